"""The sink's commit protocol driven as Spark drives it, in plain Python, against a standalone node: tasks
write into store transactions and report (transaction, query, batch); the driver commits a batch with
the fenced multi-commit on a fresh writer each time (as Spark's commit process builds one); a replayed
batch commits nothing and aborts its new transactions; a retried commit is harmless; ``abort`` skips
failed tasks' ``None`` slots and their orphans expire by lease; a lapsed lease fails the commit with
nothing committed; a checkpoint older than its output is refused; rows become events by the
``serializer`` (a JSON round trip through the source); bad DataFrames and messages are refused."""

from __future__ import annotations

import datetime
import decimal
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import millstream
from millstream.errors import InternalError, TransactionNotOpenError
from millstream.spark import (
    FenceAheadError,
    MillstreamBatchReader,
    MillstreamCommitMessage,
    MillstreamStreamArrowWriter,
    MillstreamStreamWriter,
    OptionError,
    SchemaMismatchError,
    fence_key,
    parse_sink_options,
    parse_source_options,
)
from millstream.spark._writer import TaskIdentity, _Encoding, _SinkProtocol

RAW = StructType([StructField("value", BinaryType()), StructField("routing_key", StringType())])


def sink_options(node: Any, stream: str, **options: str) -> Any:
    return parse_sink_options({"controller": node.uri, "stream": stream, **options})


def task(node: Any, stream: str, batch: int, partition: int, count: int, *, attempt: int = 0, query: str = "q1",
         lease: str = "60") -> MillstreamCommitMessage:
    """One task of a batch: ``count`` rows ``b<batch>-p<partition>-r<row>`` routed by partition."""
    protocol = _SinkProtocol(sink_options(node, stream, transactionLeaseSeconds=lease), RAW)
    payloads = pa.array([f"b{batch}-p{partition}-r{row}".encode() for row in range(count)], type=pa.binary())
    keys = pa.array([f"key-{partition}"] * count, type=pa.string())
    return protocol.write_events([(payloads, keys)], TaskIdentity(query, batch, partition, attempt))


def driver(node: Any, stream: str) -> MillstreamStreamArrowWriter:
    """A fresh writer, as Spark's commit process builds one for every commit and abort."""
    return MillstreamStreamArrowWriter(sink_options(node, stream), RAW)


def read_stream(node: Any, stream: str, serializer: str = "raw", spark_schema: StructType | None = None, /,
                **options: str) -> list[Any]:
    """Every event of ``stream`` through the batch reader: the payloads (sorted), or rows of ``spark_schema``."""
    parsed = parse_source_options({"controller": node.uri, "stream": stream, "serializer": serializer, **options})
    reader = MillstreamBatchReader(parsed, spark_schema or StructType([StructField("value", BinaryType())]))
    rows = [row for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]
    return rows if spark_schema is not None else sorted(r["value"].decode() for r in rows)


def status(node: Any, stream: str, txn: str | None) -> str:
    assert txn is not None
    scope, name = stream.split("/")
    return str(node.run(node.controller.get_transaction(scope, name, uuid.UUID(txn).hex)).status.value)


def statuses(node: Any, stream: str, messages: Sequence[MillstreamCommitMessage | None]) -> set[str]:
    return {status(node, stream, m.txn_id) for m in messages if m is not None}


def fence(node: Any, stream: str, query: str = "q1") -> int | None:
    with millstream.connect(node.uri) as client:
        return client.get_fence(stream, fence_key(query))


def expected(batches: dict[int, int], partitions: int = 3) -> list[str]:
    return sorted(f"b{b}-p{p}-r{r}" for b, count in batches.items() for p in range(partitions) for r in range(count))


