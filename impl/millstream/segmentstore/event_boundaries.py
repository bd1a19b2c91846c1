"""Event boundaries: which segments hold events, the sparse index of offsets where an event begins,
and the bounded check that a truncation offset is one.

Theory of operation.  The segment store is a byte store, but most segments hold *events*, framed
``type:i32 = 0 | length:i32 | payload``, and a truncation in the middle of one leaves the segment
unreadable from its head for good (every reader meets a ``MalformedEventError``).  So:

* *Which segments hold events* is a core attribute, ``EVENT_SEGMENT_ATTRIBUTE_ID`` = ``EVENT_SEGMENT``,
  given at creation by whoever knows: the controller for a stream's segments and reader groups' state
  segments (``LocalSegmentStore``), the server for segments clients create by name (event writers
  write there).  A byte-stream writer, which appends raw bytes, removes it when it opens its segment.
  A segment without it (the controller's own log, transient segments, segments made before this
  attribute existed, tests of the container) keeps byte granularity, as the container's specs have it.
* *Known boundaries.*  In a segment that holds events every append and every merge is whole events
  (the server checks each block's framing; a merged transaction or large event is whole events), so
  its start offset, its length, and the end of every append are boundaries.  Each segment keeps a
  sparse index of them (``SegmentMetadata.boundaries``): the end of the first append past every
  ``spacing`` bytes (``limits.EVENT_BOUNDARY_INDEX_SPACING_BYTES``), at most
  ``limits.EVENT_BOUNDARY_INDEX_ENTRIES_MAX`` of them -- past that every other one is dropped and the
  spacing doubles -- and none at or below the start offset.  It is metadata like the length: changed
  only by operations (``accept``), carried by metadata checkpoints and rebuilt by replay, so it
  survives restarts.  The index is kept for every segment (the attribute may come and go; the cost
  is one comparison per append) and used only for those that hold events.
* *The check* (``SegmentContainer.truncate``, and the controller for every stream cut it is given) of
  an offset of a segment that holds events: the start offset and the length pass at once; otherwise
  it hops from the nearest known boundary at or below the offset, event header to event header,
  reading at most ``limits.EVENT_BOUNDARY_SCAN_BYTES_MAX`` bytes (a long event is hopped over: of it
  at most one small read, ``SCAN_READ_BYTES_MIN``, is made).  Landing exactly on the offset confirms
  it; an offset inside an event, or bytes that are not an event header, refuse it with
  ``EventBoundaryError``; running out of budget refuses it too, saying it could not be confirmed.
  Memory and work per check are bounded whatever the segment's size.

Below the specs' level of abstraction: ``spec/DurableLog.tla`` and ``ContainerFailover.tla`` count
data in abstract units and truncate at any offset within ``[start, length]``; which offsets are event
boundaries is a check made before a truncation is submitted, and the index is derived metadata.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Mapping
from typing import Final

from millstream import limits
from millstream.errors import EventBoundaryError
from millstream.model.types import AttributeUpdate, AttributeUpdateType
from millstream.values import EVENT_SEGMENT, EVENT_SEGMENT_ATTRIBUTE_ID

__all__ = [
    "EVENT_SEGMENT",
    "EVENT_SEGMENT_ATTRIBUTES",
    "EVENT_SEGMENT_ATTRIBUTE_ID",
    "holds_events",
    "index_after_append",
    "index_after_merge",
    "index_after_truncation",
    "nearest_known",
    "next_due",
    "walk_events",
]

#: What a creator passes to make a segment that holds events.
EVENT_SEGMENT_ATTRIBUTES: Final = (AttributeUpdate(EVENT_SEGMENT_ATTRIBUTE_ID, AttributeUpdateType.REPLACE,
                                                   EVENT_SEGMENT),)

_EVENT_HEADER: Final = struct.Struct(">ii")
EVENT_HEADER_LENGTH: Final = _EVENT_HEADER.size

# Module-level, read at each use, so that tests can shrink them (for a whole container's life: the
# index is replayed, so changing its parameters under a running container breaks recovery).
SPACING_BYTES_MIN = limits.EVENT_BOUNDARY_INDEX_SPACING_BYTES
ENTRIES_MAX = limits.EVENT_BOUNDARY_INDEX_ENTRIES_MAX
SCAN_BYTES_MAX = limits.EVENT_BOUNDARY_SCAN_BYTES_MAX
#: The check's first read, and its read after hopping over a long event: enough for a few hundred
#: small events' headers, little of a long event's payload (reads double from it up to
#: ``limits.READ_LENGTH_BYTES_MAX`` while they hold whole events).
SCAN_READ_BYTES_MIN = 64 * limits.KIB

Boundaries = tuple[int, ...]


def holds_events(attributes: Mapping[int, int] | Callable[[int], int]) -> bool:
    """Whether a segment with these attributes (a dict, or a ``get_attribute``) holds events."""
    if callable(attributes):
        return attributes(EVENT_SEGMENT_ATTRIBUTE_ID) == EVENT_SEGMENT
    return attributes.get(EVENT_SEGMENT_ATTRIBUTE_ID) == EVENT_SEGMENT


def next_due(boundaries: Boundaries, spacing: int, start_offset: int) -> int:
    """The length at which the next append end is recorded."""
    return (boundaries[-1] if boundaries else start_offset) + spacing


def _thinned(boundaries: Boundaries, spacing: int) -> tuple[Boundaries, int]:
    """Drop every other entry (keeping the newest) and double the spacing until the index fits."""
    while len(boundaries) > ENTRIES_MAX:
        boundaries = boundaries[(len(boundaries) - 1) % 2::2]  # (every other one, counted from the newest)
        spacing *= 2
    return boundaries, spacing


def index_after_append(boundaries: Boundaries, spacing: int, length: int) -> tuple[Boundaries, int]:
    """The index once an append ending at ``length`` (>= ``next_due``) is recorded."""
    return _thinned((*boundaries, length), spacing)


def index_after_truncation(boundaries: Boundaries, start_offset: int) -> Boundaries:
    """The index once the segment starts at ``start_offset`` (entries at or below it are dropped)."""
    if not boundaries or boundaries[0] > start_offset:
        return boundaries
    return boundaries[bisect.bisect_right(boundaries, start_offset):]


def index_after_merge(boundaries: Boundaries, spacing: int, start_offset: int, offset: int, source: Boundaries,
                      length: int) -> tuple[Boundaries, int]:
    """The target's index once a source was merged at ``offset`` (its old length), ending at
    ``length``: both ends of the merged bytes, and the source's own entries moved up, are boundaries."""
    added = [offset] if offset > start_offset and (not boundaries or boundaries[-1] < offset) else []
    added += [offset + b for b in source if b > 0 and offset + b < length]
    if length > max(offset, start_offset):
        added.append(length)
    return _thinned((*boundaries, *added), spacing)


