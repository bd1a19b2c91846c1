"""Events to and from segments over the wire, as whole buffers: reading a range for the source's
tasks (``read_blocks``) and for the planner's admission control (``measure``); writing the sink's
rows into a stream transaction's segments (``frame_events``, ``route``, ``TransactionAppender``).

Theory of operation.  A range ``[start, end)`` of a segment was written before the batch was
planned (its end is at most the tail the planner saw), so reading it never waits for data: each
``ReadSegment`` asks for at most what is left of the range -- up to ``limits.SPARK_READ_AHEAD_MAX``
reads in flight, also while the planner counts events for admission control (but none starting past
a byte budget) -- and no byte beyond ``end`` is fetched.

The bytes are events framed as the writer frames them (``type 0 | length | payload``, big-endian
32-bit integers).  ``scan_frames`` finds where the frames start in a whole buffer, not event by
event in Python where it can help it: at a frame whose length repeats -- what a sensor stream and a
benchmark write -- it compares every header of the run with the first at once (a strided view of
the buffer in numpy), so a run of equally long events costs a few array operations whatever its
length; where lengths vary it walks the headers one by one for a stretch, then tries a run again.
The result is a ``FrameBlock``: the buffer, holding whole frames only, and the array of their
starts, from which the decoder builds Arrow arrays over the same buffer (``_decoding``).

Writing is the same framing the other way round, also per buffer: ``route`` sends each routing key
where the stream's writer would (``StreamRouter`` over the transaction's segments, asked once per
distinct key, not per row), ``frame_events`` builds the frames of a whole Arrow array of payloads in
C (the 8-byte headers from the array's offsets in numpy, joined to the payloads element-wise by
Arrow), and a ``TransactionAppender`` appends those bytes to the transaction's hidden segments -- handed
to the client's event loop a few MiB at a time, every segment's at once, not per Arrow batch -- each
through an offset-conditional raw append pipeline (``AsyncByteStreamWriter``: the bytes of a
transaction segment land once and in order however often a reconnect resends them, and the task is
the segment's only writer).  A transaction segment holds nothing but whole frames, so what the
controller merges into the stream on commit reads back as the events written.

A range that does not start and end at event boundaries (a cut written by hand) is an
``InvalidStreamCutError`` naming the offset; bytes that retention or truncation deleted are a
``TruncatedDataError`` naming the segment and offset: the source never skips them.  A read that
returns nothing before the end (a segment store still recovering) is retried a bounded number of
times (``limits.SPARK_READ_EMPTY_*``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream import Client, limits
from millstream.client import AsyncByteStreamWriter, StreamRouter
from millstream.errors import (
    InvalidStreamCutError,
    PayloadTooLargeError,
    RequestTimeoutError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
    TruncatedDataError,
)
from millstream.spark._planning import SegmentRange

__all__ = ["HEADER_LENGTH", "FrameBlock", "MalformedFrameError", "TransactionAppender", "frame_events", "measure",
           "int64_array", "read_blocks", "route", "scan_frames"]

_HEADER: Final = struct.Struct(">ii")
#: The bytes of an event's frame before its payload.
HEADER_LENGTH: Final = _HEADER.size
_EVENT_LENGTH_MAX: Final = limits.EVENT_LENGTH_BYTES_MAX
#: A run of equally long frames is taken as one (strided) only once this many headers agree; a
#: shorter one is walked header by header.
_RUN_PROBE: Final = 16
#: After a run turned out shorter than the probe, this many frames are walked one by one before a
#: run is tried again: where lengths vary, the failed probes then cost a few percent of the walk.
_WALK_STRETCH: Final = 256


class MalformedFrameError(Exception):
    """The bytes at ``position`` of a buffer are not an event's header (internal: the callers say
    which segment and offset)."""

    def __init__(self, position: int, kind: int, length: int) -> None:
        super().__init__(f"type {kind}, length {length} at {position}")
        self.position = position
        self.kind = kind
        self.length = length


def _run_length(data: Any, position: int, stride: int, available: int) -> int:
    """How many frames from ``position`` on have the header of the first (at most ``available``),
    comparing the headers of a probe first and of the rest only if the probe's all agree.  Each
    8-byte header is read as one 64-bit integer through a strided view of the buffer (no copy)."""
    probe = min(_RUN_PROBE, available)
    for count in (probe, available):
        headers = np.ndarray((count,), dtype=np.uint64, buffer=data, offset=position, strides=(stride,))
        agree = headers == headers[0]
        if not agree.all():
            return int(np.argmin(agree))
        if count == available:
            break
    return available


def scan_frames(data: Any) -> tuple[np.ndarray, int]:
    """The starts (an int64 array, ascending) of the whole frames at the front of ``data`` (any
    buffer), and where the last of them ends.  A partial frame at the end is left out.  Raises
    ``MalformedFrameError`` at the first header that is not an event's (type 0, a length in
    ``[0, limits.EVENT_LENGTH_BYTES_MAX]``)."""
    size = len(data)
    unpack = _HEADER.unpack_from
    pieces: list[np.ndarray] = []
    position = 0
    while size - position >= HEADER_LENGTH:
        kind, length = unpack(data, position)
        if kind != 0 or not 0 <= length <= _EVENT_LENGTH_MAX:
            raise MalformedFrameError(position, kind, length)
        stride = HEADER_LENGTH + length
        available = (size - position) // stride
        run = _run_length(data, position, stride, available) if available >= _RUN_PROBE else 0
        if run >= _RUN_PROBE:
            pieces.append(np.arange(position, position + run * stride, stride, dtype=np.int64))
            position += run * stride
            continue
        walked: list[int] = []
        for _ in range(_WALK_STRETCH):
            if size - position < HEADER_LENGTH:
                break
            kind, length = unpack(data, position)
            if kind != 0 or not 0 <= length <= _EVENT_LENGTH_MAX:
                raise MalformedFrameError(position, kind, length)
            end = position + HEADER_LENGTH + length
            if end > size:
                break
            walked.append(position)
            position = end
        if not walked:
            break  # a partial frame
        pieces.append(np.array(walked, dtype=np.int64))
        if len(walked) < _WALK_STRETCH:
            break
    if not pieces:
        return np.empty(0, dtype=np.int64), 0
    starts = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return starts, position


@attrs.frozen(eq=False)
class FrameBlock:
    """Whole events of one segment, in one buffer: ``data`` holds their frames and nothing else,
    ``data[0]`` lies at segment offset ``base_offset``, and ``starts`` (int64, ascending) are where
    the frames start in ``data``."""

    data: Any  # bytes or a buffer (the frames)
    base_offset: int
    starts: np.ndarray

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def end_offset(self) -> int:
        """The segment offset after the last frame."""
        return self.base_offset + len(self.data)

    def ends(self) -> np.ndarray:
        """Where each frame ends in ``data``."""
        ends = np.empty_like(self.starts)
        ends[:-1] = self.starts[1:]
        if len(ends):
            ends[-1] = len(self.data)
        return ends

    def lengths(self) -> np.ndarray:
        """Each event's payload length."""
        lengths: np.ndarray = self.ends() - self.starts - HEADER_LENGTH
        return lengths

    def offsets(self) -> np.ndarray:
        """Each event's segment offset (where its frame starts)."""
        return self.starts + self.base_offset

    def events(self) -> list[tuple[int, bytes]]:
        """``(offset, payload)`` of each event (one Python object per event: the slow path)."""
        view = memoryview(self.data)
        ends = self.ends().tolist()
        return [(self.base_offset + start, bytes(view[start + HEADER_LENGTH:end]))
                for start, end in zip(self.starts.tolist(), ends, strict=True)]

    def split(self, rows_max: int, bytes_max: int) -> Iterator[FrameBlock]:
        """This block in pieces of at most ``rows_max`` events and (but for a single event) at most
        ``bytes_max`` bytes of frames, in order."""
        count = self.count
        if count <= rows_max and len(self.data) <= bytes_max:
            yield self
            return
        ends = self.ends()
        first = 0
        while first < count:
            limit = self.starts[first] + bytes_max
            last = int(np.searchsorted(ends, limit, side="right"))
            last = max(first + 1, min(last, first + rows_max))
            low, high = int(self.starts[first]), int(ends[last - 1])
            yield FrameBlock(memoryview(self.data)[low:high], self.base_offset + low, self.starts[first:last] - low)
            first = last


