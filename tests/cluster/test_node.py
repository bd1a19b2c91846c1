"""A cluster node (``millstream.cluster._node``): a segment-store server that serves exactly what
ZooKeeper's map gives it.  Two nodes on real ZooKeeper, FileLogs and one Tier-2 directory shared
(the shared-disk case), in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from millstream.client import AsyncClient, ClientConfig
from millstream.client._controller import ControllerSegmentLocator
from millstream.cluster import ClusterNode
from millstream.errors import CoordinationUnavailableError, SessionLostError
from millstream.naming import container_of
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.server import ServerConfig, ServerState
from millstream.testing.zookeeper_server import ZooKeeperServer
from millstream.wire import CreateSegment, SegmentCreated, WrongHost, codec
from tests.server.raw import RawClient

from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, WAIT_SECONDS, cluster_name, file_logs, in_loop, wait_until

CONTAINER_COUNT = 4


def _segment_in(container_id: int, prefix: str) -> str:
    return next(name for name in (f"scope/{prefix}-{index}" for index in range(1000))
                if container_of(name, CONTAINER_COUNT) == container_id)


@in_loop
async def test_two_nodes_share_the_containers_and_one_takes_all_when_the_other_stops(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    storages = {host: FileChunkStorage(tmp_path / "tier2") for host in ("a", "b")}
    nodes = {host: ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host,
                               open_log=file_logs(tmp_path), chunk_storage=storages[host],
                               config=ServerConfig(container_count=CONTAINER_COUNT),
                               session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                               host_options={"restart_delay_seconds": 0.01})
             for host in ("a", "b")}
    a, b = nodes["a"], nodes["b"]
    try:
        # (Both start together: a start still under way on one node when the map moves that container
        # to the other is the race the container claims close; test_start_race.py reproduces it.)
        await asyncio.gather(a.start(), b.start())
        await wait_until(lambda: a.serving | b.serving == set(range(CONTAINER_COUNT))
                         and not a.serving & b.serving and len(a.serving) == len(b.serving) == 2,
                         "two nodes serving two containers each")
        assert a.member is not None and a.member.address == a.address
        # The cluster's map says where each segment lives: on the node serving its container.
        for container_id in range(CONTAINER_COUNT):
            segment = _segment_in(container_id, "located")
            owner = a if container_id in a.serving else b
            assert await a.segment_uri(segment) == await b.segment_uri(segment) == owner.uri
        # Every container is reachable on its node, and refused as WrongHost on the other.
        written = {}
        for node, other in ((a, b), (b, a)):
            first = await RawClient.connect(node.server.port)
            second = await RawClient.connect(other.server.port)
            for request_id, container_id in enumerate(sorted(node.serving)):
                segment = _segment_in(container_id, "stream")
                assert await second.request(CreateSegment(request_id, segment, "")) == WrongHost(
                    request_id, segment, "")
                assert await first.request(CreateSegment(request_id, segment, "")) == SegmentCreated(
                    request_id, segment)
                data = f"written through {node.host_id} into container {container_id};".encode() * 20
                await node.server.container_for(segment).append(segment, data)
                written[segment] = data
            await first.close()
            await second.close()
        # a stops: b serves every container, with what was written through a.
        from_a = sorted(a.serving)
        await a.stop()
        await wait_until(lambda: b.serving == set(range(CONTAINER_COUNT)), "b serving every container")
        for container_id in range(CONTAINER_COUNT):
            assert await b.segment_uri(_segment_in(container_id, "located")) == b.uri
        for segment, data in written.items():
            container = b.server.container_for(segment)
            length = container.get_info(segment).length
            assert (await container.read(segment, 0, length)).data == data
        # And b takes requests for a's former containers over the wire.
        client = await RawClient.connect(b.server.port)
        for request_id, container_id in enumerate(from_a, start=100):
            moved = _segment_in(container_id, "new")
            assert await client.request(CreateSegment(request_id, moved, "")) == SegmentCreated(request_id, moved)
        await client.close()
        assert a.serving == frozenset()
        b.server.check_invariants()
    finally:
        for node in (a, b):
            await node.stop()
        for storage in storages.values():
            await storage.close()


@in_loop
async def test_a_node_given_a_wrong_zookeeper_address_fails_to_start_and_leaves_nothing_running(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    storage = FileChunkStorage(tmp_path / "tier2")
    node = ClusterNode(f"127.0.0.1:{port}", cluster=cluster_name(), host_id="lonely", open_log=file_logs(tmp_path),
                       chunk_storage=storage, config=ServerConfig(container_count=CONTAINER_COUNT),
                       connect_timeout_seconds=1.0)
    try:
        with pytest.raises(CoordinationUnavailableError, match="did not answer"):
            await node.start()
        assert node.server.state is ServerState.STOPPED
        assert node.serving == frozenset()
    finally:
        await node.stop()
        await storage.close()


@in_loop
async def test_a_node_cut_off_from_zookeeper_stops_serving_its_containers(
        tmp_path: Path, zookeeper_own: ZooKeeperServer) -> None:
    """ZooKeeper goes away: after a session timeout the node cannot know it still owns anything, so
    its server answers WrongHost for every segment (rather than risk two owners)."""
    storage = FileChunkStorage(tmp_path / "tier2")
    node = ClusterNode(zookeeper_own.connect_string, cluster=cluster_name(), host_id="alone",
                       open_log=file_logs(tmp_path), chunk_storage=storage,
                       config=ServerConfig(container_count=CONTAINER_COUNT),
                       session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0)
    try:
        await node.start()
        await wait_until(lambda: node.serving == set(range(CONTAINER_COUNT)), "the lone node to serve everything")
        segment = _segment_in(0, "stream")
        client = await RawClient.connect(node.server.port)
        assert await client.request(CreateSegment(1, segment, "")) == SegmentCreated(1, segment)
        await asyncio.to_thread(zookeeper_own.kill)
        assert node.stopped is not None
        cause = await asyncio.wait_for(node.stopped, WAIT_SECONDS)
        assert isinstance(cause, SessionLostError)
        await wait_until(lambda: node.serving == frozenset(), "the node to stop serving")
        assert node.manager.serving == frozenset()
        assert await client.request(CreateSegment(2, segment, "")) == WrongHost(2, segment, "")
        await client.close()
    finally:
        await node.stop()
        await storage.close()


class _ClusterAnswers:
    """The one controller call the client's locator makes, answered from the cluster's map (what a
    cluster controller will answer; the controller itself is not hosted by cluster nodes yet)."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.asked = 0

    async def get_segment_uri(self, segment: str) -> str:
        self.asked += 1
        return await self.node.segment_uri(segment)


