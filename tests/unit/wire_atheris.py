"""A coverage-guided fuzzer for the wire decoder (atheris, i.e. libFuzzer for Python).  Not a pytest
module (its name does not start with ``test_``); run it by hand or nightly:

    python -m tests.unit.wire_atheris -atheris_runs=100000

Theory of operation: the same property as ``test_wire_fuzz.py`` -- whatever bytes arrive, in whatever
pieces, the ``Decoder`` returns commands or raises a ``WireProtocolError``, after which it stays
poisoned -- but libFuzzer steers the inputs by the branches they reach in the (instrumented) codec.
Half of the inputs are raw bytes; the other half are built into frames with real type codes and
exact lengths, so the fuzzer spends its time in the field decoders rather than at the first header.
A finding is any other exception, or a broken decoder invariant; libFuzzer saves the input.
"""

from __future__ import annotations

import struct
import sys

import atheris

import millstream  # noqa: F401  (the rest of millstream, imported first so that only the codec is instrumented)

with atheris.instrument_imports(include=["millstream.wire"]):
    from millstream.wire import Decoder, WireProtocolError
    from millstream.wire.commands import COMMAND_TYPES

KNOWN_TYPES = sorted(COMMAND_TYPES)


def build_stream(provider: atheris.FuzzedDataProvider) -> bytes:
    """Frames with real type codes and (mostly) exact lengths, from the fuzzer's bytes."""
    frames = []
    for _ in range(provider.ConsumeIntInRange(1, 6)):
        type_code = KNOWN_TYPES[provider.ConsumeIntInRange(0, len(KNOWN_TYPES) - 1)]
        body = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 200))
        length = len(body) + (provider.ConsumeIntInRange(-2, 2) if provider.ConsumeBool() else 0)
        frames.append(struct.pack(">ii", type_code, length) + body)
    return b"".join(frames)


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    raw = provider.ConsumeBool()
    cuts = sorted(provider.ConsumeIntInRange(0, 4096) for _ in range(provider.ConsumeIntInRange(0, 6)))
    stream = provider.ConsumeBytes(provider.remaining_bytes()) if raw else build_stream(provider)
    cuts = [min(cut, len(stream)) for cut in cuts]
    decoder = Decoder()
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        try:
            decoder.feed(stream[start:end])
        except WireProtocolError as error:
            try:
                decoder.feed(b"")
            except WireProtocolError as again:
                if again is not error:
                    raise AssertionError("a poisoned decoder raised a different error") from again
            else:
                raise AssertionError("a poisoned decoder accepted more bytes") from error
            break
        decoder.check_invariants()
        if decoder.pending_bytes > end:
            raise AssertionError(f"the decoder holds {decoder.pending_bytes} bytes of {end} fed")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
