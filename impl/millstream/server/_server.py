"""``SegmentStoreServer``: segment containers behind a TCP port."""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from millstream import limits
from millstream.auth import Authorizer
from millstream.clock import Clock, SystemClock
from millstream.errors import (
    InternalError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    StreamSegmentNotExistsError,
    WrongHostError,
)
from millstream.naming import container_of, is_transient_segment, validate_segment_name
from millstream.rate_limited_log import RateLimitedLog
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.container import SegmentContainer, StorageSettings
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.host import ContainerHost
from millstream.server._config import FramePool, IngressBudget, ReceiveBudget, ServerConfig
from millstream.server._connection import Connection
from millstream.server._connection_state import ControllerEndpoint
from millstream.server._memory import trim_memory
from millstream.server._stats import ReadPositions, SegmentStatistics
from millstream.server._transient import TransientSegments
from millstream.tasks import cancel_and_wait

__all__ = ["SERVER_LIFECYCLE", "SegmentStoreServer", "ServerState"]

log = logging.getLogger("millstream.server")


class ServerState(enum.Enum):
    NEW = "new"
    RUNNING = "running"  # containers started, listening
    STOPPING = "stopping"  # not accepting; draining connections, then stopping containers
    STOPPED = "stopped"


#: (state, event) -> next state.  Anything not listed is a bug (InternalError).
SERVER_LIFECYCLE: dict[tuple[ServerState, str], ServerState] = {
    (ServerState.NEW, "start"): ServerState.RUNNING,
    (ServerState.NEW, "stop"): ServerState.STOPPED,
    (ServerState.RUNNING, "failed_to_start"): ServerState.STOPPED,
    (ServerState.RUNNING, "stop"): ServerState.STOPPING,
    (ServerState.STOPPING, "stopped"): ServerState.STOPPED,
}


