"""The data source's calls to the store, through one blocking client per process.

Every Spark-side object -- the planner's stream reader, a task's reader or writer, the driver's
commit -- runs in a Python process of its own and is pickled there without connections, so each
asks for its client lazily (``StoreSession.client``).  Spark keeps those processes: the planner
runs for the whole query, and the Python workers that run tasks and the sink's commit are reused,
task after task and batch after batch.  So the client is not the object's but the process's
(``shared_client``): one per (controller, token), opened by the first task that needs it and kept
for the next -- a micro-batch then pays no thread start, no event loop and no TCP handshake, only
its requests.  A client made before a fork is never used after it (the key holds the pid), and the
clients close when the process exits.  A client whose server went away reconnects on its next
request, as any client does.

``check_reachable`` is the one call that does not go through the client: a bounded TCP connect to
the controller's address, made where a query starts, so that a wrong address fails the query in
seconds with a message naming it instead of after the client's reconnect budget.

The calls made on the controller are gathered here with their errors translated into what the
query should say.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import millstream
from millstream import limits
from millstream.client import ReaderGroup, ReaderGroupConfig, SegmentSlice, StreamCut, parse_uri
from millstream.errors import InvalidStreamCutError, ReaderGroupNotFoundError, TruncatedDataError
from millstream.spark._errors import OptionError
from millstream.spark._options import StoreOptions

__all__ = ["StoreSession", "check_reachable", "check_reachable_once", "close_shared_clients", "shared_client"]

T = TypeVar("T")

_log = logging.getLogger("millstream.spark")

_clients: dict[tuple[str, str], tuple[int, millstream.Client]] = {}
_clients_lock = threading.Lock()
_exit_hook: list[bool] = []  # holds True once close_shared_clients is registered with atexit


def shared_client(controller: str, token: str) -> millstream.Client:
    """This process's client for ``controller`` and ``token`` (opened on first use, kept until exit)."""
    key = (controller, token)
    with _clients_lock:
        entry = _clients.get(key)
        if entry is not None and entry[0] == os.getpid():
            return entry[1]
        client = millstream.connect(controller, token=token)
        _clients[key] = (os.getpid(), client)
        if not _exit_hook:
            atexit.register(close_shared_clients)
            _exit_hook.append(True)
        return client


def close_shared_clients() -> None:
    """Close this process's shared clients (at exit; tests call it too)."""
    with _clients_lock:
        entries = list(_clients.values())
        _clients.clear()
    for pid, client in entries:
        if pid == os.getpid():
            client.close()


#: ``check_reachable``'s way of opening a TCP connection (tests pass a fake).
Connect = Callable[[tuple[str, int], float], socket.socket]


def check_reachable(controller: str, *, connect: Connect = socket.create_connection,
                    timeout_seconds: float = limits.SPARK_CONTROLLER_CONNECT_TIMEOUT_SECONDS) -> None:
    """Raise ``OptionError`` naming option ``controller`` unless a TCP connection to its address
    opens within ``timeout_seconds`` (refused, unreachable, unknown host, no answer).  Nothing is
    sent: it only checks where the query points before anything waits on the store."""
    endpoint = parse_uri(controller)
    try:
        connection = connect((endpoint.host, endpoint.port), timeout_seconds)
    except OSError as error:
        reason = f"no answer within {timeout_seconds:g} s" if isinstance(error, TimeoutError) else str(error)
        raise OptionError("controller", f"cannot reach the store at {controller} ({reason}); is it running there, "
                                        "and is this the address the executors reach it at?") from None
    connection.close()


_reached: set[str] = set()


def check_reachable_once(controller: str) -> None:
    """``check_reachable``, once per process and address that answered (the sink's commit process
    builds its writer every batch; one check is enough)."""
    if controller not in _reached:
        check_reachable(controller)
        _reached.add(controller)


