"""A real ``millstream`` node in a child process, for tests that play hostile peers against it, and the
pieces they share: its resident memory read from outside (``/proc/PID/status``), a normal client
that writes and reads back byte for byte, and hostile connections spread over loopback addresses.

The node is ``millstream standalone`` (authentication off) or ``millstream serve`` with an
``auth_secret_file`` (authentication on), started with ``--port 0``; the port comes from the line it
prints once it listens.  It is stopped by its PID (SIGTERM, then SIGKILL) and reaped, whatever the
test did.  Every wait is bounded; none is a duration to sleep."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from millstream.auth import Permission, issue_token
from millstream.client import AsyncClient, ClientConfig
from millstream.wire import OLDEST_COMPATIBLE_VERSION, WIRE_VERSION, Hello, encode, iter_events

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
SECRET = b"hostile-test-secret-0123456789"
READY_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 30.0
HELLO = encode(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
#: Hostile connections come from 127.0.0.2 and up (any 127.x.y.z reaches loopback on Linux), this
#: many per address -- under the server's per-address limit, so that the global limit is what binds.
CONNECTIONS_PER_ADDRESS = 1000


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files towards ``wanted`` (within the hard limit); a
    node started afterwards inherits it.  Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard if hard != resource.RLIM_INFINITY else wanted)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def hostile_address(index: int) -> str:
    """The loopback address the ``index``-th hostile connection binds to."""
    number = 2 + index // CONNECTIONS_PER_ADDRESS
    return f"127.0.{number // 250}.{2 + number % 250}" if number >= 250 else f"127.0.0.{number}"


class Node:
    """A node in a child process (``auth``: with token authentication on)."""

    def __init__(self, directory: Path, *, auth: bool = False) -> None:
        self.directory = directory
        self.auth = auth
        self.data_dir = directory / "data"
        self.stderr_path = directory / "node.stderr"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        #: A token good for everything (empty with authentication off).
        self.token = issue_token(SECRET, "*", Permission.READ_UPDATE, time.time() + 86_400) if auth else ""

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.auth:
            (self.directory / "secret").write_bytes(SECRET)
            (self.directory / "node.toml").write_text(
                'data_dir = "data"\nport = 0\ncontainer_count = 1\nauth_secret_file = "secret"\n')
            command = ["serve", "--config", str(self.directory / "node.toml")]
        else:
            command = ["standalone", "--data-dir", str(self.data_dir), "--port", "0"]
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from millstream.cli import main; main()", *command], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        line = b""
        while time.monotonic() < deadline and self.process.poll() is None:
            ready = _readline_within(self.process.stdout, deadline - time.monotonic())
            if ready is not None:
                line = ready
                break
        match = re.match(rb"millstream standalone listening on tcp://127\.0\.0\.1:(\d+) ", line)
        assert match, f"the node did not start: {line!r} (exit {self.process.poll()}): {self.stderr_tail()}"
        self.port = int(match[1])

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # by PID: this child and nothing else
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_SECONDS)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        """The node's resident set, read from outside the process."""
        assert self.process is not None
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/PID/status")

    def stderr_tail(self, characters: int = 3000) -> str:
        return self.stderr_path.read_text(errors="replace")[-characters:]

    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _readline_within(stream: Any, seconds: float) -> bytes | None:
    import selectors
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(max(seconds, 0.0)):
            return None
    return stream.readline()  # type: ignore[no-any-return]


@contextlib.contextmanager
def node(directory: Path, *, auth: bool = False) -> Iterator[Node]:
    with Node(directory, auth=auth) as started:
        yield started


def client_config() -> ClientConfig:
    """A normal client's settings, patient enough for a loaded machine under attack."""
    return ClientConfig(request_timeout_seconds=30.0)


class NormalClient:
    """A well-behaved client: writes numbered events to its own segment with an idempotent writer and
    reads them all back, byte for byte.  Its history survives across event loops (a new client and
    writer each time; the segment and the events written so far are remembered)."""

    def __init__(self, uri: str, token: str, segment: str) -> None:
        self.uri = uri
        self.token = token
        self.segment = segment
        self.written: list[bytes] = []

    def payload(self, number: int) -> bytes:
        size = (number * 7919) % 3000  # various sizes, a few bytes to 3 KB
        return number.to_bytes(4, "big") + bytes((number + i) % 251 for i in range(size))

    async def write(self, count: int, *, large: int = 0) -> None:
        """Write ``count`` events (and ``large`` events of 200 KB), flush: all acknowledged."""
        async with AsyncClient(self.uri, token=self.token, config=client_config()) as client:
            if not self.written:
                await client.segments().create(self.segment)
            writer = client.event_writer([self.segment])
            try:
                batch = []
                for _ in range(count):
                    batch.append(self.payload(len(self.written) + len(batch)))
                for _ in range(large):
                    batch.append(bytes([len(batch) % 256]) * 200_000)
                for payload in batch:
                    await writer.write_event(payload)
                await writer.flush()
            finally:
                await writer.close()
            self.written.extend(batch)

    async def read_back(self) -> None:
        """Every event written so far is there, in order, byte for byte, and nothing else."""
        async with AsyncClient(self.uri, token=self.token, config=client_config()) as client:
            segments = client.segments()
            data = bytearray()
            offset = 0
            while True:
                result = await segments.read(self.segment, offset)
                data += result.data
                offset += len(result.data)
                if not result.data or result.at_tail:
                    break
        events = list(iter_events(bytes(data)))
        assert len(events) == len(self.written), (len(events), len(self.written))
        for number, (got, expected) in enumerate(zip(events, self.written, strict=True)):
            assert got == expected, f"event {number} differs"


async def open_connection(port: int, index: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(hostile_address(index), 0))
