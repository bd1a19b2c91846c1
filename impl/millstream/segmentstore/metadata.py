"""Container metadata: what the container knows about each of its segments, and its checkpoints.

``ContainerMetadata`` holds only committed state -- the effects of operations Tier 1 has made
durable.  Operations in flight live in the chain of metadata update transactions
(``metadata_transaction``) until their frame is acknowledged.

Checkpoint byte layout (big-endian), the payload of a ``MetadataCheckpointOperation``::

    checkpoint := version:u8 (=2) | next_segment_id:i64 | segment_count:u32 | segment* | modified
    segment    := id:i64 | name_length:u16 | name:utf-8 | status:u8 | start_offset:i64 | length:i64
                  | attribute_count:u32 | (attribute_id:u128 | value:i64)*
                  | span_count:u32 | span*
                  | boundary_spacing:i64 | boundary_count:u32 | boundary:i64*       (version 2 only)
    span       := offset:i64 | length:i64 | chunk_offset:i64 | chunk_name_length:u16 | chunk_name:utf-8
    status     := 0 active | 1 sealed | 2 merged | 3 deleted
    modified   := last_modified_ms:i64 * segment_count, in segment order             (version 2 only)

Version 1 (written before event boundaries and modification times were kept) is still read: its
segments get no known boundaries and a modification time of 0 ("unknown").

Spans are the segment's layout in Tier 2 (``layout``): a checkpoint carries them, so a log truncated
below it still knows where every byte it no longer holds lives.  Boundaries are the sparse index of
offsets where an event begins (``event_boundaries``).  Everything but ``modified`` is a function of
the operations in the log, so recovery compares it byte for byte with what replay rebuilds
(``checkpoint_body``); modification times are wall-clock readings the log does not hold, so they are
carried, not compared (see ``SegmentMetadata.last_modified_ms``).
"""

from __future__ import annotations

import itertools
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
from millstream.segmentstore import event_boundaries
from millstream.segmentstore.layout import ChunkSpan, Spans

__all__ = [
    "CHECKPOINT_VERSION",
    "ContainerMetadata",
    "SegmentMetadata",
    "attribute_update_values",
    "checkpoint_body",
    "checkpoint_version",
    "deserialize_checkpoint",
    "serialize_checkpoint",
    "updated_attribute_value",
]

_STATUS_CODES = {SegmentStatus.ACTIVE: 0, SegmentStatus.SEALED: 1, SegmentStatus.MERGED: 2, SegmentStatus.DELETED: 3}
_STATUS_BY_CODE = {code: status for status, code in _STATUS_CODES.items()}
_HEADER = struct.Struct(">BqI")
_SEGMENT_HEAD = struct.Struct(">qH")
_SEGMENT_TAIL = struct.Struct(">BqqI")
_ATTRIBUTE = struct.Struct(">QQq")
_COUNT = struct.Struct(">I")
_SPAN = struct.Struct(">qqqH")
_BOUNDARIES_HEAD = struct.Struct(">qI")
_I64 = struct.Struct(">q")
#: The version written; every version up to it is read.
CHECKPOINT_VERSION = 2
_MASK64 = (1 << 64) - 1


