"""Readers and large events, against a node over TCP: small events as before; an event above the
reader's in-memory limit raises ``EventTooLargeError`` (nothing consumed, again and again) until
``EventRead.stream_event()`` opens a bounded ``EventReader`` over exactly its bytes; once consumed
through either path it is not served again; the reader does not advance while an ``EventReader`` is
open; positions and checkpoints count a streamed event as consumed; a group of readers over a
multi-segment stream reads every event once, large ones whole (the history checker agrees); and the
blocking flavour.  Also the stall this fixed: an ordinary event longer than the read length."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from millstream.client import AsyncEventReader, EventRead, ReaderConfig, ReaderGroupConfig
from millstream.errors import EventReaderOpenError, EventTooLargeError, InvalidArgumentError, ObjectClosedError
from millstream.testing.history import EventTag, History, Outcome, check
from tests.large_events.helpers import (
    READER,
    SMALL,
    create_stream,
    digest,
    large_payload,
    node_and_client,
    run,
)


async def next_read(reader: object, wait_seconds: float = 2.0) -> EventRead[bytes]:
    """The next event (skipping empty reads and checkpoints), or the EventTooLargeError's EventRead."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while asyncio.get_running_loop().time() < deadline:
        try:
            read = await reader.read_next_event(wait_seconds)  # type: ignore[attr-defined]
        except EventTooLargeError as error:
            assert isinstance(error.event_read, EventRead)
            return error.event_read  # type: ignore[no-any-return]
        if read.event is not None:
            return read  # type: ignore[no-any-return]
    raise AssertionError("no event within 10 s")


async def drain(event_reader: AsyncEventReader, piece: int) -> bytes:
    data = bytearray()
    while True:
        chunk = await event_reader.read(piece)
        if not chunk:
            return bytes(data)
        assert len(chunk) <= piece
        data += chunk


def test_a_large_event_is_streamed_once_and_the_reader_waits_for_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/read")
            writer = client.large_event_writer("le/read", config=SMALL)
            big = large_payload(EventTag("big", 1), 50_000)
            medium = large_payload(EventTag("medium", 1), 6_000)  # streamed by the writer, held by the reader
            await writer.write_event(b"before", routing_key="k")
            for payload in (big, medium):
                event = writer.stream_event("k")
                await event.write(payload)
                await event.commit()
            await writer.write_event(b"after", routing_key="k")
            await writer.close()
            group = await client.reader_group("le/g", config=ReaderGroupConfig(["le/read"]))
            reader = await group.reader("r", config=READER)
            assert (await next_read(reader)).event == b"before"
            # The large event: refused as a value, again and again, until it is streamed.
            with pytest.raises(EventTooLargeError) as first:
                await reader.read_next_event(1.0)
            with pytest.raises(EventTooLargeError) as second:
                await reader.read_next_event(1.0)
            read = first.value.event_read
            assert isinstance(read, EventRead) and read.event is None and read.length == len(big)
            assert (read.segment, read.offset) == (second.value.event_read.segment, second.value.event_read.offset)
            position_before = reader.position()
            streamed = read.stream_event()
            # Consumed: not served again through either path, and the reader does not move meanwhile.
            with pytest.raises(EventReaderOpenError):
                await reader.read_next_event(0.1)
            with pytest.raises(EventReaderOpenError):
                second.value.event_read.stream_event()
            assert reader.position().segments[read.segment] == read.next_offset != \
                position_before.segments[read.segment]
            data = await drain(streamed, 7_777)
            assert digest(data) == digest(big) and len(data) == len(big) == streamed.tell()
            assert await streamed.read(10**9) == b""  # bounded: nothing past the event
            await streamed.close()
            with pytest.raises(ObjectClosedError):
                await streamed.read(1)
            with pytest.raises(InvalidArgumentError, match="no longer"):
                read.stream_event()  # (it was served)
            assert (await next_read(reader)).event == medium
            after = await next_read(reader)
            assert after.event == b"after"
            with pytest.raises(InvalidArgumentError, match="served already"):
                after.stream_event()
            await reader.close()
    run(scenario)


