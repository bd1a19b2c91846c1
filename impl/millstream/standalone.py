"""Standalone mode: a whole millstream node in one process, on local files, listening on loopback.

Theory of operation.  A ``Node`` is the services of one node -- the segment store
(``SegmentStoreServer`` hosting every container, FileLog as Tier 1 and FileChunkStorage as Tier 2)
and the controller (``millstream.controller``: scopes, streams, scaling, retention, reader groups;
its metadata lives in a system segment of this store, so it recovers with it) -- started in order and
stopped in reverse, all on one event loop.  The controller shares the segment store's port; a node
that owns only some containers hosts no controller by default (it could not reach every segment).
Adding a service means adding it to ``Node._build_services``: each is an object with
``async start()`` and ``async stop()``.

Metrics and health (``metrics_port``, off by default).  The node then measures its Tier-1 logs and
its controller's requests (``millstream.metrics``) and runs one more service, first of all:
``millstream.health.MetricsEndpoint``, serving ``/metrics``, ``/healthz``, ``/readyz`` and
``/status`` over HTTP on ``metrics_host`` (loopback by default) -- started before the containers
recover, so that readiness says so while they do.

``standalone(data_dir)`` runs a ``Node`` on its own event loop in a background thread and returns a
``StandaloneNode`` handle once it listens: use it as a context manager, or call ``close()``.
``millstream standalone`` runs the same ``Node`` on the main thread's loop until SIGINT/SIGTERM.
Any other process -- a CLI command, a Spark executor -- reaches it over TCP at ``uri``.

Everything lives under the data directory, so stopping the node and starting it again on the same
directory recovers every segment (each container replays its log, Tier 2 keeps the rest)::

    <data_dir>/node.lock                 flock()ed by the running node; holds its pid
    <data_dir>/node.json                 the node's fixed shape (container count); checked at start
    <data_dir>/tier1/container-<id>/     each container's FileLog
    <data_dir>/tier2/                    the FileChunkStorage all containers share

The container count is fixed when the directory is first used: changing it would move segments to
other containers, whose logs do not hold them, so a node refuses to start on a directory made with
another count (``InvalidArgumentError``).

One node per data directory.  A second node on the same directory would take every container's log
over and fence the first.  So a node holds an exclusive ``flock`` on ``node.lock`` from before it
reads anything until it has stopped, and writes its pid there; a node that finds the lock taken
refuses to start (``DataDirectoryInUseError``, naming that pid).  The kernel releases the lock when
the process dies however it dies, so a node killed with SIGKILL can be started again at once.

A node that stops serving for good.  A container whose log was fenced (another process took it
over anyway: a second node with a lock it could not see, on a file system without flock, or by hand)
or that found its data corrupt is not restarted (``ContainerHost``).  Then the node must not linger
half alive: ``Node.failed`` completes with the cause (the host logged it as an ERROR, naming the
container and the newer epoch), ``millstream standalone`` stops the node and exits non-zero, and a
``StandaloneNode`` stops it and reports the cause (``failure``; ``run`` and leaving the ``with``
block raise it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import json
import logging
import os
import ssl
import threading
from collections.abc import Collection, Coroutine
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from millstream import limits
from millstream.auth import exposure_warnings, is_loopback_host
from millstream.errors import (
    DataDirectoryInUseError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    StorageError,
)

# The node's parts -- segment store, server, controller, metrics -- are imported where a node is built,
# not here: ``import millstream`` brings this module (for ``standalone`` and ``StandaloneNode``), and a
# client that never runs a node (a Spark worker above all, which starts often) must not pay for them.
if TYPE_CHECKING:
    from millstream.controller import Controller, ControllerConfig
    from millstream.health import MetricsEndpoint, NodeHealth
    from millstream.metrics import NodeMetrics
    from millstream.segmentstore.container import StorageSettings
    from millstream.segmentstore.durable_data_log import DurableDataLog
    from millstream.segmentstore.file_chunk_storage import FileChunkStorage
    from millstream.server import SegmentStoreServer, ServerConfig

__all__ = ["LOCK_FILE_NAME", "DataDirectoryLock", "Node", "Service", "StandaloneNode", "standalone"]

log = logging.getLogger("millstream.standalone")

_T = TypeVar("_T")

#: The version of the data directory's layout (``node.json``'s "format").
_LAYOUT_FORMAT: Final = 1

#: Containers of a node whose data directory is new, when the caller names no count.  A node is one
#: Python process with one event loop, so more containers bring no parallelism -- each adds a Tier-1
#: log of its own (a group-commit thread and a stream of fdatasyncs) and splits the batches that one
#: log would have committed together.  Measured on the 2-core machine, one writer over 16 segments:
#: 100 B events at 13,000/s, p50/p95 write latency 10.2/21.1 ms with 4 containers, 5.3/9.7 ms with
#: one; 10 KB events at max, 102-118 MB/s with 4, 146 MB/s with one.  A cluster (``millstream
#: serve``) spreads containers over nodes and picks its own count.
CONTAINER_COUNT_DEFAULT: Final = 1

#: How long ``standalone()`` waits for the node to recover and listen, and ``close()`` for it to stop.
#: Recovery replays each container's log, which is bounded by checkpoints and truncation; a minute
#: covers a large log on a slow disk, and a node that takes longer is broken, not slow.
NODE_START_TIMEOUT_SECONDS: Final = 60.0
NODE_STOP_TIMEOUT_SECONDS: Final = limits.SERVER_SHUTDOWN_DRAIN_SECONDS + limits.SHUTDOWN_TIMEOUT_SECONDS + 10.0


#: The data directory's lock file (see the module docstring).
LOCK_FILE_NAME: Final = "node.lock"


class DataDirectoryLock:
    """An exclusive ``flock`` on ``<data_dir>/node.lock``, with the holder's pid written in the file.

    ``acquire`` takes it without waiting (``DataDirectoryInUseError`` if another open file holds
    it -- another process, or another node of this one); ``release`` (idempotent) closes the file,
    which releases it.  The kernel releases it too when the process dies.  The file is never deleted:
    a process that deleted it while another waited could let two nodes lock two different files."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        # O_CLOEXEC (Python's default): a process this one starts does not inherit the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_pid(fd)
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(f"cannot lock {self.path}: {error}") from error
            raise DataDirectoryInUseError(
                f"the data directory {self.path.parent} is in use by another millstream node "
                f"({'pid ' + holder if holder else 'its pid is not recorded yet'}; it holds {self.path}): "
                "stop that node first -- two nodes on one directory would fence each other") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # the pid is a courtesy for the message above; the lock is what counts
            log.warning("could not record this process's pid in %s", self.path)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


