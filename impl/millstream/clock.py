"""Time, injected.  Decision code never reads the system clock itself (STYLE.md: time arrives as data)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """A source of monotonic time and of timed waits."""

    def monotonic(self) -> float:
        """Seconds since an arbitrary origin; never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (measured by this clock)."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
