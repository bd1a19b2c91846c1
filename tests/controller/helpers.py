"""Controllers for the service tests: a segment-store server on the simulated tiers (or on files),
a ``LocalSegmentStore`` over it, a manual clock, and a store that fails on cue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from millstream.controller import Controller, ControllerConfig, LocalSegmentStore
from millstream.controller._segment_store import AppendCounts, SegmentState
from millstream.segmentstore.read_index import ReadResult
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from tests.server.raw import Tiers, serving

SCENARIO_TIMEOUT_SECONDS = 45.0


def run(scenario: Callable[[], Awaitable[None]], seconds: float = SCENARIO_TIMEOUT_SECONDS) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), seconds)
    asyncio.run(bounded())


class Crash(Exception):
    """The controller "dies" at this point (a test's fault; the store saw nothing of the failed call)."""


class FlakyStore:
    """A ``SegmentStore`` that passes every call to ``inner``, except -- once ``arm``ed -- the
    ``fail_on``-th call of ``operation`` after arming (1-based), which raises ``Crash`` without
    reaching the store."""

    def __init__(self, inner: LocalSegmentStore) -> None:
        self.inner = inner
        self.operation = ""
        self.fail_on = 0
        self.calls: dict[str, int] = {}
        self.landed_then: type[Exception] | None = None

    def arm(self, operation: str, fail_on: int, *, landed_then: type[Exception] | None = None) -> None:
        """Fail the ``fail_on``-th ``operation`` from now; with ``landed_then`` (appends only) the append
        reaches the store first and then that error is raised (its outcome looked unknown)."""
        self.operation, self.fail_on, self.calls, self.landed_then = operation, fail_on, {}, landed_then

    def _count(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        if operation == self.operation and self.calls[operation] == self.fail_on:
            self.operation = ""
            raise Crash(f"{operation} #{self.fail_on}")

    async def create_segment(self, name: str) -> bool:
        self._count("create_segment")
        return await self.inner.create_segment(name)

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        if self.landed_then is not None:
            length = await self.inner.append(name, data, expected_offset=expected_offset)
            try:
                self._count("append")
            except Crash:
                raise self.landed_then(f"the append to {name} landed, yet it looked as if it had not") from None
            return length
        self._count("append")
        return await self.inner.append(name, data, expected_offset=expected_offset)

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        return await self.inner.read(name, offset, max_length)

    async def get_info(self, name: str) -> SegmentState | None:
        return await self.inner.get_info(name)

    async def seal(self, name: str) -> int:
        self._count("seal")
        return await self.inner.seal(name)

    async def truncate(self, name: str, offset: int) -> None:
        self._count("truncate")
        await self.inner.truncate(name, offset)

    async def delete(self, name: str) -> bool:
        self._count("delete")
        return await self.inner.delete(name)

    async def check_event_boundary(self, name: str, offset: int) -> None:
        await self.inner.check_event_boundary(name, offset)

    def uri_of(self, name: str) -> str:
        return self.inner.uri_of(name)

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        return self.inner.drain_append_counts()


class Harness:
    """A server on ``tiers`` and controllers over it, all on one manual clock for the controller."""

    def __init__(self, server: SegmentStoreServer, clock: ManualClock) -> None:
        self.server = server
        self.clock = clock
        self.controllers: list[Controller] = []

    def store(self) -> LocalSegmentStore:
        return LocalSegmentStore(self.server)

    async def controller(self, *, store: Any = None, **options: Any) -> Controller:
        """A started controller (periodic work off: tests call ``tick``)."""
        config = ControllerConfig(periodic=False, **options)
        controller = Controller(store if store is not None else self.store(), clock=self.clock,
                                now=self.clock.monotonic, config=config)
        await controller.start()
        controller.check_invariants()
        self.controllers.append(controller)
        return controller

    def container(self, name: str) -> Any:
        return self.server.container_for(name)

    def segment(self, name: str) -> Any:
        return self.server.container_for(name).get_info(name)


@contextlib.asynccontextmanager
async def harness(kind: str = "simulated", directory: Path | None = None,
                  tiers: Tiers | None = None) -> AsyncIterator[Harness]:
    """A started server (simulated tiers by default) and a manual clock starting at 1,000,000 s."""
    async with serving(tiers or Tiers(kind, directory)) as server:
        test = Harness(server, ManualClock(1_000_000.0))
        try:
            yield test
            for controller in test.controllers:
                controller.check_invariants()
        finally:
            for controller in test.controllers:
                await controller.stop()


async def append_events(test: Harness, segment: str, count: int, size: int = 10) -> None:
    """Append ``count`` framed events of ``size`` bytes to ``segment`` (straight into its container)."""
    from millstream.wire import encode_event

    await test.container(segment).append(segment, b"".join(encode_event(b"x" * size) for _ in range(count)))
