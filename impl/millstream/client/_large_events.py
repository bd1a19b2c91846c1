"""Large events (up to 1 GiB) through transient segments: ``AsyncLargeEventWriter`` and the file-like
``AsyncEventWriter`` that ``stream_event`` returns (``spec/LargeEvents.tla``, PDP-43/43A).

Theory of operation.  A ``LargeEventWriter`` writes a stream's ordinary events through an ordinary
idempotent writer (``write_event``) and streams large ones: ``stream_event(routing_key)`` returns an
``EventWriter`` the application writes the event's bytes into, as into a file, and then commits
(``commit``) or abandons (``close`` before ``commit`` aborts).  Several may be open at once.  The
whole event is never held in the client's memory:

1. An ``EventWriter`` keeps what it is given in memory while it stays at or under the inline limit
   (8 MiB).  A commit then is one plain append of that payload through the ordinary writer -- no
   transient segment at all (``Commit`` of an inline event in the spec).
2. Past the inline limit (or on ``flush``) it routes its key to the target segment of the stream's
   current epoch, asks that segment's store for a transient segment ``T1`` of it
   (``CreateTransientSegment``: ``CreateTransient``), and from then on streams the event's bytes into
   ``T1`` in chunks (``ChunkPipeline``: conditional appends, pipelined, kept until acknowledged,
   resent after a reconnect without duplication -- ``SendChunk``, ``AppendChunk``, ``Disconnect``,
   ``Reconnect``).  Its memory is one partial chunk plus the unacknowledged window.
3. ``commit`` takes the writer's commit lock -- the application's ordinary writes and other commits
   wait (the spec's ``Blocked``) -- waits until every chunk is acknowledged, flushes the ordinary
   writer (so every ordinary event written before the commit is stored first: ``Merge`` requires
   ``Flushed``), and then makes the event appear in the target at once, framed as one event.

The framing header.  Readers need ``type 0 | length | payload`` in the target, header first, yet the
length is known only at commit, and the bytes are already in ``T1``.  The commit therefore creates a
second transient segment ``T2`` for the same target, appends the 8-byte header to it, merges ``T1``
into ``T2`` and merges ``T2`` into the target.  Merges are container-local metadata relinks (no byte
is copied: the read index hands its blocks over, Tier 2 relinks its chunk spans), so this costs four
small requests whatever the event's size, and it needs no new segment-store operation (PDP-43's
"merge with header").  Only the last merge touches the target, and it is atomic: readers see the
whole event or nothing, never interleaved with other events of its key.  (The spec abstracts the
header as part 0 of the event; it is in the target exactly when the chunks are.)

Failure.  If ``T1`` disappears (the store deleted it: idle, or its writer's connection stayed down
past the grace period), the target is sealed (scaling: out of scope, as in PDP-43), or reconnecting
gives up, the event fails with ``LargeEventFailedError`` (retryable: write it again), its transient
segments are deleted (best effort: the store's sweep deletes what this cannot), and nothing of it is
merged.  Bad input -- an event over the limit, ``write`` after ``commit``, ``commit`` after
``close`` -- is a typed error (``PayloadTooLargeError``, ``ObjectClosedError``) and merges nothing.

Lifecycle of an ``EventWriter`` (a table, ``EVENT_WRITER_TRANSITIONS``, the model's minus
``ABANDONED``, which is the application dropping it): OPEN -> COMMITTING -> COMMITTED | FAILED;
OPEN -> COMMITTED (inline) | ABORTED | FAILED.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Generic, TypeVar
from uuid import UUID

import attrs

from millstream import limits
from millstream.client._byte_stream import ChunkPipeline
from millstream.client._config import ClientConfig, RandomSource, random_uuid
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._replies import expect
from millstream.client._routing import Router, StreamRouter
from millstream.client._segments import AsyncSegments
from millstream.client._serializers import Serializer
from millstream.client._writer import AsyncEventStreamWriter, StreamBinding
from millstream.errors import (
    BadOffsetError,
    ConnectionLostError,
    InternalError,
    InvalidArgumentError,
    LargeEventFailedError,
    MergeOutcomeUnknownError,
    MillstreamError,
    ObjectClosedError,
    PayloadTooLargeError,
    ReconnectBudgetExceededError,
    RequestTimeoutError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    TransientSegmentError,
)
from millstream.naming import is_hidden_segment
from millstream.wire.commands import CreateTransientSegment, SegmentCreated

__all__ = ["EVENT_WRITER_TRANSITIONS", "AsyncEventReader", "AsyncEventWriter", "AsyncLargeEventWriter", "EventWriter",
           "EventWriterPhase", "LargeEventConfig", "LargeEventWriter"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

_EVENT_HEADER: Final = struct.Struct(">ii")


def _size(limit: int, what: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if type(value) is not int or not 0 < value <= limit:
            raise InvalidArgumentError(f"{attribute.name} must be an int in (0, {limit}] ({what}), not {value!r}")
    return check


@attrs.frozen(kw_only=True)
class LargeEventConfig:
    """How a ``LargeEventWriter`` stages events; each defaults to (and may only shrink below) its limit
    in ``millstream.limits`` -- tests shrink them so a "large" event is a few kilobytes."""

    inline_bytes_max: int = attrs.field(default=limits.LARGE_EVENT_INLINE_BYTES_MAX,
                                        validator=_size(limits.LARGE_EVENT_INLINE_BYTES_MAX, "the inline limit"))
    chunk_bytes: int = attrs.field(default=limits.LARGE_EVENT_CHUNK_BYTES_MAX,
                                   validator=_size(limits.LARGE_EVENT_CHUNK_BYTES_MAX, "one conditional append"))
    unacked_bytes_max: int = attrs.field(default=limits.LARGE_EVENT_UNACKED_BYTES_MAX,
                                         validator=_size(limits.LARGE_EVENT_UNACKED_BYTES_MAX, "kept for resends"))
    event_length_max: int = attrs.field(default=limits.LARGE_EVENT_LENGTH_BYTES_MAX,
                                        validator=_size(limits.LARGE_EVENT_LENGTH_BYTES_MAX, "one event"))

    def __attrs_post_init__(self) -> None:
        if self.chunk_bytes > self.unacked_bytes_max:
            raise InvalidArgumentError("chunk_bytes must not exceed unacked_bytes_max")
        if self.inline_bytes_max > self.event_length_max:
            raise InvalidArgumentError("inline_bytes_max must not exceed event_length_max")


class EventWriterPhase(enum.Enum):
    """A large-event writer's phase (``EVENT_WRITER_TRANSITIONS`` says which follows which)."""

    OPEN = "open"  # taking bytes
    COMMITTING = "committing"  # inside commit: waiting for acknowledgements and the flush, merging
    COMMITTED = "committed"  # merged (or, inline, stored through the ordinary writer)
    ABORTED = "aborted"  # closed without commit
    FAILED = "failed"  # its transient segment went away, its target was sealed, or reconnecting gave up


