"""The byte-stream writer and reader over a single-segment stream, against a node over TCP: raw bytes
(no framing) exactly once across broken connections, a second writer detected, streams that are not
byte streams refused, the blocking flavour."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from millstream.errors import BadOffsetError, InvalidArgumentError, ObjectClosedError, StreamSegmentTruncatedError
from tests.large_events.helpers import create_stream, node_and_client, run, segment_bytes


def test_raw_bytes_arrive_once_in_order_across_broken_connections(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/bytes")
            writer = await client.byte_stream_writer("le/bytes", chunk_bytes=1000, unacked_bytes_max=4000)
            rng = random.Random(5)
            written = bytearray()
            for round_ in range(40):
                data = rng.randbytes(rng.randrange(1, 3000))
                assert await writer.write(data) == len(data)
                written += data
                if round_ % 9 == 4:
                    for connection in client.pool.connections():
                        connection.close()
            await writer.flush()
            assert writer.offset == len(written) == await writer.tail_offset()
            assert writer.pipeline.reconnects >= 1
            reader = await client.open_byte_stream_reader("le/bytes")
            assert await segment_bytes(client, reader.segment) == bytes(written)
            # A second writer picks up at the end; the first, still open, is now behind: its next bytes
            # are refused rather than written over or after someone else's.
            second = await client.byte_stream_writer("le/bytes")
            await second.write(b"second")
            await second.close()
            await writer.write(b"x" * 1000)
            with pytest.raises(BadOffsetError, match="another writer"):
                await writer.flush()
            with pytest.raises(BadOffsetError):
                await writer.close()  # (closed, with the error that failed it)
            assert writer.closed
            # Truncation through the writer; the reader sees it.
            await second.close()  # (closing twice is fine)
            with pytest.raises(ObjectClosedError):
                await second.write(b"late")
            fresh = await client.byte_stream_writer("le/bytes")
            await fresh.truncate_data_before(100)
            with pytest.raises(StreamSegmentTruncatedError):
                await client.byte_stream_reader(reader.segment).read()
            tail = client.byte_stream_reader(reader.segment, offset=100)
            assert (await tail.read(10)) == bytes(written[100:110])
            await fresh.close()
    run(scenario)


def test_only_single_segment_streams_are_byte_streams_and_the_blocking_flavour(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/wide", segments=2)
            with pytest.raises(InvalidArgumentError, match="exactly one"):
                await client.byte_stream_writer("le/wide")
            with pytest.raises(InvalidArgumentError, match="exactly one"):
                await client.open_byte_stream_reader("le/wide")
    run(scenario)
    import millstream
    from millstream.client import RetentionPolicy, ScalingPolicy, StreamConfig, connect

    with millstream.standalone(tmp_path / "blocking") as node, connect(node.uri) as client:
        client.stream_manager().create_scope("le", exist_ok=True)
        client.stream_manager().create_stream("le/b", StreamConfig(scaling=ScalingPolicy.fixed(1),
                                                                   retention=RetentionPolicy.none()))
        with client.byte_stream_writer("le/b") as writer:
            writer.write(b"hello, ")
            writer.write(memoryview(b"bytes"))
            writer.flush()
            assert writer.tail_offset() == 12
        with client.byte_stream_reader("le/b") as reader:
            assert reader.read(100) == b"hello, bytes"
