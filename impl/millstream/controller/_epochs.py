"""Key ranges, epochs and a stream's history: pure functions, no I/O (STYLE.md #1).

Theory of operation.  Routing keys hash into [0, 1).  A stream is a sequence of *epochs*; each
epoch is a tuple of segments whose key ranges [key_start, key_end) cover [0, 1) exactly once,
ordered by key.  Epoch 0 is made when the stream is created; a scale makes epoch e + 1 from epoch e
by removing the sealed segments and adding new ones whose ranges cover exactly the keys the sealed
ones owned.  A segment that survives a scale keeps its id, so it appears in several epochs; its id
packs the epoch that created it with its number (``naming.segment_id``), and new numbers continue
from the largest number ever used in the stream.

Key-range bounds are floats compared exactly.  That is sound because a bound is never computed
twice: a split computes each inner bound once and both neighbours share it, a merge reuses the
outer bounds of the merged segments, and JSON carries floats unchanged (Python prints the shortest
string that reads back as the same float).

From the epochs follow the *relations* every reader and stream cut relies on.  A segment S created
in epoch c (the id says which) and last present in epoch l:

* its predecessors are the segments of epoch c - 1 whose ranges overlap S's (empty for epoch 0);
* it was sealed by the scale that made epoch l + 1 (if there is one), and its successors are the
  segments of epoch l + 1 that overlap it -- each new in that epoch;
* of two *different* segments whose ranges overlap, the one created later comes after the other for
  every key they share: the earlier one was sealed before the later one was created, since two
  segments of one epoch never overlap.  So ``(creation epoch, offset)`` orders positions at a key.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from millstream import limits
from millstream.errors import InternalError, InvalidArgumentError, InvalidScaleError
from millstream.naming import segment_id, segment_id_parts

__all__ = [
    "KEY_SPACE",
    "EpochRecord",
    "SegmentRecord",
    "StreamHistory",
    "check_cover",
    "initial_epoch",
    "key_union",
    "next_epoch",
    "overlaps",
    "split_range",
    "validate_scale",
]

#: The whole key space.
KEY_SPACE: Final = (0.0, 1.0)


@attrs.frozen(order=False)
class SegmentRecord:
    """A segment and the keys it owns, [``key_start``, ``key_end``)."""

    segment_id: int
    key_start: float
    key_end: float

    @property
    def creation_epoch(self) -> int:
        return segment_id_parts(self.segment_id)[0]

    @property
    def number(self) -> int:
        return segment_id_parts(self.segment_id)[1]

    def to_json(self) -> list[float | int]:
        return [self.segment_id, self.key_start, self.key_end]

    @classmethod
    def from_json(cls, value: Sequence[float | int]) -> SegmentRecord:
        identifier, start, end = value
        return cls(int(identifier), float(start), float(end))


@attrs.frozen
class EpochRecord:
    """Epoch ``epoch``: made at ``creation_time`` (the controller's clock), its segments by key."""

    epoch: int
    creation_time: float
    segments: tuple[SegmentRecord, ...]

    def segment_ids(self) -> frozenset[int]:
        return frozenset(s.segment_id for s in self.segments)

    def find(self, identifier: int) -> SegmentRecord | None:
        for segment in self.segments:
            if segment.segment_id == identifier:
                return segment
        return None

    def to_json(self) -> dict[str, object]:
        return {"epoch": self.epoch, "time": self.creation_time, "segments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> EpochRecord:
        return cls(int(value["epoch"]), float(value["time"]),
                   tuple(SegmentRecord.from_json(s) for s in value["segments"]))


def overlaps(a: SegmentRecord | tuple[float, float], b: SegmentRecord | tuple[float, float]) -> bool:
    """Whether two key ranges share a key."""
    a_start, a_end = (a.key_start, a.key_end) if isinstance(a, SegmentRecord) else a
    b_start, b_end = (b.key_start, b.key_end) if isinstance(b, SegmentRecord) else b
    return a_start < b_end and b_start < a_end


def key_union(ranges: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ranges that do not overlap, as maximal contiguous ranges in key order.  Raises
    ``InvalidArgumentError`` if two of them overlap."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(ranges):
        if merged and start < merged[-1][1]:
            raise InvalidArgumentError(f"key ranges overlap at [{start}, {min(end, merged[-1][1])})")
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def check_cover(ranges: Iterable[tuple[float, float]]) -> bool:
    """Whether the ranges cover [0, 1) exactly once."""
    try:
        return key_union(ranges) == [KEY_SPACE]
    except InvalidArgumentError:
        return False


def split_range(key_start: float, key_end: float, parts: int) -> list[tuple[float, float]]:
    """[key_start, key_end) in ``parts`` equal parts; the first starts at ``key_start`` and the last
    ends at ``key_end`` exactly, and neighbours share each inner bound."""
    if parts < 1 or not key_start < key_end:
        raise InternalError(f"cannot split [{key_start}, {key_end}) into {parts}")
    width = key_end - key_start
    bounds = [key_start] + [key_start + width * index / parts for index in range(1, parts)] + [key_end]
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise InvalidScaleError(f"[{key_start}, {key_end}) is too narrow to split into {parts} parts")
    return list(itertools.pairwise(bounds))


def initial_epoch(segment_count: int, creation_time: float) -> EpochRecord:
    """Epoch 0 of a new stream: ``segment_count`` segments owning equal key ranges."""
    ranges = split_range(*KEY_SPACE, segment_count)
    return EpochRecord(0, creation_time, tuple(SegmentRecord(segment_id(0, number), start, end)
                                               for number, (start, end) in enumerate(ranges)))


def _check_range(value: tuple[float, float]) -> tuple[float, float]:
    start, end = value
    if not 0.0 <= start < end <= 1.0:
        raise InvalidScaleError(f"the key range [{start}, {end}) is empty or leaves [0, 1)")
    return float(start), float(end)


def validate_scale(current: EpochRecord, seal: Sequence[int], new_ranges: Sequence[tuple[float, float]]) -> None:
    """Raise ``InvalidScaleError`` unless sealing ``seal`` (ids in ``current``) and adding segments
    owning ``new_ranges`` keeps every key owned exactly once: the sealed segments must all be in the
    current epoch (and named once each), and the union of the new ranges must be exactly the union of
    theirs, without overlaps."""
    if not seal:
        raise InvalidScaleError("a scale seals at least one segment")
    if len(set(seal)) != len(seal):
        raise InvalidScaleError(f"segments to seal are named more than once: {sorted(seal)}")
    sealed = []
    for identifier in seal:
        found = current.find(identifier)
        if found is None:
            raise InvalidScaleError(f"segment {identifier} is not in the stream's current epoch {current.epoch}")
        sealed.append(found)
    if not new_ranges:
        raise InvalidScaleError("a scale creates at least one segment")
    if len(current.segments) - len(sealed) + len(new_ranges) > limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX:
        raise InvalidScaleError(f"the new epoch would have more than {limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX} "
                                "segments")
    ranges = [_check_range(r) for r in new_ranges]
    try:
        new_union = key_union(ranges)
    except InvalidArgumentError as error:
        raise InvalidScaleError(f"the new key ranges overlap: {error}") from None
    old_union = key_union((s.key_start, s.key_end) for s in sealed)
    if new_union != old_union:
        raise InvalidScaleError(f"the new key ranges cover {new_union}, the sealed segments {old_union}: they "
                                "must be exactly the same keys")


def next_epoch(current: EpochRecord, seal: Sequence[int], new_ranges: Sequence[tuple[float, float]],
               next_number: int, creation_time: float) -> tuple[EpochRecord, tuple[SegmentRecord, ...]]:
    """The epoch after ``current`` once ``seal`` is replaced by segments owning ``new_ranges``
    (validated with ``validate_scale`` first), and its new segments.  New segments are numbered from
    ``next_number`` in key order."""
    validate_scale(current, seal, new_ranges)
    epoch = current.epoch + 1
    created = tuple(SegmentRecord(segment_id(epoch, next_number + index), start, end)
                    for index, (start, end) in enumerate(sorted(_check_range(r) for r in new_ranges)))
    kept = [s for s in current.segments if s.segment_id not in set(seal)]
    segments = tuple(sorted(kept + list(created), key=lambda s: s.key_start))
    if not check_cover((s.key_start, s.key_end) for s in segments):
        raise InternalError(f"epoch {epoch} would not cover the key space: {segments}")
    return EpochRecord(epoch, creation_time, segments), created


class StreamHistory:
    """The retained epochs of a stream (consecutive, the last is current) and the relations between
    its segments, computed once.  Immutable: a scale or a truncation builds a new one."""

    __slots__ = ("_by_epoch", "_last_epoch_of", "_records", "epochs")

    def __init__(self, epochs: Sequence[EpochRecord]) -> None:
        if not epochs:
            raise InternalError("a stream has at least one epoch")
        for before, after in itertools.pairwise(epochs):
            if after.epoch != before.epoch + 1:
                raise InternalError(f"epochs {before.epoch} and {after.epoch} are not consecutive")
        self.epochs: tuple[EpochRecord, ...] = tuple(epochs)
        self._by_epoch = {e.epoch: e for e in self.epochs}
        self._records: dict[int, SegmentRecord] = {}
        self._last_epoch_of: dict[int, int] = {}
        for epoch in self.epochs:
            for segment in epoch.segments:
                self._records.setdefault(segment.segment_id, segment)
                self._last_epoch_of[segment.segment_id] = epoch.epoch

    @property
    def current(self) -> EpochRecord:
        return self.epochs[-1]

    @property
    def first_epoch(self) -> int:
        return self.epochs[0].epoch

    def epoch(self, number: int) -> EpochRecord | None:
        return self._by_epoch.get(number)

    def segment(self, identifier: int) -> SegmentRecord | None:
        """The segment, if it belongs to a retained epoch of this stream."""
        return self._records.get(identifier)

    def segments(self) -> list[SegmentRecord]:
        """Every retained segment, ordered by creation epoch, then key."""
        return sorted(self._records.values(), key=lambda s: (s.creation_epoch, s.key_start))

    def is_current(self, identifier: int) -> bool:
        return self._last_epoch_of.get(identifier) == self.current.epoch

    def sealing_epoch(self, identifier: int) -> int | None:
        """The epoch whose scale sealed the segment, or None while it is in the current epoch."""
        last = self._last_epoch_of.get(identifier)
        if last is None or last == self.current.epoch:
            return None
        return last + 1

    def predecessors(self, identifier: int) -> list[SegmentRecord]:
        """The segments it replaced (empty for a segment of the first retained epoch)."""
        record = self._records[identifier]
        before = self._by_epoch.get(record.creation_epoch - 1)
        if before is None:
            return []
        return [s for s in before.segments if overlaps(s, record)]

    def successors(self, identifier: int) -> list[SegmentRecord]:
        """The segments that replaced it (empty while it is in the current epoch)."""
        sealing = self.sealing_epoch(identifier)
        if sealing is None:
            return []
        record = self._records[identifier]
        return [s for s in self._by_epoch[sealing].segments if overlaps(s, record)]

    def with_epoch(self, epoch: EpochRecord) -> StreamHistory:
        return StreamHistory((*self.epochs, epoch))

    def without_epochs_before(self, epoch: int) -> StreamHistory:
        return StreamHistory([e for e in self.epochs if e.epoch >= epoch])

    def check_invariants(self) -> None:
        for epoch in self.epochs:
            assert check_cover((s.key_start, s.key_end) for s in epoch.segments), epoch
            assert list(epoch.segments) == sorted(epoch.segments, key=lambda s: s.key_start), epoch
            for segment in epoch.segments:
                assert segment.creation_epoch <= epoch.epoch, (segment, epoch.epoch)
                assert self._records[segment.segment_id] == segment
        for before, after in zip(self.epochs, self.epochs[1:], strict=False):
            created = [s for s in after.segments if s.creation_epoch == after.epoch]
            gone = [s for s in before.segments if s.segment_id not in after.segment_ids()]
            # successor ranges exactly cover the predecessors they replace
            assert key_union((s.key_start, s.key_end) for s in created) \
                == key_union((s.key_start, s.key_end) for s in gone), (before.epoch, after.epoch)
            assert all(s.creation_epoch < after.epoch for s in after.segments if s in before.segments)

    def to_json(self) -> list[dict[str, object]]:
        return [e.to_json() for e in self.epochs]

    @classmethod
    def from_json(cls, value: Sequence[Mapping[str, Any]]) -> StreamHistory:
        return cls([EpochRecord.from_json(e) for e in value])

    def __repr__(self) -> str:
        return f"StreamHistory({list(self.epochs)!r})"
