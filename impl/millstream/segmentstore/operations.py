"""Operations: every change to a segment container is one, sequenced through the durable log.

Byte layout of a serialized operation (a *record*; all integers big-endian, ``i64`` signed)::

    record    := type:u8 | version:u8 | body
    append    := segment_id:i64 | offset:i64 | data_length:u32 | attribute_count:u16
                 | attribute * attribute_count | data
    seal      := segment_id:i64 | offset:i64            (offset = length at seal)
    truncate  := segment_id:i64 | offset:i64            (the new start offset)
    delete    := segment_id:i64
    merge     := target_id:i64 | source_id:i64 | offset:i64 | length:i64
                                                        (offset in target, source length)
    map       := segment_id:i64 | name_length:u16 | name:utf-8 | attribute_count:u16
                 | attribute * attribute_count          (creates the segment)
    attributes:= segment_id:i64 | attribute_count:u16 | attribute * attribute_count
    checkpoint:= payload_length:u32 | payload           (see ``metadata.serialize_checkpoint``)
    flush     := segment_id:i64 | offset:i64 | length:i64 | chunk_offset:i64 | chunk_name_length:u16
                 | chunk_name:utf-8                     (segment bytes now in Tier 2, see ``layout``)
    attribute := id:u128 | update_type:u8 | value:i64 | comparison_value:i64

Type codes are never reused.  The sequence number is not part of the record: it travels in the
header of every DataFrame entry (``data_frame``), so even a record cut short by a crash names it.

An operation's ``future`` is the caller's: it completes when the operation is acknowledged (or
fails).  It is None for operations replayed by recovery and for the container's own checkpoints.
"""

from __future__ import annotations

import asyncio
import struct
from typing import ClassVar

from millstream.errors import DataCorruptionError
from millstream.model.types import NO_OFFSET, AttributeUpdate, AttributeUpdateType, OperationKind
from millstream.segmentstore.durable_data_log import LogAddress

__all__ = [
    "DeleteSegmentOperation",
    "MergeSegmentOperation",
    "MetadataCheckpointOperation",
    "Operation",
    "StreamSegmentAppendOperation",
    "StreamSegmentMapOperation",
    "StreamSegmentSealOperation",
    "StorageFlushOperation",
    "StreamSegmentTruncateOperation",
    "UpdateAttributesOperation",
    "deserialize",
]

_APPEND_HEADER = struct.Struct(">BBqqIH")
_SEGMENT_OFFSET = struct.Struct(">BBqq")
_SEGMENT = struct.Struct(">BBq")
_MERGE = struct.Struct(">BBqqqq")
_MAP_HEADER = struct.Struct(">BBqH")
_COUNT = struct.Struct(">H")
_ATTRIBUTES_HEADER = struct.Struct(">BBqH")
_CHECKPOINT_HEADER = struct.Struct(">BBI")
_ATTRIBUTE = struct.Struct(">QQBqq")
_TYPE = struct.Struct(">BB")
_FLUSH_HEADER = struct.Struct(">BBqqqqH")

VERSION = 0
NO_SEGMENT_ID = -1


class Operation:
    """Base class: a sequenced change.  Subclasses set ``TYPE`` and ``KIND``."""

    __slots__ = ("future", "segment_name", "sequence_number")
    TYPE: ClassVar[int]
    KIND: ClassVar[OperationKind | None]

    def __init__(self) -> None:
        self.sequence_number = 0
        self.future: asyncio.Future[int] | None = None
        #: The name the caller used; resolved to an id (``segment_id``) when the operation is processed.
        self.segment_name = ""

    def serialize(self) -> bytes:
        raise NotImplementedError

    @property
    def serialized_length(self) -> int:
        return len(self.serialize())

    @property
    def payload_length(self) -> int:
        """Bytes of user data this operation carries (for queue accounting)."""
        return 0

    @property
    def result_offset(self) -> int:
        """The value the caller's future completes with."""
        return NO_OFFSET

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._repr_fields())
        return f"{type(self).__name__}({fields})"

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number",)


def _serialize_attributes(updates: tuple[AttributeUpdate, ...]) -> bytes:
    return b"".join(
        _ATTRIBUTE.pack(u.attribute_id >> 64, u.attribute_id & 0xFFFF_FFFF_FFFF_FFFF, u.update_type,
                        u.value, u.comparison_value)
        for u in updates)


