"""``ReaderGroupState`` behaviour the sampled mutants of ``client/_reader_group_state.py`` found
unchecked (MUTATION.md, issue 24): the longest valid name, checkpoint equality, the heartbeat a
reader's liveness is judged by, and the invariants on segments waiting for their predecessors."""

from __future__ import annotations

import attrs
import pytest

from millstream import limits
from millstream.client import StreamCut
from millstream.client._reader_group import (
    AcquireSegment,
    AddReader,
    Checkpoint,
    CreateCheckpoint,
    ReaderGroupState,
    SegmentCompleted,
    UpdateDistanceToTail,
)
from millstream.client._reader_group_state import CheckpointState, FutureSegment, _names, _offset, validate_name
from millstream.errors import InternalError, InvalidArgumentError
from tests.readers.topology import A0, A1, A3, A4, B0, CONFIG, START, successors


def _state_with_a_merge_waiting() -> ReaderGroupState:
    """r1 read A0 (split) and A1 to their ends: A4 waits for A3, beside the completed A1."""
    state = ReaderGroupState.initial(CONFIG, 0, START, {})
    for update in (AddReader("r1"), AcquireSegment("r1", A0), AcquireSegment("r1", A1),
                   SegmentCompleted("r1", A0, 4, successors(A0)), SegmentCompleted("r1", A1, 3, successors(A1))):
        state = state.apply(update)
    state.check_invariants()
    assert state.future[A4] == FutureSegment(frozenset({A3}), frozenset({A1, A3}))
    assert dict(state.completed) == {A1: 3}
    return state


def test_a_name_of_exactly_the_longest_length_is_valid_and_one_more_is_refused() -> None:
    """Reader ids and checkpoint names may have ``READER_GROUP_NAME_LENGTH_MAX`` characters, as the
    error message promises; one more is refused.  Kills ``len(value) > MAX`` -> ``>=`` in
    ``validate_name``."""
    longest = "r" * limits.READER_GROUP_NAME_LENGTH_MAX
    assert validate_name(longest, "reader id") == longest
    state = ReaderGroupState.initial(CONFIG, 0, START, {}).apply(AddReader(longest))
    assert longest in state.readers
    assert state.apply(CreateCheckpoint(longest)).checkpoint(longest) is not None
    with pytest.raises(InvalidArgumentError, match="at most"):
        validate_name(longest + "r", "reader id")


def test_checkpoints_differing_in_name_or_in_cuts_are_not_equal() -> None:
    """Two checkpoints are equal only if both their names and their cuts are (as their JSON is).
    Kills ``and`` -> ``or`` in ``Checkpoint.__eq__``."""
    cut = {"s/a": StreamCut("s/a", {0: 4, 1: 3})}
    other_cut = {"s/a": StreamCut("s/a", {0: 4, 1: 2})}
    assert Checkpoint("c1", cut) == Checkpoint.from_json(Checkpoint("c1", cut).to_json())
    assert Checkpoint("c1", cut) != Checkpoint("c2", cut)
    assert Checkpoint("c1", cut) != Checkpoint("c1", other_cut)
    assert Checkpoint("c1", cut) != Checkpoint("c2", other_cut)


def test_every_heartbeat_changes_the_readers_heartbeat_count() -> None:
    """Other readers decide a reader is alive by seeing its heartbeat count change
    (``EventStreamReader``'s offline detection): each ``UpdateDistanceToTail`` must advance it, even
    with an unchanged lag.  Kills ``heartbeat + 1`` -> ``heartbeat + 0``."""
    state = ReaderGroupState.initial(CONFIG, 0, START, {}).apply(AddReader("r1"))
    seen = [state.readers["r1"].heartbeat]
    for _ in range(3):
        state = state.apply(UpdateDistanceToTail("r1", 0.0))
        seen.append(state.readers["r1"].heartbeat)
    assert seen == sorted(set(seen)) and len(seen) == 4  # strictly increasing: every heartbeat is seen
    assert state.readers["r1"].lag_seconds == 0.0


