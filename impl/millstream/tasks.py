"""Stopping a background task for certain.

``task.cancel()`` followed by ``await task`` is not enough on CPython 3.11: ``asyncio.wait_for`` returns
the inner result, and drops the cancellation, when the task is cancelled just as what it waits for
completes (gh-86296, fixed in 3.12).  A periodic loop that lost its cancellation that way carries on
forever, and a ``stop`` awaiting it never returns.  ``cancel_and_wait`` cancels again until the task
is done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from millstream import limits

__all__ = ["cancel_and_wait"]

log = logging.getLogger("millstream")


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it is done, cancelling it again every
    ``limits.TASK_CANCEL_RETRY_SECONDS`` while it is not (a lost cancellation).  The task's own
    exception, if any, is not raised here (it is the task owner's to report)."""
    attempts = 0
    while not task.done():
        task.cancel()
        attempts += 1
        if attempts == 2:
            log.warning("task %s carried on after it was cancelled; cancelling it again", task.get_name())
        await asyncio.wait({task}, timeout=limits.TASK_CANCEL_RETRY_SECONDS)
    if not task.cancelled():
        task.exception()  # (retrieved: it is not "never retrieved" at garbage collection)
