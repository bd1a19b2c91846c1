"""The fenced idle owner (issue 23): an owner whose container another host took over stops serving it
as soon as it learns so -- its claim znode names another host, or its session is lost -- not at its
next Tier-1 write, which an idle owner may never make.  Until it learns, what it can return is bounded:
only what its log committed, which the new owner recovers (stale, never lost)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from millstream.cluster._containers import ContainerClaims, ContainerManager
from millstream.cluster._zookeeper import Assignment, ClusterMember, write_claim
from millstream.errors import WrongHostError
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.testing.zookeeper_server import ZooKeeperServer

from .test_start_race import _Claims
from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, WAIT_SECONDS, cluster_name, file_logs, in_loop, wait_until

CONTAINER_COUNT = 1


def _manager(root: Path, host_id: str, claims: ContainerClaims, left: list[int] | None = None) -> ContainerManager:
    return ContainerManager(host_id, file_logs(root), chunk_storage=FileChunkStorage(root / "tier2"),
                            host_options={"restart_delay_seconds": 0.01}, claims=claims,
                            on_leaving=None if left is None else left.append)


async def _read_all(manager: ContainerManager) -> bytes:
    container = manager.container(0)
    result = await container.read("s", 0, container.get_info("s").length)
    return bytes(result.data)


@in_loop
async def test_an_idle_owner_stops_serving_when_another_host_claims_its_container(tmp_path: Path) -> None:
    """By hand, no ZooKeeper: a serves container 0 and goes idle; b (under a newer map a never saw)
    claims and opens it, fencing a.  Before a hears of the claim, a read from a returns only what a
    acknowledged, all of which b has; once the claim watch reports b's claim, a stops serving at once
    (the router is told, requests get ``WrongHostError``) and does not start it again under its map."""
    claims = _Claims()
    left: list[int] = []
    a, b = _manager(tmp_path, "a", claims, left), _manager(tmp_path, "b", claims)
    async with a, b:
        a.apply(Assignment({0: "a"}, 0, CONTAINER_COUNT))
        await a.settled()
        old = a.container(0)
        await old.create_segment("s")
        await old.append("s", b"acknowledged by a;")
        b.apply(Assignment({0: "b"}, 1, CONTAINER_COUNT))  # (a does not hear of it: a zombie, or slow)
        await b.settled()
        assert b.serving == {0}
        await b.container(0).append("s", b"then b;")
        # The bound before a learns: a's reads are a prefix of what the new owner holds.
        seen_on_a = await _read_all(a)
        assert seen_on_a == b"acknowledged by a;"
        assert (await _read_all(b)).startswith(seen_on_a)
        a.claim_changed(0, await claims.container_claim(0))
        assert left == [0]
        with pytest.raises(WrongHostError):
            a.container(0)
        await a.settled()
        assert a.serving == frozenset() and a.history[-1] == ("stop", 0)
        # A late report of a's own claim, or of an older one, changes nothing on b.
        b.claim_changed(0, ("b", 1))
        b.claim_changed(0, ("a", 0))
        assert b.serving == {0}


@in_loop
async def test_a_lost_session_stops_serving_before_the_call_returns(tmp_path: Path) -> None:
    """``session_lost`` withdraws every container at once, not when the manager's task next runs
    (before the fix, ``container()`` still handed out the container after the call)."""
    left: list[int] = []
    a = _manager(tmp_path, "a", _Claims(), left)
    async with a:
        a.apply(Assignment({0: "a"}, 0, CONTAINER_COUNT))
        await a.settled()
        assert a.container(0) is not None
        a.session_lost(RuntimeError("expired"))
        with pytest.raises(WrongHostError):
            a.container(0)
        assert left == [0]
        await a.settled()
        assert a.serving == frozenset() and a.history[-1] == ("stop", 0)


def _later(managers: dict[str, ContainerManager], method: str) -> Callable[..., None]:
    """A member callback calling host a's manager's ``method`` (the manager is built after the member)."""
    def call(*args: Any) -> None:
        getattr(managers["a"], method)(*args)
    return call


@in_loop
async def test_the_claim_watch_on_zookeeper_stops_an_idle_owner(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """On real ZooKeeper: host a (alone, so it leads and maps container 0 to itself) serves it and goes
    idle.  Another host claims it under a newer map, as a new owner does before opening the log; a's
    member watches the claim and a stops serving, with no write of its own to fail."""
    cluster = cluster_name()
    managers: dict[str, ContainerManager] = {}
    member = ClusterMember(zookeeper.connect_string, cluster=cluster, host_id="a", address="a:1",
                           container_count=CONTAINER_COUNT, session_timeout_seconds=SESSION_TIMEOUT_SECONDS,
                           connect_timeout_seconds=30.0, on_assignment=_later(managers, "apply"),
                           on_session_lost=_later(managers, "session_lost"),
                           on_claim=_later(managers, "claim_changed"))
    managers["a"] = _manager(tmp_path, "a", member)
    try:
        await managers["a"].start()
        await member.start()
        await wait_until(lambda: managers["a"].serving == {0}, "a to serve container 0")
        version = member.assignment.version
        write_claim(member.client, member.paths, 0, "b", version + 1)
        await wait_until(lambda: managers["a"].serving == frozenset(), "a to stop serving the claimed container",
                         WAIT_SECONDS)
        with pytest.raises(WrongHostError):
            managers["a"].container(0)
    finally:
        await member.stop()
        await managers["a"].stop()
