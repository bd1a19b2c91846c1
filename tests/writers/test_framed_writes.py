"""The columnar batch path (``_framing``): events framed in columns, blocks cut from the framed bytes.

The machine's ``write_framed`` must make the blocks ``write_events`` makes for the same run; the
framing must be what framing the events one by one gives; a pre-framed block must be re-sent after a
cut connection like any block; the writer's key routes must follow a scale of the stream; and a batch
written from another thread than the loop's must wake the loop once, not once per segment."""

from __future__ import annotations

import asyncio
import random
import struct
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import millstream
from millstream.client._framing import KeyRoutes, bytes_batch, column_batch, frame_runs
from millstream.client._routing import KeySpaceRouter
from millstream.client._segment_writer_state import SegmentWriterState, WriterBudget
from millstream.client._writer import WriterShared
from millstream.testing.clock import ManualClock
from millstream.wire.commands import AppendBlock
from tests.client.fake_server import FakeServer, FakeServerThread, Faults
from tests.client.helpers import client, fast_config, run
from tests.writers.test_batch_writes import SEGMENTS, assert_in_order_per_key_and_once, keyed, make_segments


def framed(payload: bytes) -> bytes:
    return struct.pack(">ii", 0, len(payload)) + payload


def machine(block_bytes_max: int) -> tuple[SegmentWriterState, WriterBudget]:
    budget = WriterBudget(1 << 30)
    state = SegmentWriterState("s", writer_id=uuid.UUID(int=1), budget=budget, clock=ManualClock(),
                               block_bytes_max=block_bytes_max)
    return state, budget


def framed_run(payloads: list[bytes], keys: list[str | None]) -> tuple[bytes, list[int], list[int]]:
    """A run framed by hand: its bytes, framed ends and charge ends (what ``frame_runs`` hands over)."""
    framed_ends = [0]
    charge_ends = [0]
    for payload, key in zip(payloads, keys, strict=True):
        framed_ends.append(framed_ends[-1] + 8 + len(payload))
        charge_ends.append(charge_ends[-1] + 8 + len(payload) + (0 if key is None else len(key)))
    return b"".join(map(framed, payloads)), framed_ends, charge_ends


# --- The machine: write_framed makes write_events' blocks ---------------------------------------------


