"""Idempotent, pipelined appends over TCP: resends after a reconnect are deduplicated by the stored
event number, a second writer with the same id is refused, and acknowledgements come back in order."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.wire import (
    AppendSetup,
    CreateSegment,
    DataAppended,
    InvalidEventNumber,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    iter_events,
)
from tests.server.raw import RawClient, Tiers, block, run, serving

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer
    from millstream.server import SegmentStoreServer


async def read_all(client: RawClient, segment: str) -> list[bytes]:
    data = b""
    while True:
        reply = await client.request(ReadSegment(999_000 + len(data), segment, len(data), 1 << 20, "", 0))
        assert isinstance(reply, SegmentRead), reply
        data += reply.data
        if reply.at_tail:
            return list(iter_events(data))


async def segment_on(server: SegmentStoreServer, segment: str) -> tuple[RawClient, SegmentContainer]:
    """A client connected to ``server``, ``segment`` created through it, and the container that owns it."""
    client = await RawClient.connect(server.port)
    await client.request(CreateSegment(1, segment, ""))
    return client, server.container_for(segment)


def payload(number: int) -> bytes:
    return f"event-{number:06d}".encode()


def test_pipelined_blocks_are_acknowledged_in_order(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            segment = "sc/pipeline"
            await client.request(CreateSegment(1, segment, ""))
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            blocks = [block(writer, (n + 1) * 10, [payload(n * 10 + i + 1) for i in range(10)], 100 + n)
                      for n in range(300)]
            await client.send(*blocks)  # all of them, without waiting
            acks = await client.receive_many(len(blocks))
            assert all(isinstance(a, DataAppended) for a in acks)
            assert [a.event_number for a in acks] == [b.last_event_number for b in blocks]  # type: ignore[union-attr]
            assert [a.request_id for a in acks] == [b.request_id for b in blocks]  # type: ignore[union-attr]
            previous = [NULL_ATTRIBUTE_VALUE] + [b.last_event_number for b in blocks[:-1]]
            assert [a.previous_event_number for a in acks] == previous  # type: ignore[union-attr]
            offsets = [a.current_segment_write_offset for a in acks]  # type: ignore[union-attr]
            assert offsets == sorted(offsets) and offsets[-1] == sum(len(b.data) for b in blocks)
            assert await read_all(client, segment) == [payload(n) for n in range(1, 3001)]
            await client.close()
    run(scenario)


def test_a_resend_after_a_reconnect_is_deduplicated_by_the_stored_event_number(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            segment = "sc/idempotent"
            writer = uuid.uuid4()
            first = await RawClient.connect(server.port)
            await first.request(CreateSegment(1, segment, ""))
            await first.request(SetupAppend(2, writer, segment, ""))
            # Send 50 one-event blocks and hang up without reading a single acknowledgement.
            await first.send(*(block(writer, n, [payload(n)], 10 + n) for n in range(1, 51)))
            await first.close()
            # The writer reconnects; whatever was stored is what SetupAppend reports.
            second = await RawClient.connect(server.port)
            for _ in range(100):
                setup = await second.request(SetupAppend(3, writer, segment, ""))
                assert isinstance(setup, AppendSetup)
                if setup.last_event_number == 50:
                    break
                await asyncio.sleep(0.01)  # the blocks the first connection sent may still be landing
            stored = setup.last_event_number
            # It re-sends only what follows the stored number, as a client does ...
            resend = [block(writer, n, [payload(n)], 100 + n) for n in range(max(stored, 0) + 1, 61)]
            await second.send(*resend)
            acks = await second.receive_many(len(resend))
            assert [a.event_number for a in acks] == [b.last_event_number for b in resend]  # type: ignore[union-attr]
            assert await read_all(second, segment) == [payload(n) for n in range(1, 61)]
            # ... and a block it had stored already is refused, not stored twice.
            stale = await RawClient.connect(server.port)
            await stale.request(SetupAppend(4, writer, segment, ""))
            assert await stale.request(block(writer, 60, [payload(60)], 5)) == InvalidEventNumber(5, writer, 60)
            await stale.expect_closed()
            assert await read_all(second, segment) == [payload(n) for n in range(1, 61)]
            await second.close()
    run(scenario)


def test_a_second_writer_with_the_same_id_gets_invalid_event_number_and_the_first_goes_on(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            segment = "sc/twins"
            writer = uuid.uuid4()
            one = await RawClient.connect(server.port)
            two = await RawClient.connect(server.port)
            await one.request(CreateSegment(1, segment, ""))
            assert await one.request(SetupAppend(2, writer, segment, "")) == AppendSetup(
                2, segment, writer, NULL_ATTRIBUTE_VALUE)
            assert await two.request(SetupAppend(2, writer, segment, "")) == AppendSetup(
                2, segment, writer, NULL_ATTRIBUTE_VALUE)
            assert isinstance(await one.request(block(writer, 1, [b"from one"], 3)), DataAppended)
            # The twin compares with what it was told (nothing stored) and finds event 1 stored.
            assert await two.request(block(writer, 1, [b"from two"], 3)) == InvalidEventNumber(3, writer, 1)
            await two.expect_closed()
            assert isinstance(await one.request(block(writer, 2, [b"one again"], 4)), DataAppended)
            assert await read_all(one, segment) == [b"from one", b"one again"]
            await one.close()
    run(scenario)


def test_many_writers_share_one_connection(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            writers = [uuid.uuid4() for _ in range(8)]
            for index, writer in enumerate(writers):
                await client.request(CreateSegment(index, f"sc/multi/{index}", ""))
                await client.request(SetupAppend(100 + index, writer, f"sc/multi/{index}", ""))
            # Interleave the writers' blocks on the wire.
            await client.send(*(block(w, n, [payload(n)], n * 100 + i) for n in range(1, 21)
                                for i, w in enumerate(writers)))
            acks = await client.receive_many(20 * len(writers))
            for writer in writers:
                mine = [a.event_number for a in acks if a.writer_id == writer]  # type: ignore[union-attr]
                assert mine == list(range(1, 21)), "each writer's acknowledgements are in order"
            for index in range(len(writers)):
                assert await read_all(client, f"sc/multi/{index}") == [payload(n) for n in range(1, 21)]
            await client.close()
    run(scenario)


def test_a_block_overtaken_before_the_container_is_submitted_again_not_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An append that waits before it is queued (ingestion throttling does that) can be overtaken by
    the writer's next block, whose comparison then fails.  The server submits the overtaking block
    again once the first is stored: the writer sees nothing but acknowledgements, in order."""
    tiers = Tiers("simulated", tmp_path)

    async def scenario() -> None:
        async with serving(tiers) as server:
            segment = "sc/overtaken"
            client, container = await segment_on(server, segment)
            real_append = container.append
            delayed: list[int] = []
            calls: list[int] = []
            # The first appends of 2 and 5 wait (as a throttled append waits before it is queued) until
            # 8 has been submitted; then both go on, 2 first (an Event wakes its waiters in order).
            everything_submitted = asyncio.Event()

            async def throttled_append(name, data, attribute_updates=(), *, expected_offset=None):  # type: ignore[no-untyped-def]
                number = attribute_updates[0].value
                if number in (2, 5) and number not in delayed:
                    delayed.append(number)
                    await asyncio.wait_for(everything_submitted.wait(), 10.0)
                calls.append(number)
                if number == 8:
                    everything_submitted.set()
                return await real_append(name, data, attribute_updates, expected_offset=expected_offset)

            container.append = throttled_append  # type: ignore[method-assign]
            # Every append takes the path that may wait (as while Tier 2 lags): the fast path says so.
            container.append_at_once = lambda *args, **kwargs: None  # type: ignore[method-assign]
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            blocks = [block(writer, n, [payload(n)], 10 + n) for n in range(1, 9)]
            await client.send(*blocks)
            acks = await client.receive_many(len(blocks))
            assert all(isinstance(a, DataAppended) for a in acks), acks
            assert [a.event_number for a in acks] == list(range(1, 9))  # type: ignore[union-attr]
            assert [a.previous_event_number for a in acks] == [NULL_ATTRIBUTE_VALUE, *range(1, 8)]  # type: ignore[union-attr]
            assert delayed == [2, 5]
            # 3 and 4 overtook 2, and 6, 7, 8 overtook 5, which itself came late and compared with 4: each
            # of them was refused once and submitted again, in order, after 2 was stored.
            assert calls[:8] == [1, 3, 4, 6, 7, 8, 2, 5], calls
            assert calls[8:] == [3, 4, 5, 6, 7, 8], calls
            assert await read_all(client, segment) == [payload(n) for n in range(1, 9)]
            server.check_invariants()
            await client.close()
    run(scenario)


