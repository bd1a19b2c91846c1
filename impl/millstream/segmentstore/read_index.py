"""The ReadIndex: acknowledged segment data, readable by offset -- from memory, or from Tier 2.

Only committed operations reach the read index (the OperationProcessor applies them after Tier 1
acknowledged their frame and before the client is told), so a reader never sees data that a crash
could take back.  A read at the tail of a segment that is not sealed may wait, with a timeout, for
new data.

Memory.  A segment's bytes ``[memory_start, length)`` are held in blocks: small appends are copied
into blocks of at most ``BLOCK_LENGTH_BYTES`` (many small appends cost few Python objects); an append
of at least ``SHARED_APPEND_BYTES_MIN`` that arrives as ``bytes`` (immutable: the block a client sent)
becomes a block of its own, by reference -- no copy, and no more memory than the copy would have
taken, since the operation let go of it once applied.  Bytes below ``memory_start``
(a segment recovered from a truncated log) are only in Tier 2.  When the blocks of all segments hold
more than the cache budget, blocks whose bytes are all in Tier 2 are *evicted* (lowest offsets first:
tail readers read the newest bytes) and leave a hole.  A block with a byte not yet in Tier 2 is never
evicted -- it is the only copy outside the log -- so memory beyond the budget is bounded by what the
StorageWriter has not flushed, which ingestion throttling bounds (``SegmentContainer``).

Tier 2.  A read that meets a hole, or an offset below ``memory_start``, reads the 1 MiB-aligned
block around it from Tier 2 (``TierTwo``) into a separate, bounded *catch-up cache* (least recently
used out first).  Catch-up readers far behind the tail therefore never push tail data out of memory,
and a sequential catch-up reader costs one Tier-2 read per MiB.  Such a read returns what that one
source holds (up to the block's end); readers ask again for the rest, as they do at any short read.
"""

from __future__ import annotations

import abc
import asyncio
import bisect
from collections import OrderedDict

from millstream import limits
from millstream.clock import Clock
from millstream.errors import (
    BadOffsetError,
    InternalError,
    InvalidArgumentError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
    TooManyTailReadersError,
)
from millstream.limits import READ_LENGTH_BYTES_MAX, TAIL_READ_WAIT_SECONDS_MAX, TAIL_READERS_PER_SEGMENT_MAX
from millstream.values import ReadResult

__all__ = ["BLOCK_LENGTH_BYTES", "SHARED_APPEND_BYTES_MIN", "ReadIndex", "ReadResult", "SegmentReadIndex", "TierTwo"]

#: Small appends are copied into blocks of this size; blocks are the unit of eviction.
BLOCK_LENGTH_BYTES = 256 * 1024
#: An append of ``bytes`` at least this long is kept as its own block, not copied (10 KB events over
#: 16 segments: copying into blocks took 16 % of the server's main thread, py-spy).
SHARED_APPEND_BYTES_MIN = 32 * 1024


