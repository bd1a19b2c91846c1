"""ContainerHost: a container that meets a Tier-1 failure is replaced by one that recovered; a fenced
or corrupt one is not; restarts are bounded."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from millstream.errors import ContainerUnavailableError, DataLogFencedError, WriteFailedError
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.host import ContainerHost
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedFaults, SimulatedLogStorage

SCENARIO_TIMEOUT_SECONDS = 20.0


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS)
    asyncio.run(bounded())


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.002)


def test_a_tier_one_failure_restarts_the_container_and_nothing_acknowledged_is_lost() -> None:
    async def scenario() -> None:
        storage = SimulatedLogStorage()
        logs: list[SimulatedDurableDataLog] = []

        def open_log() -> SimulatedDurableDataLog:
            # The first owner's 6th write fails with its outcome unknown; later owners are healthy.
            faults = SimulatedFaults(script={6: "unknown_outcome"}) if not logs else None
            logs.append(SimulatedDurableDataLog(storage, faults=faults))
            return logs[-1]

        host = ContainerHost(3, open_log, chunk_storage=SimulatedChunkStorage(rng=random.Random(1)),
                             restart_delay_seconds=0.001)
        container = await host.start()
        await container.create_segment("s")
        acknowledged, failed = [], 0
        for i in range(12):
            record = f"record-{i};".encode()
            try:
                offset = await host.container.append("s", record)
                acknowledged.append((offset, record))
            except ContainerUnavailableError:
                failed += 1  # retryable: outcome unknown; the test does not retry it
                await until(lambda: host.restarts == 1 and host._container is not None
                            and host._container.state.value == "running", "the host restarted the container")
        assert failed >= 1 and host.restarts == 1
        assert isinstance(await container.stopped, WriteFailedError), "the first container stopped on the failure"
        current = host.container
        data = (await current.read("s", 0, current.get_info("s").length)).data
        for offset, record in acknowledged:
            assert data[offset:offset + len(record)] == record, "an acknowledged append was lost"
        await host.stop()
        assert await host.stopped is None
    run(scenario)


def test_a_fenced_container_is_not_restarted() -> None:
    async def scenario() -> None:
        storage = SimulatedLogStorage()
        host = ContainerHost(3, lambda: SimulatedDurableDataLog(storage), restart_delay_seconds=0.001)
        container = await host.start()
        await container.create_segment("s")
        usurper = SegmentContainer(3, SimulatedDurableDataLog(storage))
        await usurper.start()
        with pytest.raises(ContainerUnavailableError):
            await container.append("s", b"x")
        cause = await host.stopped
        assert isinstance(cause, DataLogFencedError) or isinstance(cause.__cause__, DataLogFencedError)
        assert host.restarts == 0
        with pytest.raises(ContainerUnavailableError):
            _ = host.container
        assert (await usurper.read("s", 0, 10)).data == b""
        await usurper.stop()
        await host.stop()
    run(scenario)


def test_restarts_are_bounded_and_the_last_failure_is_reported() -> None:
    async def scenario() -> None:
        storage = SimulatedLogStorage()
        opened = 0

        def open_log() -> SimulatedDurableDataLog:
            nonlocal opened
            opened += 1
            if opened > 1:
                raise WriteFailedError("the log's disk is gone")
            return SimulatedDurableDataLog(storage, faults=SimulatedFaults(script={3: "fail"}))

        host = ContainerHost(3, open_log, restarts_max=4, restart_delay_seconds=0.001)
        container = await host.start()
        await container.create_segment("s")
        with pytest.raises(ContainerUnavailableError):
            for _ in range(3):  # the third Tier-1 write fails, whichever append it carries
                await container.append("s", b"x")
        cause = await host.stopped
        assert isinstance(cause, WriteFailedError) and "disk is gone" in str(cause)
        assert opened == 1 + 4 and host.restarts == 0
        await host.stop()
    run(scenario)
