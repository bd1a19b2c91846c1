"""Hostile peers (issue 19, items 1 and 2), in process: nothing is allocated from a length a peer
announces, frames are small until a connection authenticates, partly received frames are bounded
per connection and over the server (without deadlocking when they are all large), and every slot has
a deadline: Hello, a started frame, an idle connection; one address cannot take every slot.

The deadlines run on a ``ManualClock``: the tests move time, they never wait for it.  (The memory
figures of a real process, measured from outside, are in ``tests/hostile``.)"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import struct
import uuid
import weakref
from pathlib import Path

import pytest

from millstream import limits
from millstream.auth import Permission, issue_token
from millstream.server import ServerConfig
from millstream.server._config import FramePool, ReceiveBudget
from millstream.testing.clock import ManualClock
from millstream.wire import (
    FRAME_BYTES_MAX,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    AppendBlockPart,
    AppendSetup,
    ControllerReply,
    ControllerRequest,
    CreateSegment,
    DataAppended,
    ErrorMessage,
    Hello,
    KeepAlive,
    ReadSegment,
    SegmentCreated,
    SetupAppend,
    encode,
    encode_event,
    iter_events,
)
from tests.server.raw import RawClient, Tiers, block, run, serving
from tests.server.test_bad_input import Bystander, closing_warnings
from tests.server.test_flow import until

SECRET = b"a-test-secret-of-enough-bytes"
HEADER = struct.Struct(">ii")
HELLO = encode(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
#: Enough turns of the event loop for the server to act on what a test just did (no time passes).
SETTLE_TURNS = 50


async def settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


async def connect_from(port: int, local_host: str, *, hello: bool = True) -> RawClient:
    """A raw client whose socket is bound to ``local_host`` (any 127.x.y.z reaches loopback)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local_host, 0))
    client = RawClient(reader, writer)
    assert isinstance(await client.receive(), Hello)
    if hello:
        await client.send(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
    return client


# --- item 1: memory before authentication -----------------------------------------------------------


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_an_announced_length_is_not_allocated_before_its_bytes_arrive(tiers: Tiers) -> None:
    """Eight connections announce frames of 16 MiB and send 100 bytes of each: the server holds what
    arrived plus a read's worth of room, not 8 x 16 MiB (the issue: 48 such connections, +694 MiB)."""

    async def scenario() -> None:
        async with serving(tiers) as server:
            clients = []
            for _ in range(8):
                client = await RawClient.connect(server.port)
                await client.send_bytes(HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(100))
                clients.append(client)
            await until(lambda: all(c.receive_buffered_bytes > 0 for c in server.connections), "all started")
            held = sum(c.receive_buffered_bytes for c in server.connections)
            assert held <= 8 * (108 + limits.SERVER_CONNECTION_RECEIVE_BUFFERED_BYTES_MIN), held
            assert server.receive_budget.total == held
            server.check_invariants()
            for client in clients:
                await client.close()
            await until(lambda: not server.connections, "all closed")
            assert server.receive_budget.total == 0
    run(scenario)


def test_frames_are_small_until_the_connection_authenticates(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    token = issue_token(SECRET, "sc/*", Permission.READ_UPDATE, 4_000_000_000.0)
    writer = uuid.uuid4()
    big = AppendBlockPart(writer, bytes(limits.SERVER_UNAUTHENTICATED_FRAME_BYTES_MAX))

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), auth_secret=SECRET) as server:
            # Before Hello: a frame over the limit closes the connection as soon as its header is in.
            early = await RawClient.connect(server.port, hello=False)
            before = len(closing_warnings(caplog))
            await early.send_bytes(HEADER.pack(CreateSegment.TYPE, limits.SERVER_UNAUTHENTICATED_FRAME_BYTES_MAX + 1))
            assert await early.expect_closed() == []
            assert "not authenticated yet" in closing_warnings(caplog)[before]
            # After Hello, with authentication on, but before a token was accepted: the same.
            anonymous = await RawClient.connect(server.port)
            assert isinstance(await anonymous.request(CreateSegment(1, "sc/a", "not a token")), object)
            await anonymous.send(big)
            assert await anonymous.expect_closed() == []
            # Once a request's token was accepted, frames up to the wire's limit are welcome.
            client = await RawClient.connect(server.port)
            assert await client.request(CreateSegment(1, "sc/a", token)) == SegmentCreated(1, "sc/a")
            assert isinstance(await client.request(SetupAppend(3, writer, "sc/a", token)), AppendSetup)
            await client.send(big)
            assert await client.request(CreateSegment(2, "sc/b", token)) == SegmentCreated(2, "sc/b")
            await client.close()
            server.check_invariants()
    run(scenario)


