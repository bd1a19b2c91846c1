"""The source: ``MillstreamStreamReader`` (micro-batches) and ``MillstreamBatchReader`` (a bounded range).

Theory of operation.  Spark runs a stream reader in three kinds of process
(reference/spark-exactly-once.md section 1): the *planner* (one long-lived Python process per query
run: ``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ``prepareForTriggerAvailableNow``),
the *tasks* (``read(partition)`` in executors' Python workers, on a pickled copy of the reader) and
the driver's planning worker that builds and pickles it.  So the reader holds only parsed options
and the decoder when pickled; each process opens its own client on first use (``StoreSession``).

* Offsets are stream cuts (``_offsets``); ``initialOffset`` resolves the ``start`` option once per
  run (Spark asks twice) and registers the query's reader group, if any.
* ``latestOffset(start, limit)`` asks the controller for the slices between ``start`` and each
  bound (the tail, the ``end`` option, the available-now target) and lets ``_planning.plan_end``
  choose the end: successors enter at batch boundaries; admission control places each segment's
  share at an event boundary the store knows (``event_boundaries``), counting by reading
  (``_segment_io.measure``) only a small sample of each segment's range.
* ``partitions(start, end)`` is ``segments_between(start, end)``: one partition per segment
  range -- a pure function of the two cuts, so a replayed batch reads the same events.
* ``read`` yields Arrow record batches (``_decoding``), each at most
  ``limits.SPARK_ARROW_BATCH_ROWS_MAX`` rows / ``SPARK_ARROW_BATCH_BYTES_MAX`` bytes.
* ``commit(end)`` -- Spark calls it once batch N+1 is logged, so batch N's output is committed --
  publishes ``end`` as the reader group's subscriber cut, letting consumption-based retention
  truncate below it.  Data deleted before the query read it is ``TruncatedDataError``, never skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from millstream import limits
from millstream.client import StreamCut
from millstream.errors import InvalidStreamCutError, RetryableError
from millstream.spark._dead_letters import DeadLetterWriter
from millstream.spark._dead_letters import fence_key as dead_letter_fence
from millstream.spark._decoding import DeadLetter, EventDecoder
from millstream.spark._errors import OptionError
from millstream.spark._offsets import cut_of, offset_of
from millstream.spark._options import CutOption, SourceOptions
from millstream.spark._planning import Budget, SegmentRange, plan_end, ranges_between, views_of
from millstream.spark._segment_io import measure, read_blocks
from millstream.spark._store import StoreSession
from millstream.spark._timeline import span as timeline_span

__all__ = ["MillstreamBatchReader", "MillstreamStreamReader", "SegmentRangePartition"]

_log = logging.getLogger("millstream.spark")


class SegmentRangePartition(InputPartition):
    """One partition: the events of one segment between two offsets (``value`` is the
    ``SegmentRange``)."""

    def __init__(self, value: SegmentRange) -> None:
        super().__init__(value)

    @property
    def range(self) -> SegmentRange:
        value: SegmentRange = self.value
        return value


def _read_partition(session: StoreSession, decoder: EventDecoder, partition: InputPartition,
                    dead_letter_stream: str | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition (a task's work): a batch per block the store's reads
    give (``_segment_io.read_blocks``), at most ``limits.SPARK_ARROW_BATCH_ROWS_MAX`` rows and
    ``SPARK_ARROW_BATCH_BYTES_MAX`` bytes each.  With ``dead_letter_stream``, events that do not
    decode go there (``_dead_letters``) instead of failing the task."""
    if not isinstance(partition, SegmentRangePartition):
        return  # an empty batch read: Spark plans one partition holding None
    span = partition.range
    letters: list[DeadLetter] | None = None
    dead = None
    if dead_letter_stream is not None:
        letters = []
        query_id = _query_id()
        fence = None if query_id is None else (
            dead_letter_fence(query_id, span.stream, span.segment_id), span.end_offset)
        dead = DeadLetterWriter(session, dead_letter_stream, fence=fence,
                                lease_seconds=limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS)
    finished = False
    try:
        with timeline_span("source.read", segment=span.segment_id, rows=0) as step:
            for block in read_blocks(session.client, span):
                for piece in block.split(limits.SPARK_ARROW_BATCH_ROWS_MAX, limits.SPARK_ARROW_BATCH_BYTES_MAX):
                    batch = decoder.decode_block(span.stream, span.segment_id, piece, letters)
                    if dead is not None and letters:
                        dead.add(letters)
                        letters.clear()
                    if batch.num_rows:
                        step["rows"] += batch.num_rows
                        yield batch
            if dead is not None:
                dead.commit()
        finished = True
    finally:
        if dead is not None and not finished:
            dead.abort()  # read only in part (an error, or Spark stopped early): not this range's letters
        session.close()


