"""Every writer class of the sink, end to end in plain Python against a standalone node (the task side
through the class's own ``write``, Spark's task context stood in for): a batch commits once, a replay
of it -- new transactions, the same batch id -- commits nothing, and the fence records the batch, for
the row writer as for the Arrow writer and for ``df.write`` with a fence.  Beside them: rows reach the
store a buffer at a time (never through the per-event writer), one client serves a process's tasks
and commits, and the driver commits, waits for the merge and aborts through the client's public API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

import millstream
from millstream.client import AsyncClient, AsyncTransaction, Transaction
from millstream.spark import (
    MillstreamBatchArrowWriter,
    MillstreamBatchWriter,
    MillstreamCommitMessage,
    MillstreamStreamArrowWriter,
    MillstreamStreamWriter,
    _store,
    _writer,
    fence_key,
    parse_sink_options,
)
from millstream.spark._writer import TaskIdentity
from tests.spark.test_sink_protocol import read_stream, statuses

SCHEMA = StructType([StructField("value", BinaryType()), StructField("routing_key", StringType())])
ARROW_SCHEMA = pa.schema([("value", pa.binary()), ("routing_key", pa.string())])
STREAMING = (MillstreamStreamWriter, MillstreamStreamArrowWriter)
BATCH = (MillstreamBatchWriter, MillstreamBatchArrowWriter)


def rows_of(batch: int, partition: int, count: int) -> list[dict[str, Any]]:
    return [{"value": f"b{batch}-p{partition}-r{row}".encode(), "routing_key": f"key-{row % 5}"}
            for row in range(count)]


def feed(writer_class: type, rows: list[dict[str, Any]]) -> Iterator[Any]:
    """What Spark hands ``write``: ``Row``s, or Arrow record batches (two of them, to cross one)."""
    if writer_class in (MillstreamStreamArrowWriter, MillstreamBatchArrowWriter):
        half = len(rows) // 2
        return iter([pa.RecordBatch.from_pylist(part, schema=ARROW_SCHEMA) for part in (rows[:half], rows[half:])])
    return iter([Row(**row) for row in rows])


def new_writer(writer_class: type, node: Any, stream: str, **options: str) -> Any:
    """A fresh writer, as Spark builds one for each task and for every commit and abort."""
    return writer_class(parse_sink_options({"controller": node.uri, "stream": stream, **options}), SCHEMA)


def run_task(monkeypatch: pytest.MonkeyPatch, writer: Any, rows: list[dict[str, Any]], *, query: str, batch: int,
             partition: int, attempt: int = 0) -> MillstreamCommitMessage:
    identity = TaskIdentity(query, batch if type(writer) in STREAMING else -1, partition, attempt)
    monkeypatch.setattr(_writer, "current_task", lambda *, streaming: identity)
    return writer.write(feed(type(writer), rows))


def expected(*batches: int, partitions: int = 2, count: int = 6) -> list[str]:
    return sorted(f"b{b}-p{p}-r{r}" for b in batches for p in range(partitions) for r in range(count))


@pytest.mark.parametrize("writer_class", STREAMING, ids=lambda c: c.__name__)
def test_each_streaming_writer_commits_a_batch_once_and_its_replay_not_at_all(
        writer_class: type, node: Any, unique_stream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = unique_stream(2)

    def batch(number: int, attempt: int = 0) -> list[MillstreamCommitMessage]:
        return [run_task(monkeypatch, new_writer(writer_class, node, stream), rows_of(number, p, 6), query="q7",
                         batch=number, partition=p, attempt=attempt) for p in range(2)]

    first = batch(0)
    assert read_stream(node, stream) == [], "nothing is visible before the driver commits"
    new_writer(writer_class, node, stream).commit(first, 0)
    assert read_stream(node, stream) == expected(0), "commit returns once the batch is readable"
    with millstream.connect(node.uri) as client:
        assert client.get_fence(stream, fence_key("q7")) == 0, "the commit recorded the batch for the query"
    replay = batch(0, attempt=1)  # Spark re-runs batch 0 after a crash between the commit and its log
    new_writer(writer_class, node, stream).commit(replay, 0)
    assert read_stream(node, stream) == expected(0), "the replay wrote nothing"
    assert statuses(node, stream, replay) <= {"aborting", "aborted"}
    second = batch(1)
    new_writer(writer_class, node, stream).commit(second, 1)
    assert read_stream(node, stream) == expected(0, 1)
    with millstream.connect(node.uri) as client:
        assert client.get_fence(stream, fence_key("q7")) == 1
    aborted = batch(2)
    new_writer(writer_class, node, stream).abort([aborted[0], None], 2)
    assert statuses(node, stream, aborted[:1]) <= {"aborting", "aborted"}


@pytest.mark.parametrize("writer_class", BATCH, ids=lambda c: c.__name__)
def test_each_batch_writer_with_a_fence_writes_a_job_once(writer_class: type, node: Any, unique_stream: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    stream = unique_stream(2)
    fenced = {"fenceKey": "daily-load", "fenceValue": "20240506"}

    def job(attempt: int) -> list[MillstreamCommitMessage]:
        return [run_task(monkeypatch, new_writer(writer_class, node, stream, **fenced), rows_of(0, p, 6),
                         query="", batch=-1, partition=p, attempt=attempt) for p in range(2)]

    new_writer(writer_class, node, stream, **fenced).commit(job(0))
    assert read_stream(node, stream) == expected(0)
    new_writer(writer_class, node, stream, **fenced).commit(job(1))  # the job run again
    assert read_stream(node, stream) == expected(0), "the same fence writes nothing twice"
    unfenced = [run_task(monkeypatch, new_writer(writer_class, node, stream), rows_of(9, 0, 3), query="", batch=-1,
                         partition=0)]
    new_writer(writer_class, node, stream).commit(unfenced)
    assert len(read_stream(node, stream)) == 12 + 3, "without a fence a job always writes"


def test_the_stream_writers_share_one_commit_and_abort() -> None:
    """The row writer's commit is the Arrow writer's: defined once, on the class the other extends."""
    assert issubclass(MillstreamStreamArrowWriter, MillstreamStreamWriter)
    assert MillstreamStreamArrowWriter.commit is MillstreamStreamWriter.commit
    assert MillstreamStreamArrowWriter.abort is MillstreamStreamWriter.abort
    assert MillstreamBatchArrowWriter.commit is MillstreamBatchWriter.commit


@pytest.mark.parametrize("writer_class", STREAMING + BATCH, ids=lambda c: c.__name__)
def test_rows_reach_the_store_a_buffer_at_a_time_not_an_event_at_a_time(
        writer_class: type, node: Any, unique_stream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = unique_stream(3)

    def per_event(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an event went through the per-event writer")

    monkeypatch.setattr(Transaction, "write_event", per_event)
    monkeypatch.setattr(AsyncTransaction, "write_event", per_event)
    message = run_task(monkeypatch, new_writer(writer_class, node, stream), rows_of(4, 0, 5000), query="q", batch=4,
                       partition=0)
    assert message.events == 5000
    if writer_class in STREAMING:
        new_writer(writer_class, node, stream).commit([message], 4)
    else:
        new_writer(writer_class, node, stream).commit([message])
    assert read_stream(node, stream) == sorted(f"b4-p0-r{r}" for r in range(5000))


def test_one_client_serves_every_task_and_commit_of_a_process(node: Any, unique_stream: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark reuses its Python workers: a batch must not pay for a client (a thread, an event loop, a
    connection) per task and per commit."""
    stream = unique_stream(2)
    _store.close_shared_clients()
    opened: list[str] = []
    connect = millstream.connect

    def counting(uri: str, **kwargs: Any) -> Any:
        opened.append(uri)
        return connect(uri, **kwargs)

    monkeypatch.setattr(_store.millstream, "connect", counting)
    try:
        for number in range(3):
            messages = [run_task(monkeypatch, new_writer(MillstreamStreamArrowWriter, node, stream),
                                 rows_of(number, p, 4), query="q", batch=number, partition=p) for p in range(2)]
            new_writer(MillstreamStreamArrowWriter, node, stream).commit(messages, number)
        assert opened == [node.uri], f"one client for 6 tasks and 3 commits, not {len(opened)}"
        assert read_stream(node, stream) == expected(0, 1, 2, count=4)
    finally:
        _store.close_shared_clients()


