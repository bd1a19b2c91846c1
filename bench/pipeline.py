"""``millstream pipeline bench``: the Spark side measured against Spark's own source and sink, in one run.

Theory of operation.  One standalone store (in a background thread) and one SparkSession (this
process, ``local[2]``, the pipeline's settings) serve every measurement, so the figures compare on
the same machine at the same moment:

* **source**: ``rows`` readings (16 sensors, the sensor workload's shape, about 90 bytes each) are written to a
  stream of two segments first; then a query reads them through the millstream source -- Arrow record
  batches out of ``read()`` -- into Spark's ``noop`` sink, in ``BATCHES`` micro-batches of
  ``rows / BATCHES`` (admission control): once as ``value`` bytes (``serializer=raw``) with the
  default columns, once parsed into columns (``serializer=json`` with the workload's schema), once
  with only the ``value`` column (``.schema("value BINARY")``: fewer columns for Spark to convert).
  Beside them, Spark's built-in ``rate-micro-batch`` source makes the same number of rows per batch,
  into the same ``noop`` sink.
* **sink**: ``rate-micro-batch`` rows (a routing key and a ~90-byte value each) into the millstream
  sink -- one store transaction per task, one fenced multi-commit per batch, durable and merged when
  the batch commits -- with the Arrow writer and with the row writer, beside the same rows into
  ``noop``.
* **the sink's own cost**: before Spark starts, the calls the sink makes for a micro-batch of the
  reference pipeline's size (two tasks of ``SINK_COST_ROWS_PER_TASK`` rows) are timed one by one in
  plain Python: each task's transaction begin and its durable write, the driver's fenced commit and
  its wait for the merge -- what millstream adds to a batch's ``addBatch``.
* **pipeline**: the reference pipeline (``start_query``: JSON parsing, event-time windows, RocksDB
  state with changelog checkpointing, the exactly-once sink) runs for ``pipeline_seconds`` on a
  processing-time trigger of one second while sensor readings are written at
  ``PIPELINE_EVENTS_PER_SECOND``; each micro-batch's duration (``triggerExecution``) is its
  end-to-end latency from the batch's start to its output being committed and readable, and the
  medians of Spark's parts of it (``latestOffset``, ``walCommit``, ``queryPlanning``, ``addBatch``,
  ``commitOffsets``) say where it goes.

**start-up**: the pipeline runs first, right after the SparkSession is built, so its first
micro-batch is a cold start's, as after a restart (no Python worker running, nothing imported),
started as ``millstream pipeline run`` starts it (``prewarm``: the executors' Python workers start
while the driver plans the first batch): the session's build time (its JVM), the time from
``start()`` to the first progress report, and that batch's parts say where a start goes.

Rates are rows per second of batch time (``triggerExecution`` summed over the batches with rows,
the first batch of each query left out: it pays for worker start-up and JIT, 4-13 s here); the
query's wall time including its start is given beside it.  The ratios the issue asks for are
computed from the same run: the source against ``rate`` -> ``noop``, JSON against the raw source,
the sink against the same rows into ``noop``.  ``--markdown`` replaces the pipeline's section of
``BENCHMARKS.md`` (between ``SECTION_BEGIN`` and ``SECTION_END``) and ``--figures`` draws rows/s per
query (``pipeline-throughput.png``); every figure is also written as JSON.

``--ceiling`` (``run_ceiling``) measures instead what Spark's Python Data Source machinery allows by
itself on this machine, with the same session settings and no store: a trivial streaming Python
source that yields prebuilt Arrow record batches of 100-byte binary values (in batches of
10,000 rows, and in one record batch per partition) into ``noop``, and ``rate-micro-batch`` into a
trivial Python Arrow sink that discards what it gets (in Spark's Arrow batches of 10,000 rows, and
of 100,000: ``spark.sql.execution.arrow.maxRecordsPerBatch``), each beside
Spark's own rate -> noop in the same session; then the reference pipeline's logic on Spark's rate
source into the trivial Python sink, beside the same into noop: what a Python sink costs a
micro-batch by itself.  No Python data source can beat those figures here.

The machine is shared and noisy, so each query also records CPU (``CpuMeter``): ours (this process
and every descendant -- the driver's Python, its JVM and the Python workers the JVM forks -- from
``/proc/<pid>/stat``, sampled every half second) and everyone else's (the machine's busy time from
``/proc/stat`` minus ours), as a share of all CPUs over the query's wall time.  A figure measured
while others took much of the machine says less than one measured on a quiet machine; the table
says which was which.
"""

from __future__ import annotations

import datetime
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
from millstream.spark.pipeline import PipelineConfig, build_session, prewarm, start_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SECTION_BEGIN", "SECTION_END", "BenchConfig", "BenchReport", "Measurement", "main", "plot",
           "replace_section", "run_bench"]

