"""The stream reader driven as Spark drives it, in plain Python, against a standalone node: keyed events
written while the stream splits and merges between micro-batches reach the query in per-key order,
each exactly once, within the batch budget; a batch re-planned from its logged offsets (a restart)
reads the same events; the query's reader group receives the committed cut and consumption-based
retention truncates below it; data deleted before the query read it is an error, never skipped;
available-now stops at its target; bad input is refused naming the option."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from pyspark.sql.types import LongType, StringType, StructField, StructType

import millstream
from millstream.client import RetentionPolicy, StreamCut
from millstream.errors import InvalidStreamCutError, TruncatedDataError
from millstream.spark import OptionError, SchemaMismatchError, offset_of
from millstream.spark._offsets import offset_json
from tests.spark.helpers import (
    KeyedWriter,
    check_per_key_order_and_exactly_once,
    cut,
    read_partition,
    reader_for,
    run_batches,
)

JSON_SCHEMA = StructType([StructField("key", StringType()), StructField("seq", LongType()),
                          StructField("stream", StringType()), StructField("segment", LongType()),
                          StructField("offset", LongType())])
JSON_OPTIONS = {"serializer": "json", "schema": "key STRING, seq BIGINT", "metadataColumns": "true"}


def segments(uri: str, stream: str) -> list[int]:
    with millstream.connect(uri) as client:
        return [s.segment_id for s in client.stream_manager().current_segments(stream).segments]


def test_per_key_order_and_exactly_once_while_the_stream_splits_and_merges(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    reader = reader_for(node.uri, stream, JSON_SCHEMA, maxRowsPerBatch="37", **JSON_OPTIONS)
    manager_client = millstream.connect(node.uri)
    manager = manager_client.stream_manager()

    def between(number: int) -> None:
        if number in (0, 3, 6, 9, 12):
            writer.write(64)
        if number == 2:
            manager.split_segment(stream, segments(node.uri, stream)[0])  # 3 segments
        if number == 5:
            manager.split_segment(stream, segments(node.uri, stream)[-1])  # 4 segments
        if number == 8:
            current = segments(node.uri, stream)
            manager.merge_segments(stream, current[:2])  # 3 segments
        if number == 11:
            manager.merge_segments(stream, segments(node.uri, stream))  # 1 segment

    try:
        batches = run_batches(reader, ReadMaxRows(37), between=between, rounds_min=13)
    finally:
        reader.stop()
        manager_client.close()
    assert writer.total == 5 * 64
    check_per_key_order_and_exactly_once(batches, writer.sequence)
    assert all(len(b.rows) <= 37 for b in batches), [len(b.rows) for b in batches]
    segment_ids = {row["segment"] for b in batches for row in b.rows}
    assert len(segment_ids) >= 6, f"the events came from every epoch's segments: {segment_ids}"
    for batch in batches:
        for rows in batch.partitions:
            assert len({r["segment"] for r in rows}) == 1, "one partition, one segment"
            offsets = [r["offset"] for r in rows]
            assert offsets == sorted(offsets)
        assert {r["stream"] for r in batch.rows} == {stream}


def test_a_batch_replayed_from_its_logged_offsets_reads_the_same_events(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(3)
    writer = KeyedWriter(node.uri, stream)
    writer.write(90)
    first = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    start = first.initialOffset()
    assert first.initialOffset() == start, "Spark asks twice; the start is resolved once"
    end = first.latestOffset(start, ReadMaxRows(50))
    planned = [read_partition(first, p) for p in first.partitions(start, end)]
    first.stop()
    writer.write(30)
    manager = millstream.connect(node.uri)
    manager.stream_manager().split_segment(stream, segments(node.uri, stream)[1])
    manager.close()
    # A restart: a new planner process gets the logged offsets as JSON text and re-runs the batch.
    again = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    logged_start, logged_end = json.loads(offset_json(start)), json.loads(offset_json(end))
    replayed = [read_partition(again, p) for p in again.partitions(logged_start, logged_end)]
    assert replayed == planned and sum(map(len, planned)) == 50
    again.stop()


def test_byte_budget_and_read_all_available(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    writer.write(200)
    raw = StructType([StructField("value", __import__("pyspark.sql.types", fromlist=["BinaryType"]).BinaryType()),
                      StructField("offset", LongType())])
    reader = reader_for(node.uri, stream, raw, maxBytesPerBatch="1000")
    try:
        batches = run_batches(reader, reader.getDefaultReadLimit())
        assert isinstance(reader.getDefaultReadLimit(), ReadMaxBytes)
        sizes = [sum(len(r["value"]) + 8 for r in b.rows) for b in batches]
        assert all(size <= 1000 for size in sizes) and sum(len(b.rows) for b in batches) == 200, sizes
        check_per_key_order_and_exactly_once(batches, writer.sequence)
        # ReadAllAvailable (Spark's limit for some triggers) overrides the options: one batch.
        start = reader.initialOffset()
        assert len(run_batches(reader, ReadAllAvailable(), start=start)) == 1
    finally:
        reader.stop()


def test_available_now_stops_at_the_target_and_end_bounds_the_query(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    writer = KeyedWriter(node.uri, stream)
    writer.write(40)
    reader = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        writer.write(40)  # after the target: not for this run
        batches = run_batches(reader, ReadMaxRows(15), start=start)
        assert sum(len(b.rows) for b in batches) == 40
        assert reader.reportLatestOffset() is not None
    finally:
        reader.stop()
    with millstream.connect(node.uri) as client:
        middle = client.stream_manager().tail_cut(stream)
    writer.write(40)
    bounded = reader_for(node.uri, stream, JSON_SCHEMA, end=middle.to_json(), **JSON_OPTIONS)
    try:
        batches = run_batches(bounded, ReadAllAvailable())
        assert sum(len(b.rows) for b in batches) == 80 and batches[-1].end == offset_of(middle)
    finally:
        bounded.stop()


def test_commit_publishes_the_cut_and_consumption_retention_truncates_below_it(node: Any,
                                                                               unique_stream: Any) -> None:
    stream = unique_stream(2, retention=RetentionPolicy.consumption())
    writer = KeyedWriter(node.uri, stream)
    writer.write(100)
    reader = reader_for(node.uri, stream, JSON_SCHEMA, readerGroup="readers", **JSON_OPTIONS)
    scope, name = stream.split("/")
    controller = node.controller
    try:
        start = reader.initialOffset()
        # Registered, no cut published yet: retention keeps everything.
        node.run(controller._apply_retention((scope, name), 0.0))
        with millstream.connect(node.uri) as client:
            assert client.stream_manager().head_cut(stream) == StreamCut(stream, {s: 0 for s in segments(node.uri,
                                                                                                         stream)})
        batches = run_batches(reader, ReadMaxRows(30), start=start)
        assert len(batches) == 4
        # run_batches committed every batch but the last (Spark lags one): the head follows that cut.
        node.run(controller._apply_retention((scope, name), 0.0))
        with millstream.connect(node.uri) as client:
            head = client.stream_manager().head_cut(stream)
        assert offset_of(head) == batches[-2].end
        # The next batch still reads fine; an old position is deleted data -- an error, not a skip.
        assert sum(len(read_partition(reader, p)) for p in reader.partitions(batches[-1].start, batches[-1].end)) \
            == len(batches[-1].rows)
        with pytest.raises(TruncatedDataError, match="lies before the stream's head"):
            reader.partitions(batches[0].start, batches[0].end)
        with pytest.raises(TruncatedDataError, match="lies before the stream's head"):
            reader.latestOffset(batches[0].start, ReadMaxRows(30))
    finally:
        reader.stop()


def test_a_reader_group_that_cannot_be_the_querys_is_an_error_naming_the_option(node: Any,
                                                                                unique_stream: Any) -> None:
    stream, other = unique_stream(1), unique_stream(1)
    # A group of that name exists and subscribes to another stream: the query must not take it over.
    with millstream.connect(node.uri) as client:
        client.reader_group(f"{other.split('/')[0]}/taken", [other]).close()
    reader = reader_for(node.uri, stream, JSON_SCHEMA, readerGroup=f"{other.split('/')[0]}/taken", **JSON_OPTIONS)
    try:
        with pytest.raises(OptionError, match=r"readerGroup.*does not subscribe"):
            reader.initialOffset()
    finally:
        reader.stop()
    # A group in a scope that does not exist.
    reader = reader_for(node.uri, stream, JSON_SCHEMA, readerGroup="no-such-scope/g", **JSON_OPTIONS)
    try:
        with pytest.raises(OptionError, match=r"readerGroup.*no-such-scope/g"):
            reader.initialOffset()
    finally:
        reader.stop()
    # The same name again, once free of those: registered, and a second registration opens it.
    for _ in range(2):
        reader = reader_for(node.uri, stream, JSON_SCHEMA, readerGroup="mine", **JSON_OPTIONS)
        try:
            reader.initialOffset()
        finally:
            reader.stop()
    with millstream.connect(node.uri) as client:
        group = client.reader_group(f"{stream.split('/')[0]}/mine")
        assert list(group.config().streams) == [stream] and group.config().retention == "consumption"
        group.close()


def test_reading_a_range_retention_deleted_is_an_error(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    writer = KeyedWriter(node.uri, stream)
    writer.write(10)
    reader = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    try:
        start = reader.initialOffset()
        middle = reader.latestOffset(start, ReadAllAvailable())  # an event boundary, where a cut may land
        writer.write(10)
        end = reader.latestOffset(middle, ReadAllAvailable())
        (partition,) = reader.partitions(start, end)  # planned; then the stream is truncated under the task
        with millstream.connect(node.uri) as client:
            client.stream_manager().truncate_stream(stream, cut(middle, stream))
        with pytest.raises(TruncatedDataError, match="does not skip them"):
            read_partition(reader, partition)
    finally:
        reader.stop()


def test_bad_input_is_refused_before_anything_is_read(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    KeyedWriter(node.uri, stream).write(5)
    missing = reader_for(node.uri, "spark/never-created", JSON_SCHEMA, **JSON_OPTIONS)
    with pytest.raises(OptionError, match="option 'stream': 'spark/never-created' does not exist"):
        missing.initialOffset()
    reader = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    try:
        other = offset_of(StreamCut("spark/other", {0: 0}))
        with pytest.raises(InvalidStreamCutError, match="position of stream 'spark/other'"):
            reader.latestOffset(other, ReadAllAvailable())
        with pytest.raises(InvalidStreamCutError, match="position of stream 'spark/other'"):
            reader.partitions(other, other)
    finally:
        reader.stop()
    beyond = StreamCut(stream, {0: 10**6})
    for option in ("start", "end"):
        bad = reader_for(node.uri, stream, JSON_SCHEMA, **{option: beyond.to_json()}, **JSON_OPTIONS)
        with pytest.raises(OptionError, match=f"option '{option}': is not a position of"):
            bad.initialOffset()
        bad.stop()
    with millstream.connect(node.uri) as client:
        tail = client.stream_manager().tail_cut(stream)
    inverted = reader_for(node.uri, stream, JSON_SCHEMA, start=tail.to_json(),
                          end=StreamCut(stream, {0: 0}).to_json(), **JSON_OPTIONS)
    with pytest.raises(OptionError, match="option 'end': lies before the start"):
        inverted.initialOffset()
    inverted.stop()
    with pytest.raises(OptionError, match="option 'serializer'"):
        reader_for(node.uri, stream, StructType([StructField("key", StringType())]))


def dead_letters(uri: str, stream: str) -> list[dict[str, Any]]:
    with millstream.connect(uri) as client:
        tail = client.stream_manager().tail_cut(stream)
        letters = []
        for segment, length in tail.segment_names().items():
            reader = client.segment_reader(segment)
            while reader.offset < length:
                letters.extend(json.loads(e.value) for e in reader.read_events())
            reader.close()
    return sorted(letters, key=lambda letter: (letter["segment"], letter["offset"]))


def test_an_event_that_does_not_decode_goes_to_the_dead_letter_stream_once(node: Any, unique_stream: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``deadLetterStream`` a bad event leaves the batch for that stream, with its position and
    the reason; re-reading its range (a retried task, a re-run batch) does not write it again."""
    import base64

    from millstream.spark import _reader

    stream, letters_stream = unique_stream(1), unique_stream(1)
    writer = KeyedWriter(node.uri, stream)
    writer.write(10)
    with millstream.connect(node.uri) as client, client.event_writer(stream) as raw:
        raw.write_event(b'{"key": 5, "seq": 1}')
        raw.write_event(b"\xff garbage")
    writer.write(10)
    monkeypatch.setattr(_reader, "_query_id", lambda: "q-letters")
    reader = reader_for(node.uri, stream, JSON_SCHEMA, deadLetterStream=letters_stream, **JSON_OPTIONS)
    try:
        batches = run_batches(reader, ReadAllAvailable())
        (partition,) = reader.partitions(batches[0].start, batches[0].end)
        assert len(read_partition(reader, partition)) == 20, "a retried task reads the same range"
    finally:
        reader.stop()
    assert len(batches) == 1 and len(batches[0].rows) == 20
    check_per_key_order_and_exactly_once(batches, writer.sequence)
    letters = dead_letters(node.uri, letters_stream)
    assert [(letter["stream"], letter["segment"]) for letter in letters] == [(stream, 0)] * 2, letters
    assert [base64.b64decode(letter["payload_base64"]) for letter in letters] == [b'{"key": 5, "seq": 1}',
                                                                                   b"\xff garbage"]
    offsets = [letter["offset"] for letter in letters]
    assert "field 'key' expects a string" in letters[0]["reason"] and "is not JSON" in letters[1]["reason"]
    assert all(f"at offset {offset}" in letter["reason"] for offset, letter in zip(offsets, letters, strict=True))
    # Without the option the same batch fails, naming the first bad event's position.
    plain = reader_for(node.uri, stream, JSON_SCHEMA, **JSON_OPTIONS)
    try:
        with pytest.raises(SchemaMismatchError, match=f"segment 0 at offset {offsets[0]} does not fit"):
            run_batches(plain, ReadAllAvailable())
    finally:
        plain.stop()
    missing = reader_for(node.uri, stream, JSON_SCHEMA, deadLetterStream="spark/never-created", **JSON_OPTIONS)
    with pytest.raises(OptionError, match="option 'deadLetterStream': 'spark/never-created' does not exist"):
        missing.initialOffset()
    missing.stop()