runs = st.lists(st.lists(st.tuples(st.binary(max_size=40), st.sampled_from(["a", "bb", "key-ccc", None])),
                         min_size=0, max_size=30), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(runs=runs, block_bytes_max=st.integers(min_value=1, max_value=300), first_single=st.booleans(),
       acknowledge_between=st.booleans())
def test_a_framed_run_makes_the_blocks_the_same_run_of_events_makes(
        runs: list[list[tuple[bytes, str | None]]], block_bytes_max: int, first_single: bool,
        acknowledge_between: bool) -> None:
    events_state, events_budget = machine(block_bytes_max)
    framed_state, framed_budget = machine(block_bytes_max)
    sequence = 0
    if first_single:  # an open block (or a block in flight) before the runs
        for state in (events_state, framed_state):
            state.write_event(b"first", "a", None)
        sequence = 1
    for run_ in runs:
        payloads = [payload for payload, _ in run_]
        keys = [key for _, key in run_]
        sequences = list(range(sequence + 1, sequence + 1 + len(run_)))
        sequence += len(run_)
        expected = events_state.write_events(payloads, keys, sequences)
        data, framed_ends, charge_ends = framed_run(payloads, keys)
        assert framed_state.write_framed(data, numpy.asarray(framed_ends), numpy.asarray(charge_ends), keys,
                                         sequences) == expected
        if acknowledge_between:
            for state in (events_state, framed_state):
                blocks = state.take_closed()
                if blocks:
                    state.acknowledge(blocks[-1].last_event_number, sent_on_this_session=False)
        assert framed_budget.unacked_bytes == events_budget.unacked_bytes
        assert framed_state.charged() == events_state.charged()
        framed_state.check_invariants()
        events_state.check_invariants()
    for state in (events_state, framed_state):
        state.close_open_block()
    expected_blocks = events_state.take_closed()
    blocks = framed_state.take_closed()
    assert [(b.data, b.keys, list(b.sequences), b.charge, b.event_count, b.last_event_number) for b in blocks] == [
        (b.data, b.keys, list(b.sequences), b.charge, b.event_count, b.last_event_number) for b in expected_blocks]
    for block in blocks:
        assert all(type(sequence) is int for sequence in block.sequences)


def test_an_open_block_of_framed_runs_and_single_events_is_taken_out_whole() -> None:
    """The open block may hold runs of framed events beside single events: a hand-over, the in-doubt
    set and the unacknowledged payloads read every event of it, in order."""
    state, budget = machine(block_bytes_max=1 << 20)
    state.write_event(b"zero", "a", None)  # goes out alone (nothing in flight)
    state.write_event(b"one", "a", None)
    data, framed_ends, charge_ends = framed_run([b"two", b"three"], ["b", None])
    budget.sequence += 2  # (the writer takes a batch's places in its sequence, then frames it)
    state.write_framed(data, framed_ends, charge_ends, ["b", None], [3, 4])
    state.write_event(b"four", "a", None)
    state.check_invariants()
    assert state.unacknowledged_payloads() == [b"zero", b"one", b"two", b"three", b"four"]
    assert [(event.sequence, event.routing_key, event.payload) for event in state.in_doubt()] == [
        (1, "a", b"zero"), (2, "a", b"one"), (3, "b", b"two"), (4, None, b"three"), (5, "a", b"four")]
    moved = state.retire()
    assert [(payload, key, sequence) for payload, key, _, sequence in moved] == [
        (b"zero", "a", 1), (b"one", "a", 2), (b"two", "b", 3), (b"three", None, 4), (b"four", "a", 5)]
    assert budget.unacked_bytes == 0


# --- The framing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("segment_count", [1, 5])
def test_framing_in_columns_gives_each_segment_its_events_framed_one_by_one_in_order(
        large: bool, segment_count: int) -> None:
    generator = random.Random(7)
    payloads = [generator.randbytes(generator.randrange(0, 300)) for _ in range(2000)]
    keys = [f"key-{generator.randrange(150)}" for _ in payloads]
    values = pa.array(payloads, type=pa.large_binary() if large else pa.binary()).slice(100, 1800)
    batch = column_batch(values, pa.array(keys).slice(100, 1800))
    assert batch is not None
    router = KeySpaceRouter([f"s{i}" for i in range(segment_count)])
    routes = KeyRoutes(0)
    runs_ = frame_runs(batch, routes.route(batch.keys, router.segment_for))
    seen = []
    for run_ in runs_:
        positions = run_.positions.tolist()
        assert positions == sorted(positions)
        assert run_.data == b"".join(framed(payloads[100 + i]) for i in positions)
        assert run_.routing_keys == [keys[100 + i] for i in positions]
        assert all(router.segment_for(key) == run_.segment for key in run_.routing_keys)
        assert run_.framed_ends.tolist() == [0, *numpy.cumsum([8 + len(payloads[100 + i]) for i in positions])]
        assert run_.charge_ends[-1] == len(run_.data) + sum(len(key) for key in run_.routing_keys)
        seen += positions
    assert sorted(seen) == list(range(1800))
    assert len({run_.segment for run_ in runs_}) == len(runs_) <= segment_count


def test_key_routes_route_each_new_key_once_and_stay_bounded() -> None:
    calls: list[str] = []

    def segment_for(key: str) -> str:
        calls.append(key)
        return f"s{len(key) % 3}"

    routes = KeyRoutes(0, size_max=4)
    first = routes.route(pa.array(["a", "bb", "a", "ccc"]), segment_for)
    assert [first.objects[i] for i in first.indexes] == ["a", "bb", "a", "ccc"] and calls == ["a", "bb", "ccc"]
    routes.route(pa.array(["bb", "a"]), segment_for)
    assert calls == ["a", "bb", "ccc"]  # known keys: not routed again
    again = routes.route(pa.array(["dd", "eeeee", "a"]), segment_for)  # over the bound: starts again
    assert [again.objects[i] for i in again.indexes] == ["dd", "eeeee", "a"] and len(routes.keys) == 3
    assert [again.names[again.segments[i]] for i in again.indexes] == ["s2", "s2", "s1"]
    # What a batch was routed with stays as it was when the routes start again under it.
    assert [first.objects[i] for i in first.indexes] == ["a", "bb", "a", "ccc"]
    assert [first.names[first.segments[i]] for i in first.indexes] == ["s1", "s2", "s1", "s0"]


def test_a_batch_with_a_null_key_or_without_numpy_takes_the_per_event_path() -> None:
    assert bytes_batch([b"a", b"b"], ["k", None]) is None
    assert column_batch(pa.array([b"a"]), pa.array([None], type=pa.string())) is None
    assert column_batch(pa.array([b"a"]), None) is None
    assert column_batch(pa.array([b"a"]), [b"k"]) is None  # (Arrow would take bytes for text)
    batch = bytes_batch([b"a", b"bc"], ["k", "k"])
    assert batch is not None and batch.lengths.tolist() == [1, 2]


# --- The writer: resends, scales, wake-ups ---------------------------------------------------------------


def spy_on_framing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the events framed in columns (so a test knows the columnar path ran)."""
    from millstream.client import _writer

    framed_events: list[int] = []
    original = _writer.frame_runs

    def spy(batch: Any, routes: Any) -> Any:
        framed_events.append(len(batch))
        return original(batch, routes)

    monkeypatch.setattr(_writer, "frame_runs", spy)
    return framed_events


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("at_block", [1, 4])
def test_a_pre_framed_block_is_resent_after_a_cut_connection_and_stored_once(
        when: str, at_block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    framed_events = spy_on_framing(monkeypatch)
    seen = 0

    def cut(block: AppendBlock) -> str | None:
        nonlocal seen
        seen += 1
        return when if seen == at_block else None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(cut=cut)) as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            writer = c.event_writer(SEGMENTS)
            for start in range(0, 3000, 300):
                rows = [keyed(i) for i in range(start, start + 300)]
                if start % 600:
                    await writer.write_columns(pa.array([e for _, e in rows]), pa.array([k for k, _ in rows]))
                else:
                    await writer.write_events([e for _, e in rows], routing_keys=[k for k, _ in rows])
            await writer.flush()
            writer.check_invariants()
            assert sum(w.reconnects for w in writer.segment_writers().values()) >= 1
            await writer.close()
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, 3000)
    run(scenario)
    assert sum(framed_events) == 3000  # every batch took the columnar path


def test_keys_routed_by_the_writers_key_routes_follow_a_split_to_the_new_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key's route, kept by the writer between batches, must not outlive a scale: after the writer
    learns of the split, every key goes where the new epoch puts it."""
    from millstream.client import ScalingPolicy, StreamConfig
    from millstream.client._routing import StreamRouter

    framed_events = spy_on_framing(monkeypatch)
    rows = [keyed(i, keys=50) for i in range(3000)]

    def batch(start: int, end: int) -> tuple[Any, Any]:
        return pa.array([e for _, e in rows[start:end]]), pa.array([k for k, _ in rows[start:end]])

    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as blocking:
        manager = blocking.stream_manager()
        manager.create_scope("b")
        manager.create_stream("b/s", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        with blocking.event_writer("b/s") as writer:
            writer.write_columns(*batch(0, 1000))
            writer.flush()
            first = manager.current_segments("b/s").segments
            manager.split_segment("b/s", first[0].segment_id)
            writer.write_columns(*batch(1000, 2000))  # routed by the old view: meets the seal, moves on
            writer.flush()
            assert writer.core.hand_overs >= 1
            writer.write_columns(*batch(2000, 3000))  # routed by the new view
            writer.flush()
            current = {segment.name for segment in manager.current_segments("b/s").segments}
            routes = writer.core._key_routes
            assert routes is not None and set(routes.names) <= current
            router = writer.core.router
            assert isinstance(router, StreamRouter)
            assert all(routes.names[routes.segments[i]] == router.segment_for(key)
                       for i, key in enumerate(routes.keys.to_pylist()))
        segments = blocking.segments()
        stored: dict[str, list[bytes]] = {}
        for name in sorted({segment.name for segment in first} | current):
            reader = blocking.segment_reader(name)
            stored[name] = []
            while (event := reader.read_event()) is not None:
                stored[name].append(event.value)
            reader.close()
        assert segments.info(first[0].name).sealed
    assert sum(framed_events) >= 3000
    # Every key's events: once each and in order within a segment; the last batch's events only in
    # segments of the new epoch.
    numbers = sorted(int(raw.decode().split(":")[1]) for values in stored.values() for raw in values)
    assert numbers == list(range(3000))
    for name, values in stored.items():
        last: dict[str, int] = {}
        for raw in values:
            key, number = raw.decode().split(":")
            assert int(number) > last.get(key, -1)
            last[key] = int(number)
            if int(number) >= 2000:
                assert name in current, (name, number)


@pytest.mark.parametrize("columnar", [False, True])
def test_a_batch_from_another_thread_wakes_the_loop_once_not_once_per_segment(
        columnar: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    segments = [f"t/{i}" for i in range(16)]
    rows = [keyed(i, keys=400) for i in range(4000)]
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        for name in segments:
            blocking.segments().create(name)
        with blocking.event_writer(segments) as writer:
            writer.write_events([e for _, e in rows[:2000]], routing_keys=[k for k, _ in rows[:2000]])
            writer.flush()  # every segment writer started, nothing in flight: the next batch ships 16 blocks
            loop = writer.core._shared.loop
            wakes: list[Callable[..., Any]] = []
            original = loop.call_soon_threadsafe

            def counting(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                wakes.append(callback)
                return original(callback, *args, **kwargs)

            monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
            if columnar:
                writer.write_columns(pa.array([e for _, e in rows[2000:]]), pa.array([k for k, _ in rows[2000:]]))
            else:
                writer.write_events([e for _, e in rows[2000:]], routing_keys=[k for k, _ in rows[2000:]])
            assert len(wakes) == 1, wakes  # one hand-off to the loop for the batch's 16 blocks
            monkeypatch.undo()
            writer.flush()
        stored: dict[str, list[bytes]] = {}
        for name in segments:
            reader = blocking.segment_reader(name)
            stored[name] = []
            while (event := reader.read_event()) is not None:
                stored[name].append(event.value)
            reader.close()
        assert sum(1 for values in stored.values() if values) == 16
        assert_in_order_per_key_and_once(stored, 4000)


def test_posted_callbacks_run_in_order_on_the_loop_and_one_failing_does_not_hold_back_the_rest() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        shared = WriterShared(loop, 1 << 20)
        ran: list[int] = []
        done = asyncio.Event()

        def fail() -> None:
            raise RuntimeError("a broken callback")

        def poster() -> None:
            shared.post(lambda: ran.append(1))
            shared.post(fail)
            shared.post(lambda: ran.append(2))
            shared.post(lambda: loop.call_soon(done.set))

        thread = threading.Thread(target=poster)
        thread.start()
        thread.join()
        await asyncio.wait_for(done.wait(), 10)
        assert ran == [1, 2]
    run(scenario)


def test_events_written_through_the_columnar_path_are_counted_and_decoded_intact() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                payloads = [bytes([i % 256]) * (i % 37) for i in range(500)]
                await writer.write_columns(pa.array(payloads), [f"k{i % 9}" for i in range(500)])
                assert writer.events_written == 500
            stored = {name: server.payloads(name) for name in SEGMENTS}
            assert sorted(p for values in stored.values() for p in values) == sorted(payloads)
            for values in stored.values():  # (each segment's events in the batch's order)
                indexes = [payloads.index(p) if p else -1 for p in values]
                assert [i for i in indexes if i >= 0] == sorted(i for i in indexes if i >= 0)
    run(scenario)


def test_threads_writing_columns_through_one_writer_keep_each_keys_order_while_the_routes_start_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's key routes are shared by the threads that write through it; bounded at 50 keys
    here, they start again every few batches, under batches routed a moment before."""
    import functools

    from millstream.client import _writer

    monkeypatch.setattr(_writer, "KeyRoutes", functools.partial(KeyRoutes, size_max=50))
    threads_count, batches, batch_events = 4, 10, 200
    errors: list[BaseException] = []
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        for name in SEGMENTS:
            blocking.segments().create(name)
        with blocking.event_writer(SEGMENTS) as writer:
            def write(thread: int) -> None:
                try:
                    for batch in range(batches):
                        numbers = range((thread * batches + batch) * batch_events,
                                        (thread * batches + batch + 1) * batch_events)
                        keys = [f"t{thread}-k{n % 30}" for n in numbers]
                        values = [f"{key}:{n}".encode() for key, n in zip(keys, numbers, strict=True)]
                        writer.write_columns(pa.array(values), pa.array(keys))
                except BaseException as error:  # (reported by the main thread)
                    errors.append(error)

            threads = [threading.Thread(target=write, args=(thread,)) for thread in range(threads_count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not errors, errors
            assert not any(thread.is_alive() for thread in threads)
            writer.flush()
        stored: dict[str, list[bytes]] = {}
        for name in SEGMENTS:
            reader = blocking.segment_reader(name)
            stored[name] = []
            while (event := reader.read_event()) is not None:
                stored[name].append(event.value)
            reader.close()
    assert_in_order_per_key_and_once(stored, threads_count * batches * batch_events)


def test_columns_with_keys_that_are_not_text_are_refused_by_name_before_anything_is_written() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                with pytest.raises(millstream.errors.InvalidArgumentError, match="not bytes"):
                    await writer.write_columns(pa.array([b"a", b"b"]), ["k", b"k"])
                assert writer.events_written == 0
            assert server.payloads("s") == []
    run(scenario)


def test_a_binary_column_that_framing_would_take_past_32_bit_offsets_is_framed_as_large_binary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from millstream.client import _framing

    monkeypatch.setattr(_framing, "INT32_MAX", 100)  # (2 GiB of test data, scaled down)
    payloads = [bytes([i]) * 20 for i in range(10)]  # 200 bytes framed: past the bound
    batch = column_batch(pa.array(payloads, type=pa.binary()), pa.array(["k"] * 10))
    assert batch is not None
    routes = KeyRoutes(0)
    (run_,) = frame_runs(batch, routes.route(batch.keys, lambda key: "s"))
    assert run_.data == b"".join(map(framed, payloads))


def test_a_write_events_batch_finds_its_keys_rows_by_dict_not_by_hashing_every_known_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``pc.index_in`` hashes its whole value set -- every key the routes hold -- on every call: with
    10,000 keys known and batches of 1,000 that was 1.1 µs/event, the batch path's largest cost.  A
    ``write_events`` batch smaller than the routes holds its keys as ``str`` already: they find their
    rows by dict, the same rows the Arrow path gives, each new key routed once, within the bound."""
    import pyarrow.compute as pc

    generator = random.Random(11)
    known = [f"key-{i}" for i in range(300)]
    router = KeySpaceRouter([f"s{i}" for i in range(5)])
    calls: list[str] = []

    def segment_for(key: str) -> str:
        calls.append(key)
        return router.segment_for(key)

    by_arrow = KeyRoutes(0)
    by_dict = KeyRoutes(0)
    warm = bytes_batch([b"x"] * len(known), list(known))
    assert warm is not None and warm.key_list == known
    by_arrow.route(warm.keys, router.segment_for)
    by_dict.route(warm.keys, segment_for, warm.key_list)
    assert calls == known  # each new key routed once, in the order it first appears
    keys = [generator.choice(known) for _ in range(500)]
    batch = bytes_batch([b"y"] * len(keys), keys)
    assert batch is not None
    part = batch.slice(100, 350)  # 250 events, 300 keys known
    assert part.key_list == keys[100:350] and part.keys.to_pylist() == keys[100:350]
    expected = by_arrow.route(part.keys, router.segment_for)

    index_in_calls = []
    original = pc.index_in

    def counting_index_in(*args: Any, **kwargs: Any) -> Any:
        index_in_calls.append(len(kwargs["value_set"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(pc, "index_in", counting_index_in)
    routed = by_dict.route(part.keys, segment_for, part.key_list)
    assert index_in_calls == []  # no hash table of every known key for this batch
    assert calls == known  # nothing routed again
    assert routed.indexes.tolist() == expected.indexes.tolist()
    assert [routed.objects[i] for i in routed.indexes] == keys[100:350]
    assert [routed.names[routed.segments[i]] for i in routed.indexes] == [router.segment_for(k) for k in keys[100:350]]
    runs_ = frame_runs(part, routed)
    assert sorted(p for run_ in runs_ for p in run_.positions.tolist()) == list(range(250))
    monkeypatch.setattr(pc, "index_in", original)

    # New keys in a small batch are routed once, in order; over the bound the routes start again from
    # the batch's keys; the two ways share the rows.
    small = KeyRoutes(0, size_max=4)
    calls.clear()
    small.route(pa.array(["a", "bb"]), segment_for, ["a", "bb"])
    first = small.route(pa.array(["ccc"]), segment_for, ["ccc"])  # (1 event, 2 keys known: by dict)
    assert calls == ["a", "bb", "ccc"] and [first.objects[i] for i in first.indexes] == ["ccc"]
    second = small.route(pa.array(["a", "dd"]), segment_for, ["a", "dd"])
    assert calls == ["a", "bb", "ccc", "dd"] and [second.objects[i] for i in second.indexes] == ["a", "dd"]
    assert [second.names[second.segments[i]] for i in second.indexes] == [router.segment_for("a"),
                                                                          router.segment_for("dd")]
    again = small.route(pa.array(["eeeee", "a"]), segment_for, ["eeeee", "a"])  # over the bound
    assert calls == ["a", "bb", "ccc", "dd", "eeeee", "a"] and len(small.keys) == 2
    assert [again.objects[i] for i in again.indexes] == ["eeeee", "a"]
    assert [second.objects[i] for i in second.indexes] == ["a", "dd"]  # what it was routed with stays
    mixed = small.route(pa.array(["a", "eeeee", "a"]), segment_for)  # the Arrow way knows the dict's keys
    assert len(calls) == 6 and [mixed.objects[i] for i in mixed.indexes] == ["a", "eeeee", "a"]
