"""Membership, election and the container map on a real ZooKeeper (``millstream.cluster._zookeeper``):
three members in one process, each with its own kazoo client and session.

Every wait is for a condition, bounded generously (a loaded CI machine); session timeouts are small
and injected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from kazoo.client import KazooClient, KazooState

from millstream.cluster._assignment import check_assignment
from millstream.cluster._zookeeper import (
    Assignment,
    ClusterMember,
    cluster_paths,
    read_assignment,
    write_assignment,
)
from millstream.errors import AssignmentConflictError, CoordinationUnavailableError, SessionLostError
from millstream.testing.clock import ManualClock
from millstream.testing.zookeeper_server import ZooKeeperServer

from .zookeeper_helpers import CONTAINER_COUNT, SESSION_TIMEOUT_SECONDS, WAIT_SECONDS, cluster_name, in_loop, wait_until


def _member(zookeeper: ZooKeeperServer, cluster: str, host_id: str, **options: object) -> ClusterMember:
    return ClusterMember(zookeeper.connect_string, cluster=cluster, host_id=host_id, address=f"{host_id}:9090",
                         container_count=CONTAINER_COUNT, session_timeout_seconds=SESSION_TIMEOUT_SECONDS,
                         connect_timeout_seconds=30.0, **options)  # type: ignore[arg-type]


@asynccontextmanager
async def _members(zookeeper: ZooKeeperServer, cluster: str,
                   host_ids: list[str]) -> AsyncIterator[dict[str, ClusterMember]]:
    members = {host_id: _member(zookeeper, cluster, host_id) for host_id in host_ids}
    try:
        for member in members.values():
            await member.start()
        yield members
    finally:
        for member in members.values():
            await member.stop()


def _converged(members: dict[str, ClusterMember], live: set[str]) -> Callable[[], bool]:
    """Every live member sees the same map, and it is a balanced map onto exactly the live hosts."""
    def check() -> bool:
        maps = [members[host].assignment for host in live]
        first = maps[0]
        return all(m == first for m in maps) and set(first.containers.values()) == live \
            and check_assignment(first.containers, live, CONTAINER_COUNT) is None
    return check


def _leaders(members: dict[str, ClusterMember]) -> list[str]:
    return [host for host, member in members.items() if member.is_leader]


@in_loop
async def test_three_members_assign_every_container_exactly_once_balanced(zookeeper: ZooKeeperServer) -> None:
    async with _members(zookeeper, cluster_name(), ["a", "b", "c"]) as members:
        await wait_until(_converged(members, {"a", "b", "c"}), "three members to agree on a balanced map")
        await wait_until(lambda: len(_leaders(members)) == 1, "one leader")
        assignment = members["a"].assignment
        assert sorted(assignment.containers) == list(range(CONTAINER_COUNT))
        counts = sorted(len(assignment.containers_of(host)) for host in "abc")
        assert counts == [2, 3, 3]
        # ZooKeeper holds what they see, and each host is registered with its address.
        stored = await asyncio.to_thread(read_assignment, members["a"].client, members["a"].paths)
        assert stored.containers == assignment.containers
        address, _ = members["b"].client.get(members["b"].paths.host("c"))
        assert address == b"c:9090"


@in_loop
async def test_a_member_that_leaves_has_its_containers_reassigned(zookeeper: ZooKeeperServer) -> None:
    async with _members(zookeeper, cluster_name(), ["a", "b", "c"]) as members:
        await wait_until(_converged(members, {"a", "b", "c"}), "a balanced map of three")
        leader = _leaders(members)[0]
        leaving = next(host for host in "abc" if host != leader)
        before = members[leader].assignment
        await members[leaving].stop()  # closes its session: ZooKeeper removes its registration at once
        staying = {"a", "b", "c"} - {leaving}
        await wait_until(_converged(members, staying), f"{leaving}'s containers to move to {staying}")
        after = members[leader].assignment
        # Only the leaver's containers moved.
        assert {c for c, host in after.containers.items() if before.containers[c] != host} == \
            set(before.containers_of(leaving))
        assert after.version > before.version


@in_loop
async def test_when_the_leader_leaves_another_is_elected_and_the_map_converges(zookeeper: ZooKeeperServer) -> None:
    async with _members(zookeeper, cluster_name(), ["a", "b", "c"]) as members:
        await wait_until(_converged(members, {"a", "b", "c"}), "a balanced map of three")
        await wait_until(lambda: len(_leaders(members)) == 1, "one leader")
        old_leader = _leaders(members)[0]
        await members[old_leader].stop()
        staying = {"a", "b", "c"} - {old_leader}
        await wait_until(lambda: [h for h in _leaders(members) if h in staying] != [], "a new leader")
        await wait_until(_converged(members, staying), "the new leader's map")
        assert len([h for h in _leaders(members) if h in staying]) == 1
        new_leader = next(h for h in _leaders(members) if h in staying)
        assert members[new_leader].writes >= 1


@in_loop
async def test_a_stale_leaders_conditional_write_is_refused(zookeeper: ZooKeeperServer) -> None:
    paths = cluster_paths(cluster_name())
    old = KazooClient(hosts=zookeeper.connect_string)
    new = KazooClient(hosts=zookeeper.connect_string)
    await asyncio.to_thread(old.start, 30.0)
    await asyncio.to_thread(new.start, 30.0)
    try:
        old.ensure_path(paths.root)
        version = write_assignment(old, paths, {0: "a", 1: "a"}, 2, -1)
        read_by_old = read_assignment(old, paths)
        assert read_by_old.version == version
        # A successor writes first...
        write_assignment(new, paths, {0: "b", 1: "b"}, 2, read_by_old.version)
        # ...so the deposed leader's write, conditioned on what it read, is refused and changes nothing.
        with pytest.raises(AssignmentConflictError):
            write_assignment(old, paths, {0: "a", 1: "c"}, 2, read_by_old.version)
        with pytest.raises(AssignmentConflictError):  # and creating over an existing map is refused too
            write_assignment(old, paths, {0: "a", 1: "c"}, 2, -1)
        assert read_assignment(new, paths).containers == {0: "b", 1: "b"}
    finally:
        for client in (old, new):
            await asyncio.to_thread(client.stop)
            await asyncio.to_thread(client.close)


@in_loop
async def test_a_member_whose_session_expired_stops_its_containers(zookeeper: ZooKeeperServer) -> None:
    lost: list[BaseException] = []
    cluster = cluster_name()
    doomed = _member(zookeeper, cluster, "doomed", on_session_lost=lost.append)
    async with _members(zookeeper, cluster, ["a"]) as members:
        await doomed.start()
        try:
            members["doomed"] = doomed
            await wait_until(_converged(members, {"a", "doomed"}), "a map of two")
            # Expire the session the way ZooKeeper does for a host that went silent: another client
            # attaches to the same session and closes it (kazoo's own test harness does the same).
            session_id, password = doomed.client.client_id
            twin = KazooClient(hosts=zookeeper.connect_string, client_id=(session_id, password))
            await asyncio.to_thread(twin.start, 30.0)
            await asyncio.to_thread(twin.stop)
            await asyncio.to_thread(twin.close)
            assert doomed.stopped is not None
            cause = await asyncio.wait_for(doomed.stopped, WAIT_SECONDS)
            assert isinstance(cause, SessionLostError)
            assert lost == [cause]
            assert not doomed.is_leader
            del members["doomed"]
            await wait_until(_converged(members, {"a"}), "the survivor to take every container")
        finally:
            await doomed.stop()


@in_loop
async def test_a_member_cut_off_from_zookeeper_for_a_session_timeout_stops_its_containers(
        zookeeper_own: ZooKeeperServer) -> None:
    """ZooKeeper itself goes away: the member is suspended (starts nothing new, keeps serving), and
    after a whole session timeout without ZooKeeper it takes its session as lost."""
    suspensions: list[bool] = []
    lost: list[BaseException] = []
    member = _member(zookeeper_own, cluster_name(), "alone", on_suspended=suspensions.append,
                     on_session_lost=lost.append)
    await member.start()
    try:
        await wait_until(lambda: member.assignment.containers_of("alone") == frozenset(range(CONTAINER_COUNT)),
                         "the lone member to take every container")
        await asyncio.to_thread(zookeeper_own.kill)
        await wait_until(lambda: suspensions == [True], "the member to notice it is suspended")
        assert member.stopped is not None
        cause = await asyncio.wait_for(member.stopped, WAIT_SECONDS)
        assert isinstance(cause, SessionLostError) and "session timeout" in str(cause)
        assert lost == [cause]
    finally:
        await member.stop()


@in_loop
async def test_a_wrong_zookeeper_address_fails_to_start_with_a_typed_error() -> None:
    # A loopback port nobody listens on: connection refused, again and again, until the bound.
    member = ClusterMember("127.0.0.1:1", cluster=cluster_name(), host_id="h", address="h:1",
                           container_count=2, connect_timeout_seconds=1.0)
    with pytest.raises(CoordinationUnavailableError, match="did not answer within"):
        await member.start()
    assert member.stopped is not None and not member.stopped.done()
    await member.stop()  # nothing left to stop; harmless


@in_loop
async def test_a_host_id_taken_by_a_live_session_is_refused(zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    async with _members(zookeeper, cluster, ["twin"]):
        second = _member(zookeeper, cluster, "twin")
        with pytest.raises(CoordinationUnavailableError, match="registered"):
            await second.start()


def test_an_assignment_lists_a_hosts_containers() -> None:
    assignment = Assignment({0: "a", 1: "b", 2: "a"}, 3, 3)
    assert assignment.containers_of("a") == {0, 2} and assignment.containers_of("z") == frozenset()


@in_loop
async def test_a_lost_session_is_not_coalesced_away_by_the_reconnection_after_it(zookeeper: ZooKeeperServer) -> None:
    """kazoo reports LOST and, on a new session, CONNECTED right after; the member's task may see only
    the newest state.  The loss must still stop the member (found in review: it did not)."""
    lost: list[BaseException] = []
    member = _member(zookeeper, cluster_name(), "h", on_session_lost=lost.append)
    await member.start()
    try:
        # What kazoo's thread does, both before the loop runs the member's task once.
        member._on_state(KazooState.LOST)
        member._on_state(KazooState.CONNECTED)
        assert member.stopped is not None
        cause = await asyncio.wait_for(member.stopped, WAIT_SECONDS)
        assert isinstance(cause, SessionLostError) and lost == [cause]
    finally:
        await member.stop()


@in_loop
async def test_a_timer_of_an_earlier_suspension_does_not_expire_a_later_one(zookeeper: ZooKeeperServer) -> None:
    """Suspended at t=0, back at 0.5, suspended again at 1.5: at t=2 (the first suspension's session
    timeout) the member has been cut off for 0.5 s only and must carry on; it gives up at 3.5."""
    clock = ManualClock()
    member = _member(zookeeper, cluster_name(), "h", clock=clock)
    await member.start()
    try:
        assert member.stopped is not None
        member._on_state(KazooState.SUSPENDED)
        await wait_until(lambda: member.suspended and clock.sleeping == 1, "the first suspension's timer")
        clock.advance(0.5)
        member._on_state(KazooState.CONNECTED)
        await wait_until(lambda: not member.suspended, "the connection back")
        clock.advance(1.0)
        member._on_state(KazooState.SUSPENDED)
        await wait_until(lambda: member.suspended and clock.sleeping == 2, "the second suspension's timer")
        clock.advance(0.6)  # t = 2.1: past the first timer's deadline only
        await wait_until(lambda: clock.sleeping == 1, "the first timer to wake and end")
        await asyncio.sleep(0)
        assert not member.stopped.done()
        clock.advance(1.5)  # t = 3.6: a whole session timeout into the second suspension
        cause = await asyncio.wait_for(member.stopped, WAIT_SECONDS)
        assert isinstance(cause, SessionLostError)
    finally:
        await member.stop()
