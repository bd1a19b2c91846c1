"""Event blocks to Arrow record batches (plain Python, milliseconds): the block path builds every
column over the whole buffer -- no event is decoded one by one in Python for raw, string and json
sources -- and gives exactly what the event-by-event path gives; any event the block path cannot
take sends its block down the event path, which names the first event that does not fit, or hands
each such event over as a dead letter with its position while the rest of the block goes on."""

from __future__ import annotations

import datetime
import json
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from millstream.spark import SchemaMismatchError, parse_source_options
from millstream.spark._decoding import DeadLetter, EventDecoder, _Refused
from millstream.spark._segment_io import FrameBlock, scan_frames

STREAM = "sc/st"
BASE = {"controller": "tcp://127.0.0.1:1", "stream": STREAM}
RAW_SCHEMA = StructType([StructField("value", BinaryType()), StructField("stream", StringType()),
                         StructField("segment", LongType()), StructField("offset", LongType()),
                         StructField("routing_key", StringType())])
STRING_SCHEMA = StructType([StructField("value", StringType()), *RAW_SCHEMA.fields[1:]])
SENSOR_DDL = "sensor STRING, n BIGINT, reading DOUBLE, hot BOOLEAN"
SENSOR_SCHEMA = StructType([StructField("sensor", StringType()), StructField("n", LongType()),
                            StructField("reading", DoubleType()), StructField("hot", BooleanType()),
                            StructField("stream", StringType()), StructField("segment", LongType()),
                            StructField("offset", LongType())])


def block_of(payloads: list[bytes], base: int = 500) -> FrameBlock:
    data = b"".join(struct.pack(">ii", 0, len(p)) + p for p in payloads)
    starts, end = scan_frames(data)
    assert end == len(data)
    return FrameBlock(data, base, starts)


def decoder(spark_schema: StructType, /, **options: str) -> EventDecoder:
    return EventDecoder(parse_source_options({**BASE, **options}), spark_schema)


def readings(count: int, width: int = 4) -> list[bytes]:
    return [json.dumps({"sensor": f"s{n % 5}", "n": n * 10 ** width, "reading": n / 4, "hot": n % 3 == 0},
                       separators=(",", ":")).encode() for n in range(count)]


@pytest.mark.parametrize(("schema", "options"), [
    (RAW_SCHEMA, {}), (STRING_SCHEMA, {"serializer": "string"}),
    (RAW_SCHEMA, {"routingKeyField": "sensor"}),
    (SENSOR_SCHEMA, {"serializer": "json", "schema": SENSOR_DDL, "metadataColumns": "true"})])
def test_a_block_is_decoded_whole_not_event_by_event(schema: StructType, options: dict[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    events = readings(3000)
    block = block_of(events)
    expected = decoder(schema, **options).decode(STREAM, 7, block.events())

    def per_event(*args: Any) -> Any:
        raise AssertionError("an event was decoded on its own, in Python")

    monkeypatch.setattr(EventDecoder, "_row", per_event)
    monkeypatch.setattr(EventDecoder, "_object", per_event)
    batch = decoder(schema, **options).decode_block(STREAM, 7, block)
    assert batch.equals(expected) and batch.num_rows == 3000
    assert batch.column(batch.schema.get_field_index("offset")).to_pylist() == [
        500 + int(s) for s in block.starts]


json_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                        st.text(max_size=6), st.lists(st.integers(0, 3), max_size=2))


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["object"] * 6 + ["garbage", "two", "scalar", "empty", "utf16"]))
    if kind == "garbage":
        return draw(st.binary(max_size=12))
    if kind == "scalar":
        return json.dumps(draw(json_values)).encode()
    if kind == "empty":
        return b""
    fields = draw(st.dictionaries(st.sampled_from(["sensor", "n", "reading", "hot", "other"]), json_values,
                                  max_size=5))
    text = json.dumps(fields, ensure_ascii=draw(st.booleans()))
    if kind == "two":
        return (text + " " + text).encode()
    return text.encode("utf-16") if kind == "utf16" else text.encode()


def outcome(action: Any) -> Any:
    try:
        return action()
    except SchemaMismatchError as error:
        return f"error: {error}"


@pytest.mark.parametrize(("schema", "options"), [
    (RAW_SCHEMA, {}), (STRING_SCHEMA, {"serializer": "string"}), (RAW_SCHEMA, {"routingKeyField": "sensor"}),
    (SENSOR_SCHEMA, {"serializer": "json", "schema": SENSOR_DDL, "metadataColumns": "true"})])
@given(st.lists(payloads(), min_size=1, max_size=25))
def test_the_block_path_answers_as_the_event_path(schema: StructType, options: dict[str, str],
                                                  events: list[bytes]) -> None:
    block = block_of(events)
    whole = decoder(schema, **options)
    by_event = decoder(schema, **options)
    try:
        fast = whole._decode_whole(STREAM, 3, block)
    except _Refused:
        fast = None
    slow = outcome(lambda: by_event.decode(STREAM, 3, block.events()))
    if fast is not None:
        assert not isinstance(slow, str), f"the block path took a block the event path refuses: {slow}"
        assert fast.equals(slow), (fast.to_pylist(), slow.to_pylist())
    assert outcome(lambda: decoder(schema, **options).decode_block(STREAM, 3, block)) == slow


