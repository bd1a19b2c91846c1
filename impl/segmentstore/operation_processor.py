"""The OperationProcessor: one container's sequencer.  Every operation passes through it.

Theory of operation (``spec/DurableLog.tla`` names in brackets).  Callers put operations into a
bounded queue [Submit].  One task takes them in order, validates each against the chain of
metadata update transactions, gives it the next sequence number and serializes it into the
DataFrame being built [Process]; a frame that fills up is sealed at once, and when the queue runs
dry the partly filled frame is sealed too [SealFrame].  Each sealed frame is handed to Tier 1
without waiting for earlier ones: many are in flight.  When Tier 1 reports frame k durable
[Persist, Complete], the transactions of every frame up to k are committed, in order, their
operations are applied to the read index and their callers are answered; a notice for a frame an
earlier notice already covered is ignored.  A write failure is final [FailWrite]: every operation
not yet acknowledged fails with ``ContainerUnavailableError`` (its outcome is unknown), the
uncommitted transactions are discarded and the processor stops; the container is then recovered
from the log by its host.

Before taking operations the processor may wait (dynamic batching, ``throttler``), and it stops
taking them while ``limits.DATA_LOG_IN_FLIGHT_BYTES_MAX`` bytes of frames are in flight.  Every
``limits.CHECKPOINT_FRAME_COUNT_MIN`` frames it queues a metadata checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from functools import partial

from millstream import limits
from millstream.clock import Clock
from millstream.errors import (
    CallerError,
    ContainerUnavailableError,
    InternalError,
    ObjectClosedError,
    StorageError,
)
from millstream.segmentstore.data_frame import DataFrameBuilder, SealedFrame
from millstream.segmentstore.durable_data_log import DurableDataLog, LogAddress
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
from millstream.segmentstore.throttler import WriteStatistics, batching_delay_seconds
from millstream.segmentstore.tracing import Tracer

__all__ = ["OperationProcessor"]

_Future = asyncio.Future  # (one per operation: the hot path skips the module attribute lookup)


class _Frame:
    """A sealed frame whose metadata update transaction is not committed yet."""

    __slots__ = ("issued_at", "length", "number", "operations", "transaction")

    def __init__(self, number: int, operations: list[Operation], transaction: ContainerMetadataUpdateTransaction,
                 length: int, issued_at: float) -> None:
        self.number = number
        self.operations = operations
        self.transaction = transaction
        self.length = length
        self.issued_at = issued_at


class OperationProcessor:
    """Sequences, validates, frames, writes and commits one container's operations."""

    def __init__(
        self,
        metadata: ContainerMetadata,
        data_log: DurableDataLog,
        *,
        clock: Clock,
        on_committed: Callable[[list[Operation]], None],
        next_sequence_number: int,
        next_frame_number: int,
        frame_length_max: int = limits.DATA_FRAME_SIZE_MAX_BYTES,
        tracer: Tracer | None = None,
        queue_length_max: int = limits.OPERATION_QUEUE_LENGTH_MAX,
        queue_bytes_max: int = limits.OPERATION_QUEUE_BYTES_MAX,
        in_flight_bytes_max: int = limits.DATA_LOG_IN_FLIGHT_BYTES_MAX,
        checkpoint_frame_count: int = limits.CHECKPOINT_FRAME_COUNT_MIN,
        checkpoint_frame_bytes: int = limits.CHECKPOINT_FRAME_BYTES_MIN,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        frame_length_max = min(frame_length_max, data_log.write_settings.max_write_length_bytes)
        self._metadata = metadata
        #: Seconds since the Unix epoch: the operations of each batch taken are stamped with it
        #: (``SegmentMetadata.last_modified_ms``), never going backwards.  None: no times (0).
        self._wall_clock = wall_clock
        self._time_ms = 0
        self._log = data_log
        self._loop = asyncio.get_running_loop()
        self._clock = clock
        self._on_committed = on_committed
        self._tracer = tracer
        self._queue: deque[Operation] = deque()
        self._queue_bytes = 0
        self._queue_length_max = queue_length_max
        self._queue_bytes_max = queue_bytes_max
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        #: The idle processor task waits on this future (None while it runs): a bare future costs
        #: less per wake-up than an asyncio.Event, and a lone appender wakes the processor every time.
        self._idle: asyncio.Future[None] | None = None
        self._log_capacity = asyncio.Event()
        self._active = ContainerMetadataUpdateTransaction(metadata, None)
        self._in_flight: deque[_Frame] = deque()
        self._in_flight_bytes = 0
        self._in_flight_bytes_max = in_flight_bytes_max
        self._frame_operations: list[Operation] = []
        self._committing: list[Operation] = []
        self._processing: Operation | None = None
        self._builder = DataFrameBuilder(frame_length_max, self._on_frame_sealed)
        self._frame_capacity = self._builder.capacity
        self._next_sequence_number = next_sequence_number
        self._next_frame_number = next_frame_number
        self._highest_committed_frame = next_frame_number - 1
        self._highest_persisted_frame = next_frame_number - 1
        self._explicit_seal = False
        self._statistics = WriteStatistics(limits.BATCHING_STATISTICS_WINDOW)
        self._checkpoint_frame_count = checkpoint_frame_count
        self._checkpoint_frame_bytes = checkpoint_frame_bytes
        self._frames_since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        self._checkpoint_queued = False
        self._unsealed_checkpoint: MetadataCheckpointOperation | None = None
        #: Checkpoints waiting for the address of the frame before theirs, by that frame's number.
        self._awaiting_address: dict[int, MetadataCheckpointOperation] = {}
        self._highest_notified: tuple[int, LogAddress | None] = (next_frame_number - 1, None)
        self._failure: BaseException | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.stopped: asyncio.Future[BaseException | None] = self._loop.create_future()

    # --- public --------------------------------------------------------------------------------------

    @property
    def frame_capacity(self) -> int:
        """Content bytes one DataFrame holds (the spec's FrameCapacity)."""
        return self._builder.capacity

    def peek(self, name: str) -> SegmentMetadata | SegmentMetadataUpdateTransaction | None:
        """Segment ``name`` as the next operation would see it (operations in flight included), or None."""
        return self._active.peek(name)

    @property
    def running(self) -> bool:
        return self._task is not None and self._failure is None and not self._closing

    def start(self) -> None:
        if self._task is not None:
            raise InternalError("the processor was started already")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="operation-processor")

    async def add(self, operation: Operation) -> int:
        """Queue ``operation`` and wait until it is durable and applied; return its offset.

        Waits while the queue is full.  Raises the ``CallerError`` it was rejected with, or
        ``ContainerUnavailableError`` if the processor stopped before acknowledging it (then it may or
        may not have taken effect).
        """
        if self._queue_full():
            await self.wait_for_space()
        return await self.enqueue(operation)

    @property
    def queue_full(self) -> bool:
        """True while the queue holds ``queue_length_max`` operations or ``queue_bytes_max`` bytes."""
        return len(self._queue) >= self._queue_length_max or self._queue_bytes >= self._queue_bytes_max

    async def wait_for_space(self) -> None:
        """Wait until the queue has room (backpressure).  Raises ``ContainerUnavailableError`` if the
        processor stops meanwhile."""
        while self._queue_full():
            self._check_running()
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters.append(waiter)
            await waiter
        self._check_running()

    def enqueue(self, operation: Operation) -> asyncio.Future[int]:
        """Queue ``operation`` without waiting for space (the caller bounds what it enqueues); the
        future completes when it is acknowledged, or fails with its rejection or unavailability.

        Processing is left to the processor's task even when it is idle: operations that arrive in
        the same loop turn (a burst) then share one frame.  (Processing the first inline saved a
        loop turn but sent it alone and made the rest of the burst wait out a batching delay.)
        """
        if self._failure is not None or self._closing or self._task is None:
            self._check_running()
        future: asyncio.Future[int] = _Future(loop=self._loop)
        operation.future = future
        self._queue.append(operation)
        if type(operation) is StreamSegmentAppendOperation:  # the hot path: skip the property lookup
            self._queue_bytes += len(operation.data)
        else:
            self._queue_bytes += operation.payload_length
        if self._tracer is not None:
            self._trace_submit(operation)
        idle = self._idle  # (``_wake``, inlined: this runs once per operation)
        if idle is not None and not idle.done():
            idle.set_result(None)
        return future

    def _wake(self) -> None:
        """Wake the processor task if it waits for work."""
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def close(self) -> None:
        """Stop taking operations; wait (bounded) for frames in flight; fail whatever is left."""
        self._closing = True
        self._wake()
        self._log_capacity.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        deadline = self._clock.monotonic() + limits.SHUTDOWN_TIMEOUT_SECONDS
        while self._in_flight and self._failure is None and self._clock.monotonic() < deadline:
            self._log_capacity.clear()
            await asyncio.wait_for(self._log_capacity.wait(), timeout=deadline - self._clock.monotonic())
        if self._failure is None:
            self._fail(ObjectClosedError("the container is shutting down"), trace=False)

    def fail(self, error: BaseException) -> None:
        """Stop because a part of the container outside the processor failed (e.g. Tier 2 holds
        corrupt data): everything unacknowledged fails, as on a Tier-1 failure."""
        self._fail(error, trace=False)

    def kill(self) -> None:
        """Stop at once, as a process that dies: no further writes, nothing acknowledged."""
        if self._task is not None:
            self._task.cancel()
        if self._failure is None:
            self._fail(ObjectClosedError("the container was killed"), trace=False)

    # --- the processing loop -----------------------------------------------------------------------------

    def _queue_full(self) -> bool:
        return len(self._queue) >= self._queue_length_max or self._queue_bytes >= self._queue_bytes_max

    def _check_running(self) -> None:
        if self._failure is not None or self._closing or self._task is None:
            raise ContainerUnavailableError("the container is not running") from self._failure

    async def _run(self) -> None:
        try:
            while self._failure is None:
                if not self._queue:
                    if self._closing:
                        return
                    self._idle = self._loop.create_future()
                    try:
                        await self._idle
                    finally:
                        self._idle = None
                    continue
                if self._in_flight:  # (else the delay is zero: see batching_delay_seconds)
                    delay = batching_delay_seconds(
                        len(self._in_flight), self._statistics.latency_seconds, self._statistics.fill_ratio,
                        limits.BATCHING_DELAY_MAX_SECONDS)
                    if delay > 0.0:
                        await self._clock.sleep(delay)
                while self._in_flight_bytes >= self._in_flight_bytes_max and self._failure is None:
                    self._log_capacity.clear()
                    await self._log_capacity.wait()
                if self._failure is not None:
                    return
                self._process_queued()
                if not self._queue and self._failure is None:
                    self._flush()
        except (StorageError, ObjectClosedError) as error:
            self._fail(error)
        except Exception as error:  # a bug: stop rather than keep serving from a broken state
            self._fail(InternalError(f"operation processor failed: {error!r}"), trace=False)
            raise

    def _flush(self) -> None:
        """Seal the partly filled frame (the spec's SealFrame)."""
        self._explicit_seal = True
        try:
            self._builder.flush()
        finally:
            self._explicit_seal = False

    def _process_queued(self) -> None:
        if self._wall_clock is not None:  # (once per batch, not per operation)
            self._time_ms = self._active.time_ms = max(self._time_ms, int(self._wall_clock() * 1000))
        queue = self._queue
        process = self._process
        for _ in range(min(len(queue), limits.PROCESSOR_TAKE_COUNT_MAX)):
            operation = queue.popleft()
            self._processing = operation  # so that a failure inside _process still answers it
            process(operation)
            self._processing = None
            if self._failure is not None:
                return
        waiters = self._space_waiters
        while waiters and not self._queue_full():
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _process(self, operation: Operation) -> None:
        # Appends are nearly every operation: they skip the ``payload_length`` and ``header`` dispatch.
        append = operation if type(operation) is StreamSegmentAppendOperation else None
        self._queue_bytes -= operation.payload_length if append is None else len(append.data)
        try:
            self._active.pre_process(operation)
        except CallerError as error:
            if self._tracer is not None:
                self._tracer("Process", error=type(error).__name__, sequence_number=0, offset=-1, size=0)
            future = operation.future
            if future is not None and not future.done():
                future.set_exception(error)
            return
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
        if self._tracer is not None:
            self._tracer("Process", error=None, sequence_number=sequence_number,
                         offset=operation.result_offset, size=len(head) + len(tail))
        needs_seal = self._builder.append(sequence_number, head, tail)
        self._active.accept(operation)
        self._frame_operations.append(operation)
        if needs_seal:
            self._builder.flush()

    # --- frames and their completion ----------------------------------------------------------------------

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
        frame = _Frame(number, self._frame_operations, self._active, len(sealed.data), self._clock.monotonic())
        self._frame_operations = []
        self._active = ContainerMetadataUpdateTransaction(self._metadata, frame.transaction)
        self._in_flight.append(frame)
        self._in_flight_bytes += frame.length
        if self._explicit_seal and self._tracer is not None:
            self._tracer("SealFrame", frame=number)
        try:
            self._log.append(sealed.data, partial(self._on_write_done, frame))
        except ObjectClosedError as error:
            # The log failed (its writer saw the failure before our completion callback did) or was
            # closed.  A failure is the real cause: report it as such, so the host recovers.
            if isinstance(error.__cause__, StorageError):
                raise error.__cause__ from error
            raise

    def _on_write_done(self, frame: _Frame, future: asyncio.Future[LogAddress]) -> None:
        """The log completed frame ``frame``'s write (called by the log, in its completion callback)."""
        try:
            self._handle_write_done(frame, future)
        except Exception as error:  # a bug: stop (failing everything unacknowledged) rather than hang
            self._fail(InternalError(f"committing frame {frame.number} failed: {error!r}"), trace=False)
            raise

    def _handle_write_done(self, frame: _Frame, future: asyncio.Future[LogAddress]) -> None:
        if future.cancelled():
            self._fail(ObjectClosedError("a Tier-1 write was cancelled"))
            return
        error = future.exception()
        if self._failure is not None:
            return  # everything in flight was failed already
        if error is not None:
            self._fail(error, frame=frame.number)
            return
        address = future.result()
        if address.sequence != frame.number:
            self._fail(InternalError(f"Tier 1 wrote frame {frame.number} as record {address.sequence}"), trace=False)
            return
        if frame.number > self._highest_notified[0]:
            self._highest_notified = (frame.number, address)
        if self._awaiting_address:
            checkpoint = self._awaiting_address.pop(frame.number, None)
            if checkpoint is not None:
                checkpoint.truncation_address = address
        self._statistics.record(self._clock.monotonic() - frame.issued_at, frame.length / self._frame_capacity)
        tracer = self._tracer
        if tracer is not None:
            while self._highest_persisted_frame < frame.number:
                self._highest_persisted_frame += 1
                tracer("Persist", frame=self._highest_persisted_frame)
        if frame.number <= self._highest_committed_frame:
            if tracer is not None:
                tracer("Complete", frame=frame.number, acked=[])
            return  # a late notice: a later frame's notice committed this one already
        committed = self._commit_through(frame.number)
        if tracer is not None:
            tracer("Complete", frame=frame.number, acked=[op.sequence_number for op in committed])
        if (not self._checkpoint_queued and (self._frames_since_checkpoint >= self._checkpoint_frame_count
                                             or self._bytes_since_checkpoint >= self._checkpoint_frame_bytes)):
            self.queue_checkpoint()

    def _commit_through(self, frame_number: int) -> list[Operation]:
        in_flight = self._in_flight
        committed: list[Operation] = []
        self._committing = committed  # so that a failure below still answers them
        while in_flight and in_flight[0].number <= frame_number:
            frame = in_flight.popleft()
            frame.transaction.commit()
            (in_flight[0].transaction if in_flight else self._active).previous = None
            self._in_flight_bytes -= frame.length
            committed.extend(frame.operations)
            self._frames_since_checkpoint += 1
            self._bytes_since_checkpoint += frame.length
        self._highest_committed_frame = frame_number
        self._on_committed(committed)
        for operation in committed:
            future = operation.future
            if future is not None and not future.done():
                future.set_result(operation.offset if type(operation) is StreamSegmentAppendOperation
                                  else operation.result_offset)
        self._committing = []
        self._log_capacity.set()
        return committed

    def queue_checkpoint(self) -> None:
        """Queue a metadata checkpoint (behind what already waits: it need not jump the queue)."""
        checkpoint = MetadataCheckpointOperation()
        self._checkpoint_queued = True
        self._frames_since_checkpoint = self._bytes_since_checkpoint = 0
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.add_done_callback(self._checkpoint_done)
        checkpoint.future = future
        self._queue.append(checkpoint)
        if self._tracer is not None:
            self._trace_submit(checkpoint)
        self._wake()

    def _checkpoint_done(self, future: asyncio.Future[int]) -> None:
        self._checkpoint_queued = False
        if not future.cancelled():
            future.exception()  # retrieved: a failed checkpoint fails the whole processor anyway

    # --- failure ------------------------------------------------------------------------------------------

    def _fail(self, error: BaseException, *, frame: int | None = None, trace: bool = True) -> None:
        if self._failure is not None:
            return
        self._failure = error
        if trace and self._tracer is not None:
            self._tracer("FailWrite", frame=frame)
        unavailable = ContainerUnavailableError(f"the container stopped: {error}")
        unavailable.__cause__ = error
        doomed = list(self._committing)
        if self._processing is not None:
            doomed.append(self._processing)
            self._processing = None
        doomed += [op for frame_ in self._in_flight for op in frame_.operations]
        doomed += self._frame_operations
        doomed += self._queue
        self._in_flight.clear()
        self._frame_operations = []
        self._queue.clear()
        self._queue_bytes = self._in_flight_bytes = 0
        for operation in doomed:
            future = operation.future
            if future is not None and not future.done():
                future.set_exception(unavailable)
        for waiter in self._space_waiters:
            if not waiter.done():
                waiter.set_result(None)  # the caller re-checks and sees the failure
        self._space_waiters.clear()
        self._wake()
        self._log_capacity.set()
        if not self.stopped.done():
            self.stopped.set_result(None if isinstance(error, ObjectClosedError) else error)

    # --- tracing ------------------------------------------------------------------------------------------

    def _trace_submit(self, operation: Operation) -> None:
        assert self._tracer is not None
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
        self._tracer("Submit", kind=kind, segment=operation.segment_name or None, source=source,
                     length=length, offset=offset)
