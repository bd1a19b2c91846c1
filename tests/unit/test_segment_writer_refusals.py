"""``SegmentWriterState``'s refusals at the event size limit, where the seed-2611 mutation sample found
the boundary unpinned: an event of exactly ``EVENT_LENGTH_MAX`` bytes is within the limit."""

from __future__ import annotations

import uuid

import pytest

from millstream.client._segment_writer_state import EVENT_LENGTH_MAX, REROUTE, SegmentWriterState, WriterBudget
from millstream.errors import PayloadTooLargeError
from millstream.testing.clock import ManualClock


def test_an_event_of_exactly_the_limit_is_rerouted_by_a_retired_writer_and_one_byte_more_is_too_large() -> None:
    """A retired writer (its segment sealed, its keys moved on) answers REROUTE for an event of exactly
    ``EVENT_LENGTH_MAX`` bytes -- the event is valid, only its segment is gone -- and refuses one of a
    byte more as too large.  Kills ``length > EVENT_LENGTH_MAX`` -> ``>=`` in ``_refuse`` (the largest
    valid event was refused as too large instead of being routed again)."""
    state = SegmentWriterState("s", writer_id=uuid.UUID(int=1), budget=WriterBudget(1 << 30), clock=ManualClock(),
                               block_bytes_max=1 << 20)
    assert state.retire() == []
    assert state.write_event(b"x" * EVENT_LENGTH_MAX, "a", None) == REROUTE
    with pytest.raises(PayloadTooLargeError):
        state.write_event(b"x" * (EVENT_LENGTH_MAX + 1), "a", None)
