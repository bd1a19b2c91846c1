"""The cluster measurement (issue 23): 100-byte events into a three-node cluster with replicas 3, beside
JetStream R3 publishing the same events one message each, and beside ``millstream standalone`` -- all
in the same run, interleaved.

Run from a clone: ``python -m bench --suite cluster [--repeat R] [--markdown BENCHMARKS.md]`` (its
section of that file is replaced), or ``python -m bench.cluster [--events N] [--repeats R] [--data-dir D]``
for the raw figures as JSON.

What runs.  ``millstream cluster up --nodes 3`` (ZooKeeper, three NATS servers in a JetStream cluster
with ``sync_interval: always``, three node processes, each container's Tier-1 a JetStream stream with
replicas 3), and a ``millstream standalone`` node (FileLog, fdatasync before each acknowledgement),
each in processes of their own; this process is the client of all three.

* millstream (cluster and standalone): one ``AsyncEventStreamWriter`` on a stream of ``SEGMENTS``
  fixed segments (spread over the cluster's nodes), a routing key per event from ``KEYS`` keys, as fast
  as it goes -- pipelined, one flush at the end; the cluster client is given the nodes as seeds.
* JetStream R3: one nats-py connection to the same NATS cluster, a stream with replicas 3, each event
  one ``publish_async`` with at most ``JETSTREAM_IN_FLIGHT_MAX`` publishes awaiting their
  acknowledgement, then ``publish_async_completed``.

Events/s is the events of a window over the time until its last acknowledgement.  The three run in
turn in every repeat (the order rotating), and the report gives each one's median and the ratios of
medians: cluster over JetStream (the issue's target: at least 5), cluster over standalone (the cost
of replication).  The machine is shared: the figures are one run's, to be read as ratios.  Every wait
is bounded (``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS`` per call, ``READY_SECONDS`` for the
cluster to come up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from bench import _suite
from bench._suite import bounded, standalone_server
from bench.limits import BENCH_DRIVER_CALL_TIMEOUT_SECONDS

__all__ = ["ClusterUp", "main", "render_cluster_markdown", "replace_section", "run_cluster", "section_of"]

EVENT_BYTES: Final = 100
SEGMENTS: Final = 4
KEYS: Final = 1_000
#: The issue's bound on JetStream's asynchronous publishes awaiting acknowledgement.
JETSTREAM_IN_FLIGHT_MAX: Final = 1_000
#: A bound on ``cluster up`` getting ready, and on it stopping (ZooKeeper, three NATS servers and three
#: Python processes on a loaded machine).
READY_SECONDS: Final = 300.0
STOP_SECONDS: Final = 180.0
SCOPE: Final = "bench"
#: Events per window in ``python -m bench --suite cluster``.
SUITE_EVENTS: Final = 50_000
#: The issue's target: the cluster's events/s over JetStream R3's at equal replication.
TARGET_OVER_JETSTREAM: Final = 5.0
#: Where the generated section of BENCHMARKS.md begins and ends (the rest of the file is others').
SECTION_BEGIN: Final = "<!-- millstream bench --suite cluster: begin -->"
SECTION_END: Final = "<!-- millstream bench --suite cluster: end -->"


class ClusterUp:
    """``millstream cluster up --nodes 3`` in a process of its own, until ``stop`` (SIGINT, bounded)."""

    def __init__(self, directory: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from millstream.cli import main; sys.exit(main())",
             "cluster", "up", "--nodes", "3", "--data-dir", str(directory)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        printed = []
        deadline = time.monotonic() + READY_SECONDS
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"cluster up exited early with status {self.process.wait()}")
            printed.append(line)
            if line.startswith("millstream cluster ready"):
                break
        text = "".join(printed)
        self.seeds = ",".join(re.findall(r"^node-\d (tcp://\S+) ", text, re.M))
        self.nats_urls = re.findall(r"^nats \S+ (nats://\S+) ", text, re.M)
        if len(self.nats_urls) != 3 or self.seeds.count(",") != 2:
            raise RuntimeError(f"cluster up printed what this does not understand:\n{text}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def _millstream_events_per_second(uri: str, stream: str, events: int) -> float:
    import millstream
    from millstream.values import ScalingPolicy, StreamConfig

    payload = b"x" * EVENT_BYTES
    keys = [f"k{index}" for index in range(KEYS)]
    async with millstream.AsyncClient(uri) as client:
        manager = client.stream_manager()
        with contextlib.suppress(millstream.errors.ScopeExistsError):
            await bounded(manager.create_scope(SCOPE))
        await bounded(manager.create_stream(f"{SCOPE}/{stream}", StreamConfig(scaling=ScalingPolicy.fixed(SEGMENTS))))
        writer = client.event_writer(f"{SCOPE}/{stream}")
        await bounded(writer.write_event(payload, routing_key=keys[0]))  # (connections and segments found)
        await bounded(writer.flush())
        started = time.perf_counter()
        for index in range(events):
            await writer.write_event(payload, routing_key=keys[index % KEYS])
        await bounded(writer.flush())
        elapsed = time.perf_counter() - started
        await bounded(writer.close())
    return events / elapsed


async def _jetstream_events_per_second(urls: list[str], stream: str, events: int) -> float:
    import nats

    connection = await nats.connect(servers=urls, connect_timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
    try:
        jetstream = connection.jetstream(timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS,
                                         publish_async_max_pending=JETSTREAM_IN_FLIGHT_MAX)
        await bounded(jetstream.add_stream(name=stream, subjects=[f"{stream}.*"], storage="file", num_replicas=3))
        payload = b"x" * EVENT_BYTES
        started = time.perf_counter()
        for index in range(events):
            await jetstream.publish_async(f"{stream}.k{index % KEYS}", payload)
        await asyncio.wait_for(jetstream.publish_async_completed(), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
        elapsed = time.perf_counter() - started
        await bounded(jetstream.delete_stream(stream))
    finally:
        await connection.close()
    return events / elapsed


@contextlib.contextmanager
def _directory(data_dir: Path | None) -> Iterator[Path]:
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        yield data_dir
        return
    with tempfile.TemporaryDirectory(prefix="millstream-bench-cluster-") as name:
        yield Path(name)


def run_cluster(events: int, repeats: int, data_dir: Path | None = None) -> dict[str, Any]:
    """Measure the three systems ``repeats`` times each, interleaved; return medians and ratios."""
    rates: dict[str, list[float]] = {"cluster": [], "jetstream": [], "standalone": []}
    with _directory(data_dir) as root:
        cluster = ClusterUp(root / "cluster")
        try:
            with standalone_server(root / "standalone") as standalone:
                standalone_uri = f"tcp://127.0.0.1:{standalone.port}"
                for repeat in range(repeats):
                    order = list(rates)
                    order = order[repeat % 3:] + order[:repeat % 3]
                    for system in order:
                        name = f"r{repeat}"
                        if system == "cluster":
                            rate = asyncio.run(_millstream_events_per_second(cluster.seeds, name, events))
                        elif system == "standalone":
                            rate = asyncio.run(_millstream_events_per_second(standalone_uri, name, events))
                        else:
                            rate = asyncio.run(_jetstream_events_per_second(cluster.nats_urls, f"BENCH{repeat}",
                                                                            events))
                        rates[system].append(rate)
                        print(f"{system}: {rate:,.0f} events/s", file=sys.stderr)
        finally:
            cluster.stop()
    medians = {system: statistics.median(values) for system, values in rates.items()}
    return {"events": events, "event_bytes": EVENT_BYTES, "repeats": repeats, "rates": rates, "medians": medians,
            "cluster_over_jetstream": medians["cluster"] / medians["jetstream"],
            "cluster_over_standalone": medians["cluster"] / medians["standalone"]}


def render_cluster_markdown(report: dict[str, Any], *, command: str = "python -m bench --suite cluster",
                            date: str = "") -> str:
    """The suite's section of ``BENCHMARKS.md`` (and its stdout report) for a ``run_cluster`` report,
    between ``SECTION_BEGIN`` and ``SECTION_END``."""
    names = {"cluster": "millstream cluster: 3 nodes, JetStream Tier-1 with replicas 3",
             "jetstream": f"JetStream R3: one message per event, at most {JETSTREAM_IN_FLIGHT_MAX:,} in flight",
             "standalone": "millstream standalone: one node, FileLog"}
    rows = [f"| {names[system]} | {report['medians'][system]:,.0f} | "
            + ", ".join(f"{rate:,.0f}" for rate in rates) + " |"
            for system, rates in report["rates"].items()]
    over_jetstream = report["cluster_over_jetstream"]
    verdict = "met" if over_jetstream >= TARGET_OVER_JETSTREAM else "not met"
    lines = [
        SECTION_BEGIN,
        "## A three-node cluster beside JetStream R3 and standalone",
        "",
        f"> Generated by `{command}`; do not edit by hand -- run the command again to refresh it.",
        "",
        *([f"{date}  "] if date else []),
        f"`millstream cluster up --nodes 3` (ZooKeeper, three NATS servers in a JetStream cluster with "
        f"`sync_interval: always`, three node processes; each container's Tier-1 a JetStream stream with "
        f"replicas 3) and a `millstream standalone` node (fdatasync before each acknowledgement), all on "
        f"127.0.0.1, this process the client of each.  {report['events']:,} events of {report['event_bytes']} B "
        f"per window, {SEGMENTS} segments, {KEYS:,} routing keys; one pipelined writer, durable at `flush()`; "
        f"the systems take turns, the order rotating, {report['repeats']} window(s) each.",
        "",
        "| system | events/s (median) | every window |",
        "|---|---:|---|",
        *rows,
        "",
        f"Cluster ÷ JetStream R3: **{over_jetstream:.1f}x** (target ≥ {TARGET_OVER_JETSTREAM:g}x: {verdict}).  "
        f"Cluster ÷ standalone (the cost of replication): **{report['cluster_over_standalone']:.2f}**.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def replace_section(document: str, section: str) -> str:
    """``document`` with its cluster section (between the markers) replaced by ``section``, or with
    ``section`` appended if it has none."""
    return _suite.replace_section(document, section, SECTION_BEGIN, SECTION_END)


def section_of(document: str) -> str | None:
    """The cluster section of ``document`` (markers included), if it has one."""
    return _suite.section_of(document, SECTION_BEGIN, SECTION_END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per window (default 20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="windows per system (default 3)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the nodes keep their data")
    arguments = parser.parse_args(argv)
    if arguments.events < 1 or arguments.repeats < 1:
        parser.error("--events and --repeats must be positive")
    print(json.dumps(run_cluster(arguments.events, arguments.repeats, arguments.data_dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