def test_with_authentication_off_a_hello_is_enough_even_in_the_same_read(tmp_path: Path) -> None:
    writer = uuid.uuid4()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            setup = await RawClient.connect(server.port)
            await setup.request(CreateSegment(1, "sc/pipelined", ""))
            await setup.close()
            client = await RawClient.connect(server.port, hello=False)
            payload = bytes(200_000)
            # Hello, SetupAppend and a 200 KB block in one write: the block's header arrives with the Hello.
            await client.send_bytes(HELLO + encode(SetupAppend(2, writer, "sc/pipelined", ""))
                                    + encode(block(writer, 1, [payload], 3)))
            assert isinstance(await client.receive(), AppendSetup)
            reply = await client.receive()
            assert isinstance(reply, DataAppended) and reply.event_number == 1, reply
            await client.close()
    run(scenario)


class _GatedController:
    """A controller endpoint whose ``echo`` checks the request's token once the test opens its gate."""

    def __init__(self, server) -> None:  # type: ignore[no-untyped-def]
        self.server = server
        self.gate = asyncio.Event()

    def knows(self, method: str) -> bool:
        return method == "echo"

    async def handle(self, method: str, body: bytes) -> bytes:
        token = json.loads(body)["token"]
        await self.gate.wait()
        self.server.authorizer.check(token, "sc/x", Permission.READ)
        return b"{}"


@pytest.mark.parametrize("valid", [True, False])
def test_a_large_frame_behind_a_request_that_may_authenticate_waits_for_its_answer(tmp_path: Path,
                                                                                   valid: bool) -> None:
    token = issue_token(SECRET, "sc/*", Permission.READ, 4_000_000_000.0) if valid else "forged"
    large_body = json.dumps({"token": token, "pad": "x" * 100_000}).encode()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), auth_secret=SECRET) as server:
            controller = _GatedController(server)
            server.attach_controller(controller)
            client = await RawClient.connect(server.port)
            await client.send(ControllerRequest(1, "echo", json.dumps({"token": token}).encode()),
                              ControllerRequest(2, "echo", large_body))
            await settle()
            (connection,) = server.connections
            assert connection.reading_paused, "the large frame waits for the first request's answer"
            assert connection.receive_buffered_bytes <= 2 * (limits.SERVER_UNAUTHENTICATED_FRAME_BYTES_MAX + 8)
            controller.gate.set()
            if valid:
                assert await client.receive() == ControllerReply(1, b"{}")
                assert await client.receive() == ControllerReply(2, b"{}")
                await client.close()
            else:
                replies = await client.expect_closed()
                assert len(replies) == 1 and replies[0].request_id == 1, replies
            server.check_invariants()
    run(scenario)


# --- item 1: partly received frames are bounded over the server -------------------------------------


