"""One bounded retry: an operation run again after the errors a policy names, with doubling delays.

The controller's store runs each segment operation again while the segment's container restarts
(``LocalSegmentStore``) or moves to another host (``ClusterSegmentStore``), and a cluster node starts
its controller again while a container it must reach is still moving (``ClusterNode``).  They differ
only in what they retry after, how often and how long they wait; ``RetryPolicy`` says that as data,
and ``retry_bounded`` is the one loop.  Every retry is bounded (``retries_max``), and the waits are on
the injected clock, so a test on a manual clock runs them without waiting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from millstream.clock import Clock

__all__ = ["RetryPolicy", "retry_bounded"]

_T = TypeVar("_T")


@attrs.frozen
class RetryPolicy:
    """After which errors an operation runs again, how many times at most, and how long it waits before
    each retry: ``delay_seconds`` at first, doubling up to ``delay_seconds_max``."""

    retryable: tuple[type[Exception], ...]
    retries_max: int = attrs.field(validator=attrs.validators.ge(0))
    delay_seconds: float = attrs.field(validator=attrs.validators.gt(0))
    delay_seconds_max: float

    def __attrs_post_init__(self) -> None:
        if self.delay_seconds_max < self.delay_seconds:
            raise ValueError(f"delay_seconds_max {self.delay_seconds_max} is below delay_seconds {self.delay_seconds}")


#: Told of each retryable failure: the error, how many attempts have failed so far (1 for the first),
#: and the delay before the next attempt -- None when there is none (the error is raised next).
FailureListener = Callable[[Exception, int, float | None], None]


async def retry_bounded(operation: Callable[[], Awaitable[_T]], policy: RetryPolicy, clock: Clock, *,
                        on_failure: FailureListener | None = None) -> _T:
    """Return ``operation()``'s result; after an error in ``policy.retryable``, tell ``on_failure``,
    wait on ``clock`` and run it again, at most ``policy.retries_max`` times.  Raises the last error once
    the retries are spent, and any other error at once."""
    delay = policy.delay_seconds
    failures = 0
    while True:
        try:
            return await operation()
        except policy.retryable as error:
            failures += 1
            last = failures > policy.retries_max
            if on_failure is not None:
                on_failure(error, failures, None if last else delay)
            if last:
                raise
        await clock.sleep(delay)
        delay = min(delay * 2, policy.delay_seconds_max)
