"""A node's health, and the HTTP endpoint that serves it with the node's metrics.

Theory of operation.  ``node_health(server)`` reads, without changing anything, what each container
this node hosts is doing (``ContainerHost.status``): *running*, *recovering* (replaying its log, at
start or after a Tier-1 failure), *fenced* (another process took its log over: it never serves
again here), *failed* (corrupt data, or its restarts exhausted) or *stopped*; and whether Tier 2
lags so far that its appends are *throttled*.  The node is **ready** when the server runs and every
container it hosts is running; otherwise the reasons say which are not, and why.

``MetricsEndpoint`` is a node service (``millstream.standalone.Node``) that serves, over plain
HTTP/1.1 on its own port (``--metrics-port``, loopback unless ``--metrics-host`` says otherwise):

    GET /metrics   the Prometheus exposition of the node's ``NodeMetrics``
    GET /healthz   liveness: 200 "ok" whenever the node's event loop answers
    GET /readyz    readiness: 200 "ready", or 503 with one reason per line
    GET /status    ``node_health`` as JSON (what ``millstream node status`` prints)

It is started *first* among the node's services, so that while containers recover at start the
endpoint already answers -- ``/readyz`` says 503 and which containers recover.  Each request is
answered on the node's event loop (so a scrape reads a consistent state) and the connection closed.
Everything is bounded: the request head (``limits.METRICS_REQUEST_HEAD_BYTES_MAX``), the time to
send it (``METRICS_REQUEST_TIMEOUT_SECONDS``) and the connections at once
(``METRICS_CONNECTIONS_MAX``: beyond, a connection is answered 503 and closed).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import attrs

from millstream import limits
from millstream.errors import MillstreamError
from millstream.metrics import CONTENT_TYPE, NodeMetrics

if TYPE_CHECKING:
    from millstream.server import SegmentStoreServer

__all__ = ["CONTAINER_STATES", "ContainerHealth", "MetricsEndpoint", "NodeHealth", "node_health"]

log = logging.getLogger("millstream.health")

#: What a container can be doing, as ``ContainerHealth.state`` says it.
CONTAINER_STATES: Final = ("running", "recovering", "fenced", "failed", "stopped")


@attrs.frozen
class ContainerHealth:
    """One hosted container: its ``state`` (one of ``CONTAINER_STATES``), whether its appends are
    ``throttled`` (Tier 2 lags), and for a fenced or failed one the ``cause``."""

    container: int
    state: str
    throttled: bool = False
    cause: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"container": self.container, "state": self.state, "throttled": self.throttled, "cause": self.cause}


@attrs.frozen
class NodeHealth:
    """A node's health: ``ready`` when its server runs and every container it hosts is running;
    ``reasons`` says why not (one line each)."""

    server: str
    containers: tuple[ContainerHealth, ...]
    ready: bool
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"ready": self.ready, "server": self.server, "reasons": list(self.reasons),
                "containers": [container.to_json() for container in self.containers]}


def node_health(server: SegmentStoreServer | None, failure: BaseException | None = None) -> NodeHealth:
    """The health of the node whose segment store is ``server`` (None: not built yet).  ``failure``:
    why the node stopped serving, if it did."""
    if server is None:
        return NodeHealth("starting", (), False, ("the node is starting",))
    state = server.state.value
    containers = []
    reasons = []
    for container_id in sorted(server.config.containers):
        try:
            host = server.container_host(container_id)
        except MillstreamError:  # not started yet (or the server stopped): it recovers, or is gone
            host_state, cause = ("recovering" if state in ("new", "running") else "stopped"), None
            throttled = False
        else:
            host_state, cause = host.status
            throttled = False
            if host_state == "running":
                writer = host.container.storage_writer
                throttled = writer is not None and writer.unflushed_bytes > writer.unflushed_bytes_max
        containers.append(ContainerHealth(container_id, host_state, throttled, "" if cause is None else str(cause)))
        if host_state != "running":
            reasons.append(f"container {container_id} is {host_state}" + (f": {cause}" if cause is not None else ""))
    if state != "running":
        reasons.insert(0, f"the segment store is {state}")
    if failure is not None:
        reasons.insert(0, f"the node stopped serving: {failure}")
    return NodeHealth(state, tuple(containers), not reasons, tuple(reasons))


_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                   408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class MetricsEndpoint:
    """The node service serving ``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` on
    ``host``:``port`` (0: a free one; ``port`` says which once started).  ``health()`` gives the
    node's health at the time of a request."""

    def __init__(self, metrics: NodeMetrics, health: Callable[[], NodeHealth], *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.metrics = metrics
        self._health = health
        self.host = host
        self._port = port
        self._listener: asyncio.Server | None = None
        #: The connections being answered, with the tasks answering them (``stop`` waits for those).
        self._writers: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        #: Connections answered 503 because ``METRICS_CONNECTIONS_MAX`` were open (evidence for tests).
        self.refused = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` (host in brackets if IPv6)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        self._listener = await asyncio.start_server(self._serve, self.host, self._port,
                                                    limit=limits.METRICS_REQUEST_HEAD_BYTES_MAX, reuse_address=True)
        self._port = self._listener.sockets[0].getsockname()[1]
        log.info("metrics and health on %s (/metrics, /healthz, /readyz, /status)", self.url)

    async def stop(self) -> None:
        if self._listener is None:
            return
        self._listener.close()
        tasks = list(self._writers.values())
        for writer in list(self._writers):
            writer.close()
        if tasks:
            await asyncio.wait(tasks, timeout=limits.METRICS_REQUEST_TIMEOUT_SECONDS)
        await self._listener.wait_closed()
        self._listener = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= limits.METRICS_CONNECTIONS_MAX:
            self.refused += 1
            await self._reply(writer, 503, b"too many connections\n")
            return
        task = asyncio.current_task()
        assert task is not None
        self._writers[writer] = task
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.METRICS_REQUEST_TIMEOUT_SECONDS)
            except TimeoutError:
                await self._reply(writer, 408, b"request timeout\n")
                return
            except asyncio.LimitOverrunError:
                await self._reply(writer, 431, b"request head too large\n")
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            status, body, content_type = self._answer(head)
            await self._reply(writer, status, body, content_type, head_only=head.startswith(b"HEAD "))
        finally:
            self._writers.pop(writer, None)

    def _answer(self, head: bytes) -> tuple[int, bytes, str]:
        """The status, body and content type answering the request ``head``."""
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, b"bad request\n", "text/plain"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", "text/plain"
        if target == "/metrics":
            return 200, self.metrics.exposition(), CONTENT_TYPE
        if target == "/healthz":
            return 200, b"ok\n", "text/plain"
        if target == "/readyz":
            health = self._health()
            if health.ready:
                return 200, b"ready\n", "text/plain"
            return 503, "".join(reason + "\n" for reason in health.reasons).encode(), "text/plain"
        if target == "/status":
            health = self._health()
            return (200 if health.ready else 503), (json.dumps(health.to_json()) + "\n").encode(), "application/json"
        return 404, b"not found: try /metrics, /healthz, /readyz or /status\n", "text/plain"

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "text/plain", *,
                     head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
        try:
            writer.write(head if head_only else head + body)
            await asyncio.wait_for(writer.drain(), limits.METRICS_REQUEST_TIMEOUT_SECONDS)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
