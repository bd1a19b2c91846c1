"""The OperationProcessor machine, driven directly -- no event loop, no log -- in lockstep with the model.

Each rule is one action of ``spec/DurableLog.tla`` under the spec's name (``submit``, ``process``,
``seal_frame``, ``persist``, ``complete``, ``fail_write``, ``crash``, ``recover``), applied to the machine
and to the model (``millstream.model.durable_log``) alike.  The test plays Tier 1 itself: it keeps the
frames the machine asked to write (``WriteFrame``) in flight, makes them durable in order and
delivers their notices in any order; recovery replays the durable frames through ``LogReplay`` into
a new machine.  After every rule the two agree on what each caller was told (``Acknowledge`` at which
offset, ``Reject`` with which error, ``Stop`` as unavailable), on the committed metadata of every
segment, and on the durable frames, entry by entry.  The same actions through the asyncio executor
(``DurableLog``) are checked by ``test_container_vs_model.py``.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.errors import ObjectClosedError, StorageError
from millstream.model import durable_log as dl
from millstream.model.segment import Request
from millstream.model.types import NO_OFFSET, OperationKind
from millstream.model.types import SegmentStatus as Status
from millstream.segmentstore.data_frame import ENTRY_HEADER_LENGTH, FRAME_HEADER_LENGTH, DataFrameReader, decode_frame
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord
from millstream.segmentstore.durable_log import LogReplay
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import (
    Acknowledge,
    Instruction,
    OperationProcessor,
    Reject,
    Stop,
    Trace,
    WriteFrame,
)
from millstream.segmentstore.operations import (
    DeleteSegmentOperation,
    MergeSegmentOperation,
    Operation,
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentSealOperation,
    StreamSegmentTruncateOperation,
)

SEGMENTS = ("a", "b", "c")
#: Small frames, so that records span frames often.
FRAME_BYTES_MAX = 160
#: Frequent checkpoints, so recovery meets several.
CHECKPOINT_FRAME_COUNT = 5

names = st.sampled_from(SEGMENTS)
payloads = st.binary(max_size=90)
kinds = st.sampled_from(["create", "append", "append", "conditional", "seal", "truncate", "merge", "delete"])


def operation_for(request: Request) -> Operation:
    """The implementation's operation for the model's ``request`` (as ``SegmentContainer`` builds it)."""
    operation: Operation
    if request.kind is OperationKind.CREATE:
        operation = StreamSegmentMapOperation(request.segment)
    elif request.kind is OperationKind.APPEND:
        operation = StreamSegmentAppendOperation(-1, request.data, expected_offset=request.offset)
    elif request.kind is OperationKind.SEAL:
        operation = StreamSegmentSealOperation(-1)
    elif request.kind is OperationKind.TRUNCATE:
        operation = StreamSegmentTruncateOperation(-1, request.offset)
    elif request.kind is OperationKind.MERGE:
        operation = MergeSegmentOperation(-1, -1)
        assert request.source is not None
        operation.source_name = request.source
    else:
        assert request.kind is OperationKind.DELETE
        operation = DeleteSegmentOperation(-1)
    operation.segment_name = request.segment
    return operation


class ProcessorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        layout = dl.FrameLayout(FRAME_BYTES_MAX - FRAME_HEADER_LENGTH, ENTRY_HEADER_LENGTH)
        self.model = dl.initial_state(layout)
        #: Tier 1: frames in flight (number, bytes) in order; durable ones; durable ones whose notice is due.
        self.in_flight: list[tuple[int, bytes]] = []
        self.durable: list[tuple[int, bytes]] = []
        self.unnotified: list[int] = []
        #: The model's id of every operation the machine holds, and what its caller was told.
        self.ids: dict[int, int] = {}
        self.told: dict[int, tuple[str, Any]] = {}
        #: The kind of every operation the model knows, by its id.
        self.kinds: dict[int, OperationKind] = {}
        #: Every operation submitted (``ids`` is keyed by object id: they must outlive the map).
        self.operations: list[Operation] = []
        self.metadata: ContainerMetadata
        self.processor: OperationProcessor
        self.start()

    # --- plumbing ------------------------------------------------------------------------------------

    def start(self) -> None:
        """A new machine over what the durable frames replay to (the spec's Init, then Recover)."""
        self.metadata = ContainerMetadata(0)
        replay = LogReplay(self.metadata, on_committed=lambda operations: None, on_loaded=None, wall_clock=None)
        reader = DataFrameReader(LogRecord(LogAddress(number), data) for number, data in self.durable)
        found_checkpoint = replay.replay(reader)
        self.processor = OperationProcessor(self.metadata, frame_bytes_max=FRAME_BYTES_MAX,
                                            checkpoint_frame_count=CHECKPOINT_FRAME_COUNT, tracing=True)
        self.carry_out(self.processor.recover(
            reader.highest_sequence_number + 1, (reader.last_address.sequence if reader.last_address else 0) + 1,
            reader.frame_count, found_checkpoint=found_checkpoint))

    @property
    def running(self) -> bool:
        return self.processor.running

    def carry_out(self, instructions: Any) -> None:
        """Do what the machine asks, and take each step it traces on the model too."""
        for instruction in instructions:
            self.carry_out_one(instruction)
        self.model.check_invariants()

    def carry_out_one(self, instruction: Instruction) -> None:
        model = self.model
        if isinstance(instruction, Trace):
            fields = instruction.fields
            if instruction.action == "Submit":
                assert fields["kind"] == "checkpoint", fields  # (the test's own submits are taken in ``submit``)
                self.model = dl.submit(model, Request(OperationKind.CHECKPOINT, ""))
                self.kinds[self.model.submitted] = OperationKind.CHECKPOINT
            elif instruction.action == "Process":
                head = model.queue[0]
                sized = attrs.evolve(head, request=attrs.evolve(head.request, size=fields["size"]))
                self.model = dl.process(attrs.evolve(model, queue=(sized, *model.queue[1:])))
                result = self.model.results[head.id - 1]
                if fields["error"] is None:
                    assert result.kind is dl.ResultKind.PENDING, (fields, result)
                else:
                    assert result.kind is dl.ResultKind.REJECTED, (fields, result)
                    assert result.error is not None and result.error.__name__ == fields["error"], (fields, result)
            elif instruction.action == "SealFrame":
                assert fields["frame"] == len(model.log) + len(model.pending) + 1, fields
                self.model = dl.seal_frame(model)
            elif instruction.action == "Recover":
                if model.status is dl.ContainerStatus.STOPPED:
                    self.model = dl.recover(model)
            elif instruction.action not in ("Persist", "Complete", "FailWrite"):  # (their rules step the model)
                raise AssertionError(f"unknown trace {instruction}")
        elif isinstance(instruction, WriteFrame):
            self.in_flight.append((instruction.frame_number, bytes(instruction.data)))
        elif isinstance(instruction, Acknowledge):
            for operation in instruction.operations:
                value = operation.offset if type(operation) is StreamSegmentAppendOperation else operation.result_offset
                self.tell(operation, "acked", value)
        elif isinstance(instruction, Reject):
            self.tell(instruction.operation, "rejected", type(instruction.error))
        else:
            assert isinstance(instruction, Stop)
            for operation in instruction.operations:
                self.tell(operation, "failed", None)

    def tell(self, operation: Operation, outcome: str, value: Any) -> None:
        operation_id = self.ids.pop(id(operation), None)
        if operation_id is not None:  # (None: a checkpoint the machine queued itself)
            self.told[operation_id] = (outcome, value)

    def stopped(self) -> None:
        """Tier 1 forgets the writes not yet durable, and the notices due (the process is gone)."""
        self.in_flight.clear()
        self.unnotified.clear()

    # --- agreement -----------------------------------------------------------------------------------------

    @invariant()
    def callers_were_told_what_the_model_says(self) -> None:
        for operation_id, (outcome, value) in self.told.items():
            result = self.model.results[operation_id - 1]
            if outcome == "acked":
                assert result.kind is dl.ResultKind.ACKED, (operation_id, result)
                if self.kinds[operation_id] in (OperationKind.APPEND, OperationKind.SEAL, OperationKind.MERGE):
                    assert value == result.offset, (operation_id, value, result)
            elif outcome == "rejected":
                assert result.kind is dl.ResultKind.REJECTED and result.error is value, (operation_id, result, value)
            else:
                assert result.kind is dl.ResultKind.FAILED, (operation_id, result)
        told = set(self.told)
        for index, result in enumerate(self.model.results):
            if result.kind is not dl.ResultKind.PENDING and self.kinds[index + 1] is not OperationKind.CHECKPOINT:
                assert index + 1 in told, (index + 1, result)

    @invariant()
    def committed_metadata_agrees(self) -> None:
        if not self.running:
            return
        self.metadata.check_invariants()
        for name in SEGMENTS:
            expected = self.model.metadata.get(name)
            actual = self.metadata.get(name)
            if expected is None or expected.status in (Status.DELETED, Status.MERGED):
                assert actual is None or actual.status in (Status.DELETED, Status.MERGED), (name, actual)
                continue
            assert actual is not None, name
            assert (actual.status, actual.length, actual.start_offset, actual.attributes) == (
                expected.status, expected.length, expected.start_offset, dict(expected.attributes)), (name, actual)

    @invariant()
    def durable_frames_agree(self) -> None:
        assert len(self.durable) == len(self.model.log)
        for (number, data), frame in zip(self.durable, self.model.log, strict=True):
            entries = [(e.sequence_number, e.first, e.last) for e in decode_frame(data, f"frame {number}")]
            assert entries == [(e.operation.sequence_number, e.first, e.last) for e in frame], number
        if self.running:
            assert len(self.in_flight) == len(self.model.pending), (self.in_flight, self.model.pending)

    # --- the spec's actions --------------------------------------------------------------------------------

    @precondition(lambda self: self.running)
    @rule(kind=kinds, name=names, other=names, data=payloads, where=st.integers(0, 120))
    def submit(self, kind: str, name: str, other: str, data: bytes, where: int) -> None:
        """A client hands the container a request."""
        if kind == "create":
            request = Request(OperationKind.CREATE, name)
        elif kind in ("append", "conditional"):
            offset = where if kind == "conditional" else NO_OFFSET
            request = Request(OperationKind.APPEND, name, data=data, offset=offset)
        elif kind == "seal":
            request = Request(OperationKind.SEAL, name)
        elif kind == "truncate":
            request = Request(OperationKind.TRUNCATE, name, offset=where)
        elif kind == "merge":
            request = Request(OperationKind.MERGE, name, source=other)
        else:
            request = Request(OperationKind.DELETE, name)
        operation = operation_for(request)
        instructions = self.processor.submit(operation)
        self.model = dl.submit(self.model, request)
        self.ids[id(operation)] = self.model.submitted
        self.kinds[self.model.submitted] = request.kind
        self.operations.append(operation)
        traces = [i for i in instructions if isinstance(i, Trace)]
        assert [t.action for t in traces] == ["Submit"] and traces[0].fields["kind"] == request.kind.value, traces

    @precondition(lambda self: self.running and self.processor.queue_length > 0)
    @rule()
    def process(self) -> None:
        """The processor takes the head of the queue."""
        self.carry_out(self.processor.process())

    @precondition(lambda self: self.running)
    @rule()
    def seal_frame(self) -> None:
        """The processor seals the partly filled frame (the executor does when the queue runs dry)."""
        self.carry_out(self.processor.seal_frame())
        if self.model.open_frame.entries:
            raise AssertionError("the machine sealed nothing, the model has an open frame")

    @precondition(lambda self: self.running and self.in_flight)
    @rule()
    def persist(self) -> None:
        """Tier 1 makes the oldest frame in flight durable; its notice is due."""
        number, data = self.in_flight.pop(0)
        assert number == len(self.durable) + 1
        self.durable.append((number, data))
        self.unnotified.append(number)
        self.model = dl.persist(self.model)
        self.carry_out(self.processor.persist(number))

    @precondition(lambda self: self.running and self.unnotified)
    @rule(choice=st.integers(min_value=0))
    def complete(self, choice: int) -> None:
        """The notice of a durable frame arrives (in any order)."""
        number = self.unnotified.pop(choice % len(self.unnotified))
        self.model = dl.complete(self.model, number)
        self.carry_out(self.processor.complete(number, LogAddress(number)))

    @precondition(lambda self: self.running and (self.in_flight or any(
        number > self.model.committed for number in self.unnotified)))
    @rule(durable_first=st.booleans())
    def fail_write(self, durable_first: bool) -> None:
        """A Tier-1 write fails (a frame in flight, or a durable one whose notice reports failure)."""
        frame = max(self.unnotified) if durable_first and self.unnotified else (
            self.in_flight[0][0] if self.in_flight else None)
        self.model = dl.fail_write(self.model)
        self.carry_out(self.processor.fail_write(StorageError("injected"), frame))
        assert not self.running
        self.stopped()

    @precondition(lambda self: self.running)
    @rule()
    def crash(self) -> None:
        """The process dies: only the durable frames remain."""
        self.model = dl.crash(self.model)
        self.carry_out(self.processor.stop(ObjectClosedError("killed")))
        assert not self.running
        self.stopped()

    @precondition(lambda self: not self.running)
    @rule()
    def recover(self) -> None:
        """A new processor starts from what the durable frames replay to."""
        self.start()
        assert self.model.status is dl.ContainerStatus.RUNNING


TestProcessorVsModel = ProcessorMachine.TestCase
