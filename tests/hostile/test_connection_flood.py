"""4,096 hostile connections against a real node while a normal client writes (issue 19, evidence):
the normal client's writes succeed and read back byte for byte, and the node's resident memory --
read from outside the process -- grows by less than 128 MiB.  The figures are printed (``-s``).

The hostile connections come from loopback addresses other than the normal client's (127.0.0.2 and
up, under the per-address limit), so what binds is the node's global limit: the normal client, which
connected first, keeps its connections.  They are, in turn:

* idle: Hello, then nothing;
* silent: not even a Hello;
* announcing: Hello and a frame header announcing 16 MiB, then 100 bytes of it;
* announcing before Hello: the same without a Hello (refused at the header, closed at once);
* dripping: Hello and the first bytes of a frame, then one more byte per round;
* sending: Hello and the first 256 KiB of a real 1 MiB frame, then nothing (bytes the node must
  hold, within its receive budget).

Nothing waits for a duration: the steps follow each other as fast as the machine goes, and the node's
deadlines (10 s for a Hello, 30 s for a frame or an idle connection) may close some hostile
connections on a slow machine -- which only makes the node's life easier; the count still open is
printed."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from pathlib import Path

import pytest

from millstream.client import AsyncClient
from millstream.server._memory import trimming_available
from millstream.wire import FRAME_BYTES_MAX, AppendBlockPart, CreateSegment, encode
from tests.hostile.node import HELLO, Node, NormalClient, client_config, node, open_connection, raise_open_files_limit

MIB = 1024 * 1024
HEADER = struct.Struct(">ii")
HOSTILE = 4096
GROWTH_LIMIT_BYTES = 128 * MIB
#: Connections opened at once (the node's accept backlog is 100).
OPENING_CONCURRENCY = 64
DRIP_ROUNDS = 4
EVENTS_PER_ROUND = 250
FLOOD_TIMEOUT_SECONDS = 600.0
#: The node gives memory back within a housekeeping tick (1 s) of the closes; a loaded machine may
#: take much longer to get there.
RETURN_TIMEOUT_SECONDS = 120.0
#: ... and gives back at least this share of what the flood made it grow (the rest: allocator arenas
#: still holding a few live objects each, reused by the next connections).
RETURNED_SHARE = 0.4
#: Enough descriptors for 4,096 sockets on each side, and the node's own files.
OPEN_FILES = 2 * HOSTILE + 1024

KINDS = ("idle", "silent", "announcing", "announcing-before-hello", "dripping", "sending")
WEIGHTS = (1024, 512, 1024, 256, 1216, 64)
assert sum(WEIGHTS) == HOSTILE
DRIP_FRAME = encode(CreateSegment(1, "hostile/drip/0", ""))


def plan() -> list[str]:
    kinds = [kind for kind, weight in zip(KINDS, WEIGHTS, strict=True) for _ in range(weight)]
    # Interleave the kinds (a stable shuffle), so every address and every moment sees all of them.
    return [kinds[(index * 2654435761) % HOSTILE] for index in range(HOSTILE)] if HOSTILE & (HOSTILE - 1) == 0 \
        else kinds


def first_bytes(kind: str) -> bytes:
    if kind == "idle":
        return HELLO
    if kind == "silent":
        return b""
    if kind == "announcing":
        return HELLO + HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(100)
    if kind == "announcing-before-hello":
        return HEADER.pack(AppendBlockPart.TYPE, FRAME_BYTES_MAX) + bytes(100)
    if kind == "dripping":
        return HELLO + DRIP_FRAME[:5]
    assert kind == "sending"
    return HELLO + HEADER.pack(AppendBlockPart.TYPE, MIB) + bytes(256 * 1024)


def test_4096_hostile_connections_while_a_normal_client_writes(tmp_path: Path) -> None:
    available = raise_open_files_limit(OPEN_FILES)
    if available < OPEN_FILES:
        pytest.skip(f"needs {OPEN_FILES} open files per process; the hard limit allows {available}")
    with node(tmp_path) as started:
        asyncio.run(asyncio.wait_for(flood(started), FLOOD_TIMEOUT_SECONDS))


async def flood(started: Node) -> None:
    normal = NormalClient(started.uri, started.token, "hostile/normal/0")
    samples: dict[str, int] = {}

    def sample(moment: str) -> None:
        samples[moment] = started.rss_bytes()

    async with AsyncClient(started.uri, config=client_config()) as client:
        await client.segments().create(normal.segment)
        writer = client.event_writer([normal.segment])

        async def write_round() -> None:
            batch = [normal.payload(len(normal.written) + n) for n in range(EVENTS_PER_ROUND)]
            batch.append(bytes([len(normal.written) % 256]) * 200_000)
            for payload in batch:
                await writer.write_event(payload)
            await writer.flush()  # every event acknowledged, durable
            normal.written.extend(batch)

        await write_round()  # warm: the node's caches, the client's connections
        await normal.read_back()
        sample("before")

        kinds = plan()
        hostile: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, str]] = []
        refused = 0
        gate = asyncio.Semaphore(OPENING_CONCURRENCY)

        async def open_one(index: int) -> None:
            nonlocal refused
            async with gate:
                try:
                    reader, stream = await open_connection(started.port, index)
                    await reader.readexactly(len(HELLO))  # the node's Hello: later, EOF means it closed
                except (OSError, asyncio.IncompleteReadError):
                    refused += 1
                    return
                data = first_bytes(kinds[index])
                if data:
                    stream.write(data)
                    with contextlib.suppress(ConnectionError):
                        await stream.drain()
                hostile.append((reader, stream, kinds[index]))

        await asyncio.gather(*(open_one(index) for index in range(HOSTILE)))
        sample("flooded")
        for drip in range(DRIP_ROUNDS):
            for _reader, stream, kind in hostile:
                if kind == "dripping" and not stream.is_closing():
                    stream.write(DRIP_FRAME[5 + drip:6 + drip])
            await write_round()
            sample(f"round {drip}")
        open_now = sum(1 for reader, _stream, _kind in hostile if not reader.at_eof())
        await normal.read_back()
        sample("read back")
        await writer.close()

        # Hang up: half-close each, and wait until the node has closed its side (EOF on ours).
        for _reader, stream, _kind in hostile:
            with contextlib.suppress(OSError):
                if not stream.is_closing():
                    stream.write_eof()
        for reader, stream, _kind in hostile:
            with contextlib.suppress(OSError):
                while await reader.read(1 << 16):
                    pass
            stream.close()
        await normal.read_back()
        sample("closed")
        # The node gives the freed pages back at its next housekeeping tick (where the C library can):
        # wait for it to come down by at least RETURNED_SHARE of its growth.
        if trimming_available():
            peak = max(samples.values())
            target = peak - int((peak - samples["before"]) * RETURNED_SHARE)
            async with asyncio.timeout(RETURN_TIMEOUT_SECONDS):
                while started.rss_bytes() > target:
                    await normal.read_back()  # (a round trip between looks; no sleeping)
            sample("given back")

    assert started.alive(), started.stderr_tail()
    before = samples["before"]
    during = {moment: rss for moment, rss in samples.items() if moment not in ("closed", "given back")}
    peak_moment, peak = max(during.items(), key=lambda item: item[1])
    growth = peak - before
    events = len(normal.written)
    print(f"\n{HOSTILE} hostile connections ({', '.join(f'{w} {k}' for k, w in zip(KINDS, WEIGHTS, strict=True))}): "
          f"{len(hostile)} connected ({refused} refused at connect), {open_now} still open after the rounds; "
          f"the normal client wrote and read back {events} events.\n"
          f"node RSS {before / MIB:.1f} MiB before, peak {peak / MIB:.1f} MiB ({peak_moment}), growth "
          f"{growth / MIB:.1f} MiB (limit {GROWTH_LIMIT_BYTES / MIB:.0f}); {samples['closed'] / MIB:.1f} MiB when "
          f"the hostile connections had closed, {samples.get('given back', 0) / MIB:.1f} MiB once given back.  "
          f"Samples: "
          + ", ".join(f"{moment} {rss / MIB:.1f}" for moment, rss in samples.items()))
    assert growth < GROWTH_LIMIT_BYTES, f"the node grew by {growth / MIB:.1f} MiB"