class StreamSegmentAppendOperation(Operation):
    """Append ``data`` (and apply ``attribute_updates`` atomically with it).  ``expected_offset`` makes
    it conditional; ``offset`` is assigned when the operation is processed."""

    __slots__ = ("attribute_updates", "data", "expected_offset", "offset", "segment_id")
    TYPE = 1
    KIND = OperationKind.APPEND

    def __init__(self, segment_id: int, data: bytes | memoryview, attribute_updates: tuple[AttributeUpdate, ...] = (),
                 expected_offset: int = NO_OFFSET, offset: int = NO_OFFSET) -> None:
        # Operation.__init__'s fields, set here directly: one call less on the path of every append.
        self.sequence_number = 0
        self.future: asyncio.Future[int] | None = None
        self.segment_name = ""
        self.segment_id = segment_id
        self.data = data
        self.attribute_updates = attribute_updates
        self.expected_offset = expected_offset
        self.offset = offset

    def header(self) -> bytes:
        """Everything but the data (the data is written to the frame without copying it first)."""
        header = _APPEND_HEADER.pack(self.TYPE, VERSION, self.segment_id, self.offset, len(self.data),
                                     len(self.attribute_updates))
        if self.attribute_updates:
            header += _serialize_attributes(self.attribute_updates)
        return header

    def serialize(self) -> bytes:
        return self.header() + bytes(self.data)

    @property
    def serialized_length(self) -> int:
        return _APPEND_HEADER.size + len(self.attribute_updates) * _ATTRIBUTE.size + len(self.data)

    @property
    def payload_length(self) -> int:
        return len(self.data)

    @property
    def result_offset(self) -> int:
        return self.offset

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id", "offset", "attribute_updates", "expected_offset")


class StreamSegmentSealOperation(Operation):
    """Seal a segment; ``offset`` (its length at the seal) is assigned when processed."""

    __slots__ = ("offset", "segment_id")
    TYPE = 2
    KIND = OperationKind.SEAL

    def __init__(self, segment_id: int, offset: int = NO_OFFSET) -> None:
        super().__init__()
        self.segment_id = segment_id
        self.offset = offset

    def serialize(self) -> bytes:
        return _SEGMENT_OFFSET.pack(self.TYPE, VERSION, self.segment_id, self.offset)

    @property
    def result_offset(self) -> int:
        return self.offset

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id", "offset")


class MergeSegmentOperation(Operation):
    """Merge the sealed ``source`` into the end of ``target``.  ``offset`` (where the source's bytes
    begin in the target) and ``length`` (the source's length) are assigned when processed."""

    __slots__ = ("length", "offset", "source_name", "source_segment_id", "target_segment_id")
    TYPE = 3
    KIND = OperationKind.MERGE

    def __init__(self, target_segment_id: int, source_segment_id: int, offset: int = NO_OFFSET,
                 length: int = 0) -> None:
        super().__init__()
        self.target_segment_id = target_segment_id
        self.source_segment_id = source_segment_id
        self.offset = offset
        self.length = length
        self.source_name = ""

    def serialize(self) -> bytes:
        return _MERGE.pack(self.TYPE, VERSION, self.target_segment_id, self.source_segment_id, self.offset,
                           self.length)

    @property
    def result_offset(self) -> int:
        return self.offset

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "target_segment_id", "source_segment_id", "offset", "length")


class StreamSegmentMapOperation(Operation):
    """Create segment ``name`` with id ``segment_id`` (assigned when processed) and initial attributes."""

    __slots__ = ("attribute_updates", "name", "segment_id")
    TYPE = 4
    KIND = OperationKind.CREATE

    def __init__(self, name: str, attribute_updates: tuple[AttributeUpdate, ...] = (),
                 segment_id: int = NO_SEGMENT_ID) -> None:
        super().__init__()
        self.name = name
        self.segment_id = segment_id
        self.attribute_updates = attribute_updates

    def serialize(self) -> bytes:
        encoded = self.name.encode()
        return (_MAP_HEADER.pack(self.TYPE, VERSION, self.segment_id, len(encoded)) + encoded
                + _COUNT.pack(len(self.attribute_updates)) + _serialize_attributes(self.attribute_updates))

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "name", "segment_id", "attribute_updates")


