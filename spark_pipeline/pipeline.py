"""The reference pipeline: sensor readings from a stream to per-sensor window aggregates and alerts,
written exactly once to another stream.

Theory of operation.  ``sensor_pipeline`` is the query's logic and nothing else (a DataFrame in, a
DataFrame out), so tests can feed it from any source:

1. *parse*: each input event's bytes are a JSON document (``SensorWorkload.payload``); ``from_json``
   turns it into (kind, sensor_id, ts_ms, temperature_c) and a document that does not parse, or lacks
   the sensor or the time, is dropped -- garbage on the wire is an input fact, not a failure;
2. *event time and watermark*: ``event_time`` is ``ts_ms``; the watermark trails the newest event time
   seen by ``watermark_delay_seconds``, so readings that arrive a little out of order still count;
3. *windows*: tumbling windows of ``window_seconds`` per sensor: count, min, max, exact decimal sum,
   and how many readings were at or above the alert threshold.  Watermark markers (``kind`` "end",
   written after the last reading) move the watermark but enter no window;
4. *alerts*: a window with at least ``alert_readings_min`` hot readings also yields an ``alert`` row;
5. *output*: one JSON event per row (``routing_key`` = the sensor id, so a sensor's rows stay in order
   in the output stream), in append mode: a window's rows are written once, when the watermark passes
   the window's end.

``start_query`` runs it from the millstream source to the millstream sink with a checkpoint location;
Spark's offset and commit logs and the sink's fenced multi-commit make the output exactly once across
driver crashes (``spec/ExactlyOnceSink.tla``).  The
state of the windows lives in the RocksDB state store with changelog checkpointing and bounded memory
(``spark_conf``): Spark's own implementation, configured here, not re-implemented.

``run`` is ``millstream pipeline run``: build the session, start the query, print one ``progress`` line
of JSON per micro-batch on stdout, stop gracefully on SIGTERM or SIGINT (``query.stop()``; Spark
re-runs an interrupted batch on the next start, which the sink's fence turns into a no-op) and, with
the available-now trigger, return once everything readable at start has been processed.

Fault hook (tests only, off by default).  With ``MILLSTREAM_SPARK_FAULT=kill-in-commit:WHEN:BATCH``
in the driver's environment (WHEN is ``before`` or ``after``; BATCH a batch id), the sink's driver-side
``commit`` of the first batch whose id is at least BATCH and that has rows to commit (a store
transaction in its commit messages) sends SIGKILL to every process of the run's session
(``kill_session``: the driver's Python, its JVM and every Python worker) just before, or just after, the
store's fenced multi-commit: a driver machine dying inside the commit protocol, at the one point a
sink without the fence duplicates a batch.  ``tests/faults/test_pipeline_kill.py`` uses it; the
variable is read in the process that runs the sink's commit, which inherits the driver's environment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from millstream.errors import InvalidArgumentError

if TYPE_CHECKING:  # pyspark is the `spark` extra: imported where the pipeline runs, not at import time
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "FAULT_ENVIRONMENT_VARIABLE",
    "INPUT_COLUMNS_DDL",
    "INPUT_SCHEMA_DDL",
    "PipelineConfig",
    "build_session",
    "input_events",
    "parse_fault",
    "run",
    "sensor_pipeline",
    "spark_conf",
    "start_query",
]

#: The environment variable the sink's fault hook reads (see the module docstring).
FAULT_ENVIRONMENT_VARIABLE: Final = "MILLSTREAM_SPARK_FAULT"

#: What ``from_json`` reads from an input event.  Temperatures are exact decimals (two places), so
#: sums are exact and the verification compares them with ``==``.
INPUT_SCHEMA_DDL: Final = "kind STRING, sensor_id STRING, ts_ms BIGINT, temperature_c DECIMAL(7,2)"
#: The one column of the input stream the query reads (the source's ``value``, the raw event).
INPUT_COLUMNS_DDL: Final = "value BINARY"

#: The RocksDB state store provider (Spark's default is still the HDFS-backed one in 4.x).
ROCKSDB_PROVIDER: Final = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: How often ``run`` looks at the query (new progress to print, a stop request): often enough that a
#: progress line follows its batch closely, rarely enough to cost nothing beside a micro-batch.
POLL_INTERVAL_SECONDS: Final = 0.5

#: Each executor of a ``spark://`` cluster gets one core and this much memory: a two-core machine runs
#: the cluster's executors beside the store and the driver (the workers offer 1 GiB each).
EXECUTOR_MEMORY: Final = "512m"

#: ``query.stop()`` waits at most this long for running tasks (Spark's own default is to wait forever);
#: a batch it interrupts is re-run on the next start.
STOP_TIMEOUT_MS: Final = 30_000


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"{attribute.name} must be a positive number, not {value!r}")


def _stream(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    from millstream.client import split_stream_name

    split_stream_name(value)


@attrs.frozen(kw_only=True)
class PipelineConfig:
    """Everything a run of the reference pipeline needs.

    ``controller`` is the store's URI; ``input_stream``/``output_stream`` are ``scope/stream`` names;
    ``checkpoint`` is Spark's checkpoint location (restart with the same one to resume).  The window,
    watermark and alert rule must match the workload's (``SensorWorkload``) for the verification to
    agree.  ``trigger`` is ``processing-time`` (a micro-batch every ``trigger_interval_seconds``,
    until stopped) or ``available-now`` (everything readable at start, then stop).
    ``max_rows_per_batch`` caps a micro-batch (the source's admission control; None: all available).
    ``state_memory_mb`` bounds RocksDB's memory per executor JVM (a soft limit)."""

    controller: str
    input_stream: str = attrs.field(default="iot/sensors", validator=_stream)
    output_stream: str = attrs.field(default="iot/alerts", validator=_stream)
    checkpoint: Path = attrs.field(converter=Path)
    window_seconds: int = attrs.field(default=10, validator=_positive)
    watermark_delay_seconds: int = attrs.field(default=10, validator=_positive)
    alert_threshold_c: Decimal = attrs.field(default=Decimal("80.00"), converter=Decimal)
    alert_readings_min: int = attrs.field(default=3, validator=_positive)
    trigger: str = "processing-time"
    trigger_interval_seconds: float = attrs.field(default=1.0, validator=_positive)
    max_rows_per_batch: int | None = None
    state_memory_mb: int = attrs.field(default=256, validator=_positive)
    shuffle_partitions: int = attrs.field(default=2, validator=_positive)
    master: str = "local[2]"
    query_name: str = "sensor_alerts"

    def __attrs_post_init__(self) -> None:
        if self.trigger not in ("processing-time", "available-now"):
            raise InvalidArgumentError(f"trigger is processing-time or available-now, not {self.trigger!r}")
        if self.max_rows_per_batch is not None and (type(self.max_rows_per_batch) is not int
                                                    or self.max_rows_per_batch < 1):
            raise InvalidArgumentError(f"max_rows_per_batch must be a positive int, not {self.max_rows_per_batch!r}")
        if self.input_stream == self.output_stream:
            raise InvalidArgumentError("the output stream must not be the input stream")
        if not self.alert_threshold_c.is_finite():
            raise InvalidArgumentError(f"alert_threshold_c must be finite, not {self.alert_threshold_c}")


def spark_conf(config: PipelineConfig) -> dict[str, str]:
    """The session's settings: a small local Spark, and the state store the seed recommends."""
    state = "spark.sql.streaming.stateStore"
    return {
        "spark.master": config.master,
        "spark.app.name": f"millstream-{config.query_name}",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.default.parallelism": str(config.shuffle_partitions),
        # RocksDB holds the windows' state; changelog checkpointing makes a micro-batch's state durable
        # by uploading only its changes (snapshots are built in the background); bounded memory puts
        # every RocksDB instance of an executor under one cache and write-buffer budget.
        f"{state}.providerClass": ROCKSDB_PROVIDER,
        f"{state}.rocksdb.changelogCheckpointing.enabled": "true",
        f"{state}.rocksdb.boundedMemoryUsage": "true",
        f"{state}.rocksdb.maxMemoryUsageMB": str(config.state_memory_mb),
        # Counting rows costs a RocksDB scan per commit; the pipeline does not need the figure.
        f"{state}.rocksdb.trackTotalNumberOfRows": "false",
        # A window is emitted by the batch after the one that moved the watermark past its end, even
        # when no new data arrives (Spark's default, stated because the answer depends on it).
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
        **({"spark.executor.cores": "1", "spark.executor.memory": EXECUTOR_MEMORY}
           if config.master.startswith("spark://") else {}),
    }


def build_session(config: PipelineConfig) -> SparkSession:
    """A SparkSession configured by ``spark_conf`` with the millstream data source registered.

    Spark's Python workers must run this interpreter, which has millstream and pyarrow installed
    (``PYSPARK_PYTHON``); a worker on another interpreter fails to import the data source."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    return spark


def register_data_sources(spark: SparkSession) -> None:
    """Register format ``millstream`` (and, when the fault hook is set, its fault-injecting twin)."""
    from millstream.spark import MillstreamDataSource

    spark.dataSource.register(MillstreamDataSource)
    if os.environ.get(FAULT_ENVIRONMENT_VARIABLE):
        parse_fault(os.environ[FAULT_ENVIRONMENT_VARIABLE])  # a bad value fails here, in the driver
        spark.dataSource.register(_fault_injecting_source())


def sensor_pipeline(events: DataFrame, config: PipelineConfig) -> DataFrame:
    """The query's logic: input events (a ``value`` column of JSON, binary or string) to output rows
    (``routing_key``, ``value``: one JSON document per aggregate or alert)."""
    from pyspark.sql import functions as F

    parsed = (events
              .select(F.from_json(F.col("value").cast("string"), INPUT_SCHEMA_DDL).alias("event"))
              .select("event.*")
              .where(F.col("sensor_id").isNotNull() & F.col("ts_ms").isNotNull()
                     & F.col("kind").isin("reading", "end")))
    timed = (parsed
             .withColumn("event_time", F.timestamp_millis(F.col("ts_ms")))
             .withWatermark("event_time", f"{config.watermark_delay_seconds} seconds"))
    # Markers must reach the watermark operator before they are dropped.  Spark's optimizer pushes a
    # filter below the watermark unless it reads the event-time column, so this one does: one
    # predicate that reads it (a conjunction would be split and its other half pushed down).
    readings = timed.where(F.when((F.col("kind") == "reading") & F.col("temperature_c").isNotNull(),
                                  F.col("event_time")).isNotNull())
    threshold = F.lit(config.alert_threshold_c).cast("decimal(7,2)")
    windows = (readings
               .groupBy(F.window("event_time", f"{config.window_seconds} seconds"), F.col("sensor_id"))
               .agg(F.count(F.lit(1)).alias("count"),
                    F.min("temperature_c").alias("min_c"),
                    F.max("temperature_c").alias("max_c"),
                    F.sum("temperature_c").alias("sum_c"),
                    F.count_if(F.col("temperature_c") >= threshold).alias("hot_readings")))
    kinds = F.when(F.col("hot_readings") >= F.lit(config.alert_readings_min),
                   F.array(F.lit("aggregate"), F.lit("alert"))).otherwise(F.array(F.lit("aggregate")))
    rows = windows.select(
        F.explode(kinds).alias("kind"), F.col("sensor_id"),
        F.unix_millis(F.col("window.start")).alias("window_start_ms"),
        F.unix_millis(F.col("window.end")).alias("window_end_ms"),
        "count", "min_c", "max_c", "sum_c", "hot_readings")
    aggregate = F.struct("kind", "sensor_id", "window_start_ms", "window_end_ms", "count", "min_c", "max_c",
                         "sum_c", "hot_readings")
    alert = F.struct("kind", "sensor_id", "window_start_ms", "window_end_ms", "max_c", "hot_readings")
    return rows.select(
        F.col("sensor_id").alias("routing_key"),
        F.when(F.col("kind") == "alert", F.to_json(alert)).otherwise(F.to_json(aggregate)).alias("value"))


def input_events(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The query's input: the events of ``config.input_stream``, their payload (``value``) only."""
    # The logic reads only the payload: asking for that column alone (not the stream, segment, offset
    # and routing-key columns too) spares every batch their Arrow building in the tasks, their
    # transfer to the JVM and their conversion to rows there.
    reader = (spark.readStream.format("millstream")
              .option("controller", config.controller)
              .option("stream", config.input_stream)
              .schema(INPUT_COLUMNS_DDL))
    if config.max_rows_per_batch is not None:
        reader = reader.option("maxRowsPerBatch", str(config.max_rows_per_batch))
    return reader.load()


def start_query(spark: SparkSession, config: PipelineConfig) -> StreamingQuery:
    """Start the pipeline from ``config.input_stream`` to ``config.output_stream``."""
    sink_format = _FAULT_FORMAT if os.environ.get(FAULT_ENVIRONMENT_VARIABLE) else "millstream"
    writer = (sensor_pipeline(input_events(spark, config), config).writeStream
              .format(sink_format)
              .queryName(config.query_name)
              .outputMode("append")
              .option("controller", config.controller)
              .option("stream", config.output_stream)
              .option("checkpointLocation", str(config.checkpoint)))
    if config.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.trigger_interval_seconds} seconds")
    return writer.start()


