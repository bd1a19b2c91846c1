"""The sink's behaviour the sampled mutants of ``spark_pipeline/_writer.py`` found unchecked
(MUTATION.md, issue 24), in plain Python against the session's standalone node, as
``test_sink_protocol.py`` drives the protocol (no SparkSession; where a writer reads its Spark task
context, a stand-in context is installed): a commit message is a value; a ``df.write`` task runs
outside any micro-batch; a task that fails after beginning its transaction aborts it; a row value
JSON cannot hold is refused with a ``TypeError`` naming its type."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, DayTimeIntervalType, StringType, StructField, StructType

from millstream.spark import MillstreamBatchReader, MillstreamCommitMessage, parse_sink_options, parse_source_options
from millstream.spark import _writer as writer_module
from millstream.spark._writer import (
    MillstreamBatchArrowWriter,
    MillstreamBatchWriter,
    TaskIdentity,
    _Encoding,
    _SinkProtocol,
)

RAW = StructType([StructField("value", BinaryType()), StructField("routing_key", StringType())])


class _BatchJobTaskContext:
    """A stand-in for ``pyspark.TaskContext`` in a ``df.write`` task: a partition and an attempt, and
    none of the micro-batch properties (batch id, query id) a streaming task's context carries."""

    def __init__(self, partition: int) -> None:
        self._partition = partition

    @classmethod
    def get(cls) -> _BatchJobTaskContext:
        return cls(3)

    def partitionId(self) -> int:  # (Spark's name)
        return self._partition

    def attemptNumber(self) -> int:  # (Spark's name)
        return 0

    def getLocalProperty(self, key: str) -> str | None:  # (Spark's name)
        return None


def _read_payloads(node: Any, stream: str) -> list[bytes]:
    parsed = parse_source_options({"controller": node.uri, "stream": stream})
    reader = MillstreamBatchReader(parsed, StructType([StructField("value", BinaryType())]))
    return sorted(row["value"] for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist())


def _statuses(node: Any, stream: str) -> list[str]:
    scope, name = stream.split("/")
    return sorted(s.value for s in node.run(node.controller.list_transactions(scope, name)).values())


def test_a_commit_message_is_an_immutable_hashable_value() -> None:
    """What a task reports travels to the driver as it was made: its fields cannot be reassigned,
    and equal messages are equal and hash alike.  Kills ``dataclass(frozen=True)`` -> ``frozen=False``
    on ``MillstreamCommitMessage`` (which made it mutable and unhashable)."""
    message = MillstreamCommitMessage(str(uuid.uuid4()), "q1", 0, 1, 0, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.txn_id = None  # type: ignore[misc]  # (assigning to a frozen field is the check under test)
    twin = dataclasses.replace(message)
    assert twin == message and hash(twin) == hash(message) and len({message, twin}) == 1


@pytest.mark.parametrize("writer_class", [MillstreamBatchWriter, MillstreamBatchArrowWriter])
def test_a_df_write_task_writes_outside_any_micro_batch(node: Any, unique_stream: Any,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        writer_class: type[MillstreamBatchWriter]) -> None:
    """A ``df.write`` task's context has no batch id or query id: the batch writers (rows and Arrow)
    write and commit all the same.  Kills ``current_task(streaming=False)`` -> ``True`` in either
    batch writer's ``write`` (the task refused itself as "outside a micro-batch")."""
    stream = unique_stream(1)
    monkeypatch.setattr(writer_module, "TaskContext", _BatchJobTaskContext)
    writer = writer_class(parse_sink_options({"controller": node.uri, "stream": stream}), RAW)
    if writer_class is MillstreamBatchArrowWriter:
        rows: Iterator[Any] = iter([pa.RecordBatch.from_pydict(
            {"value": [b"e0", b"e1"], "routing_key": ["k", "k"]},
            schema=pa.schema([("value", pa.binary()), ("routing_key", pa.string())]))])
    else:
        rows = iter([Row(value=b"e0", routing_key="k"), Row(value=b"e1", routing_key="k")])
    message = writer.write(rows)
    assert (message.partition_id, message.batch_id, message.events) == (3, -1, 2) and message.txn_id
    writer_class(parse_sink_options({"controller": node.uri, "stream": stream}), RAW).commit([message])
    assert _read_payloads(node, stream) == [b"e0", b"e1"]


def test_a_task_that_fails_after_beginning_its_transaction_aborts_it(node: Any, unique_stream: Any) -> None:
    """A task whose rows fail midway (after its first chunk went into a new transaction) aborts that
    transaction itself rather than leaving it open until its lease lapses, and reports its own error.
    Kills ``if txn is not None:`` -> ``if txn is None:`` in ``_SinkProtocol._write_events``."""
    stream = unique_stream(1)
    protocol = _SinkProtocol(parse_sink_options({"controller": node.uri, "stream": stream,
                                                 "transactionLeaseSeconds": "600"}), RAW)

    def events() -> Iterator[tuple[pa.Array, pa.Array]]:
        yield pa.array([b"e0"], type=pa.binary()), pa.array(["k"], type=pa.string())
        raise RuntimeError("the task's input failed")

    with pytest.raises(RuntimeError, match="the task's input failed"):
        protocol.write_events(events(), TaskIdentity("q1", 0, 0, 0))
    statuses = _statuses(node, stream)
    assert len(statuses) == 1 and statuses[0] in {"aborting", "aborted"}, statuses
    assert _read_payloads(node, stream) == []


def test_a_row_value_json_cannot_hold_is_refused_naming_its_type() -> None:
    """``serializer=json``: a column JSON has no form for (a day-time interval) fails the task with
    a ``TypeError`` naming the type, from the row writer and the Arrow writer alike.  Kills ``if
    isinstance(value, Row):`` -> ``if not isinstance(...)`` in ``_json_value`` (an unsupported value
    then failed with an ``AttributeError`` about ``asDict``)."""
    options = parse_sink_options({"controller": "tcp://h:1", "stream": "sc/st", "serializer": "json"})
    schema = StructType([StructField("pause", DayTimeIntervalType())])
    encoding = _Encoding.of(options, schema)
    interval = datetime.timedelta(seconds=90)
    with pytest.raises(TypeError, match="cannot write timedelta as JSON"):
        list(encoding.rows([Row(pause=interval)]))
    with pytest.raises(TypeError, match="cannot write timedelta as JSON"):
        list(encoding.batches([pa.RecordBatch.from_pydict({"pause": [interval]})]))
