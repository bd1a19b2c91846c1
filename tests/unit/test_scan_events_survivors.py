"""``server._appends.scan_events``' strided fast path, where the seed-2611 mutation sample found it
unpinned: its threshold (``_STRIDED_COUNT_MIN``) and a block that is a slice of a larger buffer.
Results are right either way (the per-event loop takes over); what these pin is that the fast path
runs where it should, counted by the headers unpacked."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.errors import MalformedEventError
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


def test_a_single_empty_event_takes_the_one_event_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of exactly one event is answered from its header alone, an empty event too (a header and
    nothing else: length 0 is a whole event).  Kills ``length >= 0`` -> ``length > 0`` in the one-event
    shortcut (seed-2611 sample, round 5): the result was right, but an empty event was unpacked twice."""
    counting = _CountingHeader()
    monkeypatch.setattr(_appends, "_EVENT_HEADER", counting)
    assert _appends.scan_events(encode_event(b"")) == (1, 0)
    assert counting.offsets == [0]
    assert _appends.scan_events(encode_event(b"x" * 3)) == (1, 3) and counting.offsets == [0, 0]


def test_a_truncated_header_after_whole_events_is_reported_with_its_size_and_offset() -> None:
    """The refusal of a block that ends in a partial header names how many bytes are left and where
    they start.  Kills ``size - position`` -> ``size + position`` in that message (seed-2611 sample,
    round 5: it reported the block's size plus the offset)."""
    events = _events(2)
    with pytest.raises(MalformedEventError,
                       match=rf"^3 bytes at offset {len(events)} are too few for an event header$"):
        _appends.scan_events(events + b"\0\0\0")