def progress_record(progress: dict[str, Any]) -> dict[str, Any]:
    """The few fields of a ``StreamingQueryProgress`` that the demo, the tests and the bench read."""
    durations = progress.get("durationMs") or {}
    sink = progress.get("sink") or {}
    return {
        "batch_id": progress.get("batchId"),
        "input_rows": progress.get("numInputRows"),
        "output_rows": sink.get("numOutputRows"),
        "trigger_ms": durations.get("triggerExecution"),
        "add_batch_ms": durations.get("addBatch"),
        "latest_offset_ms": durations.get("latestOffset"),
        "wal_commit_ms": durations.get("walCommit"),
        "get_batch_ms": durations.get("getBatch"),
        "query_planning_ms": durations.get("queryPlanning"),
        "commit_offsets_ms": durations.get("commitOffsets"),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "timestamp": progress.get("timestamp"),
    }


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[Callable[[], bool]]:
    """SIGTERM and SIGINT ask the run to stop (checked between polls); the old handlers come back after."""
    requested: list[int] = []

    def handler(signal_number: int, frame: Any) -> None:
        requested.append(signal_number)

    previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield lambda: bool(requested)
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _warm_worker(batches: Iterator[Any]) -> Iterator[Any]:
    """A prewarm task: import what the pipeline's tasks unpickle, in this (reused) Python worker."""
    import millstream.spark._reader
    import millstream.spark._writer  # noqa: F401

    yield from batches


