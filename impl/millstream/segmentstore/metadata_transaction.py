"""Metadata update transactions: how an operation is validated against effects not yet durable.

Theory of operation.  The OperationProcessor validates each operation against the container
metadata *as every operation processed before it would leave it* -- including operations whose
frames are still in flight.  Each DataFrame gets one ``ContainerMetadataUpdateTransaction``; each
transaction is chained onto the one of the previous frame, and the oldest onto the committed
``ContainerMetadata``.  Reads go down the chain (a segment is copied into a transaction the first
time that transaction touches it); writes land in the newest transaction only.  When Tier 1
acknowledges frame k, the transactions of every frame up to k are committed into the metadata, in
order, and the next one is re-based onto the metadata.  When a write fails, every uncommitted
transaction is discarded.

Validation happens in two steps, as in Pravega: ``pre_process`` checks an operation and fills in
what the container assigns (offsets, new segment ids) without changing anything; ``accept`` then
applies it.  Between the two the DataFrameBuilder may seal a frame, so ``accept`` may land in a
newer transaction than ``pre_process`` read -- which is why ``pre_process`` must not write.
"""

from __future__ import annotations

from collections.abc import Iterator

from millstream.errors import (
    BadOffsetError,
    DataCorruptionError,
    InternalError,
    InvalidArgumentError,
    StreamSegmentExistsError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentNotSealedError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
)
from millstream.limits import SEGMENTS_PER_CONTAINER_MAX
from millstream.model.types import NO_OFFSET, NULL_ATTRIBUTE_VALUE, SegmentStatus
from millstream.segmentstore import event_boundaries
from millstream.segmentstore.event_boundaries import (
    index_after_append,
    index_after_merge,
    index_after_truncation,
    next_due,
)
from millstream.segmentstore.layout import ChunkSpan, add_span, drop_below, overlaps, shifted
from millstream.segmentstore.metadata import ContainerMetadata, SegmentMetadata, attribute_update_values
from millstream.segmentstore.operations import (
    NO_SEGMENT_ID,
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
)

__all__ = ["ContainerMetadataUpdateTransaction", "SegmentMetadataUpdateTransaction"]

_ACTIVE, _SEALED, _MERGED, _DELETED = (
    SegmentStatus.ACTIVE, SegmentStatus.SEALED, SegmentStatus.MERGED, SegmentStatus.DELETED)


class SegmentMetadataUpdateTransaction:
    """One segment as a transaction sees it.  Attribute changes are an overlay on the version below.
    ``boundary_due`` (derived, not kept): the length at which the next append end joins the index of
    known event boundaries -- so an append costs one comparison for it."""

    __slots__ = ("attribute_changes", "below", "boundaries", "boundary_due", "boundary_spacing", "id",
                 "last_modified_ms", "length", "name", "spans", "start_offset", "status")

    def __init__(self, below: SegmentMetadata | SegmentMetadataUpdateTransaction | None, segment_id: int,
                 name: str) -> None:
        self.below = below
        self.id = segment_id
        self.name = name
        self.attribute_changes: dict[int, int] = {}
        if below is None:
            self.status, self.start_offset, self.length = _ACTIVE, 0, 0
            self.spans: tuple[ChunkSpan, ...] = ()
            self.boundaries: tuple[int, ...] = ()
            self.boundary_spacing = event_boundaries.SPACING_BYTES_MIN
            self.last_modified_ms = 0
        else:
            self.status, self.start_offset, self.length = below.status, below.start_offset, below.length
            self.spans = below.spans
            self.boundaries, self.boundary_spacing = below.boundaries, below.boundary_spacing
            self.last_modified_ms = below.last_modified_ms
        self.boundary_due = next_due(self.boundaries, self.boundary_spacing, self.start_offset)

    def get_attribute(self, attribute_id: int) -> int:
        changes = self.attribute_changes
        if attribute_id in changes:
            return changes[attribute_id]
        below = self.below
        return NULL_ATTRIBUTE_VALUE if below is None else below.get_attribute(attribute_id)

    def require_writable(self) -> None:
        """Raise unless the segment exists and is not sealed."""
        status = self.status
        if status is not _ACTIVE:
            raise _unavailable_error(self) if status is not _SEALED else StreamSegmentSealedError(self.name)

    def require_exists(self) -> None:
        if self.status is _DELETED or self.status is _MERGED:
            raise _unavailable_error(self)

    def all_attributes(self) -> dict[int, int]:
        below = self.below
        if below is None:
            attributes: dict[int, int] = {}
        elif isinstance(below, SegmentMetadata):
            attributes = dict(below.attributes)
        else:
            attributes = below.all_attributes()
        for key, value in self.attribute_changes.items():
            if value == NULL_ATTRIBUTE_VALUE:
                attributes.pop(key, None)
            else:
                attributes[key] = value
        return attributes


