"""Helpers of the ZooKeeper cluster tests: an event loop per test, bounded waits for conditions, file logs."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_log import FileLog

#: Small enough that expiry tests finish quickly, large enough that a loaded machine keeps sessions.
SESSION_TIMEOUT_SECONDS = 2.0
CONTAINER_COUNT = 8
WAIT_SECONDS = 60.0
SCENARIO_SECONDS = 240.0

_names = itertools.count()


def cluster_name() -> str:
    return f"test-{next(_names)}"


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop, bounded as a whole."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), SCENARIO_SECONDS))
    return run


async def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    """Poll ``condition`` until it holds; fail (naming ``what``) after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)




def file_logs(root: Path) -> Callable[[int], DurableDataLog]:
    """A node's Tier-1 logs as ``FileLog``s under ``root/tier1`` (one directory per container, shared by
    every node in the process: the shared-disk case)."""
    def open_log(container_id: int) -> DurableDataLog:
        return FileLog(root / "tier1" / f"container-{container_id}")
    return open_log
