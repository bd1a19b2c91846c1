"""The batch and columnar write calls (``write_events``, ``write_columns``) of both writer flavours
against the fake server: order per key, exactly once across a cut connection and a restarted server,
all-or-nothing validation, Arrow arrays and (buffer, offsets) pairs.

Each scenario checks what the server stored against what was written, as the per-event writer's tests
do (``tests/client/test_writer.py``): nothing lost, nothing twice, in order per key."""

from __future__ import annotations

import random
import sys
import uuid
from pathlib import Path

import numpy
import pyarrow as pa
import pytest

import millstream
from millstream.client import AsyncEventStreamWriter, JsonSerializer, StringSerializer
from millstream.client._segment_writer_state import (
    ARM_BATCH_TIMER,
    OVER_BUDGET,
    REROUTE,
    SHIPPED,
    SegmentWriterState,
    WriterBudget,
)
from millstream.errors import InvalidArgumentError, ObjectClosedError, OperationUnsupportedError, PayloadTooLargeError
from millstream.testing.clock import ManualClock
from millstream.wire import codec
from millstream.wire.commands import AppendBlock
from tests.client.fake_server import FakeServer, FakeServerThread, Faults
from tests.client.helpers import client, fast_config, run

SEGMENTS = ["t/0", "t/1", "t/2", "t/3"]
BLOCK_BYTES_MAX = 64


def payload(i: int) -> bytes:
    return f"event-{i:06d}".encode()


def keyed(i: int, keys: int = 40) -> tuple[str, bytes]:
    key = f"k{i % keys}"
    return key, f"{key}:{i}".encode()


def assert_in_order_per_key_and_once(stored: dict[str, list[bytes]], count: int) -> None:
    """Every event ``0..count-1`` stored exactly once, each key in one segment, in order."""
    seen: set[int] = set()
    where: dict[str, str] = {}
    for segment, payloads in stored.items():
        last: dict[str, int] = {}
        for raw in payloads:
            key, number = raw.decode().split(":")
            assert int(number) not in seen, f"event {number} stored twice"
            seen.add(int(number))
            assert where.setdefault(key, segment) == segment, f"key {key} went to two segments"
            assert int(number) > last.get(key, -1), f"key {key} out of order"
            last[key] = int(number)
    assert seen == set(range(count))


async def make_segments(c: millstream.client.AsyncClient, names: list[str]) -> None:
    for name in names:
        await c.segments().create(name)


# --- The machine's batch step (SegmentWriterState.write_events), alone -------------------------------


def machine(unacked_bytes_max: int = 10_000) -> tuple[SegmentWriterState, WriterBudget]:
    budget = WriterBudget(unacked_bytes_max)
    state = SegmentWriterState("s", writer_id=uuid.UUID(int=1), budget=budget, clock=ManualClock(),
                               block_bytes_max=BLOCK_BYTES_MAX)
    return state, budget


def test_a_run_fills_blocks_up_to_the_block_size_and_numbers_them_like_single_events() -> None:
    state, budget = machine()
    payloads = [payload(i) for i in range(10)]  # 12 bytes + 8 of header + 1 of key: 21 charged each
    flags = state.write_events(payloads, ["k"] * 10, list(range(1, 11)))
    # Full blocks left (84 >= 64: four events each); the last two wait in a new open block, for its timer.
    assert flags == SHIPPED | ARM_BATCH_TIMER and state._open_count == 2
    assert state.close_open_block()
    blocks = state.take_closed()
    assert [block.event_count for block in blocks] == [4, 4, 2]
    assert [block.last_event_number for block in blocks] == [4, 8, 10]
    assert [p for block in blocks for p in codec.iter_events(block.data)] == payloads
    assert [s for block in blocks for s in block.sequences] == list(range(1, 11))
    assert budget.unacked_bytes == 10 * 21 == sum(block.charge for block in blocks)
    state.check_invariants()


def test_a_run_while_blocks_are_in_flight_leaves_an_open_block_for_the_timer() -> None:
    state, _ = machine()
    state.write_event(payload(0), "k", None)  # goes out alone: now a block is in flight
    state.take_closed()
    flags = state.write_events([payload(1), payload(2)], ["k", "k"], [2, 3])
    assert flags == ARM_BATCH_TIMER and state._open_count == 2  # the target is not reached
    assert state.write_events([payload(3)], ["k"], [4]) == 0  # the same open block: its timer is armed
    state.check_invariants()


