"""What the parts of a server connection share (``ConnectionState``): the state that
``_connection.Connection`` holds and the methods its mixins -- ``_ingress.Ingress``,
``_append_requests.AppendRequests``, ``_segment_requests.SegmentRequests``,
``_error_replies.ErrorReplies`` -- call on one another, declared once for type checkers.  At run
time it is an empty base class: ``Connection.__init__`` makes the state (see ``_connection``).

What a connection sees of the server that accepted it is ``ConnectionServer``: the few members of
``_server.SegmentStoreServer`` the connection's parts use, and ``ControllerEndpoint``, the controller
it may host.  They are declared here, below the connection, because the server makes connections
(it imports ``_connection``): a connection names the server only through these protocols."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections import deque
    from collections.abc import Callable, Coroutine
    from uuid import UUID

    from millstream.auth import Authorizer, SegmentOperation
    from millstream.clock import Clock
    from millstream.rate_limited_log import RateLimitedLog
    from millstream.segmentstore.container import SegmentContainer
    from millstream.server._appends import WriterSession
    from millstream.server._config import FramePool, IngressBudget, ReceiveBudget, ServerConfig
    from millstream.server._stats import ReadPositions, SegmentStatistics
    from millstream.server._transient import TransientSegments
    from millstream.wire import Command, Decoder

__all__ = ["ConnectionServer", "ConnectionState", "ControllerEndpoint"]


class ControllerEndpoint(Protocol):
    """What the server needs of a controller it hosts: ``ControllerRequest``s are handed to it."""

    def knows(self, method: str) -> bool:
        """Whether ``method`` is a controller method (else the request is answered OperationUnsupported)."""
        ...

    async def handle(self, method: str, body: bytes) -> bytes:
        """The reply body of ``method`` called with ``body``; raises the typed error to answer with --
        ``AuthenticationError`` if the server's ``authorizer`` refuses the request's token (a reply
        counts as proof that the connection authenticated)."""
        ...


class ConnectionServer(Protocol):
    """What a connection uses of its server (``SegmentStoreServer``; the server's docstrings say what
    each member does).  The methods that take the connection itself take it as ``Any``: this module
    cannot name ``Connection``, which is built on it; the server's own signatures do."""

    receiving: bool  # (set by the connection whose read is being processed: the receive buffer is in use)

    @property
    def receive_view(self) -> memoryview: ...
    @property
    def config(self) -> ServerConfig: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def log(self) -> RateLimitedLog: ...
    @property
    def authorizer(self) -> Authorizer: ...
    @property
    def budget(self) -> IngressBudget: ...
    @property
    def receive_budget(self) -> ReceiveBudget: ...
    @property
    def frame_pool(self) -> FramePool: ...
    @property
    def statistics(self) -> SegmentStatistics: ...
    @property
    def read_positions(self) -> ReadPositions | None: ...
    @property
    def append_latency(self) -> Callable[[int, float], None] | None: ...
    @property
    def transients(self) -> TransientSegments: ...
    @property
    def controller(self) -> ControllerEndpoint | None: ...
    @property
    def controller_expected(self) -> bool: ...
    @property
    def controller_settled(self) -> asyncio.Event: ...

    def container_for(self, segment: str) -> SegmentContainer: ...
    def adopt(self, connection: Any) -> None: ...
    def forget(self, connection: Any) -> None: ...
    def watch_paused(self, connection: Any) -> None: ...
    def on_receive_released(self) -> None: ...
    def on_released(self) -> None: ...


class ConnectionState:
    """The base of ``Connection``'s mixins: declarations only (``Connection.__init__`` sets the state)."""

    if TYPE_CHECKING:
        _authenticated: bool
        _backlog: deque[Command]
        _buffered: int
        _clock: Clock
        _closing: bool
        _completed_frame: bool
        _config: ServerConfig
        _connected_at: float
        _decoder: Decoder
        _dispatching: bool
        _draining: bool
        _frame_started_at: float | None
        _handed: memoryview | None
        _in_flight_bytes: int
        _large: bytearray | None
        _large_capacity: int
        _large_filled: int
        _large_growth: int
        _large_size: int
        _large_view: memoryview | None
        _last_frame_at: float
        _last_received: float
        _parts: dict[UUID, list[bytes]]
        _parts_bytes: dict[UUID, int]
        _paused_at: float | None
        _paused_by_peer: bool
        _read_bytes: int
        _reading_paused: bool
        _receive_waiting: bool
        _requests: int
        _server: ConnectionServer
        _small_buffered: int
        _task_group: asyncio.TaskGroup | None
        _transport: asyncio.Transport | None
        _unauthenticated: bytearray | None
        _unauthenticated_blocked: bool
        _version: int | None
        _waiting_appends: int
        _writers: dict[UUID, WriterSession]
        _writing_paused: bool
        peer: str

        def _abort(self, reason: str) -> None: ...
        def _authenticate(self) -> None: ...
        def _authorized_container(self, request_id: int, token: str, segment: str,
                                  operation: SegmentOperation) -> SegmentContainer | None: ...
        def _charge(self, amount: int) -> None: ...
        def _check_quiet(self) -> None: ...
        def _dispatch(self, command: Command) -> None: ...
        def _error_reply(self, request_id: int, segment: str, error: BaseException,
                         container: SegmentContainer | None = None) -> Command: ...
        def _fail_protocol(self, reason: str, reply: Command | None = None) -> None: ...
        def _release(self, amount: int) -> None: ...
        def _send(self, command: Command) -> None: ...
        def _spawn(self, coroutine: Coroutine[Any, Any, None], *, read: bool = False) -> None: ...
        def _update_reading(self) -> None: ...
