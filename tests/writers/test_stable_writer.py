"""A writer with a stable writer id (``event_writer(stream, serializer, writer_id=...)``): the API, a
restart that replays its source across scaling, and the hold -- each against ``millstream.standalone``.

The stateful test (``tests/stateful/test_stable_writer_vs_model.py``) drives the same writer in
lockstep with the model; the kill campaign (``tests/faults/test_writer_restart_kill.py``) SIGKILLs its
process.  Here: what a user calls, and one race built on purpose (a merge whose predecessors hand
their events over in the wrong order), which without the hold loses an acknowledged event."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import pytest

import millstream as ms
from millstream.client import AsyncClient, ScalingPolicy, SegmentWithRange, StreamConfig, routing_key_fraction
from millstream.client._sequenced_writer import SequencedSegmentWriter
from millstream.errors import InvalidArgumentError, InvalidSequenceError, ObjectClosedError

#: How long a test waits for a condition the implementation must reach (generous: CI is loaded).
WAIT_SECONDS = 30.0


@contextmanager
def node_with_stream(stream: str = "iot/s", segments: int = 2) -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as data, ms.standalone(data) as node:
        with ms.connect(node.uri) as admin:
            admin.stream_manager().create_scope(stream.split("/", maxsplit=1)[0])
            admin.stream_manager().create_stream(stream, StreamConfig(scaling=ScalingPolicy.fixed(segments)))
        yield node


def read_all(uri: str, stream: str) -> list[str]:
    """Every event of every segment the stream ever had, segment by segment in epoch order (so each
    key's events in the order readers get them)."""
    async def read() -> list[str]:
        async with AsyncClient(uri) as client:
            scope, name = stream.split("/")
            slices = await client.controller().get_segments_between(scope, name, None, None)
            events: list[str] = []
            for piece in slices:
                segment = piece.segment.name
                length = (await client.segments().info(segment)).length
                data = b""
                while len(data) < length:
                    data += bytes((await client.segments().read(segment, len(data))).data)
                events.extend(event.decode() for event in _events(data))
            return events
    return asyncio.run(read())


def keys_in_halves() -> tuple[str, str]:
    """A routing key in [0, 0.5) and one in [0.5, 1)."""
    low = next(f"k{n}" for n in range(1000) if routing_key_fraction(f"k{n}") < 0.5)
    high = next(f"k{n}" for n in range(1000) if routing_key_fraction(f"k{n}") >= 0.5)
    return low, high


# --- The API: misuse is a typed error, and changes nothing -------------------------------------------


def test_misuse_is_a_typed_error_and_writes_nothing() -> None:
    with node_with_stream() as node, ms.connect(node.uri) as client:
        with client.event_writer("iot/s", ms.StringSerializer()) as plain, \
                pytest.raises(InvalidSequenceError, match="random writer id"):
            plain.write_event("x", routing_key="k", sequence=1)  # type: ignore[arg-type]
        for bad in ("", "x" * 257, 7, "tab\there"):
            with pytest.raises(InvalidArgumentError, match="stable writer id"):
                client.event_writer("iot/s", writer_id=bad)  # type: ignore[call-overload]
        with pytest.raises(InvalidArgumentError, match="needs a stream"):
            client.event_writer(["iot/s/0.#epoch.0"], writer_id="w")  # type: ignore[call-overload]
        with client.event_writer("iot/s", ms.StringSerializer(), writer_id="ingest-7") as writer:
            assert writer.write_event("a", routing_key="k", sequence=5)
            for bad_sequence in (5, 4, 0, -1, 2**63, True, 6.0, None):
                with pytest.raises(InvalidSequenceError):
                    writer.write_event("bad", routing_key="k", sequence=bad_sequence)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="needs a routing key"):
                writer.write_event("b", routing_key=None, sequence=6)  # type: ignore[arg-type]
            assert writer.last_sequence == 5  # refused calls took no sequence
            assert writer.write_event("b", routing_key="k", sequence=6)
            writer.flush()
            assert writer.deduplication_floor("k") == 0  # (what the stream held when it started)
        with client.event_writer("iot/s", ms.StringSerializer(), writer_id="ingest-7") as again:
            assert again.deduplication_floor("k") == 6
            assert not again.write_event("b", routing_key="k", sequence=6)
            assert again.duplicates == 1
        assert read_all(node.uri, "iot/s") == ["a", "b"]


