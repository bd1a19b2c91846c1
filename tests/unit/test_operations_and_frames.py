"""The bytes recovery reads back: operations, DataFrames and metadata checkpoints.

* Every operation type survives ``serialize`` -> ``deserialize`` with every field (Hypothesis), and
  any bytes either deserialize to an operation that serializes back to exactly them, or raise
  ``DataCorruptionError`` -- never another exception.
* The DataFrameBuilder packs by the documented rule (a record that exactly fills a frame, one that
  leaves less than an entry's room, one that spans three or more frames) and the DataFrameReader
  applies the rules for records cut short: dropped at the log's end, skipped at the very start,
  corruption anywhere else.
* A metadata checkpoint, attributes and tombstones included, round-trips byte for byte.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.errors import DataCorruptionError
from millstream.model.types import (
    ATTRIBUTE_ID_MAX,
    INT64_MAX,
    INT64_MIN,
    AttributeUpdate,
    AttributeUpdateType,
    SegmentStatus,
)
from millstream.segmentstore.data_frame import (
    ENTRY_HEADER_LENGTH,
    FRAME_HEADER_LENGTH,
    DataFrameBuilder,
    DataFrameReader,
    SealedFrame,
    decode_frame,
)
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord
from millstream.segmentstore.layout import ChunkSpan
from millstream.segmentstore.metadata import SegmentMetadata, deserialize_checkpoint, serialize_checkpoint
from millstream.segmentstore.operations import (
    DeleteSegmentOperation,
    MergeSegmentOperation,
    MetadataCheckpointOperation,
    Operation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentSealOperation,
    StreamSegmentTruncateOperation,
    UpdateAttributesOperation,
    deserialize,
)

# --- Operations ---------------------------------------------------------------------------------------

int64s = st.integers(INT64_MIN, INT64_MAX)
segment_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
attribute_updates = st.lists(
    st.builds(AttributeUpdate, st.integers(0, ATTRIBUTE_ID_MAX), st.sampled_from(AttributeUpdateType), int64s, int64s),
    max_size=5,
).map(tuple)

OPERATIONS: dict[type[Operation], st.SearchStrategy[Operation]] = {
    StreamSegmentAppendOperation: st.builds(
        lambda segment_id, data, updates, offset: StreamSegmentAppendOperation(segment_id, data, updates,
                                                                              offset=offset),
        int64s, st.binary(max_size=300), attribute_updates, int64s),
    StreamSegmentSealOperation: st.builds(StreamSegmentSealOperation, int64s, int64s),
    MergeSegmentOperation: st.builds(MergeSegmentOperation, int64s, int64s, int64s, int64s),
    StreamSegmentMapOperation: st.builds(StreamSegmentMapOperation, segment_names, attribute_updates, int64s),
    UpdateAttributesOperation: st.builds(UpdateAttributesOperation, int64s, attribute_updates),
    StreamSegmentTruncateOperation: st.builds(StreamSegmentTruncateOperation, int64s, int64s),
    MetadataCheckpointOperation: st.builds(MetadataCheckpointOperation, st.binary(max_size=300)),
    DeleteSegmentOperation: st.builds(DeleteSegmentOperation, int64s),
    StorageFlushOperation: st.builds(StorageFlushOperation, int64s, int64s, int64s, segment_names, int64s),
}
operations = st.one_of(*OPERATIONS.values())

#: What each type carries through the log (``expected_offset`` and names resolved later do not).
FIELDS: dict[type[Operation], Callable[[Any], tuple[Any, ...]]] = {
    StreamSegmentAppendOperation: lambda op: (op.segment_id, op.offset, bytes(op.data), op.attribute_updates),
    StreamSegmentSealOperation: lambda op: (op.segment_id, op.offset),
    MergeSegmentOperation: lambda op: (op.target_segment_id, op.source_segment_id, op.offset, op.length),
    StreamSegmentMapOperation: lambda op: (op.name, op.segment_id, op.attribute_updates),
    UpdateAttributesOperation: lambda op: (op.segment_id, op.attribute_updates),
    StreamSegmentTruncateOperation: lambda op: (op.segment_id, op.offset),
    MetadataCheckpointOperation: lambda op: (op.payload,),
    DeleteSegmentOperation: lambda op: (op.segment_id,),
    StorageFlushOperation: lambda op: (op.segment_id, op.offset, op.length, op.chunk, op.chunk_offset),
}


def test_every_operation_type_is_covered() -> None:
    defined = {kind for kind in Operation.__subclasses__() if kind.__module__.startswith("millstream.")}
    assert set(OPERATIONS) == set(FIELDS) == defined
    assert len({kind.TYPE for kind in OPERATIONS}) == len(OPERATIONS), "type codes are never shared"


@given(operations, st.integers(1, 2**62))
def test_operations_round_trip(operation: Operation, sequence_number: int) -> None:
    record = operation.serialize()
    assert operation.serialized_length == len(record)
    assert record[0] == operation.TYPE and record[1] == 0  # type code, version
    back = deserialize(record, sequence_number)
    assert type(back) is type(operation)
    assert back.sequence_number == sequence_number
    assert FIELDS[type(back)](back) == FIELDS[type(operation)](operation)
    assert back.serialize() == record


@given(operations, st.data())
def test_a_record_cut_short_or_extended_is_corruption(operation: Operation, data: st.DataObject) -> None:
    record = operation.serialize()
    cut = data.draw(st.integers(0, len(record) - 1), label="cut")
    with pytest.raises(DataCorruptionError, match="operation 7 is malformed"):
        deserialize(record[:cut], 7)
    with pytest.raises(DataCorruptionError, match="operation 7 is malformed"):
        deserialize(record + data.draw(st.binary(min_size=1, max_size=3), label="extra"), 7)


@given(st.one_of(st.binary(max_size=120), operations.map(lambda op: op.serialize()).flatmap(
    lambda record: st.tuples(st.just(record), st.integers(0, len(record) - 1), st.integers(1, 255)).map(
        lambda t: t[0][:t[1]] + bytes([t[0][t[1]] ^ t[2]]) + t[0][t[1] + 1:]))))
def test_any_bytes_are_an_exact_operation_or_corruption(record: bytes) -> None:
    """Random bytes, and valid records with one byte changed: the decoder never raises anything but
    DataCorruptionError, and whatever it accepts is canonical (serializes back to the same bytes)."""
    try:
        operation = deserialize(record, 1)
    except DataCorruptionError:
        return
    assert operation.serialize() == record


def test_an_unknown_type_or_version_is_corruption() -> None:
    with pytest.raises(DataCorruptionError, match="unknown operation type 99"):
        deserialize(bytes([99, 0]) + bytes(16), 1)
    with pytest.raises(DataCorruptionError, match="unknown record version 1"):
        deserialize(bytes([StreamSegmentSealOperation.TYPE, 1]) + bytes(16), 1)
    with pytest.raises(DataCorruptionError):
        deserialize(b"", 1)


# --- DataFrames ---------------------------------------------------------------------------------------

FRAME_BYTES_MAX = 64
CAPACITY = FRAME_BYTES_MAX - FRAME_HEADER_LENGTH  # content bytes per frame
FIRST, LAST = 1, 2


class Frames:
    """A builder and the frames it sealed."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self.sealed: list[SealedFrame] = []
        self.builder = DataFrameBuilder(frame_bytes_max, self.sealed.append)

    def append(self, sequence_number: int, record: bytes) -> bool:
        needs_flush = self.builder.append(sequence_number, record[:3], record[3:])  # head + tail, as appends do
        if needs_flush:
            self.builder.flush()
        return needs_flush

    @property
    def data(self) -> list[bytes]:
        return [bytes(frame.data) for frame in self.sealed]


