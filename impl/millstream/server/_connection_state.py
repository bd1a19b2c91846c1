"""What the parts of a server connection share (``ConnectionState``): the state that
``_connection.Connection`` holds and the methods its mixins -- ``_ingress.Ingress``,
``_append_requests.AppendRequests``, ``_segment_requests.SegmentRequests``,
``_error_replies.ErrorReplies`` -- call on one another, declared once for type checkers.  At run
time it is an empty base class: ``Connection.__init__`` makes the state (see ``_connection``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections import deque
    from collections.abc import Coroutine
    from typing import Any
    from uuid import UUID

    from millstream.auth import SegmentOperation
    from millstream.clock import Clock
    from millstream.segmentstore.container import SegmentContainer
    from millstream.server._appends import WriterSession
    from millstream.server._config import ServerConfig
    from millstream.server._server import SegmentStoreServer
    from millstream.wire import Command, Decoder

__all__ = ["ConnectionState"]


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
        _server: SegmentStoreServer
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
        def _authorize(self, request_id: int, token: str, segment: str, operation: SegmentOperation) -> bool: ...
        def _charge(self, amount: int) -> None: ...
        def _check_quiet(self) -> None: ...
        def _container(self, request_id: int, segment: str) -> SegmentContainer | None: ...
        def _dispatch(self, command: Command) -> None: ...
        def _error_reply(self, request_id: int, segment: str, error: BaseException,
                         container: SegmentContainer | None = None) -> Command: ...
        def _fail_protocol(self, reason: str, reply: Command | None = None) -> None: ...
        def _release(self, amount: int) -> None: ...
        def _send(self, command: Command) -> None: ...
        def _spawn(self, coroutine: Coroutine[Any, Any, None], *, read: bool = False) -> None: ...
        def _update_reading(self) -> None: ...