def test_a_group_reads_every_event_once_and_large_ones_whole(tmp_path: Path) -> None:
    keys = [f"key-{i}" for i in range(6)]

    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/many", segments=3)
            history = History()
            writer = client.large_event_writer("le/many", config=SMALL)
            expected: dict[EventTag, str] = {}
            for sequence in range(1, 31):
                key = keys[sequence % len(keys)]
                tag = EventTag("w", sequence)
                history.write_invoked(tag, key=key)
                size = (20_000 + 997 * sequence) if sequence % 3 == 0 else 200 + sequence
                payload = large_payload(tag, size, key=key)
                expected[tag] = digest(payload)
                if sequence % 3 == 0:
                    event = writer.stream_event(key)
                    for start in range(0, size, 4_096):
                        await event.write(payload[start:start + 4_096])
                    await event.commit()
                else:
                    await writer.write_event(payload, routing_key=key)
                history.write_completed(tag, Outcome.ACKED)
            failed = writer.stream_event(keys[0])  # aborted: must never be read
            await failed.write(large_payload(EventTag("w", 31), 30_000, key=keys[0]))
            await failed.close()
            history.write_invoked(EventTag("w", 31), key=keys[0])
            history.write_completed(EventTag("w", 31), Outcome.FAILED)
            await writer.close()
            group = await client.reader_group("le/all", config=ReaderGroupConfig(["le/many"]))
            readers = [await group.reader(f"r{i}", config=READER) for i in range(2)]
            seen: list[bytes] = []
            digests: dict[EventTag, str] = {}

            async def consume(reader: object) -> None:
                while len(seen) < 30:
                    try:
                        read = await reader.read_next_event(0.2)  # type: ignore[attr-defined]
                    except EventTooLargeError as error:
                        async with error.event_read.stream_event() as streamed:
                            data = await drain(streamed, 5_000)
                        payload = data
                    else:
                        if read.event is None:
                            continue
                        payload = read.event
                    tag = EventTag.parse(payload)
                    assert tag is not None
                    digests[tag] = digest(payload)
                    seen.append(payload[:64])  # the tag is all the history checker needs
            await asyncio.gather(*(consume(r) for r in readers))
            history.read_all("all", seen, complete=True)
            report = check(history)
            assert report.ok and report.reads == 30, report.summary()
            assert digests == expected, "every event read whole, byte for byte"
            for reader in readers:
                await reader.close()
    run(scenario, 60)


def test_the_in_memory_limit_is_the_readers_choice_and_the_blocking_flavour_streams_too(tmp_path: Path) -> None:
    import millstream
    from millstream.client import connect

    payload = large_payload(EventTag("b", 1), 40_000)
    with millstream.standalone(tmp_path) as node, connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope("le", exist_ok=True)
        from millstream.client import RetentionPolicy, ScalingPolicy, StreamConfig
        manager.create_stream("le/blocking", StreamConfig(scaling=ScalingPolicy.fixed(1),
                                                          retention=RetentionPolicy.none()))
        with client.large_event_writer("le/blocking", config=SMALL) as writer:
            writer.write_event(b"x")
            event = writer.stream_event("k")
            event.write(payload)
            event.commit()
            writer.write_event(b"y")
        group = client.reader_group("le/bg", ["le/blocking"])
        roomy = ReaderConfig(time_unit_seconds=0.02, heartbeat_seconds=0.05, offline_timeout_seconds=0.0,
                             tail_wait_seconds=0.5, event_in_memory_bytes_max=100_000)
        with group.reader("roomy", config=roomy) as reader:  # a limit above it: a value, as any event
            values = []
            while len(values) < 3:
                read = reader.read_next_event(1.0)
                if read.event is not None:
                    values.append(read.event)
            assert values == [b"x", payload, b"y"]
        # A limit below it (8 KiB): the blocking reader raises, and its EventRead streams the event.
        with client.reader_group("le/bg2", ["le/blocking"]).reader("tight", config=READER) as tight:
            got = []
            while len(got) < 3:
                try:
                    read = tight.read_next_event(1.0)
                except EventTooLargeError as error:
                    with error.event_read.stream_event() as streamed:
                        with pytest.raises(EventReaderOpenError):
                            tight.read_next_event(0.1)
                        got.append(streamed.read(30_000) + streamed.read())
                        assert streamed.remaining == 0
                    continue
                if read.event is not None:
                    got.append(read.event)
            assert got == [b"x", payload, b"y"]
    with pytest.raises(InvalidArgumentError):
        ReaderConfig(event_in_memory_bytes_max=2**31)


def test_an_ordinary_event_longer_than_the_read_length_is_read(tmp_path: Path) -> None:
    """Before large events, a reader asked for one read length ahead and no more, so an event longer
    than that (> 1 MiB, well under the 8 MiB limit) never completed: the reader waited forever."""
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/long")
            writer = client.event_writer("le/long")
            payload = large_payload(EventTag("long", 1), 3_000_000)
            await writer.write_event(payload, routing_key="k")
            await writer.close()
            group = await client.reader_group("le/lg", config=ReaderGroupConfig(["le/long"]))
            reader = await group.reader("r", config=ReaderConfig(time_unit_seconds=0.02, heartbeat_seconds=0.05,
                                                                 offline_timeout_seconds=0.0, tail_wait_seconds=0.5))
            assert (await next_read(reader)).event == payload
            await reader.close()
    run(scenario)
