"""Raw bytes into one segment, exactly once: the ``ChunkPipeline`` under the byte-stream writer and
the large-event writer, and ``AsyncByteStreamWriter`` itself.

Theory of operation.  A ``ChunkPipeline`` appends *chunks* -- raw bytes, no event framing -- to one
segment, in order, each as a ``ConditionalBlockEnd`` that expects the segment to hold exactly the
bytes before it (its offset).  Chunks are pipelined on a connection without waiting and kept until
acknowledged.  The session is a loop like the event writer's (``_writer.SegmentWriter``): find the
segment's server, take a connection, ``SetupAppend``, send every unacknowledged chunk in order, and
when the connection breaks (or an acknowledgement is overdue: a lost reply) start again after a
jittered, capped backoff -- giving up once one outage outlasts the reconnect budget
(``ClientConfig.reconnect_budget_seconds``, per outage: see ``_append_session``).

Why the offset alone makes resends safe (``spec/LargeEvents.tla``: ``AppendChunk``, ``Reconnect``).
A chunk lands only at its own offset, so the segment always holds a prefix of the chunk sequence,
whatever mix of stale requests (from a dead connection, still applied by the store) and resends
reaches it.  After a reconnect the pipeline resends, on one connection and in order, every chunk not
yet acknowledged.  When the store refuses a resent chunk (``ConditionalCheckFailed``), every chunk
before it on this connection is stored (acknowledged, or refused the same way), so the segment is at
least as long as the chunk's offset -- and not exactly that long, or it would have been appended:
the chunk is stored already (a stale copy got there first).  The refusal therefore acknowledges it.
A refusal of a chunk that was never sent before cannot be explained by a stale copy: someone else
wrote to the segment, and the pipeline fails with ``BadOffsetError``.  (So a segment takes one
pipeline at a time; a transient segment's only writer is its ``EventWriter``.)

The store does not compare an event number for raw chunks (``ConditionalBlockEnd``): the offset is
the whole guard, which is exactly what makes a resend's refusal mean "stored".  Event numbers still
increase per connection, as the append path requires, so the store answers in order.

Memory: chunks sent and not acknowledged are bounded by ``unacked_bytes_max``; ``append`` waits for
acknowledgements beyond it.  Errors that retrying cannot fix (the segment was deleted or sealed,
someone else wrote to it, the token was refused, reconnecting gave up) fail the pipeline: every later
call raises that error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final
from uuid import UUID

from millstream import limits
from millstream.client._append_session import AppendSession
from millstream.client._config import ClientConfig, RandomSource, random_uuid
from millstream.client._controller import ControllerClient, ControllerSegmentLocator
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._segments import AsyncSegments, validate_segment_name
from millstream.client._streams import split_stream_name
from millstream.errors import (
    BadOffsetError,
    ConnectionLostError,
    InvalidArgumentError,
    ObjectClosedError,
    ProtocolError,
    ReconnectBudgetExceededError,
    StreamSealedError,
    TransientSegmentError,
)
from millstream.naming import is_transient_segment
from millstream.values import EVENT_SEGMENT, EVENT_SEGMENT_ATTRIBUTE_ID
from millstream.wire.commands import (
    AppendSetup,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    DataAppended,
)

__all__ = ["AsyncByteStreamWriter", "ByteStreamWriter", "ChunkPipeline", "byte_stream_segment"]

_log = logging.getLogger(__name__)

#: ``ChunkPipeline`` phases: sending (running), failed (an error retrying cannot fix), closed.
_RUNNING: Final = "running"
_FAILED: Final = "failed"
_CLOSED: Final = "closed"


class _Chunk:
    __slots__ = ("data", "number", "offset", "resent", "sent", "sent_at")

    def __init__(self, number: int, offset: int, data: bytes) -> None:
        self.number = number
        self.offset = offset
        self.data = data
        self.sent_at = 0.0
        self.sent = False  # sent at least once
        self.resent = False  # sent on an earlier connection too: a refusal now means "stored"


class ChunkPipeline(AppendSession):
    """Appends chunks to ``segment`` from ``base_offset`` on (its length when the pipeline starts),
    exactly once and in order (see the module docstring).  Runs on the client's event loop."""

    def __init__(self, segment: str, *, pool: ConnectionPool, locator: SegmentLocator, token: str,
                 writer_id: UUID, config: ClientConfig, base_offset: int = 0,
                 unacked_bytes_max: int = limits.LARGE_EVENT_UNACKED_BYTES_MAX) -> None:
        super().__init__(segment, pool=pool, locator=locator, token=token, writer_id=writer_id, config=config)
        self._unacked_bytes_max = unacked_bytes_max
        self._chunks: deque[_Chunk] = deque()  # not yet acknowledged, in order
        self._unacked_bytes = 0
        self._next_number = 1
        self._end_offset = base_offset  # where the next chunk goes
        self._acked_offset = base_offset  # every byte below it is stored (_sent: a prefix of _chunks went out)
        self._waiters: list[asyncio.Future[None]] = []  # woken on any acknowledgement, failure or close
        self._task: asyncio.Task[None] | None = None
        self._phase = _RUNNING
        self._error: BaseException | None = None
        #: Sessions set up (AppendSetup received) and chunks acknowledged by a refused resend (with
        #: ``reconnects``: evidence for tests, and what a stateful test maps onto the spec's Reconnect).
        self.sessions = 0
        self.refused_resends = 0

    # --- The session loop's questions (see AppendSession) -------------------------------------------

    _SESSION_KIND = "a chunk session"

    @property
    def _label(self) -> str:
        return f"chunks to {self.segment}"

    def _oldest_sent_at(self) -> float:
        return self._chunks[0].sent_at

    def _may_continue(self) -> bool:
        return self._phase is _RUNNING

    def _progress(self) -> int:
        return self._acked_offset

    def _gave_up(self, reason: BaseException, attempts: int) -> BaseException:
        error = ReconnectBudgetExceededError(
            f"chunks to {self.segment!r}: gave up after {attempts} reconnect attempts: an outage outlasted the "
            f"reconnect budget of {self._config.reconnect_budget_seconds:g} s; last error: {reason}")
        error.__cause__ = reason
        return error

    # --- State ---------------------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """Where the next chunk goes (the segment's length once everything is acknowledged)."""
        return self._end_offset

    @property
    def acknowledged_offset(self) -> int:
        """Every byte below it is stored."""
        return self._acked_offset

    @property
    def unacknowledged_chunks(self) -> int:
        return len(self._chunks)

    @property
    def sent_on_connection(self) -> int:
        """Chunks sent on the current connection and not yet acknowledged."""
        return self._sent

    @property
    def connected(self) -> bool:
        return self._ready

    @property
    def error(self) -> BaseException | None:
        return self._error

    # --- Producer side -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and self._phase is _RUNNING:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"millstream-chunks-{self.segment}")

    async def append(self, data: bytes) -> None:
        """Queue ``data`` as the next chunk (sent at once if connected); wait first while too much is
        unacknowledged.  Raises the pipeline's error, ``ObjectClosedError`` once closed."""
        size = len(data)
        if not 0 < size <= limits.APPEND_LENGTH_BYTES_MAX:
            raise InvalidArgumentError(f"a chunk holds 1 to {limits.APPEND_LENGTH_BYTES_MAX} bytes, not {size}")
        while True:
            self._check()
            if not self._chunks or self._unacked_bytes + size <= self._unacked_bytes_max:
                break
            await self._wait()
        chunk = _Chunk(self._next_number, self._end_offset, data)
        self._next_number += 1
        self._end_offset += size
        self._unacked_bytes += size
        self._chunks.append(chunk)
        if self._ready and self._sent == len(self._chunks) - 1:
            self._send(chunk)

    async def flush(self) -> None:
        """Wait until every chunk appended so far is stored.  Raises the pipeline's error."""
        target = self._end_offset
        while self._acked_offset < target:
            self._check()
            await self._wait()
        self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._phase is _CLOSED:
            raise ObjectClosedError(f"the chunk pipeline to {self.segment!r} is closed")

    async def _wait(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        """Stop (what is unacknowledged stays unacknowledged) and detach from the connection."""
        if self._phase is _RUNNING:
            self._phase = _CLOSED
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._leave_session()
        self._wake()

    # --- The session loop ------------------------------------------------------------------------------

    def _send(self, chunk: _Chunk) -> None:
        connection = self._connection
        assert connection is not None and self._ready
        chunk.sent_at = self._clock.monotonic()
        chunk.resent = chunk.sent  # (a chunk goes out at most once per connection)
        try:
            connection.send(ConditionalBlockEnd(self._writer_id, chunk.number, chunk.offset, chunk.data,
                                                self._request_id))
        except ConnectionLostError:
            return  # the connection is closing: the session ends and resends after setting up again
        chunk.sent = True
        self._sent += 1

    def _on_setup(self, reply: AppendSetup) -> None:
        if reply.writer_id != self._writer_id or self._ready:
            raise ProtocolError(f"unexpected AppendSetup for writer {reply.writer_id}")
        self._ready = True
        self.sessions += 1
        self._sent = 0
        for chunk in self._chunks:
            self._send(chunk)
            if not self._ready:
                break

    def _front(self, number: int, what: str) -> _Chunk:
        if not self._chunks or self._sent == 0 or self._chunks[0].number != number:
            expected = self._chunks[0].number if self._chunks else None
            raise ProtocolError(f"{what} for chunk {number} of {self.segment!r}, expected one for chunk {expected} "
                                "(replies come in order)")
        return self._chunks[0]

    def _on_appended(self, reply: DataAppended) -> None:
        chunk = self._front(reply.event_number, "DataAppended")
        end = chunk.offset + len(chunk.data)
        if reply.current_segment_write_offset != end:
            raise ProtocolError(f"chunk {chunk.number} of {self.segment!r} was appended at "
                                f"{reply.current_segment_write_offset - len(chunk.data)}, not at its offset "
                                f"{chunk.offset}")
        self._acknowledge()

    def _on_refused(self, reply: ConditionalCheckFailed) -> None:
        chunk = self._front(reply.event_number, "ConditionalCheckFailed")
        if not chunk.resent:
            error = BadOffsetError(f"segment {self.segment!r} is not {chunk.offset} bytes long where this writer's "
                                   "next bytes go: another writer appended to it")
            self._fail(error)
            self._end_session(error)
            return
        self.refused_resends += 1  # stored already, by the request this one resends (module docstring)
        self._acknowledge()

    _REPLY_HANDLERS = {DataAppended: _on_appended, ConditionalCheckFailed: _on_refused, AppendSetup: _on_setup}

    def _acknowledge(self) -> None:
        chunk = self._chunks.popleft()
        self._sent -= 1
        self._unacked_bytes -= len(chunk.data)
        self._acked_offset = chunk.offset + len(chunk.data)
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is not None:
            return
        self._error = error
        self._phase = _FAILED
        _log.info("chunks to %s failed: %s", self.segment, error)
        self._wake()

    def check_invariants(self) -> None:
        offset = self._acked_offset
        for chunk in self._chunks:
            assert chunk.offset == offset, (chunk.offset, offset)
            offset += len(chunk.data)
        assert offset == self._end_offset
        assert self._unacked_bytes == sum(len(c.data) for c in self._chunks)
        assert 0 <= self._sent <= len(self._chunks)
        assert self._ready or self._sent == 0 or self._connection is not None


async def byte_stream_segment(controller: ControllerClient, target: str) -> str:
    """The segment a byte stream lives in: ``target`` itself if it names a segment, else the one segment
    of stream ``target`` (``"scope/stream"``).  Raises ``InvalidArgumentError`` for a stream with more
    than one segment (a byte stream does not scale), ``StreamSealedError`` for a sealed one,
    ``TransientSegmentError`` for a transient segment."""
    validate_segment_name(target)
    if is_transient_segment(target):
        raise TransientSegmentError(f"{target!r} is a transient segment: a byte stream lives in a stream segment")
    if target.count("/") != 1:
        return target
    scope, name = split_stream_name(target)
    description = await controller.get_stream(scope, name)
    if len(description.segments) != 1:
        raise InvalidArgumentError(f"stream {target} has {len(description.segments)} segments; a byte stream needs "
                                   "exactly one (a fixed scaling policy of one segment)")
    return description.segments[0].name


class AsyncByteStreamWriter:
    """Appends raw bytes (no event framing) to one segment, exactly once and in order, through a
    ``ChunkPipeline``.  Made by ``AsyncClient.byte_stream_writer``; ``write`` returns once the bytes are
    queued (waiting only while too much is unacknowledged), ``flush`` waits until they are durable,
    ``close`` flushes and stops.  One writer per byte stream at a time: a byte someone else appended
    meanwhile fails the writer with ``BadOffsetError``."""

    def __init__(self, segment: str, *, pool: ConnectionPool, locator: SegmentLocator, segments: AsyncSegments,
                 token: str, config: ClientConfig, rng: RandomSource, base_offset: int,
                 chunk_bytes: int = limits.LARGE_EVENT_CHUNK_BYTES_MAX,
                 unacked_bytes_max: int = limits.LARGE_EVENT_UNACKED_BYTES_MAX) -> None:
        if not 0 < chunk_bytes <= limits.LARGE_EVENT_CHUNK_BYTES_MAX:
            raise InvalidArgumentError(f"chunk_bytes must lie in (0, {limits.LARGE_EVENT_CHUNK_BYTES_MAX}]")
        if not chunk_bytes <= unacked_bytes_max <= limits.LARGE_EVENT_UNACKED_BYTES_MAX:
            raise InvalidArgumentError(f"unacked_bytes_max must lie in [chunk_bytes, "
                                       f"{limits.LARGE_EVENT_UNACKED_BYTES_MAX}]")
        self.segment = segment
        self._segments = segments
        self._chunk_bytes = chunk_bytes
        self._buffer = bytearray()
        self._pipeline = ChunkPipeline(segment, pool=pool, locator=locator, token=token, writer_id=random_uuid(rng),
                                       config=config, base_offset=base_offset, unacked_bytes_max=unacked_bytes_max)
        self._pipeline.start()
        self._closed = False

    @classmethod
    async def open(cls, target: str, *, controller: ControllerClient, pool: ConnectionPool, locator: SegmentLocator,
                   token: str, config: ClientConfig, rng: RandomSource, **options: int) -> AsyncByteStreamWriter:
        """A writer at the end of byte stream ``target``: a stream with one segment (``"scope/stream"``,
        found where the controller says) or a segment named directly (found by ``locator``)."""
        segment = await byte_stream_segment(controller, target)
        if target.count("/") == 1:
            locator = ControllerSegmentLocator(controller)
        segments = AsyncSegments(pool=pool, locator=locator, token=token, rng=rng)
        properties = await segments.info(segment)
        if properties.sealed:
            raise StreamSealedError(f"byte stream {target} is sealed")
        # Raw bytes, not events: its truncations (truncate_data_before) keep byte granularity, so the
        # segment must stop claiming to hold events (a stream's segments and segments created by name
        # do).  A compare-and-set that finds the claim gone already changes nothing.
        await segments.update_attribute(segment, EVENT_SEGMENT_ATTRIBUTE_ID, None, expected_value=EVENT_SEGMENT)
        return cls(segment, pool=pool, locator=locator, segments=segments, token=token, config=config, rng=rng,
                   base_offset=properties.length, **options)

    @property
    def offset(self) -> int:
        """The byte stream's length once everything written so far is stored."""
        return self._pipeline.end_offset + len(self._buffer)

    @property
    def pipeline(self) -> ChunkPipeline:
        return self._pipeline

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Queue ``data``; return how many bytes were taken (all of them)."""
        if self._closed:
            raise ObjectClosedError(f"the byte-stream writer of {self.segment!r} is closed")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"write takes bytes-like data, not {type(data).__name__}")
        view = memoryview(data).cast("B")
        self._buffer += view
        while len(self._buffer) >= self._chunk_bytes:
            chunk = bytes(self._buffer[:self._chunk_bytes])
            del self._buffer[:self._chunk_bytes]
            await self._pipeline.append(chunk)
        return len(view)

    async def flush(self) -> None:
        """Wait until every byte written so far is durable."""
        if self._closed:
            raise ObjectClosedError(f"the byte-stream writer of {self.segment!r} is closed")
        if self._buffer:
            chunk, self._buffer = bytes(self._buffer), bytearray()
            await self._pipeline.append(chunk)
        await self._pipeline.flush()

    async def tail_offset(self) -> int:
        """The byte stream's length on the server now."""
        return (await self._segments.info(self.segment)).length

    async def truncate_data_before(self, offset: int) -> None:
        """Make the bytes before ``offset`` unreadable (and free their storage)."""
        await self._segments.truncate(self.segment, offset)

    async def close(self) -> None:
        """Flush, then stop.  Raises the flush's error (after stopping)."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            await self._pipeline.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncByteStreamWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()



class ByteStreamWriter:
    """The blocking ``AsyncByteStreamWriter``."""

    def __init__(self, core: AsyncByteStreamWriter, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncByteStreamWriter:
        return self._core

    @property
    def offset(self) -> int:
        return self._core.offset

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._run(self._core.write(data))  # type: ignore[no-any-return]

    def flush(self) -> None:
        self._run(self._core.flush())

    def tail_offset(self) -> int:
        return self._run(self._core.tail_offset())  # type: ignore[no-any-return]

    def truncate_data_before(self, offset: int) -> None:
        self._run(self._core.truncate_data_before(offset))

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> ByteStreamWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