#: phase -> {event: the phase that follows} (the model's ``WRITER_TRANSITIONS`` minus ABANDONED).
EVENT_WRITER_TRANSITIONS: dict[EventWriterPhase, dict[str, EventWriterPhase]] = {
    EventWriterPhase.OPEN: {"commit": EventWriterPhase.COMMITTING, "commit inline": EventWriterPhase.COMMITTED,
                            "close": EventWriterPhase.ABORTED, "fail": EventWriterPhase.FAILED},
    EventWriterPhase.COMMITTING: {"merged": EventWriterPhase.COMMITTED, "fail": EventWriterPhase.FAILED},
    EventWriterPhase.COMMITTED: {},
    EventWriterPhase.ABORTED: {},
    EventWriterPhase.FAILED: {},
}

#: Errors that end a large event for good (its transient segment or target went away, someone else
#: wrote into its transient segment, reconnecting gave up): ``LargeEventFailedError``.
_FATAL: Final = (StreamSegmentNotExistsError, StreamSegmentSealedError, BadOffsetError, ConnectionLostError,
                 RequestTimeoutError)


class AsyncEventWriter:
    """One large event being streamed (made by ``AsyncLargeEventWriter.stream_event``): ``write`` its
    bytes, optionally ``flush`` them (durable in the transient segment), then ``commit`` -- or ``close``
    without committing to abort.  ``async with`` aborts on the way out unless committed."""

    def __init__(self, owner: AsyncLargeEventWriter[Any], routing_key: str | None, writer_id: UUID) -> None:
        self._owner = owner
        self.routing_key = routing_key
        self.writer_id = writer_id
        self._config = owner.large_config
        self._phase = EventWriterPhase.OPEN
        self._buffer = bytearray()  # inline: the whole event so far; streaming: the next chunk's start
        self._length = 0
        self._parent: str | None = None
        self._transient: str | None = None
        self._header_segment: str | None = None
        self._pipeline: ChunkPipeline | None = None
        self._committing: asyncio.Future[None] | None = None
        self.error: BaseException | None = None

    # --- State ---------------------------------------------------------------------------------------

    @property
    def phase(self) -> EventWriterPhase:
        return self._phase

    @property
    def length(self) -> int:
        """Bytes written so far (the event's length once committed)."""
        return self._length

    @property
    def parent_segment(self) -> str | None:
        """The segment the event goes to (known once it left the inline buffer)."""
        return self._parent

    @property
    def transient_segment(self) -> str | None:
        """Its transient segment ``T1`` (None while inline)."""
        return self._transient

    @property
    def pipeline(self) -> ChunkPipeline | None:
        return self._pipeline

    @property
    def inline(self) -> bool:
        return self._pipeline is None

    def _move(self, phase: EventWriterPhase) -> None:
        if phase not in EVENT_WRITER_TRANSITIONS[self._phase].values():
            raise InternalError(f"EventWriter: no transition {self._phase.value} -> {phase.value}")
        self._phase = phase
        if phase is not EventWriterPhase.OPEN and phase is not EventWriterPhase.COMMITTING:
            self._owner._forget(self)

    def _check_open(self, what: str) -> None:
        if self._phase is not EventWriterPhase.OPEN:
            if self._phase is EventWriterPhase.FAILED and self.error is not None:
                raise LargeEventFailedError(f"{what}: the large event failed earlier: {self.error}") from self.error
            raise ObjectClosedError(f"{what}: the EventWriter is {self._phase.value}")

    # --- Writing -------------------------------------------------------------------------------------

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Add ``data`` to the event; return how many bytes were taken (all of them).  Waits only while
        too much is unacknowledged.  Raises ``ObjectClosedError`` after ``commit`` or ``close``,
        ``PayloadTooLargeError`` if the event would exceed its limit (1 GiB; the event is then aborted:
        nothing of it is ever merged), ``LargeEventFailedError`` if the event failed."""
        self._check_open("write")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"write takes bytes-like data, not {type(data).__name__}")
        view = memoryview(data).cast("B")
        size = len(view)
        if self._length + size > self._config.event_length_max:
            await self._abort()
            raise PayloadTooLargeError(
                f"a large event may hold {self._config.event_length_max} bytes; this write would make it "
                f"{self._length + size} (the event was aborted: nothing of it is merged)")
        self._length += size
        if self._pipeline is None:
            self._buffer += view
            if len(self._buffer) > self._config.inline_bytes_max:
                await self._guard(self._stream())
            return size
        await self._guard(self._ship(view))
        return size

    async def _ship(self, view: memoryview) -> None:
        """Stream ``view`` into the transient segment in whole chunks; keep the rest for the next one."""
        pipeline = self._pipeline
        assert pipeline is not None
        chunk = self._config.chunk_bytes
        position = 0
        if self._buffer:
            take = min(chunk - len(self._buffer), len(view))
            self._buffer += view[:take]
            position = take
            if len(self._buffer) < chunk:
                return
            data, self._buffer = bytes(self._buffer), bytearray()
            await pipeline.append(data)
        while len(view) - position >= chunk:
            await pipeline.append(bytes(view[position:position + chunk]))
            position += chunk
        if position < len(view):
            self._buffer += view[position:]

    async def _stream(self) -> None:
        """``CreateTransient``: leave the inline buffer -- route the key, create ``T1``, start the
        pipeline and stream what was buffered."""
        owner = self._owner
        self._parent = await owner.route(self.routing_key)
        self._transient = await owner.create_transient(self._parent, self.writer_id)
        self._pipeline = owner.pipeline(self._transient, self.writer_id)
        self._pipeline.start()
        buffered, self._buffer = self._buffer, bytearray()
        await self._ship(memoryview(buffered))

    async def _guard(self, step: Awaitable[None]) -> None:
        """Run ``step``; an error that ends the event fails it (``LargeEventFailedError``), cleaning up."""
        try:
            await step
        except MergeOutcomeUnknownError as error:
            self.error = error
            if self._phase in (EventWriterPhase.OPEN, EventWriterPhase.COMMITTING):
                self._move(EventWriterPhase.FAILED)
            await self._discard()
            raise ConnectionLostError(f"the large event for routing key {self.routing_key!r}: {error}") from error
        except _FATAL as error:
            await self._fail(error)
        except TransientSegmentError as error:
            await self._fail(error)

    async def _fail(self, error: BaseException) -> None:
        self.error = error
        if self._phase in (EventWriterPhase.OPEN, EventWriterPhase.COMMITTING):
            self._move(EventWriterPhase.FAILED)
        await self._discard()
        _log.info("large event for key %r failed: %s", self.routing_key, error)
        raise LargeEventFailedError(
            f"the large event for routing key {self.routing_key!r} failed ({type(error).__name__}: {error}); "
            "nothing of it was merged -- write it again") from error

    async def flush(self) -> None:
        """Make every byte written so far durable in the transient segment (creating it if the event was
        still inline, as PDP-43 says of the first flush)."""
        self._check_open("flush")
        if self._pipeline is None:
            await self._guard(self._stream())
        pipeline = self._pipeline
        assert pipeline is not None
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            await self._guard(pipeline.append(data))
        await self._guard(pipeline.flush())

    # --- Commit and abort ----------------------------------------------------------------------------

    async def commit(self) -> None:
        """Make the event appear in its segment, whole and at once, after every ordinary event written
        before this call; return once it is durable.  Raises ``ObjectClosedError`` if the EventWriter was
        committed or closed already, ``LargeEventFailedError`` if the event failed (nothing merged)."""
        self._check_open("commit")
        owner = self._owner
        async with owner.commit_lock:
            self._check_open("commit")  # (it may have failed while we waited for the lock)
            if self._pipeline is None:
                await self._commit_inline()
                return
            self._move(EventWriterPhase.COMMITTING)
            self._committing = asyncio.get_running_loop().create_future()
            try:
                await self._guard(self._merge())
            finally:
                if not self._committing.done():
                    self._committing.set_result(None)

    async def _commit_inline(self) -> None:
        """An event at or under the inline limit: one plain append through the ordinary writer (after
        everything written through it before, by its own order)."""
        payload, self._buffer = bytes(self._buffer), bytearray()
        try:
            future = await self._owner.ordinary.write_event_future(payload, routing_key=self.routing_key)
            await future
        except MillstreamError as error:  # the ordinary writer's error: the event's outcome is its outcome
            self.error = error
            self._move(EventWriterPhase.FAILED)
            raise
        self._move(EventWriterPhase.COMMITTED)

    async def _merge(self) -> None:
        """``Merge``: every chunk acknowledged and the ordinary writer flushed, then header segment,
        T1 -> T2, T2 -> target."""
        owner = self._owner
        pipeline = self._pipeline
        parent, transient = self._parent, self._transient
        assert pipeline is not None and parent is not None and transient is not None
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            await pipeline.append(data)
        await pipeline.flush()
        if pipeline.end_offset != self._length:
            raise InternalError(f"the transient segment holds {pipeline.end_offset} bytes of a {self._length}-byte "
                                "event")
        await pipeline.close()
        await owner.ordinary.flush()
        header_segment = self._header_segment = await owner.create_transient(parent, self.writer_id)
        header = owner.pipeline(header_segment, self.writer_id)
        header.start()
        try:
            await header.append(_EVENT_HEADER.pack(0, self._length))
            await header.flush()
        finally:
            await header.close()
        await owner.merge(header_segment, transient)
        self._transient = None  # (merged into the header segment: nothing to delete any more)
        await owner.merge(parent, header_segment)
        self._header_segment = None
        self._move(EventWriterPhase.COMMITTED)

    async def close(self) -> None:
        """Abort unless committed: delete the transient segment; nothing of the event is ever merged.
        After ``commit`` (or a failure) it does nothing."""
        if self._phase is EventWriterPhase.COMMITTING and self._committing is not None:
            await asyncio.shield(self._committing)
            return
        if self._phase is EventWriterPhase.OPEN:
            await self._abort()

    async def _abort(self) -> None:
        """``Abort``: the event is dropped and its transient segment deleted."""
        self._move(EventWriterPhase.ABORTED)
        await self._discard()

    async def _discard(self) -> None:
        """Stop the pipeline and delete the transient segments (best effort: what this cannot delete, the
        store's sweep does)."""
        self._buffer = bytearray()
        if self._pipeline is not None:
            await self._pipeline.close()
        for segment in (self._transient, self._header_segment):
            if segment is not None:
                await self._owner.delete_transient(segment)
        self._transient = self._header_segment = None

    async def __aenter__(self) -> AsyncEventWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"AsyncEventWriter(routing_key={self.routing_key!r}, phase={self._phase.value}, "
                f"length={self._length}, transient={self._transient!r})")


