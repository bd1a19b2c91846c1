"""Client throughput and write latency against ``millstream standalone`` in a separate process.

Not a test (pytest does not collect it): the measurement behind the client's performance figures.

    python tests/client/measure_throughput.py [SECONDS] [CASE...]     # CASE: async-100-1, sync-10000-1, ...
    python tests/client/measure_throughput.py --latency RATE,SIZE,SEGMENTS ...
    python tests/client/measure_throughput.py --streams [SECONDS] [ROUNDS]

For each case it starts a node on a temporary data directory (FileLog: write + fdatasync before every
acknowledgement), writes SIZE-byte events as fast as ``write_event`` takes them for SECONDS (one writer
over SEGMENTS segments; with several segments every event has a routing key), flushes, and prints
events/s, MB/s and the CPU seconds each process spent per event -- a side bound by its core shows it
there even on a busy machine, where the wall-clock figures are not to be trusted (the load average is
printed beside them).  ``--latency`` paces one writer at RATE events/s and prints the p50/p95/p99 time
from ``write_event_future`` to the event being durable.

``--streams`` measures what routing keys cost a stream writer (``event_writer("scope/stream")``):
100-byte events into a stream of 1 or 16 segments, without keys (spread round robin) and with
10,000 random keys (each event draws one; the draws are made before the clock starts), in both
flavours, ROUNDS times each with the cases interleaved (so a burst of load on a shared machine hits
every case alike).  It prints every run, then per case the best events/s and the median client CPU
per event, and the keyed/keyless ratio of each: the promise is that keys cost under 10%.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import millstream
from millstream.client import AsyncClient

CASES = [("async", 100, 1), ("sync", 100, 1), ("async", 100, 16), ("sync", 100, 16), ("async", 10_000, 1),
         ("sync", 10_000, 1)]


def cpu_seconds_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_server(data: str) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-c", "from millstream.cli import main; main()", "standalone", "--data-dir", data, "--port",
         "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdout is not None
    match = re.search(r"tcp://\S+", server.stdout.readline())
    assert match is not None, "the node did not say where it listens"
    return server, match.group(0)


async def write_async(uri: str, names: list[str], size: int, seconds: float) -> tuple[int, float]:
    async with AsyncClient(uri) as client:
        for name in names:
            await client.segments().create(name)
        writer = client.event_writer(names)
        payload = b"x" * size
        keys = [f"k{i}" for i in range(1000)] if len(names) > 1 else [None] * 1000
        count = 0
        started = time.perf_counter()
        write = writer.write_event
        while time.perf_counter() < started + seconds:
            for key in keys:
                await write(payload, routing_key=key)
            count += len(keys)
        await writer.close()
        return count, time.perf_counter() - started


def write_blocking(uri: str, names: list[str], size: int, seconds: float) -> tuple[int, float]:
    with millstream.connect(uri) as client:
        for name in names:
            client.segments().create(name)
        writer = client.event_writer(names)
        payload = b"x" * size
        keys = [f"k{i}" for i in range(1000)] if len(names) > 1 else [None] * 1000
        count = 0
        started = time.perf_counter()
        write = writer.write_event
        while time.perf_counter() < started + seconds:
            for key in keys:
                write(payload, routing_key=key)
            count += len(keys)
        writer.close()
        return count, time.perf_counter() - started


async def paced(uri: str, rate: int, size: int, seconds: float, segments: int) -> None:
    async with AsyncClient(uri) as client:
        names = [f"latency/{time.time_ns()}/{i}.#epoch.0" for i in range(segments)]
        for name in names:
            await client.segments().create(name)
        writer = client.event_writer(names)
        payload = b"x" * size
        keys = [f"k{i}" for i in range(1000)]
        latencies: list[tuple[float, int]] = []  # (latency, how many events had it)
        clock = time.perf_counter
        started = clock()
        sent = 0
        write = writer.write_event_future
        while clock() - started < seconds:
            due = int((clock() - started) * rate) - sent
            now = clock()
            shared: dict[int, list[object]] = {}  # the events of a block share a future: one callback each
            for i in range(due):
                key = keys[(sent + i) % 1000] if segments > 1 else None
                future = await write(payload, routing_key=key)
                entry = shared.get(id(future))
                if entry is None:
                    shared[id(future)] = [future, 1]
                else:
                    entry[1] += 1  # type: ignore[operator]
            for future, count in shared.values():
                future.add_done_callback(  # type: ignore[attr-defined]
                    lambda _, t=now, n=count: latencies.append((clock() - t, n)))
            sent += due
            await asyncio.sleep(0.001)
        await writer.flush()
        elapsed = clock() - started
        await writer.close()
    latencies.sort()
    total = sum(count for _, count in latencies)

    def quantile(p: float) -> float:
        seen = 0
        for latency, count in latencies:
            seen += count
            if seen >= p * total:
                return latency * 1000
        return latencies[-1][0] * 1000

    print(f"paced {rate:,}/s x {size} B x {segments} seg: achieved {sent / elapsed:,.0f}/s; write latency ms "
          f"p50 {quantile(.5):.2f} p95 {quantile(.95):.2f} p99 {quantile(.99):.2f} | load {os.getloadavg()[0]:.1f}",
          flush=True)


STREAM_KEYS = 10_000
STREAM_CASES = [(mode, segments, keyed) for mode in ("async", "sync") for segments in (1, 16)
                for keyed in (False, True)]


def key_draws(keyed: bool) -> list[str | None]:
    """What each event's routing key is: a precomputed cycle of 100,003 draws from 10,000 random keys."""
    if not keyed:
        return [None] * 1000
    rng = random.Random(7)
    keys = [f"device-{rng.randrange(10**12):012d}" for _ in range(STREAM_KEYS)]
    return [rng.choice(keys) for _ in range(100_003)]


