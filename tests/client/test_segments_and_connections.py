"""Segment operations and the connection under them, against the fake server: replies routed by request
id in any order, typed errors for every error reply, keep-alives, deadlines, broken connections."""

from __future__ import annotations

import asyncio
import random
import uuid

import attrs
import pytest

from millstream import errors
from millstream.client import AsyncClient
from millstream.client._config import parse_uri
from millstream.client._connection import Connection
from millstream.errors import (
    AuthenticationError,
    BadOffsetError,
    ConnectionLostError,
    InvalidArgumentError,
    InvalidEventNumberError,
    ObjectClosedError,
    OperationUnsupportedError,
    ProtocolError,
    RequestTimeoutError,
    StreamSegmentExistsError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
    WrongHostError,
)
from millstream.testing.clock import ManualClock
from millstream.wire import codec
from millstream.wire.commands import (
    AuthTokenCheckFailed,
    Command,
    ConditionalCheckFailed,
    ErrorMessage,
    GetSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    NoSuchSegment,
    OperationUnsupported,
    SegmentAlreadyExists,
    SegmentCreated,
    SegmentIsSealed,
    SegmentIsTruncated,
    WrongHost,
)
from millstream.wire.error_codes import ERROR_CODES
from tests.client.fake_server import FakeServer, Faults
from tests.client.helpers import client, fast_config, run, until


def test_administration_and_attributes_round_trip() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            segments = c.segments()
            await segments.create("s/a/0")
            assert await segments.exists("s/a/0") and not await segments.exists("s/a/1")
            info = await segments.info("s/a/0")
            assert (info.name, info.length, info.start_offset, info.sealed) == ("s/a/0", 0, 0, False)
            assert await segments.get_attribute("s/a/0", 7) is None
            assert await segments.update_attribute("s/a/0", 7, 40, expected_value=None)
            assert not await segments.update_attribute("s/a/0", 7, 41, expected_value=39)
            assert await segments.get_attribute("s/a/0", 7) == 40
            assert await segments.update_attribute("s/a/0", 7, None, expected_value=40)
            assert await segments.get_attribute("s/a/0", 7) is None
            length = await segments.conditional_append("s/a/0", [b"one", b"two"], expected_offset=0)
            assert length == 2 * 8 + 6
            with pytest.raises(BadOffsetError):
                await segments.conditional_append("s/a/0", [b"three"], expected_offset=0)
            assert await segments.conditional_append("s/a/0", [b"three"], expected_offset=length) == length + 13
            await segments.create("s/b/0")
            await segments.conditional_append("s/b/0", [b"tail"], expected_offset=0)
            assert await segments.merge("s/a/0", "s/b/0") == length + 13 + 12
            assert not await segments.exists("s/b/0")
            await segments.truncate("s/a/0", length)
            assert (await segments.info("s/a/0")).start_offset == length
            await segments.seal("s/a/0")
            await segments.seal("s/a/0")  # idempotent on the wire
            assert (await segments.info("s/a/0")).sealed
            await segments.delete("s/a/0")
            with pytest.raises(StreamSegmentNotExistsError):
                await segments.info("s/a/0")
            assert server.payloads is not None
    run(scenario)


def test_arguments_are_checked_before_anything_is_sent() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            segments = c.segments()
            for call in (segments.create(""), segments.create("x" * 2000), segments.truncate("s", -1),
                         segments.read("s", 0, length=0), segments.get_attribute("s", -1),
                         segments.update_attribute("s", 1, 2**63, expected_value=None),
                         segments.conditional_append("s", b"not a list", expected_offset=0),
                         segments.read("s", 0, wait_seconds=-1)):
                with pytest.raises(InvalidArgumentError):
                    await call
            assert server.connection_count == 0, "nothing reached the server"
    run(scenario)


#: Every error reply of the contract, and the error the client raises for it.
ERROR_REPLIES: list[tuple[Command, type[Exception]]] = [
    (NoSuchSegment(0, "s"), StreamSegmentNotExistsError),
    (SegmentIsSealed(0, "s", 10), StreamSegmentSealedError),
    (SegmentAlreadyExists(0, "s"), StreamSegmentExistsError),
    (SegmentIsTruncated(0, "s", 10), StreamSegmentTruncatedError),
    (WrongHost(0, "s", ""), WrongHostError),
    (InvalidEventNumber(0, uuid.UUID(int=1), 5), InvalidEventNumberError),
    (ConditionalCheckFailed(0, uuid.UUID(int=1), 5), BadOffsetError),
    (AuthTokenCheckFailed(0, "expired"), AuthenticationError),
    (OperationUnsupported(0, "GetSegmentInfo"), OperationUnsupportedError),
    *[(ErrorMessage(0, "s", code, "from the server"), cls) for code, cls in ERROR_CODES.items()],
    (ErrorMessage(0, "s", 999, "a newer server's error"), errors.InternalError),
]


