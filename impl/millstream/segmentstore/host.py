"""ContainerHost: keeps one segment container serving across Tier-1 failures.

A container that meets a Tier-1 write failure stops (everything it had not acknowledged fails with
the retryable ``ContainerUnavailableError``) and is never restarted in place.  Its host builds a new
container on a freshly opened log -- which fences whatever is left of the old owner and recovers by
replay -- and carries on serving.  Restarts are bounded: after ``restarts_max`` failures in a row (a
container that ran for ``stable_seconds`` resets the count) the delay between them doubles up to a
cap, and then the host gives up and reports the last failure.

The host does not restart a container that was *fenced* (another owner took the log over: serving
now would be split brain) or that found its data corrupt (``DataCorruptionError``: an operator must
look; serving could mean serving wrong bytes).  ``stopped`` then completes with that cause, and the
host says so in an ERROR log naming the container and the cause (for a fenced log: the newer
owner's epoch) -- a host that stops serving for good must never do so silently.  Whoever runs the
host (``millstream.standalone``) watches ``stopped`` and stops the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from millstream import limits
from millstream.clock import Clock, SystemClock
from millstream.errors import ContainerUnavailableError, DataCorruptionError, DataLogFencedError
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.container import ContainerState, SegmentContainer, StorageSettings
from millstream.segmentstore.durable_data_log import DurableDataLog

__all__ = ["ContainerHost"]

log = logging.getLogger("millstream.segmentstore.host")


def _is_final(error: BaseException) -> bool:
    """Whether a container that stopped on ``error`` must not be restarted."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (DataLogFencedError, DataCorruptionError)):
            return True
        seen = seen.__cause__
    return False


def _is_fenced(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, DataLogFencedError):
            return True
        seen = seen.__cause__
    return False


class ContainerHost:
    """Runs container ``container_id`` on the log ``open_log()`` opens, restarting it after failures."""

    def __init__(
        self,
        container_id: int,
        open_log: Callable[[], DurableDataLog],
        *,
        chunk_storage: ChunkStorage | None = None,
        storage_settings: StorageSettings | None = None,
        clock: Clock | None = None,
        restarts_max: int = limits.CONTAINER_RESTARTS_MAX,
        restart_delay_seconds: float = limits.CONTAINER_RESTART_DELAY_SECONDS,
        stable_seconds: float = 60.0,
        **container_options: object,
    ) -> None:
        self.container_id = container_id
        self._open_log = open_log
        self._chunk_storage = chunk_storage
        self._storage_settings = storage_settings
        self._clock = clock or SystemClock()
        self._restarts_max = restarts_max
        self._restart_delay_seconds = restart_delay_seconds
        self._stable_seconds = stable_seconds
        self._container_options = container_options
        self._container: SegmentContainer | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: Containers started after the first (evidence for tests).
        self.restarts = 0
        self.stopped: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    @property
    def container(self) -> SegmentContainer:
        """The container serving now.  Raises ``ContainerUnavailableError`` between containers."""
        container = self._container
        if container is None or container.state is not ContainerState.RUNNING:
            raise ContainerUnavailableError(f"container {self.container_id} is restarting or stopped")
        return container

    @property
    def status(self) -> tuple[str, BaseException | None]:
        """What the host is doing, for health checks: ``("running", None)``, ``("recovering", None)``
        (a container replays its log: the first, or one restarting after a failure), ``("fenced",
        cause)`` or ``("failed", cause)`` (stopped serving for good), or ``("stopped", None)``."""
        if self.stopped.done():
            cause = self.stopped.result()
            if cause is None:
                return "stopped", None
            return ("fenced" if _is_fenced(cause) else "failed"), cause
        container = self._container
        if container is not None and container.state is ContainerState.RUNNING:
            return "running", None
        return "recovering", None

    async def start(self) -> SegmentContainer:
        """Start the first container (its errors propagate) and begin watching it."""
        if self._task is not None:
            raise ContainerUnavailableError("the host was started already")
        container = await self._start_container()
        self._task = asyncio.get_running_loop().create_task(self._watch(container), name=f"host-{self.container_id}")
        return container

    async def _start_container(self) -> SegmentContainer:
        container = SegmentContainer(
            self.container_id, self._open_log(), clock=self._clock, chunk_storage=self._chunk_storage,
            storage_settings=self._storage_settings, **self._container_options)  # type: ignore[arg-type]
        await container.start()
        self._container = container
        restart = self.restarts + (1 if self._task is not None else 0)  # (the watcher counts it once started)
        log.info("container %d recovered and serving%s", self.container_id,
                 f" (restart {restart})" if restart else "", extra={"container": self.container_id, "restart": restart})
        return container

    async def _watch(self, container: SegmentContainer) -> None:
        failures_in_a_row = 0
        delay = self._restart_delay_seconds
        while True:
            started_at = self._clock.monotonic()
            cause = await container.stopped
            if cause is None or self._closing:
                self._finish(None)
                return
            if _is_final(cause):
                self._finish(cause)
                return
            if self._clock.monotonic() - started_at >= self._stable_seconds:
                failures_in_a_row, delay = 0, self._restart_delay_seconds
            while True:
                failures_in_a_row += 1
                if failures_in_a_row > self._restarts_max:
                    self._finish(cause)
                    return
                await self._clock.sleep(delay)
                delay = min(delay * 2, limits.CONTAINER_RESTART_DELAY_SECONDS_MAX)
                if self._closing:
                    self._finish(None)
                    return
                try:
                    container = await self._start_container()
                    self.restarts += 1
                    break
                except Exception as error:
                    cause = error
                    if _is_final(error):
                        self._finish(error)
                        return

    def _finish(self, cause: BaseException | None) -> None:
        if self.stopped.done():
            return
        if cause is not None:
            if _is_fenced(cause):
                log.error("container %d was fenced: %s -- another process owns its log now; this host stops "
                          "serving it", self.container_id, cause)
            elif _is_final(cause):
                log.error("container %d stopped for good: %s", self.container_id, cause)
            else:
                log.error("container %d failed %d times in a row; giving up: %s", self.container_id,
                          self._restarts_max + 1, cause)
        self.stopped.set_result(cause)

    async def stop(self) -> None:
        """Stop the serving container (draining what it acknowledged) and stop restarting."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._container is not None:
            await self._container.stop()
        self._finish(None)

    async def __aenter__(self) -> ContainerHost:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
