"""``scan_events``' fast path for blocks of equally long events, observed by counting header unpacks
(a load-independent measure, not a timing)."""

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


def test_a_block_of_equally_long_events_is_checked_without_a_loop_per_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten events of ten bytes: one header unpacked, not ten, and the count and longest payload
    right; a block whose last header differs still takes the loop and is refused.  Kills ``count =
    size // stride`` -> ``size * stride``, which made the strided comparison never match (after
    building ``size * stride`` bytes) so that every such block fell back to the loop."""
    counting = _CountingHeader()
    monkeypatch.setattr(_appends, "_EVENT_HEADER", counting)
    events = b"".join(encode_event(bytes([n]) * 10) for n in range(10))
    assert _appends.scan_events(events) == (10, 10)
    assert counting.offsets == [0]
    bad = events[:-18] + (1).to_bytes(4, "big") + events[-14:]  # the last event's type: 1
    with pytest.raises(MalformedEventError, match="type 1"):
        _appends.scan_events(bad)