@pytest.mark.parametrize(("reply", "expected"), ERROR_REPLIES, ids=lambda v: type(v).__name__ if isinstance(
    v, Command) else v.__name__)
def test_every_error_reply_raises_its_typed_error(reply: Command, expected: type[Exception]) -> None:
    def answer(command: Command) -> Command | None:
        return attrs.evolve(reply, request_id=command.request_id) if isinstance(command, GetSegmentInfo) else None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(error_reply=answer)) as server, client(server.uri) as c:
            with pytest.raises(expected) as caught:
                await c.segments().info("s")
            assert type(caught.value) is expected
            assert c.pool.connections(), "an error reply leaves the connection open"
    run(scenario)


def test_replies_are_matched_by_request_id_in_any_order() -> None:
    """Hold every reply of a burst of requests, then release them in reverse order."""
    held: list[tuple[Command, Command]] = []

    def hold(command: Command) -> Command | None:
        if isinstance(command, GetSegmentInfo):
            held.append((command, command))
            return KeepAlive()  # the fake sends this instead of the answer: the real answer comes later
        return None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(error_reply=hold)) as server, client(server.uri) as c:
            for i in range(5):
                await c.segments().create(f"s/{i}")
            calls = [asyncio.ensure_future(c.segments().info(f"s/{i}")) for i in range(5)]
            await until(lambda: len(held) == 5, "all five requests arrived")
            server.faults.error_reply = None
            connection = server.connections[-1]
            for request, _ in reversed(held):
                connection.handle(request)
            infos = await asyncio.gather(*calls)
            assert [info.name for info in infos] == [f"s/{i}" for i in range(5)]
    run(scenario)


def test_a_broken_connection_fails_every_request_in_flight_and_the_next_request_reconnects() -> None:
    def stall(command: Command) -> Command | None:
        return KeepAlive() if isinstance(command, GetSegmentInfo) and command.segment.startswith("stall") else None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(error_reply=stall)) as server, client(server.uri) as c:
            await c.segments().create("s")
            calls = [asyncio.ensure_future(c.segments().exists(f"stall/{i}")) for i in range(3)]
            await until(lambda: len(server.blocks_of(GetSegmentInfo)) == 3, "the requests arrived")
            server.faults.error_reply = None
            server.cut_all()
            # info is idempotent: each is re-sent on a new connection and succeeds.
            assert await asyncio.gather(*calls) == [False, False, False]
            assert server.connection_count == 2
            # create is not: a cut while it is in flight raises ConnectionLostError (its outcome is unknown).
            server.faults.drop_reply = lambda reply: isinstance(reply, SegmentCreated)
            creating = asyncio.ensure_future(c.segments().create("t"))
            await until(lambda: "t" in server.segments, "the create arrived")
            server.cut_all()
            with pytest.raises(ConnectionLostError):
                await creating
    run(scenario)


def test_an_unanswered_request_times_out() -> None:
    async def scenario() -> None:
        faults = Faults(drop_reply=lambda reply: True)
        async with FakeServer(faults=faults) as server:
            faults.drop_reply = lambda reply: not isinstance(reply, Hello)
            async with client(server.uri, request_timeout_seconds=0.1) as c:
                with pytest.raises(RequestTimeoutError):
                    await c.segments().create("s")
    run(scenario)


def test_a_server_that_cannot_be_reached_fails_after_bounded_retries() -> None:
    """A server that was reached and went away: retried within the reconnect budget (here: a count),
    then the retryable ``ReconnectBudgetExceededError`` with the last reason.  (A server never reached
    at all is ``ConnectFailedError``: tests/client/test_fail_fast.py.)"""
    async def scenario() -> None:
        server = FakeServer()
        await server.start()
        async with client(server.uri, reconnect_attempts_max=3) as c:
            await c.segments().create("s")
            await server.stop()
            with pytest.raises(ConnectionLostError, match="cannot connect") as raised:
                await c.segments().info("s")  # (idempotent: retried)
            assert isinstance(raised.value, errors.ReconnectBudgetExceededError)
    run(scenario)


