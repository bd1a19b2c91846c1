"""Stream cuts: pure functions over a ``StreamHistory`` (no I/O).

Theory of operation.  A stream cut maps segment ids to offsets; it is a *position of the stream*
when its segments are retained segments of the stream and their key ranges cover [0, 1) exactly
once, and each offset lies within its segment.  At a key k, the position of a cut is
``(creation epoch, offset)`` of the cut's segment owning k; positions at one key compare in that
order (``_epochs``: of two overlapping segments the later-created one comes after the other).  So:

* cut A is *at or after* cut B when, at every key, A's position is not below B's -- checked pair by
  pair over overlapping segments;
* a segment lies *wholly before* a cut when some segment of the cut that overlaps it was created
  later (then every one that overlaps it was, for a valid cut);
* the *size* of the stream up to a cut is the lengths of the segments wholly before it plus the cut's
  offsets (only differences of sizes mean anything, since truncation forgets old segments);
* a *lower bound* of several cuts (consumption-based retention truncates there) takes, key by key,
  the lowest position; where that would use a segment on only part of its range, the segment is
  replaced by its predecessors at their ends -- a position before it -- until every segment chosen
  covers its whole range.  The result is at or before each cut (not always the greatest such cut,
  which is all retention needs).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import attrs

from millstream.controller._epochs import SegmentRecord, StreamHistory, check_cover, overlaps
from millstream.errors import InternalError, InvalidStreamCutError

__all__ = [
    "Slice",
    "cut_size",
    "is_at_or_after",
    "lower_bound",
    "segments_before",
    "segments_between",
    "validate_cut",
]

Cut = Mapping[int, int]


@attrs.frozen
class Slice:
    """A segment's bytes between two cuts: from ``start_offset`` to ``end_offset`` (-1: no bound),
    and those of its predecessors that lie between the cuts too."""

    segment: SegmentRecord
    start_offset: int
    end_offset: int
    predecessors: tuple[int, ...]


def validate_cut(history: StreamHistory, cut: Cut, *, lengths: Mapping[int, int]) -> None:
    """Raise ``InvalidStreamCutError`` unless ``cut`` is a position of the stream: known (retained)
    segments covering [0, 1) exactly once, offsets non-negative and, where ``lengths`` knows the
    segment's length, not beyond it."""
    if not cut:
        raise InvalidStreamCutError("a stream cut names at least one segment")
    records: list[SegmentRecord] = []
    for identifier, offset in cut.items():
        record = history.segment(identifier)
        if record is None:
            raise InvalidStreamCutError(
                f"segment {identifier} is not a segment of this stream (or was truncated away)")
        if type(offset) is not int or offset < 0:
            raise InvalidStreamCutError(f"the offset of segment {identifier} must be a non-negative int, not "
                                        f"{offset!r}")
        length = lengths.get(identifier)
        if length is not None and offset > length:
            raise InvalidStreamCutError(f"offset {offset} lies beyond the end of segment {identifier} ({length})")
        records.append(record)
    if not check_cover((r.key_start, r.key_end) for r in records):
        raise InvalidStreamCutError(
            "the cut's segments do not cover the key space [0, 1) exactly once: "
            + ", ".join(f"{r.segment_id}=[{r.key_start}, {r.key_end})" for r in sorted(records,
                                                                                        key=lambda r: r.key_start)))


def _record(history: StreamHistory, identifier: int) -> SegmentRecord:
    record = history.segment(identifier)
    if record is None:
        raise InternalError(f"segment {identifier} of a validated cut is unknown")
    return record


def is_at_or_after(history: StreamHistory, cut: Cut, other: Cut) -> bool:
    """Whether ``cut`` is at or after ``other`` at every key (both valid cuts of ``history``)."""
    for identifier, offset in cut.items():
        record = _record(history, identifier)
        for other_identifier, other_offset in other.items():
            if other_identifier == identifier:
                if offset < other_offset:
                    return False
                continue
            other_record = _record(history, other_identifier)
            if overlaps(record, other_record) and record.creation_epoch < other_record.creation_epoch:
                return False
    return True


def segments_before(history: StreamHistory, cut: Cut) -> list[SegmentRecord]:
    """The retained segments wholly before ``cut`` (a valid cut)."""
    in_cut = [_record(history, identifier) for identifier in cut]
    return [s for s in history.segments() if s.segment_id not in cut
            and any(overlaps(s, c) and c.creation_epoch > s.creation_epoch for c in in_cut)]


def cut_size(history: StreamHistory, cut: Cut, sealed_lengths: Mapping[int, int]) -> int:
    """Bytes of the retained stream up to ``cut``.  A segment before the cut whose length is unknown
    (its seal is not recorded yet) counts as empty."""
    before = sum(sealed_lengths.get(s.segment_id, 0) for s in segments_before(history, cut))
    return before + sum(cut.values())


