"""The host's container manager (``millstream.cluster._containers``): containers start and stop as the
map says, move between hosts on FileLogs in one shared directory (the shared-disk case) with their data,
and a previous owner that still runs is fenced, not trusted.  The last test drives it from real
ZooKeeper membership."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from millstream.cluster._containers import ContainerClaims, ContainerManager
from millstream.cluster._zookeeper import Assignment, ClusterMember
from millstream.errors import ContainerUnavailableError, DataLogFencedError, WrongHostError
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.testing.zookeeper_server import ZooKeeperServer

from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, WAIT_SECONDS, cluster_name, in_loop, wait_until

CONTAINER_COUNT = 4


def _file_logs(root: Path) -> Callable[[int], DurableDataLog]:
    """One FileLog directory per container under ``root``: every host opens the same one."""
    def open_log(container_id: int) -> DurableDataLog:
        return FileLog(root / "tier1" / f"container-{container_id}")
    return open_log


def _manager(root: Path, host_id: str, claims: ContainerClaims | None = None) -> ContainerManager:
    return ContainerManager(host_id, _file_logs(root), chunk_storage=FileChunkStorage(root / "tier2"),
                            host_options={"restart_delay_seconds": 0.01}, claims=claims)


def _map(version: int, **owners: str) -> Assignment:
    return Assignment({int(container.removeprefix("c")): host for container, host in owners.items()}, version,
                      CONTAINER_COUNT)


async def _read_all(manager: ContainerManager, container_id: int, segment: str) -> bytes:
    container = manager.container(container_id)
    length = container.get_info(segment).length
    result = await container.read(segment, 0, length)
    return result.data


@in_loop
async def test_containers_follow_the_map_and_their_data_moves_with_them(tmp_path: Path) -> None:
    a, b = _manager(tmp_path, "a"), _manager(tmp_path, "b")
    async with a, b:
        first = _map(0, c0="a", c1="a", c2="b", c3="b")
        for manager in (a, b):
            manager.apply(first)
            await manager.settled()
        assert a.serving == {0, 1} and b.serving == {2, 3}
        with pytest.raises(WrongHostError):
            a.container(2)
        written = {}
        for manager, container_id in ((a, 0), (a, 1), (b, 2), (b, 3)):
            container = manager.container(container_id)
            await container.create_segment(f"s{container_id}")
            data = f"before the move, container {container_id};".encode() * 50
            await container.append(f"s{container_id}", data)
            written[container_id] = data
        # b leaves: everything goes to a.  b stops first (as it does when it reads the map), then a
        # starts b's containers on the same log directories and recovers them.
        second = _map(1, c0="a", c1="a", c2="a", c3="a")
        b.apply(second)
        await b.settled()
        a.apply(second)
        await a.settled()
        assert a.serving == {0, 1, 2, 3} and b.serving == frozenset()
        for container_id, data in written.items():
            assert await _read_all(a, container_id, f"s{container_id}") == data
        # And the moved containers take new writes.
        await a.container(3).append("s3", b"after the move;")
        assert (await _read_all(a, 3, "s3")).endswith(b"after the move;")
        assert ("start", 2) in a.history and b.history[-2:] == [("stop", 2), ("stop", 3)]


@in_loop
async def test_a_previous_owner_that_still_runs_is_fenced_by_the_new_owner_and_not_restarted(tmp_path: Path) -> None:
    """A zombie: the map moved container 0 to b, but a never saw that map and keeps serving.  b's start
    opens the log, which fences a; a's next write fails, a's host stops it for good, and a does not
    start it again under the same map (that would fence b in turn)."""
    a, b = _manager(tmp_path, "a"), _manager(tmp_path, "b")
    async with a, b:
        first = _map(0, c0="a", c1="a", c2="a", c3="a")
        a.apply(first)
        await a.settled()
        old = a.container(0)
        await old.create_segment("s")
        await old.append("s", b"acknowledged by a;")
        b.apply(_map(1, c0="b", c1="a", c2="a", c3="a"))  # (a does not hear of it)
        await b.settled()
        assert b.serving == {0}
        with pytest.raises((DataLogFencedError, ContainerUnavailableError)):
            await old.append("s", b"zombie write;")
        await wait_until(lambda: 0 not in a.serving, "a's host to stop the fenced container")
        await a.settled()
        assert 0 not in a.serving  # not restarted under the map it has
        assert await _read_all(b, 0, "s") == b"acknowledged by a;"
        await b.container(0).append("s", b"b writes on;")
        # When a finally reads the newer map it agrees, and nothing changes on either host.
        a.apply(_map(1, c0="b", c1="a", c2="a", c3="a"))
        await a.settled()
        assert a.serving == {1, 2, 3} and b.serving == {0}


@in_loop
async def test_suspended_starts_nothing_new_and_a_lost_session_stops_everything(tmp_path: Path) -> None:
    a = _manager(tmp_path, "a")
    async with a:
        a.apply(_map(0, c0="a", c1="a"))
        await a.settled()
        a.suspend(True)
        a.apply(_map(1, c0="a", c1="a", c2="a"))
        await a.settled()
        assert a.serving == {0, 1}  # running ones keep serving; the new one waits
        a.suspend(False)
        await a.settled()
        assert a.serving == {0, 1, 2}
        a.session_lost(RuntimeError("expired"))
        await a.settled()
        assert a.serving == frozenset()
        a.apply(_map(2, c0="a", c1="a", c2="a", c3="a"))
        await a.settled()
        assert a.serving == frozenset()


@in_loop
async def test_members_on_zookeeper_move_containers_and_their_data_when_a_host_leaves(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    cluster = cluster_name()
    managers: dict[str, ContainerManager] = {}
    members = {host: ClusterMember(zookeeper.connect_string, cluster=cluster, host_id=host, address=f"{host}:1",
                                   container_count=CONTAINER_COUNT, session_timeout_seconds=SESSION_TIMEOUT_SECONDS,
                                   connect_timeout_seconds=30.0,
                                   on_assignment=lambda assignment, host=host: managers[host].apply(assignment),
                                   on_suspended=lambda suspended, host=host: managers[host].suspend(suspended),
                                   on_session_lost=lambda error, host=host: managers[host].session_lost(error))
               for host in ("a", "b")}
    # (The members keep the containers' claims: the two hosts start together safely.)
    managers.update({host: _manager(tmp_path, host, claims=members[host]) for host in ("a", "b")})
    try:
        for host in ("a", "b"):
            await managers[host].start()
            await members[host].start()
        await wait_until(lambda: managers["a"].serving | managers["b"].serving == set(range(CONTAINER_COUNT))
                         and not managers["a"].serving & managers["b"].serving
                         and len(managers["a"].serving) == len(managers["b"].serving) == 2,
                         "two hosts serving two containers each")
        moving = sorted(managers["b"].serving)
        for container_id in moving:
            container = managers["b"].container(container_id)
            await container.create_segment("s")
            await container.append("s", f"written on b to {container_id};".encode())
        await members["b"].stop()
        await managers["b"].stop()
        await wait_until(lambda: managers["a"].serving == set(range(CONTAINER_COUNT)), "a to serve everything",
                         WAIT_SECONDS)
        await managers["a"].settled()
        for container_id in moving:
            assert await _read_all(managers["a"], container_id, "s") == f"written on b to {container_id};".encode()
    finally:
        for host in ("a", "b"):
            await members[host].stop()
            await managers[host].stop()