class _PeakBudget(ReceiveBudget):
    """Remembers the most it ever held."""

    peak = 0

    def take(self, holder: object, held: int, more: int) -> bool:
        granted = super().take(holder, held, more)
        self.peak = max(self.peak, self.total)
        return granted

    def charge(self, amount: int) -> None:
        super().charge(amount)
        self.peak = max(self.peak, self.total)


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_large_frames_beyond_the_receive_budget_wait_and_then_all_complete(tiers: Tiers) -> None:
    """Six writers each send a 3 MiB block at once, piece by piece, into a server whose receive
    budget is 1 MiB: the total held stays bounded (not 6 x 3 MiB), and every block is stored -- one
    connection may always go past the budget, so they never all wait for each other."""
    writers = 6
    size = 3 * limits.MIB
    config = ServerConfig(receive_buffered_bytes_max=limits.MIB)

    async def scenario() -> None:
        async with serving(tiers, config=config) as server:
            budget = server.receive_budget = _PeakBudget(config.receive_buffered_bytes_max,
                                                         config.connection_receive_buffered_bytes_min)
            clients, frames = [], []
            for index in range(writers):
                client = await RawClient.connect(server.port)
                writer, segment = uuid.uuid4(), f"sc/budget-{index}"
                assert await client.request(CreateSegment(1, segment, "")) == SegmentCreated(1, segment)
                assert isinstance(await client.request(SetupAppend(2, writer, segment, "")), AppendSetup)
                clients.append(client)
                frames.append(encode(AppendBlock(writer, 1, 1, 3, encode_event(bytes([index]) * size))))
            piece = 256 * 1024
            for start in range(0, len(frames[0]), piece):
                for client, frame in zip(clients, frames, strict=True):
                    client.writer.write(frame[start:start + piece])  # (not drained: the kernel and asyncio buffer it)
            for client in clients:
                reply = await client.receive(seconds=60.0)
                assert isinstance(reply, DataAppended) and reply.event_number == 1, reply
            bound = config.receive_buffered_bytes_max + len(frames[0]) + writers * 2 * piece
            assert budget.peak <= bound, (budget.peak, bound)
            assert budget.peak < writers * size
            await until(lambda: budget.total == 0, "everything given back")
            assert budget.exempt is None and not budget.waiting
            server.check_invariants()
            for index, client in enumerate(clients):
                read = await client.request(ReadSegment(4, f"sc/budget-{index}", 0, 8, "", 0))
                assert read.data[8:] == bytes([index]) * 0 or read.data.startswith(encode_event(b"")[:4]), read
                await client.close()
    run(scenario)


def test_the_receive_budget_rules() -> None:
    budget = ReceiveBudget(total_max=100, connection_min=10)
    a, b, c = object(), object(), object()
    assert budget.take(a, 0, 60) and budget.total == 60  # within the total
    assert budget.take(b, 0, 10) and budget.total == 70  # within b's allowance
    assert budget.take(b, 10, 50) and budget.exempt is b  # past the total: b is the one that may
    assert not budget.take(c, 0, 30) and list(budget.waiting) == [c]  # c waits
    assert not budget.take(a, 60, 30) and list(budget.waiting) == [c, a]
    assert budget.take(c, 0, 5)  # (its allowance is always there)
    budget.give_back(60)
    budget.finish(b)
    assert budget.exempt is None
    assert budget.take(c, 5, 30) and list(budget.waiting) == [a]  # the first waiter first
    budget.check_invariants()


# --- item 2: deadlines --------------------------------------------------------------------------------


def deadline_config(**overrides: float) -> ServerConfig:
    settings = {"hello_timeout_seconds": 10.0, "frame_timeout_seconds": 20.0, "idle_timeout_seconds": 30.0,
                "keepalive_interval_seconds": 1000.0}
    settings.update(overrides)
    return ServerConfig(**settings)  # type: ignore[arg-type]


async def advance(clock: ManualClock, seconds: float) -> None:
    """Move the clock in small steps, letting the server act after each."""
    steps = 10
    for _ in range(steps):
        clock.advance(seconds / steps)
        await settle()


def test_hello_deadline_holds_even_for_a_peer_that_drips_its_hello(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    clock = ManualClock()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=deadline_config(), clock=clock) as server:
            mute = await RawClient.connect(server.port, hello=False)
            dripper = await RawClient.connect(server.port, hello=False)
            for byte in HELLO[:-1]:  # one byte a second, never the last
                await dripper.send_bytes(bytes([byte]))
                await advance(clock, 0.6)
            assert len(server.connections) == 2, "the Hello deadline has not passed yet"
            await advance(clock, 10.0)
            await mute.expect_closed()
            await dripper.expect_closed()
            reasons = [w for w in closing_warnings(caplog) if "no Hello within 10 s" in w]
            assert len(reasons) == 2, closing_warnings(caplog)
    run(scenario)


def test_a_started_frame_must_be_completed_in_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    clock = ManualClock()
    frame = encode(CreateSegment(1, "sc/slow", ""))

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=deadline_config(), clock=clock) as server:
            dripper = await RawClient.connect(server.port)
            talker = await RawClient.connect(server.port)
            for byte in frame[:-1]:
                await dripper.send_bytes(bytes([byte]))
                await talker.send(KeepAlive())  # (the talker completes frames: it is never overdue)
                await advance(clock, 0.5)
            await advance(clock, 20.0 - 0.5 * (len(frame) - 1) - 1.0)
            assert len(server.connections) == 2, "the frame deadline has not passed yet"
            await talker.send(KeepAlive())
            await advance(clock, 2.0)
            await dripper.expect_closed()
            assert any("still incomplete" in w for w in closing_warnings(caplog)), closing_warnings(caplog)
            assert await talker.request(CreateSegment(2, "sc/fast", "")) == SegmentCreated(2, "sc/fast")
            await talker.close()
    run(scenario)


