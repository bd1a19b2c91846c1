"""``ReaderGroupState`` as a pure state machine: every update, its refusals (typed errors, nothing
changed), its JSON, the rebalancing policy, and a Hypothesis state machine over the topology of
``topology.py`` whose invariants are the reader group's: a segment has one holder; a successor is
handed out only after all its predecessors completed; a completed checkpoint's cut covers every
stream's key space; recorded offsets never run ahead of what a reader read."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream import limits
from millstream.client import ReaderGroupConfig, StreamCut
from millstream.client._reader_group import (
    AcquireSegment,
    AddReader,
    Checkpoint,
    CheckpointReader,
    CreateCheckpoint,
    ReaderGroupState,
    ReaderGroupStateInit,
    ReaderGroupUpdate,
    ReleaseSegment,
    RemoveReader,
    SegmentCompleted,
    UpdateDistanceToTail,
)
from millstream.client._streams import canonical_json
from millstream.errors import (
    CheckpointLimitError,
    InvalidArgumentError,
    ReaderExistsError,
    ReaderNotInGroupError,
)
from millstream.naming import segment_id, stream_segment_name
from tests.readers.topology import (
    A0,
    A1,
    A2,
    A3,
    A4,
    B0,
    CONFIG,
    LENGTHS,
    START,
    covers,
    length,
    predecessors,
    successors,
)

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"


def initial() -> ReaderGroupState:
    return ReaderGroupState.initial(CONFIG, 0, START, {})


def apply_all(state: ReaderGroupState, *updates: ReaderGroupUpdate) -> ReaderGroupState:
    for update in updates:
        state = state.apply(update)
        state.check_invariants()
        assert round_trip(state) == state
    return state


def round_trip(state: ReaderGroupState) -> ReaderGroupState:
    return ReaderGroupState.from_json_object(json.loads(canonical_json(state.to_json_object())))


def test_initial_state_holds_every_start_segment_unassigned() -> None:
    state = initial()
    state.check_invariants()
    assert dict(state.unassigned) == START and not state.readers and not state.finished
    assert round_trip(state) == state
    with pytest.raises(InvalidArgumentError):
        ReaderGroupState.initial(CONFIG, 0, {A0: 0, A1: 0}, {})  # no offsets for s/b
    with pytest.raises(InvalidArgumentError):
        ReaderGroupState.initial(CONFIG, 0, {**START, "s/c/0.#epoch.0": 0}, {})  # not a stream of the group


def test_readers_join_acquire_release_and_leave() -> None:
    state = apply_all(initial(), AddReader("r1"), AddReader("r2"))
    assert state.online == {"r1", "r2"} and state.segments_to_acquire("r1") == 2  # round(3 / 2) = 2
    state = apply_all(state, AcquireSegment("r1", A0), AcquireSegment("r1", B0), AcquireSegment("r2", A1))
    assert dict(state.segments_of("r1")) == {A0: 0, B0: 0} and not state.unassigned
    # A reader gives a segment back only at its recorded offset (where it acquired it, or checkpointed).
    with pytest.raises(InvalidArgumentError, match="recorded offset"):
        state.apply(ReleaseSegment("r1", A0, 2))
    state = apply_all(state, ReleaseSegment("r1", A0, 0))
    assert dict(state.unassigned) == {A0: 0}
    # Leaving with positions returns the segments there; without, at the recorded offsets.
    state = apply_all(state, RemoveReader("r1", {B0: 3}), RemoveReader("r2"))
    assert dict(state.unassigned) == {A0: 0, B0: 3, A1: 0} and not state.readers


def test_bad_updates_raise_typed_errors_and_change_nothing() -> None:
    state = apply_all(initial(), AddReader("r1"), AcquireSegment("r1", A0))
    snapshot = state.to_json_object()
    for update, error in [
        (AddReader("r1"), ReaderExistsError),
        (AcquireSegment("ghost", A1), ReaderNotInGroupError),
        (AcquireSegment("r1", A0), InvalidArgumentError),  # not unassigned
        (ReleaseSegment("r1", A1, 0), InvalidArgumentError),  # not held
        (SegmentCompleted("r1", A1, 3, successors(A1)), InvalidArgumentError),  # not held
        (SegmentCompleted("r1", A0, 4, {A4: frozenset({A1, A3})}), InvalidArgumentError),  # not its successor
        (RemoveReader("r1", {A1: 2}), InvalidArgumentError),  # a position of a segment it does not hold
        (CheckpointReader("c", "r1", {A0: 1}), InvalidArgumentError),  # no such checkpoint
        (UpdateDistanceToTail("ghost", 1.0), ReaderNotInGroupError),
        (ReaderGroupStateInit(CONFIG, 0, START, {}), InvalidArgumentError),  # not a newer generation
        (AddReader(""), InvalidArgumentError),
        (CreateCheckpoint("bad\nname"), InvalidArgumentError),
    ]:
        with pytest.raises(error):
            state.apply(update)
        assert state.to_json_object() == snapshot


def test_successor_of_a_split_is_readable_at_once_and_of_a_merge_only_after_both_predecessors() -> None:
    state = apply_all(initial(), AddReader("r1"), AcquireSegment("r1", A0), AcquireSegment("r1", A1))
    # A0 (split into A2, A3) completes: both successors have no other predecessor.
    state = apply_all(state, SegmentCompleted("r1", A0, 4, successors(A0)))
    assert dict(state.unassigned) == {A2: 0, A3: 0, B0: 0} and not state.future
    # A1 completes: A4 still waits for A3, and A1's end stays in the state for checkpoints' cuts.
    state = apply_all(state, SegmentCompleted("r1", A1, 3, successors(A1)))
    assert A4 not in state.unassigned and state.future[A4].waiting == {A3} and dict(state.completed) == {A1: 3}
    checkpointed = apply_all(state, CreateCheckpoint("c"))
    assert dict(checkpointed.checkpoint("c").positions) == {A1: 3, A2: 0, A3: 0, B0: 0}
    checkpoint = apply_all(checkpointed, CheckpointReader("c", "r1", {})).checkpoint("c")  # r1 holds nothing now
    assert checkpoint is not None and checkpoint.complete and covers(checkpoint.positions)
    state = apply_all(state, AcquireSegment("r1", A3), SegmentCompleted("r1", A3, 2, successors(A3)))
    assert state.unassigned[A4] == 0 and not state.future and not state.completed


def test_a_reader_owing_a_checkpoint_neither_acquires_releases_nor_completes() -> None:
    state = apply_all(initial(), AddReader("r1"), AddReader("r2"), AcquireSegment("r1", A0),
                      CreateCheckpoint("c1"))
    for update in (AcquireSegment("r1", A1), ReleaseSegment("r1", A0, 0),
                   SegmentCompleted("r1", A0, 4, successors(A0))):
        with pytest.raises(InvalidArgumentError, match="owes checkpoint"):
            state.apply(update)
    with pytest.raises(InvalidArgumentError):  # positions for every segment it holds, not fewer
        state.apply(CheckpointReader("c1", "r1", {}))
    with pytest.raises(InvalidArgumentError):  # not the checkpoint it owes
        state.apply(CheckpointReader("c2", "r1", {A0: 1}))
    state = apply_all(state, CheckpointReader("c1", "r1", {A0: 3}))
    assert state.segments_of("r1")[A0] == 3 and state.free("r1") and not state.checkpoint("c1").complete
    with pytest.raises(InvalidArgumentError):  # never behind its recorded offset
        apply_all(state, CreateCheckpoint("c2")).apply(CheckpointReader("c2", "r1", {A0: 2}))
    # r2 crashes: the checkpoint takes its (empty) recorded positions and completes.
    state = apply_all(state, RemoveReader("r2"))
    done = state.checkpoint_value("c1")
    assert done == Checkpoint("c1", {"s/a": StreamCut("s/a", {0: 3, 1: 0}), "s/b": StreamCut("s/b", {0: 0})})
    assert Checkpoint.from_json(done.to_json()) == done
    # Right after a checkpoint the reader may release at the checkpointed offset.
    state = apply_all(state, ReleaseSegment("r1", A0, 3))
    assert state.unassigned[A0] == 3


def test_checkpoints_in_progress_are_limited_and_completed_ones_kept_within_bounds() -> None:
    state = apply_all(initial(), AddReader("r1"))
    for index in range(limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX):
        state = apply_all(state, CreateCheckpoint(f"c{index}"))
    with pytest.raises(CheckpointLimitError):
        state.apply(CreateCheckpoint("one-too-many"))
    with pytest.raises(InvalidArgumentError):
        state.apply(CheckpointReader("c1", "r1", {}))  # c0 comes first
    for index in range(limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX):
        state = apply_all(state, CheckpointReader(f"c{index}", "r1", {}))
    for index in range(limits.READER_GROUP_CHECKPOINTS_KEPT + 2):
        state = apply_all(state, CreateCheckpoint(f"d{index}"), CheckpointReader(f"d{index}", "r1", {}))
    names = [c.name for c in state.checkpoints]
    kept = limits.READER_GROUP_CHECKPOINTS_KEPT
    assert len(names) == kept and names[-1] == f"d{kept + 1}"
    with pytest.raises(InvalidArgumentError):
        state.apply(CreateCheckpoint(names[-1]))  # names are unique


def test_silent_checkpoints_and_reset() -> None:
    state = apply_all(initial(), AddReader("r1"), AcquireSegment("r1", A0), CreateCheckpoint("cuts#silent"),
                      CreateCheckpoint("c"))
    assert state.pending_checkpoint("r1").silent and state.pending_checkpoint("r1").name == "cuts#silent"
    # A reset drops checkpoints in progress; readers stay online, holding nothing.
    state = apply_all(state, ReaderGroupStateInit(CONFIG, 1, {A2: 1, A3: 0, A1: 2, B0: 5}, {B0: 9}))
    assert state.generation == 1 and state.online == {"r1"} and not state.segments_of("r1")
    assert not state.checkpoints and dict(state.unassigned) == {A2: 1, A3: 0, A1: 2, B0: 5}
    assert dict(state.end_offsets) == {B0: 9}


def test_a_segment_with_nothing_after_it_ends_and_the_group_finishes() -> None:
    config = ReaderGroupConfig(["s/b"], automatic_checkpoint_seconds=0)
    state = apply_all(ReaderGroupState.initial(config, 0, {B0: 0}, {B0: 4}), AddReader("r"), AcquireSegment("r", B0))
    assert not state.finished
    state = apply_all(state, SegmentCompleted("r", B0, 4, {}))
    assert state.finished and dict(state.ended) == {B0: 4}
    assert dict(apply_all(state, CreateCheckpoint("end")).checkpoint("end").positions) == {B0: 4}


def test_rebalancing_policy() -> None:
    state = apply_all(initial(), AddReader("r1"))
    assert state.segments_to_acquire("r1") == 3  # alone: everything
    state = apply_all(state, *[AcquireSegment("r1", s) for s in (A0, A1, B0)], AddReader("r2"))
    assert state.ranking("r1") == 0 and state.ranking("r2") == 1
    assert state.should_release("r1") and not state.should_release("r2")  # 3 > 0 + max(1, 0)
    assert state.release_choice("r1", [A0, A1]) in (A0, A1) and state.release_choice("r1", []) is None
    state = apply_all(state, ReleaseSegment("r1", A0, 0))
    assert state.should_release("r1")  # 2 > 0 + max(1, 1): Pravega's rule (the release timer paces it)
    assert state.segments_to_acquire("r2") == 1
    assert not apply_all(state, AcquireSegment("r2", A0)).should_release("r1")  # 2 > 1 + max(1, 0) is false
    # A lagging reader counts as more loaded (its lag beyond the assumed lag scales its load).
    lagging = apply_all(state, UpdateDistanceToTail("r2", 4 * limits.READER_ASSUMED_LAG_SECONDS),
                        AcquireSegment("r2", A0))
    loads = lagging.relative_loads()
    assert loads["r2"] == 1.0 and loads["r1"] == 0.5 and lagging.ranking("r2") == 0
    assert sorted(state.acquisition_order("r2")) == sorted(state.unassigned)


def test_updates_round_trip_through_json() -> None:
    updates: list[ReaderGroupUpdate] = [
        ReaderGroupStateInit(CONFIG, 3, START, {B0: 2}), AddReader("r"), RemoveReader("r"), RemoveReader("r", {A0: 1}),
        AcquireSegment("r", A0), ReleaseSegment("r", A0, 2), SegmentCompleted("r", A1, 3, successors(A1)),
        SegmentCompleted("r", B0, 3), UpdateDistanceToTail("r", 1.5), CreateCheckpoint("c"),
        CheckpointReader("c", "r", {A0: 2, B0: 1})]
    for update in updates:
        assert ReaderGroupUpdate.from_json_object(json.loads(canonical_json(update.to_json_object()))) == update
    for bad in ({"type": "nope"}, {"type": "add_reader"}, {"type": "update_distance_to_tail", "reader": "r",
                                                              "lag_seconds": -1}, [1]):
        with pytest.raises(InvalidArgumentError):
            ReaderGroupUpdate.from_json_object(bad)
    with pytest.raises(InvalidArgumentError):
        ReaderGroupState.from_json_object({"config": {}})


# --- The state machine -----------------------------------------------------------------------------

READERS = ("r1", "r2", "r3")


class ReaderGroupStateMachine(RuleBasedStateMachine):
    """Readers join, acquire, read, complete, release, checkpoint, crash and reset, choosing among the
    updates the state allows; every step keeps the invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.state = initial()
        self.read: dict[str, dict[str, int]] = {}  # reader -> segment -> how far it read
        self.completed: set[str] = set()  # segments completed since the last reset
        self.generation = 0

    def step(self, *updates: ReaderGroupUpdate) -> None:
        self.state = apply_all(self.state, *updates)

    def sync_reads(self) -> None:
        """Readers forget segments the state no longer gives them, and start new ones at the recorded offset."""
        for reader in list(self.read):
            if reader not in self.state.readers:
                del self.read[reader]
        for reader in self.state.readers:
            mine = self.state.segments_of(reader)
            positions = self.read.setdefault(reader, {})
            for segment in [s for s in positions if s not in mine]:
                del positions[segment]
            for segment, offset in mine.items():
                positions.setdefault(segment, offset)

    @rule(reader=st.sampled_from(READERS))
    def add_reader(self, reader: str) -> None:
        if reader in self.state.readers:
            with pytest.raises(ReaderExistsError):
                self.state.apply(AddReader(reader))
            return
        self.step(AddReader(reader))
        self.sync_reads()

    @rule(data=st.data())
    def acquire_segment(self, data: st.DataObject) -> None:
        free = [r for r in sorted(self.state.readers) if self.state.free(r)]
        if not free or not self.state.unassigned:
            return
        reader = data.draw(st.sampled_from(free))
        segment = data.draw(st.sampled_from(sorted(self.state.unassigned)))
        self.step(AcquireSegment(reader, segment))
        self.sync_reads()

    @rule(data=st.data())
    def read_next_event(self, data: st.DataObject) -> None:
        choices = [(r, s) for r in sorted(self.read) for s, o in sorted(self.read[r].items()) if o < length(s)]
        if choices:
            reader, segment = data.draw(st.sampled_from(choices))
            self.read[reader][segment] += 1

    @rule(data=st.data())
    def segment_completed(self, data: st.DataObject) -> None:
        choices = [(r, s) for r in sorted(self.read) if self.state.free(r)
                   for s, o in sorted(self.read[r].items()) if s in LENGTHS and o == LENGTHS[s]]
        if not choices:
            return
        reader, segment = data.draw(st.sampled_from(choices))
        before = set(self.state.unassigned)
        self.step(SegmentCompleted(reader, segment, LENGTHS[segment], successors(segment)))
        self.completed.add(segment)
        for successor in set(self.state.unassigned) - before:
            # A successor is handed out only once every predecessor has been read to its end.
            assert predecessors(successor) <= self.completed, (successor, self.completed)
        self.sync_reads()

    @rule(data=st.data())
    def release_segment(self, data: st.DataObject) -> None:
        choices = [(r, s) for r in sorted(self.read) if self.state.free(r)
                   for s, o in sorted(self.read[r].items()) if o == self.state.segments_of(r)[s]]
        if not choices:
            return
        reader, segment = data.draw(st.sampled_from(choices))
        self.step(ReleaseSegment(reader, segment, self.read[reader][segment]))
        self.sync_reads()

    @precondition(lambda self: len(self.state.outstanding_checkpoints)
                  < limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX)
    @rule()
    def create_checkpoint(self) -> None:
        self.step(CreateCheckpoint(f"c{self.state.checkpoints_created}"))

    @rule(data=st.data())
    def checkpoint_reader(self, data: st.DataObject) -> None:
        owing = [r for r in sorted(self.state.readers) if self.state.pending_checkpoint(r) is not None]
        if not owing:
            return
        reader = data.draw(st.sampled_from(owing))
        owed = self.state.pending_checkpoint(reader)
        assert owed is not None
        self.step(CheckpointReader(owed.name, reader, dict(self.read[reader])))

    @rule(data=st.data(), graceful=st.booleans())
    def reader_offline(self, data: st.DataObject, graceful: bool) -> None:
        if not self.state.readers:
            return
        reader = data.draw(st.sampled_from(sorted(self.state.readers)))
        self.step(RemoveReader(reader, dict(self.read[reader]) if graceful else None))
        self.sync_reads()

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        done = [c for c in self.state.checkpoints if c.complete]
        if not done:
            return
        checkpoint = data.draw(st.sampled_from(done))
        self.generation += 1
        self.step(ReaderGroupStateInit(CONFIG, self.generation, dict(checkpoint.positions), {}))
        self.completed = {s for s in checkpoint.positions if s in LENGTHS and checkpoint.positions[s] == LENGTHS[s]}
        self.sync_reads()

    @rule(reader=st.sampled_from(READERS), lag=st.floats(0, 100))
    def update_distance_to_tail(self, reader: str, lag: float) -> None:
        if reader in self.state.readers:
            self.step(UpdateDistanceToTail(reader, lag))

    @invariant()
    def completed_checkpoints_cover_every_stream(self) -> None:
        for checkpoint in self.state.checkpoints:
            if checkpoint.complete:
                assert covers(checkpoint.positions), checkpoint

    @invariant()
    def recorded_offsets_never_run_ahead_of_reading(self) -> None:
        for reader, positions in self.read.items():
            for segment, offset in self.state.segments_of(reader).items():
                assert offset <= positions[segment]

    @invariant()
    def what_the_group_holds_covers_the_key_space(self) -> None:
        # Held segments with the completed predecessors futures wait beside and the ended segments:
        # exactly what a checkpoint created now starts from (with the readers' positions).
        assert covers(set(self.state.held) | set(self.state.completed) | set(self.state.ended)), self.state


