"""``millstream pipeline bench``: the Spark side measured against Spark's own source and sink, in one run.

Theory of operation.  One standalone store (in a background thread) and one SparkSession (this
process, ``local[2]``, the pipeline's settings) serve every measurement, so the figures compare on
the same machine at the same moment:

* **source**: ``rows`` events (the sensor workload's payloads, about 90 bytes each) are written to a
  stream of two segments first; then a query reads them through the millstream source -- Arrow record
  batches out of ``read()`` -- into Spark's ``noop`` sink, in ``BATCHES`` micro-batches of
  ``rows / BATCHES`` (admission control).  Beside it, Spark's built-in ``rate-micro-batch`` source
  makes the same number of rows per batch, into the same ``noop`` sink.
* **sink**: ``rate-micro-batch`` rows (a routing key and a ~90-byte value each) into the millstream
  sink -- one store transaction per task, one fenced multi-commit per batch -- with the Arrow writer
  and with the row writer, beside the same rows into ``noop``.
* **pipeline**: the reference pipeline (``start_query``) runs for ``pipeline_seconds`` on a
  processing-time trigger of one second while the sensor workload is written at 200 events/s; each
  micro-batch's duration (``triggerExecution``: planning, reading, the RocksDB state, the sink's
  commit and Spark's logs) is its end-to-end latency from the batch's start to its output being
  committed and readable.

Rates are rows per second of batch time (``triggerExecution`` summed over the batches with rows,
the first batch of each query left out: it pays for worker start-up and JIT, 4-13 s here); the
query's wall time including its start is given beside it.  Every figure is also written as JSON.

The machine is shared and noisy, so each query also records CPU (``CpuMeter``): ours (this process
and every descendant -- the driver's Python, its JVM and the Python workers the JVM forks -- from
``/proc/<pid>/stat``, sampled every half second) and everyone else's (the machine's busy time from
``/proc/stat`` minus ours), as a share of all CPUs over the query's wall time.  A figure measured
while others took much of the machine says less than one measured on a quiet machine; the table
says which was which.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
from millstream.clock import SystemClock
from millstream.spark.pipeline import PipelineConfig, build_session, start_query
from millstream.spark.workload import SensorWorkload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BenchConfig", "BenchReport", "Measurement", "main", "run_bench"]

#: Micro-batches per throughput query (the first is left out of the rate).
BATCHES: Final = 6
#: A throughput query gets this long before it is stopped and reported as failed.
QUERY_TIMEOUT_SECONDS: Final = 900.0
#: The rate the pipeline measurement writes at (the demo's rate).
PIPELINE_EVENTS_PER_SECOND: Final = 200


@attrs.frozen(kw_only=True)
class BenchConfig:
    rows: int = 500_000
    pipeline_seconds: float = 60.0
    data_dir: Path | None = None
    json_path: Path | None = None


@attrs.frozen(kw_only=True)
class Measurement:
    """One query's figures."""

    name: str
    rows: int
    batches: int
    batch_seconds: float         # triggerExecution summed over the batches with rows but the first
    measured_rows: int           # ... and their rows
    wall_seconds: float          # the whole query, its start included
    own_cpu_percent: float       # our process tree's CPU over the query, % of all CPUs
    others_cpu_percent: float    # everyone else's, the same way

    @property
    def rows_per_second(self) -> float:
        return self.measured_rows / self.batch_seconds if self.batch_seconds > 0 else 0.0


