"""The ReadIndex: acknowledged segment data, in memory, readable by offset.

Only committed operations reach the read index (the OperationProcessor applies them after Tier 1
acknowledged their frame and before the client is told), so a reader never sees data that a crash
could take back.  Data lives in blocks of at most ``BLOCK_LENGTH_BYTES``; a read copies out of them.
A read at the tail of a segment that is not sealed may wait, with a timeout, for new data.
"""

from __future__ import annotations

import asyncio
import bisect

import attrs
from millstream.clock import Clock
from millstream.errors import (
    BadOffsetError,
    InvalidArgumentError,
    RetryableError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
)
from millstream.limits import READ_LENGTH_MAX_BYTES, TAIL_READ_WAIT_MAX_SECONDS, TAIL_READERS_PER_SEGMENT_MAX

__all__ = ["BLOCK_LENGTH_BYTES", "ReadIndex", "ReadResult", "SegmentReadIndex"]

#: Appends are copied into blocks of this size, so many small appends cost few Python objects.
BLOCK_LENGTH_BYTES = 256 * 1024


class TooManyTailReadersError(RetryableError):
    """More tail reads wait on one segment than ``TAIL_READERS_PER_SEGMENT_MAX``; retry later."""


@attrs.frozen
class ReadResult:
    """What one read returned.  ``at_tail``: the read ended at the segment's current length.
    ``end_of_segment``: the segment is sealed and the read reached its end (no more data, ever)."""

    offset: int
    data: bytes
    at_tail: bool
    end_of_segment: bool


class SegmentReadIndex:
    """One segment's committed bytes ``[start_offset, length)``."""

    __slots__ = ("_block_starts", "_blocks", "_waiters", "length", "sealed", "start_offset")

    def __init__(self) -> None:
        self._blocks: list[bytearray] = []
        self._block_starts: list[int] = []
        self._waiters: list[asyncio.Future[None]] = []
        self.length = 0
        self.start_offset = 0
        self.sealed = False

    def append(self, offset: int, data: bytes | memoryview) -> None:
        if offset != self.length:
            raise AssertionError(f"append at {offset} to a segment of length {self.length}")
        position, size = 0, len(data)
        while position < size:
            if not self._blocks or len(self._blocks[-1]) >= BLOCK_LENGTH_BYTES:
                self._blocks.append(bytearray())
                self._block_starts.append(self.length + position)
            block = self._blocks[-1]
            piece = min(size - position, BLOCK_LENGTH_BYTES - len(block))
            block += data[position:position + piece] if piece < size else data
            position += piece
        self.length += size
        self._wake()

    def read(self, offset: int, length: int) -> bytes:
        """Copy ``[offset, offset + length)``; the caller has checked the bounds."""
        if length <= 0:
            return b""
        index = bisect.bisect_right(self._block_starts, offset) - 1
        parts = []
        end = offset + length
        while offset < end:
            block, start = self._blocks[index], self._block_starts[index]
            piece_end = min(end, start + len(block))
            parts.append(block[offset - start:piece_end - start])
            offset = piece_end
            index += 1
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def seal(self) -> None:
        self.sealed = True
        self._wake()

    def truncate(self, offset: int) -> None:
        self.start_offset = offset
        # Drop whole blocks below the new start; a partly truncated block stays.
        keep = bisect.bisect_right(self._block_starts, offset) - 1
        if keep > 0:
            del self._blocks[:keep]
            del self._block_starts[:keep]

    def absorb(self, source: SegmentReadIndex) -> None:
        """Append all of ``source``'s bytes (a merge); ``source`` must not be used afterwards."""
        for block, start in zip(source._blocks, source._block_starts, strict=True):
            self._blocks.append(block)
            self._block_starts.append(self.length + start)
        self.length += source.length
        self._wake()

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
    """The read indexes of every segment of one container, by segment id."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._segments: dict[int, SegmentReadIndex] = {}

    def segment(self, segment_id: int) -> SegmentReadIndex:
        index = self._segments.get(segment_id)
        if index is None:
            index = self._segments[segment_id] = SegmentReadIndex()
        return index

    def delete(self, segment_id: int) -> None:
        index = self._segments.pop(segment_id, None)
        if index is not None:
            index._wake()

    def merge(self, target_id: int, source_id: int) -> None:
        source = self._segments.pop(source_id, None) or SegmentReadIndex()
        self.segment(target_id).absorb(source)
        source._wake()

    def contains(self, segment_id: int) -> bool:
        return segment_id in self._segments

    async def read(self, segment_id: int, offset: int, max_length: int, wait_seconds: float = 0.0) -> ReadResult:
        """Read up to ``max_length`` bytes from ``offset``.  At the tail of a segment that is not
        sealed, wait up to ``wait_seconds`` for data (returning empty if none came).

        Raises ``StreamSegmentTruncatedError`` below the start offset, ``BadOffsetError`` beyond the
        length, ``StreamSegmentNotExistsError`` if the segment is gone (also when it goes while
        waiting), ``InvalidArgumentError`` for a negative length or wait.
        """
        if max_length < 0 or not 0 <= wait_seconds <= TAIL_READ_WAIT_MAX_SECONDS:
            raise InvalidArgumentError(
                f"max_length must be >= 0 and wait_seconds within [0, {TAIL_READ_WAIT_MAX_SECONDS}]")
        max_length = min(max_length, READ_LENGTH_MAX_BYTES)
        deadline = self._clock.monotonic() + wait_seconds
        while True:
            index = self._segments.get(segment_id)
            if index is None:
                raise StreamSegmentNotExistsError(f"segment id {segment_id} does not exist")
            if offset < index.start_offset:
                raise StreamSegmentTruncatedError(f"offset {offset} is below the start offset {index.start_offset}")
            if offset > index.length:
                raise BadOffsetError(f"offset {offset} is beyond the length {index.length}")
            available = index.length - offset
            remaining = deadline - self._clock.monotonic()
            if available > 0 or index.sealed or remaining <= 0 or max_length == 0:
                length = min(available, max_length)
                at_tail = offset + length == index.length
                return ReadResult(offset, index.read(offset, length), at_tail, at_tail and index.sealed)
            waiter = index.add_waiter()
            try:
                await _wait_with_timeout(self._clock, waiter, remaining)
            finally:
                index.remove_waiter(waiter)


async def _wait_with_timeout(clock: Clock, waiter: asyncio.Future[None], seconds: float) -> None:
    """Wait until ``waiter`` completes or ``seconds`` pass on ``clock``, whichever is first."""
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Cancelled, the sleeper finishes on the loop's next turn; nothing waits on it.
        sleeper.cancel()