#: Micro-batches per throughput query (the first is left out of the rate).
BATCHES: Final = 6
#: A throughput query gets this long before it is stopped and reported as failed.
QUERY_TIMEOUT_SECONDS: Final = 900.0
#: Events a millstream -> noop warm-up reads before the source is measured (its Python workers start).
WARM_UP_EVENTS: Final = 30_000
#: The rate the pipeline measurement writes at (issue 21: 10,000 events/s at one-second triggers).
PIPELINE_EVENTS_PER_SECOND: Final = 10_000
#: The event time of the pipeline measurement's first reading (any fixed instant: windows follow it).
PIPELINE_EVENT_TIME_START_MS: Final = 1_000_000_000_000
#: The schema the JSON source query parses the sensor workload's payloads with.
JSON_SCHEMA_DDL: Final = "kind STRING, sensor_id STRING, ts_ms BIGINT, temperature_c DOUBLE"
#: The pipeline's section of BENCHMARKS.md lies between these (``--markdown`` replaces it).
SECTION_BEGIN: Final = "<!-- millstream pipeline bench: begin -->"
SECTION_END: Final = "<!-- millstream pipeline bench: end -->"
#: The queries' names (the ratios are computed between them).
SOURCE: Final = "source: millstream (Arrow, raw) -> noop"
SOURCE_JSON: Final = "source: millstream (Arrow, json) -> noop"
SOURCE_VALUE: Final = "source: millstream (Arrow, raw, .schema('value BINARY')) -> noop"
SOURCE_BASELINE: Final = "source: rate-micro-batch -> noop"
SINK: Final = "sink: rate-micro-batch -> millstream (Arrow writer)"
SINK_ROWS: Final = "sink: rate-micro-batch -> millstream (row writer)"
SINK_BASELINE: Final = "sink: rate-micro-batch -> noop (same rows)"
#: The ceiling's queries: what Spark's Python data source machinery allows by itself (no millstream).
CEILING_SOURCE: Final = "ceiling: trivial Python source (Arrow batches of 10,000 100-byte values) -> noop"
CEILING_SOURCE_LARGE: Final = "ceiling: trivial Python source (Arrow, one record batch per partition) -> noop"
CEILING_SINK: Final = "ceiling: rate-micro-batch -> trivial Python Arrow sink (discards)"
CEILING_SINK_LARGE: Final = ("ceiling: rate-micro-batch -> trivial Python Arrow sink (discards), "
                             "arrow.maxRecordsPerBatch 100,000")
#: Spark's setting for the rows per Arrow batch it hands a Python writer (default 10,000).
ARROW_RECORDS_PER_BATCH: Final = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: query -> (what it is compared with, the ratio it must reach, the rows/s it must reach).
TARGETS: Final = {SOURCE: (SOURCE_BASELINE, 0.8, 1_000_000.0), SOURCE_JSON: (SOURCE, 0.5, 0.0),
                  SOURCE_VALUE: (SOURCE_BASELINE, 0.0, 0.0),
                  SINK: (SINK_BASELINE, 0.5, 400_000.0), SINK_ROWS: (SINK_BASELINE, 0.0, 0.0),
                  CEILING_SOURCE: (SOURCE_BASELINE, 0.0, 0.0), CEILING_SOURCE_LARGE: (SOURCE_BASELINE, 0.0, 0.0),
                  CEILING_SINK: (SINK_BASELINE, 0.0, 0.0), CEILING_SINK_LARGE: (SINK_BASELINE, 0.0, 0.0)}
#: Spark's names of the parts of a throughput query's micro-batch shown per query.
THROUGHPUT_PARTS: Final = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
                           "triggerExecution")
#: The parts of a micro-batch's duration Spark reports (``durationMs``), in the order they happen.
BATCH_PARTS: Final = ("latest_offset_ms", "wal_commit_ms", "get_batch_ms", "query_planning_ms", "add_batch_ms",
                      "commit_offsets_ms")
#: The reference pipeline's per-batch latency targets (median, p90).
LATENCY_TARGETS_MS: Final = (400.0, 600.0)


