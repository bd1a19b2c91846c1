"""Adaptive batching: how many bytes a writer lets accumulate before it closes a block.  Pure: time
arrives as arguments.

Theory of operation (Pravega's rule, in our words).  A writer with nothing in flight sends an event at
once -- a lone event never waits.  While blocks are in flight, events accumulate in an open block,
which is closed and sent when it holds ``target()`` bytes, or when an acknowledgement leaves nothing
else in flight.  The target is what arrives in about half a round trip, capped by a batch window and a
block size:

    target = min(arrival_rate x min(round_trip / 2, window_max), block_bytes_max)

and an open block never waits longer than ``window()`` (that time again: a block whose events trickle
in, or whose acknowledgement is slow to come, still leaves within the window).  So a slow writer sends
every event as it comes (the target is smaller than one event), and a fast one
sends blocks that grow until about two are in flight per round trip -- enough to keep the server's
pipeline busy, few enough that the per-block costs (a frame, a container append, an acknowledgement)
stay small.  The arrival rate is measured per block: the bytes of the block just closed over the time
since the previous block closed (the open block starts filling the moment the previous one closes).
Both averages are exponentially weighted, so the target follows a change of load within a few blocks.
"""

from __future__ import annotations

from millstream.errors import InvalidArgumentError

__all__ = ["BlockSizeTracker"]

#: Weight of the newest sample in each moving average.
_WEIGHT = 0.2


class BlockSizeTracker:
    """Arrival rate and round trip of one segment writer, and the block size they call for."""

    __slots__ = ("_block_bytes_max", "_last_close", "_rate", "_round_trip", "_window_max")

    def __init__(self, *, now: float, block_bytes_max: int, window_seconds_max: float) -> None:
        if block_bytes_max <= 0 or window_seconds_max <= 0:
            raise InvalidArgumentError("the block size and the batch window must be positive")
        self._block_bytes_max = block_bytes_max
        self._window_max = window_seconds_max
        self._last_close = now
        self._rate = 0.0  # bytes per second
        self._round_trip: float | None = None

    @property
    def rate_bytes_per_second(self) -> float:
        return self._rate

    @property
    def round_trip_seconds(self) -> float | None:
        return self._round_trip

    def block_closed(self, now: float, size_bytes: int) -> None:
        """A block of ``size_bytes`` was closed at ``now``."""
        elapsed = now - self._last_close
        self._last_close = now
        if elapsed <= 0:
            elapsed = 1e-6  # two closes within the clock's resolution: a very high rate, not a division by 0
        sample = size_bytes / elapsed
        self._rate = sample if self._rate == 0.0 else self._rate + _WEIGHT * (sample - self._rate)

    def acknowledged(self, now: float, sent_at: float) -> None:
        """The block sent at ``sent_at`` was acknowledged at ``now``."""
        sample = max(now - sent_at, 0.0)
        self._round_trip = sample if self._round_trip is None else self._round_trip + _WEIGHT * (
            sample - self._round_trip)

    def window(self) -> float:
        """How long an open block may wait for more events: min(half a round trip, the batch window)."""
        return self._window_max if self._round_trip is None else min(self._round_trip / 2, self._window_max)

    def target(self) -> int:
        """Close the open block once it holds this many bytes (0: close at every event)."""
        return min(int(self._rate * self.window()), self._block_bytes_max)
