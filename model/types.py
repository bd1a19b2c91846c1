"""Shared vocabulary: the value types that the model, the implementation and the tests all speak.

The implementation may import this module (and ``errors``) from the model package, but nothing
else: the model's transition code stays independent so that model-versus-implementation tests
remain differential.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

__all__ = [
    "ATTRIBUTE_ID_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "NO_OFFSET",
    "NULL_ATTRIBUTE_VALUE",
    "AttributeUpdate",
    "AttributeUpdateType",
    "OperationKind",
    "SegmentStatus",
]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

#: An attribute that holds this value is absent; writing it removes the attribute.
NULL_ATTRIBUTE_VALUE: Final = INT64_MIN

#: Attribute ids are 128-bit unsigned integers (a writer id is a UUID's ``int``).
ATTRIBUTE_ID_MAX: Final = 2**128 - 1

#: "No offset": a plain (unconditional) append, or an operation that has no offset.
NO_OFFSET: Final = -1


class AttributeUpdateType(enum.IntEnum):
    """How an attribute update combines with the attribute's current value."""

    NONE = 0
    """Set the value only if the attribute is absent."""
    REPLACE = 1
    """Set the value unconditionally."""
    REPLACE_IF_GREATER = 2
    """Set the value only if it is greater than the current one (absent counts as the minimum)."""
    REPLACE_IF_EQUALS = 3
    """Compare-and-set: set the value only if the current one equals ``comparison_value``."""
    ACCUMULATE = 4
    """Add the value to the current one (absent counts as zero)."""

    def __repr__(self) -> str:
        return f"AttributeUpdateType.{self.name}"


@attrs.frozen
class AttributeUpdate:
    """One update to one segment attribute. ``comparison_value`` is read by REPLACE_IF_EQUALS only."""

    attribute_id: int
    update_type: AttributeUpdateType
    value: int
    comparison_value: int = NULL_ATTRIBUTE_VALUE


class OperationKind(enum.Enum):
    """The kinds of operation a segment container sequences through its durable log.

    The values are the names the TLA+ spec ``DurableLog`` uses for the same kinds.
    """

    CREATE = "create"
    APPEND = "append"
    SEAL = "seal"
    TRUNCATE = "truncate"
    MERGE = "merge"
    DELETE = "delete"
    UPDATE_ATTRIBUTES = "update_attributes"
    CHECKPOINT = "checkpoint"
    """The container's own metadata checkpoint: valid in every state, changes no segment."""

    def __repr__(self) -> str:
        return f"OperationKind.{self.name}"


class SegmentStatus(enum.Enum):
    """A segment's lifecycle state (the values are the spec's names).  No entry at all means the
    segment was never created."""

    ACTIVE = "active"
    SEALED = "sealed"
    MERGED = "merged"
    DELETED = "deleted"

    def __repr__(self) -> str:
        return f"SegmentStatus.{self.name}"
