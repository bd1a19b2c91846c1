"""Per-segment append statistics, measured where appends arrive, for auto-scaling.

Theory of operation.  Auto-scaling needs each segment's event rate and data rate.  The server counts,
per segment, the bytes and events of every append block it accepts -- one dictionary update per
*block*, never per event (the block's event count is known already: the connection checked it) --
and the controller drains the counts on its tick (``drain``, every ``limits.CONTROLLER_TICK_SECONDS``)
and folds them into its moving averages.  Counting happens when a block is accepted, so it measures
the load writers offer (a block re-sent after a reconnect counts again: it was offered again).

The node's metrics (``millstream.metrics``), when enabled (``enable_totals``), are a second consumer:
the same record also adds to counts that the metrics drain at each scrape (``drain_totals``), bounded
the same way, so neither consumer's drains disturb the other's counts.  ``ReadPositions`` remembers,
for the metrics' reader lag, where each connection's last read of each segment ended.
"""

from __future__ import annotations

from millstream import limits

__all__ = ["ReadPositions", "SegmentStatistics"]


class SegmentStatistics:
    """Bytes and events appended per segment since the last ``drain``."""

    __slots__ = ("_counts", "_segments_max", "_totals", "dropped_blocks")

    def __init__(self, segments_max: int = limits.STATISTICS_SEGMENTS_MAX) -> None:
        self._counts: dict[str, list[int]] = {}
        self._segments_max = segments_max
        #: Blocks not counted because too many segments were tracked already (evidence for tests).
        self.dropped_blocks = 0
        #: Per segment, ``[bytes, events, blocks]`` since the metrics last drained them (None: no metrics).
        self._totals: dict[str, list[int]] | None = None

    def enable_totals(self) -> None:
        """Count for ``drain_totals`` too, from now on (the node serves metrics)."""
        if self._totals is None:
            self._totals = {}

    def record(self, segment: str, size: int, events: int) -> None:
        """One accepted block of ``events`` events, ``size`` bytes, to ``segment``."""
        if self._totals is not None:
            self._record_total(segment, size, events)
        counts = self._counts.get(segment)
        if counts is None:
            if len(self._counts) >= self._segments_max:
                self.dropped_blocks += 1
                return
            self._counts[segment] = [size, events]
            return
        counts[0] += size
        counts[1] += events

    def _record_total(self, segment: str, size: int, events: int) -> None:
        assert self._totals is not None
        totals = self._totals.get(segment)
        if totals is None:
            if len(self._totals) >= self._segments_max:
                return  # (``dropped_blocks`` counts the statistics' own misses only)
            self._totals[segment] = [size, events, 1]
            return
        totals[0] += size
        totals[1] += events
        totals[2] += 1

    def drain_totals(self) -> dict[str, tuple[int, int, int]]:
        """Per segment, ``(bytes, events, blocks)`` since the last ``drain_totals`` (empty unless enabled)."""
        if not self._totals:
            return {}
        totals, self._totals = self._totals, {}
        return {segment: (size, events, blocks) for segment, (size, events, blocks) in totals.items()}

    def drain(self) -> dict[str, tuple[int, int]]:
        """Per segment, ``(bytes, events)`` since the last drain; the counts start again from zero."""
        counts, self._counts = self._counts, {}
        return {segment: (size, events) for segment, (size, events) in counts.items()}

    def check_invariants(self) -> None:
        assert len(self._counts) <= self._segments_max
        assert all(size >= 0 and events >= 0 for size, events in self._counts.values())
        if self._totals is not None:
            assert len(self._totals) <= self._segments_max
            assert all(min(counts) >= 0 for counts in self._totals.values())


class ReadPositions:
    """Where each connection's last read of each segment ended, for at most ``positions_max``
    (connection, segment) pairs in all; a connection's are forgotten when it closes (at once: a flood
    of closing connections costs one dictionary removal each)."""

    __slots__ = ("_by_connection", "_count", "_positions_max", "untracked")

    def __init__(self, positions_max: int = limits.METRICS_READ_POSITIONS_MAX) -> None:
        self._by_connection: dict[int, dict[str, int]] = {}
        self._count = 0
        self._positions_max = positions_max
        #: Reads whose position could not be tracked for lack of room (evidence for tests).
        self.untracked = 0

    def record(self, connection: object, segment: str, end_offset: int) -> None:
        positions = self._by_connection.get(id(connection))
        if positions is not None and segment in positions:
            positions[segment] = end_offset
            return
        if self._count >= self._positions_max:
            self.untracked += 1
            return
        if positions is None:
            positions = self._by_connection[id(connection)] = {}
        positions[segment] = end_offset
        self._count += 1

    def forget(self, connection: object) -> None:
        positions = self._by_connection.pop(id(connection), None)
        if positions is not None:
            self._count -= len(positions)

    def items(self) -> list[tuple[str, int]]:
        """Every tracked ``(segment, end offset)``."""
        return [item for positions in self._by_connection.values() for item in positions.items()]

    def check_invariants(self) -> None:
        assert self._count == sum(len(positions) for positions in self._by_connection.values())
        assert self._count <= self._positions_max
        assert all(offset >= 0 for positions in self._by_connection.values() for offset in positions.values())
