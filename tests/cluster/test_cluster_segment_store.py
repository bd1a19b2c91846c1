"""``ClusterSegmentStore`` (issue 23): the controller's ``SegmentStore`` over a whole cluster gives the
same answers for a segment served by another node, over the wire, as ``LocalSegmentStore`` gives
for one served in process -- the protocol's idempotent meanings included -- and follows a container
that moves.  Two nodes in one process on real ZooKeeper, FileLogs and a shared Tier-2 directory."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from millstream.client import AsyncClient
from millstream.cluster import ClusterNode
from millstream.cluster._segment_store import DRAIN_APPEND_COUNTS, ClusterSegmentStore
from millstream.controller import LocalSegmentStore
from millstream.controller._segment_store import AppendCounts, SegmentStore
from millstream.errors import (
    BadOffsetError,
    EventBoundaryError,
    InternalError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
)
from millstream.naming import container_of, stream_segment_name, transaction_segment_name
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.server import ServerConfig
from millstream.testing.zookeeper_server import ZooKeeperServer
from millstream.wire import ControllerReply, ControllerRequest, codec
from tests.server.raw import RawClient

from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, cluster_name, in_loop, wait_until

CONTAINER_COUNT = 4
EVENTS = [b"first", b"second event", b"third, the longest of the three"]


def _file_logs(root: Path) -> Callable[[int], DurableDataLog]:
    def open_log(container_id: int) -> DurableDataLog:
        return FileLog(root / "tier1" / f"container-{container_id}")
    return open_log


def _stream_in(containers: frozenset[int], prefix: str) -> str:
    """A stream segment's name whose container is one of ``containers``."""
    return next(name for name in (stream_segment_name("scope", f"{prefix}{index}", 0) for index in range(1000))
                if container_of(name, CONTAINER_COUNT) in containers)


async def _outcome(call: Callable[[], Awaitable[Any]]) -> Any:
    """What ``call`` returned, or the type of the error it raised."""
    try:
        result = await call()
    except Exception as error:  # (the scenario compares which errors, too)
        return type(error).__name__
    return (result.data, result.offset, result.end_of_segment) if hasattr(result, "data") else result


async def _scenario(store: SegmentStore, segment: str, write: Callable[[str, bytes], Awaitable[None]]) -> list[Any]:
    """The controller's uses of a store, on ``segment`` and one of its transaction segments."""
    source = transaction_segment_name(segment, UUID(int=7))
    second = transaction_segment_name(segment, UUID(int=8))
    frames = [codec.encode_event(event) for event in EVENTS]
    boundaries = [sum(len(frame) for frame in frames[:index]) for index in range(len(frames) + 1)]
    steps: list[Any] = [
        await _outcome(lambda: store.create_segment(segment)),
        await _outcome(lambda: store.create_segment(segment)),  # exists: False, nothing changes
        await _outcome(lambda: store.get_info(segment)),
        await _outcome(lambda: store.get_info(transaction_segment_name(segment, UUID(int=99)))),  # missing
    ]
    await write(segment, b"".join(frames))
    steps += [
        await _outcome(lambda: store.get_info(segment)),
        await _outcome(lambda: store.read(segment, boundaries[1], 1000)),
        *[await _outcome(lambda b=b: store.check_event_boundary(segment, b)) for b in boundaries],
        await _outcome(lambda: store.check_event_boundary(segment, boundaries[1] + 3)),  # inside an event
        await _outcome(lambda: store.check_event_boundary(segment, boundaries[-1] + 1)),  # beyond the end
        await _outcome(lambda: store.truncate(segment, boundaries[1])),
        await _outcome(lambda: store.truncate(segment, boundaries[1])),  # already there: nothing happens
        await _outcome(lambda: store.truncate(segment, 0)),  # below the start: nothing happens
        await _outcome(lambda: store.get_info(segment)),
        await _outcome(lambda: store.create_segment(source)),
    ]
    await write(source, frames[0])
    steps += [
        await _outcome(lambda: store.merge(segment, source)),
        await _outcome(lambda: store.merge(segment, source)),  # merged already: False
        await _outcome(lambda: store.get_info(source)),
        await _outcome(lambda: store.seal(segment)),
        await _outcome(lambda: store.seal(segment)),  # sealed already: its length again
        await _outcome(lambda: store.create_segment(second)),
        await _outcome(lambda: store.merge(segment, second)),  # into a sealed target
        await _outcome(lambda: store.delete(second)),
        await _outcome(lambda: store.delete(second)),
        await _outcome(lambda: store.delete(segment)),
        await _outcome(lambda: store.delete(segment)),  # gone already: False
        await _outcome(lambda: store.get_info(segment)),
        await _outcome(lambda: store.seal(segment)),
    ]
    return steps