def test_blocks_that_need_not_wait_are_appended_without_a_task_and_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The common case: nothing throttled, the queue has room -- each block goes to the container at
    once (``append_at_once``) and its future answers; the path that may wait is never taken."""
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            segment = "sc/fast"
            client, container = await segment_on(server, segment)
            waited: list[int] = []
            real_append = container.append

            async def counting_append(name, data, attribute_updates=(), *, expected_offset=None):  # type: ignore[no-untyped-def]
                waited.append(attribute_updates[0].value)
                return await real_append(name, data, attribute_updates, expected_offset=expected_offset)

            container.append = counting_append  # type: ignore[method-assign]
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            await client.send(*(block(writer, n, [payload(n)], 10 + n) for n in range(1, 41)))
            acks = await client.receive_many(40)
            assert [a.event_number for a in acks] == list(range(1, 41)), acks  # type: ignore[union-attr]
            assert waited == []
            assert await read_all(client, segment) == [payload(n) for n in range(1, 41)]
            server.check_invariants()
            await client.close()
    run(scenario)


def test_a_container_that_refuses_an_append_at_once_closes_only_that_writers_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``append_at_once`` raising (the container is restarting) is answered like the waiting path's
    failure, on a later turn: that connection closes, the writer reconnects and re-sends, nothing is lost."""
    from millstream.errors import ContainerUnavailableError

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            segment = "sc/refused"
            client, container = await segment_on(server, segment)
            real = container.append_at_once
            refusals = [ContainerUnavailableError("container 0 is recovering")]

            def refusing(*args, **kwargs):  # type: ignore[no-untyped-def]
                if refusals:
                    raise refusals.pop()
                return real(*args, **kwargs)

            container.append_at_once = refusing  # type: ignore[method-assign]
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            await client.send(block(writer, 1, [payload(1)], 11))
            await client.expect_closed()
            again = await RawClient.connect(server.port)
            setup = await again.request(SetupAppend(3, writer, segment, ""))
            assert setup.last_event_number == NULL_ATTRIBUTE_VALUE  # type: ignore[union-attr]
            await again.send(block(writer, 1, [payload(1)], 12))
            (ack,) = await again.receive_many(1)
            assert isinstance(ack, DataAppended) and ack.event_number == 1, ack
            assert await read_all(again, segment) == [payload(1)]
            server.check_invariants()
            await again.close()
    run(scenario)


def test_large_and_small_blocks_mixed_arrive_intact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Blocks larger than one socket read are received into buffers of their own size; mixed with
    small ones in one pipeline, every byte still lands in order."""
    import random
    rng = random.Random(5)
    sizes = [rng.choice([10, 1000, 60_000, 70_000, 300_000, 1_500_000]) for _ in range(40)]

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            client = await RawClient.connect(server.port)
            segment = "sc/mixed"
            await client.request(CreateSegment(1, segment, ""))
            writer = uuid.uuid4()
            await client.request(SetupAppend(2, writer, segment, ""))
            payloads = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
            await client.send(*(block(writer, n + 1, [p], n + 10) for n, p in enumerate(payloads)))
            acks = await client.receive_many(len(payloads), seconds=20)
            assert [a.event_number for a in acks] == list(range(1, len(payloads) + 1))  # type: ignore[union-attr]
            assert await read_all(client, segment) == payloads
            server.check_invariants()
            await client.close()
    run(scenario)