@in_loop
async def test_a_writer_and_a_reader_follow_a_container_that_moves(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    storages = {host: FileChunkStorage(tmp_path / "tier2") for host in ("a", "b")}
    nodes = {host: ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host,
                               open_log=file_logs(tmp_path), chunk_storage=storages[host],
                               config=ServerConfig(container_count=CONTAINER_COUNT),
                               session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                               host_options={"restart_delay_seconds": 0.01})
             for host in ("a", "b")}
    a, b = nodes["a"], nodes["b"]
    try:
        await asyncio.gather(a.start(), b.start())
        await wait_until(lambda: len(a.serving) == len(b.serving) == CONTAINER_COUNT // 2
                         and a.serving | b.serving == set(range(CONTAINER_COUNT)), "two balanced nodes")
        segment = _segment_in(min(a.serving), "moving")  # on a, which will leave
        answers = _ClusterAnswers(b)
        locator = ControllerSegmentLocator(answers)  # type: ignore[arg-type]
        async with AsyncClient(b.uri, config=ClientConfig(reconnect_budget_seconds=WAIT_SECONDS),
                               locator=locator) as client:
            await client.segments().create(segment)
            writer = client.event_writer([segment])
            for index in range(100):
                await writer.write_event(b"event %d" % index)
            await writer.flush()
            assert (await client.segments().read(segment, 0)).data.startswith(codec.encode_event(b"event 0"))
            # a leaves while the writer carries on: its container moves to b.
            stopping = asyncio.ensure_future(a.stop())
            for index in range(100, 200):
                await writer.write_event(b"event %d" % index)
            await stopping
            await writer.flush()
            await writer.close()
            await wait_until(lambda: b.serving == set(range(CONTAINER_COUNT)), "b serving every container")
            data = b""
            while True:
                result = await client.segments().read(segment, len(data))
                data += result.data
                if result.end_of_segment or not result.data:
                    break
        assert list(codec.iter_events(data)) == [b"event %d" % index for index in range(200)]  # once each, in order
        assert answers.asked >= 2  # asked again after the move
    finally:
        for node in (a, b):
            await node.stop()
        for storage in storages.values():
            await storage.close()
