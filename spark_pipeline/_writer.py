"""The exactly-once sink: ``MillstreamStreamWriter`` (rows), ``MillstreamStreamArrowWriter`` (Arrow),
``MillstreamBatchWriter`` and ``MillstreamBatchArrowWriter`` (``df.write``).

Theory of operation (spec/ExactlyOnceSink.tla; DESIGN.md section 7).  Spark commits a micro-batch
in two phases, and the store's stream transactions and its fenced multi-commit are the two halves:

1. *Tasks* (``write``, in executors): each task reads its batch id and the query id from its task
   context -- ``write`` is not given them -- and writes its rows, as events, into one store
   transaction of the output stream, begun at its first row (a task with no rows begins none).  It
   flushes, leaves the transaction open, and returns a ``MillstreamCommitMessage``: (transaction
   id, query id, batch id).  Nothing is visible to readers yet.
2. *The driver* (``commit(messages, batch_id)``, in a Python worker the driver JVM starts, on a
   fresh writer each time -- so it keeps nothing in memory): one call,
   ``commit_transactions(stream, ids, fence=("spark/<query id>", batch_id))``, commits every
   transaction of the batch and records the batch id for the query -- atomically, and only if the
   recorded batch id is lower.  Otherwise the batch was committed before (Spark re-runs the last
   batch of its offset log after a crash that came between the sink's commit and its commit log):
   the call commits nothing, aborts the listed transactions, answers "already committed", and
   ``commit`` succeeds -- the replay writes nothing twice.  The fence is keyed by the query id, which
   a checkpoint keeps across restarts, because batch ids start again at 0 with a new checkpoint.
3. ``abort(messages, batch_id)`` aborts the listed transactions (``None`` slots -- failed tasks --
   are skipped).  Transactions nobody lists (a task killed with its executor or with the driver)
   expire when their lease (``transactionLeaseSeconds``) lapses.

Every writer class is the same protocol (``_SinkProtocol``): the stream writers differ only in what
``write`` is handed -- Spark ``Row``s or Arrow record batches -- and share one ``commit`` and one
``abort``, defined once on ``MillstreamStreamWriter`` (the Arrow writer is its subclass), so no
writer can commit without the fence.  ``df.write`` (the batch writers) commits the same way without
a fence unless the ``fenceKey``/``fenceValue`` options give one.

``commit`` then waits, within a bound, until the store has merged the batch's transactions, so the
batch's events are readable when Spark records it committed: through the client's public transaction
API (each transaction's ``wait_for_completion``, all at once on the client's event loop; the sink
calls no controller method and sleeps nowhere itself).  A transaction
whose lease lapsed before the driver committed it makes the store refuse the whole batch
(``TransactionNotOpenError``, nothing committed); Spark fails the query, and a restart re-runs the
batch.

Output modes, as Spark's Kafka sink has them: every batch's rows are appended to the stream, once.
In *append* mode they are the new result rows; in *complete* mode the whole result table, every
batch (Spark asks the sink to "truncate" first, which a stream cannot: its readers see every
batch's table one after the other); in *update* mode the rows that changed in the batch (Spark's
Python data sources cannot take update mode themselves; ``millstream.spark.register`` routes it
through ``foreachBatch`` and the fenced batch writer -- see ``_modes``).

A row becomes an event by ``serializer``: ``raw`` takes the ``value`` column (binary, or a string as
UTF-8), ``json`` the whole row as a JSON object; the routing key is the ``routingKeyColumn`` column
(default ``routing_key``) when the DataFrame has it.  Rows reach the store a buffer at a time, not
an event at a time: the payloads of a record batch (for the row writer, of a few thousand rows) are
one Arrow binary array, routed by distinct key and framed in C (``_segment_io.route``,
``frame_events``), then appended to the transaction's segments (``TransactionAppender``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import decimal
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from millstream import limits
from millstream.client import CommitOutcome, StreamRouter, TransactionStatus
from millstream.errors import (
    InternalError,
    InvalidArgumentError,
    RequestTimeoutError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.spark._errors import FenceAheadError, OptionError, SchemaMismatchError
from millstream.spark._options import SinkOptions
from millstream.spark._segment_io import TransactionAppender, frame_events, route
from millstream.spark._store import StoreSession
from millstream.spark._timeline import span as timeline_span

__all__ = [
    "MillstreamBatchArrowWriter",
    "MillstreamBatchWriter",
    "MillstreamCommitMessage",
    "MillstreamStreamArrowWriter",
    "MillstreamStreamWriter",
    "TaskIdentity",
    "fence_key",
]

_log = logging.getLogger("millstream.spark")

#: Spark's task-context properties carrying the batch id and the query id (reference, pitfall 4).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"

#: The row writer hands the store this many rows at a time (one Arrow array of payloads).
ROWS_PER_CHUNK = 4096


def fence_key(query_id: str) -> str:
    """The fence key of a query's batches on its output stream."""
    return f"spark/{query_id}"


