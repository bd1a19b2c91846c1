"""A checkpoint records where the application is, not where the reader has fetched to: a reader that
fetched a whole segment and handed out three of its ten events records the fourth event's offset, and
a group reset to that checkpoint reads the fourth to the tenth again -- exactly those, once each.

(The reader reads ahead: its fetcher's read position runs past the events it has handed out.  A
checkpoint taken from the read position would lose the events in between after a reset or a restart.
Beside the stream trace validation and the undecodable-event test, this is a third, direct test.  The
asyncio reader, which hands out one event per call; the blocking reader hands out a batch the asyncio
one returned, and owes the checkpoint after it.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import millstream
from millstream.client import AsyncClient, ReaderGroupConfig, ScalingPolicy, StreamConfig
from tests.readers.helpers import FAST, run

HEADER_BYTES = 8  # type 0 | length, before each payload
PAYLOADS = [f"event-{n:02d}".encode() for n in range(10)]
OFFSETS = [n * (HEADER_BYTES + len(PAYLOADS[0])) for n in range(len(PAYLOADS))]
HANDED = 3


async def next_events(reader: Any, count: int) -> list[bytes]:
    events: list[bytes] = []
    for _ in range(200):
        if len(events) == count:
            return events
        read = await reader.read_next_event(1.0)
        assert read.checkpoint_name is None, read
        if read.event is not None:
            events.append(read.event)
    raise AssertionError(f"{len(events)} of {count} events within 200 reads")


def test_a_checkpoint_records_the_events_handed_out_not_those_fetched(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            manager = client.stream_manager()
            await manager.create_scope("s")
            await manager.create_stream("s/a", StreamConfig(scaling=ScalingPolicy.fixed(1)))
            writer = client.event_writer("s/a")
            for payload in PAYLOADS:
                await writer.write_event(payload, routing_key="k")
            await writer.close()
            (segment,) = [s.name for s in (await manager.current_segments("s/a")).segments]
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            reader = await group.reader("r", config=FAST)
            assert await next_events(reader, HANDED) == PAYLOADS[:HANDED]
            future = await group.initiate_checkpoint("cp", timeout=20)
            # Wait until the reader's view of the group holds the checkpoint it owes (its long poll on the
            # group's state brings it): its next read is then the checkpoint, with events fetched and not
            # handed out.
            sync = reader._sync  # the reader's own view of the group's state
            for _ in range(3000):
                if sync.state is not None and sync.state.pending_checkpoint("r") is not None:
                    break
                await asyncio.sleep(0.01)  # polling a condition
            else:
                raise AssertionError("the reader never learned of the checkpoint")
            read = await reader.read_next_event(1.0)
            assert read.checkpoint_name == "cp" and read.event is None, read
            assert await next_events(reader, 1) == [PAYLOADS[HANDED]]  # (records the checkpoint, reads on)
            checkpoint = await future
            assert checkpoint.cuts["s/a"].segment_names() == {segment: OFFSETS[HANDED]}, checkpoint
            await reader.close()
            await group.reset_to_checkpoint(checkpoint)
            again = await group.reader("r2", config=FAST)
            assert await next_events(again, len(PAYLOADS) - HANDED) == PAYLOADS[HANDED:]
            await again.close()
            await group.close()

    with millstream.standalone(tmp_path) as node:
        run(scenario)