def prewarm(spark: SparkSession) -> threading.Thread:
    """Start the executors' Python workers now, in a background job, so that the query's first
    tasks find them running with millstream imported (Spark reuses its Python workers).

    The first micro-batch after a start waits for a Python process per kind of work (planning,
    reading, writing, committing), each importing pyarrow, numpy, pyspark and millstream -- most of
    it one after the other.  The executors' workers are needed last, when the tasks run; started at
    once, they come up while the driver plans the query.  Returns the job's thread (a daemon: the
    query does not wait for it, and an error only means no warm-up)."""
    parallelism = int(spark.conf.get("spark.sql.shuffle.partitions", "2") or "2")

    def job() -> None:
        try:
            spark.range(0, parallelism, 1, parallelism).mapInArrow(_warm_worker, "id long").collect()
        except Exception:  # a warm-up that fails leaves the workers to start when the tasks need them
            logging.getLogger("millstream.spark").info("prewarming the Python workers failed", exc_info=True)

    thread = threading.Thread(target=job, name="millstream-prewarm", daemon=True)
    thread.start()
    return thread


def run(config: PipelineConfig, *, out: Callable[[str], None] | None = None) -> int:
    """``millstream pipeline run``: run the query until it ends (available-now) or a stop signal.
    Prints ``started {...}`` once, then ``progress {...}`` per micro-batch, then ``stopped {...}``.
    Returns the exit status: 0 when the query ended or was stopped, 1 when it failed."""
    emit = out or _print_line
    spark = build_session(config)
    try:
        prewarm(spark)
        query = start_query(spark, config)
        emit("started " + json.dumps({"query_id": str(query.id), "run_id": str(query.runId),
                                      "checkpoint": str(config.checkpoint), "pid": os.getpid()}))
        printed = -1
        with _stop_on_signals() as stop_requested:
            while True:
                ended = query.awaitTermination(POLL_INTERVAL_SECONDS)  # type: ignore[arg-type]  # (seconds: a float works)
                for progress in query.recentProgress:
                    record = progress_record(json.loads(progress.json))
                    batch_id = record["batch_id"]
                    if isinstance(batch_id, int) and batch_id > printed:
                        printed = batch_id
                        emit("progress " + json.dumps(record))
                if ended:
                    break
                if stop_requested():
                    spark.conf.set("spark.sql.streaming.stopTimeout", str(STOP_TIMEOUT_MS))
                    query.stop()
                    break
        error = query.exception()
        if error is not None:
            emit("failed " + json.dumps({"error": _first_line(str(error))}))
            return 1
        emit("stopped " + json.dumps({"last_batch_id": printed}))
        return 0
    except Exception as error:  # a query that cannot start: the one line that says why, not a trace
        from pyspark.errors import PySparkException

        if isinstance(error, (PySparkException, InvalidArgumentError)):
            emit("failed " + json.dumps({"error": _first_line(str(error))}))
            return 1
        raise
    finally:
        spark.stop()


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else message


