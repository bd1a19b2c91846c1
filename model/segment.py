"""Segment metadata and the rules every operation is validated against (the model's side).

Mirrors ``Validate``, ``AssignedOffset`` and ``Apply`` in ``spec/DurableLog.tla``.  The lifecycle
is a table: for each status a segment may be in (or ``None``: no such segment), ``LIFECYCLE`` says
which roles an operation may play on it and which status follows; ``REFUSALS`` says with which error
any other role is refused.
Argument checks (offsets, attribute conditions) come after the table, in the spec's order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from millstream.model.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    MillstreamError,
    StreamSegmentExistsError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentNotSealedError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
)
from millstream.model.frozen_map import FrozenMap
from millstream.model.types import (
    INT64_MAX,
    INT64_MIN,
    NO_OFFSET,
    NULL_ATTRIBUTE_VALUE,
    AttributeUpdate,
    AttributeUpdateType,
    OperationKind,
    SegmentStatus,
)

__all__ = [
    "LIFECYCLE",
    "REFUSALS",
    "ContainerMetadata",
    "Request",
    "Role",
    "Run",
    "SegmentMetadata",
    "SegmentStatus",
    "apply",
    "apply_attribute_updates",
    "assigned_offset",
    "validate",
]


class Role(enum.Enum):
    """The part a segment plays in an operation."""

    CREATE = "create"
    APPEND = "append"
    SEAL = "seal"
    TRUNCATE = "truncate"
    DELETE = "delete"
    UPDATE_ATTRIBUTES = "update_attributes"
    MERGE_TARGET = "merge_target"
    MERGE_SOURCE = "merge_source"


_Outcome = SegmentStatus | type[MillstreamError]
_ROLES_ON_EXISTING = (Role.APPEND, Role.SEAL, Role.TRUNCATE, Role.DELETE, Role.UPDATE_ATTRIBUTES,
                      Role.MERGE_TARGET, Role.MERGE_SOURCE)

#: The segment lifecycle: for each status (or None for "no such segment"), the roles an operation may
#: play on it and the status that follows.  A role not listed is refused with ``REFUSALS``'s error.
LIFECYCLE: dict[SegmentStatus | None, dict[Role, SegmentStatus]] = {
    None: {Role.CREATE: SegmentStatus.ACTIVE},
    SegmentStatus.ACTIVE: {
        Role.APPEND: SegmentStatus.ACTIVE,
        Role.SEAL: SegmentStatus.SEALED,
        Role.TRUNCATE: SegmentStatus.ACTIVE,
        Role.DELETE: SegmentStatus.DELETED,
        Role.UPDATE_ATTRIBUTES: SegmentStatus.ACTIVE,
        Role.MERGE_TARGET: SegmentStatus.ACTIVE,
    },
    SegmentStatus.SEALED: {
        Role.TRUNCATE: SegmentStatus.SEALED,
        Role.DELETE: SegmentStatus.DELETED,
        Role.MERGE_SOURCE: SegmentStatus.MERGED,
    },
    SegmentStatus.MERGED: {},
    SegmentStatus.DELETED: {Role.CREATE: SegmentStatus.ACTIVE},
}

#: For each status, the error each role ``LIFECYCLE`` does not allow is refused with.
REFUSALS: dict[SegmentStatus | None, dict[Role, type[MillstreamError]]] = {
    None: dict.fromkeys(_ROLES_ON_EXISTING, StreamSegmentNotExistsError),
    SegmentStatus.ACTIVE: {Role.CREATE: StreamSegmentExistsError, Role.MERGE_SOURCE: StreamSegmentNotSealedError},
    SegmentStatus.SEALED: {
        Role.CREATE: StreamSegmentExistsError,
        Role.APPEND: StreamSegmentSealedError,
        Role.SEAL: StreamSegmentSealedError,
        Role.UPDATE_ATTRIBUTES: StreamSegmentSealedError,
        Role.MERGE_TARGET: StreamSegmentSealedError,
    },
    SegmentStatus.MERGED: dict.fromkeys(Role, StreamSegmentMergedError),
    SegmentStatus.DELETED: dict.fromkeys(_ROLES_ON_EXISTING, StreamSegmentNotExistsError),
}


@attrs.frozen
class Run:
    """``data`` appended by operation ``operation_id`` (the spec's ``[id, len]`` run)."""

    operation_id: int
    data: bytes


@attrs.frozen(cache_hash=True)
class SegmentMetadata:
    """One segment as the container's metadata records it."""

    status: SegmentStatus
    start_offset: int = 0
    length: int = 0
    runs: tuple[Run, ...] = ()
    attributes: FrozenMap[int, int] = attrs.field(factory=FrozenMap)

    def readable(self) -> bytes:
        """The bytes a reader can read: ``[start_offset, length)``."""
        return b"".join(run.data for run in self.runs)[self.start_offset:]


ContainerMetadata = FrozenMap[str, SegmentMetadata]

_FRESH = SegmentMetadata(SegmentStatus.ACTIVE)


@attrs.frozen
class Request:
    """What a client asks a container to do.

    ``offset`` is the expected offset of a conditional append (``NO_OFFSET`` for a plain one) or
    the truncation offset.  ``size`` is the operation's serialized size in frame units.
    """

    kind: OperationKind
    segment: str
    source: str | None = None
    data: bytes = b""
    offset: int = NO_OFFSET
    attribute_updates: tuple[AttributeUpdate, ...] = ()
    size: int = 1


def _outcome(metadata: ContainerMetadata, name: str, role: Role) -> _Outcome:
    segment = metadata.get(name)
    status = segment.status if segment else None
    following = LIFECYCLE[status].get(role)
    return following if following is not None else REFUSALS[status][role]


def _is_error(outcome: _Outcome) -> bool:
    return not isinstance(outcome, SegmentStatus)


_ROLE_OF_KIND = {
    OperationKind.CREATE: Role.CREATE,
    OperationKind.APPEND: Role.APPEND,
    OperationKind.SEAL: Role.SEAL,
    OperationKind.TRUNCATE: Role.TRUNCATE,
    OperationKind.DELETE: Role.DELETE,
    OperationKind.UPDATE_ATTRIBUTES: Role.UPDATE_ATTRIBUTES,
    OperationKind.MERGE: Role.MERGE_TARGET,
}


def validate(metadata: ContainerMetadata, request: Request) -> type[MillstreamError] | None:
    """The error ``request`` is rejected with against ``metadata``, or None if it is valid."""
    if request.kind is OperationKind.CHECKPOINT:
        return None
    target = _outcome(metadata, request.segment, _ROLE_OF_KIND[request.kind])
    if _is_error(target):
        return target  # type: ignore[return-value]
    segment = metadata.get(request.segment, _FRESH)
    if request.kind is OperationKind.MERGE:
        assert request.source is not None
        source = _outcome(metadata, request.source, Role.MERGE_SOURCE)
        if _is_error(source):
            return source  # type: ignore[return-value]
        if metadata[request.source].start_offset != 0:
            return StreamSegmentTruncatedError
    if request.kind in (OperationKind.CREATE, OperationKind.APPEND, OperationKind.UPDATE_ATTRIBUTES):
        attributes = segment.attributes if request.kind is not OperationKind.CREATE else FrozenMap()
        try:
            apply_attribute_updates(attributes, request.attribute_updates)
        except BadAttributeUpdateError:
            return BadAttributeUpdateError
    if request.kind is OperationKind.APPEND and request.offset not in (NO_OFFSET, segment.length):
        return BadOffsetError
    if request.kind is OperationKind.TRUNCATE and not (
        segment.start_offset <= request.offset <= segment.length
    ):
        return BadOffsetError
    return None


def assigned_offset(metadata: ContainerMetadata, request: Request) -> int:
    """The offset the processor gives a valid operation (the spec's ``AssignedOffset``)."""
    if request.kind in (OperationKind.APPEND, OperationKind.SEAL, OperationKind.MERGE):
        return metadata[request.segment].length
    if request.kind is OperationKind.TRUNCATE:
        return request.offset
    return NO_OFFSET


def apply(metadata: ContainerMetadata, request: Request, operation_id: int) -> ContainerMetadata:
    """The metadata after the valid operation ``operation_id`` (the spec's ``Apply``)."""
    kind = request.kind
    name = request.segment
    if kind is OperationKind.CHECKPOINT:
        return metadata
    if kind is OperationKind.CREATE:
        attributes = apply_attribute_updates(FrozenMap(), request.attribute_updates)
        return metadata.set(name, SegmentMetadata(SegmentStatus.ACTIVE, attributes=attributes))
    segment = metadata[name]
    if kind is OperationKind.APPEND:
        runs = (*segment.runs, Run(operation_id, request.data)) if request.data else segment.runs
        return metadata.set(name, attrs.evolve(
            segment,
            length=segment.length + len(request.data),
            runs=runs,
            attributes=apply_attribute_updates(segment.attributes, request.attribute_updates),
        ))
    if kind is OperationKind.UPDATE_ATTRIBUTES:
        return metadata.set(name, attrs.evolve(
            segment, attributes=apply_attribute_updates(segment.attributes, request.attribute_updates)))
    if kind is OperationKind.SEAL:
        return metadata.set(name, attrs.evolve(segment, status=SegmentStatus.SEALED))
    if kind is OperationKind.TRUNCATE:
        return metadata.set(name, attrs.evolve(segment, start_offset=request.offset))
    if kind is OperationKind.DELETE:
        return metadata.set(name, SegmentMetadata(SegmentStatus.DELETED))
    assert kind is OperationKind.MERGE and request.source is not None
    source = metadata[request.source]
    merged = attrs.evolve(segment, length=segment.length + source.length, runs=segment.runs + source.runs)
    return metadata.set(name, merged).set(request.source, SegmentMetadata(SegmentStatus.MERGED))


def apply_attribute_updates(
    attributes: FrozenMap[int, int], updates: Iterable[AttributeUpdate]
) -> FrozenMap[int, int]:
    """``attributes`` after ``updates``, applied in order (each sees the ones before it).

    Raises ``BadAttributeUpdateError`` if any update's condition fails; then nothing applies.
    An absent attribute reads as ``NULL_ATTRIBUTE_VALUE``; writing that value removes it.
    """
    result = dict(attributes)
    for update in updates:
        current = result.get(update.attribute_id, NULL_ATTRIBUTE_VALUE)
        kind = update.update_type
        if kind is AttributeUpdateType.NONE:
            if current != NULL_ATTRIBUTE_VALUE:
                raise BadAttributeUpdateError(f"attribute {update.attribute_id:#x} is already set")
            value = update.value
        elif kind is AttributeUpdateType.REPLACE:
            value = update.value
        elif kind is AttributeUpdateType.REPLACE_IF_GREATER:
            if update.value <= current:
                raise BadAttributeUpdateError(f"attribute {update.attribute_id:#x}: {update.value} <= {current}")
            value = update.value
        elif kind is AttributeUpdateType.REPLACE_IF_EQUALS:
            if current != update.comparison_value:
                raise BadAttributeUpdateError(
                    f"attribute {update.attribute_id:#x}: {current} != {update.comparison_value}")
            value = update.value
        else:
            base = 0 if current == NULL_ATTRIBUTE_VALUE else current
            value = base + update.value
            if not INT64_MIN < value <= INT64_MAX:
                raise BadAttributeUpdateError(f"attribute {update.attribute_id:#x}: accumulation overflows")
        if value == NULL_ATTRIBUTE_VALUE:
            result.pop(update.attribute_id, None)
        else:
            result[update.attribute_id] = value
    return FrozenMap(result)
