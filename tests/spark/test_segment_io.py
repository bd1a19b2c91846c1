"""Events to and from segment buffers (plain Python, milliseconds): ``scan_frames`` finds exactly the
frames a header-by-header walk finds, in runs of equal lengths and mixed ones, cut anywhere, and stops
at a header that is not an event's; blocks split within their bounds; ``frame_events`` frames an Arrow
array of payloads byte for byte as the writer frames one event; ``route`` sends every row where the
stream writer's router would, keeping each segment's rows in order; ``TransactionAppender`` hands every
byte to its segment in order, a buffer at a time (few hand-overs to the client's loop thread)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream import limits
from millstream.client import SegmentWithRange, StreamRouter
from millstream.errors import PayloadTooLargeError
from millstream.naming import segment_id, stream_segment_name
from millstream.spark._segment_io import (
    FrameBlock,
    MalformedFrameError,
    TransactionAppender,
    frame_events,
    route,
    scan_frames,
)


def frames(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">ii", 0, len(p)) + p for p in payloads)


def walk(data: bytes) -> tuple[list[int], int]:
    """The reference: the frames' starts found header by header, and where the last whole one ends."""
    starts, position = [], 0
    while len(data) - position >= 8:
        kind, length = struct.unpack_from(">ii", data, position)
        if kind != 0 or length < 0:
            raise MalformedFrameError(position, kind, length)
        if position + 8 + length > len(data):
            break
        starts.append(position)
        position += 8 + length
    return starts, position


# Runs of equal lengths (what the strided check takes) mixed with single events of other lengths.
runs = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 80)), max_size=12)


@given(runs, st.data())
def test_scan_frames_finds_what_a_header_walk_finds(shape: list[tuple[int, int]], data: st.DataObject) -> None:
    payloads = [bytes([65 + index % 26]) * length for index, (length, count) in enumerate(shape)
                for _ in range(count)]
    buffer = frames(payloads)
    cut = data.draw(st.integers(0, len(buffer)))
    starts, end = scan_frames(buffer[:cut])
    assert (starts.tolist(), end) == walk(buffer[:cut])
    assert starts.dtype == np.int64


def test_a_long_run_of_equal_events_and_a_mixed_tail() -> None:
    payloads = [b"x" * 90] * 5000 + [b"y" * 7, b"z" * 90, b""] + [b"w" * 3] * 40
    starts, end = scan_frames(frames(payloads))
    assert (starts.tolist(), end) == walk(frames(payloads)) and len(starts) == len(payloads)


@pytest.mark.parametrize(("header", "position"), [((1, 5), 0), ((0, -1), 13),
                                                   ((0, limits.EVENT_LENGTH_BYTES_MAX + 1), 13)])
def test_a_header_that_is_not_an_events_is_named_by_its_position(header: tuple[int, int], position: int) -> None:
    good = frames([b"hello"])  # 13 bytes
    bad = struct.pack(">ii", *header) + b"abcde"
    with pytest.raises(MalformedFrameError) as caught:
        scan_frames(bad + good if position == 0 else good + bad)
    assert (caught.value.position, caught.value.kind, caught.value.length) == (position, *header)


def test_a_corrupt_header_inside_an_equal_run_is_named_by_its_position() -> None:
    data = bytearray(frames([b"a" * 10] * 100))
    data[50 * 18 + 3] = 1  # the 51st header's type
    with pytest.raises(MalformedFrameError) as caught:
        scan_frames(bytes(data))
    assert (caught.value.position, caught.value.kind) == (50 * 18, 1)


def test_blocks_split_within_their_bounds() -> None:
    payloads = [bytes([n]) * (n % 7) for n in range(100)]
    data = frames(payloads)
    starts, _ = scan_frames(data)
    block = FrameBlock(data, 1000, starts)
    assert block.events() == [(1000 + int(s), p) for s, p in zip(starts, payloads, strict=True)]
    assert block.lengths().tolist() == [len(p) for p in payloads]
    pieces = list(block.split(rows_max=7, bytes_max=50))
    assert [e for piece in pieces for e in piece.events()] == block.events()
    assert all(piece.count <= 7 and (len(piece.data) <= 50 or piece.count == 1) for piece in pieces)
    assert [piece.base_offset for piece in pieces] == [piece.events()[0][0] for piece in pieces]
    assert list(block.split(rows_max=1000, bytes_max=1 << 20)) == [block]
    big = FrameBlock(frames([b"q" * 100]), 0, np.array([0], dtype=np.int64))
    assert [p.count for p in big.split(rows_max=5, bytes_max=10)] == [1], "an event larger than the bound goes alone"