def entries(frame: bytes) -> list[tuple[int, int, int]]:
    """``(sequence number, flags, payload length)`` of each entry: an independent reading of the
    layout in data_frame's docstring, which also checks the frame's header and CRC."""
    version, flags, content_length, crc = struct.unpack_from(">BBII", frame, 0)
    content = frame[FRAME_HEADER_LENGTH:]
    assert (version, flags, content_length, crc) == (0, 0, len(content), zlib.crc32(content))
    result = []
    position = 0
    while position < len(content):
        length, entry_flags, sequence_number = struct.unpack_from(">IBq", content, position)
        result.append((sequence_number, entry_flags, length))
        position += ENTRY_HEADER_LENGTH + length
    assert position == len(content)
    return result


def log_records(frames: list[bytes], first_sequence: int = 1) -> list[LogRecord]:
    return [LogRecord(LogAddress(first_sequence + index), frame) for index, frame in enumerate(frames)]


def read_back(frames: list[bytes], first_sequence: int = 1) -> tuple[list[tuple[int, bytes, int]], DataFrameReader]:
    """``(sequence number, record, log sequence of the frame holding its end)`` of each record read."""
    reader = DataFrameReader(log_records(frames, first_sequence))
    return [(r.sequence_number, bytes(r.data), r.address.sequence) for r in reader], reader