def test_a_run_that_reaches_the_target_exactly_closes_the_open_block() -> None:
    """The open block closes when its charge reaches the target, equality included, as a single
    ``write_event`` does.  (A mutation run found nothing pinned the boundary: with ``>`` the block
    stayed open for one more event.)  The target adapts to the arrival rate; here it is set below
    the block size, as a slower writer's would be."""
    state, _ = machine()
    state.write_event(payload(0), "k", None)  # goes out alone: now a block is in flight
    state.take_closed()
    state._target_bytes = state._close_at = 42  # two events of 21 (below the block size, 64)
    flags = state.write_events([payload(1), payload(2)], ["k", "k"], [2, 3])
    assert flags & SHIPPED and state._open_count == 0
    assert [block.event_count for block in state.take_closed()] == [2]
    state.check_invariants()


def test_a_run_is_all_or_nothing_and_answers_over_budget_and_reroute() -> None:
    state, budget = machine(unacked_bytes_max=50)
    too_big = [payload(0), b"x" * (millstream.limits.EVENT_LENGTH_BYTES_MAX + 1)]
    with pytest.raises(PayloadTooLargeError):
        state.write_events(too_big, [None, None], [1, 2])
    assert state._open_count == 0 and budget.unacked_bytes == 0
    assert state.write_events([payload(i) for i in range(3)], [None] * 3, [1, 2, 3]) & OVER_BUDGET
    state.retire()
    assert state.write_events([payload(9)], [None], [4]) == REROUTE
    fresh, _ = machine()
    fresh.stop_taking_events()
    with pytest.raises(ObjectClosedError):
        fresh.write_events([payload(0)], [None], [1])


# --- Order per key, keyless spread, interleaving with write_event ------------------------------------


def test_a_batch_keeps_order_per_key_across_segments_and_with_single_writes() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                for start in range(0, 4000, 500):  # batches, with single events between them
                    events = [keyed(i) for i in range(start, start + 499)]
                    await writer.write_events([e for _, e in events], routing_keys=[k for k, _ in events])
                    key, event = keyed(start + 499)
                    await writer.write_event(event, routing_key=key)
                writer.check_invariants()
                assert writer.events_written == 4000
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, 4000)
            assert sum(1 for name in SEGMENTS if server.payloads(name)) > 1
    run(scenario)


def test_a_keyless_batch_spreads_evenly_like_keyless_single_writes() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                await writer.write_events([payload(i) for i in range(400)])
            assert [len(server.payloads(name)) for name in SEGMENTS] == [100] * 4
            assert sorted(p for name in SEGMENTS for p in server.payloads(name)) == [payload(i) for i in range(400)]
    run(scenario)


def test_a_batch_larger_than_the_budget_is_written_a_slice_at_a_time() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, writer_unacked_bytes_max=4096) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                await writer.write_events([payload(i) for i in range(3000)], routing_keys=["k"] * 3000)
                # Slices of at most half the budget, each added once at most half is unacknowledged.
                assert writer._shared.unacked_bytes <= 4096 + 256
            assert server.payloads("s") == [payload(i) for i in range(3000)]
    run(scenario)


# --- Exactly once across a cut connection and a restarted server -------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("at_block", [1, 3])
def test_a_cut_connection_loses_and_duplicates_nothing_of_a_batch(when: str, at_block: int) -> None:
    """The batch variant of ``test_a_cut_connection_loses_and_duplicates_nothing``: ``before``, the
    block never reached storage; ``after``, it was stored and its acknowledgement lost."""
    seen = 0

    def cut(block: AppendBlock) -> str | None:
        nonlocal seen
        seen += 1
        return when if seen == at_block else None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(cut=cut)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            for start in range(0, 2000, 100):
                await writer.write_events([payload(i) for i in range(start, start + 100)])
            await writer.flush()
            writer.check_invariants()
            assert writer.segment_writers()["s"].reconnects >= 1
            await writer.close()
            assert server.payloads("s") == [payload(i) for i in range(2000)]
    run(scenario)


def test_a_restarted_server_gets_every_event_of_a_batch_exactly_once() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, reconnect_attempts_max=12,
                                                  reconnect_delay_max_seconds=0.05) as c:
            await make_segments(c, SEGMENTS)
            writer = c.event_writer(SEGMENTS)
            first = [keyed(i) for i in range(1000)]
            await writer.write_events([e for _, e in first], routing_keys=[k for k, _ in first])
            await server.stop()  # a crash: every connection cut, nothing listening
            second = [keyed(i) for i in range(1000, 2000)]
            await writer.write_events([e for _, e in second], routing_keys=[k for k, _ in second])
            await server.start()  # back on the same port, with what it had stored
            await writer.flush()
            await writer.close()
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, 2000)
    run(scenario)


# --- Validation: typed, fast, all or nothing ---------------------------------------------------------


