"""Ingress and backpressure of a server connection: the transport's reading callbacks, the
decoder, the receive and in-flight budgets, and the deadlines (``Ingress``, a mixin of
``_connection.Connection``).

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
  (the decoder's ``frame_bytes_max`` says the same).  A larger frame is refused at its header and
  the connection closed -- unless a request that may yet authenticate it is in flight: then reading
  stops until that request is answered, and the frame is judged again.
* A frame of at least ``_LARGE_FRAME_BYTES`` that does not arrive in one read is received straight
  into a buffer of its own (``_start_large``), which grows as its bytes arrive: to at most twice what
  arrived, never past the frame's length, each step granted by the server's ``ReceiveBudget`` (a
  connection whose frame cannot grow stops reading until room is given back).  The decoder does not
  gather it piece by piece; a block's bytes are then copied once out of the frame by the codec and
  once into a DataFrame by the container.  Small frames' partial bytes (in the decoder) and the bytes
  before authentication are counted in the same budget.
* Deadlines (``overdue``, checked by ``Connection._watch_liveness``): a Hello, a started frame, an
  idle connection, a silent one.

The connection's memory is then a few KiB of objects plus what its peer really sent, and a peer that
sends little and slowly is closed by a deadline.
"""

from __future__ import annotations

import struct

from millstream import limits
from millstream.server._connection_state import ConnectionState
from millstream.wire import (
    COMMAND_TYPES,
    FRAME_BYTES_MAX,
    FRAME_HEADER_LENGTH,
    Decoder,
    WireProtocolError,
)

__all__ = ["Ingress"]

_HEADER = struct.Struct(">ii")
_LENGTH = struct.Struct(">i")

#: A frame at least this long that does not arrive in one read is received into a buffer of its own
#: (growing as it arrives, up to its size), then decoded whole: its bytes are not first gathered by
#: the decoder, which would copy them once more (and again each time its buffer grew).
_LARGE_FRAME_BYTES = 64 * 1024

#: A read that cannot use the server's shared receive buffer gets one of its own of this size.
_PRIVATE_READ_BYTES = 64 * 1024


class Ingress(ConnectionState):
    """Receiving and backpressure: the ``Connection``'s methods for them (a mixin over its state)."""

    # --- receiving ------------------------------------------------------------------------------------

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
        limit = self._decoder.frame_bytes_max
        with memoryview(pending) as view:
            while not self._closing and not self._authenticated and not self._backlog \
                    and size - position >= FRAME_HEADER_LENGTH:
                type_code, length = _HEADER.unpack_from(view, position)
                known = type_code in COMMAND_TYPES
                if known and 0 <= length <= limit:
                    end = position + FRAME_HEADER_LENGTH + length
                    if end > size:
                        break  # the rest of the frame has not arrived
                elif known and limit < length <= FRAME_BYTES_MAX and self._requests:
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
        self._decoder.frame_bytes_max = FRAME_BYTES_MAX

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
            if not 0 <= length <= FRAME_BYTES_MAX:
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
            if self._closing:
                backlog.clear()  # (a command closed the connection: nothing decoded after it runs)
        finally:
            self._dispatching = False

    # --- the transport's other callbacks --------------------------------------------------------------

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

    # --- deadlines ------------------------------------------------------------------------------------

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

    # --- backpressure ---------------------------------------------------------------------------------

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
        self._server.forget(self)  # (Ingress is a part of Connection, never alone)

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