def record(sequence_number: int, length: int) -> bytes:
    return bytes((sequence_number * 31 + i) % 251 for i in range(length))


def test_a_record_that_exactly_fills_a_frame() -> None:
    frames = Frames()
    exact = CAPACITY - ENTRY_HEADER_LENGTH
    assert frames.append(1, record(1, exact)) is True  # full: the caller must flush (done by the helper)
    assert frames.append(2, record(2, 5)) is False
    frames.builder.flush()
    assert [len(frame) for frame in frames.data] == [FRAME_BYTES_MAX, FRAME_HEADER_LENGTH + ENTRY_HEADER_LENGTH + 5]
    assert entries(frames.data[0]) == [(1, FIRST | LAST, exact)]
    assert read_back(frames.data)[0] == [(1, record(1, exact), 1), (2, record(2, 5), 2)]


def test_a_frame_with_less_room_than_an_entry_needs_is_full() -> None:
    """A frame takes a new entry only while it has room for an entry header and one payload byte."""
    builder_frames = Frames()
    leaves_room = CAPACITY - 2 * ENTRY_HEADER_LENGTH - 1  # leaves exactly one header and one byte
    assert builder_frames.builder.append(1, record(1, leaves_room)) is False
    assert builder_frames.builder.append(2, b"x") is True  # now exactly full
    builder_frames = Frames()
    assert builder_frames.builder.append(1, record(1, leaves_room + 1)) is True  # leaves only a header


def test_a_record_one_byte_too_long_spans_two_frames() -> None:
    frames = Frames()
    length = CAPACITY - ENTRY_HEADER_LENGTH + 1
    frames.append(1, record(1, length))
    frames.builder.flush()
    assert [entries(frame) for frame in frames.data] == [
        [(1, FIRST, CAPACITY - ENTRY_HEADER_LENGTH)], [(1, LAST, 1)]]
    assert read_back(frames.data)[0] == [(1, record(1, length), 2)]


@pytest.mark.parametrize("frame_count", [3, 4, 7])
def test_a_record_spanning_several_frames(frame_count: int) -> None:
    frames = Frames()
    frames.append(1, record(1, 10))  # the big record starts mid-frame
    length = (frame_count - 1) * (CAPACITY - ENTRY_HEADER_LENGTH) - 10
    frames.append(2, record(2, length))
    frames.append(3, record(3, 4))
    frames.builder.flush()
    layout = [entries(frame) for frame in frames.data]
    assert len(layout) == frame_count
    assert layout[0] == [(1, FIRST | LAST, 10), (2, FIRST, CAPACITY - 2 * ENTRY_HEADER_LENGTH - 10)]
    assert all(frame == [(2, 0, CAPACITY - ENTRY_HEADER_LENGTH)] for frame in layout[1:-1])
    assert layout[-1][0][:2] == (2, LAST) and layout[-1][1] == (3, FIRST | LAST, 4)
    assert all(len(frame) <= FRAME_BYTES_MAX for frame in frames.data)
    assert read_back(frames.data)[0] == [(1, record(1, 10), 1), (2, record(2, length), frame_count),
                                         (3, record(3, 4), frame_count)]


#: Record 2 of ``spanning_log``: the rest of frame 1, two whole frames, and 10 bytes of frame 4.
SPANNING_LENGTH = (CAPACITY - 2 * ENTRY_HEADER_LENGTH - 20) + 2 * (CAPACITY - ENTRY_HEADER_LENGTH) + 10


