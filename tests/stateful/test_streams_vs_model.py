"""Streams, scaling and a reader group, in lockstep with the model (``millstream.model.stream_ordering``,
the executable mirror of ``spec/StreamOrdering.tla``).

Hypothesis drives a real node -- a segment store on the simulated tiers with the controller attached,
reached by real clients over TCP (``tests.trace.stream_run.StreamRun``) -- and the model.  Every rule
is an environment choice named after the model transition it starts: writers write events
(``write_event``; they travel while later rules run) and wait for them (``flush``); the stream scales
by hand (``create_successors``: a split of a segment in two at any cell boundary, or a merge of two
adjacent ones) or by the auto-scaler on the controller's manual clock (``auto_scale``: a segment made
hot splits, two adjacent ones made cold merge); readers join (``add_reader``), read
(``read_next_event``), leave at their persisted position and crash (``reader_offline``: declared
offline by the application, or by the other readers once silent for their timeout); time passes on the
readers' clock (``advance_time``: heartbeats, rebalancing); the application checkpoints
(``create_checkpoint``) and resets to a completed checkpoint (``reset``).

After each rule the steps the implementation took -- read off its durable state (the controller's
epochs, the segments' contents, the reader group's state segment) and what it returned to the
application -- are replayed on the model (``tests.trace.stream_replay``), each checked to be a step
the model allows with the values the implementation reported.  Then the two must agree on what
clients observe: every segment's events and whether it is sealed, the epochs, the group's state
(who holds what at which recorded offset, the unassigned and future segments, every checkpoint),
where the reader that just read stands, and the model's invariants hold over the implementation's
history -- ``NoDuplicateReads``, ``PerKeyOrder`` and ``ExactlyOnceAfterReset`` are about the events
the implementation's readers returned.  At the end of each example the group reads everything
(liveness), and the history checker judges the delivery: per-key order across scaling and readers, no
event twice between a checkpoint and the next reset (reads lost with a crashed reader excepted),
exactly once after each reset (nothing the application had processed before the checkpoint, every
event after it), nothing lost.

Bounds: two writers, three readers, eight cells (keys) starting in two segments, eight events per
writer, four scales, four checkpoints, three crashes or leaves, two resets.  Default profile: 15
examples x 25 steps (7-11 s here); nightly: 400 x 60.

Seeded by hand once (a successor made acquirable as soon as any one of its predecessors completed):
the test failed after a merge, the group's unassigned segments holding the successor the model
still kept waiting.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream import limits
from millstream.model import stream_ordering as so
from millstream.testing.history import EventTag, History, Outcome, check
from tests.trace.stream_replay import Replay
from tests.trace.stream_run import StreamRun

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"

WRITERS = ("w1", "w2")
READERS = ("r1", "r2", "r3")
GRID = 8
INITIAL_SEGMENTS = 2
EVENTS_PER_WRITER = 8
MAX_SCALES = 4
MAX_CHECKPOINTS = 4
MAX_CRASHES = 3
MAX_RESETS = 2
#: The final drain's bound: rounds of (every reader reads, a second passes).
DRAIN_ROUNDS_MAX = 80


@attrs.define
class _Read:
    """One event a reader returned: in which pass, by whom, where (model segment, 1-based offset)."""

    pass_name: str
    reader: str
    segment: int
    offset: int
    payload: bytes
    lost: bool = False


class Delivery:
    """The history of one run for the checker: writes, and reads grouped into passes (one per reset),
    with the reads a crash lost forgotten and each reset's pass resuming from its checkpoint."""

    def __init__(self) -> None:
        self.history = History()
        self.passes = 0
        self.pass_name = "p0"
        self.reads: list[_Read] = []
        self.created: dict[int, tuple[str, int]] = {}  # checkpoint -> (its pass, reads before it)
        self.unacked: dict[str, list[EventTag]] = {w: [] for w in WRITERS}

    def written(self, writer: str, number: int, key: str) -> None:
        tag = EventTag(writer, number)
        self.history.write_invoked(tag, key=key)
        self.unacked[writer].append(tag)

    def flushed(self, writer: str) -> None:
        self.history.writes_completed(self.unacked[writer], Outcome.ACKED)
        self.unacked[writer] = []

    def step(self, step: dict[str, Any]) -> None:
        action = step["a"]
        if action == "ReadNextEvent":
            self.reads.append(_Read(self.pass_name, step["r"], step["s"], step["o"], step["payload"]))
            self.history.read(self.pass_name, step["payload"])
        elif action == "ReaderOffline":
            # What the reader returned beyond the offsets its segments go back at is lost with it.
            returned = step["positions"]
            for read in self.reads:
                if read.pass_name == self.pass_name and read.reader == step["r"] and not read.lost \
                        and read.segment in returned and read.offset > returned[read.segment]:
                    read.lost = True
                    self.history.forget(self.pass_name, read.payload)
        elif action == "CreateCheckpoint":
            self.created[step["i"]] = (self.pass_name, len(self.reads))
        elif action == "Reset":
            pass_name, before = self.created[step["i"]]
            processed = [r.payload for r in self.reads[:before] if r.pass_name == pass_name and not r.lost]
            self.passes += 1
            self.pass_name = f"p{self.passes}"
            self.history.resume(self.pass_name, processed)


class StreamsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.healthy = False
        self.run = StreamRun(grid=GRID, initial_segments=INITIAL_SEGMENTS, writers=WRITERS, seed=11,
                             offline_timeout=True)
        self.replay = Replay(so.initial_state(WRITERS, READERS, [], GRID, initial_splits=(GRID // 2,)))
        self.delivery = Delivery()
        self.crashes = 0
        self.last_reader: str | None = None
        self.take(self.run.initial_steps)
        self.healthy = True

    @property
    def model(self) -> so.StreamState:
        return self.replay.model

    def take(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.healthy = False  # (until the invariant below has passed)
        for step in steps:
            self.replay.apply(step)
            self.delivery.step(step)
        return steps

    def teardown(self) -> None:
        try:
            if self.healthy:
                self.drain_and_check()
        finally:
            self.run.close()

    # --- Writers -------------------------------------------------------------------------------------

    @precondition(lambda self: any(self.model.written[w] < EVENTS_PER_WRITER for w in WRITERS))
    @rule(data=st.data(), cell=st.integers(0, GRID - 1))
    def write_event(self, data: st.DataObject, cell: int) -> None:
        writer = data.draw(st.sampled_from([w for w in WRITERS if self.model.written[w] < EVENTS_PER_WRITER]),
                           label="writer")
        self.delivery.written(writer, self.model.written[writer] + 1, self.run.keys[cell])
        self.take(self.run.write_event(writer, cell))

    @rule(writer=st.sampled_from(WRITERS))
    def flush(self, writer: str) -> None:
        self.take(self.run.flush(writer))
        self.delivery.flushed(writer)
        assert not self.model.inflight[writer], \
            f"{writer} flushed, but the model still has {self.model.inflight[writer]}"

    # --- Scaling -------------------------------------------------------------------------------------

    @precondition(lambda self: self.model.scales < MAX_SCALES)
    @rule(data=st.data())
    def create_successors(self, data: st.DataObject) -> None:
        predecessors, ranges = data.draw(st.sampled_from(list(so.scale_requests(self.model))), label="scale")
        steps = self.take(self.run.scale(predecessors, ranges))
        created = [(s["preds"], s["ranges"]) for s in steps if s["a"] == "CreateSuccessors"]
        assert created == [(set(predecessors), [list(r) for r in ranges])], created

    def hot_candidates(self) -> list[int]:
        """Segments the auto-scaler can split in halves along cell boundaries (an even number of cells)."""
        return sorted(s for s in self.model.current if (self.model.segment(s).hi - self.model.segment(s).lo) % 2 == 0)

    def cold_candidates(self) -> list[tuple[int, int]]:
        if len(self.model.current) <= INITIAL_SEGMENTS:  # (the policy keeps min_segments)
            return []
        return [(s, t) for s in sorted(self.model.current) for t in sorted(self.model.current)
                if self.model.segment(s).hi == self.model.segment(t).lo]

    @precondition(lambda self: self.model.scales < MAX_SCALES and bool(self.hot_candidates() or self.cold_candidates()))
    @rule(data=st.data(), hot=st.booleans())
    def auto_scale(self, data: st.DataObject, hot: bool) -> None:
        """The auto-scaler splits a hot segment in halves, or merges two adjacent cold ones."""
        if (hot and self.hot_candidates()) or not self.cold_candidates():
            segment = data.draw(st.sampled_from(self.hot_candidates()), label="hot")
            low, high = self.model.segment(segment).lo, self.model.segment(segment).hi
            expected = ({segment}, [[low, (low + high) // 2], [(low + high) // 2, high]])
            steps, scaled = self.run.auto_scale(hot=[segment])
        else:
            pair = data.draw(st.sampled_from(self.cold_candidates()), label="cold")
            expected = (set(pair), [[self.model.segment(pair[0]).lo, self.model.segment(pair[1]).hi]])
            steps, scaled = self.run.auto_scale(cold=pair)
        self.take(steps)
        assert scaled, f"the auto-scaler did not act on {expected}"
        created = [s for s in steps if s["a"] == "CreateSuccessors"]
        assert [(s["preds"], s["ranges"]) for s in created] == [expected], (created, expected)

    # --- Readers -------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.model.online) < len(READERS))
    @rule(data=st.data())
    def add_reader(self, data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from([r for r in READERS if r not in self.model.online]), label="reader")
        self.take(self.run.add_reader(reader))
        assert reader in self.model.online

    def readable(self, reader: str) -> bool:
        """Whether the model says ``reader``'s next call must return an event (or its checkpoint)."""
        model = self.model
        if reader not in model.online:
            return False
        if model.at_checkpoint[reader] == 0 and model.pending(reader):
            return True  # it owes a checkpoint: the call returns it
        return any(o < len(model.data[s - 1]) for s, o in model.positions[reader].items())

    @precondition(lambda self: bool(self.model.online))
    @rule(data=st.data())
    def read_next_event(self, data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from(sorted(self.model.online)), label="reader")
        must = self.readable(reader)
        steps = self.take(self.run.read(reader, expect_event=must))
        returned = [s for s in steps if s["a"] in ("ReadNextEvent", "SurfaceCheckpoint")]
        if must:
            assert returned, f"{reader} returned nothing though the model has something for it to return"
        self.last_reader = reader

    @rule(seconds=st.integers(1, 3))
    def advance_time(self, seconds: int) -> None:
        self.take(self.run.advance(float(seconds)))

    @precondition(lambda self: bool(self.model.online) and self.crashes < MAX_CRASHES)
    @rule(data=st.data(), how=st.sampled_from(["leave", "crash", "timeout"]))
    def reader_offline(self, data: st.DataObject, how: str) -> None:
        reader = data.draw(st.sampled_from(sorted(self.model.online)), label="reader")
        self.crashes += 1
        if how == "leave":
            steps = self.run.leave(reader)
        else:
            steps = self.run.crash(reader, by_timeout=how == "timeout" and len(self.model.online) > 1)
        self.take(steps)
        assert reader not in self.model.online, f"{reader} is still online after it went away ({how})"

    # --- Checkpoints and resets ---------------------------------------------------------------------

    @precondition(lambda self: not self.model.checkpoint_in_progress and len(self.model.checkpoints) < MAX_CHECKPOINTS)
    @rule()
    def create_checkpoint(self) -> None:
        self.take(self.run.create_checkpoint(len(self.model.checkpoints) + 1))

    def resettable(self) -> list[int]:
        """Completed checkpoints the group still keeps (the newest few)."""
        complete = [i for i, c in enumerate(self.model.checkpoints, start=1) if c.complete]
        return complete[-limits.READER_GROUP_CHECKPOINTS_KEPT:]

    @precondition(lambda self: not self.model.checkpoint_in_progress and self.model.resets < MAX_RESETS
                  and any(c.complete for c in self.model.checkpoints))
    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        number = data.draw(st.sampled_from(self.resettable()), label="checkpoint")
        before = self.model.resets
        self.take(self.run.reset(number))
        assert self.model.resets == before + 1, (before, self.model.resets)
        assert dict(self.model.origin) == dict(self.model.checkpoints[number - 1].cut), self.model.origin

    # --- What clients observe ------------------------------------------------------------------------

    @invariant()
    def clients_observe_what_the_model_says(self) -> None:
        model, run = self.model, self.run
        model.check_invariants()  # over the implementation's delivery: no duplicate, per-key order, ...
        run.controller.check_invariants()
        # The stream: its epochs, every segment's events and whether it is sealed.
        history = run.controller.state.streams[("sc", "st")].history
        epochs = [frozenset(run.model_id(s.segment_id) for s in e.segments) for e in history.epochs]
        assert tuple(epochs) == model.epochs, (epochs, model.epochs)
        for model_id in range(1, len(model.segments) + 1):
            segment = run.segment_of(model_id)
            stored = [so.StoredEvent(w, n, k) for w, n, k in segment.events]
            assert tuple(stored) == model.data[model_id - 1], (model_id, stored, model.data[model_id - 1])
            assert run.is_sealed(model_id) == (model_id in model.sealed), model_id
        # The group's state.
        state = run.group_state()
        state.check_invariants()
        assert state.online == model.online, (state.online, model.online)
        for reader in READERS:
            assert run.counts(state.segments_of(reader)) == dict(model.assigned[reader]), \
                f"{reader} holds {run.counts(state.segments_of(reader))}, in the model {dict(model.assigned[reader])}"
        assert run.counts(state.unassigned) == dict(model.unassigned), \
            f"unassigned: the group's state has {run.counts(state.unassigned)}, the model {dict(model.unassigned)}"
        future = {run.segments[t].model_id: {run.segments[p].model_id for p in f.waiting}
                  for t, f in state.future.items()}
        assert future == {t: set(waits) for t, waits in model.future.items()}, (future, dict(model.future))
        assert run.counts(state.completed) == {p: len(model.data[p - 1]) for p in model.completed_waiting}, \
            (run.counts(state.completed), model.completed_waiting)
        kept = {c.name: c for c in state.checkpoints}
        for number, checkpoint in enumerate(model.checkpoints, start=1):
            mine = kept.get(f"c{number}")
            if mine is None:  # dropped: the group keeps only the newest completed ones
                assert checkpoint.complete
                continue
            assert mine.pending == checkpoint.pending and run.counts(mine.positions) == dict(checkpoint.cut), number
        # Where the reader that just read stands (it has taken in the group's state during its call).
        reader = self.last_reader
        if reader is not None and reader in run.readers and reader in model.online:
            assert run.positions(reader) == dict(model.positions[reader]), (reader, run.positions(reader))
        self.last_reader = None
        self.healthy = True

    # --- The end: read everything, judge the history ------------------------------------------------

    def drain_and_check(self) -> None:
        run = self.run
        for writer in WRITERS:
            self.flush(writer)
        if not self.model.online:
            self.take(run.add_reader(next(r for r in READERS if r not in self.model.online)))
        for _ in range(DRAIN_ROUNDS_MAX):
            if self.model.drained and not self.model.checkpoint_in_progress:
                break
            for reader in sorted(self.model.online):
                for _ in range(4):
                    self.take(run.read(reader, expect_event=self.readable(reader)))
            self.take(run.advance(1.0))
        else:
            raise AssertionError(f"the group did not read everything: {self.model.unassigned=} {self.model.future=} "
                                 f"{dict(self.model.positions)=}")
        self.clients_observe_what_the_model_says()
        self.delivery.history.pass_complete(self.delivery.pass_name)
        report = check(self.delivery.history)
        assert report.ok, report.summary()


StreamsMachine.TestCase.settings = settings(
    max_examples=400 if NIGHTLY else 15, stateful_step_count=60 if NIGHTLY else 25, deadline=None)
test_streams_vs_model = StreamsMachine.TestCase
