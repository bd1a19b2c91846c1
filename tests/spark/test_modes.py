"""Output modes of the ``millstream`` sink in Spark (the session's ``local[2]`` SparkSession), as Spark's
Kafka sink has them: every batch's rows are appended to the output stream, once.  Complete mode
appends each batch's whole result table; update mode (which Spark's Python data sources cannot take
by themselves: ``millstream.spark.register`` routes it through ``foreachBatch`` and the fenced batch
writer) appends the rows that changed -- and a batch Spark re-runs after its commit log was lost
commits nothing, in both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import millstream
from millstream.spark import fence_key
from tests.spark.helpers import KeyedWriter
from tests.spark.test_end_to_end import read_output, source

KEYS = [f"sensor-{n}" for n in range(4)]


def counts(spark: Any, node: Any, stream: str) -> Any:
    frame = source(spark, node, stream, serializer="json", schema="key STRING, seq BIGINT")
    return frame.groupBy("key").count().selectExpr("key AS routing_key", "to_json(struct(*)) AS value")


def run(frame: Any, mode: str, checkpoint: Path, node: Any, output: str) -> Any:
    query = (frame.writeStream.format("millstream").outputMode(mode).option("controller", node.uri)
             .option("stream", output).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(600)
    assert not query.isActive and query.exception() is None, query.exception()
    return query


def table(node: Any, stream: str) -> list[tuple[str, int]]:
    return sorted((row["key"], row["count"]) for row in read_output(node, stream))


def forget_last_commit(checkpoint: Path) -> int:
    """The driver "died" after the sink's commit of the last batch and before Spark's commit log."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


def test_complete_mode_appends_each_batchs_whole_table(spark: Any, node: Any, unique_stream: Any,
                                                      tmp_path: Path) -> None:
    stream, output = unique_stream(2), unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    writer.write(20, KEYS)
    checkpoint = tmp_path / "checkpoint"
    run(counts(spark, node, stream), "complete", checkpoint, node, output)
    first = [(key, 5) for key in KEYS]
    assert table(node, output) == first
    writer.write(4, KEYS[:2])
    run(counts(spark, node, stream), "complete", checkpoint, node, output)
    second = [(key, 7 if key in KEYS[:2] else 5) for key in KEYS]  # two more each
    assert table(node, output) == sorted(first + second), "the whole table again, after the first"
    forget_last_commit(checkpoint)
    run(counts(spark, node, stream), "complete", checkpoint, node, output)
    assert table(node, output) == sorted(first + second), "the re-run batch committed nothing"


def test_update_mode_appends_the_rows_that_changed_once(spark: Any, node: Any, unique_stream: Any,
                                                       tmp_path: Path) -> None:
    stream, output = unique_stream(2), unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    writer.write(20, KEYS)
    checkpoint = tmp_path / "checkpoint"
    query = run(counts(spark, node, stream), "update", checkpoint, node, output)
    assert table(node, output) == [(key, 5) for key in KEYS]
    writer.write(3, KEYS[:1])
    run(counts(spark, node, stream), "update", checkpoint, node, output)
    assert table(node, output) == sorted([(key, 5) for key in KEYS] + [(KEYS[0], 8)]), "only the changed row"
    last = forget_last_commit(checkpoint)
    replay = run(counts(spark, node, stream), "update", checkpoint, node, output)
    assert [p["batchId"] for p in replay.recentProgress][:1] == [last], "Spark ran the batch again"
    assert len(read_output(node, output)) == 5, "and it committed nothing"
    with millstream.connect(node.uri) as client:
        assert client.get_fence(output, fence_key(str(query.id))) == last, "fenced as the streaming sink fences"
    assert all(json.loads(json.dumps(row)) for row in read_output(node, output))