class Service(Protocol):
    """One part of a node."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class _ChunkStorageService:
    """Closes the shared Tier-2 storage after the containers using it have stopped."""

    def __init__(self, storage: FileChunkStorage) -> None:
        self.storage = storage

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        await self.storage.close()


class _ControllerService:
    """The controller, over the node's own segment store; serves ``ControllerRequest``s on its port."""

    def __init__(self, server: SegmentStoreServer, config: ControllerConfig | None,
                 metrics: NodeMetrics | None = None) -> None:
        self._server = server
        self._config = config
        self._metrics = metrics
        self.controller: Controller | None = None

    async def start(self) -> None:
        from millstream.controller import Controller, ControllerRpc, LocalSegmentStore

        controller = Controller(LocalSegmentStore(self._server), clock=self._server.clock, config=self._config)
        await controller.start()
        self.controller = controller
        endpoint = ControllerRpc(controller, self._server.authorizer)
        self._server.attach_controller(endpoint if self._metrics is None else self._metrics.meter_controller(endpoint))

    async def stop(self) -> None:
        self._server.attach_controller(None)
        if self.controller is not None:
            await self.controller.stop()


def recorded_container_count(data_dir: str | os.PathLike[str]) -> int | None:
    """The container count ``data_dir`` was created with; None if it was never used (or says none)."""
    try:
        recorded = json.loads((Path(data_dir) / "node.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise StorageError(f"{Path(data_dir) / 'node.json'} is unreadable: {error}") from error
    count = recorded.get("container_count") if isinstance(recorded, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _check_layout(data_dir: Path, container_count: int) -> None:
    """Create ``node.json`` on first use; refuse a directory made for another container count."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "node.json"
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"format": _LAYOUT_FORMAT, "container_count": container_count}) + "\n")
        with open(temporary, "rb") as file:
            os.fsync(file.fileno())
        os.replace(temporary, path)
        directory = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself is durable before anything is written under it
        finally:
            os.close(directory)
        return
    except (OSError, ValueError) as error:
        raise StorageError(f"{path} is unreadable: {error}") from error
    if not isinstance(recorded, dict) or recorded.get("format") != _LAYOUT_FORMAT:
        raise InvalidArgumentError(f"{path} describes an unknown layout: {recorded!r}")
    if recorded.get("container_count") != container_count:
        raise InvalidArgumentError(
            f"{data_dir} was created with {recorded.get('container_count')} containers, not {container_count}: "
            "the container count of a data directory cannot change")


class Node:
    """The services of one node on local files under ``data_dir``, run on the calling event loop.

    ``container_count`` (default: what ``data_dir`` was created with, else ``CONTAINER_COUNT_DEFAULT``),
    ``owned_containers`` (default: all) and the other options go to the ``SegmentStoreServer``.
    ``controller``: host the controller (default: when the node owns every container);
    ``controller_config`` tunes it (tests).  ``metrics_port`` (None: off; 0: a free port) serves
    metrics and health on ``metrics_host`` (see the module docstring)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        container_count: int | None = None,
        owned_containers: Collection[int] | None = None,
        auth_secret: bytes | None = None,
        ssl_context: ssl.SSLContext | None = None,
        storage_settings: StorageSettings | None = None,
        config: ServerConfig | None = None,
        controller: bool | None = None,
        controller_config: ControllerConfig | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        from millstream.server import ServerConfig

        self.data_dir = Path(data_dir)
        if metrics_port is not None and (type(metrics_port) is not int or not 0 <= metrics_port <= 65535):
            raise InvalidArgumentError(f"metrics_port must be a port number (0 to 65535) or None, not {metrics_port!r}")
        #: The node's metrics (None: it serves none).
        self.metrics: NodeMetrics | None = None
        if metrics_port is not None:
            from millstream.metrics import NodeMetrics  # (with prometheus_client: only for a node serving metrics)

            self.metrics = NodeMetrics(lambda: self.server)
        self._metrics_host = metrics_host
        self._metrics_port = metrics_port
        self.metrics_endpoint: MetricsEndpoint | None = None
        if config is None:
            if container_count is None:
                container_count = recorded_container_count(self.data_dir) or CONTAINER_COUNT_DEFAULT
            config = ServerConfig(host=host, port=port, container_count=container_count,
                                  owned_containers=None if owned_containers is None else frozenset(owned_containers))
        self.config = config
        self._auth_secret = auth_secret
        self._ssl_context = ssl_context
        self._storage_settings = storage_settings
        owns_all = config.owned_containers is None or set(range(config.container_count)) <= config.owned_containers
        if controller and not owns_all:
            raise InvalidArgumentError("a node hosts the controller only if it owns every container")
        self._host_controller = owns_all if controller is None else controller
        self._controller_config = controller_config
        self._services: list[Service] = []
        self._started: list[Service] = []
        self.server: SegmentStoreServer | None = None
        self._controller_service: _ControllerService | None = None
        self._lock = DataDirectoryLock(self.data_dir)
        self._stopping = False
        #: Completes with the cause once a container stops serving for good (fenced, corrupt data, or
        #: its restarts exhausted) while the node runs; never while it stops normally.
        self.failed: asyncio.Future[BaseException] | None = None

    def _open_log(self, container_id: int) -> DurableDataLog:
        from millstream.segmentstore.file_log import FileLog

        log = FileLog(self.data_dir / "tier1" / f"container-{container_id}")
        return log if self.metrics is None else self.metrics.meter_log(container_id, log)

    def _build_services(self) -> list[Service]:
        """The node's services in start order (add new ones here)."""
        from millstream.health import MetricsEndpoint
        from millstream.segmentstore.file_chunk_storage import FileChunkStorage
        from millstream.server import SegmentStoreServer

        chunk_storage = FileChunkStorage(self.data_dir / "tier2")
        self.server = SegmentStoreServer(self._open_log, config=self.config, chunk_storage=chunk_storage,
                                         storage_settings=self._storage_settings, ssl_context=self._ssl_context,
                                         auth_secret=self._auth_secret)
        # Stopped in reverse: the controller before the server it uses, the server (and its
        # containers) before the storage they write to; the metrics endpoint first and last, so it
        # answers (not ready) while containers recover and while the node stops.
        services: list[Service] = []
        if self.metrics is not None:
            self.server.enable_metrics(self.metrics.observe_append)
            self.metrics_endpoint = MetricsEndpoint(self.metrics, self.health, host=self._metrics_host,
                                                    port=self._metrics_port or 0)
            services.append(self.metrics_endpoint)
        services += [_ChunkStorageService(chunk_storage), self.server]
        if self._host_controller:
            self.server.expect_controller()  # (requests before it has started wait for it)
            self._controller_service = _ControllerService(self.server, self._controller_config, self.metrics)
            services.append(self._controller_service)
        return services

    async def start(self) -> None:
        """Lock the data directory, then start every service; if one fails, stop those already
        started, unlock and re-raise.  Raises ``DataDirectoryInUseError`` if another node runs on
        the directory."""
        if self._services:
            raise ObjectClosedError("a node starts once")
        self.failed = asyncio.get_running_loop().create_future()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            _check_layout(self.data_dir, self.config.container_count)
            self._services = self._build_services()
            for service in self._services:
                await service.start()
                self._started.append(service)
        except BaseException:
            await self.stop()
            raise
        # Beyond loopback, say loudly what is open (auth off: anyone may do anything; no TLS: tokens in clear).
        for warning in exposure_warnings(self.config.host, auth=self._auth_secret is not None,
                                         tls=self._ssl_context is not None):
            log.warning("%s", warning)
        if self.metrics_endpoint is not None and not is_loopback_host(self._metrics_host):
            log.warning("metrics and health on %s (not loopback): they need no token, and name segments and "
                        "streams to anyone who can reach that port", self.metrics_endpoint.url)
        assert self.server is not None
        for container_id in sorted(self.config.containers):
            self.server.container_host(container_id).stopped.add_done_callback(self._on_container_stopped)

    def _on_container_stopped(self, stopped: asyncio.Future[BaseException | None]) -> None:
        cause = None if stopped.cancelled() else stopped.result()
        if cause is None or self._stopping or self.failed is None or self.failed.done():
            return
        log.error("the node on %s stops serving: %s", self.data_dir, cause)
        self.failed.set_result(cause)

    async def stop(self) -> None:
        """Stop the started services in reverse order (each one's failure is logged, the rest still
        stop), then unlock the data directory."""
        self._stopping = True
        try:
            while self._started:
                service = self._started.pop()
                try:
                    await service.stop()
                except Exception:
                    log.exception("stopping %s failed", type(service).__name__)
        finally:
            self._lock.release()

    def health(self) -> NodeHealth:
        """The node's health now (``millstream.health.node_health``)."""
        from millstream.health import node_health

        failure = self.failed.result() if self.failed is not None and self.failed.done() else None
        return node_health(self.server, failure)

    @property
    def metrics_url(self) -> str:
        """``http://host:port`` of the metrics endpoint ("" if it serves none, or before ``start``)."""
        return "" if self.metrics_endpoint is None or not self.metrics_endpoint.port else self.metrics_endpoint.url

    @property
    def host(self) -> str:
        return self.config.host

    @property
    def port(self) -> int:
        return 0 if self.server is None else self.server.port

    @property
    def uri(self) -> str:
        return "" if self.server is None else self.server.uri

    @property
    def controller(self) -> Controller | None:
        """The controller this node hosts (None before ``start`` or if it hosts none)."""
        return None if self._controller_service is None else self._controller_service.controller


class StandaloneNode:
    """A ``Node`` running on its own event loop in a background thread.  Made by ``standalone()``.

    ``uri`` (``tcp://127.0.0.1:PORT``), ``host``, ``port`` and ``data_dir`` say where it is;
    ``close()`` (or leaving the ``with`` block) shuts it down gracefully and waits for that.  ``run``
    runs a coroutine on the node's loop (for tests and embedding code that needs the server object).

    A node that stops serving for good while it runs (a container fenced or corrupt: see the module
    docstring) stops at once; ``failure`` then holds the cause, and ``run``, ``server``,
    ``controller`` and leaving the ``with`` block (without another exception) raise an error of the
    cause's type naming the node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        #: Why the node stopped serving while it ran (None while it serves, or after a normal close).
        self._stopped_by: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"millstream-node {node.data_dir}", daemon=True)
        self._closed = False

    def _start(self, timeout_seconds: float) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_seconds):
            self.close()
            raise TimeoutError(f"the node on {self.node.data_dir} did not start within {timeout_seconds:g} s")
        if self._failure is not None:
            self._thread.join(timeout_seconds)
            raise self._failure

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the thread that called standalone()
            if not self._ready.is_set():
                self._failure = error
                self._ready.set()
            else:
                log.exception("the standalone node failed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self.node.start()
        try:
            self._ready.set()
            failed = self.node.failed
            assert failed is not None
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait((stop, failed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                await asyncio.gather(stop, return_exceptions=True)
            if failed.done():
                self._stopped_by = failed.result()
        finally:
            await self.node.stop()

    @property
    def failure(self) -> BaseException | None:
        """Why the node stopped serving on its own (a fenced or corrupt container), or None."""
        return self._stopped_by

    def _check_serving(self) -> None:
        """Raise the node's failure (as an error of its type naming the node) if it stopped on its own."""
        cause = self._stopped_by
        if cause is not None:
            raise _stopped_error(self.data_dir, cause)

    @property
    def uri(self) -> str:
        return self.node.uri

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def data_dir(self) -> Path:
        return self.node.data_dir

    @property
    def metrics_url(self) -> str:
        """Where the node serves metrics and health (``http://127.0.0.1:PORT``; "" without ``metrics_port``)."""
        return self.node.metrics_url

    @property
    def server(self) -> SegmentStoreServer:
        """The segment store (touch it only on the node's loop: see ``run``)."""
        self._check_serving()
        assert self.node.server is not None
        return self.node.server

    @property
    def controller(self) -> Controller:
        """The controller (touch it only on the node's loop: see ``run``)."""
        self._check_serving()
        controller = self.node.controller
        if controller is None:
            raise ObjectClosedError("this node hosts no controller")
        return controller

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_seconds: float = NODE_START_TIMEOUT_SECONDS) -> _T:
        """Run ``coroutine`` on the node's event loop and return its result.  Raises the node's
        failure if it stopped serving on its own, ``ObjectClosedError`` once closed."""
        if self._stopped_by is not None:
            coroutine.close()
            self._check_serving()
        if self._loop is None or self._closed:
            coroutine.close()
            raise ObjectClosedError("the node is not running")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_seconds)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the call did not finish within {timeout_seconds:g} s") from None

    def close(self) -> None:
        """Shut the node down gracefully and wait for it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.is_alive():
            self._thread.join(NODE_STOP_TIMEOUT_SECONDS)
            if self._thread.is_alive():
                log.error("the node on %s did not stop within %.0f s", self.data_dir, NODE_STOP_TIMEOUT_SECONDS)

    def __enter__(self) -> StandaloneNode:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
        if exc is None:
            self._check_serving()  # a node that stopped on its own does not leave the block quietly

    def __repr__(self) -> str:
        return f"StandaloneNode(uri={self.uri!r}, data_dir={str(self.data_dir)!r})"


def _stopped_error(data_dir: Path, cause: BaseException) -> BaseException:
    """An error of ``cause``'s type (a ``MillstreamError``; else ``ObjectClosedError``) saying that the
    node on ``data_dir`` stopped serving because of it, chained to it."""
    message = f"the node on {data_dir} stopped serving: {cause}"
    error: BaseException
    try:
        error = type(cause)(message) if isinstance(cause, MillstreamError) else ObjectClosedError(message)
    except TypeError:  # a class that wants more than a message
        error = ObjectClosedError(message)
    error.__cause__ = cause
    return error


def standalone(
    data_dir: str | os.PathLike[str],
    *,
    port: int = 0,
    container_count: int | None = None,
    host: str = "127.0.0.1",
    auth_secret: bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
    storage_settings: StorageSettings | None = None,
    start_timeout_seconds: float = NODE_START_TIMEOUT_SECONDS,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> StandaloneNode:
    """Start a full node on ``data_dir`` in a background thread; return its handle once it listens.

    Use as ``with millstream.standalone("./data") as node: ...`` (``node.uri`` is where to connect),
    or keep the handle and call ``close()``.  ``container_count``: what ``data_dir`` was created with,
    else ``CONTAINER_COUNT_DEFAULT`` (one).  Raises ``InvalidArgumentError`` for a bad option or a
    data directory made with another container count, ``DataDirectoryInUseError`` if another node
    runs on ``data_dir``, the storage's error if recovery fails, and ``TimeoutError`` if the node does
    not listen within ``start_timeout_seconds``.

    ``metrics_port`` (default None: off; 0 picks a free port) serves Prometheus metrics and health
    checks over HTTP on ``metrics_host`` (loopback by default): ``node.metrics_url`` says where::

        with millstream.standalone("./data", metrics_port=0) as node:
            print(node.metrics_url + "/metrics")"""
    node = Node(data_dir, host=host, port=port, container_count=container_count, auth_secret=auth_secret,
                ssl_context=ssl_context, storage_settings=storage_settings, metrics_port=metrics_port,
                metrics_host=metrics_host)
    handle = StandaloneNode(node)
    handle._start(start_timeout_seconds)
    return handle
