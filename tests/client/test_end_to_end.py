"""The client against the real server (``millstream.standalone``: FileLog and Tier 2 on local files).

The fake server (``fake_server``) is where protocol faults are injected; here the faults are the ones a
real deployment meets -- connections cut under a busy writer, the node stopped and started again on
its data directory -- and the contract details only the real server can confirm (its acknowledgement
offsets, tail-read wake-ups, tokens and TLS)."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner

import millstream
from millstream.auth import Permission, issue_token
from millstream.cli import main
from millstream.client import AsyncClient, JsonSerializer
from millstream.errors import AuthenticationError, StreamSegmentSealedError
from millstream.testing.history import EventTag, History, Outcome, check
from tests.client.helpers import client, fast_config, run


def test_write_and_read_back_over_several_segments(tmp_path: Path) -> None:
    names = [f"e2e/json/{i}.#epoch.0" for i in range(3)]

    async def scenario(uri: str) -> None:
        async with client(uri) as c:
            for name in names:
                await c.segments().create(name)
            tails = [c.segment_reader(name, JsonSerializer()) for name in names]
            waiting = [asyncio.ensure_future(reader.read_events(wait_seconds=30)) for reader in tails]
            async with c.event_writer(names, JsonSerializer()) as writer:
                for i in range(3000):
                    await writer.write_event({"key": f"k{i % 17}", "i": i}, routing_key=f"k{i % 17}")
            woken = await asyncio.wait_for(asyncio.gather(*waiting), 20)
            assert all(events for events in woken), "every waiting tail read was woken by the appends"
            seen: dict[str, list[int]] = {}
            for name in names:
                reader = c.segment_reader(name, JsonSerializer())
                while events := await reader.read_events():
                    for event in events:
                        seen.setdefault(event.value["key"], []).append(event.value["i"])
                assert reader.offset == (await c.segments().info(name)).length
            assert sum(len(v) for v in seen.values()) == 3000
            for key, numbers in seen.items():
                assert numbers == sorted(numbers) == [i for i in range(3000) if f"k{i % 17}" == key]

    with millstream.standalone(tmp_path) as node:
        run(lambda: scenario(node.uri))


def test_exactly_once_while_connections_are_cut_under_a_busy_writer(tmp_path: Path) -> None:
    segment = "e2e/cuts/0.#epoch.0"
    history = History()

    async def scenario(uri: str) -> None:
        async with client(uri, reconnect_attempts_max=12, append_ack_timeout_seconds=10.0) as c:
            await c.segments().create(segment)
            writer = c.event_writer([segment])
            pending = []
            cuts = 0

            async def cut_now_and_then() -> None:
                nonlocal cuts
                for _ in range(8):
                    await asyncio.sleep(0.03)
                    for connection in c.pool.connections():
                        connection.close()
                    cuts += 1

            cutter = asyncio.ensure_future(cut_now_and_then())
            for i in range(20_000):
                tag = EventTag("w", i)
                history.write_invoked(tag, key="k")
                pending.append((tag, await writer.write_event_future(tag.payload(32), routing_key="k")))
                if i % 500 == 0:
                    await asyncio.sleep(0.005)  # let the cutter in while the writer is busy
            await cutter
            await writer.flush()
            for tag, future in pending:
                history.write_completed(tag, Outcome.ACKED if future.exception() is None else Outcome.UNKNOWN)
            assert writer.segment_writers()[segment].reconnects >= 4
            await writer.close()
            reader = c.segment_reader(segment)
            while events := await reader.read_events():
                history.read_all("read", [event.value for event in events])
            history.pass_complete("read")
            assert cuts == 8

    with millstream.standalone(tmp_path) as node:
        run(lambda: scenario(node.uri), timeout=60)
    report = check(history)
    assert report.ok, report.summary()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_node_stopped_and_started_again_gets_every_event_exactly_once(tmp_path: Path) -> None:
    """The writer keeps writing while the node is down; when the node is back (recovered from its log)
    the writer sets up again, learns what was stored, and re-sends only the rest."""
    segment = "e2e/restart/0.#epoch.0"
    port = _free_port()
    node = millstream.standalone(tmp_path, port=port)
    try:
        with millstream.connect(node.uri, config=fast_config(reconnect_attempts_max=12,
                                                             reconnect_delay_max_seconds=0.2,
                                                             append_ack_timeout_seconds=10.0),
                                rng=random.Random(3)) as c:
            c.segments().create(segment)
            writer = c.event_writer([segment])
            for i in range(5000):
                writer.write_event(b"%06d" % i)
            writer.flush()
            for i in range(5000, 6000):
                writer.write_event(b"%06d" % i)
            node.close()  # graceful: what it received is acknowledged or dropped, never half-stored
            for i in range(6000, 7000):
                writer.write_event(b"%06d" % i)
            time.sleep(0.1)
            node = millstream.standalone(tmp_path, port=port)
            writer.close()
            reader = c.segment_reader(segment)
            values = [event.value for event in reader.read_events()]
            while events := reader.read_events():
                values.extend(event.value for event in events)
            assert values == [b"%06d" % i for i in range(7000)]
    finally:
        node.close()


def test_tokens_and_tls_against_the_real_server(tmp_path: Path) -> None:
    secret = b"a-test-secret-of-enough-bytes"
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    authority.configure_trust(client_context)
    expiry = time.time() + 600
    write_token = issue_token(secret, "iot/*", Permission.READ_UPDATE, expiry)
    read_token = issue_token(secret, "iot/sensors", Permission.READ, expiry)
    segment = "iot/sensors/0.#epoch.0"

    async def scenario(uri: str) -> None:
        assert uri.startswith("tls://")
        async with AsyncClient(uri, token=write_token, ssl_context=client_context, config=fast_config()) as c:
            await c.segments().create(segment)
            async with c.event_writer([segment]) as writer:
                await writer.write_event(b"secret reading")
        async with AsyncClient(uri, token=read_token, ssl_context=client_context, config=fast_config()) as c:
            events = await c.segment_reader(segment).read_events()
            assert [event.value for event in events] == [b"secret reading"]
            writer = c.event_writer([segment])
            await writer.write_event(b"not allowed")
            with pytest.raises(AuthenticationError):
                await writer.flush()
            with pytest.raises(AuthenticationError):
                await c.segments().seal(segment)
            with pytest.raises(AuthenticationError):
                await writer.close()

    with millstream.standalone(tmp_path, auth_secret=secret, ssl_context=server_context) as node:
        run(lambda: scenario(node.uri))


def test_the_cli_against_the_real_server(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        runner = CliRunner()
        assert runner.invoke(main, ["segment", "create", "cli/e2e/0", "--uri", node.uri]).exit_code == 0
        result = runner.invoke(main, ["write", "--segment", "cli/e2e/0", "--uri", node.uri], input=b"a\nbb\n")
        assert result.exit_code == 0, result.output
        result = runner.invoke(main, ["read", "--segment", "cli/e2e/0", "--show-offsets", "--uri", node.uri])
        assert (result.exit_code, result.stdout) == (0, "0\ta\n9\tbb\n")
        assert runner.invoke(main, ["segment", "seal", "cli/e2e/0", "--uri", node.uri]).exit_code == 0
        result = runner.invoke(main, ["write", "--segment", "cli/e2e/0", "--uri", node.uri], input=b"late\n")
        assert result.exit_code == 1 and "StreamSegmentSealedError" in result.stderr
        assert StreamSegmentSealedError.__name__ in result.stderr
