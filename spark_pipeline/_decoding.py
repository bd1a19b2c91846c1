"""Events to Arrow record batches, by the source's schema (executor side).

Theory of operation.  A source task reads whole buffers of framed events of one segment
(``_segment_io.FrameBlock``: the bytes and where each frame starts) and turns each into one
``pyarrow.RecordBatch`` whose schema is exactly the one Spark derives from the query's schema
(``to_arrow_schema(schema, timezone="UTC")``: Spark refuses any other).  Each column is filled by
name:

* ``stream``, ``segment``, ``offset`` -- where the event lies (in ``raw``/``string`` mode always; in
  ``json`` mode with ``metadataColumns=true``);
* ``value`` -- the payload, binary (``raw``) or UTF-8 text (``string``);
* ``routing_key`` -- a field of the payload's JSON object with ``routingKeyField``, else null;
* in ``json`` mode every other column is the field of that name of the payload's JSON object,
  converted to the column's type: numbers for numeric columns, ``true``/``false`` for booleans,
  ISO-8601 text or epoch seconds for timestamps and dates, base64 text for binary, text or numbers for
  decimals; a missing field or ``null`` is null.

Two paths give the same answer.  The *block path* builds each column over the whole buffer at once,
in C: the frames are one Arrow binary array whose offsets are the frame starts (no copy), and
``binary_slice`` cuts the headers off every value in one call; ``string`` is that array cast to
UTF-8 (which validates it); the metadata columns are numpy arrays; ``json`` overwrites each header in a
copy of the buffer with blanks and a newline -- the buffer is then newline-delimited JSON -- and
parses it with pyarrow's JSON reader against the schema.  It takes a block only when Arrow's reading
is provably the same as the event path's: anything Arrow refuses or counts differently (a number
where text is wanted, an integral float for an integer column, a payload holding two objects or
none), and any column type it cannot read the same way (maps, epoch seconds for a timestamp), sends
the whole block down the *event path*, which decodes event by event in Python and says exactly which
event does not fit.

An event that does not fit (not UTF-8, not a JSON object, a field of the wrong type) fails the task
with a ``SchemaMismatchError`` naming the option, the stream, the segment and the event's offset --
or, with the source's ``deadLetterStream`` option, becomes a ``DeadLetter`` (its position, its bytes,
the reason) that the reader writes to that stream (``_dead_letters``) while the batch goes on
without it.  Either way the source never drops or nulls an event it cannot read.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
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

from millstream.spark._errors import OptionError, SchemaMismatchError
from millstream.spark._options import METADATA_COLUMNS, SourceOptions
from millstream.spark._segment_io import HEADER_LENGTH, FrameBlock, int64_array

__all__ = ["DeadLetter", "EventDecoder"]

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


#: ``binary_slice``'s stop for "to the end of each value" (a payload is far shorter).
_TO_THE_END: Final = 2**31 - 1
#: What replaces an event's 8-byte header in the JSON reader's copy of a block: blanks, then a
#: newline, so the payloads become newline-delimited JSON.
_JSON_SEPARATOR: Final = np.frombuffer(b"       \n", dtype=np.uint8)


@attrs.frozen
class DeadLetter:
    """An event the source could not decode, where it lies, and why (``deadLetterStream``)."""

    stream: str
    segment_id: int
    offset: int
    payload: bytes
    reason: str


class _Refused(Exception):
    """The block path cannot take this block; the event path decodes it."""


def _json_read_type(arrow_type: pa.DataType) -> tuple[pa.DataType, str] | None:
    """How the block path reads a column of ``arrow_type`` with Arrow's JSON reader: the type to read
    and what to do after (``""``: nothing; ``"date"``: text to a date; ``"base64"``: text to bytes;
    ``"naive"``: a UTC timestamp without its zone), or None if it cannot read it as the event path
    would."""
    if pa.types.is_string(arrow_type) or pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) \
            or pa.types.is_boolean(arrow_type) or pa.types.is_decimal128(arrow_type):
        return arrow_type, ""
    if pa.types.is_timestamp(arrow_type):
        return pa.timestamp(arrow_type.unit, "UTC"), "" if arrow_type.tz is not None else "naive"
    if pa.types.is_date32(arrow_type):
        return pa.string(), "date"
    if pa.types.is_binary(arrow_type):
        return pa.string(), "base64"
    if pa.types.is_list(arrow_type):
        inner = _json_read_type(arrow_type.value_type)
        return (arrow_type, "") if inner == (arrow_type.value_type, "") else None
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        same = all(_json_read_type(f.type) == (f.type, "") for f in fields)
        return (arrow_type, "") if same else None
    return None


def _binary_over(data: Any, starts: np.ndarray, end: int) -> pa.Array:
    """The frames of a block as one Arrow binary array over its own buffer (no copy)."""
    offsets = np.empty(len(starts) + 1, dtype=np.int32)
    offsets[:-1] = starts
    offsets[-1] = end
    return pa.Array.from_buffers(pa.binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _repeated_string(text: str, count: int) -> pa.Array:
    """``count`` copies of ``text`` as an Arrow string array, without a Python object per row."""
    encoded = text.encode("utf-8")
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(len(encoded))
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * count)])


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
        # What the JSON reader reads (``_json_columns``): None until planned, then a list, or an
        # empty tuple when the schema has a column it cannot read as the event path does.
        self._json_plan: list[tuple[str, pa.DataType, str]] | tuple[()] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None  # rebuilt where it is used
        state["_converters"] = None
        state["_json_plan"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._converters = [_converter(f.dataType) for f in self._schema.fields]

    @property
    def arrow_schema(self) -> pa.Schema:
        if self._arrow_schema is None:
            self._arrow_schema = to_arrow_schema(self._schema, timezone="UTC")
        return self._arrow_schema

    # --- The block path ----------------------------------------------------------------------------

    def decode_block(self, stream: str, segment_id: int, block: FrameBlock,
                     dead_letters: list[DeadLetter] | None = None) -> pa.RecordBatch:
        """One record batch of the events of ``block``.  Raises ``SchemaMismatchError`` for the first
        event that does not fit -- or, with ``dead_letters``, appends each such event there and
        leaves it out of the batch."""
        try:
            return self._decode_whole(stream, segment_id, block)
        except _Refused:
            return self._decode_events(stream, segment_id, block.events(), dead_letters)

    def _decode_whole(self, stream: str, segment_id: int, block: FrameBlock) -> pa.RecordBatch:
        schema = self.arrow_schema
        count = block.count
        table: pa.Table | None = None
        if self._serializer == "json":
            table = self._json_table(block, self._json_columns())
        arrays = []
        values: pa.Array | None = None
        for index, name in enumerate(self._names):
            arrow_type = schema.field(index).type
            if self._metadata and name in METADATA_COLUMNS:
                if name == "stream":
                    array = _repeated_string(stream, count)
                elif name == "segment":
                    array = int64_array(np.full(count, segment_id, dtype=np.int64))
                else:
                    array = int64_array(block.offsets())
            elif self._serializer != "json" and name == "value":
                if values is None:
                    values = self._values(block)
                array = values
                if self._serializer == "string":
                    try:
                        array = values.cast(pa.string())
                    except pa.ArrowInvalid:
                        raise _Refused from None  # not UTF-8: the event path names the event
            elif self._serializer != "json":  # routing_key
                array = pa.nulls(count, pa.string()) if self._routing_key_field is None \
                    else self._routing_keys(block)
            else:
                assert table is not None
                array = self._json_column(table, name, arrow_type)
            if array.type != arrow_type:
                raise _Refused
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    @staticmethod
    def _values(block: FrameBlock) -> pa.Array:
        """The payloads as one binary array: the frames over the block's buffer, headers cut off."""
        frames = _binary_over(block.data, block.starts, len(block.data))
        return pc.binary_slice(frames, HEADER_LENGTH, _TO_THE_END)

    def _json_columns(self) -> list[tuple[str, pa.DataType, str]]:
        """The schema's columns the JSON reader fills, each with the type to read and the step after;
        ``_Refused`` if a column cannot be read as the event path reads it."""
        if self._json_plan is None:
            plan: list[tuple[str, pa.DataType, str]] = []
            schema = self.arrow_schema
            for index, name in enumerate(self._names):
                if self._metadata and name in METADATA_COLUMNS:
                    continue
                read = _json_read_type(schema.field(index).type)
                if read is None:
                    self._json_plan = ()
                    break
                plan.append((name, *read))
            else:
                self._json_plan = plan
        if not isinstance(self._json_plan, list):
            raise _Refused
        return self._json_plan

    @staticmethod
    def _json_table(block: FrameBlock, columns: list[tuple[str, pa.DataType, str]]) -> pa.Table:
        """The block's payloads read by Arrow's JSON reader as the ``columns`` (name, type to read);
        ``_Refused`` unless it reads exactly one object per event."""
        text = np.frombuffer(block.data, dtype=np.uint8).copy()
        positions = block.starts
        # Every payload must be one object by its bytes alone: it starts with '{' and ends with '}'.
        # Then no object can run from one payload into the next (a '{' cannot follow a complete value
        # inside an object or array, and the separator's newline cannot stand inside a string), so
        # each payload gives at least one row and a count of one per event proves one each.  (Arrow's
        # reader also crashes on a first value of ``null``: this keeps it from ever seeing one.)
        ends = block.ends()
        if not len(positions) or bool((ends - positions <= HEADER_LENGTH).any()) \
                or not bool((text[positions + HEADER_LENGTH] == ord("{")).all()) \
                or not bool((text[ends - 1] == ord("}")).all()):
            raise _Refused
        for index in range(HEADER_LENGTH):
            text[positions + index] = _JSON_SEPARATOR[index]
        read_schema = pa.schema([(name, read_type) for name, read_type, _ in columns])
        try:
            table = pa_json.read_json(
                pa.BufferReader(pa.py_buffer(text)),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(text) + 1, 1 << 16)),
                parse_options=pa_json.ParseOptions(explicit_schema=read_schema, unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise _Refused from None
        if table.num_rows != block.count:
            raise _Refused  # a payload held two objects, or none
        return table

    def _json_column(self, table: pa.Table, name: str, arrow_type: pa.DataType) -> pa.Array:
        assert isinstance(self._json_plan, list)
        step = next(after for column, _, after in self._json_plan if column == name)
        column = table.column(name).combine_chunks()
        try:
            if step == "date":
                column = pc.cast(pc.utf8_slice_codeunits(column, 0, 10), pa.date32())
            elif step == "naive":
                column = column.cast(arrow_type)
            elif step == "base64":
                column = pa.array([None if text is None else _binary(text) for text in column.to_pylist()],
                                  type=pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, _Mismatch):
            raise _Refused from None
        return column

    def _routing_keys(self, block: FrameBlock) -> pa.Array:
        """``routingKeyField`` of each event: read as text by Arrow's JSON reader, or -- when an event
        is not JSON or the field is not text, which makes the key unknown (null), not an error --
        event by event."""
        field = self._routing_key_field
        assert field is not None
        try:
            table = self._json_table(block, [(field, pa.string(), "")])
            return table.column(field).combine_chunks()
        except _Refused:
            keys = []
            for offset, payload in block.events():
                value = self._object("", 0, offset, payload)
                key = value.get(field) if isinstance(value, dict) else None
                keys.append(key if isinstance(key, str) else None)
            return pa.array(keys, type=pa.string())

    # --- The event path ----------------------------------------------------------------------------

    def decode(self, stream: str, segment_id: int, events: Sequence[tuple[int, bytes]]) -> pa.RecordBatch:
        """One record batch of ``events`` (``(offset, payload)`` of segment ``segment_id``), event by
        event.  Raises ``SchemaMismatchError`` for the first event that does not fit."""
        return self._decode_events(stream, segment_id, events, None)

    def _decode_events(self, stream: str, segment_id: int, events: Sequence[tuple[int, bytes]],
                       dead_letters: list[DeadLetter] | None) -> pa.RecordBatch:
        schema = self.arrow_schema
        kept: list[tuple[int, bytes]] = []
        columns: list[list[Any]] = [[] for _ in self._names]
        for offset, payload in events:
            try:
                row = self._row(stream, segment_id, offset, payload)
            except SchemaMismatchError as error:
                if dead_letters is None:
                    raise
                dead_letters.append(DeadLetter(stream, segment_id, offset, payload, str(error)))
                continue
            kept.append((offset, payload))
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        while True:
            arrays = []
            for index, name in enumerate(self._names):
                arrow_type = schema.field(index).type
                try:
                    arrays.append(pa.array(columns[index], type=arrow_type))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as error:
                    refused = self._first_refused(columns[index], arrow_type)
                    offset, payload = kept[refused]
                    mismatch = self._mismatch(stream, segment_id, offset,
                                              f"field {name!r} does not fit {arrow_type}: {error}")
                    if dead_letters is None:
                        raise mismatch from None
                    dead_letters.append(DeadLetter(stream, segment_id, offset, payload, str(mismatch)))
                    del kept[refused]
                    for column in columns:
                        del column[refused]
                    break
            else:
                return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _row(self, stream: str, segment_id: int, offset: int, payload: bytes) -> list[Any]:
        """One event's value for each column; ``SchemaMismatchError`` if it does not fit."""
        value: Any = None
        if self._serializer == "json" or self._routing_key_field is not None:
            value = self._object(stream, segment_id, offset, payload)
        row: list[Any] = []
        for index, name in enumerate(self._names):
            if self._metadata and name in METADATA_COLUMNS:
                row.append(stream if name == "stream" else segment_id if name == "segment" else offset)
            elif self._serializer != "json" and name == "value":
                row.append(payload if self._serializer == "raw" else self._text(stream, segment_id, offset, payload))
            elif self._serializer != "json":  # routing_key
                key = value.get(self._routing_key_field) if isinstance(value, dict) else None
                row.append(key if isinstance(key, str) else None)
            else:
                raw = value.get(name)
                try:
                    row.append(None if raw is None else self._converters[index](raw))
                except _Mismatch as error:
                    raise self._mismatch(stream, segment_id, offset, f"field {name!r} {error}") from None
        return row

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
    def _first_refused(values: list[Any], arrow_type: pa.DataType) -> int:
        for index, value in enumerate(values):
            try:
                pa.array([value], type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
                return index
        return 0
