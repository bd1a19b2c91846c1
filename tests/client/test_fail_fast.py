"""Failing fast (issue 19 item 5): a client that never reached a server gives up after its initial
connect budget with ``ConnectFailedError`` naming the address -- from every entry point, on the
injected clock, so it is the configured budget that ends the wait -- and a TLS failure (an untrusted
certificate, a plain client at a TLS port, a TLS client at a plain port) is ``TlsHandshakeError`` at
once, never retried.  Retries are for a server that was reached and went away: there the reconnect
budget applies (``ReconnectBudgetExceededError``)."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from click.testing import CliRunner

import millstream
from millstream.cli import main
from millstream.client import AsyncClient, ClientConfig
from millstream.errors import (
    CallerError,
    ConnectFailedError,
    ConnectionLostError,
    ReconnectBudgetExceededError,
    RetryableError,
    TlsHandshakeError,
)
from tests.client.fake_server import FakeServer
from tests.client.helpers import run


class JumpingClock:
    """An injected clock whose ``sleep`` moves time forward at once (recording each wait), so a retry
    loop's whole budget passes in a few event-loop turns.  The keep-alive ticker's sleeps never end
    (they are cancelled when their connection closes): time is the retry loops' alone."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_name().startswith("millstream-keepalive"):
            await asyncio.get_running_loop().create_future()  # forever: until the connection closes
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


