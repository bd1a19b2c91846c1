"""The reference pipeline in Spark (the session's ``local[2]`` SparkSession, availableNow triggers).

* Its logic (``sensor_pipeline``) from Spark's file source, batch by batch, against the answer
  computed in plain Python: every window once, exact values -- with the RocksDB state store, whose
  changelog checkpointing leaves a changelog per state version in the checkpoint.
* The whole query from a millstream stream to another (``start_query``), across a split of the input
  stream and a restart from the checkpoint (its source giving the payload column only), read back with
  the plain client.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import millstream
from millstream.spark.demo import read_stream
from millstream.spark.pipeline import PipelineConfig, input_events, sensor_pipeline, spark_conf, start_query
from millstream.spark.workload import SensorWorkload, expected_output, verify

WORKLOAD = SensorWorkload(seed=5, sensors=6, events_per_second=100, window_seconds=2, watermark_delay_seconds=4,
                          disorder_ms_max=1_000, malformed_every=50)


@pytest.fixture
def pipeline_settings(spark: Any) -> Iterator[None]:
    """The pipeline's SQL settings (the RocksDB state store, changelog checkpointing, bounded memory)
    on the shared session for one test; the session's own values come back after."""
    settings = {key: value for key, value in spark_conf(PipelineConfig(controller="tcp://127.0.0.1:1",
                                                                       checkpoint="unused")).items()
                if key.startswith("spark.sql.")}
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def config_for(uri: str, checkpoint: Path, **overrides: Any) -> PipelineConfig:
    return PipelineConfig(controller=uri, checkpoint=checkpoint, window_seconds=WORKLOAD.window_seconds,
                          watermark_delay_seconds=WORKLOAD.watermark_delay_seconds,
                          alert_threshold_c=WORKLOAD.alert_threshold_c,
                          alert_readings_min=WORKLOAD.alert_readings_min, **overrides)


def test_the_pipeline_answers_what_plain_python_computes(spark: Any, pipeline_settings: None, tmp_path: Path) -> None:
    readings = 3_000
    payloads = [WORKLOAD.payload(i) for i in range(readings)] + [p for _, p in WORKLOAD.end_markers(readings)]
    folder = tmp_path / "input"
    folder.mkdir()
    # Files in write order, one per micro-batch (the file source orders them by modification time).
    for number, first in enumerate(range(0, len(payloads), 700)):
        path = folder / f"part-{number:03d}.jsonl"
        path.write_bytes(b"\n".join(payloads[first:first + 700]) + b"\n")
        os.utime(path, (1_000_000 + 10 * number, 1_000_000 + 10 * number))
    events = spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(str(folder))
    checkpoint = tmp_path / "checkpoint"
    query = (sensor_pipeline(events, config_for("tcp://127.0.0.1:1", checkpoint)).writeStream
             .format("memory").queryName("sensor_pipeline_rows").outputMode("append")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(600)
        assert query.exception() is None
        rows = spark.table("sensor_pipeline_rows").collect()
    finally:
        query.stop()
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    assert len(batches) == 5, "one micro-batch per file"
    assert {r.routing_key for r in rows} <= {WORKLOAD.sensor_id(k) for k in range(WORKLOAD.sensors)}
    verification = verify(WORKLOAD, payloads, payloads, [r.value.encode() for r in rows])
    assert verification.passed, verification.table()
    assert verification.expected_rows == len(expected_output(WORKLOAD, payloads)) > 60
    assert verification.expected_alerts > 0
    # RocksDB with changelog checkpointing: each state version of each partition is a changelog.
    changelogs = sorted(p.name for p in (checkpoint / "state" / "0" / "0").glob("*.changelog"))
    assert len(changelogs) >= len(batches), changelogs


def write_events(uri: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    with millstream.connect(uri) as client, client.event_writer(stream) as writer:
        for routing_key, payload in events:
            writer.write_event(payload, routing_key=routing_key)


def read_back(uri: str, stream: str) -> list[bytes]:
    async def read() -> list[bytes]:
        async with millstream.AsyncClient(uri) as client:
            return await read_stream(client, stream)

    return asyncio.run(read())


def test_the_query_is_exactly_once_across_a_split_and_a_restart(spark: Any, pipeline_settings: None, node: Any,
                                                                 unique_stream: Any, tmp_path: Path) -> None:
    source, sink = unique_stream(1, prefix="sensors"), unique_stream(2, prefix="alerts")
    config = config_for(node.uri, tmp_path / "checkpoint", input_stream=source, output_stream=sink,
                        trigger="available-now")
    first, second = 1_500, 3_000
    write_events(node.uri, source, list(WORKLOAD.events(0, first)))
    # The logic reads only the payload, so the source builds and Spark converts that column alone.
    assert input_events(spark, config).columns == ["value"]
    query = start_query(spark, config)
    query.awaitTermination(600)
    assert query.exception() is None
    after_first = read_back(node.uri, sink)
    assert after_first, "windows behind the watermark are written by the first run"

    with millstream.connect(node.uri) as client:  # every segment splits at once, as in the demo
        manager = client.stream_manager()
        (segment,) = manager.describe_stream(source).segments
        manager.split_segment(source, segment.segment_id, 2)
    write_events(node.uri, source, list(WORKLOAD.events(first, second - first)) + WORKLOAD.end_markers(second))
    query = start_query(spark, config)  # the same checkpoint: a restart
    query.awaitTermination(600)
    assert query.exception() is None

    written = [WORKLOAD.payload(i) for i in range(second)] + [p for _, p in WORKLOAD.end_markers(second)]
    output = read_back(node.uri, sink)
    assert set(after_first) <= set(output), "what the first run committed stays committed"
    verification = verify(WORKLOAD, written, read_back(node.uri, source), output)
    assert verification.passed, verification.table()
    with millstream.connect(node.uri) as client:
        assert len(client.stream_manager().describe_stream(source).segments) == 2
