"""Events to Arrow record batches, by the source's schema (executor side).

Theory of operation.  A source task reads ``(offset, payload)`` pairs of one segment
(``_segment_io``) and turns each run of them into one ``pyarrow.RecordBatch`` whose schema is exactly
the one Spark derives from the query's schema (``to_arrow_schema(schema, timezone="UTC")``: Spark
refuses any other).  Each column is filled by name:

* ``stream``, ``segment``, ``offset`` -- where the event lies (in ``raw``/``string`` mode always; in
  ``json`` mode with ``metadataColumns=true``);
* ``value`` -- the payload, binary (``raw``) or UTF-8 text (``string``);
* ``routing_key`` -- a field of the payload's JSON object with ``routingKeyField``, else null;
* in ``json`` mode every other column is the field of that name of the payload's JSON object,
  converted to the column's type: numbers for numeric columns, ``true``/``false`` for booleans,
  ISO-8601 text or epoch seconds for timestamps and dates, base64 text for binary, text or numbers for
  decimals; a missing field or ``null`` is null.

An event that does not fit (not UTF-8, not a JSON object, a field of the wrong type) fails the task
with a ``SchemaMismatchError`` naming the option, the stream, the segment and the event's offset:
the source never drops or nulls an event it cannot read.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from millstream.spark._errors import OptionError, SchemaMismatchError
from millstream.spark._options import METADATA_COLUMNS, SourceOptions
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

__all__ = ["EventDecoder"]

_UTC = datetime.UTC


class _Mismatch(Exception):
    """One value does not fit its column (the decoder adds where the event lies)."""


def _timestamp(value: Any, *, aware: bool) -> datetime.datetime:
    if isinstance(value, bool):
        raise _Mismatch(f"expects a timestamp, got {value!r}")
    if isinstance(value, (int, float)):
        moment = datetime.datetime.fromtimestamp(value, _UTC)
    elif isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            raise _Mismatch(f"expects an ISO-8601 timestamp or epoch seconds, got {value!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_UTC)
    else:
        raise _Mismatch(f"expects a timestamp, got {value!r}")
    return moment.astimezone(_UTC) if aware else moment.astimezone(_UTC).replace(tzinfo=None)


def _date(value: Any) -> datetime.date:
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value[:10])
        except ValueError:
            pass
    raise _Mismatch(f"expects an ISO-8601 date, got {value!r}")


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Mismatch(f"expects an integer, got {value!r}")
    return value


def _floating(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch(f"expects a number, got {value!r}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Mismatch(f"expects true or false, got {value!r}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Mismatch(f"expects a string, got {value!r}")
    return value


def _binary(value: Any) -> bytes:
    if not isinstance(value, str):
        raise _Mismatch(f"expects base64 text, got {value!r}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Mismatch(f"expects base64 text, got {value!r}") from None


def _decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Mismatch(f"expects a decimal number, got {value!r}")
    try:
        return decimal.Decimal(str(value))
    except decimal.InvalidOperation:
        raise _Mismatch(f"expects a decimal number, got {value!r}") from None


def _converter(data_type: DataType) -> Callable[[Any], Any]:
    """How a JSON value becomes a value Arrow takes for a column of ``data_type`` (nested types are
    handed to Arrow as they are; Arrow refuses what does not fit)."""
    if isinstance(data_type, StringType):
        return _string
    if isinstance(data_type, (ByteType, ShortType, IntegerType, LongType)):
        return _integer
    if isinstance(data_type, (FloatType, DoubleType)):
        return _floating
    if isinstance(data_type, BooleanType):
        return _boolean
    if isinstance(data_type, TimestampType):
        return lambda v: _timestamp(v, aware=True)
    if isinstance(data_type, TimestampNTZType):
        return lambda v: _timestamp(v, aware=False)
    if isinstance(data_type, DateType):
        return _date
    if isinstance(data_type, BinaryType):
        return _binary
    if isinstance(data_type, DecimalType):
        return _decimal
    return lambda v: v


class EventDecoder:
    """Turns the events of one segment into record batches of the query's schema.  Built on the
    driver when the reader is (so a schema the source cannot fill fails the query at its start) and
    pickled to the tasks."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._serializer = options.serializer
        self._routing_key_field = options.routing_key_field
        self._metadata = options.serializer != "json" or options.metadata_columns
        self._schema = schema
        self._names = list(schema.fieldNames())
        allowed = {"value", "routing_key", *METADATA_COLUMNS}
        for field in schema.fields:
            name = field.name
            if self._serializer == "json":
                if name in METADATA_COLUMNS and self._metadata:
                    expected: tuple[type[DataType], ...] = (StringType,) if name == "stream" else (LongType,)
                    if not isinstance(field.dataType, expected):
                        raise OptionError("schema", f"column {name!r} is a metadata column of type "
                                                    f"{expected[0].__name__}, not {field.dataType.simpleString()}")
                continue
            if name not in allowed:
                raise OptionError("serializer", f"a {self._serializer} source has the columns value, stream, segment, "
                                                f"offset and routing_key; the query's schema asks for {name!r} (use "
                                                "serializer=json with a schema to read fields of the events)")
            wanted = {"value": (BinaryType,) if self._serializer == "raw" else (StringType,),
                      "routing_key": (StringType,), "stream": (StringType,), "segment": (LongType,),
                      "offset": (LongType,)}[name]
            if not isinstance(field.dataType, wanted):
                raise OptionError("serializer", f"column {name!r} of a {self._serializer} source is "
                                                f"{wanted[0].__name__}, not {field.dataType.simpleString()}")
        self._converters = [_converter(f.dataType) for f in schema.fields]
        self._arrow_schema: pa.Schema | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None  # rebuilt where it is used
        state["_converters"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._converters = [_converter(f.dataType) for f in self._schema.fields]

    @property
    def arrow_schema(self) -> pa.Schema:
        if self._arrow_schema is None:
            self._arrow_schema = to_arrow_schema(self._schema, timezone="UTC")
        return self._arrow_schema

    def decode(self, stream: str, segment_id: int, events: Sequence[tuple[int, bytes]]) -> pa.RecordBatch:
        """One record batch of ``events`` (``(offset, payload)`` of segment ``segment_id``)."""
        schema = self.arrow_schema
        objects: list[Any] | None = None
        if self._serializer == "json" or self._routing_key_field is not None:
            objects = [self._object(stream, segment_id, offset, payload) for offset, payload in events]
        arrays = []
        for index, name in enumerate(self._names):
            arrow_type = schema.field(index).type
            if self._metadata and name in METADATA_COLUMNS:
                if name == "stream":
                    values: list[Any] = [stream] * len(events)
                elif name == "segment":
                    values = [segment_id] * len(events)
                else:
                    values = [offset for offset, _ in events]
            elif self._serializer != "json" and name == "value":
                if self._serializer == "raw":
                    values = [payload for _, payload in events]
                else:
                    values = [self._text(stream, segment_id, offset, payload) for offset, payload in events]
            elif self._serializer != "json":  # routing_key
                field = self._routing_key_field
                values = [None] * len(events) if objects is None else [
                    o.get(field) if isinstance(o, dict) and isinstance(o.get(field), str) else None for o in objects]
            else:
                assert objects is not None
                convert = self._converters[index]
                values = []
                for (offset, _), obj in zip(events, objects, strict=True):
                    raw = obj.get(name)
                    try:
                        values.append(None if raw is None else convert(raw))
                    except _Mismatch as error:
                        raise self._mismatch(stream, segment_id, offset, f"field {name!r} {error}") from None
            try:
                arrays.append(pa.array(values, type=arrow_type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as error:
                offset = self._first_refused(values, arrow_type, events)
                raise self._mismatch(stream, segment_id, offset,
                                     f"field {name!r} does not fit {arrow_type}: {error}") from None
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _object(self, stream: str, segment_id: int, offset: int, payload: bytes) -> Any:
        try:
            value = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as error:
            if self._serializer != "json":
                return None  # the routing key is simply not known
            raise self._mismatch(stream, segment_id, offset, f"the event is not JSON ({error})") from None
        if self._serializer == "json" and not isinstance(value, dict):
            raise self._mismatch(stream, segment_id, offset, f"the event is JSON but not an object: {value!r:.80}")
        return value

    def _text(self, stream: str, segment_id: int, offset: int, payload: bytes) -> str:
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SchemaMismatchError(f"option 'serializer' is string, but the event of {stream} in segment "
                                      f"{segment_id} at offset {offset} is not UTF-8 text ({error})") from None

    def _mismatch(self, stream: str, segment_id: int, offset: int, what: str) -> SchemaMismatchError:
        return SchemaMismatchError(f"the event of {stream} in segment {segment_id} at offset {offset} does not fit "
                                   f"option 'schema': {what}")

    @staticmethod
    def _first_refused(values: list[Any], arrow_type: pa.DataType, events: Sequence[tuple[int, bytes]]) -> int:
        for value, (offset, _) in zip(values, events, strict=True):
            try:
                pa.array([value], type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
                return offset
        return events[0][0]