def test_with_the_default_settings_a_dripping_peer_is_closed(tmp_path: Path) -> None:
    """The issue's finding as it was: a peer sending a frame one byte every 5 s kept its connection
    forever (every byte counted as life).  With the defaults it is closed once the frame is overdue."""
    clock = ManualClock()
    frame = encode(CreateSegment(1, "sc/" + "d" * 200, ""))

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), clock=clock) as server:
            dripper = await RawClient.connect(server.port)
            for byte in frame[:30]:  # 30 bytes, 5 s apart: 150 s of dripping, if it is let
                if not server.connections:
                    break
                await dripper.send_bytes(bytes([byte]))
                await advance(clock, 5.0)
            assert not server.connections, f"still open after {clock.monotonic():.0f} s of dripping"
            assert clock.monotonic() <= limits.SERVER_FRAME_TIMEOUT_SECONDS + 10.0
    run(scenario)


def test_a_frame_the_server_stopped_reading_is_not_overdue(tmp_path: Path) -> None:
    """Time the server itself made a peer wait (here: a graceful shutdown's drain) is not the peer's."""
    clock = ManualClock()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=deadline_config(), clock=clock) as server:
            client = await RawClient.connect(server.port)
            await client.send_bytes(encode(CreateSegment(1, "sc/half", ""))[:10])
            await settle()
            (connection,) = server.connections
            await advance(clock, 5.0)
            connection.begin_drain()
            await settle()
            assert connection.reading_paused
            clock.advance(1000.0)
            assert connection.overdue(clock.monotonic()) is None
            await client.close()
    run(scenario)


def test_idle_connections_close_and_keepalives_count_as_activity(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    clock = ManualClock()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=deadline_config(idle_timeout_seconds=5.0),
                           clock=clock) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, "sc/idle", ""))
            await client.close()
            await until(lambda: not server.connections, "closed")
            idle = await RawClient.connect(server.port)
            alive = await RawClient.connect(server.port)
            waiting = await RawClient.connect(server.port)
            await waiting.send(ReadSegment(1, "sc/idle", 0, 100, "", 60_000))  # a tail read: in flight
            for _ in range(6):
                await alive.send(KeepAlive())
                await advance(clock, 3.0)
            await idle.expect_closed()
            assert any("idle: no request or keep-alive" in w for w in closing_warnings(caplog))
            assert len(server.connections) == 2, "the keep-alive sender and the waiting reader stay"
            await alive.send(KeepAlive())
            assert await alive.request(CreateSegment(2, "sc/still", "")) == SegmentCreated(2, "sc/still")
            await alive.close()
            await waiting.close()
    run(scenario)


# --- item 2: slots --------------------------------------------------------------------------------------


def test_one_address_cannot_take_every_slot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    config = ServerConfig(connections_max=6, connections_per_address_max=3)

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=config) as server:
            hogs = [await connect_from(server.port, "127.0.0.2") for _ in range(3)]
            refused = await connect_from(server.port, "127.0.0.2", hello=False)
            assert await refused.expect_closed() == []
            assert any("3 connections from 127.0.0.2 are open" in r.getMessage() for r in caplog.records)
            # Another address still gets in, and a normal client works.
            bystander = await Bystander.start(server.port)
            await bystander.still_works()
            others = [await connect_from(server.port, "127.0.0.3") for _ in range(2)]
            full = await connect_from(server.port, "127.0.0.4", hello=False)
            assert await full.expect_closed() == [], "the global limit still holds"
            # A closed connection gives its slot back.
            await hogs.pop().close()
            await until(lambda: len(server.connections) == 5, "one closed")
            hogs.append(await connect_from(server.port, "127.0.0.2"))
            server.check_invariants()
            for client in hogs + others + [bystander.client]:
                await client.close()
    run(scenario)