def _unavailable_error(segment: SegmentMetadataUpdateTransaction) -> Exception:
    if segment.status is _MERGED:
        return StreamSegmentMergedError(f"segment {segment.name!r} was merged")
    return StreamSegmentNotExistsError(f"segment {segment.name!r} does not exist")


class ContainerMetadataUpdateTransaction:
    """The effects of the operations ending in one DataFrame, chained onto those before it."""

    __slots__ = ("_by_name", "metadata", "names", "next_segment_id", "previous", "segments", "time_ms")

    def __init__(self, metadata: ContainerMetadata, previous: ContainerMetadataUpdateTransaction | None) -> None:
        self.metadata = metadata
        self.previous = previous
        #: The time the operations accepted now are stamped with (``SegmentMetadata.last_modified_ms``):
        #: set by the OperationProcessor once per batch it takes, by recovery for what it replays.
        self.time_ms: int = previous.time_ms if previous is not None else 0
        self.segments: dict[int, SegmentMetadataUpdateTransaction] = {}
        #: Names this transaction (re)binds to a new segment id.
        self.names: dict[str, int] = {}
        #: What ``segment(name)`` found, so that the next operation on the name skips the walk down
        #: the chain.  Only this transaction's own copies are kept, and only a name (re)bound by this
        #: transaction can change what a name resolves to here (older transactions no longer change),
        #: so an entry goes stale only through ``accept`` of a map operation, which drops it.
        self._by_name: dict[str, SegmentMetadataUpdateTransaction] = {}
        self.next_segment_id: int = previous.next_segment_id if previous else metadata.next_segment_id

    # --- reading through the chain -------------------------------------------------------------------

    def peek(self, name: str) -> SegmentMetadata | SegmentMetadataUpdateTransaction | None:
        """The newest version of the segment ``name`` maps to, as this transaction sees it, or None.
        Reads only (``segment`` copies the segment into this transaction)."""
        segment_id = self.segment_id(name)
        if segment_id is None:
            return None
        return self.segments.get(segment_id) or self._version_below(segment_id)

    def segment_id(self, name: str) -> int | None:
        transaction: ContainerMetadataUpdateTransaction | None = self
        while transaction is not None:
            if name in transaction.names:
                return transaction.names[name]
            transaction = transaction.previous
        return self.metadata.ids_by_name.get(name)

    def _version_below(self, segment_id: int) -> SegmentMetadata | SegmentMetadataUpdateTransaction | None:
        transaction = self.previous
        while transaction is not None:
            found = transaction.segments.get(segment_id)
            if found is not None:
                return found
            transaction = transaction.previous
        return self.metadata.segments.get(segment_id)

    def segment(self, name: str) -> SegmentMetadataUpdateTransaction:
        """The segment ``name`` maps to, as this transaction sees it (copied in on first touch).
        Raises ``StreamSegmentNotExistsError`` if the name was never created."""
        segment = self._by_name.get(name)
        if segment is None:
            segment_id = self.segment_id(name)
            if segment_id is None:
                raise StreamSegmentNotExistsError(f"segment {name!r} does not exist")
            segment = self._by_name[name] = self._segment_by_id(segment_id)
        return segment

    def _existing_by_id(self, segment_id: int) -> SegmentMetadataUpdateTransaction | None:
        """The segment with id ``segment_id`` if it exists (not deleted or merged), else None."""
        if segment_id not in self.segments and self._version_below(segment_id) is None:
            return None
        segment = self._segment_by_id(segment_id)
        return None if segment.status is _DELETED or segment.status is _MERGED else segment

    def _segment_by_id(self, segment_id: int) -> SegmentMetadataUpdateTransaction:
        segment = self.segments.get(segment_id)
        if segment is None:
            below = self._version_below(segment_id)
            if below is None:
                raise InternalError(f"segment id {segment_id} is mapped but unknown")
            segment = SegmentMetadataUpdateTransaction(below, segment_id, below.name)
            self.segments[segment_id] = segment
        return segment

    # --- validation --------------------------------------------------------------------------------

    def pre_process(self, operation: Operation) -> None:
        """Check ``operation`` against this view and fill in what the container assigns.  Changes
        nothing.  Raises the ``CallerError`` the operation is rejected with."""
        if isinstance(operation, StreamSegmentAppendOperation):
            # (The hot path of every append: written with as few calls as possible.)
            segment = self._by_name.get(operation.segment_name) or self.segment(operation.segment_name)
            if segment.status is not _ACTIVE:
                segment.require_writable()
            if operation.attribute_updates:
                attribute_update_values(segment.get_attribute, operation.attribute_updates)
            expected = operation.expected_offset
            length = segment.length
            if expected not in (NO_OFFSET, length):
                raise BadOffsetError(f"segment {segment.name!r} has length {length}, "
                                     f"the append expected {expected}")
            operation.segment_id = segment.id
            operation.offset = length
        elif isinstance(operation, StreamSegmentSealOperation):
            segment = self.segment(operation.segment_name)
            segment.require_writable()
            operation.segment_id = segment.id
            operation.offset = segment.length
        elif isinstance(operation, StreamSegmentTruncateOperation):
            segment = self.segment(operation.segment_name)
            segment.require_exists()
            if operation.expected_segment_id not in (NO_SEGMENT_ID, segment.id):
                # Checked (for event boundaries) on another segment of that name, deleted since.
                raise StreamSegmentNotExistsError(f"segment {segment.name!r} was deleted and created again "
                                                  "while the truncation was checked")
            if not segment.start_offset <= operation.offset <= segment.length:
                raise BadOffsetError(f"truncation offset {operation.offset} is outside "
                                     f"[{segment.start_offset}, {segment.length}] of {segment.name!r}")
            operation.segment_id = segment.id
        elif isinstance(operation, DeleteSegmentOperation):
            segment = self.segment(operation.segment_name)
            segment.require_exists()
            operation.segment_id = segment.id
        elif isinstance(operation, MergeSegmentOperation):
            target = self.segment(operation.segment_name)
            target.require_writable()
            source = self.segment(operation.source_name)
            source.require_exists()
            if source.status is not _SEALED:
                raise StreamSegmentNotSealedError(f"merge source {source.name!r} is not sealed")
            if source.start_offset != 0:
                raise StreamSegmentTruncatedError(f"merge source {source.name!r} was truncated")
            operation.target_segment_id = target.id
            operation.source_segment_id = source.id
            operation.offset = target.length
            operation.length = source.length
        elif isinstance(operation, StreamSegmentMapOperation):
            existing = self.segment_id(operation.name)
            if existing is not None:
                segment = self._segment_by_id(existing)
                if segment.status is _MERGED:
                    raise StreamSegmentMergedError(f"segment {operation.name!r} was merged")
                if segment.status is not _DELETED:
                    raise StreamSegmentExistsError(f"segment {operation.name!r} already exists")
            if len(self.metadata.segments) >= SEGMENTS_PER_CONTAINER_MAX:
                raise InvalidArgumentError(f"container holds {SEGMENTS_PER_CONTAINER_MAX} segments already")
            if operation.attribute_updates:
                attribute_update_values(lambda _: NULL_ATTRIBUTE_VALUE, operation.attribute_updates)
            operation.segment_id = self.next_segment_id
        elif isinstance(operation, UpdateAttributesOperation):
            segment = self.segment(operation.segment_name)
            segment.require_writable()
            attribute_update_values(segment.get_attribute, operation.attribute_updates)
            operation.segment_id = segment.id
        elif isinstance(operation, StorageFlushOperation):
            segment_or_none = self._existing_by_id(operation.segment_id)
            if segment_or_none is None:
                raise StreamSegmentNotExistsError(f"segment id {operation.segment_id} does not exist")
            end = operation.offset + operation.length
            if operation.offset < 0 or operation.length <= 0 or operation.chunk_offset < 0 \
                    or end > segment_or_none.length or overlaps(segment_or_none.spans, operation.offset, end):
                raise BadOffsetError(f"flush of [{operation.offset}, {end}) does not fit the layout of "
                                     f"{segment_or_none.name!r} (length {segment_or_none.length})")
            operation.segment_name = segment_or_none.name
        elif not isinstance(operation, MetadataCheckpointOperation):
            raise InternalError(f"unknown operation {operation!r}")

    def accept(self, operation: Operation) -> None:
        """Apply a pre-processed operation.  Must not fail for an operation ``pre_process`` passed."""
        if isinstance(operation, StreamSegmentAppendOperation):
            segment = self.segments.get(operation.segment_id) or self._segment_by_id(operation.segment_id)
            length = segment.length = segment.length + len(operation.data)
            segment.last_modified_ms = self.time_ms
            if length >= segment.boundary_due:
                segment.boundaries, segment.boundary_spacing = index_after_append(
                    segment.boundaries, segment.boundary_spacing, length)
                segment.boundary_due = length + segment.boundary_spacing
            if operation.attribute_updates:
                segment.attribute_changes.update(
                    attribute_update_values(segment.get_attribute, operation.attribute_updates))
        elif isinstance(operation, StreamSegmentSealOperation):
            segment = self._segment_by_id(operation.segment_id)
            segment.status = _SEALED
            segment.last_modified_ms = self.time_ms
        elif isinstance(operation, StreamSegmentTruncateOperation):
            segment = self._segment_by_id(operation.segment_id)
            segment.start_offset = operation.offset
            segment.spans = drop_below(segment.spans, operation.offset)
            segment.boundaries = index_after_truncation(segment.boundaries, operation.offset)
            segment.boundary_due = next_due(segment.boundaries, segment.boundary_spacing, segment.start_offset)
            segment.last_modified_ms = self.time_ms
        elif isinstance(operation, DeleteSegmentOperation):
            _tombstone(self._segment_by_id(operation.segment_id), _DELETED)
        elif isinstance(operation, MergeSegmentOperation):
            # The source's Tier-2 bytes become the target's without a copy: its spans are relinked.
            target = self._segment_by_id(operation.target_segment_id)
            source = self._segment_by_id(operation.source_segment_id)
            target.length += operation.length
            target.spans = target.spans + shifted(source.spans, operation.offset)
            target.boundaries, target.boundary_spacing = index_after_merge(
                target.boundaries, target.boundary_spacing, target.start_offset, operation.offset, source.boundaries,
                target.length)
            target.boundary_due = next_due(target.boundaries, target.boundary_spacing, target.start_offset)
            target.last_modified_ms = self.time_ms
            _tombstone(source, _MERGED)
        elif isinstance(operation, StorageFlushOperation):
            segment = self._segment_by_id(operation.segment_id)
            if operation.offset + operation.length > segment.start_offset:  # else truncated meanwhile: moot
                segment.spans = add_span(segment.spans, ChunkSpan(
                    operation.offset, operation.length, operation.chunk, operation.chunk_offset))
        elif isinstance(operation, StreamSegmentMapOperation):
            segment = SegmentMetadataUpdateTransaction(None, operation.segment_id, operation.name)
            segment.last_modified_ms = self.time_ms
            if operation.attribute_updates:
                values = attribute_update_values(lambda _: NULL_ATTRIBUTE_VALUE, operation.attribute_updates)
                segment.attribute_changes.update(values)
            self.segments[operation.segment_id] = segment
            self.names[operation.name] = operation.segment_id
            self._by_name.pop(operation.name, None)
            self.next_segment_id = max(self.next_segment_id, operation.segment_id + 1)
        elif isinstance(operation, UpdateAttributesOperation):
            segment = self._segment_by_id(operation.segment_id)
            segment.last_modified_ms = self.time_ms
            segment.attribute_changes.update(
                attribute_update_values(segment.get_attribute, operation.attribute_updates))

    def adopt_modification_times(self, stored: ContainerMetadata) -> None:
        """Recovery met a later checkpoint: its modification times are the truth up to it (replay
        stamped what it replayed with the time of the recovery), so take them over."""
        for segment in stored.segments.values():
            if self.segment_id(segment.name) == segment.id:
                self._segment_by_id(segment.id).last_modified_ms = segment.last_modified_ms

    def replay(self, operation: Operation) -> None:
        """Apply an operation read back from the log (recovery): it must validate where it stands and
        carry exactly the offsets and ids the container would assign now."""
        recorded = _assigned(operation)
        if isinstance(operation, StreamSegmentMapOperation):
            operation.segment_name = operation.name
        elif isinstance(operation, MergeSegmentOperation):
            operation.segment_name = self._name_of(operation.target_segment_id)
            operation.source_name = self._name_of(operation.source_segment_id)
        elif not isinstance(operation, (MetadataCheckpointOperation, StorageFlushOperation)):
            operation.segment_name = self._name_of(operation.segment_id)  # type: ignore[attr-defined]
        if isinstance(operation, StreamSegmentAppendOperation):
            operation.expected_offset = operation.offset
        self.pre_process(operation)
        if _assigned(operation) != recorded:
            raise DataCorruptionError(f"operation {operation.sequence_number} recorded {recorded}, "
                                      f"replay assigns {_assigned(operation)}")
        self.accept(operation)

    def _name_of(self, segment_id: int) -> str:
        for transaction in self._chain():
            if segment_id in transaction.segments:
                return transaction.segments[segment_id].name
        segment = self.metadata.segments.get(segment_id)
        if segment is None:
            raise StreamSegmentNotExistsError(f"segment id {segment_id} is unknown")
        return segment.name

    def _chain(self) -> Iterator[ContainerMetadataUpdateTransaction]:
        transaction: ContainerMetadataUpdateTransaction | None = self
        while transaction is not None:
            yield transaction
            transaction = transaction.previous

    # --- commit --------------------------------------------------------------------------------------

    def commit(self) -> None:
        """Apply this transaction to the committed metadata.  Its predecessors must be committed."""
        if self.previous is not None:
            raise InternalError("metadata update transactions must commit in order")
        metadata = self.metadata
        for segment in self.segments.values():
            committed = metadata.segments.get(segment.id)
            if committed is None:
                committed = SegmentMetadata(segment.id, segment.name)
                metadata.put(committed)
            committed.status = segment.status
            committed.start_offset = segment.start_offset
            committed.length = segment.length
            committed.spans = segment.spans
            committed.boundaries, committed.boundary_spacing = segment.boundaries, segment.boundary_spacing
            committed.last_modified_ms = segment.last_modified_ms
            if segment.status is _DELETED or segment.status is _MERGED:
                committed.attributes = {}
            else:
                attributes = committed.attributes
                for key, value in segment.attribute_changes.items():
                    if value == NULL_ATTRIBUTE_VALUE:
                        attributes.pop(key, None)
                    else:
                        attributes[key] = value
        metadata.next_segment_id = self.next_segment_id

    def snapshot(self) -> list[SegmentMetadata]:
        """Every segment as this transaction sees it (for a metadata checkpoint)."""
        # The segment each name maps to now: a name (re)bound by a newer transaction hides the
        # segment it named before, as it will once committed (ContainerMetadata.put drops that one).
        ids_by_name = dict(self.metadata.ids_by_name)
        for transaction in reversed(list(self._chain())):  # oldest first, so the newest binding wins
            ids_by_name.update(transaction.names)
        ids = set(ids_by_name.values())
        result = []
        for segment_id in sorted(ids):
            segment = self.segments.get(segment_id) or self._version_below(segment_id)
            assert segment is not None
            attributes = (dict(segment.attributes) if isinstance(segment, SegmentMetadata)
                          else segment.all_attributes())
            result.append(SegmentMetadata(segment.id, segment.name, segment.status, segment.start_offset,
                                          segment.length, attributes, segment.spans, boundaries=segment.boundaries,
                                          boundary_spacing=segment.boundary_spacing,
                                          last_modified_ms=segment.last_modified_ms))
        return result


def _tombstone(segment: SegmentMetadataUpdateTransaction, status: SegmentStatus) -> None:
    segment.status = status
    segment.start_offset = 0
    segment.length = 0
    segment.spans = ()
    segment.boundaries, segment.boundary_spacing = (), event_boundaries.SPACING_BYTES_MIN
    segment.boundary_due = next_due((), segment.boundary_spacing, 0)
    segment.attribute_changes.clear()
    segment.below = None


def _assigned(operation: Operation) -> tuple[int, ...]:
    if isinstance(operation, MergeSegmentOperation):
        return (operation.target_segment_id, operation.source_segment_id, operation.offset, operation.length)
    if isinstance(operation, StreamSegmentMapOperation):
        return (operation.segment_id,)
    if isinstance(operation, (StreamSegmentAppendOperation, StreamSegmentSealOperation)):
        return (operation.segment_id, operation.offset)
    return ()