def test_a_server_that_never_says_hello_fails_the_connect() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(silent=True)) as server, client(
                server.uri, connect_timeout_seconds=0.1, reconnect_attempts_max=1) as c:
            with pytest.raises(errors.ConnectFailedError, match="timed out"):
                await c.segments().create("s")
    run(scenario)


async def _raw_server(handler: asyncio.Protocol) -> tuple[asyncio.Server, str]:
    server = await asyncio.get_running_loop().create_server(lambda: handler, "127.0.0.1", 0)
    return server, f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"


class _Scripted(asyncio.Protocol):
    """Answers Hello with ``hello`` frames, then sends ``after`` once the first request arrives."""

    def __init__(self, hello: bytes, after: bytes = b"") -> None:
        self.hello = hello
        self.after = after
        self.transport: asyncio.Transport | None = None
        self.greeted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if not self.greeted:
            self.greeted = True
            self.transport.write(self.hello)
        elif self.after:
            self.transport.write(self.after)
            self.after = b""


@pytest.mark.parametrize(("hello", "after", "error"), [
    (codec.encode(Hello(99, 50)), b"", codec.IncompatibleVersionError),
    (codec.encode(SegmentCreated(1, "s")), b"", ProtocolError),  # a reply before Hello
    (b"\x00\x00\x00\x63\x00\x00\x00\x00", b"", ProtocolError),  # an unknown command type
    (codec.encode(Hello(1, 1)), codec.encode(SegmentCreated(77, "s")), ConnectionLostError),  # never asked
    (codec.encode(Hello(1, 1)), codec.encode(GetSegmentInfo(1, "s", "")), ConnectionLostError),  # not a reply
])
def test_a_server_breaking_the_protocol_gets_its_connection_closed(hello: bytes, after: bytes,
                                                                   error: type[Exception]) -> None:
    async def scenario() -> None:
        handler = _Scripted(hello, after)
        server, uri = await _raw_server(handler)
        try:
            async with client(uri, reconnect_attempts_max=1) as c:
                with pytest.raises(error) as caught:
                    await c.segments().create("s")
                if error is ConnectionLostError:  # the request was in flight: its outcome is unknown
                    assert isinstance(caught.value.__cause__, ProtocolError), caught.value
                assert not c.pool.connections()
        finally:
            server.close()
            await server.wait_closed()
    run(scenario)


def test_keepalives_on_a_manual_clock() -> None:
    """Idle for an interval: a KeepAlive goes out.  Silent for three: the connection is closed."""
    async def scenario() -> None:
        async with FakeServer() as server:
            clock = ManualClock()
            config = fast_config(keepalive_interval_seconds=1.0)
            connection = await Connection.open(parse_uri(server.uri), clock=clock, config=config)
            try:
                clock.advance(1.0)
                connection.check_deadlines()
                await until(lambda: any(isinstance(c, KeepAlive) for c in server.received), "a keep-alive arrived")
                assert connection.is_open
                server.connections[-1].send(KeepAlive())  # the server's keep-alive, received at t = 1
                await until(lambda: connection._last_received == 1.0, "the server's keep-alive arrived")
                server.faults.silent = True
                clock.advance(2.0)
                connection.check_deadlines()
                assert connection.is_open, "two silent intervals are not yet three"
                clock.advance(1.0)
                connection.check_deadlines()
                assert not connection.is_open
                assert isinstance(await connection.wait_closed(), ConnectionLostError)
                connection.check_invariants()
            finally:
                connection.close()
    run(scenario)


def test_a_closed_client_refuses_calls() -> None:
    async def scenario() -> None:
        async with FakeServer() as server:
            c = AsyncClient(server.uri)
            await c.segments().create("s")
            await c.close()
            await c.close()
            with pytest.raises(ObjectClosedError):
                c.segments()
            assert not c.pool.connections()
    run(scenario)


def test_token_is_passed_and_a_refused_one_raises_authentication_error() -> None:
    async def scenario() -> None:
        async with FakeServer(token="secret") as server:
            async with client(server.uri, token="secret") as good:
                await good.segments().create("s")
            async with client(server.uri, token="wrong") as bad:
                with pytest.raises(AuthenticationError):
                    await bad.segments().info("s")
    run(scenario)