def closed_port() -> int:
    """A port nothing listens on (bound, then closed: connecting to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fresh_client(uri: str, clock: JumpingClock, **config: Any) -> AsyncClient:
    return AsyncClient(uri, clock=clock, rng=random.Random(1), config=ClientConfig(**config))


@pytest.mark.parametrize("budget", [2.0, 30.0])
def test_a_refused_connection_fails_once_the_initial_connect_budget_is_spent(budget: float) -> None:
    port = closed_port()

    async def scenario() -> None:
        clock = JumpingClock()
        async with fresh_client(f"tcp://127.0.0.1:{port}", clock, initial_connect_budget_seconds=budget) as client:
            with pytest.raises(ConnectFailedError) as raised:
                await client.stream_manager().list_scopes()
        error = raised.value
        assert isinstance(error, CallerError) and not isinstance(error, RetryableError)
        assert f"tcp://127.0.0.1:{port}" in str(error) and "initial connect budget" in str(error)
        # The budget is what ended it: the waits add up to it exactly (the last is cut to end with it),
        # after several attempts -- not a count of attempts, not a nest of retry loops.
        assert sum(clock.sleeps) == pytest.approx(budget) and clock.now == pytest.approx(budget)
        assert len(clock.sleeps) >= 3
    run(scenario)


async def _begin(client: AsyncClient) -> None:
    await client.transactional_writer("s/a").begin()


async def _write(client: AsyncClient) -> None:
    writer = client.event_writer(["s/a/0"])
    await writer.write_event(b"x")
    await writer.flush()


async def _write_to_stream(client: AsyncClient) -> None:
    writer = client.event_writer("s/a")
    await writer.write_event(b"x")


ENTRY_POINTS: dict[str, Callable[[AsyncClient], Awaitable[Any]]] = {
    "segment info (retried)": lambda c: c.segments().info("s/a/0"),
    "segment create (not retried)": lambda c: c.segments().create("s/a/0"),
    "scope list": lambda c: c.stream_manager().list_scopes(),
    "scope create": lambda c: c.stream_manager().create_scope("s"),
    "writer of segments": _write,
    "stream writer": _write_to_stream,
    "transaction begin": _begin,
    "reader group": lambda c: c.reader_group("s/g", ["s/a"]),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_fails_the_same_way_within_the_same_budget(entry: str) -> None:
    port = closed_port()

    async def scenario() -> None:
        clock = JumpingClock()
        async with fresh_client(f"tcp://127.0.0.1:{port}", clock, initial_connect_budget_seconds=3.0) as client:
            with pytest.raises(ConnectFailedError, match=f"127.0.0.1:{port}"):
                await ENTRY_POINTS[entry](client)
            assert clock.now == pytest.approx(3.0)
            if entry == "writer of segments":
                with pytest.raises(ConnectFailedError):
                    await client.close()  # (the writer's error, raised after everything closed)
    run(scenario)


def test_a_server_that_was_reached_is_retried_for_the_reconnect_budget() -> None:
    async def scenario() -> None:
        clock = JumpingClock()
        server = FakeServer()
        await server.start()
        async with AsyncClient(server.uri, clock=clock, rng=random.Random(1),
                               config=ClientConfig(reconnect_budget_seconds=7.0)) as client:
            await client.segments().create("s")
            await server.stop()
            with pytest.raises(ReconnectBudgetExceededError, match="reconnect budget") as raised:
                await client.segments().info("s")
            assert isinstance(raised.value, ConnectionLostError)  # retryable: the server may come back
            assert clock.now == pytest.approx(7.0) and len(clock.sleeps) >= 3
    run(scenario)


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def test_tls_failures_are_typed_at_once_and_never_retried(tmp_path: Path, authority: trustme.CA) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    trusting = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    authority.configure_trust(trusting)

    async def scenario(tls_uri: str, plain_uri: str) -> None:
        # Without the CA: the certificate is not trusted.
        clock = JumpingClock()
        async with fresh_client(tls_uri, clock) as client:
            with pytest.raises(TlsHandshakeError, match="not trusted") as raised:
                await client.stream_manager().list_scopes()
        assert tls_uri in str(raised.value) and "--tls-ca" in str(raised.value)
        assert clock.sleeps == [], "a TLS failure is not retried"
        # A TLS client at a plain port: the server does not speak TLS.
        clock = JumpingClock()
        async with AsyncClient(plain_uri.replace("tcp://", "tls://"), ssl_context=trusting, clock=clock,
                               config=ClientConfig()) as client:
            with pytest.raises(TlsHandshakeError, match="does not speak TLS"):
                await client.stream_manager().list_scopes()
        assert clock.sleeps == []
        # A plain client at the TLS port: the server drops its Hello; the message says what that means.
        clock = JumpingClock()
        async with fresh_client(tls_uri.replace("tls://", "tcp://"), clock, initial_connect_budget_seconds=2.0) as c:
            with pytest.raises(ConnectFailedError, match="tls://") as raised:
                await c.stream_manager().list_scopes()
        assert "before its Hello" in str(raised.value) and clock.now == pytest.approx(2.0)
        # With the CA, the same server answers.
        async with AsyncClient(tls_uri, ssl_context=trusting) as client:
            assert await client.stream_manager().list_scopes() == []

    with millstream.standalone(tmp_path / "tls", ssl_context=server_context) as tls_node, \
            millstream.standalone(tmp_path / "plain") as plain_node:
        run(lambda: scenario(tls_node.uri, plain_node.uri))


def test_a_plain_client_answered_in_tls_says_so_at_once() -> None:
    """A server that answers a plain Hello with a TLS record (an alert) is a TLS server."""
    class AnswersInTls(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.write(b"\x15\x03\x03\x00\x02\x02\x46")  # a TLS alert record: protocol_version

    async def scenario() -> None:
        server = await asyncio.get_running_loop().create_server(AnswersInTls, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        clock = JumpingClock()
        try:
            async with fresh_client(f"tcp://127.0.0.1:{port}", clock) as client:
                with pytest.raises(TlsHandshakeError, match="answered in TLS"):
                    await client.segments().info("s")
            assert clock.sleeps == []
        finally:
            server.close()
            await server.wait_closed()
    run(scenario)


def test_the_cli_names_the_address_and_the_error() -> None:
    port = closed_port()
    result = CliRunner().invoke(main, ["scope", "list", "--uri", f"tcp://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert "ConnectFailedError" in result.output and f"tcp://127.0.0.1:{port}" in result.output
