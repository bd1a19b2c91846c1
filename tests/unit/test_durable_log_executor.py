"""``DurableLog`` as the executor of the processor's instructions: once the processor has stopped, a
``WriteFrame`` still in a list of instructions is skipped -- the frame must not follow the failed
write -- and the instructions after it are still carried out, in order (a step of the trace, an
answer to a caller)."""

from __future__ import annotations

import asyncio

import pytest

from millstream import limits
from millstream.clock import SystemClock
from millstream.errors import ContainerUnavailableError, StorageError
from millstream.segmentstore.durable_log import DurableLog
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import Trace, WriteFrame
from millstream.segmentstore.operations import StreamSegmentAppendOperation, StreamSegmentMapOperation
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage


def test_a_skipped_write_does_not_skip_the_instructions_after_it() -> None:
    traced: list[str] = []

    async def scenario() -> None:
        storage = SimulatedLogStorage()
        log = SimulatedDurableDataLog(storage, auto_complete=False)
        durable_log = DurableLog(ContainerMetadata(0), log, clock=SystemClock(), on_committed=lambda ops: None,
                                 tracer=lambda action, **fields: traced.append(action))
        durable_log.processor.failure = StorageError("an earlier write failed")
        durable_log._execute([WriteFrame(7, bytearray(b"frame")), Trace("FailWrite", {"frame": 7})])
        assert storage.last_sequence == 0  # nothing was written

    asyncio.run(scenario())
    assert traced == ["FailWrite"]


def test_a_burst_larger_than_one_take_goes_out_in_one_frame() -> None:
    """The task takes at most ``PROCESSOR_TAKE_COUNT_MAX`` operations per pass, and seals the open
    frame only once the queue is empty: a burst of more than one take still shares one frame.  (A
    mutation run found nothing pinned this: sealing after every take halved the frames' fill and no
    test noticed.)"""
    burst = limits.PROCESSOR_TAKE_COUNT_MAX + limits.PROCESSOR_TAKE_COUNT_MAX // 2

    async def scenario() -> int:
        storage = SimulatedLogStorage()
        log = SimulatedDurableDataLog(storage)
        durable_log = DurableLog(ContainerMetadata(0), log, clock=SystemClock(), on_committed=lambda ops: None)
        await durable_log.start()
        create = StreamSegmentMapOperation("s")
        create.segment_name = "s"
        await durable_log.add(create)
        before = storage.last_sequence
        futures = []
        for _ in range(burst):  # in one turn of the loop: the task sees them all queued
            append = StreamSegmentAppendOperation(-1, b"x")
            append.segment_name = "s"
            futures.append(durable_log.submit(append))
        await asyncio.gather(*futures)
        appends_frames = [sequence for sequence, _ in storage.records if sequence > before]
        await durable_log.close()
        return len(appends_frames)

    assert burst * 40 < limits.DATA_FRAME_SIZE_BYTES_MAX  # (the burst fits in one frame)
    assert asyncio.run(scenario()) == 1


def test_only_a_running_log_without_a_failure_takes_operations() -> None:
    """A running, healthy log has room for a caller (``wait_for_space`` returns); once its processor
    failed, or once it is closed, a caller is refused fast with ``ContainerUnavailableError``.  Kills
    ``self.processor.failure is not None`` negated in ``_check_running`` (seed-2711 sample: a healthy log
    refused every caller that waited for space, and a failed one took them)."""

    async def scenario() -> None:
        log = SimulatedDurableDataLog(SimulatedLogStorage())
        durable_log = DurableLog(ContainerMetadata(0), log, clock=SystemClock(), on_committed=lambda ops: None)
        await durable_log.start()
        create = StreamSegmentMapOperation("s")
        create.segment_name = "s"
        await durable_log.add(create)
        await durable_log.wait_for_space()
        durable_log.processor.failure = StorageError("a write failed")
        with pytest.raises(ContainerUnavailableError, match="not running"):
            await durable_log.wait_for_space()
        durable_log.processor.failure = None
        await durable_log.close()
        append = StreamSegmentAppendOperation(-1, b"x")
        append.segment_name = "s"
        with pytest.raises(ContainerUnavailableError, match="not running"):
            durable_log.submit(append)

    asyncio.run(scenario())


def test_recovery_counts_the_operations_it_replayed() -> None:
    """``recovered_operations`` is what the last recovery replayed beyond checkpoints: nothing for a new
    log, the segment's creation and its two appends after a restart.  Kills its initial ``0`` -> ``-1``
    (seed-2711 sample)."""

    async def scenario() -> tuple[int, int]:
        storage = SimulatedLogStorage()
        first = DurableLog(ContainerMetadata(0), SimulatedDurableDataLog(storage), clock=SystemClock(),
                           on_committed=lambda ops: None)
        await first.start()
        fresh = first.recovered_operations
        create = StreamSegmentMapOperation("s")
        create.segment_name = "s"
        await first.add(create)
        for payload in (b"a", b"b"):
            append = StreamSegmentAppendOperation(-1, payload)
            append.segment_name = "s"
            await first.add(append)
        await first.close()
        second = DurableLog(ContainerMetadata(0), SimulatedDurableDataLog(storage), clock=SystemClock(),
                            on_committed=lambda ops: None)
        await second.start()
        replayed = second.recovered_operations
        await second.close()
        return fresh, replayed

    assert asyncio.run(scenario()) == (0, 3)
