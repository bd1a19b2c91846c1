"""What a bounded reader of a stream (a batch job, ``millstream.spark``'s source and sink) asks the
client, through public methods rather than ``AsyncClient.controller()``: the segments between two
stream cuts (``segments_between``), whether a cut is a position of the stream now (``check_cut``),
and a writer of self-framed bytes into a transaction's segment (``segment_byte_writer``) -- against
``millstream.standalone`` over TCP."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

import millstream
from millstream.client import AsyncClient, ScalingPolicy, StreamConfig, StreamCut
from millstream.errors import BadOffsetError, InvalidArgumentError, InvalidStreamCutError
from millstream.standalone import Node
from tests.readers.helpers import run

STREAM = "sc/ranges"


def frames(payloads: list[bytes]) -> bytes:
    """Events framed as a writer frames them: type 0, length, payload (big-endian 32-bit integers)."""
    return b"".join(struct.pack(">ii", 0, len(p)) + p for p in payloads)


async def write(client: AsyncClient, count: int, prefix: str) -> None:
    writer = client.event_writer(STREAM)
    for n in range(count):
        await writer.write_event(f"{prefix}{n}".encode(), routing_key=f"k{n}")
    await writer.close()


def test_segments_between_two_cuts_across_a_split_and_checking_cuts(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path)
        await node.start()
        try:
            async with AsyncClient(node.uri) as client:
                manager = client.stream_manager()
                await manager.create_scope("sc", exist_ok=True)
                await manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(1)))
                await write(client, 10, "a")
                middle = await manager.tail_cut(STREAM)
                [first] = list(middle.positions)
                await manager.split_segment(STREAM, first)
                await write(client, 10, "b")
                tail = await manager.tail_cut(STREAM)

                everything = await manager.segments_between(STREAM, None, tail)
                assert everything[0].segment.segment_id == first
                assert everything[0].start_offset == 0 and everything[0].end_offset == middle.positions[first]
                successors = everything[1:]
                assert len(successors) == 2 and all(s.predecessors == frozenset({first}) for s in successors)
                current = await manager.current_segments(STREAM)
                assert {s.segment.segment_id for s in successors} == {s.segment_id for s in current.segments}
                assert all(s.end_offset == tail.positions[s.segment.segment_id] for s in successors)
                # From the middle: the sealed segment has nothing left; no end bound: open ends.
                later = await manager.segments_between(STREAM, middle)
                assert {s.segment.segment_id for s in later if s.end_offset is None} \
                    == {s.segment.segment_id for s in successors}
                # The blocking flavour answers the same.
                with millstream.connect(node.uri) as blocking:
                    assert await asyncio.to_thread(blocking.stream_manager().segments_between, STREAM, None,
                                                   tail) == everything

                await manager.check_cut(STREAM, middle)
                await manager.check_cut(STREAM, tail)
                with pytest.raises(InvalidStreamCutError):
                    await manager.segments_between(STREAM, tail, middle)  # an end before the start
                with pytest.raises(InvalidStreamCutError):
                    await manager.check_cut(STREAM, StreamCut("sc/other", dict(middle.positions)))
                with pytest.raises(InvalidStreamCutError):
                    await manager.check_cut(STREAM, StreamCut(STREAM, {first: 3}))  # not an event boundary
                with pytest.raises(InvalidArgumentError, match="StreamCut"):
                    await manager.segments_between(STREAM, {first: 0})  # type: ignore[arg-type]
                with pytest.raises(InvalidArgumentError, match="StreamCut"):
                    await manager.check_cut(STREAM, "head")  # type: ignore[arg-type]
                # After truncation at the middle, a cut before it is no position of the stream.
                await manager.truncate_stream(STREAM, middle)
                with pytest.raises(InvalidStreamCutError):
                    await manager.check_cut(STREAM, StreamCut(STREAM, {first: 0}))
        finally:
            await node.stop()

    run(scenario)


def test_a_segment_byte_writer_fills_a_transaction_segment_with_frames_read_back_as_events(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path)
        await node.start()
        try:
            async with AsyncClient(node.uri) as client:
                manager = client.stream_manager()
                await manager.create_scope("sc", exist_ok=True)
                await manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(1)))
                with pytest.raises(InvalidArgumentError, match="base_offset"):
                    client.segment_byte_writer("sc/ranges/0", base_offset=-1)
                with pytest.raises(InvalidArgumentError, match="segment's name"):
                    client.segment_byte_writer(None, base_offset=0)  # type: ignore[arg-type]
                txn = await client.transactional_writer(STREAM, lease_seconds=60).begin()
                segment = txn.info.transaction_segments[0].name
                payloads = [f"event {n}".encode() for n in range(100)]
                writer = client.segment_byte_writer(segment, base_offset=0)
                await writer.write(frames(payloads[:60]))
                await writer.write(frames(payloads[60:]))
                await writer.close()
                assert writer.offset == len(frames(payloads))
                await client.commit_transactions(STREAM, [txn.txn_id])
                tail = await manager.tail_cut(STREAM)
                [piece] = await manager.segments_between(STREAM, None, tail)
                reader = client.segment_reader(piece.segment.name)
                read: list[bytes] = []
                while len(read) < len(payloads):
                    events = await reader.read_events(wait_seconds=1.0)
                    assert events, "the committed events must be readable"
                    read.extend(e.value for e in events)
                await reader.close()
                assert read == payloads

                # The caller must be the segment's only writer: a byte appended by someone else fails it.
                other = await client.transactional_writer(STREAM, lease_seconds=60).begin()
                target = other.info.transaction_segments[0].name
                first = client.segment_byte_writer(target, base_offset=0)
                await first.write(frames([b"mine"]))
                await first.flush()
                late = client.segment_byte_writer(target, base_offset=0)
                await late.write(frames([b"theirs"]))
                with pytest.raises(BadOffsetError):
                    await late.close()  # (it stops all the same)
                assert late.closed
                await first.close()
        finally:
            await node.stop()

    run(scenario)
