"""Seeded runs of the real write path that record its trace.

``machine_run`` drives the ``OperationProcessor`` machine alone -- no event loop, no log: the run plays
its executor and Tier 1 itself, with the same faults as below.
``simulated_run`` drives the container on the simulated Tier-1 log and injects faults: writes made
durable in order, notices delivered late and out of order, failed writes (with and without an
unknown outcome), crashes that lose or tear the unsynced tail.  ``file_log_run`` drives it on the real
FileLog (group commit, fdatasync) and restarts it a few times.  The same seed gives the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from millstream.errors import (
    DataCorruptionError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    StorageError,
)
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.data_frame import DataFrameReader
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord
from millstream.segmentstore.durable_log import LogReplay
from millstream.segmentstore.file_log import FileLog
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import Instruction, OperationProcessor, Trace, WriteFrame
from millstream.segmentstore.operations import (
    DeleteSegmentOperation,
    MergeSegmentOperation,
    Operation,
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentSealOperation,
    StreamSegmentTruncateOperation,
)
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceEvent, TraceRecorder

__all__ = ["FRAME_BYTES_MAX", "file_log_run", "machine_run", "simulated_run"]

FRAME_BYTES_MAX = 200
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
                try:
                    log.fail_write(unknown_outcome=rng.random() < 0.5)
                except InvalidArgumentError:
                    # Every pending write was durable and older than a confirmed one: the log delivered
                    # their notices instead (it cannot fail a write it implicitly confirmed).
                    await _settle()
                    continue
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
        return SegmentContainer(0, log, clock=clock, tracer=recorder, frame_bytes_max=FRAME_BYTES_MAX,
                                checkpoint_frame_count=4)

    return asyncio.run(_simulated(seed, steps, container_factory or default_factory))


async def _file(directory: Path, seed: int, rounds: int) -> list[TraceEvent]:
    rng = random.Random(seed)
    recorder = TraceRecorder()
    for _ in range(rounds):
        container = SegmentContainer(0, FileLog(directory), tracer=recorder, frame_bytes_max=FRAME_BYTES_MAX,
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


def _operation(rng: random.Random) -> Operation:
    """A seeded operation as ``SegmentContainer`` would submit it (the choices of ``_client_call``)."""
    name = rng.choice(SEGMENTS)
    other = rng.choice(SEGMENTS)
    choice = rng.choice(["create", "append", "append", "append", "conditional", "seal", "truncate", "merge",
                         "delete"])
    operation: Operation
    if choice == "create":
        operation = StreamSegmentMapOperation(name)
    elif choice == "append":
        operation = StreamSegmentAppendOperation(-1, rng.randbytes(rng.randrange(0, 120)))
    elif choice == "conditional":
        offset = rng.randrange(0, 60)
        operation = StreamSegmentAppendOperation(-1, b"c" * rng.randrange(1, 20), expected_offset=offset)
    elif choice == "seal":
        operation = StreamSegmentSealOperation(-1)
    elif choice == "truncate":
        operation = StreamSegmentTruncateOperation(-1, rng.randrange(0, 80))
    elif choice == "merge":
        operation = MergeSegmentOperation(-1, -1)
        operation.source_name = other
    else:
        operation = DeleteSegmentOperation(-1)
    operation.segment_name = name
    return operation


class _MachineRun:
    """The executor and Tier 1 of ``machine_run``: frames in flight, durable frames, notices due."""

    def __init__(self) -> None:
        self.recorder = TraceRecorder()
        self.in_flight: list[tuple[int, bytes]] = []
        self.durable: list[tuple[int, bytes]] = []
        self.unnotified: list[int] = []
        self.processor = self.start()

    def start(self) -> OperationProcessor:
        """A new processor over what the durable frames replay to."""
        self.in_flight.clear()
        self.unnotified.clear()
        metadata = ContainerMetadata(0)
        reader = DataFrameReader(LogRecord(LogAddress(number), data) for number, data in self.durable)
        found_checkpoint = LogReplay(metadata, on_committed=lambda operations: None, on_loaded=None,
                                     wall_clock=None).replay(reader)
        processor = OperationProcessor(metadata, frame_bytes_max=FRAME_BYTES_MAX, checkpoint_frame_count=4,
                                       tracing=True)
        self.carry_out(processor.recover(
            reader.highest_sequence_number + 1, (reader.last_address.sequence if reader.last_address else 0) + 1,
            reader.frame_count, found_checkpoint=found_checkpoint))
        return processor

    def carry_out(self, instructions: Sequence[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, Trace):
                self.recorder(instruction.action, **instruction.fields)
            elif isinstance(instruction, WriteFrame):
                self.in_flight.append((instruction.frame_number, bytes(instruction.data)))
            # (Acknowledge, Reject, Stop: the callers' answers are in the trace; the spec checks them.)

    def persist(self) -> None:
        number, data = self.in_flight.pop(0)
        self.durable.append((number, data))
        self.unnotified.append(number)
        self.recorder.persisted(number)

    def complete(self, number: int) -> None:
        self.unnotified.remove(number)
        self.carry_out(self.processor.persist(number))
        self.carry_out(self.processor.complete(number, LogAddress(number)))


def machine_run(seed: int, steps: int = 60) -> list[TraceEvent]:
    """One seeded run of the ``OperationProcessor`` machine driven directly (with faults); returns the trace."""
    rng = random.Random(seed)
    run = _MachineRun()
    for _ in range(steps):
        processor = run.processor
        action = rng.choices(["submit", "process", "seal", "persist", "complete", "fail", "crash"],
                             weights=[6, 8, 3, 3, 4, 1, 1])[0]
        if action == "submit":
            for _ in range(rng.randrange(1, 5)):
                run.carry_out(processor.submit(_operation(rng)))
        elif action == "process":
            for _ in range(min(rng.randrange(1, 5), processor.queue_length)):
                run.carry_out(processor.process())
        elif action == "seal":
            run.carry_out(processor.seal_frame())
        elif action == "persist" and run.in_flight:
            run.persist()
        elif action == "complete" and run.unnotified:
            run.complete(rng.choice(run.unnotified))
        elif action in ("fail", "crash"):
            if action == "fail" and processor.in_flight_frames:  # (a write is outstanding: the spec's guard)
                frame = run.in_flight[0][0] if run.in_flight else None
                run.carry_out(processor.fail_write(StorageError("injected"), frame))
            elif action == "crash":
                run.carry_out(processor.stop(ObjectClosedError("killed")))
                run.recorder("Crash")
            else:
                continue
            try:
                run.processor = run.start()
            except DataCorruptionError:
                return run.recorder.take()  # only a broken implementation gets here (the seeded-bug test)
    # Let everything finish, as the executor would, so the run ends with every operation answered.
    processor = run.processor
    while processor.queue_length or run.in_flight or run.unnotified:
        if processor.queue_length:
            run.carry_out(processor.process())
        elif processor.in_flight_frames and not run.in_flight and not run.unnotified:
            raise AssertionError("frames in flight that Tier 1 never saw")
        elif run.in_flight:
            run.persist()
        else:
            run.complete(run.unnotified[-1])
        if not processor.queue_length:
            run.carry_out(processor.seal_frame())
    run.carry_out(processor.stop(ObjectClosedError("done")))
    return run.recorder.take()