@attrs.frozen(kw_only=True)
class BenchReport:
    throughput: tuple[Measurement, ...]
    pipeline_batches: tuple[dict[str, Any], ...]
    pipeline_cpu_percent: tuple[float, float]  # (ours, others') while the pipeline ran
    spark_version: str

    def latency_summary(self) -> dict[str, float]:
        batches = [b for b in self.pipeline_batches[1:] if b.get("trigger_ms") is not None]
        if not batches:
            return {}
        trigger = sorted(float(b["trigger_ms"]) for b in batches)
        add = sorted(float(b.get("add_batch_ms") or 0) for b in batches)
        rows = [int(b.get("input_rows") or 0) for b in batches]
        return {"batches": float(len(batches)), "median_ms": statistics.median(trigger),
                "p90_ms": _percentile(trigger, 0.9), "max_ms": trigger[-1],
                "add_batch_median_ms": statistics.median(add), "rows_per_batch_median": statistics.median(rows)}

    def markdown(self) -> str:
        lines = [f"Spark {self.spark_version}, local[2], one session for every query.", "",
                 "| query | rows | batches | rows/s (batch time) | wall s (with start) | our CPU % | others' CPU % |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {m.name} | {m.rows:,} | {m.batches} | {m.rows_per_second:,.0f} | {m.wall_seconds:.1f} | "
                  f"{m.own_cpu_percent:.0f} | {m.others_cpu_percent:.0f} |" for m in self.throughput]
        summary = self.latency_summary()
        if summary:
            lines += ["", "Reference pipeline, per micro-batch (processing-time trigger 1 s, "
                      f"{PIPELINE_EVENTS_PER_SECOND} events/s written; the first batch left out):", "",
                      "| batches | rows/batch (median) | latency median ms | p90 ms | max ms | addBatch median ms "
                      "| our CPU % | others' CPU % |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|",
                      f"| {summary['batches']:.0f} | {summary['rows_per_batch_median']:.0f} | "
                      f"{summary['median_ms']:.0f} | {summary['p90_ms']:.0f} | {summary['max_ms']:.0f} | "
                      f"{summary['add_batch_median_ms']:.0f} | {self.pipeline_cpu_percent[0]:.0f} | "
                      f"{self.pipeline_cpu_percent[1]:.0f} |"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"spark_version": self.spark_version,
                "throughput": [{**attrs.asdict(m), "rows_per_second": m.rows_per_second} for m in self.throughput],
                "pipeline_batches": list(self.pipeline_batches), "pipeline_latency": self.latency_summary(),
                "pipeline_cpu_percent": {"ours": self.pipeline_cpu_percent[0],
                                         "others": self.pipeline_cpu_percent[1]}}


def _percentile(values: Sequence[float], fraction: float) -> float:
    index = min(len(values) - 1, max(0, round(fraction * (len(values) - 1))))
    return values[index]


_PROC: Final = Path("/proc")


class CpuMeter:
    """CPU used by the whole machine and by this process tree since the meter was made.

    ``sample()`` (called every half second or so while a query runs) reads ``/proc``: the machine's
    busy ticks, and the user+system ticks of this process and each of its descendants by pid.  Ours
    is the sum over every pid seen of its last reading minus its first (a process already running at
    the start counts from there, a new one from zero).  Children's ``cutime`` is not used: a process
    whose parent reaps it would then count twice.  What a process used after the last sample before
    it ended is lost, so ours errs low by at most one sampling interval per ended process."""

    def __init__(self) -> None:
        self._ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._machine_first = self._machine_last = self._machine_busy()
        tree = self._tree()
        self._first: dict[int, int] = dict(tree)
        self._last: dict[int, int] = dict(tree)

    @staticmethod
    def _machine_busy() -> int:
        fields = (_PROC / "stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[1:9])
        return user + nice + system + irq + softirq + steal

    @staticmethod
    def _tree() -> dict[int, int]:
        parents: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:  # the process ended while we looked
                continue
            # After "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
            rest = text[text.rindex(")") + 2:].split()
            parents[int(entry.name)] = int(rest[1])
            ticks[int(entry.name)] = int(rest[11]) + int(rest[12])
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        tree: dict[int, int] = {}
        pending = [os.getpid()]
        while pending:
            pid = pending.pop()
            if pid in ticks and pid not in tree:
                tree[pid] = ticks[pid]
                pending.extend(children.get(pid, ()))
        return tree

    def sample(self) -> None:
        self._machine_last = self._machine_busy()
        for pid, ticks in self._tree().items():
            self._first.setdefault(pid, 0)
            self._last[pid] = max(ticks, self._last.get(pid, 0))

    def shares(self, wall_seconds: float) -> tuple[float, float]:
        """(ours, others') since the meter was made, as % of all CPUs over ``wall_seconds``."""
        self.sample()
        capacity = max(wall_seconds, 1e-9) * (os.cpu_count() or 1)
        ours = sum(self._last[pid] - self._first[pid] for pid in self._last) / self._ticks_per_second
        busy = (self._machine_last - self._machine_first) / self._ticks_per_second
        return 100.0 * ours / capacity, 100.0 * max(0.0, busy - ours) / capacity


def _measure(name: str, start: Callable[[], Any], rows: int, *, stop_after_rows: int | None = None) -> Measurement:
    """Run the query ``start()`` returns until it ends (or has processed ``stop_after_rows``)."""
    clock = SystemClock()
    meter = CpuMeter()
    began = clock.monotonic()
    query = start()
    try:
        while True:
            ended = query.awaitTermination(0.5)
            meter.sample()
            done = sum(p.numInputRows for p in query.recentProgress)
            if ended or (stop_after_rows is not None and done >= stop_after_rows):
                break
            if clock.monotonic() - began > QUERY_TIMEOUT_SECONDS:
                raise TimeoutError(f"{name}: not done within {QUERY_TIMEOUT_SECONDS:.0f} s")
    finally:
        if query.isActive:
            query.stop()
    wall = clock.monotonic() - began
    own, others = meter.shares(wall)
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"{name} failed: {error}")
    progress = [json.loads(p.json) for p in query.recentProgress]
    with_rows = [p for p in progress if (p.get("numInputRows") or 0) > 0]
    measured = with_rows[1:]
    return Measurement(name=name, rows=sum(p["numInputRows"] for p in with_rows), batches=len(with_rows),
                       batch_seconds=sum(p["durationMs"]["triggerExecution"] for p in measured) / 1000.0,
                       measured_rows=sum(p["numInputRows"] for p in measured), wall_seconds=wall,
                       own_cpu_percent=own, others_cpu_percent=others)


