"""Readers over one segment: raw bytes (``AsyncByteStreamReader``) and decoded events (``AsyncSegmentReader``).

Theory of operation.  Both read forward from an offset with ``ReadSegment``.  Behind the tail a read
answers at once; at the tail of an unsealed segment the server holds the read up to the caller's wait
(a long poll, at most ``limits.TAIL_READ_WAIT_SECONDS_MAX``) and answers as soon as data arrives, so a
reader following a segment neither spins nor sleeps.  A sealed segment's end is reported
(``end_of_segment``) and nothing more is ever read.

The event reader keeps the bytes after the last whole event it returned (at most one read plus one
unfinished event, i.e. bounded by ``limits.EVENT_LENGTH_BYTES_MAX`` + one read) and splits complete
events out of them: ``type 0 | length | payload``, the framing the writer uses.  Each event comes back
with its offset in the segment; ``offset`` is where the next event starts, so a caller that stores it
resumes exactly after the last event it processed.  While catching up (the last read did not reach the
tail) the reader keeps one read ahead in flight, so the network and the caller's processing overlap;
at the tail it reads only when asked.  Bytes that are not an event (a wrong type, a length beyond the
event limit) raise ``MalformedEventError``; a payload the serializer refuses raises
``UndecodableEventError`` (naming its offset and length, with its raw bytes) -- in both cases after
the events before it were returned, and the reader stays before that event until ``seek`` moves it
(``seek(error.next_offset)`` skips an undecodable event).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final, Generic, NamedTuple, TypeVar

from millstream import limits
from millstream.client._segments import AsyncSegments, validate_segment_name
from millstream.client._serializers import Serializer, is_identity
from millstream.errors import InvalidArgumentError, ObjectClosedError, UndecodableEventError
from millstream.values import ReadResult
from millstream.wire.codec import MalformedEventError

__all__ = ["AsyncByteStreamReader", "AsyncSegmentReader", "SegmentEvent"]

T = TypeVar("T")

_HEADER: Final = struct.Struct(">ii")
_HEADER_LENGTH: Final = _HEADER.size


class SegmentEvent(NamedTuple, Generic[T]):
    """One event read from a segment: where its frame starts, and its (deserialized) value."""

    offset: int
    value: T


def _wait(seconds: float) -> float:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise InvalidArgumentError(f"wait_seconds must be a number >= 0, not {seconds!r}")
    return min(float(seconds), limits.TAIL_READ_WAIT_SECONDS_MAX)


class AsyncByteStreamReader:
    """Reads a segment's bytes forward from an offset.  Made by ``AsyncClient.byte_stream_reader``."""

    def __init__(self, segments: AsyncSegments, segment: str, *, offset: int = 0) -> None:
        self._segments = segments
        self.segment = validate_segment_name(segment)
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        self._offset = offset
        self._end_of_segment = False
        self._at_tail = False
        self._closed = False

    @property
    def offset(self) -> int:
        """Where the next read starts."""
        return self._offset

    @property
    def end_of_segment(self) -> bool:
        """The segment is sealed and everything up to its end was read."""
        return self._end_of_segment

    @property
    def at_tail(self) -> bool:
        """The last read reached the segment's length at the time."""
        return self._at_tail

    def seek(self, offset: int) -> None:
        """Continue reading at ``offset``."""
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        self._offset = offset
        self._end_of_segment = False
        self._at_tail = False

    async def read(self, max_bytes: int | None = None, *, wait_seconds: float = 0.0) -> bytes:
        """The next bytes (at most ``max_bytes``; default the config's read size).  At the tail waits up
        to ``wait_seconds`` for data, then returns b"" -- as it does at the end of a sealed segment
        (see ``end_of_segment``)."""
        if self._closed:
            raise ObjectClosedError("the reader is closed")
        if self._end_of_segment:
            return b""
        result = await self._segments.read(self.segment, self._offset, length=max_bytes,
                                           wait_seconds=_wait(wait_seconds))
        self._offset += len(result.data)
        self._at_tail = result.at_tail
        self._end_of_segment = result.end_of_segment
        return result.data

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> AsyncByteStreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncSegmentReader(Generic[T]):
    """Reads the events of one segment in order, each with its offset.  Made by
    ``AsyncClient.segment_reader``; ``async for event in reader`` follows the segment until it is sealed
    and read to its end."""

    def __init__(self, segments: AsyncSegments, segment: str, serializer: Serializer[T], *, offset: int = 0) -> None:
        self._segments = segments
        self.segment = validate_segment_name(segment)
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        self._serializer = serializer
        self._deserialize = serializer.deserialize
        self._identity = is_identity(serializer)
        self._buffer = bytearray()  # bytes from _offset on, not yet returned
        self._offset = offset  # where _buffer starts: the next event's offset
        self._at_tail = False  # the last read reached the tail
        self._sealed_end = False  # the last read reached the end of a sealed segment
        self._ahead: asyncio.Task[ReadResult] | None = None  # the read-ahead, from _offset + len(_buffer)
        self._closed = False

    @property
    def offset(self) -> int:
        """Where the next event starts (store it to resume after the events returned so far)."""
        return self._offset

    @property
    def end_of_segment(self) -> bool:
        """The segment is sealed and every event in it was returned."""
        return self._sealed_end and not self._buffer

    @property
    def at_tail(self) -> bool:
        """Every event the segment held at the last read was returned."""
        return self._at_tail and not self._buffer

    def _fetch_offset(self) -> int:
        return self._offset + len(self._buffer)

    def _start_read_ahead(self) -> None:
        if self._ahead is None and not self._at_tail and not self._sealed_end and not self._closed:
            self._ahead = asyncio.get_running_loop().create_task(
                self._segments.read(self.segment, self._fetch_offset()), name=f"millstream-read-ahead-{self.segment}")

    async def _fetch(self, wait_seconds: float) -> bool:
        """Read more into the buffer; return whether any bytes came."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            result = await ahead
        else:
            result = await self._segments.read(self.segment, self._fetch_offset(), wait_seconds=wait_seconds)
        self._buffer += result.data
        self._at_tail = result.at_tail
        self._sealed_end = result.end_of_segment
        self._start_read_ahead()
        return bool(result.data)

    def _split(self, max_events: int) -> list[SegmentEvent[T]]:
        """Whole events from the front of the buffer (consumed); stops before a bad one."""
        buffer = self._buffer
        size = len(buffer)
        view = memoryview(buffer)
        unpack = _HEADER.unpack_from
        deserialize = None if self._identity else self._deserialize
        events: list[SegmentEvent[T]] = []
        base = self._offset
        position = 0
        try:
            while size - position >= _HEADER_LENGTH and len(events) < max_events:
                kind, length = unpack(view, position)
                if kind != 0 or not 0 <= length <= limits.EVENT_LENGTH_BYTES_MAX:
                    if events:
                        break
                    raise MalformedEventError(
                        f"the bytes of segment {self.segment!r} at offset {base + position} are not an event "
                        f"(type {kind}, length {length})")
                end = position + _HEADER_LENGTH + length
                if end > size:
                    break
                payload = bytes(view[position + _HEADER_LENGTH:end])
                if deserialize is None:
                    events.append(SegmentEvent(base + position, payload))  # type: ignore[arg-type]
                else:
                    try:
                        value = deserialize(payload)
                    except Exception as error:
                        if events:
                            break
                        raise UndecodableEventError(
                            f"{self._serializer!r} cannot decode the event of {length} bytes at offset "
                            f"{base + position} of segment {self.segment!r} ({error}); the reader stays before it "
                            "-- seek(error.next_offset) skips it (its bytes are error.payload)",
                            segment=self.segment, offset=base + position, length=length, payload=payload) from error
                    events.append(SegmentEvent(base + position, value))
                position = end
        finally:
            view.release()
        if position:
            del buffer[:position]
            self._offset = base + position
        return events

    async def read_events(self, *, wait_seconds: float = 0.0, max_events: int = 1 << 30) -> list[SegmentEvent[T]]:
        """The next events (at least one, unless at the tail after waiting up to ``wait_seconds``, or at
        the end of a sealed segment: then an empty list)."""
        if self._closed:
            raise ObjectClosedError("the reader is closed")
        if max_events < 1:
            raise InvalidArgumentError(f"max_events must be >= 1, not {max_events}")
        wait = _wait(wait_seconds)
        while True:
            events = self._split(max_events)
            if events:
                self._start_read_ahead()
                return events
            if self._sealed_end:
                if self._buffer:
                    raise MalformedEventError(
                        f"segment {self.segment!r} ends inside an event at offset {self._offset}")
                return []
            if self._at_tail and self._ahead is None:
                if not await self._fetch(wait):  # a long poll at the tail
                    return []
            else:
                await self._fetch(0.0)  # catching up: the read-ahead, or a read now

    async def read_event(self, *, wait_seconds: float = 0.0) -> SegmentEvent[T] | None:
        """The next event, or None at the tail after waiting up to ``wait_seconds`` (or at the end of
        a sealed segment)."""
        events = await self.read_events(wait_seconds=wait_seconds, max_events=1)
        return events[0] if events else None

    def seek(self, offset: int) -> None:
        """Continue at ``offset`` (which must be where an event starts)."""
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative int, not {offset!r}")
        self._cancel_read_ahead()
        self._buffer = bytearray()
        self._offset = offset
        self._at_tail = False
        self._sealed_end = False

    def _cancel_read_ahead(self) -> asyncio.Task[ReadResult] | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
        return ahead

    async def close(self) -> None:
        """Stop (cancels the read-ahead)."""
        self._closed = True
        ahead = self._cancel_read_ahead()
        if ahead is not None:
            await asyncio.gather(ahead, return_exceptions=True)

    def __aiter__(self) -> AsyncSegmentReader[T]:
        return self

    async def __anext__(self) -> SegmentEvent[T]:
        while True:
            event = await self.read_event(wait_seconds=limits.TAIL_READ_WAIT_SECONDS_MAX)
            if event is not None:
                return event
            if self.end_of_segment:
                raise StopAsyncIteration

    async def __aenter__(self) -> AsyncSegmentReader[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