class StoreSession:
    """The process's client for ``options`` (controller URI and token), taken on first use, and the
    stream's controller calls.  Pickled without it."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options
        self._client: millstream.Client | None = None
        self._group: ReaderGroup | None = None  # the query's reader group, once registered (planner only)

    @property
    def client(self) -> millstream.Client:
        if self._client is None:
            self._client = shared_client(self.options.controller, self.options.token)
        return self._client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.client.run(coroutine)

    def close(self) -> None:
        """Let go of the client (the process keeps it for the next session) and of the reader
        group's handle."""
        self._drop_group()
        self._client = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_client": None, "_group": None}

    # --- Stream cuts ---------------------------------------------------------------------------------

    def head(self) -> StreamCut:
        return self.client.stream_manager().head_cut(self.options.stream)

    def tail(self) -> StreamCut:
        return self.client.stream_manager().tail_cut(self.options.stream)

    def check_exists(self, stream: str | None = None, option: str = "stream") -> None:
        """Raise ``OptionError`` naming ``option`` if ``stream`` (default: the query's) or its scope
        does not exist."""
        name = self.options.stream if stream is None else stream
        try:
            self.client.stream_manager().describe_stream(name)
        except LookupError as error:  # ScopeNotFoundError, StreamNotFoundError
            raise OptionError(option, f"{name!r} does not exist ({error})") from None

    def between(self, start: StreamCut, end: StreamCut | None) -> list[SegmentSlice]:
        """The stream's ``segments_between(start, end)``; a start the stream's head has passed is
        ``TruncatedDataError`` (retention deleted what the query still had to read)."""
        manager = self.client.stream_manager()
        stream = self.options.stream
        try:
            return manager.segments_between(stream, start, end)
        except InvalidStreamCutError as error:
            head = self.head()
            try:
                manager.check_cut(stream, start)
            except InvalidStreamCutError:
                raise TruncatedDataError(
                    f"the query's position in {stream} ({start.to_json()}) lies before the stream's "
                    f"head ({head.to_json()}): retention or truncation deleted events the query had not read, and the "
                    "source does not skip them. Start a new query (a new checkpoint, option start=head) to go on "
                    "from the head") from None
            raise error from None

    # --- The query's reader group (consumption-based retention) -------------------------------------

    def register_group(self, scope: str, group: str) -> None:
        """Create reader group ``scope/group`` subscribing to the stream for consumption-based
        retention, or check that the existing one reads it; keep its handle for ``publish``."""
        config = ReaderGroupConfig([self.options.stream], automatic_checkpoint_seconds=0, retention="consumption")
        handle = None
        for _ in range(2):  # a group deleted between its creation and its opening is created again
            try:
                handle = self.client.reader_group(f"{scope}/{group}", config=config)
                break
            except ReaderGroupNotFoundError:
                continue
            except LookupError as error:  # the group's scope does not exist
                raise OptionError("readerGroup", f"{scope}/{group}: {error}") from None
        if handle is None:
            raise OptionError("readerGroup", f"reader group {scope}/{group} was deleted twice while the query "
                                             "registered it; start the query again")
        existing = handle.config()
        if self.options.stream not in existing.streams or existing.retention != "consumption":
            handle.close()
            raise OptionError("readerGroup", f"reader group {scope}/{group} exists and does not subscribe to "
                                             f"{self.options.stream} for consumption-based retention; name another")
        self._drop_group()
        self._group = handle

    def publish(self, scope: str, group: str, cut: StreamCut) -> None:
        """Record ``cut`` as the group's subscriber cut of the stream (registering the group first if
        this session has not)."""
        if self._group is None or self._group.qualified_name != f"{scope}/{group}":
            self.register_group(scope, group)
        assert self._group is not None
        self._group.update_retention_stream_cut({self.options.stream: cut})

    def _drop_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            try:
                group.close()
            except Exception:  # a handle only; the group itself stays registered
                _log.debug("closing the handle of reader group %s failed", group.qualified_name, exc_info=True)