def nearest_known(boundaries: Boundaries, start_offset: int, offset: int) -> int:
    """The highest known boundary at or below ``offset`` (at least the start offset)."""
    index = bisect.bisect_right(boundaries, offset) - 1
    return max(start_offset, boundaries[index]) if index >= 0 else start_offset


def walk_events(view: memoryview | bytes, base: int, position: int, target: int, name: str) -> int:
    """Hop from the event that begins at ``position`` towards ``target`` through the bytes ``view``
    holds (segment bytes from offset ``base``).  Returns ``target`` once an event ends exactly there, or
    the position of the next event whose header ``view`` does not hold in full (read on from there).

    Raises ``EventBoundaryError`` if ``target`` lies inside an event (or its header), or if the bytes
    at an event's position are not an event header (the segment does not hold events there)."""
    end = base + len(view)
    unpack = _EVENT_HEADER.unpack_from
    while position < target:
        if position + EVENT_HEADER_LENGTH > target:
            raise EventBoundaryError(f"offset {target} of {name!r} is not an event boundary: it lies inside the "
                                     f"header of the event at {position}")
        if position + EVENT_HEADER_LENGTH > end:
            return position
        type_code, length = unpack(view, position - base)
        if type_code != 0 or length < 0:
            raise EventBoundaryError(f"offset {target} of {name!r} cannot be confirmed as an event boundary: the "
                                     f"bytes at {position} are not an event header (type {type_code}, length "
                                     f"{length}), so the segment does not hold well-framed events there")
        following = position + EVENT_HEADER_LENGTH + length
        if following > target:
            raise EventBoundaryError(f"offset {target} of {name!r} is not an event boundary: it lies inside the "
                                     f"event at [{position}, {following})")
        position = following
    return position