async def stream_async(uri: str, stream: str, keys: list[str | None], seconds: float) -> tuple[int, float]:
    async with AsyncClient(uri) as client:
        writer = client.event_writer(stream)
        payload = b"x" * 100
        await writer.write_event(payload)  # learn the stream's segments before the clock starts
        count = 0
        started = time.perf_counter()
        write = writer.write_event
        while time.perf_counter() < started + seconds:
            for key in keys:
                await write(payload, routing_key=key)
            count += len(keys)
        await writer.close()
        return count, time.perf_counter() - started


def stream_blocking(uri: str, stream: str, keys: list[str | None], seconds: float) -> tuple[int, float]:
    with millstream.connect(uri) as client:
        writer = client.event_writer(stream)
        payload = b"x" * 100
        count = 0
        started = time.perf_counter()
        write = writer.write_event
        while time.perf_counter() < started + seconds:
            for key in keys:
                write(payload, routing_key=key)
            count += len(keys)
        writer.close()
        return count, time.perf_counter() - started


def measure_streams(server: subprocess.Popen[str], uri: str, seconds: float, rounds: int) -> None:
    with millstream.connect(uri) as client:
        manager = client.stream_manager()
        manager.create_scope("bench", exist_ok=True)
        for segments in (1, 16):
            manager.create_stream(f"bench/s{segments}", millstream.StreamConfig(
                scaling=millstream.ScalingPolicy.fixed(segments)), exist_ok=True)
    draws = {keyed: key_draws(keyed) for keyed in (False, True)}
    results: dict[tuple[str, int, bool], list[tuple[float, float]]] = {case: [] for case in STREAM_CASES}
    for round_number in range(rounds):
        for mode, segments, keyed in STREAM_CASES:
            stream = f"bench/s{segments}"
            server_before, client_before = cpu_seconds_of(server.pid), own_cpu_seconds()
            count, elapsed = (asyncio.run(stream_async(uri, stream, draws[keyed], seconds)) if mode == "async"
                              else stream_blocking(uri, stream, draws[keyed], seconds))
            server_cpu = cpu_seconds_of(server.pid) - server_before
            client_cpu = own_cpu_seconds() - client_before
            results[(mode, segments, keyed)].append((count / elapsed, 1e6 * client_cpu / count))
            print(f"round {round_number + 1}: {mode:5} 100 B x {segments:2d} seg, "
                  f"{'10,000 keys' if keyed else 'no keys    '}: {count / elapsed:10,.0f} ev/s | client "
                  f"{1e6 * client_cpu / count:5.2f} us/ev, server {1e6 * server_cpu / count:5.2f} us/ev | load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    # On a shared machine the wall clock mostly measures the neighbours: the best run and the least
    # client CPU per event are the least disturbed figures.
    print("\ncase                          best ev/s  client us/ev (min, median)   keyed/keyless: best ev/s, min us/ev")
    for mode, segments, keyed in STREAM_CASES:
        runs = results[(mode, segments, keyed)]
        best = max(rate for rate, _ in runs)
        least = min(us for _, us in runs)
        line = (f"{mode:5} {segments:2d} seg {'10,000 keys' if keyed else 'no keys    '}  {best:11,.0f}  "
                f"{least:8.2f} {statistics.median(us for _, us in runs):8.2f}")
        if keyed:
            plain = results[(mode, segments, False)]
            line += (f"               {best / max(rate for rate, _ in plain):6.3f}  "
                     f"{least / min(us for _, us in plain):6.3f}")
        print(line, flush=True)


def main(arguments: list[str]) -> None:
    with tempfile.TemporaryDirectory() as data:
        server, uri = start_server(data)
        try:
            if arguments[:1] == ["--streams"]:
                seconds = float(arguments[1]) if len(arguments) > 1 else 5.0
                measure_streams(server, uri, seconds, int(arguments[2]) if len(arguments) > 2 else 3)
                return
            if arguments[:1] == ["--latency"]:
                for spec in arguments[1:]:
                    rate, size, segments = map(int, spec.split(","))
                    asyncio.run(paced(uri, rate, size, 5.0, segments))
                return
            seconds = float(arguments[0]) if arguments else 5.0
            chosen = [case for case in CASES if not arguments[1:] or "-".join(map(str, case)) in arguments[1:]]
            for index, (mode, size, segments) in enumerate(chosen):
                names = [f"bench/run{index}/{i}.#epoch.0" for i in range(segments)]
                server_before, client_before = cpu_seconds_of(server.pid), own_cpu_seconds()
                count, elapsed = (asyncio.run(write_async(uri, names, size, seconds)) if mode == "async"
                                  else write_blocking(uri, names, size, seconds))
                server_cpu = cpu_seconds_of(server.pid) - server_before
                client_cpu = own_cpu_seconds() - client_before
                print(f"{mode:5} {size:6d} B x {segments:2d} seg: {count / elapsed:10,.0f} ev/s "
                      f"{count * size / elapsed / 1e6:7.1f} MB/s | client {1e6 * client_cpu / count:6.2f} us/ev "
                      f"({client_cpu / elapsed:4.0%} core), server {1e6 * server_cpu / count:6.2f} us/ev "
                      f"({server_cpu / elapsed:4.0%} core) | load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main(sys.argv[1:])
