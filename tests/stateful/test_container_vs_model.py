"""The segment container, in lockstep with the model, under Tier-1 faults.

Hypothesis drives a real ``SegmentContainer`` on the simulated Tier-1 log (writes complete only
when a rule says so: in order, late, failed, with unknown outcome, or lost in a crash that may
tear the last write).  The container reports each step it takes in the spec's vocabulary; every
reported step is replayed on the model (``millstream.model.durable_log``) -- it must be a step the
model allows -- and after every rule the two must agree on everything visible: each segment's
existence, length, start offset, sealed flag, attributes and readable bytes; what every caller
was told (acknowledged at which offset, rejected with which error, failed as unavailable); and
the frames on the log, entry by entry.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.errors import (
    ContainerUnavailableError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
)
from millstream.model import container_failover as cf
from millstream.model import durable_log as dl
from millstream.model.segment import Request
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType, OperationKind
from millstream.model.types import SegmentStatus as Status
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.data_frame import ENTRY_HEADER_LENGTH, FRAME_HEADER_LENGTH, decode_frame
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceRecorder
from tests.trace import container_failover_run as failover

SEGMENTS = ("a", "b", "c")
#: Small frames, so that records span frames often.
FRAME_BYTES_MAX = 160
#: Frequent checkpoints, so recovery meets several.
CHECKPOINT_FRAME_COUNT = 5
ATTRIBUTE_IDS = (1, 2, 2**127 + 5)
SETTLE_TURNS = 60

names = st.sampled_from(SEGMENTS)
payloads = st.binary(max_size=90)
attribute_updates = st.lists(
    st.builds(
        AttributeUpdate,
        st.sampled_from(ATTRIBUTE_IDS),
        st.sampled_from(list(AttributeUpdateType)),
        st.integers(-3, 3),
        st.sampled_from([NULL_ATTRIBUTE_VALUE, -1, 0, 1, 2]),
    ),
    max_size=2,
).map(tuple)


@attrs.frozen
class Issued:
    """A client call the test made, waiting for the container to report its Submit."""

    request: Request
    call: Any  # a zero-argument callable returning the container coroutine


class ContainerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.recorder = TraceRecorder()
        self.storage = SimulatedLogStorage(on_persisted=self.recorder.persisted)
        self.clock = ManualClock()
        self.model = dl.initial_state(dl.FrameLayout(FRAME_BYTES_MAX - FRAME_HEADER_LENGTH, ENTRY_HEADER_LENGTH))
        self.issued: deque[Issued] = deque()
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.pending_calls: deque[asyncio.Task[Any]] = deque()
        self.container: SegmentContainer
        self.log: SimulatedDurableDataLog
        self.start_container()

    def teardown(self) -> None:
        try:
            if self.container.state.value == "running":
                self.container.kill()
            self.settle(check=False)
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            for task in (*self.tasks.values(), *self.pending_calls):
                if task.done() and not task.cancelled():
                    task.exception()  # the example ended before its outcome was compared
            self.loop.close()

    # --- plumbing ------------------------------------------------------------------------------------

    def start_container(self) -> None:
        self.log = SimulatedDurableDataLog(self.storage, auto_complete=False)

        async def start() -> None:
            self.container = SegmentContainer(
                0, self.log, clock=self.clock, tracer=self.recorder, frame_bytes_max=FRAME_BYTES_MAX,
                checkpoint_frame_count=CHECKPOINT_FRAME_COUNT)
            await self.container.start()

        self.loop.run_until_complete(self.loop.create_task(start()))
        self.settle()

    def settle(self, *, check: bool = True) -> None:
        async def turns() -> None:
            for _ in range(SETTLE_TURNS):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())
        self.replay()
        if check:
            self.check_results()

    def issue(self, request: Request, call: Any) -> None:
        """Make a client call; the container reports it as Submit when it reaches the queue."""
        self.issued.append(Issued(request, call))
        self.pending_calls.append(self.loop.create_task(call()))

    @property
    def running(self) -> bool:
        return self.container.state.value == "running"

    # --- replaying the container's steps on the model ---------------------------------------------------

    def replay(self) -> None:
        for event in self.recorder.take():
            fields = event.fields
            model = self.model
            if event.action == "Submit":
                if fields["kind"] == "checkpoint":
                    request = Request(OperationKind.CHECKPOINT, "")
                    task = None
                else:
                    issued = self.issued.popleft()
                    request = issued.request
                    task = self.pending_calls.popleft()
                    assert (request.kind.value, request.segment) == (fields["kind"], fields["segment"]), fields
                self.model = dl.submit(model, request)
                if task is not None:
                    self.tasks[self.model.submitted] = task
            elif event.action == "Process":
                head = model.queue[0]
                sized = attrs.evolve(head, request=attrs.evolve(head.request, size=fields["size"]))
                self.model = dl.process(attrs.evolve(model, queue=(sized, *model.queue[1:])))
                result = self.model.results[head.id - 1]
                if fields["error"] is not None:
                    assert result.kind is dl.ResultKind.REJECTED, (fields, result)
                    assert result.error is not None and result.error.__name__ == fields["error"], (fields, result)
                else:
                    assert result.kind is dl.ResultKind.PENDING, (fields, result)
                    frames = (*self.model.pending, self.model.open_frame.entries)
                    last = next(e for frame in reversed(frames) for e in reversed(frame) if e.last)
                    assert last.operation.id == head.id
                    assert last.operation.sequence_number == fields["sequence_number"]
                    if head.request.kind is not OperationKind.CHECKPOINT:
                        assert last.operation.offset == fields["offset"], (fields, last)
            elif event.action == "SealFrame":
                assert fields["frame"] == len(model.log) + len(model.pending) + 1, fields
                self.model = dl.seal_frame(model)
            elif event.action == "Persist":
                assert fields["frame"] == len(model.log) + 1, fields
                self.model = dl.persist(model)
            elif event.action == "Complete":
                self.model = dl.complete(model, fields["frame"])
                sequence_numbers = {e.operation.id: e.operation.sequence_number
                                    for frame in self.model.log for e in frame if e.last}
                pairs = enumerate(zip(model.results, self.model.results, strict=True))
                newly_acked = sorted(sequence_numbers[i + 1] for i, (old, new) in pairs
                                     if old.kind is not dl.ResultKind.ACKED and new.kind is dl.ResultKind.ACKED)
                assert newly_acked == sorted(fields["acked"]), (fields, newly_acked)
            elif event.action == "FailWrite":
                self.model = dl.fail_write(model)
            elif event.action == "Crash":
                self.model = dl.crash(model)
            elif event.action == "Recover":
                self.model = dl.recover(model)
            else:
                raise AssertionError(f"unknown event {event}")
            self.model.check_invariants()

    # --- comparing -----------------------------------------------------------------------------------------

    def check_results(self) -> None:
        for operation_id, task in list(self.tasks.items()):
            result = self.model.results[operation_id - 1]
            if result.kind is dl.ResultKind.PENDING:
                assert not task.done(), (operation_id, task)
                continue
            assert task.done(), (operation_id, result)
            del self.tasks[operation_id]
            error = task.exception()
            if result.kind is dl.ResultKind.ACKED:
                assert error is None, (operation_id, error)
                value = task.result()
                if value is not None:
                    assert value == result.offset, (operation_id, value, result)
            elif result.kind is dl.ResultKind.REJECTED:
                assert type(error) is result.error, (operation_id, error, result)
            else:
                assert isinstance(error, ContainerUnavailableError), (operation_id, error)

    @invariant()
    def visible_state_agrees(self) -> None:
        if not self.running:
            return
        self.container.check_invariants()
        for name in SEGMENTS:
            expected = self.model.metadata.get(name)
            if expected is None or expected.status is Status.DELETED:
                self._expect_error(name, StreamSegmentNotExistsError)
                continue
            if expected.status is Status.MERGED:
                self._expect_error(name, StreamSegmentMergedError)
                continue
            info = self.container.get_info(name)
            assert (info.length, info.start_offset, info.sealed) == (
                expected.length, expected.start_offset, expected.status is Status.SEALED), (name, info, expected)
            assert info.attributes == dict(expected.attributes), (name, info, expected)
            readable = self.read_all(name, expected.start_offset, expected.length)
            assert readable == expected.readable(), name

    def _expect_error(self, name: str, error: type[Exception]) -> None:
        try:
            self.container.get_info(name)
        except error:
            return
        raise AssertionError(f"{name}: expected {error.__name__}")

    def read_all(self, name: str, start: int, length: int) -> bytes:
        async def read() -> bytes:
            parts, offset = [], start
            while offset < length:
                result = await self.container.read(name, offset, length - offset)
                parts.append(result.data)
                offset += len(result.data)
            return b"".join(parts)

        return self.loop.run_until_complete(read())

    @invariant()
    def log_agrees(self) -> None:
        durable = self.storage.records
        assert len(durable) == len(self.model.log), (len(durable), len(self.model.log))
        for (sequence, data), frame in zip(durable, self.model.log, strict=True):
            entries = [(e.sequence_number, e.first, e.last) for e in decode_frame(data, f"record {sequence}")]
            assert entries == [(e.operation.sequence_number, e.first, e.last) for e in frame], sequence
        if self.running:
            assert len(self.log.pending_sequences) == len(self.model.pending) + len(
                [k for k in self.model.unnotified]), (self.log.pending_sequences, self.model.pending)

    # --- client operations -------------------------------------------------------------------------------

    def _length_in_view(self, name: str) -> int:
        segment = self.model.view.get(name)
        return segment.length if segment is not None else 0

    @precondition(lambda self: self.running)
    @rule(name=names, attributes=attribute_updates)
    def create(self, name: str, attributes: tuple[AttributeUpdate, ...]) -> None:
        self._create(name, attributes)
        self.settle()

    def _create(self, name: str, attributes: tuple[AttributeUpdate, ...]) -> None:
        container = self.container
        self.issue(Request(OperationKind.CREATE, name, attribute_updates=attributes),
                   lambda: container.create_segment(name, attributes))

    @precondition(lambda self: self.running)
    @rule(name=names, data=payloads, condition=st.sampled_from(["none", "current", "wrong"]),
          attributes=attribute_updates)
    def append(self, name: str, data: bytes, condition: str, attributes: tuple[AttributeUpdate, ...]) -> None:
        self._append(name, data, condition, attributes)
        self.settle()

    def _append(self, name: str, data: bytes, condition: str, attributes: tuple[AttributeUpdate, ...]) -> None:
        container = self.container
        expected = {"none": None, "current": self._length_in_view(name),
                    "wrong": self._length_in_view(name) + 1}[condition]
        self.issue(Request(OperationKind.APPEND, name, data=data, attribute_updates=attributes,
                           offset=-1 if expected is None else expected),
                   lambda: container.append(name, data, attributes, expected_offset=expected))

    @precondition(lambda self: self.running)
    @rule(name=names)
    def seal(self, name: str) -> None:
        self._seal(name)
        self.settle()

    def _seal(self, name: str) -> None:
        container = self.container
        self.issue(Request(OperationKind.SEAL, name), lambda: container.seal(name))

    @precondition(lambda self: self.running)
    @rule(name=names, where=st.sampled_from(["start", "middle", "end", "beyond"]))
    def truncate(self, name: str, where: str) -> None:
        segment = self.model.view.get(name)
        start, length = (segment.start_offset, segment.length) if segment else (0, 0)
        offset = {"start": start, "middle": (start + length) // 2, "end": length, "beyond": length + 1}[where]
        container = self.container
        self.issue(Request(OperationKind.TRUNCATE, name, offset=offset), lambda: container.truncate(name, offset))
        self.settle()

    @precondition(lambda self: self.running)
    @rule(into=names, source=names)
    def merge(self, into: str, source: str) -> None:
        container = self.container
        self.issue(Request(OperationKind.MERGE, into, source=source), lambda: container.merge(into, source))
        self.settle()

    @precondition(lambda self: self.running)
    @rule(name=names)
    def delete(self, name: str) -> None:
        container = self.container
        self.issue(Request(OperationKind.DELETE, name), lambda: container.delete(name))
        self.settle()

    @precondition(lambda self: self.running)
    @rule(name=names, attributes=attribute_updates)
    def update_attributes(self, name: str, attributes: tuple[AttributeUpdate, ...]) -> None:
        container = self.container
        self.issue(Request(OperationKind.UPDATE_ATTRIBUTES, name, attribute_updates=attributes),
                   lambda: container.update_attributes(name, attributes))
        self.settle()

    @precondition(lambda self: self.running)
    @rule(batch=st.lists(st.tuples(st.sampled_from(["create", "append", "seal"]), names, payloads), min_size=2,
                         max_size=6))
    def submit_batch(self, batch: list[tuple[str, str, bytes]]) -> None:
        """Several calls before the processor runs: they share frames."""
        for kind, name, data in batch:
            if kind == "create":
                self._create(name, ())
            elif kind == "append":
                self._append(name, data, "none", ())
            else:
                self._seal(name)
        self.settle()

    # --- Tier 1 ----------------------------------------------------------------------------------------------

    @precondition(lambda self: self.running and self.log.pending_sequences)
    @rule(choice=st.integers(min_value=0))
    def persist_and_complete(self, choice: int) -> None:
        """Tier 1 makes writes durable up to one of those in flight and delivers that one's notice."""
        pending = self.log.pending_sequences
        self.log.complete(pending[choice % len(pending)])
        self.settle()

    @precondition(lambda self: self.running
                  and len(self.log.pending_sequences) > len(self.log.durable_pending_sequences))
    @rule()
    def persist(self) -> None:
        """Tier 1 makes the oldest write durable; its notice is delayed."""
        self.log.persist(1)
        self.settle()

    @precondition(lambda self: self.running and self.log.durable_pending_sequences)
    @rule(choice=st.integers(min_value=0))
    def complete(self, choice: int) -> None:
        """A delayed notice arrives (possibly after a later one: out of order)."""
        durable = self.log.durable_pending_sequences
        self.log.notify(durable[choice % len(durable)])
        self.settle()

    @precondition(lambda self: self.running and self.log.pending_sequences)
    @rule(unknown_outcome=st.booleans())
    def fail_write(self, unknown_outcome: bool) -> None:
        """A Tier-1 write fails; the container stops; its host recovers a new one from the log."""
        # (The simulated log first delivers the notices still due for writes a later notice already
        # confirmed: a log cannot report a failure for a write it has implicitly confirmed.)
        if all(sequence <= self.model.committed for sequence in self.log.pending_sequences):
            return
        self.log.fail_write(unknown_outcome=unknown_outcome)
        self.settle()
        assert not self.running
        self.start_container()

    @precondition(lambda self: self.running)
    @rule(torn=st.booleans())
    def crash_and_recover(self, torn: bool) -> None:
        """The process dies (writes not yet durable are lost, the last one maybe torn) and restarts."""
        self.container.kill()
        self.recorder("Crash")
        self.log.crash(torn=torn and bool(self.log.pending_sequences))
        self.settle()
        self.start_container()

    @precondition(lambda self: self.running)
    @rule(seconds=st.sampled_from([0.0001, 0.001, 0.01]))
    def advance_clock(self, seconds: float) -> None:
        """Time passes: Tier-1 latency grows, so the processor's batching delay comes into play."""
        self.clock.advance(seconds)
        self.settle()


