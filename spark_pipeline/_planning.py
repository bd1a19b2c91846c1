"""Planning micro-batches over a stream that scales: where a batch ends, and its partitions (pure).

Theory of operation.  A batch is the data between two stream cuts, ``start`` (the previous batch's
end, from Spark's offset log) and ``end`` (what ``latestOffset`` chose, logged before the batch
runs).  ``partitions(start, end)`` is a pure function of the two: the stream manager's
``segments_between(start, end)`` (the controller's answer) lists every segment with bytes between
them and the offsets to read, one partition per non-empty slice (``ranges_between``).  Spark
re-runs a batch after a crash with the logged cuts, and the same cuts always give the same
partitions and the same events.

Per-key order across scaling is the planner's job (``plan_end``).  A routing key's events live in
one segment per epoch; when a segment is sealed its keys continue in its successors.  Two
partitions of one batch are read in parallel, so a batch must never hold events of a segment and
of its successor: the key's older events could then be read after its newer ones.  The planner
therefore moves the cut into successors only at a batch boundary -- a successor *enters* the cut
once each of its predecessors stands at its sealed end in ``start`` (and every successor of those
predecessors enters with it, so the cut still covers the key space once) -- and within the batch
advances only the segments of that expanded cut, each at most to its available end.  A predecessor
is read to its end in one batch and its successors from the next batch on: each key's events reach
Spark in order, batch after batch, and within a batch from one partition, in order.

Admission control (``Budget``): ``maxRowsPerBatch`` and ``maxBytesPerBatch`` are shared among the
segments with data, smallest first, so what a small segment does not use goes to the larger ones
("water-filling").  A cut always lies at an event boundary.  Counting events needs their bytes: the
caller's ``measure`` reads a range from its start and says where the last whole event within the
budget ends.  Reading every event of a large batch to count it cost the planner more than a
tenth of a second per batch, so with ``known`` -- the event boundaries the store keeps for each
segment without reading it (``AsyncSegments.event_boundaries``: one about every MiB of appends) --
a segment's share is placed instead (``_place``): a byte budget ends at the highest known boundary
within it; a row budget first reads a small sample (``limits.SPARK_PLAN_SAMPLE_BYTES``, counted by
``measure``), which answers exactly when the share or the range ends inside it, and otherwise gives
the mean size of the range's events, turning the rows into bytes (rows times the mean) that end at
the highest known boundary within them.  So a batch holds at most ``maxRowsPerBatch`` rows when the
events past each sample are on average no smaller than the sample's -- always for events of one
size -- and about that many otherwise; it never holds more bytes than ``maxBytesPerBatch``.  Only
where the store knows no boundary within a share is the share counted by reading, as without
``known``.  A batch takes at least one event when any is available, so a single event larger than
the byte budget does not stall the query.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from millstream import limits
from millstream.client import SegmentSlice, SegmentWithRange, StreamCut
from millstream.errors import InternalError

__all__ = ["Budget", "KnownBoundaries", "Measure", "SegmentRange", "SegmentView", "covers_key_space", "plan_end",
           "ranges_between", "views_of"]


@attrs.frozen
class SegmentRange:
    """The events of segment ``segment`` (qualified name; id ``segment_id`` of ``stream``) from
    ``start_offset`` (where an event starts) up to ``end_offset`` (where one ends), exclusive."""

    stream: str
    segment_id: int
    segment: str
    start_offset: int
    end_offset: int

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.start_offset <= self.end_offset:
            raise InternalError(f"a segment range from {self.start_offset} to {self.end_offset}")

    @property
    def length_bytes(self) -> int:
        return self.end_offset - self.start_offset


@attrs.frozen
class Budget:
    """How much one batch may take: events, bytes of events (their frames), or both; None: no bound."""

    max_rows: int | None = None
    max_bytes: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_rows is None and self.max_bytes is None


#: ``measure(range, max_events, max_bytes) -> (end_offset, events)``: read ``range`` from its start and
#: return where the last whole event ends such that at most ``max_events`` events and ``max_bytes``
#: bytes lie before it (None: no bound), and how many events that is.
Measure = Callable[[SegmentRange, "int | None", "int | None"], tuple[int, int]]


#: ``known(range, end_offset) -> offsets``: the event boundaries the store knows in ``[range.start_offset,
#: end_offset]`` of the range's segment, ascending, without reading it (``AsyncSegments.event_boundaries``).
KnownBoundaries = Callable[[SegmentRange, int], Sequence[int]]


@attrs.frozen
class SegmentView:
    """What the planner knows of one segment after ``start``: its key range, where reading it may
    end in this batch (``end``; equal to its offset in ``start`` when nothing may be read), its length
    if it is sealed (None while it is active or its length is unknown), and its predecessors that lie
    after ``start`` too."""

    segment: SegmentWithRange
    start_offset: int
    end: int
    sealed_length: int | None
    predecessors: frozenset[int]


def views_of(start: StreamCut, tail: StreamCut, bounded: Sequence[Sequence[SegmentSlice]]) -> dict[int, SegmentView]:
    """Combine ``segments_between(start, bound)`` for each bound of this batch: the first must be
    the stream's ``tail`` (what is written now), the others further bounds (the ``end`` option, the
    target of an available-now query).  A segment may be read only as far as every bound allows, and
    not at all if a bound lies before it."""
    if not bounded:
        raise InternalError("planning needs the slices up to the tail")
    by_bound = [{s.segment.segment_id: s for s in slices} for slices in bounded]
    views: dict[int, SegmentView] = {}
    for identifier, first in by_bound[0].items():
        if not all(identifier in other for other in by_bound[1:]):
            continue  # a bound lies before it
        ends = [other[identifier].end_offset for other in by_bound]
        known = [e for e in ends if e is not None]
        end = first.start_offset if len(known) < len(ends) else max(first.start_offset, min(known))
        sealed = first.end_offset if identifier not in tail.positions else None
        views[identifier] = SegmentView(first.segment, first.start_offset, end, sealed, first.predecessors)
    return views


def covers_key_space(segments: Sequence[SegmentWithRange]) -> bool:
    """Whether the key ranges cover [0, 1) exactly once."""
    position = 0.0
    for segment in sorted(segments, key=lambda s: s.key_start):
        if segment.key_start != position:
            return False
        position = segment.key_end
    return position == 1.0


def _expand(start: StreamCut, views: Mapping[int, SegmentView]) -> dict[int, int]:
    """``start`` with every segment that stands at its sealed end replaced by its successors (at
    their first offsets), as long as a whole set of successors can enter; see the module docstring."""
    cut = dict(start.positions)
    for identifier in cut:
        if identifier not in views:
            raise InternalError(f"segment {identifier} of the start cut is not among the segments after it")
    successors: dict[int, set[int]] = {}
    for identifier, view in views.items():
        for predecessor in view.predecessors:
            successors.setdefault(predecessor, set()).add(identifier)
    for _ in range(limits.SPARK_PLAN_SCALE_ROUNDS_MAX):
        ended = {s for s, offset in cut.items() if views[s].sealed_length == offset}
        candidates = {n for p in ended for n in successors.get(p, ())
                      if n not in cut and views[n].predecessors <= ended}
        removable = {p for p in ended if successors.get(p) and successors[p] <= candidates}
        entering = {n for n in candidates if views[n].predecessors <= removable}
        if not entering:
            return cut
        removed = set().union(*(views[n].predecessors for n in entering))
        cut = {s: o for s, o in cut.items() if s not in removed} | {n: views[n].start_offset for n in entering}
        if not covers_key_space([views[s].segment for s in cut]):
            raise InternalError(f"replacing {sorted(removed)} by {sorted(entering)} leaves a cut that does not "
                                f"cover the key space: {cut}")
    raise InternalError(f"more than {limits.SPARK_PLAN_SCALE_ROUNDS_MAX} rounds of successors in one batch")


def plan_end(start: StreamCut, views: Mapping[int, SegmentView], budget: Budget, measure: Measure,
             known: KnownBoundaries | None = None) -> StreamCut:
    """Where the batch after ``start`` ends: ``start`` itself when there is nothing to read, else a cut
    of the segments of ``start`` expanded into successors (see the module docstring), each advanced
    within ``budget`` and never beyond ``views``' ends.  With ``known``, shares are placed at known
    boundaries rather than counted (``_place``)."""
    frontier = _expand(start, views)
    available = {s: views[s].end - offset for s, offset in frontier.items() if views[s].end > offset}
    if not available:
        return start
    end = dict(frontier)
    if budget.unlimited:
        for identifier in available:
            end[identifier] = views[identifier].end
    else:
        rows_left, bytes_left = budget.max_rows, budget.max_bytes
        order = sorted(available, key=lambda s: (available[s], s))
        for index, identifier in enumerate(order):
            share = len(order) - index
            rows = None if rows_left is None else math.ceil(rows_left / share)
            size = None if bytes_left is None else math.ceil(bytes_left / share)
            span = _range(start.stream, views[identifier], frontier[identifier])
            if rows is None and size is not None and size >= span.length_bytes:
                offset, events = span.end_offset, -1  # all of it fits; no need to count
            elif rows == 0 or size == 0:
                continue
            elif known is not None:
                offset, events = _place(span, rows, size, measure, known)
                _check_measured(span, offset, events, rows)
            else:
                offset, events = measure(span, rows, size)
                _check_measured(span, offset, events, rows)
            end[identifier] = offset
            if rows_left is not None:
                rows_left -= events
            if bytes_left is not None:
                bytes_left -= offset - span.start_offset
        if end == frontier:
            # Not even one event fitted a share: take the first event of the first segment, so a
            # single event larger than the budget cannot stall the query.
            identifier = min(available)
            span = _range(start.stream, views[identifier], frontier[identifier])
            offset, events = measure(span, 1, None)
            _check_measured(span, offset, events, 1)
            if events != 1:
                raise InternalError(f"measuring one event of {span} found {events}")
            end[identifier] = offset
    if end == frontier:
        return start
    return StreamCut(start.stream, end)


def _place(span: SegmentRange, rows: int | None, size: int | None, measure: Measure,
           known: KnownBoundaries) -> tuple[int, int]:
    """Where a share of ``rows`` events and ``size`` bytes of ``span`` ends, and about how many events
    that is (exactly, if it was counted), counting only a sample (see the module docstring)."""
    limit = span.end_offset if size is None else min(span.end_offset, span.start_offset + size)
    sampled_end, sampled = span.start_offset, 0
    if rows is not None:
        sample = min(limits.SPARK_PLAN_SAMPLE_BYTES, limit - span.start_offset)
        sampled_end, sampled = measure(span, rows, sample)
        _check_measured(span, sampled_end, sampled, rows)
        if sampled == rows or sampled_end == span.end_offset:
            return sampled_end, sampled  # the share, or the range, ends within the sample: counted
        # Events no smaller than a sample without a whole one: at least the sample's size each.
        mean = (sampled_end - span.start_offset) / sampled if sampled else max(sample, 1)
        limit = min(limit, span.start_offset + math.floor(rows * mean))
    boundaries = [b for b in known(span, limit) if sampled_end < b <= limit]
    if not boundaries:  # none known past the sample within the share: count it, as without ``known``
        return measure(span, rows, limit - span.start_offset)
    offset = boundaries[-1]
    if rows is None:
        return offset, -1  # (not counted: only bytes are budgeted)
    estimate = sampled + math.floor((offset - sampled_end) / mean)
    return offset, min(estimate, rows)


def _range(stream: str, view: SegmentView, offset: int) -> SegmentRange:
    return SegmentRange(stream, view.segment.segment_id, view.segment.name, offset, view.end)


def _check_measured(span: SegmentRange, offset: int, events: int, rows: int | None) -> None:
    if not span.start_offset <= offset <= span.end_offset or (rows is not None and events > rows):
        raise InternalError(f"measuring {span} (at most {rows} events) answered offset {offset}, {events} events")


def ranges_between(stream: str, slices: Sequence[SegmentSlice]) -> list[SegmentRange]:
    """The partitions of the batch whose slices (``segments_between(start, end)``) are
    ``slices``: one range per slice with bytes, in the controller's order (epoch, then key)."""
    ranges = []
    for piece in slices:
        if piece.end_offset is None:
            raise InternalError(f"segment {piece.segment.segment_id} has no end between two cuts")
        if piece.end_offset > piece.start_offset:
            ranges.append(SegmentRange(stream, piece.segment.segment_id, piece.segment.name, piece.start_offset,
                                       piece.end_offset))
    return ranges
