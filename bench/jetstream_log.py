"""JetStreamLog beside raw nats-py on the same three-server JetStream cluster (replicas 3, sync always).

Not wired into a suite (issue 23's cluster bench is ``millstream bench --suite cluster``, later): run it
from a clone with ``python -m bench.jetstream_log [--rounds N]``.  Each round measures, interleaved, the
same messages written two ways to a fresh stream of the same cluster:

* ``JetStreamLog``: a DurableLog-like loop -- ``append()`` without waiting, at most ``--window``
  records unacknowledged (as the DurableLog bounds its frames in flight), every future awaited;
* raw nats-py: ``publish_async`` of the same payloads with at most ``--window`` in flight, on a stream
  with the same configuration, no expected-last-sequence header (no fencing, no ordering guarantee
  after a failure).

It prints records/s and MB/s per round and the medians, and the ratio log / raw of the medians (A/B in
the same run, so machine load affects both alike).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StorageType, StreamConfig

from millstream.limits import KIB, MIB
from millstream.segmentstore.jetstream_log import JetStreamLog
from millstream.testing.nats_cluster import NatsCluster

#: (label, payload bytes, records per measurement): about 1-2 s each here.
SIZES = [("1 KB frames", KIB, 5000), ("1 MiB frames", MIB, 150)]


async def _log_loop(urls: list[str], container_id: int, payload: bytes, count: int, window: int) -> float:
    log = JetStreamLog(urls, container_id, cluster_name="bench", replicas=3)
    await log.initialize()
    room = asyncio.Semaphore(window)  # as nats-py bounds publish_async: the same cost on both sides
    futures = []
    started = time.perf_counter()
    for _ in range(count):
        await room.acquire()
        futures.append(log.append(payload, lambda _future: room.release()))
    for future in futures:
        await future
    elapsed = time.perf_counter() - started
    await log.close()
    return elapsed


async def _raw_loop(urls: list[str], stream: str, payload: bytes, count: int, window: int) -> float:
    connection = await nats.connect(urls)
    jetstream = connection.jetstream(publish_async_max_pending=window)
    await jetstream.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.x"], num_replicas=3,
                                            storage=StorageType.FILE))
    futures = []
    started = time.perf_counter()
    for _ in range(count):
        futures.append(await jetstream.publish_async(f"{stream}.x", payload))
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await connection.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=64, help="records in flight (both ways)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, NatsCluster(Path(directory), size=3) as cluster:
        urls = cluster.client_urls
        stream_number = 0
        for label, size, count in SIZES:
            payload = bytes(size)
            results: dict[str, list[float]] = {"JetStreamLog": [], "raw nats-py": []}
            for _round in range(arguments.rounds):
                stream_number += 1
                runs: list[tuple[str, Coroutine[Any, Any, float]]] = [
                    ("JetStreamLog", _log_loop(urls, stream_number, payload, count, arguments.window)),
                    ("raw nats-py", _raw_loop(urls, f"RAW{stream_number}", payload, count, arguments.window)),
                ]
                if _round % 2:
                    runs.reverse()  # alternate which goes first
                for name, run in runs:
                    elapsed = asyncio.run(run)
                    results[name].append(count / elapsed)
                    print(f"{label:13} {name:13} round {_round + 1}: {count / elapsed:9.0f} records/s "
                          f"{count * size / elapsed / MIB:7.1f} MiB/s", flush=True)
            medians = {name: statistics.median(values) for name, values in results.items()}
            for name, value in medians.items():
                print(f"{label:13} {name:13} median: {value:9.0f} records/s {value * size / MIB:7.1f} MiB/s")
            print(f"{label:13} ratio JetStreamLog / raw nats-py (medians): "
                  f"{medians['JetStreamLog'] / medians['raw nats-py']:.2f}")


if __name__ == "__main__":
    main()
