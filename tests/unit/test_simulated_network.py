"""The simulated network: bytes arrive in order on a later turn; each named fault does what its
docstring says (delay, black hole, cut, partition, heal); flow control and paused reading hold; a
seed replays random faults; and the real client and server talk over it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from millstream.client import AsyncClient, ClientConfig
from millstream.errors import ConnectionLostError, InvalidArgumentError
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.clock import ManualClock
from millstream.testing.network import (
    Direction,
    NetworkFaults,
    SimulatedNetwork,
    SimulatedTransport,
    VirtualTimeEventLoop,
)
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage

TURNS_MAX = 10_000


class Recorder(asyncio.Protocol):
    """Records what arrives; echoes nothing."""

    def __init__(self) -> None:
        self.transport: SimulatedTransport | None = None
        self.received = bytearray()
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost: list[BaseException | None] = []
        self.paused_writing = 0
        self.resumed_writing = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, SimulatedTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += data
        self.chunks.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.paused_writing += 1

    def resume_writing(self) -> None:
        self.resumed_writing += 1


class BufferedRecorder(asyncio.BufferedProtocol):
    """A BufferedProtocol with a tiny buffer, so deliveries arrive in many pieces."""

    def __init__(self, buffer_size: int = 3) -> None:
        self.buffer = bytearray(buffer_size)
        self.received = bytearray()
        self.lost: list[BaseException | None] = []
        self.transport: SimulatedTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, SimulatedTransport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self.received += self.buffer[:nbytes]

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


class World:
    """A virtual-time loop, its clock and a network with one listener (``Recorder`` servers)."""

    def __init__(self, **network_options: Any) -> None:
        self.clock = ManualClock()
        self.loop = VirtualTimeEventLoop(self.clock)
        self.network = SimulatedNetwork(self.loop, **network_options)
        self.servers: list[Any] = []
        self.server_factory: Callable[[], Any] = Recorder
        self.network.listen("server", 1, self._accept)

    def _accept(self) -> Any:
        protocol = self.server_factory()
        self.servers.append(protocol)
        return protocol

    def turns(self, count: int = 20) -> None:
        async def spin() -> None:
            for _ in range(count):
                await asyncio.sleep(0)
        self.loop.run_until_complete(spin())
        self.network.check_invariants()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.turns()

    def run(self, coroutine: Awaitable[Any]) -> Any:
        task = self.loop.create_task(coroutine)  # type: ignore[arg-type]
        for _ in range(TURNS_MAX):
            if task.done():
                return task.result()
            self.turns(1)
        raise AssertionError("the coroutine did not finish")

    def connect(self) -> Recorder:
        _transport, protocol = self.run(self.network.create_connection(Recorder, "server", 1))
        assert isinstance(protocol, Recorder)
        return protocol

    def close(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.turns(5)
        self.loop.close()


@pytest.fixture
def world() -> Any:
    w = World()
    yield w
    w.close()


def test_bytes_arrive_in_order_on_a_later_turn_and_close_is_seen_after_them(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None and server.transport is not None
    client.transport.write(b"one")
    client.transport.write(b"two")
    assert server.received == b"", "nothing is delivered synchronously"
    world.turns()
    assert server.received == b"onetwo"
    server.transport.write(b"back")
    client.transport.close()
    world.turns()
    assert client.received == b"" and client.lost == [None], "a closed end receives nothing more"
    assert server.eof and server.lost == [None], "the peer saw the end of the stream and closed too"
    assert world.network.links == []


def test_a_buffered_protocol_receives_everything_through_its_small_buffer() -> None:
    w = World()
    try:
        w.server_factory = BufferedRecorder
        client = w.connect()
        assert client.transport is not None
        client.transport.write(bytes(range(50)))
        w.turns()
        assert w.servers[0].received == bytes(range(50))
    finally:
        w.close()


class AbortingRecorder(BufferedRecorder):
    """Aborts its connection on the first bytes it is given (as a server does with a malformed frame)."""

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        assert self.transport is not None
        self.transport.abort()


def test_a_receiver_that_aborts_while_taking_bytes_loses_the_rest_and_the_peer_sees_a_reset() -> None:
    w = World()
    try:
        w.server_factory = AbortingRecorder
        client = w.connect()
        assert client.transport is not None
        client.transport.write(b"0123456789")
        client.transport.write(b"more")
        w.turns()
        assert w.servers[0].received == b"012" and w.servers[0].lost == [None]
        assert [type(e) for e in client.lost] == [ConnectionResetError]
        assert w.network.links == []
    finally:
        w.close()


def test_a_paused_reader_gets_nothing_until_it_resumes_and_the_writer_is_throttled(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None and server.transport is not None
    client.transport.set_write_buffer_limits(high=10)
    server.transport.pause_reading()
    client.transport.write(b"x" * 8)
    world.turns()
    assert server.received == b"" and client.transport.get_write_buffer_size() == 8
    client.transport.write(b"y" * 8)
    assert client.paused_writing == 1, "16 bytes in flight is over the high-water mark"
    server.transport.resume_reading()
    world.turns()
    assert server.received == b"x" * 8 + b"y" * 8
    assert client.resumed_writing == 1 and client.transport.get_write_buffer_size() == 0


def test_a_delay_holds_bytes_until_the_clock_passes_it_and_keeps_their_order(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None
    world.network.delay(0.5, Direction.TO_SERVER)
    client.transport.write(b"late")
    world.network.heal()  # later writes are not delayed, but may not overtake the delayed one
    client.transport.write(b"after")
    world.advance(0.4)
    assert server.received == b""
    world.advance(0.1)
    assert server.received == b"lateafter"


def test_a_black_hole_swallows_one_direction_for_good_even_the_close(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None and server.transport is not None
    world.network.black_hole(world.network.links[0], Direction.TO_CLIENT)
    server.transport.write(b"reply")
    client.transport.write(b"request")
    world.network.heal()
    world.advance(10.0)
    assert server.received == b"request" and client.received == b""
    server.transport.close()
    world.turns()
    assert client.lost == [] and not client.eof, "the client never hears of the server's close"
    assert world.network.counts["black_hole"] == 1


def test_a_cut_resets_both_ends_and_loses_what_was_in_flight(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None
    client.transport.write(b"lost")
    world.network.cut(world.network.links[0])
    world.turns()
    assert server.received == b""
    assert [type(e) for e in client.lost] == [ConnectionResetError]
    assert [type(e) for e in server.lost] == [ConnectionResetError]
    client.transport.write(b"after")  # ignored: the transport is closing
    assert world.network.links == []


def test_a_partition_holds_traffic_and_connects_until_it_ends(world: World) -> None:
    client = world.connect()
    server = world.servers[0]
    assert client.transport is not None
    world.network.partition(1.0)
    client.transport.write(b"held")
    connect = world.loop.create_task(world.network.create_connection(Recorder, "server", 1))
    world.advance(0.9)
    assert server.received == b"" and not connect.done()
    world.advance(0.1)
    assert server.received == b"held" and connect.done() and len(world.servers) == 2
    world.network.partition(5.0)
    client.transport.write(b"healed")
    world.network.heal()
    world.turns()
    assert server.received == b"heldhealed"


def test_nobody_listening_is_refused_and_bad_arguments_are_typed(world: World) -> None:
    with pytest.raises(ConnectionRefusedError):
        world.run(world.network.create_connection(Recorder, "server", 2))
    with pytest.raises(InvalidArgumentError):
        world.network.partition(0)
    with pytest.raises(InvalidArgumentError):
        world.network.delay(-1)
    with pytest.raises(InvalidArgumentError):
        world.network.listen("server", 1, Recorder)
    with pytest.raises(InvalidArgumentError):
        NetworkFaults(random.Random(1), cut_probability=0.7, black_hole_probability=0.7)
    with pytest.raises(InvalidArgumentError):
        SimulatedNetwork(world.loop, chunk_bytes=0)


def test_chunking_splits_writes_into_separate_deliveries() -> None:
    w = World(chunk_bytes=4)
    try:
        client = w.connect()
        assert client.transport is not None
        client.transport.write(b"0123456789")
        w.turns()
        assert w.servers[0].chunks == [b"0123", b"4567", b"89"]
    finally:
        w.close()


def random_run(seed: int) -> tuple[dict[str, int], bytes]:
    w = World(faults=NetworkFaults(random.Random(seed), cut_probability=0.05, black_hole_probability=0.05,
                                   delay_probability=0.3, delay_seconds_max=0.2))
    try:
        received = bytearray()
        for attempt in range(20):
            client = w.connect()
            assert client.transport is not None
            for index in range(10):
                client.transport.write(b"%d.%d;" % (attempt, index))
                w.advance(0.05)
            w.advance(1.0)
            received += w.servers[-1].received
            client.transport.abort()
            w.turns()
        return dict(w.network.counts), bytes(received)
    finally:
        w.close()


def test_random_faults_replay_from_their_seed() -> None:
    first, second, other = random_run(5), random_run(5), random_run(6)
    assert first == second
    assert first != other
    counts, _ = first
    assert counts["cut"] > 0 and counts["black_hole"] > 0 and counts["delay"] == 0  # (delay() calls only)


def test_the_client_and_the_server_talk_over_it_and_a_cut_is_a_lost_connection() -> None:
    clock = ManualClock()
    loop = VirtualTimeEventLoop(clock)
    network = SimulatedNetwork(loop)

    async def scenario() -> None:
        storage = SimulatedLogStorage()
        server = SegmentStoreServer(lambda _cid: SimulatedDurableDataLog(storage),
                                    config=ServerConfig(container_count=1), clock=clock)
        await server.start()
        network.listen("store", 9090, server.protocol_factory)
        client = AsyncClient("tcp://store:9090", clock=clock, rng=random.Random(1),
                             config=ClientConfig(connector=network.create_connection, reconnect_attempts_max=1))
        try:
            await client.segments().create("s")
            assert (await client.segments().info("s")).length == 0
            network.cut(network.open_links()[0])
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            network.stop_listening("store", 9090)
            with pytest.raises(ConnectionLostError):
                await client.segments().create("t")
            tls = AsyncClient("tls://store:9090", clock=clock,
                              config=ClientConfig(connector=network.create_connection))
            with pytest.raises(InvalidArgumentError, match="TLS"):
                await tls.segments().create("u")
            await tls.close()
        finally:
            await client.close()
            await server.stop()

    # Time passes while the scenario waits (reconnect backoff, the server's drain): 10 ms per 10 turns.
    task = loop.create_task(scenario())
    try:
        for turn in range(TURNS_MAX):
            if task.done():
                break
            loop.run_until_complete(asyncio.sleep(0))
            if turn % 10 == 9:
                clock.advance(0.01)
        task.result()
    finally:
        loop.close()
