"""Planning micro-batches (plain Python, milliseconds): where ``latestOffset`` ends a batch across a split
and a merge (successors enter only at a batch boundary, a whole set at a time), admission control that
shares a budget among segments at event boundaries, bounds that stop the query, and the partitions of a
batch as a pure function of its two cuts.  The controller's slices are written out by hand here; the
same planner runs against a real controller in ``test_source_protocol``."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from millstream import limits
from millstream.client import SegmentSlice, SegmentWithRange, StreamCut
from millstream.errors import InternalError
from millstream.naming import segment_id, stream_segment_name
from millstream.spark._planning import Budget, SegmentRange, plan_end, ranges_between, views_of

STREAM = "sc/st"
EVENT_BYTES = 10  # every event of these tests is a 10-byte frame


def segment(epoch: int, number: int, low: float, high: float) -> SegmentWithRange:
    identifier = segment_id(epoch, number)
    return SegmentWithRange(identifier, low, high, stream_segment_name("sc", "st", identifier))


S0 = segment(0, 0, 0.0, 1.0)
LOW, HIGH = segment(1, 1, 0.0, 0.5), segment(1, 2, 0.5, 1.0)  # the split of S0
MERGED = segment(2, 3, 0.0, 1.0)  # the merge of LOW and HIGH


def piece(seg: SegmentWithRange, start: int, end: int | None, *predecessors: SegmentWithRange) -> SegmentSlice:
    return SegmentSlice(seg, start, end, frozenset(p.segment_id for p in predecessors))


def cut(**positions: int) -> StreamCut:
    names = {"s0": S0, "low": LOW, "high": HIGH, "merged": MERGED}
    return StreamCut(STREAM, {names[k].segment_id: v for k, v in positions.items()})


class Measure:
    """A fake ``measure`` over 10-byte events; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None, int | None]] = []

    def __call__(self, span: SegmentRange, rows: int | None, size: int | None) -> tuple[int, int]:
        self.calls.append((span.segment_id, rows, size))
        events = span.length_bytes // EVENT_BYTES
        if rows is not None:
            events = min(events, rows)
        if size is not None:
            events = min(events, size // EVENT_BYTES)
        return span.start_offset + events * EVENT_BYTES, events


UNLIMITED = Budget()


def plan(start: StreamCut, tail: StreamCut, slices: Iterable[SegmentSlice], budget: Budget = UNLIMITED,
         *more_bounds: Iterable[SegmentSlice], measure: Measure | None = None) -> StreamCut:
    views = views_of(start, tail, [list(slices), *(list(b) for b in more_bounds)])
    return plan_end(start, views, budget, measure or Measure())


def test_without_scaling_a_batch_reads_to_the_tail() -> None:
    start = StreamCut(STREAM, {LOW.segment_id: 10, HIGH.segment_id: 0})
    tail = StreamCut(STREAM, {LOW.segment_id: 50, HIGH.segment_id: 20})
    slices = [piece(LOW, 10, 50), piece(HIGH, 0, 20)]
    assert plan(start, tail, slices) == tail
    assert plan(tail, tail, [piece(LOW, 50, 50), piece(HIGH, 20, 20)]) == tail, "no new data: the start itself"


def test_across_a_split_the_successors_enter_only_after_the_predecessor_ended() -> None:
    tail = cut(low=100, high=80)
    # Batch 1: S0 is read to its sealed end (300); its successors wait for the next batch.
    first = plan(cut(s0=100), tail, [piece(S0, 100, 300), piece(LOW, 0, 100, S0), piece(HIGH, 0, 80, S0)])
    assert first == cut(s0=300)
    # Batch 2: S0 stands at its end, so LOW and HIGH take its place.
    second = plan(first, tail, [piece(S0, 300, 300), piece(LOW, 0, 100, S0), piece(HIGH, 0, 80, S0)])
    assert second == tail
    # The partitions of each batch: never a segment and its successor in one batch.
    assert [r.segment_id for r in ranges_between(STREAM, [piece(S0, 100, 300)])] == [S0.segment_id]
    assert [(r.segment_id, r.start_offset, r.end_offset) for r in ranges_between(
        STREAM, [piece(S0, 300, 300), piece(LOW, 0, 100, S0), piece(HIGH, 0, 80, S0)])] == \
        [(LOW.segment_id, 0, 100), (HIGH.segment_id, 0, 80)], "the empty slice of S0 is no partition"


def test_successors_without_data_yet_are_no_new_batch() -> None:
    tail = cut(low=0, high=0)
    start = cut(s0=300)
    assert plan(start, tail, [piece(S0, 300, 300), piece(LOW, 0, 0, S0), piece(HIGH, 0, 0, S0)]) == start


def test_a_merge_waits_for_every_predecessor_to_end() -> None:
    tail = cut(merged=40)
    slices = [piece(LOW, 100, 100), piece(HIGH, 50, 80), piece(MERGED, 0, 40, LOW, HIGH)]
    first = plan(cut(low=100, high=50), tail, slices)
    assert first == cut(low=100, high=80), "LOW has ended, HIGH has not: MERGED may not enter yet"
    second = plan(first, tail, [piece(LOW, 100, 100), piece(HIGH, 80, 80), piece(MERGED, 0, 40, LOW, HIGH)])
    assert second == tail


def test_successors_enter_as_a_whole_set_or_not_at_all() -> None:
    # A and B are replaced by C (A's keys below 0.25) and D (the rest of A's and all of B's).
    a, b = segment(1, 1, 0.0, 0.5), segment(1, 2, 0.5, 1.0)
    c, d = segment(2, 3, 0.0, 0.25), segment(2, 4, 0.25, 1.0)
    tail = StreamCut(STREAM, {c.segment_id: 30, d.segment_id: 30})
    start = StreamCut(STREAM, {a.segment_id: 70, b.segment_id: 10})  # A ended (70), B did not (90)
    slices = [piece(a, 70, 70), piece(b, 10, 90), piece(c, 0, 30, a), piece(d, 0, 30, a, b)]
    end = plan(start, tail, slices)
    assert end == StreamCut(STREAM, {a.segment_id: 70, b.segment_id: 90}), "C alone would leave A's upper half"
    slices = [piece(a, 70, 70), piece(b, 90, 90), piece(c, 0, 30, a), piece(d, 0, 30, a, b)]
    assert plan(end, tail, slices) == tail


def test_a_chain_of_empty_successors_is_crossed_in_one_step() -> None:
    # S0 ended, was split into LOW/HIGH which were merged at once, empty, into MERGED, which has data.
    tail = cut(merged=50)
    slices = [piece(S0, 300, 300), piece(LOW, 0, 0, S0), piece(HIGH, 0, 0, S0), piece(MERGED, 0, 50, LOW, HIGH)]
    assert plan(cut(s0=300), tail, slices) == tail


def test_a_bound_before_the_successors_stops_the_query_at_the_predecessor() -> None:
    tail = cut(low=100, high=80)
    slices = [piece(S0, 100, 300), piece(LOW, 0, 100, S0), piece(HIGH, 0, 80, S0)]
    target = [piece(S0, 100, 250)]  # the available-now target (or the end option): {S0: 250}
    end = plan(cut(s0=100), tail, slices, Budget(), target)
    assert end == cut(s0=250)
    assert plan(end, tail, [piece(S0, 250, 300), piece(LOW, 0, 100, S0), piece(HIGH, 0, 80, S0)], Budget(),
                [piece(S0, 250, 250)]) == end, "at the target: no more batches"


def test_max_rows_are_shared_smallest_first() -> None:
    a, b, c = segment(0, 0, 0.0, 0.25), segment(0, 1, 0.25, 0.5), segment(0, 2, 0.5, 1.0)
    start = StreamCut(STREAM, {a.segment_id: 0, b.segment_id: 0, c.segment_id: 0})
    tail = StreamCut(STREAM, {a.segment_id: 100, b.segment_id: 500, c.segment_id: 1000})  # 10, 50, 100 events
    slices = [piece(a, 0, 100), piece(b, 0, 500), piece(c, 0, 1000)]
    measure = Measure()
    end = plan(start, tail, slices, Budget(max_rows=60), measure=measure)
    # a's share is 20 and it has 10; the 10 left over go to b and c, 25 each.
    assert end == StreamCut(STREAM, {a.segment_id: 100, b.segment_id: 250, c.segment_id: 250})
    assert measure.calls == [(a.segment_id, 20, None), (b.segment_id, 25, None), (c.segment_id, 25, None)]
    # A budget smaller than the number of segments: the first segments get one each, the rest wait.
    end = plan(start, tail, slices, Budget(max_rows=1))
    assert end == StreamCut(STREAM, {a.segment_id: 10, b.segment_id: 0, c.segment_id: 0})


def test_max_bytes_count_frames_and_read_only_what_does_not_fit_whole() -> None:
    a, b = segment(0, 0, 0.0, 0.5), segment(0, 1, 0.5, 1.0)
    start = StreamCut(STREAM, {a.segment_id: 0, b.segment_id: 30})
    tail = StreamCut(STREAM, {a.segment_id: 100, b.segment_id: 1030})
    measure = Measure()
    end = plan(start, tail, [piece(a, 0, 100), piece(b, 30, 1030)], Budget(max_bytes=605), measure=measure)
    assert end == StreamCut(STREAM, {a.segment_id: 100, b.segment_id: 530}), "a whole (100), b the other 505 -> 500"
    assert measure.calls == [(b.segment_id, None, 505)], "a fitted its share whole: nothing to read"
    both = plan(start, tail, [piece(a, 0, 100), piece(b, 30, 1030)], Budget(max_rows=5, max_bytes=605))
    assert both == StreamCut(STREAM, {a.segment_id: 30, b.segment_id: 50}), "the tighter of rows and bytes"


def test_an_event_larger_than_the_budget_still_makes_progress() -> None:
    start = cut(s0=0)
    end = plan(start, cut(s0=100), [piece(S0, 0, 100)], Budget(max_bytes=3))
    assert end == cut(s0=10), "one event, although it exceeds the byte budget"


def test_ranges_between_refuses_a_slice_without_an_end() -> None:
    with pytest.raises(InternalError, match="no end"):
        ranges_between(STREAM, [piece(S0, 0, None)])


def test_a_measure_that_breaks_its_contract_is_caught() -> None:
    def liar(span: SegmentRange, rows: int | None, size: int | None) -> tuple[int, int]:
        return span.end_offset + 1, 1

    views = views_of(cut(s0=0), cut(s0=100), [[piece(S0, 0, 100)]])
    with pytest.raises(InternalError, match="answered offset 101"):
        plan_end(cut(s0=0), views, Budget(max_rows=3), liar)


def test_a_start_segment_the_controller_did_not_list_is_an_internal_error() -> None:
    views = views_of(cut(low=0, high=0), cut(low=0, high=0), [[piece(LOW, 0, 0)]])
    with pytest.raises(InternalError, match="not among the segments"):
        plan_end(cut(low=0, high=0), views, Budget(), Measure())


class Known:
    """A fake ``known``: the store knows a boundary every ``spacing`` bytes (10-byte events) and each
    range's ends; records what it was asked."""

    def __init__(self, spacing: int) -> None:
        self.spacing = spacing
        self.calls: list[tuple[int, int]] = []

    def __call__(self, span: SegmentRange, end: int) -> list[int]:
        self.calls.append((span.segment_id, end))
        inner = range((span.start_offset // self.spacing + 1) * self.spacing, end + 1, self.spacing)
        return sorted({span.start_offset, *inner, *([span.end_offset] if span.end_offset <= end else [])})


def plan_known(start: StreamCut, tail: StreamCut, slices: Iterable[SegmentSlice], budget: Budget, measure: Measure,
               known: Known) -> StreamCut:
    return plan_end(start, views_of(start, tail, [list(slices)]), budget, measure, known)


def test_max_rows_are_placed_at_known_boundaries_reading_only_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: ``latestOffset`` read every event of a batch to count it.  With the store's known
    boundaries only a sample is read; events of one size keep the batch within the cap."""
    monkeypatch.setattr(limits, "SPARK_PLAN_SAMPLE_BYTES", 100)  # 10 events
    a, b = segment(0, 0, 0.0, 0.5), segment(0, 1, 0.5, 1.0)
    start = StreamCut(STREAM, {a.segment_id: 0, b.segment_id: 0})
    tail = StreamCut(STREAM, {a.segment_id: 100_000, b.segment_id: 100_000})  # 10,000 events each
    measure, known = Measure(), Known(spacing=1_000)
    end = plan_known(start, tail, [piece(a, 0, 100_000), piece(b, 0, 100_000)], Budget(max_rows=5_000),
                     measure, known)
    assert end == StreamCut(STREAM, {a.segment_id: 25_000, b.segment_id: 25_000}), "2,500 events each"
    assert measure.calls == [(a.segment_id, 2_500, 100), (b.segment_id, 2_500, 100)], "only the samples are read"
    assert known.calls == [(a.segment_id, 25_000), (b.segment_id, 25_000)]
    # Boundaries further apart: the share ends at the last one within it (fewer rows, never more).
    coarse = plan_known(start, tail, [piece(a, 0, 100_000), piece(b, 0, 100_000)], Budget(max_rows=5_000),
                        Measure(), Known(spacing=7_000))
    assert coarse == StreamCut(STREAM, {a.segment_id: 21_000, b.segment_id: 21_000 + 7_000}), \
        "a's 2,100 leave b a share of 2,900"


def test_a_share_counted_within_its_sample_or_without_a_known_boundary_is_exact(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SPARK_PLAN_SAMPLE_BYTES", 100)
    start, tail = cut(s0=0), cut(s0=100_000)
    measure, known = Measure(), Known(spacing=1_000)
    assert plan_known(start, tail, [piece(S0, 0, 100_000)], Budget(max_rows=7), measure, known) == cut(s0=70)
    assert known.calls == [], "the sample held the whole share"
    sparse = Measure()
    assert plan_known(start, tail, [piece(S0, 0, 100_000)], Budget(max_rows=50), sparse, Known(spacing=50_000)) \
        == cut(s0=500), "no boundary known within 500 bytes: counted"
    assert sparse.calls == [(S0.segment_id, 50, 100), (S0.segment_id, 50, 500)]


def test_max_bytes_end_at_the_last_known_boundary_within_them_without_reading() -> None:
    start, tail = cut(s0=0), cut(s0=100_000)
    measure = Measure()
    assert plan_known(start, tail, [piece(S0, 0, 100_000)], Budget(max_bytes=25_500), measure, Known(1_000)) \
        == cut(s0=25_000)
    assert measure.calls == [], "nothing read"
    assert plan_known(start, tail, [piece(S0, 0, 100_000)], Budget(max_bytes=505), measure, Known(1_000)) \
        == cut(s0=500), "no known boundary within the budget: counted"
    assert measure.calls == [(S0.segment_id, None, 505)]
