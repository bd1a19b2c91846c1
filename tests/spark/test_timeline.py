"""The data source's opt-in timeline (``millstream.spark._timeline``): with the variable set, a sink
batch and a source batch run in plain Python record every step -- with its process, its figures and
its duration -- and ``summarize`` counts steps, rows and the processes started for them; without it,
nothing is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

import millstream
from millstream.spark import MillstreamDataSource, MillstreamStreamArrowWriter, _timeline
from tests.spark.helpers import reader_for, run_batches
from tests.spark.test_sink_writers import new_writer, rows_of, run_task

SOURCE_SCHEMA = StructType([StructField("value", BinaryType()), StructField("stream", StringType()),
                            StructField("segment", LongType()), StructField("offset", LongType()),
                            StructField("routing_key", StringType())])


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_span_records_its_step_figures_duration_and_process(tmp_path: Path) -> None:
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    timeline = _timeline.Timeline(tmp_path / "t.jsonl", now=lambda: 1_000.0, monotonic=lambda: next(ticks),
                                  age=lambda: 2.5)
    with timeline.span("sink.write", batch_id=3) as step:
        step["rows"] = 7
    with pytest.raises(KeyError), timeline.span("source.read"):
        raise KeyError("a failing step is recorded too")
    written = records(tmp_path / "t.jsonl")
    assert written == [
        {"step": "sink.write", "start": 1000.0, "duration_ms": 250.0, "pid": os.getpid(),
         "process_age_seconds": 2.5, "batch_id": 3, "rows": 7},
        {"step": "source.read", "start": 1000.0, "duration_ms": 500.0, "pid": os.getpid(),
         "process_age_seconds": 2.5, "failed": True}]


def test_summarize_counts_runs_rows_and_the_processes_started_for_a_step() -> None:
    young, old = _timeline.YOUNG_PROCESS_SECONDS / 2, _timeline.YOUNG_PROCESS_SECONDS * 10
    write = {"step": "sink.write"}
    runs = [{**write, "start": 1.0, "duration_ms": 10.0, "pid": 1, "process_age_seconds": young, "rows": 5},
            {**write, "start": 2.0, "duration_ms": 30.0, "pid": 1, "process_age_seconds": old, "rows": 6},
            {**write, "start": 3.0, "duration_ms": 20.0, "pid": 2, "process_age_seconds": old, "rows": 0},
            {"step": "sink.commit", "start": 4.0, "duration_ms": 8.0, "pid": 3, "process_age_seconds": None}]
    assert _timeline.summarize(runs) == {
        "sink.commit": {"count": 1, "median_ms": 8.0, "max_ms": 8.0, "processes": 1, "processes_started": 0},
        "sink.write": {"count": 3, "median_ms": 20.0, "max_ms": 30.0, "processes": 2, "processes_started": 1,
                       "rows": 11}}


def test_a_sink_batch_records_its_tasks_and_its_commit(node: Any, unique_stream: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(_timeline.ENVIRONMENT_VARIABLE, str(path))
    stream = unique_stream(2)
    messages = [run_task(monkeypatch, new_writer(MillstreamStreamArrowWriter, node, stream), rows_of(0, p, 6),
                         query="q-timeline", batch=0, partition=p) for p in range(2)]
    source = MillstreamDataSource({"controller": node.uri, "stream": stream})
    source.streamWriter(StructType([StructField("value", BinaryType())]), False).commit(messages, 0)
    written = records(path)
    assert {record["pid"] for record in written} == {os.getpid()}
    assert all(record["duration_ms"] >= 0 and "failed" not in record for record in written)
    steps = [record["step"] for record in written]
    assert steps == ["sink.begin", "sink.flush", "sink.write"] * 2 + [
        "sink.writer", "sink.multi_commit", "sink.merge_wait", "sink.commit"]
    writes = [record for record in written if record["step"] == "sink.write"]
    assert [(w["batch_id"], w["partition"], w["rows"]) for w in writes] == [(0, 0, 6), (0, 1, 6)]
    commit = next(record for record in written if record["step"] == "sink.multi_commit")
    assert (commit["batch_id"], commit["transactions"]) == (0, 2)
    summary = _timeline.summarize(written)
    assert summary["sink.write"]["rows"] == 12
    assert summary["sink.commit"]["count"] == 1


def test_a_source_batch_records_its_planning_and_reads(node: Any, unique_stream: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    stream = unique_stream(2)
    with millstream.connect(node.uri) as client, client.event_writer(stream) as writer:
        for index in range(40):
            writer.write_event(f"event-{index}".encode(), routing_key=f"key-{index % 7}")
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(_timeline.ENVIRONMENT_VARIABLE, str(path))
    batches = run_batches(reader_for(node.uri, stream, SOURCE_SCHEMA), ReadAllAvailable())
    assert sum(len(batch.rows) for batch in batches) == 40
    summary = _timeline.summarize(records(path))
    assert summary["source.read"]["rows"] == 40
    assert summary["source.partitions"]["count"] == len(batches)
    assert summary["source.latest_offset"]["count"] == len(batches) + 1  # the last one finds nothing new


def test_without_the_variable_nothing_is_recorded(node: Any, unique_stream: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_timeline.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    stream = unique_stream(1)
    message = run_task(monkeypatch, new_writer(MillstreamStreamArrowWriter, node, stream), rows_of(0, 0, 3),
                       query="q-off", batch=0, partition=0)
    new_writer(MillstreamStreamArrowWriter, node, stream).commit([message], 0)
    assert list(tmp_path.iterdir()) == []
    assert _timeline.current().path is None
