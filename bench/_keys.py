"""Routing keys for a workload: the key table, a seeded sequence of keys, and each key's partition.

OpenMessaging Benchmark's RANDOM_NANO distribution picks, for every message, a key at random from a
table generated in advance (10,000 keys by default); the seed's workloads use it.  Here the table
is ``key-0 .. key-(N-1)`` and the sequence of picks is a fixed-length ring of indices drawn with
SplitMix64 from the workload's seed, so a run is replayable and picking a key costs a list slice,
not a random-number call per event (``reference/performance-baselines.md``: one microsecond per
event is the whole budget).  Event ``i`` of a step uses ring slot ``i mod RING_LENGTH``.

Peers have no routing of their own: their drivers send a keyed event to partition
``crc32(key) mod partitions`` (stable across processes, unlike the built-in ``hash``) and spread
unkeyed events round-robin.  millstream's writer routes keys itself.
"""

from __future__ import annotations

import zlib
from typing import Final

__all__ = ["RING_LENGTH", "KeySpace", "splitmix64"]

RING_LENGTH: Final = 1 << 16
_MASK64: Final = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: ``(output, next state)``; a deterministic 64-bit generator."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31), state


class KeySpace:
    """The keys of one workload (``None`` each, when it has no routing keys) and their partitions."""

    __slots__ = ("keyed", "partitions", "ring_keys", "ring_partitions")

    def __init__(self, *, keyed: bool, key_count: int, partitions: int, seed: int) -> None:
        if key_count < 1 or partitions < 1:
            raise ValueError("key_count and partitions must be at least 1")
        self.keyed = keyed
        self.partitions = partitions
        if keyed:
            keys = [f"key-{index}" for index in range(key_count)]
            key_partition = [zlib.crc32(key.encode()) % partitions for key in keys]
            state = seed & _MASK64
            picks = []
            for _ in range(RING_LENGTH):
                value, state = splitmix64(state)
                picks.append(value % key_count)
            self.ring_keys: list[str | None] = [keys[pick] for pick in picks]
            self.ring_partitions = [key_partition[pick] for pick in picks]
        else:
            self.ring_keys = [None] * RING_LENGTH
            self.ring_partitions = [slot % partitions for slot in range(RING_LENGTH)]

    def keys(self, first: int, count: int) -> list[str | None]:
        """The routing keys of events ``first .. first + count - 1`` of a step."""
        return _ring_slice(self.ring_keys, first, count)

    def partitions_of(self, first: int, count: int) -> list[int]:
        """The peer partitions of the same events."""
        return _ring_slice(self.ring_partitions, first, count)


def _ring_slice(ring: list, first: int, count: int) -> list:  # type: ignore[type-arg]
    if count > RING_LENGTH:
        raise ValueError(f"at most {RING_LENGTH} events at once, not {count}")
    start = first % RING_LENGTH
    end = start + count
    return ring[start:end] if end <= RING_LENGTH else ring[start:] + ring[: end - RING_LENGTH]