def _deleted(span: SegmentRange, offset: int, error: Exception) -> TruncatedDataError:
    return TruncatedDataError(
        f"the events of {span.stream} in segment {span.segment_id} from offset {offset} were deleted (by retention "
        f"or truncation) before the query read them; the source does not skip them. Start a new query from the "
        f"stream's head (option start=head, a new checkpoint), or keep the data longer ({error})")


def _not_an_event(span: SegmentRange, offset: int, kind: int, length: int) -> InvalidStreamCutError:
    return InvalidStreamCutError(
        f"the bytes of segment {span.segment_id} of {span.stream} at offset {offset} are not an event (type {kind}, "
        f"length {length}): the batch's cut does not lie at an event boundary (a start or end option written by "
        "hand?)")


class _Reads:
    """Reads of one range on the client's event loop, up to ``depth`` of them in flight, none starting
    at or beyond ``horizon`` (a byte budget's end) unless asked for."""

    def __init__(self, client: Client, span: SegmentRange, depth: int, horizon: int | None = None) -> None:
        self._client = client
        self._span = span
        self._depth = depth
        self._horizon = span.end_offset if horizon is None else min(horizon, span.end_offset)
        self._segments = client.async_client.segments()
        self._length_max = client.async_client.config.read_length_bytes
        self._pending: deque[tuple[int, int, concurrent.futures.Future[Any]]] = deque()  # (offset, length, read)
        self._next = span.start_offset  # where the next read to start begins

    def _fill(self) -> None:
        while len(self._pending) < self._depth and self._next < self._span.end_offset and (
                not self._pending or self._next < self._horizon):
            length = min(self._length_max, self._span.end_offset - self._next)
            if self._next < self._horizon:
                length = min(length, self._horizon - self._next)  # a budget's end: no bytes beyond it
            future = asyncio.run_coroutine_threadsafe(
                self._segments.read(self._span.segment, self._next, length=length), self._client.loop)
            self._pending.append((self._next, length, future))
            self._next += length

    def read(self, offset: int) -> bytes:
        """The bytes at ``offset`` (some, not necessarily all, up to the range's end)."""
        if not self._pending or self._pending[0][0] != offset:
            self.close()
            self._next = offset
        self._fill()
        _, length, future = self._pending.popleft()
        try:
            data: bytes = future.result(limits.SPARK_READ_EMPTY_WAIT_SECONDS * limits.SPARK_READ_EMPTY_ATTEMPTS_MAX
                                        ).data
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeoutError(f"reading segment {self._span.segment!r} at {offset} did not answer") from None
        except (StreamSegmentTruncatedError, StreamSegmentNotExistsError) as error:
            raise _deleted(self._span, offset, error) from None
        if len(data) < length:
            # A short read: the reads queued behind it start further on than what follows; drop them.
            self.close()
            self._next = offset + len(data)
        return data

    def close(self) -> None:
        while self._pending:
            self._pending.popleft()[2].cancel()