@in_loop
async def test_a_segment_on_another_node_behaves_as_one_in_process(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    storages = [FileChunkStorage(tmp_path / "tier2") for _ in range(2)]
    a, b = (ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host, open_log=_file_logs(tmp_path),
                        chunk_storage=storage, config=ServerConfig(container_count=CONTAINER_COUNT),
                        session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                        host_options={"restart_delay_seconds": 0.01})
            for host, storage in zip("ab", storages, strict=True))
    try:
        await asyncio.gather(a.start(), b.start())
        await wait_until(lambda: len(a.serving) == len(b.serving) == 2, "two nodes serving two containers each")
        await a.refresh_addresses()

        async def write(segment: str, data: bytes) -> None:
            node = a if container_of(segment, CONTAINER_COUNT) in a.serving else b
            await node.server.container_for(segment).append(segment, data)

        local_segment = _stream_in(a.serving, "here")
        remote_segment = _stream_in(b.serving, "there")
        local = await _scenario(LocalSegmentStore(a.server), local_segment, write)
        store = ClusterSegmentStore(a.server, a, token=await a._read_peer_token(a._claims()))
        try:
            remote = await _scenario(store, remote_segment, write)
            assert remote == local, [(index, here, there) for index, (here, there)
                                     in enumerate(zip(local, remote, strict=True)) if here != there]
            assert "EventBoundaryError" in local and "BadOffsetError" in local and False in local
            assert store.uri_of(remote_segment) == b.uri and store.uri_of(local_segment) == a.uri
            # Raw appends (the controller's own log) are served only in process.
            with pytest.raises(InternalError, match="its own log"):
                await store.append(_stream_in(b.serving, "log"), b"raw", expected_offset=0)
            # The container moves: b stops, and the same store finds the segment on a, now in process.
            moving = _stream_in(b.serving, "moving")
            assert await store.create_segment(moving) is True
            await b.stop()
            await wait_until(lambda: len(a.serving) == CONTAINER_COUNT, "a serving every container")
            assert await store.create_segment(moving) is False
            assert await store.seal(moving) == 0
        finally:
            await store.close()
    finally:
        await a.stop()
        await b.stop()
        for storage in storages:
            await storage.close()

    assert {BadOffsetError.__name__, EventBoundaryError.__name__, StreamSegmentSealedError.__name__,
            StreamSegmentNotExistsError.__name__} >= {step for step in local if isinstance(step, str)}


@in_loop
async def test_the_append_counts_of_other_nodes_reach_the_controllers_store_for_the_peer_token_only(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    storages = [FileChunkStorage(tmp_path / "tier2") for _ in range(2)]
    a, b = (ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host, open_log=_file_logs(tmp_path),
                        chunk_storage=storage, config=ServerConfig(container_count=CONTAINER_COUNT),
                        session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0)
            for host, storage in zip("ab", storages, strict=True))
    try:
        await asyncio.gather(a.start(), b.start())
        await wait_until(lambda: len(a.serving) == len(b.serving) == 2, "two nodes serving two containers each")
        await a.refresh_addresses()
        there, here = _stream_in(b.serving, "there"), _stream_in(a.serving, "here")
        for node, segment in ((b, there), (a, here)):
            await node.server.container_for(segment).create_segment(segment)
        # Appends through the wire are what the servers count (per block, as writers send them).
        async with AsyncClient(b.uri) as to_b, AsyncClient(a.uri) as to_a:
            async with to_b.event_writer([there]) as writer:
                for index in range(10):
                    await writer.write_event(b"event %d" % index)
            async with to_a.event_writer([here]) as writer:
                await writer.write_event(b"here")
        store = ClusterSegmentStore(a.server, a, token=await a._read_peer_token(a._claims()))
        try:
            assert a.peer_uris() == [b.uri]
            await store.collect_append_counts()
            counts = store.drain_append_counts()
            assert counts[there].events == 10 and counts[there].bytes == sum(
                len(codec.encode_event(b"event %d" % index)) for index in range(10))
            assert counts[here] == AppendCounts(len(codec.encode_event(b"here")), 1)
            assert store.drain_append_counts() == {}  # (drained)
            await store.collect_append_counts()
            assert store.drain_append_counts() == {}  # (b's were drained too)
        finally:
            await store.close()
        # Anyone else is refused, and drains nothing.
        raw = await RawClient.connect(b.server.port)
        for request_id, body in enumerate((b'{"token": ""}', b'{"token": "' + b"0" * 64 + b'"}', b"{}", b"[]")):
            refused = await raw.request(ControllerRequest(request_id, DRAIN_APPEND_COUNTS, body))
            assert not isinstance(refused, ControllerReply), refused
        await raw.close()
    finally:
        await a.stop()
        await b.stop()
        for storage in storages:
            await storage.close()
