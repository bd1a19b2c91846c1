"""The ReadIndex: reads by offset across blocks, and tail reads that wait on an injected clock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.errors import (
    BadOffsetError,
    InvalidArgumentError,
    StreamSegmentNotExistsError,
    StreamSegmentTruncatedError,
)
from millstream.segmentstore.read_index import (
    BLOCK_LENGTH_BYTES,
    SHARED_APPEND_BYTES_MIN,
    ReadIndex,
    SegmentReadIndex,
)
from millstream.testing.clock import ManualClock


@given(st.lists(st.binary(max_size=3 * BLOCK_LENGTH_BYTES // 2), max_size=6), st.data())
def test_reads_return_exactly_what_was_appended(appends: list[bytes], data: st.DataObject) -> None:
    index = SegmentReadIndex()
    for chunk in appends:
        index.append(index.length, chunk)
    whole = b"".join(appends)
    assert index.length == len(whole)
    offset = data.draw(st.integers(0, len(whole)))
    length = data.draw(st.integers(0, len(whole) - offset))
    assert index.read_memory(offset, length) == whole[offset:offset + length]


_SIZES = st.sampled_from([1, 100, SHARED_APPEND_BYTES_MIN - 1, SHARED_APPEND_BYTES_MIN, BLOCK_LENGTH_BYTES - 5,
                          BLOCK_LENGTH_BYTES + 3, 2 * BLOCK_LENGTH_BYTES])


@given(st.lists(st.tuples(_SIZES, st.sampled_from([bytes, bytearray, memoryview])), min_size=1, max_size=8),
       st.data())
def test_shared_and_copied_appends_read_back_and_are_counted(appends: list[tuple[int, type]],
                                                             data: st.DataObject) -> None:
    """Large ``bytes`` appends are kept by reference, everything else is copied into blocks: either
    way reads return what was appended, a mutable source changed afterwards changes nothing, and the
    cache counts every byte once (and frees them all on release)."""
    owner = ReadIndex(ManualClock())
    index = SegmentReadIndex(owner)
    expected = bytearray()
    sources: list[bytearray] = []
    for number, (size, kind) in enumerate(appends):
        chunk = bytes([number % 251 + 1]) * size
        expected += chunk
        if kind is bytes:
            index.append(index.length, chunk)
        else:
            source = bytearray(chunk)
            sources.append(source)
            index.append(index.length, source if kind is bytearray else memoryview(source))
    for source in sources:  # the index copied them: scribbling on them now must not show
        source[:] = bytes(len(source))
    assert index.length == len(expected) == owner.cached_bytes
    offset = data.draw(st.integers(0, len(expected)))
    length = data.draw(st.integers(0, len(expected) - offset))
    assert index.read_memory(offset, length) == expected[offset:offset + length]
    index.release()
    assert owner.cached_bytes == 0


def test_truncate_keeps_what_lies_above_the_start() -> None:
    index = SegmentReadIndex()
    payload = bytes(range(256)) * (3 * BLOCK_LENGTH_BYTES // 256)
    index.append(0, payload)
    index.truncate(BLOCK_LENGTH_BYTES + 7)
    assert index.read_memory(BLOCK_LENGTH_BYTES + 7, 100) == payload[BLOCK_LENGTH_BYTES + 7:BLOCK_LENGTH_BYTES + 107]


async def _pending_read(read_index: ReadIndex, offset: int, wait: float) -> asyncio.Task[object]:
    task = asyncio.get_running_loop().create_task(read_index.read(1, offset, 100, wait))
    for _ in range(5):
        await asyncio.sleep(0)
    return task


def test_a_tail_read_waits_for_data_and_wakes_on_append() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        read_index = ReadIndex(clock)
        read_index.segment(1).append(0, b"abc")
        task = await _pending_read(read_index, 3, wait=5.0)
        assert not task.done()
        read_index.segment(1).append(3, b"de")
        result = await asyncio.wait_for(task, 1)
        assert (result.offset, result.data, result.at_tail, result.end_of_segment) == (3, b"de", True, False)

    asyncio.run(scenario())


def test_a_tail_read_times_out_empty_when_the_clock_passes_its_deadline() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        read_index = ReadIndex(clock)
        read_index.segment(1).append(0, b"abc")
        task = await _pending_read(read_index, 3, wait=5.0)
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not task.done()
        clock.advance(0.2)
        result = await asyncio.wait_for(task, 1)
        assert (result.data, result.at_tail, result.end_of_segment) == (b"", True, False)

    asyncio.run(scenario())


def test_a_tail_read_ends_when_the_segment_is_sealed() -> None:
    async def scenario() -> None:
        read_index = ReadIndex(ManualClock())
        read_index.segment(1).append(0, b"abc")
        task = await _pending_read(read_index, 3, wait=5.0)
        read_index.segment(1).seal()
        result = await asyncio.wait_for(task, 1)
        assert (result.data, result.end_of_segment) == (b"", True)

    asyncio.run(scenario())


def test_a_tail_read_fails_when_the_segment_goes_away() -> None:
    async def scenario() -> None:
        read_index = ReadIndex(ManualClock())
        read_index.segment(1)
        task = await _pending_read(read_index, 0, wait=5.0)
        read_index.delete(1)
        with pytest.raises(StreamSegmentNotExistsError):
            await asyncio.wait_for(task, 1)

    asyncio.run(scenario())


def test_reads_outside_the_segment_are_typed_errors() -> None:
    async def scenario() -> None:
        read_index = ReadIndex(ManualClock())
        read_index.segment(1).append(0, b"abcdef")
        read_index.segment(1).truncate(2)
        with pytest.raises(StreamSegmentTruncatedError):
            await read_index.read(1, 1, 10)
        with pytest.raises(BadOffsetError):
            await read_index.read(1, 7, 10)
        with pytest.raises(InvalidArgumentError):
            await read_index.read(1, 2, -1)
        with pytest.raises(StreamSegmentNotExistsError):
            await read_index.read(2, 0, 10)
        assert (await read_index.read(1, 2, 10)).data == b"cdef"

    asyncio.run(scenario())