class TierTwo(abc.ABC):
    """What the read index needs of long-term storage: which bytes are there, and reading them."""

    @abc.abstractmethod
    def covered_end(self, segment_id: int, offset: int) -> int:
        """The end of the run of the segment's bytes from ``offset`` that Tier 2 holds (``offset`` if none)."""

    @abc.abstractmethod
    async def read(self, segment_id: int, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``; the range is within what ``covered_end`` reported."""


class SegmentReadIndex:
    """One segment's committed bytes ``[start_offset, length)``: ``[memory_start, length)`` in blocks
    (None where evicted), the rest in Tier 2."""

    __slots__ = ("_block_starts", "_blocks", "_owner", "_waiters", "length", "memory_start", "sealed", "start_offset")

    def __init__(self, owner: ReadIndex | None = None, length: int = 0) -> None:
        self._owner = owner
        self._blocks: list[bytearray | bytes | None] = []  # bytes: a shared append (never grows)
        self._block_starts: list[int] = []
        self._waiters: list[asyncio.Future[None]] = []
        self.length = length
        self.start_offset = 0
        self.memory_start = length
        self.sealed = False

    def _count(self, delta: int) -> None:
        if self._owner is not None:
            self._owner.cached_bytes += delta

    def append(self, offset: int, data: bytes | memoryview) -> None:
        if offset != self.length:
            raise AssertionError(f"append at {offset} to a segment of length {self.length}")
        size = len(data)
        blocks = self._blocks
        if blocks:  # the common case first: the data fits into the last block
            block = blocks[-1]
            if type(block) is bytearray and len(block) + size <= BLOCK_LENGTH_BYTES:
                block += data
                self.length += size
                self._count(size)
                if self._waiters:
                    self._wake()
                return
        if size >= SHARED_APPEND_BYTES_MIN and type(data) is bytes:
            blocks.append(data)
            self._block_starts.append(self.length)
        else:
            with memoryview(data) as view:  # (pieces of it are copied once, into the blocks)
                position = 0
                while position < size:
                    block = blocks[-1] if blocks else None
                    if type(block) is not bytearray or len(block) >= BLOCK_LENGTH_BYTES:
                        block = bytearray()
                        blocks.append(block)
                        self._block_starts.append(self.length + position)
                    piece = min(size - position, BLOCK_LENGTH_BYTES - len(block))
                    block += view[position:position + piece]
                    position += piece
        self.length += size
        self._count(size)
        self._wake()

    def _block_end(self, index: int) -> int:
        return self._block_starts[index + 1] if index + 1 < len(self._blocks) else self.length

    def read_memory(self, offset: int, length: int) -> bytes | None:
        """Copy ``[offset, offset + length)`` if memory holds all of it (the caller checked the bounds),
        else None."""
        if length <= 0:
            return b""
        if offset < self.memory_start:
            return None
        index = bisect.bisect_right(self._block_starts, offset) - 1
        pieces: list[memoryview] = []
        end = offset + length
        try:
            while offset < end:
                block, start = self._blocks[index], self._block_starts[index]
                if block is None:
                    return None
                piece_end = min(end, start + len(block))
                with memoryview(block) as whole:  # (slicing the block itself would be a second copy)
                    pieces.append(whole[offset - start:piece_end - start])
                offset = piece_end
                index += 1
            return bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)  # the one copy
        finally:
            for piece in pieces:  # released before an append may grow a block again
                piece.release()

    def memory_run_end(self, offset: int, limit: int) -> int:
        """The end (at most ``limit``) of the run of bytes from ``offset`` that memory holds."""
        if offset < self.memory_start:
            return offset
        index = bisect.bisect_right(self._block_starts, offset) - 1
        while offset < limit and 0 <= index < len(self._blocks) and self._blocks[index] is not None:
            offset = self._block_end(index)
            index += 1
        return min(offset, limit)

    def missing_ranges(self) -> list[tuple[int, int]]:
        """The ranges of readable bytes (from the start offset) that memory does not hold."""
        ranges = []
        if self.start_offset < self.memory_start:
            ranges.append((self.start_offset, self.memory_start))
        for index, block in enumerate(self._blocks):
            if block is None:
                start, end = max(self._block_starts[index], self.start_offset), self._block_end(index)
                if start < end:
                    ranges.append((start, end))
        return ranges

    def seal(self) -> None:
        self.sealed = True
        self._wake()

    def truncate(self, offset: int) -> None:
        self.start_offset = offset
        # Drop whole blocks below the new start; a partly truncated block stays.
        keep = bisect.bisect_right(self._block_starts, offset) - 1
        if keep > 0:
            self._count(-sum(len(block) for block in self._blocks[:keep] if block is not None))
            del self._blocks[:keep]
            del self._block_starts[:keep]
            self.memory_start = max(self.memory_start, self._block_starts[0])

    def release(self) -> None:
        """Forget every block (the segment is gone)."""
        self._count(-sum(len(block) for block in self._blocks if block is not None))
        self._blocks, self._block_starts = [], []
        self._wake()

    def absorb(self, source: SegmentReadIndex) -> None:
        """Append all of ``source``'s bytes (a merge); ``source`` must not be used afterwards.  What the
        source held only in Tier 2 becomes a hole (the merge relinked its spans into this segment)."""
        if not self._blocks:
            self.memory_start = self.length
        if source.memory_start > 0:
            self._blocks.append(None)
            self._block_starts.append(self.length)
        for block, start in zip(source._blocks, source._block_starts, strict=True):
            self._blocks.append(block)
            self._block_starts.append(self.length + start)
        source._blocks, source._block_starts = [], []  # its bytes are counted once, here
        self.length += source.length
        self._wake()

    def evict_covered(self, covered_end: int, budget_excess: int) -> int:
        """Evict blocks that lie entirely below ``covered_end`` (in Tier 2), lowest first, until
        ``budget_excess`` bytes are freed; return the bytes freed."""
        freed = 0
        for index, block in enumerate(self._blocks):
            if freed >= budget_excess or self._block_end(index) > covered_end:
                break
            if block is not None:
                self._blocks[index] = None
                freed += len(block)
        self._count(-freed)
        return freed

    def add_waiter(self) -> asyncio.Future[None]:
        if len(self._waiters) >= TAIL_READERS_PER_SEGMENT_MAX:
            raise TooManyTailReadersError(f"{len(self._waiters)} tail reads already wait on this segment")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


class ReadIndex:
    """The read indexes of every segment of one container, by segment id, with the cache budget."""

    def __init__(self, clock: Clock, tier_two: TierTwo | None = None, *,
                 cache_bytes_max: int = limits.CACHE_BYTES_MAX,
                 catch_up_cache_bytes_max: int = limits.CATCH_UP_CACHE_BYTES_MAX) -> None:
        self._clock = clock
        self._tier_two = tier_two
        self._segments: dict[int, SegmentReadIndex] = {}
        self.cache_bytes_max = cache_bytes_max
        #: Bytes held in blocks (not counting the catch-up cache).
        self.cached_bytes = 0
        self._catch_up: OrderedDict[tuple[int, int], tuple[int, bytes]] = OrderedDict()
        self._catch_up_bytes = 0
        self._catch_up_bytes_max = catch_up_cache_bytes_max
        #: Reads served from Tier 2 (block fetches), for tests and benchmarks.
        self.tier_two_reads = 0
        #: Set by ``close``: what every read waiting at a tail, and every later wait, raises.
        self._closed: BaseException | None = None

    def close(self, error: BaseException) -> None:
        """The container stops: wake every read waiting at a tail and make it raise ``error`` (the
        container's retryable ``ContainerUnavailableError``) at once instead of holding its request
        for the rest of its wait -- its client goes to the container's next owner."""
        self._closed = error
        for index in self._segments.values():
            index._wake()

    def attach_tier_two(self, tier_two: TierTwo) -> None:
        self._tier_two = tier_two

    def segment(self, segment_id: int) -> SegmentReadIndex:
        index = self._segments.get(segment_id)
        if index is None:
            index = self._segments[segment_id] = SegmentReadIndex(self)
        return index

    def load(self, segment_id: int, start_offset: int, length: int, sealed: bool) -> None:
        """Know a segment recovered from a checkpoint: its bytes so far are only in Tier 2."""
        index = self._segments[segment_id] = SegmentReadIndex(self, length)
        index.start_offset = start_offset
        index.sealed = sealed

    def delete(self, segment_id: int) -> None:
        index = self._segments.pop(segment_id, None)
        if index is not None:
            index.release()
        self._forget_catch_up(segment_id)

    def merge(self, target_id: int, source_id: int) -> None:
        source = self._segments.pop(source_id, None) or SegmentReadIndex(self)
        self.segment(target_id).absorb(source)
        source._wake()
        self._forget_catch_up(source_id)

    def contains(self, segment_id: int) -> bool:
        return segment_id in self._segments

    # --- the cache budget ------------------------------------------------------------------------------

    def evict(self) -> int:
        """Bring the blocks within the cache budget by evicting bytes Tier 2 holds; return bytes freed.
        What cannot be evicted (not yet in Tier 2) stays: throttling bounds it."""
        excess = self.cached_bytes - self.cache_bytes_max
        if excess <= 0 or self._tier_two is None:
            return 0
        freed = 0
        for segment_id, index in self._segments.items():
            if index.memory_start < index.length:
                covered = self._tier_two.covered_end(segment_id, max(index.start_offset, index.memory_start))
                freed += index.evict_covered(covered, excess - freed)
                if freed >= excess:
                    break
        return freed

    def _forget_catch_up(self, segment_id: int) -> None:
        for key in [key for key in self._catch_up if key[0] == segment_id]:
            self._catch_up_bytes -= len(self._catch_up.pop(key)[1])

    # --- reading -------------------------------------------------------------------------------------

    async def read(self, segment_id: int, offset: int, max_length: int, wait_seconds: float = 0.0) -> ReadResult:
        """Read up to ``max_length`` bytes from ``offset``.  At the tail of a segment that is not
        sealed, wait up to ``wait_seconds`` for data (returning empty if none came).  A read served
        from Tier 2 may return fewer bytes than are there (up to the end of one 1 MiB block).

        Raises ``StreamSegmentTruncatedError`` below the start offset, ``BadOffsetError`` beyond the
        length, ``StreamSegmentNotExistsError`` if the segment is gone (also when it goes while
        waiting), ``InvalidArgumentError`` for a negative length or wait, and Tier 2's
        ``StorageError`` if it cannot be read.
        """
        if max_length < 0 or not 0 <= wait_seconds <= TAIL_READ_WAIT_SECONDS_MAX:
            raise InvalidArgumentError(
                f"max_length must be >= 0 and wait_seconds within [0, {TAIL_READ_WAIT_SECONDS_MAX}]")
        max_length = min(max_length, READ_LENGTH_BYTES_MAX)
        deadline = self._clock.monotonic() + wait_seconds
        while True:
            index = self._checked(segment_id, offset)
            available = index.length - offset
            remaining = deadline - self._clock.monotonic()
            if available > 0 or index.sealed or remaining <= 0 or max_length == 0:
                length = min(available, max_length)
                data = index.read_memory(offset, length)
                if data is None:
                    data = await self._read_mixed(segment_id, offset, length)
                    index = self._checked(segment_id, offset)
                at_tail = offset + len(data) == index.length
                return ReadResult(offset, data, at_tail, at_tail and index.sealed)
            if self._closed is not None:
                raise self._closed
            waiter = index.add_waiter()
            try:
                await _wait_with_timeout(self._clock, waiter, remaining)
            finally:
                index.remove_waiter(waiter)

    def _checked(self, segment_id: int, offset: int) -> SegmentReadIndex:
        index = self._segments.get(segment_id)
        if index is None:
            raise StreamSegmentNotExistsError(f"segment id {segment_id} does not exist")
        if offset < index.start_offset:
            raise StreamSegmentTruncatedError(f"offset {offset} is below the start offset {index.start_offset}")
        if offset > index.length:
            raise BadOffsetError(f"offset {offset} is beyond the length {index.length}")
        return index

    async def _read_mixed(self, segment_id: int, offset: int, length: int) -> bytes:
        """What memory holds from ``offset`` if it holds the first byte, else the Tier-2 block's part."""
        index = self._segments[segment_id]
        in_memory = index.memory_run_end(offset, offset + length)
        if in_memory > offset:
            data = index.read_memory(offset, in_memory - offset)
            assert data is not None
            return data
        block_start, block = await self._catch_up_block(segment_id, offset)
        return block[offset - block_start:offset - block_start + length]

    async def _catch_up_block(self, segment_id: int, offset: int) -> tuple[int, bytes]:
        """The bytes of the 1 MiB-aligned Tier-2 block around ``offset`` (clipped to what Tier 2
        holds contiguously from ``offset``'s run), from the catch-up cache or Tier 2."""
        if self._tier_two is None:
            raise InternalError(f"segment id {segment_id}: bytes at {offset} are in neither memory nor Tier 2")
        size = limits.TIER_TWO_READ_BLOCK_BYTES
        key = (segment_id, offset // size)
        cached = self._catch_up.get(key)
        if cached is not None and cached[0] <= offset < cached[0] + len(cached[1]):
            self._catch_up.move_to_end(key)
            return cached
        aligned = key[1] * size
        start = aligned if self._tier_two.covered_end(segment_id, aligned) > offset else offset
        end = min(aligned + size, self._tier_two.covered_end(segment_id, start))
        if end <= offset:
            raise InternalError(f"segment id {segment_id}: bytes at {offset} are in neither memory nor Tier 2")
        data = await self._tier_two.read(segment_id, start, end - start)
        self.tier_two_reads += 1
        if segment_id in self._segments:  # still there: keep the block for the next reader
            if cached is not None:
                self._catch_up_bytes -= len(self._catch_up.pop(key)[1])
            self._catch_up[key] = (start, data)
            self._catch_up_bytes += len(data)
            while self._catch_up_bytes > self._catch_up_bytes_max and self._catch_up:
                self._catch_up_bytes -= len(self._catch_up.popitem(last=False)[1][1])
        return start, data


async def _wait_with_timeout(clock: Clock, waiter: asyncio.Future[None], seconds: float) -> None:
    """Wait until ``waiter`` completes or ``seconds`` pass on ``clock``, whichever is first."""
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Cancelled, the sleeper finishes on the loop's next turn; nothing waits on it.
        sleeper.cancel()