if os.environ.get("MILLSTREAM_PROFILE") == "nightly":
    # The nightly depth the evidence asks of the container: 10,000 runs of 200 steps (the profile's
    # default is 5,000); the ci profile's 200 x 50 otherwise.
    ContainerMachine.TestCase.settings = settings(max_examples=10_000, stateful_step_count=200)
TestContainerVsModel = ContainerMachine.TestCase


# --- Failover across the two tiers, with the Adopt rule ---------------------------------------------------


class FailoverMachine(RuleBasedStateMachine):
    """Owners of one container across Tier 1 and Tier 2, in lockstep with ``model/container_failover.py``.

    The real ``SegmentContainer`` owners of ``tests/trace/container_failover_run.py`` (one shared fenced
    log, one chunk storage, a manual clock, a StorageWriter that flushes only when a rule says so) are
    driven by Hypothesis instead of a seeded random walk.  Every step the implementation reports, in the
    spec's vocabulary, is replayed on the model -- it must be a step the model allows, with the same
    arguments (unit ids, offsets, chunk contents, storage lengths) -- and after every rule the model's
    invariants hold and what the implementation shows agrees with it: which owners serve, the current
    owner's units and storage length, and the chunks (a garbage chunk the implementation deleted is one
    the model keeps and nobody reads).  The ``adopt`` rule sets up the case the StorageWriter's
    reconciliation exists for: an owner fenced while it flushes writes its chunk but cannot record it;
    a later owner adopts that verified, unrecorded write (all of it, or a prefix when appends followed).
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.run = failover.FailoverRun(seed=0, steps=0)
        self.model = cf.initial_state(str(slot) for slot in failover.OWNERS)
        self.replayed = 0
        self.adopted = 0  # Adopt steps replayed
        self.after_start = self.model  # the model's state after the last Start replayed

    def teardown(self) -> None:
        try:
            for owner in self.run.owners.values():
                if owner is not None:
                    owner.container.kill()
            for container in self.run.dead:
                container.kill()
            self.loop.run_until_complete(asyncio.sleep(0))
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def act(self, step: Any) -> None:
        """One step of the run, its background work brought to rest, observed, and replayed on the model."""
        async def then_observe() -> None:
            await step
            await self.run.settle()
            await self.run.observe()

        self.loop.run_until_complete(then_observe())
        self.replay()

    def replay(self) -> None:
        for event in self.run.trace[self.replayed:]:
            self.replayed += 1
            fields = event.fields
            owner = str(fields.get("o", 0))
            before = self.model
            if event.action == "Start":
                self.model = cf.start(before, owner)
                assert fields["epoch"] == self.model.log_epoch, (fields, self.model.log_epoch)
                self.after_start = self.model
            elif event.action == "ClientAppend":
                self.model = cf.client_append(before, owner)
                me = self.model.own[owner]
                assert (fields["id"], fields["off"]) == (self.model.history[-1], len(me.units)), fields
            elif event.action == "WriteChunk":
                self.model = cf.write_chunk(before, owner)
                chunk = cf.target_chunk(before, owner)
                written = self.model.chunks[chunk][len(before.chunks.get(chunk, ())):]
                assert list(written) == fields["units"], (fields, written)
            elif event.action == "CommitFlush":
                self.model = cf.commit_flush(before, owner)
                assert fields["storage"] == self.model.own[owner].storage, (fields, self.model.own[owner])
            elif event.action == "Adopt":
                count = fields["storage"] - before.own[owner].storage
                self.model = cf.adopt(before, owner, fields["chunk"], count)
                self.adopted += 1
                # The longest verified prefix: adopting less would leave verified bytes to write again.
                offered = [n for chunk, n in cf.adoptions(before, owner) if chunk == fields["chunk"]]
                assert count == max(offered), (fields, offered)
            elif event.action == "Checkpoint":
                self.model = cf.checkpoint(before, owner)
                record = self.model.log[-1]
                assert (fields["length"], fields["storage"]) == (record.length, record.storage), (fields, record)
            elif event.action == "Truncate":
                self.model = cf.truncate(before, owner, len(before.log) - fields["remaining"] + 1)
            elif event.action == "Crash":
                self.model = cf.crash(before, owner)
            elif event.action == "LogWriteFenced":
                self.model = cf.log_write_fenced(before, owner)
            elif event.action == "Observe":
                self.observed(fields)
            else:
                raise AssertionError(f"unknown event {event}")
            cf.check_invariants(self.model)

    def observed(self, fields: dict[str, Any]) -> None:
        model = self.model
        assert {int(o) for o in model.own if model.serving(o)} == fields["serving"], (fields, model.own)
        for chunk, units in fields["chunks"]:
            assert model.chunks.get(chunk) == units, (chunk, units, model.chunks)
        current = [o for o in model.own if model.current(o)]
        assert [str(fields["o"])] == current if fields["o"] else not current, (fields, current)
        if current:
            me = model.own[current[0]]
            assert (tuple(fields["units"]), fields["storage"]) == (me.units, me.storage), (fields, me)

    # --- rules -------------------------------------------------------------------------------------------

    def down(self) -> list[int]:
        return [slot for slot, owner in self.run.owners.items() if owner is None]

    @precondition(lambda self: self.down())
    @rule(choice=st.integers(min_value=0))
    def start(self, choice: int) -> None:
        """A down slot takes the container over (fencing the owner before it)."""
        down = self.down()
        self._start(down[choice % len(down)])

    def _start(self, slot: int) -> None:
        started: list[bool] = []

        async def start() -> None:
            started.append(await self.run.start(slot))

        self.act(start())
        assert started == [True], "recovery refused what the tiers hold"

    @precondition(lambda self: self.run.current() is not None)
    @rule(count=st.integers(min_value=1, max_value=3))
    def append(self, count: int) -> None:
        for _ in range(count):
            current = self.run.current()
            assert current is not None
            self.act(self.run.append(current))

    @precondition(lambda self: self.run.serving())
    @rule(choice=st.integers(min_value=0))
    def flush(self, choice: int) -> None:
        """A serving owner flushes: current, its chunk write then its flush record; fenced, its chunk
        write and then the failure of its record's log write."""
        unflushed = [slot for slot in self.run.serving() if self.run.unflushed(slot)]
        if unflushed:
            self.act(self.run.flush(unflushed[choice % len(unflushed)]))

    @precondition(lambda self: self.run.fenced())
    @rule(choice=st.integers(min_value=0))
    def fenced_append(self, choice: int) -> None:
        fenced = self.run.fenced()
        self.act(self.run.append(fenced[choice % len(fenced)]))

    @precondition(lambda self: self.run.current() is not None)
    @rule()
    def truncate(self) -> None:
        owner = self.run.owners[self.run.current() or 0]
        assert owner is not None
        self.act(owner.writer._truncate_log_if_possible())

    @precondition(lambda self: self.run.serving())
    @rule(choice=st.integers(min_value=0))
    def crash(self, choice: int) -> None:
        serving = self.run.serving()
        slot = serving[choice % len(serving)]
        self._crash(slot)

    def _crash(self, slot: int) -> None:
        async def crash() -> None:
            owner = self.run.owners[slot]
            assert owner is not None
            owner.container.kill()
            self.run.emit("Crash", o=slot)
            self.run.down(slot)

        self.act(crash())

    @precondition(lambda self: self.run.current() is not None and self.down())
    @rule(units=st.integers(min_value=1, max_value=3), appends_since=st.integers(min_value=0, max_value=2),
          choice=st.integers(min_value=0))
    def adopt(self, units: int, appends_since: int, choice: int) -> None:
        """Adopt: the current owner is fenced by a take-over while ``units`` appends wait to be flushed;
        it flushes anyway (its chunk write lands, its flush record fails); the new owner appends
        ``appends_since`` more and crashes; its successor adopts the older owner's write -- all of it, or
        the verified prefix when appends followed -- recording it with a flush record, writing nothing."""
        older = self.run.current()
        assert older is not None
        for _ in range(units):
            self.act(self.run.append(older))
        down = self.down()
        newer = down[choice % len(down)]
        self._start(newer)
        for _ in range(appends_since):
            self.act(self.run.append(newer))
        adopted = self.adopted
        self.act(self.run.flush(older))  # WriteChunk, then LogWriteFenced
        assert self.run.owners[older] is None, "the fenced owner's flush record was written"
        self._crash(newer)
        self._start(newer)
        # The implementation adopts exactly when the model offers an adoption.  (It may not: when the
        # newer owner had adopted an even older write, the older owner's chunk starts before the unflushed
        # units.)
        offered = cf.adoptions(self.after_start, str(newer))
        assert self.adopted == adopted + bool(offered), (offered, self.adopted, adopted)
        if offered:
            layout = self.model.own[str(newer)].layout
            assert layout[-1].chunk == self.model.own[str(newer)].epoch - 2, layout  # the older owner's chunk


TestFailoverVsModel = FailoverMachine.TestCase


def test_the_adopt_rule_adopts_the_whole_write_or_the_prefix_appends_followed() -> None:
    """The Adopt rule's two cases, from a fresh container: nothing appended since the fenced owner's
    write (the whole unflushed tail is adopted) and two appends since (a verified prefix is)."""
    for appends_since, adopted_units, whole in ((0, 2, True), (2, 2, False)):
        machine = FailoverMachine()
        try:
            machine.start(choice=0)
            machine.adopt(units=2, appends_since=appends_since, choice=0)
            assert machine.adopted == 1 and machine.run.adoptions == [(adopted_units, whole)]
            machine.append(count=1)
            machine.flush(choice=0)  # the adopter's own first chunk write and flush record follow
            current = machine.model.own[str(machine.run.current())]
            assert current.storage == len(current.units) == adopted_units + appends_since + 1, current
        finally:
            machine.teardown()
