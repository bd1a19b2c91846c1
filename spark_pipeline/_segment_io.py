"""Reading the events of a segment range over the wire: for the tasks (``read_frames``) and for the
planner's admission control (``measure``).

Theory of operation.  A range ``[start, end)`` of a segment was written before the batch was
planned (its end is at most the tail the planner saw), so reading it never waits for data: each
``ReadSegment`` asks for at most what is left of the range, one read ahead of the one being split,
and frames are split here (``type 0 | length | payload``, big-endian, as the writer frames them) --
no byte beyond ``end`` is fetched.  A range that does not start and end at event boundaries (a cut
written by hand) is an ``InvalidStreamCutError``; bytes that retention or truncation deleted are a
``TruncatedDataError`` naming the segment and offset: the source never skips them.  A read that
returns nothing before the end (a segment store still recovering) is retried a bounded number of
times (``limits.SPARK_READ_EMPTY_*``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from millstream import Client, limits
from millstream.errors import (
    InvalidStreamCutError,
    RequestTimeoutError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
    TruncatedDataError,
)
from millstream.spark._planning import SegmentRange

__all__ = ["measure", "read_frames"]

_HEADER: Final = struct.Struct(">ii")
_HEADER_LENGTH: Final = _HEADER.size


def _deleted(span: SegmentRange, offset: int, error: Exception) -> TruncatedDataError:
    return TruncatedDataError(
        f"the events of {span.stream} in segment {span.segment_id} from offset {offset} were deleted (by retention "
        f"or truncation) before the query read them; the source does not skip them. Start a new query from the "
        f"stream's head (option start=head, a new checkpoint), or keep the data longer ({error})")


class _Reads:
    """Reads of one range, one ahead of the caller, on the client's event loop."""

    def __init__(self, client: Client, span: SegmentRange) -> None:
        self._client = client
        self._span = span
        self._segments = client.async_client.segments()
        self._length_max = client.async_client.config.read_length_bytes
        self._ahead: concurrent.futures.Future[Any] | None = None
        self._ahead_offset = -1

    def _start(self, offset: int) -> None:
        length = min(self._length_max, self._span.end_offset - offset)
        self._ahead_offset = offset
        self._ahead = asyncio.run_coroutine_threadsafe(
            self._segments.read(self._span.segment, offset, length=length), self._client.loop)

    def read(self, offset: int, *, ahead: bool) -> bytes:
        """The bytes at ``offset`` (some, not necessarily all, up to the range's end)."""
        if self._ahead is None or self._ahead_offset != offset:
            self.close()
            self._start(offset)
        future, self._ahead = self._ahead, None
        assert future is not None
        try:
            data: bytes = future.result(limits.SPARK_READ_EMPTY_WAIT_SECONDS * limits.SPARK_READ_EMPTY_ATTEMPTS_MAX
                                        ).data
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeoutError(f"reading segment {self._span.segment!r} at {offset} did not answer") from None
        except (StreamSegmentTruncatedError, StreamSegmentNotExistsError) as error:
            raise _deleted(self._span, offset, error) from None
        following = offset + len(data)
        if ahead and data and following < self._span.end_offset:
            self._start(following)
        return data

    def close(self) -> None:
        future, self._ahead = self._ahead, None
        if future is not None:
            future.cancel()


def read_frames(client: Client, span: SegmentRange, *, max_events: int | None = None,
                max_bytes: int | None = None, sleep: Callable[[float], None] = time.sleep,
                ) -> Iterator[list[tuple[int, bytes]]]:
    """The events of ``span`` as lists of ``(offset, payload)`` (one list per read), in order; with
    ``max_events``/``max_bytes``, only the events that fit those bounds (frames counted whole).
    Raises ``TruncatedDataError``, ``InvalidStreamCutError`` (see the module docstring); ``sleep`` waits
    between empty reads (tests pass a fake)."""
    reads = _Reads(client, span)
    bounded = max_events is not None or max_bytes is not None
    buffer = bytearray()
    base = span.start_offset  # the offset of buffer[0]
    fetched = span.start_offset
    events = 0
    empty = 0
    try:
        while base < span.end_offset:
            if fetched < span.end_offset:
                data = reads.read(fetched, ahead=not bounded)
                if not data:
                    empty += 1
                    if empty > limits.SPARK_READ_EMPTY_ATTEMPTS_MAX:
                        raise RequestTimeoutError(
                            f"segment {span.segment!r} returned no data at {fetched}, before the end of the batch's "
                            f"range ({span.end_offset}), {empty} times")
                    sleep(limits.SPARK_READ_EMPTY_WAIT_SECONDS)
                    continue
                empty = 0
                buffer += data
                fetched += len(data)
            batch: list[tuple[int, bytes]] = []
            position = 0
            size = len(buffer)
            view = memoryview(buffer)
            try:
                while size - position >= _HEADER_LENGTH:
                    kind, length = _HEADER.unpack_from(view, position)
                    if kind != 0 or not 0 <= length <= limits.EVENT_LENGTH_MAX_BYTES:
                        raise InvalidStreamCutError(
                            f"the bytes of segment {span.segment_id} of {span.stream} at offset {base + position} "
                            f"are not an event (type {kind}, length {length}): the batch's cut does not lie at an "
                            "event boundary (a start or end option written by hand?)")
                    frame_end = position + _HEADER_LENGTH + length
                    if frame_end > size:
                        break
                    if (max_events is not None and events >= max_events) or (
                            max_bytes is not None and base + frame_end - span.start_offset > max_bytes):
                        if batch:
                            yield batch
                        return
                    batch.append((base + position, bytes(view[position + _HEADER_LENGTH:frame_end])))
                    events += 1
                    position = frame_end
            finally:
                view.release()
            del buffer[:position]
            base += position
            if fetched >= span.end_offset and base < span.end_offset and not batch:
                # Everything up to the end is here and no whole event is left in it.
                raise InvalidStreamCutError(
                    f"segment {span.segment_id} of {span.stream} has an event across offset {span.end_offset}: the "
                    "batch's end cut does not lie at an event boundary (an end option written by hand?)")
            if batch:
                yield batch
    finally:
        reads.close()


def measure(client: Client, span: SegmentRange, max_events: int | None, max_bytes: int | None) -> tuple[int, int]:
    """Where the last whole event of ``span`` within ``max_events`` events and ``max_bytes`` bytes ends,
    and how many events lie before it (the planner's ``Measure``)."""
    end = span.start_offset
    count = 0
    for batch in read_frames(client, span, max_events=max_events, max_bytes=max_bytes):
        count += len(batch)
        offset, payload = batch[-1]
        end = offset + _HEADER_LENGTH + len(payload)
    return end, count
