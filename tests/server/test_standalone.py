"""Standalone mode: start, write, stop, start again on the same directory, read it all back; and
``millstream standalone`` as a subprocess reached over TCP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import millstream
from millstream.errors import InvalidArgumentError
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.wire import (
    AppendSetup,
    CreateSegment,
    DataAppended,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    iter_events,
)
from tests.server.raw import RawClient, block, run

SEGMENTS = [f"sc/standalone/{n}" for n in range(6)]  # spread over the containers


def write_some(port: int, writer: uuid.UUID, first: int, count: int) -> None:
    async def scenario() -> None:
        client = await RawClient.connect(port)
        for request_id, segment in enumerate(SEGMENTS):
            if first == 1:
                assert await client.request(CreateSegment(request_id, segment, "")) == SegmentCreated(
                    request_id, segment)
            setup = await client.request(SetupAppend(request_id, writer, segment, ""))
            expected = NULL_ATTRIBUTE_VALUE if first == 1 else first - 1
            assert setup == AppendSetup(request_id, segment, writer, expected), setup
            for number in range(first, first + count):
                reply = await client.request(block(writer, number, [f"{segment}:{number}".encode()], number))
                assert isinstance(reply, DataAppended)
        await client.close()
    run(scenario)


def read_back(port: int) -> dict[str, list[bytes]]:
    found: dict[str, list[bytes]] = {}

    async def scenario() -> None:
        client = await RawClient.connect(port)
        for segment in SEGMENTS:
            read = await client.request(ReadSegment(1, segment, 0, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead), read
            found[segment] = list(iter_events(read.data))
        await client.close()
    run(scenario)
    return found


def test_standalone_start_stop_restart_recovers_everything(tmp_path: Path) -> None:
    writer = uuid.uuid4()
    with millstream.standalone(tmp_path / "data") as node:
        assert node.uri == f"tcp://127.0.0.1:{node.port}" and node.host == "127.0.0.1"
        assert node.data_dir == tmp_path / "data"
        write_some(node.port, writer, 1, 10)
    assert (tmp_path / "data" / "node.json").exists()
    node = millstream.standalone(tmp_path / "data")
    try:
        expected = {s: [f"{s}:{n}".encode() for n in range(1, 11)] for s in SEGMENTS}
        assert read_back(node.port) == expected
        write_some(node.port, writer, 11, 5)  # SetupAppend reports 10: the writer's number survived too
    finally:
        node.close()
    node.close()  # idempotent
    with millstream.standalone(tmp_path / "data") as node:
        assert read_back(node.port) == {s: [f"{s}:{n}".encode() for n in range(1, 16)] for s in SEGMENTS}


def test_a_data_directory_keeps_its_container_count(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path, container_count=2):
        pass
    with pytest.raises(InvalidArgumentError, match="2 containers"):
        millstream.standalone(tmp_path, container_count=3)
    with millstream.standalone(tmp_path) as node:  # no count named: the directory's
        assert node.node.config.container_count == 2


def test_a_new_data_directory_gets_one_container_unless_told_otherwise(tmp_path: Path) -> None:
    from millstream.standalone import CONTAINER_COUNT_DEFAULT, recorded_container_count

    assert CONTAINER_COUNT_DEFAULT == 1 and recorded_container_count(tmp_path / "fresh") is None
    with millstream.standalone(tmp_path / "fresh") as node:
        assert node.node.config.container_count == 1
    assert recorded_container_count(tmp_path / "fresh") == 1
    with millstream.standalone(tmp_path / "four", container_count=4) as node:
        assert node.node.config.container_count == 4
    assert recorded_container_count(tmp_path / "four") == 4


def test_the_cli_serves_over_tcp_until_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "cli-data"
    process = subprocess.Popen(
        [sys.executable, "-c", "from millstream.cli import main; main()", "standalone", "--data-dir", str(data_dir),
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(r"millstream standalone listening on tcp://127\.0\.0\.1:(\d+) \(data in (.+)\)\n", line)
        assert match, line
        assert Path(match[2]) == data_dir
        port = int(match[1])
        writer = uuid.uuid4()
        write_some(port, writer, 1, 3)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert process.stderr is not None
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # The data it acknowledged is there for the next node on that directory.
    with millstream.standalone(data_dir) as node:
        assert read_back(node.port) == {s: [f"{s}:{n}".encode() for n in range(1, 4)] for s in SEGMENTS}


def test_serve_runs_a_node_from_a_toml_file(tmp_path: Path) -> None:
    from millstream.auth import Permission, issue_token
    from millstream.naming import container_of
    from millstream.wire import AuthTokenCheckFailed, WrongHost

    secret = b"serve-test-secret-0123456789"
    (tmp_path / "secret").write_bytes(secret + b"\n")
    (tmp_path / "node.toml").write_text(
        'data_dir = "data"\nport = 0\ncontainer_count = 4\nowned_containers = [0, 1]\n'
        'auth_secret_file = "secret"\n')
    owned = next(f"sc/s{n}" for n in range(100) if container_of(f"sc/s{n}", 4) in (0, 1))
    foreign = next(f"sc/s{n}" for n in range(100) if container_of(f"sc/s{n}", 4) in (2, 3))
    token = issue_token(secret, "sc/*", Permission.READ_UPDATE, 4_000_000_000.0)
    process = subprocess.Popen(
        [sys.executable, "-c", "from millstream.cli import main; main()", "serve", "--config",
         str(tmp_path / "node.toml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(r"millstream standalone listening on tcp://127\.0\.0\.1:(\d+) \(data in (.+)\)\n", line)
        assert match and Path(match[2]) == tmp_path / "data", line

        async def scenario() -> None:
            client = await RawClient.connect(int(match[1]))
            assert isinstance(await client.request(CreateSegment(1, owned, "")), AuthTokenCheckFailed)
            assert await client.request(CreateSegment(2, owned, token)) == SegmentCreated(2, owned)
            assert await client.request(CreateSegment(3, foreign, token)) == WrongHost(3, foreign, "")
            await client.close()
        run(scenario)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_refuses_a_bad_configuration_clearly(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from millstream.cli import main

    (tmp_path / "bad.toml").write_text('data_dir = "d"\nprot = 9090\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "bad.toml")])
    assert result.exit_code == 2 and "unknown keys ['prot']" in result.output
    (tmp_path / "tls.toml").write_text('data_dir = "d"\ntls_cert_file = "c.pem"\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "tls.toml")])
    assert result.exit_code == 2 and "go together" in result.output
