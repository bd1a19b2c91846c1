"""``ReaderGroupState`` in lockstep with the reader-group part of ``millstream.model.stream_ordering``
(the executable mirror of ``spec/StreamOrdering.tla``).

Hypothesis drives the model -- a writer, scaling (splits and merges in the spec's four steps) and a
reader group -- and replays every group action on the implementation's pure state as the update the
reader code would write: ``AcquireSegment``, ``ReleaseSegment``, ``SegmentCompleted`` (with the
successors and all their predecessors, as the controller gives them), ``CreateCheckpoint``,
``CheckpointReader`` (the model's ``surface_checkpoint`` then ``checkpoint_reader``: the reader records
on the call after the one that surfaced it), ``RemoveReader`` (a crash: recorded offsets) and
``ReaderGroupStateInit`` (a reset to a checkpoint).  After every step the two agree on who holds what
at which recorded offset, the unassigned offsets, the futures and what they wait for, the completed
predecessors' ends and every checkpoint (who still owes it, its positions).  Where the model refuses an
update because a reader owes a checkpoint or the segment is not there to take, the implementation
refuses it too.  (The model's load guards on acquire and release are the implementation's timers and
policy, not its state's rules: the test takes only steps the model allows.)
"""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.client import ReaderGroupConfig
from millstream.client._reader_group import (
    AcquireSegment,
    AddReader,
    CheckpointReader,
    CreateCheckpoint,
    ReaderGroupState,
    ReaderGroupStateInit,
    ReleaseSegment,
    RemoveReader,
    SegmentCompleted,
)
from millstream.errors import MillstreamError
from millstream.model import stream_ordering as so
from millstream.naming import segment_id, stream_segment_name

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"

READERS = ("r1", "r2", "r3")
GRID = 4
CONFIG = ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0)
MAX_SCALES = 3
MAX_CHECKPOINTS = 6
MAX_CRASHES = 2
MAX_RESETS = 2


