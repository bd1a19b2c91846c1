"""``millstream`` in Spark, end to end (the session's ``local[2]`` SparkSession, ``trigger(availableNow=True)``):
the source across scaling (each key's events in order, exactly the events written, across two runs of
one checkpoint with the stream split and merged in between); the batch reader between two cuts; the
sink (every row in the output stream exactly once, with the Arrow and the row writer; a batch Spark
re-runs after its commit log was lost commits nothing); bad options failing the query at its start
with an error that names the option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import millstream
from tests.spark.helpers import KEYS, KeyedWriter

JSON_SCHEMA = "key STRING, seq BIGINT"


def source(spark: Any, node: Any, stream: str, **options: str) -> Any:
    reader = spark.readStream.format("millstream").option("controller", node.uri).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(frame: Any, checkpoint: Path, on_batch: Any = None, **sink: str) -> Any:
    """Run ``frame`` to the millstream sink (``sink`` options) or to ``on_batch`` until all is read."""
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if on_batch is not None:
        writer = writer.foreachBatch(on_batch)
    else:
        writer = writer.format("millstream")
        for name, value in sink.items():
            writer = writer.option(name, value)
    query = writer.start()
    query.awaitTermination(600)
    assert not query.isActive, "the available-now run did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_the_source_keeps_each_keys_order_across_scaling_and_a_restart(spark: Any, node: Any, unique_stream: Any,
                                                                         tmp_path: Path) -> None:
    stream = unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    seen: list[tuple[int, dict[str, Any]]] = []

    def collect(frame: Any, batch_id: int) -> None:
        seen.extend((batch_id, row.asDict()) for row in frame.collect())

    frame = source(spark, node, stream, serializer="json", schema=JSON_SCHEMA, metadataColumns="true",
                   maxRowsPerBatch="250")
    with millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        writer.write(300)
        manager.split_segment(stream, manager.current_segments(stream).segments[0].segment_id)
        writer.write(300)
        first = run_available_now(frame, tmp_path / "checkpoint", collect)
        # Between the runs the stream scales again: the restarted query goes on from its logged offsets.
        manager.merge_segments(stream, [s.segment_id for s in manager.current_segments(stream).segments[:2]])
        writer.write(300)
        manager.split_segment(stream, manager.current_segments(stream).segments[-1].segment_id)
        writer.write(300)
    second = run_available_now(frame, tmp_path / "checkpoint", collect)
    assert [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]] and \
        max(p["numInputRows"] for p in first.recentProgress + second.recentProgress) <= 250
    batch_ids = [b for b, _ in seen]
    assert batch_ids == sorted(batch_ids), "foreachBatch saw the batches in order"
    per_key: dict[str, list[int]] = {}
    for _, row in seen:
        per_key.setdefault(row["key"], []).append(row["seq"])
    assert set(per_key) == set(KEYS)
    for key, sequence in per_key.items():
        assert sequence == list(range(1, writer.sequence[key] + 1)), f"{key}: in order, each once"
    assert len(seen) == writer.total == 1200
    assert len({row["segment"] for _, row in seen}) >= 5, "the events came from every epoch"


def test_the_batch_reader_reads_exactly_the_events_between_two_cuts(spark: Any, node: Any,
                                                                    unique_stream: Any) -> None:
    stream = unique_stream(3)
    writer = KeyedWriter(node.uri, stream)
    with millstream.connect(node.uri) as client:
        writer.write(50)
        start = client.stream_manager().tail_cut(stream)
        at_start = dict(writer.sequence)
        writer.write(30)
        client.stream_manager().split_segment(stream, client.stream_manager().current_segments(stream).segments[1]
                                              .segment_id)
        writer.write(30)
        end = client.stream_manager().tail_cut(stream)
        at_end = dict(writer.sequence)
        writer.write(20)

    def read(**options: str) -> Any:
        reader = spark.read.format("millstream").option("controller", node.uri).option("stream", stream)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    assert read().count() == 130
    between = read(serializer="json", schema=JSON_SCHEMA, start=start.to_json(), end=end.to_json())
    rows = between.collect()
    assert len(rows) == 60
    expected = sorted((key, seq) for key in KEYS for seq in range(at_start[key] + 1, at_end[key] + 1))
    assert sorted((r["key"], r["seq"]) for r in rows) == expected
    raw = read(end=start.to_json()).selectExpr("CAST(value AS STRING) AS text", "stream", "offset", "routing_key")
    first_rows = raw.collect()
    assert len(first_rows) == 50 and {r["stream"] for r in first_rows} == {stream}
    assert all(r["routing_key"] is None for r in first_rows), "the store keeps no routing keys"
    keyed = read(end=start.to_json(), routingKeyField="key").select("routing_key").collect()
    assert sorted(r["routing_key"] for r in keyed) == sorted(k for k, n in at_start.items() for _ in range(n))


def read_output(node: Any, stream: str) -> list[dict[str, Any]]:
    with millstream.connect(node.uri) as client:
        tail = client.stream_manager().tail_cut(stream)
        events = []
        for segment, length in tail.segment_names().items():
            reader = client.segment_reader(segment)
            while reader.offset < length:
                events.extend(json.loads(e.value) for e in reader.read_events())
            reader.close()
    return events


def test_the_sink_writes_every_row_once_and_a_replayed_batch_commits_nothing(spark: Any, node: Any,
                                                                             unique_stream: Any,
                                                                             tmp_path: Path) -> None:
    source_stream, output = unique_stream(2), unique_stream(2)
    writer = KeyedWriter(node.uri, source_stream)
    writer.write(400)
    frame = source(spark, node, source_stream, serializer="json", schema=JSON_SCHEMA, maxRowsPerBatch="200") \
        .selectExpr("to_json(struct(key, seq)) AS value", "key AS routing_key")
    checkpoint = tmp_path / "checkpoint"
    sink = {"controller": node.uri, "stream": output}
    query = run_available_now(frame, checkpoint, **sink)
    rows = read_output(node, output)
    assert sorted((r["key"], r["seq"]) for r in rows) == sorted(
        (key, seq) for key, count in writer.sequence.items() for seq in range(1, count + 1)), "each row exactly once"
    last = max(p["batchId"] for p in query.recentProgress)
    with millstream.connect(node.uri) as client:
        assert client.get_fence(output, f"spark/{query.id}") == last

    # The driver "died" after the sink's commit of the last batch and before Spark's commit log: Spark
    # re-runs that batch from its logged offsets, and the fence turns its commit into an abort.
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    replay = run_available_now(frame, checkpoint, **sink)
    replayed = [p for p in replay.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0, "Spark ran the batch again"
    assert len(read_output(node, output)) == 400, "and it committed nothing"
    writer.write(50)
    run_available_now(frame, checkpoint, **sink)
    assert len(read_output(node, output)) == 450

    # The row writer (writer=rows) commits the same way.
    rows_output = unique_stream(1)
    run_available_now(frame, tmp_path / "rows", **{**sink, "stream": rows_output, "writer": "rows"})
    assert sorted((r["key"], r["seq"]) for r in read_output(node, rows_output)) == sorted(
        (r["key"], r["seq"]) for r in read_output(node, output))


def failure(action: Any) -> str:
    with pytest.raises(Exception) as caught:
        action()
    return str(caught.value)


def test_bad_options_fail_the_query_at_its_start_naming_the_option(spark: Any, node: Any, unique_stream: Any,
                                                                   tmp_path: Path) -> None:
    stream = unique_stream(1)
    KeyedWriter(node.uri, stream).write(10)

    def base() -> Any:  # a new reader each time: option() changes the reader it is called on
        return spark.readStream.format("millstream").option("controller", node.uri)

    assert "option 'stream': is required" in failure(lambda: base().load())
    assert "option 'maxRowsPerBatch': must be a positive integer" in failure(
        lambda: base().option("stream", stream).option("maxRowsPerBatch", "lots").load())
    assert "option 'schema': is required with serializer=json" in failure(
        lambda: base().option("stream", stream).option("serializer", "json").load())

    # A controller address nothing answers at fails the query at its start, naming it (not after the
    # client's reconnect budget: minutes).
    from tests.spark.test_options import closed_port

    wrong = f"tcp://127.0.0.1:{closed_port()}"
    unreachable = spark.readStream.format("millstream").option("controller", wrong).option("stream", stream).load()
    assert f"option 'controller': cannot reach the store at {wrong}" in failure(
        lambda: run_available_now(unreachable, tmp_path / "unreachable", lambda frame, batch: None))

    missing = source(spark, node, "spark/never-created")
    assert "option 'stream': 'spark/never-created' does not exist" in failure(
        lambda: run_available_now(missing, tmp_path / "missing", lambda frame, batch: None))

    no_value = source(spark, node, stream).selectExpr("offset")
    assert "needs a 'value' column" in failure(
        lambda: run_available_now(no_value, tmp_path / "sink", controller=node.uri, stream=stream))

    # A checkpoint made reading one stream, restarted reading another: its offsets are refused.
    other = unique_stream(1)
    KeyedWriter(node.uri, other).write(5)
    run_available_now(source(spark, node, stream), tmp_path / "switch", lambda frame, batch: None)
    KeyedWriter(node.uri, stream).write(5)
    message = failure(lambda: run_available_now(source(spark, node, other), tmp_path / "switch",
                                                lambda frame, batch: None))
    assert f"is a position of stream {stream!r}, but the query reads {other!r}" in message


def test_a_query_may_ask_for_some_of_the_columns_by_name(spark: Any, node: Any, unique_stream: Any) -> None:
    """The README: ``.schema("value BINARY")`` (any of the source's columns, in any order) reads only
    those -- the cheapest rows for Spark to convert."""
    stream = unique_stream(2)
    with millstream.connect(node.uri) as client, client.event_writer(stream, millstream.BytesSerializer()) as w:
        for number in range(50):
            w.write_event(b"event %d" % number, routing_key=f"k{number % 5}")
    def base() -> Any:  # (a DataFrameReader keeps the schema it was given: a new one each time)
        return spark.read.format("millstream").option("controller", node.uri).option("stream", stream)

    values = base().schema("value BINARY").load()
    assert values.columns == ["value"]
    assert sorted(bytes(row.value) for row in values.collect()) == sorted(b"event %d" % n for n in range(50))
    some = base().schema("offset BIGINT, value BINARY").load().collect()
    assert len(some) == 50 and all(row.offset >= 0 and bytes(row.value).startswith(b"event ") for row in some)
    assert base().load().columns == ["value", "stream", "segment", "offset", "routing_key"], "the default: all five"