def spanning_log() -> list[bytes]:
    """Frames: record 1 whole, record 2 across four frames, record 3 whole (in the last one)."""
    frames = Frames()
    frames.append(1, record(1, 20))
    frames.append(2, record(2, SPANNING_LENGTH))
    frames.append(3, record(3, 6))
    frames.builder.flush()
    assert [[flags for _sequence, flags, _length in entries(frame)] for frame in frames.data] == [
        [FIRST | LAST, FIRST], [0], [0], [LAST, FIRST | LAST]]
    return frames.data


def test_a_record_cut_short_at_the_end_of_the_log_is_dropped() -> None:
    log = spanning_log()
    for end in (2, 3):  # the log ends after record 2's first, or second, frame
        records, reader = read_back(log[:end])
        assert records == [(1, record(1, 20), 1)]
        assert reader.highest_sequence_number == 2  # its number is not reissued
        assert reader.frame_count == end and reader.last_address == LogAddress(end)


def test_a_continuation_at_the_very_start_is_skipped() -> None:
    """The log was truncated inside record 2: its tail is skipped, what follows is read."""
    log = spanning_log()
    records, reader = read_back(log[3:], first_sequence=4)
    assert records == [(3, record(3, 6), 4)]
    assert reader.highest_sequence_number == 3


def test_every_continuation_of_the_record_cut_by_truncation_is_skipped() -> None:
    log = spanning_log()
    records, _reader = read_back(log[1:], first_sequence=2)
    assert records == [(3, record(3, 6), 4)]


def one_record_frame(sequence_number: int) -> bytes:
    frames = Frames()
    frames.append(sequence_number, record(sequence_number, 8))
    frames.builder.flush()
    return frames.data[0]


def test_a_continuation_anywhere_else_is_corruption() -> None:
    log = spanning_log()
    # A whole record, then a middle piece of record 2, whose first frame is missing.
    with pytest.raises(DataCorruptionError, match="log record 2: a record continues that never began"):
        read_back([one_record_frame(1), log[2]])
    # A continuation after a whole record in the same frame.
    frame = frame_with_entries([(1, FIRST | LAST, b"whole"), (2, LAST, b"tail")])
    with pytest.raises(DataCorruptionError, match="log record 1: a record continues that never began"):
        read_back([frame])


def frame_with_entries(items: list[tuple[int, int, bytes]]) -> bytes:
    content = b"".join(struct.pack(">IBq", len(payload), flags, sequence) + payload
                       for sequence, flags, payload in items)
    return struct.pack(">BBII", 0, 0, len(content), zlib.crc32(content)) + content


def test_a_new_record_discards_one_left_open_by_a_crash() -> None:
    """Record 2's first frame landed, its rest did not; the next owner's record 3 follows."""
    log = spanning_log()
    after_crash = frame_with_entries([(3, FIRST | LAST, b"next owner")])
    records, _reader = read_back([log[0], log[1], after_crash])
    assert records == [(1, record(1, 20), 1), (3, b"next owner", 3)]


@pytest.mark.parametrize(("items", "message"), [
    ([(2, FIRST | LAST, b"a"), (2, FIRST | LAST, b"b")], "sequence number 2 does not follow 2"),
    ([(5, FIRST | LAST, b"a"), (4, FIRST | LAST, b"b")], "sequence number 4 does not follow 5"),
    ([(2, FIRST, b"a"), (3, LAST, b"b")], "entry of 3 inside record 2"),
], ids=["repeated", "backwards", "interleaved"])
def test_entries_out_of_order_are_corruption(items: list[tuple[int, int, bytes]], message: str) -> None:
    with pytest.raises(DataCorruptionError, match=message):
        read_back([frame_with_entries(items)])


def damaged(frame: bytes, change: Callable[[bytearray], None]) -> bytes:
    data = bytearray(frame)
    change(data)
    return bytes(data)


def fix_crc(data: bytearray) -> None:
    struct.pack_into(">I", data, 6, zlib.crc32(data[FRAME_HEADER_LENGTH:]))


GOOD_FRAME = frame_with_entries([(1, FIRST | LAST, b"hello"), (2, FIRST | LAST, b"world")])


def _content_flipped(data: bytearray) -> None:
    data[-1] ^= 1


