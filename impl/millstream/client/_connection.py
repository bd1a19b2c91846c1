"""One client connection to a segment store: framing, request routing, sessions, keep-alives, timeouts.

Theory of operation.  A ``Connection`` is an ``asyncio.Protocol`` around the sans-I/O codec.  On
connect both sides send ``Hello`` and ``codec.negotiate`` picks the version; until the server's Hello
has arrived nothing else may (a reply before it is a protocol error).  Two kinds of user share a
connection:

* **one-shot requests** (administration, attributes, reads, conditional appends): ``request`` picks
  the next request id (unique and increasing on this connection), sends the command and waits for the
  reply that echoes the id.  Replies may come back in any order.  A request not answered by its
  deadline (the config's request timeout, plus the server-side wait of a tail read) fails with
  ``RequestTimeoutError``; a reply that arrives later is dropped.
* **sessions** (an idempotent writer's append session): long-lived, registered under the request id
  of their ``SetupAppend`` and under their writer id.  Every reply echoing that request id, and every
  ``DataAppended``/``InvalidEventNumber`` naming that writer, goes to the session's ``on_reply``.  A
  session also names the time by which its oldest unacknowledged block must be acknowledged; past it
  the connection is declared broken (the reply was lost, or the server is stuck), so the session
  reconnects and re-sends -- the only way to recover from a lost last acknowledgement.

A reply that answers a request id never issued on this connection, a request-type command from the
server, or bytes the decoder rejects break the protocol: the connection closes.  Closing (for any
reason) fails every one-shot request in flight with ``ConnectionLostError`` and tells every session,
which decide for themselves whether and how to reconnect.

Sending.  Commands are encoded into one outgoing buffer and written once per event-loop turn
(``_flush``), as the server does with its replies: the blocks of many segment writers that close in
one turn leave in one ``send``, so the server wakes once for them, not once per block.

Keep-alives: a ticker on the injected clock sends ``KeepAlive`` when nothing was sent for a
keep-alive interval, and closes the connection when nothing was received for
``limits.KEEPALIVE_MISSED_MAX`` intervals (the server sends keep-alives too, so a live idle server is
never mistaken for a dead one).  The same ticker enforces request and acknowledgement deadlines, so no
per-request timer exists.  Flow control: the client does not stop on ``pause_writing``; what it can
have buffered is bounded by each writer's unacknowledged-bytes budget and by the requests it waits on.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Callable
from typing import Final, Protocol
from uuid import UUID

from millstream import limits
from millstream.client._config import ClientConfig, Endpoint
from millstream.client._replies import ERROR_REPLIES
from millstream.clock import Clock
from millstream.errors import (
    ConnectionLostError,
    InvalidArgumentError,
    MillstreamError,
    ProtocolError,
    RequestTimeoutError,
    TlsHandshakeError,
)
from millstream.wire import codec
from millstream.wire.commands import (
    AppendSetup,
    Command,
    ConditionalCheckFailed,
    ControllerReply,
    DataAppended,
    EventBoundaries,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
)

__all__ = ["Connection", "Session"]

_log = logging.getLogger(__name__)

#: Commands a server may send: replies, error replies and the connection's own commands.
_FROM_SERVER: frozenset[type[Command]] = frozenset({
    Hello, KeepAlive, AppendSetup, DataAppended, ConditionalCheckFailed, SegmentRead, SegmentInfo, SegmentCreated,
    SegmentSealed, SegmentDeleted, SegmentAttribute, SegmentAttributeUpdated, SegmentTruncated, SegmentsMerged,
    ControllerReply, EventBoundaries,
}) | ERROR_REPLIES


#: The first byte of a TLS record a server may answer a non-TLS hello with: an alert, or a handshake.
_TLS_RECORD_TYPES: Final = (b"\x15", b"\x16")


def _tls_failure(endpoint: Endpoint, error: _ssl.SSLError) -> TlsHandshakeError:
    """What a failed TLS handshake means, for the message: an untrusted certificate, a server that does
    not speak TLS, or whatever else OpenSSL said."""
    if isinstance(error, _ssl.SSLCertVerificationError):
        detail = error.verify_message or str(error)
        return TlsHandshakeError(
            f"cannot connect to {endpoint}: the TLS handshake failed: the server's certificate is not trusted "
            f"({detail}); give the CA that signed it (--tls-ca FILE, or an ssl_context that trusts it)")
    reason = error.reason or str(error)
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD"):
        return TlsHandshakeError(
            f"cannot connect to {endpoint}: the server does not speak TLS (the handshake failed: {reason}); "
            "use a tcp:// URI for a plain server")
    return TlsHandshakeError(f"cannot connect to {endpoint}: the TLS handshake failed: {error}")


class Session(Protocol):
    """A long-lived user of a connection (a writer's append session).  Called on the event loop."""

    @property
    def request_id(self) -> int:
        """The request id its replies echo (its ``SetupAppend``'s)."""
        ...

    @property
    def writer_id(self) -> UUID:
        ...

    def on_reply(self, reply: Command) -> None:
        """A reply for this session arrived."""
        ...

    def on_connection_lost(self, error: BaseException) -> None:
        """The connection closed; the session is detached already."""
        ...

    def reply_deadline(self) -> float | None:
        """Clock time by which the session expects a reply (its setup's, or its oldest block's
        acknowledgement), or None if it expects none."""
        ...


class _Pending:
    __slots__ = ("deadline", "future", "what")

    def __init__(self, future: asyncio.Future[Command], deadline: float, what: str) -> None:
        self.future = future
        self.deadline = deadline
        self.what = what


class Connection(asyncio.Protocol):
    """A connection to one server.  Open with ``Connection.open``; every method runs on its event loop."""

    def __init__(self, endpoint: Endpoint, *, clock: Clock, config: ClientConfig,
                 on_closed: Callable[[Connection], None] | None = None) -> None:
        self.endpoint = endpoint
        self._clock = clock
        self._config = config
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._decoder = codec.Decoder()
        self._transport: asyncio.Transport | None = None
        self._outgoing = bytearray()  # encoded commands not yet handed to the transport (see _flush)
        self._flush_scheduled = False
        self._hello: asyncio.Future[int] = self._loop.create_future()
        self.version: int | None = None
        self._requests: dict[int, _Pending] = {}
        self._sessions: dict[int, Session] = {}
        self._writers: dict[UUID, Session] = {}
        self._next_request_id = 1
        self._error: BaseException | None = None
        self._closed: asyncio.Future[BaseException] = self._loop.create_future()
        self._ticker: asyncio.Task[None] | None = None
        now = clock.monotonic()
        self._last_sent = now
        self._last_received = now
        self._tls = endpoint.tls  # (``open`` says whether TLS is on)
        self._received_any = False

    # --- Lifecycle ---------------------------------------------------------------------------------

    @classmethod
    async def open(cls, endpoint: Endpoint, *, clock: Clock, config: ClientConfig,
                   ssl_context: _ssl.SSLContext | None = None,
                   on_closed: Callable[[Connection], None] | None = None) -> Connection:
        """Connect, exchange Hello, start the keep-alive ticker.  Raises ``ConnectionLostError`` if the
        server cannot be reached or does not answer in time (one attempt: the pool decides about
        more), ``TlsHandshakeError`` if TLS fails -- an untrusted certificate, or one side speaking TLS
        and the other not, which no retry can fix -- ``IncompatibleVersionError`` if it speaks no
        version we do, ``ProtocolError`` if it sends garbage."""
        connection = cls(endpoint, clock=clock, config=config, on_closed=on_closed)
        loop = asyncio.get_running_loop()
        tls = endpoint.tls or ssl_context is not None
        connection._tls = tls
        context = (ssl_context or _ssl.create_default_context()) if tls else None
        try:
            async with asyncio.timeout(config.connect_timeout_seconds):
                if config.connector is not None:  # a test's simulated network (ClientConfig.connector)
                    if tls:
                        raise InvalidArgumentError(f"{endpoint}: a connector carries plain connections, not TLS")
                    await config.connector(lambda: connection, endpoint.host, endpoint.port)
                else:
                    await loop.create_connection(lambda: connection, endpoint.host, endpoint.port, ssl=context,
                                                 server_hostname=endpoint.host if tls else None)
                await connection._hello
        except MillstreamError as error:  # (TlsHandshakeError and ConnectionLostError are OSErrors too)
            connection.close(error)
            if isinstance(error, ConnectionLostError):
                raise ConnectionLostError(f"cannot connect to {endpoint}: {error}") from error
            raise
        except _ssl.SSLError as error:  # (before OSError: it is one)
            failed = _tls_failure(endpoint, error)
            connection.close(failed)
            raise failed from error
        except (OSError, TimeoutError) as error:
            reason = "timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            lost = ConnectionLostError(f"cannot connect to {endpoint}: {reason}")
            connection.close(lost)
            raise lost from error
        except BaseException as error:
            connection.close(error if isinstance(error, Exception) else ConnectionLostError("connect cancelled"))
            raise
        connection._ticker = loop.create_task(connection._tick(), name=f"millstream-keepalive-{endpoint}")
        return connection

    @property
    def is_open(self) -> bool:
        return self._error is None

    @property
    def load(self) -> int:
        """How many sessions use this connection (the pool spreads writers by it)."""
        return len(self._sessions)

    def close(self, error: BaseException | None = None) -> None:
        """Close (idempotent).  ``error`` is the reason reported to requests in flight and sessions."""
        if self._error is not None:
            return
        reason = error or ConnectionLostError(f"the connection to {self.endpoint} was closed")
        self._error = reason
        outgoing, self._outgoing = self._outgoing, bytearray()
        transport = self._transport
        if transport is not None:
            if isinstance(reason, ProtocolError):
                transport.abort()
            else:
                if outgoing and not transport.is_closing():
                    transport.write(outgoing)  # sent before the close: it still leaves, then the close
                transport.close()
        if not self._hello.done():
            self._hello.set_exception(reason if isinstance(reason, Exception) else ConnectionLostError(str(reason)))
            self._hello.exception()  # retrieved: nobody may be waiting any more
        requests, self._requests = self._requests, {}
        for pending in requests.values():
            if not pending.future.done():
                lost = ConnectionLostError(f"{pending.what}: the connection to {self.endpoint} broke ({reason})")
                lost.__cause__ = reason
                pending.future.set_exception(lost)
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._writers.clear()
        for session in sessions:
            session.on_connection_lost(reason)
        ticker = self._ticker
        if ticker is not None and ticker is not asyncio.current_task():
            ticker.cancel()
        if not self._closed.done():
            self._closed.set_result(reason)
        if self._on_closed is not None:
            self._on_closed(self)

    async def wait_closed(self) -> BaseException:
        """Wait until closed (and the ticker has stopped); return the reason."""
        reason = await asyncio.shield(self._closed)
        if self._ticker is not None:
            await asyncio.gather(self._ticker, return_exceptions=True)  # its CancelledError is expected
        return reason

    # --- Sending -----------------------------------------------------------------------------------

    def _check_open(self) -> asyncio.Transport:
        if self._error is not None or self._transport is None:
            raise ConnectionLostError(f"the connection to {self.endpoint} is closed ({self._error})")
        return self._transport

    def send(self, command: Command) -> None:
        """Put ``command`` on the wire (no reply is awaited): it leaves at the end of this event-loop
        turn, after the commands sent before it.  Raises ``ConnectionLostError`` if closed."""
        self._check_open()
        codec.encode_into(self._outgoing, command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        self._last_sent = self._clock.monotonic()

    def _flush(self) -> None:
        """Hand the outgoing buffer to the transport (once per event-loop turn; ``close`` sends what is left)."""
        self._flush_scheduled = False
        if not self._outgoing or self._error is not None or self._transport is None:
            return
        data, self._outgoing = self._outgoing, bytearray()
        self._transport.write(data)  # (hands the buffer over: TLS keeps a reference to it)

    def take_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        return request_id

    async def request(self, build: Callable[[int], Command], *, what: str = "a request",
                      wait_seconds: float = 0.0) -> Command:
        """Send ``build(request_id)`` and return the reply echoing its id (error replies included: the
        caller maps them with ``_replies.expect``).  ``wait_seconds``: how long the server may hold the
        request on purpose (a tail read), added to the request timeout."""
        self._check_open()
        request_id = self.take_request_id()
        command = build(request_id)
        future: asyncio.Future[Command] = self._loop.create_future()
        deadline = self._clock.monotonic() + wait_seconds + self._config.request_timeout_seconds
        self._requests[request_id] = _Pending(future, deadline, what)
        try:
            self.send(command)
            return await future
        finally:
            self._requests.pop(request_id, None)

    # --- Sessions ----------------------------------------------------------------------------------

    def attach(self, session: Session) -> None:
        """Route the replies of ``session`` to it from now on."""
        self._check_open()
        if session.request_id in self._sessions or session.writer_id in self._writers:
            raise InvalidArgumentError(f"writer {session.writer_id} already has a session on this connection")
        self._sessions[session.request_id] = session
        self._writers[session.writer_id] = session

    def detach(self, session: Session) -> None:
        """Stop routing replies to ``session`` (late ones are dropped)."""
        if self._sessions.get(session.request_id) is session:
            del self._sessions[session.request_id]
        if self._writers.get(session.writer_id) is session:
            del self._writers[session.writer_id]

    # --- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(codec.encode(Hello(codec.WIRE_VERSION, codec.OLDEST_COMPATIBLE_VERSION)))
        self._last_sent = self._clock.monotonic()

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            return
        if not self._received_any:
            self._received_any = True
            if not self._tls and data[:1] in _TLS_RECORD_TYPES and data[1:2] == b"\x03":
                # A plain client at a TLS port: its Hello was no ClientHello, and the server answered in TLS.
                self.close(TlsHandshakeError(
                    f"the server at {self.endpoint} answered in TLS: it expects TLS -- use a tls:// URI (and its CA)"))
                return
        self._last_received = self._clock.monotonic()
        try:
            replies = self._decoder.feed(data)
            for reply in replies:
                self._dispatch(reply)
                if self._error is not None:
                    return
        except codec.WireProtocolError as error:
            _log.warning("closing the connection to %s: the server sent bad bytes (%s)", self.endpoint, error)
            self.close(ProtocolError(f"the server at {self.endpoint} sent bad bytes: {error}"))
        except ProtocolError as error:
            _log.warning("closing the connection to %s: %s", self.endpoint, error)
            self.close(error)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f" ({exc})" if exc is not None else ""
        if self.version is None and self._transport is not None:
            # A TLS server drops a plain client's Hello without a word: say what that usually means.
            hint = "" if self._tls else "; if it serves TLS, use a tls:// URI"
            self.close(ConnectionLostError(
                f"the server at {self.endpoint} closed the connection before its Hello{detail}{hint}"))
            return
        self.close(ConnectionLostError(f"the server at {self.endpoint} closed the connection{detail}"))

    # --- Dispatch ----------------------------------------------------------------------------------

    def _dispatch(self, reply: Command) -> None:
        kind = type(reply)
        if kind is DataAppended:
            pending = self._requests.pop(reply.request_id, None)  # type: ignore[attr-defined]
            if pending is not None:
                if not pending.future.done():
                    pending.future.set_result(reply)
                return
            session = self._writers.get(reply.writer_id)  # type: ignore[attr-defined]
            if session is not None:
                session.on_reply(reply)
                return
            self._check_issued(reply)
            return
        if kind is KeepAlive:
            return
        if kind is Hello:
            self._on_hello(reply)  # type: ignore[arg-type]
            return
        if self.version is None:
            raise ProtocolError(f"the server sent {kind.__name__} before Hello")
        if kind not in _FROM_SERVER:
            raise ProtocolError(f"the server sent {kind.__name__}, which is not a reply")
        request_id: int = reply.request_id  # type: ignore[attr-defined]
        pending = self._requests.pop(request_id, None)
        if pending is not None:
            if not pending.future.done():
                pending.future.set_result(reply)
            return
        session = self._sessions.get(request_id)
        if session is None and kind is InvalidEventNumber:
            session = self._writers.get(reply.writer_id)  # type: ignore[attr-defined]
        if session is not None:
            session.on_reply(reply)
            return
        self._check_issued(reply)

    def _check_issued(self, reply: Command) -> None:
        """A reply nobody waits for: a late one (its request timed out or was abandoned) is dropped; one
        for a request id never issued breaks the protocol."""
        request_id: int = reply.request_id  # type: ignore[attr-defined]
        if not 0 < request_id < self._next_request_id:
            raise ProtocolError(f"the server sent {type(reply).__name__} for request {request_id}, "
                                "which this connection never sent")
        _log.debug("dropping a late %s for request %d", type(reply).__name__, request_id)

    def _on_hello(self, hello: Hello) -> None:
        if self.version is not None:
            raise ProtocolError("the server sent Hello twice")
        try:
            version = codec.negotiate(codec.WIRE_VERSION, codec.OLDEST_COMPATIBLE_VERSION,
                                      hello.high_version, hello.low_version)
        except codec.IncompatibleVersionError as error:
            if not self._hello.done():
                self._hello.set_exception(error)
            self.close(error)
            return
        self.version = version
        if not self._hello.done():
            self._hello.set_result(version)

    # --- The ticker --------------------------------------------------------------------------------

    def tick_seconds(self) -> float:
        """How often the ticker checks keep-alives and deadlines."""
        config = self._config
        return min(config.keepalive_interval_seconds, config.request_timeout_seconds,
                   config.append_ack_timeout_seconds) / 4

    async def _tick(self) -> None:
        period = self.tick_seconds()
        while self._error is None:
            await self._clock.sleep(period)
            if self._error is None:
                self.check_deadlines()

    def check_deadlines(self) -> None:
        """Send a keep-alive if due; close if the server went silent or a session's reply is overdue;
        fail overdue requests.  The ticker calls it; tests driving a manual clock may too."""
        if self._error is not None:
            return
        now = self._clock.monotonic()
        interval = self._config.keepalive_interval_seconds
        if now - self._last_received >= interval * limits.KEEPALIVE_MISSED_MAX:
            self.close(ConnectionLostError(
                f"the server at {self.endpoint} sent nothing for {now - self._last_received:.1f} s"))
            return
        for session in list(self._sessions.values()):
            deadline = session.reply_deadline()
            if deadline is not None and now >= deadline:
                _log.info("writer %s got no acknowledgement in time; reconnecting to %s", session.writer_id,
                          self.endpoint)
                self.close(ConnectionLostError(
                    f"writer {session.writer_id} got no acknowledgement from {self.endpoint} in time"))
                return
        overdue = [request_id for request_id, pending in self._requests.items() if now >= pending.deadline]
        for request_id in overdue:
            pending = self._requests.pop(request_id)
            if not pending.future.done():
                pending.future.set_exception(RequestTimeoutError(
                    f"{pending.what}: no reply from {self.endpoint} within the request timeout"))
        if now - self._last_sent >= interval:
            self.send(KeepAlive())

    def check_invariants(self) -> None:
        """Sessions are routed both ways consistently; a closed connection holds nothing."""
        assert len(self._sessions) == len(self._writers)
        for request_id, session in self._sessions.items():
            assert session.request_id == request_id and self._writers[session.writer_id] is session
            assert 0 < request_id < self._next_request_id
        if self._error is not None:
            assert not self._requests and not self._sessions
        self._decoder.check_invariants()
