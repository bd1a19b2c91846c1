"""Auto-scaling decisions: moving-average rates per segment, and what to split or merge (pure).

Theory of operation (after Pravega's segment-store statistics and controller auto-scale task).  The
segment store counts each segment's appended bytes and events per block; on every controller tick
(5 s) the counts since the last tick become a sample ``amount / elapsed`` that is folded into four
exponentially weighted moving averages, over 2, 5, 10 and 20 minutes, each with weight
``1 - exp(-elapsed / window)``; the first sample sets all four, and a segment without appends gets
samples of 0, so a silent segment cools down too.  Events are counted in events/s, data in KiB/s;
which one matters is the stream's scaling policy.

A segment's *signal* (``scale_signal``), given the policy's target rate and the segment's age (time
since the controller started measuring it -- its creation, or the controller's start):

* nothing during the first ``cooldown`` (10 min): the averages have not settled;
* HOT when the 2-minute average exceeds 5 x target, or the 5-minute one 2 x target, or the
  10-minute one the target -- it wants ``max(2, int(rate / target))`` parts, where rate is the
  highest of the three;
* COLD when, after 20 minutes, the 2-, 5- and 10-minute averages are below the target and the
  20-minute one below half of it.

The gap between "above target" and "below half of the target" is the hysteresis that keeps a steady
rate near the target from oscillating: a segment split because it carried 1.5 x target leaves
children at 0.75 x target each, neither hot nor cold.

``plan_auto_scale`` turns the signals of one stream's current epoch into at most one scale: every
HOT segment splits into ``min(max(2, wanted), max(2, scale_factor))`` equal parts, and runs of
adjacent COLD segments merge -- as long as the stream keeps at least ``min_segments`` segments and a
merged segment's combined rate stays below the target (so it is not hot the moment it exists).  The
controller adds a per-stream *mute* after each auto-scale, and new segments start their cooldown, so
one burst does not cause a cascade.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from millstream import limits
from millstream.controller._epochs import SegmentRecord, split_range
from millstream.values import ScalingPolicy

__all__ = ["WINDOWS_SECONDS", "AutoScalePlan", "ScaleSignal", "SegmentRates", "Signal", "fold_sample",
           "plan_auto_scale", "scale_signal"]

#: The averaging windows, in seconds.
WINDOWS_SECONDS: Final = tuple(60.0 * minutes for minutes in limits.AUTO_SCALE_WINDOWS_MINUTES)
_KIB: Final = 1024.0


@attrs.frozen
class SegmentRates:
    """One segment's moving averages: events/s and KiB/s over each window of ``WINDOWS_SECONDS``.
    ``since``: when measuring began; ``updated``: the time of the last sample; ``sampled``: whether
    any sample has been folded in (the first one sets the averages)."""

    since: float
    updated: float
    events: tuple[float, ...] = (0.0,) * len(WINDOWS_SECONDS)
    kib: tuple[float, ...] = (0.0,) * len(WINDOWS_SECONDS)
    sampled: bool = False

    @classmethod
    def start(cls, now: float) -> SegmentRates:
        return cls(now, now)

    def for_policy(self, policy: ScalingPolicy) -> tuple[float, ...]:
        return self.kib if policy.kind == "by_data_rate" else self.events


def _fold(averages: tuple[float, ...], sample: float, elapsed: float) -> tuple[float, ...]:
    return tuple(average + (1.0 - math.exp(-elapsed / window)) * (sample - average)
                 for average, window in zip(averages, WINDOWS_SECONDS, strict=True))


def fold_sample(rates: SegmentRates, size: int, events: int, now: float) -> SegmentRates:
    """``rates`` after ``size`` bytes and ``events`` events appended since ``rates.updated``.  A
    sample over no time (``now`` not after the last one) changes nothing."""
    elapsed = now - rates.updated
    if elapsed <= 0:
        return rates
    event_rate, kib_rate = events / elapsed, size / _KIB / elapsed
    if not rates.sampled:
        count = len(WINDOWS_SECONDS)
        return SegmentRates(rates.since, now, (event_rate,) * count, (kib_rate,) * count, True)
    return SegmentRates(rates.since, now, _fold(rates.events, event_rate, elapsed), _fold(rates.kib, kib_rate, elapsed),
                        True)


class ScaleSignal(enum.Enum):
    NONE = "none"
    HOT = "hot"
    COLD = "cold"


@attrs.frozen
class Signal:
    """A segment's signal; ``parts`` (HOT) how many parts it wants; ``rate`` its highest short-window
    average (in the policy's unit)."""

    kind: ScaleSignal
    parts: int = 0
    rate: float = 0.0


_NONE: Final = Signal(ScaleSignal.NONE)


def scale_signal(rates: SegmentRates, policy: ScalingPolicy, now: float, *,
                 cooldown_seconds: float = limits.AUTO_SCALE_COOLDOWN_SECONDS) -> Signal:
    """The signal of a segment measured by ``rates`` under ``policy`` (see the module docstring)."""
    if not policy.auto_scaling or not rates.sampled:
        return _NONE
    age = now - rates.since
    if age < cooldown_seconds:
        return _NONE
    target = policy.target_rate
    two, five, ten, twenty = rates.for_policy(policy)
    rate = max(two, five, ten)
    if (age >= WINDOWS_SECONDS[0] and two > 5 * target) or (age >= WINDOWS_SECONDS[1] and five > 2 * target) \
            or (age >= WINDOWS_SECONDS[2] and ten > target):
        return Signal(ScaleSignal.HOT, max(2, int(rate / target)), rate)
    if age >= WINDOWS_SECONDS[3] and two < target and five < target and ten < target and twenty < target / 2:
        return Signal(ScaleSignal.COLD, 0, rate)
    return Signal(ScaleSignal.NONE, 0, rate)


@attrs.frozen
class AutoScalePlan:
    """One scale: seal ``seal``, create segments owning ``new_ranges``."""

    seal: tuple[int, ...]
    new_ranges: tuple[tuple[float, float], ...]
    splits: int  # how many hot segments split
    merges: int  # how many runs of cold segments merge


def plan_auto_scale(segments: Sequence[SegmentRecord], signals: Mapping[int, Signal],
                    policy: ScalingPolicy) -> AutoScalePlan | None:
    """The scale the signals of one stream's current epoch (``segments``, in key order) ask for
    under ``policy``, or None (see the module docstring)."""
    if not policy.auto_scaling:
        return None
    seal: list[int] = []
    new_ranges: list[tuple[float, float]] = []
    count = len(segments)
    splits = merges = 0
    for segment in segments:
        signal = signals.get(segment.segment_id, _NONE)
        if signal.kind is not ScaleSignal.HOT:
            continue
        parts = min(max(2, signal.parts), max(2, policy.scale_factor),
                    limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX - count + 1)
        if parts < 2:
            continue
        seal.append(segment.segment_id)
        new_ranges.extend(split_range(segment.key_start, segment.key_end, parts))
        count += parts - 1
        splits += 1
    run: list[SegmentRecord] = []
    for candidate_segment in [*segments, None]:
        signal = _NONE if candidate_segment is None else signals.get(candidate_segment.segment_id, _NONE)
        if candidate_segment is not None and signal.kind is ScaleSignal.COLD \
                and candidate_segment.segment_id not in seal:
            run.append(candidate_segment)
            continue
        # A run of adjacent cold segments ends here: merge from its start while allowed.
        while len(run) >= 2 and count > policy.min_segments:
            taken = [run[0]]
            total = signals[run[0].segment_id].rate
            for candidate in run[1:]:
                rate = signals[candidate.segment_id].rate
                if count - len(taken) < policy.min_segments or total + rate >= policy.target_rate:
                    break
                taken.append(candidate)
                total += rate
            if len(taken) < 2:
                run = run[1:]
                continue
            seal.extend(s.segment_id for s in taken)
            new_ranges.append((taken[0].key_start, taken[-1].key_end))
            count -= len(taken) - 1
            merges += 1
            run = run[len(taken):]
        run = []
    if not seal:
        return None
    return AutoScalePlan(tuple(seal), tuple(new_ranges), splits, merges)