def _version_changed(data: bytearray) -> None:
    data[0] = 1


def _content_length_wrong(data: bytearray) -> None:
    struct.pack_into(">I", data, 2, len(data) - FRAME_HEADER_LENGTH + 1)


def _empty_entry(data: bytearray) -> None:
    struct.pack_into(">I", data, FRAME_HEADER_LENGTH, 0)
    fix_crc(data)


def _unknown_flags(data: bytearray) -> None:
    data[FRAME_HEADER_LENGTH + 4] |= 4
    fix_crc(data)


def _entry_too_long(data: bytearray) -> None:
    struct.pack_into(">I", data, FRAME_HEADER_LENGTH, 1000)
    fix_crc(data)


@pytest.mark.parametrize(("frame", "message"), [
    (damaged(GOOD_FRAME, _content_flipped), "frame CRC mismatch"),
    (damaged(GOOD_FRAME, _version_changed), "unknown frame version 1"),
    (damaged(GOOD_FRAME, _content_length_wrong), "frame says"),
    (damaged(GOOD_FRAME, _empty_entry), "malformed entry at byte 10"),
    (damaged(GOOD_FRAME, _unknown_flags), "malformed entry at byte 10"),
    (damaged(GOOD_FRAME, _entry_too_long), "malformed entry at byte 10"),
    (GOOD_FRAME[:FRAME_HEADER_LENGTH - 1], "shorter than its header"),
    (frame_with_entries([(1, FIRST | LAST, b"x")]) + b"\x00", "frame says"),
], ids=["crc", "version", "content-length", "empty-entry", "unknown-flags", "entry-too-long", "short", "trailing"])
def test_a_malformed_frame_is_corruption_naming_its_record(frame: bytes, message: str) -> None:
    records = [LogRecord(LogAddress(1), one_record_frame(1)), LogRecord(LogAddress(2), frame)]
    with pytest.raises(DataCorruptionError, match=f"log record 2: .*{message}"):
        list(DataFrameReader(records))


def test_an_entry_header_cut_inside_a_frame_is_corruption() -> None:
    content = struct.pack(">IBq", 1, FIRST | LAST, 1) + b"x" + b"\x00\x00\x00"
    frame = struct.pack(">BBII", 0, 0, len(content), zlib.crc32(content)) + content
    with pytest.raises(DataCorruptionError, match="entry header cut at byte 24"):
        list(decode_frame(frame, "here"))


@given(st.lists(st.integers(1, 5 * CAPACITY), min_size=1, max_size=12), st.integers(0, 3),
       st.sampled_from([FRAME_HEADER_LENGTH + ENTRY_HEADER_LENGTH + 1, 40, FRAME_BYTES_MAX, 1000]))
def test_any_records_round_trip_through_frames(lengths: list[int], flush_every: int, frame_bytes_max: int) -> None:
    """Whatever the sizes and flushes: every frame is within its limit with a valid CRC, no frame is
    empty, and reading the frames back yields exactly the records, in order."""
    frames = Frames(frame_bytes_max)
    written = []
    for index, length in enumerate(lengths, start=1):
        data = record(index, length)
        written.append((index, data))
        frames.append(index, data)
        if flush_every and index % flush_every == 0:
            frames.builder.flush()
    frames.builder.flush()
    assert all(FRAME_HEADER_LENGTH < len(frame) <= frame_bytes_max for frame in frames.data)
    for frame in frames.data:
        entries(frame)  # header, CRC and entry layout as documented
    records, reader = read_back(frames.data)
    assert [(sequence, data) for sequence, data, _frame in records] == written
    assert reader.highest_sequence_number == len(lengths)
    assert [frame.content_length for frame in frames.sealed] == [len(frame) - FRAME_HEADER_LENGTH
                                                                for frame in frames.data]


def test_a_builder_refuses_a_frame_too_small_for_an_entry() -> None:
    with pytest.raises(ValueError, match="cannot hold an entry"):
        DataFrameBuilder(FRAME_HEADER_LENGTH + ENTRY_HEADER_LENGTH, lambda frame: None)