@attrs.frozen(kw_only=True)
class BenchConfig:
    rows: int = 500_000
    pipeline_seconds: float = 60.0
    data_dir: Path | None = None
    json_path: Path | None = None
    markdown_path: Path | None = None
    figures_dir: Path | None = None
    #: Measure only what Spark's Python data source machinery allows by itself (``run_ceiling``).
    ceiling: bool = False


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
    #: Spark's ``durationMs`` parts (``latestOffset``, ``addBatch``, ...), medians over the measured batches.
    parts_ms: dict[str, float] = attrs.field(factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.measured_rows / self.batch_seconds if self.batch_seconds > 0 else 0.0


@attrs.frozen(kw_only=True)
class BenchReport:
    throughput: tuple[Measurement, ...]
    pipeline_batches: tuple[dict[str, Any], ...]
    pipeline_cpu_percent: tuple[float, float]  # (ours, others') while the pipeline ran
    spark_version: str
    #: The same query logic on Spark's rate source into noop, the same rate (Spark's own cost).
    baseline_batches: tuple[dict[str, Any], ...] = ()
    baseline_cpu_percent: tuple[float, float] = (0.0, 0.0)
    #: Where a start's time goes (seconds): the SparkSession (its JVM), and the reference pipeline's
    #: first micro-batch -- from ``start()`` to its first progress report, and that batch's duration.
    startup: dict[str, float] = attrs.field(factory=dict)
    #: What the sink itself costs a micro-batch, without Spark (``_sink_costs``): part -> median/p90 ms.
    sink_costs: dict[str, dict[str, float]] = attrs.field(factory=dict)
    #: What ``pipeline_batches`` measured (the ceiling measures a trivial Python sink there).
    pipeline_name: str = "millstream -> reference pipeline -> millstream"
    #: The data source's own steps during the reference pipeline's measured batches, by step
    #: (``millstream.spark._timeline.summarize``): which Python process spent what inside a batch.
    pipeline_timeline: dict[str, dict[str, Any]] = attrs.field(factory=dict)

    def latency_summary(self, baseline: bool = False) -> dict[str, float]:
        source = self.baseline_batches if baseline else self.pipeline_batches
        batches = [b for b in source[1:] if b.get("trigger_ms") is not None]
        if not batches:
            return {}
        trigger = sorted(float(b["trigger_ms"]) for b in batches)
        rows = [int(b.get("input_rows") or 0) for b in batches]
        summary = {"batches": float(len(batches)), "median_ms": statistics.median(trigger),
                   "p90_ms": _percentile(trigger, 0.9), "max_ms": trigger[-1],
                   "rows_per_batch_median": statistics.median(rows)}
        for part in BATCH_PARTS:
            summary[f"{part}_median"] = statistics.median(float(b.get(part) or 0) for b in batches)
        summary["add_batch_median_ms"] = summary["add_batch_ms_median"]
        return summary

    def rate(self, name: str) -> float | None:
        found = [m.rows_per_second for m in self.throughput if m.name == name]
        return found[0] if found else None

    def ratios(self) -> dict[str, tuple[str, float]]:
        """query -> (what it is compared with, its rate over that one's), for the queries with a target."""
        result = {}
        for name, (baseline, _, _) in TARGETS.items():
            mine, theirs = self.rate(name), self.rate(baseline)
            if mine is not None and theirs:
                result[name] = (baseline, mine / theirs)
        return result

    def markdown(self) -> str:
        ratios = self.ratios()
        lines = [f"Spark {self.spark_version}, local[2], one session for every query.", "",
                 "| query | rows | batches | rows/s (batch time) | ratio | target | wall s (with start) | our CPU % "
                 "| others' CPU % |",
                 "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for m in self.throughput:
            ratio, target = "", ""
            if m.name in ratios:
                baseline, value = ratios[m.name]
                ratio = f"{value:.2f} x {_short(baseline)}"
            if m.name in TARGETS:
                baseline, ratio_min, rate_min = TARGETS[m.name]
                wanted = [f">= {rate_min:,.0f} rows/s"] if rate_min else []
                wanted += [f">= {ratio_min:g} x"] if ratio_min else []
                met = (m.rows_per_second >= rate_min) and (m.name not in ratios or ratios[m.name][1] >= ratio_min)
                target = ("met: " if met else "NOT met: ") + ", ".join(wanted) if wanted else ""
            lines.append(f"| {m.name} | {m.rows:,} | {m.batches} | {m.rows_per_second:,.0f} | {ratio} | {target} | "
                         f"{m.wall_seconds:.1f} | {m.own_cpu_percent:.0f} | {m.others_cpu_percent:.0f} |")
        parted = [m for m in self.throughput if m.parts_ms]
        if parted:
            lines += ["", "Where a throughput query's micro-batch goes (medians, ms; Spark's ``durationMs``):", "",
                      "| query | " + " | ".join(THROUGHPUT_PARTS) + " |", "|---|" + "---:|" * len(THROUGHPUT_PARTS)]
            lines += ["| " + m.name + " | "
                      + " | ".join(f"{m.parts_ms.get(part, 0.0):.0f}" for part in THROUGHPUT_PARTS) + " |"
                      for m in parted]
        summary = self.latency_summary()
        if summary:
            met = summary["median_ms"] < LATENCY_TARGETS_MS[0] and summary["p90_ms"] < LATENCY_TARGETS_MS[1]
            rows = [(self.pipeline_name, summary, self.pipeline_cpu_percent)]
            spark_own = self.latency_summary(baseline=True)
            if spark_own:
                rows.append(("rate -> the same logic -> noop (Spark's own)", spark_own, self.baseline_cpu_percent))
            lines += ["", "Reference pipeline, per micro-batch (processing-time trigger 1 s, "
                      f"{PIPELINE_EVENTS_PER_SECOND:,} events/s; the first batch left out; target median < "
                      f"{LATENCY_TARGETS_MS[0]:.0f} ms, p90 < {LATENCY_TARGETS_MS[1]:.0f} ms: "
                      f"{'met' if met else 'NOT met'}), beside the same query logic fed by Spark's rate "
                      "source into noop:", "",
                      "| query | batches | rows/batch (median) | latency median ms | p90 ms | max ms | our CPU % "
                      "| others' CPU % |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {name} | {row['batches']:.0f} | {row['rows_per_batch_median']:.0f} | "
                      f"{row['median_ms']:.0f} | {row['p90_ms']:.0f} | {row['max_ms']:.0f} | {cpu[0]:.0f} | "
                      f"{cpu[1]:.0f} |"
                      for name, row, cpu in rows]
            lines += ["", "Where a batch's time goes (medians, ms; Spark's ``durationMs``):", "",
                      "| query | " + " | ".join(part.removesuffix("_ms") for part in BATCH_PARTS) + " |",
                      "|---|" + "---:|" * len(BATCH_PARTS)]
            lines += ["| " + name + " | " + " | ".join(f"{row[f'{part}_median']:.0f}" for part in BATCH_PARTS) + " |"
                      for name, row, _ in rows]
        lines += self._timeline_lines()
        lines += self._startup_lines()
        lines += self._sink_cost_lines()
        return "\n".join(lines)

    def _timeline_lines(self) -> list[str]:
        if not self.pipeline_timeline:
            return []
        lines = ["", "Inside the reference pipeline's measured batches, the data source's own steps "
                 "(`MILLSTREAM_SPARK_TIMELINE`, `spark_pipeline/_timeline.py`): how often each ran, its "
                 "duration, and how many Python processes ran it (how many of them Spark started for it). A "
                 "sink task's `sink.write` lasts from the task handing it its first rows to its last, so it "
                 "includes Spark's own work upstream:", "",
                 "| step | runs | rows | median ms | max ms | processes | started |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {step} | {entry['count']} | {entry.get('rows', '')} | {entry['median_ms']:.1f} | "
                  f"{entry['max_ms']:.1f} | {entry['processes']} | {entry['processes_started']} |"
                  for step, entry in self.pipeline_timeline.items()]
        return lines

    def _sink_cost_lines(self) -> list[str]:
        if not self.sink_costs:
            return []
        lines = ["", f"What the exactly-once sink itself costs a micro-batch, without Spark (two tasks of "
                 f"{SINK_COST_ROWS_PER_TASK} rows, {SINK_COST_BATCHES - SINK_COST_WARM_UP_BATCHES} batches): per "
                 "task, beginning its transaction and writing its rows durably into it (the tasks run in parallel); "
                 "per batch, the driver's fenced commit and its wait until the batch is merged (readable):", "",
                 "| part | median ms | p90 ms |", "|---|---:|---:|"]
        lines += [f"| {part.replace('_', ' ')} | {figures['median_ms']:.1f} | {figures['p90_ms']:.1f} |"
                  for part, figures in self.sink_costs.items()]
        return lines

    def _startup_lines(self) -> list[str]:
        if not self.startup or not self.pipeline_batches:
            return []
        first = self.pipeline_batches[0]
        parts = " | ".join(f"{float(first.get(part) or 0) / 1000:.1f}" for part in BATCH_PARTS)
        return ["", "Start-up: the SparkSession (its JVM), then the reference pipeline's first micro-batch -- from "
                "the query's start to its first progress report, that batch's duration, and its parts (s):", "",
                "| session | first batch, from start | its duration | "
                + " | ".join(part.removesuffix("_ms") for part in BATCH_PARTS) + " |",
                "|---:|---:|---:|" + "---:|" * len(BATCH_PARTS),
                f"| {self.startup.get('session_seconds', 0.0):.1f} | "
                f"{self.startup.get('first_batch_seconds', 0.0):.1f} | "
                f"{float(first.get('trigger_ms') or 0) / 1000:.1f} | {parts} |"]

    def section(self, command: str, figure: str | None = None) -> str:
        """The pipeline's section of BENCHMARKS.md."""
        lines = [SECTION_BEGIN, "", "## Spark: the millstream source and sink beside Spark's own", "",
                 f"`{command}` (the last step of `tox -e bench`); what each query is: "
                 "`bench/pipeline.py`.  `millstream pipeline bench --ceiling` measures what Spark's Python "
                 "data source machinery allows by itself on the machine (a trivial Python source and sink, no "
                 "store), the most any Python data source can reach.", "", self.markdown()]
        if figure is not None:
            lines += ["", f"![rows/s per query]({figure})"]
        lines += ["", SECTION_END, ""]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"spark_version": self.spark_version,
                "throughput": [{**attrs.asdict(m), "rows_per_second": m.rows_per_second} for m in self.throughput],
                "ratios": {name: {"against": against, "ratio": value}
                           for name, (against, value) in self.ratios().items()},
                "pipeline_batches": list(self.pipeline_batches), "pipeline_latency": self.latency_summary(),
                "baseline_batches": list(self.baseline_batches),
                "baseline_latency": self.latency_summary(baseline=True),
                "pipeline_cpu_percent": {"ours": self.pipeline_cpu_percent[0],
                                         "others": self.pipeline_cpu_percent[1]},
                "startup": dict(self.startup), "sink_costs": dict(self.sink_costs),
                "pipeline_timeline": dict(self.pipeline_timeline)}


def _short(name: str) -> str:
    return {SOURCE_BASELINE: "rate->noop", SOURCE: "raw source", SINK_BASELINE: "rate->noop"}.get(name, name)


def plot(report: BenchReport, path: Path) -> Path:
    """Rows/s per query, a horizontal bar each, millstream's beside Spark's own (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    names = [m.name for m in report.throughput]
    rates = [m.rows_per_second for m in report.throughput]
    figure = Figure(figsize=(9, 0.5 * len(names) + 1.2))
    axes = figure.subplots()
    colors = ["tab:blue" if "millstream" in n.split("->")[0 if n.startswith("source") else 1] else "tab:gray"
              for n in names]
    axes.barh(range(len(names)), rates, color=colors)
    axes.set_yticks(range(len(names)), [n.replace(": ", ":\n", 1) for n in names], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("rows/s (batch time)")
    axes.set_title(f"Spark {report.spark_version}, local[2]: millstream (blue) and Spark's own (grey)", fontsize=9)
    for index, rate in enumerate(rates):
        axes.text(rate, index, f" {rate:,.0f}", va="center", fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", metadata={"Software": None})
    return path


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
                       own_cpu_percent=own, others_cpu_percent=others, parts_ms=_median_parts(measured))


def _median_parts(progress: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each ``durationMs`` part over ``progress`` (a part a batch lacks counts 0)."""
    return {name: float(statistics.median(float(p["durationMs"].get(name) or 0) for p in progress))
            for name in THROUGHPUT_PARTS} if progress else {}


def reading(index: int) -> tuple[bytes, str]:
    """Reading ``index`` of 16 sensors (about 90 bytes, the sensor workload's shape) and its routing
    key; its event time advances at ``PIPELINE_EVENTS_PER_SECOND``.  A format string: the seeded
    workload's generator costs tens of microseconds an event, which the bench would spend writing."""
    sensor = f"sensor-{index % 16:04d}"
    return (f'{{"kind":"reading","sensor_id":"{sensor}",'
            f'"ts_ms":{PIPELINE_EVENT_TIME_START_MS + index * 1000 // PIPELINE_EVENTS_PER_SECOND},'
            f'"temperature_c":{20 + index % 70}.{index % 100:02d}}}').encode(), sensor


def _write_events(uri: str, stream: str, count: int, first: int = 0) -> None:
    import millstream

    with millstream.connect(uri) as client, client.event_writer(stream) as writer:
        for index in range(first, first + count):
            payload, routing_key = reading(index)
            writer.write_event(payload, routing_key=routing_key)


def _throughput(spark: SparkSession, uri: str, workdir: Path, rows: int, say: Callable[[str], None],
                ) -> list[Measurement]:
    import millstream
    from millstream.client import ScalingPolicy, StreamConfig

    per_batch = max(1, rows // BATCHES)
    with millstream.connect(uri) as client:
        manager = client.stream_manager()
        manager.create_scope("bench", exist_ok=True)
        for name in ("bench/source", "bench/warm-up", "bench/sink-arrow", "bench/sink-rows"):
            manager.create_stream(name, StreamConfig(scaling=ScalingPolicy.fixed(2)))
    say(f"writing {rows:,} events to bench/source")
    _write_events(uri, "bench/source", rows)
    _write_events(uri, "bench/warm-up", WARM_UP_EVENTS)

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

    def millstream_warm_up() -> Any:
        return (spark.readStream.format("millstream").option("controller", uri).option("stream", "bench/warm-up")
                .option("maxRowsPerBatch", str(WARM_UP_EVENTS // 3)).load())

    def millstream_json_source() -> Any:
        return (spark.readStream.format("millstream").option("controller", uri).option("stream", "bench/source")
                .option("serializer", "json").option("schema", JSON_SCHEMA_DDL)
                .option("maxRowsPerBatch", str(per_batch)).load())

    def millstream_value_source() -> Any:
        # Only the payload column: Spark converts fewer Arrow columns to rows.
        return (spark.readStream.format("millstream").option("controller", uri).option("stream", "bench/source")
                .option("maxRowsPerBatch", str(per_batch)).schema("value BINARY").load())

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
    say("warm-up: rate-micro-batch -> noop, millstream -> noop")
    _measure("warm-up", to_noop(rate, "warm-up", False), rows, stop_after_rows=2 * per_batch)
    _measure("warm-up", to_noop(millstream_warm_up, "warm-up-millstream", True), WARM_UP_EVENTS)
    plan = [
        (SOURCE, to_noop(millstream_source, "source-millstream", True), None),
        (SOURCE_JSON, to_noop(millstream_json_source, "source-millstream-json", True), None),
        (SOURCE_VALUE, to_noop(millstream_value_source, "source-millstream-value", True), None),
        (SOURCE_BASELINE, to_noop(rate, "source-rate", False), rows),
        (SINK, to_millstream("bench/sink-arrow", "arrow", "sink-arrow"), rows),
        (SINK_ROWS, to_millstream("bench/sink-rows", "rows", "sink-rows"), rows),
        (SINK_BASELINE, to_noop(rate_rows, "sink-noop", False), rows),
    ]
    for name, start, stop_after in plan:
        say(name)
        results.append(_measure(name, start, rows, stop_after_rows=stop_after))
    return results


def _pipeline_latency(spark: SparkSession, uri: str, workdir: Path, seconds: float, say: Callable[[str], None],
                      ) -> tuple[list[dict[str, Any]], tuple[float, float], float]:
    import millstream
    from millstream.client import ScalingPolicy, StreamConfig
    from millstream.spark.pipeline import progress_record

    with millstream.connect(uri) as client:
        client.stream_manager().create_scope("bench", exist_ok=True)
        client.stream_manager().create_stream("bench/sensors", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        client.stream_manager().create_stream("bench/alerts", StreamConfig(scaling=ScalingPolicy.fixed(2)))
    stop = threading.Event()
    clock = SystemClock()

    def write(first: int) -> None:
        began = clock.monotonic()
        written = first
        with millstream.connect(uri) as client, client.event_writer("bench/sensors") as writer:
            while not stop.wait(0.02):
                due = first + int((clock.monotonic() - began) * PIPELINE_EVENTS_PER_SECOND)
                for index in range(written, due):
                    value, key = reading(index)
                    writer.write_event(value, routing_key=key)
                written = max(written, due)

    # One second's readings for the first micro-batch, which pays for the query's start (workers, JIT,
    # RocksDB) and is left out of the figures; the rate starts after it, so no backlog is measured.
    _write_events(uri, "bench/sensors", PIPELINE_EVENTS_PER_SECOND)
    config = PipelineConfig(controller=uri, input_stream="bench/sensors", output_stream="bench/alerts",
                            checkpoint=workdir / "checkpoints" / "pipeline")
    writer = threading.Thread(target=write, args=(PIPELINE_EVENTS_PER_SECOND,), name="bench-workload", daemon=True)
    say(f"reference pipeline: its first micro-batch (start-up), then {seconds:.0f} s at "
        f"{PIPELINE_EVENTS_PER_SECOND:,} events/s")
    meter = CpuMeter()
    prewarm(spark)  # as `millstream pipeline run` does
    query = start_query(spark, config)
    began = clock.monotonic()
    try:
        while not query.recentProgress and not query.awaitTermination(0.5):
            if clock.monotonic() - began > QUERY_TIMEOUT_SECONDS:
                raise TimeoutError(f"the reference pipeline's first batch took over {QUERY_TIMEOUT_SECONDS:.0f} s")
        first_batch_seconds = clock.monotonic() - began
        writer.start()
        meter = CpuMeter()
        began = clock.monotonic()
        while clock.monotonic() - began < seconds and not query.awaitTermination(0.5):
            meter.sample()
    finally:
        query.stop()
        stop.set()
        if writer.is_alive():
            writer.join(30.0)
    cpu = meter.shares(clock.monotonic() - began)
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the reference pipeline failed: {error}")
    return [progress_record(json.loads(p.json)) for p in query.recentProgress], cpu, first_batch_seconds


#: Micro-batches the sink's own per-batch cost is measured over (the first few left out: connections).
SINK_COST_BATCHES: Final = 40
SINK_COST_WARM_UP_BATCHES: Final = 5
#: Rows each of the two tasks of such a batch writes (about what the reference pipeline outputs).
SINK_COST_ROWS_PER_TASK: Final = 100
#: The parts of the sink's per-batch cost, in the order they happen.
SINK_COST_PARTS: Final = ("begin", "write_and_flush", "commit", "merge_wait")


def _sink_costs(uri: str) -> dict[str, dict[str, float]]:
    """What the exactly-once sink itself costs a micro-batch, without Spark: per task, beginning its
    transaction (a controller round trip) and writing and flushing its rows (durable in the
    transaction); per batch, the driver's fenced multi-commit and its wait until the store has merged
    the transactions -- the same calls ``_writer`` makes, timed one by one.  part -> median/p90 ms."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    import millstream
    from millstream.client import ScalingPolicy, StreamConfig, StreamRouter
    from millstream.spark import parse_sink_options
    from millstream.spark._segment_io import TransactionAppender, frame_events, route
    from millstream.spark._store import StoreSession
    from millstream.spark._writer import _SinkProtocol

    stream = "bench/sink-cost"
    with millstream.connect(uri) as client:
        client.stream_manager().create_scope("bench", exist_ok=True)
        client.stream_manager().create_stream(stream, StreamConfig(scaling=ScalingPolicy.fixed(2)))
    options = parse_sink_options({"controller": uri, "stream": stream})
    protocol = _SinkProtocol(options, StructType([StructField("routing_key", StringType()),
                                                  StructField("value", StringType())]))
    session = StoreSession(options.store)
    clock = SystemClock()
    timings: dict[str, list[float]] = {part: [] for part in SINK_COST_PARTS}
    try:
        client = session.client
        for batch in range(SINK_COST_BATCHES):
            txns = []
            for task in range(2):
                began = clock.monotonic()
                writer = client.transactional_writer(stream, lease_seconds=options.transaction_lease_seconds)
                txn = writer.begin()
                begun = clock.monotonic()
                pairs = [reading(batch * 1000 + task * SINK_COST_ROWS_PER_TASK + row)
                         for row in range(SINK_COST_ROWS_PER_TASK)]
                appender = TransactionAppender(client)
                router = StreamRouter(txn.info.transaction_segments)
                for segment, part in route(pa.array([p for p, _ in pairs], type=pa.binary()),
                                           pa.array([k for _, k in pairs], type=pa.string()), router):
                    appender.append(segment, frame_events(part))
                appender.close()
                writer.close()
                written = clock.monotonic()
                txns.append(str(txn.txn_id))
                if batch >= SINK_COST_WARM_UP_BATCHES:
                    timings["begin"].append(begun - began)
                    timings["write_and_flush"].append(written - begun)
            began = clock.monotonic()
            client.commit_transactions(stream, txns, fence=("spark/sink-cost", batch))
            committed = clock.monotonic()
            merged = protocol._wait_merged(session, txns)
            if batch >= SINK_COST_WARM_UP_BATCHES:
                timings["commit"].append(committed - began)
                timings["merge_wait"].append(clock.monotonic() - committed)
            if not merged:
                raise RuntimeError(f"sink cost: batch {batch} was not merged within the bound")
    finally:
        session.close()
    return {part: {"median_ms": 1000 * statistics.median(values),
                   "p90_ms": 1000 * _percentile(sorted(values), 0.9)} for part, values in timings.items()}


def _pipeline_baseline(spark: SparkSession, workdir: Path, seconds: float, say: Callable[[str], None], *,
                       sink: str = "noop", name: str = "baseline") -> tuple[list[dict[str, Any]], tuple[float, float]]:
    """The reference pipeline's logic fed by Spark's rate source (readings of the same shape, at the
    same rate) into noop: what the query costs Spark itself, with no millstream on either side (or
    into ``sink``: the ceiling's trivial Python sink)."""
    from millstream.spark.pipeline import progress_record, sensor_pipeline

    clock = SystemClock()
    config = PipelineConfig(controller="tcp://127.0.0.1:1", checkpoint=workdir / "checkpoints" / name)
    readings = (spark.readStream.format("rate").option("rowsPerSecond", str(PIPELINE_EVENTS_PER_SECOND))
                .option("numPartitions", "2").load()
                .selectExpr("concat('{\"kind\":\"reading\",\"sensor_id\":\"sensor-', "
                            "lpad(CAST(value % 16 AS STRING), 4, '0'), '\",\"ts_ms\":', "
                            f"CAST({PIPELINE_EVENT_TIME_START_MS} + value * 1000 / {PIPELINE_EVENTS_PER_SECOND} "
                            "AS BIGINT), "
                            "',\"temperature_c\":', CAST(20 + value % 70 AS STRING), '.', "
                            "lpad(CAST(value % 100 AS STRING), 2, '0'), '}') AS value"))
    say(f"the same logic on Spark's rate source into {sink}: its first micro-batch, then {seconds:.0f} s")
    query = (sensor_pipeline(readings, config).writeStream.format(sink).outputMode("append")
             .option("checkpointLocation", str(config.checkpoint)).trigger(processingTime="1 second").start())
    began = clock.monotonic()
    try:
        while not query.recentProgress and not query.awaitTermination(0.5):
            if clock.monotonic() - began > QUERY_TIMEOUT_SECONDS:
                raise TimeoutError(f"the baseline's first batch took over {QUERY_TIMEOUT_SECONDS:.0f} s")
        meter = CpuMeter()
        began = clock.monotonic()
        while clock.monotonic() - began < seconds and not query.awaitTermination(0.5):
            meter.sample()
    finally:
        query.stop()
    cpu = meter.shares(clock.monotonic() - began)
    return [progress_record(json.loads(p.json)) for p in query.recentProgress], cpu


#: Bytes in each value the trivial source yields (the issue's 100-byte events).
CEILING_VALUE_BYTES: Final = 100


def _ceiling_data_sources(rows_per_batch: int, batches: int, rows_per_record_batch: int) -> tuple[Any, Any]:
    """A trivial streaming Python data source yielding prebuilt Arrow record batches of
    ``CEILING_VALUE_BYTES``-byte binary values (``batches`` micro-batches of ``rows_per_batch``, two
    partitions each), and a trivial streaming Arrow sink that discards what it is given.  Defined in
    a function so that cloudpickle ships them by value: the Python workers need not import this module."""
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    partitions_per_batch = 2

    class CeilingReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, Any]:
            return {"batch": 0}

        def getDefaultReadLimit(self) -> Any:
            return ReadAllAvailable()

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            return {"batch": min(batches, int(start["batch"]) + 1)}

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
            if int(end["batch"]) <= int(start["batch"]):
                return []
            share = rows_per_batch // partitions_per_batch
            return [InputPartition(share) for _ in range(partitions_per_batch)]

        def read(self, partition: Any) -> Any:
            rows = int(partition.value)
            chunk = min(rows, rows_per_record_batch)
            value = b"x" * CEILING_VALUE_BYTES
            offsets = pa.array(range(0, (chunk + 1) * CEILING_VALUE_BYTES, CEILING_VALUE_BYTES), type=pa.int32())
            values = pa.BinaryArray.from_buffers(pa.binary(), chunk, [None, offsets.buffers()[1],
                                                                      pa.py_buffer(value * chunk)])
            batch = pa.RecordBatch.from_arrays([values], names=["value"])
            sent = 0
            while sent < rows:
                piece = batch if rows - sent >= chunk else batch.slice(0, rows - sent)
                sent += piece.num_rows
                yield piece

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class CeilingWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class CeilingDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return f"millstream-ceiling-{rows_per_record_batch}"

        def schema(self) -> str:
            return "value BINARY"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return CeilingReader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return CeilingWriter()

    return CeilingDataSource, CeilingDataSource.name()


def _ceiling(spark: SparkSession, workdir: Path, rows: int, say: Callable[[str], None]) -> list[Measurement]:
    """The Python data source machinery's own ceiling, beside Spark's rate -> noop in the same session."""
    per_batch = max(2, rows // BATCHES)
    names = []
    for rows_per_record_batch in (10_000, per_batch):
        source, name = _ceiling_data_sources(per_batch, BATCHES, rows_per_record_batch)
        spark.dataSource.register(source)
        names.append(name)

    def rate() -> Any:
        return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(per_batch))
                .option("numPartitions", "2").load())

    def rate_rows() -> Any:
        return rate().selectExpr("CAST(repeat('x', 100) AS BINARY) AS value")

    def query(frame: Callable[[], Any], sink: str, name: str, arrow_rows: int | None = None) -> Callable[[], Any]:
        def start() -> Any:
            if arrow_rows is not None:  # read when the query's batches are planned, so it stays set while it runs
                spark.conf.set(ARROW_RECORDS_PER_BATCH, str(arrow_rows))
            else:
                spark.conf.unset(ARROW_RECORDS_PER_BATCH)
            return (frame().writeStream.format(sink).option("checkpointLocation", str(workdir / "checkpoints" / name))
                    .trigger(processingTime="0 seconds").start())
        return start

    def trivial(index: int) -> Callable[[], Any]:
        return lambda: spark.readStream.format(names[index]).load()

    total = per_batch * BATCHES
    plan = [
        ("warm-up", query(trivial(0), "noop", "ceiling-warm-up"), 2 * per_batch),
        (SOURCE_BASELINE, query(rate, "noop", "ceiling-rate"), total),
        (CEILING_SOURCE, query(trivial(0), "noop", "ceiling-source"), total),
        (CEILING_SOURCE_LARGE, query(trivial(1), "noop", "ceiling-large"), total),
        (SINK_BASELINE, query(rate_rows, "noop", "ceiling-rate-rows"), total),
        (CEILING_SINK, query(rate_rows, names[0], "ceiling-sink"), total),
        (CEILING_SINK_LARGE, query(rate_rows, names[0], "ceiling-sink-large", 100_000), total),
    ]
    results = []
    try:
        for name, start, stop_after in plan:
            say(name)
            measurement = _measure(name, start, rows, stop_after_rows=stop_after)
            if name != "warm-up":
                results.append(measurement)
    finally:
        spark.conf.unset(ARROW_RECORDS_PER_BATCH)
    return results


def run_ceiling(config: BenchConfig, say: Callable[[str], None]) -> BenchReport:
    """``millstream pipeline bench --ceiling``: Spark's Python data source machinery alone (no store)."""
    import pyspark

    workdir = config.data_dir or Path(tempfile.mkdtemp(prefix="millstream-spark-ceiling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        spark = build_session(PipelineConfig(controller="tcp://127.0.0.1:1",
                                             checkpoint=workdir / "checkpoints" / "unused"))
        try:
            throughput = _ceiling(spark, workdir, config.rows, say)
            trivial_sink = _ceiling_data_sources(2, BATCHES, 10_000)[1]  # registered by _ceiling
            batches, cpu = _pipeline_baseline(spark, workdir, config.pipeline_seconds, say, sink=trivial_sink,
                                              name="ceiling-pipeline")
            baseline, baseline_cpu = _pipeline_baseline(spark, workdir, config.pipeline_seconds, say)
        finally:
            spark.stop()
        return BenchReport(throughput=tuple(throughput), pipeline_batches=tuple(batches), pipeline_cpu_percent=cpu,
                           spark_version=pyspark.__version__, baseline_batches=tuple(baseline),
                           baseline_cpu_percent=baseline_cpu,
                           pipeline_name="rate -> the same logic -> trivial Python sink (discards)")
    finally:
        if config.data_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def pipeline_timeline(path: Path, batches: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``_timeline.summarize`` of the steps recorded in ``path`` that started within the measured
    batches (the first left out, as in the latency figures): from the second batch's start to the
    last one's end, by the batches' progress timestamps and durations."""
    from millstream.spark._timeline import summarize

    timed = [b for b in batches[1:] if b.get("timestamp") and b.get("trigger_ms") is not None]
    if not timed or not path.exists():
        return {}
    begin = datetime.datetime.fromisoformat(str(timed[0]["timestamp"])).timestamp()
    last = datetime.datetime.fromisoformat(str(timed[-1]["timestamp"])).timestamp()
    end = last + float(timed[-1]["trigger_ms"]) / 1000
    with path.open(encoding="utf-8") as file:
        records = [json.loads(line) for line in file if line.strip()]
    return summarize(record for record in records if begin <= float(record["start"]) <= end)


def run_bench(config: BenchConfig, say: Callable[[str], None]) -> BenchReport:
    import pyspark

    import millstream
    from millstream.spark._timeline import ENVIRONMENT_VARIABLE

    workdir = config.data_dir or Path(tempfile.mkdtemp(prefix="millstream-spark-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    timeline = workdir / "timeline.jsonl"
    # Set before the session starts: Spark's JVM, and the Python workers it starts, inherit it.
    previous_timeline = os.environ.get(ENVIRONMENT_VARIABLE)
    os.environ[ENVIRONMENT_VARIABLE] = str(timeline)
    try:
        with millstream.standalone(workdir / "store") as node:
            say("the sink's own cost per micro-batch, without Spark")
            sink_costs = _sink_costs(node.uri)
            session_config = PipelineConfig(controller=node.uri, checkpoint=workdir / "checkpoints" / "unused")
            clock = SystemClock()
            began = clock.monotonic()
            spark = build_session(session_config)
            session_seconds = clock.monotonic() - began
            try:
                # The pipeline first: its first micro-batch is then a cold start's (no Python worker
                # running yet), as after a restart.
                batches, pipeline_cpu, first_batch = _pipeline_latency(spark, node.uri, workdir,
                                                                       config.pipeline_seconds, say)
                throughput = _throughput(spark, node.uri, workdir, config.rows, say)
                baseline, baseline_cpu = _pipeline_baseline(spark, workdir, config.pipeline_seconds, say)
            finally:
                spark.stop()
        return BenchReport(throughput=tuple(throughput), pipeline_batches=tuple(batches),
                           pipeline_cpu_percent=pipeline_cpu, spark_version=pyspark.__version__,
                           baseline_batches=tuple(baseline), baseline_cpu_percent=baseline_cpu,
                           startup={"session_seconds": session_seconds, "first_batch_seconds": first_batch},
                           sink_costs=sink_costs, pipeline_timeline=pipeline_timeline(timeline, batches))
    finally:
        if previous_timeline is None:
            os.environ.pop(ENVIRONMENT_VARIABLE, None)
        else:
            os.environ[ENVIRONMENT_VARIABLE] = previous_timeline
        if config.data_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(config: BenchConfig, out: Callable[[str], None] | None = None, *, command: str = "millstream pipeline bench",
         ) -> int:
    """Run the bench; the table goes to stdout, progress to ``out`` (default stderr); with
    ``markdown_path`` the pipeline's section of that file is replaced (the rest kept), with
    ``figures_dir`` the plot of rows/s per query goes there."""
    say = out or _stderr
    report = run_ceiling(config, say) if config.ceiling else run_bench(config, say)
    sys.stdout.write(report.markdown() + "\n")
    if config.json_path is not None:
        config.json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        say(f"raw figures: {config.json_path}")
    figure = None
    if config.figures_dir is not None:
        figure = plot(report, config.figures_dir / "pipeline-throughput.png")
        say(f"plot: {figure}")
    if config.markdown_path is not None:
        existing = config.markdown_path.read_text(encoding="utf-8") if config.markdown_path.exists() else ""
        link = None if figure is None else os.path.relpath(figure, config.markdown_path.parent)
        config.markdown_path.write_text(replace_section(existing, report.section(command, link)), encoding="utf-8")
        say(f"report: {config.markdown_path}")
    return 0


def replace_section(document: str, section: str) -> str:
    """``document`` with its pipeline section replaced by ``section`` (appended if it has none)."""
    first, last = document.find(SECTION_BEGIN), document.find(SECTION_END)
    if first >= 0 and last > first:
        return document[:first] + section.rstrip("\n") + document[last + len(SECTION_END):]
    return (document.rstrip("\n") + "\n\n" if document.strip() else "") + section
