"""Seeded runs of the real container that record its trace.

``simulated_run`` drives the container on the simulated Tier-1 log and injects faults: writes made
durable in order, notices delivered late and out of order, failed writes (with and without an
unknown outcome), crashes that lose or tear the unsynced tail.  ``file_log_run`` drives it on the real
FileLog (group commit, fdatasync) and restarts it a few times.  The same seed gives the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from millstream.errors import DataCorruptionError, MillstreamError
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.file_log import FileLog
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceEvent, TraceRecorder

__all__ = ["FRAME_LENGTH_MAX", "file_log_run", "simulated_run"]

FRAME_LENGTH_MAX = 200
SEGMENTS = ("a", "b")
SETTLE_TURNS = 60


def _client_call(rng: random.Random, container: SegmentContainer) -> Callable[[], Awaitable[Any]]:
    name = rng.choice(SEGMENTS)
    other = rng.choice(SEGMENTS)
    choice = rng.choice(["create", "append", "append", "append", "conditional", "seal", "truncate", "merge",
                         "delete"])
    if choice == "create":
        return lambda: container.create_segment(name)
    if choice == "append":
        data = rng.randbytes(rng.randrange(0, 120))
        return lambda: container.append(name, data)
    if choice == "conditional":
        offset = rng.randrange(0, 60)
        return lambda: container.append(name, b"c" * rng.randrange(1, 20), expected_offset=offset)
    if choice == "seal":
        return lambda: container.seal(name)
    if choice == "truncate":
        offset = rng.randrange(0, 80)
        return lambda: container.truncate(name, offset)
    if choice == "merge":
        return lambda: container.merge(name, other)
    return lambda: container.delete(name)


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


async def _swallow(call: Callable[[], Awaitable[Any]]) -> None:
    with contextlib.suppress(MillstreamError):  # rejections and failures are in the trace; the spec checks them
        await call()


async def _simulated(seed: int, steps: int, container_factory: Callable[..., SegmentContainer]) -> list[TraceEvent]:
    rng = random.Random(seed)
    recorder = TraceRecorder()
    storage = SimulatedLogStorage(on_persisted=recorder.persisted)
    tasks: list[asyncio.Task[None]] = []

    async def start() -> tuple[SegmentContainer, SimulatedDurableDataLog]:
        log = SimulatedDurableDataLog(storage, auto_complete=False)
        container = container_factory(log, recorder)
        await container.start()
        await _settle()
        return container, log

    container, log = await start()
    for _ in range(steps):
        if container.state.value != "running":
            break  # it stopped by itself without a Tier-1 failure: only a broken implementation does
        action = rng.choices(
            ["calls", "complete", "persist", "notify", "fail", "crash"], weights=[8, 6, 2, 2, 1, 1])[0]
        if action == "calls":
            for _ in range(rng.randrange(1, 5)):
                tasks.append(asyncio.get_running_loop().create_task(_swallow(_client_call(rng, container))))
        elif action == "complete" and log.pending_sequences:
            log.complete(rng.choice(log.pending_sequences))
        elif action == "persist" and len(log.pending_sequences) > len(log.durable_pending_sequences):
            log.persist(1)
        elif action == "notify" and log.durable_pending_sequences:
            log.notify(rng.choice(log.durable_pending_sequences))
        elif action in ("fail", "crash"):
            if action == "fail" and log.pending_sequences:
                log.fail_write(unknown_outcome=rng.random() < 0.5)
            elif action == "crash":
                container.kill()
                recorder("Crash")
                log.crash(torn=rng.random() < 0.5
                          and len(log.pending_sequences) > len(log.durable_pending_sequences))
            else:
                continue
            await _settle()
            try:
                container, log = await start()
            except DataCorruptionError:
                # Only a broken implementation gets here (the seeded-bug test): the run ends.
                await asyncio.gather(*tasks)
                return recorder.take()
        await _settle()
    # Let everything in flight finish, so the run ends with every operation answered.
    for _ in range(1000):
        if all(task.done() for task in tasks) or container.state.value != "running":
            break
        if log.pending_sequences:
            log.complete(log.pending_sequences[-1])
        await _settle()
    else:
        raise AssertionError("operations still unanswered after draining the log")
    await asyncio.gather(*tasks)
    container.kill()
    return recorder.take()


def simulated_run(seed: int, steps: int = 40,
                  container_factory: Callable[..., SegmentContainer] | None = None) -> list[TraceEvent]:
    """One seeded run on the simulated log (with faults); returns the trace."""
    clock = ManualClock()  # time stands still: no batching delays, so the seed alone decides the run

    def default_factory(log: SimulatedDurableDataLog, recorder: TraceRecorder) -> SegmentContainer:
        return SegmentContainer(0, log, clock=clock, tracer=recorder, frame_length_max=FRAME_LENGTH_MAX,
                                checkpoint_frame_count=4)

    return asyncio.run(_simulated(seed, steps, container_factory or default_factory))


async def _file(directory: Path, seed: int, rounds: int) -> list[TraceEvent]:
    rng = random.Random(seed)
    recorder = TraceRecorder()
    for _ in range(rounds):
        container = SegmentContainer(0, FileLog(directory), tracer=recorder, frame_length_max=FRAME_LENGTH_MAX,
                                     checkpoint_frame_count=4)
        await container.start()
        for _ in range(rng.randrange(5, 15)):
            await asyncio.gather(*(_swallow(_client_call(rng, container)) for _ in range(rng.randrange(1, 6))))
        await container.stop()
        recorder("Crash")  # a clean stop, as the spec sees it: a stop with nothing outstanding
    return recorder.take()


def file_log_run(directory: Path, seed: int, rounds: int = 3) -> list[TraceEvent]:
    """Seeded runs on the real FileLog, stopped and recovered ``rounds`` times; returns the trace."""
    return asyncio.run(_file(directory, seed, rounds))