def _query_id() -> str | None:
    """The streaming query's id in a micro-batch's task (None: a batch read, or outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty("sql.streaming.queryId")
    return str(value) if value else None


def _resolve(session: StoreSession, option: CutOption, name: str) -> StreamCut | None:
    """A ``start``/``end`` option as a cut of the stream (None for ``latest`` as an end: no bound).
    A cut given as JSON is checked by the controller (``OptionError`` naming the option)."""
    if option.cut is not None:
        try:
            session.client.stream_manager().check_cut(session.options.stream, option.cut)
        except InvalidStreamCutError as error:
            raise OptionError(name, f"is not a position of {session.options.stream} now ({error})") from None
        return option.cut
    if option.keyword == "head":
        return session.head()
    if option.keyword == "tail":
        return session.tail()
    return None  # latest


class MillstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch source (see the module docstring).  Built by ``MillstreamDataSource.streamReader``."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._decoder = EventDecoder(options, schema)
        self._session = StoreSession(options.store)
        # Planner state, for one run of the query (never pickled, never needed after a restart).
        self._initial: StreamCut | None = None
        self._end: StreamCut | None = None
        self._end_resolved = False
        self._target: StreamCut | None = None
        self._group_registered = False

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options, "_decoder": self._decoder, "_session": StoreSession(self._options.store),
                "_initial": None, "_end": None, "_end_resolved": False, "_target": None, "_group_registered": False}

    @property
    def _stream(self) -> str:
        return self._options.store.stream

    def _cut(self, offset: Any, what: str) -> StreamCut:
        return cut_of(offset, self._stream, what=what)

    def _end_bound(self) -> StreamCut | None:
        if not self._end_resolved:
            self._end = _resolve(self._session, self._options.end, "end")
            self._end_resolved = True
        return self._end

    def _register_group(self) -> None:
        if self._options.reader_group is not None and not self._group_registered:
            self._session.register_group(*self._options.reader_group)
            self._group_registered = True

    # --- Planning (the planner process) -------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """The ``start`` option's cut (resolved once per run); checks the stream and the ``end`` option."""
        if self._initial is None:
            self._session.check_exists()
            if self._options.dead_letter_stream is not None:
                self._session.check_exists(self._options.dead_letter_stream, "deadLetterStream")
            start = _resolve(self._session, self._options.start, "start")
            assert start is not None
            end = self._end_bound()
            if end is not None:
                try:
                    self._session.between(start, end)
                except InvalidStreamCutError as error:
                    raise OptionError("end", f"lies before the start of the query ({error})") from None
            self._register_group()
            self._initial = start
        return offset_of(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_rows_per_batch is not None:
            return ReadMaxRows(self._options.max_rows_per_batch)
        if self._options.max_bytes_per_batch is not None:
            return ReadMaxBytes(self._options.max_bytes_per_batch)
        return ReadAllAvailable()

    def _budget(self, limit: ReadLimit | None) -> Budget:
        if isinstance(limit, ReadAllAvailable):
            return Budget()
        rows, size = self._options.max_rows_per_batch, self._options.max_bytes_per_batch
        if isinstance(limit, ReadMaxRows):
            rows = limit.max_rows if rows is None else min(rows, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            size = limit.max_bytes if size is None else min(size, limit.max_bytes)
        return Budget(rows, size)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch after ``start`` within ``limit`` (``start`` itself: no new data)."""
        with timeline_span("source.latest_offset"):
            begin = self._cut(start, "the start offset")
            return offset_of(self.plan(begin, self._budget(limit)))

    def plan(self, begin: StreamCut, budget: Budget) -> StreamCut:
        """``latestOffset`` on cuts."""
        tail = self._session.tail()
        bounded = [self._session.between(begin, tail)]
        for bound in (self._end_bound(), self._target):
            if bound is not None:
                try:
                    bounded.append(self._session.between(begin, bound))
                except InvalidStreamCutError:
                    return begin  # the query stands at (or beyond) the bound: nothing more to read
        views = views_of(begin, tail, bounded)
        client = self._session.client
        segments = client.segments()
        return plan_end(begin, views, budget, lambda span, rows, size: measure(client, span, rows, size),
                        lambda span, end: segments.event_boundaries(span.segment, span.start_offset, end))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The stream's tail, for Spark's progress reports."""
        return offset_of(self._session.tail())

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target of an available-now run: the tail now (the query stops there).  Spark calls
        this before ``initialOffset``, so a missing stream is named here first."""
        self._session.check_exists()
        self._target = self._session.tail()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per segment range between the two cuts (a pure function of them)."""
        with timeline_span("source.partitions") as step:
            begin = self._cut(start, "the batch's start offset")
            finish = self._cut(end, "the batch's end offset")
            partitions = [SegmentRangePartition(r)
                          for r in ranges_between(self._stream, self._session.between(begin, finish))]
            step["partitions"] = len(partitions)
            return partitions

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch up to ``end``: publish it as the reader group's subscriber cut."""
        if self._options.reader_group is None:
            return
        cut = self._cut(end, "the committed offset")
        try:
            with timeline_span("source.commit"):
                self._register_group()
                self._session.publish(*self._options.reader_group, cut)
        except RetryableError:
            # The store is unreachable for now: the next batch's commit publishes a later cut, and
            # until then retention only keeps more than it must.
            _log.warning("could not publish the consumed cut of %s to reader group %s; the next commit will",
                         self._stream, "/".join(self._options.reader_group), exc_info=True)

    def stop(self) -> None:
        self._session.close()

    # --- Tasks --------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(StoreSession(self._options.store), self._decoder, partition,
                               self._options.dead_letter_stream)


class MillstreamBatchReader(DataSourceReader):
    """``spark.read.format("millstream")``: the events between the ``start`` cut (default the head)
    and the ``end`` cut (default the tail when the query is planned), one partition per segment range."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._decoder = EventDecoder(options, schema)

    def partitions(self) -> Sequence[InputPartition]:
        session = StoreSession(self._options.store)
        try:
            session.check_exists()
            if self._options.dead_letter_stream is not None:
                session.check_exists(self._options.dead_letter_stream, "deadLetterStream")
            start = _resolve(session, self._options.start, "start")
            end = _resolve(session, self._options.end, "end") or session.tail()
            assert start is not None
            try:
                slices = session.between(start, end)
            except InvalidStreamCutError as error:
                raise OptionError("end", f"lies before option 'start' ({error})") from None
            return [SegmentRangePartition(r) for r in ranges_between(self._options.store.stream, slices)]
        finally:
            session.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(StoreSession(self._options.store), self._decoder, partition,
                               self._options.dead_letter_stream)