def _write_events(uri: str, stream: str, workload: SensorWorkload, count: int) -> None:
    import millstream

    with millstream.connect(uri) as client, client.event_writer(stream) as writer:
        for routing_key, payload in workload.events(0, count):
            writer.write_event(payload, routing_key=routing_key)


def _throughput(spark: SparkSession, uri: str, workdir: Path, rows: int, say: Callable[[str], None],
                ) -> list[Measurement]:
    import millstream
    from millstream.client import ScalingPolicy, StreamConfig

    per_batch = max(1, rows // BATCHES)
    with millstream.connect(uri) as client:
        manager = client.stream_manager()
        manager.create_scope("bench", exist_ok=True)
        for name in ("bench/source", "bench/sink-arrow", "bench/sink-rows"):
            manager.create_stream(name, StreamConfig(scaling=ScalingPolicy.fixed(2)))
    say(f"writing {rows:,} events to bench/source")
    _write_events(uri, "bench/source", SensorWorkload(seed=3, malformed_every=0), rows)

    def checkpoint(name: str) -> str:
        return str(workdir / "checkpoints" / name)

    def rate() -> Any:
        return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(per_batch))
                .option("numPartitions", "2").load())

    def rate_rows() -> Any:
        # A routing key and a value about as long as a sensor reading's JSON.
        return rate().selectExpr("concat('sensor-', CAST(value % 16 AS STRING)) AS routing_key",
                                 "concat('{\"kind\":\"reading\",\"sensor_id\":\"sensor-0001\",\"ts_ms\":', "
                                 "CAST(value AS STRING), ',\"temperature_c\":21.37}') AS value")

    def millstream_source() -> Any:
        return (spark.readStream.format("millstream").option("controller", uri).option("stream", "bench/source")
                .option("maxRowsPerBatch", str(per_batch)).load())

    def to_noop(frame: Any, name: str, available_now: bool) -> Callable[[], Any]:
        def start() -> Any:
            writer = frame().writeStream.format("noop").option("checkpointLocation", checkpoint(name))
            writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
            return writer.start()
        return start

    def to_millstream(stream: str, writer_kind: str, name: str) -> Callable[[], Any]:
        def start() -> Any:
            return (rate_rows().writeStream.format("millstream").option("controller", uri).option("stream", stream)
                    .option("writer", writer_kind).option("checkpointLocation", checkpoint(name))
                    .trigger(processingTime="0 seconds").start())
        return start

    results = []
    say("warm-up: rate-micro-batch -> noop")
    _measure("warm-up", to_noop(rate, "warm-up", False), rows, stop_after_rows=2 * per_batch)
    plan = [
        ("source: millstream (Arrow) -> noop", to_noop(millstream_source, "source-millstream", True), None),
        ("source: rate-micro-batch -> noop", to_noop(rate, "source-rate", False), rows),
        ("sink: rate-micro-batch -> millstream (Arrow writer)",
         to_millstream("bench/sink-arrow", "arrow", "sink-arrow"), rows),
        ("sink: rate-micro-batch -> millstream (row writer)", to_millstream("bench/sink-rows", "rows", "sink-rows"),
         rows),
        ("sink: rate-micro-batch -> noop (same rows)", to_noop(rate_rows, "sink-noop", False), rows),
    ]
    for name, start, stop_after in plan:
        say(name)
        results.append(_measure(name, start, rows, stop_after_rows=stop_after))
    return results