def read_blocks(client: Client, span: SegmentRange, *, max_events: int | None = None,
                max_bytes: int | None = None, sleep: Callable[[float], None] = time.sleep,
                ) -> Iterator[FrameBlock]:
    """The events of ``span`` as ``FrameBlock``s (about one per read), in order; with
    ``max_events``/``max_bytes``, only the events that fit those bounds (frames counted whole).
    Raises ``TruncatedDataError``, ``InvalidStreamCutError`` (see the module docstring); ``sleep``
    waits between empty reads (tests pass a fake)."""
    bounded = max_events is not None or max_bytes is not None
    # Bounded (the planner counting events), reads go ahead too -- but not past a byte budget's end.
    reads = _Reads(client, span, limits.SPARK_READ_AHEAD_MAX,
                   None if max_bytes is None else span.start_offset + max_bytes)
    buffer: bytes = b""
    base = span.start_offset  # the offset of buffer[0]
    fetched = span.start_offset
    events = 0
    empty = 0
    try:
        while base < span.end_offset:
            if fetched < span.end_offset:
                data = reads.read(fetched)
                if not data:
                    empty += 1
                    if empty > limits.SPARK_READ_EMPTY_ATTEMPTS_MAX:
                        raise RequestTimeoutError(
                            f"segment {span.segment!r} returned no data at {fetched}, before the end of the batch's "
                            f"range ({span.end_offset}), {empty} times")
                    sleep(limits.SPARK_READ_EMPTY_WAIT_SECONDS)
                    continue
                empty = 0
                buffer = buffer + data if buffer else data
                fetched += len(data)
            try:
                starts, whole = scan_frames(buffer)
            except MalformedFrameError as error:
                raise _not_an_event(span, base + error.position, error.kind, error.length) from None
            if bounded and len(starts):
                ends = np.empty_like(starts)
                ends[:-1] = starts[1:]
                ends[-1] = whole
                keep = len(starts)
                if max_events is not None:
                    keep = min(keep, max_events - events)
                if max_bytes is not None:
                    keep = min(keep, int(np.searchsorted(ends, span.start_offset + max_bytes - base, side="right")))
                if keep < len(starts):
                    if keep > 0:
                        yield FrameBlock(memoryview(buffer)[:int(ends[keep - 1])], base, starts[:keep])
                    return
            if len(starts):
                events += len(starts)
                yield FrameBlock(memoryview(buffer)[:whole] if whole < len(buffer) else buffer, base, starts)
                buffer = buffer[whole:]  # the partial frame at the end (a copy of at most one event)
                base += whole
            if (max_bytes is not None and fetched >= span.start_offset + max_bytes) or (
                    max_events is not None and events >= max_events):
                return  # the budget is spent (what is left begins an event ending beyond the bytes)
            if fetched >= span.end_offset and base < span.end_offset and not len(starts):
                # Everything up to the end is here and no whole event is left in it.
                raise InvalidStreamCutError(
                    f"segment {span.segment_id} of {span.stream} has an event across offset {span.end_offset}: the "
                    "batch's end cut does not lie at an event boundary (an end option written by hand?)")
    finally:
        reads.close()


