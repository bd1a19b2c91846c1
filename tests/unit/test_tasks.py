"""``millstream.tasks.cancel_and_wait``: a stop that cancels a background task returns even if the task
lost a cancellation, as ``asyncio.wait_for`` can make it lose one on CPython 3.11."""

from __future__ import annotations

import asyncio
import sys

import pytest

from millstream import limits
from millstream.tasks import cancel_and_wait


def test_wait_for_can_drop_a_cancellation_on_this_python() -> None:
    """The mechanism: cancelled just as what it waits for completes, ``wait_for`` returns the result."""

    async def scenario() -> tuple[bool, object]:
        inner = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(asyncio.wait_for(inner, 60))
        await asyncio.sleep(0)
        inner.set_result("done")
        task.cancel()
        await asyncio.wait({task})
        return task.cancelled(), None if task.cancelled() else task.result()

    cancelled, result = asyncio.run(scenario())
    if sys.version_info < (3, 12):
        assert (cancelled, result) == (False, "done"), "3.11's wait_for drops the cancellation"
    else:
        assert cancelled


def test_a_task_that_lost_its_cancellation_is_cancelled_again_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "TASK_CANCEL_RETRY_SECONDS", 0.01)
    cancellations = []

    async def periodic() -> None:  # a loop that, once, went on after a cancellation (as above)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancellations.append(1)
                if len(cancellations) > 1:
                    raise

    async def scenario() -> asyncio.Task[None]:
        task = asyncio.ensure_future(periodic())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task), 30)  # (bounded: the old cancel-then-await hangs here)
        return task

    task = asyncio.run(scenario())
    assert task.cancelled() and len(cancellations) == 2


def test_a_task_that_ends_with_an_error_is_waited_for_without_raising_it() -> None:
    async def failing() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def scenario() -> asyncio.Task[None]:
        task = asyncio.ensure_future(failing())
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        return task

    task = asyncio.run(scenario())
    assert isinstance(task.exception(), RuntimeError)