class AsyncLargeEventWriter(Generic[T]):
    """Ordinary events (``write_event``, through an ordinary idempotent writer) and large ones
    (``stream_event``) for one stream, in one order per routing key.  Made by
    ``AsyncClient.large_event_writer``.  ``close`` aborts the EventWriters still open and closes the
    ordinary writer (flushing it)."""

    def __init__(self, *, ordinary: AsyncEventStreamWriter[bytes], serializer: Serializer[T],
                 binding: StreamBinding | None, router: Router | None, pool: ConnectionPool,
                 locator: SegmentLocator, segments: AsyncSegments, token: str, config: ClientConfig,
                 rng: RandomSource, large_config: LargeEventConfig | None = None) -> None:
        if (binding is None) == (router is None):
            raise InternalError("a large-event writer routes by a stream's segments or by a router, not both")
        self.ordinary = ordinary
        self._serializer = serializer
        self._binding = binding
        self._router = router
        self._pool = pool
        self._locator = locator
        self._segments = segments
        self._token = token
        self._config = config
        self._rng = rng
        self.large_config = large_config or LargeEventConfig()
        #: Held by a large commit: ordinary writes and other commits wait (the spec's ``Blocked``).
        self.commit_lock = asyncio.Lock()
        self._open: set[AsyncEventWriter] = set()
        self._closed = False

    @property
    def stream(self) -> str | None:
        return None if self._binding is None else self._binding.stream

    def open_event_writers(self) -> list[AsyncEventWriter]:
        return list(self._open)

    # --- The application's calls ---------------------------------------------------------------------

    async def write_event(self, event: T, *, routing_key: str | None = None) -> None:
        """An ordinary event (at most 8 MiB serialized), as ``AsyncEventStreamWriter.write_event``; waits
        while a large event is being committed, so it lands after it."""
        self._check_open()
        payload = self._serializer.serialize(event)
        if type(payload) is not bytes:
            raise InvalidArgumentError(f"{self._serializer!r} returned {type(payload).__name__}, not bytes")
        if self.commit_lock.locked():
            async with self.commit_lock:
                pass
        await self.ordinary.write_event(payload, routing_key=routing_key)

    def stream_event(self, routing_key: str | None = None) -> AsyncEventWriter:
        """A file-like ``EventWriter`` for one large event with ``routing_key`` (nothing is sent until
        its bytes outgrow the inline limit or it is flushed)."""
        self._check_open()
        if routing_key is not None and not isinstance(routing_key, str):
            raise InvalidArgumentError(f"a routing key is a str or None, not {type(routing_key).__name__}")
        writer = AsyncEventWriter(self, routing_key, random_uuid(self._rng))
        self._open.add(writer)
        return writer

    async def flush(self) -> None:
        """Flush the ordinary writer (large events are durable when their ``commit`` returns)."""
        self._check_open()
        await self.ordinary.flush()

    async def close(self) -> None:
        """Abort every EventWriter still open, then close the ordinary writer (flushing it)."""
        if self._closed:
            return
        self._closed = True
        for writer in list(self._open):
            await writer.close()
        await self.ordinary.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("the large-event writer is closed")

    def _forget(self, writer: AsyncEventWriter) -> None:
        self._open.discard(writer)

    async def __aenter__(self) -> AsyncLargeEventWriter[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- What an EventWriter asks of its owner -------------------------------------------------------

    async def route(self, routing_key: str | None) -> str:
        """The segment of the stream's current epoch that owns ``routing_key``.  Asked afresh for each
        large event, so an event after a scale goes to the successor even if this writer's ordinary
        events have not met the seal yet (they are flushed before the merge, and readers finish a
        predecessor before they start its successors, so order holds either way)."""
        if self._router is not None:
            segment = self._router.segment_for(routing_key)
        else:
            assert self._binding is not None
            segment = StreamRouter(await self._binding.current_segments()).segment_for(routing_key)
        if is_hidden_segment(segment):
            raise TransientSegmentError(f"a large event's target must be a stream segment, not hidden segment "
                                        f"{segment!r}")
        return segment

    async def create_transient(self, parent: str, writer_id: UUID) -> str:
        """``CreateTransientSegment`` for ``parent``; the store's name for it.  A lost reply is retried
        (the transient segment it may have created is the store's to delete: its connection closed).
        Raises ``StreamSegmentSealedError`` if ``parent`` is sealed (the stream scaled),
        ``StreamSegmentNotExistsError`` if it is gone: the EventWriter fails the event with them."""
        async def once() -> str:
            connection = await self._pool.acquire(await self._locator.endpoint_for(parent))  # (retried below)
            reply = await connection.request(
                lambda rid: CreateTransientSegment(rid, writer_id, parent, self._token),
                what=f"create a transient segment of {parent!r}")
            return expect(reply, SegmentCreated).segment

        return await self._pool.retrying(once, retry_on=(ConnectionLostError, RequestTimeoutError),
                                         what=f"creating a transient segment of {parent}")

    def pipeline(self, segment: str, writer_id: UUID) -> ChunkPipeline:
        return ChunkPipeline(segment, pool=self._pool, locator=self._locator, token=self._token,
                             writer_id=writer_id, config=self._config,
                             unacked_bytes_max=self.large_config.unacked_bytes_max)

    async def merge(self, target: str, source: str) -> None:
        """``MergeSegments(source -> target)``, retried after a lost reply (the store remembers merges of
        transient segments, so a retry of one that happened is answered as the first was).  A retry
        that then finds the source gone cannot tell "merged" from "deleted" if the store restarted
        meanwhile: that is an unknown outcome (``ConnectionLostError``), never a claimed failure."""
        outage = self._config.outage(self._pool.rng, self._pool.clock)
        failures = 0
        while True:
            try:
                await self._segments.merge(target, source)
                return
            except ReconnectBudgetExceededError as error:  # (connecting gave up: this attempt sent nothing)
                if failures:
                    raise MergeOutcomeUnknownError(
                        f"merging {source!r} into {target!r}: the outcome is unknown ({error})") from error
                raise
            except (ConnectionLostError, RequestTimeoutError) as error:
                failures += 1
                delay = outage.failed()
                if delay is None:
                    raise MergeOutcomeUnknownError(f"merging {source!r} into {target!r}: the outcome is unknown after "
                                                   f"{outage.describe()} ({error})") from error
                await self._pool.clock.sleep(delay)
            except StreamSegmentNotExistsError as error:
                if failures:
                    raise MergeOutcomeUnknownError(f"merging {source!r} into {target!r}: the reply was lost and the "
                                                   f"source is gone now ({error}); the outcome is unknown") from error
                raise

    async def delete_transient(self, segment: str) -> None:
        """Delete a transient segment of an aborted or failed event; an error is logged, not raised (the
        store's sweep deletes what is left)."""
        try:
            await self._segments.delete(segment)
        except StreamSegmentNotExistsError:
            pass
        except MillstreamError as error:
            _log.info("could not delete transient segment %s (%s); the store's sweep will", segment, error)



# --- The reader side: one event's bytes, streamed ---------------------------------------------------


class AsyncEventReader:
    """A bounded, file-like reader over exactly one event's payload -- ``length`` bytes of ``segment``
    from ``start`` -- made by ``EventRead.stream_event()`` for an event too large to return as a value
    (``EventTooLargeError``).  ``read(size)`` returns at most ``size`` bytes (all that is left for -1)
    and b"" at the event's end; it never reads past the event.  One read-ahead of the client's read
    length is kept in flight, so the network and the caller's processing overlap; memory is bounded by
    two reads.  ``close`` (or leaving ``async with``) lets the event reader advance again."""

    def __init__(self, segments: AsyncSegments, segment: str, start: int, length: int, *, read_length_bytes: int,
                 on_close: Callable[[AsyncEventReader], None] | None = None) -> None:
        if length < 0 or start < 0:
            raise InvalidArgumentError(f"an event's bytes lie at a non-negative offset and length, not {start}, "
                                       f"{length}")
        self._segments = segments
        self.segment = segment
        self.start = start
        self.length = length
        self._read_length = max(1, min(read_length_bytes, limits.READ_LENGTH_BYTES_MAX))
        self._end = start + length
        self._position = start  # the next byte to return
        self._fetch_offset = start  # the next byte to fetch
        #: Fetched, not returned -- [position, fetch_offset) -- as the reads' own bytes objects, the first
        #: from ``_skip`` on: a read of exactly what one fetch brought returns that object, uncopied.
        self._pieces: deque[bytes] = deque()
        self._skip = 0
        self._buffered = 0
        self._ahead: asyncio.Task[bytes] | None = None
        self._on_close = on_close
        self._closed = False

    def tell(self) -> int:
        """How many of the event's bytes were returned so far."""
        return self._position - self.start

    @property
    def remaining(self) -> int:
        return self._end - self._position

    @property
    def closed(self) -> bool:
        return self._closed

    def readable(self) -> bool:
        return True

    async def _fetch(self, offset: int, length: int) -> bytes:
        result = await self._segments.read(self.segment, offset, length=length)
        data = result.data
        if not data:
            raise InternalError(f"segment {self.segment!r} returned nothing at {offset}, inside a merged event")
        return data if len(data) <= self._end - offset else data[:self._end - offset]

    def _start_ahead(self, *, needed: bool = False) -> None:
        """Start the next read unless one is in flight (or the buffer holds a read's worth already,
        unless the caller ``needed`` more)."""
        if self._ahead is None and self._fetch_offset < self._end and not self._closed \
                and (needed or self._buffered < self._read_length):
            length = min(self._read_length, self._end - self._fetch_offset)
            self._ahead = asyncio.get_running_loop().create_task(
                self._fetch(self._fetch_offset, length), name=f"millstream-event-read-{self.segment}")

    async def _fill(self, want: int) -> None:
        while self._buffered < want and self._fetch_offset < self._end:
            self._start_ahead(needed=True)
            ahead, self._ahead = self._ahead, None
            assert ahead is not None
            data = await ahead
            self._pieces.append(bytes(data))
            self._buffered += len(data)
            self._fetch_offset += len(data)

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` of the event's next bytes (everything left for ``size < 0``); b"" at its end."""
        if self._closed:
            raise ObjectClosedError("the EventReader is closed")
        if type(size) is not int:
            raise InvalidArgumentError(f"size is an int, not {size!r}")
        want = self.remaining if size < 0 else min(size, self.remaining)
        if want == 0:
            return b""
        await self._fill(want)
        data = self._take(want)
        self._position += len(data)
        self._start_ahead()
        return data

    def _take(self, want: int) -> bytes:
        """The next ``want`` buffered bytes (``want <= _buffered``): a whole fetched piece as it is,
        anything else copied once."""
        pieces = self._pieces
        first = pieces[0]
        if self._skip == 0 and len(first) == want:
            pieces.popleft()
            self._buffered -= want
            return first
        parts = []
        needed = want
        while needed:
            first = pieces[0]
            available = len(first) - self._skip
            take = min(available, needed)
            parts.append(memoryview(first)[self._skip:self._skip + take])
            needed -= take
            if take == available:
                pieces.popleft()
                self._skip = 0
            else:
                self._skip += take
        self._buffered -= want
        return b"".join(parts)

    async def readinto(self, buffer: bytearray | memoryview) -> int:
        """Read into ``buffer``; return how many bytes were read (0 at the event's end)."""
        view = memoryview(buffer).cast("B")
        data = await self.read(len(view))
        view[:len(data)] = data
        return len(data)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            await asyncio.gather(ahead, return_exceptions=True)
        self._pieces.clear()
        self._buffered = self._skip = 0
        if self._on_close is not None:
            self._on_close(self)

    async def __aenter__(self) -> AsyncEventReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncEventReader({self.segment!r}, start={self.start}, length={self.length}, read={self.tell()})"


# --- The blocking flavour ---------------------------------------------------------------------------

_Run = Callable[[Coroutine[Any, Any, Any]], Any]


class EventWriter:
    """The blocking ``AsyncEventWriter``: a file-like writer of one large event (``write``, ``flush``,
    ``commit``, ``close`` = abort unless committed; ``with`` aborts unless committed)."""

    def __init__(self, core: AsyncEventWriter, run: _Run) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncEventWriter:
        return self._core

    @property
    def phase(self) -> EventWriterPhase:
        return self._core.phase

    @property
    def length(self) -> int:
        return self._core.length

    @property
    def closed(self) -> bool:
        return self._core.phase is not EventWriterPhase.OPEN

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._run(self._core.write(data))  # type: ignore[no-any-return]

    def flush(self) -> None:
        self._run(self._core.flush())

    def commit(self) -> None:
        self._run(self._core.commit())

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventWriter({self._core!r})"


class LargeEventWriter(Generic[T]):
    """The blocking ``AsyncLargeEventWriter``."""

    def __init__(self, core: AsyncLargeEventWriter[T], run: _Run) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncLargeEventWriter[T]:
        return self._core

    def write_event(self, event: T, *, routing_key: str | None = None) -> None:
        self._run(self._core.write_event(event, routing_key=routing_key))

    def stream_event(self, routing_key: str | None = None) -> EventWriter:
        async def open_() -> AsyncEventWriter:
            return self._core.stream_event(routing_key)
        return EventWriter(self._run(open_()), self._run)

    def flush(self) -> None:
        self._run(self._core.flush())

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> LargeEventWriter[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