def test_a_batch_commits_once_and_its_replay_commits_nothing(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    first = [task(node, stream, 0, p, 4) for p in range(3)]
    assert {m.batch_id for m in first} == {0} and all(m.txn_id for m in first) and [m.events for m in first] == [4] * 3
    assert read_stream(node, stream) == [], "nothing is visible before the driver commits"
    driver(node, stream).commit(first, 0)
    assert read_stream(node, stream) == expected({0: 4}), "commit returns once the batch is readable"
    assert fence(node, stream) == 0 and statuses(node, stream, first) == {"committed"}
    # The driver died after the sink's commit and before Spark's commit log: batch 0 runs again.
    replay = [task(node, stream, 0, p, 4, attempt=1) for p in range(3)]
    driver(node, stream).commit(replay, 0)
    assert read_stream(node, stream) == expected({0: 4}), "the replay wrote nothing"
    assert statuses(node, stream, replay) <= {"aborting", "aborted"} and fence(node, stream) == 0
    driver(node, stream).commit(first, 0)  # a retried commit call (a lost reply): harmless
    second = [task(node, stream, 1, p, 2) for p in range(3)]
    driver(node, stream).commit(second, 1)
    assert read_stream(node, stream) == expected({0: 4, 1: 2}) and fence(node, stream) == 1
    # Another checkpoint is another query id: its batch 0 is new.
    other = [task(node, stream, 0, p, 1, query="q2") for p in range(3)]
    driver(node, stream).commit(other, 0)
    assert fence(node, stream, "q2") == 0 and len(read_stream(node, stream)) == 12 + 6 + 3


def test_abort_skips_failed_slots_and_orphans_expire_by_lease(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    reported = [task(node, stream, 0, p, 3, lease="1") for p in range(2)]
    orphan = task(node, stream, 0, 2, 3, lease="1")  # its task died after writing: Spark never saw its message
    driver(node, stream).abort([*reported, None], 0)
    assert statuses(node, stream, reported) <= {"aborting", "aborted"}
    assert status(node, stream, orphan.txn_id) == "open"
    driver(node, stream).abort([*reported, None], 0)  # aborting twice is harmless
    time.sleep(1.2)
    # The node's own tick (every few seconds) may have expired the lease first; either way it ends here.
    node.run(node.controller.expire_leases())
    assert status(node, stream, orphan.txn_id) in {"aborting", "aborted"}, "a lapsed lease aborts the orphan"
    assert read_stream(node, stream) == [] and fence(node, stream) is None


def test_a_lapsed_lease_fails_the_commit_with_nothing_committed(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    fine = task(node, stream, 0, 0, 2)
    lapsed = task(node, stream, 0, 1, 2, lease="1")
    time.sleep(1.2)
    node.run(node.controller.expire_leases())
    with pytest.raises(TransactionNotOpenError):
        driver(node, stream).commit([fine, lapsed], 0)
    assert read_stream(node, stream) == [] and fence(node, stream) is None
    assert status(node, stream, fine.txn_id) == "open", "nothing changed: Spark aborts the batch next"
    driver(node, stream).abort([fine, lapsed], 0)
    assert status(node, stream, fine.txn_id) in {"aborting", "aborted"}
    retried = [task(node, stream, 0, p, 2, attempt=1) for p in range(2)]  # the restart re-runs batch 0
    driver(node, stream).commit(retried, 0)
    assert read_stream(node, stream) == expected({0: 2}, partitions=2)


def test_a_checkpoint_older_than_its_output_is_refused(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    driver(node, stream).commit([task(node, stream, 5, 0, 1)], 5)
    stale = [task(node, stream, 3, 0, 1)]
    with pytest.raises(FenceAheadError, match="records batch 5 of query q1 as committed, but Spark asks to commit "
                                              "batch 3"):
        driver(node, stream).commit(stale, 3)
    assert statuses(node, stream, stale) <= {"aborting", "aborted"} and read_stream(node, stream) == ["b5-p0-r0"]


def test_a_batch_without_rows_commits_nothing(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    empty = [task(node, stream, 0, p, 0) for p in range(2)]
    assert [m.txn_id for m in empty] == [None, None] and [m.events for m in empty] == [0, 0]
    driver(node, stream).commit(empty, 0)
    driver(node, stream).abort(empty, 0)
    assert fence(node, stream) is None and read_stream(node, stream) == []


def test_messages_that_do_not_belong_to_the_batch_are_refused(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    mine = task(node, stream, 2, 0, 1)
    other_batch = task(node, stream, 1, 1, 1)
    other_query = task(node, stream, 2, 1, 1, query="q9")
    for messages, fragment in (([mine, other_batch], "a commit message of batch 1"),
                               ([mine, other_query], "several queries"), ([mine, None], "missing"),
                               ([mine, "x"], "another sink")):
        with pytest.raises(InternalError, match=fragment):
            driver(node, stream).commit(messages, 2)  # type: ignore[arg-type]
    assert statuses(node, stream, [mine, other_batch, other_query]) == {"open"}, "refused before any store call"
    driver(node, stream).abort([mine, other_query, other_batch][:1], 2)


def events_of(chunks: Any) -> list[tuple[bytes, str | None]]:
    """What the encoding's chunks (payloads, keys) hold, one pair per row."""
    pairs: list[tuple[bytes, str | None]] = []
    for payloads, keys in chunks:
        pairs.extend(zip(payloads.to_pylist(), [None] * len(payloads) if keys is None else keys.to_pylist(),
                         strict=True))
    return pairs


def test_rows_and_arrow_batches_become_the_same_events() -> None:
    options = parse_sink_options({"controller": "tcp://h:1", "stream": "sc/st"})
    raw = StructType([StructField("routing_key", StringType()), StructField("value", StringType())])
    encoding = _Encoding.of(options, raw)
    rows = [Row(routing_key="k1", value="é1"), Row(routing_key=None, value="two")]
    batch = pa.RecordBatch.from_pylist([r.asDict() for r in rows], schema=pa.schema([("routing_key", pa.string()),
                                                                                      ("value", pa.string())]))
    assert events_of(encoding.rows(rows)) == events_of(encoding.batches([batch])) == [("é1".encode(), "k1"),
                                                                                      (b"two", None)]
    as_json = _Encoding.of(parse_sink_options({"controller": "tcp://h:1", "stream": "sc/st", "serializer": "json",
                                               "routingKeyColumn": "value"}), raw)
    assert events_of(as_json.rows(rows[:1])) == events_of(as_json.batches([batch.slice(0, 1)])) == \
        [(b'{"routing_key":"k1","value":"\xc3\xa91"}', "\u00e91")]
    with pytest.raises(SchemaMismatchError, match="a row's 'value' is null"):
        list(encoding.rows([Row(routing_key="k", value=None)]))
    with pytest.raises(SchemaMismatchError, match="a row's 'value' is null"):
        list(encoding.batches([pa.RecordBatch.from_pylist([{"routing_key": "k", "value": None}],
                                                          schema=batch.schema)]))


def test_bad_dataframes_are_refused_when_the_query_starts() -> None:
    base = {"controller": "tcp://h:1", "stream": "sc/st"}
    no_value = StructType([StructField("payload", BinaryType())])
    with pytest.raises(SchemaMismatchError, match="option 'serializer' is raw: the DataFrame needs a 'value' column"):
        MillstreamStreamWriter(parse_sink_options(base), no_value)
    with pytest.raises(SchemaMismatchError, match="must be binary or string, not int"):
        MillstreamStreamWriter(parse_sink_options(base), StructType([StructField("value", IntegerType())]))
    with pytest.raises(OptionError, match="option 'routingKeyColumn': the DataFrame has no column 'sensor'"):
        MillstreamStreamWriter(parse_sink_options({**base, "routingKeyColumn": "sensor"}), RAW)
    with pytest.raises(SchemaMismatchError, match="option 'routingKeyColumn'"):
        MillstreamStreamWriter(parse_sink_options(base), StructType([StructField("value", BinaryType()),
                                                                     StructField("routing_key", LongType())]))
    json_sink = MillstreamStreamWriter(parse_sink_options({**base, "serializer": "json"}), no_value)
    assert json_sink is not None, "json writes whole rows: any columns do"


def test_json_rows_round_trip_through_the_source(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(2)
    schema = StructType([
        StructField("sensor", StringType()), StructField("n", LongType()), StructField("reading", DoubleType()),
        StructField("hot", BooleanType()), StructField("at", TimestampType()), StructField("day", DateType()),
        StructField("total", DecimalType(10, 3)), StructField("raw", BinaryType()),
        StructField("tags", ArrayType(StringType()))])
    at = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    rows = [{"sensor": f"s{n}", "n": n, "reading": n / 3, "hot": n % 2 == 0, "at": at + datetime.timedelta(hours=n),
             "day": datetime.date(2024, 1, 1 + n), "total": decimal.Decimal(f"{n}.125"), "raw": bytes([n, 255]),
             "tags": ["a", str(n)]} for n in range(5)]
    rows.append({name: None for name in schema.fieldNames()})
    from pyspark.sql.pandas.types import to_arrow_schema
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema, timezone="UTC"))
    protocol = _SinkProtocol(sink_options(node, stream, serializer="json", routingKeyColumn="sensor"), schema)
    message = protocol.write_events(protocol._encoding.batches([batch]), TaskIdentity("q", 0, 0, 0))
    driver_side = MillstreamStreamWriter(sink_options(node, stream, serializer="json"), schema)
    driver_side.commit([message], 0)
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
    back = read_stream(node, stream, "json", schema, schema=ddl)
    assert sorted(back, key=lambda r: (r["n"] is None, r["n"])) == rows


def test_an_event_that_does_not_fit_the_schema_names_where_it_lies(node: Any, unique_stream: Any) -> None:
    stream = unique_stream(1)
    with millstream.connect(node.uri) as client, client.event_writer(stream) as writer:
        writer.write_event(json.dumps({"n": 1}).encode())
        writer.write_event(json.dumps({"n": "two"}).encode())
    schema = StructType([StructField("n", LongType())])
    with pytest.raises(SchemaMismatchError, match=r"segment 0 at offset 16 does not fit option 'schema': field 'n' "
                                                  r"expects an integer, got 'two'"):
        read_stream(node, stream, "json", schema, schema="n BIGINT")
    with millstream.connect(node.uri) as client, client.event_writer(stream) as writer:
        writer.write_event(b"\xff not json")
    with pytest.raises(SchemaMismatchError, match="is not JSON"):
        read_stream(node, stream, "json", schema, schema="n BIGINT", start=json.dumps(
            {"positions": {"0": 36}, "stream": stream}))
    string = StructType([StructField("value", StringType())])
    with pytest.raises(SchemaMismatchError, match=r"option 'serializer' is string.*not UTF-8"):
        read_stream(node, stream, "string", string)


def test_an_empty_arrow_batch_is_skipped_and_the_rows_after_it_written(node: Any, unique_stream: Any) -> None:
    """A task's Arrow batches may be empty anywhere (Spark sends them): an empty one is skipped, and
    the rows of the batches after it are written and committed.  Kills ``continue`` -> ``break`` in
    ``_SinkProtocol.write_events``, which lost every row after a leading or middle empty batch."""
    stream = unique_stream(1)
    protocol = _SinkProtocol(sink_options(node, stream), RAW)

    def arrow(rows: list[int]) -> tuple[Any, Any]:
        return (pa.array([f"b0-p0-r{row}".encode() for row in rows], type=pa.binary()),
                pa.array(["key-0"] * len(rows), type=pa.string()))

    message = protocol.write_events([arrow([]), arrow([0, 1]), arrow([]), arrow([2])], TaskIdentity("q1", 0, 0, 0))
    assert message.events == 3 and message.txn_id is not None
    driver(node, stream).commit([message], 0)
    assert read_stream(node, stream) == expected({0: 3}, partitions=1)
