"""millstream.retry: the one bounded retry loop the controller's stores and a cluster node's controller
start share (each with its policy as data)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from millstream.errors import ContainerUnavailableError, WrongHostError
from millstream.retry import RetryPolicy, retry_bounded
from millstream.testing.clock import ManualClock

_T = TypeVar("_T")

#: Generous: nothing here waits on real time (the clock is manual).
SCENARIO_TIMEOUT_SECONDS = 60.0

POLICY = RetryPolicy((ContainerUnavailableError,), retries_max=3, delay_seconds=0.5, delay_seconds_max=1.5)


def run(scenario: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_SECONDS))


class Flaky:
    """Fails with ``error`` the first ``failures`` times it is called, then answers its call count."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


class RecordingClock(ManualClock):
    """A manual clock whose ``sleep`` records how long it was asked to wait, and moves time on by that."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)


def test_it_retries_the_named_errors_with_doubling_delays_up_to_the_cap() -> None:
    async def scenario() -> tuple[int | BaseException, list[float], list[tuple[int, float | None]]]:
        clock = RecordingClock()
        seen: list[tuple[int, float | None]] = []
        operation = Flaky(3, ContainerUnavailableError("moving"))
        try:
            result: int | BaseException = await retry_bounded(
                operation, POLICY, clock, on_failure=lambda error, n, delay: seen.append((n, delay)))
        except ContainerUnavailableError as error:
            result = error
        delays = clock.delays
        return result, delays, seen

    result, delays, seen = run(scenario())
    assert result == 4
    assert delays == [0.5, 1.0, 1.5]
    assert seen == [(1, 0.5), (2, 1.0), (3, 1.5)]


def test_it_raises_the_last_error_once_the_retries_are_spent_and_says_so() -> None:
    async def scenario() -> tuple[int | BaseException, list[float], list[tuple[int, float | None]], int]:
        clock = RecordingClock()
        seen: list[tuple[int, float | None]] = []
        operation = Flaky(10, ContainerUnavailableError("gone"))
        try:
            result: int | BaseException = await retry_bounded(
                operation, POLICY, clock, on_failure=lambda error, n, delay: seen.append((n, delay)))
        except ContainerUnavailableError as error:
            result = error
        delays = clock.delays
        return result, delays, seen, operation.calls

    result, delays, seen, calls = run(scenario())
    assert isinstance(result, ContainerUnavailableError) and str(result) == "gone"
    assert calls == POLICY.retries_max + 1
    assert delays == [0.5, 1.0, 1.5]
    assert seen[-1] == (4, None)


def test_another_error_is_raised_at_once() -> None:
    async def scenario() -> tuple[int | BaseException, list[float], int]:
        clock = RecordingClock()
        operation = Flaky(1, WrongHostError("elsewhere"))
        try:
            result: int | BaseException = await retry_bounded(operation, POLICY, clock)
        except WrongHostError as error:
            result = error
        delays = clock.delays
        return result, delays, operation.calls

    result, delays, calls = run(scenario())
    assert isinstance(result, WrongHostError)
    assert (delays, calls) == ([], 1)


@pytest.mark.parametrize(("retries_max", "delay_seconds", "delay_seconds_max"),
                         [(-1, 0.5, 1.0), (1, 0.0, 1.0), (1, 0.5, 0.25)])
def test_a_policy_that_would_not_be_bounded_or_doubling_is_refused(retries_max: int, delay_seconds: float,
                                                                   delay_seconds_max: float) -> None:
    with pytest.raises(ValueError):
        RetryPolicy((ContainerUnavailableError,), retries_max=retries_max, delay_seconds=delay_seconds,
                    delay_seconds_max=delay_seconds_max)