def test_the_blocking_flavour_counts_what_it_took_and_has_nothing_in_doubt_once_flushed() -> None:
    """``events_written`` counts every event ``write_event`` took, dropped duplicates included (places in
    the writer's sequence, as ``InDoubtEvent.sequence`` numbers them); after a flush nothing is in doubt."""
    with node_with_stream() as node, ms.connect(node.uri) as client:
        with client.event_writer("iot/s", ms.StringSerializer(), writer_id="ingest-7") as writer:
            assert writer.events_written == 0 and writer.in_doubt_events() == ()
            for sequence in (1, 2, 3):
                assert writer.write_event(f"e{sequence}", routing_key=f"k{sequence}", sequence=sequence)
            writer.flush()
            assert writer.in_doubt_events() == () and writer.events_written == 3
        with client.event_writer("iot/s", ms.StringSerializer(), writer_id="ingest-7") as again:
            assert [again.write_event(f"e{n}", routing_key=f"k{n}", sequence=n) for n in (2, 3, 4)] == [
                False, False, True]
            again.flush()
            assert again.in_doubt_events() == () and again.events_written == 3 and again.duplicates == 2
            with pytest.raises(ObjectClosedError, match="without flushing"):
                again.close(flush=False)  # (as every writer's: it says the writer was abandoned)
            assert again.in_doubt_events() == ()  # (everything was acknowledged: nothing is lost)
        assert sorted(read_all(node.uri, "iot/s")) == ["e1", "e2", "e3", "e4"]


async def _async_misuse(uri: str) -> None:
    async with AsyncClient(uri) as client:
        plain = client.event_writer("iot/s")
        with pytest.raises(InvalidSequenceError):
            await plain.write_event(b"x", routing_key="k", sequence=1)  # type: ignore[arg-type]
        await plain.close()
        writer = client.event_writer("iot/s", writer_id="async-7")
        with pytest.raises(InvalidArgumentError, match="not learnt the stream"):
            writer.deduplication_floor("k")
        assert await writer.write_event(b"a", routing_key="k", sequence=10)
        with pytest.raises(InvalidSequenceError, match="does not exceed 10"):
            await writer.write_event(b"b", routing_key="k", sequence=10)
        await writer.close()


def test_the_asyncio_flavour_refuses_the_same_misuse() -> None:
    with node_with_stream() as node:
        asyncio.run(_async_misuse(node.uri))


# --- A restart replays its source: exactly once, across scaling --------------------------------------


def write_source(uri: str, source: Sequence[tuple[str, str]], start: int, end: int, *, flush: bool,
                 between: Callable[[int], None] = lambda n: None) -> list[bool]:
    """One process of the application: write offsets ``start..end`` (1-based) of ``source`` with the
    stable id ``ingest-7``; returns what ``write_event`` said of each."""
    results = []
    client = ms.connect(uri)
    writer = client.event_writer("iot/s", ms.StringSerializer(), writer_id="ingest-7")
    for n in range(start, end + 1):
        key, value = source[n - 1]
        results.append(writer.write_event(value, routing_key=key, sequence=n))
        between(n)
    if flush:
        writer.flush()
        client.close()
    return results


def test_a_restarted_writer_drops_what_the_stream_holds_and_writes_the_rest_across_scaling() -> None:
    source = [(f"sensor-{n % 7}", f"e{n}") for n in range(1, 121)]
    with node_with_stream() as node, ms.connect(node.uri) as admin:
        manager = admin.stream_manager()

        def scale(n: int) -> None:
            if n == 30:
                widest = max(manager.current_segments("iot/s").segments, key=lambda s: s.key_end - s.key_start)
                manager.split_segment("iot/s", widest.segment_id, 2)
            if n == 60:
                first, second = manager.current_segments("iot/s").segments[:2]
                manager.merge_segments("iot/s", [first.segment_id, second.segment_id])

        first = write_source(node.uri, source, 1, 80, flush=True, between=scale)
        assert all(first)
        # The process "dies" after 80 (everything durable); the application resumes from offset 41.
        again = write_source(node.uri, source, 41, 120, flush=True,
                             between=lambda n: manager.split_segment(
                                 "iot/s", manager.current_segments("iot/s").segments[-1].segment_id, 2)
                             if n == 100 else None)
        assert again == [False] * 40 + [True] * 40
        events = read_all(node.uri, "iot/s")
        assert sorted(events, key=lambda e: int(e[1:])) == [value for _, value in source]
        # Per key, in sequence order.
        for key in {k for k, _ in source}:
            mine = [e for e in events if source[int(e[1:]) - 1][0] == key]
            assert mine == sorted(mine, key=lambda e: int(e[1:])), key


# --- The hold ----------------------------------------------------------------------------------------


class GatedBinding:
    """The writer's stream binding, except that ``successors`` of one segment waits until ``opened()``."""

    def __init__(self, inner: Any, gated: str, opened: Callable[[], Any]) -> None:
        self._inner = inner
        self._gated = gated
        self._opened = opened
        self.waited = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def successors(self, sealed: SegmentWithRange) -> Sequence[SegmentWithRange]:
        if sealed.name == self._gated:
            self.waited = True
            deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
            while not await self._opened():
                assert asyncio.get_running_loop().time() < deadline, "the successor neither held nor sent"
                await asyncio.sleep(0.001)
        return await self._inner.successors(sealed)


