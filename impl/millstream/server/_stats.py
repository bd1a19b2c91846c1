"""Per-segment append statistics, measured where appends arrive, for auto-scaling.

Theory of operation.  Auto-scaling needs each segment's event rate and data rate.  The server counts,
per segment, the bytes and events of every append block it accepts -- one dictionary update per
*block*, never per event (the block's event count is known already: the connection checked it) --
and the controller drains the counts on its tick (``drain``, every ``limits.CONTROLLER_TICK_SECONDS``)
and folds them into its moving averages.  Counting happens when a block is accepted, so it measures
the load writers offer (a block re-sent after a reconnect counts again: it was offered again).
"""

from __future__ import annotations

from millstream import limits

__all__ = ["SegmentStatistics"]


class SegmentStatistics:
    """Bytes and events appended per segment since the last ``drain``."""

    __slots__ = ("_counts", "_segments_max", "dropped_blocks")

    def __init__(self, segments_max: int = limits.STATISTICS_SEGMENTS_MAX) -> None:
        self._counts: dict[str, list[int]] = {}
        self._segments_max = segments_max
        #: Blocks not counted because too many segments were tracked already (evidence for tests).
        self.dropped_blocks = 0

    def record(self, segment: str, size: int, events: int) -> None:
        """One accepted block of ``events`` events, ``size`` bytes, to ``segment``."""
        counts = self._counts.get(segment)
        if counts is None:
            if len(self._counts) >= self._segments_max:
                self.dropped_blocks += 1
                return
            self._counts[segment] = [size, events]
            return
        counts[0] += size
        counts[1] += events

    def drain(self) -> dict[str, tuple[int, int]]:
        """Per segment, ``(bytes, events)`` since the last drain; the counts start again from zero."""
        counts, self._counts = self._counts, {}
        return {segment: (size, events) for segment, (size, events) in counts.items()}

    def check_invariants(self) -> None:
        assert len(self._counts) <= self._segments_max
        assert all(size >= 0 and events >= 0 for size, events in self._counts.values())
