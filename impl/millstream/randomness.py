"""Randomness, injected.  Decision code never draws from the operating system or ``random``
itself (STYLE.md #2: randomness arrives as data): writer ids, transaction ids and backoff jitter
come from a ``RandomSource``.  Pass a seeded ``random.Random`` and a run replays exactly; the default
draws from the operating system (``os.urandom``), as ``SystemClock`` reads the real clock.

A module of its own, beside ``millstream.clock``, because the client and the controller both draw
from it and neither may import the other (``tests/test_architecture.py``).
"""

from __future__ import annotations

import os
import uuid
from typing import Protocol

from millstream.errors import InvalidArgumentError

__all__ = ["RandomSource", "SystemRandomSource", "random_uuid"]


class RandomSource(Protocol):
    """Where the client's randomness comes from; ``random.Random`` is one."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...

    def getrandbits(self, k: int, /) -> int:
        """An int of ``k`` random bits."""
        ...


class SystemRandomSource:
    """Randomness from the operating system: the default when no seeded source is given."""

    def random(self) -> float:
        return (int.from_bytes(os.urandom(7), "big") >> 3) / (1 << 53)

    def getrandbits(self, k: int, /) -> int:
        if k < 0:
            raise InvalidArgumentError(f"bits must be non-negative, not {k}")
        return int.from_bytes(os.urandom((k + 7) // 8), "big") >> (-k % 8)


def random_uuid(rng: RandomSource) -> uuid.UUID:
    """A version-4 UUID drawn from ``rng`` (a writer id)."""
    return uuid.UUID(int=rng.getrandbits(128), version=4)
