"""A small fixed stream topology for the pure tests of ``ReaderGroupState``: stream ``s/a`` split and
merged across three epochs, and stream ``s/b`` of one segment.

    s/a epoch 0:  A0 [0, .5)        A1 [.5, 1)
        epoch 1:  A2 [0, .25)  A3 [.25, .5)   (A0 split; A1 stays)
        epoch 2:  A2 [0, .25)  A4 [.25, 1)    (A3 and A1 merged)
    s/b epoch 0:  B0 [0, 1)

A0, A1 and A3 are sealed with the lengths in ``LENGTHS``; A2, A4 and B0 are active (a reader may
read them up to ``ACTIVE_LENGTH``, they never complete).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from millstream.client import ReaderGroupConfig
from millstream.naming import segment_id, stream_segment_name

__all__ = ["A0", "A1", "A2", "A3", "A4", "ACTIVE_LENGTH", "B0", "CONFIG", "LENGTHS", "RANGES", "START", "covers",
           "predecessors", "successors"]


def _name(stream: str, epoch: int, number: int) -> str:
    return stream_segment_name("s", stream, segment_id(epoch, number))


A0, A1 = _name("a", 0, 0), _name("a", 0, 1)
A2, A3 = _name("a", 1, 2), _name("a", 1, 3)
A4 = _name("a", 2, 4)
B0 = _name("b", 0, 0)

RANGES: dict[str, tuple[float, float]] = {
    A0: (0.0, 0.5), A1: (0.5, 1.0), A2: (0.0, 0.25), A3: (0.25, 0.5), A4: (0.25, 1.0), B0: (0.0, 1.0)}
LENGTHS: dict[str, int] = {A0: 4, A1: 3, A3: 2}  # sealed segments and their lengths (in events)
ACTIVE_LENGTH = 5
_SUCCESSORS: dict[str, dict[str, frozenset[str]]] = {
    A0: {A2: frozenset({A0}), A3: frozenset({A0})},
    A1: {A4: frozenset({A1, A3})},
    A3: {A4: frozenset({A1, A3})},
}

CONFIG = ReaderGroupConfig(["s/a", "s/b"], automatic_checkpoint_seconds=0)
START: dict[str, int] = {A0: 0, A1: 0, B0: 0}


def successors(segment: str) -> dict[str, frozenset[str]]:
    return dict(_SUCCESSORS.get(segment, {}))


def predecessors(segment: str) -> frozenset[str]:
    return frozenset(p for p, following in _SUCCESSORS.items() if segment in following)


def length(segment: str) -> int:
    return LENGTHS.get(segment, ACTIVE_LENGTH)


def covers(positions: Iterable[str] | Mapping[str, int]) -> bool:
    """Whether the segments cover [0, 1) exactly once in each stream they belong to (and every
    stream of ``CONFIG`` has some)."""
    by_stream: dict[str, list[tuple[float, float]]] = {}
    for segment in positions:
        by_stream.setdefault(segment.rsplit("/", 1)[0], []).append(RANGES[segment])
    if set(by_stream) != {"s/a", "s/b"}:
        return False
    for ranges in by_stream.values():
        ranges.sort()
        point = 0.0
        for low, high in ranges:
            if low != point:
                return False
            point = high
        if point != 1.0:
            return False
    return True
