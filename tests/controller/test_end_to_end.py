"""The controller over TCP in ``millstream.standalone``: the StreamManager and every ControllerClient
method, typed errors across the wire, malformed requests beside a server that keeps serving, a node
restarted on the same directory (everything is still there), tokens, and the append path feeding
auto-scaling's counts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import millstream
from millstream.auth import Permission, issue_token
from millstream.client import (
    ReaderGroupConfig,
    RetentionPolicy,
    ScalingPolicy,
    StreamConfig,
    StreamCut,
    SuccessorSegment,
)
from millstream.errors import (
    AuthenticationError,
    InvalidArgumentError,
    InvalidScaleError,
    InvalidStreamCutError,
    OperationUnsupportedError,
    ReaderGroupExistsError,
    ScopeNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
)
from millstream.naming import segment_id
from millstream.wire import ControllerReply, ControllerRequest, ErrorMessage, OperationUnsupported
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient


def test_stream_manager_and_controller_client_over_tcp(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        assert manager.create_scope("iot") is True and manager.create_scope("iot", exist_ok=True) is False
        config = StreamConfig(scaling=ScalingPolicy.fixed(2), retention=RetentionPolicy.by_time(3600))
        assert manager.create_stream("iot/sensors", config) is True
        with pytest.raises(StreamExistsError):
            manager.create_stream("iot/sensors", StreamConfig())
        with pytest.raises(ScopeNotFoundError):
            manager.create_stream("nowhere/s")
        with pytest.raises(InvalidArgumentError):
            manager.create_stream("iot/_hidden")
        description = manager.describe_stream("iot/sensors")
        assert description.config == config and description.epoch == 0 and not description.sealed
        assert [s.name for s in description.segments] == ["iot/sensors/0.#epoch.0", "iot/sensors/1.#epoch.0"]
        # Write through the segments of the current epoch, as the stream-aware writer will.
        current = manager.current_segments("iot/sensors")
        assert all(s.uri == node.uri for s in current.segments)
        with client.event_writer([s.name for s in current.segments]) as writer:
            for index in range(40):
                writer.write_event(b"event-%d" % index, routing_key=f"key-{index}")
        tail = manager.tail_cut("iot/sensors")
        assert sum(tail.positions.values()) == sum(len(b"event-%d" % i) + 8 for i in range(40))
        assert manager.head_cut("iot/sensors") == StreamCut("iot/sensors", {0: 0, 1: 0})
        # Scale: split segment 0 in three, then merge two of the parts.
        assert manager.split_segment("iot/sensors", 0, 3) == 1
        parts = [s.segment_id for s in manager.current_segments("iot/sensors").segments][:3]
        assert parts == [segment_id(1, 2), segment_id(1, 3), segment_id(1, 4)]
        assert manager.merge_segments("iot/sensors", parts[1:]) == 2
        with pytest.raises(InvalidScaleError):
            manager.scale_stream("iot/sensors", [parts[0]], [(0.0, 0.1)])
        with pytest.raises(StreamSegmentSealedError):
            client.segments().conditional_append("iot/sensors/0.#epoch.0", [b"late"], expected_offset=tail.positions[0])
        controller = client.async_client.controller()
        successors = client.run(controller.get_successors("iot", "sensors", 0))
        assert [s.segment.segment_id for s in successors] == parts and all(
            isinstance(s, SuccessorSegment) and s.predecessors == {0} for s in successors)
        between = client.run(controller.get_segments_between("iot", "sensors", None, None))
        assert [s.segment.segment_id for s in between][:2] == [0, 1] and between[-1].end_offset is None
        # Truncate at the tail recorded before the scale; a cut of another stream is refused.
        manager.truncate_stream("iot/sensors", tail)
        assert manager.head_cut("iot/sensors") == tail
        with pytest.raises(InvalidStreamCutError):
            manager.truncate_stream("iot/sensors", StreamCut("iot/other", dict(tail.positions)))
        with pytest.raises(InvalidStreamCutError):
            manager.truncate_stream("iot/sensors", StreamCut("iot/sensors", {0: 0, 1: 0}))
        assert client.run(controller.get_segment_uri("iot/sensors/1.#epoch.0")) == node.uri
        assert manager.cut_at("iot/sensors", time.time()) == tail, "nothing recorded yet: the head"
        # Reader groups.
        group = ReaderGroupConfig({"iot/sensors": (tail, None)}, retention="consumption")
        state_segment = client.run(controller.create_reader_group("iot", "analytics", group))
        assert client.segments().info(state_segment).length == 0
        with pytest.raises(ReaderGroupExistsError):
            client.run(controller.create_reader_group("iot", "analytics", group))
        info = client.run(controller.get_reader_group("iot", "analytics"))
        assert (info.config, info.generation, info.state_segment) == (group, 0, state_segment)
        client.run(controller.update_subscriber_cut("iot", "analytics", "iot/sensors", tail))
        assert client.run(controller.update_reader_group("iot", "analytics", group)) == 1
        client.run(controller.delete_reader_group("iot", "analytics"))
        # Seal (twice), delete; a deleted stream is gone, its segments too.
        with pytest.raises(StreamNotSealedError):
            manager.delete_stream("iot/sensors")
        manager.seal_stream("iot/sensors")
        manager.seal_stream("iot/sensors")
        assert manager.describe_stream("iot/sensors").state == "sealed"
        assert manager.delete_stream("iot/sensors") is True
        with pytest.raises(StreamNotFoundError):
            manager.describe_stream("iot/sensors")
        with pytest.raises(StreamSegmentNotExistsError):
            client.segments().info("iot/sensors/1.#epoch.0")
        assert manager.delete_stream("iot/sensors", missing_ok=True) is False
        assert manager.list_streams("iot") == [] and manager.delete_scope("iot") is True


def test_malformed_requests_get_typed_errors_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async def scenario(port: int) -> None:
        client = await RawClient.connect(port)
        invalid = error_code_of(InvalidArgumentError())
        bad = [
            ControllerRequest(1, "create_scope", b"{not json"),
            ControllerRequest(2, "create_scope", b"[1, 2]"),
            ControllerRequest(3, "create_scope", b'{"scope": "a", "extra": 1}'),
            ControllerRequest(4, "create_scope", b'{}'),
            ControllerRequest(5, "create_scope", b'{"scope": 7}'),
            ControllerRequest(6, "scale_stream", b'{"scope":"a","stream":"b","seal":[0],"new_ranges":[[0,2]]}'),
            ControllerRequest(7, "truncate_stream", b'{"cut":{"x":1},"scope":"a","stream":"b"}'),
            ControllerRequest(8, "create_scope", b"\xff\xfe"),
        ]
        for request in bad:
            reply = await client.request(request)
            assert isinstance(reply, ErrorMessage) and reply.request_id == request.request_id, reply
            assert reply.error_code == invalid, reply
        reply = await client.request(ControllerRequest(9, "drop_everything", b"{}"))
        assert reply == OperationUnsupported(9, "ControllerRequest 'drop_everything'")
        reply = await client.request(ControllerRequest(10, "get_stream", b'{"scope":"a","stream":"b"}'))
        assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(ScopeNotFoundError())
        reply = await client.request(ControllerRequest(11, "create_scope", b'{"scope":"a"}'))
        assert reply == ControllerReply(11, b"{}")
        reply = await client.request(ControllerRequest(12, "list_scopes", b"{}"))
        assert reply == ControllerReply(12, b'{"scopes":["a"]}')
        await client.close()

    with millstream.standalone(tmp_path) as node:
        asyncio.run(scenario(node.port))
        with millstream.connect(node.uri) as client:
            assert client.stream_manager().list_scopes() == ["a"], "only the valid request changed anything"
            with pytest.raises(OperationUnsupportedError):
                client.run(_call_unknown_method(client.async_client))
            with pytest.raises(InvalidArgumentError):
                client.run(client.async_client.controller().call("drop_everything"))


async def _call_unknown_method(client: millstream.AsyncClient) -> None:
    from millstream.client._replies import expect

    connection = await client.pool.acquire(client.endpoint)
    expect(await connection.request(lambda rid: ControllerRequest(rid, "drop_everything", b"{}")), ControllerReply)


def test_everything_survives_a_restart_of_the_node(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope("keep")
        manager.create_stream("keep/a", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        manager.create_stream("keep/b", StreamConfig(scaling=ScalingPolicy.by_event_rate(50, 2, 2)))
        with client.event_writer(["keep/a/0.#epoch.0", "keep/a/1.#epoch.0"]) as writer:
            for index in range(20):
                writer.write_event(b"x" * 10, routing_key=str(index))
        manager.split_segment("keep/a", 0)
        cut = manager.tail_cut("keep/a")
        manager.truncate_stream("keep/a", cut)
        manager.seal_stream("keep/b")
        client.run(client.async_client.controller().create_reader_group(
            "keep", "g", ReaderGroupConfig(["keep/a"])))
        before = {name: manager.describe_stream(name) for name in ("keep/a", "keep/b")}
        snapshot = node.run(_snapshot(node))
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        assert manager.list_scopes() == ["keep"] and manager.list_streams("keep") == ["a", "b"]
        assert {name: manager.describe_stream(name) for name in ("keep/a", "keep/b")} == before
        assert manager.head_cut("keep/a") == cut
        assert node.run(_snapshot(node)) == snapshot
        assert client.run(client.async_client.controller().get_reader_group("keep", "g")).generation == 0


async def _snapshot(node: millstream.StandaloneNode) -> dict[str, object]:
    return node.controller.state.to_snapshot()


def test_appends_over_tcp_are_counted_per_segment_for_auto_scaling(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        client.stream_manager().create_scope("sc")
        client.stream_manager().create_stream("sc/st", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        node.run(_drain(node))
        with client.event_writer(["sc/st/0.#epoch.0"]) as writer:
            for _ in range(30):
                writer.write_event(b"y" * 100)
        counts = node.run(_drain(node))
        assert counts == {"sc/st/0.#epoch.0": (30 * 108, 30)}


async def _drain(node: millstream.StandaloneNode) -> dict[str, tuple[int, int]]:
    return node.server.statistics.drain()


def test_controller_requests_need_a_token_when_the_node_checks_them(tmp_path: Path) -> None:
    secret = b"a-secret-of-sixteen-bytes-or-more"
    with millstream.standalone(tmp_path, auth_secret=secret) as node:
        expires = time.time() + 600
        with millstream.connect(node.uri) as anonymous, pytest.raises(AuthenticationError):
            anonymous.stream_manager().create_scope("iot")
        scope_admin = issue_token(secret, "iot", Permission.READ_UPDATE, expires)
        with millstream.connect(node.uri, token=scope_admin) as client:
            client.stream_manager().create_scope("iot")
            with pytest.raises(AuthenticationError):
                client.stream_manager().create_stream("iot/s")  # "iot" covers the scope, not its streams
        stream_admin = issue_token(secret, "iot/*", Permission.READ_UPDATE, expires)
        with millstream.connect(node.uri, token=stream_admin) as client:
            client.stream_manager().create_stream("iot/s")
            assert client.stream_manager().describe_stream("iot/s").epoch == 0
        reader = issue_token(secret, "iot/s", Permission.READ, expires)
        with millstream.connect(node.uri, token=reader) as client:
            assert client.stream_manager().tail_cut("iot/s").positions == {0: 0}
            with pytest.raises(AuthenticationError):
                client.stream_manager().seal_stream("iot/s")


def test_the_periodic_work_runs_on_the_real_clock_in_a_node(tmp_path: Path) -> None:
    """Tail cuts recorded and time retention applied by the node's own periodic loop (short periods)."""
    from millstream.controller import ControllerConfig
    from millstream.standalone import Node

    async def scenario() -> None:
        node = Node(tmp_path, controller_config=ControllerConfig(tick_seconds=0.02, tail_cut_interval_seconds=0.05))
        await node.start()
        try:
            async with millstream.AsyncClient(node.uri) as client:
                manager = client.stream_manager()
                await manager.create_scope("sc")
                await manager.create_stream("sc/st", StreamConfig(retention=RetentionPolicy.by_time(0.1)))
                writer = client.event_writer(["sc/st/0.#epoch.0"])
                controller = node.controller
                assert controller is not None
                async with asyncio.timeout(10):
                    while controller.retention_truncations == 0:
                        await writer.write_event(b"z" * 50)
                        await writer.flush()
                        await asyncio.sleep(0.02)
                await writer.close()
                head = await manager.head_cut("sc/st")
                assert head.positions[0] > 0, "retention truncated the oldest data"
                assert (await client.segments().info("sc/st/0.#epoch.0")).start_offset == head.positions[0]
                assert controller.failed_ticks == 0
        finally:
            await node.stop()
    asyncio.run(scenario())