TYPED_DDL = "at TIMESTAMP, naive TIMESTAMP_NTZ, day DATE, raw BINARY, total DECIMAL(10,3), tags ARRAY<STRING>"
TYPED_SCHEMA = StructType([StructField("at", TimestampType()), StructField("naive", TimestampNTZType()),
                           StructField("day", DateType()), StructField("raw", BinaryType()),
                           StructField("total", DecimalType(10, 3)), StructField("tags", ArrayType(StringType()))])


def test_typed_columns_take_the_block_path_and_agree_with_the_event_path() -> None:
    rows = [{"at": "2024-05-06T07:08:09.123456Z", "naive": "2024-05-06T07:08:09+02:00", "day": "2024-01-02T03:04",
             "raw": "AAE=", "total": 1.125, "tags": ["a", "b"]},
            {"at": "2024-05-06 07:08:09", "naive": None, "day": "2024-01-03", "raw": None, "total": "2.5"},
            {}]
    block = block_of([json.dumps(r).encode() for r in rows])
    typed = decoder(TYPED_SCHEMA, serializer="json", schema=TYPED_DDL)
    fast = typed._decode_whole(STREAM, 0, block)
    assert fast.equals(typed.decode(STREAM, 0, block.events()))
    first = fast.to_pylist()[0]
    assert first["at"] == datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    assert first["naive"] == datetime.datetime(2024, 5, 6, 5, 8, 9) and first["raw"] == b"\x00\x01"
    # Epoch seconds for a timestamp: the event path reads them (the block path refuses the block).
    epoch = block_of([b'{"at": 1700000000}'])
    with pytest.raises(_Refused):
        typed._decode_whole(STREAM, 0, epoch)
    assert typed.decode_block(STREAM, 0, epoch).column(0)[0].as_py() == datetime.datetime(
        2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)


def test_a_bad_event_is_named_by_its_position_or_becomes_a_dead_letter() -> None:
    events = readings(50)
    events[17] = b'{"sensor": 5}'
    events[31] = b"\xff not json"
    block = block_of(events, base=1000)
    offsets = block.offsets().tolist()
    json_decoder = decoder(SENSOR_SCHEMA, serializer="json", schema=SENSOR_DDL, metadataColumns="true")
    with pytest.raises(SchemaMismatchError, match=rf"segment 4 at offset {offsets[17]} does not fit option "
                                                  r"'schema': field 'sensor' expects a string, got 5"):
        json_decoder.decode_block(STREAM, 4, block)
    letters: list[DeadLetter] = []
    batch = json_decoder.decode_block(STREAM, 4, block, letters)
    assert [(d.stream, d.segment_id, d.offset, d.payload) for d in letters] == [
        (STREAM, 4, offsets[17], events[17]), (STREAM, 4, offsets[31], events[31])]
    assert "expects a string" in letters[0].reason and "is not JSON" in letters[1].reason
    assert batch.num_rows == 48 and batch.column(6).to_pylist() == [o for n, o in enumerate(offsets)
                                                                   if n not in (17, 31)]
    # A value Arrow refuses (an integer beyond 64 bits) is found and named the same way.
    events[40] = b'{"n": 100000000000000000000}'
    letters = []
    batch = json_decoder.decode_block(STREAM, 4, block_of(events, base=1000), letters)
    assert [d.offset for d in letters] == [offsets[17], offsets[31], offsets[40]] and batch.num_rows == 47
    # Text that is not UTF-8, with serializer=string.
    letters = []
    batch = decoder(STRING_SCHEMA, serializer="string").decode_block(STREAM, 4, block_of(events, base=1000), letters)
    assert [d.offset for d in letters] == [offsets[31]] and batch.num_rows == 49
    assert "not UTF-8" in letters[0].reason


def test_every_batch_has_the_schema_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    block = block_of(readings(10))
    for schema, options in ((RAW_SCHEMA, {}), (STRING_SCHEMA, {"serializer": "string"}),
                            (SENSOR_SCHEMA, {"serializer": "json", "schema": SENSOR_DDL, "metadataColumns": "true"})):
        batch = decoder(schema, **options).decode_block(STREAM, 1, block)
        assert batch.schema.equals(to_arrow_schema(schema, timezone="UTC")), batch.schema
    empty = decoder(RAW_SCHEMA).decode_block(STREAM, 1, FrameBlock(b"", 0, np.empty(0, dtype=np.int64)))
    assert empty.num_rows == 0 and isinstance(empty, pa.RecordBatch)


@pytest.mark.parametrize("events", [
    [b"null"], [b"{}", b"null"], [b'{"a":', b'{"sensor":"x"}}', b"{} null"], [b'{"a":"}', b'{"sensor":"x"}'],
    [b" {}"], [b"{} "], [b"[{}]"], [b"{}{}", b""], [b'{"sensor": "s"}\n'], [b'{"sensor":\n"s"}']])
def test_payloads_that_are_not_one_object_each_answer_as_the_event_path(events: list[bytes]) -> None:
    """Arrow's reader sees the block as one text: an object running into the next payload, two objects
    in one, a top-level null (which crashes Arrow 26's reader as a first value) must not slip by."""
    block = block_of(events)
    for spark_schema, options in ((SENSOR_SCHEMA, {"serializer": "json", "schema": SENSOR_DDL,
                                                   "metadataColumns": "true"}),
                                  (RAW_SCHEMA, {"routingKeyField": "sensor"})):
        expected = outcome(lambda s=spark_schema, o=options: decoder(s, **o).decode(STREAM, 0, block.events()))
        assert outcome(lambda s=spark_schema, o=options: decoder(s, **o).decode_block(STREAM, 0, block)) == expected
