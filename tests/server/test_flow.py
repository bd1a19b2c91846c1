"""Backpressure (reading pauses while in-flight append bytes exceed the limits, and resumes), graceful
shutdown (acknowledged-bound work drains), keep-alives, and a container restart under a connected
client."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import uuid
from pathlib import Path

import pytest

from millstream.errors import ContainerUnavailableError
from millstream.naming import container_of
from millstream.segmentstore.file_log import FileLog
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedFaults, SimulatedLogStorage
from millstream.wire import (
    AppendSetup,
    CreateSegment,
    DataAppended,
    ErrorMessage,
    KeepAlive,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    iter_events,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import ConnectionClosed, RawClient, Tiers, block, run, serving


class GatedFdatasync:
    """A FileLog's fdatasync that blocks while the gate is closed: acknowledgements stop, appends pile up."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, fd: int) -> None:
        if not self.gate.wait(20.0):
            raise OSError("the test never opened the gate")
        os.fdatasync(fd)


def gated_tiers(directory: Path, gate: GatedFdatasync) -> Tiers:
    tiers = Tiers("files", directory)
    tiers.open_log = lambda container_id: FileLog(directory / f"container-{container_id}",  # type: ignore[method-assign]
                                                  fdatasync=gate)
    return tiers


async def until(condition, what: str, seconds: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


def test_reading_pauses_while_in_flight_bytes_exceed_the_limit_and_resumes(tmp_path: Path) -> None:
    gate = GatedFdatasync()
    config = ServerConfig(connection_in_flight_bytes_target=64 * 1024, connection_in_flight_bytes_min=16 * 1024,
                          in_flight_bytes_max=4 * 1024 * 1024)

    async def scenario() -> None:
        async with serving(gated_tiers(tmp_path, gate), config=config) as server:
            client = await RawClient.connect(server.port)
            segment = "sc/pressure"
            await client.request(CreateSegment(1, segment, ""))
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            gate.gate.clear()  # from now on nothing becomes durable
            payload = bytes(64 * 1024)
            blocks = [block(writer, n, [payload], n) for n in range(1, 401)]  # 25 MiB: more than TCP buffers

            async def send_all() -> None:
                for item in blocks:
                    await client.send(item)

            sender = asyncio.create_task(send_all())
            (connection,) = server.connections
            await until(lambda: connection.reading_paused, "the connection stopped reading")
            await asyncio.sleep(0.2)
            # Bounded per block, not per read: it pauses once charged >= 2 x 64 KiB - charged, so at
            # most one block (64 KiB of data + 2 KiB of overhead) beyond 64 KiB is charged.
            charged = server.in_flight_bytes
            assert 64 * 1024 <= charged <= 64 * 1024 + 64 * 1024 + 2048 + 64, charged
            assert not sender.done(), "the sender should be blocked by TCP flow control"
            server.check_invariants()
            gate.gate.set()
            await sender
            acks = await client.receive_many(len(blocks), seconds=20)
            assert [a.event_number for a in acks] == list(range(1, 401))  # type: ignore[union-attr]
            await until(lambda: server.in_flight_bytes == 0, "every charge was released")
            assert not connection.reading_paused
            await client.close()
    run(scenario)


def test_the_server_wide_limit_pauses_every_connection(tmp_path: Path) -> None:
    gate = GatedFdatasync()
    config = ServerConfig(connection_in_flight_bytes_target=1024 * 1024, connection_in_flight_bytes_min=16 * 1024,
                          in_flight_bytes_max=96 * 1024)

    async def scenario() -> None:
        async with serving(gated_tiers(tmp_path, gate), config=config) as server:
            clients = [await RawClient.connect(server.port) for _ in range(2)]
            writers = [uuid.uuid4() for _ in clients]
            for index, (client, writer) in enumerate(zip(clients, writers, strict=True)):
                await client.request(CreateSegment(1, f"sc/wide/{index}", ""))
                await client.request(SetupAppend(2, writer, f"sc/wide/{index}", ""))
            gate.gate.clear()
            payload = bytes(4 * 1024)
            senders = [asyncio.create_task(c.send(*(block(w, n, [payload], n) for n in range(1, 101))))
                       for c, w in zip(clients, writers, strict=True)]
            await until(lambda: len(server.connections) == 2 and all(c.reading_paused for c in server.connections),
                        "both connections stopped reading")
            assert server.in_flight_bytes >= 96 * 1024
            gate.gate.set()
            await asyncio.gather(*senders)
            for client in clients:
                acks = await client.receive_many(100, seconds=20)
                assert [a.event_number for a in acks] == list(range(1, 101))  # type: ignore[union-attr]
                await client.close()
    run(scenario)


def test_graceful_shutdown_drains_acknowledged_work(tmp_path: Path) -> None:
    gate = GatedFdatasync()
    tiers = gated_tiers(tmp_path, gate)

    async def scenario() -> None:
        segment = "sc/drain"
        writer = uuid.uuid4()
        chunk_storage = tiers.open_chunk_storage()
        server = SegmentStoreServer(tiers.open_log, chunk_storage=chunk_storage)
        await server.start()
        client = await RawClient.connect(server.port)
        await client.request(CreateSegment(1, segment, ""))
        await client.request(SetupAppend(2, writer, segment, ""))
        gate.gate.clear()
        blocks = [block(writer, n, [f"event {n}".encode()], n) for n in range(1, 51)]
        await client.send(*blocks)
        await until(lambda: server.in_flight_bytes >= 50 * 2048, "the server received every block")
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        assert not stopping.done(), "the server waits for the appends it received"
        gate.gate.set()
        replies = await client.expect_closed()
        await stopping
        assert [r.event_number for r in replies if isinstance(r, DataAppended)] == list(range(1, 51))
        await chunk_storage.close()
        # Everything acknowledged is there after a restart.
        async with serving(tiers) as restarted:
            reader = await RawClient.connect(restarted.port)
            read = await reader.request(ReadSegment(1, segment, 0, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead)
            assert list(iter_events(read.data)) == [f"event {n}".encode() for n in range(1, 51)]
            assert await reader.request(SetupAppend(2, writer, segment, "")) == AppendSetup(2, segment, writer, 50)
            await reader.close()
    run(scenario)


def test_keepalives_are_sent_and_silent_connections_closed(tmp_path: Path) -> None:
    config = ServerConfig(keepalive_interval_seconds=0.1, hello_timeout_seconds=0.3)

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=config) as server:
            started = asyncio.get_running_loop().time()
            client = await RawClient.connect(server.port)
            assert await client.receive(seconds=1.0, keepalive=True) == KeepAlive()
            # It says nothing back after its Hello: after 3 intervals the server hangs up.
            await client.expect_closed(seconds=2.0)
            assert 0.3 <= asyncio.get_running_loop().time() - started < 2.0
            # A client that keeps sending KeepAlives stays connected.
            talker = await RawClient.connect(server.port)
            for _ in range(8):
                await talker.send(KeepAlive())
                await asyncio.sleep(0.06)
            assert isinstance(await talker.request(CreateSegment(1, "sc/alive", "")), object)
            await talker.close()
            # A client that never says Hello is closed after the Hello timeout.
            mute = await RawClient.connect(server.port, hello=False)
            await mute.expect_closed(seconds=2.0)
    run(scenario)


def test_a_container_restart_under_a_connected_writer_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    tiers = Tiers("simulated", tmp_path)
    segment = "sc/restart"
    container_id = container_of(segment, 4)
    opened = {"count": 0}
    original = tiers.open_log

    def open_log(cid: int) -> SimulatedDurableDataLog:
        if cid != container_id:
            return original(cid)  # type: ignore[no-any-return]
        opened["count"] += 1
        storage = tiers.log_storages.setdefault(cid, SimulatedLogStorage())
        # The first owner's 12th write fails with its outcome unknown; its successors are healthy.
        faults = SimulatedFaults(script={12: "unknown_outcome"}) if opened["count"] == 1 else None
        return SimulatedDurableDataLog(storage, faults=faults)

    tiers.open_log = open_log  # type: ignore[method-assign]

    async def scenario() -> None:
        async with serving(tiers, container_options={"restart_delay_seconds": 0.01}) as server:
            writer = uuid.uuid4()
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, segment, ""))
            await client.request(SetupAppend(2, writer, segment, ""))
            acknowledged = 0
            total = 60
            next_number = 1
            reconnects = 0
            while acknowledged < total:
                try:
                    await client.send(*(block(writer, n, [f"e{n}".encode()], n)
                                        for n in range(next_number, min(next_number + 5, total + 1))))
                    next_number = min(next_number + 5, total + 1)
                    while acknowledged < next_number - 1:
                        reply = await client.receive()
                        assert isinstance(reply, DataAppended), reply
                        acknowledged = reply.event_number
                except (ConnectionClosed, ConnectionResetError):
                    reconnects += 1
                    assert reconnects < 20
                    client = await RawClient.connect(server.port)
                    while True:  # the container may still be recovering
                        setup = await client.request(SetupAppend(3, writer, segment, ""))
                        if isinstance(setup, AppendSetup):
                            break
                        assert isinstance(setup, ErrorMessage)
                        assert setup.error_code == error_code_of(ContainerUnavailableError())
                        await asyncio.sleep(0.01)
                    acknowledged = max(acknowledged, setup.last_event_number)
                    next_number = acknowledged + 1
            assert reconnects >= 1 and server.container_host(container_id).restarts == 1
            read = await client.request(ReadSegment(9, segment, 0, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead)
            assert list(iter_events(read.data)) == [f"e{n}".encode() for n in range(1, total + 1)]
            await client.close()
    run(scenario)


def test_shutdown_does_not_wait_for_connections_that_went_away(tmp_path: Path) -> None:
    gate = GatedFdatasync()

    async def scenario() -> None:
        tiers = gated_tiers(tmp_path, gate)
        chunk_storage = tiers.open_chunk_storage()
        server = SegmentStoreServer(tiers.open_log, chunk_storage=chunk_storage,
                                    config=ServerConfig(shutdown_drain_seconds=5.0, keepalive_interval_seconds=0.1))
        await server.start()
        client = await RawClient.connect(server.port)
        writer = uuid.uuid4()
        await client.request(CreateSegment(1, "sc/gone", ""))
        await client.request(SetupAppend(2, writer, "sc/gone", ""))
        gate.gate.clear()
        await client.send(block(writer, 1, [b"never acknowledged"], 3))
        await until(lambda: server.in_flight_bytes > 0, "the block arrived")
        started = asyncio.get_running_loop().time()
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        assert not stopping.done(), "the server waits for the block it received"
        # The writer's process dies while the server drains (a reset, not a polite close).  The
        # server does not read during the drain, but its next KeepAlive meets the reset.
        sock = client.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.writer.transport.abort()
        await until(lambda: not server.connections, "the server saw the connection go", seconds=3.0)
        assert not stopping.done()
        gate.gate.set()
        await stopping
        assert asyncio.get_running_loop().time() - started < 2.0, "it did not wait for the drain timeout"
        await chunk_storage.close()
    run(scenario)


def test_the_server_lifecycle_follows_its_table(tmp_path: Path) -> None:
    from millstream.errors import InternalError
    from millstream.server import SERVER_LIFECYCLE, ServerState

    assert {state for state, _ in SERVER_LIFECYCLE} | set(SERVER_LIFECYCLE.values()) == set(ServerState)

    async def scenario() -> None:
        tiers = Tiers("simulated", tmp_path)
        server = SegmentStoreServer(tiers.open_log)
        assert server.state is ServerState.NEW and server.port == 0
        await server.start()
        assert server.state is ServerState.RUNNING and server.port > 0
        with pytest.raises(InternalError):
            await server.start()
        await server.stop()
        assert server.state is ServerState.STOPPED
        await server.stop()  # idempotent
        never_started = SegmentStoreServer(tiers.open_log)
        await never_started.stop()
        assert never_started.state is ServerState.STOPPED
    run(scenario)


@pytest.mark.parametrize("limit", [{"connection_requests_max": 3}, {"connection_read_bytes_max": 1200}])
def test_reads_in_flight_are_bounded_per_connection(tmp_path: Path, limit: dict[str, int]) -> None:
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=ServerConfig(**limit)) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, "sc/quiet", ""))
            # Eight tail reads of 400 bytes that each wait 300 ms on an empty segment.
            await client.send(*(ReadSegment(10 + n, "sc/quiet", 0, 400, "", 300) for n in range(8)))
            (connection,) = server.connections
            await until(lambda: connection.reading_paused, "the connection stopped reading")
            assert connection._requests == 3, "three reads in flight, the rest still unread"
            replies = await client.receive_many(8, seconds=5.0)
            assert sorted(r.request_id for r in replies) == list(range(10, 18))  # type: ignore[attr-defined]
            assert all(isinstance(r, SegmentRead) and r.data == b"" for r in replies)
            await until(lambda: not connection.reading_paused, "it reads again")
            await client.close()
    run(scenario)
