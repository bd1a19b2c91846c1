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

Backpressure.  Append bytes received and not yet answered are charged to the connection and to the
server's ``IngressBudget``; while the budget says so -- or while too many other requests (or reads of
too many bytes) are in flight, or the peer does not read its replies (the transport paused our
writing) -- the connection stops reading from its socket, which in turn fills the peer's TCP window.
Commands already decoded from the last read wait in a backlog meanwhile, so every limit holds per
command rather than per read.  Whatever makes it pause re-checks when it changes (an answer, a
release elsewhere on the server, the transport resuming).

Receiving.  Nothing is allocated from a length a peer announces; bytes are held as they arrive.

* Every connection reads into the server's one receive buffer (``SegmentStoreServer.receive_view``):
  a read is decoded, and whatever must outlive it copied out, before any other read starts -- so an
  idle connection holds no buffer at all.
* Until a connection has *authenticated* -- with authentication off: said Hello; with it on: sent a
  request whose token the server accepted (``_authorize``, or a controller call that succeeded) --
  its bytes are kept in ``_unauthenticated`` and decoded one frame at a time
  (``_drain_unauthenticated``), each frame limited to ``config.unauthenticated_frame_bytes_max``
  (the decoder's ``frame_length_max`` says the same).  A larger frame is refused at its header and
  the connection closed -- unless a request that may yet authenticate it is in flight: then reading
  stops until that request is answered, and the frame is judged again.
* A frame of at least ``_LARGE_FRAME_BYTES`` that does not arrive in one read is received straight
  into a buffer of its own (``_start_large``), which grows as its bytes arrive: to at most twice what
  arrived, never past the frame's length, each step granted by the server's ``ReceiveBudget`` (a
  connection whose frame cannot grow stops reading until room is given back).  The decoder does not
  gather it piece by piece; a block's bytes are then copied once out of the frame by the codec and
  once into a DataFrame by the container.  Small frames' partial bytes (in the decoder) and the bytes
  before authentication are counted in the same budget.
* Deadlines (``overdue``, checked by ``_watch_liveness``): a Hello, a started frame, an idle
  connection, a silent one.

The connection's memory is then a few KiB of objects plus what its peer really sent, and a peer that
sends little and slowly is closed by a deadline.

Bad input never takes the server down and never disturbs other connections: a frame the decoder
rejects, a block whose events are malformed or do not match its accounting, an event number that
does not increase, an append without ``SetupAppend`` -- each is logged once and closes this
connection (after the reply that explains it, where the protocol has one).  Requests that are merely
wrong (an unknown segment, a bad offset, a bad token, a segment another server owns, a change to a
segment only the node itself changes: ``millstream.auth``) get their typed reply and the connection
carries on.  A connection that closes drops its unanswered work: appends
already submitted still complete in the container, unacknowledged; the writer re-sends them after
it reconnects and the stored event number makes that safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import sys
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any
from uuid import UUID

from millstream import limits
from millstream.auth import SegmentOperation
from millstream.errors import (
    AuthenticationError,
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerUnavailableError,
    InvalidArgumentError,
    MillstreamError,
    PayloadTooLargeError,
    ProtocolError,
    ReservedSegmentError,
    StreamSegmentExistsError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    TransientSegmentError,
    WrongHostError,
)
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.naming import is_transient_segment, quote
from millstream.segmentstore.event_boundaries import EVENT_SEGMENT_ATTRIBUTES
from millstream.server._appends import Failure, PendingBlock, WriterSession, scan_events
from millstream.server._transient import check_merge
from millstream.wire import (
    COMMAND_TYPES,
    FRAME_HEADER_LENGTH,
    FRAME_LENGTH_MAX,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    AppendBlockEnd,
    AppendBlockPart,
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
    ConditionalAppend,
    ConditionalBlockEnd,
    ControllerReply,
    ControllerRequest,
    CreateSegment,
    CreateTransientSegment,
    Decoder,
    DeleteSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetSegmentInfo,
    Hello,
    InvalidCommandError,
    InvalidEventNumber,
    KeepAlive,
    MergeSegments,
    OperationUnsupported,
    ReadSegment,
    SealSegment,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    WireProtocolError,
    encode_into,
    negotiate,
)
from millstream.wire.error_codes import error_code_of, reply_of_error

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer
    from millstream.server._server import ControllerEndpoint, SegmentStoreServer

__all__ = ["Connection"]

log = logging.getLogger("millstream.server")

_REPLACE_IF_EQUALS = AttributeUpdateType.REPLACE_IF_EQUALS
_HEADER = struct.Struct(">ii")
_LENGTH = struct.Struct(">i")

#: A frame at least this long that does not arrive in one read is received into a buffer of its own
#: (growing as it arrives, up to its size), then decoded whole: its bytes are not first gathered by
#: the decoder, which would copy them once more (and again each time its buffer grew).
_LARGE_FRAME_BYTES = 64 * 1024

#: A read that cannot use the server's shared receive buffer gets one of its own of this size.
_PRIVATE_READ_BYTES = 64 * 1024

_READ, _APPEND = SegmentOperation.READ, SegmentOperation.APPEND


class _Closed(Exception):
    """Raised inside dispatch once the connection has been closed: stop processing this read."""


class Connection(asyncio.BufferedProtocol):
    """One client connection.  Created by the server for each accepted socket."""

    def __init__(self, server: SegmentStoreServer) -> None:
        self._server = server
        self._config = server.config
        self._clock = server.clock
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_address = "?"  # the peer's host (connections per address are limited)
        self.adopted = False  # served by the server (not refused)
        # Receiving (see "Receiving" in the module docstring).
        self._decoder = Decoder(frame_length_max=self._config.unauthenticated_frame_bytes_max)
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

    # --- the transport's callbacks -------------------------------------------------------------------

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

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            view = self._large_buffer()
        else:
            server = self._server
            if server.receiving:  # another connection's read is being processed (asyncio never does this)
                view = memoryview(bytearray(_PRIVATE_READ_BYTES))
            elif self._unauthenticated is not None:
                view = server.receive_view[:self._config.unauthenticated_frame_bytes_max + FRAME_HEADER_LENGTH]
            elif server.receive_budget.exhausted:  # (a large frame starting now gets little before it waits)
                view = server.receive_view[:self._config.connection_receive_buffered_bytes_min]
            else:
                view = server.receive_view
        self._handed = view
        return view

    def _large_buffer(self) -> memoryview:
        """The rest of the large frame's buffer, grown first by the room granted for it.  (Growing is
        done here, not in ``buffer_updated``: the transport no longer uses the view it had then.)"""
        large = self._large
        assert large is not None
        previous = self._large_view
        if previous is not None:
            previous.release()  # (a view still exported would forbid resizing the buffer)
        filled = self._large_filled
        growth = self._large_growth
        if not growth and filled >= self._large_capacity:
            # Asked for more without room granted (a transport that reads while paused): a little,
            # counted, so that what arrives is received as it arrives and no more.
            growth = min(self._large_size - filled, _PRIVATE_READ_BYTES)
            self._charge_receive(growth)
        if growth:  # (never for a pooled buffer: it holds the whole frame)
            large += bytes(growth)  # (realloc: usually in place; the zeros are overwritten as bytes arrive)
            self._large_growth = 0
            self._large_capacity = len(large)
        view = self._large_view = memoryview(large)[filled:self._large_capacity]
        return view

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        server = self._server
        server.receiving = True
        try:
            self._last_received = self._clock.monotonic()
            handed = self._handed
            assert handed is not None
            if self._large is not None:
                self._large_received(nbytes)
            elif self._unauthenticated is not None:
                self._unauthenticated += handed[:nbytes]
                self._drain_unauthenticated()
            else:
                self._receive(handed[:nbytes])
            if not self._closing:
                self._after_read()
        finally:
            server.receiving = False

    def _receive(self, view: memoryview) -> None:
        """Decode the bytes of an authenticated connection; a large frame that starts and does not end
        in them is received into a buffer of its own (see "Receiving")."""
        whole = self._whole_frames_end(view)
        if whole is None:
            self._feed(view)
        else:
            # A large frame starts at ``whole`` and does not end in this read: decode what comes
            # before it, and receive the rest of it straight into a buffer of its own.
            self._feed(view[:whole])
            if self._closing:
                return
            self._start_large(view[whole:])
            return
        decoder = self._decoder
        if decoder.pending_bytes >= FRAME_HEADER_LENGTH and not self._closing:
            pending = decoder.pending_frame_length
            if pending is not None and pending >= _LARGE_FRAME_BYTES:
                # The decoder holds the start of a large frame (its header came in pieces, or after a
                # frame it was finishing): take it over, so that it is not gathered piece by piece.
                self._start_large(memoryview(decoder.take_pending()))

    def _start_large(self, head: memoryview) -> None:
        """Begin receiving a large frame of which ``head`` (its header and more) arrived: into a buffer
        of what arrived plus room for as much again (at least ``SERVER_LARGE_FRAME_GROWTH_MIN_BYTES``)
        -- never the length the frame announces -- if the receive budget grants that room; else of
        just what arrived, and stop reading until room is granted."""
        self._count_small()  # (``head`` may be what the decoder or the bytes before authentication held)
        held = len(head)
        header_length, = _LENGTH.unpack_from(head, 4)
        size = FRAME_HEADER_LENGTH + header_length
        budget = self._server.receive_budget
        pooled = self._server.frame_pool.take(size)
        if pooled is not None:  # the buffer of an earlier frame, long enough for all of this one
            if budget.take(self, self._buffered, len(pooled)):
                self._buffered += len(pooled)
                pooled[:held] = head
                self._large, self._large_size, self._large_filled, self._large_capacity = pooled, size, held, size
                return
            self._server.frame_pool.give(pooled)  # (no room for it now)
        room = min(size, held + max(held, limits.SERVER_LARGE_FRAME_GROWTH_MIN_BYTES)) - held
        capacity = held
        self._charge_receive(held)
        if budget.take(self, self._buffered, room):
            self._buffered += room
            capacity += room
        else:
            self._receive_waiting = True
        large = bytearray(capacity)
        large[:held] = head
        self._large, self._large_size, self._large_filled, self._large_capacity = large, size, held, capacity

    def _large_received(self, nbytes: int) -> None:
        large = self._large
        assert large is not None
        filled = self._large_filled = self._large_filled + nbytes
        size = self._large_size
        if filled < size:
            if filled == self._large_capacity:
                self._ask_for_room()
            return
        self._large = None
        self._large_view = None  # (the transport still holds that view for a moment: it must not be released)
        with memoryview(large) as whole:
            self._feed(whole[:size])
        self._server.receive_budget.finish(self)  # (first: the room given back may go to a waiter past the total)
        self._give_back_receive(len(large))
        self._server.frame_pool.give(large)  # (for the next large frame, of this connection or another)

    def _ask_for_room(self) -> None:
        """The large frame's buffer is full and the frame is not: grant it room to grow (to twice what
        arrived, by at least ``SERVER_LARGE_FRAME_GROWTH_MIN_BYTES``, at most to the frame's end), or
        wait for room."""
        large = self._large
        assert large is not None
        filled = self._large_filled
        room = min(self._large_size, filled + max(filled, limits.SERVER_LARGE_FRAME_GROWTH_MIN_BYTES)) - len(large)
        assert room > 0, "a pooled buffer holds its whole frame"
        if self._server.receive_budget.take(self, self._buffered, room):
            self._buffered += room
            self._large_growth = room
            self._receive_waiting = False
        else:
            self._receive_waiting = True

    def retry_receive(self) -> None:
        """The server's receive budget has room again: take some if this connection waits for it."""
        if self._closing:
            self._server.receive_budget.finish(self)
            return
        if self._receive_waiting and self._large is not None:
            self._ask_for_room()
            if not self._receive_waiting:
                self._update_reading()

    def _drain_unauthenticated(self) -> None:
        """Decode, one frame at a time, the bytes that arrived before authentication: each frame must
        fit ``config.unauthenticated_frame_bytes_max``, and once a request authenticates the connection
        the rest goes the usual way.  A frame too large for now waits while requests that may yet
        authenticate the connection are in flight (reading stops meanwhile); with none, it is refused
        and the connection closed."""
        pending = self._unauthenticated
        assert pending is not None
        self._unauthenticated_blocked = False
        size = len(pending)
        position = 0
        limit = self._decoder.frame_length_max
        with memoryview(pending) as view:
            while not self._closing and not self._authenticated and not self._backlog \
                    and size - position >= FRAME_HEADER_LENGTH:
                type_code, length = _HEADER.unpack_from(view, position)
                known = type_code in COMMAND_TYPES
                if known and 0 <= length <= limit:
                    end = position + FRAME_HEADER_LENGTH + length
                    if end > size:
                        break  # the rest of the frame has not arrived
                elif known and limit < length <= FRAME_LENGTH_MAX and self._requests:
                    self._unauthenticated_blocked = True  # (a request in flight may authenticate us)
                    break
                else:
                    end = position + FRAME_HEADER_LENGTH  # the decoder rejects the header itself
                self._feed(view[position:end])
                position = end
            rest = view[position:]
            if self._closing:
                return
            if not self._authenticated:
                if position:
                    self._unauthenticated = bytearray(rest)
                return
            self._unauthenticated = None
            if rest:
                self._receive(rest)

    def _authenticate(self) -> None:
        """A request's token was accepted (or authentication is off and the peer said Hello): frames
        up to the wire's limit are welcome from now on."""
        self._authenticated = True
        self._decoder.frame_length_max = FRAME_LENGTH_MAX

    def _after_read(self) -> None:
        """Count what the read left buffered, note whether a frame is in progress, and decide whether
        to read on."""
        small = self._count_small()
        if self._large is None and not small:
            self._frame_started_at = None
        elif self._frame_started_at is None or self._completed_frame:
            self._frame_started_at = self._last_received  # (this read finished a frame and began another)
        self._completed_frame = False
        self._update_reading()

    def _count_small(self) -> int:
        """Charge (or give back) the change in the small buffered bytes -- the decoder's unfinished
        frame, the bytes not decoded before authentication; return them."""
        unauthenticated = self._unauthenticated
        small = self._decoder.pending_bytes + (len(unauthenticated) if unauthenticated is not None else 0)
        counted = self._small_buffered
        if small != counted:
            self._small_buffered = small
            if small > counted:
                self._charge_receive(small - counted)
            else:
                self._give_back_receive(counted - small)
        return small

    def _charge_receive(self, amount: int) -> None:
        self._buffered += amount
        self._server.receive_budget.charge(amount)

    def _give_back_receive(self, amount: int) -> None:
        if amount:
            self._buffered -= amount
            budget = self._server.receive_budget
            budget.give_back(amount)
            if budget.waiting:
                self._server.on_receive_released()

    @property
    def receive_buffered_bytes(self) -> int:
        """Bytes this connection holds of partly received frames (charged to the receive budget)."""
        return self._buffered

    def _whole_frames_end(self, view: memoryview) -> int | None:
        """Where a frame of at least ``_LARGE_FRAME_BYTES`` starts that ``view`` holds only the start
        of, if the decoder is between frames; else None (the decoder takes everything as it is: small
        frames it buffers cost little to copy, and it rejects bad headers itself)."""
        if self._decoder.pending_bytes:
            return None
        size = len(view)
        position = 0
        header = _HEADER.unpack_from
        while size - position >= FRAME_HEADER_LENGTH:
            _type_code, length = header(view, position)
            if not 0 <= length <= FRAME_LENGTH_MAX:
                return None
            end = position + FRAME_HEADER_LENGTH + length
            if end > size:
                return position if FRAME_HEADER_LENGTH + length >= _LARGE_FRAME_BYTES else None
            position = end
        return None

    def _feed(self, data: memoryview) -> None:
        try:
            commands = self._decoder.feed(data)
        except WireProtocolError as error:
            self._abort(f"malformed input ({type(error).__name__}: {error})")
            return
        if commands:
            self._last_frame_at = self._last_received
            self._completed_frame = True
            self._backlog.extend(commands)
            self._run_backlog()

    def _run_backlog(self) -> None:
        """Dispatch decoded commands in order until something says pause: then the rest wait (at most
        what one read decoded) until it says resume, so every limit holds per command, not per read."""
        if self._dispatching:
            return  # (a release inside a dispatch re-checks this connection: the outer loop goes on)
        self._dispatching = True
        backlog = self._backlog
        try:
            while backlog and not self._closing and not self._must_pause():
                self._dispatch(backlog.popleft())
        except _Closed:
            backlog.clear()
        finally:
            self._dispatching = False

    def eof_received(self) -> bool:
        pending = self._decoder.pending_bytes or self._large_filled * (self._large is not None) \
            or len(self._unauthenticated or b"")
        if pending:
            self._abort(f"the peer hung up inside a frame ({pending} bytes of it)")
        return False  # close our side too: there is no half-open use in this protocol

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self.close_reason is None:
            self.close_reason = "closed by the peer" if exc is None else f"lost: {exc!r}"
        if not self._lost.done():
            self._lost.set_result(None)

    # --- lifecycle -------------------------------------------------------------------------------------

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

    def overdue(self, now: float) -> str | None:
        """Why the connection must be closed at ``now``, if a deadline has passed:

        * no Hello within ``hello_timeout_seconds`` of connecting;
        * a frame begun ``frame_timeout_seconds`` ago still incomplete -- a peer dripping a frame
          (time the server itself stopped reading, for backpressure, does not count; time it stopped
          because the peer does not read its replies does);
        * nothing in flight (no request, no append unanswered) and no whole frame -- a KeepAlive is
          one -- for ``config.idle_timeout``;
        * nothing at all received for ``KEEPALIVE_MISSED_MAX`` keep-alive intervals (a dead peer).

        The last two wait while the server is not reading from the peer: its keep-alives cannot
        arrive then."""
        config = self._config
        if self._version is None and now - self._connected_at >= config.hello_timeout_seconds:
            return f"no Hello within {config.hello_timeout_seconds:g} s"
        started = self._frame_started_at
        if started is not None:
            elapsed = now - started
            if self._reading_paused and not self._paused_by_peer and self._paused_at is not None:
                elapsed -= now - self._paused_at  # (the server's own pause so far)
            if elapsed >= config.frame_timeout_seconds:
                return f"a frame begun {elapsed:.1f} s ago is still incomplete ({self._frame_progress()})"
        if self._reading_paused:
            return None
        quiet = now - self._last_frame_at
        if quiet >= config.idle_timeout and not (self._requests or self._in_flight_bytes or self._backlog):
            return f"idle: no request or keep-alive for {quiet:.1f} s"
        silence = now - self._last_received
        if silence >= limits.KEEPALIVE_MISSED_MAX * config.keepalive_interval_seconds:
            return f"nothing received for {silence:.1f} s"
        return None

    def _frame_progress(self) -> str:
        if self._large is not None:
            return f"{self._large_filled} of {self._large_size} bytes arrived"
        return f"{self._small_buffered} bytes arrived"

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

    # --- backpressure -----------------------------------------------------------------------------------

    def _charge(self, amount: int) -> None:
        self._in_flight_bytes += amount
        self._server.budget.total += amount

    def _release(self, amount: int) -> None:
        if amount:
            self._in_flight_bytes -= amount
            self._server.budget.total -= amount
            self._server.on_released()

    def _release_all(self) -> None:
        self._server.transients.connection_closed(self, self._clock.monotonic())
        held = self._in_flight_bytes
        self._writers.clear()
        self._parts.clear()
        self._parts_bytes.clear()
        self._release(held)
        # What was partly received goes back to the receive budget (the buffers go with this object,
        # a large frame's to the pool).
        if self._large is not None:
            self._server.frame_pool.give(self._large)
        self._large = self._unauthenticated = None
        self._decoder = Decoder()
        self._small_buffered = 0
        self._receive_waiting = False
        self._server.receive_budget.finish(self)
        self._give_back_receive(self._buffered)
        self._server.forget(self)

    def _must_pause(self) -> bool:
        return (self._task_group is None or self._writing_paused or self._draining
                or self._requests >= self._config.connection_requests_max
                or self._read_bytes >= self._config.connection_read_bytes_max
                or self._server.budget.must_pause(self._in_flight_bytes))

    def _update_reading(self) -> None:
        if self._closing:
            return
        if self._backlog:
            self._run_backlog()
        if self._unauthenticated and not self._backlog and not self._dispatching:
            self._drain_unauthenticated()  # (what waited for the backlog, or for authentication)
            if self._closing:
                return
            self._count_small()
        pause = bool(self._backlog) or self._must_pause() or self._receive_waiting or self._unauthenticated_blocked
        if pause != self._reading_paused:
            self._set_reading(not pause)
        if pause and not self._writing_paused and self._task_group is not None:
            self._server.watch_paused(self)

    def recheck_reading(self) -> None:
        """The server's budget changed: resume if nothing holds this connection back any more."""
        self._update_reading()

    def _set_reading(self, reading: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        now = self._clock.monotonic()
        if reading:
            transport.resume_reading()
            paused_at = self._paused_at
            if paused_at is not None:
                # The frame deadline does not count the server's own pause; the idle and silence
                # deadlines start again (the peer's keep-alives could not be read meanwhile).
                if not self._paused_by_peer and self._frame_started_at is not None:
                    self._frame_started_at += now - paused_at
                self._last_received = self._last_frame_at = now
                self._paused_at = None
        else:
            transport.pause_reading()
            self._paused_at = now
            self._paused_by_peer = self._writing_paused
        self._reading_paused = not reading

    # --- sending ------------------------------------------------------------------------------------------

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

    # --- dispatch -----------------------------------------------------------------------------------------

    def _dispatch(self, command: Command) -> None:
        kind = type(command)
        if kind is AppendBlock:
            self._on_append_block(command)  # type: ignore[arg-type]
            return
        if self._version is None:
            if kind is not Hello:
                self._fail_protocol(f"{kind.__name__} before Hello")
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
        if reply is not None:
            self._send(reply)
        self._abort(reason)
        raise _Closed

    def _on_hello(self, hello: Hello) -> None:
        try:
            self._version = negotiate(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION, hello.high_version, hello.low_version)
        except WireProtocolError as error:
            self._fail_protocol(f"incompatible: {error}")
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

    def _container(self, request_id: int, segment: str) -> SegmentContainer | None:
        """The container serving ``segment``, or None after replying why there is none."""
        try:
            return self._server.container_for(segment)
        except WrongHostError as error:
            self._send(self._error_reply(request_id, segment, error))
        except MillstreamError as error:  # the container is restarting or stopped; a bad name
            self._send(ErrorMessage(request_id, segment, error_code_of(error), _text(error)))
        return None

    # --- appends -------------------------------------------------------------------------------------------

    def _on_setup_append(self, command: SetupAppend) -> None:
        request_id, segment = command.request_id, command.segment
        if not self._authorize(request_id, command.token, segment, _APPEND):
            return
        container = self._container(request_id, segment)
        if container is None:
            return
        existing = self._writers.get(command.writer_id)
        if existing is None and len(self._writers) >= self._config.connection_writers_max:
            self._send(ErrorMessage(request_id, segment, error_code_of(InvalidArgumentError()),
                                    f"this connection has {len(self._writers)} writers set up already; "
                                    f"the limit is {self._config.connection_writers_max}"))
            return
        if existing is not None and not existing.idle:
            self._send(ErrorMessage(request_id, segment, error_code_of(InvalidArgumentError()),
                                    f"writer {command.writer_id} has appends in flight on this connection"))
            return
        try:
            info = container.get_info(segment)
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        if is_transient_segment(segment):
            try:  # (re-)attaches this connection: a writer that reconnected in time carries on
                self._server.transients.attach(segment, self, command.writer_id, self._clock.monotonic())
            except TransientSegmentError as error:
                self._send(self._error_reply(request_id, segment, error))
                return
        # A sealed segment still gets AppendSetup: the writer learns what is stored, and its next
        # block is answered SegmentIsSealed.
        last = info.attributes.get(command.writer_id.int, NULL_ATTRIBUTE_VALUE)
        self._writers[command.writer_id] = WriterSession(command.writer_id, segment, last)
        self._drop_parts(command.writer_id)
        self._send(AppendSetup(request_id, segment, command.writer_id, last))

    def _session(self, writer_id: UUID, request_id: int) -> WriterSession:
        session = self._writers.get(writer_id)
        if session is None:
            self._fail_protocol(f"an append for writer {writer_id} without SetupAppend",
                                ErrorMessage(request_id, "", error_code_of(ProtocolError()),
                                             f"writer {writer_id} did not SetupAppend on this connection"))
        return session  # type: ignore[return-value]

    def _on_append_block(self, command: AppendBlock) -> None:
        if self._version is None:
            self._fail_protocol("AppendBlock before Hello")
        session = self._session(command.writer_id, command.request_id)
        self._accept_block(session, command.request_id, command.last_event_number, command.event_count,
                           command.data, None)

    def _accept_block(self, session: WriterSession, request_id: int, last_event_number: int,
                      event_count: int | None, data: bytes, expected_offset: int | None, *, raw: bool = False) -> None:
        writer_id = session.writer_id
        if last_event_number <= session.last_received:
            self._fail_protocol(
                f"writer {writer_id}: event number {last_event_number} does not follow {session.last_received}",
                InvalidEventNumber(request_id, writer_id, last_event_number))
        if raw:  # a large event's chunk or a byte stream's bytes: not events, so nothing to scan
            if is_transient_segment(session.segment):
                self._server.transients.touch(session.segment, self._clock.monotonic())
            else:
                self._server.statistics.record(session.segment, len(data), 0)
            charge = len(data) + self._config.append_overhead_bytes
            block = PendingBlock(request_id, last_event_number, data, expected_offset, charge, raw=True)
            self._charge(charge)
            if session.accept(block):
                self._submit(session, block)
            else:
                self._answer(session)
            return
        try:
            count, longest = scan_events(data)
        except WireProtocolError as error:
            self._fail_protocol(f"writer {writer_id}: malformed events: {error}",
                                ErrorMessage(request_id, session.segment, error_code_of(error), _text(error)))
        if event_count is not None and count != event_count:
            self._fail_protocol(f"writer {writer_id}: a block announces {event_count} events and holds {count}",
                                InvalidEventNumber(request_id, writer_id, last_event_number))
        if longest > limits.EVENT_LENGTH_MAX_BYTES:
            message = f"an event of {longest} bytes exceeds {limits.EVENT_LENGTH_MAX_BYTES}"
            self._fail_protocol(f"writer {writer_id}: {message}",
                                ErrorMessage(request_id, session.segment, error_code_of(_PAYLOAD_TOO_LARGE), message))
        self._server.statistics.record(session.segment, len(data), count)  # (per block: auto-scaling's rates)
        charge = len(data) + self._config.append_overhead_bytes
        block = PendingBlock(request_id, last_event_number, data, expected_offset, charge)
        self._charge(charge)
        if session.accept(block):
            self._submit(session, block)
        else:
            self._answer(session)

    def _submit(self, session: WriterSession, block: PendingBlock) -> None:
        try:
            container = self._server.container_for(session.segment)
        except MillstreamError as error:
            self._abort(f"writer {session.writer_id}: cannot append to {session.segment!r}: {error}")
            raise _Closed from None
        if self._task_group is None or self._closing:
            return
        updates = () if block.raw else (AttributeUpdate(session.writer_id.int, _REPLACE_IF_EQUALS,
                                                        block.last_event_number, block.comparison),)
        if not self._waiting_appends:
            # The fast path: no task per block, the operation's future calls back.  Not while an
            # append waits in a task (throttled, or the queue full): a later block must not overtake it.
            try:
                future = container.append_at_once(session.segment, block.data, updates,
                                                  expected_offset=block.expected_offset)
            except Exception as error:  # answered on a later turn, as the task path would: not from inside dispatch
                future = asyncio.get_running_loop().create_future()
                future.set_exception(error)
            if future is not None:
                future.add_done_callback(functools.partial(self._on_appended, container, session, block))
                return
        self._waiting_appends += 1
        self._spawn(self._append(container, session, block, updates))

    async def _append(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                      updates: tuple[AttributeUpdate, ...]) -> None:
        """An append that may have to wait (Tier 2 lags, or the container's queue is full)."""
        try:
            offset = await container.append(session.segment, block.data, updates,
                                            expected_offset=block.expected_offset)
        except Exception as error:
            self._appended(container, session, block, None, error)
        else:
            self._appended(container, session, block, offset, None)
        finally:
            self._waiting_appends -= 1

    def _on_appended(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                     future: asyncio.Future[int]) -> None:
        if future.cancelled():  # (nothing here cancels it; a container that stops fails it instead)
            self._appended(container, session, block, None, ContainerUnavailableError("the append was cancelled"))
            return
        error = future.exception()
        try:
            self._appended(container, session, block, None if error is not None else future.result(), error)
        except Exception:  # a bug: this runs as a loop callback, so say so here and end the connection
            self._server.log.error("%s: handling an append's outcome failed", self.peer,
                                   exc_info=sys.exc_info()[1])
            self._abort("internal error while answering an append")

    def _appended(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                  offset: int | None, error: BaseException | None) -> None:
        """The container stored ``block`` at ``offset``, or refused it with ``error``: answer what may be."""
        if error is None:
            assert offset is not None
            session.succeeded(block, offset)
        elif isinstance(error, BadAttributeUpdateError):
            session.failed(block, Failure.COMPARISON)
        elif isinstance(error, BadOffsetError):
            session.failed(block, Failure.OFFSET)
        elif isinstance(error, StreamSegmentSealedError):
            session.failed(block, Failure.SEALED, _length_or_zero(container, session.segment))
        elif isinstance(error, StreamSegmentNotExistsError):
            session.failed(block, Failure.GONE)
        else:  # ContainerUnavailableError, or anything unexpected: the writer reconnects
            if not self._closing:
                self._abort(f"writer {session.writer_id}: append to {session.segment!r} failed: {error!r}")
            return
        if self._closing or self._writers.get(session.writer_id) is not session:
            return
        try:
            self._answer(session)
        except _Closed:
            return
        self._update_reading()

    def _answer(self, session: WriterSession) -> None:
        """Send what ``session`` may answer now; submit what it wants re-submitted."""
        answered, to_submit = session.drain()
        released = 0
        close: str | None = None
        for block in answered:
            released += block.charge
            reply = block.reply
            assert reply is not None
            self._send(reply)
            if type(reply) is InvalidEventNumber:
                close = (f"writer {session.writer_id}: another writer with the same id wrote to "
                         f"{session.segment!r} (event number {block.last_event_number})")
        self._release(released)
        if close is not None:
            self._abort(close)
            raise _Closed
        for block in to_submit:
            self._submit(session, block)
        self._check_quiet()

    def _on_conditional_append(self, command: ConditionalAppend) -> None:
        session = self._session(command.writer_id, command.request_id)
        if command.expected_offset < 0:
            self._send(ErrorMessage(command.request_id, session.segment, error_code_of(InvalidArgumentError()),
                                    f"expected_offset {command.expected_offset} is negative"))
            return
        self._accept_block(session, command.request_id, command.event_number, None, command.data,
                           command.expected_offset)

    def _on_conditional_block_end(self, command: ConditionalBlockEnd) -> None:
        session = self._session(command.writer_id, command.request_id)
        if command.expected_offset < 0:
            self._send(ErrorMessage(command.request_id, session.segment, error_code_of(InvalidArgumentError()),
                                    f"expected_offset {command.expected_offset} is negative"))
            return
        self._accept_block(session, command.request_id, command.event_number, None, command.data,
                           command.expected_offset, raw=True)

    def _on_append_block_part(self, command: AppendBlockPart) -> None:
        session = self._session(command.writer_id, -1)
        held = self._parts_bytes.get(command.writer_id, 0) + len(command.data)
        if held > limits.APPEND_LENGTH_MAX_BYTES:
            self._fail_protocol(f"writer {session.writer_id}: a streamed block exceeds "
                                f"{limits.APPEND_LENGTH_MAX_BYTES} bytes")
        self._parts.setdefault(command.writer_id, []).append(command.data)
        self._parts_bytes[command.writer_id] = held
        self._charge(len(command.data))

    def _drop_parts(self, writer_id: UUID) -> bytes:
        parts = self._parts.pop(writer_id, [])
        self._release(self._parts_bytes.pop(writer_id, 0))
        return b"".join(parts)

    def _on_append_block_end(self, command: AppendBlockEnd) -> None:
        session = self._session(command.writer_id, command.request_id)
        head = self._drop_parts(command.writer_id)
        data = head + command.data if head else command.data
        if len(data) != command.size_of_whole_events:
            self._fail_protocol(
                f"writer {session.writer_id}: a streamed block of {len(data)} bytes announces "
                f"{command.size_of_whole_events}",
                ErrorMessage(command.request_id, session.segment, error_code_of(ProtocolError()),
                             "the block's parts do not add up to size_of_whole_events"))
        if len(data) > limits.APPEND_LENGTH_MAX_BYTES:
            self._fail_protocol(f"writer {session.writer_id}: a streamed block exceeds the append limit")
        self._accept_block(session, command.request_id, command.last_event_number, command.event_count, data, None)

    # --- reads and administration ----------------------------------------------------------------------

    def _request(self, coroutine: Coroutine[Any, Any, None], *, read_bytes: int = 0) -> None:
        self._requests += 1
        self._read_bytes += read_bytes
        self._spawn(self._counted(coroutine, read_bytes), read=read_bytes > 0)

    async def _counted(self, coroutine: Coroutine[Any, Any, None], read_bytes: int) -> None:
        try:
            await coroutine
        finally:
            self._requests -= 1
            self._read_bytes -= read_bytes
            if not self._closing:
                self._update_reading()
                self._check_quiet()

    def _on_read_segment(self, command: ReadSegment) -> None:
        if not self._authorize(command.request_id, command.token, command.segment, _READ):
            return
        container = self._container(command.request_id, command.segment)
        if container is not None:
            reserved = max(1, min(command.suggested_length, limits.READ_LENGTH_MAX_BYTES))
            self._request(self._read(container, command), read_bytes=reserved)

    async def _read(self, container: SegmentContainer, command: ReadSegment) -> None:
        length = min(command.suggested_length, limits.READ_LENGTH_MAX_BYTES)
        wait_seconds = min(max(command.wait_ms, 0) / 1000.0, limits.TAIL_READ_WAIT_MAX_SECONDS)
        try:
            result = await container.read(command.segment, command.offset, length, wait_seconds=wait_seconds)
        except Exception as error:
            self._send(self._error_reply(command.request_id, command.segment, error, container))
            return
        self._send(SegmentRead(command.request_id, command.segment, result.offset, result.at_tail,
                               result.end_of_segment, result.data))

    def _on_get_segment_info(self, command: GetSegmentInfo) -> None:
        request_id, segment = command.request_id, command.segment
        if not self._authorize(request_id, command.token, segment, _READ):
            return
        container = self._container(request_id, segment)
        if container is None:
            return
        try:
            info = container.get_info(segment)
        except StreamSegmentNotExistsError:
            self._send(SegmentInfo(request_id, segment, False, False, False, 0, 0, 0))
            return
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        self._send(SegmentInfo(request_id, segment, True, info.sealed, False, info.start_offset, info.length,
                               info.last_modified_ms))

    def _on_get_segment_attribute(self, command: GetSegmentAttribute) -> None:
        request_id, segment = command.request_id, command.segment
        if not self._authorize(request_id, command.token, segment, _READ):
            return
        container = self._container(request_id, segment)
        if container is None:
            return
        try:
            value = container.get_info(segment).attributes.get(command.attribute_id, NULL_ATTRIBUTE_VALUE)
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        self._send(SegmentAttribute(request_id, value))

    def _administer(self, request_id: int, segment: str, token: str,
                    operation: Coroutine[Any, Any, Command], what: SegmentOperation) -> None:
        """Run an administrative ``operation`` (after the token and ownership checks) as a request."""
        if not self._authorize(request_id, token, segment, what) \
                or self._container(request_id, segment) is None:
            operation.close()
            return
        self._request(self._reply_with(request_id, segment, operation))

    async def _reply_with(self, request_id: int, segment: str, operation: Coroutine[Any, Any, Command]) -> None:
        try:
            reply = await operation
        except Exception as error:
            reply = self._error_reply(request_id, segment, error)
        self._send(reply)

    def _on_create_segment(self, command: CreateSegment) -> None:
        async def create() -> Command:
            if is_transient_segment(command.segment):
                raise TransientSegmentError(f"{command.segment!r} is a transient segment's name: only "
                                            "CreateTransientSegment makes those")
            # Segments clients create by name hold events (event writers write there): their
            # truncation lands on event boundaries.  A byte-stream writer clears this when it opens one.
            await self._server.container_for(command.segment).create_segment(command.segment,
                                                                             EVENT_SEGMENT_ATTRIBUTES)
            return SegmentCreated(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, create(), SegmentOperation.CREATE)

    def _on_create_transient_segment(self, command: CreateTransientSegment) -> None:
        parent, writer_id = command.parent, command.writer_id
        transients = self._server.transients

        async def create() -> Command:
            container = self._server.container_for(parent)
            info = container.get_info(parent)  # (raises: no such segment)
            if info.sealed:
                raise StreamSegmentSealedError(f"segment {parent!r} is sealed: it takes no large events")
            for _ in range(limits.TRANSIENT_SEGMENT_ATTRIBUTES_MAX):
                name = transients.new_name(parent, writer_id)
                try:
                    await container.create_segment(name)
                except StreamSegmentExistsError:
                    continue  # a leftover of an earlier run under that name: take the next one
                if not self._closing:
                    transients.created(name, parent, writer_id, self, self._clock.monotonic())
                else:  # the writer is gone already: its grace period starts now
                    transients.adopt(name, self._clock.monotonic())
                return SegmentCreated(command.request_id, name)
            raise TransientSegmentError(f"no free transient segment name for {parent!r}")
        self._administer(command.request_id, parent, command.token, create(), SegmentOperation.CREATE_TRANSIENT)

    def _on_seal_segment(self, command: SealSegment) -> None:
        async def seal() -> Command:
            _refuse_transient(command.segment, "sealed")
            with contextlib.suppress(StreamSegmentSealedError):  # sealing is idempotent on the wire
                await self._server.container_for(command.segment).seal(command.segment)
            return SegmentSealed(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, seal(), SegmentOperation.SEAL)

    def _on_truncate_segment(self, command: TruncateSegment) -> None:
        async def truncate() -> Command:
            _refuse_transient(command.segment, "truncated")
            await self._server.container_for(command.segment).truncate(command.segment, command.offset)
            return SegmentTruncated(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, truncate(), SegmentOperation.TRUNCATE)

    def _on_delete_segment(self, command: DeleteSegment) -> None:
        async def delete() -> Command:
            segment = command.segment
            try:
                await self._server.container_for(segment).delete(segment)
            except StreamSegmentNotExistsError:
                if is_transient_segment(segment):
                    self._server.transients.deleted(segment)  # (gone anyway: forget it)
                raise
            if is_transient_segment(segment):
                self._server.transients.deleted(segment)  # an abort
            return SegmentDeleted(command.request_id, segment)
        self._administer(command.request_id, command.segment, command.token, delete(), SegmentOperation.DELETE)

    def _on_merge_segments(self, command: MergeSegments) -> None:
        request_id, target, source = command.request_id, command.target, command.source
        if not self._authorize(request_id, command.token, source, SegmentOperation.MERGE_FROM) \
                or self._container(request_id, source) is None:
            return

        async def merge() -> Command:
            check_merge(target, source)
            container = self._server.container_for(target)
            if self._server.container_for(source) is not container:
                raise InvalidArgumentError(f"{source!r} and {target!r} live in different containers; "
                                           "only a segment's own hidden segments can be merged into it")
            transients = self._server.transients
            transient = is_transient_segment(source)
            if transient:
                done = transients.merge_outcome(source)
                if done is not None and done[0] == target:  # a retry after a lost reply
                    return SegmentsMerged(request_id, target, source, done[1])
                if is_transient_segment(target):
                    transients.touch(target, self._clock.monotonic())
            try:
                with contextlib.suppress(StreamSegmentSealedError):
                    await container.seal(source)
                source_length = container.get_info(source).length
                offset = await container.merge(target, source)
            except StreamSegmentNotExistsError:
                done = transients.merge_outcome(source) if transient else None
                if done is not None and done[0] == target:  # the first attempt won the race
                    return SegmentsMerged(request_id, target, source, done[1])
                raise
            if transient:
                transients.merged(source, target, offset + source_length)
            return SegmentsMerged(request_id, target, source, offset + source_length)
        self._administer(request_id, target, command.token, merge(), SegmentOperation.MERGE_INTO)

    def _on_update_segment_attribute(self, command: UpdateSegmentAttribute) -> None:
        async def update() -> Command:
            _refuse_transient(command.segment, "given attribute updates")
            container = self._server.container_for(command.segment)
            try:
                await container.update_attributes(command.segment, (AttributeUpdate(
                    command.attribute_id, _REPLACE_IF_EQUALS, command.new_value, command.expected_value),))
            except BadAttributeUpdateError:
                return SegmentAttributeUpdated(command.request_id, False)
            return SegmentAttributeUpdated(command.request_id, True)
        self._administer(command.request_id, command.segment, command.token, update(),
                         SegmentOperation.UPDATE_ATTRIBUTE)

    # --- the controller ---------------------------------------------------------------------------------------

    def _on_controller_request(self, command: ControllerRequest) -> None:
        controller = self._server.controller
        if controller is None or not controller.knows(command.method):
            what = "ControllerRequest" if controller is None else f"ControllerRequest {command.method[:100]!r}"
            self._server.log.info("connection %s: unsupported %s (request %d)", self.peer,
                                  what, command.request_id)
            self._send(OperationUnsupported(command.request_id, what))
            return
        if len(command.body) > limits.CONTROLLER_REQUEST_BODY_BYTES_MAX:
            self._send(ErrorMessage(command.request_id, "", error_code_of(_PAYLOAD_TOO_LARGE),
                                    f"a controller request body of {len(command.body)} bytes exceeds "
                                    f"{limits.CONTROLLER_REQUEST_BODY_BYTES_MAX}"))
            return
        self._request(self._call_controller(controller, command))

    async def _call_controller(self, controller: ControllerEndpoint, command: ControllerRequest) -> None:
        try:
            body = await controller.handle(command.method, command.body)
        except Exception as error:
            self._send(self._error_reply(command.request_id, "", error))
            return
        if not self._authenticated and not self._closing:
            self._authenticate()  # (the controller checks the request's token with the server's authorizer)
        self._send(ControllerReply(command.request_id, body))

    # --- errors ----------------------------------------------------------------------------------------------

    def _error_reply(self, request_id: int, segment: str, error: BaseException,
                     container: SegmentContainer | None = None) -> Command:
        """The reply a failed request gets: its own command where the protocol has one, else an
        ``ErrorMessage`` with the error's code.  Unexpected errors are logged (once)."""
        entry = reply_of_error(error)
        if entry is not None and entry.to_reply is not None:
            position = 0
            if entry.position is not None:
                found = self._safe_container(segment, container)
                if found is not None:
                    with contextlib.suppress(MillstreamError):
                        position = getattr(found.get_info(segment), entry.position)
            return entry.to_reply(request_id, segment, _text(error), position)
        if not isinstance(error, MillstreamError):
            self._server.log.error("connection %s: request %d on %s failed unexpectedly", self.peer,
                                   request_id, quote(segment), exc_info=error)
        return ErrorMessage(request_id, segment, error_code_of(error), _text(error))

    def _safe_container(self, segment: str, container: SegmentContainer | None) -> SegmentContainer | None:
        if container is not None:
            return container
        try:
            return self._server.container_for(segment)
        except MillstreamError:
            return None

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


def _length_or_zero(container: SegmentContainer | None, segment: str) -> int:
    if container is None:
        return 0
    try:
        return container.get_info(segment).length
    except MillstreamError:
        return 0


_PAYLOAD_TOO_LARGE = PayloadTooLargeError()


def _text(error: BaseException | str, limit: int = limits.SERVER_ERROR_TEXT_BYTES_MAX) -> str:
    """The text an error reply carries: the error's message (its class name if it has none), cut to
    ``limit`` UTF-8 bytes so that the reply always fits its string field, whatever it quotes."""
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    if len(text) <= limit // 4:  # (fewer characters cannot make too many bytes)
        return text
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return text
    cut = encoded[:limit - 40].decode("utf-8", "ignore")
    return f"{cut}... (cut from {len(encoded)} bytes)"


def _refuse_transient(segment: str, what: str) -> None:
    """Transient segments are never sealed, truncated or given attribute updates by request (PDP-43):
    their writer owns their bytes, and a merge seals them itself."""
    if is_transient_segment(segment):
        raise TransientSegmentError(f"transient segment {segment!r} cannot be {what}")

_HANDLERS: dict[type[Command], Any] = {
    KeepAlive: Connection._on_keep_alive,
    SetupAppend: Connection._on_setup_append,
    AppendBlock: Connection._on_append_block,
    ConditionalAppend: Connection._on_conditional_append,
    AppendBlockPart: Connection._on_append_block_part,
    AppendBlockEnd: Connection._on_append_block_end,
    ReadSegment: Connection._on_read_segment,
    GetSegmentInfo: Connection._on_get_segment_info,
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
