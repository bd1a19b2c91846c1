"""Auto-scaling decisions (pure): the moving averages, each segment's signal, and the scale planned."""

from __future__ import annotations

import math

import pytest

from millstream.client import ScalingPolicy
from millstream.controller import (
    ScaleSignal,
    SegmentRates,
    Signal,
    fold_sample,
    initial_epoch,
    plan_auto_scale,
    scale_signal,
)
from millstream.controller._autoscale import WINDOWS_SECONDS

POLICY = ScalingPolicy.by_event_rate(100, 4, min_segments=1)


def steady(rate_per_second: float, seconds: float, *, tick: float = 5.0, start: SegmentRates | None = None,
           size_per_event: int = 0) -> SegmentRates:
    """The rates after ``seconds`` of a steady ``rate_per_second``, sampled every ``tick``."""
    rates = start or SegmentRates.start(0.0)
    now = rates.updated
    for _ in range(round(seconds / tick)):
        now += tick
        events = round(rate_per_second * tick)
        rates = fold_sample(rates, events * size_per_event, events, now)
    return rates


def test_the_first_sample_sets_every_average_and_later_ones_decay_toward_the_sample() -> None:
    rates = fold_sample(SegmentRates.start(0.0), 10 * 1024, 50, 5.0)
    assert rates.sampled and rates.events == (10.0,) * 4 and rates.kib == (2.0,) * 4
    later = fold_sample(rates, 0, 0, 10.0)
    for average, window in zip(later.events, WINDOWS_SECONDS, strict=True):
        assert average == pytest.approx(10.0 * math.exp(-5.0 / window))
    assert later.events[0] < later.events[3], "the short window forgets first"
    assert fold_sample(later, 1, 1, 10.0) is later, "no time passed: nothing to fold"


def test_signals_wait_for_the_cooldown_then_follow_the_windows() -> None:
    hot = steady(300, 9 * 60)
    assert scale_signal(hot, POLICY, hot.updated).kind is ScaleSignal.NONE, "inside the 10-minute cooldown"
    hot = steady(300, 2 * 60, start=hot)
    signal = scale_signal(hot, POLICY, hot.updated)
    assert signal.kind is ScaleSignal.HOT and signal.parts == 3 and signal.rate == pytest.approx(300, rel=0.01)
    near = steady(90, 30 * 60)
    assert scale_signal(near, POLICY, near.updated).kind is ScaleSignal.NONE, "below target, above half: hold"
    cold = steady(30, 21 * 60)
    assert scale_signal(cold, POLICY, cold.updated).kind is ScaleSignal.COLD
    assert scale_signal(steady(30, 19 * 60), POLICY, 19 * 60).kind is ScaleSignal.NONE, "cold needs 20 minutes"
    assert scale_signal(cold, ScalingPolicy.fixed(2), cold.updated).kind is ScaleSignal.NONE


def test_data_rate_policies_use_kib_per_second() -> None:
    policy = ScalingPolicy.by_data_rate(100, 2)  # 100 KiB/s
    rates = steady(10, 21 * 60, size_per_event=20 * 1024)  # 10 events/s of 20 KiB = 200 KiB/s
    assert scale_signal(rates, policy, rates.updated).kind is ScaleSignal.HOT
    assert scale_signal(rates, ScalingPolicy.by_event_rate(100, 2), rates.updated).kind is ScaleSignal.COLD


def test_a_hot_segment_splits_into_parts_bounded_by_the_scale_factor() -> None:
    epoch = initial_epoch(2, 0.0)
    first, second = epoch.segments
    plan = plan_auto_scale(epoch.segments, {first.segment_id: Signal(ScaleSignal.HOT, 9, 900.0)}, POLICY)
    assert plan is not None and plan.seal == (first.segment_id,) and len(plan.new_ranges) == 4  # factor 4
    assert plan.new_ranges[0][0] == first.key_start and plan.new_ranges[-1][1] == first.key_end
    small_factor = ScalingPolicy.by_event_rate(100, 1)
    plan = plan_auto_scale(epoch.segments, {second.segment_id: Signal(ScaleSignal.HOT, 9, 900.0)}, small_factor)
    assert plan is not None and len(plan.new_ranges) == 2, "max(2, scale_factor)"


def test_cold_neighbours_merge_but_never_below_min_segments_nor_into_a_hot_one() -> None:
    epoch = initial_epoch(4, 0.0)
    cold = {s.segment_id: Signal(ScaleSignal.COLD, 0, 10.0) for s in epoch.segments}
    plan = plan_auto_scale(epoch.segments, cold, ScalingPolicy.by_event_rate(100, 2, min_segments=1))
    assert plan is not None and plan.new_ranges == ((0.0, 1.0),) and len(plan.seal) == 4
    plan = plan_auto_scale(epoch.segments, cold, ScalingPolicy.by_event_rate(100, 2, min_segments=3))
    assert plan is not None and len(plan.seal) == 2 and len(plan.new_ranges) == 1, "4 - 1 = 3 segments left"
    assert plan_auto_scale(epoch.segments, cold, ScalingPolicy.by_event_rate(100, 2, min_segments=4)) is None
    warm = {s.segment_id: Signal(ScaleSignal.COLD, 0, 45.0) for s in epoch.segments}
    plan = plan_auto_scale(epoch.segments, warm, ScalingPolicy.by_event_rate(100, 2))
    assert plan is not None and len(plan.new_ranges) == 2, "45 + 45 < 100, but 3 x 45 would be hot at once"
    # Not adjacent: nothing merges.
    apart = {epoch.segments[0].segment_id: Signal(ScaleSignal.COLD, 0, 1.0),
             epoch.segments[2].segment_id: Signal(ScaleSignal.COLD, 0, 1.0)}
    assert plan_auto_scale(epoch.segments, apart, POLICY) is None


def test_no_plan_without_signals_or_for_a_fixed_policy() -> None:
    epoch = initial_epoch(2, 0.0)
    assert plan_auto_scale(epoch.segments, {}, POLICY) is None
    hot = {epoch.segments[0].segment_id: Signal(ScaleSignal.HOT, 3, 300.0)}
    assert plan_auto_scale(epoch.segments, hot, ScalingPolicy.fixed(2)) is None