class SegmentMetadata:
    """One segment's committed state."""

    __slots__ = ("attributes", "boundaries", "boundary_spacing", "id", "last_modified_ms", "length", "name",
                 "spans", "start_offset", "status")

    def __init__(self, segment_id: int, name: str, status: SegmentStatus = SegmentStatus.ACTIVE,
                 start_offset: int = 0, length: int = 0, attributes: dict[int, int] | None = None,
                 spans: Spans = (), *, boundaries: tuple[int, ...] = (), boundary_spacing: int | None = None,
                 last_modified_ms: int = 0) -> None:
        self.id = segment_id
        self.name = name
        self.status = status
        self.start_offset = start_offset
        self.length = length
        self.attributes: dict[int, int] = attributes if attributes is not None else {}
        #: Where the segment's bytes live in Tier 2 (see ``layout``).
        self.spans: Spans = spans
        #: Offsets known to begin an event, sparse, all in ``(start_offset, length]``, and how far apart
        #: the index records them (``event_boundaries``).
        self.boundaries: tuple[int, ...] = boundaries
        self.boundary_spacing = event_boundaries.SPACING_BYTES_MIN if boundary_spacing is None else boundary_spacing
        #: When an operation last changed the segment (ms since the Unix epoch, by the container's wall
        #: clock; 0: unknown).  After a crash, a segment changed since the last metadata checkpoint
        #: shows the time of the recovery (the log holds no times): never earlier than the truth.
        self.last_modified_ms = last_modified_ms

    def get_attribute(self, attribute_id: int) -> int:
        return self.attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)

    def __repr__(self) -> str:
        return (f"SegmentMetadata({self.id}, {self.name!r}, {self.status!r}, start_offset={self.start_offset}, "
                f"length={self.length}, attributes={self.attributes!r}, spans={self.spans!r}, "
                f"boundaries={self.boundaries!r}, boundary_spacing={self.boundary_spacing}, "
                f"last_modified_ms={self.last_modified_ms})")


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
            check_boundaries(segment.boundaries, segment.boundary_spacing, segment.start_offset, segment.length,
                             repr(segment))
            assert segment_id < self.next_segment_id, segment
        assert len(self.segments) == len(self.ids_by_name)


def check_boundaries(boundaries: tuple[int, ...], spacing: int, start_offset: int, length: int, what: str) -> None:
    """Assert the index of known event boundaries is well formed (``event_boundaries``)."""
    assert len(boundaries) <= event_boundaries.ENTRIES_MAX and spacing >= event_boundaries.SPACING_BYTES_MIN, what
    assert all(start_offset < b <= length for b in boundaries), what
    assert all(a < b for a, b in itertools.pairwise(boundaries)), what


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
        new = updated_attribute_value(old, update)
        if new is None:
            raise BadAttributeUpdateError(_refusal(attribute_id, old, update))
        values[attribute_id] = new
    return values


def updated_attribute_value(old: int, update: AttributeUpdate) -> int | None:
    """The value ``update`` gives an attribute holding ``old`` (``NULL_ATTRIBUTE_VALUE``: absent), or
    None if its condition fails.  Formats no message, so CrossHair checks its contracts over all paths
    (``proofs/contracts_pure.py``)."""
    update_type = update.update_type
    if update_type == AttributeUpdateType.REPLACE:
        return update.value
    if update_type == AttributeUpdateType.REPLACE_IF_EQUALS:
        return update.value if old == update.comparison_value else None
    if update_type == AttributeUpdateType.REPLACE_IF_GREATER:
        return update.value if update.value > old else None
    if update_type == AttributeUpdateType.NONE:
        return update.value if old == NULL_ATTRIBUTE_VALUE else None
    new = (0 if old == NULL_ATTRIBUTE_VALUE else old) + update.value
    return new if INT64_MIN < new <= INT64_MAX else None


def _refusal(attribute_id: int, old: int, update: AttributeUpdate) -> str:
    """Why ``update`` was refused on an attribute holding ``old``."""
    update_type = update.update_type
    if update_type == AttributeUpdateType.REPLACE_IF_EQUALS:
        return f"attribute {attribute_id:#x} is {old}, expected {update.comparison_value}"
    if update_type == AttributeUpdateType.REPLACE_IF_GREATER:
        return f"attribute {attribute_id:#x}: {update.value} is not above {old}"
    if update_type == AttributeUpdateType.NONE:
        return f"attribute {attribute_id:#x} is already set"
    return f"attribute {attribute_id:#x}: accumulating overflows"