def test_planning_a_row_budget_reads_a_sample_not_every_event(node: Any, unique_stream: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: ``latestOffset`` counted a batch's events by reading them all (over 100 ms a batch
    at 142,857 rows).  Now it reads at most ``limits.SPARK_PLAN_SAMPLE_BYTES`` of a segment and places
    the batch's end at a boundary the store knows; events of one size keep it within the cap."""
    from millstream import limits
    from millstream.spark import _reader

    stream = unique_stream(1)
    with millstream.connect(node.uri) as client, client.event_writer(stream, millstream.BytesSerializer()) as w:
        for number in range(30_000):
            w.write_event(number.to_bytes(4, "big") * 25)  # 100 bytes each
    asked: list[int] = []

    def counting(client: Any, span: Any, rows: int | None, size: int | None) -> tuple[int, int]:
        end, events = measure(client, span, rows, size)
        asked.append(end - span.start_offset)
        return end, events

    measure = _reader.measure
    monkeypatch.setattr(_reader, "measure", counting)
    raw = StructType([StructField("value", __import__("pyspark.sql.types", fromlist=["BinaryType"]).BinaryType())])
    reader = reader_for(node.uri, stream, raw, maxRowsPerBatch="20000")
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert asked and sum(asked) <= limits.SPARK_PLAN_SAMPLE_BYTES, asked
        rows = sum(len(read_partition(reader, p)) for p in reader.partitions(start, end))
        assert 0 < rows <= 20_000, rows
        batches = run_batches(reader, reader.getDefaultReadLimit())
        values = [row["value"] for batch in batches for row in batch.rows]
        assert all(len(batch.rows) <= 20_000 for batch in batches)
        assert values == [number.to_bytes(4, "big") * 25 for number in range(30_000)], "each once, in order"
    finally:
        reader.stop()