def _after_or_at(history: StreamHistory, record: SegmentRecord, cut: Cut) -> bool:
    """Whether ``record`` is not before ``cut`` (it is in it, or every overlapping cut segment was
    created earlier)."""
    for identifier in cut:
        if identifier == record.segment_id:
            return True
        other = _record(history, identifier)
        if overlaps(other, record) and other.creation_epoch > record.creation_epoch:
            return False
    return True


def _before_or_at(history: StreamHistory, record: SegmentRecord, cut: Cut) -> bool:
    for identifier in cut:
        if identifier == record.segment_id:
            return True
        other = _record(history, identifier)
        if overlaps(other, record) and other.creation_epoch < record.creation_epoch:
            return False
    return True


def segments_between(history: StreamHistory, from_cut: Cut, to_cut: Cut | None,
                     sealed_lengths: Mapping[int, int]) -> list[Slice]:
    """Every segment with bytes between ``from_cut`` and ``to_cut`` (None: no end), ordered by
    creation epoch then key: a segment of ``from_cut`` starts at its offset there (others at 0), a
    segment of ``to_cut`` ends at its offset there, a sealed segment at its length, an active one
    unbounded (-1).  Raises ``InvalidStreamCutError`` if ``to_cut`` lies before ``from_cut``."""
    if to_cut is not None and not is_at_or_after(history, to_cut, from_cut):
        raise InvalidStreamCutError("the end cut lies before the start cut")
    chosen = [s for s in history.segments()
              if _after_or_at(history, s, from_cut) and (to_cut is None or _before_or_at(history, s, to_cut))]
    ids = {s.segment_id for s in chosen}
    slices = []
    for segment in chosen:
        identifier = segment.segment_id
        if to_cut is not None and identifier in to_cut:
            end = to_cut[identifier]
        elif history.is_current(identifier):
            end = -1
        else:
            end = sealed_lengths.get(identifier, -1)
        predecessors = tuple(sorted(p.segment_id for p in history.predecessors(identifier) if p.segment_id in ids))
        slices.append(Slice(segment, from_cut.get(identifier, 0), end, predecessors))
    return slices


def lower_bound(history: StreamHistory, cuts: Iterable[Cut], sealed_lengths: Mapping[int, int]) -> dict[int, int]:
    """A valid cut at or before every one of ``cuts`` (valid cuts of ``history``), as high as this
    simple construction finds (see the module docstring)."""
    # Candidates: (segment, offset) pairs; at every key the lowest candidate owning it wins.
    candidates: dict[int, int] = {}
    for cut in cuts:
        for identifier, offset in cut.items():
            candidates[identifier] = min(offset, candidates.get(identifier, offset))
    if not candidates:
        raise InternalError("the lower bound of no cuts")
    for _ in range(len(history.epochs) * 4 + 4):  # every round lowers a segment to an earlier epoch
        records = {i: _record(history, i) for i in candidates}
        bounds = sorted({b for r in records.values() for b in (r.key_start, r.key_end)})
        chosen_on: dict[int, list[tuple[float, float]]] = {}
        for start, end in itertools.pairwise(bounds):
            owners = [r for r in records.values() if r.key_start <= start and end <= r.key_end]
            if not owners:
                raise InternalError(f"no candidate owns [{start}, {end})")
            lowest = min(owners, key=lambda r: (r.creation_epoch, candidates[r.segment_id]))
            chosen_on.setdefault(lowest.segment_id, []).append((start, end))
        partial = [i for i, pieces in chosen_on.items()
                   if pieces[0][0] != records[i].key_start or pieces[-1][1] != records[i].key_end
                   or any(a[1] != b[0] for a, b in itertools.pairwise(pieces))]
        if not partial:
            result = {i: candidates[i] for i in chosen_on}
            if not check_cover((records[i].key_start, records[i].key_end) for i in result):
                raise InternalError(f"the lower bound {result} is not a cut")
            return result
        for identifier in partial:
            predecessors = history.predecessors(identifier)
            if not predecessors:
                raise InternalError(f"segment {identifier} of the first retained epoch cannot be partial")
            for predecessor in predecessors:
                # Just before the segment: its predecessor at its end (an unknown end counts as 0,
                # which is lower still -- a lower bound stays a lower bound).
                offset = sealed_lengths.get(predecessor.segment_id, 0)
                candidates[predecessor.segment_id] = min(offset, candidates.get(predecessor.segment_id, offset))
    raise InternalError("the lower bound of the cuts did not settle")
