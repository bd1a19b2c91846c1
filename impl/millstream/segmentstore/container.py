"""SegmentContainer: the public face of one container -- segments you can create, append to, seal,
truncate, merge, delete and read.

Lifecycle (a table, ``LIFECYCLE``): STARTING -> RUNNING -> STOPPING -> STOPPED; any state but
STOPPED goes to STOPPED on a failure.  A container that stopped because Tier 1 failed is not
restarted in place: its host builds a new one on the same log, which recovers by replay.

Every mutating call is one operation through the DurableLog; it returns once the operation is
durable and visible to readers, or raises the typed error it was rejected with.  Arguments are
validated before anything is queued (``InvalidArgumentError``, ``PayloadTooLargeError``).

Truncation of a segment that holds events (its ``EVENT_SEGMENT_ATTRIBUTE_ID`` says so) lands only on
an event boundary: ``truncate`` checks the offset against the committed bytes first, within a
bounded read (``event_boundaries``), and refuses it with ``EventBoundaryError`` otherwise; other
segments keep byte granularity.

Tiering.  Given a ``ChunkStorage`` (Tier 2), the container runs a ``StorageWriter`` that flushes
acknowledged bytes there, truncates the log behind them and lets the cache evict them; reads of
evicted bytes come back from Tier 2.  While more than ``StorageSettings.unflushed_bytes_max``
acknowledged bytes are not yet in Tier 2, appends are throttled: they wait for flushes before being
queued, so a slow Tier 2 slows acknowledgements instead of growing memory and the log.  Without a
``ChunkStorage`` everything stays in memory and in the log (tests, benchmarks of Tier 1 alone).
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import time
from collections.abc import Callable, Iterable, Sequence

import attrs

from millstream import limits
from millstream.clock import Clock, SystemClock
from millstream.errors import (
    BadOffsetError,
    ContainerUnavailableError,
    DataCorruptionError,
    EventBoundaryError,
    InternalError,
    InvalidArgumentError,
    PayloadTooLargeError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
)
from millstream.model.types import (
    ATTRIBUTE_ID_MAX,
    INT64_MAX,
    INT64_MIN,
    NO_OFFSET,
    AttributeUpdate,
    AttributeUpdateType,
    SegmentStatus,
)
from millstream.segmentstore import event_boundaries
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.durable_log import DurableLog
from millstream.segmentstore.event_boundaries import holds_events, nearest_known, walk_events
from millstream.segmentstore.layout import covered_end, is_covered
from millstream.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from millstream.segmentstore.operations import (
    DeleteSegmentOperation,
    MergeSegmentOperation,
    MetadataCheckpointOperation,
    Operation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentSealOperation,
    StreamSegmentTruncateOperation,
    UpdateAttributesOperation,
)
from millstream.segmentstore.read_index import ReadIndex, ReadResult
from millstream.segmentstore.storage_writer import StorageWriter
from millstream.segmentstore.tracing import Tracer

__all__ = ["LIFECYCLE", "ContainerState", "SegmentContainer", "SegmentInfo", "StorageSettings"]


class ContainerState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


#: state -> {event: next state}.  Anything not listed is a bug (InternalError).
LIFECYCLE: dict[ContainerState, dict[str, ContainerState]] = {
    ContainerState.STARTING: {"started": ContainerState.RUNNING, "failed": ContainerState.STOPPED},
    ContainerState.RUNNING: {"stop": ContainerState.STOPPING, "failed": ContainerState.STOPPED},
    ContainerState.STOPPING: {"stopped": ContainerState.STOPPED, "failed": ContainerState.STOPPED},
    ContainerState.STOPPED: {},
}


@attrs.frozen
class SegmentInfo:
    """A segment's committed state.  ``storage_length``: bytes from the start offset on that are in
    Tier 2 without a gap (0 without Tier 2).  ``last_modified_ms``: when an operation last changed it
    (ms since the Unix epoch by the container's wall clock; see ``SegmentMetadata.last_modified_ms``)."""

    name: str
    length: int
    start_offset: int
    sealed: bool
    attributes: dict[int, int] = attrs.field(eq=True, hash=False)
    storage_length: int = attrs.field(default=0, eq=False)
    last_modified_ms: int = attrs.field(default=0, eq=False)


@attrs.frozen
class StorageSettings:
    """How the container uses Tier 2 and memory; defaults and reasons are in ``limits``."""

    cache_bytes_max: int = limits.CACHE_BYTES_MAX
    catch_up_cache_bytes_max: int = limits.CATCH_UP_CACHE_BYTES_MAX
    flush_bytes_min: int = limits.STORAGE_FLUSH_BYTES_MIN
    flush_bytes_max: int = limits.STORAGE_FLUSH_BYTES_MAX
    flush_age_seconds: float = limits.STORAGE_FLUSH_AGE_SECONDS
    unflushed_bytes_max: int = limits.UNFLUSHED_BYTES_MAX


class SegmentContainer:
    """One segment container over a durable data log.  Use ``async with`` or ``start``/``stop``."""

    def __init__(
        self,
        container_id: int,
        data_log: DurableDataLog,
        *,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        frame_bytes_max: int = limits.DATA_FRAME_SIZE_BYTES_MAX,
        checkpoint_frame_count: int = limits.CHECKPOINT_FRAME_COUNT_MIN,
        chunk_storage: ChunkStorage | None = None,
        storage_settings: StorageSettings | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``wall_clock`` (seconds since the Unix epoch) times segments' ``last_modified_ms``."""
        self.container_id = container_id
        self._clock = clock or SystemClock()
        self._metadata = ContainerMetadata(container_id)
        settings = storage_settings or StorageSettings()
        self._read_index = ReadIndex(self._clock, cache_bytes_max=settings.cache_bytes_max,
                                     catch_up_cache_bytes_max=settings.catch_up_cache_bytes_max)
        self._storage_writer: StorageWriter | None = None
        if chunk_storage is not None:
            self._storage_writer = StorageWriter(
                container_id, self._metadata, self._read_index, chunk_storage, clock=self._clock,
                submit=self._run_internal, truncate_log=data_log.truncate,
                flush_bytes_min=settings.flush_bytes_min, flush_bytes_max=settings.flush_bytes_max,
                flush_age_seconds=settings.flush_age_seconds, unflushed_bytes_max=settings.unflushed_bytes_max)
            self._read_index.attach_tier_two(self._storage_writer)
        self._durable_log = DurableLog(
            self._metadata, data_log, clock=self._clock, on_committed=self._apply_committed, on_loaded=self._load,
            tracer=tracer, frame_bytes_max=frame_bytes_max, checkpoint_frame_count=checkpoint_frame_count,
            wall_clock=wall_clock)
        self._data_log = data_log
        self._state = ContainerState.STARTING
        self._started = False
        self._closing_task: asyncio.Task[None] | None = None
        #: Appends that had to wait for Tier 2 (evidence for tests and benchmarks).
        self.throttled_appends = 0
        self.stopped: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    # --- lifecycle -----------------------------------------------------------------------------------

    @property
    def state(self) -> ContainerState:
        return self._state

    @property
    def storage_writer(self) -> StorageWriter | None:
        """The Tier-2 writer (None without Tier 2); its counters are evidence for tests and benchmarks."""
        return self._storage_writer

    @property
    def read_index(self) -> ReadIndex:
        return self._read_index

    def _transition(self, event: str) -> None:
        following = LIFECYCLE[self._state].get(event)
        if following is None:
            raise InternalError(f"container {self.container_id}: no transition from {self._state} on {event!r}")
        self._state = following

    async def start(self) -> None:
        """Recover from the log and start serving.  Raises ``DataCorruptionError`` if the log cannot be
        trusted, or the log's error if it cannot be taken over; the container is STOPPED then."""
        if self._started:
            raise InternalError("a container starts once; build a new one to recover again")
        self._started = True
        try:
            await self._durable_log.start()
            self._sync_read_index()
        except BaseException as error:
            self._durable_log.kill()
            self._transition("failed")
            await self._data_log.close()
            self.stopped.set_result(error)
            raise
        self._transition("started")
        self._durable_log.stopped.add_done_callback(self._on_durable_log_stopped)
        if self._storage_writer is not None:
            self._storage_writer.start(self._metadata.epoch)
            task = self._storage_writer.stopped
            assert task is not None
            task.add_done_callback(self._on_storage_writer_stopped)

    def _on_storage_writer_stopped(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and self._state is ContainerState.RUNNING:
            # Tier 2 holds data that cannot be trusted, or a bug: stop rather than serve wrong bytes.
            self._durable_log.fail(error)

    def _on_durable_log_stopped(self, stopped: asyncio.Future[BaseException | None]) -> None:
        cause = stopped.result()
        if cause is None and self._state is ContainerState.RUNNING:
            # The write path stopped on its own, yet nobody asked it to: that is a failure too.
            cause = ContainerUnavailableError(f"container {self.container_id}: its processor stopped")
        if self._state is not ContainerState.STOPPED:
            self._transition("failed" if cause is not None else "stopped")
        if cause is not None and not self.stopped.done():
            # A Tier-1 failure: release the log; the host recovers a new container from it.
            self._closing_task = asyncio.get_running_loop().create_task(self._close_log_after_failure(cause))

    async def _close_log_after_failure(self, cause: BaseException) -> None:
        try:
            await self._data_log.close()
        finally:
            if not self.stopped.done():
                self.stopped.set_result(cause)

    async def stop(self) -> None:
        """Stop taking operations, finish (bounded) what is in flight, release the log.  Reads waiting
        at a tail raise ``ContainerUnavailableError`` at once (their clients go to the next owner)."""
        if self._state is ContainerState.RUNNING:
            self._transition("stop")
        self._read_index.close(ContainerUnavailableError(f"container {self.container_id} stopped"))
        if self._storage_writer is not None:
            await self._storage_writer.close()
        if self._started:
            await self._durable_log.close()
        if self._state is not ContainerState.STOPPED:
            self._transition("stopped")
        if self._closing_task is not None:
            await self._closing_task
        await self._data_log.close()
        if not self.stopped.done():
            self.stopped.set_result(None)

    def kill(self) -> None:
        """Die at once, as the process would (tests): nothing more is written or acknowledged."""
        if self._storage_writer is not None:
            self._storage_writer.kill()
        self._durable_log.kill()
        self._state = ContainerState.STOPPED
        if not self.stopped.done():
            self.stopped.set_result(None)

    async def __aenter__(self) -> SegmentContainer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- operations ----------------------------------------------------------------------------------

    async def create_segment(self, name: str, attribute_updates: Sequence[AttributeUpdate] = ()) -> None:
        """Create segment ``name``.  Raises ``StreamSegmentExistsError`` if it exists (and is not deleted)."""
        operation = StreamSegmentMapOperation(_check_name(name), _check_attributes(attribute_updates))
        await self._run(operation, name)

    async def append(self, name: str, data: bytes | bytearray | memoryview,
                     attribute_updates: Sequence[AttributeUpdate] = (), *, expected_offset: int | None = None) -> int:
        """Append ``data`` (with ``attribute_updates``, atomically); return the offset it landed at.

        With ``expected_offset`` the append is conditional: it is rejected with ``BadOffsetError``
        unless the segment's length is exactly that.  Raises ``StreamSegmentSealedError`` on a sealed
        segment and ``BadAttributeUpdateError`` if an attribute condition fails; nothing is appended then.
        """
        operation = self._append_operation(name, data, attribute_updates, expected_offset)
        writer = self._storage_writer
        if writer is not None and writer.unflushed_bytes > writer.unflushed_bytes_max:
            await self._throttle(writer)
        durable_log = self._running_durable_log()
        if durable_log.queue_full:
            await durable_log.wait_for_space()
        return await durable_log.submit(operation)

    def append_at_once(self, name: str, data: bytes | bytearray | memoryview,
                       attribute_updates: Sequence[AttributeUpdate] = (), *,
                       expected_offset: int | None = None) -> asyncio.Future[int] | None:
        """``append`` for a caller that keeps no coroutine per append (the server, once per block): the
        future of the offset, with ``append``'s errors -- or None, having done nothing, when the append
        would have to wait (Tier 2 lags, or the processor's queue is full): then await ``append``.
        Raises what ``append`` raises before it would wait."""
        writer = self._storage_writer
        if writer is not None and writer.unflushed_bytes > writer.unflushed_bytes_max:
            return None
        durable_log = self._running_durable_log()
        if durable_log.queue_full:
            return None
        return durable_log.submit(self._append_operation(name, data, attribute_updates, expected_offset))

    def _append_operation(self, name: str, data: bytes | bytearray | memoryview,
                          attribute_updates: Sequence[AttributeUpdate],
                          expected_offset: int | None) -> StreamSegmentAppendOperation:
        if type(data) is not bytes:  # (what nearly every caller passes, and needs no more checks)
            data = _byte_view(data)
        if len(data) > limits.APPEND_LENGTH_BYTES_MAX:
            raise PayloadTooLargeError(f"append of {len(data)} bytes exceeds {limits.APPEND_LENGTH_BYTES_MAX}")
        if expected_offset is not None and not _is_offset(expected_offset):
            raise InvalidArgumentError(f"expected_offset must be a non-negative int, not {expected_offset!r}")
        payload = bytes(data) if isinstance(data, bytearray) else data
        operation = StreamSegmentAppendOperation(
            -1, payload, () if attribute_updates == () else _check_attributes(attribute_updates),
            expected_offset=NO_OFFSET if expected_offset is None else expected_offset)
        # A name the committed metadata knows was checked when its segment was created.
        known = type(name) is str and name in self._metadata.ids_by_name
        operation.segment_name = name if known else _check_name(name)
        return operation

    def _running_durable_log(self) -> DurableLog:
        if self._state is not ContainerState.RUNNING:
            raise ContainerUnavailableError(f"container {self.container_id} is {self._state.value}")
        return self._durable_log

    async def _throttle(self, writer: StorageWriter) -> None:
        """Hold an append while Tier 2 lags: each wait is bounded, and ends early when a flush commits."""
        self.throttled_appends += 1
        while writer.unflushed_bytes > writer.unflushed_bytes_max:
            if self._state is not ContainerState.RUNNING:
                raise ContainerUnavailableError(f"container {self.container_id} is {self._state.value}")
            await writer.wait_for_progress(limits.THROTTLE_WAIT_SECONDS_MAX)

    async def seal(self, name: str) -> int:
        """Seal the segment; return its final length.  Raises ``StreamSegmentSealedError`` if sealed."""
        return await self._run(StreamSegmentSealOperation(-1), name)

    async def truncate(self, name: str, offset: int) -> None:
        """Make bytes below ``offset`` unreadable.  Raises ``BadOffsetError`` unless
        ``start offset <= offset <= length``, and -- for a segment that holds events -- its subclass
        ``EventBoundaryError`` unless an event begins at ``offset`` (see ``check_event_boundary``)."""
        if not _is_offset(offset):
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        operation = StreamSegmentTruncateOperation(-1, offset)
        # Whether it holds events as the operations in flight leave it (it may have just been created);
        # its bytes are checked as acknowledged.
        newest = self._durable_log.peek(_check_name(name)) if self._started else None
        if newest is not None and newest.status in (SegmentStatus.ACTIVE, SegmentStatus.SEALED) \
                and holds_events(newest.get_attribute):
            segment = self._metadata.segments.get(newest.id)
            if segment is None:  # created, but not acknowledged yet: it holds no acknowledged bytes
                if offset != 0:
                    raise BadOffsetError(f"truncation offset {offset} is beyond the acknowledged bytes of {name!r}")
            else:
                await self._check_event_boundary(segment, offset)
            operation.expected_segment_id = newest.id
        await self._run(operation, name)

    async def check_event_boundary(self, name: str, offset: int) -> None:
        """Return if ``offset`` may start segment ``name``: it lies in ``[start offset, length]`` of
        the committed bytes and, if the segment holds events, an event begins there.  Otherwise raise
        ``BadOffsetError`` (outside), or its subclass ``EventBoundaryError`` (inside an event, not
        event data, or not confirmable within ``limits.EVENT_BOUNDARY_SCAN_BYTES_MAX`` bytes of
        reading).  Reads only committed bytes; changes nothing."""
        if not _is_offset(offset):
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        segment = self._committed(name)
        if not segment.start_offset <= offset <= segment.length:
            raise BadOffsetError(f"offset {offset} is outside [{segment.start_offset}, {segment.length}] of {name!r}")
        if holds_events(segment.attributes):
            await self._check_event_boundary(segment, offset)

    def event_boundaries(self, name: str, start_offset: int, end_offset: int, limit: int) -> tuple[int, ...]:
        """The event boundaries known of segment ``name`` (which holds events) in ``[start_offset,
        end_offset]`` of its committed bytes, without reading them: its start offset, the entries of
        its sparse index (``event_boundaries``) and its length, ascending -- the lowest ``limit`` of
        them.  Offsets beyond the segment's bytes are simply not there.  Raises
        ``InvalidArgumentError`` for offsets that are not non-negative ints, a start beyond the end,
        a ``limit`` below 1, or a segment that does not hold events (it has no event boundaries)."""
        if not _is_offset(start_offset) or not _is_offset(end_offset) or start_offset > end_offset:
            raise InvalidArgumentError(f"an offset range is two non-negative ints, the first at most the second, not "
                                       f"[{start_offset!r}, {end_offset!r}]")
        if type(limit) is not int or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive int, not {limit!r}")
        segment = self._committed(name)
        if not holds_events(segment.attributes):
            raise InvalidArgumentError(f"segment {name!r} does not hold events: it has no event boundaries")
        known = (segment.start_offset, *segment.boundaries, segment.length)
        first = bisect.bisect_left(known, start_offset)
        last = bisect.bisect_right(known, end_offset)
        return tuple(sorted(set(known[first:min(last, first + limit + 1)])))[:limit]

    async def _check_event_boundary(self, segment: SegmentMetadata, offset: int) -> None:
        """Hop event headers from the nearest known boundary to ``offset`` (``event_boundaries``)."""
        length, start = segment.length, segment.start_offset
        if offset > length:
            # Beyond the acknowledged bytes (maybe inside appends still in flight): nothing to check it
            # against, and no caller can have learned such an offset from a reader or a cut.
            raise BadOffsetError(f"truncation offset {offset} is outside [{start}, {length}] of {segment.name!r}")
        if offset <= start or offset == length or offset in segment.boundaries:
            return  # (below the start: the operation refuses it with BadOffsetError)
        position = known = nearest_known(segment.boundaries, start, offset)
        budget = event_boundaries.SCAN_BYTES_MAX
        base, buffer, read = position, b"", 0
        # Reads start small and double while they hold whole events; after a hop past what was read
        # (a long event) they start small again, so a long event costs one small read, not its length.
        window = event_boundaries.SCAN_READ_BYTES_MIN
        while position < offset:
            if position > base + len(buffer):  # hopped over the rest of a long event: read on from there
                window = event_boundaries.SCAN_READ_BYTES_MIN
            elif read:
                window = min(window * 2, limits.READ_LENGTH_BYTES_MAX)
            buffer, base = buffer[position - base:], position  # (what is left of an event header, if any)
            want = min(offset - base - len(buffer), window)
            if read + want > budget:
                want = budget - read
            if want <= 0:
                raise EventBoundaryError(
                    f"offset {offset} of {segment.name!r} could not be confirmed as an event boundary within "
                    f"{budget} bytes of reading from the nearest known one, {known}: truncate at an offset a "
                    "reader, a stream cut or the segment's length gave")
            result = await self._read_index.read(segment.id, base + len(buffer), want, 0.0)
            if not result.data:
                raise InternalError(f"a read of committed bytes of {segment.name!r} at {base + len(buffer)} was empty")
            read += len(result.data)
            buffer += result.data
            position = walk_events(buffer, base, position, offset, segment.name)

    async def merge(self, target: str, source: str) -> int:
        """Append the sealed ``source``'s bytes to ``target``; ``source`` is gone afterwards.  Returns
        the offset in ``target`` where they begin."""
        operation = MergeSegmentOperation(-1, -1)
        operation.source_name = _check_name(source)
        return await self._run(operation, target)

    async def delete(self, name: str) -> None:
        """Delete the segment; its name may be created again."""
        await self._run(DeleteSegmentOperation(-1), name)

    async def update_attributes(self, name: str, attribute_updates: Sequence[AttributeUpdate]) -> None:
        """Apply ``attribute_updates`` atomically (all or none)."""
        await self._run(UpdateAttributesOperation(-1, _check_attributes(attribute_updates)), name)

    async def _run(self, operation: Operation, name: str) -> int:
        operation.segment_name = _check_name(name)
        return await self._run_internal(operation)

    async def _run_internal(self, operation: Operation) -> int:
        if self._state is not ContainerState.RUNNING:
            raise ContainerUnavailableError(f"container {self.container_id} is {self._state.value}")
        return await self._durable_log.add(operation)

    # --- reads ---------------------------------------------------------------------------------------

    def _committed(self, name: str) -> SegmentMetadata:
        if self._state is not ContainerState.RUNNING:
            # Stopped or recovering: what memory holds may be stale or empty; "does not exist" would
            # be a lie a caller could take as final.
            raise ContainerUnavailableError(f"container {self.container_id} is {self._state.value}")
        segment = self._metadata.get(_check_name(name))
        if segment is None or segment.status is SegmentStatus.DELETED:
            raise StreamSegmentNotExistsError(f"segment {name!r} does not exist")
        if segment.status is SegmentStatus.MERGED:
            raise StreamSegmentMergedError(f"segment {name!r} was merged")
        return segment

    def get_info(self, name: str) -> SegmentInfo:
        """The committed state of segment ``name``."""
        segment = self._committed(name)
        stored = covered_end(segment.spans, segment.start_offset) - segment.start_offset
        return SegmentInfo(name, segment.length, segment.start_offset, segment.status is SegmentStatus.SEALED,
                           dict(segment.attributes), stored, segment.last_modified_ms)

    def segment_names(self) -> list[str]:
        """Names of every segment that exists (active or sealed)."""
        return sorted(s.name for s in self._metadata.segments.values()
                      if s.status in (SegmentStatus.ACTIVE, SegmentStatus.SEALED))

    async def read(self, name: str, offset: int, max_length: int, *, wait_seconds: float = 0.0) -> ReadResult:
        """Read up to ``max_length`` committed bytes of ``name`` from ``offset``; at the tail wait up to
        ``wait_seconds`` for more.  See ``ReadIndex.read`` for the errors."""
        if not _is_offset(offset) or not _is_offset(max_length):
            raise InvalidArgumentError(
                f"offset and max_length must be non-negative ints, not {offset!r} and {max_length!r}")
        if not isinstance(wait_seconds, (int, float)):
            raise InvalidArgumentError(f"wait_seconds must be a number, not {wait_seconds!r}")
        segment = self._committed(name)
        return await self._read_index.read(segment.id, offset, max_length, wait_seconds)

    # --- applying committed operations to memory -----------------------------------------------------

    def _load(self, metadata: ContainerMetadata) -> None:
        """Recovery loaded a checkpoint: every live segment's bytes so far are in Tier 2 only."""
        for segment in metadata.segments.values():
            if segment.status in (SegmentStatus.ACTIVE, SegmentStatus.SEALED):
                self._read_index.load(segment.id, segment.start_offset, segment.length,
                                      segment.status is SegmentStatus.SEALED)

    def _apply_committed(self, operations: list[Operation]) -> None:
        """Apply committed operations to the read index, in order.  A run of appends to one segment
        is applied as one append of their joined data (one copy into the index, one wake-up)."""
        if self._storage_writer is not None:
            self._storage_writer.on_committed(operations)
        read_index = self._read_index
        run_segment, run_offset, run_parts = -1, 0, []
        for operation in operations:
            if type(operation) is StreamSegmentAppendOperation:
                if not operation.data:
                    continue
                if operation.segment_id == run_segment:
                    run_parts.append(operation.data)
                    continue
                if run_parts:
                    read_index.segment(run_segment).append(run_offset, b"".join(run_parts))
                run_segment, run_offset, run_parts = operation.segment_id, operation.offset, [operation.data]
                continue
            if run_parts:
                read_index.segment(run_segment).append(run_offset, b"".join(run_parts))
                run_segment, run_parts = -1, []
            if isinstance(operation, StreamSegmentMapOperation):
                read_index.segment(operation.segment_id)
            elif isinstance(operation, StreamSegmentSealOperation):
                read_index.segment(operation.segment_id).seal()
            elif isinstance(operation, StreamSegmentTruncateOperation):
                read_index.segment(operation.segment_id).truncate(operation.offset)
            elif isinstance(operation, DeleteSegmentOperation):
                read_index.delete(operation.segment_id)
            elif isinstance(operation, MergeSegmentOperation):
                read_index.merge(operation.target_segment_id, operation.source_segment_id)
            elif not isinstance(operation, (UpdateAttributesOperation, MetadataCheckpointOperation,
                                            StorageFlushOperation)):
                raise InternalError(f"cannot apply {operation!r}")
        if run_parts:
            read_index.segment(run_segment).append(run_offset, b"".join(run_parts))

    def _sync_read_index(self) -> None:
        """After recovery: every live segment has a read index agreeing with its metadata, and every
        readable byte the log no longer holds is in Tier 2 (else the log was truncated too far, or
        Tier 2 lost its layout: refuse to serve rather than serve holes)."""
        for segment in self._metadata.segments.values():
            if segment.status in (SegmentStatus.ACTIVE, SegmentStatus.SEALED):
                index = self._read_index.segment(segment.id)
                if index.length != segment.length or index.start_offset != segment.start_offset:
                    raise InternalError(f"read index of {segment.name!r} disagrees with its metadata")
                for start, end in index.missing_ranges():
                    if not is_covered(segment.spans, start, end):
                        raise DataCorruptionError(
                            f"container {self.container_id}: bytes [{start}, {end}) of {segment.name!r} are "
                            f"neither in the log nor in Tier 2")
                if segment.status is SegmentStatus.SEALED and not index.sealed:
                    index.seal()

    def check_invariants(self) -> None:
        self._metadata.check_invariants()
        for segment in self._metadata.segments.values():
            if segment.status in (SegmentStatus.ACTIVE, SegmentStatus.SEALED):
                index = self._read_index.segment(segment.id)
                assert index.length == segment.length, (segment, index.length)
                assert index.start_offset == segment.start_offset, (segment, index.start_offset)
                assert index.sealed == (segment.status is SegmentStatus.SEALED), segment
                for start, end in index.missing_ranges():  # every readable byte is in memory or Tier 2
                    assert is_covered(segment.spans, start, end), (segment, start, end)
            else:
                assert not self._read_index.contains(segment.id), segment


def _byte_view(data: object) -> bytes | bytearray | memoryview:
    """``data`` if it is bytes-like, as something whose ``len`` counts bytes.  Raises
    ``InvalidArgumentError`` otherwise."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"data must be bytes-like, not {type(data).__name__}")
    if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1 or not data.c_contiguous):
        # len() of such a view counts items, not bytes, while frames copy its bytes: appended as
        # is, it would write a record whose length field lies (and the log could not be replayed).
        return data.tobytes()
    return data


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a segment name must be a non-empty str, not {name!r}")
    try:
        encoded = name.encode()
    except UnicodeEncodeError as error:  # e.g. a lone surrogate
        raise InvalidArgumentError(f"segment name {name!r} is not valid Unicode: {error}") from None
    if len(encoded) > limits.SEGMENT_NAME_LENGTH_BYTES_MAX:
        raise InvalidArgumentError(f"segment name longer than {limits.SEGMENT_NAME_LENGTH_BYTES_MAX} bytes")
    return name


def _is_offset(value: object) -> bool:
    """A non-negative int (and not a bool, which Python counts as an int)."""
    return type(value) is int and value >= 0


def _check_attributes(updates: Iterable[AttributeUpdate]) -> tuple[AttributeUpdate, ...]:
    try:
        result = tuple(updates)
    except TypeError:
        raise InvalidArgumentError(f"attribute updates must be a sequence, not {updates!r}") from None
    if len(result) > limits.ATTRIBUTE_UPDATES_PER_OPERATION_MAX:
        raise PayloadTooLargeError(
            f"{len(result)} attribute updates exceed {limits.ATTRIBUTE_UPDATES_PER_OPERATION_MAX}")
    for update in result:
        if not isinstance(update, AttributeUpdate):
            raise InvalidArgumentError(f"not an AttributeUpdate: {update!r}")
        if not isinstance(update.update_type, AttributeUpdateType):
            raise InvalidArgumentError(f"unknown attribute update type {update.update_type!r}")
        # (isinstance first: a float passes the range checks, then fails to serialize inside the
        # OperationProcessor -- which stops the container.)
        if not isinstance(update.attribute_id, int) or not 0 <= update.attribute_id <= ATTRIBUTE_ID_MAX:
            raise InvalidArgumentError(f"attribute id {update.attribute_id!r} is not a 128-bit unsigned int")
        if not all(isinstance(value, int) and INT64_MIN <= value <= INT64_MAX
                   for value in (update.value, update.comparison_value)):
            raise InvalidArgumentError(f"attribute values must be 64-bit signed ints: {update!r}")
    return result
