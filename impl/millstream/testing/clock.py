"""A clock that moves only when a test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["ManualClock"]


class ManualClock:
    """Monotonic time that ``advance`` moves; ``sleep`` waits until the clock passes its deadline."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    @property
    def sleeping(self) -> int:
        """Sleepers still waiting."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed, earliest first."""
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