def test_pool_retrying_backs_off_on_the_injected_clock_and_gives_up_with_the_last_failure() -> None:
    """``ConnectionPool.retrying`` (the segment, controller and transient-segment requests' retry loop):
    a failure named in ``retry_on`` is retried after the seeded backoff's delays, slept on the pool's
    clock; the attempts' bound raises the last failure; any other failure goes through at once."""
    from millstream.client._pool import ConnectionPool

    class RecordingClock(ManualClock):
        def __init__(self) -> None:
            super().__init__()
            self.sleeps: list[float] = []

        async def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)  # no waiting: each attempt follows at once

    config = fast_config(reconnect_attempts_max=3, reconnect_delay_initial_seconds=0.01,
                         reconnect_delay_max_seconds=0.05)

    async def scenario() -> None:
        # Fails twice, then answers: two sleeps, exactly the seeded backoff's first two delays.
        clock = RecordingClock()
        pool = ConnectionPool(clock=clock, config=config, rng=random.Random(7))
        failures = [ConnectionLostError("first"), RequestTimeoutError("second")]

        async def flaky() -> str:
            if failures:
                raise failures.pop(0)
            return "answer"

        assert await pool.retrying(flaky, retry_on=(ConnectionLostError, RequestTimeoutError)) == "answer"
        expected = config.backoff(random.Random(7))
        assert clock.sleeps == [expected.delay(1), expected.delay(2)]

        # Never answers: three attempts' delays, then the last failure itself.
        clock.sleeps.clear()
        attempts: list[int] = []

        async def dead() -> None:
            attempts.append(len(attempts) + 1)
            raise ConnectionLostError(f"attempt {len(attempts)}")

        with pytest.raises(ConnectionLostError, match="attempt 4"):
            await pool.retrying(dead)
        assert attempts == [1, 2, 3, 4] and len(clock.sleeps) == 3

        # A failure not in ``retry_on`` (by default only a lost connection is): raised at once, no sleep.
        clock.sleeps.clear()

        async def timed_out() -> None:
            raise RequestTimeoutError("slow")

        with pytest.raises(RequestTimeoutError):
            await pool.retrying(timed_out)
        assert clock.sleeps == []

    asyncio.run(scenario())


class _RecordingTransport(asyncio.Transport):
    """A transport that keeps what it is given, to see how commands leave a connection."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.is_closing(), "written after the close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted


def test_commands_sent_in_one_loop_turn_leave_in_one_write_and_a_clean_close_sends_them_first() -> None:
    async def scenario() -> None:
        connection = Connection(parse_uri("tcp://127.0.0.1:1"), clock=ManualClock(), config=fast_config())
        transport = _RecordingTransport()
        connection.connection_made(transport)
        assert codec.Decoder().feed(transport.writes.pop()) == [
            Hello(codec.WIRE_VERSION, codec.OLDEST_COMPATIBLE_VERSION)]
        burst: list[Command] = [GetSegmentInfo(1, "a", ""), KeepAlive(), GetSegmentInfo(2, "b", "")]
        for command in burst:
            connection.send(command)
        assert transport.writes == [], "nothing leaves before the loop turn ends"
        await asyncio.sleep(0)
        assert len(transport.writes) == 1 and codec.Decoder().feed(transport.writes[0]) == burst
        connection.send(GetSegmentInfo(3, "c", ""))
        connection.close()  # before the turn ends: what was sent still leaves, ahead of the close
        assert transport.closed and codec.Decoder().feed(transport.writes[1]) == [GetSegmentInfo(3, "c", "")]
        await asyncio.sleep(0)
        assert len(transport.writes) == 2, "the flush scheduled before the close sends nothing again"
        with pytest.raises(ConnectionLostError):
            connection.send(KeepAlive())

    run(scenario)


def test_a_connection_closed_for_a_protocol_error_drops_what_it_had_not_sent() -> None:
    async def scenario() -> None:
        connection = Connection(parse_uri("tcp://127.0.0.1:1"), clock=ManualClock(), config=fast_config())
        transport = _RecordingTransport()
        connection.connection_made(transport)
        transport.writes.clear()
        connection.send(GetSegmentInfo(1, "a", ""))
        connection.close(ProtocolError("the server sent bad bytes"))
        await asyncio.sleep(0)
        assert transport.aborted and transport.writes == []

    run(scenario)
