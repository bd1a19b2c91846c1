"""Shared helpers for the client tests: bounded scenarios, a fast configuration, a seeded client."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from millstream.client import AsyncClient, ClientConfig

SCENARIO_TIMEOUT_SECONDS = 30.0


def run(scenario: Callable[[], Awaitable[None]], timeout: float = SCENARIO_TIMEOUT_SECONDS) -> None:
    """Run one async scenario on a fresh loop; a hang fails the test instead of stalling the suite."""
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout)
    asyncio.run(bounded())


def fast_config(**overrides: Any) -> ClientConfig:
    """Small timeouts and delays, so a lost reply or a dead server shows within milliseconds."""
    values: dict[str, Any] = dict(
        connect_timeout_seconds=2.0, request_timeout_seconds=2.0, append_ack_timeout_seconds=0.3,
        keepalive_interval_seconds=1.0, reconnect_attempts_max=6, reconnect_delay_initial_seconds=0.002,
        reconnect_delay_max_seconds=0.02)
    values.update(overrides)
    return ClientConfig(**values)


def client(uri: str, *, seed: int = 1, **overrides: Any) -> AsyncClient:
    """An ``AsyncClient`` with the fast configuration and a seeded RNG (writer ids, jitter)."""
    token = overrides.pop("token", "")
    return AsyncClient(uri, token=token, config=fast_config(**overrides), rng=random.Random(seed))


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)
