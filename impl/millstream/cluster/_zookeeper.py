"""A host's membership of a millstream cluster on ZooKeeper: registration, election, the container map.

Znode layout (one cluster: ``/millstream/<cluster>``)::

    /millstream/<cluster>/hosts/<host-id>    EPHEMERAL, data: the host's address ("host:port", UTF-8).
                                             Exists while the host's session lives: it *is* membership.
    /millstream/<cluster>/election/...       kazoo's Election recipe (ephemeral sequential lock nodes,
                                             data: the contender's host id); the lowest one leads.
    /millstream/<cluster>/assignment         PERSISTENT, data: the container map as JSON
                                             {"format": 1, "container_count": N,
                                              "containers": {"0": "<host-id>", ...}}.
                                             Written only by the elected host, and only conditionally:
                                             created if absent (fails if another created it), else set
                                             with the znode version the writer read.  A deposed leader's
                                             write carries a stale version and ZooKeeper refuses it
                                             (``AssignmentConflictError``); the znode version is the
                                             map's generation.

    /millstream/<cluster>/containers/<id>    PERSISTENT, data: the container's claim as JSON
                                             {"format": 1, "host": "<host-id>", "map_version": V}:
                                             the host that last opened (or is about to open) the
                                             container's log and the map version it acted on.
                                             Written by that host before it opens the log, only
                                             conditionally on the znode version it read and only if
                                             the recorded map version is not newer than its own
                                             (``claim_container``).

    /millstream/<cluster>/peer-token         PERSISTENT, data: 32 random bytes in hex, created by the
                                             first node (create-if-absent) and read by every node: a
                                             node's requests to another carry it, and only they may
                                             touch reserved segments (``ClusterNode``, ``_node.py``).

Ownership of a container's data is decided by its Tier-1 log, whose ``initialize()`` fences every
older owner (the ``DurableDataLog`` contract): the map says who *should* serve; the log decides who
*can* write.  The claims tie the two: a host acting on an older map never opens a log a newer map's
owner has claimed, and a newer owner fenced by an older claimant that opened first starts again
(``ContainerManager``'s docstring tells the race this closes).  No epoch lives here.

Theory of operation.  ``ClusterMember.start`` connects (bounded by ``connect_timeout_seconds``: a wrong
address raises ``CoordinationUnavailableError``), registers the host, sets a children watch on
``hosts`` and a data watch on ``assignment``, and enters the election on a thread of its own (kazoo's
``Election.run`` blocks while it contends and while it leads).  kazoo calls watches and state
listeners on its own threads; they only record the latest value under a lock and wake the member's
task on the asyncio loop with ``loop.call_soon_threadsafe`` -- at most one wake-up is outstanding, so
the hand-off is bounded however fast ZooKeeper fires (values coalesce: the task always sees the
newest).  The task, on the loop:

* hands each new map to ``on_assignment`` (the host's ``ContainerManager``);
* while elected and connected, recomputes the map with ``assign`` (balanced, minimal movement) when
  membership or the map changed, and writes it conditionally; a refused write is not retried blindly:
  the data watch brings the newer map and the task recomputes from it.

Claim watches.  Once this member has claimed a container it watches the claim znode (one data watch
per container, set at the first claim and kept: at most ``container_count``); each change is recorded
under the lock like the map's and handed, on the loop, to ``on_claim(container_id, (host, version) |
None)``.  The host's ``ContainerManager`` stops serving a container whose claim names another owner at
once -- an owner fenced while idle would otherwise answer reads until its next Tier-1 write fails.

Session loss.  On SUSPENDED (the connection dropped; the session may live on) the member stops
taking new work: the leader writes nothing and ``on_suspended(True)`` tells the manager to start no
container; running ones keep serving.  On CONNECTED again the session survived: back to normal.  On
LOST (ZooKeeper expired the session), or when the member has been SUSPENDED for a whole session
timeout -- by then ZooKeeper, if it is up, has expired the session and the leader may have given the
containers away; a host cut off from ZooKeeper cannot learn that, so it assumes it -- the member
completes ``stopped`` with ``SessionLostError`` and ``on_session_lost`` makes the host stop every
container.  It cannot know whether it still owns them; stopping is safe, serving might mean two
owners.  (A zombie -- a host that keeps running after its session expired without noticing -- is
stopped by fencing: the new owner's log ``initialize()`` makes the zombie's next Tier-1 write fail.
This rule is the second line, not the first.)  A member whose session was lost never rejoins under
the same object: a new ``ClusterMember`` must start (and recovers its containers from their logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.election import Election

from millstream import limits
from millstream.clock import Clock, SystemClock
from millstream.cluster._assignment import assign
from millstream.errors import (
    AssignmentConflictError,
    CoordinationUnavailableError,
    DataCorruptionError,
    InvalidArgumentError,
    SessionLostError,
)
from millstream.tasks import cancel_and_wait

__all__ = ["Assignment", "ClusterMember", "cluster_paths", "decode_assignment", "decode_claim",
           "encode_assignment", "encode_claim", "read_assignment", "read_claim", "read_cluster_status",
           "write_assignment", "write_claim"]

log = logging.getLogger("millstream.cluster")

#: The assignment znode's format: bumped if its JSON changes incompatibly.
_FORMAT = 1

#: The version ``write_assignment`` takes for "the znode does not exist yet".
NO_VERSION = -1


@dataclass(frozen=True, slots=True)
class Assignment:
    """One generation of the container map: container -> host id, and the znode ``version`` it was
    read at (``NO_VERSION`` for none written yet)."""

    containers: Mapping[int, str] = field(default_factory=dict)
    version: int = NO_VERSION
    container_count: int = 0

    def containers_of(self, host_id: str) -> frozenset[int]:
        """The containers this map gives ``host_id``."""
        return frozenset(container for container, host in self.containers.items() if host == host_id)


@dataclass(frozen=True, slots=True)
class ClusterPaths:
    """The znodes of one cluster (the layout is in the module's docstring)."""

    root: str
    hosts: str
    election: str
    assignment: str
    containers: str

    def host(self, host_id: str) -> str:
        return f"{self.hosts}/{host_id}"

    def container(self, container_id: int) -> str:
        return f"{self.containers}/{container_id}"


def cluster_paths(cluster: str) -> ClusterPaths:
    """The znode paths of ``cluster``.  Raises ``InvalidArgumentError`` for a name ZooKeeper would
    take as more than one path element."""
    _check_name("cluster", cluster)
    root = f"/millstream/{cluster}"
    return ClusterPaths(root, f"{root}/hosts", f"{root}/election", f"{root}/assignment", f"{root}/containers")


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") \
            or any(ord(character) < 0x20 for character in name) or len(name) > 200:
        raise InvalidArgumentError(f"{what} must be a non-empty name without '/' or control characters, not {name!r}")


def encode_assignment(containers: Mapping[int, str], container_count: int) -> bytes:
    """The assignment znode's data for a map."""
    body = {"format": _FORMAT, "container_count": container_count,
            "containers": {str(container): host for container, host in sorted(containers.items())}}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_assignment(data: bytes, version: int) -> Assignment:
    """The map in an assignment znode's ``data`` at ``version``.  Raises ``DataCorruptionError`` for
    data that is not such a map (it was not written by a member)."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != _FORMAT:
            raise ValueError(f"format {body.get('format') if isinstance(body, dict) else None!r} is not {_FORMAT}")
        count = body["container_count"]
        raw = body["containers"]
        if not isinstance(count, int) or count < 0 or not isinstance(raw, dict):
            raise ValueError("container_count or containers malformed")
        containers = {int(container): host for container, host in raw.items()}
        if any(not 0 <= container < count or not isinstance(host, str) for container, host in containers.items()):
            raise ValueError("a container outside the count, or a host id that is not a string")
    except (ValueError, KeyError, TypeError) as error:
        raise DataCorruptionError(f"the container map (version {version}) is malformed: {error}") from error
    return Assignment(containers, version, count)


def read_assignment(client: KazooClient, paths: ClusterPaths, *,
                    timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS) -> Assignment:
    """The map as ZooKeeper holds it now (an empty one at ``NO_VERSION`` if none was written).  Blocks:
    call it from a thread."""
    try:
        data, stat = client.get_async(paths.assignment).get(timeout=timeout_seconds)
    except NoNodeError:
        return Assignment()
    return decode_assignment(data, stat.version)


def write_assignment(client: KazooClient, paths: ClusterPaths, containers: Mapping[int, str],
                     container_count: int, expected_version: int, *,
                     timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS) -> int:
    """Write the map if the znode is still at ``expected_version`` (``NO_VERSION``: if it does not
    exist), and return its new version.  Raises ``AssignmentConflictError`` (nothing written) if
    another writer got there first.  Blocks: call it from a thread."""
    data = encode_assignment(containers, container_count)
    try:
        if expected_version == NO_VERSION:
            client.create_async(paths.assignment, data).get(timeout=timeout_seconds)
            return 0
        stat = client.set_async(paths.assignment, data, version=expected_version).get(timeout=timeout_seconds)
    except NodeExistsError as error:
        raise AssignmentConflictError("the container map was created by another writer meanwhile") from error
    except (BadVersionError, NoNodeError) as error:
        raise AssignmentConflictError(
            f"the container map is no longer at version {expected_version}: another leader wrote it") from error
    version: int = stat.version
    return version


def encode_claim(host_id: str, map_version: int) -> bytes:
    """A container claim znode's data."""
    return json.dumps({"format": _FORMAT, "host": host_id, "map_version": map_version}, sort_keys=True,
                      separators=(",", ":")).encode()


def decode_claim(data: bytes) -> tuple[str, int]:
    """(host id, map version) of a claim znode's ``data``.  Raises ``DataCorruptionError`` for data
    that is not a claim."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != _FORMAT:
            raise ValueError("not a claim of format 1")
        host, version = body["host"], body["map_version"]
        if not isinstance(host, str) or not isinstance(version, int):
            raise ValueError("host or map_version malformed")
    except (ValueError, KeyError, TypeError) as error:
        raise DataCorruptionError(f"a container claim is malformed: {error}") from error
    return host, version


def read_claim(client: KazooClient, paths: ClusterPaths, container_id: int, *,
               timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS) -> tuple[str, int] | None:
    """The claim of ``container_id`` (None if never claimed).  Blocks: call it from a thread."""
    try:
        data, _ = client.get_async(paths.container(container_id)).get(timeout=timeout_seconds)
    except NoNodeError:
        return None
    return decode_claim(data)


def write_claim(client: KazooClient, paths: ClusterPaths, container_id: int, host_id: str, map_version: int, *,
                timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS) -> bool:
    """Claim ``container_id`` for ``host_id`` under map ``map_version`` unless the recorded claim is
    under a newer map, or another host's under the same one (False, nothing written).  Conditional on
    the znode version read, retried when another claimant wrote in between.  Raises
    ``CoordinationUnavailableError`` if the retries run out.  Blocks: call it from a thread."""
    path = paths.container(container_id)
    data = encode_claim(host_id, map_version)
    for _ in range(limits.CLUSTER_CLAIM_ATTEMPTS_MAX):
        try:
            recorded, stat = client.get_async(path).get(timeout=timeout_seconds)
        except NoNodeError:
            try:
                client.create_async(path, data, makepath=True).get(timeout=timeout_seconds)
            except NodeExistsError:
                continue
            return True
        holder, version = decode_claim(recorded)
        if version > map_version or (version == map_version and holder != host_id):
            return False
        if (holder, version) == (host_id, map_version):
            return True
        try:
            client.set_async(path, data, version=stat.version).get(timeout=timeout_seconds)
        except (BadVersionError, NoNodeError):
            continue
        return True
    raise CoordinationUnavailableError(
        f"container {container_id}'s claim kept changing under {limits.CLUSTER_CLAIM_ATTEMPTS_MAX} attempts")


def read_cluster_status(client: KazooClient, paths: ClusterPaths, *,
                        timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS) -> dict[str, Any]:
    """What ZooKeeper says of the cluster now (``millstream cluster status``), as plain data::

        {"map_version": V, "container_count": N, "leader": host id or None,
         "hosts": {host id: {"address": "host:port", "containers": [ids]}},
         "containers": {id: {"host": host id or None, "claimed_by": host id or None,
                             "claimed_under": map version or None}}}

    A container whose host is not registered is listed with that host (it is moving).  Blocks: call
    it from a thread."""
    def get(path: str) -> bytes | None:
        try:
            data, _ = client.get_async(path).get(timeout=timeout_seconds)
        except NoNodeError:
            return None
        return bytes(data)

    def children(path: str) -> list[str]:
        try:
            return sorted(client.get_children_async(path).get(timeout=timeout_seconds))
        except NoNodeError:
            return []

    assignment = read_assignment(client, paths, timeout_seconds=timeout_seconds)
    hosts: dict[str, dict[str, Any]] = {}
    for host_id in children(paths.hosts):
        address = get(paths.host(host_id))
        if address is not None:
            hosts[host_id] = {"address": address.decode(errors="replace"),
                              "containers": sorted(assignment.containers_of(host_id))}
    contenders = sorted(children(paths.election), key=lambda name: name.rsplit("_", 1)[-1])
    leader = None
    if contenders:
        data = get(f"{paths.election}/{contenders[0]}")
        leader = None if data is None else data.decode(errors="replace")
    containers: dict[int, dict[str, Any]] = {}
    for container_id in range(assignment.container_count):
        recorded = get(paths.container(container_id))
        claim = None if recorded is None else decode_claim(recorded)
        containers[container_id] = {"host": assignment.containers.get(container_id),
                                    "claimed_by": None if claim is None else claim[0],
                                    "claimed_under": None if claim is None else claim[1]}
    return {"map_version": assignment.version, "container_count": assignment.container_count, "leader": leader,
            "hosts": hosts, "containers": containers}


class ClusterMember:
    """One host's membership: registered under ``host_id`` at ``address``, contending for leadership,
    writing the map while elected and watching it always.  Start with ``await start()``; ``stopped``
    completes when the member stops (``None``) or loses its session (``SessionLostError``).

    The callbacks run on the event loop, never block, and must not raise: ``on_assignment`` gets each
    new map, ``on_suspended`` whether the connection is suspended, ``on_session_lost`` the error once
    the session is gone (stop every container), ``on_claim`` each change of a claim this member made
    (see "Claim watches" in the module docstring)."""

    def __init__(
        self,
        connect_string: str,
        *,
        cluster: str,
        host_id: str,
        address: str,
        container_count: int,
        on_assignment: Callable[[Assignment], None] | None = None,
        on_suspended: Callable[[bool], None] | None = None,
        on_session_lost: Callable[[BaseException], None] | None = None,
        on_claim: Callable[[int, tuple[str, int] | None], None] | None = None,
        session_timeout_seconds: float = limits.ZOOKEEPER_SESSION_TIMEOUT_SECONDS,
        connect_timeout_seconds: float = limits.ZOOKEEPER_CONNECT_TIMEOUT_SECONDS,
        request_timeout_seconds: float = limits.ZOOKEEPER_REQUEST_TIMEOUT_SECONDS,
        clock: Clock | None = None,
        client_factory: Callable[..., KazooClient] = KazooClient,
    ) -> None:
        _check_name("host_id", host_id)
        if not isinstance(connect_string, str) or not connect_string.strip():
            raise InvalidArgumentError(
                f"connect_string must name ZooKeeper servers (HOST:PORT[,...]), not {connect_string!r}")
        if not isinstance(container_count, int) or container_count < 1:
            raise InvalidArgumentError(f"container_count must be >= 1, not {container_count!r}")
        for name, value in (("session_timeout_seconds", session_timeout_seconds),
                            ("connect_timeout_seconds", connect_timeout_seconds),
                            ("request_timeout_seconds", request_timeout_seconds)):
            if not value > 0:
                raise InvalidArgumentError(f"{name} must be > 0, not {value!r}")
        self.connect_string = connect_string
        self.paths = cluster_paths(cluster)
        self.host_id = host_id
        self.address = address
        self.container_count = container_count
        self._on_assignment = on_assignment
        self._on_suspended = on_suspended
        self._on_session_lost = on_session_lost
        self._on_claim = on_claim
        self._session_timeout_seconds = session_timeout_seconds
        self._connect_timeout_seconds = connect_timeout_seconds
        self._request_timeout_seconds = request_timeout_seconds
        self._clock = clock or SystemClock()
        self._client_factory = client_factory
        self._client: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Written by kazoo's threads and the election thread, read by the loop: under ``_lock``.
        self._lock = threading.Lock()
        self._seen_hosts: tuple[str, ...] | None = None
        self._seen_map: tuple[bytes, int] | None = None  # (data, version); (b"", NO_VERSION) = absent
        self._seen_state = KazooState.CONNECTED
        # Sticky: kazoo goes on from LOST to CONNECTED on a new session, and the task may see only the
        # newest state; a loss must never be coalesced away.
        self._seen_lost = False
        # Counts the suspensions, so a timer started by one does not expire a later one early.
        self._suspensions = 0
        self._seen_leader = False
        # container -> its claim as last seen by its watch (None: gone or unreadable), not yet handed on.
        self._seen_claims: dict[int, tuple[str, int] | None] = {}
        self._watched_claims: set[int] = set()  # (touched on the claiming threads: under ``_lock`` too)
        self._wake_scheduled = False
        self._wake = asyncio.Event()
        self._resign = threading.Event()
        self._election: Election | None = None
        self._election_thread: threading.Thread | None = None
        #: What the loop has taken in (the task's own view).
        self.hosts: tuple[str, ...] = ()
        self.assignment = Assignment()
        self.is_leader = False
        self.suspended = False
        #: Maps this member wrote as leader (evidence for tests and logs).
        self.writes = 0
        self.stopped: asyncio.Future[BaseException | None] | None = None

    # --- Lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, register, watch, and enter the election.  Raises ``CoordinationUnavailableError``
        (nothing registered, nothing left running) if ZooKeeper does not answer within the connect
        timeout or the host id stays registered by another live session."""
        if self._client is not None:
            raise InvalidArgumentError("the member was started already")
        self._loop = asyncio.get_running_loop()
        self.stopped = self._loop.create_future()
        try:
            client = self._client_factory(hosts=self.connect_string, timeout=self._session_timeout_seconds,
                                          connection_retry={"max_tries": -1, "max_delay": 1.0})
        except (ValueError, KazooException) as error:
            raise InvalidArgumentError(f"bad ZooKeeper address {self.connect_string!r}: {error}") from error
        self._client = client
        try:
            await asyncio.to_thread(self._connect_and_register, client)
        except BaseException:
            await asyncio.to_thread(_close_quietly, client)
            self._client = None
            raise
        self._spawn(self._run(), name=f"cluster-member-{self.host_id}")
        self._election_thread = threading.Thread(target=self._contend, name=f"election-{self.host_id}", daemon=True)
        self._election_thread.start()
        log.info("host %s joined cluster %s at %s", self.host_id, self.paths.root, self.connect_string)

    def _connect_and_register(self, client: KazooClient) -> None:
        """On a thread: connect (bounded), register the host, set the watches."""
        try:
            client.start(timeout=self._connect_timeout_seconds)
        except KazooTimeoutError as error:
            raise CoordinationUnavailableError(
                f"ZooKeeper at {self.connect_string} did not answer within {self._connect_timeout_seconds} s "
                f"(is the address right and the server up?)") from error
        client.add_listener(self._on_state)
        timeout = self._request_timeout_seconds
        for path in (self.paths.hosts, self.paths.election):
            client.ensure_path(path)
        address = self.address.encode()
        try:
            client.create_async(self.paths.host(self.host_id), address, ephemeral=True).get(timeout=timeout)
        except NodeExistsError as error:
            raise CoordinationUnavailableError(
                f"host id {self.host_id!r} is registered in {self.paths.hosts} by another live session (a second "
                f"host with that id, or this host's previous session that has not expired yet: retry after "
                f"{self._session_timeout_seconds} s)") from error
        client.ChildrenWatch(self.paths.hosts, self._on_hosts)
        client.DataWatch(self.paths.assignment, self._on_map)
        self._election = client.Election(self.paths.election, identifier=self.host_id)

    async def stop(self) -> None:
        """Leave: resign, close the session (ZooKeeper removes the registration at once) and stop the
        task.  Idempotent."""
        client = self._client
        self._resign.set()
        if self._election is not None:
            self._election.cancel()
        while self._tasks:
            await cancel_and_wait(next(iter(self._tasks)))
        if client is not None:
            await asyncio.to_thread(_close_quietly, client)
        thread = self._election_thread
        if thread is not None:
            await asyncio.to_thread(thread.join, limits.ZOOKEEPER_ELECTION_STOP_TIMEOUT_SECONDS)
            if thread.is_alive():
                log.error("host %s: the election thread did not end within %s s", self.host_id,
                          limits.ZOOKEEPER_ELECTION_STOP_TIMEOUT_SECONDS)
        self.is_leader = False
        if self.stopped is not None and not self.stopped.done():
            self.stopped.set_result(None)

    async def __aenter__(self) -> ClusterMember:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def client(self) -> KazooClient:
        """The member's ZooKeeper client (for tests and ``millstream cluster status``)."""
        if self._client is None:
            raise InvalidArgumentError("the member is not started")
        return self._client

    # --- Container claims (``ContainerClaims``; see the module docstring) -----------------------------

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        """Claim ``container_id`` for ``host_id`` under map ``map_version`` (``write_claim``)."""
        client = self.client
        try:
            claimed = await asyncio.to_thread(write_claim, client, self.paths, container_id, host_id, map_version,
                                              timeout_seconds=self._request_timeout_seconds)
            if claimed and self._on_claim is not None:
                await asyncio.to_thread(self._watch_claim, client, container_id)
            return claimed
        except (KazooException, KazooTimeoutError) as error:
            raise CoordinationUnavailableError(f"ZooKeeper did not take container {container_id}'s claim: "
                                               f"{error!r}") from error

    def _watch_claim(self, client: KazooClient, container_id: int) -> None:
        """On a thread: watch ``container_id``'s claim znode from now on (once per container)."""
        with self._lock:
            if container_id in self._watched_claims:
                return
            self._watched_claims.add(container_id)
        client.DataWatch(self.paths.container(container_id), functools.partial(self._on_claim_data, container_id))

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        """The recorded claim of ``container_id`` (``read_claim``)."""
        client = self.client
        try:
            return await asyncio.to_thread(read_claim, client, self.paths, container_id,
                                           timeout_seconds=self._request_timeout_seconds)
        except (KazooException, KazooTimeoutError) as error:
            raise CoordinationUnavailableError(f"ZooKeeper did not say who claimed container {container_id}: "
                                               f"{error!r}") from error

    def _spawn(self, coroutine: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``coroutine`` as a task that ``stop`` cancels and awaits; its failure is logged."""
        assert self._loop is not None
        task = self._loop.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("host %s: task %s failed", self.host_id, task.get_name(), exc_info=task.exception())

    # --- kazoo's threads: record, wake the loop ----------------------------------------------------

    def _wake_loop(self) -> None:
        """Called with ``_lock`` held: schedule one wake-up of the task unless one is pending."""
        if self._wake_scheduled or self._loop is None:
            return
        self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        with self._lock:
            self._wake_scheduled = False
        self._wake.set()

    def _on_state(self, state: str) -> None:
        with self._lock:
            if state == KazooState.SUSPENDED and self._seen_state != KazooState.SUSPENDED:
                self._suspensions += 1
            self._seen_state = state
            self._seen_lost = self._seen_lost or state == KazooState.LOST
            self._wake_loop()
        if state == KazooState.LOST:
            self._resign.set()

    def _on_hosts(self, children: list[str]) -> None:
        with self._lock:
            self._seen_hosts = tuple(sorted(children))
            self._wake_loop()

    def _on_map(self, data: bytes | None, stat: Any) -> None:
        with self._lock:
            self._seen_map = (b"", NO_VERSION) if data is None or stat is None else (data, stat.version)
            self._wake_loop()

    def _on_claim_data(self, container_id: int, data: bytes | None, stat: Any) -> None:
        claim: tuple[str, int] | None = None
        if data is not None:
            try:
                claim = decode_claim(data)
            except DataCorruptionError as error:
                log.error("host %s: %s", self.host_id, error)
        with self._lock:
            self._seen_claims[container_id] = claim
            self._wake_loop()

    def _contend(self) -> None:
        """The election thread: contend, and while elected wait until told to resign."""
        election = self._election
        if election is None:
            return
        try:
            election.run(self._lead)
        except Exception as error:  # the session went away under the recipe: the member stops anyway
            if not self._resign.is_set():
                log.warning("host %s left the election: %r", self.host_id, error)

    def _lead(self) -> None:
        with self._lock:
            self._seen_leader = True
            self._wake_loop()
        try:
            self._resign.wait()
        finally:
            with self._lock:
                self._seen_leader = False
                self._wake_loop()

    # --- The task on the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        handled_map: tuple[bytes, int] | None = None
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                hosts, seen_map, state, leader, lost = (self._seen_hosts, self._seen_map, self._seen_state,
                                                        self._seen_leader, self._seen_lost)
                claims, self._seen_claims = self._seen_claims, {}
            if lost:
                self._lose(SessionLostError(f"host {self.host_id}: ZooKeeper expired the session"))
                return
            if self._on_claim is not None:
                for container_id, claim in sorted(claims.items()):
                    self._on_claim(container_id, claim)
            self._set_suspended(state == KazooState.SUSPENDED)
            if hosts is not None:
                self.hosts = hosts
            if seen_map is not None and seen_map != handled_map:
                handled_map = seen_map
                data, version = seen_map
                try:
                    assignment = Assignment() if version == NO_VERSION else decode_assignment(data, version)
                except DataCorruptionError as error:
                    log.error("host %s: %s; keeping the map of version %d", self.host_id, error,
                              self.assignment.version)
                else:
                    self.assignment = assignment
                    if self._on_assignment is not None:
                        self._on_assignment(assignment)
            if leader != self.is_leader:
                self.is_leader = leader
                log.info("host %s %s the leader of %s", self.host_id, "is" if leader else "is no longer",
                         self.paths.root)
            if self.is_leader and not self.suspended and hosts is not None and seen_map is not None:
                await self._rebalance()

    def _set_suspended(self, suspended: bool) -> None:
        if suspended == self.suspended:
            return
        self.suspended = suspended
        log.warning("host %s: ZooKeeper connection %s", self.host_id,
                    "suspended: starting nothing new until it is back" if suspended else "restored, session intact")
        if suspended:
            with self._lock:
                suspension = self._suspensions
            self._spawn(self._expire_if_still_suspended(suspension), name=f"suspension-{self.host_id}")
        if self._on_suspended is not None:
            self._on_suspended(suspended)

    def _still_suspended(self, suspension: int) -> bool:
        with self._lock:
            return self._seen_state == KazooState.SUSPENDED and self._suspensions == suspension

    async def _expire_if_still_suspended(self, suspension: int) -> None:
        """A whole session timeout without ZooKeeper: assume the session expired (see the docstring)."""
        deadline = self._clock.monotonic() + self._session_timeout_seconds
        while self._clock.monotonic() < deadline:
            await self._clock.sleep(deadline - self._clock.monotonic())
            if not self._still_suspended(suspension):
                return
        if self._still_suspended(suspension):
            self._lose(SessionLostError(
                f"host {self.host_id}: cut off from ZooKeeper for a whole session timeout "
                f"({self._session_timeout_seconds} s); its session must be taken as expired"))

    def _lose(self, error: SessionLostError) -> None:
        if self.stopped is None or self.stopped.done():
            return
        log.error("%s: stopping every container (it cannot know it still owns them)", error)
        self._resign.set()
        self.is_leader = False
        if self._on_session_lost is not None:
            self._on_session_lost(error)
        self.stopped.set_result(error)
        # End the session too: if ZooKeeper comes back with it still alive, the registration must not
        # linger, or the leader would keep containers on a host that serves none.
        client = self._client
        if client is not None:
            self._spawn(asyncio.to_thread(_close_quietly, client), name=f"close-{self.host_id}")

    async def _rebalance(self) -> None:
        current = self.assignment
        wanted = assign(self.hosts, self.container_count, current.containers)
        if wanted == dict(current.containers) and current.container_count == self.container_count:
            return
        try:
            version = await asyncio.to_thread(
                write_assignment, self.client, self.paths, wanted, self.container_count, current.version,
                timeout_seconds=self._request_timeout_seconds)
        except AssignmentConflictError as error:
            # The data watch brings the newer map and wakes the task: it recomputes from that.
            log.info("host %s: %s", self.host_id, error)
            return
        except (KazooException, KazooTimeoutError) as error:
            # The connection dropped under the write: the state listener says what follows.
            log.warning("host %s: writing the container map failed: %r", self.host_id, error)
            return
        self.writes += 1
        log.info("host %s wrote the container map, version %d: %s", self.host_id, version, wanted)


def _close_quietly(client: KazooClient) -> None:
    """Stop and close a kazoo client whatever state it is in (on a thread)."""
    with contextlib.suppress(Exception):
        client.stop()
    with contextlib.suppress(Exception):
        client.close()
