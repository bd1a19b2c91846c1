"""Dynamic batching: how long the OperationProcessor waits for more operations before writing.

The rule (seed ``segment-store-append-path.txt``; ``reference/pravega-behaviour.md`` §1.5)::

    delay = min(recent Tier-1 latency x (1 - recent frame fill ratio), cap)

Intuition: when recent frames were small, waiting about one Tier-1 round trip gathers more
operations into the next frame at no cost in throughput; when frames are full, waiting buys nothing.
With no write in flight the delay is zero -- nothing is gained by holding a lone operation back,
which keeps a single writer's latency at one Tier-1 write.  There is no user-visible knob.
"""

from __future__ import annotations

from collections import deque

__all__ = ["WriteStatistics", "batching_delay_seconds"]


def batching_delay_seconds(
    writes_in_flight: int, latency_seconds: float, fill_ratio: float, cap_seconds: float
) -> float:
    """The batching delay.

    pre: cap_seconds >= 0
    post: 0.0 <= __return__ <= cap_seconds
    post: __return__ <= max(0.0, latency_seconds)
    post: writes_in_flight > 0 or __return__ == 0.0
    """
    if writes_in_flight <= 0 or not latency_seconds > 0.0:  # written so that NaN means "no delay"
        return 0.0
    fill = 1.0 if fill_ratio > 1.0 else (fill_ratio if fill_ratio > 0.0 else 0.0)
    delay = latency_seconds * (1.0 - fill)
    if not delay > 0.0:  # zero, or NaN from an infinite latency times an empty share
        return 0.0
    return delay if delay < cap_seconds else cap_seconds


class WriteStatistics:
    """Latency and fill ratio of the last ``window`` Tier-1 writes (a moving average).

    Recording is one append per figure (it happens for every Tier-1 write); the averages are summed
    when asked for, which the processor does only while writes are in flight.  (Summing at most
    ``window`` floats in C is also exact where running sums would drift.)"""

    __slots__ = ("_fills", "_latencies")

    def __init__(self, window: int) -> None:
        self._latencies: deque[float] = deque(maxlen=window)
        self._fills: deque[float] = deque(maxlen=window)

    def record(self, latency_seconds: float, fill_ratio: float) -> None:
        self._latencies.append(latency_seconds)
        self._fills.append(fill_ratio)

    @property
    def latency_seconds(self) -> float:
        return sum(self._latencies) / len(self._latencies) if self._latencies else 0.0

    @property
    def fill_ratio(self) -> float:
        return sum(self._fills) / len(self._fills) if self._fills else 0.0
