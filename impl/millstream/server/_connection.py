"""One client connection of the segment-store server: bytes in, container calls, replies out.

Theory of operation.  ``Connection`` is an ``asyncio.BufferedProtocol``: the transport reads into the
server's shared receive buffer and ``buffer_updated`` feeds those bytes to a ``wire.Decoder``; every
command decoded is dispatched at once, in order.  Cheap requests (Hello, SetupAppend, segment info,
attribute reads) are answered inline; an append block is checked (event numbers, event count, event
lengths), charged against the in-flight budget and handed to its writer's ``WriterSession``, which
decides whether to submit it now; every container call that may wait (appends, reads, segment
administration) runs as a task in the connection's own ``asyncio.TaskGroup`` (``run``), so a
connection's tasks never outlive it and a bug in one surfaces instead of vanishing.

Replies are encoded into one outgoing buffer and written once per event-loop turn (``_flush``): a
burst of acknowledgements becomes one ``send``.

The class is put together from one mixin per job, each in a module of its own:

* ``_ingress.Ingress`` -- receiving and backpressure: the transport's reading callbacks, the
  decoder, the receive and in-flight budgets, the deadlines;
* ``_append_requests.AppendRequests`` -- SetupAppend, append blocks and their answers;
* ``_segment_requests.SegmentRequests`` -- reads, segment administration, the controller's calls;
* ``_error_replies.ErrorReplies`` -- the reply a failed request gets.

This module holds the state they share, the connection's lifecycle, sending and dispatch (with the
checks every request passes: the token, the segment's owner).

Bad input never takes the server down and never disturbs other connections: a frame the decoder
rejects, a block whose events are malformed or do not match its accounting, an event number that
does not increase, an append without ``SetupAppend`` -- each is logged once and closes this
connection (after the reply that explains it, where the protocol has one; the handler then returns
and nothing more of the connection is dispatched).  Requests that are merely wrong (an unknown
segment, a bad offset, a bad token, a segment another server owns, a change to a segment only the
node itself changes: ``millstream.auth``) get their typed reply and the connection carries on.  A
connection that closes drops its unanswered work: appends already submitted still complete in the
container, unacknowledged; the writer re-sends them after it reconnects and the stored event number
makes that safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any
from uuid import UUID

from millstream import limits
from millstream.auth import SegmentOperation
from millstream.errors import (
    AuthenticationError,
    MillstreamError,
    ReservedSegmentError,
    TransientSegmentError,
    WrongHostError,
)
from millstream.server._append_requests import AppendRequests
from millstream.server._appends import WriterSession
from millstream.server._connection_state import ConnectionServer
from millstream.server._error_replies import ErrorReplies, _text
from millstream.server._ingress import Ingress
from millstream.server._segment_requests import SegmentRequests
from millstream.wire import (
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    AppendBlockEnd,
    AppendBlockPart,
    AuthTokenCheckFailed,
    Command,
    ConditionalAppend,
    ConditionalBlockEnd,
    ControllerRequest,
    CreateSegment,
    CreateTransientSegment,
    Decoder,
    DeleteSegment,
    ErrorMessage,
    GetEventBoundaries,
    GetSegmentAttribute,
    GetSegmentInfo,
    Hello,
    InvalidCommandError,
    KeepAlive,
    MergeSegments,
    OperationUnsupported,
    ReadSegment,
    SealSegment,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    WireProtocolError,
    encode_into,
    negotiate,
)
from millstream.wire.error_codes import error_code_of

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer

__all__ = ["Connection"]

log = logging.getLogger("millstream.server")


class Connection(Ingress, AppendRequests, SegmentRequests, ErrorReplies, asyncio.BufferedProtocol):
    """One client connection.  Created by the server for each accepted socket."""

    def __init__(self, server: ConnectionServer) -> None:
        self._server = server
        self._config = server.config
        self._clock = server.clock
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_address = "?"  # the peer's host (connections per address are limited)
        self.adopted = False  # served by the server (not refused)
        # Receiving (see "Receiving" in the module docstring).
        self._decoder = Decoder(frame_bytes_max=self._config.unauthenticated_frame_bytes_max)
        self._authenticated = False
        #: Bytes received before authentication and not decoded yet (None once authenticated).
        self._unauthenticated: bytearray | None = bytearray()
        self._unauthenticated_blocked = False  # a frame too large for now waits for requests in flight
        self._handed: memoryview | None = None  # the buffer the last get_buffer handed out
        self._large_view: memoryview | None = None  # ... if it was (a part of) the large frame's buffer
        self._large: bytearray | None = None  # a large frame being received, its buffer growing as it arrives
        self._large_size = 0  # that frame's length, header included
        self._large_capacity = 0  # how much of _large it may fill now (all of the frame, in a pooled buffer)
        self._large_filled = 0
        self._large_growth = 0  # room granted for it, added to the buffer on the next get_buffer
        self._receive_waiting = False  # the large frame needs room the server's receive budget has not got
        self._buffered = 0  # bytes charged to the server's receive budget
        self._small_buffered = 0  # ... of which the decoder's pending bytes and _unauthenticated
        self._frame_started_at: float | None = None  # when the frame being received began (None: between frames)
        self._completed_frame = False  # the read being processed completed a frame
        self._paused_at: float | None = None
        self._paused_by_peer = False  # paused because the peer does not read its replies
        self._outgoing = bytearray()
        self._flush_scheduled = False
        self._version: int | None = None
        self._writers: dict[UUID, WriterSession] = {}
        self._parts: dict[UUID, list[bytes]] = {}  # streamed blocks' parts, by writer
        self._parts_bytes: dict[UUID, int] = {}
        self._in_flight_bytes = 0  # charged to the server's budget
        self._requests = 0  # non-append requests in flight
        self._read_bytes = 0  # what the reads in flight may return at most, together
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting_appends = 0  # appends in a task of their own (they may wait); see _submit
        self._read_tasks: set[asyncio.Task[Any]] = set()
        self._task_group: asyncio.TaskGroup | None = None
        self._backlog: deque[Command] = deque()  # decoded, not yet dispatched (while paused)
        self._dispatching = False
        self._reading_paused = False
        self._writing_paused = False
        self._draining = False
        self._closing = False
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._quiet = asyncio.Event()
        now = self._clock.monotonic()
        self._connected_at = self._last_received = self._last_frame_at = self._last_sent = now
        self.close_reason: str | None = None

    # --- the transport's callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        self.peer_address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        transport.set_write_buffer_limits(high=self._config.send_buffer_bytes_max)
        # Read nothing until ``run`` has entered the task group that dispatch spawns into.
        self._set_reading(False)
        self._send(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
        self._server.adopt(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self.close_reason is None:
            self.close_reason = "closed by the peer" if exc is None else f"lost: {exc!r}"
        if not self._lost.done():
            self._lost.set_result(None)

    # --- lifecycle ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes; then cancel what is left and release its charge."""
        try:
            async with asyncio.TaskGroup() as task_group:
                self._task_group = task_group
                self._spawn(self._watch_liveness())
                self._update_reading()
                await self._lost
                for task in list(self._tasks):
                    task.cancel()
        except Exception as error:  # a bug in a request task: this connection cannot be trusted
            self._server.log.error("connection %s failed", self.peer, exc_info=error)
            self._abort(f"internal error: {error!r}")
        finally:
            self._closing = True
            self._quiet.set()  # nothing of a closed connection waits for an answer any more
            self._release_all()
            if self._transport is not None and not self._transport.is_closing():
                self._transport.abort()

    def _spawn(self, coroutine: Coroutine[Any, Any, None], *, read: bool = False) -> None:
        task_group = self._task_group
        if task_group is None or self._closing:
            coroutine.close()
            return
        task = task_group.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if read:
            self._read_tasks.add(task)
            task.add_done_callback(self._read_tasks.discard)

    async def _watch_liveness(self) -> None:
        """Close the connection once a deadline passes (``overdue``); send KeepAlives meanwhile."""
        config = self._config
        interval = config.keepalive_interval_seconds
        tick = min(interval, config.hello_timeout_seconds, config.frame_timeout_seconds, config.idle_timeout) / 2
        while not self._closing:
            await self._clock.sleep(tick)
            now = self._clock.monotonic()
            reason = self.overdue(now)
            if reason is not None:
                self._abort(reason)
                return
            if now - self._last_sent >= interval:
                self._send(KeepAlive())

    def begin_drain(self) -> None:
        """Graceful shutdown: read nothing more, cancel waiting reads (they have no effect to keep);
        appends and administration already received run to their answers."""
        self._draining = True
        self._update_reading()
        for task in list(self._read_tasks):
            task.cancel()
        self._check_quiet()

    async def wait_quiet(self) -> None:
        """Until nothing this connection received waits for its answer (after ``begin_drain``)."""
        await self._quiet.wait()

    def close(self, reason: str) -> None:
        """Close after sending what is buffered."""
        if self.close_reason is None:
            self.close_reason = reason
        self._closing = True
        self._flush()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if not self._lost.done() and self._transport is None:
            self._lost.set_result(None)

    def _abort(self, reason: str) -> None:
        """Close because the peer (or a failure) left nothing sensible to do; logged once."""
        if self._closing:
            return
        self._server.log.warning("closing connection %s: %s", self.peer, reason)
        self.close(reason)

    def _check_quiet(self) -> None:
        if self._draining and self._requests == 0 and all(s.idle for s in self._writers.values()):
            self._quiet.set()

    @property
    def in_flight_bytes(self) -> int:
        return self._in_flight_bytes

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    # --- sending --------------------------------------------------------------------------------------

    def _send(self, command: Command) -> None:
        try:
            encode_into(self._outgoing, command)
        except InvalidCommandError as error:  # a bug: every reply's fields are bounded (see _text)
            self._server.log.error("connection %s: cannot encode %s", self.peer,
                                   type(command).__name__, exc_info=error)
            self._abort(f"internal error: a {type(command).__name__} reply could not be encoded")
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._outgoing:
            return
        data, self._outgoing = self._outgoing, bytearray()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)  # (hands the buffer over: TLS keeps a reference to it)
            self._last_sent = self._clock.monotonic()

    # --- dispatch -------------------------------------------------------------------------------------

    def _dispatch(self, command: Command) -> None:
        kind = type(command)
        if kind is AppendBlock:
            self._on_append_block(command)  # type: ignore[arg-type]
            return
        if self._version is None:
            if kind is not Hello:
                self._fail_protocol(f"{kind.__name__} before Hello")
                return
            self._on_hello(command)  # type: ignore[arg-type]
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            # A reply only the store sends, or a Hello again: nothing to do with it.
            request_id = getattr(command, "request_id", -1)
            self._server.log.info("connection %s: unsupported %s (request %s)", self.peer,
                                  kind.__name__, request_id)
            self._send(OperationUnsupported(request_id, kind.__name__))
            return
        handler(self, command)

    def _fail_protocol(self, reason: str, reply: Command | None = None) -> None:
        """The peer broke the protocol: send ``reply`` (if the protocol has one) and close.  The caller
        returns at once; ``_run_backlog`` dispatches nothing more to a closing connection."""
        if reply is not None:
            self._send(reply)
        self._abort(reason)

    def _on_hello(self, hello: Hello) -> None:
        try:
            self._version = negotiate(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION, hello.high_version, hello.low_version)
        except WireProtocolError as error:
            self._fail_protocol(f"incompatible: {error}")
            return
        if not self._server.authorizer.enabled:
            self._authenticate()  # (with authentication off, a Hello is all there is to prove)

    def _on_keep_alive(self, command: KeepAlive) -> None:
        pass  # its arrival updated _last_received already

    def _authorize(self, request_id: int, token: str, segment: str, operation: SegmentOperation) -> bool:
        """Whether a client may ``operation`` ``segment`` (its kind allows it, whatever the token; the
        token grants it); else reply why not and return False."""
        try:
            self._server.authorizer.authorize(token, segment, operation)
        except AuthenticationError as error:
            self._server.log.info("connection %s: request %d refused: %s", self.peer, request_id,
                                  _text(error, limits.ERROR_QUOTE_CHARACTERS_MAX * 4))
            self._send(AuthTokenCheckFailed(request_id, _text(error)))
            return False
        except (ReservedSegmentError, TransientSegmentError) as error:
            self._server.log.info("connection %s: request %d refused: %s", self.peer, request_id,
                                  _text(error, limits.ERROR_QUOTE_CHARACTERS_MAX * 4))
            self._send(ErrorMessage(request_id, segment, error_code_of(error), _text(error)))
            return False
        if not self._authenticated:
            self._authenticate()
        return True

    def _authorized_container(self, request_id: int, token: str, segment: str,
                              operation: SegmentOperation) -> SegmentContainer | None:
        """``_authorize``, then ``_container``: the container serving ``segment`` for a client that may
        ``operation`` it, or None after replying why not."""
        if not self._authorize(request_id, token, segment, operation):
            return None
        return self._container(request_id, segment)

    def _container(self, request_id: int, segment: str) -> SegmentContainer | None:
        """The container serving ``segment``, or None after replying why there is none."""
        try:
            return self._server.container_for(segment)
        except WrongHostError as error:
            self._send(self._error_reply(request_id, segment, error))
        except MillstreamError as error:  # the container is restarting or stopped; a bad name
            self._send(ErrorMessage(request_id, segment, error_code_of(error), _text(error)))
        return None

    # --- invariants -----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        charged = sum(b.charge for s in self._writers.values() for b in s.pending) + sum(self._parts_bytes.values())
        if not self._closing:
            assert charged == self._in_flight_bytes, (charged, self._in_flight_bytes)
        assert self._requests >= 0 and self._read_bytes >= 0
        for session in self._writers.values():
            session.check_invariants()
        self._decoder.check_invariants()
        large = self._large
        if large is not None:
            assert not self._decoder.pending_bytes and self._unauthenticated is None
            assert 0 < self._large_filled < self._large_size and self._large_filled <= self._large_capacity
            assert self._large_capacity <= len(large) and self._large_capacity <= self._large_size
            assert self._large_growth == 0 or len(large) + self._large_growth <= self._large_size
        if not self._closing:
            unauthenticated = len(self._unauthenticated) if self._unauthenticated is not None else 0
            assert self._small_buffered == self._decoder.pending_bytes + unauthenticated, self._small_buffered
            large_held = len(large) + self._large_growth if large is not None else 0
            assert self._buffered == self._small_buffered + large_held, (self._buffered, self._small_buffered,
                                                                         large_held)
            assert self._authenticated == (self._unauthenticated is None)
            assert len(self._writers) <= self._config.connection_writers_max


_HANDLERS: dict[type[Command], Any] = {
    KeepAlive: Connection._on_keep_alive,
    SetupAppend: Connection._on_setup_append,
    AppendBlock: Connection._on_append_block,
    ConditionalAppend: Connection._on_conditional_append,
    AppendBlockPart: Connection._on_append_block_part,
    AppendBlockEnd: Connection._on_append_block_end,
    ReadSegment: Connection._on_read_segment,
    GetSegmentInfo: Connection._on_get_segment_info,
    GetEventBoundaries: Connection._on_get_event_boundaries,
    GetSegmentAttribute: Connection._on_get_segment_attribute,
    CreateSegment: Connection._on_create_segment,
    SealSegment: Connection._on_seal_segment,
    TruncateSegment: Connection._on_truncate_segment,
    DeleteSegment: Connection._on_delete_segment,
    MergeSegments: Connection._on_merge_segments,
    CreateTransientSegment: Connection._on_create_transient_segment,
    ConditionalBlockEnd: Connection._on_conditional_block_end,
    UpdateSegmentAttribute: Connection._on_update_segment_attribute,
    ControllerRequest: Connection._on_controller_request,
}
