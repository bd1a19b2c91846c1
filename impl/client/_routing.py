"""Routing: which segment an event goes to.

Theory of operation.  A routing key is hashed onto the unit interval [0, 1) exactly as Pravega does
(murmur3 x64 128-bit, seed 1741865571, over the key's UTF-16-LE code units; the first 64 bits'
top 52 bits below the sign become the fraction), so the same key lands on the same point in every
process, Python version and machine -- never the built-in ``hash``, which is randomized per process.
Each segment of a writer owns a slice of [0, 1): ``KeySpaceRouter`` gives ``n`` segments equal
slices, in the order given, as a stream's first epoch does; the stream layer supplies routers that
follow a stream's epochs and key ranges.  Events with the same key go to the same segment, in order.
Events without a key carry no order promise and are spread evenly, round robin.

Hashing a key costs more than everything else the writer does for an event, so a router remembers
the segment of recent keys (a bounded memo that empties when full).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final, Protocol

import mmh3
from millstream import limits
from millstream.errors import InvalidArgumentError

__all__ = ["KeySpaceRouter", "Router", "routing_key_fraction"]

#: Pravega's seed for routing keys ("EventRouter".hashCode()); part of the key -> segment contract.
_ROUTING_SEED: Final = 1741865571
_MANTISSA_MASK: Final = (1 << 52) - 1
_MANTISSA_SCALE: Final = float(1 << 52)


def routing_key_fraction(routing_key: str) -> float:
    """The point in [0, 1) that ``routing_key`` hashes to (stable across processes and versions)."""
    if not isinstance(routing_key, str):
        raise InvalidArgumentError(f"a routing key is a str, not {type(routing_key).__name__}")
    try:
        encoded = routing_key.encode("utf-16-le", "surrogatepass")
    except UnicodeEncodeError as error:  # pragma: no cover - surrogatepass admits every str
        raise InvalidArgumentError(f"routing key {routing_key!r} cannot be encoded: {error}") from None
    high = mmh3.hash64(encoded, _ROUTING_SEED, True)[0]
    return ((high >> 12) & _MANTISSA_MASK) / _MANTISSA_SCALE


class Router(Protocol):
    """Chooses the segment for each event.  Called once per event: keep it to a few plain operations."""

    def segment_for(self, routing_key: str | None) -> str:
        """The segment an event with ``routing_key`` (None: no key) goes to now."""
        ...


class KeySpaceRouter:
    """``segments`` split [0, 1) into equal slices: segment ``i`` owns [i/n, (i+1)/n)."""

    __slots__ = ("_count", "_memo", "_memo_max", "_next", "_segments", "_single")

    def __init__(self, segments: Sequence[str], *,
                 memo_size_max: int = limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX) -> None:
        if isinstance(segments, str) or not segments:
            raise InvalidArgumentError("a writer needs a non-empty list of segment names")
        names = list(segments)
        for name in names:
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"segment names are non-empty strings, not {name!r}")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"segment names must be distinct: {names}")
        self._segments: tuple[str, ...] = tuple(names)
        self._count = len(names)
        self._single = names[0] if len(names) == 1 else None
        self._next = itertools.cycle(names).__next__
        self._memo: dict[str, str] = {}
        self._memo_max = memo_size_max

    @property
    def segments(self) -> tuple[str, ...]:
        return self._segments

    def segment_for(self, routing_key: str | None) -> str:
        single = self._single
        if single is not None:
            if routing_key is not None and not isinstance(routing_key, str):
                raise InvalidArgumentError(f"a routing key is a str or None, not {type(routing_key).__name__}")
            return single
        if routing_key is None:
            return self._next()
        segment = self._memo.get(routing_key)
        if segment is None:
            segment = self._segments[int(routing_key_fraction(routing_key) * self._count)]
            if len(self._memo) >= self._memo_max:
                self._memo.clear()
            self._memo[routing_key] = segment
        return segment

    def segment_for_fraction(self, fraction: float) -> str:
        """The segment that owns the point ``fraction`` of [0, 1)."""
        if not 0.0 <= fraction < 1.0:
            raise InvalidArgumentError(f"a key-space point lies in [0, 1), not {fraction}")
        return self._segments[int(fraction * self._count)]
