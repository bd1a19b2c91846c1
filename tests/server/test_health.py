"""Health: /healthz, /readyz and /status say which containers are running, recovering or fenced,
driven by the simulated log's fault hooks (a Tier-1 failure, a second owner fencing the first)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

from millstream.errors import ContainerUnavailableError
from millstream.health import MetricsEndpoint, node_health
from millstream.metrics import NodeMetrics
from millstream.segmentstore.container import SegmentContainer
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedFaults, SimulatedLogStorage

SCENARIO_TIMEOUT_SECONDS = 30.0


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS)
    asyncio.run(bounded())


async def until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.002)


async def get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


class Node:
    """One server (container 0 of 1) on simulated logs, with its metrics endpoint; the first log
    opened fails its ``fail_write``-th write (outcome unknown) when given."""

    def __init__(self, clock: ManualClock, fail_write: int | None = None) -> None:
        self.storage = SimulatedLogStorage()
        self.opened = 0

        def open_log(container_id: int) -> SimulatedDurableDataLog:
            self.opened += 1
            faults = SimulatedFaults(script={fail_write: "unknown_outcome"}) \
                if fail_write is not None and self.opened == 1 else None
            return SimulatedDurableDataLog(self.storage, faults=faults)
        self.server = SegmentStoreServer(open_log, config=ServerConfig(container_count=1), clock=clock,
                                         container_options={"restart_delay_seconds": 60.0})
        self.endpoint = MetricsEndpoint(NodeMetrics(lambda: self.server), lambda: node_health(self.server))

    async def __aenter__(self) -> Node:
        await self.endpoint.start()
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.stop()
        await self.endpoint.stop()

    def state(self) -> str:
        return node_health(self.server).containers[0].state


def test_a_node_not_built_yet_or_not_started_is_not_ready() -> None:
    assert not node_health(None).ready
    server = SegmentStoreServer(lambda _: SimulatedDurableDataLog(SimulatedLogStorage()),
                                config=ServerConfig(container_count=2))
    health = node_health(server)
    # (a node starts its endpoint before its server: the containers are about to recover)
    assert not health.ready and [c.state for c in health.containers] == ["recovering", "recovering"]
    assert health.reasons[0] == "the segment store is new"


def test_ready_then_recovering_after_a_tier_one_failure_then_ready_again() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with Node(clock, fail_write=4) as node:
            port = node.endpoint.port
            assert await get(port, "/readyz") == (200, "ready\n")
            assert await get(port, "/healthz") == (200, "ok\n")
            container = node.server.container_host(0).container
            await container.create_segment("s")
            failed = False
            for i in range(10):
                try:
                    await container.append("s", b"x" * i)
                except ContainerUnavailableError:
                    failed = True
                    break
            assert failed, "the scripted Tier-1 failure did not happen"
            await until(lambda: node.state() == "recovering", "the container is recovering")
            status, reasons = await get(port, "/readyz")
            assert status == 503 and reasons == "container 0 is recovering\n"
            status, text = await get(port, "/status")
            assert status == 503
            assert json.loads(text)["containers"] == [
                {"container": 0, "state": "recovering", "throttled": False, "cause": ""}]
            assert await get(port, "/healthz") == (200, "ok\n")  # alive all the while
            clock.advance(60.0)  # the host's restart delay: it recovers a new container
            await until(lambda: node.state() == "running", "the container is running again")
            assert await get(port, "/readyz") == (200, "ready\n")
    run(scenario)


def test_a_fenced_container_makes_the_node_not_ready_and_says_why() -> None:
    async def scenario() -> None:
        async with Node(ManualClock()) as node:
            container = node.server.container_host(0).container
            await container.create_segment("s")
            usurper = SegmentContainer(0, SimulatedDurableDataLog(node.storage))
            await usurper.start()  # another owner takes the log over
            with contextlib.suppress(ContainerUnavailableError):
                await container.append("s", b"x")
            await until(lambda: node.state() == "fenced", "the container is fenced")
            status, reasons = await get(node.endpoint.port, "/readyz")
            assert status == 503 and reasons.startswith("container 0 is fenced: ")
            status, text = await get(node.endpoint.port, "/status")
            answer = json.loads(text)
            assert status == 503 and answer["ready"] is False
            assert answer["containers"][0]["state"] == "fenced" and "fenced" in answer["containers"][0]["cause"].lower()
            await usurper.stop()
    run(scenario)


def test_the_endpoint_answers_while_containers_recover_at_start() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        gate = asyncio.Event()
        storage = SimulatedLogStorage()

        class SlowLog(SimulatedDurableDataLog):
            async def initialize(self) -> int:
                await gate.wait()  # recovery that has not finished yet
                return await super().initialize()
        server = SegmentStoreServer(lambda _: SlowLog(storage), config=ServerConfig(container_count=1), clock=clock)
        endpoint = MetricsEndpoint(NodeMetrics(lambda: server), lambda: node_health(server))
        await endpoint.start()
        starting = asyncio.ensure_future(server.start())
        try:
            status, reasons = await get(endpoint.port, "/readyz")
            assert status == 503 and reasons == "container 0 is recovering\n"
            gate.set()
            await starting
            assert await get(endpoint.port, "/readyz") == (200, "ready\n")
        finally:
            gate.set()
            await asyncio.gather(starting, return_exceptions=True)
            await server.stop()
            await endpoint.stop()
    run(scenario)


def test_a_container_whose_tier_two_lags_is_reported_throttled() -> None:
    async def scenario() -> None:
        import random

        from millstream.segmentstore.container import StorageSettings
        from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage

        clock = ManualClock()
        chunk_storage = SimulatedChunkStorage(clock=clock, rng=random.Random(5))
        chunk_storage.fail_writes()  # Tier 2 is unavailable: nothing acknowledged can be flushed
        storage = SimulatedLogStorage()
        server = SegmentStoreServer(lambda _: SimulatedDurableDataLog(storage), config=ServerConfig(container_count=1),
                                    clock=clock, chunk_storage=chunk_storage,
                                    storage_settings=StorageSettings(unflushed_bytes_max=64))
        endpoint = MetricsEndpoint(NodeMetrics(lambda: server), lambda: node_health(server))
        await endpoint.start()
        await server.start()
        try:
            container = server.container_host(0).container
            await container.create_segment("s")
            assert not node_health(server).containers[0].throttled
            await container.append("s", b"x" * 100)  # beyond the unflushed bytes allowed: the next would wait
            health = node_health(server)
            assert health.containers[0].throttled and health.ready  # throttled is slow, not down
            status, text = await get(endpoint.port, "/status")
            assert status == 200 and json.loads(text)["containers"][0]["throttled"] is True
            _, exposition = await get(endpoint.port, "/metrics")
            assert 'millstream_throttling{container="0"} 1.0' in exposition
            assert 'millstream_tier2_unflushed_bytes{container="0"} 100.0' in exposition
        finally:
            chunk_storage.heal()
            await server.stop()
            await endpoint.stop()
    run(scenario)
