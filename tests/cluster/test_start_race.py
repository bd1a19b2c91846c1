"""The start-up race of ``ContainerManager`` (issue 23; its docstring tells it): a host still starting
a container under an older map opens the log after the newer map's owner did, and fences it.  Without
claims tying the map's generation to the log's fencing nobody served that container until the next
map.  Reproduced deterministically: host a's open of the moving container's log is held at a gate
until b serves it, then let through."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from millstream.cluster import ClusterNode, assign
from millstream.cluster._containers import ContainerManager
from millstream.cluster._zookeeper import Assignment
from millstream.errors import MillstreamError
from millstream.naming import container_of
from millstream.segmentstore.durable_data_log import DurableDataLog, LogAddress, LogRecord, OnDone, WriteSettings
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.server import ServerConfig
from millstream.testing.zookeeper_server import ZooKeeperServer

from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, WAIT_SECONDS, cluster_name, in_loop, wait_until

CONTAINER_COUNT = 2


class _GatedLog(DurableDataLog):
    """A FileLog whose ``initialize`` waits at ``gate`` (and says it got there through ``entered``)."""

    def __init__(self, inner: DurableDataLog, entered: asyncio.Event, gate: asyncio.Event) -> None:
        self._inner, self._entered, self._gate = inner, entered, gate

    @property
    def write_settings(self) -> WriteSettings:
        return self._inner.write_settings

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    async def initialize(self) -> int:
        self._entered.set()
        await self._gate.wait()
        return await self._inner.initialize()

    def read(self) -> Iterator[LogRecord]:
        return self._inner.read()

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        return self._inner.append(data, on_done)

    async def truncate(self, upto: LogAddress) -> None:
        await self._inner.truncate(upto)

    async def close(self) -> None:
        await self._inner.close()


def _segments_in(container_id: int) -> Iterator[str]:
    return (name for name in (f"scope/race-{index}" for index in itertools.count())
            if container_of(name, CONTAINER_COUNT) == container_id)


@in_loop
async def test_a_host_starting_under_an_older_map_does_not_leave_a_container_unserved(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    # a alone gets both containers (map 0); when b joins, the map moves this one to b.
    moving = next(container for container, host in assign(["a", "b"], CONTAINER_COUNT, {0: "a", 1: "a"}).items()
                  if host == "b")
    entered, gate = asyncio.Event(), asyncio.Event()

    def open_log(host_id: str) -> Callable[[int], DurableDataLog]:
        def open_this(container_id: int) -> DurableDataLog:
            log = FileLog(tmp_path / "tier1" / f"container-{container_id}")
            if host_id == "a" and container_id == moving and not gate.is_set():
                return _GatedLog(log, entered, gate)
            return log
        return open_this

    cluster = cluster_name()
    storages = {host: FileChunkStorage(tmp_path / "tier2") for host in ("a", "b")}
    nodes = {host: ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host,
                               open_log=open_log(host), chunk_storage=storages[host],
                               config=ServerConfig(container_count=CONTAINER_COUNT),
                               session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                               host_options={"restart_delay_seconds": 0.01})
             for host in ("a", "b")}
    a, b = nodes["a"], nodes["b"]
    try:
        await a.start()
        await asyncio.wait_for(entered.wait(), WAIT_SECONDS)  # a opens `moving` under the map giving it both
        await b.start()
        await wait_until(lambda: moving in b.serving, "b serving the container the newer map gives it")
        gate.set()  # a's open goes through now, after b's: it fences b
        await a.manager.settled()
        assert moving not in a.serving  # (the newer map is not a's)
        # Every write into the moving container must go through again: b serves it on a log of its own.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        segments = _segments_in(moving)
        while True:
            segment = next(segments)
            try:
                await b.manager.container(moving).create_segment(segment)
                break
            except MillstreamError:
                assert loop.time() < deadline, "nobody serves the container that b was fenced out of"
                await asyncio.sleep(0.02)
        assert b.manager.container(moving).get_info(segment).length == 0
        assert moving in b.serving and moving not in a.serving
        assert b.manager.history.count(("start", moving)) == 2  # fenced once by a, started again
    finally:
        for node in (a, b):
            await node.stop()
        for storage in storages.values():
            await storage.close()


@in_loop
async def test_a_claim_under_an_older_map_is_refused_and_a_newer_one_taken(zookeeper: ZooKeeperServer) -> None:
    from kazoo.client import KazooClient

    from millstream.cluster._zookeeper import cluster_paths, read_claim, write_claim

    paths = cluster_paths(cluster_name())
    client = KazooClient(hosts=zookeeper.connect_string)
    await asyncio.to_thread(client.start, 30.0)
    try:
        def claims() -> list[object]:
            return [read_claim(client, paths, 3),
                    write_claim(client, paths, 3, "a", 1), read_claim(client, paths, 3),
                    write_claim(client, paths, 3, "b", 0),   # an older map: refused
                    write_claim(client, paths, 3, "b", 1),   # another host under the same map: refused
                    write_claim(client, paths, 3, "a", 1),   # its own claim again: holds
                    read_claim(client, paths, 3),
                    write_claim(client, paths, 3, "b", 2), read_claim(client, paths, 3)]
        assert await asyncio.to_thread(claims) == [None, True, ("a", 1), False, False, True, ("a", 1), True, ("b", 2)]
    finally:
        await asyncio.to_thread(client.stop)
        await asyncio.to_thread(client.close)


class _Claims:
    """``ContainerClaims`` in memory, with ``write_claim``'s rule (for managers driven by hand)."""

    def __init__(self) -> None:
        self.claims: dict[int, tuple[str, int]] = {}

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        held = self.claims.get(container_id)
        if held is not None and (held[1] > map_version or (held[1] == map_version and held[0] != host_id)):
            return False
        self.claims[container_id] = (host_id, map_version)
        return True

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        return self.claims.get(container_id)


