"""``DurableLog`` as the executor of the processor's instructions: once the processor has stopped, a
``WriteFrame`` still in a list of instructions is skipped -- the frame must not follow the failed
write -- and the instructions after it are still carried out, in order (a step of the trace, an
answer to a caller)."""

from __future__ import annotations

import asyncio

from millstream import limits
from millstream.clock import SystemClock
from millstream.errors import StorageError
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
