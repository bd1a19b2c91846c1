"""The issue's memory findings, reproduced at small scale against a real node (issue 19, items 1 and
2), its resident memory read from outside the process:

* frames announcing 16 MiB each made the node allocate 16 MiB at once, before a byte of them came
  (48 connections: +694 MiB) -- here 8 connections must not cost 8 x 16 MiB;
* idle connections cost 256 KiB each (4,096: ~1 GiB), not all given back when they closed -- here
  1,024 must cost a few KiB each, and opening them again must reuse what the first ones used.

Figures are printed (``-s`` shows them) so the issue's closing note can quote them.  Nothing here
waits for a duration: each step waits for a condition -- a reply, a closed socket -- within a
generous bound."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from pathlib import Path

import pytest

from millstream.wire import FRAME_BYTES_MAX, AppendBlockPart
from tests.hostile.node import HELLO, Node, NormalClient, node, open_connection, raise_open_files_limit

MIB = 1024 * 1024
HEADER = struct.Struct(">ii")
#: How long a step may wait for a condition (a loaded CI machine is slow; nothing waits this long
#: when things work).
STEP_TIMEOUT_SECONDS = 120.0


def run(coroutine: object) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS)  # type: ignore[arg-type]
    asyncio.run(bounded())


async def settled(normal: NormalClient) -> None:
    """The node has dealt with everything sent before: a few round trips of a normal client."""
    for _ in range(3):
        await normal.read_back()


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Whether the node closes the connection (what it sends before -- its Hello -- is skipped)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(1 << 16):
            pass
    return reader.at_eof() or reader.exception() is not None


@pytest.fixture
def warm_node(tmp_path: Path) -> tuple[Node, NormalClient]:
    raise_open_files_limit(4096)
    with node(tmp_path) as started:
        normal = NormalClient(started.uri, started.token, "hostile/normal/0")
        run(normal.write(200, large=2))
        run(settled(normal))
        yield started, normal  # type: ignore[misc]


def test_frames_announcing_16_mib_do_not_make_the_node_allocate_them(warm_node: tuple[Node, NormalClient]) -> None:
    started, normal = warm_node
    connections = 8
    before = started.rss_bytes()

    async def scenario() -> list[asyncio.StreamWriter]:
        writers = []
        for index in range(connections):
            _reader, writer = await open_connection(started.port, index)
            writer.write(HELLO + HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(100))
            await writer.drain()
            writers.append(writer)
        await settled(normal)
        return writers

    loop = asyncio.new_event_loop()
    try:
        writers = loop.run_until_complete(asyncio.wait_for(scenario(), STEP_TIMEOUT_SECONDS))
        during = started.rss_bytes()
        for writer in writers:
            writer.close()
    finally:
        loop.close()
    growth = during - before
    print(f"\n{connections} connections announcing {FRAME_BYTES_MAX + 8} bytes each: RSS {before / MIB:.1f} MiB "
          f"-> {during / MIB:.1f} MiB ({growth / MIB:+.1f} MiB; allocating the announced lengths would be "
          f"+{connections * 16} MiB)")
    assert growth < 16 * MIB, f"the node grew by {growth / MIB:.1f} MiB"
    assert started.alive()
    run(normal.write(10))
    run(normal.read_back())


def test_a_frame_too_large_before_authentication_is_refused_at_its_header(
        warm_node: tuple[Node, NormalClient]) -> None:
    started, normal = warm_node
    before = started.rss_bytes()

    async def scenario() -> None:
        for index in range(8):
            reader, writer = await open_connection(started.port, index)
            writer.write(HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(100))  # no Hello
            await writer.drain()
            assert await closed_by_peer(reader), "the node closes the connection"
            writer.close()

    run(scenario())
    assert started.rss_bytes() - before < 8 * MIB
    run(normal.write(10))
    run(normal.read_back())


def test_idle_connections_cost_little_and_their_memory_is_reused(warm_node: tuple[Node, NormalClient]) -> None:
    started, normal = warm_node
    connections = 1024
    figures: list[tuple[int, int]] = []  # (RSS with the connections open, RSS after they closed)

    async def cycle() -> None:
        pairs = []
        for index in range(connections):
            reader, writer = await open_connection(started.port, index)
            writer.write(HELLO)
            pairs.append((reader, writer))
        for _reader, writer in pairs:
            await writer.drain()
        await settled(normal)
        opened = started.rss_bytes()
        for _reader, writer in pairs:
            writer.close()
        await settled(normal)
        figures.append((opened, started.rss_bytes()))

    before = started.rss_bytes()
    for _ in range(3):
        run(cycle())
    (open_1, closed_1), (open_2, closed_2), (open_3, closed_3) = figures
    print(f"\n{connections} idle connections: RSS {before / MIB:.1f} MiB -> {open_1 / MIB:.1f} MiB open "
          f"({(open_1 - before) / 1024 / connections:.1f} KiB each) -> {closed_1 / MIB:.1f} MiB closed; "
          f"twice more: {open_2 / MIB:.1f}/{closed_2 / MIB:.1f}, {open_3 / MIB:.1f}/{closed_3 / MIB:.1f} MiB")
    assert open_1 - before < 32 * MIB, "a few KiB per connection, not a 256 KiB buffer each"
    # What the first connections used is reused by the next ones, not added to.
    assert open_3 - open_1 < 8 * MIB and closed_3 - closed_1 < 8 * MIB, figures
    assert started.alive()
    run(normal.write(10))
    run(normal.read_back())
