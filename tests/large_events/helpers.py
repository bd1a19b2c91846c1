"""Helpers for the large-event tests: a node in the test's own event loop (so its server's transient
segments can be inspected and swept), small sizes so a "large" event is a few kilobytes, tagged large
payloads whose bytes can be checked while they are streamed, and the events of a segment decoded
straight from its bytes (large ones included)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from millstream.client import (
    AsyncClient,
    ClientConfig,
    LargeEventConfig,
    ReaderConfig,
    RetentionPolicy,
    ScalingPolicy,
    StreamConfig,
)
from millstream.server import ServerConfig
from millstream.standalone import Node
from millstream.testing.history import EventTag

SCENARIO_TIMEOUT_SECONDS = 45.0

#: "Large" in these tests: more than 4 KiB is streamed through a transient segment, in 1 KiB chunks.
SMALL = LargeEventConfig(inline_bytes_max=4096, chunk_bytes=1024, unacked_bytes_max=4096)

#: Readers rebalance fast; events over 8 KiB are too large to hold.
READER = ReaderConfig(time_unit_seconds=0.02, heartbeat_seconds=0.05, offline_timeout_seconds=0.0,
                      tail_wait_seconds=0.5, event_in_memory_bytes_max=8192)

_HEADER = struct.Struct(">ii")


def run(scenario: Callable[[], Awaitable[None]], seconds: float = SCENARIO_TIMEOUT_SECONDS) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), seconds)
    asyncio.run(bounded())


def fast_client_config(**overrides: Any) -> ClientConfig:
    values: dict[str, Any] = dict(
        connect_timeout_seconds=2.0, request_timeout_seconds=5.0, append_ack_timeout_seconds=2.0,
        keepalive_interval_seconds=1.0, reconnect_attempts_max=10, reconnect_delay_initial_seconds=0.002,
        reconnect_delay_max_seconds=0.05)
    values.update(overrides)
    return ClientConfig(**values)


@contextlib.asynccontextmanager
async def node_and_client(data_dir: Path, *, seed: int = 1, **server: Any) -> AsyncIterator[tuple[Node, AsyncClient]]:
    """A node (segment store and controller) on this loop, and a seeded client of it."""
    config = ServerConfig(container_count=2, **server)
    node = Node(data_dir, config=config)
    await node.start()
    try:
        async with AsyncClient(node.uri, config=fast_client_config(), rng=random.Random(seed)) as client:
            yield node, client
        assert node.server is not None
        node.server.check_invariants()
    finally:
        await node.stop()


async def create_stream(client: AsyncClient, name: str, segments: int = 1) -> None:
    manager = client.stream_manager()
    await manager.create_scope(name.split("/", maxsplit=1)[0], exist_ok=True)
    await manager.create_stream(name, StreamConfig(scaling=ScalingPolicy.fixed(segments),
                                                   retention=RetentionPolicy.none()))


def large_payload(tag: EventTag, size: int, *, key: str | None = None) -> bytes:
    """``size`` bytes that start with ``tag`` (so the history checker knows the event by its first bytes)
    and go on with bytes drawn from a generator seeded by the tag (so every byte is checked)."""
    head = tag.payload(0, key=key)
    body = random.Random(f"{tag.writer}/{tag.sequence}").randbytes(max(0, size - len(head)))
    return (head + body)[:size] if size >= len(head) else head


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def decode_events(data: bytes) -> list[bytes]:
    """The payloads of a segment's bytes (whole events only; anything else fails the test)."""
    events, position = [], 0
    while position < len(data):
        assert len(data) - position >= _HEADER.size, f"a segment ends inside an event header at {position}"
        kind, length = _HEADER.unpack_from(data, position)
        assert kind == 0 and length >= 0, f"not an event at {position}: type {kind}, length {length}"
        end = position + _HEADER.size + length
        assert end <= len(data), f"a segment ends inside an event at {position}"
        events.append(data[position + _HEADER.size:end])
        position = end
    return events


async def segment_bytes(client: AsyncClient, segment: str) -> bytes:
    reader = client.byte_stream_reader(segment)
    data = bytearray()
    while True:
        chunk = await reader.read(1 << 20)
        if not chunk:
            break
        data += chunk
        if reader.at_tail:
            break
    await reader.close()
    return bytes(data)


async def stream_events(client: AsyncClient, stream: str) -> dict[str, list[bytes]]:
    """Each current segment's events, decoded from its bytes."""
    segments = await client.stream_manager().current_segments(stream)
    return {s.name: decode_events(await segment_bytes(client, s.name)) for s in segments.segments}