def test_invariants_refuse_a_future_segment_waiting_for_nothing_or_for_a_non_predecessor() -> None:
    """A successor waits for at least one predecessor, and only for its predecessors; a state breaking
    either (with every other invariant kept) is refused by ``check_invariants``.  Kills the loop over
    ``self.future`` run zero times."""
    state = _state_with_a_merge_waiting()
    # A4 waits for A0 besides A3: A0 is not one of its predecessors (A0 is held nowhere any more).
    stray = attrs.evolve(state, future={A4: FutureSegment(frozenset({A0, A3}), frozenset({A1, A3}))})
    with pytest.raises(InternalError, match="waits for nothing, or for a non-predecessor"):
        stray.check_invariants()
    # A4 waits for nothing though it is still in the future: A3 moved from unassigned to completed.
    unassigned = {s: o for s, o in state.unassigned.items() if s != A3}
    idle = attrs.evolve(state, future={A4: FutureSegment(frozenset(), frozenset({A1, A3}))},
                        completed={A1: 3, A3: 2}, unassigned=unassigned)
    with pytest.raises(InternalError, match="waits for nothing, or for a non-predecessor"):
        idle.check_invariants()


def test_an_offset_is_a_non_negative_int_zero_included() -> None:
    """Offsets, generations and heartbeat counts read from the group's JSON are ints from 0 up: 0 is
    accepted and -1 refused.  Kills ``value < 0`` -> ``value < 1`` and -> ``value < -1`` in
    ``_offset`` (seed-2711 sample)."""
    assert _offset(0, "offset") == 0 and _offset(7, "offset") == 7
    for bad in (-1, -2, 1.0, True, "1"):
        with pytest.raises(InvalidArgumentError, match="non-negative int"):
            _offset(bad, "offset")


def test_invariants_refuse_a_future_segment_waiting_for_an_ended_predecessor() -> None:
    """A successor never waits for a predecessor that has ended (nor for a completed one): a state where
    A4 still waits for A3 though A3 is among the ended segments is refused.  Kills
    ``completed | ended`` -> ``completed & ended`` in ``check_invariants`` (seed-2711 sample: only a
    segment both completed and ended was then caught, which the holders check already refuses)."""
    state = _state_with_a_merge_waiting()
    unassigned = {s: o for s, o in state.unassigned.items() if s != A3}
    ended = attrs.evolve(state, unassigned=unassigned, ended={**state.ended, A3: 2})
    with pytest.raises(InternalError, match="waits for a completed predecessor"):
        ended.check_invariants()


def test_invariants_refuse_a_complete_checkpoint_that_lacks_a_stream() -> None:
    """A complete checkpoint records a position in every stream of the group; one with positions in
    s/a only is refused, one with both streams accepted.  Kills the loop over ``self.checkpoints`` in
    ``check_invariants`` run zero times (seed-2711 sample)."""
    state = ReaderGroupState.initial(CONFIG, 0, START, {})
    whole = attrs.evolve(state, checkpoints=(CheckpointState("c1", False, frozenset(), {A1: 0, B0: 0}),))
    whole.check_invariants()
    lacking = attrs.evolve(state, checkpoints=(CheckpointState("c1", False, frozenset(), {A1: 0}),))
    with pytest.raises(InternalError, match="checkpoint c1 lacks a stream"):
        lacking.check_invariants()


def test_a_collection_of_segment_names_is_neither_a_str_nor_a_scalar() -> None:
    """A future segment's ``waiting`` and ``predecessors``, read from the group's JSON, are collections
    of names: a bare name (a str, itself iterable) or a number is refused with the same typed error.
    Kills ``isinstance(value, str) or not isinstance(value, Iterable)`` -> ``and`` in ``_names``
    (seed-2711 sample: a number failed with a ``TypeError`` from ``frozenset``)."""
    assert _names([A3, A1], "waiting") == frozenset({A1, A3})
    for bad in (A3, 5, None):
        with pytest.raises(InvalidArgumentError, match="collection of segment names"):
            _names(bad, "waiting")
