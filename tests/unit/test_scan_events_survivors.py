"""``server._appends.scan_events``' strided fast path, where the seed-2611 mutation sample found it
unpinned: its threshold (``_STRIDED_COUNT_MIN``) and a block that is a slice of a larger buffer.
Results are right either way (the per-event loop takes over); what these pin is that the fast path
runs where it should, counted by the headers unpacked."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.server import _appends
from millstream.wire.codec import encode_event


class _CountingHeader:
    """``_appends._EVENT_HEADER`` that records the offset of every header it unpacks."""

    def __init__(self) -> None:
        self.header = _appends._EVENT_HEADER
        self.size = self.header.size
        self.offsets: list[int] = []

    def unpack_from(self, buffer: Any, offset: int = 0) -> tuple[Any, ...]:
        self.offsets.append(offset)
        return self.header.unpack_from(buffer, offset)


def _events(count: int) -> bytes:
    return b"".join(encode_event(bytes([n]) * 10) for n in range(count))


@pytest.mark.parametrize("count", [4, 5])
def test_the_strided_check_starts_at_five_equally_long_events(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Four events take the loop (a header each, after the first); five take the strided check (the
    first header only).  Kills ``_STRIDED_COUNT_MIN = 5`` -> 4 and -> 6."""
    counting = _CountingHeader()
    monkeypatch.setattr(_appends, "_EVENT_HEADER", counting)
    assert _appends.scan_events(_events(count)) == (count, 10)
    assert len(counting.offsets) == (1 if count == 5 else 1 + count)


def test_a_block_sliced_from_a_larger_buffer_takes_the_strided_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memoryview slice (what the server hands over from its read buffer) is copied once and checked
    strided, not compared through the whole buffer behind it.  Kills ``len(view.obj) == size`` -> ``!=``
    (the slice's whole underlying buffer was compared, never matched, and the loop ran)."""
    events = _events(10)
    buffer = b"\0" * 7 + events + b"\0" * 5
    counting = _CountingHeader()
    monkeypatch.setattr(_appends, "_EVENT_HEADER", counting)
    assert _appends.scan_events(memoryview(buffer)[7:7 + len(events)]) == (10, 10)
    assert counting.offsets == [0]
    assert _appends.scan_events(events) == (10, 10) and counting.offsets == [0, 0]
