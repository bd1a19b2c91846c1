"""``StreamRouter``: keys go to the segment whose range holds their hash; a sealed segment's range is
patched with its successors (and only that range); bad successors change nothing; the memo is
bounded and never outlives a change of the view.  The property test scales a stream at random and
tells the router about seals in a random order, lazily, as a writer meets them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.client import SegmentWithRange, StreamRouter, routing_key_fraction
from millstream.errors import InvalidArgumentError, ProtocolError
from millstream.naming import segment_id

KEYS = [f"key-{i}" for i in range(2000)]


def seg(epoch: int, number: int, low: float, high: float) -> SegmentWithRange:
    identifier = segment_id(epoch, number)
    return SegmentWithRange(identifier, low, high, f"s/t/{number}.#epoch.{epoch}")


def owner(segments: list[SegmentWithRange], key: str) -> str:
    fraction = routing_key_fraction(key)
    (found,) = [s.name for s in segments if s.key_start <= fraction < s.key_end]
    return found


def test_keys_go_to_the_segment_whose_range_holds_their_hash() -> None:
    segments = [seg(0, 0, 0.0, 0.3), seg(0, 1, 0.3, 0.31), seg(0, 2, 0.31, 1.0)]
    router = StreamRouter(reversed(segments))  # any order: sorted by range
    for key in KEYS:
        assert router.segment_for(key) == owner(segments, key)
        assert router.segment_for(key) == owner(segments, key)  # from the memo, the same
    router.check_invariants()
    assert router.epoch == 0 and [s.name for s in router.segments()] == [s.name for s in segments]


def test_a_split_patches_only_the_sealed_range_and_forgets_the_memo() -> None:
    a, b = seg(0, 0, 0.0, 0.5), seg(0, 1, 0.5, 1.0)
    router = StreamRouter([a, b])
    before = {key: router.segment_for(key) for key in KEYS}
    left, right = seg(1, 2, 0.0, 0.25), seg(1, 3, 0.25, 0.5)
    taken = router.replace(a, [right, left])
    assert {name: [(r.key_start, r.key_end) for r in parts] for name, parts in taken.items()} == {
        left.name: [(0.0, 0.25)], right.name: [(0.25, 0.5)]}
    assert router.epoch == 1 and not router.routes_to(a.name) and router.routes_to(b.name)
    for key in KEYS:
        expected = owner([left, right, b], key)
        assert router.segment_for(key) == expected
        if before[key] == b.name:
            assert expected == b.name, "keys of segments that were not sealed stay where they were"
    router.check_invariants()


def test_a_merge_is_learned_one_predecessor_at_a_time() -> None:
    a, b, c = seg(0, 0, 0.0, 1 / 3), seg(0, 1, 1 / 3, 2 / 3), seg(0, 2, 2 / 3, 1.0)
    router = StreamRouter([a, b, c])
    merged = seg(1, 3, 0.0, 2 / 3)
    router.replace(b, [merged])  # the writer met b's seal first; a's keys still go to a
    assert [(r.key_start, r.key_end, r.segment.name) for r in router.ranges] == [
        (0.0, 1 / 3, a.name), (1 / 3, 2 / 3, merged.name), (2 / 3, 1.0, c.name)]
    for key in KEYS:
        expected = a.name if routing_key_fraction(key) < 1 / 3 else owner([merged, c], key)
        assert router.segment_for(key) == expected
    router.replace(a, [merged])
    assert [(r.key_start, r.key_end, r.segment.name) for r in router.ranges] == [
        (0.0, 2 / 3, merged.name), (2 / 3, 1.0, c.name)], "neighbours routed to one segment coalesce"
    router.check_invariants()


def test_successors_that_do_not_cover_the_sealed_range_change_nothing() -> None:
    a, b = seg(0, 0, 0.0, 0.5), seg(0, 1, 0.5, 1.0)
    router = StreamRouter([a, b])
    ranges = router.ranges
    with pytest.raises(ProtocolError):
        router.replace(a, [seg(1, 2, 0.0, 0.2), seg(1, 3, 0.3, 0.5)])  # a gap
    with pytest.raises(ProtocolError):
        router.replace(a, [])
    with pytest.raises(ProtocolError):
        router.replace(a, [seg(1, 2, 0.6, 0.9)])  # elsewhere
    assert router.ranges == ranges and router.routes_to(a.name)
    with pytest.raises(ProtocolError):
        StreamRouter([seg(0, 0, 0.0, 0.5), seg(0, 1, 0.6, 1.0)])
    with pytest.raises(InvalidArgumentError):
        StreamRouter([])


def test_keyless_events_cycle_over_the_distinct_segments() -> None:
    a, b, c = seg(0, 0, 0.0, 1 / 3), seg(0, 1, 1 / 3, 2 / 3), seg(0, 2, 2 / 3, 1.0)
    router = StreamRouter([a, b, c])
    merged = seg(1, 3, 0.0, 1.0)
    router.replace(a, [merged])
    router.replace(c, [merged])  # merged now holds two ranges apart, around b
    assert len(router.ranges) == 3
    picks = [router.segment_for(None) for _ in range(600)]
    assert {name: picks.count(name) for name in set(picks)} == {merged.name: 300, b.name: 300}


def test_the_memo_is_bounded_and_keys_are_checked() -> None:
    segments = [seg(0, n, n / 4, (n + 1) / 4 if n < 3 else 1.0) for n in range(4)]
    router = StreamRouter(segments, memo_size_max=8)
    for key in KEYS[:100]:
        assert router.segment_for(key) == owner(segments, key)
        assert len(router._memo) <= 8
    router.check_invariants()
    with pytest.raises(InvalidArgumentError):
        router.segment_for(17)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        router.segment_for(["a list"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        router.segment_for_fraction(1.0)


# --- A stream scaled at random; seals learned lazily, in any order ---------------------------------


@st.composite
def scalings(draw: st.DrawFn) -> tuple[list[list[SegmentWithRange]], list[int]]:
    """A history of epochs (splits into 2-3 parts, merges of 2-3 neighbours) and an order in which a
    writer might meet the seals."""
    number = itertools.count()
    epochs = [[seg(0, next(number), 0.0, 0.5), seg(0, next(number), 0.5, 1.0)]]
    for epoch in range(1, draw(st.integers(1, 8)) + 1):
        current = epochs[-1]
        if len(current) > 1 and draw(st.booleans()):
            width = draw(st.integers(2, min(3, len(current))))
            start = draw(st.integers(0, len(current) - width))
            group = current[start:start + width]
            new = [seg(epoch, next(number), group[0].key_start, group[-1].key_end)]
            kept = current[:start] + current[start + width:]
        else:
            index = draw(st.integers(0, len(current) - 1))
            victim = current[index]
            parts = draw(st.integers(2, 3))
            bounds = [victim.key_start + (victim.key_end - victim.key_start) * i / parts for i in range(parts)]
            bounds.append(victim.key_end)
            new = [seg(epoch, next(number), low, high) for low, high in itertools.pairwise(bounds)]
            kept = current[:index] + current[index + 1:]
        epochs.append(sorted(kept + new, key=lambda s: s.key_start))
    order = draw(st.randoms(use_true_random=False))
    return epochs, [order.randrange(10_000) for _ in range(60)]


def successors_of(epochs: list[list[SegmentWithRange]], sealed: SegmentWithRange) -> list[SegmentWithRange]:
    last = max(i for i, epoch in enumerate(epochs) if sealed in epoch)
    return [s for s in epochs[last + 1] if s not in epochs[last]
            and s.key_start < sealed.key_end and sealed.key_start < s.key_end]


@given(scalings())
def test_a_router_told_of_seals_in_any_order_ends_on_the_current_epoch(
        case: tuple[list[list[SegmentWithRange]], list[int]]) -> None:
    epochs, choices = case
    current = epochs[-1]
    router = StreamRouter(epochs[0])
    sample = KEYS[:100]
    chains = {key: [owner(epoch, key) for epoch in epochs] for key in sample}
    for choice in choices:
        stale = [s for s in router.segments() if s not in current]
        if not stale:
            break
        sealed = stale[choice % len(stale)]
        router.replace(sealed, successors_of(epochs, sealed))
        router.check_invariants()
        for key in sample:  # always a segment on the key's own chain of successors, never a stranger
            assert router.segment_for(key) in chains[key], (key, router.segment_for(key), chains[key])
    assert not [s for s in router.segments() if s not in current], "every seal learned"
    for key in sample:
        assert router.segment_for(key) == chains[key][-1]
    assert router.epoch == max(s.epoch for s in current)
