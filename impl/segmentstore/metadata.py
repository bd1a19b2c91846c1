"""Container metadata: what the container knows about each of its segments, and its checkpoints.

``ContainerMetadata`` holds only committed state -- the effects of operations Tier 1 has made
durable.  Operations in flight live in the chain of metadata update transactions
(``metadata_transaction``) until their frame is acknowledged.

Checkpoint byte layout (big-endian), the payload of a ``MetadataCheckpointOperation``::

    checkpoint := version:u8 (=1) | next_segment_id:i64 | segment_count:u32 | segment*
    segment    := id:i64 | name_length:u16 | name:utf-8 | status:u8 | start_offset:i64 | length:i64
                  | attribute_count:u32 | (attribute_id:u128 | value:i64)*
                  | span_count:u32 | span*
    span       := offset:i64 | length:i64 | chunk_offset:i64 | chunk_name_length:u16 | chunk_name:utf-8
    status     := 0 active | 1 sealed | 2 merged | 3 deleted

Spans are the segment's layout in Tier 2 (``layout``): a checkpoint carries them, so a log truncated
below it still knows where every byte it no longer holds lives.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from millstream.errors import BadAttributeUpdateError, DataCorruptionError
from millstream.model.types import (
    INT64_MAX,
    INT64_MIN,
    NULL_ATTRIBUTE_VALUE,
    AttributeUpdate,
    AttributeUpdateType,
    SegmentStatus,
)
from millstream.segmentstore.layout import ChunkSpan, Spans

__all__ = [
    "ContainerMetadata",
    "SegmentMetadata",
    "attribute_update_values",
    "deserialize_checkpoint",
    "serialize_checkpoint",
]

_STATUS_CODES = {SegmentStatus.ACTIVE: 0, SegmentStatus.SEALED: 1, SegmentStatus.MERGED: 2, SegmentStatus.DELETED: 3}
_STATUS_BY_CODE = {code: status for status, code in _STATUS_CODES.items()}
_HEADER = struct.Struct(">BqI")
_SEGMENT_HEAD = struct.Struct(">qH")
_SEGMENT_TAIL = struct.Struct(">BqqI")
_ATTRIBUTE = struct.Struct(">QQq")
_COUNT = struct.Struct(">I")
_SPAN = struct.Struct(">qqqH")
CHECKPOINT_VERSION = 1
_MASK64 = (1 << 64) - 1


class SegmentMetadata:
    """One segment's committed state."""

    __slots__ = ("attributes", "id", "length", "name", "spans", "start_offset", "status")

    def __init__(self, segment_id: int, name: str, status: SegmentStatus = SegmentStatus.ACTIVE,
                 start_offset: int = 0, length: int = 0, attributes: dict[int, int] | None = None,
                 spans: Spans = ()) -> None:
        self.id = segment_id
        self.name = name
        self.status = status
        self.start_offset = start_offset
        self.length = length
        self.attributes: dict[int, int] = attributes if attributes is not None else {}
        #: Where the segment's bytes live in Tier 2 (see ``layout``).
        self.spans: Spans = spans

    def get_attribute(self, attribute_id: int) -> int:
        return self.attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)

    def __repr__(self) -> str:
        return (f"SegmentMetadata({self.id}, {self.name!r}, {self.status!r}, start_offset={self.start_offset}, "
                f"length={self.length}, attributes={self.attributes!r}, spans={self.spans!r})")


class ContainerMetadata:
    """Every segment a container knows, by id, and the name each name currently maps to."""

    __slots__ = ("container_id", "epoch", "ids_by_name", "next_segment_id", "segments")

    def __init__(self, container_id: int) -> None:
        self.container_id = container_id
        self.epoch = 0
        self.next_segment_id = 1
        self.segments: dict[int, SegmentMetadata] = {}
        self.ids_by_name: dict[str, int] = {}

    def get(self, name: str) -> SegmentMetadata | None:
        """The segment ``name`` currently maps to (which may be deleted or merged), or None."""
        segment_id = self.ids_by_name.get(name)
        return None if segment_id is None else self.segments[segment_id]

    def put(self, segment: SegmentMetadata) -> None:
        """Record ``segment``; a segment created again under an old name replaces the old one."""
        previous = self.ids_by_name.get(segment.name)
        if previous is not None and previous != segment.id:
            del self.segments[previous]
        self.segments[segment.id] = segment
        self.ids_by_name[segment.name] = segment.id

    def check_invariants(self) -> None:
        for name, segment_id in self.ids_by_name.items():
            segment = self.segments[segment_id]
            assert segment.name == name, (name, segment)
            assert 0 <= segment.start_offset <= segment.length, segment
            ends = [0] + [span.end for span in segment.spans]
            for span, previous_end in zip(segment.spans, ends, strict=False):
                assert previous_end <= span.offset and span.length > 0 and span.end <= segment.length, segment
            assert segment_id < self.next_segment_id, segment
        assert len(self.segments) == len(self.ids_by_name)


