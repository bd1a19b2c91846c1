"""Readers: events with their offsets, resuming from an offset, long-poll tail reads that return as
soon as data arrives, the end of a sealed segment, truncation, bytes that are not events."""

from __future__ import annotations

import asyncio

import pytest

from millstream.client import JsonSerializer
from millstream.errors import InvalidArgumentError, ObjectClosedError, StreamSegmentTruncatedError
from millstream.wire import codec
from millstream.wire.codec import MalformedEventError
from millstream.wire.commands import ReadSegment
from tests.client.fake_server import FakeSegment, FakeServer
from tests.client.helpers import client, run


async def fill(server: FakeServer, segment: str, payloads: list[bytes]) -> list[int]:
    """Append framed events straight into the fake store; return their offsets."""
    store = server.segments.setdefault(segment, FakeSegment())
    offsets = []
    for payload in payloads:
        offsets.append(store.length)
        store.data += codec.encode_event(payload)
    store.wake()
    return offsets


def test_events_come_back_in_order_with_their_offsets_and_a_reader_resumes_from_one() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, read_length_bytes=1000) as c:
            payloads = [f"event {i}".encode() * (1 + i % 30) for i in range(500)]
            offsets = await fill(server, "s", payloads)
            reader = c.segment_reader("s")
            seen = []
            while events := await reader.read_events():
                seen.extend(events)
            assert [e.value for e in seen] == payloads
            assert [e.offset for e in seen] == offsets
            assert reader.at_tail and reader.offset == server.segments["s"].length
            assert len(server.blocks_of(ReadSegment)) > 10, "small reads: events span reads"
            resumed = c.segment_reader("s", offset=offsets[321])
            first = await resumed.read_event()
            assert first is not None and first.value == payloads[321] and first.offset == offsets[321]
            resumed.seek(offsets[7])
            again = await resumed.read_event()
            assert again is not None and again.value == payloads[7]
            await reader.close()
            await resumed.close()
            with pytest.raises(ObjectClosedError):
                await reader.read_events()
    run(scenario)


def test_a_tail_read_waits_and_returns_as_soon_as_data_arrives() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            reader = c.segment_reader("s", JsonSerializer())
            assert await reader.read_events(wait_seconds=0) == []
            loop = asyncio.get_running_loop()
            started = loop.time()
            waiting = asyncio.ensure_future(reader.read_event(wait_seconds=30))
            await asyncio.sleep(0.1)
            assert not waiting.done(), "the read is held at the tail"
            async with c.event_writer(["s"], JsonSerializer()) as writer:
                await writer.write_event({"n": 1})
            event = await waiting
            assert event is not None and event.value == {"n": 1} and event.offset == 0
            assert loop.time() - started < 5, "answered when the data came, not at the end of the wait"
            started = loop.time()
            assert await reader.read_event(wait_seconds=0.2) is None
            assert 0.15 < loop.time() - started < 5, "an empty tail read waits for its full wait"
    run(scenario)


def test_iteration_follows_a_segment_until_it_is_sealed_and_read_to_its_end() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            reader = c.segment_reader("s")

            async def produce() -> None:
                async with c.event_writer(["s"]) as writer:
                    for i in range(50):
                        await writer.write_event(b"%d" % i)
                        if i % 10 == 0:
                            await asyncio.sleep(0.01)
                await c.segments().seal("s")

            producing = asyncio.ensure_future(produce())
            values = [event.value async for event in reader]
            await producing
            assert values == [b"%d" % i for i in range(50)]
            assert reader.end_of_segment
            assert await reader.read_events(wait_seconds=5) == [], "nothing more, and no waiting"
    run(scenario)


def test_reading_below_the_start_offset_is_a_typed_error() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            offsets = await fill(server, "s", [b"a", b"b", b"c"])
            await c.segments().truncate("s", offsets[1])
            with pytest.raises(StreamSegmentTruncatedError):
                await c.segment_reader("s").read_events()
            events = await c.segment_reader("s", offset=offsets[1]).read_events()
            assert [e.value for e in events] == [b"b", b"c"]
    run(scenario)


def test_bytes_that_are_not_events_raise_and_the_reader_stays_before_them() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            offsets = await fill(server, "s", [b"good"])
            server.segments["s"].data += b"\x00\x00\x00\x07garbage!"
            reader = c.segment_reader("s")
            assert [e.value for e in await reader.read_events()] == [b"good"]
            with pytest.raises(MalformedEventError):
                await reader.read_events()
            assert reader.offset == offsets[0] + 12
    run(scenario)


def test_a_payload_the_serializer_refuses_raises_after_the_events_before_it() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await fill(server, "s", [b'{"a":1}', b"not json", b'{"c":3}'])
            reader = c.segment_reader("s", JsonSerializer())
            assert [e.value for e in await reader.read_events()] == [{"a": 1}]
            with pytest.raises(InvalidArgumentError):
                await reader.read_events()
            with pytest.raises(InvalidArgumentError):
                await reader.read_events()  # stays before the bad event
    run(scenario)


def test_the_byte_stream_reader_reads_raw_bytes_and_long_polls() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("b")
            server.segments["b"].data += b"0123456789"
            reader = c.byte_stream_reader("b", offset=2)
            assert await reader.read(4) == b"2345"
            assert await reader.read() == b"6789" and reader.at_tail and reader.offset == 10
            waiting = asyncio.ensure_future(reader.read(wait_seconds=30))
            await asyncio.sleep(0.05)
            server.segments["b"].data += b"AB"
            server.segments["b"].wake()
            assert await waiting == b"AB"
            await c.segments().seal("b")
            assert await reader.read(wait_seconds=5) == b"" and reader.end_of_segment
            reader.seek(0)
            assert await reader.read() == b"0123456789AB"
            with pytest.raises(InvalidArgumentError):
                reader.seek(-1)
            await reader.close()
    run(scenario)
