"""A deliberately small client for the server's tests: wire commands over raw asyncio streams.

It is not a client library (that is ``millstream.client``'s job): it sends exactly the commands or
bytes a test gives it and hands back exactly what arrives, so a test can break the protocol on
purpose and the server's tests never depend on the client's behaviour.  Also here: servers on the
two kinds of tiers (FileLog + FileChunkStorage in a temp dir; the simulated log and chunk storage),
and a bounded ``run`` for async scenarios.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.wire import (
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    Command,
    Decoder,
    Hello,
    KeepAlive,
    encode,
    encode_event,
)

SCENARIO_TIMEOUT_SECONDS = 30.0
REPLY_TIMEOUT_SECONDS = 5.0


def run(scenario: Callable[[], Awaitable[None]], seconds: float = SCENARIO_TIMEOUT_SECONDS) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), seconds)
    asyncio.run(bounded())


def events(*payloads: bytes) -> bytes:
    """A block's data: the payloads as framed events."""
    return b"".join(encode_event(p) for p in payloads)


def block(writer_id: UUID, last_event_number: int, payloads: list[bytes], request_id: int = 1) -> AppendBlock:
    return AppendBlock(writer_id, last_event_number, len(payloads), request_id, events(*payloads))


class ConnectionClosed(AssertionError):
    """The server closed the connection while a test waited for a reply."""


class RawClient:
    """One connection to a server: send commands or bytes, receive commands (KeepAlives skipped)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = Decoder()
        self.received: list[Command] = []  # decoded, not yet handed out
        self.keepalives = 0
        self.server_hello: Hello | None = None

    @classmethod
    async def connect(cls, port: int, *, hello: bool = True, ssl_context: ssl.SSLContext | None = None,
                      server_hostname: str | None = None) -> RawClient:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ssl_context, server_hostname=server_hostname if ssl_context else None)
        client = cls(reader, writer)
        first = await client.receive()
        assert isinstance(first, Hello), first
        client.server_hello = first
        if hello:
            await client.send(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
        return client

    async def send(self, *commands: Command) -> None:
        self.writer.write(b"".join(encode(c) for c in commands))
        await self.writer.drain()

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self, seconds: float = REPLY_TIMEOUT_SECONDS, *, keepalive: bool = False) -> Command:
        """The next command (skipping KeepAlives unless ``keepalive``).  Raises ``ConnectionClosed``
        at end of stream and ``TimeoutError`` if nothing arrives in time."""
        async with asyncio.timeout(seconds):
            while True:
                while self.received:
                    command = self.received.pop(0)
                    if isinstance(command, KeepAlive):
                        self.keepalives += 1
                        if not keepalive:
                            continue
                    return command
                data = await self.reader.read(1 << 20)
                if not data:
                    raise ConnectionClosed("the server closed the connection")
                self.received.extend(self.decoder.feed(data))

    async def request(self, command: Command, seconds: float = REPLY_TIMEOUT_SECONDS) -> Command:
        await self.send(command)
        return await self.receive(seconds)

    async def receive_many(self, count: int, seconds: float = REPLY_TIMEOUT_SECONDS) -> list[Command]:
        return [await self.receive(seconds) for _ in range(count)]

    async def expect_closed(self, seconds: float = REPLY_TIMEOUT_SECONDS) -> list[Command]:
        """Everything the server sent before it closed the connection (fails if it does not close)."""
        replies: list[Command] = []
        with contextlib.suppress(ConnectionClosed, ConnectionResetError):
            while True:
                replies.append(await self.receive(seconds))
        return replies

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


class Tiers:
    """Opens Tier 1 and Tier 2 for a server: ``files`` (FileLog per container + FileChunkStorage under
    a directory) or ``simulated`` (SimulatedDurableDataLog + SimulatedChunkStorage).  The same
    ``Tiers`` serves a restarted server the data of the last one."""

    def __init__(self, kind: str, directory: Path | None = None) -> None:
        self.kind = kind
        self.directory = directory
        self.log_storages: dict[int, SimulatedLogStorage] = {}
        self.logs: dict[int, list[Any]] = {}
        self.chunk_storage: Any = None

    def open_log(self, container_id: int) -> Any:
        if self.kind == "files":
            assert self.directory is not None
            log: Any = FileLog(self.directory / f"container-{container_id}")
        else:
            storage = self.log_storages.setdefault(container_id, SimulatedLogStorage())
            log = SimulatedDurableDataLog(storage)
        self.logs.setdefault(container_id, []).append(log)
        return log

    def open_chunk_storage(self) -> Any:
        if self.kind == "files":
            assert self.directory is not None
            return FileChunkStorage(self.directory / "tier2")
        if self.chunk_storage is None:
            self.chunk_storage = SimulatedChunkStorage(rng=random.Random(7))
        return self.chunk_storage


@contextlib.asynccontextmanager
async def serving(tiers: Tiers, *, config: ServerConfig | None = None, **options: Any) -> AsyncIterator[
        SegmentStoreServer]:
    """A started server on ``tiers`` (with Tier 2), stopped (and checked) on the way out."""
    chunk_storage = tiers.open_chunk_storage()
    server = SegmentStoreServer(tiers.open_log, config=config, chunk_storage=chunk_storage, **options)
    await server.start()
    try:
        yield server
        server.check_invariants()
    finally:
        await server.stop()
        if tiers.kind == "files":
            await chunk_storage.close()
