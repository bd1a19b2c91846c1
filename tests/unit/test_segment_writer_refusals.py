"""``SegmentWriterState``'s refusals at the event size limit, where the seed-2611 mutation sample found
the boundary unpinned: an event of exactly ``EVENT_LENGTH_MAX`` bytes is within the limit."""

from __future__ import annotations

import struct
import uuid

import pytest

from millstream.client._segment_writer_state import (
    EVENT_LENGTH_MAX,
    REROUTE,
    EndSession,
    SegmentWriterState,
    WriterBudget,
)
from millstream.errors import PayloadTooLargeError, WriterIdInUseError
from millstream.testing.clock import ManualClock
from millstream.wire import codec


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


def _state(block_bytes_max: int = 1 << 20) -> SegmentWriterState:
    return SegmentWriterState("s", writer_id=uuid.UUID(int=1), budget=WriterBudget(1 << 30), clock=ManualClock(),
                              block_bytes_max=block_bytes_max)


def test_a_writer_that_failed_refuses_an_event_with_its_own_error() -> None:
    """Once the event writer has an error, an event is refused with that error (the application learns
    why), not as if the writer were merely closed.  Kills ``self._shared.error is not None`` -> ``not``
    in ``_refuse`` (seed-2611 sample: the writer's error was replaced by ``ObjectClosedError``)."""
    state = _state()
    state._shared.error = WriterIdInUseError("another writer uses this id")
    with pytest.raises(WriterIdInUseError, match="another writer uses this id"):
        state.write_event(b"x", "a", None)


def test_a_framed_run_longer_than_a_block_is_cut_into_blocks_of_its_own_bytes() -> None:
    """``write_framed`` cuts a run of framed events into blocks where the charges reach the block size;
    each block holds exactly its events' bytes, and the blocks put together are the run.  Kills
    ``first == 0 and last == len(data)`` -> ``!=`` (seed-2611 sample: the run's last block, which starts
    inside the run and ends at its end, carried the whole run again)."""
    payloads = [bytes([n]) * 100 for n in range(5)]
    framed = [struct.pack(">ii", 0, len(p)) + p for p in payloads]
    data = b"".join(framed)
    framed_ends = [sum(len(f) for f in framed[:i]) for i in range(len(framed) + 1)]
    charge_ends = [end + i for i, end in enumerate(framed_ends)]   # a one-character key each
    state = _state(block_bytes_max=250)
    state.write_framed(data, framed_ends, charge_ends, ["k"] * 5, [1, 2, 3, 4, 5])
    state.close_open_block()
    blocks = state.take_closed()
    assert len(blocks) > 1
    assert b"".join(bytes(block.data) for block in blocks) == data
    assert [list(codec.iter_events(bytes(block.data))) for block in blocks] == [
        payloads[sum(b.event_count for b in blocks[:i]):sum(b.event_count for b in blocks[:i + 1])]
        for i in range(len(blocks))]


def test_a_moved_event_without_a_routing_key_is_charged_its_framed_bytes_only() -> None:
    """An event handed over from a sealed predecessor may have no routing key: it is charged its framed
    bytes, and one with a key those plus the key's characters.  Kills ``routing_key is not None`` ->
    ``is None`` in ``_frame`` (seed-2611 sample: ``len(None)`` failed the hand-over of a keyless event)."""
    state = _state()
    assert state.write_moved_event(b"x" * 10, None, None, 1) is None
    assert state.charged() == 8 + 10
    state.write_moved_event(b"y" * 10, "key", None, 2)
    assert state.charged() == 2 * (8 + 10) + len("key")


def test_a_retired_writer_holds_nothing_and_keeps_its_invariants() -> None:
    """``retire`` hands every event over and leaves the writer holding nothing against the budget, its
    invariants intact.  Kills ``_open_charge = _open_count = 0`` -> ``1`` (seed-2611 sample: a retired
    writer still charged a byte) and ``_close_at = 0`` -> ``-1`` (its closing target no longer the
    idle one) in ``retire``."""
    state = _state(block_bytes_max=64)
    for n in range(5):
        state.write_event(bytes([n]) * 20, "k", None)
    state.check_invariants()
    assert state.charged() > 0
    handed_over = state.retire()
    assert [payload for payload, _key, _future, _sequence in handed_over] == [bytes([n]) * 20 for n in range(5)]
    assert state.charged() == 0
    state.check_invariants()


def test_a_new_writer_told_its_id_already_stored_an_event_ends_the_session() -> None:
    """A writer that never sent anything, told by ``AppendSetup`` (or after a seal) that its id already
    holds event 1, has met another writer with its id: the session ends with ``WriterIdInUseError``.
    Kills ``_sent_max = 0`` -> ``1`` (seed-2611 sample: event 1 of another writer was taken as this
    writer's own)."""
    state = _state()
    (end,) = state.setup(1)
    assert isinstance(end, EndSession) and isinstance(end.reason, WriterIdInUseError)
    with pytest.raises(WriterIdInUseError, match="already holds events"):
        state.check_stored(1)
    assert not any(isinstance(i, EndSession) for i in state.setup(0))   # nothing stored: the session goes on


def test_a_batch_window_over_no_open_events_closes_nothing() -> None:
    """When the batch window of the open block passes with no event open, nothing is closed or shipped.
    Kills the second ``or`` -> ``and`` in ``batch_window_passed``'s early return (seed-2611 sample: an
    empty block was closed)."""
    state = _state()
    assert state.batch_window_passed(state.last_assigned) is False
    assert state.take_closed() == [] and state.charged() == 0
    state.check_invariants()