def measure(client: Client, span: SegmentRange, max_events: int | None, max_bytes: int | None) -> tuple[int, int]:
    """Where the last whole event of ``span`` within ``max_events`` events and ``max_bytes`` bytes ends,
    and how many events lie before it (the planner's ``Measure``)."""
    end = span.start_offset
    count = 0
    for block in read_blocks(client, span, max_events=max_events, max_bytes=max_bytes):
        count += block.count
        end = block.end_offset
    return end, count


# --- Writing ---------------------------------------------------------------------------------------


def _offsets(values: pa.Array) -> np.ndarray:
    """The int32 value offsets of a binary array (its slice of them)."""
    return np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]


def frame_events(values: pa.Array) -> bytes | pa.Buffer:
    """The frames (``type 0 | length | payload``) of every payload of ``values`` (a binary array
    without nulls), in order, as one buffer.  Raises ``PayloadTooLargeError`` for a payload beyond
    ``limits.EVENT_LENGTH_BYTES_MAX`` (nothing framed)."""
    count = len(values)
    if count == 0:
        return b""
    lengths = np.diff(_offsets(values))
    if int(lengths.max()) > _EVENT_LENGTH_MAX:
        raise PayloadTooLargeError(f"an event of {int(lengths.max())} bytes exceeds the limit of "
                                   f"{_EVENT_LENGTH_MAX} bytes")
    headers = np.zeros((count, 2), dtype=">i4")
    headers[:, 1] = lengths
    header_array = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * np.int32(HEADER_LENGTH)),
                             pa.py_buffer(headers)])
    framed = pc.binary_join_element_wise(header_array, values, pa.scalar(b"", pa.binary()))
    offsets = _offsets(framed)
    return framed.buffers()[2][int(offsets[0]):int(offsets[-1])]