def attribute_update_values(read: Callable[[int], int], updates: Iterable[AttributeUpdate]) -> dict[int, int]:
    """The new values ``updates`` produce, applied in order, each seeing those before it.

    ``read(attribute_id)`` gives the current value (``NULL_ATTRIBUTE_VALUE`` if absent).  A result of
    ``NULL_ATTRIBUTE_VALUE`` means "remove".  Raises ``BadAttributeUpdateError`` if any update's
    condition fails; nothing is applied then.
    """
    values: dict[int, int] = {}
    for update in updates:
        attribute_id = update.attribute_id
        old = values[attribute_id] if attribute_id in values else read(attribute_id)
        update_type = update.update_type
        if update_type == AttributeUpdateType.REPLACE:
            new = update.value
        elif update_type == AttributeUpdateType.REPLACE_IF_EQUALS:
            if old != update.comparison_value:
                raise BadAttributeUpdateError(
                    f"attribute {attribute_id:#x} is {old}, expected {update.comparison_value}")
            new = update.value
        elif update_type == AttributeUpdateType.REPLACE_IF_GREATER:
            if update.value <= old:
                raise BadAttributeUpdateError(f"attribute {attribute_id:#x}: {update.value} is not above {old}")
            new = update.value
        elif update_type == AttributeUpdateType.NONE:
            if old != NULL_ATTRIBUTE_VALUE:
                raise BadAttributeUpdateError(f"attribute {attribute_id:#x} is already set")
            new = update.value
        else:
            new = (0 if old == NULL_ATTRIBUTE_VALUE else old) + update.value
            if not INT64_MIN < new <= INT64_MAX:
                raise BadAttributeUpdateError(f"attribute {attribute_id:#x}: accumulating overflows")
        values[attribute_id] = new
    return values


def serialize_checkpoint(next_segment_id: int, segments: Iterable[SegmentMetadata]) -> bytes:
    """A checkpoint of ``segments`` (give them in id order): the same metadata always gives the same bytes."""
    parts: list[bytes] = []
    count = 0
    for segment in segments:
        count += 1
        name = segment.name.encode()
        parts.append(_SEGMENT_HEAD.pack(segment.id, len(name)))
        parts.append(name)
        parts.append(_SEGMENT_TAIL.pack(_STATUS_CODES[segment.status], segment.start_offset, segment.length,
                                        len(segment.attributes)))
        attributes = sorted(segment.attributes.items())
        parts.extend(_ATTRIBUTE.pack(key >> 64, key & _MASK64, value) for key, value in attributes)
        parts.append(_COUNT.pack(len(segment.spans)))
        for span in segment.spans:
            chunk = span.chunk.encode()
            parts.append(_SPAN.pack(span.offset, span.length, span.chunk_offset, len(chunk)))
            parts.append(chunk)
    return _HEADER.pack(CHECKPOINT_VERSION, next_segment_id, count) + b"".join(parts)


def deserialize_checkpoint(payload: bytes, container_id: int) -> ContainerMetadata:
    """The metadata a checkpoint holds.  Raises ``DataCorruptionError`` if it is malformed."""
    try:
        version, next_segment_id, count = _HEADER.unpack_from(payload, 0)
        if version != CHECKPOINT_VERSION:
            raise ValueError(f"unknown checkpoint version {version}")
        metadata = ContainerMetadata(container_id)
        metadata.next_segment_id = next_segment_id
        position = _HEADER.size
        for _ in range(count):
            segment_id, name_length = _SEGMENT_HEAD.unpack_from(payload, position)
            position += _SEGMENT_HEAD.size
            name = payload[position:position + name_length].decode()
            position += name_length
            status, start_offset, length, attribute_count = _SEGMENT_TAIL.unpack_from(payload, position)
            position += _SEGMENT_TAIL.size
            attributes = {}
            for _ in range(attribute_count):
                high, low, value = _ATTRIBUTE.unpack_from(payload, position)
                attributes[(high << 64) | low] = value
                position += _ATTRIBUTE.size
            (span_count,) = _COUNT.unpack_from(payload, position)
            position += _COUNT.size
            spans = []
            for _ in range(span_count):
                offset, span_length, chunk_offset, chunk_length = _SPAN.unpack_from(payload, position)
                position += _SPAN.size
                chunk = payload[position:position + chunk_length]
                position += chunk_length
                if len(chunk) != chunk_length or span_length <= 0 or chunk_offset < 0 or offset + span_length > length \
                        or offset < (spans[-1].end if spans else 0):
                    raise ValueError(f"segment {segment_id}: span {len(spans)} is not a valid layout entry")
                spans.append(ChunkSpan(offset, span_length, chunk.decode(), chunk_offset))
            metadata.put(SegmentMetadata(segment_id, name, _STATUS_BY_CODE[status], start_offset, length, attributes,
                                         tuple(spans)))
        if position != len(payload):
            raise ValueError("trailing bytes after the last segment")
    except (struct.error, ValueError, KeyError, UnicodeDecodeError) as error:
        raise DataCorruptionError(f"container {container_id}: malformed metadata checkpoint: {error}") from error
    return metadata
