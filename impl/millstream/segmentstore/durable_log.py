"""DurableLog: a container's write path, as ``spec/DurableLog.tla`` means it -- the processing queue,
DataFrames, pipelined Tier-1 writes, in-order commit, the stop-on-failure rule and recovery by replay.

The decisions are the ``OperationProcessor``'s, a synchronous machine whose methods are the spec's
actions and which returns instructions (``operation_processor``).  ``DurableLog`` is its asyncio
executor: it hands the machine each event -- an operation submitted, a Tier-1 write done or failed --
and carries out what comes back against the ``DurableDataLog``: writes frames, applies committed
operations (``on_committed``) and answers callers' futures, waits for capacity, traces.  Its one task
takes queued operations in batches (after the dynamic batching delay, ``throttler``, and while fewer
than ``limits.DATA_LOG_IN_FLIGHT_BYTES_MAX`` bytes of frames are in flight) and seals the open frame
when the queue runs dry.  The container reaches the write path only through ``DurableLog``.

Recovery (``LogReplay``; ``spec/DurableLog.tla``'s ``Recover``, ``spec/ContainerFailover.tla``'s ``Start``).  After
``initialize()`` fences any older owner, the log is read from its truncation point: the
DataFrameReader reassembles records (dropping a record a crash cut short), the first metadata
checkpoint loads the metadata, and every later operation is replayed through a metadata update
transaction -- it must validate where it stands and carry exactly the offsets and ids the container
would assign again, or the log is corrupt and the container refuses to start
(``DataCorruptionError``, naming where).  A later checkpoint must agree with what replay rebuilt.
Sequence numbers resume above the highest one seen in any entry, complete or not.  A log with
nothing in it gets a checkpoint first, so the log always starts with one.

The log is truncated only just below the frame a checkpoint begins in, and only once every byte that
checkpoint describes is in Tier 2 (``storage_writer``).  So the first frame read may begin with
records older than the checkpoint (they are part of it, and are skipped), and the checkpoint may
name segment bytes the log no longer holds -- its spans must then cover them, or the log is corrupt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from millstream import limits
from millstream.clock import Clock
from millstream.errors import (
    ContainerUnavailableError,
    DataCorruptionError,
    InternalError,
    MillstreamError,
    ObjectClosedError,
    StorageError,
)
from millstream.segmentstore.data_frame import DataFrameReader
from millstream.segmentstore.durable_data_log import DurableDataLog, LogAddress
from millstream.segmentstore.metadata import (
    ContainerMetadata,
    SegmentMetadata,
    checkpoint_body,
    checkpoint_version,
    deserialize_checkpoint,
    serialize_checkpoint,
)
from millstream.segmentstore.metadata_transaction import (
    ContainerMetadataUpdateTransaction,
    SegmentMetadataUpdateTransaction,
)
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
    MetadataCheckpointOperation,
    Operation,
    StreamSegmentAppendOperation,
    deserialize,
)
from millstream.segmentstore.throttler import WriteStatistics, batching_delay_seconds
from millstream.segmentstore.tracing import Tracer

__all__ = ["DurableLog", "LogReplay"]

_Future = asyncio.Future  # (one per operation: the hot path skips the module attribute lookup)


class DurableLog:
    """A container's write-ahead log (``spec/DurableLog.tla``): recovers the metadata (and, through
    ``on_committed``, the container's memory) from the log, then runs the ``OperationProcessor``'s
    instructions against the log on the running loop -- the asyncio executor of that machine."""

    def __init__(
        self,
        metadata: ContainerMetadata,
        data_log: DurableDataLog,
        *,
        clock: Clock,
        on_committed: Callable[[list[Operation]], None],
        on_loaded: Callable[[ContainerMetadata], None] | None = None,
        tracer: Tracer | None = None,
        frame_bytes_max: int = limits.DATA_FRAME_SIZE_BYTES_MAX,
        checkpoint_frame_count: int = limits.CHECKPOINT_FRAME_COUNT_MIN,
        wall_clock: Callable[[], float] | None = None,
        in_flight_bytes_max: int = limits.DATA_LOG_IN_FLIGHT_BYTES_MAX,
    ) -> None:
        self.metadata = metadata
        #: Seconds since the Unix epoch: the operations of each batch taken are stamped with it
        #: (``SegmentMetadata.last_modified_ms``).  None: no times (0).
        self._wall_clock = wall_clock
        self._log = data_log
        self._loop = asyncio.get_running_loop()
        self._clock = clock
        self._on_committed = on_committed
        self._tracer = tracer
        self._replay = LogReplay(metadata, on_committed=on_committed, on_loaded=on_loaded, wall_clock=wall_clock)
        self.processor = OperationProcessor(
            metadata, frame_bytes_max=min(frame_bytes_max, data_log.write_settings.max_write_length_bytes),
            checkpoint_frame_count=checkpoint_frame_count, tracing=tracer is not None)
        self._frame_capacity = self.processor.frame_capacity
        #: The latest wall time handed to the processor (ms; it changes far less often than batches are taken).
        self._wall_time_ms = 0
        self._in_flight_bytes_max = in_flight_bytes_max
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        #: The idle task waits on this future (None while it runs): a bare future costs less per
        #: wake-up than an asyncio.Event, and a lone appender wakes the task every time.
        self._idle: asyncio.Future[None] | None = None
        self._log_capacity = asyncio.Event()
        self._statistics = WriteStatistics(limits.BATCHING_STATISTICS_WINDOW)
        #: Operations being acknowledged (so that a failure while applying them still answers them).
        self._acknowledging: list[Operation] = []
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.stopped: asyncio.Future[BaseException | None] = self._loop.create_future()

    @property
    def recovered_operations(self) -> int:
        """Operations replayed by recovery."""
        return self._replay.recovered_operations

    async def start(self) -> None:
        """Take the log over, recover, and start processing.  Raises ``DataCorruptionError`` if the log
        cannot be trusted (nothing is written then), or the log's own errors (e.g. fencing)."""
        if self._task is not None:
            raise InternalError("the DurableLog was started already")
        self.metadata.epoch = await self._log.initialize()
        reader = DataFrameReader(self._log.read())
        found_checkpoint = self._replay.replay(reader)
        instructions = self.processor.recover(
            reader.highest_sequence_number + 1, (reader.last_address.sequence if reader.last_address else 0) + 1,
            reader.frame_count, found_checkpoint=found_checkpoint)
        self._task = self._loop.create_task(self._run(), name="operation-processor")
        self._execute(instructions)

    # --- what the container calls ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and self.processor.running and not self._closing

    @property
    def queue_full(self) -> bool:
        return self.processor.queue_full

    async def add(self, operation: Operation) -> int:
        """Submit ``operation`` (waiting while the queue is full) and wait until it is durable and
        applied; return its offset.  Raises the ``CallerError`` it was rejected with, or
        ``ContainerUnavailableError`` if the log stopped before acknowledging it (then it may or may
        not have taken effect)."""
        if self.processor.queue_full:
            await self.wait_for_space()
        return await self.submit(operation)

    async def wait_for_space(self) -> None:
        """Wait until the queue has room (backpressure).  Raises ``ContainerUnavailableError`` if the
        log stops meanwhile."""
        while self.processor.queue_full:
            self._check_running()
            waiter = self._loop.create_future()
            self._space_waiters.append(waiter)
            await waiter
        self._check_running()

    def submit(self, operation: Operation) -> asyncio.Future[int]:
        """[Submit] Queue ``operation`` without waiting for space (the caller bounds what it submits);
        the future completes when it is acknowledged, or fails with its rejection or unavailability.

        Processing is left to the task even when it is idle: operations that arrive in the same loop
        turn (a burst) then share one frame."""
        if self._closing or self._task is None:
            self._check_running()
        future: asyncio.Future[int] = _Future(loop=self._loop)
        operation.future = future
        instructions = self.processor.submit(operation)
        if instructions:
            self._execute(instructions)
        idle = self._idle  # (``_wake``, inlined: this runs once per operation)
        if idle is not None and not idle.done():
            idle.set_result(None)
        return future

    def peek(self, name: str) -> SegmentMetadata | SegmentMetadataUpdateTransaction | None:
        """Segment ``name`` as the next operation would see it (operations in flight included), or None."""
        return self.processor.peek(name)

    async def close(self) -> None:
        """Stop taking operations; wait (bounded) for frames in flight; fail whatever is left."""
        self._closing = True
        self._wake()
        self._log_capacity.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        deadline = self._clock.monotonic() + limits.SHUTDOWN_TIMEOUT_SECONDS
        while self.processor.in_flight_frames and self.processor.failure is None \
                and self._clock.monotonic() < deadline:
            self._log_capacity.clear()
            await asyncio.wait_for(self._log_capacity.wait(), timeout=deadline - self._clock.monotonic())
        self.fail(ObjectClosedError("the container is shutting down"))

    def fail(self, error: BaseException) -> None:
        """Stop because a part of the container outside the log failed (e.g. Tier 2 holds corrupt
        data): everything unacknowledged fails, as on a Tier-1 failure."""
        self._execute(self.processor.stop(error))

    def kill(self) -> None:
        """Stop at once, as a process that dies: no further writes, nothing acknowledged."""
        if self._task is not None:
            self._task.cancel()
        self.fail(ObjectClosedError("the container was killed"))

    # --- the executor ----------------------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self.processor.failure is not None or self._closing or self._task is None:
            raise ContainerUnavailableError("the container is not running") from self.processor.failure

    def _wake(self) -> None:
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _run(self) -> None:
        processor = self.processor
        queue = processor.queue
        try:
            while processor.failure is None:
                if not queue:
                    if self._closing:
                        return
                    self._idle = self._loop.create_future()
                    try:
                        await self._idle
                    finally:
                        self._idle = None
                    continue
                in_flight_frames = processor.in_flight_frames
                if in_flight_frames:  # (else the delay is zero: see batching_delay_seconds)
                    delay = batching_delay_seconds(
                        in_flight_frames, self._statistics.latency_seconds, self._statistics.fill_ratio,
                        limits.BATCHING_DELAY_SECONDS_MAX)
                    if delay > 0.0:
                        await self._clock.sleep(delay)
                while processor.in_flight_bytes >= self._in_flight_bytes_max and processor.failure is None:
                    self._log_capacity.clear()
                    await self._log_capacity.wait()
                if processor.failure is not None:
                    return
                self._process_queued()
                if not queue and processor.failure is None:
                    self._execute(processor.seal_frame())
        except (StorageError, ObjectClosedError) as error:
            self._execute(processor.fail_write(error))
        except Exception as error:  # a bug: stop rather than keep serving from a broken state
            self.fail(InternalError(f"operation processor failed: {error!r}"))
            raise

    def _process_queued(self) -> None:
        processor = self.processor
        if self._wall_clock is not None:  # (once per batch, not per operation)
            time_ms = int(self._wall_clock() * 1000)
            if time_ms > self._wall_time_ms:
                self._wall_time_ms = time_ms
                processor.advance_wall_time(time_ms)
        process, execute = processor.process, self._execute
        for _ in range(min(len(processor.queue), limits.PROCESSOR_TAKE_COUNT_MAX)):
            instructions = process()
            if instructions:
                execute(instructions)
                if processor.failure is not None:
                    return
        waiters = self._space_waiters
        while waiters and not processor.queue_full:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _execute(self, instructions: Sequence[Instruction]) -> None:
        """Carry out the processor's instructions, in order.  (The two of every frame, ``WriteFrame`` and
        ``Acknowledge``, are carried out here rather than in methods of their own: a lone appender's
        every operation is a frame, and a call is a measurable part of what one costs.)"""
        for instruction in instructions:
            if type(instruction) is WriteFrame:
                if self.processor.failure is not None:
                    continue  # (a write failed while this frame's batch was carried out: it must not follow)
                try:
                    self._log.append(instruction.data, partial(
                        self._on_write_done, instruction.frame_number, len(instruction.data), self._clock.monotonic()))
                except ObjectClosedError as error:
                    # The log failed (its writer saw the failure before our completion callback did) or
                    # was closed.  A failure is the real cause: report it as such, so the host recovers.
                    if isinstance(error.__cause__, StorageError):
                        raise error.__cause__ from error
                    raise
            elif type(instruction) is Acknowledge:
                operations = self._acknowledging = instruction.operations
                self._on_committed(operations)
                for operation in operations:
                    future = operation.future
                    if future is not None and not future.done():
                        future.set_result(operation.offset if type(operation) is StreamSegmentAppendOperation
                                          else operation.result_offset)
                self._acknowledging = []
                self._log_capacity.set()
            elif type(instruction) is Reject:
                future = instruction.operation.future
                if future is not None and not future.done():
                    future.set_exception(instruction.error)
            elif type(instruction) is Trace:
                assert self._tracer is not None
                self._tracer(instruction.action, **instruction.fields)
            elif type(instruction) is Stop:
                self._stop(instruction)
            else:
                raise InternalError(f"unknown instruction {instruction!r}")

    def _on_write_done(self, frame_number: int, length: int, issued_at: float,
                       future: asyncio.Future[LogAddress]) -> None:
        """The log completed frame ``frame_number``'s write (called by the log, in its completion callback)."""
        processor = self.processor
        try:
            if future.cancelled():
                self._execute(processor.fail_write(ObjectClosedError("a Tier-1 write was cancelled")))
                return
            error = future.exception()
            if error is not None:
                self._execute(processor.fail_write(error, frame_number))
                return
            if processor.failure is not None:
                return
            self._statistics.record(self._clock.monotonic() - issued_at, length / self._frame_capacity)
            instructions = processor.persist(frame_number)
            if instructions:  # (only when tracing)
                self._execute(instructions)
            self._execute(processor.complete(frame_number, future.result()))
            if processor.queue:
                self._wake()  # (the processor queued a checkpoint)
        except Exception as error:  # a bug: stop (failing everything unacknowledged) rather than hang
            self.fail(InternalError(f"committing frame {frame_number} failed: {error!r}"))
            raise

    def _stop(self, stop: Stop) -> None:
        unavailable = ContainerUnavailableError(f"the container stopped: {stop.error}")
        unavailable.__cause__ = stop.error
        for operation in (*self._acknowledging, *stop.operations):
            future = operation.future
            if future is not None and not future.done():
                future.set_exception(unavailable)
        self._acknowledging = []
        for waiter in self._space_waiters:
            if not waiter.done():
                waiter.set_result(None)  # the caller re-checks and sees the failure
        self._space_waiters.clear()
        self._wake()
        self._log_capacity.set()
        if not self.stopped.done():
            self.stopped.set_result(None if isinstance(stop.error, ObjectClosedError) else stop.error)


