"""The OperationProcessor: one container's sequencer, as a synchronous machine.  Every operation passes
through it.

Theory of operation.  Its methods are the actions of ``spec/DurableLog.tla`` (and of the model,
``millstream.model.durable_log``), under the same names.  Each one takes an event -- an operation a
caller hands over, a completion notice from Tier 1, a failure -- changes the processor's state and
returns what is to be done about it, as instructions: ``WriteFrame`` (hand a sealed frame to Tier 1),
``Acknowledge`` (these operations are durable: apply them to memory and answer their callers),
``Reject`` (answer this caller with this error), ``Stop`` (the processor stopped: these operations
failed with an unknown outcome) and, when tracing, ``Trace`` (the step in the spec's vocabulary, for
``segmentstore.tracing``).  It does no I/O, awaits nothing, reads no clock and resolves no future:
``DurableLog`` executes the instructions against a ``DurableDataLog`` on an asyncio loop, and tests
drive the machine directly (``tests/stateful/test_operation_processor_vs_model.py``).

The actions.  ``submit`` puts an operation into the bounded queue [Submit].  ``process`` takes the
head, validates it against the chain of metadata update transactions, gives it the next sequence
number and serializes it into the DataFrame being built; a frame that fills up is sealed at once
[Process].  ``seal_frame`` seals the partly filled frame (the executor calls it when the queue runs
dry) [SealFrame].  Each sealed frame goes to Tier 1 without waiting for earlier ones: many are in
flight.  ``persist`` learns that Tier 1 made frames durable, and ``complete`` that frame k's notice
arrived [Persist, Complete]: the transactions of every frame up to k are committed, in order, and
their operations acknowledged; a notice for a frame an earlier notice already covered is ignored.
A write failure is final [FailWrite]: every operation not yet acknowledged fails (its outcome is
unknown), the uncommitted transactions are discarded and the processor stops for good; the container
is then recovered from the log by its host, and a new processor starts with ``recover`` [Recover].
``stop`` is the spec's Stop without a Tier-1 failure (shutdown, a kill, a failure elsewhere).

Every ``limits.CHECKPOINT_FRAME_COUNT_MIN`` frames (or ``CHECKPOINT_FRAME_BYTES_MIN`` bytes) the
processor queues a metadata checkpoint of its own.

Instructions come back as a sequence, often empty (the empty tuple: nothing is allocated on the hot
path); the executor must carry them out in order.  An instruction list is the machine's only output.
(Instructions are plain ``attrs.define`` classes rather than frozen ones: a frozen attrs class costs
twice as much to build, and a lone appender builds two per operation.  Nothing changes them.)

What the executor reads between actions: ``queue`` (the operations submitted and not processed yet),
``queue_full``, ``in_flight_frames``, ``in_flight_bytes`` and ``failure`` -- plain attributes rather than properties,
because the executor reads them several times per frame (``queue_full`` once per operation); only
the actions change them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import attrs

from millstream import limits
from millstream.errors import CallerError, ContainerUnavailableError, InternalError
from millstream.segmentstore.data_frame import DataFrameBuilder, SealedFrame
from millstream.segmentstore.durable_data_log import LogAddress
from millstream.segmentstore.metadata import ContainerMetadata, SegmentMetadata, serialize_checkpoint
from millstream.segmentstore.metadata_transaction import (
    ContainerMetadataUpdateTransaction,
    SegmentMetadataUpdateTransaction,
)
from millstream.segmentstore.operations import (
    MergeSegmentOperation,
    MetadataCheckpointOperation,
    Operation,
    StreamSegmentAppendOperation,
    StreamSegmentTruncateOperation,
)

__all__ = [
    "Acknowledge",
    "Instruction",
    "OperationProcessor",
    "Reject",
    "Stop",
    "Trace",
    "WriteFrame",
]


@attrs.define
class WriteFrame:
    """Hand frame ``frame_number`` (``data``, a whole DataFrame) to Tier 1; report its completion to
    ``persist`` and ``complete`` (or its failure to ``fail_write``)."""

    frame_number: int
    data: bytearray


@attrs.define
class Acknowledge:
    """``operations`` are durable and committed, in order: apply them to memory, then answer each
    caller with its ``result_offset`` (an append: its ``offset``)."""

    operations: list[Operation]


@attrs.define
class Reject:
    """``operation`` was refused (nothing of it is written): answer its caller with ``error``."""

    operation: Operation
    error: CallerError


@attrs.define
class Stop:
    """The processor stopped because of ``error``: answer each of ``operations`` as unavailable (its
    outcome is unknown); ``error`` is an ``ObjectClosedError`` for a shutdown or a kill."""

    error: BaseException
    operations: list[Operation]


@attrs.define
class Trace:
    """The step just taken, in ``spec/DurableLog.tla``'s vocabulary (``segmentstore.tracing``).
    Produced only by a processor built with ``tracing=True``."""

    action: str
    fields: dict[str, object]


Instruction = WriteFrame | Acknowledge | Reject | Stop | Trace

_NOTHING: tuple[Instruction, ...] = ()


class _Frame:
    """A sealed frame whose metadata update transaction is not committed yet."""

    __slots__ = ("length", "number", "operations", "transaction")

    def __init__(self, number: int, operations: list[Operation], transaction: ContainerMetadataUpdateTransaction,
                 length: int) -> None:
        self.number = number
        self.operations = operations
        self.transaction = transaction
        self.length = length


class OperationProcessor:
    """Sequences, validates, frames and commits one container's operations; see the module docstring.

    A new processor is not running until ``recover`` says where the log left off."""

    def __init__(
        self,
        metadata: ContainerMetadata,
        *,
        frame_bytes_max: int = limits.DATA_FRAME_SIZE_BYTES_MAX,
        queue_length_max: int = limits.OPERATION_QUEUE_LENGTH_MAX,
        queue_bytes_max: int = limits.OPERATION_QUEUE_BYTES_MAX,
        checkpoint_frame_count: int = limits.CHECKPOINT_FRAME_COUNT_MIN,
        checkpoint_frame_bytes: int = limits.CHECKPOINT_FRAME_BYTES_MIN,
        tracing: bool = False,
    ) -> None:
        self._metadata = metadata
        self._tracing = tracing
        #: Instructions of the action under way (frames sealed while an operation is serialized).
        self._outbox: list[Instruction] = []
        self._time_ms = 0
        #: Operations submitted and not processed yet (read-only outside the processor).
        self.queue: deque[Operation] = deque()
        self._queue_bytes = 0
        #: True while the queue holds ``queue_length_max`` operations or ``queue_bytes_max`` bytes
        #: (read-only outside the processor; an attribute the actions keep, because every append asks).
        self.queue_full = False
        self._queue_length_max = queue_length_max
        self._queue_bytes_max = queue_bytes_max
        self._active = ContainerMetadataUpdateTransaction(metadata, None)
        self._in_flight: deque[_Frame] = deque()
        #: Frames handed to Tier 1 and not committed yet, and their bytes (read-only outside the processor).
        self.in_flight_frames = 0
        self.in_flight_bytes = 0
        self._frame_operations: list[Operation] = []
        self._processing: Operation | None = None
        self._builder = DataFrameBuilder(frame_bytes_max, self._on_frame_sealed)
        self._next_sequence_number = 1
        self._next_frame_number = 1
        self._highest_committed_frame = 0
        self._highest_persisted_frame = 0
        self._explicit_seal = False
        self._checkpoint_frame_count = checkpoint_frame_count
        self._checkpoint_frame_bytes = checkpoint_frame_bytes
        self._frames_since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        #: The checkpoint the processor queued and has not seen committed (or refused) yet.
        self._queued_checkpoint: MetadataCheckpointOperation | None = None
        self._unsealed_checkpoint: MetadataCheckpointOperation | None = None
        #: Checkpoints waiting for the address of the frame before theirs, by that frame's number.
        self._awaiting_address: dict[int, MetadataCheckpointOperation] = {}
        self._highest_notified: tuple[int, LogAddress | None] = (0, None)
        self._recovered = False
        #: Why the processor stopped (None while it has not).
        self.failure: BaseException | None = None

    # --- what the executor reads ---------------------------------------------------------------------

    @property
    def frame_capacity(self) -> int:
        """Content bytes one DataFrame holds (the spec's FrameCapacity)."""
        return self._builder.capacity

    @property
    def running(self) -> bool:
        """Recovered and not stopped: ``submit`` accepts operations."""
        return self._recovered and self.failure is None

    @property
    def queue_length(self) -> int:
        return len(self.queue)

    def peek(self, name: str) -> SegmentMetadata | SegmentMetadataUpdateTransaction | None:
        """Segment ``name`` as the next operation would see it (operations in flight included), or None."""
        return self._active.peek(name)

    def advance_wall_time(self, time_ms: int) -> None:
        """Operations processed from now on are stamped with ``time_ms`` (ms since the Unix epoch;
        ``SegmentMetadata.last_modified_ms``), unless an earlier stamp was later: times never go back."""
        if time_ms > self._time_ms:
            self._time_ms = self._active.time_ms = time_ms

    # --- the spec's actions ------------------------------------------------------------------------------

    def recover(self, next_sequence_number: int, next_frame_number: int, frames_read: int, *,
                found_checkpoint: bool) -> Sequence[Instruction]:
        """[Recover] The log was replayed into the metadata (``DurableLog``): ``frames_read`` frames,
        the last numbered ``next_frame_number - 1``, sequence numbers below ``next_sequence_number``.
        A log without a checkpoint gets one first.  Raises ``InternalError`` if already recovered."""
        if self._recovered:
            raise InternalError("the processor was recovered already")
        self._recovered = True
        self._active = ContainerMetadataUpdateTransaction(self._metadata, None)  # (over what replay loaded)
        self._next_sequence_number = next_sequence_number
        self._next_frame_number = next_frame_number
        self._highest_committed_frame = self._highest_persisted_frame = next_frame_number - 1
        self._highest_notified = (next_frame_number - 1, None)
        outbox = self._outbox
        if self._tracing:
            outbox.append(Trace("Recover", {"frames": frames_read}))
        if not found_checkpoint:
            self._queue_checkpoint()
        return self._take()

    def submit(self, operation: Operation) -> Sequence[Instruction]:
        """[Submit] Queue ``operation`` without regard to the queue's bounds (the caller bounds what it
        submits: see ``queue_full``).  Raises ``ContainerUnavailableError`` unless running."""
        if self.failure is not None or not self._recovered:
            raise ContainerUnavailableError("the container is not running") from self.failure
        queue = self.queue
        queue.append(operation)
        if type(operation) is StreamSegmentAppendOperation:  # the hot path: skip the property lookup
            self._queue_bytes += len(operation.data)
        else:
            self._queue_bytes += operation.payload_length
        if len(queue) >= self._queue_length_max or self._queue_bytes >= self._queue_bytes_max:
            self.queue_full = True
        if self._tracing:
            self._trace_submit(operation)
            return self._take()
        return _NOTHING

    def process(self) -> Sequence[Instruction]:
        """[Process] Validate the head of the queue against the chain; reject it, or give it the next
        sequence number and serialize it into the open frame (``WriteFrame`` for every frame it fills).
        Raises ``InternalError`` if the queue is empty or the processor is not running."""
        if not self.queue or self.failure is not None:
            raise InternalError("Process is not enabled: the queue is empty or the processor stopped")
        operation = self.queue.popleft()
        self._processing = operation  # so that a failure inside still answers it
        # Appends are nearly every operation: they skip the ``payload_length`` and ``header`` dispatch.
        append = operation if type(operation) is StreamSegmentAppendOperation else None
        self._queue_bytes -= operation.payload_length if append is None else len(append.data)
        if self.queue_full:
            self.queue_full = len(self.queue) >= self._queue_length_max or self._queue_bytes >= self._queue_bytes_max
        try:
            self._active.pre_process(operation)
        except CallerError as error:
            self._processing = None
            if operation is self._queued_checkpoint:
                self._queued_checkpoint = None
            if self._tracing:
                self._outbox.append(Trace("Process", {"error": type(error).__name__, "sequence_number": 0,
                                                      "offset": -1, "size": 0}))
            self._outbox.append(Reject(operation, error))
            return self._take()
        sequence_number = self._next_sequence_number
        self._next_sequence_number = sequence_number + 1
        operation.sequence_number = sequence_number
        if append is not None:
            head, tail = append.header(), append.data
        else:
            if isinstance(operation, MetadataCheckpointOperation):
                operation.payload = serialize_checkpoint(self._active.next_segment_id, self._active.snapshot())
                self._unsealed_checkpoint = operation
            head, tail = operation.serialize(), b""
        if self._tracing:
            self._outbox.append(Trace("Process", {"error": None, "sequence_number": sequence_number,
                                                  "offset": operation.result_offset, "size": len(head) + len(tail)}))
        needs_seal = self._builder.append(sequence_number, head, tail)
        self._active.accept(operation)
        self._frame_operations.append(operation)
        self._processing = None
        if needs_seal:
            self._builder.flush()
        if self._outbox:
            return self._take()
        return _NOTHING

    def seal_frame(self) -> Sequence[Instruction]:
        """[SealFrame] Seal the partly filled frame, if there is one (``WriteFrame``)."""
        if self.failure is not None:
            return _NOTHING
        self._explicit_seal = True
        try:
            self._builder.flush()
        finally:
            self._explicit_seal = False
        outbox = self._outbox  # (``_take``, inlined: this runs once per frame)
        if not outbox:
            return _NOTHING
        self._outbox = []
        return outbox

    def persist(self, frame_number: int) -> Sequence[Instruction]:
        """[Persist] Tier 1 made every frame up to ``frame_number`` durable (a completion notice says so)."""
        if not self._tracing:
            self._highest_persisted_frame = max(self._highest_persisted_frame, frame_number)
            return _NOTHING
        while self._highest_persisted_frame < frame_number:
            self._highest_persisted_frame += 1
            self._outbox.append(Trace("Persist", {"frame": self._highest_persisted_frame}))
        return self._take()

    def complete(self, frame_number: int, address: LogAddress) -> Sequence[Instruction]:
        """[Complete] Frame ``frame_number``'s notice arrived (Tier 1 wrote it at ``address``): commit
        every frame up to it (``Acknowledge``), unless an earlier notice did.  Ignored once stopped."""
        if self.failure is not None:
            return _NOTHING  # everything in flight was failed already
        if address.sequence != frame_number:
            return self.stop(InternalError(f"Tier 1 wrote frame {frame_number} as record {address.sequence}"))
        if frame_number > self._highest_notified[0]:
            self._highest_notified = (frame_number, address)
        if self._awaiting_address:
            checkpoint = self._awaiting_address.pop(frame_number, None)
            if checkpoint is not None:
                checkpoint.truncation_address = address
        if frame_number <= self._highest_committed_frame:
            if self._tracing:
                self._outbox.append(Trace("Complete", {"frame": frame_number, "acked": []}))
                return self._take()
            return _NOTHING  # a late notice: a later frame's notice committed this one already
        committed = self._commit_through(frame_number)
        outbox = self._outbox
        if self._tracing:
            outbox.append(Trace("Complete", {"frame": frame_number,
                                             "acked": [op.sequence_number for op in committed]}))
        outbox.append(Acknowledge(committed))
        checkpoint = self._queued_checkpoint
        if checkpoint is None:
            if (self._frames_since_checkpoint >= self._checkpoint_frame_count
                    or self._bytes_since_checkpoint >= self._checkpoint_frame_bytes):
                self._queue_checkpoint()
        elif checkpoint.sequence_number and committed and committed[-1].sequence_number >= checkpoint.sequence_number:
            self._queued_checkpoint = None  # committed: the next one may be queued from the next notice on
        self._outbox = []  # (``_take``, inlined: this runs once per frame; ``outbox`` holds the Acknowledge)
        return outbox

    def fail_write(self, error: BaseException, frame_number: int | None = None) -> Sequence[Instruction]:
        """[FailWrite] A Tier-1 write (of ``frame_number``, if known) failed: stop.  Ignored once stopped."""
        if self.failure is not None:
            return _NOTHING
        if self._tracing:
            self._outbox.append(Trace("FailWrite", {"frame": frame_number}))
        return self.stop(error)

    def stop(self, error: BaseException) -> Sequence[Instruction]:
        """[Stop] Stop for good because of ``error``: everything not acknowledged fails (``Stop``), the
        uncommitted transactions are discarded.  Ignored once stopped."""
        if self.failure is not None:
            return _NOTHING
        self.failure = error
        doomed: list[Operation] = []
        if self._processing is not None:
            doomed.append(self._processing)
            self._processing = None
        doomed += [op for frame in self._in_flight for op in frame.operations]
        doomed += self._frame_operations
        doomed += self.queue
        self._in_flight.clear()
        self._frame_operations = []
        self.queue.clear()
        self._queue_bytes = self.in_flight_bytes = self.in_flight_frames = 0
        self.queue_full = False
        self._outbox.append(Stop(error, doomed))
        return self._take()

    def queue_checkpoint(self) -> Sequence[Instruction]:
        """Queue a metadata checkpoint (behind what already waits: it need not jump the queue)."""
        if self.failure is not None:
            return _NOTHING
        self._queue_checkpoint()
        return self._take()

    # --- inside the actions ------------------------------------------------------------------------------

    def _take(self) -> Sequence[Instruction]:
        outbox = self._outbox
        if not outbox:
            return _NOTHING
        self._outbox = []
        return outbox

    def _queue_checkpoint(self) -> None:
        checkpoint = MetadataCheckpointOperation()
        self._queued_checkpoint = checkpoint
        self._frames_since_checkpoint = self._bytes_since_checkpoint = 0
        self.queue.append(checkpoint)
        if len(self.queue) >= self._queue_length_max:
            self.queue_full = True
        if self._tracing:
            self._trace_submit(checkpoint)

    def _on_frame_sealed(self, sealed: SealedFrame) -> None:
        number = self._next_frame_number
        self._next_frame_number = number + 1
        if self._unsealed_checkpoint is not None:
            checkpoint = self._unsealed_checkpoint
            self._unsealed_checkpoint = None
            checkpoint.frame_number = number
            notified, address = self._highest_notified
            if notified == number - 1:
                checkpoint.truncation_address = address  # (None for the first frame after recovery)
            else:
                self._awaiting_address[number - 1] = checkpoint
        frame = _Frame(number, self._frame_operations, self._active, len(sealed.data))
        self._frame_operations = []
        self._active = ContainerMetadataUpdateTransaction(self._metadata, frame.transaction)
        self._in_flight.append(frame)
        self.in_flight_frames += 1
        self.in_flight_bytes += frame.length
        if self._explicit_seal and self._tracing:
            self._outbox.append(Trace("SealFrame", {"frame": number}))
        self._outbox.append(WriteFrame(number, sealed.data))

    def _commit_through(self, frame_number: int) -> list[Operation]:
        in_flight = self._in_flight
        committed: list[Operation] = []
        while in_flight and in_flight[0].number <= frame_number:
            frame = in_flight.popleft()
            frame.transaction.commit()
            (in_flight[0].transaction if in_flight else self._active).previous = None
            self.in_flight_frames -= 1
            self.in_flight_bytes -= frame.length
            committed.extend(frame.operations)
            self._frames_since_checkpoint += 1
            self._bytes_since_checkpoint += frame.length
        self._highest_committed_frame = frame_number
        return committed

    def _trace_submit(self, operation: Operation) -> None:
        if operation.KIND is not None:
            kind = operation.KIND.value
        else:
            kind = "checkpoint" if isinstance(operation, MetadataCheckpointOperation) else "storage_flush"
        source = operation.source_name if isinstance(operation, MergeSegmentOperation) else None
        length = len(operation.data) if isinstance(operation, StreamSegmentAppendOperation) else 0
        if isinstance(operation, StreamSegmentAppendOperation):
            offset = operation.expected_offset
        elif isinstance(operation, StreamSegmentTruncateOperation):
            offset = operation.offset
        else:
            offset = -1
        self._outbox.append(Trace("Submit", {"kind": kind, "segment": operation.segment_name or None,
                                             "source": source, "length": length, "offset": offset}))