@in_loop
async def test_an_owner_a_newer_map_kept_starts_again_when_an_older_claimant_fences_it(tmp_path: Path) -> None:
    """The race, one map later: b claimed the container under map 1, map 2 left it on b, and a, still
    opening it under map 0, fences b.  b holds its claim (under map 1, older than the current map) and
    the current map gives it the container, so b starts it again."""
    entered, gate = asyncio.Event(), asyncio.Event()
    claims = _Claims()

    def manager(host_id: str) -> ContainerManager:
        def open_log(container_id: int) -> DurableDataLog:
            log = FileLog(tmp_path / "tier1" / f"container-{container_id}")
            if host_id == "a" and not gate.is_set():
                return _GatedLog(log, entered, gate)
            return log
        return ContainerManager(host_id, open_log, chunk_storage=FileChunkStorage(tmp_path / "tier2"),
                                host_options={"restart_delay_seconds": 0.01}, claims=claims)

    a, b = manager("a"), manager("b")
    async with a, b:
        a.apply(Assignment({0: "a"}, 0, 1))
        await asyncio.wait_for(entered.wait(), WAIT_SECONDS)  # a claimed it under map 0 and is opening its log
        b.apply(Assignment({0: "b"}, 1, 1))
        await b.settled()
        assert b.serving == {0} and claims.claims[0] == ("b", 1)
        for later in (a, b):
            later.apply(Assignment({0: "b"}, 2, 1))  # a newer map leaves it on b
        await b.settled()
        gate.set()  # a's open goes through now: it fences b, re-reads the claim and stops its copy
        await a.settled()
        assert a.serving == frozenset() and a.history == []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        for index in itertools.count():
            try:
                await b.container(0).create_segment(f"scope/after-{index}")
                break
            except MillstreamError:
                assert loop.time() < deadline, "b did not serve the container again after a fenced it"
                await asyncio.sleep(0.02)
        assert b.history == [("start", 0), ("stop", 0), ("start", 0)]
        assert claims.claims[0] == ("b", 2)