class UpdateAttributesOperation(Operation):
    """Apply ``attribute_updates`` to a segment."""

    __slots__ = ("attribute_updates", "segment_id")
    TYPE = 6
    KIND = OperationKind.UPDATE_ATTRIBUTES

    def __init__(self, segment_id: int, attribute_updates: tuple[AttributeUpdate, ...]) -> None:
        super().__init__()
        self.segment_id = segment_id
        self.attribute_updates = attribute_updates

    def serialize(self) -> bytes:
        return (_ATTRIBUTES_HEADER.pack(self.TYPE, VERSION, self.segment_id, len(self.attribute_updates))
                + _serialize_attributes(self.attribute_updates))

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id", "attribute_updates")


class StreamSegmentTruncateOperation(Operation):
    """Move a segment's start offset to ``offset``; the bytes below it are no longer readable.
    ``expected_segment_id`` (not recorded): the segment whose event boundaries the container checked
    before queueing it; the operation is refused if its name now names another segment."""

    __slots__ = ("expected_segment_id", "offset", "segment_id")
    TYPE = 7
    KIND = OperationKind.TRUNCATE

    def __init__(self, segment_id: int, offset: int) -> None:
        super().__init__()
        self.segment_id = segment_id
        self.offset = offset
        self.expected_segment_id = NO_SEGMENT_ID

    def serialize(self) -> bytes:
        return _SEGMENT_OFFSET.pack(self.TYPE, VERSION, self.segment_id, self.offset)

    @property
    def result_offset(self) -> int:
        return self.offset

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id", "offset")


class MetadataCheckpointOperation(Operation):
    """A snapshot of the container metadata; recovery starts from the first one in the log."""

    __slots__ = ("frame_number", "payload", "truncation_address")
    TYPE = 8
    KIND = None

    def __init__(self, payload: bytes = b"") -> None:
        super().__init__()
        self.payload = payload
        #: The log record (DataFrame) the checkpoint begins in, once sealed into one, and the address of
        #: the record before it once Tier 1 reported it: the log may be truncated through that address
        #: (never through the checkpoint) once everything the checkpoint describes is in Tier 2.
        self.frame_number = 0
        self.truncation_address: LogAddress | None = None

    def serialize(self) -> bytes:
        return _CHECKPOINT_HEADER.pack(self.TYPE, VERSION, len(self.payload)) + self.payload


class StorageFlushOperation(Operation):
    """The StorageWriter's record that segment ``segment_id``'s bytes ``[offset, offset + length)`` are
    durable in Tier 2 as bytes ``[chunk_offset, ...)`` of ``chunk`` -- written there before this
    operation is queued, and referenced only once it commits (so a fenced owner's chunk writes, whose
    flush operations can never commit, are never read)."""

    __slots__ = ("chunk", "chunk_offset", "length", "offset", "segment_id")
    TYPE = 11
    KIND = None

    def __init__(self, segment_id: int, offset: int, length: int, chunk: str, chunk_offset: int) -> None:
        super().__init__()
        self.segment_id = segment_id
        self.offset = offset
        self.length = length
        self.chunk = chunk
        self.chunk_offset = chunk_offset

    def serialize(self) -> bytes:
        chunk = self.chunk.encode()
        return _FLUSH_HEADER.pack(self.TYPE, VERSION, self.segment_id, self.offset, self.length, self.chunk_offset,
                                  len(chunk)) + chunk

    @property
    def result_offset(self) -> int:
        return self.offset + self.length

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id", "offset", "length", "chunk", "chunk_offset")


class DeleteSegmentOperation(Operation):
    """Delete a segment.  Its name may be created again afterwards (as a new segment)."""

    __slots__ = ("segment_id",)
    TYPE = 10
    KIND = OperationKind.DELETE

    def __init__(self, segment_id: int) -> None:
        super().__init__()
        self.segment_id = segment_id

    def serialize(self) -> bytes:
        return _SEGMENT.pack(self.TYPE, VERSION, self.segment_id)

    def _repr_fields(self) -> tuple[str, ...]:
        return ("sequence_number", "segment_id")


