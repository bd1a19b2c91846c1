"""``DurableLog`` as the executor of the processor's instructions: once the processor has stopped, a
``WriteFrame`` still in a list of instructions is skipped -- the frame must not follow the failed
write -- and the instructions after it are still carried out, in order (a step of the trace, an
answer to a caller)."""

from __future__ import annotations

import asyncio

from millstream.clock import SystemClock
from millstream.errors import StorageError
from millstream.segmentstore.durable_log import DurableLog
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import Trace, WriteFrame
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
