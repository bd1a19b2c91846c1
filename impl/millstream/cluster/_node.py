"""ClusterNode: one millstream segment-store host of a cluster (issue 23; DESIGN §10).

Theory of operation.  A node is three parts on one event loop:

* a ``SegmentStoreServer`` built with ``attached_containers=True``: it listens from the start but
  serves no container of its own accord; every segment of a container not attached at that moment
  is answered ``WrongHost``;
* a ``ContainerManager`` that starts and stops ``ContainerHost``s as the cluster's map changes, on
  the injected ``open_log(container_id)`` (opening a log fences its previous owner) and the shared
  Tier-2 ``chunk_storage``.  It attaches each container to the server once it has recovered and
  detaches it *before* stopping it, so new requests meet ``WrongHost`` at once while requests
  already inside the container finish or fail with its retryable ``ContainerUnavailableError``
  (reads waiting at a tail included);
* a ``ClusterMember`` registering the server's address (``host:port``, the port the server got) in
  ZooKeeper, taking part in the election and handing every map to the manager.  Session loss stops
  every container (the member tells the manager); the node then serves nothing, and ``stopped``
  completes with the ``SessionLostError`` so its owner can stop it and start a new node.

Start order: server (listening, so the address registered is real), manager, member (only now can
a map give this node work).  Stop order is the reverse of what can create work: member first (it
resigns and its registration disappears at once, so the leader moves its containers away), then the
manager (stopping every container: their logs are quiet for the next owner), then the server.

Tier 1 and Tier 2 are the caller's: ``FileLog`` under a directory every host mounts works (tests),
``JetStreamLog`` for a replicated log; ``FileChunkStorage`` on a shared directory for Tier 2.  The
node does not close ``chunk_storage``: its creator does, after ``stop``.

The controller.  It runs on exactly one node: the one serving the container of the controller's
metadata segment (``controller_container``).  When the manager attaches that container here, the node
starts a ``Controller`` over a ``ClusterSegmentStore`` (this node's containers in process, every other
container over the wire, where the map puts it); the controller recovers its state from the metadata
log as a restarted standalone controller does.  When the container leaves (the map moves it, the node
stops, the session is lost), the node stops serving controller requests at once, before the container
is detached, and stops the controller: the container's next owner starts the next one.  A controller
cut off without noticing (a zombie) cannot change anything: its metadata log's appends are
conditional, and the new owner's log fences the old one.  The controller serves on the node's own
port.  Every controller tick the node also collects the other nodes' append counts for it
(``ClusterSegmentStore.collect_append_counts``), so auto-scaling sees the whole cluster's appends.

Every node answers ``ControllerRequest``s (``ClusterControllerEndpoint``): with its controller when it
runs one; otherwise with ``WrongHostError`` (nothing was done: a client may resend any call), and
every node answers ``locate_controller`` with the controller node's URI from the map, so a client
given any node's address (a *seed*) finds the controller, and finds it again after it moved.
``segment_uri`` gives the answer a cluster controller gives ``get_segment_uri`` (the registered
address of the host the map gives the segment's container).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
import ssl
from collections.abc import Callable, Mapping
from typing import Any, Final

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from millstream import limits
from millstream.auth import Authorizer
from millstream.cluster._containers import ContainerManager
from millstream.cluster._segment_store import DRAIN_APPEND_COUNTS, ClusterSegmentStore
from millstream.cluster._zookeeper import Assignment, ClusterMember
from millstream.controller import Controller, ControllerConfig, ControllerRpc
from millstream.controller._rpc import METHODS
from millstream.errors import (
    AuthenticationError,
    ContainerUnavailableError,
    CoordinationUnavailableError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    WrongHostError,
)
from millstream.naming import container_of, validate_segment_name
from millstream.retry import RetryPolicy, retry_bounded
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.host import ContainerHost
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.tasks import cancel_and_wait
from millstream.values import canonical_json

__all__ = ["LOCATE_CONTROLLER", "ClusterControllerEndpoint", "ClusterNode"]

#: The ``ControllerRequest`` method every node of a cluster answers (body: ``{}`` or ``{"token": ...}``)
#: with ``{"uri": "tcp://host:port"}``, the node that runs the controller now.
LOCATE_CONTROLLER = "locate_controller"

#: The znode under the cluster's root that holds the peer token: random hex, written once by the first
#: node.  A node's requests carrying it may do what a node may (``Authorizer.trust_peer_token``): the
#: controller creates and merges transaction segments and reader groups' state in other nodes'
#: containers, which clients may not.  ZooKeeper is the cluster's own service: whoever can read it can
#: also rewrite the container map.
PEER_TOKEN_ZNODE = "peer-token"
#: Random bytes in the peer token (hex: twice as many characters).
PEER_TOKEN_BYTES = 32
#: The bytes of one ``[name, bytes, events]`` entry of a ``DRAIN_APPEND_COUNTS`` reply beside its name:
#: brackets, quotes, commas and two 64-bit integers in decimal.
_COUNTS_ENTRY_BYTES_MAX = 48

log = logging.getLogger("millstream.cluster")

#: How a node starts its controller again after a failure (``_run_controller``): at most
#: ``limits.CLUSTER_CONTROLLER_START_ATTEMPTS_MAX`` attempts in all.
_CONTROLLER_START_RETRY: Final = RetryPolicy(
    (MillstreamError,), retries_max=limits.CLUSTER_CONTROLLER_START_ATTEMPTS_MAX - 1,
    delay_seconds=limits.CLUSTER_CONTROLLER_START_DELAY_SECONDS,
    delay_seconds_max=limits.CLUSTER_CONTROLLER_START_DELAY_SECONDS_MAX)


class ClusterNode:
    """One host of cluster ``cluster`` on the ZooKeeper ensemble ``zookeeper`` (``HOST:PORT[,...]``),
    registered as ``host_id``.  ``config`` is the server's (``config.container_count`` is the
    cluster's; ``owned_containers`` is ignored: the map decides).  ``advertised_host`` is the address
    other hosts and clients reach it at (default: ``config.host``).  ``host_options`` go to every
    ``ContainerHost``; ``server_options`` to the ``SegmentStoreServer``; ``controller_config`` to the
    controller, while this node runs it.  ``peer_ssl_context`` (a client-side ``ssl.SSLContext``) is
    what this node's controller trusts when it reaches other nodes of a cluster that serves TLS
    (default: the system's trust store, which a private authority's certificates do not pass).

    ``await start()`` raises ``CoordinationUnavailableError`` (nothing left running) if ZooKeeper
    does not answer in ``connect_timeout_seconds``.  ``stopped`` completes when the member stops
    (None) or loses its session (``SessionLostError``)."""

    def __init__(
        self,
        zookeeper: str,
        *,
        cluster: str,
        host_id: str,
        open_log: Callable[[int], DurableDataLog],
        chunk_storage: ChunkStorage | None = None,
        config: ServerConfig | None = None,
        advertised_host: str | None = None,
        session_timeout_seconds: float = limits.ZOOKEEPER_SESSION_TIMEOUT_SECONDS,
        connect_timeout_seconds: float = limits.ZOOKEEPER_CONNECT_TIMEOUT_SECONDS,
        host_options: Mapping[str, Any] | None = None,
        server_options: Mapping[str, Any] | None = None,
        controller_config: ControllerConfig | None = None,
        peer_ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if peer_ssl_context is not None and not isinstance(peer_ssl_context, ssl.SSLContext):
            raise InvalidArgumentError(f"peer_ssl_context must be an ssl.SSLContext, not "
                                       f"{type(peer_ssl_context).__name__}")
        if advertised_host is not None and (not isinstance(advertised_host, str) or not advertised_host):
            raise InvalidArgumentError(f"advertised_host must be a non-empty string, not {advertised_host!r}")
        self.config = config if config is not None else ServerConfig()
        self.server = SegmentStoreServer(open_log, config=self.config, chunk_storage=chunk_storage,
                                         attached_containers=True, **dict(server_options or {}))
        self.manager = ContainerManager(host_id, open_log, chunk_storage=chunk_storage, host_options=host_options,
                                        on_serving=self._serving, on_leaving=self._leaving, claims=self)
        self._zookeeper = zookeeper
        self._cluster = cluster
        self.host_id = host_id
        self._advertised_host = advertised_host
        self._session_timeout_seconds = session_timeout_seconds
        self._connect_timeout_seconds = connect_timeout_seconds
        self.member: ClusterMember | None = None
        #: The member from the moment it is made (its maps may reach the manager before ``start`` returns).
        self._joining: ClusterMember | None = None
        self._started = False
        #: host id -> its registered address, as last read from ZooKeeper (addresses never change).
        self._addresses: dict[str, str] = {}
        self._controller_config = controller_config or ControllerConfig()
        self._peer_ssl_context = peer_ssl_context
        #: The controller, while this node runs it; and the task starting or stopping it.
        self.controller: Controller | None = None
        self._controller_task: asyncio.Task[None] | None = None
        self._store: ClusterSegmentStore | None = None
        self._peer_token: str | None = None
        #: Append counts drained from the server but not yet sent to a controller (``drain_append_counts_reply``).
        self._undelivered_counts: dict[str, list[int]] = {}
        self._collecting: asyncio.Task[None] | None = None
        self._refreshing: set[asyncio.Task[None]] = set()
        self.endpoint = ClusterControllerEndpoint(self, self.server.authorizer)

    @property
    def controller_container(self) -> int:
        """The container holding the controller's metadata segment: its owner runs the controller."""
        return container_of(self._controller_config.metadata_segment, self.config.container_count)

    # --- Lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, start the manager, join the cluster (in that order; see the module docstring)."""
        if self._started:
            raise InvalidArgumentError("the node was started already")
        self._started = True
        await self.server.start()
        self.server.attach_controller(self.endpoint)
        try:
            await self.manager.start()
            member = ClusterMember(
                self._zookeeper, cluster=self._cluster, host_id=self.host_id, address=self.address,
                container_count=self.config.container_count, on_assignment=self._on_assignment,
                on_suspended=self.manager.suspend, on_session_lost=self.manager.session_lost,
                on_claim=self.manager.claim_changed,
                session_timeout_seconds=self._session_timeout_seconds,
                connect_timeout_seconds=self._connect_timeout_seconds)
            self._joining = member
            await member.start()
            self.member = member
            self.server.authorizer.trust_peer_token(await self._read_peer_token(member))
        except BaseException:
            if self.member is not None:  # (the peer token could not be read: leave again)
                await self.member.stop()
            await self.manager.stop()
            await self.server.stop()
            raise
        log.info("node %s of cluster %s serves at %s", self.host_id, self._cluster, self.address)

    async def stop(self) -> None:
        """Leave the cluster, stop every container, stop the server.  Idempotent."""
        if self.member is not None:
            await self.member.stop()
        await self.manager.stop()
        for task in list(self._refreshing):
            await cancel_and_wait(task)
        if self._controller_task is not None:
            await asyncio.wait([self._controller_task])  # (its failure, if any, was logged)
        await self.server.stop()

    async def __aenter__(self) -> ClusterNode:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def stopped(self) -> asyncio.Future[BaseException | None] | None:
        """Completes when the member stops or loses its session (None before ``start``)."""
        return None if self.member is None else self.member.stopped

    # --- Where it serves, and what ---------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` as registered in ZooKeeper (valid once started)."""
        return f"{self._advertised_host or self.server.host}:{self.server.port}"

    @property
    def uri(self) -> str:
        return self.server.uri

    @property
    def serving(self) -> frozenset[int]:
        """The containers the server answers for at this moment."""
        return self.server.serving

    async def segment_uri(self, segment: str) -> str:
        """Where ``segment`` is served, from the cluster's map: ``tcp://host:port`` (``tls://`` with TLS
        on) of the host that owns the segment's container (the answer a cluster controller gives ``get_segment_uri``).
        Raises ``InvalidArgumentError`` for a bad name, ``ContainerUnavailableError`` (retryable) while
        the map gives the container to nobody or its owner's registration is gone (it is moving), and
        ``ObjectClosedError`` unless the node runs."""
        validate_segment_name(segment)
        member = self.member
        if member is None or member.stopped is None or member.stopped.done():
            raise ObjectClosedError("the node is not a running member of the cluster")
        container_id = container_of(segment, self.config.container_count)
        owner = member.assignment.containers.get(container_id)
        if owner is None:
            raise ContainerUnavailableError(f"container {container_id} is assigned to no host yet")
        return self._uri_of_address(await self._address_of(member, owner, container_id))

    async def _address_of(self, member: ClusterMember, owner: str, container_id: int) -> str:
        """Host ``owner``'s registered address, read from ZooKeeper (and remembered)."""
        try:
            data, _ = await asyncio.to_thread(
                lambda: member.client.get_async(member.paths.host(owner)).get(
                    timeout=limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS))
        except NoNodeError:
            raise ContainerUnavailableError(
                f"container {container_id}'s host {owner} left the cluster; it is being reassigned") from None
        except KazooException as error:
            raise CoordinationUnavailableError(f"ZooKeeper did not say where host {owner} is: {error!r}") from error
        address: str = data.decode()
        self._addresses[owner] = address
        return address

    def known_segment_uri(self, segment: str) -> str:
        """``segment_uri`` from the map this node holds and the addresses it has read already, without
        asking ZooKeeper (for ``get_segment_uri`` and the segments a controller lists).  Raises
        ``ContainerUnavailableError`` while the map gives the container to nobody or to a host whose
        address this node has not read yet (``refresh_addresses`` reads them)."""
        validate_segment_name(segment)
        member = self.member
        if member is None:
            raise ObjectClosedError("the node is not a running member of the cluster")
        container_id = container_of(segment, self.config.container_count)
        owner = member.assignment.containers.get(container_id)
        address = None if owner is None else self._addresses.get(owner)
        if address is None:
            raise ContainerUnavailableError(f"container {container_id} is moving (owner {owner!r} not known yet)")
        return self._uri_of_address(address)

    async def refresh_addresses(self) -> None:
        """Read the address of every host the current map names that this node has not read yet."""
        member = self.member
        if member is None:
            return
        for owner in sorted(set(member.assignment.containers.values()) - set(self._addresses)):
            container_id = min(c for c, host in member.assignment.containers.items() if host == owner)
            with contextlib.suppress(ContainerUnavailableError, CoordinationUnavailableError):
                await self._address_of(member, owner, container_id)

    async def _read_peer_token(self, member: ClusterMember) -> str:
        """The cluster's peer token (``PEER_TOKEN_ZNODE`` under the cluster's root): read, or created
        by the first node that finds none (created once; a node that loses the race reads the winner's)."""
        if self._peer_token is not None:
            return self._peer_token
        path = f"{member.paths.root}/{PEER_TOKEN_ZNODE}"
        client = member.client

        def read_or_create() -> str:
            with contextlib.suppress(NodeExistsError):
                client.create(path, secrets.token_hex(PEER_TOKEN_BYTES).encode(), makepath=True)
            data, _ = client.get(path)
            return str(data.decode())

        try:
            token = await asyncio.wait_for(asyncio.to_thread(read_or_create),
                                           limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS)
        except (KazooException, TimeoutError) as error:
            raise CoordinationUnavailableError(f"ZooKeeper did not give the cluster's peer token: {error!r}") \
                from error
        self._peer_token = token
        return token

    def peer_uris(self) -> list[str]:
        """The URIs of the other hosts the map names, whose addresses this node has read."""
        member = self.member
        owners = set() if member is None else set(member.assignment.containers.values())
        return [self._uri_of_address(self._addresses[owner]) for owner in sorted(owners - {self.host_id})
                if owner in self._addresses]

    def drain_append_counts_reply(self, body: bytes) -> bytes:
        """The reply to ``DRAIN_APPEND_COUNTS``: this node's append counts since the last one, at most
        ``limits.CLUSTER_APPEND_COUNTS_REPLY_BYTES_MAX`` of them (``"more"``: the rest wait for the next
        request).  Only for a body carrying the peer token (``AuthenticationError`` otherwise)."""
        if len(body) > limits.CONTROLLER_REQUEST_BODY_BYTES_MAX:
            raise InvalidArgumentError(f"{DRAIN_APPEND_COUNTS}: a body of {len(body)} bytes is too large")
        try:
            token = json.loads(body).get("token")
        except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
            raise InvalidArgumentError(f"{DRAIN_APPEND_COUNTS}: the body is {{\"token\": str}}") from None
        if self._peer_token is None or not isinstance(token, str) \
                or not hmac.compare_digest(token.encode("utf-8", "replace"), self._peer_token.encode()):
            raise AuthenticationError(f"{DRAIN_APPEND_COUNTS} is for the cluster's nodes (their peer token) only")
        for name, (size, events) in self.server.statistics.drain().items():
            counts = self._undelivered_counts.get(name)
            if counts is not None:
                counts[0] += size
                counts[1] += events
            elif len(self._undelivered_counts) < limits.STATISTICS_SEGMENTS_MAX:
                self._undelivered_counts[name] = [size, events]
        entries: list[list[object]] = []
        budget = limits.CLUSTER_APPEND_COUNTS_REPLY_BYTES_MAX
        for name in list(self._undelivered_counts):
            budget -= len(name.encode()) + _COUNTS_ENTRY_BYTES_MAX
            if budget < 0:
                break
            size, events = self._undelivered_counts.pop(name)
            entries.append([name, size, events])
        return canonical_json({"counts": entries, "more": bool(self._undelivered_counts)})

    async def _collect_append_counts(self, store: ClusterSegmentStore) -> None:
        """Every controller tick, bring the other nodes' append counts to the controller's store."""
        while True:
            await self.server.clock.sleep(self._controller_config.tick_seconds)
            try:
                await store.collect_append_counts()
            except Exception:  # one failed round must not end the collection for good
                log.exception("node %s: collecting the append counts failed", self.host_id)

    async def controller_uri(self) -> str:
        """Where the controller runs now: the URI of the node serving ``controller_container``."""
        return await self.segment_uri(self._controller_config.metadata_segment)

    def _uri_of_address(self, address: str) -> str:
        return f"{'tls' if self.server.tls else 'tcp'}://{address}"  # (a cluster's hosts all use TLS or none)

    # --- The controller (see the module docstring) -----------------------------------------------------

    async def _run_controller(self, previous: asyncio.Task[None] | None) -> None:
        """Start the controller over the whole cluster, after ``previous`` (a stop) is done; again after
        a failure (a container it must reach still moving), with doubling delays on the server's clock,
        at most ``limits.CLUSTER_CONTROLLER_START_ATTEMPTS_MAX`` times.  (The node leaving the container
        cancels this.)"""
        if previous is not None:
            await asyncio.wait([previous])  # (its failure, if any, was logged)
        def failed(error: Exception, attempt: int, delay: float | None) -> None:
            if delay is not None:
                log.warning("node %s: the controller did not start (attempt %d of %d; again in %.2f s): %s",
                            self.host_id, attempt, limits.CLUSTER_CONTROLLER_START_ATTEMPTS_MAX, delay, error)
        await retry_bounded(self._start_controller, _CONTROLLER_START_RETRY, self.server.clock, on_failure=failed)

    async def _start_controller(self) -> None:
        await self.refresh_addresses()
        member = self._claims()
        store = self._store = ClusterSegmentStore(self.server, self, clock=self.server.clock,
                                                  token=await self._read_peer_token(member),
                                                  ssl_context=self._peer_ssl_context)
        controller = Controller(store, clock=self.server.clock, config=self._controller_config)
        try:
            await controller.start()
        except BaseException:
            await store.close()
            raise
        self.controller = controller
        if self._controller_config.periodic:
            self._collecting = asyncio.get_running_loop().create_task(
                self._collect_append_counts(store), name=f"millstream-append-counts-{self.host_id}")
        self.endpoint.rpc = ControllerRpc(controller, self.server.authorizer)
        log.info("node %s runs the cluster's controller", self.host_id)

    async def _stop_controller(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await cancel_and_wait(previous)
        collecting, self._collecting = self._collecting, None
        if collecting is not None:
            await cancel_and_wait(collecting)
        controller, self.controller = self.controller, None
        store, self._store = self._store, None
        if controller is not None:
            await controller.stop()
        if store is not None:
            await store.close()
        if controller is not None:
            log.info("node %s stopped the cluster's controller", self.host_id)

    def _controller_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("node %s: the controller failed to start or stop", self.host_id, exc_info=task.exception())

    # --- The manager's container claims (``ContainerClaims``), kept by the member on ZooKeeper ----------

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        return await self._claims().claim_container(container_id, host_id, map_version)

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        return await self._claims().container_claim(container_id)

    def _claims(self) -> ClusterMember:
        if self._joining is None:
            raise CoordinationUnavailableError("the node has not joined the cluster")
        return self._joining

    def _on_assignment(self, assignment: Assignment) -> None:
        self.manager.apply(assignment)
        if self.controller is not None and set(assignment.containers.values()) - set(self._addresses):
            task = asyncio.get_running_loop().create_task(self.refresh_addresses(),
                                                          name=f"millstream-addresses-{self.host_id}")
            self._refreshing.add(task)
            task.add_done_callback(self._refreshing.discard)

    def _serving(self, container_id: int, host: ContainerHost) -> None:
        self.server.attach_container(container_id, host)
        if container_id == self.controller_container:
            self._controller_task = asyncio.get_running_loop().create_task(
                self._run_controller(self._controller_task), name=f"millstream-controller-start-{self.host_id}")
            self._controller_task.add_done_callback(self._controller_done)

    def _leaving(self, container_id: int) -> None:
        if container_id == self.controller_container:
            self.endpoint.rpc = None  # (from now on controller requests are answered WrongHost)
            self._controller_task = asyncio.get_running_loop().create_task(
                self._stop_controller(self._controller_task), name=f"millstream-controller-stop-{self.host_id}")
            self._controller_task.add_done_callback(self._controller_done)
        self.server.detach_container(container_id)


class ClusterControllerEndpoint:
    """The ``ControllerEndpoint`` of every cluster node: its controller's RPC while it runs one
    (``rpc``), else ``WrongHostError`` for every controller method; ``locate_controller`` always."""

    def __init__(self, node: ClusterNode, authorizer: Authorizer | None) -> None:
        self._node = node
        self._authorizer = authorizer
        self.rpc: ControllerRpc | None = None

    def knows(self, method: str) -> bool:
        return method in (LOCATE_CONTROLLER, DRAIN_APPEND_COUNTS) or method in METHODS

    async def handle(self, method: str, body: bytes) -> bytes:
        if method == LOCATE_CONTROLLER:
            return await self._locate(body)
        rpc = self.rpc
        if method == DRAIN_APPEND_COUNTS:
            return self._node.drain_append_counts_reply(body)
        if rpc is None:
            raise WrongHostError(f"the cluster's controller does not run on {self._node.host_id}: ask "
                                 f"{LOCATE_CONTROLLER} where it runs")
        try:
            return await rpc.handle(method, body)
        except ObjectClosedError as error:
            if self.rpc is rpc:
                raise
            # The controller left this node under the request (its container moved; its store was closed):
            # a retryable error whose outcome is unknown, not the caller's "closed" object.
            raise ContainerUnavailableError(
                f"the cluster's controller left {self._node.host_id} during {method}, which may or may not have "
                f"taken effect: {error}") from error

    async def _locate(self, body: bytes) -> bytes:
        if len(body) > limits.CONTROLLER_REQUEST_BODY_BYTES_MAX:
            raise InvalidArgumentError(f"{LOCATE_CONTROLLER}: a body of {len(body)} bytes is too large")
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise InvalidArgumentError(f"{LOCATE_CONTROLLER}: the request body is not JSON") from None
        if not isinstance(request, dict) or set(request) - {"token"} or not isinstance(request.get("token", ""), str):
            raise InvalidArgumentError(f"{LOCATE_CONTROLLER}: the body is {{}} or {{\"token\": str}}")
        if self._authorizer is not None:
            self._authorizer.check_authentic(request.get("token", ""))
        try:
            uri = await self._node.controller_uri()
        except ObjectClosedError as error:
            # This node is stopping (or not yet a member): the caller's objects are fine, and another node
            # can say -- a retryable error, not the caller's "closed".
            raise ContainerUnavailableError(f"{self._node.host_id} is not a running member of the cluster: ask "
                                            f"another node where the controller runs ({error})") from error
        return canonical_json({"uri": uri})