def test_bad_batches_are_refused_before_anything_of_them_is_written() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            writer = c.event_writer(SEGMENTS)
            good = [payload(i) for i in range(10)]
            with pytest.raises(InvalidArgumentError, match="10 events and 9 routing keys"):
                await writer.write_events(good, routing_keys=["k"] * 9)
            with pytest.raises(InvalidArgumentError, match="routing key is a str or None, not int"):
                await writer.write_events(good, routing_keys=["k"] * 9 + [7])  # type: ignore[list-item]
            oversized = [*good[:5], b"x" * (millstream.limits.EVENT_LENGTH_BYTES_MAX + 1), *good[5:]]
            with pytest.raises(PayloadTooLargeError, match="event 5 of the batch"):
                await writer.write_events(oversized)
            with pytest.raises(InvalidArgumentError):
                await writer.write_events([*good[:3], None, *good[3:]])  # type: ignore[list-item]
            with pytest.raises(InvalidArgumentError, match="sequence of events"):
                await writer.write_events(b"not a batch")  # type: ignore[arg-type]
            assert writer.events_written == 0
            assert writer.in_doubt_events() == ()
            await writer.write_events(good)
            await writer.close()
            assert sorted(p for name in SEGMENTS for p in server.payloads(name)) == good
    run(scenario)


def test_a_batch_the_serializer_refuses_writes_nothing_and_a_closed_writer_refuses_batches() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"], JsonSerializer())
            with pytest.raises(InvalidArgumentError, match="event 2 of the batch"):
                await writer.write_events([{"a": 1}, {"b": 2}, {"c": {1, 2}}])
            assert writer.events_written == 0
            await writer.write_events([{"a": 1}, {"b": 2}])
            await writer.close()
            assert server.payloads("s") == [b'{"a":1}', b'{"b":2}']
            with pytest.raises(ObjectClosedError):
                await writer.write_events([{"a": 1}])
    run(scenario)


# --- The columnar form -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["binary", "large_binary", "chunked", "buffer_and_offsets"])
def test_columns_are_written_as_their_rows_would_be(kind: str) -> None:
    rows = [keyed(i) for i in range(3000)]
    values: object
    if kind == "buffer_and_offsets":
        data = b"".join(e for _, e in rows)
        offsets = numpy.cumsum([0] + [len(e) for _, e in rows])
        values = (numpy.frombuffer(data, dtype=numpy.uint8), offsets)
        keys: object = [k for k, _ in rows]
    else:
        array = pa.array([e for _, e in rows], type=pa.large_binary() if kind == "large_binary" else pa.binary())
        values = pa.chunked_array([array[:1000], array[1000:]]) if kind == "chunked" else array
        keys = pa.array([k for k, _ in rows], type=pa.string())

    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                await writer.write_columns(values, keys)
                assert writer.events_written == 3000
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, 3000)
    run(scenario)


def test_a_sliced_arrow_array_writes_only_its_slice_and_keys_may_be_any_text_or_null() -> None:
    array = pa.array([payload(i) for i in range(100)])
    keys = pa.array(["ключ-é", "k", None, "🙂"] * 30, type=pa.large_string()).slice(3, 20)

    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                await writer.write_columns(array.slice(10, 20), keys)
                ascii_keys = pa.array([f"key-{i % 7}" for i in range(30)]).slice(5, 20)
                await writer.write_columns(array.slice(40, 20), ascii_keys)
            stored = {name: server.payloads(name) for name in SEGMENTS}
            assert sorted(p for ps in stored.values() for p in ps) == [payload(i) for i in range(10, 30)] + [
                payload(i) for i in range(40, 60)]
            # Events with the same key went to one segment, in order (a null key is no key: spread).
            routed = {name: [int(p.decode().split("-")[1]) for p in ps] for name, ps in stored.items()}
            for name, numbers in routed.items():
                assert numbers == sorted(numbers), name
            pattern = ["ключ-é", "k", None, "🙂"]
            for key in ("ключ-é", "k", "🙂"):  # position j of the slice: pattern[(3 + j) % 4], payload 10 + j
                numbers = {10 + j for j in range(20) if pattern[(3 + j) % 4] == key}
                assert sum(1 for ns in routed.values() if numbers <= set(ns)) == 1, key
            for residue in range(7):  # position j: key-((5 + j) % 7), payload 40 + j
                numbers = {40 + j for j in range(20) if (5 + j) % 7 == residue}
                assert sum(1 for ns in routed.values() if numbers <= set(ns)) == 1, residue
    run(scenario)