@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(0, 5))
def test_frame_events_frames_as_the_writer_does(payloads: list[bytes], skip: int) -> None:
    array = pa.array(payloads, type=pa.binary()).slice(min(skip, len(payloads)))
    assert bytes(frame_events(array)) == frames(payloads[min(skip, len(payloads)):])


def test_a_payload_beyond_the_event_limit_is_refused() -> None:
    array = pa.array([b"ok", b"x" * (limits.EVENT_LENGTH_BYTES_MAX + 1)], type=pa.binary())
    with pytest.raises(PayloadTooLargeError, match="exceeds the limit"):
        frame_events(array)


def stream_segments(count: int) -> list[SegmentWithRange]:
    bounds = np.linspace(0.0, 1.0, count + 1).tolist()
    return [SegmentWithRange(segment_id(0, n), bounds[n], bounds[n + 1], stream_segment_name("sc", "st",
                                                                                             segment_id(0, n)))
            for n in range(count)]


@given(st.integers(1, 5), st.lists(st.one_of(st.none(), st.sampled_from([f"key-{n}" for n in range(12)])),
                                   min_size=1, max_size=80))
def test_route_sends_each_row_where_the_writers_router_would(count: int, keys: list[str | None]) -> None:
    segments = stream_segments(count)
    values = pa.array([f"row-{n}".encode() for n in range(len(keys))], type=pa.binary())
    parts = route(values, pa.array(keys, type=pa.string()), StreamRouter(segments))
    reference = StreamRouter(segments)
    seen = []
    for name, part in parts:
        rows = [int(v.decode().split("-")[1]) for v in part.to_pylist()]
        assert rows == sorted(rows), "a segment's rows keep their order"
        for row in rows:
            if keys[row] is not None:
                assert reference.segment_for(keys[row]) == name, f"{keys[row]} routed to {name}"
        keyless = [row for row in rows if keys[row] is None]
        assert not keyless or all(keys[row] is None for row in keyless)
        seen.extend(rows)
    assert sorted(seen) == list(range(len(keys))), "every row once"
    assert len({name for name, _ in parts if any(keys[int(v.decode().split('-')[1])] is None
                                                   for v in _.to_pylist())}) <= 1, "keyless rows go to one segment"
    assert route(values, None, StreamRouter(segments))[0][1] is values


class _FakeByteWriter:
    """A segment's raw-append pipeline that records what it is given (and whether it was closed)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    async def write(self, data: memoryview) -> int:
        assert not self.closed
        self.data += data
        return len(data)

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class _FakeLoopClient:
    """What ``TransactionAppender`` uses of a blocking client: ``run`` (counted: each is a hand-over
    to the client's event-loop thread) and ``async_client.segment_byte_writer``."""

    def __init__(self) -> None:
        self.runs = 0
        self.writers: dict[str, _FakeByteWriter] = {}
        self.async_client = self

    def segment_byte_writer(self, segment: str, *, base_offset: int) -> _FakeByteWriter:
        assert base_offset == 0 and segment not in self.writers
        return self.writers.setdefault(segment, _FakeByteWriter())

    def run(self, coroutine: Any) -> Any:
        self.runs += 1
        return asyncio.run(coroutine)


@given(st.lists(st.tuples(st.sampled_from(["seg-a", "seg-b", "seg-c"]), st.binary(min_size=0, max_size=300)),
                max_size=60),
       st.integers(1, 2_000))
def test_transaction_appender_hands_bytes_to_the_loop_a_buffer_at_a_time_in_order(
        pieces: list[tuple[str, bytes]], buffer_bytes: int) -> None:
    # Each hand-over to the loop's thread cost 10-25 ms under load (a GIL hand-over each way): the
    # appender made one per append (per Arrow batch and segment), now one per buffer_bytes and one to close.
    client = _FakeLoopClient()
    appender = TransactionAppender(client, buffer_bytes=buffer_bytes)  # type: ignore[arg-type]  # a fake client
    for segment, data in pieces:
        appender.append(segment, data)
    appender.close()
    total = sum(len(data) for _, data in pieces)
    assert client.runs <= total // buffer_bytes + 1
    for segment in ("seg-a", "seg-b", "seg-c"):
        expected = b"".join(data for name, data in pieces if name == segment)
        writer = client.writers.get(segment)
        assert (b"" if writer is None else bytes(writer.data)) == expected, f"{segment}: every byte, in order"
        assert writer is None or writer.closed


def test_transaction_appender_writes_nothing_it_discards() -> None:
    client = _FakeLoopClient()
    appender = TransactionAppender(client, buffer_bytes=1_000)  # type: ignore[arg-type]  # a fake client
    appender.append("seg-a", b"x" * 10)
    appender.discard()
    assert client.writers == {} and client.runs == 1
