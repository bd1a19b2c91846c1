"""``AsyncEventStreamReader`` / ``EventStreamReader``: one reader of a reader group, and the values it
returns (``EventRead``, ``Position``).

Theory of operation.  A reader joins its group (``AddReader``) and keeps its own copy of the group's
state through a ``StateSynchronizer``.  ``read_next_event(timeout)`` does, in order:

1. if the previous call returned a checkpoint, record this reader's positions in it
   (``CheckpointReader``): the application has had the time between the two calls to persist its
   own state, so the positions recorded are ones it can restart from;
2. take in what changed in the group (a long poll on the state segment is always outstanding, so a
   checkpoint, a reset or a freed segment is noticed at once, without polling); if the group was
   reset, drop every segment and start over from the new generation; if this reader was declared
   offline, raise ``ReaderNotInGroupError``;
3. if the reader owes a checkpoint, return it (an ``EventRead`` with ``checkpoint_name`` and no
   event) -- or, for a silent one, record it at once;
4. rebalance on its timers: acquire unassigned segments (``AcquireSegment``) or release one
   (``ReleaseSegment``, only at its recorded offset) -- the group's load rules decide how many;
5. return the next event already fetched, from any of its segments in turn;
6. a segment read to its end: ask the controller for its successors (with all their predecessors)
   and record ``SegmentCompleted`` -- a successor becomes readable once every predecessor is done;
7. otherwise wait, at most until ``timeout``, for any of: a read of any segment, the state long poll,
   a rebalancing timer.

Reading is efficient: every segment the reader holds has one read in flight at most -- while behind,
a read-ahead of one block (the client's read length); at the tail, a long poll that the server holds
until data arrives -- so a reader following sixteen segments has sixteen waiting reads and answers
the first event that lands on any of them.  Events are decoded from each segment's bytes as they come
(``type 0 | length | payload``); a segment's position is where its next unreturned event starts.

A background task writes the reader's heartbeat (``UpdateDistanceToTail``, with its lag) every
``heartbeat_seconds``; it also watches the other readers' heartbeats on this reader's clock and
declares offline (``RemoveReader`` without positions: segments return at their recorded offsets) a
reader silent for ``offline_timeout_seconds``, and it starts automatic checkpoints when the group's
interval has passed since the last checkpoint this reader saw created.  ``close()`` leaves the group
with the reader's current positions (every event returned is taken as processed).

Data that truncation or retention removed is never skipped: ``TruncatedDataError`` is raised and the
reader stays where it was.  Nor is an event the serializer refuses (a "poison" event): every event
before it is returned first, then ``UndecodableEventError`` -- naming its segment, offset and length,
with its raw bytes -- is raised on every call, the reader staying *at* it (its position and any
checkpoint name that offset), until the application calls ``skip(error.event_read)`` (as a Kafka
consumer seeks past a record it cannot deserialize).  ``EventStreamReader`` is the blocking flavour;
it takes events from the event loop in batches (ending at any checkpoint, and before an undecodable
event) and keeps its position per event returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Generic, NamedTuple, NoReturn, Protocol, TypeVar

import attrs

from millstream import limits
from millstream.client._config import RandomSource
from millstream.client._controller import ControllerClient
from millstream.client._large_events import AsyncEventReader
from millstream.client._reader_group_state import (
    AcquireSegment,
    AddReader,
    CheckpointReader,
    CheckpointState,
    CreateCheckpoint,
    ReaderGroupState,
    ReaderGroupStateCodec,
    ReaderGroupUpdate,
    ReleaseSegment,
    RemoveReader,
    SegmentCompleted,
    UpdateDistanceToTail,
    validate_name,
)
from millstream.client._segments import AsyncSegments
from millstream.client._serializers import Serializer
from millstream.client._state_synchronizer import StateSynchronizer
from millstream.clock import Clock
from millstream.errors import (
    EventReaderOpenError,
    EventTooLargeError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    ReaderGroupNotFoundError,
    ReaderNotInGroupError,
    StreamNotFoundError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
    TruncatedDataError,
    UndecodableEventError,
)
from millstream.naming import parse_stream_segment_name, stream_segment_name
from millstream.values import ReadResult, canonical_json, split_stream_name
from millstream.wire.codec import MalformedEventError

__all__ = ["AsyncEventStreamReader", "EventRead", "EventReader", "EventStreamReader", "Position", "ReaderConfig",
           "ReaderGroupAccess"]

log = logging.getLogger("millstream.client.reader")

T = TypeVar("T")

_HEADER: Final = struct.Struct(">ii")


class ReaderGroupAccess(Protocol):
    """What a reader uses of the group that made it (``_reader_group.AsyncReaderGroup``, which makes
    readers and so imports this module): where it reads and with what, the group's names, and two
    calls back -- a checkpoint a reader completed, a reader that left."""

    @property
    def qualified_name(self) -> str: ...
    @property
    def state_segment(self) -> str: ...
    @property
    def _segments(self) -> AsyncSegments: ...
    @property
    def _controller(self) -> ControllerClient: ...
    @property
    def _clock(self) -> Clock: ...
    @property
    def _rng(self) -> RandomSource: ...
    @property
    def _read_length_bytes(self) -> int: ...
    async def _publish_completed(self, before: ReaderGroupState | None, after: ReaderGroupState | None) -> None: ...
    def _forget(self, reader: AsyncEventStreamReader[Any]) -> None: ...


def _seconds(value: Any, what: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero):
        raise InvalidArgumentError(f"{what} must be a finite {'non-negative' if zero else 'positive'} number of "
                                   f"seconds, not {value!r}")
    return float(value)


@attrs.frozen(kw_only=True)
class ReaderConfig:
    """A reader's timers.  ``time_unit_seconds``: the rebalancing unit (Pravega's 1 s; tests shorten
    it); ``heartbeat_seconds``: how often the reader tells the group it is alive;
    ``offline_timeout_seconds``: how long another reader may stay silent before this one declares it
    offline (0: never); ``tail_wait_seconds``: the long polls' length; ``event_in_memory_bytes_max``:
    the longest event ``read_next_event`` returns as a value (a longer one raises
    ``EventTooLargeError`` and is read through ``EventRead.stream_event()``)."""

    time_unit_seconds: float = limits.READER_TIME_UNIT_SECONDS
    heartbeat_seconds: float = limits.READER_HEARTBEAT_SECONDS
    offline_timeout_seconds: float = limits.READER_OFFLINE_TIMEOUT_SECONDS
    tail_wait_seconds: float = limits.READER_TAIL_WAIT_SECONDS
    event_in_memory_bytes_max: int = limits.READER_EVENT_IN_MEMORY_BYTES_MAX

    def __attrs_post_init__(self) -> None:
        limit = self.event_in_memory_bytes_max
        if type(limit) is not int or not 0 <= limit <= limits.LARGE_EVENT_LENGTH_BYTES_MAX:
            raise InvalidArgumentError(f"event_in_memory_bytes_max must be an int in [0, "
                                       f"{limits.LARGE_EVENT_LENGTH_BYTES_MAX}], not {limit!r}")
        _seconds(self.time_unit_seconds, "time_unit_seconds")
        _seconds(self.heartbeat_seconds, "heartbeat_seconds")
        _seconds(self.offline_timeout_seconds, "offline_timeout_seconds", zero=True)
        wait = _seconds(self.tail_wait_seconds, "tail_wait_seconds")
        if wait > limits.TAIL_READ_WAIT_SECONDS_MAX:
            raise InvalidArgumentError(f"tail_wait_seconds may be at most {limits.TAIL_READ_WAIT_SECONDS_MAX}")


class Position:
    """Where a reader is: for each segment it holds, the offset of the next event it would return.
    Store it with the application's state; ``reader_offline(reader, position)`` hands the segments
    back there.  ``to_json``/``from_json`` are canonical.  Frozen."""

    __slots__ = ("_segments",)

    _segments: dict[str, int]

    def __init__(self, segments: Mapping[str, int]) -> None:
        if not isinstance(segments, Mapping):
            raise InvalidArgumentError(f"a position maps segment names to offsets, not {segments!r}")
        checked: dict[str, int] = {}
        for segment, offset in segments.items():
            parse_stream_segment_name(segment)
            if type(offset) is not int or offset < 0:
                raise InvalidArgumentError(f"the offset of {segment!r} must be a non-negative int, not {offset!r}")
            checked[segment] = offset
        object.__setattr__(self, "_segments", dict(sorted(checked.items())))

    @property
    def segments(self) -> Mapping[str, int]:
        """Segment name -> offset (a copy)."""
        return dict(self._segments)

    def to_json(self) -> str:
        return canonical_json({"segments": self._segments}).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Position:
        import json

        try:
            value = json.loads(text)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"a position's JSON is malformed: {error}") from None
        if not isinstance(value, dict) or set(value) != {"segments"}:
            raise InvalidArgumentError(f"a position is {{\"segments\": {{...}}}}, not {value!r:.200}")
        return cls(value["segments"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Position) and self._segments == other._segments

    def __hash__(self) -> int:
        return hash(tuple(self._segments.items()))

    def __setattr__(self, name: str, value: object) -> None:
        raise attrs.exceptions.FrozenInstanceError()

    def __repr__(self) -> str:
        return f"Position({self._segments!r})"


class EventRead(NamedTuple, Generic[T]):
    """What ``read_next_event`` returned: an event (``event``, with its ``stream``, ``segment``,
    ``offset`` where it starts and ``next_offset`` where the segment's next event starts), or no
    event because a checkpoint was reached (``checkpoint_name``), every segment of the group was read
    to its end (``end_of_stream``: sealed streams or bounded reads), or the timeout passed (none of
    them).  ``event`` is None only then -- or for an event too large to return as a value: the
    ``EventRead`` an ``EventTooLargeError`` carries names it (``segment``, ``offset``, ``next_offset``),
    and its ``stream_event()`` opens it.  (A named tuple: one is made per event, cheaply.)"""

    event: T | None
    stream: str | None = None
    segment: str | None = None
    offset: int = -1
    next_offset: int = -1
    checkpoint_name: str | None = None
    end_of_stream: bool = False
    #: The reader that can still stream this event (set only on an ``EventTooLargeError``'s).
    source: Any = None

    @property
    def is_checkpoint(self) -> bool:
        return self.checkpoint_name is not None

    @property
    def length(self) -> int:
        """The event's payload length (-1 when this holds no event)."""
        return -1 if self.segment is None else self.next_offset - self.offset - _HEADER.size

    def stream_event(self) -> Any:
        """A bounded, file-like ``EventReader`` over exactly this event's bytes (an
        ``AsyncEventReader``, or an ``EventReader`` from the blocking reader).  Opening it consumes the
        event: neither ``read_next_event`` nor another ``stream_event`` serves it again, and the reader
        does not advance until it is closed (``EventReaderOpenError``).  Raises
        ``InvalidArgumentError`` for an event already served (every event ``read_next_event`` returned
        as a value was) or no longer the reader's next one."""
        if self.source is None or self.segment is None:
            raise InvalidArgumentError(
                "this event was served already (read_next_event returned it as a value) or this EventRead holds "
                "no event; stream_event() opens only an event an EventTooLargeError names")
        return self.source.open_event_reader(self)


_NOTHING: Final[EventRead[Any]] = EventRead(None)
_END: Final[EventRead[Any]] = EventRead(None, end_of_stream=True)


class _SegmentFetcher:
    """One segment this reader holds: its position, the events fetched and not yet returned, and at
    most one read in flight."""

    __slots__ = ("at_tail", "decoded", "end_offset", "events", "fetch_offset", "in_memory_max", "name", "offset",
                 "queued", "raw", "sealed_end", "stream", "tail_since", "task")

    def __init__(self, name: str, offset: int, end_offset: int | None, now: float,
                 in_memory_max: int = limits.READER_EVENT_IN_MEMORY_BYTES_MAX) -> None:
        scope, stream, _ = parse_stream_segment_name(name)
        self.name = name
        self.stream = f"{scope}/{stream}"
        self.offset = offset  # the next event to return
        self.decoded = offset  # where ``raw`` starts (events before it are in ``events``)
        self.fetch_offset = offset  # where the next read starts
        self.raw = bytearray()
        # (offset, payload, next offset); payload None: an event over ``in_memory_max``, whose bytes are
        # skipped here (they are streamed by an EventReader, or never fetched).
        self.events: deque[tuple[int, bytes | None, int]] = deque()
        self.in_memory_max = in_memory_max
        self.task: asyncio.Task[ReadResult] | None = None
        self.at_tail = False
        self.sealed_end = False
        self.end_offset = end_offset  # a bounded read stops here
        self.tail_since = now  # when the reader was last at this segment's tail (for its lag)
        self.queued = False  # in the reader's queue of segments with events to return

    @property
    def buffered_bytes(self) -> int:
        return self.fetch_offset - self.offset

    @property
    def done_fetching(self) -> bool:
        return self.sealed_end or (self.end_offset is not None and self.fetch_offset >= self.end_offset)

    @property
    def exhausted(self) -> bool:
        """Every event up to the segment's end (or the bounded read's end) was returned."""
        return self.done_fetching and not self.events and self.task is None and self.offset == self.fetch_offset

    def absorb(self, result: ReadResult) -> None:
        self.raw += result.data
        self.fetch_offset += len(result.data)
        self.at_tail = result.at_tail
        self.sealed_end = result.end_of_segment
        raw = self.raw
        position = 0
        size = len(raw)
        while size - position >= _HEADER.size:
            kind, length = _HEADER.unpack_from(raw, position)
            if kind != 0 or not 0 <= length <= limits.LARGE_EVENT_LENGTH_BYTES_MAX:
                raise MalformedEventError(f"the bytes of segment {self.name!r} at offset {self.decoded + position} "
                                          f"are not an event (type {kind}, length {length})")
            end = position + _HEADER.size + length
            if length > self.in_memory_max:
                # Too large to hold: note where it lies and skip its bytes (what was read of them is
                # dropped, what was not is never fetched here); it is streamed or not at all.
                self.events.append((self.decoded + position, None, self.decoded + end))
                if end > size:
                    self.raw = bytearray()
                    self.decoded += end
                    self.fetch_offset = self.decoded
                    return
                position = end
                continue
            if end > size:
                break
            self.events.append((self.decoded + position, bytes(raw[position + _HEADER.size:end]), self.decoded + end))
            position = end
        if position:
            del raw[:position]
            self.decoded += position
        if self.done_fetching and raw:
            raise MalformedEventError(f"segment {self.name!r} ends inside an event at offset {self.decoded}")


class AsyncEventStreamReader(Generic[T]):
    """A reader in a reader group (asyncio).  Made by ``AsyncReaderGroup.reader``; reads with
    ``read_next_event(timeout)``; ``close()`` leaves the group.  Not for concurrent use by several
    tasks at once (``read_next_event`` refuses to be entered twice)."""

    def __init__(self, group: ReaderGroupAccess, reader_id: str, serializer: Serializer[T],
                 config: ReaderConfig) -> None:
        self._group = group
        self.reader_id = validate_name(reader_id, "reader id")
        self._serializer = serializer
        self._config = config
        self._segments: AsyncSegments = group._segments
        self._clock = group._clock
        self._rng = group._rng
        self._read_length = group._read_length_bytes
        self._sync: StateSynchronizer[ReaderGroupState, ReaderGroupUpdate] = StateSynchronizer(
            self._segments, group.state_segment, ReaderGroupStateCodec(), rng=self._rng)
        self._fetchers: dict[str, _SegmentFetcher] = {}
        self._ready: deque[_SegmentFetcher] = deque()  # segments with fetched events, served in turn
        # What the group's state says for this reader, worked out once per change of the state:
        self._state: ReaderGroupState | None = None
        self._owed: CheckpointState | None = None  # the checkpoint it owes its positions to
        self._free = False  # it may acquire, release and complete
        self._has_unassigned = False
        self._generation = -1
        self._seen_offset = -1  # the synchronizer offset last reconciled with
        self._at_checkpoint: str | None = None
        now = self._clock.monotonic()
        unit = config.time_unit_seconds
        self._acquire_at = now + self._rng.random() * unit  # a random first delay spreads joining readers
        self._release_at = now + unit
        self._heartbeats_seen: dict[str, tuple[int, float]] = {}
        self._checkpoints_seen = (-1, now)
        self._ranges: dict[str, frozenset[str]] = {}  # bounded streams: the segments up to the end cut
        self._watch: asyncio.Task[bool] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._dropped: set[asyncio.Task[Any]] = set()  # cancelled reads, awaited at close
        self._busy = False
        self._removed = False
        self._closed = False
        self._event_reader: AsyncEventReader | None = None  # an event being streamed: no advancing meanwhile

    # --- Joining -----------------------------------------------------------------------------------

    async def _join(self) -> None:
        """Enter the group.  Raises ``ReaderExistsError`` (nothing changed), ``ReaderGroupNotFoundError``."""
        try:
            await self._sync.update(lambda state: None if state is None else [AddReader(self.reader_id)])
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self._group.qualified_name} does not exist") from None
        state = self._sync.state
        if state is None or self.reader_id not in state.readers:
            raise ReaderGroupNotFoundError(f"reader group {self._group.qualified_name} holds no state (was it "
                                           "deleted?)")
        self._reconcile()
        self._heartbeat_task = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(), name=f"millstream-reader-heartbeat-{self.reader_id}")

    # --- Reading -----------------------------------------------------------------------------------

    async def read_next_event(self, timeout: float) -> EventRead[T]:  # noqa: ASYNC109 (on the injected clock)
        """The next event, waiting at most ``timeout`` seconds; or a checkpoint, the end of the
        group's streams, or nothing after the timeout (see ``EventRead``).  Raises
        ``TruncatedDataError`` (nothing skipped; the reader stays where it was), ``StreamNotFoundError``
        for a deleted stream, ``ReaderNotInGroupError`` once the reader was declared offline (it is
        then closed), ``MalformedEventError`` for bytes that are not an event, and
        ``UndecodableEventError`` for an event the serializer refuses -- after every event before it
        was returned; the reader stays at it and raises again until ``skip`` moves past it."""
        if self._closed:
            raise ObjectClosedError(f"reader {self.reader_id!r} is closed")
        if type(timeout) is not float or not 0 <= timeout < math.inf:
            timeout = _seconds(timeout, "timeout", zero=True)
        if self._busy:
            raise InvalidArgumentError(f"reader {self.reader_id!r}: read_next_event is already running")
        if self._event_reader is not None:
            raise EventReaderOpenError(f"reader {self.reader_id!r} has an EventReader open ({self._event_reader!r}); "
                                       "close it before reading on")
        # The hot path: an event already fetched, and nothing to do first (no checkpoint to record or
        # return, no change of the group's state to take in, no rebalancing timer due).
        if self._ready and self._at_checkpoint is None and self._quiet():
            event = self._next_event()
            if event is not None:
                return event
        self._busy = True
        try:
            return await self._read(self._clock.monotonic() + timeout)
        except ReaderNotInGroupError:
            await self._stop()
            raise
        finally:
            self._busy = False

    async def _read(self, deadline: float) -> EventRead[T]:
        if self._at_checkpoint is not None:
            name, self._at_checkpoint = self._at_checkpoint, None
            await self._record_checkpoint(name)
        for _ in range(1 << 20):  # each round either returns, waits, or writes an update that moves on
            if self._closed:
                raise ObjectClosedError(f"reader {self.reader_id!r} was closed")
            state = await self._refresh()
            owed = self._owed
            if owed is not None:
                if owed.silent:
                    await self._record_checkpoint(owed.name)
                    continue
                self._at_checkpoint = owed.name
                return EventRead(None, checkpoint_name=owed.name)
            if self._free and await self._rebalance(state):
                continue
            event = self._next_event()
            if event is not None:
                return event
            finished = [f for f in self._fetchers.values() if f.exhausted]
            if finished:
                for fetcher in finished:
                    await self._complete(fetcher)
                continue
            if state.finished:
                await asyncio.sleep(0)  # (a caller polling the end in a loop must not starve the event loop)
                return _END
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                # Out of time: take in reads that finished meanwhile (and go round once more if they
                # brought something), and leave reads started for the next call (even with timeout 0).
                if await self._take_done_reads():
                    continue
                for fetcher in self._fetchers.values():
                    self._start_fetch(fetcher)
                await asyncio.sleep(0)
                return _NOTHING
            await self._wait(state, remaining)
        raise InvalidArgumentError("read_next_event went round too often")  # pragma: no cover - bounded by design

    def _next_event(self) -> EventRead[T] | None:
        """The next fetched event, from the segments with events in turn (consumed), or None."""
        ready = self._ready
        while ready:
            fetcher = ready[0]
            if not fetcher.events or self._fetchers.get(fetcher.name) is not fetcher:
                ready.popleft()  # (dropped, or drained)
                fetcher.queued = False
                continue
            offset, payload, next_offset = fetcher.events[0]
            if payload is None:  # too large to return: it stays, and raises again until it is streamed
                self._too_large(fetcher, offset, next_offset)
            try:
                value = self._serializer.deserialize(payload)
            except Exception as error:  # a refused payload stays, and raises again until it is skipped
                self._undecodable(fetcher, offset, payload, next_offset, error)
            fetcher.events.popleft()
            fetcher.offset = next_offset
            ready.popleft()
            if fetcher.events:
                ready.append(fetcher)  # round robin: the next event comes from the next segment
            else:
                fetcher.queued = False
                self._start_fetch(fetcher)
            return EventRead(value, fetcher.stream, fetcher.name, offset, next_offset)
        return None

    def _too_large(self, fetcher: _SegmentFetcher, offset: int, next_offset: int) -> NoReturn:
        length = next_offset - offset - _HEADER.size
        read = EventRead(None, fetcher.stream, fetcher.name, offset, next_offset, source=self)
        raise EventTooLargeError(
            f"the event of {length} bytes at offset {offset} of {fetcher.name!r} exceeds reader {self.reader_id!r}'s "
            f"in-memory limit of {self._config.event_in_memory_bytes_max} bytes; read it with "
            "error.event_read.stream_event() (the reader stays before it until then)", read)

    def _undecodable(self, fetcher: _SegmentFetcher, offset: int, payload: bytes, next_offset: int,
                     error: Exception) -> NoReturn:
        read = EventRead(None, fetcher.stream, fetcher.name, offset, next_offset)
        raise UndecodableEventError(
            f"reader {self.reader_id!r}: {self._serializer!r} cannot decode the event of {len(payload)} bytes at "
            f"offset {offset} of {fetcher.name!r} ({error}); the reader stays at it -- skip it with "
            "reader.skip(error.event_read) (its bytes are error.payload)",
            segment=fetcher.name, offset=offset, length=len(payload), payload=payload, event_read=read) from error

    def skip(self, read: EventRead[Any]) -> None:
        """Move past the event ``read`` names without returning it: the event an
        ``UndecodableEventError`` (or an ``EventTooLargeError``) carries as ``event_read``, which must
        be this reader's next event in its segment.  The reader's position, and so its next checkpoint,
        then lie after it.  Raises ``InvalidArgumentError`` (nothing skipped) for any other event."""
        if self._closed:
            raise ObjectClosedError(f"reader {self.reader_id!r} is closed")
        if not isinstance(read, EventRead):
            raise InvalidArgumentError(f"skip takes the EventRead of the event to skip (an error's event_read), "
                                       f"not {read!r:.100}")
        if self._event_reader is not None:
            raise EventReaderOpenError(f"reader {self.reader_id!r} has an EventReader open already")
        if self._busy:
            raise InvalidArgumentError(f"reader {self.reader_id!r}: read_next_event is running")
        fetcher = self._next_of(read)
        fetcher.events.popleft()
        fetcher.offset = read.next_offset
        log.info("reader %s skipped the event at offset %d of %s (%d bytes)", self.reader_id, read.offset,
                 read.segment, read.length)
        if not fetcher.events:
            self._start_fetch(fetcher)

    def _next_of(self, read: EventRead[Any]) -> _SegmentFetcher:
        """The fetcher whose next event ``read`` names; ``InvalidArgumentError`` if there is none."""
        fetcher = self._fetchers.get(read.segment) if read.segment is not None else None
        if fetcher is None or not fetcher.events or fetcher.events[0][0] != read.offset \
                or fetcher.events[0][2] != read.next_offset:
            raise InvalidArgumentError(
                f"the event at offset {read.offset} of {read.segment!r} is no longer reader {self.reader_id!r}'s "
                "next event (it was served or skipped already, or its segment moved to another reader or the group "
                "was reset)")
        return fetcher

    def open_event_reader(self, read: EventRead[Any]) -> AsyncEventReader:
        """``EventRead.stream_event()``: consume the event ``read`` names -- it must be this reader's next
        event in its segment -- and return an ``AsyncEventReader`` over its bytes.  The reader does not
        advance until that is closed."""
        if self._closed:
            raise ObjectClosedError(f"reader {self.reader_id!r} is closed")
        if self._event_reader is not None:
            raise EventReaderOpenError(f"reader {self.reader_id!r} has an EventReader open already")
        if self._busy:
            raise EventReaderOpenError(f"reader {self.reader_id!r}: read_next_event is running")
        fetcher = self._next_of(read)
        fetcher.events.popleft()
        fetcher.offset = read.next_offset
        start = read.offset + _HEADER.size
        reader = AsyncEventReader(self._segments, fetcher.name, start, read.next_offset - start,
                                  read_length_bytes=self._read_length, on_close=self._event_reader_closed)
        self._event_reader = reader
        return reader

    def _event_reader_closed(self, reader: AsyncEventReader) -> None:
        if self._event_reader is reader:
            self._event_reader = None

    def _quiet(self) -> bool:
        """Nothing to do before returning a fetched event: the state long poll and the heartbeat are
        still waiting (so the group's state did not change), nothing is owed, no timer is due."""
        watch, heartbeat = self._watch, self._heartbeat_task
        if watch is None or watch.done() or heartbeat is None or heartbeat.done() \
                or self._sync.offset != self._seen_offset or self._owed is not None:
            return False
        if not self._free:
            return True
        now = self._clock.monotonic()
        return now < self._release_at and not (self._has_unassigned and now >= self._acquire_at)

    def position(self) -> Position:
        """Where this reader is: the next event's offset in every segment it holds."""
        return Position({name: fetcher.offset for name, fetcher in self._fetchers.items()})

    @property
    def segments(self) -> list[str]:
        """The segments this reader holds now."""
        return sorted(self._fetchers)

    # --- The group's state -------------------------------------------------------------------------

    async def _refresh(self) -> ReaderGroupState:
        """Take in what changed in the group; keep a long poll on the state segment outstanding."""
        heartbeat = self._heartbeat_task
        if heartbeat is not None and heartbeat.done() and not heartbeat.cancelled():
            failure = heartbeat.exception()
            if failure is not None:
                raise failure  # (a bug in the heartbeat task: say so here rather than go silent)
        watch = self._watch
        if watch is not None and watch.done():
            self._watch = None
            if watch.cancelled() or watch.exception() is not None:
                await self._sync_fetch()  # the long poll failed (a broken connection): read now
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(
                self._sync.wait_for_change(self._config.tail_wait_seconds),
                name=f"millstream-reader-watch-{self.reader_id}")
        return self._reconcile()

    async def _sync_fetch(self) -> None:
        try:
            await self._sync.fetch_updates()
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self._group.qualified_name} was deleted") from None

    async def _update(self, plan: Callable[[ReaderGroupState | None], Sequence[ReaderGroupUpdate] | None]) -> bool:
        try:
            return await self._sync.update(plan)
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self._group.qualified_name} was deleted") from None

    def _reconcile(self) -> ReaderGroupState:
        """Bring the reader's segments in line with the group's state (after any change of it)."""
        state = self._sync.state
        if state is None:
            raise ReaderGroupNotFoundError(f"reader group {self._group.qualified_name} holds no state")
        if self._sync.offset == self._seen_offset:
            return state
        self._seen_offset = self._sync.offset
        if self.reader_id not in state.readers:
            self._removed = True
            raise ReaderNotInGroupError(f"reader {self.reader_id!r} is no longer online in reader group "
                                        f"{self._group.qualified_name} (it was declared offline)")
        now = self._clock.monotonic()
        if state.generation != self._generation:
            if self._generation >= 0:
                log.info("reader %s: group %s reset to generation %d", self.reader_id, self._group.qualified_name,
                         state.generation)
            for name in list(self._fetchers):
                self._drop(name)
            self._generation = state.generation
            self._at_checkpoint = None
            self._ranges.clear()
            self._acquire_at = now + self._rng.random() * self._config.time_unit_seconds
        mine = state.segments_of(self.reader_id)
        for name in [n for n in self._fetchers if n not in mine]:
            self._drop(name)
        for name, offset in mine.items():
            if name not in self._fetchers:
                self._fetchers[name] = _SegmentFetcher(name, offset, state.end_offsets.get(name), now,
                                                       self._config.event_in_memory_bytes_max)
        self._state = state
        self._owed = state.pending_checkpoint(self.reader_id)
        self._free = self._owed is None
        self._has_unassigned = bool(state.unassigned)
        return state

    def _drop(self, name: str) -> None:
        fetcher = self._fetchers.pop(name)
        if fetcher.task is not None:
            fetcher.task.cancel()
            self._dropped.add(fetcher.task)
            fetcher.task = None

    # --- Rebalancing -------------------------------------------------------------------------------

    async def _rebalance(self, state: ReaderGroupState) -> bool:
        """Acquire or release on the reader's timers; return whether the group's state changed."""
        me = self.reader_id
        if not state.free(me):
            return False
        now = self._clock.monotonic()
        unit = self._config.time_unit_seconds
        if state.unassigned and now >= self._acquire_at:
            def acquire(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
                if current is None or not current.free(me):
                    return None
                count = current.segments_to_acquire(me)
                return [AcquireSegment(me, s) for s in current.acquisition_order(me)[:count]] or None
            wrote = await self._update(acquire)
            latest = self._reconcile()
            self._acquire_at = now + (len(latest.readers) - latest.ranking(me)) * unit
            return wrote
        if now >= self._release_at:
            wrote = False
            if state.should_release(me):
                recorded = state.segments_of(me)
                releasable = [n for n, f in self._fetchers.items() if f.offset == recorded.get(n)]
                choice = state.release_choice(me, releasable)
                if choice is not None:
                    offset = self._fetchers[choice].offset

                    def release(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
                        if current is None or not current.free(me) or not current.should_release(me) \
                                or current.segments_of(me).get(choice) != offset:
                            return None
                        return [ReleaseSegment(me, choice, offset)]
                    wrote = await self._update(release)
            latest = self._reconcile()
            self._release_at = now + (1 + latest.ranking(me)) * unit
            return wrote
        return False

    # --- Checkpoints -------------------------------------------------------------------------------

    async def _record_checkpoint(self, name: str) -> None:
        """Record this reader's positions in checkpoint ``name`` (unless the group dropped it)."""
        me = self.reader_id

        def record(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or me not in current.readers:
                return None
            owed = current.pending_checkpoint(me)
            if owed is None or owed.name != name:
                return None
            positions = {s: (self._fetchers[s].offset if s in self._fetchers else recorded)
                         for s, recorded in current.segments_of(me).items()}
            return [CheckpointReader(name, me, positions)]
        before = self._sync.state
        if await self._update(record):
            log.debug("reader %s recorded checkpoint %s", me, name)
            await self._group._publish_completed(before, self._sync.state)

    # --- Segments read to their end ----------------------------------------------------------------

    async def _complete(self, fetcher: _SegmentFetcher) -> None:
        """``fetcher``'s segment is read to its end: hand its successors to the group."""
        me = self.reader_id
        name = fetcher.name
        state = self._sync.state
        assert state is not None
        successors: dict[str, frozenset[str]] = {}
        if name not in state.end_offsets:
            scope, stream, identifier = parse_stream_segment_name(name)
            found = await self._group._controller.get_successors(scope, stream, identifier)
            allowed: frozenset[str] | None = None
            if state.config.streams[f"{scope}/{stream}"][1] is not None:
                allowed = await self._range(state, f"{scope}/{stream}")
            for successor in found:
                if allowed is not None and successor.segment.name not in allowed:
                    continue  # beyond the bounded read's end
                predecessors = frozenset(stream_segment_name(scope, stream, p) for p in successor.predecessors)
                if allowed is not None:
                    predecessors = frozenset(p for p in predecessors if p in allowed or p == name)
                successors[successor.segment.name] = predecessors
        end = fetcher.offset

        def complete(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or not current.free(me) or name not in current.segments_of(me):
                return None
            return [SegmentCompleted(me, name, end, successors)]
        await self._update(complete)
        self._reconcile()

    async def _range(self, state: ReaderGroupState, stream: str) -> frozenset[str]:
        """The segments of a bounded stream up to its end cut (cached per generation)."""
        found = self._ranges.get(stream)
        if found is None:
            scope, name = split_stream_name(stream)
            slices = await self._group._controller.get_segments_between(scope, name, None,
                                                                        state.config.end_cut(stream))
            found = self._ranges[stream] = frozenset(s.segment.name for s in slices)
        return found

    # --- Waiting for data --------------------------------------------------------------------------

    def _start_fetch(self, fetcher: _SegmentFetcher) -> None:
        """Start the segment's next read if it needs one: a read-ahead while behind, a long poll at the
        tail once its events are all returned."""
        if fetcher.task is not None or fetcher.done_fetching:
            return
        if fetcher.buffered_bytes >= self._read_length and fetcher.events:
            return  # a read's worth ahead already (an event longer than that is fetched until it is whole)
        if fetcher.at_tail and fetcher.events:
            return
        length = min(self._read_length, limits.READER_TAIL_READ_LENGTH_BYTES) if fetcher.at_tail else self._read_length
        if fetcher.end_offset is not None:
            length = min(length, fetcher.end_offset - fetcher.fetch_offset)
        wait = self._config.tail_wait_seconds if fetcher.at_tail else 0.0
        fetcher.task = asyncio.get_running_loop().create_task(
            self._segments.read_following_moves(fetcher.name, fetcher.fetch_offset, length=length, wait_seconds=wait),
            name=f"millstream-reader-fetch-{fetcher.name}")

    async def _wait(self, state: ReaderGroupState, remaining: float) -> None:
        """Wait, at most ``remaining`` seconds, for a read, the state long poll or a rebalancing timer."""
        for fetcher in self._fetchers.values():
            self._start_fetch(fetcher)
        now = self._clock.monotonic()
        if state.unassigned and state.free(self.reader_id):
            remaining = min(remaining, max(0.0, self._acquire_at - now))
        if state.should_release(self.reader_id):
            remaining = min(remaining, max(0.0, self._release_at - now))
        waits: set[asyncio.Future[Any]] = {f.task for f in self._fetchers.values() if f.task is not None}
        if self._watch is not None:
            waits.add(self._watch)
        sleeper = asyncio.get_running_loop().create_task(self._clock.sleep(remaining))
        try:
            await asyncio.wait(waits | {sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sleeper
        await self._take_done_reads()

    async def _take_done_reads(self) -> bool:
        """Take in every read that finished; return whether there was any."""
        took = False
        for fetcher in list(self._fetchers.values()):
            if fetcher.task is not None and fetcher.task.done():
                await self._take_read(fetcher)
                took = True
        self._dropped = {t for t in self._dropped if not t.done()}
        return took

    async def _take_read(self, fetcher: _SegmentFetcher) -> None:
        task, fetcher.task = fetcher.task, None
        assert task is not None
        try:
            result = task.result()
        except (StreamSegmentTruncatedError, StreamSegmentNotExistsError) as error:
            # Only if the segment is still this reader's at that offset (the group may have been reset
            # past the missing data meanwhile, and this reader not have noticed yet).
            await self._sync_fetch()
            self._reconcile()
            if self._fetchers.get(fetcher.name) is not fetcher:
                return
            await self._raise_missing(fetcher, error)
        fetcher.absorb(result)
        if fetcher.at_tail:
            fetcher.tail_since = self._clock.monotonic()
        if fetcher.events and not fetcher.queued:
            fetcher.queued = True
            self._ready.append(fetcher)
        self._start_fetch(fetcher)

    async def _raise_missing(self, fetcher: _SegmentFetcher, error: Exception) -> NoReturn:
        scope, stream = split_stream_name(fetcher.stream)
        if isinstance(error, StreamSegmentNotExistsError):
            try:
                await self._group._controller.get_stream(scope, stream)
            except StreamNotFoundError:
                raise StreamNotFoundError(f"stream {fetcher.stream} was deleted under reader {self.reader_id!r}") \
                    from error
        raise TruncatedDataError(
            f"reader {self.reader_id!r}: the data of {fetcher.name!r} at offset {fetcher.fetch_offset} is gone "
            f"(truncated or deleted by retention: {error}); nothing was skipped -- reset the group to a stream cut "
            "at or after the stream's head to go on") from error

    # --- Heartbeats, offline readers and automatic checkpoints --------------------------------------

    def _lag_seconds(self, now: float) -> float:
        behind = [now - f.tail_since for f in self._fetchers.values() if not (f.at_tail and not f.events)]
        return max(behind, default=0.0)

    async def _heartbeat_loop(self) -> None:
        interval = self._config.heartbeat_seconds
        while not self._closed:
            automatic = self._group_automatic_seconds()
            await self._clock.sleep(min(interval, automatic / 2) if automatic > 0 else interval)
            try:
                await self._periodic()
            except (ReaderNotInGroupError, ReaderGroupNotFoundError):
                return  # the next read_next_event says so
            except MillstreamError as error:  # a broken connection, a restarting container: try next time
                log.warning("reader %s: heartbeat failed: %s", self.reader_id, error)

    def _group_automatic_seconds(self) -> float:
        state = self._sync.state
        return 0.0 if state is None else state.config.automatic_checkpoint_seconds

    async def _periodic(self) -> None:
        """One heartbeat: tell the group this reader is alive, declare silent readers offline, start
        an automatic checkpoint when one is due."""
        me = self.reader_id
        now = self._clock.monotonic()
        lag = self._lag_seconds(now)
        await self._update(lambda s: None if s is None or me not in s.readers else [UpdateDistanceToTail(me, lag)])
        state = self._sync.state
        if state is None or me not in state.readers:
            return
        for reader in self._silent_readers(state, now):
            heartbeat = self._heartbeats_seen[reader][0]

            def remove(current: ReaderGroupState | None, reader: str = reader,
                       heartbeat: int = heartbeat) -> list[ReaderGroupUpdate] | None:
                info = None if current is None else current.readers.get(reader)
                return None if info is None or info.heartbeat != heartbeat else [RemoveReader(reader)]
            before = self._sync.state
            if await self._update(remove):
                log.warning("reader %s declared reader %s of group %s offline (no heartbeat for %.1f s)", me, reader,
                            self._group.qualified_name, now - self._heartbeats_seen[reader][1])
                await self._group._publish_completed(before, self._sync.state)
        await self._automatic_checkpoint(now)

    def _silent_readers(self, state: ReaderGroupState, now: float) -> list[str]:
        """Readers whose heartbeat this reader has not seen change for the offline timeout."""
        seen = self._heartbeats_seen
        for reader in [r for r in seen if r not in state.readers]:
            del seen[reader]
        for reader, info in state.readers.items():
            if reader not in seen or seen[reader][0] != info.heartbeat:
                seen[reader] = (info.heartbeat, now)
        timeout = self._config.offline_timeout_seconds
        if timeout <= 0:
            return []
        return sorted(r for r, (_, since) in seen.items() if r != self.reader_id and now - since > timeout)

    async def _automatic_checkpoint(self, now: float) -> None:
        state = self._sync.state
        assert state is not None
        interval = state.config.automatic_checkpoint_seconds
        created = state.checkpoints_created
        if created != self._checkpoints_seen[0]:
            self._checkpoints_seen = (created, now)
            return
        if interval <= 0 or now - self._checkpoints_seen[1] < interval or state.outstanding_checkpoints:
            return
        name = f"auto-{created + 1}"

        def create(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or current.checkpoints_created != created or current.outstanding_checkpoints \
                    or current.checkpoint(name) is not None:
                return None
            return [CreateCheckpoint(name)]
        before = self._sync.state
        if await self._update(create):
            log.debug("reader %s started automatic checkpoint %s", self.reader_id, name)
            await self._group._publish_completed(before, self._sync.state)
        latest = self._sync.state
        assert latest is not None
        self._checkpoints_seen = (latest.checkpoints_created, now)

    # --- Closing -----------------------------------------------------------------------------------

    async def _stop(self) -> None:
        """Stop every task of this reader (reads, the long poll, heartbeats) and wait for them."""
        self._closed = True
        tasks = [f.task for f in self._fetchers.values() if f.task is not None] + list(self._dropped)
        for fetcher in self._fetchers.values():
            fetcher.task = None
        if self._watch is not None:
            tasks.append(self._watch)
            self._watch = None
        if self._heartbeat_task is not None and self._heartbeat_task is not asyncio.current_task():
            tasks.append(self._heartbeat_task)
        self._heartbeat_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._dropped.clear()
        self._group._forget(self)

    async def close(self, position: Position | None = None) -> None:
        """Leave the group: the reader's segments return to the pool at ``position`` (default: where
        the reader is, i.e. every event returned counts as processed).  A reader that cannot reach the
        group is declared offline by the others after their timeout instead."""
        if self._closed:
            return
        positions = (position or self.position()).segments
        await self._stop()
        if self._removed:
            return
        me = self.reader_id

        def leave(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or me not in current.readers:
                return None
            mine = current.segments_of(me)
            return [RemoveReader(me, {s: o for s, o in positions.items() if s in mine})]
        before = self._sync.state
        try:
            if await self._update(leave):
                await self._group._publish_completed(before, self._sync.state)
        except MillstreamError as error:
            log.warning("reader %s could not leave group %s (%s); the other readers will declare it offline",
                        me, self._group.qualified_name, error)

    async def _abandon(self) -> None:
        """Stop without telling the group, as a crashed process would (tests): the group declares the
        reader offline after its timeout, or ``reader_offline`` does at once."""
        await self._stop()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def synchronizer(self) -> StateSynchronizer[ReaderGroupState, ReaderGroupUpdate]:
        """The reader's copy of the group's state (diagnostics and tests)."""
        return self._sync

    async def __aenter__(self) -> AsyncEventStreamReader[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncEventStreamReader({self.reader_id!r}, group={self._group.qualified_name!r})"


class EventStreamReader(Generic[T]):
    """The blocking reader (see ``AsyncEventStreamReader``).  Events cross from the event loop in
    batches that end at any checkpoint; ``position()`` counts only the events returned."""

    def __init__(self, core: AsyncEventStreamReader[T], run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._core = core
        self._run = run
        self._pending: deque[EventRead[T]] = deque()

    @property
    def reader_id(self) -> str:
        return self._core.reader_id

    @property
    def core(self) -> AsyncEventStreamReader[T]:
        return self._core

    def read_next_event(self, timeout: float) -> EventRead[T]:
        """As ``AsyncEventStreamReader.read_next_event``: the events before an undecodable one are
        returned first, then ``UndecodableEventError`` is raised, again and again, until ``skip``
        moves past it.  An ``EventTooLargeError``'s ``event_read`` opens a blocking ``EventReader``
        here (``stream_event()``)."""
        if self._pending:
            return self._pending.popleft()
        try:
            batch: list[EventRead[T]] = self._run(_read_batch(self._core, timeout))
        except EventTooLargeError as error:
            read = error.event_read
            if isinstance(read, EventRead):
                error.event_read = read._replace(source=self)
            raise
        first = batch[0]
        self._pending.extend(batch[1:])
        return first

    def skip(self, read: EventRead[Any]) -> None:
        """Move past the event ``read`` names without returning it -- the ``event_read`` of an
        ``UndecodableEventError`` (or ``EventTooLargeError``) this reader raised: see
        ``AsyncEventStreamReader.skip``.  Raises ``InvalidArgumentError`` (nothing skipped) if it is not
        the reader's next event in its segment."""
        if not isinstance(read, EventRead):
            raise InvalidArgumentError(f"skip takes the EventRead of the event to skip (an error's event_read), "
                                       f"not {read!r:.100}")
        if any(pending.segment == read.segment for pending in self._pending):
            raise InvalidArgumentError(f"the event at offset {read.offset} of {read.segment!r} is not reader "
                                       f"{self.reader_id!r}'s next event (events before it were not returned yet)")

        async def skip() -> None:
            self._core.skip(read)
        self._run(skip())

    def open_event_reader(self, read: EventRead[Any]) -> EventReader:
        """``EventRead.stream_event()`` for the blocking reader: a blocking ``EventReader``."""
        if self._pending:
            raise InvalidArgumentError(f"the event at offset {read.offset} of {read.segment!r} is not reader "
                                       f"{self.reader_id!r}'s next event")

        async def open_() -> AsyncEventReader:
            return self._core.open_event_reader(read)
        return EventReader(self._run(open_()), self._run)

    def position(self) -> Position:
        """The next offset, in every segment held, after the events returned so far."""
        segments = dict(self._core.position().segments)
        for event in self._pending:
            if event.segment is not None and event.segment in segments:
                segments[event.segment] = min(segments[event.segment], event.offset)
        return Position(segments)

    @property
    def segments(self) -> list[str]:
        return self._core.segments

    def close(self, position: Position | None = None) -> None:
        """Leave the group at ``position`` (default: after the events returned)."""
        position = position or self.position()
        self._pending.clear()
        self._run(self._core.close(position))

    def __enter__(self) -> EventStreamReader[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventStreamReader({self._core.reader_id!r})"


async def _read_batch(reader: AsyncEventStreamReader[T], timeout: float) -> list[EventRead[T]]:  # noqa: ASYNC109
    """One ``read_next_event`` and then the events already fetched, up to
    ``limits.READER_BLOCKING_BATCH_EVENTS_MAX``, as long as the group's state did not change."""
    first = await reader.read_next_event(timeout)
    batch = [first]
    if first.event is None:
        return batch
    while len(batch) < limits.READER_BLOCKING_BATCH_EVENTS_MAX and reader._quiet():
        try:
            event = reader._next_event()
        except (EventTooLargeError, UndecodableEventError):
            break  # (raised again by the next call, once the events before it are handed out)
        if event is None:
            break
        batch.append(event)
    return batch


class EventReader:
    """The blocking ``AsyncEventReader``: a bounded, file-like reader over exactly one event's bytes."""

    def __init__(self, core: AsyncEventReader, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._core = core
        self._run = run

    @property
    def length(self) -> int:
        return self._core.length

    @property
    def remaining(self) -> int:
        return self._core.remaining

    @property
    def closed(self) -> bool:
        return self._core.closed

    def tell(self) -> int:
        return self._core.tell()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._run(self._core.read(size))  # type: ignore[no-any-return]

    def readinto(self, buffer: bytearray | memoryview) -> int:
        return self._run(self._core.readinto(buffer))  # type: ignore[no-any-return]

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> EventReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventReader({self._core!r})"
