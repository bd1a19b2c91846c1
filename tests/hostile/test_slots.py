"""The issue's lockout, reproduced against a real node with its default settings (issue 19, item 2):
4,096 idle connections from one address took every slot, and a real client was refused ("connection
reset").  Now one address gets at most ``SERVER_CONNECTIONS_PER_ADDRESS_MAX`` of them; the rest are
refused, and a client from elsewhere still gets in and is served."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from millstream import limits
from millstream.wire import CreateSegment, Decoder, GetSegmentInfo, SegmentCreated, encode
from tests.hostile.node import HELLO, node, raise_open_files_limit

HOGS = limits.SERVER_CONNECTIONS_MAX
OPEN_FILES = 2 * HOGS + 1024
OPENING_CONCURRENCY = 64
TIMEOUT_SECONDS = 300.0


async def hog(port: int, gate: asyncio.Semaphore) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """One idle connection from 127.0.0.2 (Hello, then nothing); None if it could not even start."""
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        writer.write(HELLO)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await writer.drain()
            await reader.readexactly(len(HELLO))  # the node's Hello (a refused connection ends after it)
            return reader, writer
        writer.close()
        return None


async def still_served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the node still serves this connection: a request gets its reply (not EOF, not a reset)."""
    with contextlib.suppress(OSError):
        writer.write(encode(GetSegmentInfo(1, "slots/probe/0", "")))
        await writer.drain()
        decoder = Decoder()
        while data := await reader.read(1 << 16):
            if decoder.feed(data):
                return True
    return False


def test_one_address_cannot_lock_out_other_clients(tmp_path: Path) -> None:
    available = raise_open_files_limit(OPEN_FILES)
    if available < OPEN_FILES:
        pytest.skip(f"needs {OPEN_FILES} open files per process; the hard limit allows {available}")

    async def scenario(port: int) -> None:
        gate = asyncio.Semaphore(OPENING_CONCURRENCY)
        hogs = [c for c in await asyncio.gather(*(hog(port, gate) for _ in range(HOGS))) if c is not None]
        # A client from another address gets in and is served.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HELLO + encode(CreateSegment(1, "slots/bystander/0", "")))
        await writer.drain()
        decoder, replies = Decoder(), []
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while len(replies) < 2:
                data = await reader.read(1 << 16)
                assert data, "the node refused a client from another address: one address took every slot"
                replies += decoder.feed(data)
        assert replies[1] == SegmentCreated(1, "slots/bystander/0"), replies
        writer.close()
        # The node refused the hogs past the per-address limit (it closed them after its Hello).
        served = sum(await asyncio.gather(*(still_served(reader, stream) for reader, stream in hogs)))
        print(f"\n{HOGS} idle connections from 127.0.0.2: the node kept {served} (limit "
              f"{limits.SERVER_CONNECTIONS_PER_ADDRESS_MAX} per address); a client from 127.0.0.1 was served")
        assert 0 < served <= limits.SERVER_CONNECTIONS_PER_ADDRESS_MAX
        for _reader, stream in hogs:
            stream.close()

    with node(tmp_path) as started:
        asyncio.run(asyncio.wait_for(scenario(started.port), TIMEOUT_SECONDS))
        assert started.alive()