@pytest.mark.parametrize("writer_class", STREAMING + BATCH, ids=lambda c: c.__name__)
def test_the_driver_commits_waits_and_aborts_through_the_public_client_api_only(
        writer_class: type, node: Any, unique_stream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22: the driver's side of the sink -- the fenced commit, the wait until the batch is
    merged (readable), the abort -- uses the client's public API: it reaches for no controller
    method (``AsyncClient.controller()``) and sleeps on no thread (``time.sleep``) itself."""
    stream = unique_stream(2)
    streaming = writer_class in STREAMING

    def tasks(batch: int) -> list[MillstreamCommitMessage]:
        return [run_task(monkeypatch, new_writer(writer_class, node, stream), rows_of(batch, p, 6), query="q",
                         batch=batch, partition=p) for p in range(2)]

    committed, aborted = tasks(0), tasks(1)

    def reached_around(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the sink's driver side went around the client's public API")

    with monkeypatch.context() as patched:
        patched.setattr(AsyncClient, "controller", reached_around)
        patched.setattr(time, "sleep", reached_around)
        driver = new_writer(writer_class, node, stream)
        driver.commit(committed, 0) if streaming else driver.commit(committed)
        driver = new_writer(writer_class, node, stream)
        driver.abort(aborted, 1) if streaming else driver.abort(aborted)
    assert statuses(node, stream, committed) == {"committed"}, "commit returned once the batch was merged"
    assert statuses(node, stream, aborted) <= {"aborting", "aborted"}
    assert read_stream(node, stream) == expected(0)