@dataclasses.dataclass(frozen=True)
class MillstreamCommitMessage(WriterCommitMessage):
    """What a task reports to the driver: its transaction (None: it had no rows), the query and batch
    it wrote for, and which attempt of which partition it was, with its event count (for logs)."""

    txn_id: str | None
    query_id: str
    batch_id: int
    partition_id: int
    attempt: int
    events: int


@attrs.frozen
class TaskIdentity:
    """Which task is writing: its query id and batch id (from the task context), partition, attempt."""

    query_id: str
    batch_id: int
    partition_id: int
    attempt: int


def current_task(*, streaming: bool) -> TaskIdentity:
    """The running Spark task's identity.  Raises ``InternalError`` outside a task, or (``streaming``)
    in a task that is not part of a micro-batch."""
    context = TaskContext.get()
    if context is None:
        raise InternalError("the millstream sink's write() runs only inside a Spark task")
    if not streaming:
        return TaskIdentity("", -1, context.partitionId(), context.attemptNumber())
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    if batch is None or not query:
        raise InternalError(f"the task context lacks {BATCH_ID_PROPERTY!r}/{QUERY_ID_PROPERTY!r}: the sink's "
                            "streaming write ran outside a micro-batch")
    return TaskIdentity(str(query), int(batch), context.partitionId(), context.attemptNumber())


