"""Stream cuts (pure): validity, order, the segments between two cuts, sizes and lower bounds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.controller import (
    StreamHistory,
    cut_size,
    initial_epoch,
    is_at_or_after,
    lower_bound,
    next_epoch,
    segments_before,
    segments_between,
    split_range,
    validate_cut,
)
from millstream.errors import InvalidStreamCutError
from tests.controller.strategies import SEALED_LENGTH, advancing_cuts, histories, sealed_lengths


def split_then_merge() -> tuple[StreamHistory, list[int]]:
    """epoch 0: 0=[0,.5) 1=[.5,1); epoch 1: 0 split into a, b; epoch 2: b and 1 merged into c."""
    e0 = initial_epoch(2, 0.0)
    e1, (a, b) = next_epoch(e0, [0], split_range(0.0, 0.5, 2), 2, 1.0)
    e2, (c,) = next_epoch(e1, [b.segment_id, 1], [(0.25, 1.0)], 4, 2.0)
    return StreamHistory([e0, e1, e2]), [0, 1, a.segment_id, b.segment_id, c.segment_id]


def test_validate_cut_names_what_is_wrong() -> None:
    history, (s0, s1, a, b, c) = split_then_merge()
    lengths = {s0: 10, s1: 20, b: 5}
    validate_cut(history, {s0: 10, s1: 20}, lengths=lengths)
    validate_cut(history, {a: 3, b: 5, s1: 7}, lengths=lengths)
    validate_cut(history, {a: 3, c: 0}, lengths=lengths)
    with pytest.raises(InvalidStreamCutError, match="not a segment of this stream"):
        validate_cut(history, {s0: 0, 99: 0}, lengths=lengths)
    with pytest.raises(InvalidStreamCutError, match="exactly once"):
        validate_cut(history, {s0: 0}, lengths=lengths)  # [.5, 1) uncovered
    with pytest.raises(InvalidStreamCutError, match="exactly once"):
        validate_cut(history, {s0: 0, a: 0, s1: 0}, lengths=lengths)  # [0, .25) twice
    with pytest.raises(InvalidStreamCutError, match="beyond the end"):
        validate_cut(history, {s0: 11, s1: 0}, lengths=lengths)
    with pytest.raises(InvalidStreamCutError, match="non-negative"):
        validate_cut(history, {s0: -1, s1: 0}, lengths=lengths)
    with pytest.raises(InvalidStreamCutError, match="at least one"):
        validate_cut(history, {}, lengths=lengths)


def test_order_before_between_and_size_on_a_split_and_a_merge() -> None:
    history, (s0, s1, a, b, c) = split_then_merge()
    lengths = {s0: 10, s1: 20, b: 5}
    head, middle, tail = {s0: 0, s1: 0}, {a: 2, b: 5, s1: 20}, {a: 4, c: 9}
    assert is_at_or_after(history, middle, head) and is_at_or_after(history, tail, middle)
    assert not is_at_or_after(history, head, middle)
    assert is_at_or_after(history, head, head)
    assert not is_at_or_after(history, {a: 1, b: 5, s1: 20}, middle), "an offset went back"
    assert {s.segment_id for s in segments_before(history, tail)} == {s0, s1, b}
    assert cut_size(history, head, lengths) == 0
    assert cut_size(history, middle, lengths) == 10 + 2 + 5 + 20
    assert cut_size(history, tail, lengths) == 10 + 20 + 5 + 4 + 9
    slices = {s.segment.segment_id: s for s in segments_between(history, middle, tail, lengths)}
    assert set(slices) == {a, b, s1, c}
    assert (slices[a].start_offset, slices[a].end_offset) == (2, 4)
    assert (slices[b].start_offset, slices[b].end_offset) == (5, 5)
    assert (slices[c].start_offset, slices[c].end_offset, slices[c].predecessors) == (0, 9, (s1, b))
    unbounded = {s.segment.segment_id: s for s in segments_between(history, head, None, lengths)}
    assert set(unbounded) == {s0, s1, a, b, c}
    assert unbounded[c].end_offset == -1 and unbounded[s0].end_offset == 10 and unbounded[a].predecessors == (s0,)
    with pytest.raises(InvalidStreamCutError, match="before the start"):
        segments_between(history, tail, middle, lengths)


def test_lower_bound_steps_back_to_predecessors_where_a_segment_is_only_partly_lowest() -> None:
    # epoch 0: q=[0,.5) s=[.5,1); epoch 1: both merged into p=[0,1); epoch 2: p split into l, r.
    e0 = initial_epoch(2, 0.0)
    q, s = (x.segment_id for x in e0.segments)
    e1, (p,) = next_epoch(e0, [q, s], [(0.0, 1.0)], 2, 1.0)
    e2, (left, right) = next_epoch(e1, [p.segment_id], split_range(0.0, 1.0, 2), 3, 2.0)
    history = StreamHistory([e0, e1, e2])
    lengths = {q: 10, s: 20, p.segment_id: 30}
    one, other = {p.segment_id: 5}, {q: 3, right.segment_id: 2}
    # Key by key the lowest is q@3 on [0, .5) and p@5 on [.5, 1): p only partly.  So p steps back
    # to its predecessors at their ends, and s@20 (before p) is the bound on the right.
    bound = lower_bound(history, [one, other], lengths)
    assert bound == {q: 3, s: 20}
    validate_cut(history, bound, lengths=lengths)
    assert is_at_or_after(history, one, bound) and is_at_or_after(history, other, bound)
    # Comparable cuts: the lower one is the bound itself.
    assert lower_bound(history, [{left.segment_id: 1, right.segment_id: 1}, one], lengths) == one


@given(st.data())
def test_drawn_cuts_are_valid_and_ordered_and_their_lower_bound_is_below_each(data: st.DataObject) -> None:
    history = data.draw(histories())
    lengths = sealed_lengths(history)
    cuts = data.draw(advancing_cuts(history))
    for cut in cuts:
        validate_cut(history, cut, lengths=lengths)
    for earlier, later in itertools.pairwise(cuts):
        assert is_at_or_after(history, later, earlier)
        assert cut_size(history, later, lengths) >= cut_size(history, earlier, lengths)
        between = segments_between(history, earlier, later, lengths)
        ids = {s.segment.segment_id for s in between}
        assert set(earlier) <= ids and set(later) <= ids
        for piece in between:
            assert set(piece.predecessors) <= ids
            assert piece.end_offset == -1 or piece.start_offset <= piece.end_offset
    # Cuts drawn independently (two readers progressing differently): their lower bound.
    others = data.draw(advancing_cuts(history, count=2))
    group = [cuts[-1], others[-1], cuts[0]]
    bound = lower_bound(history, group, lengths)
    validate_cut(history, bound, lengths=lengths)
    for cut in group:
        assert is_at_or_after(history, cut, bound)
    assert all(0 <= offset <= SEALED_LENGTH for offset in bound.values())
