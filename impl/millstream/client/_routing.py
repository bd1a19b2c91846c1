"""Routing: which segment an event goes to.

Theory of operation.  A routing key is hashed onto the unit interval [0, 1) exactly as Pravega does
(murmur3 x64 128-bit, seed 1741865571, over the key's UTF-16-LE code units; the first 64 bits'
top 52 bits below the sign become the fraction), so the same key lands on the same point in every
process, Python version and machine -- never the built-in ``hash``, which is randomized per process.
Each segment of a writer owns a slice of [0, 1): ``KeySpaceRouter`` gives ``n`` segments equal
slices, in the order given, as a stream's first epoch does; ``StreamRouter`` follows a stream's key
ranges as they change with scaling.  Events with the same key go to the same segment, in order.
Events without a key carry no order promise and are spread evenly, round robin.

Hashing a key costs more than everything else the writer does for an event, so a router remembers
the segment of recent keys (a bounded memo that empties when full).  The writer looks a key up in
the memo itself (``memo``: one ``dict.get``, in C) and calls ``segment_for`` only when that misses --
for a new key, a keyless event, or a router without a memo.  While a router's view has a single
segment (``single_segment``; a stream's first epoch is often one), the writer asks neither: every
``str`` key and every keyless event goes there (other keys still go to ``segment_for``, which
refuses them).  That skips the memo's cache miss on one of thousands of keys and the router call of
a keyless event: 1 segment, 100 B events, writer CPU 2.53 -> 2.10 us per event with 10,000 keys and
2.41 -> 2.07 without.

``StreamRouter``'s view of a stream.  It starts from the segments of the stream's current epoch and
changes only when the writer learns that one of them was sealed: ``replace`` puts the sealed
segment's successors in its place, each owning the part of the sealed segment's range that it
covers.  The view is therefore patched range by range rather than swapped for the controller's
newest epoch as a whole, and that is deliberate: a segment the writer still holds unacknowledged
events for must keep its keys until those events have moved on (the stream writer moves them in the
same step as ``replace``), or newer events for its keys could overtake them.  After a merge of
``A`` and ``B`` into ``C`` the view may for a while route ``A``'s keys to ``C`` and ``B``'s keys to
``B`` -- the next append to ``B`` meets its seal and patches that range too.  Every ``replace``
empties the memo, so a key is hashed once per change of the view.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Final, Protocol

import mmh3

from millstream import limits
from millstream.errors import InternalError, InvalidArgumentError, ProtocolError
from millstream.values import SegmentWithRange

__all__ = ["KeySpaceRouter", "Router", "RoutedRange", "StreamRouter", "routing_key_fraction"]

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

    @property
    def single_segment(self) -> str | None:
        """The one segment, if there is only one (every event goes there)."""
        return self._single

    @property
    def memo(self) -> dict[str, str]:
        """Keys routed so far -> their segment (the writer looks keys up here itself, in C, before
        calling ``segment_for``; it never changes what the memo holds)."""
        return self._memo

    def segment_for(self, routing_key: str | None) -> str:
        if routing_key is None:
            single = self._single
            return single if single is not None else self._next()
        segment = self._memo.get(routing_key)
        if segment is None:
            single = self._single
            if single is not None:  # no hashing: but the key must be one
                if not isinstance(routing_key, str):
                    raise InvalidArgumentError(f"a routing key is a str or None, not {type(routing_key).__name__}")
                segment = single
            else:
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


class RoutedRange:
    """A part of the key space, [``key_start``, ``key_end``), and the segment it is routed to (whose
    own range contains it: after a merge a successor may own more than one predecessor's part)."""

    __slots__ = ("key_end", "key_start", "segment")

    def __init__(self, key_start: float, key_end: float, segment: SegmentWithRange) -> None:
        self.key_start = key_start
        self.key_end = key_end
        self.segment = segment

    def __repr__(self) -> str:
        return f"RoutedRange({self.key_start!r}, {self.key_end!r}, {self.segment.name!r})"


class StreamRouter:
    """Routes by a stream's key ranges: the segments of its current epoch to begin with, patched by
    ``replace`` as the writer learns of seals (see the module docstring).

    ``segment_for`` runs on the writer's per-event path, from any thread; ``replace`` is called with
    the writer's lock held, so the two never interleave badly (``segment_for`` reads attributes that
    ``replace`` swaps whole, never mutates in place)."""

    __slots__ = ("_by_name", "_epoch", "_memo", "_memo_max", "_next", "_ranges", "_single", "_table")

    def __init__(self, segments: Iterable[SegmentWithRange], *,
                 memo_size_max: int = limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX) -> None:
        ordered = sorted(segments, key=lambda s: s.key_start)
        if not ordered:
            raise InvalidArgumentError("a stream router needs the segments of an epoch")
        self._memo: dict[str, str] = {}
        self._memo_max = memo_size_max
        self._install([RoutedRange(s.key_start, s.key_end, s) for s in ordered])

    def _install(self, ranges: list[RoutedRange]) -> None:
        """Adopt ``ranges`` (sorted, contiguous, covering [0, 1) -- checked), coalescing neighbours
        routed to the same segment, and forget every remembered key."""
        merged: list[RoutedRange] = []
        for part in ranges:
            if merged and merged[-1].segment.segment_id == part.segment.segment_id:
                merged[-1] = RoutedRange(merged[-1].key_start, part.key_end, part.segment)
            else:
                merged.append(part)
        if merged[0].key_start != 0.0 or merged[-1].key_end != 1.0 or any(
                a.key_end != b.key_start for a, b in itertools.pairwise(merged)) or any(
                not r.key_start < r.key_end for r in merged):
            raise ProtocolError(f"the stream's segments do not cover the key space [0, 1) exactly: {merged}")
        by_name = {r.segment.name: r.segment for r in merged}
        # A thread on the per-event path may read the view while it changes, so the view is replaced
        # whole, never mutated: ``_table`` is one snapshot (range ends, their segments, the memo of keys
        # routed by exactly those ranges), so a key routed by an old snapshot is remembered only in the
        # old snapshot's memo.  (An event routed by a stale snapshot reaches a segment writer that was
        # retired with the change, which sends it back to be routed again.)
        memo: dict[str, str] = {}
        # One segment owns every key: keys need no hashing (they are still remembered, so the writer's
        # own lookup finds them).
        self._single: str | None = merged[0].segment.name if len(merged) == 1 else None
        self._ranges: tuple[RoutedRange, ...] = tuple(merged)
        self._by_name: dict[str, SegmentWithRange] = by_name
        self._epoch = max(s.epoch for s in by_name.values())
        self._next = itertools.cycle(tuple(by_name)).__next__
        self._table: tuple[list[float], tuple[str, ...], dict[str, str], str | None] = (
            [r.key_end for r in merged], tuple(r.segment.name for r in merged), memo, self._single)
        self._memo = memo

    # --- The per-event path ------------------------------------------------------------------------

    def segment_for(self, routing_key: str | None) -> str:
        if routing_key is None:
            single = self._single
            return single if single is not None else self._next()
        try:
            segment = self._memo.get(routing_key)
        except TypeError:  # an unhashable key: free on the normal path (3.11's exceptions cost nothing)
            raise InvalidArgumentError(
                f"a routing key is a str or None, not {type(routing_key).__name__}") from None
        if segment is None:
            segment = self._route(routing_key)
        return segment

    def _route(self, routing_key: str) -> str:
        """A key not in the memo: hash it, look its range up, remember it."""
        ends, names, memo, single = self._table
        if single is not None:  # one segment owns every key: no hashing (but the key must be one)
            if not isinstance(routing_key, str):
                raise InvalidArgumentError(f"a routing key is a str or None, not {type(routing_key).__name__}")
            segment = single
        else:
            segment = names[bisect.bisect_right(ends, routing_key_fraction(routing_key))]
        if len(memo) >= self._memo_max:
            memo.clear()
        memo[routing_key] = segment
        return segment

    # --- The view ----------------------------------------------------------------------------------

    @property
    def memo(self) -> dict[str, str]:
        """The current view's remembered keys -> their segment.  A new dict with every change of the
        view (so a lookup in an old one can only give an old view's answer, never a wrong mix)."""
        return self._memo

    @property
    def epoch(self) -> int:
        """The newest epoch among the segments routed to."""
        return self._epoch

    @property
    def single_segment(self) -> str | None:
        """The one segment the current view routes to, if it has only one (every key goes there)."""
        return self._single

    @property
    def ranges(self) -> tuple[RoutedRange, ...]:
        return self._ranges

    def segments(self) -> list[SegmentWithRange]:
        """The distinct segments routed to, in key order."""
        return list(self._by_name.values())

    def routes_to(self, segment: str) -> bool:
        """Whether some key is routed to ``segment`` now."""
        return segment in self._by_name

    def segment_named(self, segment: str) -> SegmentWithRange | None:
        return self._by_name.get(segment)

    def segment_for_fraction(self, fraction: float) -> SegmentWithRange:
        """The segment that owns the point ``fraction`` of [0, 1)."""
        if not 0.0 <= fraction < 1.0:
            raise InvalidArgumentError(f"a key-space point lies in [0, 1), not {fraction}")
        return self._ranges[bisect.bisect_right(self._table[0], fraction)].segment

    def replace(self, sealed: SegmentWithRange, successors: Sequence[SegmentWithRange]) -> dict[str, list[RoutedRange]]:
        """Route ``sealed``'s keys to ``successors``: each takes the part of ``sealed``'s ranges that
        its own range covers.  Returns the new ranges by successor name.  Raises ``ProtocolError`` if
        the successors do not cover exactly what ``sealed`` had (the controller promises they do)."""
        if sealed.name not in self._by_name:
            raise InternalError(f"{sealed.name!r} is not routed to; nothing to replace")
        ordered = sorted(successors, key=lambda s: s.key_start)
        ranges: list[RoutedRange] = []
        taken: dict[str, list[RoutedRange]] = {}
        for part in self._ranges:
            if part.segment.segment_id != sealed.segment_id:
                ranges.append(part)
                continue
            pieces = [RoutedRange(max(part.key_start, s.key_start), min(part.key_end, s.key_end), s)
                      for s in ordered if s.key_start < part.key_end and part.key_start < s.key_end]
            if not pieces or pieces[0].key_start != part.key_start or pieces[-1].key_end != part.key_end or any(
                    a.key_end != b.key_start for a, b in itertools.pairwise(pieces)):
                raise ProtocolError(f"the successors of {sealed.name!r} ({[s.name for s in ordered]}) do not "
                                    f"cover its keys [{part.key_start}, {part.key_end})")
            for piece in pieces:
                taken.setdefault(piece.segment.name, []).append(piece)
            ranges.extend(pieces)
        self._install(ranges)
        return taken

    def check_invariants(self) -> None:
        """The ranges are sorted, contiguous and cover [0, 1); every remembered key maps to the
        segment its hash falls in now."""
        ranges = self._ranges
        assert ranges[0].key_start == 0.0 and ranges[-1].key_end == 1.0
        for a, b in itertools.pairwise(ranges):
            assert a.key_end == b.key_start, (a, b)
            assert a.segment.segment_id != b.segment.segment_id, (a, b)
        for part in ranges:
            assert part.segment.key_start <= part.key_start < part.key_end <= part.segment.key_end, part
        ends, names, memo, single = self._table
        assert memo is self._memo and single == self._single == (names[0] if len(names) == 1 else None)
        assert ends == [r.key_end for r in ranges] and names == tuple(r.segment.name for r in ranges)
        assert set(names) == set(self._by_name)
        assert len(self._memo) <= self._memo_max
        for key, segment in list(self._memo.items())[:64]:  # a sample: the memo may be large
            assert self.segment_for_fraction(routing_key_fraction(key)).name == segment, (key, segment)
