"""The StorageWriter: moves acknowledged segment bytes from memory (and the log) to Tier 2, then lets
the log be truncated and the cache evict them.  ``spec/ContainerFailover.tla`` names in brackets.

Theory of operation.

* *Flush* [WriteChunk, CommitFlush].  A segment's bytes that no span of its layout covers (``layout``)
  are still in memory.  When a segment has at least ``flush_bytes_min`` of them (scaled by 1 to 2 per
  segment, so that segments filling at one rate come due apart), or its oldest has
  waited ``flush_age_seconds``, or ingestion is being throttled, the writer writes up to
  ``flush_bytes_max`` of them into a chunk (durable on return), then queues a
  ``StorageFlushOperation`` through the durable log; only once that commits do the bytes count as in
  Tier 2.  A chunk is appended to only by the owner that created it, and only while it continues the
  segment where the last flush ended; otherwise a new chunk is started, named
  ``c<container>/s<segment id>/<segment offset>.e<epoch>.<n>`` -- so a new owner never writes into an
  older owner's chunk, and a fenced owner's writes, whose flush operations can never commit, are
  never referenced.  That is how Tier 2 is fenced: with the log.
* *Seal, merge, truncate, delete* need nothing from Tier 2 but order: they change the layout through
  their own log operations (a merge relinks the source's spans, a truncation drops the spans below
  the new start, a delete drops them all), and the chunks no span references any more are deleted
  after those operations commit (*garbage collection*; only chunks of this owner's epoch or older,
  and never one whose flush is still in flight).
* *Reconcile* (after a restart).  The layout says exactly what Tier 2 holds; each span's chunk is
  checked to exist and be long enough (else ``DataCorruptionError``: the container must not serve
  wrong bytes).  Bytes a previous owner wrote but never recorded -- beyond the end of a segment's last
  span in that chunk, or in an unreferenced chunk named for the gap's offset -- are compared with the
  bytes in memory and, where equal, recorded without being written again.
* *Log truncation* [Checkpoint, Truncate].  Each committed metadata checkpoint is a candidate; the log
  may be truncated below it once every byte it describes (tracked through later merges, truncations
  and deletes) is covered by spans.  The newest such candidate wins.
* *Backpressure*.  ``unflushed_bytes`` counts acknowledged bytes not yet in Tier 2; the container
  throttles appends while it exceeds its limit, and ``wait_for_progress`` wakes them.
* A Tier-2 failure is retried with capped exponential backoff while the container runs (ingestion is
  throttled meanwhile: nothing is lost, acknowledgements slow down).  A log failure stops the
  container, as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections import deque
from collections.abc import Awaitable, Callable

from millstream import limits
from millstream.clock import Clock
from millstream.errors import (
    CallerError,
    ChunkNotFoundError,
    ContainerUnavailableError,
    DataCorruptionError,
    InternalError,
    ObjectClosedError,
    StorageError,
    StreamSegmentNotExistsError,
)
from millstream.model.types import SegmentStatus
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.durable_data_log import LogAddress
from millstream.segmentstore.layout import covered_end, first_gap, is_covered, uncovered_bytes
from millstream.segmentstore.metadata import ContainerMetadata, SegmentMetadata, deserialize_checkpoint
from millstream.segmentstore.operations import (
    DeleteSegmentOperation,
    MergeSegmentOperation,
    MetadataCheckpointOperation,
    Operation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
    StreamSegmentTruncateOperation,
)
from millstream.segmentstore.read_index import ReadIndex, TierTwo
from millstream.segmentstore.tracing import Tracer
from millstream.tasks import cancel_and_wait

__all__ = ["StorageWriter", "chunk_name"]

_LIVE = (SegmentStatus.ACTIVE, SegmentStatus.SEALED)
_CHUNK_NAME = re.compile(r"^c(\d+)/s(\d+)/(\d+)\.e(\d+)\.(\d+)$")
#: Checkpoints kept as truncation candidates (the newest eligible one wins; older ones add nothing).
_CANDIDATES_MAX = 8
#: (sqrt(5) - 1) / 2: multiples of it modulo 1 spread as evenly as any sequence can.
_GOLDEN_RATIO_FRACTION = 0.6180339887498949


def chunk_name(container_id: int, segment_id: int, offset: int, epoch: int, number: int) -> str:
    """The name of a chunk this owner starts for ``segment_id`` at segment byte ``offset``."""
    return f"c{container_id}/s{segment_id}/{offset:020d}.e{epoch}.{number}"


class _Candidate:
    """A committed checkpoint, and the byte ranges (by segment id) the log below it alone held."""

    __slots__ = ("checkpoint", "ranges")

    def __init__(self, checkpoint: MetadataCheckpointOperation, ranges: dict[int, list[tuple[int, int]]]) -> None:
        self.checkpoint = checkpoint
        self.ranges = ranges


class StorageWriter(TierTwo):
    """Flushes one container's segments to Tier 2, truncates its log, and reads Tier 2 for the cache."""

    def __init__(
        self,
        container_id: int,
        metadata: ContainerMetadata,
        read_index: ReadIndex,
        storage: ChunkStorage,
        *,
        clock: Clock,
        submit: Callable[[Operation], Awaitable[int]],
        truncate_log: Callable[[LogAddress], Awaitable[None]],
        flush_bytes_min: int = limits.STORAGE_FLUSH_BYTES_MIN,
        flush_bytes_max: int = limits.STORAGE_FLUSH_BYTES_MAX,
        flush_age_seconds: float = limits.STORAGE_FLUSH_AGE_SECONDS,
        unflushed_bytes_max: int = limits.UNFLUSHED_BYTES_MAX,
    ) -> None:
        self._container_id = container_id
        self._metadata = metadata
        self._read_index = read_index
        self._storage = storage
        self._clock = clock
        self._submit = submit
        self._truncate_log = truncate_log
        self._flush_bytes_min = flush_bytes_min
        self._flush_bytes_max = flush_bytes_max
        self._flush_age_seconds = flush_age_seconds
        self.unflushed_bytes_max = unflushed_bytes_max
        self._epoch = 0
        self._chunk_numbers = 0
        #: Unflushed bytes by segment id, and when each segment's oldest unflushed byte arrived.
        self._unflushed: dict[int, int] = {}
        self._dirty_since: dict[int, float] = {}
        self.unflushed_bytes = 0
        #: This owner's chunk per segment that may still grow: (name, its length, the segment offset it ends at).
        self._open_chunks: dict[int, tuple[str, int, int]] = {}
        #: Chunks written whose flush operation has not committed (garbage collection spares them).
        self._in_flight_chunks: set[str] = set()
        self._candidates: deque[_Candidate] = deque(maxlen=_CANDIDATES_MAX)
        self._garbage_possible = True
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        #: Evidence for tests and benchmarks.
        self.flushed_bytes = 0
        self.reconciled_bytes = 0
        self.log_truncations = 0
        self.deleted_chunks = 0
        self.storage_failures = 0
        #: Reports ``spec/ContainerFailover.tla``'s steps as they happen (tests; see ``tracing.py``).
        self.tracer: Tracer | None = None

    @property
    def oldest_unflushed_since(self) -> float | None:
        """When (by the clock) the oldest acknowledged byte not yet in Tier 2 arrived; None if none
        waits (the metrics' flush lag)."""
        return min(self._dirty_since.values(), default=None)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self, epoch: int) -> None:
        """Begin flushing (after recovery, with the epoch the log was taken over with)."""
        if self._task is not None:
            raise InternalError("the storage writer was started already")
        self._epoch = epoch
        self._recount()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"storage-writer-{self._container_id}")

    @property
    def stopped(self) -> asyncio.Task[None] | None:
        return self._task

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)  # (a flush's Tier-2 call can outlive one cancellation)
        self._progress.set()

    def kill(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._progress.set()

    # --- what the container tells it ------------------------------------------------------------------

    def on_committed(self, operations: list[Operation]) -> None:
        """Account for committed operations (called by the container, in order, during recovery too)."""
        if self.tracer is not None and self._task is not None:  # (replayed ones are not new steps)
            for operation in operations:
                self.tracer("Committed", operation=operation)
        for operation in operations:
            if type(operation) is StreamSegmentAppendOperation:
                size = len(operation.data)
                if size:
                    self._add_unflushed(operation.segment_id, size)
            elif isinstance(operation, MetadataCheckpointOperation):
                self._add_candidate(operation)
            elif isinstance(operation, StorageFlushOperation):
                self._recount_segment(operation.segment_id)
                self._progress.set()
            elif isinstance(operation, MergeSegmentOperation):
                self._on_merged(operation)
            elif isinstance(operation, StreamSegmentTruncateOperation):
                for candidate in self._candidates:
                    ranges = candidate.ranges.get(operation.segment_id)
                    if ranges is not None:
                        candidate.ranges[operation.segment_id] = [
                            (max(a, operation.offset), b) for a, b in ranges if b > operation.offset]
                self._recount_segment(operation.segment_id)
                self._garbage_possible = True
            elif isinstance(operation, DeleteSegmentOperation):
                for candidate in self._candidates:
                    candidate.ranges.pop(operation.segment_id, None)
                self._forget(operation.segment_id)
                self._garbage_possible = True

    def _add_unflushed(self, segment_id: int, size: int) -> None:
        before = self._unflushed.get(segment_id, 0)
        total = self._unflushed[segment_id] = before + size
        self.unflushed_bytes += size
        if before == 0:
            self._dirty_since[segment_id] = self._clock.monotonic()
        # (The cheap bound first: this runs once per committed append, and no threshold is below the minimum.)
        if ((total >= self._flush_bytes_min and before < self._flush_threshold(segment_id) <= total)
                or self.unflushed_bytes > self.unflushed_bytes_max):
            self._wake.set()

    def _flush_threshold(self, segment_id: int) -> int:
        """The unflushed bytes at which a segment is due: ``flush_bytes_min`` scaled by 1 to 2, spread
        over segment ids by the golden ratio.  Segments that fill at one rate -- every segment of a
        stream under random routing keys -- then come due one after another, not all at once: 16 flushes
        in a row kept the log's disk and the event loop busy for ~100 ms every cycle, and the appends
        that waited behind them were a write's p95."""
        return self._flush_bytes_min + int(self._flush_bytes_min * (segment_id * _GOLDEN_RATIO_FRACTION % 1.0))

    def _on_merged(self, operation: MergeSegmentOperation) -> None:
        source, target = operation.source_segment_id, operation.target_segment_id
        for candidate in self._candidates:
            ranges = candidate.ranges.pop(source, None)
            if ranges:
                candidate.ranges.setdefault(target, []).extend(
                    (a + operation.offset, b + operation.offset) for a, b in ranges)
        since = self._dirty_since.get(source)
        self._forget(source)
        self._open_chunks.pop(target, None)  # the target's layout now continues with the source's chunks
        self._recount_segment(target)
        if since is not None and target in self._dirty_since:
            self._dirty_since[target] = min(self._dirty_since[target], since)

    def _forget(self, segment_id: int) -> None:
        self.unflushed_bytes -= self._unflushed.pop(segment_id, 0)
        self._dirty_since.pop(segment_id, None)
        self._open_chunks.pop(segment_id, None)

    def _recount_segment(self, segment_id: int) -> None:
        """Recompute a segment's unflushed bytes from its committed metadata."""
        segment = self._metadata.segments.get(segment_id)
        count = 0
        if segment is not None and segment.status in _LIVE:
            count = uncovered_bytes(segment.spans, segment.start_offset, segment.length)
        before = self._unflushed.pop(segment_id, 0)
        self.unflushed_bytes += count - before
        if count:
            self._unflushed[segment_id] = count
            self._dirty_since.setdefault(segment_id, self._clock.monotonic())
        else:
            self._dirty_since.pop(segment_id, None)

    def _recount(self) -> None:
        self._unflushed.clear()
        self._dirty_since.clear()
        self.unflushed_bytes = 0
        for segment_id in self._metadata.segments:
            self._recount_segment(segment_id)

    def _add_candidate(self, checkpoint: MetadataCheckpointOperation) -> None:
        if checkpoint.frame_number <= 1:
            return  # nothing lies below it
        described = deserialize_checkpoint(checkpoint.payload, self._container_id)
        ranges = {segment.id: [(segment.start_offset, segment.length)] for segment in described.segments.values()
                  if segment.status in _LIVE and segment.length > segment.start_offset}
        self._candidates.append(_Candidate(checkpoint, ranges))

    async def wait_for_progress(self, timeout_seconds: float) -> None:
        """Wait (at most ``timeout_seconds``) until a flush commits or the writer stops."""
        self._progress.clear()
        self._wake.set()
        sleeper = asyncio.ensure_future(self._clock.sleep(timeout_seconds))
        waiter = asyncio.ensure_future(self._progress.wait())
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()
        if self._failure is not None or self._task is None or self._task.done():
            raise ContainerUnavailableError(f"container {self._container_id}: its storage writer stopped")

    # --- Tier 2 for the read index ---------------------------------------------------------------------

    def covered_end(self, segment_id: int, offset: int) -> int:
        segment = self._metadata.segments.get(segment_id)
        return offset if segment is None else covered_end(segment.spans, offset)

    async def read(self, segment_id: int, offset: int, length: int) -> bytes:
        segment = self._metadata.segments.get(segment_id)
        if segment is None:
            raise StreamSegmentNotExistsError(f"segment id {segment_id} does not exist")
        parts = []
        end = offset + length
        for span in segment.spans:
            if span.end <= offset or span.offset >= end:
                continue
            start, stop = max(span.offset, offset), min(span.end, end)
            parts.append(await self._storage.read(span.chunk, span.chunk_offset + start - span.offset, stop - start))
        data = b"".join(parts)
        if len(data) != length:
            raise InternalError(f"segment id {segment_id}: Tier 2 holds {len(data)} of [{offset}, {end})")
        return data

    # --- the loop --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._retrying(self._reconcile)
            while True:
                due = self._due_segments()
                if not due and not self._garbage_possible:
                    self._wake.clear()
                    await _wait_event(self._clock, self._wake, self._next_due_in())
                    continue
                for segment_id in due:
                    await self._retrying(functools.partial(self._flush, segment_id))
                self._read_index.evict()
                await self._truncate_log_if_possible()
                if self._garbage_possible:
                    self._garbage_possible = False
                    await self._retrying(self._collect_garbage)
        except asyncio.CancelledError:
            raise
        except (ContainerUnavailableError, ObjectClosedError) as error:
            self._failure = error  # the container is stopping; it reports why
        except BaseException as error:
            self._failure = error
            raise
        finally:
            self._progress.set()

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step``; retry a Tier-2 failure with capped exponential backoff (forever while running:
        ingestion is throttled meanwhile, and the container's stop cancels this)."""
        delay = limits.STORAGE_RETRY_DELAY_SECONDS
        while True:
            try:
                await step()
                return
            except DataCorruptionError:
                raise
            except StorageError:
                self.storage_failures += 1
                await self._clock.sleep(delay)
                delay = min(delay * 2, limits.STORAGE_RETRY_DELAY_SECONDS_MAX)

    def _due_segments(self) -> list[int]:
        now = self._clock.monotonic()
        throttling = self.unflushed_bytes > self.unflushed_bytes_max // 2
        return [segment_id for segment_id, count in self._unflushed.items()
                if throttling or count >= self._flush_threshold(segment_id)
                or now - self._dirty_since.get(segment_id, now) >= self._flush_age_seconds
                or self._sealed(segment_id)]

    def _sealed(self, segment_id: int) -> bool:
        """A sealed segment gets no more bytes: waiting for more before flushing gains nothing."""
        segment = self._metadata.segments.get(segment_id)
        return segment is not None and segment.status is SegmentStatus.SEALED

    def _next_due_in(self) -> float:
        if not self._dirty_since:
            return self._flush_age_seconds
        oldest = min(self._dirty_since.values())
        return max(0.0, min(self._flush_age_seconds, oldest + self._flush_age_seconds - self._clock.monotonic()))

    # --- flushing ------------------------------------------------------------------------------------

    def _gap(self, segment: SegmentMetadata) -> tuple[int, int] | None:
        gap = first_gap(segment.spans, segment.start_offset, segment.length)
        if gap is None:
            return None
        return gap[0], min(gap[1], gap[0] + self._flush_bytes_max)

    async def _flush(self, segment_id: int) -> None:
        segment = self._metadata.segments.get(segment_id)
        if segment is None or segment.status not in _LIVE:
            self._forget(segment_id)
            return
        gap = self._gap(segment)
        if gap is None:
            self._recount_segment(segment_id)
            return
        start, stop = gap
        read_at = self._clock.monotonic()
        took_all = stop == segment.length  # every byte then unflushed: whatever is left came later
        data = self._read_index.segment(segment_id).read_memory(start, stop - start)
        if data is None:
            raise InternalError(f"segment {segment.name!r}: unflushed bytes [{start}, {stop}) are not in memory")
        open_chunk = self._open_chunks.get(segment_id)
        if open_chunk is not None and open_chunk[2] == start:
            chunk, chunk_offset = open_chunk[0], open_chunk[1]
        else:
            self._chunk_numbers += 1
            chunk, chunk_offset = chunk_name(self._container_id, segment_id, start, self._epoch,
                                             self._chunk_numbers), 0
            self._in_flight_chunks.add(chunk)
            await self._storage.create(chunk)
        self._in_flight_chunks.add(chunk)
        self._open_chunks.pop(segment_id, None)  # until the write is known to have landed whole
        try:
            await self._storage.write(chunk, chunk_offset, data)
            if self.tracer is not None:
                self.tracer("WriteChunk", segment_id=segment_id, chunk=chunk, offset=start, data=data)
            self._open_chunks[segment_id] = (chunk, chunk_offset + len(data), stop)
            await self._record(StorageFlushOperation(segment_id, start, len(data), chunk, chunk_offset))
            self.flushed_bytes += len(data)
            since = self._dirty_since.get(segment_id)
            if took_all and since is not None and since < read_at:
                # The bytes appended while this flush ran are at most this old.  (Left at the first
                # dirty moment, a segment written without pause was over the age after 5 s for good,
                # and was flushed again at every turn, a few KB at a time.)
                self._dirty_since[segment_id] = read_at
        except StorageError:
            self._garbage_possible = True  # a torn write may have left an unreferenced chunk
            raise
        finally:
            self._in_flight_chunks.discard(chunk)

    async def _record(self, operation: StorageFlushOperation) -> None:
        try:
            await self._submit(operation)
        except CallerError:
            # The segment was deleted, merged or truncated past these bytes meanwhile: nothing to record.
            self._open_chunks.pop(operation.segment_id, None)
            self._garbage_possible = True
        self._recount_segment(operation.segment_id)

    # --- reconciliation after a restart -----------------------------------------------------------------

    async def _reconcile(self) -> None:
        prefix = f"c{self._container_id}/"
        names = set(await self._storage.list(prefix))
        for segment in list(self._metadata.segments.values()):
            if segment.status not in _LIVE:
                continue
            for span in segment.spans:
                if span.chunk not in names:
                    raise DataCorruptionError(f"container {self._container_id}: chunk {span.chunk!r} of "
                                              f"{segment.name!r} is missing from Tier 2")
            if segment.spans:
                last = segment.spans[-1]
                held = await self._storage.length(last.chunk)
                if held < last.chunk_offset + last.length:
                    raise DataCorruptionError(f"container {self._container_id}: chunk {last.chunk!r} holds {held} "
                                              f"bytes, {segment.name!r} needs {last.chunk_offset + last.length}")
            await self._adopt(segment, names)

    async def _adopt(self, segment: SegmentMetadata, names: set[str]) -> None:
        """Record bytes an earlier owner left in Tier 2 that equal the segment's unflushed bytes."""
        while True:
            segment_now = self._metadata.segments.get(segment.id)
            if segment_now is None or segment_now.status not in _LIVE:
                return
            gap = self._gap(segment_now)
            if gap is None:
                return
            start, stop = gap
            candidates: list[tuple[str, int]] = [
                (span.chunk, span.chunk_offset + span.length) for span in segment_now.spans if span.end == start]
            candidates += [(name, 0) for name in sorted(names)
                           if (parsed := _CHUNK_NAME.match(name)) is not None
                           and int(parsed[2]) == segment.id and int(parsed[3]) == start]
            adopted = 0
            for chunk, chunk_offset in candidates:
                try:
                    available = await self._storage.length(chunk) - chunk_offset
                except ChunkNotFoundError:
                    continue
                length = min(available, stop - start)
                if length <= 0:
                    continue
                stored = await self._storage.read(chunk, chunk_offset, length)
                expected = self._read_index.segment(segment.id).read_memory(start, length)
                assert expected is not None
                same = _common_prefix_length(stored, expected)
                if same > 0:
                    await self._record(StorageFlushOperation(segment.id, start, same, chunk, chunk_offset))
                    self.reconciled_bytes += same
                    adopted = same
                    break
            if adopted == 0:
                return

    # --- truncation and garbage ------------------------------------------------------------------------

    def _eligible(self, candidate: _Candidate) -> bool:
        segments = self._metadata.segments
        for segment_id, ranges in candidate.ranges.items():
            segment = segments.get(segment_id)
            if segment is None or segment.status not in _LIVE:
                continue
            for a, b in ranges:
                if b > max(a, segment.start_offset) and not is_covered(segment.spans, max(a, segment.start_offset), b):
                    return False
        return True

    async def _truncate_log_if_possible(self) -> None:
        chosen = None
        for candidate in self._candidates:
            # (The address of the frame before the checkpoint's may not be reported yet: next round.)
            if candidate.checkpoint.truncation_address is not None and self._eligible(candidate):
                chosen = candidate
        if chosen is None:
            return
        while self._candidates and self._candidates[0] is not chosen:
            self._candidates.popleft()
        self._candidates.popleft()
        address = chosen.checkpoint.truncation_address
        assert address is not None
        await self._truncate_log(address)
        self.log_truncations += 1
        if self.tracer is not None:
            self.tracer("Truncate", checkpoint=chosen.checkpoint)

    async def _collect_garbage(self) -> None:
        """Delete this container's chunks that no span references, of this owner's epoch or older."""
        referenced = {span.chunk for segment in self._metadata.segments.values() for span in segment.spans}
        open_chunks = {name for name, _, _ in self._open_chunks.values()}
        for name in await self._storage.list(f"c{self._container_id}/"):
            parsed = _CHUNK_NAME.match(name)
            if parsed is None or int(parsed[4]) > self._epoch:
                continue  # not ours to judge: a newer owner's
            if name in referenced or name in self._in_flight_chunks or name in open_chunks:
                continue
            with contextlib.suppress(ChunkNotFoundError):
                await self._storage.delete(name)
                self.deleted_chunks += 1


def _common_prefix_length(a: bytes, b: bytes) -> int:
    if a == b[:len(a)]:
        return len(a)
    low, high = 0, min(len(a), len(b))
    while low < high:  # a[:low] == b[:low] holds; find the first difference
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


async def _wait_event(clock: Clock, event: asyncio.Event, seconds: float) -> None:
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waiter.cancel()
