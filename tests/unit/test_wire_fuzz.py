"""Fuzzing the decoder: whatever bytes a peer sends, the ``Decoder`` answers with commands or a
``WireProtocolError`` -- never another exception, never a hang, never a large allocation.

Theory of operation: inputs come from two sources.  Arbitrary bytes (mostly rejected at the first
header), and valid streams that are then damaged the way a broken or hostile peer would damage them:
bits flipped, the stream cut short, a frame's length or type code overwritten with an edge value,
bytes inserted or removed.  The damaged stream is fed in pieces cut at drawn points.  After every
``feed`` the decoder's invariants hold and it holds no more bytes than it was given; after an error
it is poisoned and re-raises the same error.  Lengths are checked against ``FRAME_BYTES_MAX`` before
anything is buffered, so no input here can make the decoder wait for (or allocate) 16 MiB.

``tests/unit/wire_atheris.py`` runs the same property under atheris (coverage-guided), when installed.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from millstream.wire import commands as c
from millstream.wire.codec import FRAME_BYTES_MAX, FRAME_HEADER_LENGTH, Decoder, WireProtocolError, encode
from tests.unit.test_wire_codec import any_command

EDGE_INT32S = [0, 1, -1, 7, 8, 16, 0x7F, 0xFF, 0xFFFF, FRAME_BYTES_MAX, FRAME_BYTES_MAX + 1, 2**31 - 1, -(2**31)]
KNOWN_TYPES = sorted(c.COMMAND_TYPES)


def feed_in_pieces(stream: bytes, cuts: list[int]) -> list[c.Command]:
    """Feed ``stream`` cut at ``cuts``; return what was decoded.  Fails the test on anything but a
    ``WireProtocolError`` (which it checks poisons the decoder, then returns)."""
    decoder = Decoder()
    received: list[c.Command] = []
    fed = 0
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        try:
            received += decoder.feed(stream[start:end])
        except WireProtocolError as error:
            assert decoder.error is error and decoder.pending_bytes == 0
            decoder.check_invariants()
            try:
                decoder.feed(b"\x00" * 8)
            except WireProtocolError as again:
                assert again is error
            else:
                raise AssertionError("a poisoned decoder accepted more bytes")
            return received
        fed += end - start
        decoder.check_invariants()
        assert decoder.pending_bytes <= fed
    return received


@st.composite
def cut_points(draw: st.DrawFn, length: int) -> list[int]:
    return sorted(draw(st.lists(st.integers(0, length), max_size=8)))


@given(st.binary(max_size=2000), st.data())
def test_arbitrary_bytes(stream: bytes, data: st.DataObject) -> None:
    feed_in_pieces(stream, data.draw(cut_points(len(stream))))


@st.composite
def frames_of_a_known_type(draw: st.DrawFn) -> bytes:
    """A header of a real type and a plausible length, over random fields: gets past the header check."""
    body = draw(st.binary(max_size=120))
    length = draw(st.one_of(st.just(len(body)), st.integers(0, 130)))
    return struct.pack(">ii", draw(st.sampled_from(KNOWN_TYPES)), length) + body


@given(st.lists(frames_of_a_known_type(), min_size=1, max_size=6), st.data())
def test_random_fields_under_real_headers(frames: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(frames)
    feed_in_pieces(stream, data.draw(cut_points(len(stream))))


def frame_starts(stream: bytes) -> list[int]:
    """Where the frames of ``stream`` begin, walking its headers (until one is damaged beyond walking)."""
    starts, position = [], 0
    while position + FRAME_HEADER_LENGTH <= len(stream):
        starts.append(position)
        length = struct.unpack_from(">i", stream, position + 4)[0]
        if length < 0:
            break
        position += FRAME_HEADER_LENGTH + length
    return starts


@st.composite
def damaged_streams(draw: st.DrawFn) -> bytes:
    """A valid stream of a few commands, damaged one to three times."""
    sent = draw(st.lists(any_command, min_size=1, max_size=8))
    stream = bytearray(b"".join(map(encode, sent)))
    for _ in range(draw(st.integers(1, 3))):
        if not stream:
            break
        kind = draw(st.sampled_from(["flip", "truncate", "length", "type", "int32", "insert", "delete"]))
        position = draw(st.integers(0, len(stream) - 1))
        edge_value = draw(st.one_of(st.sampled_from(EDGE_INT32S), st.integers(-(2**31), 2**31 - 1)))
        if kind == "flip":
            stream[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del stream[position:]
        elif kind in ("length", "type"):
            starts = frame_starts(bytes(stream))
            if starts:
                start = draw(st.sampled_from(starts))
                if kind == "type":  # another real type (fields now misread) or anything
                    value = draw(st.one_of(st.sampled_from(KNOWN_TYPES), st.just(edge_value)))
                    struct.pack_into(">i", stream, start, value)
                else:
                    struct.pack_into(">i", stream, start + 4, edge_value)
        elif kind == "int32":  # any four bytes: a string's or blob's length, an int, part of a header
            if position + 4 <= len(stream):
                struct.pack_into(">i", stream, position, edge_value)
        elif kind == "insert":
            stream[position:position] = draw(st.binary(min_size=1, max_size=8))
        else:
            del stream[position:position + draw(st.integers(1, 8))]
    return bytes(stream)


@given(damaged_streams(), st.data())
def test_damaged_valid_streams(stream: bytes, data: st.DataObject) -> None:
    received = feed_in_pieces(stream, data.draw(cut_points(len(stream))))
    assert all(isinstance(command, c.Command) for command in received)


@given(st.lists(any_command, min_size=1, max_size=5), st.data())
def test_every_prefix_of_a_valid_stream_is_awaited_not_rejected(sent: list[c.Command], data: st.DataObject) -> None:
    """A stream cut short is not an error: the decoder waits, holding only the unfinished frame."""
    stream = b"".join(map(encode, sent))
    end = data.draw(st.integers(0, len(stream)))
    decoder = Decoder()
    received = decoder.feed(stream[:end])
    assert received == sent[:len(received)]
    assert decoder.pending_bytes == end - sum(len(encode(command)) for command in received)
    decoder.check_invariants()
