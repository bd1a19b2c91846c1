"""ContainerManager: a host serves exactly the containers the cluster's map gives it.

Theory of operation.  The host's ``ClusterMember`` hands every new map to ``apply`` (and connection
trouble to ``suspend`` / ``session_lost``); those calls only record the newest state and wake the
manager's one task, so changes are serialised and coalesce (a burst of maps is applied as its last).
The task compares what the map wants on this host with what runs:

* it first stops each running container the map took away (``ContainerHost.stop`` drains what the
  container acknowledged), so the next owner finds the log quiet;
* then it starts each container the map gave it, one at a time, through a ``ContainerHost`` on the
  injected ``open_log(container_id)``.  Starting opens the log, and opening a ``DurableDataLog``
  fences every older owner (its ``initialize()`` contract): a previous owner that still runs -- a
  zombie whose session expired unnoticed, or one that has not yet read the new map -- fails its next
  Tier-1 write and stops.  Only then does the new container recover by replay and serve.  So the
  log, not the map, is what keeps two owners from both writing.

Claims tie the map's generation to the log's fencing.  Opening a log fences whoever opened it
before, whatever map they acted on, so a host still starting a container under an old map can fence
the owner the newer map chose: two hosts start together, A under map v1 is slow to open container
c's log, B under v2 opens it and serves, then A's open fences B.  B would give c up (fenced), A would
stop it (v2 is not its map), and nobody would serve c until the next map.  With ``claims`` (the
host's ``ClusterMember`` on ZooKeeper: one znode per container recording the owner and the map
version it claimed under, written conditionally):

* before opening a log the manager claims the container under its map version; a claim recorded
  under a newer map refuses it, and the container is not opened (nobody older fences a newer owner
  once that owner has claimed);
* after the log is open it reads the claim again: if a newer map's owner claimed meanwhile, it stops
  its copy at once (that owner opens after it, or -- the race above -- has opened before it and is
  now fenced);
* a container fenced while this host still holds its claim (under the map it started it with, which
  may be older than the current one if a newer map left the container here) and the current map
  still gives it this host was fenced by an older claimant (the race above, or an old owner's
  ``ContainerHost`` restarting a failed container), so it is started again under the current map,
  fencing that one -- at most ``CLUSTER_CONTAINER_RECLAIMS_MAX`` times per map generation.

The fenced idle owner.  Fencing stops an old owner only at its next Tier-1 write, so an owner with
nothing to write would go on answering reads.  What it returns is bounded (a container reads only
what its log committed, so everything it returns is in the committed log a new owner recovers from:
stale, never lost -- the spec's ``ReadersSeeOnlyDurable``), but a client could read a stale tail
indefinitely.  So the host withdraws a container as soon as it learns it may have lost it, without
waiting for a write to fail: ``claim_changed`` (the member's watch on the container's claim znode)
reporting another owner's claim, or ``session_lost``.  Withdrawing is synchronous: ``container()``
raises ``WrongHostError`` and ``on_leaving`` is told before the call returns; the task then stops the
container's host.

Otherwise a container that stops on its own (its host gave up: fenced, corrupt, or restarts
exhausted) is not started again under the same map generation: the newer owner that fenced it is
serving, and starting it again would fence that owner in turn.  A newer map that still gives it to this host starts it
again; a start that fails is retried on the next map likewise (so retries are bounded by the maps the
leader writes).  While the member is suspended, nothing new starts (running containers keep serving);
once the session is lost every container stops and none starts again.

The Tier-1 log and Tier-2 storage are injected (``open_log``, ``chunk_storage``): ``FileLog`` in a
directory every host can reach works now, the JetStream log plugs in the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from millstream import limits
from millstream.cluster._zookeeper import Assignment
from millstream.errors import InvalidArgumentError, ObjectClosedError, WrongHostError
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.host import ContainerHost
from millstream.tasks import cancel_and_wait

__all__ = ["ContainerClaims", "ContainerManager"]

log = logging.getLogger("millstream.cluster")


class ContainerClaims(Protocol):
    """Who may open a container's log, by map generation (``ClusterMember`` implements it on ZooKeeper).
    Both calls raise ``CoordinationError`` when the coordination service cannot answer."""

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        """Record ``host_id`` as the owner of ``container_id`` under map ``map_version``, unless a claim
        under a newer map (or another host's under the same one) is recorded: then False, nothing written."""

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        """The recorded claim of ``container_id``: (host id, map version), None if never claimed."""


class ContainerManager:
    """Starts and stops this host's containers as maps arrive.  ``await start()`` first; ``stop()``
    stops every container.  ``hosts`` maps each container serving (or recovering) here to its
    ``ContainerHost``."""

    def __init__(
        self,
        host_id: str,
        open_log: Callable[[int], DurableDataLog],
        *,
        chunk_storage: ChunkStorage | None = None,
        host_options: Mapping[str, Any] | None = None,
        on_serving: Callable[[int, ContainerHost], None] | None = None,
        on_leaving: Callable[[int], None] | None = None,
        claims: ContainerClaims | None = None,
    ) -> None:
        if not isinstance(host_id, str) or not host_id:
            raise InvalidArgumentError(f"host_id must be a non-empty string, not {host_id!r}")
        self.host_id = host_id
        self._open_log = open_log
        self._chunk_storage = chunk_storage
        self._host_options = dict(host_options or {})
        #: Told (on the loop; must not raise) when a container has started here and serves, and when
        #: one leaves -- before it is stopped, so whoever routes requests (the node's server) stops
        #: handing it new ones first.
        self._on_serving = on_serving
        self._on_leaving = on_leaving
        #: Without claims (tests driving maps by hand), the map alone decides (see the docstring).
        self._claims = claims
        #: container -> the map version this host claimed it under (while it runs here).
        self._claimed: dict[int, int] = {}
        #: (container, map version) -> restarts after being fenced while holding the claim.
        self._reclaims: dict[tuple[int, int], int] = {}
        self._assignment = Assignment()
        self._suspended = False
        self._lost = False
        #: container -> the map version under which it stopped on its own or failed to start.
        self._given_up: dict[int, int] = {}
        #: Withdrawn from serving (``claim_changed``, ``session_lost``), for the task to stop.
        self._withdrawn: dict[int, ContainerHost] = {}
        self.hosts: dict[int, ContainerHost] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()  # (nothing handed in yet: nothing to act on)
        self._task: asyncio.Task[None] | None = None
        #: Every start and stop, in order, as ("start" | "stop", container): evidence for tests.
        self.history: list[tuple[str, int]] = []

    # --- What the member tells it (on the loop; never blocks) ----------------------------------------

    def apply(self, assignment: Assignment) -> None:
        """Serve what ``assignment`` gives this host (the newest map wins)."""
        if assignment.version < self._assignment.version:
            return  # (an older generation arriving late changes nothing)
        self._assignment = assignment
        self._poke()

    def suspend(self, suspended: bool) -> None:
        """While suspended, start nothing new; running containers keep serving."""
        self._suspended = suspended
        self._poke()

    def session_lost(self, error: BaseException) -> None:
        """The session is gone: stop serving every container at once (see the docstring), stop them,
        and never start one again."""
        self._lost = True
        for container_id in sorted(self.hosts):
            self._withdraw(container_id)
        self._poke()

    def claim_changed(self, container_id: int, holder: tuple[str, int] | None) -> None:
        """Container ``container_id``'s claim now names ``holder`` (host id, map version; None if the
        claim is gone or unreadable).  If the container serves here and another host has claimed it
        under this host's map version or a newer one, that host is opening its log (fencing this one)
        or has: stop serving it at once (see the docstring), and do not start it again under this map."""
        claimed = self._claimed.get(container_id)
        if claimed is None:
            return
        if holder is not None and (holder[0] == self.host_id or holder[1] < claimed):
            return  # (its own claim, or a change older than it seen late: claims only move to newer maps)
        log.warning("host %s: container %d is claimed by %s now; it stops serving it", self.host_id, container_id,
                    holder)
        self._withdraw(container_id)
        self._given_up[container_id] = self._assignment.version
        self._poke()

    def _withdraw(self, container_id: int) -> None:
        """Stop serving ``container_id`` now (requests get ``WrongHostError``); the task stops it."""
        host = self.hosts.pop(container_id, None)
        self._claimed.pop(container_id, None)
        if host is None:
            return
        self._withdrawn[container_id] = host
        if self._on_leaving is not None:
            self._on_leaving(container_id)

    def _poke(self) -> None:
        self._idle.clear()
        self._wake.set()

    # --- Lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise InvalidArgumentError("the manager was started already")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"containers-{self.host_id}")

    async def stop(self) -> None:
        """Stop the task and every container.  Idempotent."""
        self._lost = True
        if self._task is not None:
            await cancel_and_wait(self._task)
        for container_id in sorted(self.hosts):
            await self._stop_container(container_id)
        await self._stop_withdrawn()

    async def __aenter__(self) -> ContainerManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def settled(self) -> None:
        """Wait until every change handed in so far has been acted on (for tests and shutdown)."""
        if self._task is None or self._task.done():
            raise ObjectClosedError("the manager is not running")
        await self._idle.wait()

    # --- Serving -----------------------------------------------------------------------------------------

    @property
    def serving(self) -> frozenset[int]:
        """The containers whose host runs here (serving or recovering)."""
        return frozenset(self.hosts)

    def container(self, container_id: int) -> SegmentContainer:
        """The running container ``container_id``.  Raises ``WrongHostError`` if this host does not
        serve it (the client asks the controller again), ``ContainerUnavailableError`` while it
        recovers."""
        host = self.hosts.get(container_id)
        if host is None:
            raise WrongHostError(f"container {container_id} is not served by host {self.host_id}")
        return host.container

    # --- The task ----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._reconcile()
            if not self._wake.is_set():
                self._idle.set()

    def _wanted(self) -> frozenset[int]:
        if self._lost:
            return frozenset()
        return self._assignment.containers_of(self.host_id)

    async def _reconcile(self) -> None:
        await self._stop_withdrawn()
        # Containers that stopped on their own since: forget them, and do not restart them under
        # this map generation (see the docstring).
        for container_id, host in list(self.hosts.items()):
            if host.stopped.done():
                del self.hosts[container_id]
                if self._on_leaving is not None:
                    self._on_leaving(container_id)
                claimed = self._claimed.pop(container_id, None)
                self.history.append(("stop", container_id))
                if not await self._fenced_by_an_older_claimant(container_id, host, claimed):
                    self._given_up[container_id] = self._assignment.version
        wanted = self._wanted()
        for container_id in sorted(set(self.hosts) - wanted):
            await self._stop_container(container_id)
        if self._suspended or self._lost:
            return
        version = self._assignment.version
        for container_id in sorted(wanted - set(self.hosts)):
            if self._given_up.get(container_id, -2) >= version:
                continue
            if self._wake.is_set() and container_id not in self._wanted():
                break  # (a newer map arrived meanwhile: the next round decides)
            await self._start_container(container_id, version)

    async def _fenced_by_an_older_claimant(self, container_id: int, host: ContainerHost,
                                           claimed: int | None) -> bool:
        """Whether ``host`` (stopped on its own) was fenced while this host still holds the container's
        claim and the current map still gives it the container, with restarts left: then it is started
        again, claiming it under the current map (see the docstring)."""
        version = self._assignment.version
        if self._claims is None or claimed is None or host.status[0] != "fenced" \
                or container_id not in self._wanted():
            return False
        restarts = self._reclaims.get((container_id, version), 0)
        if restarts >= limits.CLUSTER_CONTAINER_RECLAIMS_MAX:
            log.error("host %s: container %d was fenced %d times under map version %d while this host held its "
                      "claim; giving it up until the next map", self.host_id, container_id, restarts, version)
            return False
        try:
            holder = await self._claims.container_claim(container_id)
        except Exception as error:
            log.error("host %s could not read container %d's claim: %r", self.host_id, container_id, error)
            return False
        if holder != (self.host_id, claimed):
            return False
        self._reclaims[(container_id, version)] = restarts + 1
        log.warning("host %s: container %d was fenced by an older map's owner while this host holds it under "
                    "map version %d; starting it again", self.host_id, container_id, version)
        return True

    async def _claim(self, container_id: int, version: int) -> bool:
        """Claim the container under ``version`` before opening its log (True without claims)."""
        if self._claims is None:
            return True
        try:
            claimed = await self._claims.claim_container(container_id, self.host_id, version)
        except Exception as error:
            log.error("host %s could not claim container %d under map version %d: %r; retrying on the next map",
                      self.host_id, container_id, version, error)
            return False
        if not claimed:
            log.info("host %s: container %d is claimed under a newer map than version %d; not opening it",
                     self.host_id, container_id, version)
        return claimed

    async def _still_claimed(self, container_id: int, version: int) -> bool:
        """After opening the log: whether no newer map's owner claimed the container meanwhile."""
        if self._claims is None:
            return True
        try:
            holder = await self._claims.container_claim(container_id)
        except Exception as error:
            log.error("host %s could not read container %d's claim: %r", self.host_id, container_id, error)
            return False
        return holder == (self.host_id, version)

    async def _start_container(self, container_id: int, version: int) -> None:
        if not await self._claim(container_id, version):
            self._given_up[container_id] = version
            return
        host = ContainerHost(container_id, _bind(self._open_log, container_id), chunk_storage=self._chunk_storage,
                             **self._host_options)
        try:
            await host.start()
        except Exception as error:
            self._given_up[container_id] = version
            log.error("host %s could not start container %d: %r; retrying on the next map", self.host_id,
                      container_id, error)
            with contextlib.suppress(Exception):
                await host.stop()
            return
        if not await self._still_claimed(container_id, version):
            self._given_up[container_id] = version
            log.info("host %s: container %d was claimed under a newer map while it opened; stopping it",
                     self.host_id, container_id)
            with contextlib.suppress(Exception):
                await host.stop()
            return
        self._claimed[container_id] = version
        self.hosts[container_id] = host
        self.history.append(("start", container_id))
        if self._on_serving is not None:
            self._on_serving(container_id, host)
        host.stopped.add_done_callback(lambda _: self._poke())
        log.info("host %s serves container %d (map version %d)", self.host_id, container_id, version)

    async def _stop_withdrawn(self) -> None:
        while self._withdrawn:
            container_id = min(self._withdrawn)
            await self._stop_host(container_id, self._withdrawn.pop(container_id))

    async def _stop_container(self, container_id: int) -> None:
        host = self.hosts.pop(container_id, None)
        self._claimed.pop(container_id, None)
        if host is None:
            return
        if self._on_leaving is not None:
            self._on_leaving(container_id)
        await self._stop_host(container_id, host)

    async def _stop_host(self, container_id: int, host: ContainerHost) -> None:
        try:
            await host.stop()
        except Exception as error:  # it is stopping for good either way; say so and carry on with the rest
            log.error("host %s: container %d did not stop cleanly: %r", self.host_id, container_id, error)
        self.history.append(("stop", container_id))
        log.info("host %s stopped container %d", self.host_id, container_id)


def _bind(open_log: Callable[[int], DurableDataLog], container_id: int) -> Callable[[], DurableDataLog]:
    def open_this() -> DurableDataLog:
        return open_log(container_id)
    return open_this