def serialize_checkpoint(next_segment_id: int, segments: Iterable[SegmentMetadata], *,
                         version: int = CHECKPOINT_VERSION) -> bytes:
    """A checkpoint of ``segments`` (give them in id order): the same metadata always gives the same
    bytes.  ``version`` 1 leaves out what it cannot hold (for comparing with an old checkpoint)."""
    parts: list[bytes] = []
    modified: list[bytes] = []
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
        if version >= 2:
            parts.append(_BOUNDARIES_HEAD.pack(segment.boundary_spacing, len(segment.boundaries)))
            parts.append(struct.pack(f">{len(segment.boundaries)}q", *segment.boundaries))
            modified.append(_I64.pack(segment.last_modified_ms))
    return _HEADER.pack(version, next_segment_id, count) + b"".join(parts) + b"".join(modified)


def checkpoint_version(payload: bytes) -> int:
    """The version a checkpoint was written in (0 if it is too short to say)."""
    return payload[0] if payload else 0


def checkpoint_body(payload: bytes) -> bytes:
    """A checkpoint without what replay cannot rebuild (the modification times): what recovery
    compares.  ``payload`` is a checkpoint ``deserialize_checkpoint`` accepts."""
    if checkpoint_version(payload) < 2:
        return payload
    _, _, count = _HEADER.unpack_from(payload, 0)
    return payload[:len(payload) - count * _I64.size]


def deserialize_checkpoint(payload: bytes, container_id: int) -> ContainerMetadata:
    """The metadata a checkpoint holds.  Raises ``DataCorruptionError`` if it is malformed."""
    try:
        version, next_segment_id, count = _HEADER.unpack_from(payload, 0)
        if not 1 <= version <= CHECKPOINT_VERSION:
            raise ValueError(f"unknown checkpoint version {version}")
        metadata = ContainerMetadata(container_id)
        ordered: list[SegmentMetadata] = []  # (in payload order, which the modification times follow)
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
            spans: list[ChunkSpan] = []
            for _ in range(span_count):
                offset, span_length, chunk_offset, chunk_length = _SPAN.unpack_from(payload, position)
                position += _SPAN.size
                chunk = payload[position:position + chunk_length]
                position += chunk_length
                if len(chunk) != chunk_length or span_length <= 0 or chunk_offset < 0 or offset + span_length > length \
                        or offset < (spans[-1].end if spans else 0):
                    raise ValueError(f"segment {segment_id}: span {len(spans)} is not a valid layout entry")
                spans.append(ChunkSpan(offset, span_length, chunk.decode(), chunk_offset))
            segment = SegmentMetadata(segment_id, name, _STATUS_BY_CODE[status], start_offset, length, attributes,
                                      tuple(spans))
            if version >= 2:
                spacing, boundary_count = _BOUNDARIES_HEAD.unpack_from(payload, position)
                position += _BOUNDARIES_HEAD.size
                if boundary_count > event_boundaries.ENTRIES_MAX:
                    raise ValueError(f"segment {segment_id}: {boundary_count} event boundaries")
                boundaries = struct.unpack_from(f">{boundary_count}q", payload, position)
                position += boundary_count * _I64.size
                if spacing < event_boundaries.SPACING_BYTES_MIN \
                        or not all(start_offset < b <= length for b in boundaries) \
                        or not all(a < b for a, b in itertools.pairwise(boundaries)):
                    raise ValueError(f"segment {segment_id}: its event boundaries are not a valid index")
                segment.boundaries, segment.boundary_spacing = boundaries, spacing
            metadata.put(segment)
            ordered.append(segment)
        if version >= 2:
            remaining = len(payload) - position
            if remaining > count * _I64.size:
                raise ValueError("trailing bytes after the last segment")
            if remaining < count * _I64.size:
                raise ValueError("the modification times are cut short")
            for index, parsed in enumerate(ordered):
                (parsed.last_modified_ms,) = _I64.unpack_from(payload, position + index * _I64.size)
            position += count * _I64.size
        if position != len(payload):
            raise ValueError("trailing bytes after the last segment")
    except (struct.error, ValueError, KeyError, UnicodeDecodeError) as error:
        raise DataCorruptionError(f"container {container_id}: malformed metadata checkpoint: {error}") from error
    return metadata
