"""The Spark bench's plain-Python side (no SparkSession): its CPU accounting of our process tree and
everyone else's, and the figures it derives from Spark's progress reports."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.pipeline import BenchReport, CpuMeter, Measurement


def test_our_cpu_counts_children_and_others_cpu_is_the_rest() -> None:
    meter = CpuMeter()
    # A child that burns CPU while the meter samples, then ends: its time counts as ours.
    child = subprocess.Popen([sys.executable, "-c", "sum(i * i for i in range(10_000_000))"])
    while child.poll() is None:
        meter.sample()
        time.sleep(0.05)
    ours, others = meter.shares(1.0)
    assert ours >= 10.0, "the child's second or so of CPU is ours (of 1 s on all CPUs)"
    assert others >= 0.0
    assert CpuMeter().shares(1.0)[0] < 5.0, "a fresh meter has seen next to nothing"


def test_rates_leave_the_first_batch_out_and_latency_is_summarised() -> None:
    measurement = Measurement(name="q", rows=600, batches=3, batch_seconds=2.0, measured_rows=400,
                              wall_seconds=9.0, own_cpu_percent=80.0, others_cpu_percent=10.0)
    assert measurement.rows_per_second == 200.0
    batches = tuple({"trigger_ms": ms, "add_batch_ms": ms // 2, "input_rows": 200} for ms in (9000, 100, 300, 200, 400))
    report = BenchReport(throughput=(measurement,), pipeline_batches=batches, pipeline_cpu_percent=(50.0, 25.0),
                         spark_version="4.x")
    summary = report.latency_summary()
    assert summary["batches"] == 4, "the first (warm-up) batch is left out"
    assert (summary["median_ms"], summary["max_ms"]) == (250.0, 400.0)
    table = report.markdown()
    assert "| q | 600 | 3 | 200 |  |  | 9.0 | 80 | 10 |" in table
    assert "| 4 | 200 | 250 | 400 | 400 | 50 | 25 |" in table
    assert "| 0 | 0 | 0 | 0 | 125 | 0 |" in table, "the parts of a batch (medians): addBatch 125"
    assert report.to_json()["pipeline_cpu_percent"] == {"ours": 50.0, "others": 25.0}
    assert "Start-up" not in table, "no start-up figures, no start-up table"


def test_the_start_up_table_gives_the_session_and_the_first_batch_and_its_parts() -> None:
    first = {"trigger_ms": 20_000, "latest_offset_ms": 3_000, "wal_commit_ms": 100, "get_batch_ms": 0,
             "query_planning_ms": 1_500, "add_batch_ms": 15_000, "commit_offsets_ms": 400, "input_rows": 10}
    report = BenchReport(throughput=(), pipeline_batches=(first, {"trigger_ms": 300, "input_rows": 10}),
                         pipeline_cpu_percent=(0.0, 0.0), spark_version="4.x",
                         startup={"session_seconds": 7.25, "first_batch_seconds": 31.0})
    table = report.markdown()
    assert "| 7.2 | 31.0 | 20.0 | 3.0 | 0.1 | 0.0 | 1.5 | 15.0 | 0.4 |" in table
    assert report.to_json()["startup"] == {"session_seconds": 7.25, "first_batch_seconds": 31.0}


def test_the_sinks_own_cost_is_measured_part_by_part_without_spark(node: Any) -> None:
    from bench import pipeline as bench

    costs = bench._sink_costs(node.uri)
    assert list(costs) == list(bench.SINK_COST_PARTS)
    assert all(0.0 < figures["median_ms"] <= figures["p90_ms"] for figures in costs.values())
    report = BenchReport(throughput=(), pipeline_batches=(), pipeline_cpu_percent=(0.0, 0.0), spark_version="4.x",
                         sink_costs=costs)
    table = report.markdown()
    assert f"| merge wait | {costs['merge_wait']['median_ms']:.1f} | {costs['merge_wait']['p90_ms']:.1f} |" in table


def measured(name: str, rows_per_second: float) -> Measurement:
    return Measurement(name=name, rows=1000, batches=2, batch_seconds=1.0, measured_rows=int(rows_per_second),
                       wall_seconds=3.0, own_cpu_percent=50.0, others_cpu_percent=5.0)


def test_ratios_and_targets_come_from_the_same_run(tmp_path: Path) -> None:
    from bench import pipeline as bench

    report = BenchReport(throughput=(measured(bench.SOURCE, 1_200_000), measured(bench.SOURCE_JSON, 500_000),
                                     measured(bench.SOURCE_BASELINE, 1_000_000), measured(bench.SINK, 300_000),
                                     measured(bench.SINK_BASELINE, 500_000)),
                         pipeline_batches=(), pipeline_cpu_percent=(0.0, 0.0), spark_version="4.x")
    ratios = report.ratios()
    assert ratios[bench.SOURCE] == (bench.SOURCE_BASELINE, 1.2)
    assert ratios[bench.SOURCE_JSON][1] == 500_000 / 1_200_000
    assert ratios[bench.SINK] == (bench.SINK_BASELINE, 0.6)
    table = report.markdown()
    assert "| 1.20 x rate->noop | met: >= 1,000,000 rows/s, >= 0.8 x |" in table
    assert "| 0.42 x raw source | NOT met: >= 0.5 x |" in table
    assert "| 0.60 x rate->noop | NOT met: >= 400,000 rows/s, >= 0.5 x |" in table
    # The section replaces its old self in BENCHMARKS.md and keeps the rest of the file.
    document = "# benchmarks\n\nother suites\n"
    first = bench.replace_section(document, report.section("millstream pipeline bench", "docs/bench/x.png"))
    assert first.startswith(document) and "![rows/s per query](docs/bench/x.png)" in first
    again = bench.replace_section(first + "\ntrailing\n", report.section("again"))
    assert again.count(bench.SECTION_BEGIN) == 1 and "`again`" in again and again.endswith("trailing\n")
    assert bench.plot(report, tmp_path / "plot.png").stat().st_size > 1000


def test_the_ceilings_trivial_source_yields_its_rows_in_record_batches_and_its_sink_discards() -> None:
    """``pipeline bench --ceiling``'s data sources, in plain Python: what Spark would ask of them."""
    from bench import pipeline as bench

    source_class, name = bench._ceiling_data_sources(rows_per_batch=25, batches=3, rows_per_record_batch=4)
    assert name == "millstream-ceiling-4"
    source = source_class({})
    assert source.schema() == "value BINARY"
    reader = source.streamReader(None)
    offset = reader.initialOffset()
    rows = 0
    for _ in range(4):
        end = reader.latestOffset(offset, reader.getDefaultReadLimit())
        for partition in reader.partitions(offset, end):
            batches = list(reader.read(partition))
            assert all(batch.num_rows <= 4 for batch in batches)
            assert all(value == b"x" * bench.CEILING_VALUE_BYTES for batch in batches
                       for value in batch.column(0).to_pylist())
            rows += sum(batch.num_rows for batch in batches)
        offset = end
    assert offset == {"batch": 3}, "three micro-batches, then no new data"
    assert rows == 3 * 24, "two partitions of 12 rows a micro-batch"
    writer = source.streamWriter(None, False)
    assert writer.write(iter(list(reader.read(reader.partitions({"batch": 0}, {"batch": 1})[0])))) is not None