class LogReplay:
    """Recovery by replay (the spec's ``Replay``): loads the first checkpoint into ``metadata`` and
    replays every later operation onto it, handing each to ``on_committed`` as if just committed."""

    def __init__(self, metadata: ContainerMetadata, *, on_committed: Callable[[list[Operation]], None],
                 on_loaded: Callable[[ContainerMetadata], None] | None, wall_clock: Callable[[], float] | None) -> None:
        self.metadata = metadata
        self._on_committed = on_committed
        self._on_loaded = on_loaded
        self._wall_clock = wall_clock
        #: Operations replayed by the last recovery.
        self.recovered_operations = 0

    def replay(self, reader: DataFrameReader) -> bool:
        """Replay ``reader``'s records; True if the log holds a checkpoint (else it held nothing).
        Raises ``DataCorruptionError`` naming where the log cannot be trusted."""
        container = self.metadata.container_id
        transaction: ContainerMetadataUpdateTransaction | None = None
        skipped = None
        loaded_version = 0
        # What replay changes is stamped with the time of this recovery (the log holds no times): a
        # segment's last_modified_ms is then never earlier than the truth; later checkpoints correct it.
        recovered_at_ms = 0 if self._wall_clock is None else int(self._wall_clock() * 1000)
        for record in reader:
            where = f"container {container}, operation {record.sequence_number} (log record {record.address.sequence})"
            operation = deserialize(record.data, record.sequence_number)
            if transaction is None:
                if not isinstance(operation, MetadataCheckpointOperation):
                    if reader.frame_count == 1:
                        skipped = skipped or where
                        continue  # older than the first checkpoint, which the truncation kept: part of it
                    raise DataCorruptionError(f"{where}: the log does not start with a metadata checkpoint")
                operation.frame_number, operation.truncation_address = record.first_frame, record.address_before
                self._load(operation, where)
                loaded_version = checkpoint_version(operation.payload)
                transaction = ContainerMetadataUpdateTransaction(self.metadata, None)
                transaction.time_ms = recovered_at_ms
                self._on_committed([operation])
                continue
            if isinstance(operation, MetadataCheckpointOperation):
                self._compare(operation.payload, transaction, loaded_version, where)
                operation.frame_number, operation.truncation_address = record.first_frame, record.address_before
                self._on_committed([operation])
                continue
            try:
                transaction.replay(operation)
            except DataCorruptionError as error:
                raise DataCorruptionError(f"{where}: {error}") from error
            except MillstreamError as error:
                raise DataCorruptionError(f"{where}: does not replay: {error!r}") from error
            self._on_committed([operation])
            self.recovered_operations += 1
        if transaction is None and skipped is not None:
            raise DataCorruptionError(f"{skipped}: the log does not start with a metadata checkpoint")
        if transaction is not None:
            transaction.commit()
        self.metadata.check_invariants()
        return transaction is not None

    def _compare(self, payload: bytes, transaction: ContainerMetadataUpdateTransaction, loaded_version: int,
                 where: str) -> None:
        """A later checkpoint must hold what replay rebuilt, byte for byte -- compared in the older of
        its version and the loaded one's (what the loaded checkpoint lacked, replay cannot rebuild:
        a version-1 start knows no event boundaries), and without the modification times, which replay
        does not rebuild but takes over from it."""
        stored_version = checkpoint_version(payload)
        version = min(loaded_version, stored_version)
        stored = deserialize_checkpoint(payload, self.metadata.container_id)
        if stored_version != version:
            payload = serialize_checkpoint(stored.next_segment_id, stored.segments.values(), version=version)
        rebuilt = serialize_checkpoint(transaction.next_segment_id, transaction.snapshot(), version=version)
        if checkpoint_body(rebuilt) != checkpoint_body(payload):
            raise DataCorruptionError(f"{where}: checkpoint disagrees with the replayed log")
        if stored_version >= 2:
            transaction.adopt_modification_times(stored)

    def _load(self, checkpoint: MetadataCheckpointOperation, where: str) -> None:
        """Load the first checkpoint.  The bytes it names may be only in Tier 2 now; whether its spans
        (and later flushes) cover them is checked once replay is done (``SegmentContainer``)."""
        loaded = deserialize_checkpoint(checkpoint.payload, self.metadata.container_id)
        self.metadata.segments, self.metadata.ids_by_name = loaded.segments, loaded.ids_by_name
        self.metadata.next_segment_id = loaded.next_segment_id
        if self._on_loaded is not None:
            self._on_loaded(self.metadata)