def int64_array(values: np.ndarray) -> pa.Array:
    """An Arrow int64 array over a numpy array's buffer (``pa.array`` would import pandas to ask
    whether the array is one of its own: a second's start-up in every worker)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def route(values: pa.Array, keys: pa.Array | None, router: StreamRouter) -> list[tuple[str, pa.Array]]:
    """``values`` split by the segment each row's routing key (``keys``, strings or nulls; None: no
    keys) goes to, as ``router`` routes it -- asked once per distinct key -- keeping the rows' order
    within each segment.  Rows without a key go to one segment, the router's next."""
    if keys is None or keys.null_count == len(keys):
        return [(router.segment_for(None), values)]
    encoded = keys.dictionary_encode()
    targets = [router.segment_for(key) for key in encoded.dictionary.to_pylist()]
    keyless = router.segment_for(None) if keys.null_count else None
    names = sorted({*targets} if keyless is None else {*targets, keyless})
    if len(names) == 1:
        return [(names[0], values)]
    index_of = {name: number for number, name in enumerate(names)}
    table = np.array([index_of[name] for name in targets], dtype=np.int64)
    codes = encoded.indices.fill_null(0) if keys.null_count else encoded.indices  # a null's code is arbitrary
    indices = np.frombuffer(codes.buffers()[1], dtype=np.int32)[codes.offset:codes.offset + len(keys)]
    per_row = table[indices] if len(table) else np.zeros(len(keys), dtype=np.int64)
    if keyless is not None:
        per_row[np.asarray(keys.is_null())] = index_of[keyless]
    parts = []
    for number, name in enumerate(names):
        rows = np.flatnonzero(per_row == number)
        if len(rows):
            parts.append((name, values.take(int64_array(rows))))
    return parts


class TransactionAppender:
    """Appends framed events to the hidden segments of one stream transaction, one raw-append
    pipeline per segment (opened on first use), from a thread other than the client's loop.
    ``append`` queues the bytes in this thread; they go to the loop -- every segment's in one hand-over
    -- once ``buffer_bytes`` are queued, and at ``flush`` and ``close``: each hand-over is a round trip
    between two threads taking turns on the GIL, which cost more than the rest of a task's work when
    made per Arrow batch and segment.  ``flush`` returns once every byte is durable; ``close`` flushes
    and stops the pipelines (the transaction stays open: the driver commits it), in one hand-over."""

    def __init__(self, client: Client, *, buffer_bytes: int = limits.SPARK_SINK_APPEND_BUFFER_BYTES) -> None:
        self._client = client
        self._writers: dict[str, AsyncByteStreamWriter] = {}
        self._buffer_bytes = buffer_bytes
        self._queued: dict[str, list[bytes | pa.Buffer]] = {}  # segment -> its pieces, in order
        self._queued_bytes = 0

    def append(self, segment: str, data: bytes | pa.Buffer) -> None:
        """Queue ``data`` (whole frames) for ``segment``; hands what is queued to the loop once
        ``buffer_bytes`` are (waiting there only while too much is unacknowledged)."""
        if not len(data):
            return
        self._queued.setdefault(segment, []).append(data)
        self._queued_bytes += len(data)
        if self._queued_bytes >= self._buffer_bytes:
            self._client.run(self._write_queued(self._take_queued()))

    def _take_queued(self) -> dict[str, list[bytes | pa.Buffer]]:
        queued, self._queued, self._queued_bytes = self._queued, {}, 0
        return queued

    async def _write_queued(self, queued: dict[str, list[bytes | pa.Buffer]]) -> None:
        """On the loop: each segment's pieces into its pipeline, in order."""
        for segment, pieces in queued.items():
            writer = self._writers.get(segment)
            if writer is None:
                # A transaction segment is created empty and this task is its only writer: it starts at 0.
                writer = self._writers[segment] = self._client.async_client.segment_byte_writer(segment, base_offset=0)
            for piece in pieces:
                await writer.write(memoryview(piece))

    def flush(self) -> None:
        """Wait until every segment's bytes are durable (all segments at once: one round of
        acknowledgements, not one per segment)."""
        queued = self._take_queued()

        async def flush() -> None:
            await self._write_queued(queued)
            await asyncio.gather(*(writer.flush() for writer in self._writers.values()))
        self._client.run(flush())

    def close(self) -> None:
        """Hand over what is queued, then stop every pipeline after flushing what it holds (all at
        once); the first error is raised after all are stopped."""
        queued = self._take_queued()

        async def close() -> None:
            try:
                await self._write_queued(queued)
            finally:
                writers, self._writers = list(self._writers.values()), {}
                results = await asyncio.gather(*(writer.close() for writer in writers), return_exceptions=True)
            errors = [result for result in results if isinstance(result, BaseException)]
            if errors:
                raise errors[0]
        self._client.run(close())

    def discard(self) -> None:
        """Drop what is queued and stop every pipeline without waiting for its bytes (the transaction
        is being aborted)."""
        self._take_queued()

        async def discard() -> None:
            for writer in self._writers.values():
                await writer.pipeline.close()
            self._writers.clear()
        self._client.run(discard())