# --- the fault hook (tests only) -------------------------------------------------------------------

_FAULT_FORMAT: Final = "millstream_fault_injection"


@attrs.frozen
class Fault:
    """A parsed ``MILLSTREAM_SPARK_FAULT``: kill the driver ``when`` ("before" or "after") the store's
    commit of the first batch with rows whose id is at least ``batch_id``."""

    when: str
    batch_id: int


def parse_fault(text: str) -> Fault:
    """Parse ``kill-in-commit:WHEN:BATCH``; ``InvalidArgumentError`` naming the variable otherwise."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != "kill-in-commit" or parts[1] not in ("before", "after") \
            or not parts[2].isdigit():
        raise InvalidArgumentError(f"{FAULT_ENVIRONMENT_VARIABLE} is kill-in-commit:before|after:BATCH_ID, "
                                   f"not {text!r}")
    return Fault(parts[1], int(parts[2]))


#: ``kill_session`` looks for stragglers this many times (a process may fork while the kill goes on).
KILL_SESSION_PASSES: Final = 3


def session_members(session: int) -> list[int]:
    """The pids of every live process of ``session`` (from ``/proc``; Linux).  Zombies are dead
    already (only their exit status waits for a parent), so they are not listed."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # After "(comm)": state ppid pgrp session ...
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` -- a pipeline run started in a session of its own: the
    driver's Python, its JVM and every Python worker -- a machine dying, not processes exiting.

    A process group is not enough: PySpark's worker daemon moves itself and the workers it forks
    into a group of their own, so ``killpg`` of the driver's group leaves them (and a commit running
    in one of them) behind.  The caller, if it is a member, dies last."""
    me = os.getpid()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signal.SIGKILL)  # the driver and its JVM at once
    for _ in range(KILL_SESSION_PASSES):
        others = [pid for pid in session_members(session) if pid != me]
        if not others:
            break
        for pid in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if os.getsid(0) == session:
        os.kill(me, signal.SIGKILL)


def _kill_driver() -> None:
    """SIGKILL the whole pipeline run this process belongs to (``kill_session``)."""
    kill_session(os.getsid(0))


def _fault_injecting_source() -> type:
    """The millstream data source under another format name, whose stream writer's ``commit`` obeys
    the fault hook.  Built on demand so importing this module never needs pyspark."""
    from millstream.spark import MillstreamDataSource

    class FaultInjectingDataSource(MillstreamDataSource):
        @classmethod
        def name(cls) -> str:
            return _FAULT_FORMAT

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            writer = super().streamWriter(schema, overwrite)
            text = os.environ.get(FAULT_ENVIRONMENT_VARIABLE)
            if not text:
                return writer
            fault = parse_fault(text)
            commit = writer.commit

            def commit_with_fault(messages: Any, batch_id: int) -> None:
                # Only a batch with transactions to commit: a batch without rows calls no multi-commit.
                armed = batch_id >= fault.batch_id and any(
                    getattr(message, "txn_id", None) is not None for message in messages if message is not None)
                if armed and fault.when == "before":
                    _kill_driver()
                commit(messages, batch_id)
                if armed and fault.when == "after":
                    _kill_driver()

            writer.commit = commit_with_fault  # type: ignore[method-assign, assignment]  # (the fault hook wraps it)
            return writer

    return FaultInjectingDataSource
