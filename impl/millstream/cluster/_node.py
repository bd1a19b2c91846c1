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

The controller.  Not hosted by a cluster node yet.  ``segment_uri`` gives the answer a cluster
controller must give ``get_segment_uri`` (the registered address of the host the map gives the
segment's container), but the controller itself reaches segments through ``LocalSegmentStore`` (this
process's containers only), while a cluster controller must create and read segments in every
container, wherever it runs.  The intended placement (issue 23) is the node owning the container of
the controller's metadata segment, moving with it; it needs a ``SegmentStore`` that reaches other
hosts over the wire first.  Until then a cluster serves the segment-level protocol only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError

from millstream import limits
from millstream.cluster._containers import ContainerManager
from millstream.cluster._zookeeper import ClusterMember
from millstream.errors import (
    ContainerUnavailableError,
    CoordinationUnavailableError,
    InvalidArgumentError,
    ObjectClosedError,
)
from millstream.naming import container_of, validate_segment_name
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.host import ContainerHost
from millstream.server import SegmentStoreServer, ServerConfig

__all__ = ["ClusterNode"]

log = logging.getLogger("millstream.cluster")


class ClusterNode:
    """One host of cluster ``cluster`` on the ZooKeeper ensemble ``zookeeper`` (``HOST:PORT[,...]``),
    registered as ``host_id``.  ``config`` is the server's (``config.container_count`` is the
    cluster's; ``owned_containers`` is ignored: the map decides).  ``advertised_host`` is the address
    other hosts and clients reach it at (default: ``config.host``).  ``host_options`` go to every
    ``ContainerHost``; ``server_options`` to the ``SegmentStoreServer``.

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
    ) -> None:
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

    # --- Lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, start the manager, join the cluster (in that order; see the module docstring)."""
        if self._started:
            raise InvalidArgumentError("the node was started already")
        self._started = True
        await self.server.start()
        try:
            await self.manager.start()
            member = ClusterMember(
                self._zookeeper, cluster=self._cluster, host_id=self.host_id, address=self.address,
                container_count=self.config.container_count, on_assignment=self.manager.apply,
                on_suspended=self.manager.suspend, on_session_lost=self.manager.session_lost,
                on_claim=self.manager.claim_changed,
                session_timeout_seconds=self._session_timeout_seconds,
                connect_timeout_seconds=self._connect_timeout_seconds)
            self._joining = member
            await member.start()
            self.member = member
        except BaseException:
            await self.manager.stop()
            await self.server.stop()
            raise
        log.info("node %s of cluster %s serves at %s", self.host_id, self._cluster, self.address)

    async def stop(self) -> None:
        """Leave the cluster, stop every container, stop the server.  Idempotent."""
        if self.member is not None:
            await self.member.stop()
        await self.manager.stop()
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
        try:
            data, _ = await asyncio.to_thread(
                lambda: member.client.get_async(member.paths.host(owner)).get(
                    timeout=limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS))
        except NoNodeError:
            raise ContainerUnavailableError(
                f"container {container_id}'s host {owner} left the cluster; it is being reassigned") from None
        except KazooException as error:
            raise CoordinationUnavailableError(f"ZooKeeper did not say where host {owner} is: {error!r}") from error
        return f"{'tls' if self.server.tls else 'tcp'}://{data.decode()}"  # (a cluster's hosts all use TLS or none)

    # --- The manager's container claims (``ContainerClaims``), kept by the member on ZooKeeper ----------

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        return await self._claims().claim_container(container_id, host_id, map_version)

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        return await self._claims().container_claim(container_id)

    def _claims(self) -> ClusterMember:
        if self._joining is None:
            raise CoordinationUnavailableError("the node has not joined the cluster")
        return self._joining

    def _serving(self, container_id: int, host: ContainerHost) -> None:
        self.server.attach_container(container_id, host)

    def _leaving(self, container_id: int) -> None:
        self.server.detach_container(container_id)
