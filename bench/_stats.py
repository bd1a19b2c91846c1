"""Latency samples and their summaries; medians across repeats."""

from __future__ import annotations

import array
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

__all__ = ["LATENCY_SAMPLES_MAX", "Latency", "LatencySamples", "median_or_none", "percentile"]

#: Latency samples one measurement keeps (8 bytes each: 32 MiB).  A bounded buffer, not a reservoir:
#: at the default durations no scenario comes near it, and the summary says when one did.
LATENCY_SAMPLES_MAX: Final = 4_000_000


class LatencySamples:
    """Latencies in seconds, kept in a compact array up to ``limit``; further samples are counted only."""

    __slots__ = ("_limit", "dropped", "values")

    def __init__(self, limit: int = LATENCY_SAMPLES_MAX) -> None:
        self.values = array.array("d")
        self._limit = limit
        self.dropped = 0

    def add(self, seconds: float) -> None:
        if len(self.values) < self._limit:
            self.values.append(seconds)
        else:
            self.dropped += 1

    def summary(self) -> Latency:
        return Latency.of(self.values, dropped=self.dropped)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least ``fraction`` of samples at or
    below it (so p99 of 100 samples is the 99th, and is always a latency that really happened)."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@attrs.frozen
class Latency:
    """A latency distribution in milliseconds (None where there were no samples)."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None
    dropped: int = 0  # samples beyond LATENCY_SAMPLES_MAX, not in the percentiles

    @classmethod
    def of(cls, seconds: Iterable[float], *, dropped: int = 0) -> Latency:
        ordered = sorted(seconds)
        if not ordered:
            return cls(count=0, p50_ms=None, p95_ms=None, p99_ms=None, max_ms=None, mean_ms=None, dropped=dropped)
        return cls(
            count=len(ordered),
            p50_ms=1e3 * percentile(ordered, 0.50),
            p95_ms=1e3 * percentile(ordered, 0.95),
            p99_ms=1e3 * percentile(ordered, 0.99),
            max_ms=1e3 * ordered[-1],
            mean_ms=1e3 * math.fsum(ordered) / len(ordered),
            dropped=dropped,
        )


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that exist (a scenario with no samples in some repeat still has one)."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None