# --- Rows to events --------------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """A value JSON cannot hold as it is, in the form the source's json mode reads back."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat() + "Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Row):
        return value.asDict(recursive=True)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _json_payload(row: dict[str, Any]) -> bytes:
    return json.dumps(row, default=_json_value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: Payloads (a binary array without nulls) and their routing keys (strings or nulls; None: no keys).
Events = tuple[pa.Array, "pa.Array | None"]


@attrs.frozen
class _Encoding:
    """Where an event's payload and routing key come from in the DataFrame's schema."""

    serializer: str
    value_index: int | None
    routing_key_index: int | None

    @classmethod
    def of(cls, options: SinkOptions, schema: StructType) -> _Encoding:
        names = schema.fieldNames()
        key_index = names.index(options.routing_key_column) if options.routing_key_column in names else None
        if key_index is None and options.routing_key_column_required:
            raise OptionError("routingKeyColumn", f"the DataFrame has no column {options.routing_key_column!r} "
                                                  f"(its columns: {names})")
        if key_index is not None and not isinstance(schema.fields[key_index].dataType, StringType):
            raise SchemaMismatchError(f"option 'routingKeyColumn': column {options.routing_key_column!r} is "
                                      f"{schema.fields[key_index].dataType.simpleString()}, not a string")
        value_index = None
        if options.serializer == "raw":
            if "value" not in names:
                raise SchemaMismatchError(f"option 'serializer' is raw: the DataFrame needs a 'value' column (binary "
                                          f"or string) holding each event; its columns are {names} (or use "
                                          "serializer=json to write whole rows)")
            value_index = names.index("value")
            if not isinstance(schema.fields[value_index].dataType, (BinaryType, StringType)):
                raise SchemaMismatchError(f"option 'serializer' is raw: column 'value' must be binary or string, "
                                          f"not {schema.fields[value_index].dataType.simpleString()}")
        return cls(options.serializer, value_index, key_index)

    def rows(self, rows: Iterable[Row]) -> Iterator[Events]:
        """Spark ``Row``s, a chunk of ``ROWS_PER_CHUNK`` at a time."""
        payloads: list[bytes] = []
        keys: list[str | None] = []
        for row in rows:
            if self.value_index is None:
                payloads.append(_json_payload(row.asDict(recursive=True)))
            else:
                payloads.append(_payload(row[self.value_index]))
            if self.routing_key_index is not None:
                keys.append(row[self.routing_key_index])
            if len(payloads) >= ROWS_PER_CHUNK:
                yield self._chunk(payloads, keys)
                payloads, keys = [], []
        if payloads:
            yield self._chunk(payloads, keys)

    def _chunk(self, payloads: list[bytes], keys: list[str | None]) -> Events:
        return (pa.array(payloads, type=pa.binary()),
                None if self.routing_key_index is None else pa.array(keys, type=pa.string()))

    def batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[Events]:
        """Arrow record batches, each as it is (the ``value`` column taken as bytes, without a copy)."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            keys = None if self.routing_key_index is None else _as_string(batch.column(self.routing_key_index))
            if self.value_index is None:
                payloads = pa.array([_json_payload(r) for r in batch.to_pylist()], type=pa.binary())
            else:
                payloads = _as_binary(batch.column(self.value_index))
            yield payloads, keys


def _as_binary(values: pa.Array) -> pa.Array:
    """The ``value`` column as a binary array (a string column's UTF-8 bytes are already that)."""
    if values.null_count:
        raise SchemaMismatchError("option 'serializer' is raw: a row's 'value' is null (an event needs bytes)")
    if pa.types.is_string(values.type):
        return values.view(pa.binary())
    if pa.types.is_binary(values.type):
        return values
    return values.cast(pa.binary())  # large (64-bit offset) strings and binaries


def _as_string(keys: pa.Array) -> pa.Array:
    return keys if pa.types.is_string(keys.type) else keys.cast(pa.string())


def _payload(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if value is None:
        raise SchemaMismatchError("option 'serializer' is raw: a row's 'value' is null (an event needs bytes)")
    raise SchemaMismatchError(f"option 'serializer' is raw: a row's 'value' is {type(value).__name__}")


# --- The protocol ----------------------------------------------------------------------------------


def _ahead(stream: str, fence: tuple[str, int], recorded: int) -> str:
    key, value = fence
    if key.startswith("spark/"):
        return (f"{stream} records batch {recorded} of query {key.removeprefix('spark/')} as committed, but Spark "
                f"asks to commit batch {value}: the query's checkpoint is older than its output (nothing was "
                "committed; the batch's transactions were aborted)")
    return (f"{stream} records {recorded} for fence key {key!r}, above this write's fenceValue {value}: a later "
            "write with this key was committed (nothing was committed; the transactions were aborted)")



class _SinkProtocol:
    """The task side and the driver side of the commit, shared by every writer."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._options = options
        self._encoding = _Encoding.of(options, schema)

    @property
    def options(self) -> SinkOptions:
        return self._options

    @property
    def encoding(self) -> _Encoding:
        return self._encoding

    def write_events(self, events: Iterable[Events], task: TaskIdentity) -> MillstreamCommitMessage:
        """Write ``events`` into one new store transaction (none if there are none) and report it."""
        with timeline_span("sink.write", batch_id=task.batch_id, partition=task.partition_id) as step:
            message = self._write_events(events, task)
            step["rows"] = message.events
            return message

    def _write_events(self, events: Iterable[Events], task: TaskIdentity) -> MillstreamCommitMessage:
        session = StoreSession(self._options.store)
        txn = None
        writer = None
        appender = None
        count = 0
        try:
            for payloads, keys in events:
                if len(payloads) == 0:
                    continue
                if txn is None:
                    writer = session.client.transactional_writer(
                        self._options.store.stream, lease_seconds=self._options.transaction_lease_seconds)
                    with timeline_span("sink.begin", batch_id=task.batch_id, partition=task.partition_id):
                        txn = writer.begin()
                    router = StreamRouter(txn.info.transaction_segments)
                    appender = TransactionAppender(session.client)
                assert appender is not None
                for segment, part in route(payloads, keys, router):
                    appender.append(segment, frame_events(part))
                count += len(payloads)
            if appender is not None:
                with timeline_span("sink.flush", batch_id=task.batch_id, partition=task.partition_id):
                    appender.close()  # flushes: every event is durable in the transaction
                appender = None
        except BaseException:
            if appender is not None:
                appender.discard()
            if txn is not None:
                try:
                    txn.abort()
                except Exception:  # the lease expires it; the task's own error is the one to report
                    _log.warning("could not abort transaction %s of a failed task", txn.txn_id, exc_info=True)
            raise
        finally:
            if writer is not None:
                writer.close()  # stops pinging; the transaction stays open for the driver
            session.close()
        return MillstreamCommitMessage(None if txn is None else str(txn.txn_id), task.query_id, task.batch_id,
                                       task.partition_id, task.attempt, count)

    def _listed(self, messages: Sequence[WriterCommitMessage | None], batch_id: int, *,
                tolerate_missing: bool) -> list[MillstreamCommitMessage]:
        listed = []
        for message in messages:
            if message is None:
                if not tolerate_missing:
                    raise InternalError(f"batch {batch_id} is committed with a task's commit message missing")
                continue
            if not isinstance(message, MillstreamCommitMessage):
                raise InternalError(f"batch {batch_id}: a commit message of another sink: {message!r}")
            if message.batch_id != batch_id:
                raise InternalError(f"batch {batch_id}: a commit message of batch {message.batch_id}: {message!r}")
            listed.append(message)
        if len({m.query_id for m in listed}) > 1:
            raise InternalError(f"batch {batch_id}: commit messages of several queries: {listed!r}")
        return listed

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int, *,
               fence: tuple[str, int] | None) -> None:
        """The driver's commit: every task's transaction in one atomic multi-commit, fenced by
        ``fence`` (None: not fenced -- a batch job without ``fenceKey``)."""
        with timeline_span("sink.commit", batch_id=batch_id):
            self._commit(messages, batch_id, fence=fence)

    def _commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int, *,
                fence: tuple[str, int] | None) -> None:
        listed = self._listed(messages, batch_id, tolerate_missing=False)
        txns = [m.txn_id for m in listed if m.txn_id is not None]
        if not txns:
            _log.info("batch %s wrote no rows to %s: nothing to commit", batch_id, self._options.store.stream)
            return
        if len(txns) > limits.TRANSACTIONS_PER_COMMIT_MAX:
            raise InvalidArgumentError(f"batch {batch_id} has {len(txns)} tasks with rows; one commit takes at most "
                                       f"{limits.TRANSACTIONS_PER_COMMIT_MAX} transactions (fewer partitions, please)")
        stream = self._options.store.stream
        session = StoreSession(self._options.store)
        try:
            with timeline_span("sink.multi_commit", batch_id=batch_id, transactions=len(txns)):
                result = session.client.commit_transactions(stream, txns, fence=fence)
            if result.outcome is CommitOutcome.ALREADY_COMMITTED:
                assert fence is not None and result.recorded is not None
                if result.recorded > fence[1]:
                    raise FenceAheadError(_ahead(stream, fence, result.recorded))
                _log.info("batch %s (fence %s) was committed to %s before (a replay): its %s new transactions were "
                          "aborted", batch_id, fence[0], stream, len(txns))
                return
            with timeline_span("sink.merge_wait", batch_id=batch_id, transactions=len(txns)):
                merged = self._wait_merged(session, txns)
            if not merged:
                _log.warning("transactions %s of %s are committed but not merged yet after %s s", txns, stream,
                             limits.TRANSACTION_COMPLETION_WAIT_SECONDS)
        finally:
            session.close()

    def _wait_merged(self, session: StoreSession, txns: Sequence[str]) -> bool:
        """Wait (bounded) until the store has merged the committed transactions, so the batch is
        readable once Spark logs it committed; False if the bound passed first.  Merging follows from
        the decision, so a timeout only delays readers.  Through the client's public transaction API
        (``wait_for_completion`` of each, all at once on the client's loop): the sink neither sleeps
        nor asks the controller itself."""
        stream = self._options.store.stream
        client = session.client

        async def wait() -> bool:
            writer = client.async_client.transactional_writer(stream)
            try:
                resumed = await asyncio.gather(*(writer.transaction(txn) for txn in txns))
                statuses = await asyncio.gather(*(
                    txn.wait_for_completion(limits.TRANSACTION_COMPLETION_WAIT_SECONDS)
                    for txn in resumed if txn.info.status is not TransactionStatus.COMMITTED))
            except RequestTimeoutError:
                return False
            finally:
                await writer.close()
            if any(status is not TransactionStatus.COMMITTED for status in statuses):
                raise InternalError(f"transactions {list(txns)} of {stream} were committed, and one ended "
                                    f"{[status.value for status in statuses]}")
            return True

        return client.run(wait())

    def abort(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        """Abort the listed transactions; failed tasks' slots are None (their transactions expire)."""
        listed = self._listed(messages, batch_id, tolerate_missing=True)
        txns = [m.txn_id for m in listed if m.txn_id is not None]
        if not txns:
            return
        session = StoreSession(self._options.store)
        writer = session.client.transactional_writer(self._options.store.stream)
        try:
            for txn in txns:
                try:
                    writer.transaction(txn).abort()
                except (TransactionNotOpenError, TransactionNotFoundError) as error:
                    # Committed by an earlier call for this batch, aborted already, or long forgotten.
                    _log.info("batch %s: transaction %s is not open to abort (%s)", batch_id, txn, error)
        finally:
            writer.close()
            session.close()


class MillstreamStreamWriter(DataSourceStreamWriter):
    """The sink for ``writer=rows``: Spark ``Row``s in (see the module docstring).  Its ``commit`` and
    ``abort`` are every stream writer's: fenced by (query id, batch id)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._protocol = _SinkProtocol(options, schema)

    @property
    def protocol(self) -> _SinkProtocol:
        return self._protocol

    def write(self, iterator: Iterator[Row]) -> MillstreamCommitMessage:
        task = current_task(streaming=True)
        return self._protocol.write_events(self._protocol.encoding.rows(iterator), task)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        listed = self._protocol._listed(messages, batchId, tolerate_missing=False)
        fence = (fence_key(listed[0].query_id), batchId) if listed else None
        self._protocol.commit(messages, batchId, fence=fence)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._protocol.abort(messages, batchId)


class MillstreamStreamArrowWriter(MillstreamStreamWriter, DataSourceStreamArrowWriter):
    """The sink for ``writer=arrow`` (the default): Arrow record batches in; commits as
    ``MillstreamStreamWriter`` does (it is one)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MillstreamCommitMessage:
        task = current_task(streaming=True)
        return self._protocol.write_events(self._protocol.encoding.batches(iterator), task)


class MillstreamBatchWriter(DataSourceWriter):
    """``df.write.format("millstream")`` with ``writer=rows``: every task's transaction committed in
    one atomic step -- fenced by ``fenceKey``/``fenceValue`` when given (a job run again with the same
    fence writes nothing), else not (a job run again writes again)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._protocol = _SinkProtocol(options, schema)

    @property
    def protocol(self) -> _SinkProtocol:
        return self._protocol

    def write(self, iterator: Iterator[Row]) -> MillstreamCommitMessage:
        task = current_task(streaming=False)
        return self._protocol.write_events(self._protocol.encoding.rows(iterator), task)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._protocol.commit(messages, -1, fence=self._protocol.options.fence)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._protocol.abort(messages, -1)


class MillstreamBatchArrowWriter(MillstreamBatchWriter, DataSourceArrowWriter):
    """``df.write.format("millstream")`` (the default ``writer=arrow``): Arrow record batches in;
    commits as ``MillstreamBatchWriter`` does (it is one)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MillstreamCommitMessage:
        task = current_task(streaming=False)
        return self._protocol.write_events(self._protocol.encoding.batches(iterator), task)