def test_a_closed_connection_leaves_nothing_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=ServerConfig(receive_buffered_bytes_max=limits.MIB)
                           ) as server:
            clients = []
            for kind in ("idle", "huge", "half", "unauthenticated"):
                client = await RawClient.connect(server.port, hello=kind != "unauthenticated")
                if kind == "huge":
                    await client.send_bytes(HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(300_000))
                elif kind == "half":
                    await client.send_bytes(encode(CreateSegment(1, "sc/x", ""))[:7])
                elif kind == "unauthenticated":
                    await client.send_bytes(HELLO[:5])
                clients.append(client)
            await until(lambda: sum(c.receive_buffered_bytes > 0 for c in server.connections) == 3, "all received")
            refs = [weakref.ref(connection) for connection in server.connections]
            assert len(refs) == 4
            for client in clients:
                await client.close()
            await until(lambda: not server.connections, "all closed")
            await settle()
            gc.collect()
            assert [r() for r in refs] == [None] * 4, "a closed connection is garbage"
            assert server.receive_budget.total == 0 and not server.receive_budget.waiting
            server.check_invariants()
    run(scenario)


def test_writer_sessions_per_connection_are_bounded(tmp_path: Path) -> None:
    config = ServerConfig(connection_writers_max=2)

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), config=config) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, "sc/w", ""))
            for request_id in (2, 3):
                assert isinstance(await client.request(SetupAppend(request_id, uuid.uuid4(), "sc/w", "")), AppendSetup)
            reply = await client.request(SetupAppend(4, uuid.uuid4(), "sc/w", ""))
            assert isinstance(reply, ErrorMessage) and "the limit is 2" in reply.message, reply
            with contextlib.suppress(Exception):
                await client.close()
    run(scenario)


def test_the_heap_is_trimmed_after_many_connections_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood's freed memory goes back to the operating system at the next housekeeping tick (glibc's
    allocator would keep it otherwise: tests/hostile measures the difference from outside)."""
    monkeypatch.setattr(limits, "SERVER_MEMORY_TRIM_AFTER_CLOSES", 4)
    clock = ManualClock()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), clock=clock) as server:
            clients = [await RawClient.connect(server.port) for _ in range(3)]
            for client in clients:
                await client.close()
            await until(lambda: not server.connections, "closed")
            await advance(clock, limits.SERVER_HOUSEKEEPING_INTERVAL_SECONDS * 2)
            assert server.memory_trims == 0, "three closes are not enough"
            client = await RawClient.connect(server.port)
            await client.close()
            await until(lambda: not server.connections, "closed")
            await advance(clock, limits.SERVER_HOUSEKEEPING_INTERVAL_SECONDS * 2)
            assert server.memory_trims == 1
    run(scenario)


def test_the_frame_pool_hands_over_only_buffers_that_fit_a_whole_frame() -> None:
    pool = FramePool(total_max=1000)
    assert pool.take(10) is None
    small, large = bytearray(100), bytearray(600)
    pool.give(small)
    pool.give(large)
    assert pool.take(700) is None, "nothing is grown for what a frame announces"
    assert pool.take(50) is small, "the smallest that fits"
    pool.give(small)
    pool.give(bytearray(500))  # past the total: the oldest (600) goes
    assert sorted(len(b) for b in pool.buffers) == [100, 500] and pool.total == 600
    pool.give(bytearray(2000))  # larger than the whole pool: not kept
    assert pool.total == 600
    pool.check_invariants()


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_large_frames_reuse_the_buffers_of_earlier_ones(tiers: Tiers) -> None:
    """A writer's blocks arrive one after another; after the first, each is received into the buffer
    of an earlier one (whole, in as few reads as the socket gives), not into a new growing buffer."""
    writer = uuid.uuid4()

    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, "sc/pool", ""))
            await client.request(SetupAppend(2, writer, "sc/pool", ""))
            payloads = [bytes([n]) * (300_000 - 1000 * n) for n in range(6)]
            for number, payload in enumerate(payloads, start=1):
                reply = await client.request(block(writer, number, [payload], 10 + number))
                assert isinstance(reply, DataAppended) and reply.event_number == number, reply
                assert server.frame_pool.buffers, "the block's buffer went back to the pool"
            assert len(server.frame_pool.buffers) <= 2, "reused, not one per block"
            read = await client.request(ReadSegment(20, "sc/pool", 0, 2 * limits.MIB, "", 0))
            assert list(iter_events(read.data)) == payloads
            server.check_invariants()
            await client.close()
    run(scenario)
