"""The stream-ordering model (``millstream.model.stream_ordering``) used the way the implementation's
stateful tests will use it: explicit writers, keys, readers and segments, observed through its
queries.  The spec<->model agreement (``proofs/``) proves the model equals the spec inside the CI
bounds; these tests pin down scenarios by name and walk the model far beyond those bounds (a wider
key space, more readers, writers, events and scales), checking the invariants after every step and
that the group, left to the protocol alone, always catches up.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.model import stream_ordering as so
from millstream.model.errors import InternalError
from millstream.model.frozen_map import FrozenMap
from proofs import stream_ordering_agreement as agreement

W, R1, R2 = "w1", "r1", "r2"


def fresh(initial_splits: tuple[int, ...] = (), readers: tuple[str, ...] = (R1, R2), grid: int = 2) -> so.StreamState:
    return so.initial_state([W], readers, readers, grid, initial_splits)


def split_first(state: so.StreamState) -> so.StreamState:
    """Split segment 1 ([0, 2)) into 2 ([0, 1)) and 3 ([1, 2)): all four controller steps."""
    state = so.create_successors(state, frozenset({1}), ((0, 1), (1, 2)))
    return so.activate_epoch(so.seal_predecessors(so.record_epoch(state)))


def store(state: so.StreamState, key: int, times: int = 1) -> so.StreamState:
    """The writer writes ``times`` events with ``key``; each is stored and acknowledged."""
    for _ in range(times):
        state = so.write_event(state, W, key)
        segment = state.inflight[W][-1].segment
        state = so.ack_event(so.append_event(state, W, segment), W, segment)
    return state


def keys_read(state: so.StreamState) -> list[tuple[int, int]]:
    """(key, event number) of every event the group delivered since the last reset, in order."""
    return [(state.event_at(p).key, state.event_at(p).number) for p in state.reads]


# --- Writers across a scale -----------------------------------------------------------------------


def test_an_event_stored_before_the_seal_is_not_resent_and_the_rest_follow_in_order() -> None:
    state = fresh()
    for _ in range(3):
        state = so.write_event(state, W, 1)
    state = so.append_event(state, W, 1)              # event 1 stored; its acknowledgement is still on its way
    state = split_first(state)
    with pytest.raises(so.NotEnabled):
        so.append_event(state, W, 1)                  # sealed
    state = so.segment_sealed(state, W, 1)
    assert state.route(W, 0) == 2 and state.route(W, 1) == 3
    assert [(e.number, e.segment) for e in state.inflight[W]] == [(2, 3), (3, 3)]
    state = so.append_event(so.append_event(state, W, 3), W, 3)
    state = so.ack_event(state, W, 3)
    assert state.inflight[W] == ()
    assert [e.number for e in state.data[0]] == [1] and [e.number for e in state.data[2]] == [2, 3]
    state.check_invariants()


def test_after_a_merge_a_writer_routes_by_cell_until_each_predecessor_tells_it() -> None:
    state = fresh(initial_splits=(1,))
    state = so.create_successors(state, frozenset({1, 2}), ((0, 2),))
    state = so.seal_predecessors(so.record_epoch(state))
    state = so.segment_sealed(so.write_event(state, W, 1), W, 2)
    # Cell 1 goes to the merged segment; cell 0 still to the sealed predecessor, until it is refused.
    assert state.table[W] == (1, 3)
    state = so.segment_sealed(so.write_event(state, W, 0), W, 1)
    assert state.table[W] == (3, 3)
    state.check_invariants()


def test_a_scale_must_replace_its_predecessors_exactly() -> None:
    state = fresh(grid=4)
    for ranges in (((0, 2),), ((0, 2), (3, 4)), ((0, 3), (2, 4))):
        with pytest.raises(so.NotEnabled):
            so.create_successors(state, frozenset({1}), ranges)
    with pytest.raises(so.NotEnabled):
        so.create_successors(state, frozenset({7}), ((0, 4),))
    three_way = so.create_successors(state, frozenset({1}), ((0, 1), (1, 3), (3, 4)))
    assert [(s.lo, s.hi, s.epoch) for s in three_way.segments[1:]] == [(0, 1, 2), (1, 3, 2), (3, 4, 2)]
    with pytest.raises(so.NotEnabled):
        so.create_successors(three_way, frozenset({1}), ((0, 4),))   # one scale at a time


# --- The reader group -----------------------------------------------------------------------------


def test_a_merged_segment_waits_for_every_predecessor() -> None:
    state = fresh(initial_splits=(1,))
    state = so.acquire_segment(so.acquire_segment(state, R1, 1), R2, 2)
    state = so.create_successors(state, frozenset({1, 2}), ((0, 2),))
    state = so.activate_epoch(so.seal_predecessors(so.record_epoch(state)))
    state = so.segment_completed(state, R1, 1)
    assert state.future == FrozenMap({3: frozenset({2})}) and 3 not in state.unassigned
    state = so.segment_completed(state, R2, 2)
    assert state.future == FrozenMap() and state.unassigned == FrozenMap({3: 0})


def test_a_reader_records_a_checkpoint_on_the_call_after_it_returned_it() -> None:
    state = so.acquire_segment(store(fresh(), 0), R1, 1)
    state = so.read_next_event(state, R1, 1)
    state = so.create_checkpoint(state)
    state = so.checkpoint_reader(so.surface_checkpoint(state, R2), R2)
    state = so.surface_checkpoint(state, R1)
    with pytest.raises(so.NotEnabled):
        so.read_next_event(state, R1, 1)              # owes the checkpoint first
    assert not state.checkpoints[0].complete and state.assigned[R1] == FrozenMap({1: 0})
    state = so.checkpoint_reader(state, R1)
    assert state.checkpoints[0].complete and state.checkpoints[0].cut == FrozenMap({1: 1})
    assert state.assigned[R1] == state.saved[R1] == FrozenMap({1: 1})


def test_a_crash_returns_segments_at_the_recorded_offset_and_voids_the_unpersisted_reads() -> None:
    state = so.read_next_event(so.acquire_segment(store(fresh(), 0, times=2), R1, 1), R1, 1)
    state = so.create_checkpoint(state)
    for reader in (R1, R2):
        state = so.checkpoint_reader(so.surface_checkpoint(state, reader), reader)
    state = so.read_next_event(state, R1, 1)          # event 2, not yet persisted
    state = so.reader_offline(state, R1)
    assert state.unassigned == FrozenMap({1: 1}) and keys_read(state) == [(0, 1)]
    state = so.read_next_event(so.acquire_segment(state, R2, 1), R2, 1)
    assert keys_read(state) == [(0, 1), (0, 2)]
    state.check_invariants()


def test_a_reset_restarts_the_group_from_the_checkpoint_cut() -> None:
    state = so.read_next_event(so.acquire_segment(store(fresh(), 1, times=2), R1, 1), R1, 1)
    state = so.create_checkpoint(state)
    for reader in (R1, R2):
        state = so.checkpoint_reader(so.surface_checkpoint(state, reader), reader)
    state = so.read_next_event(state, R1, 1)
    state = so.reset(state, 1)
    assert state.reads == () and state.origin == FrozenMap({1: 1}) and state.unassigned == FrozenMap({1: 1})
    state = so.read_next_event(so.acquire_segment(state, R2, 1), R2, 1)
    assert keys_read(state) == [(1, 2)] and state.drained
    state.check_invariants()


def test_release_happens_only_at_a_recorded_offset() -> None:
    state = store(so.initial_state([W], [R1, R2], [R1], 2, (1,)), 0)
    state = so.acquire_segment(so.acquire_segment(state, R1, 1), R1, 2)
    state = so.read_next_event(so.add_reader(state, R2), R1, 1)
    with pytest.raises(so.NotEnabled):
        so.release_segment(state, R1, 1)              # read since its offset was recorded
    state = so.release_segment(state, R1, 2)
    assert state.unassigned == FrozenMap({2: 0})
    with pytest.raises(so.NotEnabled):
        so.acquire_segment(state, R1, 2)              # only the least loaded reader acquires
    assert so.acquire_segment(state, R2, 2).owned(R2) == frozenset({2})


# --- The invariant checker has teeth --------------------------------------------------------------


def test_the_invariants_catch_a_duplicate_and_an_out_of_order_read() -> None:
    state = so.acquire_segment(store(fresh(), 0, times=2), R1, 1)
    state.check_invariants()
    with pytest.raises(InternalError, match="NoDuplicateReads"):
        attrs.evolve(state, reads=((1, 1), (1, 1))).check_invariants()
    with pytest.raises(InternalError, match="PerKeyOrder"):
        attrs.evolve(state, reads=((1, 2), (1, 1))).check_invariants()
    with pytest.raises(InternalError, match="ExactlyOnceAfterReset"):
        attrs.evolve(state, reads=((1, 2),), origin=FrozenMap({1: 2})).check_invariants()


# --- Random walks beyond the CI bounds ------------------------------------------------------------

#: Four cells, three keys, two writers, three readers (one joins later), three scales, and the rest.
WIDE = agreement.Configuration(
    writers=("w1", "w2"), readers=("r1", "r2", "r3"), initial_readers=frozenset({"r1", "r2"}), grid=4,
    keys=(0, 1, 3), initial_splits=frozenset({2}), events_per_writer=3, max_scales=3, max_checkpoints=2,
    max_crashes=2, max_resets=1)

#: Actions the environment chooses (writes, scales, crashes, checkpoints, resets) or that progress
#: does not need (releases); the others are the steps the spec's fairness says are eventually taken.
NOT_PROGRESS = {"WriteEvent", "CreateSuccessors", "ReaderOffline", "CreateCheckpoint", "Reset", "ReleaseSegment"}
PROGRESS_STEPS_MAX = 2_000


def _catch_up(state: so.StreamState) -> so.StreamState:
    """Take protocol steps only (the first enabled, deterministically) until nothing is left to read."""
    for _ in range(PROGRESS_STEPS_MAX):
        if state.drained and not state.checkpoint_in_progress and state.scaling.phase is so.ScalePhase.IDLE:
            return state
        step = next((after for label, after in agreement.successors(WIDE, state) if label not in NOT_PROGRESS), None)
        assert step is not None, f"stuck before catching up: {state}"
        state = step
        state.check_invariants()
    raise AssertionError(f"no catch-up within {PROGRESS_STEPS_MAX} protocol steps")


def _step(state: so.StreamState, choice: int) -> so.StreamState | None:
    """The first enabled action instance at or after ``choice`` (cyclically), or None if none is."""
    instances = list(agreement.instances(WIDE, state))
    for offset in range(len(instances)):
        _, transition, arguments = instances[(choice + offset) % len(instances)]
        try:
            return transition(state, *arguments)
        except so.NotEnabled:
            continue
    return None


#: Each walk explores a wide configuration step by step, so a quarter of the profile's examples
#: (50 in CI, 1,250 nightly) buys the same confidence per second as the other property tests.
WALKS = max(25, settings.default.max_examples // 4)


@settings(max_examples=WALKS)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=80))
def test_random_walks_keep_every_invariant_and_the_group_catches_up(choices: list[int]) -> None:
    state = agreement.initial_states(WIDE)[0]
    for choice in choices:
        following = _step(state, choice)
        if following is None:
            break
        state = following
        state.check_invariants()
    caught_up = _catch_up(state)
    # Everything after the cut the group last started from was delivered, once, in key order.
    expected = {p for p in caught_up.all_positions() if caught_up.after(p, caught_up.origin)}
    assert set(caught_up.reads) == expected and len(caught_up.reads) == len(expected)


def test_the_scales_offered_are_every_split_and_every_adjacent_merge_and_each_is_counted() -> None:
    """``scale_requests`` offers every split of a current segment at a cell boundary and every merge
    of two neighbours; ``create_successors`` counts the scales (the spec's bound on them starts at 0).
    Kills the mutants offering no split (its first loop over no segments) and starting the count at -1."""
    assert list(so.scale_requests(fresh())) == [(frozenset({1}), ((0, 1), (1, 2)))]
    assert list(so.scale_requests(fresh(initial_splits=(1,)))) == [(frozenset({1, 2}), ((0, 2),))]
    assert fresh().scales == 0
    assert split_first(fresh()).scales == 1


def test_a_checkpoint_cut_holds_a_completed_predecessor_at_its_end() -> None:
    """A merged successor waits for its second predecessor; the first, read to its end (two events),
    is in the cut at offset 2.  Kills the mutant taking the length of the wrong segment's data
    (``state.data[p - 2]`` in ``create_checkpoint``)."""
    state = store(fresh(initial_splits=(1,)), 0, times=2)
    state = so.acquire_segment(so.acquire_segment(state, R1, 1), R2, 2)
    state = so.create_successors(state, frozenset({1, 2}), ((0, 2),))
    state = so.activate_epoch(so.seal_predecessors(so.record_epoch(state)))
    state = so.read_next_event(so.read_next_event(state, R1, 1), R1, 1)
    state = so.segment_completed(state, R1, 1)
    assert state.completed_waiting == frozenset({1})
    state = so.create_checkpoint(state)
    assert state.checkpoints[-1].cut[1] == 2
    state.check_invariants()


def test_a_reader_records_the_checkpoint_it_owes_not_an_earlier_one() -> None:
    """Checkpoint 1 completes; on checkpoint 2, R1 records first, so R2 still owes it.  Kills the
    mutant recording into checkpoint 2 what it derived from checkpoint 1 (``state.checkpoints[number -
    2]`` in ``checkpoint_reader``): checkpoint 2 came out complete without R2."""
    state = so.acquire_segment(store(fresh(), 0, times=2), R1, 1)
    for _ in range(2):
        state = so.read_next_event(state, R1, 1)
        state = so.create_checkpoint(state)
        state = so.checkpoint_reader(so.surface_checkpoint(state, R1), R1)
        if len(state.checkpoints) == 1:
            state = so.checkpoint_reader(so.surface_checkpoint(state, R2), R2)
            assert state.checkpoints[0].complete
    assert state.checkpoints[1].pending == frozenset({R2}) and not state.checkpoints[1].complete
    assert state.checkpoints[1].cut == FrozenMap({1: 2})
    state = so.checkpoint_reader(so.surface_checkpoint(state, R2), R2)
    assert state.checkpoints[1].complete and state.checkpoints[1].cut == FrozenMap({1: 2})


# --- Guards and clauses the seed-2611 mutation sample found unchecked ---------------------------------


def test_an_event_key_outside_the_grid_is_not_written() -> None:
    """``WriteEvent(w, k)`` needs ``0 <= k < grid``.  Kills ``key < state.grid`` -> ``<=`` (an event
    for the cell beyond the grid was routed)."""
    state = fresh(grid=2)
    for key in (-1, 2):
        with pytest.raises(so.NotEnabled):
            so.write_event(state, W, key)
    assert so.write_event(state, W, 1).written[W] == 1


def test_a_reset_names_a_completed_checkpoint_counted_from_one() -> None:
    """``Reset(i)`` needs ``1 <= i <= Len(checkpoints)``.  Kills ``1 <= checkpoint`` -> ``0 <=``
    (checkpoint 0 reset the group to the last checkpoint's cut)."""
    state = so.acquire_segment(store(fresh(), 1, times=2), R1, 1)
    state = so.create_checkpoint(state)
    for reader in (R1, R2):
        state = so.checkpoint_reader(so.surface_checkpoint(state, reader), reader)
    for checkpoint in (0, 2):
        with pytest.raises(so.NotEnabled):
            so.reset(state, checkpoint)
    assert so.reset(state, 1).resets == 1


def test_only_a_later_epochs_segment_has_predecessors() -> None:
    """After a split of segment 1 into 2 and 3, segment 1 (epoch 1) has none and each successor has
    segment 1.  Kills ``mine.epoch == 1`` -> ``== 0`` (segment 1 counted the newest epoch's segments as
    its predecessors) and ``== 2``."""
    state = split_first(fresh())
    assert state.predecessors(1) == frozenset()
    assert state.predecessors(2) == state.predecessors(3) == frozenset({1})


def test_no_acknowledged_event_lost_counts_the_writers_first_event() -> None:
    """A stored, acknowledged first event that vanished breaks ``NoAcknowledgedEventLost``.  Kills
    ``range(1, count + 1)`` -> ``range(2, count + 1)`` in the invariant (event 1 was never checked)."""
    state = store(fresh(), 0, times=2)
    state.check_invariants()
    (_first, second), *rest = state.data
    with pytest.raises(InternalError, match="NoAcknowledgedEventLost"):
        attrs.evolve(state, data=((second,), *rest)).check_invariants()


def test_type_ok_fails_on_an_online_reader_the_group_does_not_know() -> None:
    """``TypeOK`` holds only while every online reader is one of the group's; an unknown online reader
    breaks it even where the segments and their data agree.  Kills the ``and`` before
    ``state.online <= frozenset(readers)`` -> ``or`` (seed-2711 sample), which let the segment checks
    alone satisfy ``TypeOK``."""
    state = so.acquire_segment(store(fresh(), 0), R1, 1)
    state.check_invariants()
    with pytest.raises(InternalError, match="TypeOK"):
        attrs.evolve(state, online=state.online | {"stranger"}).check_invariants()
