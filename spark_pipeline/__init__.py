"""millstream.spark: millstream streams as a Spark Structured Streaming source and exactly-once sink.

``MillstreamDataSource`` is a PySpark Python Data Source (PySpark 4.2 or later, no jars) named
``millstream``; ``register(spark)`` makes it available in a session (and lets its queries write in
update output mode, which Spark's Python data sources cannot take by themselves: ``_modes``)::

    import millstream.spark
    millstream.spark.register(spark)

    events = (spark.readStream.format("millstream")
              .option("controller", "tcp://127.0.0.1:9090").option("stream", "sensors/readings")
              .option("serializer", "json").option("schema", "sensor STRING, ts TIMESTAMP, reading DOUBLE")
              .option("maxRowsPerBatch", "10000")
              .load())
    query = (events.groupBy("sensor").count().selectExpr("sensor AS routing_key", "to_json(struct(*)) AS value")
             .writeStream.format("millstream").outputMode("update")
             .option("controller", "tcp://127.0.0.1:9090").option("stream", "sensors/counts")
             .option("checkpointLocation", "/tmp/ckpt").start())

The source reads micro-batches between stream cuts (its offsets), keeping each routing key's order
across scaling, with admission control and ``trigger(availableNow=True)``; ``spark.read`` reads the
events between two cuts.  It moves whole buffers of events, not events one by one
(``_segment_io``, ``_decoding``); an event it cannot decode fails the batch naming its position, or
goes to the ``deadLetterStream`` (``_dead_letters``).  The sink writes each task's rows into one
store transaction and commits a batch's transactions in one fenced step keyed by (query id, batch
id), so a batch Spark re-runs after a crash is written once, in append, update and complete output
modes.  Options: ``_options``; the source: ``_reader`` and ``_planning``; the sink: ``_writer``;
one client per Python process: ``_store``; where a micro-batch's time goes, step by step and
process by process (opt-in): ``_timeline``.  Spark's Python workers must import millstream: install it
in the interpreter ``PYSPARK_PYTHON`` names.
"""

from __future__ import annotations

from typing import Any

try:
    import pyarrow  # noqa: F401  (the source and the sink speak Arrow)
    import pyspark  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"millstream.spark needs pyspark>=4.2 and pyarrow: pip install 'millstream[spark]' ({error})"
                      ) from error

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from millstream.spark._decoding import DeadLetter
from millstream.spark._errors import FenceAheadError, OptionError, SchemaMismatchError
from millstream.spark._offsets import cut_of, offset_of
from millstream.spark._options import (
    SinkOptions,
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from millstream.spark._reader import MillstreamBatchReader, MillstreamStreamReader, SegmentRangePartition
from millstream.spark._store import check_reachable_once
from millstream.spark._timeline import span as timeline_span
from millstream.spark._writer import (
    MillstreamBatchArrowWriter,
    MillstreamBatchWriter,
    MillstreamCommitMessage,
    MillstreamStreamArrowWriter,
    MillstreamStreamWriter,
    fence_key,
)

__all__ = [
    "DeadLetter",
    "FenceAheadError",
    "MillstreamBatchArrowWriter",
    "MillstreamBatchReader",
    "MillstreamBatchWriter",
    "MillstreamCommitMessage",
    "MillstreamDataSource",
    "MillstreamStreamArrowWriter",
    "MillstreamStreamReader",
    "MillstreamStreamWriter",
    "OptionError",
    "SchemaMismatchError",
    "SegmentRangePartition",
    "SinkOptions",
    "SourceOptions",
    "cut_of",
    "fence_key",
    "offset_of",
    "parse_sink_options",
    "parse_source_options",
    "register",
]


class MillstreamDataSource(DataSource):
    """The ``millstream`` format: a stream of a millstream store as a source (``spark.readStream``,
    ``spark.read``) and as an exactly-once sink (``writeStream``, ``write``).  Options are checked when
    the DataFrame is loaded or the query starts (``OptionError`` names a bad one, and the nearest valid
    name for a misspelt one); the controller's address is checked then too, by a bounded TCP connect,
    so a wrong one fails in seconds.  See ``_options``."""

    @classmethod
    def name(cls) -> str:
        return "millstream"

    def _source_options(self) -> SourceOptions:
        return parse_source_options(self.options)

    def schema(self) -> str:
        """``value``, ``stream``, ``segment``, ``offset``, ``routing_key`` (``raw``/``string``), or the
        ``schema`` option's columns (``json``)."""
        return self._source_options().ddl()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._source_options()
        check_reachable_once(options.store.controller)
        return MillstreamStreamReader(options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._source_options()
        check_reachable_once(options.store.controller)
        return MillstreamBatchReader(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming sink.  ``overwrite`` is Spark asking to truncate the output before each batch
        -- complete output mode -- which a stream cannot: as Spark's Kafka sink does, every batch's
        whole result table is appended (see ``_writer``)."""
        with timeline_span("sink.writer"):
            options = parse_sink_options(self.options)
            if options.fence is not None:
                raise OptionError("fenceKey", "applies to df.write: a streaming query fences its batches by its "
                                              "query id and batch id itself")
            check_reachable_once(options.store.controller)
            if options.writer == "rows":
                return MillstreamStreamWriter(options, schema)
            return MillstreamStreamArrowWriter(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> MillstreamBatchWriter:
        if overwrite:
            raise OptionError("mode", "a millstream stream is append-only: df.write.mode('overwrite') is not "
                                      "possible (use mode 'append')")
        options = parse_sink_options(self.options)
        check_reachable_once(options.store.controller)
        if options.writer == "rows":
            return MillstreamBatchWriter(options, schema)
        return MillstreamBatchArrowWriter(options, schema)


def register(spark: Any) -> None:
    """Make ``format("millstream")`` available in ``spark`` (a ``SparkSession``), and let its
    streaming queries write in update output mode (see ``_modes``).  Call it once per session;
    calling it again does nothing more."""
    from millstream.spark._modes import enable_update_mode

    spark.dataSource.register(MillstreamDataSource)
    enable_update_mode()