def test_the_pipelines_timeline_counts_only_the_steps_of_its_measured_batches(tmp_path: Path) -> None:
    import json

    from bench.pipeline import pipeline_timeline

    # Batch 0 (left out) starts at 1_000 s, batch 1 at 1_030 s and lasts 500 ms, batch 2 at 1_031 s, 400 ms.
    batches = ({"timestamp": "1970-01-01T00:16:40.000Z", "trigger_ms": 30_000},
               {"timestamp": "1970-01-01T00:17:10.000Z", "trigger_ms": 500},
               {"timestamp": "1970-01-01T00:17:11.000Z", "trigger_ms": 400})

    def step(name: str, start: float, duration_ms: float, pid: int, **fields: Any) -> str:
        return json.dumps({"step": name, "start": start, "duration_ms": duration_ms, "pid": pid,
                           "process_age_seconds": 600.0, **fields})

    path = tmp_path / "timeline.jsonl"
    path.write_text("\n".join([
        step("source.read", 1_005.0, 9_000.0, 11, rows=10_000),    # the first batch's: left out
        step("source.latest_offset", 1_030.0, 20.0, 10),
        step("source.read", 1_030.1, 40.0, 11, rows=3_000),
        step("source.read", 1_030.1, 60.0, 12, rows=2_000),
        step("source.latest_offset", 1_031.0, 30.0, 10),
        step("sink.commit", 1_031.3, 25.0, 13),
        step("source.read", 1_040.0, 50.0, 11, rows=7_000),       # after the last measured batch
    ]) + "\n")
    summary = pipeline_timeline(path, batches)
    assert summary["source.read"] == {"count": 2, "median_ms": 50.0, "max_ms": 60.0, "processes": 2,
                                      "processes_started": 0, "rows": 5_000}
    assert summary["source.latest_offset"]["count"] == 2
    assert summary["sink.commit"]["median_ms"] == 25.0
    report = BenchReport(throughput=(), pipeline_batches=batches, pipeline_cpu_percent=(0.0, 0.0),
                         spark_version="4.x", pipeline_timeline=summary)
    assert "| source.read | 2 | 5000 | 50.0 | 60.0 | 2 | 0 |" in report.markdown()
    assert report.to_json()["pipeline_timeline"] == summary
    assert pipeline_timeline(tmp_path / "absent.jsonl", batches) == {}