async def _merge_race(uri: str) -> list[bytes]:
    low, high = keys_in_halves()
    async with AsyncClient(uri) as client:
        writer = client.event_writer("iot/s", writer_id="merge-race")
        await writer.ready()
        core = writer.core
        router = core.router
        assert router is not None
        first = router.segment_for(low)  # the segment of event 1
        segments = await client.stream_manager().current_segments("iot/s")
        # The stream merges its two segments before the writer sends anything: both events meet a seal.
        await client.stream_manager().merge_segments("iot/s", [s.segment_id for s in segments.segments])
        merged = (await client.stream_manager().current_segments("iot/s")).segments[0].name

        async def opened() -> bool:
            """The merged segment's writer holds event 2 back -- or (without the hold) stored it."""
            successor = core._writers.get(merged)
            if isinstance(successor, SequencedSegmentWriter) and successor.held:
                return True
            return (await client.segments().info(merged)).length > 0
        gate = GatedBinding(core._binding, first, opened)
        core._binding = gate
        core._stream = gate  # type: ignore[assignment]
        # Event 1 (low) waits in the first predecessor's hand-over until the merged segment either held
        # event 2 (high) back or stored it.
        assert await writer.write_event(b"one", routing_key=low, sequence=1)
        assert await writer.write_event(b"two", routing_key=high, sequence=2)
        await writer.flush()
        assert gate.waited
        result = await client.segments().read(merged, 0)
        await writer.close()
        return [bytes(event) for event in _events(bytes(result.data))]


async def _merge_race_in_one_block(uri: str) -> list[bytes]:
    """The hold must judge a block by its *last* sequence: the predecessor holding events 1 and 3 hands
    them over first -- into one block of the merged successor, numbered 3 -- while event 2 waits in the
    other predecessor.  Sent, the block stores 3, and the store then refuses 2 as stored."""
    low, high = keys_in_halves()
    async with AsyncClient(uri) as client:
        writer = client.event_writer("iot/s", writer_id="merge-race-block")
        await writer.ready()
        core = writer.core
        router = core.router
        assert router is not None
        lower, upper = router.segment_for(low), router.segment_for(high)
        segments = await client.stream_manager().current_segments("iot/s")
        await client.stream_manager().merge_segments("iot/s", [s.segment_id for s in segments.segments])
        merged = (await client.stream_manager().current_segments("iot/s")).segments[0].name
        all_written = asyncio.Event()

        async def written() -> bool:
            """The lower predecessor hands over once events 1 and 3 are both in it (in two blocks:
            the first leaves at once, the second waits behind it -- one block in the successor)."""
            return all_written.is_set()

        async def opened() -> bool:
            """The merged segment's writer holds the block back -- or (holding by its first
            sequence) stored it."""
            successor = core._writers.get(merged)
            if isinstance(successor, SequencedSegmentWriter) and successor.held:
                return True
            return (await client.segments().info(merged)).length > 0
        gate = GatedBinding(GatedBinding(core._binding, lower, written), upper, opened)
        core._binding = gate
        core._stream = gate  # type: ignore[assignment]
        assert await writer.write_event(b"one", routing_key=low, sequence=1)
        assert await writer.write_event(b"two", routing_key=high, sequence=2)
        assert await writer.write_event(b"three", routing_key=low, sequence=3)
        all_written.set()
        await writer.flush()
        assert gate.waited
        result = await client.segments().read(merged, 0)
        await writer.close()
        return [bytes(event) for event in _events(bytes(result.data))]


def _events(data: bytes) -> Iterator[bytes]:
    position = 0
    while position < len(data):
        length = int.from_bytes(data[position + 4:position + 8], "big")
        yield data[position + 8:position + 8 + length]
        position += 8 + length


def test_a_merged_successor_holds_a_later_sequence_until_the_other_predecessor_hands_over() -> None:
    """The merge of two segments while the writer has event 1 in one and event 2 in the other: the
    second predecessor's hand-over finishes first.  The successor must hold event 2 until event 1
    arrives (else the store, having stored 2, refuses 1 as stored: acknowledged and lost)."""
    with node_with_stream() as node:
        assert asyncio.run(_merge_race(node.uri)) == [b"one", b"two"]


def test_a_merged_successor_holds_a_block_whose_last_sequence_is_above_what_a_predecessor_still_has() -> None:
    """As above, but the predecessor that hands over first brings events 1 and 3 (one block in the
    successor) while event 2 is still in the other: the block's first sequence is below 2 and its last
    above it, and it must be held (else 3 is stored, the store refuses 2 as stored: lost)."""
    with node_with_stream() as node:
        assert asyncio.run(_merge_race_in_one_block(node.uri)) == [b"one", b"two", b"three"]


def test_stable_wire_writer_ids_are_per_segment_and_never_random_ones() -> None:
    from millstream.client._sequenced_writer import wire_writer_id
    a, b = wire_writer_id("ingest-7", "iot/s/0.#epoch.0"), wire_writer_id("ingest-7", "iot/s/1.#epoch.0")
    assert a != b and a == wire_writer_id("ingest-7", "iot/s/0.#epoch.0")
    assert a.version == 5 and UUID(int=a.int).version == 5  # a random writer's id is a version 4 UUID
