"""Update output mode for the ``millstream`` sink, which Spark's Python data sources cannot take.

Why.  A streaming query in update mode asks its V2 sink's write builder for Spark's internal
``SupportsStreamingUpdateAsAppend`` -- Spark's Kafka sink has it; the write builder of every Python
data source (``PythonWriteBuilder``, Spark 4.x) does not, so ``outputMode("update")`` on
``format("millstream")`` fails in the JVM as the query starts ("does not support Update mode"),
before any Python code of the sink runs.  (Complete mode reaches the sink: Spark asks it to
truncate, which ``MillstreamDataSource.streamWriter`` answers as the Kafka sink does, appending each
batch's whole result.)

How.  ``enable_update_mode`` (``millstream.spark.register`` calls it) teaches pyspark's
``DataStreamWriter`` to remember the format, options and output mode it is given -- each setter
still does what it did -- and makes ``start()`` of a ``millstream`` query in update mode a
``foreachBatch`` query instead, whose function (``FencedBatchWrite``) writes every micro-batch with
the batch writer (``df.write.format("millstream")``) fenced by ``("spark/<query id>", batch id)``:
the fence the streaming sink records, so a batch Spark re-runs after a crash between the store's
commit and Spark's commit log commits nothing, exactly as in append mode.  Every other query is
started as pyspark starts it.  The options are checked at ``start()``, as the sink's are.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

from millstream.errors import InternalError
from millstream.spark._options import SPARK_OPTIONS, parse_sink_options
from millstream.spark._writer import QUERY_ID_PROPERTY, fence_key

__all__ = ["FencedBatchWrite", "enable_update_mode"]

_STATE: Final = "_millstream_settings"
_lock = threading.Lock()
_enabled: list[bool] = []  # holds True once the writer is wrapped


class FencedBatchWrite:
    """``foreachBatch``'s function for a ``millstream`` query in update mode: each micro-batch's rows
    appended to the stream by the batch writer, fenced by the query id and the batch id."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = {key: value for key, value in options.items()
                        if key.lower() not in {name.lower() for name in SPARK_OPTIONS}}
        parse_sink_options(self.options)  # a bad option fails at start(), not in the first batch

    def __call__(self, frame: Any, batch_id: int) -> None:
        query_id = frame.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise InternalError(f"foreachBatch ran without {QUERY_ID_PROPERTY!r}: the millstream sink cannot fence "
                                "this batch")
        (frame.write.format("millstream").options(**self.options)
         .option("fenceKey", fence_key(str(query_id))).option("fenceValue", str(batch_id))
         .mode("append").save())


def _settings(writer: Any) -> dict[str, Any]:
    state: dict[str, Any] | None = writer.__dict__.get(_STATE)
    if state is None:
        state = writer.__dict__[_STATE] = {"format": None, "mode": None, "options": {}}
    return state


def enable_update_mode() -> None:
    """Wrap ``pyspark.sql.streaming.DataStreamWriter`` as the module docstring says (once)."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    with _lock:
        if _enabled:
            return
        original_format = DataStreamWriter.format
        original_option = DataStreamWriter.option
        original_options = DataStreamWriter.options
        original_mode = DataStreamWriter.outputMode
        original_start = DataStreamWriter.start

        def format(self: Any, source: str) -> Any:
            _settings(self)["format"] = source
            return original_format(self, source)

        def option(self: Any, key: str, value: Any) -> Any:
            _settings(self)["options"][key] = value
            return original_option(self, key, value)

        def options(self: Any, **values: Any) -> Any:
            _settings(self)["options"].update(values)
            return original_options(self, **values)

        def output_mode(self: Any, mode: str) -> Any:
            _settings(self)["mode"] = mode
            return original_mode(self, mode)

        def start(self: Any, path: str | None = None, format: str | None = None,
                  outputMode: str | None = None, partitionBy: Any = None, queryName: str | None = None,
                  **values: Any) -> Any:
            if values:
                self.options(**values)
            if outputMode is not None:
                self.outputMode(outputMode)
            if format is not None:
                self.format(format)
            state = _settings(self)
            if str(state["format"]).lower() == "millstream" and str(state["mode"]).lower() == "update":
                options = {key: "" if value is None else str(value) for key, value in state["options"].items()}
                self.foreachBatch(FencedBatchWrite(options))
            return original_start(self, path, partitionBy=partitionBy, queryName=queryName)

        format.__doc__, option.__doc__ = original_format.__doc__, original_option.__doc__
        options.__doc__, output_mode.__doc__ = original_options.__doc__, original_mode.__doc__
        start.__doc__ = original_start.__doc__
        DataStreamWriter.format = format  # type: ignore[method-assign]
        DataStreamWriter.option = option  # type: ignore[method-assign]
        DataStreamWriter.options = options  # type: ignore[method-assign]
        DataStreamWriter.outputMode = output_mode  # type: ignore[method-assign, assignment]
        DataStreamWriter.start = start  # type: ignore[method-assign]
        _enabled.append(True)