def _pipeline_latency(spark: SparkSession, uri: str, workdir: Path, seconds: float,
                      say: Callable[[str], None]) -> tuple[list[dict[str, Any]], tuple[float, float]]:
    import millstream
    from millstream.client import ScalingPolicy, StreamConfig
    from millstream.spark.pipeline import progress_record

    with millstream.connect(uri) as client:
        client.stream_manager().create_stream("bench/sensors", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        client.stream_manager().create_stream("bench/alerts", StreamConfig(scaling=ScalingPolicy.fixed(2)))
    workload = SensorWorkload(seed=5, events_per_second=PIPELINE_EVENTS_PER_SECOND)
    stop = threading.Event()
    clock = SystemClock()

    def write() -> None:
        with millstream.connect(uri) as client, client.event_writer("bench/sensors") as writer:
            began, written = clock.monotonic(), 0
            while not stop.wait(0.05):
                due = int((clock.monotonic() - began) * PIPELINE_EVENTS_PER_SECOND)
                for routing_key, payload in workload.events(written, due - written):
                    writer.write_event(payload, routing_key=routing_key)
                written = due

    config = PipelineConfig(controller=uri, input_stream="bench/sensors", output_stream="bench/alerts",
                            checkpoint=workdir / "checkpoints" / "pipeline")
    writer = threading.Thread(target=write, name="bench-workload", daemon=True)
    writer.start()
    say(f"reference pipeline for {seconds:.0f} s")
    meter = CpuMeter()
    query = start_query(spark, config)
    began = clock.monotonic()
    try:
        while clock.monotonic() - began < seconds and not query.awaitTermination(0.5):
            meter.sample()
    finally:
        query.stop()
        stop.set()
        writer.join(30.0)
    cpu = meter.shares(clock.monotonic() - began)
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the reference pipeline failed: {error}")
    return [progress_record(json.loads(p.json)) for p in query.recentProgress], cpu


def run_bench(config: BenchConfig, say: Callable[[str], None]) -> BenchReport:
    import millstream
    import pyspark

    workdir = config.data_dir or Path(tempfile.mkdtemp(prefix="millstream-spark-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with millstream.standalone(workdir / "store") as node:
            session_config = PipelineConfig(controller=node.uri, checkpoint=workdir / "checkpoints" / "unused")
            spark = build_session(session_config)
            try:
                throughput = _throughput(spark, node.uri, workdir, config.rows, say)
                batches, pipeline_cpu = _pipeline_latency(spark, node.uri, workdir, config.pipeline_seconds, say)
            finally:
                spark.stop()
        return BenchReport(throughput=tuple(throughput), pipeline_batches=tuple(batches),
                           pipeline_cpu_percent=pipeline_cpu, spark_version=pyspark.__version__)
    finally:
        if config.data_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(config: BenchConfig, out: Callable[[str], None] | None = None) -> int:
    """Run the bench; the table goes to stdout, progress to ``out`` (default stderr)."""
    say = out or _stderr
    report = run_bench(config, say)
    sys.stdout.write(report.markdown() + "\n")
    if config.json_path is not None:
        config.json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        say(f"raw figures: {config.json_path}")
    return 0