def test_bad_columns_are_refused_before_anything_is_written() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            writer: AsyncEventStreamWriter[bytes] = c.event_writer(["s"])
            with pytest.raises(InvalidArgumentError, match="1 null"):
                await writer.write_columns(pa.array([b"a", None, b"c"]), pa.array(["k", "k", "k"]))
            with pytest.raises(InvalidArgumentError, match="3 values and 2 routing keys"):
                await writer.write_columns(pa.array([b"a", b"b", b"c"]), pa.array(["k", "k"]))
            with pytest.raises(InvalidArgumentError, match="binary"):
                await writer.write_columns(pa.array([1, 2, 3]))
            with pytest.raises(InvalidArgumentError, match="offsets"):
                await writer.write_columns((b"abcdef", [0, 4, 2, 6]))
            with pytest.raises(InvalidArgumentError, match="offsets"):
                await writer.write_columns((b"abcdef", [0, 3, 7]))
            too_big = pa.array([b"a", b"x" * (millstream.limits.EVENT_LENGTH_BYTES_MAX + 1)], type=pa.large_binary())
            with pytest.raises(PayloadTooLargeError):
                await writer.write_columns(too_big)
            assert writer.events_written == 0
            strings = c.event_writer(["s"], StringSerializer())
            with pytest.raises(OperationUnsupportedError, match="already serialized"):
                await strings.write_columns(pa.array([b"a"]))
            await writer.close()
            await strings.close()
            assert server.payloads("s") == []
    run(scenario)


def test_without_pyarrow_arrow_columns_name_the_extra_and_pairs_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # ``import pyarrow`` raises ImportError

    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                with pytest.raises(OperationUnsupportedError, match=r"millstream\[spark\]"):
                    await writer.write_columns(object())
                await writer.write_columns((b"abcdef", [0, 2, 6]), ["k", "k"])
            assert server.payloads("s") == [b"ab", b"cdef"]
    run(scenario)


# --- The blocking flavour ----------------------------------------------------------------------------


def test_the_blocking_writer_writes_batches_and_columns_in_order_per_key() -> None:
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        segments = blocking.segments()
        for name in SEGMENTS:
            segments.create(name)
        with blocking.event_writer(SEGMENTS) as writer:
            rows = [keyed(i) for i in range(4000)]
            writer.write_events([e for _, e in rows[:2000]], routing_keys=[k for k, _ in rows[:2000]])
            writer.write_columns(pa.array([e for _, e in rows[2000:]]), pa.array([k for k, _ in rows[2000:]]))
            with pytest.raises(InvalidArgumentError, match="1 events and 2 routing keys"):
                writer.write_events([b"x"], routing_keys=["a", "b"])
            writer.flush()
            assert writer.events_written == 4000
        stored = {}
        for name in SEGMENTS:
            reader = blocking.segment_reader(name)
            values = []
            while (event := reader.read_event()) is not None:
                values.append(event.value)
            stored[name] = values
            reader.close()
        assert_in_order_per_key_and_once(stored, 4000)



def test_batches_follow_a_stream_through_a_split_and_a_merge_in_order_per_key(tmp_path: Path) -> None:
    """Against a standalone node: batches before, between and after two scales of the stream land
    once each, and a reader group reads every key in the order written (across the epochs)."""
    from millstream.client import ScalingPolicy, StreamConfig

    rows = [keyed(i, keys=60) for i in range(6000)]
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as blocking:
        manager = blocking.stream_manager()
        manager.create_scope("b")
        manager.create_stream("b/s", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        with blocking.event_writer("b/s") as writer:
            writer.write_events([e for _, e in rows[:2000]], routing_keys=[k for k, _ in rows[:2000]])
            first = manager.current_segments("b/s").segments
            manager.split_segment("b/s", first[0].segment_id)
            writer.write_columns(pa.array([e for _, e in rows[2000:4000]]), pa.array([k for k, _ in rows[2000:4000]]))
            current = manager.current_segments("b/s").segments
            manager.merge_segments("b/s", [segment.segment_id for segment in current[:2]])
            writer.write_events([e for _, e in rows[4000:]], routing_keys=[k for k, _ in rows[4000:]])
            writer.flush()
            assert writer.core.hand_overs >= 1  # the writer met a seal and moved events on
        group = blocking.reader_group("b/g", ["b/s"])
        read: list[bytes] = []
        with group.reader("r") as reader:
            empty = 0
            while len(read) < len(rows) and empty < 30:  # bounded: 30 empty reads of up to 1 s each
                event = reader.read_next_event(1.0).event
                if event is None:
                    empty += 1
                else:
                    read.append(event)
        group.close()
    numbers_by_key: dict[str, list[int]] = {}
    for raw in read:
        key, number = raw.decode().split(":")
        numbers_by_key.setdefault(key, []).append(int(number))
    assert sorted(n for ns in numbers_by_key.values() for n in ns) == list(range(6000))  # once each
    for key, numbers in numbers_by_key.items():
        assert numbers == sorted(numbers), f"key {key} out of order"
