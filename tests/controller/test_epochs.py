"""Key ranges, epochs and a stream's history (pure): scale validation, successors, predecessors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.controller import (
    EpochRecord,
    SegmentRecord,
    StreamHistory,
    check_cover,
    initial_epoch,
    key_union,
    next_epoch,
    split_range,
    validate_scale,
)
from millstream.errors import InternalError, InvalidArgumentError, InvalidScaleError
from millstream.naming import segment_id


def test_split_range_shares_bounds_and_ends_exactly() -> None:
    parts = split_range(0.25, 0.5, 3)
    assert parts[0][0] == 0.25 and parts[-1][1] == 0.5
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    assert check_cover([(0.0, 0.25), *parts, (0.5, 1.0)])
    assert split_range(0.0, 1.0, 1) == [(0.0, 1.0)]
    with pytest.raises(InternalError):
        split_range(0.5, 0.5, 2)


def test_key_union_merges_contiguous_ranges_and_refuses_overlaps() -> None:
    assert key_union([(0.5, 1.0), (0.0, 0.25), (0.25, 0.5)]) == [(0.0, 1.0)]
    assert key_union([(0.0, 0.25), (0.5, 1.0)]) == [(0.0, 0.25), (0.5, 1.0)]
    with pytest.raises(InvalidArgumentError, match="overlap"):
        key_union([(0.0, 0.6), (0.5, 1.0)])
    assert not check_cover([(0.0, 0.5)]) and not check_cover([(0.0, 0.6), (0.5, 1.0)])


def test_initial_epoch_covers_the_key_space() -> None:
    epoch = initial_epoch(3, 10.0)
    assert [s.segment_id for s in epoch.segments] == [0, 1, 2]
    assert epoch.segments[0].key_start == 0.0 and epoch.segments[-1].key_end == 1.0
    assert check_cover((s.key_start, s.key_end) for s in epoch.segments)


@pytest.mark.parametrize(("seal", "ranges", "message"), [
    ([], [(0.0, 0.5)], "at least one segment"),
    ([7], [(0.0, 0.5)], "not in the stream's current epoch"),
    ([0, 0], [(0.0, 0.5)], "more than once"),
    ([0], [], "at least one segment"),
    ([0], [(0.0, 0.25)], "exactly the same keys"),  # a gap
    ([0], [(0.0, 0.3), (0.25, 0.5)], "overlap"),
    ([0], [(0.0, 0.25), (0.25, 0.75)], "exactly the same keys"),  # beyond the sealed range
    ([0], [(0.5, 0.25)], "empty"),
    ([0], [(-0.5, 0.5)], "leaves"),
    ([0, 1], [(0.0, 1.0)], None),  # a merge: fine
    ([0], [(0.0, 0.1), (0.1, 0.5)], None),  # an uneven split: fine
])
def test_validate_scale(seal: list[int], ranges: list[tuple[float, float]], message: str | None) -> None:
    current = initial_epoch(2, 0.0)
    if message is None:
        validate_scale(current, seal, ranges)
    else:
        with pytest.raises(InvalidScaleError, match=message):
            validate_scale(current, seal, ranges)


def test_next_epoch_numbers_new_segments_and_keeps_the_others() -> None:
    current = initial_epoch(2, 0.0)
    epoch, created = next_epoch(current, [0], [(0.25, 0.5), (0.0, 0.25)], 2, 5.0)
    assert epoch.epoch == 1 and epoch.creation_time == 5.0
    assert [s.segment_id for s in created] == [segment_id(1, 2), segment_id(1, 3)]
    assert created[0].key_start == 0.0  # numbered in key order
    assert [s.segment_id for s in epoch.segments] == [segment_id(1, 2), segment_id(1, 3), 1]


def test_history_successors_and_predecessors_across_a_split_and_a_merge() -> None:
    e0 = initial_epoch(2, 0.0)                                      # 0:[0,.5) 1:[.5,1)
    e1, (a, b) = next_epoch(e0, [0], split_range(0.0, 0.5, 2), 2, 1.0)   # a:[0,.25) b:[.25,.5)
    e2, (c,) = next_epoch(e1, [b.segment_id, 1], [(0.25, 1.0)], 4, 2.0)  # c:[.25,1) merges b and 1
    history = StreamHistory([e0, e1, e2])
    history.check_invariants()
    assert [s.segment_id for s in history.successors(0)] == [a.segment_id, b.segment_id]
    assert [s.segment_id for s in history.successors(1)] == [c.segment_id]
    assert [s.segment_id for s in history.successors(b.segment_id)] == [c.segment_id]
    assert {s.segment_id for s in history.predecessors(c.segment_id)} == {b.segment_id, 1}
    assert history.successors(a.segment_id) == [] and history.successors(c.segment_id) == []  # current
    assert history.predecessors(0) == []
    assert history.sealing_epoch(1) == 2 and history.sealing_epoch(a.segment_id) is None
    assert history.is_current(a.segment_id) and not history.is_current(b.segment_id)
    pruned = history.without_epochs_before(1)
    pruned.check_invariants()
    assert pruned.segment(0) is None and pruned.predecessors(a.segment_id) == []
    assert StreamHistory.from_json(history.to_json()).epochs == history.epochs


def test_history_refuses_gaps_between_epochs() -> None:
    with pytest.raises(InternalError):
        StreamHistory([initial_epoch(1, 0.0), EpochRecord(2, 0.0, (SegmentRecord(segment_id(2, 1), 0.0, 1.0),))])


@st.composite
def scale_sequences(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """(split|merge, position, parts) steps, resolved against the epoch they apply to."""
    return draw(st.lists(st.tuples(st.sampled_from(["split", "merge"]), st.integers(0, 30), st.integers(2, 4)),
                         max_size=12))


@settings(max_examples=150)
@given(st.integers(1, 4), scale_sequences())
def test_any_sequence_of_splits_and_merges_keeps_every_epoch_an_exact_cover(
        initial: int, steps: list[tuple[str, int, int]]) -> None:
    epochs = [initial_epoch(initial, 0.0)]
    next_number = initial
    for kind, position, parts in steps:
        current = epochs[-1]
        segments = current.segments
        if kind == "split":
            target = segments[position % len(segments)]
            seal, ranges = [target.segment_id], split_range(target.key_start, target.key_end, parts)
        else:
            if len(segments) < 2:
                continue
            first = position % (len(segments) - 1)
            chosen = segments[first:first + 2]
            seal, ranges = [s.segment_id for s in chosen], [(chosen[0].key_start, chosen[-1].key_end)]
        epoch, created = next_epoch(current, seal, ranges, next_number, float(len(epochs)))
        next_number += len(created)
        epochs.append(epoch)
    history = StreamHistory(epochs)
    history.check_invariants()
    for segment in history.segments():
        successors = history.successors(segment.segment_id)
        if successors:  # every successor's predecessors include it; successors stay inside its old keys' cover
            assert all(segment in history.predecessors(s.segment_id) for s in successors)
            assert any(s.key_start <= segment.key_start for s in successors)
            assert any(s.key_end >= segment.key_end for s in successors)
    ids = [s.segment_id for s in history.segments()]
    assert len(ids) == len(set(ids))
