"""The controller on cluster nodes, and clients that need only seeds (issue 23).

Three nodes in one process on real ZooKeeper, FileLogs and one Tier-2 directory shared by all (the
shared-disk case).  The controller runs on the node serving its metadata container and moves with it;
a client given the nodes' URIs as seeds finds it, writes with an idempotent writer and a transaction,
reads with a reader group, and follows the controller and the containers when their nodes stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import pytest

from millstream import limits
from millstream.client import AsyncClient, ClientConfig
from millstream.client._controller import LOCATE_CONTROLLER
from millstream.cluster import ClusterNode
from millstream.controller import Controller
from millstream.errors import ContainerUnavailableError, ObjectClosedError
from millstream.naming import container_of, stream_segment_name
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.server import ServerConfig
from millstream.testing.history import History, check
from millstream.testing.zookeeper_server import ZooKeeperServer
from millstream.values import (
    ReaderGroupConfig,
    ScalingPolicy,
    StreamConfig,
    TransactionInfo,
    TransactionStatus,
    canonical_json,
)
from millstream.wire import ControllerReply, ControllerRequest, ErrorMessage, WrongHost
from tests.server.raw import RawClient

from .workload import EMPTY_READS_MAX, RecordedWorkload
from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, cluster_name, file_logs, in_loop, wait_until

CONTAINER_COUNT = 4
HOSTS = ("a", "b", "c")


@contextlib.asynccontextmanager
async def _cluster(tmp_path: Path, zookeeper: ZooKeeperServer) -> AsyncIterator[dict[str, ClusterNode]]:
    """Three nodes started on one ZooKeeper, FileLogs and one shared Tier-2 directory, by host id.  A test
    that stops a node takes it out of the dict; the rest are stopped on the way out, whatever happens."""
    cluster = cluster_name()
    storages = [FileChunkStorage(tmp_path / "tier2") for _ in HOSTS]
    nodes = {host: ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host,
                               open_log=file_logs(tmp_path), chunk_storage=storage,
                               config=ServerConfig(container_count=CONTAINER_COUNT),
                               session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                               host_options={"restart_delay_seconds": 0.01})
             for host, storage in zip(HOSTS, storages, strict=True)}
    running = dict(nodes)
    try:
        await asyncio.gather(*(node.start() for node in nodes.values()))
        yield running
    finally:
        for node in running.values():
            await node.stop()
        for storage in storages:
            await storage.close()


def _controller_nodes(nodes: dict[str, ClusterNode]) -> list[ClusterNode]:
    return [node for node in nodes.values() if node.controller is not None]


async def _settled(nodes: dict[str, ClusterNode]) -> ClusterNode:
    """Wait until the running nodes serve every container once and exactly one runs the controller."""
    await wait_until(lambda: sorted(c for node in nodes.values() for c in node.serving) == list(range(CONTAINER_COUNT))
                     and len(_controller_nodes(nodes)) == 1
                     and all(n.controller_container in n.serving for n in _controller_nodes(nodes)),
                     "every container served once, one controller on the node serving its metadata container")
    return _controller_nodes(nodes)[0]


@contextlib.asynccontextmanager
async def _client_with_stream(nodes: dict[str, ClusterNode], stream: str, *, segments: int,
                              config: ClientConfig | None = None) -> AsyncIterator[AsyncClient]:
    """A client given every node as a seed, with ``stream`` (``scope/name``) created, fixed at
    ``segments`` segments."""
    seeds = ",".join(node.uri for node in nodes.values())
    async with AsyncClient(seeds, config=config or _client_config()) as client:
        await client.stream_manager().create_scope(stream.partition("/")[0])
        await client.stream_manager().create_stream(stream, StreamConfig(scaling=ScalingPolicy.fixed(segments)))
        yield client


def _client_config() -> ClientConfig:
    # Generous budgets: an outage here lasts a ZooKeeper session timeout and a container's recovery.
    return ClientConfig(connect_timeout_seconds=5.0, request_timeout_seconds=10.0, reconnect_budget_seconds=60.0,
                        reconnect_delay_max_seconds=0.2)


@in_loop
async def test_the_controller_runs_on_the_node_serving_its_metadata_container(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    async with _cluster(tmp_path, zookeeper) as nodes:
        runner = await _settled(nodes)
        # Every node says where it runs; the others refuse controller methods as WrongHost.
        for request_id, node in enumerate(nodes.values()):
            raw = await RawClient.connect(node.server.port)
            reply = await raw.request(ControllerRequest(request_id, LOCATE_CONTROLLER, b"{}"))
            assert reply == ControllerReply(request_id, canonical_json({"uri": runner.uri}))
            listed = await raw.request(ControllerRequest(100 + request_id, "list_scopes", b"{}"))
            if node is runner:
                assert listed == ControllerReply(100 + request_id, canonical_json({"scopes": []}))
            else:
                assert isinstance(listed, WrongHost) and listed.request_id == 100 + request_id
            # A hostile body is refused with a clear error, and the connection serves on.
            for index, body in enumerate((b"[]", b'{"scope": "x"}', b'{"token": 7}', b"{", b"x" * 70_000)):
                refused = await raw.request(ControllerRequest(200 + index, LOCATE_CONTROLLER, body))
                assert isinstance(refused, ErrorMessage) and refused.request_id == 200 + index, refused
            assert await raw.request(ControllerRequest(300, LOCATE_CONTROLLER, b'{"token": ""}')) == \
                ControllerReply(300, canonical_json({"uri": runner.uri}))
            await raw.close()


@in_loop
async def test_a_client_given_seeds_writes_and_reads_exactly_once_while_the_controller_and_containers_move(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    history = History()
    async with _cluster(tmp_path, zookeeper) as running:
        await _settled(running)
        seeds = ",".join(node.uri for node in running.values())
        async with AsyncClient(seeds, config=_client_config()) as client:
            await client.stream_manager().create_scope("shop")
            await client.stream_manager().create_stream("shop/orders", StreamConfig(scaling=ScalingPolicy.fixed(4)))
            segments = [stream_segment_name("shop", "orders", index) for index in range(4)]
            workload = RecordedWorkload(client, "shop/orders", history)
            transactions = client.transactional_writer("shop/orders")
            await workload.write_round(50)
            # Stop the controller's node: the controller and the containers it served move.
            first = _controller_nodes(running)[0]
            await running.pop(first.host_id).stop()
            second = await _settled(running)
            assert second is not first
            await workload.write_round(50)
            await workload.commit_transaction(transactions, "t1", 10)
            # Stop a node serving a container that holds one of the stream's segments (and the controller,
            # if that is where it runs now).
            in_use = {container_of(name, CONTAINER_COUNT) for name in segments}
            victim = next(node for node in running.values() if node.serving & in_use)
            await running.pop(victim.host_id).stop()
            await _settled(running)
            await workload.write_round(50)
            await workload.writer.close()
            await transactions.close()
            # Read everything back with a reader group, through the same seeds.
            seen = await workload.read_back("shop/all")
        report = check(history)
        assert report.ok, report.summary()
        assert seen == workload.written == 160


@in_loop
async def test_a_controller_that_fails_to_start_is_started_again_while_its_node_keeps_the_container(
        tmp_path: Path, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch) -> None:
    failures = []
    start = Controller.start

    async def fail_first(controller: Controller) -> None:
        if not failures:
            failures.append(controller)
            raise ContainerUnavailableError("a container the controller must reach is still moving (injected)")
        await start(controller)
    monkeypatch.setattr(Controller, "start", fail_first)
    monkeypatch.setattr(limits, "CLUSTER_CONTROLLER_START_DELAY_SECONDS", 0.01)
    async with _cluster(tmp_path, zookeeper) as nodes:
        runner = await _settled(nodes)
        assert len(failures) == 1 and failures[0] is not runner.controller
        async with AsyncClient(",".join(node.uri for node in nodes.values()), config=_client_config()) as client:
            await client.stream_manager().create_scope("started")
            assert await client.stream_manager().list_scopes() == ["started"]


@in_loop
async def test_a_client_given_one_node_without_the_controller_finds_it_and_the_segments(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    async with _cluster(tmp_path, zookeeper) as nodes:
        runner = await _settled(nodes)
        seed = next(node for node in nodes.values() if node is not runner)
        async with AsyncClient(seed.uri, config=_client_config()) as client:
            assert not client.controller().in_cluster
            await client.stream_manager().create_scope("one")  # (answered WrongHost first, then found)
            assert client.controller().in_cluster and str(client.controller().endpoint) == runner.uri
            await client.stream_manager().create_stream("one/s", StreamConfig(scaling=ScalingPolicy.fixed(4)))
            async with client.event_writer("one/s") as writer:
                for index in range(40):
                    await writer.write_event(b"event %d" % index, routing_key=f"k{index}")
            # Reader groups read through the client's own segment operations: they find every node too.
            group = await client.reader_group("one/g", config=ReaderGroupConfig(["one/s"]))
            reader = await group.reader("r")
            seen: set[bytes] = set()
            for _ in range(EMPTY_READS_MAX):
                read = await reader.read_next_event(1.0)
                if read.event is not None:
                    seen.add(read.event)
                if len(seen) == 40:
                    break
            await group.close()
            assert seen == {b"event %d" % index for index in range(40)}


@in_loop
async def test_a_transaction_is_begun_committed_and_aborted_across_controller_moves(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """The controller's node stops between a transactional writer's calls, and the client is not told:
    ``begin`` (an unacknowledged ``create_transaction`` is safe to send again -- an orphan's lease
    lapses), ``commit`` and ``abort`` find the new controller and succeed, rather than handing the
    application a retryable error."""
    async with _cluster(tmp_path, zookeeper) as running:
        await _settled(running)
        async with _client_with_stream(running, "moves/s", segments=2) as client:
            transactions = client.transactional_writer("moves/s")
            first = await transactions.begin()
            await first.write_event(b"first", routing_key="k")
            await first.flush()
            # Stop the controller's node between two calls: the next begin meets the controller gone.
            await running.pop(_controller_nodes(running)[0].host_id).stop()
            second = await transactions.begin()
            await second.write_event(b"second", routing_key="k")
            await second.flush()
            assert await first.commit() in (TransactionStatus.COMMITTING, TransactionStatus.COMMITTED)
            # And again, between the commit and an abort.
            await _settled(running)
            await running.pop(_controller_nodes(running)[0].host_id).stop()
            assert await second.abort() in (TransactionStatus.ABORTING, TransactionStatus.ABORTED)
            assert await first.wait_for_completion() is TransactionStatus.COMMITTED
            assert await second.check_status() in (TransactionStatus.ABORTING, TransactionStatus.ABORTED)
            await transactions.close()


def _leave_after_the_first(method: str, running: dict[str, ClusterNode], stopping: list[asyncio.Task[None]],
                           monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Make ``Controller.<method>``'s first call take effect and then have the controller leave its node
    under the request, as when its container moves (the endpoint's ``rpc`` cleared, the call's store
    closed: ``ClusterControllerEndpoint`` answers ``ContainerUnavailable``, outcome unknown), and stop
    that node.  Returns the list the first call's result is put in."""
    original = getattr(Controller, method)
    results: list[object] = []

    async def leaving(controller: Controller, *args: object) -> object:
        result = await original(controller, *args)
        if results:
            return result
        results.append(result)
        node = next(node for node in running.values() if node.controller is controller)
        node.endpoint.rpc = None  # (what the node does first when the controller's container leaves it)
        stopping.append(asyncio.get_running_loop().create_task(running.pop(node.host_id).stop()))
        raise ObjectClosedError(f"the controller's store was closed under {method} (injected)")
    monkeypatch.setattr(Controller, method, leaving)
    return results


