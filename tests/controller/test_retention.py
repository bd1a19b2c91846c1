"""Retention (pure): which cut size-, time- and consumption-based policies truncate at."""

from __future__ import annotations

from millstream.client import RetentionPolicy
from millstream.controller import RecordedCut, StreamHistory, choose_truncation, initial_epoch

HISTORY = StreamHistory([initial_epoch(2, 0.0)])
HEAD = {0: 0, 1: 0}
RECORDED = [RecordedCut(60.0, {0: 100, 1: 100}), RecordedCut(120.0, {0: 200, 1: 200}),
            RecordedCut(180.0, {0: 300, 1: 300})]
TAIL = {0: 400, 1: 400}


def choose(policy: RetentionPolicy, *, head: dict[int, int] = HEAD, now: float = 200.0,
           subscribers: list[dict[int, int] | None] | None = None) -> dict[int, int] | None:
    return choose_truncation(policy, history=HISTORY, head=head, tail=TAIL, recorded=RECORDED, sealed_lengths={},
                             now=now, subscriber_cuts=subscribers or [])


def test_none_keeps_everything() -> None:
    assert choose(RetentionPolicy.none()) is None


def test_time_keeps_at_least_the_limit() -> None:
    assert choose(RetentionPolicy.by_time(75), now=200.0) == {0: 200, 1: 200}  # recorded at 120 <= 125
    assert choose(RetentionPolicy.by_time(150), now=200.0) is None  # nothing recorded at or before 50
    assert choose(RetentionPolicy.by_time(10), now=200.0, head={0: 300, 1: 300}) is None, "never back, never in place"


def test_size_keeps_at_least_the_limit_in_bytes() -> None:
    # The tail holds 800 bytes; the cut at 120 leaves 400, the one at 180 leaves 200.
    assert choose(RetentionPolicy.by_size(300)) == {0: 200, 1: 200}
    assert choose(RetentionPolicy.by_size(200)) == {0: 300, 1: 300}
    assert choose(RetentionPolicy.by_size(10_000)) is None


def test_consumption_truncates_at_the_lowest_subscriber_and_waits_for_silent_ones() -> None:
    policy = RetentionPolicy.consumption()
    assert choose(policy) is None, "no subscribers"
    assert choose(policy, subscribers=[{0: 50, 1: 70}, {0: 90, 1: 20}]) == {0: 50, 1: 20}
    assert choose(policy, subscribers=[{0: 50, 1: 70}, None]) is None, "a subscriber has not reported yet"
    assert choose(policy, subscribers=[{0: 0, 1: 0}]) is None, "at the head already"
    assert choose(policy, subscribers=[{0: 5, 99: 1}]) is None, "a cut of segments long gone is ignored"