# --- Metadata checkpoints -----------------------------------------------------------------------------


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[int, list[SegmentMetadata]]:
    """Segments in every status -- tombstones (merged, deleted) included -- with attributes that use the
    full id and value ranges; ids ascending and names unique, as a container's are."""
    names = draw(st.lists(segment_names, unique=True, max_size=8))
    ids = sorted(draw(st.lists(st.integers(0, 2**40), unique=True, min_size=len(names), max_size=len(names))))
    segments = []
    for segment_id, name in zip(ids, names, strict=True):
        status = draw(st.sampled_from(SegmentStatus))
        if status in (SegmentStatus.MERGED, SegmentStatus.DELETED) and draw(st.booleans()):
            segments.append(SegmentMetadata(segment_id, name, status))  # a tombstone, as containers keep them
            continue
        length = draw(st.integers(0, INT64_MAX))
        start_offset = draw(st.integers(0, length))
        attributes = draw(st.dictionaries(st.integers(0, ATTRIBUTE_ID_MAX), int64s, max_size=6))
        cuts = sorted(draw(st.lists(st.integers(0, length), unique=True, max_size=6)))
        spans = tuple(ChunkSpan(a, b - a, draw(segment_names), draw(st.integers(0, INT64_MAX)))
                      for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a)
        segments.append(SegmentMetadata(segment_id, name, status, start_offset, length, attributes, spans))
    next_segment_id = draw(st.integers(max(ids, default=0) + 1, INT64_MAX))
    return next_segment_id, segments


def as_tuple(segment: SegmentMetadata) -> tuple[Any, ...]:
    return (segment.id, segment.name, segment.status, segment.start_offset, segment.length, segment.attributes,
            segment.spans)


@given(checkpoints())
def test_checkpoints_round_trip(checkpoint: tuple[int, list[SegmentMetadata]]) -> None:
    next_segment_id, segments = checkpoint
    payload = serialize_checkpoint(next_segment_id, segments)
    metadata = deserialize_checkpoint(payload, container_id=3)
    assert metadata.container_id == 3
    assert metadata.next_segment_id == next_segment_id
    assert [as_tuple(s) for s in metadata.segments.values()] == [as_tuple(s) for s in segments]
    assert metadata.ids_by_name == {segment.name: segment.id for segment in segments}
    assert serialize_checkpoint(metadata.next_segment_id, metadata.segments.values()) == payload
    # Carried by an operation through a frame and back, it is still the same bytes.
    operation = deserialize(MetadataCheckpointOperation(payload).serialize(), 1)
    assert isinstance(operation, MetadataCheckpointOperation) and operation.payload == payload


def test_attribute_order_does_not_change_a_checkpoint() -> None:
    """The same metadata always gives the same bytes (recovery compares checkpoints byte for byte)."""
    one = SegmentMetadata(1, "s", attributes={5: 1, 2**127: -1, 0: 7})
    other = SegmentMetadata(1, "s", attributes={0: 7, 5: 1, 2**127: -1})
    assert serialize_checkpoint(2, [one]) == serialize_checkpoint(2, [other])


@given(checkpoints().filter(lambda checkpoint: checkpoint[1]), st.data())
def test_a_damaged_checkpoint_is_corruption(checkpoint: tuple[int, list[SegmentMetadata]],
                                            data: st.DataObject) -> None:
    payload = serialize_checkpoint(*checkpoint)
    cut = data.draw(st.integers(0, len(payload) - 1), label="cut")
    with pytest.raises(DataCorruptionError, match="container 3: malformed metadata checkpoint"):
        deserialize_checkpoint(payload[:cut], 3)
    with pytest.raises(DataCorruptionError, match="trailing bytes"):
        deserialize_checkpoint(payload + b"\x00", 3)


def test_a_checkpoint_with_an_unknown_version_or_status_is_corruption() -> None:
    payload = bytearray(serialize_checkpoint(2, [SegmentMetadata(1, "s")]))
    with pytest.raises(DataCorruptionError, match="unknown checkpoint version 9"):
        deserialize_checkpoint(bytes([9]) + bytes(payload[1:]), 0)
    status_at = 1 + 8 + 4 + 8 + 2 + 1  # header, then id, name length, name "s"
    payload[status_at] = 7
    with pytest.raises(DataCorruptionError, match="malformed"):
        deserialize_checkpoint(bytes(payload), 0)