def _read_attributes(record: memoryview, position: int, count: int) -> tuple[tuple[AttributeUpdate, ...], int]:
    updates = []
    for _ in range(count):
        high, low, update_type, value, comparison = _ATTRIBUTE.unpack_from(record, position)
        updates.append(AttributeUpdate((high << 64) | low, AttributeUpdateType(update_type), value, comparison))
        position += _ATTRIBUTE.size
    return tuple(updates), position


def deserialize(record: bytes | memoryview, sequence_number: int) -> Operation:
    """The operation a record holds.  Raises ``DataCorruptionError`` if it is malformed.

    Append data is a zero-copy slice of ``record``.
    """
    view = memoryview(record)
    try:
        operation = _deserialize(view)
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise DataCorruptionError(f"operation {sequence_number} is malformed: {error}") from error
    operation.sequence_number = sequence_number
    return operation


def _deserialize(view: memoryview) -> Operation:
    type_code, version = _TYPE.unpack_from(view, 0)
    if version != VERSION:
        raise ValueError(f"unknown record version {version}")
    operation: Operation
    if type_code == StreamSegmentAppendOperation.TYPE:
        _, _, segment_id, offset, length, count = _APPEND_HEADER.unpack_from(view, 0)
        updates, position = _read_attributes(view, _APPEND_HEADER.size, count)
        if position + length != len(view):
            raise ValueError("append length does not match the record")
        operation = StreamSegmentAppendOperation(segment_id, view[position:], updates, offset=offset)
    elif type_code in (StreamSegmentSealOperation.TYPE, StreamSegmentTruncateOperation.TYPE):
        _, _, segment_id, offset = _SEGMENT_OFFSET.unpack_from(view, 0)
        _expect_length(view, _SEGMENT_OFFSET.size)
        if type_code == StreamSegmentSealOperation.TYPE:
            operation = StreamSegmentSealOperation(segment_id, offset)
        else:
            operation = StreamSegmentTruncateOperation(segment_id, offset)
    elif type_code == DeleteSegmentOperation.TYPE:
        _expect_length(view, _SEGMENT.size)
        operation = DeleteSegmentOperation(_SEGMENT.unpack_from(view, 0)[2])
    elif type_code == MergeSegmentOperation.TYPE:
        _expect_length(view, _MERGE.size)
        _, _, target, source, offset, length = _MERGE.unpack_from(view, 0)
        operation = MergeSegmentOperation(target, source, offset, length)
    elif type_code == StreamSegmentMapOperation.TYPE:
        _, _, segment_id, name_length = _MAP_HEADER.unpack_from(view, 0)
        position = _MAP_HEADER.size
        name = bytes(view[position:position + name_length]).decode()
        (count,) = _COUNT.unpack_from(view, position + name_length)
        updates, position = _read_attributes(view, position + name_length + _COUNT.size, count)
        _expect_length(view, position)
        operation = StreamSegmentMapOperation(name, updates, segment_id)
    elif type_code == UpdateAttributesOperation.TYPE:
        _, _, segment_id, count = _ATTRIBUTES_HEADER.unpack_from(view, 0)
        updates, position = _read_attributes(view, _ATTRIBUTES_HEADER.size, count)
        _expect_length(view, position)
        operation = UpdateAttributesOperation(segment_id, updates)
    elif type_code == MetadataCheckpointOperation.TYPE:
        _, _, length = _CHECKPOINT_HEADER.unpack_from(view, 0)
        _expect_length(view, _CHECKPOINT_HEADER.size + length)
        operation = MetadataCheckpointOperation(bytes(view[_CHECKPOINT_HEADER.size:]))
    elif type_code == StorageFlushOperation.TYPE:
        _, _, segment_id, offset, length, chunk_offset, name_length = _FLUSH_HEADER.unpack_from(view, 0)
        _expect_length(view, _FLUSH_HEADER.size + name_length)
        chunk = bytes(view[_FLUSH_HEADER.size:]).decode()
        operation = StorageFlushOperation(segment_id, offset, length, chunk, chunk_offset)
    else:
        raise ValueError(f"unknown operation type {type_code}")
    return operation


def _expect_length(view: memoryview, length: int) -> None:
    if len(view) != length:
        raise ValueError(f"record is {len(view)} bytes, expected {length}")