#: Fast by default (a few seconds); the nightly profile explores far more.
ReaderGroupStateMachine.TestCase.settings = settings(max_examples=2000 if NIGHTLY else 80,
                                   stateful_step_count=100 if NIGHTLY else 40, deadline=None)
TestReaderGroupState = ReaderGroupStateMachine.TestCase


def test_boundaries_the_sampled_mutants_found_unchecked() -> None:
    """A reader exactly at the tail (lag 0) is a valid heartbeat, also read back from the state
    segment; a checkpoint refuses a cut that is not of the stream it is filed under.  Kills ``0 <=
    lag`` -> ``0 < lag`` in ``UpdateDistanceToTail.decode`` and the mutant skipping ``Checkpoint``'s
    check of its cuts."""
    at_tail = UpdateDistanceToTail("r1", 0.0)
    assert ReaderGroupUpdate.from_json_object(json.loads(canonical_json(at_tail.to_json_object()))) == at_tail
    with pytest.raises(InvalidArgumentError, match="must be a StreamCut of it"):
        Checkpoint("c1", {"s/a": StreamCut("s/b", {0: 0})})
    with pytest.raises(InvalidArgumentError, match="must be a StreamCut of it"):
        # (a plain dict where a StreamCut belongs, on purpose: the refusal is what is tested)
        Checkpoint("c1", {"s/a": StreamCut("s/a", {0: 0}), "s/b": {0: 0}})  # type: ignore[dict-item]


def test_a_group_may_hold_exactly_the_most_segments_and_not_one_more() -> None:
    """``READER_GROUP_SEGMENTS_MAX`` segments are allowed (``initial`` and the invariants agree), one
    more is refused.  Kills ``len(held) <= ...`` -> ``<`` in ``check_invariants``."""
    most = limits.READER_GROUP_SEGMENTS_MAX
    start = {B0: 0, **{stream_segment_name("s", "a", segment_id(0, n)): 0 for n in range(most - 1)}}
    assert len(start) == most
    ReaderGroupState.initial(CONFIG, 0, start, {}).check_invariants()
    with pytest.raises(InvalidArgumentError, match="at most"):
        ReaderGroupState.initial(CONFIG, 0, {**start, stream_segment_name("s", "a", segment_id(0, most)): 0}, {})
