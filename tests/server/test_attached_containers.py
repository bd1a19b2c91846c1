"""A server whose containers change at run time (``attached_containers=True``, issue 23): it serves
exactly the containers attached at each moment, answers ``WrongHost`` for the rest, and a request
in flight on a container that leaves is answered with the container's retryable error, never lost."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from millstream.errors import ContainerUnavailableError, InvalidArgumentError, ObjectClosedError
from millstream.naming import container_of
from millstream.segmentstore.host import ContainerHost
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.wire import (
    CreateSegment,
    ErrorMessage,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    WrongHost,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import REPLY_TIMEOUT_SECONDS, RawClient, Tiers, run

CONTAINER_COUNT = 2


def _segment_in(container_id: int) -> str:
    return next(name for name in (f"scope/stream-{index}" for index in range(1000))
                if container_of(name, CONTAINER_COUNT) == container_id)


async def _started_host(tiers: Tiers, container_id: int) -> ContainerHost:
    host = ContainerHost(container_id, lambda: tiers.open_log(container_id),
                         chunk_storage=tiers.open_chunk_storage())
    await host.start()
    return host


def test_a_server_serves_exactly_the_containers_attached_at_each_moment(tmp_path: Path) -> None:
    tiers = Tiers("simulated", tmp_path)
    first, second = _segment_in(0), _segment_in(1)

    async def scenario() -> None:
        server = SegmentStoreServer(tiers.open_log, config=ServerConfig(container_count=CONTAINER_COUNT),
                                    chunk_storage=tiers.open_chunk_storage(), attached_containers=True)
        await server.start()
        hosts = []
        try:
            assert server.serving == frozenset()  # (it started none itself)
            client = await RawClient.connect(server.port)
            assert await client.request(CreateSegment(1, first, "")) == WrongHost(1, first, "")
            host0 = await _started_host(tiers, 0)
            hosts.append(host0)
            server.attach_container(0, host0)
            assert server.serving == {0}
            assert await client.request(CreateSegment(2, first, "")) == SegmentCreated(2, first)
            assert await client.request(CreateSegment(3, second, "")) == WrongHost(3, second, "")
            host1 = await _started_host(tiers, 1)
            hosts.append(host1)
            server.attach_container(1, host1)
            assert await client.request(CreateSegment(4, second, "")) == SegmentCreated(4, second)
            # Container 0 leaves: new requests for it are WrongHost at once, the other still serves.
            assert server.detach_container(0) is host0
            assert server.serving == {1}
            assert await client.request(SetupAppend(5, uuid.uuid4(), first, "")) == WrongHost(5, first, "")
            assert await client.request(ReadSegment(6, first, 0, 10, "", 0)) == WrongHost(6, first, "")
            assert isinstance(await client.request(ReadSegment(7, second, 0, 10, "", 0)), SegmentRead)
            assert server.detach_container(0) is None
            await client.close()
            server.check_invariants()
        finally:
            await server.stop()
            for host in hosts:
                await host.stop()
    run(scenario)


def test_a_read_waiting_on_a_container_that_leaves_gets_its_retryable_error(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tiers = Tiers("simulated", tmp_path)
    segment = _segment_in(0)

    async def scenario() -> None:
        server = SegmentStoreServer(tiers.open_log, config=ServerConfig(container_count=CONTAINER_COUNT),
                                    chunk_storage=tiers.open_chunk_storage(), attached_containers=True)
        await server.start()
        host = await _started_host(tiers, 0)
        try:
            server.attach_container(0, host)
            client = await RawClient.connect(server.port)
            assert await client.request(CreateSegment(1, segment, "")) == SegmentCreated(1, segment)
            # A tail read: nothing to read yet, so it waits in the container (a minute at most).
            container = host.container
            reading = asyncio.Event()
            original_read = container.read

            async def read(*args: Any, **kwargs: Any) -> Any:
                reading.set()
                return await original_read(*args, **kwargs)
            monkeypatch.setattr(container, "read", read)
            await client.send(ReadSegment(2, segment, 0, 10, "", 60_000))
            await asyncio.wait_for(reading.wait(), REPLY_TIMEOUT_SECONDS)
            server.detach_container(0)
            await host.stop()
            reply = await client.receive()
            assert isinstance(reply, ErrorMessage), reply
            assert reply.request_id == 2
            assert reply.error_code == error_code_of(ContainerUnavailableError("x")), reply
            assert await client.request(ReadSegment(3, segment, 0, 10, "", 0)) == WrongHost(3, segment, "")
            await client.close()
        finally:
            await server.stop()
            await host.stop()
    run(scenario)


def test_attaching_is_checked_and_a_fixed_server_refuses_it(tmp_path: Path) -> None:
    tiers = Tiers("simulated", tmp_path)

    async def scenario() -> None:
        fixed = SegmentStoreServer(tiers.open_log, config=ServerConfig(container_count=CONTAINER_COUNT))
        dynamic = SegmentStoreServer(tiers.open_log, config=ServerConfig(container_count=CONTAINER_COUNT),
                                     attached_containers=True)
        await dynamic.start()
        host = await _started_host(tiers, 1)
        try:
            with pytest.raises(InvalidArgumentError):
                fixed.attach_container(1, host)
            with pytest.raises(InvalidArgumentError):
                fixed.detach_container(1)
            for wrong in (-1, 2, True):
                with pytest.raises(InvalidArgumentError):
                    dynamic.attach_container(wrong, host)
            with pytest.raises(InvalidArgumentError):
                dynamic.attach_container(0, host)  # (container 1's host)
            dynamic.attach_container(1, host)
            with pytest.raises(InvalidArgumentError):
                dynamic.attach_container(1, host)
            await dynamic.stop()
            assert host.stopped.done() is False  # (the server never stops a host it was handed)
            with pytest.raises(ObjectClosedError):
                dynamic.attach_container(1, host)
        finally:
            await dynamic.stop()
            await host.stop()
    run(scenario)