@in_loop
async def test_create_transaction_is_sent_again_after_the_controller_left_under_it(
        tmp_path: Path, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``create_transaction`` whose controller left under it (outcome unknown) is sent again to the new
    controller.  That is safe: the transaction the first request may have made was never acknowledged,
    so nobody writes to it or pings it, and the controller aborts it when its lease lapses -- as here."""
    stopping: list[asyncio.Task[None]] = []
    async with _cluster(tmp_path, zookeeper) as running:
        await _settled(running)
        async with _client_with_stream(running, "moves/s", segments=2) as client:
            orphans = _leave_after_the_first("create_transaction", running, stopping, monkeypatch)
            controller = client.controller()
            info = await controller.create_transaction("moves", "s", lease_seconds=limits.TRANSACTION_LEASE_MIN_SECONDS)
            assert len(orphans) == 1
            orphan = orphans[0]
            assert isinstance(orphan, TransactionInfo) and orphan.txn_id != info.txn_id
            # Neither is pinged: both leases lapse, and the controller (on its new node) aborts both.
            lapsed = (TransactionStatus.ABORTING, TransactionStatus.ABORTED)
            statuses: dict[UUID, TransactionStatus] = {}

            async def poll() -> None:
                while not all(statuses.get(t) in lapsed for t in (orphan.txn_id, info.txn_id)):
                    statuses.update(await controller.list_transactions("moves", "s"))
                    await asyncio.sleep(0.1)
            await asyncio.wait_for(poll(), 120.0)
        await asyncio.gather(*stopping)


@in_loop
async def test_commit_and_abort_are_resolved_after_the_controller_left_under_them(
        tmp_path: Path, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit, and an abort, whose controller left under them (outcome unknown) are resolved with the
    new controller: the commit by asking the transaction's status (committing again would be refused),
    the abort by sending it again (aborting an aborting transaction changes nothing)."""
    stopping: list[asyncio.Task[None]] = []
    async with _cluster(tmp_path, zookeeper) as running:
        await _settled(running)
        async with _client_with_stream(running, "moves/s", segments=2) as client:
            transactions = client.transactional_writer("moves/s")
            kept = await transactions.begin()
            dropped = await transactions.begin()
            await kept.write_event(b"kept", routing_key="k")
            await dropped.write_event(b"dropped", routing_key="k")
            committed = _leave_after_the_first("commit_transaction", running, stopping, monkeypatch)
            assert await kept.commit() in (TransactionStatus.COMMITTING, TransactionStatus.COMMITTED)
            assert len(committed) == 1
            await _settled(running)
            aborted = _leave_after_the_first("abort_transaction", running, stopping, monkeypatch)
            assert await dropped.abort() in (TransactionStatus.ABORTING, TransactionStatus.ABORTED)
            assert len(aborted) == 1
            assert await kept.wait_for_completion() is TransactionStatus.COMMITTED
            await transactions.close()
        await asyncio.gather(*stopping)


@in_loop
async def test_create_transaction_is_sent_again_when_no_reply_came_in_time(
        tmp_path: Path, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaign's transactions of unknown outcome included ``create_transaction`` timing out (a node
    too busy or dying to answer): in a cluster it is sent again, as after a lost connection."""
    release = asyncio.Event()
    hung: list[Controller] = []
    original = Controller.create_transaction

    async def hang_first(controller: Controller, scope: str, stream: str, lease: float | None = None,
                         ) -> TransactionInfo:
        if not hung:
            hung.append(controller)
            await release.wait()  # (no reply until the test ends: the client's request timeout passes)
        return await original(controller, scope, stream, lease)
    monkeypatch.setattr(Controller, "create_transaction", hang_first)
    async with _cluster(tmp_path, zookeeper) as running:
        await _settled(running)
        config = ClientConfig(connect_timeout_seconds=5.0, request_timeout_seconds=1.0, reconnect_budget_seconds=60.0,
                              reconnect_delay_max_seconds=0.2)
        try:
            async with _client_with_stream(running, "slow/s", segments=1, config=config) as client:
                transaction = await client.transactional_writer("slow/s").begin()
                assert len(hung) == 1
                assert await transaction.abort() in (TransactionStatus.ABORTING, TransactionStatus.ABORTED)
        finally:
            release.set()