class SegmentStoreServer:
    """Hosts the segment containers ``config.containers`` (each through a ``ContainerHost``, on the
    log ``open_log(container_id)`` opens and the shared Tier-2 ``chunk_storage`` if any) and serves
    them over TCP on ``config.host``/``config.port`` (port 0: a free one; see ``port`` once started).

    ``ssl_context`` (a server-side ``ssl.SSLContext``) turns on TLS; ``auth_secret`` turns on token
    authentication (``millstream.auth``); ``clock`` drives keep-alives and timeouts, ``wall_clock``
    (seconds since the Unix epoch) token expiry.  ``container_options`` go to every
    ``ContainerHost`` (e.g. ``restart_delay_seconds``), which passes the ones it does not know to its
    ``SegmentContainer`` (e.g. ``frame_bytes_max``).  The server does not close ``chunk_storage``:
    its creator does, after ``stop``.

    With ``attached_containers=True`` (a node of a cluster) the server starts no container itself:
    whoever decides what it serves (``millstream.cluster``'s node) hands it each running
    ``ContainerHost`` with ``attach_container`` and takes it back with ``detach_container``; every
    segment of a container not attached at that moment is answered ``WrongHost``.

    Use ``async with`` or ``start``/``stop``; everything runs on the loop that called ``start``."""

    def __init__(
        self,
        open_log: Callable[[int], DurableDataLog],
        *,
        config: ServerConfig | None = None,
        chunk_storage: ChunkStorage | None = None,
        storage_settings: StorageSettings | None = None,
        ssl_context: ssl.SSLContext | None = None,
        auth_secret: bytes | None = None,
        clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
        container_options: Mapping[str, Any] | None = None,
        attached_containers: bool = False,
    ) -> None:
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise InvalidArgumentError(f"ssl_context must be an ssl.SSLContext, not {type(ssl_context).__name__}")
        self.config = config if config is not None else ServerConfig()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.authorizer = Authorizer(auth_secret, now=wall_clock)
        self.budget = IngressBudget(self.config.in_flight_bytes_max, self.config.connection_in_flight_bytes_target,
                                    self.config.connection_in_flight_bytes_min)
        #: Bytes of partly received frames over every connection (``ReceiveBudget``).
        self.receive_budget = ReceiveBudget(self.config.receive_buffered_bytes_max,
                                            self.config.connection_receive_buffered_bytes_min)
        #: The one receive buffer every connection reads into (``Connection.get_buffer``): a read is
        #: decoded (and whatever must outlive it copied out) before the next read of any connection
        #: starts, so connections need no buffer of their own -- 4,096 of them once cost 1 GiB.
        #: ``receiving`` is set while a read is being processed; a read that starts meanwhile (no
        #: asyncio transport does that) gets a buffer of its own.
        self.receive_view = memoryview(bytearray(limits.SERVER_RECEIVE_BUFFER_BYTES))
        self.receiving = False
        #: Buffers of large frames already received, for the next ones (``FramePool``).
        self.frame_pool = FramePool(limits.SERVER_LARGE_FRAME_POOL_BYTES_MAX)
        self._per_address: dict[str, int] = {}
        self._open_log = open_log
        self._chunk_storage = chunk_storage
        self._storage_settings = storage_settings
        self._ssl_context = ssl_context
        self._container_options = dict(container_options or {})
        self._hosts: dict[int, ContainerHost] = {}
        #: True: containers come and go at run time (``attach_container``); the server starts none.
        self.attached_containers = attached_containers
        self._listener: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._connection_tasks: set[asyncio.Task[None]] = set()
        self._paused: set[Connection] = set()
        self._state = ServerState.NEW
        self._port = 0
        #: Bytes and events appended per segment, counted per block; drained by the controller.
        self.statistics = SegmentStatistics()
        #: The controller this node hosts (``attach_controller``); without one, ``ControllerRequest``s
        #: are answered ``OperationUnsupported`` -- unless one is expected (``expect_controller``): a
        #: node that hosts its controller starts it after the containers it keeps its state in, while
        #: the port is already open, and a request that comes meanwhile waits for it (bounded).
        self.controller: ControllerEndpoint | None = None
        self.controller_expected = False
        self.controller_settled = asyncio.Event()
        #: The transient segments of large events (``_transient``), swept on ``clock`` by ``_sweeper``.
        self.transients = TransientSegments(idle_seconds=self.config.transient_idle_seconds,
                                            grace_seconds=self.config.transient_disconnect_grace_seconds)
        self._sweeper: asyncio.Task[None] | None = None
        #: What peers can make the server say (a connection closed for bad input, a token refused, a
        #: connection refused) goes through this log: a flood of them becomes a summary per minute.
        self.log = RateLimitedLog(log, self.clock)
        self._housekeeper: asyncio.Task[None] | None = None
        #: Connections closed since the C heap's free pages were last given back (``_memory``).
        self._closed_since_trim = 0
        #: Times they were (evidence for tests and operators).
        self.memory_trims = 0
        #: Connections refused, by reason ("shutting_down", "connections_max", "per_address_max").
        self.refused_connections: dict[str, int] = {}
        #: Where readers' last reads ended (None: not tracked; ``enable_metrics`` turns it on).
        self.read_positions: ReadPositions | None = None
        #: Called with (container id, seconds from its arrival to its acknowledgement) for every append
        #: block stored (None: not measured; ``enable_metrics`` sets it).
        self.append_latency: Callable[[int, float], None] | None = None

    def enable_metrics(self, append_latency: Callable[[int, float], None] | None = None) -> None:
        """Keep what the node's metrics read beyond what the server keeps anyway: append totals for
        each scrape (``statistics.drain_totals``), readers' positions (``reader_lag``) and, with
        ``append_latency``, each append block's time to acknowledgement (one clock reading when it
        arrives and one when it is stored: per block, never per event)."""
        self.statistics.enable_totals()
        if self.read_positions is None:
            self.read_positions = ReadPositions()
        self.append_latency = append_latency

    def reader_lag(self) -> dict[int, tuple[int, int]]:
        """Per container with tracked readers: ``(the largest lag in bytes, positions tracked)``, where a
        reader's lag is its segment's length minus where its last read ended (segments that are gone
        or whose container is not serving are skipped)."""
        result: dict[int, tuple[int, int]] = {}
        if self.read_positions is None:
            return result
        for segment, offset in self.read_positions.items():
            try:
                length = self.container_for(segment).get_info(segment).length
            except MillstreamError:
                continue
            container_id = container_of(segment, self.config.container_count)
            largest, count = result.get(container_id, (0, 0))
            result[container_id] = (max(largest, length - offset), count + 1)
        return result

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every owned container (recovering it from its log), then listen.  A container that
        fails to start stops the ones already started and the error propagates."""
        if self._state is not ServerState.NEW:
            raise InternalError(f"a server starts once (it is {self._state.value})")
        self._transition("start")
        try:
            for container_id in (() if self.attached_containers else sorted(self.config.containers)):
                host = ContainerHost(container_id, self._opener(container_id), chunk_storage=self._chunk_storage,
                                     storage_settings=self._storage_settings, clock=self.clock,
                                     **self._container_options)
                await host.start()
                self._hosts[container_id] = host
            loop = asyncio.get_running_loop()
            self._listener = await loop.create_server(
                lambda: Connection(self), self.config.host, self.config.port, ssl=self._ssl_context,
                ssl_handshake_timeout=self.config.tls_handshake_timeout_seconds if self._ssl_context else None,
                reuse_address=True)
        except BaseException:
            await self._stop_hosts()
            self._transition("failed_to_start")
            raise
        self._port = self._listener.sockets[0].getsockname()[1]
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_transients(),
                                                               name="millstream-transient-sweep")
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeeping(), name="millstream-housekeeping")
        log.info("segment store listening on %s (containers %s of %d)", self.uri,
                 "attached at run time" if self.attached_containers else sorted(self.config.containers),
                 self.config.container_count)

    def _opener(self, container_id: int) -> Callable[[], DurableDataLog]:
        return lambda: self._open_log(container_id)

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting; stop reading; let appends and administration already
        received finish and be answered (at most ``config.shutdown_drain_seconds``); close every
        connection; stop the containers (which drain their own in-flight writes, bounded)."""
        if self._state in (ServerState.STOPPING, ServerState.STOPPED):
            return
        if self._state is ServerState.NEW:
            self._transition("stop")
            return
        self._transition("stop")
        for task in (self._sweeper, self._housekeeper):
            if task is not None:
                await cancel_and_wait(task)
        self._sweeper = self._housekeeper = None
        if self._listener is not None:
            self._listener.close()
        connections = list(self._connections)
        for connection in connections:
            connection.begin_drain()
        if connections:
            quiet = asyncio.ensure_future(_all_quiet(connections))
            deadline = asyncio.ensure_future(self.clock.sleep(self.config.shutdown_drain_seconds))
            try:
                done, _ = await asyncio.wait((quiet, deadline), return_when=asyncio.FIRST_COMPLETED)
            finally:
                quiet.cancel()
                deadline.cancel()
            if quiet not in done:
                log.warning("shutdown: connections still had work after %.1f s; closing them anyway",
                            self.config.shutdown_drain_seconds)
        for connection in list(self._connections):
            connection.close("the server is shutting down")
        if self._connection_tasks:
            await asyncio.wait(set(self._connection_tasks), timeout=self.config.shutdown_drain_seconds)
        for task in list(self._connection_tasks):
            task.cancel()
        if self._connection_tasks:
            await asyncio.gather(*self._connection_tasks, return_exceptions=True)
        if self._listener is not None:
            await self._listener.wait_closed()
        await self._stop_hosts()
        self._transition("stopped")
        self.log.flush(force=True)
        log.info("segment store on port %d stopped", self._port)

    async def _stop_hosts(self) -> None:
        hosts, self._hosts = self._hosts, {}
        if self.attached_containers:
            return  # (attached hosts belong to whoever attached them: it stops them)
        for host in hosts.values():
            try:
                await host.stop()
            except Exception:
                log.exception("stopping container %d failed", host.container_id)

    @property
    def state(self) -> ServerState:
        return self._state

    def _transition(self, event: str) -> None:
        following = SERVER_LIFECYCLE.get((self._state, event))
        if following is None:
            raise InternalError(f"server: no transition from {self._state.value} on {event!r}")
        self._state = following

    async def __aenter__(self) -> SegmentStoreServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- where it listens ----------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.config.host

    @property
    def port(self) -> int:
        """The port it listens on (the one picked, if configured as 0); 0 before ``start``."""
        return self._port

    @property
    def uri(self) -> str:
        """``tcp://host:port`` (``tls://`` with TLS on)."""
        return f"{'tls' if self._ssl_context is not None else 'tcp'}://{self.host}:{self._port}"

    @property
    def tls(self) -> bool:
        return self._ssl_context is not None

    # --- containers ------------------------------------------------------------------------------------------

    def container_host(self, container_id: int) -> ContainerHost:
        """The host of an owned container (tests use it to fail or inspect one)."""
        try:
            return self._hosts[container_id]
        except KeyError:
            raise WrongHostError(f"container {container_id} is not hosted here") from None

    @property
    def serving(self) -> frozenset[int]:
        """The containers attached (or started) here at this moment."""
        return frozenset(self._hosts)

    def attach_container(self, container_id: int, host: ContainerHost) -> None:
        """Serve container ``container_id`` through ``host`` (started by the caller) from now on.
        Only for a server built with ``attached_containers=True``; raises ``InvalidArgumentError`` for
        an id outside ``range(container_count)``, one attached already or a host of another id, and
        ``ObjectClosedError`` once the server stops (the caller keeps and stops the host)."""
        if not self.attached_containers:
            raise InvalidArgumentError("this server starts its own containers (attached_containers=False)")
        if isinstance(container_id, bool) or not isinstance(container_id, int) \
                or not 0 <= container_id < self.config.container_count:
            raise InvalidArgumentError(f"container_id must lie in range({self.config.container_count}), "
                                       f"not {container_id!r}")
        if host.container_id != container_id:
            raise InvalidArgumentError(f"the host is container {host.container_id}'s, not {container_id}'s")
        if container_id in self._hosts:
            raise InvalidArgumentError(f"container {container_id} is attached already")
        if self._state in (ServerState.STOPPING, ServerState.STOPPED):
            raise ObjectClosedError("the server is stopping")
        self._hosts[container_id] = host

    def detach_container(self, container_id: int) -> ContainerHost | None:
        """Stop serving container ``container_id``: new requests for its segments are answered
        ``WrongHost`` from now on; requests already handed to the container finish or fail as the
        container does when its owner stops it (``ContainerUnavailableError``, retryable).  Returns its
        host (None if it was not attached); the caller stops it.  The server never stops a detached
        host itself."""
        if not self.attached_containers:
            raise InvalidArgumentError("this server starts its own containers (attached_containers=False)")
        return self._hosts.pop(container_id, None)

    def container_for(self, segment: str) -> SegmentContainer:
        """The running container that owns ``segment``.  Raises ``WrongHostError`` if this server
        does not own it, ``ContainerUnavailableError`` while it restarts, ``ObjectClosedError``
        once the server stopped, ``InvalidArgumentError`` for a name that is not a str of 1 to
        ``limits.SEGMENT_NAME_LENGTH_BYTES_MAX`` UTF-8 bytes."""
        validate_segment_name(segment)  # (before hashing it: container_of remembers the names it saw)
        container_id = container_of(segment, self.config.container_count)
        host = self._hosts.get(container_id)
        if host is None:
            if self._state not in (ServerState.RUNNING, ServerState.STOPPING):
                raise ObjectClosedError("the server is not running")
            raise WrongHostError(f"segment {segment!r} lives in container {container_id}, not hosted here")
        return host.container

    def protocol_factory(self) -> asyncio.BufferedProtocol:
        """The protocol for one more client connection over a transport this server did not accept
        itself -- a simulated network's (``millstream.testing.network``: ``network.listen(host, port,
        server.protocol_factory)``).  Its ``connection_made`` adopts it as an accepted socket would be
        (refused unless the server is running, and counted against ``connections_max``)."""
        return Connection(self)

    def expect_controller(self) -> None:
        """A controller will be attached once it has started: ``ControllerRequest``s that come before
        wait for it (up to ``limits.CONTROLLER_START_WAIT_SECONDS``) instead of being refused."""
        self.controller_expected = True

    def attach_controller(self, controller: ControllerEndpoint | None) -> None:
        """Serve ``ControllerRequest``s with ``controller`` from now on (None: stop serving them; the
        requests waiting for an expected controller are then refused)."""
        self.controller = controller
        self.controller_expected = False
        self.controller_settled.set()

    # --- transient segments (large events) ----------------------------------------------------------------------

    async def _sweep_transients(self) -> None:
        """Every ``transient_sweep_interval_seconds`` (on the server's clock), delete the transient
        segments whose writer went away or that stayed idle (``expire_transient_segments``)."""
        interval = self.config.transient_sweep_interval_seconds
        while True:
            await self.clock.sleep(interval)
            try:
                await self.expire_transient_segments()
            except MillstreamError as error:  # a container restarting: the next sweep tries again
                log.info("transient-segment sweep: %s", error)

    async def _housekeeping(self) -> None:
        """Every ``SERVER_HOUSEKEEPING_INTERVAL_SECONDS``: summarize what ``log`` held back (whose
        windows ended), and give freed memory back after many connections closed (the frame pool's
        buffers too)."""
        while True:
            await self.clock.sleep(limits.SERVER_HOUSEKEEPING_INTERVAL_SECONDS)
            self.log.flush()
            if self._closed_since_trim >= limits.SERVER_MEMORY_TRIM_AFTER_CLOSES:
                self._closed_since_trim = 0
                self.frame_pool.clear()  # (the writers still here refill it with their next blocks)
                trim_memory()
                self.memory_trims += 1

    async def expire_transient_segments(self) -> list[str]:
        """One sweep: adopt transient segments the containers hold without a record (recovered from
        their logs), then delete those past their grace period or idle time.  Returns the names
        deleted.  Tests call it after advancing a manual clock."""
        now = self.clock.monotonic()
        for host in list(self._hosts.values()):
            try:
                container = host.container
            except MillstreamError:
                continue  # restarting: its segments are adopted by a later sweep
            for name in container.segment_names():
                if is_transient_segment(name):
                    self.transients.adopt(name, now)
        deleted = []
        for name, cause in self.transients.due(now):
            try:
                await self.container_for(name).delete(name)
            except StreamSegmentNotExistsError:
                pass  # merged or deleted meanwhile (or lost with a container that recovered without it)
            except MillstreamError as error:
                self.log.info("transient segment %s: deletion deferred (%s)", name,
                              error)
                continue
            if self.transients.get(name) is not None:
                self.transients.deleted(name, cause)
                deleted.append(name)
                self.log.info("deleted transient segment %s (%s)", name,
                              "its writer's connection stayed closed" if cause == "disconnect" else "idle")
        return deleted

    # --- connections (called by Connection) ---------------------------------------------------------------------

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._connections)

    def adopt(self, connection: Connection) -> None:
        """Serve ``connection``, or refuse it (closed at once, logged) while the server is not running,
        has ``config.connections_max`` connections open, or has ``config.connections_per_address_max``
        open from the connection's peer address."""
        address = connection.peer_address
        reason: str | None
        if self._state is not ServerState.RUNNING:
            reason, refusal = "shutting_down", "the server is shutting down"
        elif len(self._connections) >= self.config.connections_max:
            reason, refusal = "connections_max", f"{self.config.connections_max} connections are open"
        elif self._per_address.get(address, 0) >= self.config.connections_per_address_max:
            reason = "per_address_max"
            refusal = f"{self.config.connections_per_address_max} connections from {address} are open"
        else:
            reason = refusal = None
        if reason is not None and refusal is not None:
            self.refused_connections[reason] = self.refused_connections.get(reason, 0) + 1
            self.log.warning("refusing connection %s: %s", connection.peer, refusal)
            connection.close("refused")
            return
        self._per_address[address] = self._per_address.get(address, 0) + 1
        connection.adopted = True
        self._connections.add(connection)
        task = asyncio.get_running_loop().create_task(connection.run(), name=f"connection {connection.peer}")
        self._connection_tasks.add(task)
        task.add_done_callback(self._connection_tasks.discard)

    def forget(self, connection: Connection) -> None:
        if connection in self._connections:
            self._closed_since_trim += 1
            address = connection.peer_address
            count = self._per_address.get(address, 0) - 1
            if count > 0:
                self._per_address[address] = count
            else:
                self._per_address.pop(address, None)
        self._connections.discard(connection)
        self._paused.discard(connection)
        if self.read_positions is not None:
            self.read_positions.forget(connection)

    def on_receive_released(self) -> None:
        """Bytes of partly received frames were given back: offer the room to the connections that
        wait for it, in the order they began to wait (``ReceiveBudget``)."""
        budget = self.receive_budget
        for connection in list(budget.waiting):
            if connection in budget.waiting:
                connection.retry_receive()  # type: ignore[attr-defined]
            if budget.exhausted and budget.exempt is not None:
                break  # (nobody further can be granted more now)

    def watch_paused(self, connection: Connection) -> None:
        """``connection`` stopped reading for lack of budget: re-check it when bytes are released."""
        self._paused.add(connection)

    def on_released(self) -> None:
        if self._paused:
            paused, self._paused = self._paused, set()
            for connection in paused:
                connection.recheck_reading()

    @property
    def in_flight_bytes(self) -> int:
        return self.budget.total

    def check_invariants(self) -> None:
        total = sum(c.in_flight_bytes for c in self._connections)
        assert total == self.budget.total, (total, self.budget.total)
        assert self.budget.total >= 0
        buffered = sum(c.receive_buffered_bytes for c in self._connections)
        assert buffered == self.receive_budget.total, (buffered, self.receive_budget.total)
        self.receive_budget.check_invariants()
        self.frame_pool.check_invariants()
        per_address: dict[str, int] = {}
        for connection in self._connections:
            per_address[connection.peer_address] = per_address.get(connection.peer_address, 0) + 1
        assert per_address == self._per_address, (per_address, self._per_address)
        for connection in self._connections:
            connection.check_invariants()
        self.statistics.check_invariants()
        if self.read_positions is not None:
            self.read_positions.check_invariants()
        self.transients.check_invariants()
        self.log.check_invariants()


async def _all_quiet(connections: list[Connection]) -> None:
    for connection in connections:
        await connection.wait_quiet()