class Lockstep(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = so.initial_state(["w"], READERS, ["r1"], GRID, initial_splits=(2,))
        self.impl = ReaderGroupState.initial(CONFIG, 0, {self.name(s): 0 for s in self.model.unassigned}, {})
        self.impl = self.impl.apply(AddReader("r1"))
        self.generation = 0

    # --- Naming ------------------------------------------------------------------------------------

    def name(self, model_id: int) -> str:
        """The implementation's name of model segment ``model_id`` (epoch 1 is epoch 0 there)."""
        return stream_segment_name("s", "a", segment_id(self.model.segment(model_id).epoch - 1, model_id))

    def names(self, offsets: so.Offsets) -> dict[str, int]:
        return {self.name(s): o for s, o in offsets.items()}

    def step_model(self, transition: object, *args: object) -> bool:
        try:
            self.model = transition(self.model, *args)  # type: ignore[operator]
        except so.NotEnabled:
            return False
        return True

    # --- The writer and the controller (the model only: they give the segments their lengths) ------

    @rule(key=st.integers(0, GRID - 1))
    def write_event(self, key: int) -> None:
        self.model = so.write_event(self.model, "w", key)
        for _ in range(8):  # route through seals until the event is stored
            pending = self.model.inflight["w"]
            if not pending:
                return
            segment = pending[0].segment
            if not (self.step_model(so.append_event, "w", segment) or self.step_model(so.segment_sealed, "w", segment)):
                raise AssertionError(f"the writer is stuck on segment {segment}")
            self.step_model(so.ack_event, "w", segment)

    @precondition(lambda self: self.model.scales < MAX_SCALES)
    @rule(data=st.data())
    def scale(self, data: st.DataObject) -> None:
        predecessors, ranges = data.draw(st.sampled_from(list(so.scale_requests(self.model))))
        self.model = so.create_successors(self.model, predecessors, ranges)
        for transition in (so.record_epoch, so.seal_predecessors, so.activate_epoch):
            self.model = transition(self.model)

    # --- The reader group, on both ------------------------------------------------------------------

    @precondition(lambda self: self.model.online != set(READERS))
    @rule(reader=st.sampled_from(READERS))
    def add_reader(self, reader: str) -> None:
        if self.step_model(so.add_reader, reader):
            self.impl = self.impl.apply(AddReader(reader))

    def enabled(self, transition: object, pairs: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The (reader, segment) pairs for which the model allows ``transition`` now."""
        allowed = []
        for reader, segment in pairs:
            try:
                transition(self.model, reader, segment)  # type: ignore[operator]
            except so.NotEnabled:
                continue
            allowed.append((reader, segment))
        return allowed

    def held_pairs(self) -> list[tuple[str, int]]:
        return [(r, s) for r in READERS for s in sorted(self.model.assigned[r])]

    @precondition(lambda self: bool(self.model.unassigned))
    @rule(data=st.data())
    def acquire_segment(self, data: st.DataObject) -> None:
        pairs = [(r, s) for r in READERS for s in sorted(self.model.unassigned)]
        allowed = self.enabled(so.acquire_segment, pairs)
        for reader, segment in pairs:
            if reader in self.model.online and not self.model.free(reader):
                refused(self.impl, AcquireSegment(reader, self.name(segment)))
        if allowed:
            reader, segment = data.draw(st.sampled_from(allowed))
            self.model = so.acquire_segment(self.model, reader, segment)
            self.impl = self.impl.apply(AcquireSegment(reader, self.name(segment)))

    @precondition(lambda self: any(o < len(self.model.data[s - 1]) for r in READERS
                                   for s, o in self.model.positions[r].items()))
    @rule(data=st.data(), to_the_end=st.booleans())
    def read_next_event(self, data: st.DataObject, to_the_end: bool) -> None:
        allowed = self.enabled(so.read_next_event, [(r, s) for r in READERS for s in sorted(self.model.positions[r])])
        if allowed:
            reader, segment = data.draw(st.sampled_from(allowed))
            while self.step_model(so.read_next_event, reader, segment) and to_the_end:
                pass

    def completion(self, reader: str, segment: int) -> SegmentCompleted:
        successors = {self.name(t): frozenset(self.name(p) for p in self.model.predecessors(t))
                      for t in self.model.successors(segment)}
        return SegmentCompleted(reader, self.name(segment), len(self.model.data[segment - 1]), successors)

    @precondition(lambda self: any(s in self.model.sealed for _, s in self.held_pairs()))
    @rule(data=st.data())
    def segment_completed(self, data: st.DataObject) -> None:
        for reader, segment in self.held_pairs():
            if segment in self.model.sealed and not self.model.free(reader):
                refused(self.impl, self.completion(reader, segment))
        allowed = self.enabled(so.segment_completed, self.held_pairs())
        if allowed:
            reader, segment = data.draw(st.sampled_from(allowed))
            update = self.completion(reader, segment)
            self.model = so.segment_completed(self.model, reader, segment)
            self.impl = self.impl.apply(update)

    @precondition(lambda self: len(self.held_pairs()) > 1)
    @rule(data=st.data())
    def release_segment(self, data: st.DataObject) -> None:
        for reader, segment in self.held_pairs():
            if not self.model.free(reader):
                refused(self.impl, ReleaseSegment(reader, self.name(segment), self.model.assigned[reader][segment]))
        allowed = self.enabled(so.release_segment, self.held_pairs())
        if allowed:
            reader, segment = data.draw(st.sampled_from(allowed))
            offset = self.model.assigned[reader][segment]
            self.model = so.release_segment(self.model, reader, segment)
            self.impl = self.impl.apply(ReleaseSegment(reader, self.name(segment), offset))

    @precondition(lambda self: len(self.model.checkpoints) < MAX_CHECKPOINTS)
    @rule()
    def create_checkpoint(self) -> None:
        if self.step_model(so.create_checkpoint):
            self.impl = self.impl.apply(CreateCheckpoint(f"c{len(self.model.checkpoints)}"))

    @precondition(lambda self: self.model.checkpoint_in_progress)
    @rule(data=st.data())
    def checkpoint_reader(self, data: st.DataObject) -> None:
        # read_next_event returns the checkpoint; the next call records the reader's positions.
        owing = sorted(r for r in self.model.online if self.model.pending(r))
        if not owing:
            return
        reader = data.draw(st.sampled_from(owing))
        self.model = so.surface_checkpoint(self.model, reader)
        number = self.model.at_checkpoint[reader]
        positions = self.names(self.model.positions[reader])
        self.model = so.checkpoint_reader(self.model, reader)
        self.impl = self.impl.apply(CheckpointReader(f"c{number}", reader, positions))

    @precondition(lambda self: bool(self.model.online) and self.model.crashes < MAX_CRASHES)
    @rule(reader=st.sampled_from(READERS))
    def reader_offline(self, reader: str) -> None:
        if self.step_model(so.reader_offline, reader):
            self.impl = self.impl.apply(RemoveReader(reader))

    @precondition(lambda self: bool(self.model.checkpoints) and not self.model.checkpoint_in_progress
                  and self.model.resets < MAX_RESETS)
    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        if not self.model.checkpoints:
            return
        number = data.draw(st.integers(1, len(self.model.checkpoints)))
        cut = self.model.checkpoints[number - 1].cut
        if self.step_model(so.reset, number):
            self.generation += 1
            self.impl = self.impl.apply(ReaderGroupStateInit(CONFIG, self.generation, self.names(cut), {}))

    # --- Agreement ---------------------------------------------------------------------------------

    @invariant()
    def the_states_agree(self) -> None:
        model, impl = self.model, self.impl
        impl.check_invariants()
        model.check_invariants()
        assert impl.online == model.online
        for reader in READERS:
            assert dict(impl.segments_of(reader)) == self.names(model.assigned[reader]), reader
        assert dict(impl.unassigned) == self.names(model.unassigned)
        assert {t: set(f.waiting) for t, f in impl.future.items()} == {
            self.name(t): {self.name(p) for p in waits} for t, waits in model.future.items()}
        assert dict(impl.completed) == {self.name(p): len(model.data[p - 1]) for p in model.completed_waiting}
        kept = {c.name: c for c in impl.checkpoints}
        for number, checkpoint in enumerate(model.checkpoints, start=1):
            mine = kept.get(f"c{number}")
            if mine is None:  # a reset drops checkpoints in progress; the model's guard allows none then
                assert checkpoint.complete
                continue
            assert mine.pending == checkpoint.pending and dict(mine.positions) == self.names(checkpoint.cut)


def refused(state: ReaderGroupState, update: object) -> None:
    """The implementation refuses ``update`` with a typed error (and a pure state cannot change)."""
    try:
        state.apply(update)  # type: ignore[arg-type]
    except MillstreamError:
        return
    raise AssertionError(f"the implementation accepted {update!r}, which the model refuses")


#: Fast by default (a few seconds); the nightly profile explores far more.
Lockstep.TestCase.settings = settings(max_examples=2000 if NIGHTLY else 80,
                                   stateful_step_count=100 if NIGHTLY else 40, deadline=None)
TestStateAgreesWithModel = Lockstep.TestCase
