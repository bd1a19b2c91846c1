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
from millstream.model import durable_log as dl
from millstream.model.segment import Request
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType, OperationKind
from millstream.model.types import SegmentStatus as Status
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.data_frame import ENTRY_HEADER_LENGTH, FRAME_HEADER_LENGTH, decode_frame
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceRecorder

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
