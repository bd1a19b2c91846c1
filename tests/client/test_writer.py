"""The idempotent EventStreamWriter against the fake server: batching, flush, backpressure, typed errors,
and exactly-once delivery under cut connections, lost, reordered and refused acknowledgements.

Each fault scenario checks the same three things at the end: what the server stored is exactly what was
written (no loss, no duplicate, in order per writer), every acknowledged event is stored, and the
writer's own invariants hold.  The property test draws fault schedules and checks them with the
history checker (``millstream.testing.history``).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.client import AsyncClient, AsyncEventStreamWriter, JsonSerializer, StringSerializer
from millstream.client._config import random_uuid
from millstream.errors import (
    AuthenticationError,
    ConnectionLostError,
    InvalidArgumentError,
    InvalidEventNumberError,
    ObjectClosedError,
    PayloadTooLargeError,
    ReconnectBudgetExceededError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    WrongHostError,
)
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag, History, Outcome, check
from millstream.wire.commands import AppendBlock, Command, DataAppended, SetupAppend, WrongHost
from tests.client.fake_server import FakeSegment, FakeServer, Faults
from tests.client.helpers import client, fast_config, run, until


def payload(i: int) -> bytes:
    return f"event-{i:06d}".encode()


async def write_all(writer: AsyncEventStreamWriter[bytes], count: int, *, key: str | None = None) -> None:
    for i in range(count):
        await writer.write_event(payload(i), routing_key=key)


def stored_exactly_once(server: FakeServer, segment: str, count: int) -> None:
    assert server.payloads(segment) == [payload(i) for i in range(count)]


# --- Batching --------------------------------------------------------------------------------------


def test_a_lone_event_goes_out_at_once_without_a_flush() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await writer.write_event(b"alone")
            await until(lambda: server.blocks_of(AppendBlock), "the block reached the server")
            (block,) = server.blocks_of(AppendBlock)
            assert isinstance(block, AppendBlock) and block.event_count == 1 and block.last_event_number == 1
            await until(lambda: writer.segment_writers()["s"].acknowledged_event_number == 1, "the ack came back")
            await writer.write_event(b"second, nothing in flight")
            await until(lambda: len(server.blocks_of(AppendBlock)) == 2, "it went out at once too")
            writer.check_invariants()
            await writer.close()
    run(scenario)


def test_many_events_coalesce_into_few_blocks() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                await write_all(writer, 20_000)
                writer.check_invariants()
            blocks = server.blocks_of(AppendBlock)
            assert len(blocks) < 20_000 / 20, f"{len(blocks)} blocks for 20,000 events"
            assert max(b.event_count for b in blocks) > 50  # type: ignore[attr-defined]
            stored_exactly_once(server, "s", 20_000)
    run(scenario)


def test_an_open_block_leaves_within_the_batch_window_even_if_no_ack_comes() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await writer.write_event(b"first")  # nothing in flight: sent at once
            await until(lambda: len(server.blocks_of(AppendBlock)) == 1, "the first block arrived")
            loop = asyncio.get_running_loop()
            started = loop.time()
            await writer.write_event(b"second")  # one block in flight: waits for an ack or the window
            await writer.write_event(b"third")
            await until(lambda: len(server.blocks_of(AppendBlock)) == 2, "the window closed the second block")
            assert loop.time() - started < 1.0
            second = server.blocks_of(AppendBlock)[1]
            assert isinstance(second, AppendBlock) and second.event_count == 2, "events of one window share a block"
            server.release_acks()
            await writer.close()
    run(scenario)


def test_blocks_respect_the_block_size_cap() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, writer_block_bytes_max=4096) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                for i in range(3000):
                    await writer.write_event(b"x" * 92 + payload(i)[-8:])
            for block in server.blocks_of(AppendBlock):
                assert isinstance(block, AppendBlock)
                assert len(block.data) <= 4096 + 108, "a block closes once it reaches the cap"
    run(scenario)


# --- Flush, close, futures -------------------------------------------------------------------------


def test_flush_waits_until_everything_written_is_durable() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await writer.flush()  # nothing written: returns at once
            await write_all(writer, 100)
            flushing = asyncio.ensure_future(writer.flush())
            await until(lambda: len(server.payloads("s")) == 100, "everything reached the server")
            await asyncio.sleep(0.05)
            assert not flushing.done(), "stored is not acknowledged: flush still waits"
            server.release_acks()
            await flushing
            assert writer.segment_writers()["s"].acknowledged_event_number == 100
            await writer.close()
            await writer.close()  # idempotent
            with pytest.raises(ObjectClosedError):
                await writer.write_event(b"after close")
            stored_exactly_once(server, "s", 100)
    run(scenario)


def test_per_event_futures_complete_when_durable() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"], StringSerializer())
            futures = [await writer.write_event_future(f"e{i}") for i in range(10)]
            await until(lambda: len(server.payloads("s")) == 10, "stored")
            assert not any(f.done() for f in futures)
            blocks = server.blocks_of(AppendBlock)
            assert len({id(f) for f in futures}) == len(blocks) < 10, "the events of a block share one future"
            server.release_acks()
            await asyncio.gather(*futures)
            await writer.close()
    run(scenario)


def test_bad_events_are_refused_with_a_typed_error_and_nothing_is_written() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"], JsonSerializer()) as writer:
                with pytest.raises(InvalidArgumentError):
                    await writer.write_event({"x": {1, 2}})
                with pytest.raises(PayloadTooLargeError):
                    await writer.write_event("x" * (8 * 1024 * 1024 + 1))
                await writer.write_event({"ok": True})
            assert server.payloads("s") == [b'{"ok":true}']
            with pytest.raises(InvalidArgumentError):
                c.event_writer("s")  # type: ignore[arg-type]  # a stream name: not yet
    run(scenario)


# --- Backpressure ----------------------------------------------------------------------------------


def test_writes_wait_when_too_much_is_unacknowledged() -> None:
    async def scenario() -> None:
        budget = 20_000
        async with FakeServer(faults=Faults(hold_acks=True)) as server, client(
                server.uri, writer_unacked_bytes_max=budget, append_ack_timeout_seconds=10.0) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            written = 0

            async def produce() -> None:
                nonlocal written
                for i in range(1000):
                    await writer.write_event(b"y" * 992)
                    written = i + 1

            producing = asyncio.ensure_future(produce())
            await until(lambda: written > 0 and writer._shared.unacked_bytes > budget, "the budget filled")
            await asyncio.sleep(0.05)
            stalled_at = written
            assert stalled_at < 30 and not producing.done(), "the writer waits instead of buffering more"
            assert writer._shared.unacked_bytes <= budget + 1000
            server.release_acks()
            await producing
            await writer.close()
            assert len(server.payloads("s")) == 1000
    run(scenario)


# --- Idempotence under faults ----------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("at_block", [1, 3, 7])
def test_a_cut_connection_loses_and_duplicates_nothing(when: str, at_block: int) -> None:
    """``before``: the block never reached storage; ``after``: it was stored, its ack lost with the
    connection.  Either way the writer re-sends only what the server does not have."""
    seen = 0

    def cut(block: AppendBlock) -> str | None:
        nonlocal seen
        seen += 1
        return when if seen == at_block else None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(cut=cut)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            for i in range(2000):
                await writer.write_event(payload(i))
                if i % 100 == 0:
                    await asyncio.sleep(0)
            await writer.flush()
            writer.check_invariants()
            assert writer.segment_writers()["s"].reconnects >= 1
            assert server.connection_count >= 2
            await writer.close()
            stored_exactly_once(server, "s", 2000)
    run(scenario)


def test_lost_acknowledgements_are_covered_by_later_ones_or_recovered_by_the_ack_timeout() -> None:
    """Every other ack is lost, and so is the last one: the later acks cover the lost ones; the lost
    last one is recovered by the ack timeout, a reconnect, and AppendSetup's stored event number."""
    drop = True

    def lose(reply: Command) -> bool:
        nonlocal drop
        if isinstance(reply, DataAppended):
            drop = not drop
            return drop or reply.event_number == 500
        return False

    async def scenario() -> None:
        async with FakeServer(faults=Faults(drop_reply=lose)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await write_all(writer, 500)
            await writer.flush()
            assert any(isinstance(r, DataAppended) for r in server.dropped)
            segment_writer = writer.segment_writers()["s"]
            assert segment_writer.reconnects >= 1, "the lost last ack was recovered by reconnecting"
            assert server.setups[-1][1] == 500, "AppendSetup reported the stored number: nothing was re-sent"
            writer.check_invariants()
            await writer.close()
            stored_exactly_once(server, "s", 500)
    run(scenario)


def test_reordered_acknowledgements_are_harmless() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(reorder_acks=True)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            futures = [await writer.write_event_future(payload(i)) for i in range(3000)]
            await writer.flush()
            assert all(f.done() and f.exception() is None for f in futures)
            assert writer.segment_writers()["s"].reconnects == 0
            await writer.close()
            stored_exactly_once(server, "s", 3000)
    run(scenario)


def test_an_invalid_event_number_reply_is_recovered_by_setting_up_again() -> None:
    refused = 0

    def refuse_once(block: AppendBlock) -> bool:
        nonlocal refused
        refused += 1
        return refused == 2

    async def scenario() -> None:
        async with FakeServer(faults=Faults(invalid_event_number=refuse_once)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await write_all(writer, 300)
            await writer.flush()
            await writer.close()
            stored_exactly_once(server, "s", 300)
    run(scenario)


def test_invalid_event_numbers_without_progress_fail_the_writer_with_a_typed_error() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(invalid_event_number=lambda block: True)) as server, client(
                server.uri, reconnect_attempts_max=3) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            future = await writer.write_event_future(b"never")
            # It gives up after the budget (here: 3 attempts) with the typed error of giving up, whose
            # cause is the last refusal, and which names the event in doubt.
            with pytest.raises(ReconnectBudgetExceededError) as raised:
                await writer.flush()
            assert isinstance(raised.value.__cause__, InvalidEventNumberError)
            assert [event.payload for event in raised.value.in_doubt] == [b"never"]
            with pytest.raises(ReconnectBudgetExceededError):
                await future
            with pytest.raises(ReconnectBudgetExceededError):
                await writer.write_event(b"next call")
            assert writer.unacknowledged_events("s") == [b"never"]
            assert server.payloads("s") == []
            with pytest.raises(ReconnectBudgetExceededError):
                await writer.close()
    run(scenario)


def test_a_restarted_server_gets_every_event_exactly_once() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, reconnect_attempts_max=12,
                                                  reconnect_delay_max_seconds=0.05) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await write_all(writer, 100)
            await server.stop()  # a crash: every connection cut, nothing listening
            for i in range(100, 200):
                await writer.write_event(payload(i))
            await asyncio.sleep(0.05)
            await server.start()  # back on the same port, with what it had stored
            await writer.flush()
            await writer.close()
            stored_exactly_once(server, "s", 200)
    run(scenario)


def test_a_server_that_stays_down_fails_the_writer_after_bounded_retries() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri, reconnect_attempts_max=4) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await write_all(writer, 10)
            await writer.flush()
            await server.stop()
            future = await writer.write_event_future(b"lost cause")
            with pytest.raises(ConnectionLostError, match="gave up after 4"):
                await writer.flush()
            assert future.done() and isinstance(future.exception(), ConnectionLostError)
            assert writer.unacknowledged_events("s") == [b"lost cause"]
            with pytest.raises(ConnectionLostError):
                await writer.close()
    run(scenario)


# --- Typed errors from the append session ----------------------------------------------------------


def test_a_sealed_segment_is_a_typed_error_and_its_unacknowledged_events_are_kept_in_order() -> None:
    async def scenario() -> None:
        async with FakeServer(faults=Faults(seal_after_blocks=2)) as server, client(server.uri) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            futures = [await writer.write_event_future(payload(i)) for i in range(1000)]
            with pytest.raises(StreamSegmentSealedError):
                await writer.flush()
            with pytest.raises(StreamSegmentSealedError):
                await writer.write_event(b"next call")
            stored = server.payloads("s")
            left = writer.unacknowledged_events("s")
            assert stored + left == [payload(i) for i in range(1000)], "nothing lost, nothing twice, in order"
            assert all(f.exception() is None for f in futures[:len(stored)])
            assert all(isinstance(f.exception(), StreamSegmentSealedError) for f in futures[len(stored):])
            writer.check_invariants()
            with pytest.raises(StreamSegmentSealedError):
                await writer.close()
    run(scenario)


@pytest.mark.parametrize(("setup", "error"), [
    ("missing", StreamSegmentNotExistsError),
    ("token", AuthenticationError),
])
def test_a_refused_setup_is_a_typed_error(setup: str, error: type[Exception]) -> None:
    async def scenario() -> None:
        async with FakeServer(token="right") as server, client(
                server.uri, token="right" if setup == "missing" else "wrong") as c:
            if setup == "token":
                server.segments["s"] = FakeSegment()
            writer = c.event_writer(["s"])
            await writer.write_event(b"x")
            with pytest.raises(error):
                await writer.flush()
            with pytest.raises(error):
                await writer.close()
    run(scenario)


def test_wrong_host_is_retried_and_then_reported() -> None:
    answers = 0

    def wrong_host_twice(command: Command) -> Command | None:
        nonlocal answers
        if isinstance(command, SetupAppend) and answers < 2:
            answers += 1
            return WrongHost(command.request_id, command.segment, "")
        return None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(error_reply=wrong_host_twice)) as server, client(server.uri) as c:
            await c.segments().create("s")
            async with c.event_writer(["s"]) as writer:
                await writer.write_event(b"x")
            assert server.payloads("s") == [b"x"]
            server.faults.error_reply = lambda command: WrongHost(
                command.request_id, command.segment, "") if isinstance(command, SetupAppend) else None
            writer = c.event_writer(["s"])
            await writer.write_event(b"y")
            # Reported once the budget is spent: the error of giving up, caused by the last WrongHost.
            with pytest.raises(ReconnectBudgetExceededError) as raised:
                await writer.flush()
            assert isinstance(raised.value.__cause__, WrongHostError)
            assert [event.payload for event in raised.value.in_doubt] == [b"y"]
            with pytest.raises(ReconnectBudgetExceededError):
                await writer.close()
    run(scenario)


# --- Several segments ------------------------------------------------------------------------------


def test_events_of_a_key_stay_in_one_segment_in_order_and_keyless_ones_spread_evenly() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            names = ["t/0", "t/1", "t/2", "t/3"]
            for name in names:
                await c.segments().create(name)
            async with c.event_writer(names, StringSerializer()) as writer:
                for i in range(4000):
                    await writer.write_event(f"k{i % 40}:{i}", routing_key=f"k{i % 40}")
                for i in range(400):
                    await writer.write_event(f"none:{i}")
            where: dict[str, str] = {}
            keyless = {name: 0 for name in names}
            for name in names:
                last: dict[str, int] = {}
                for raw in server.payloads(name):
                    key, number = raw.decode().split(":")
                    if key == "none":
                        keyless[name] += 1
                        continue
                    assert where.setdefault(key, name) == name, f"key {key} went to two segments"
                    assert int(number) > last.get(key, -1), f"key {key} out of order"
                    last[key] = int(number)
            assert len(where) == 40 and len(set(where.values())) > 1
            assert set(keyless.values()) == {100}
    run(scenario)


# --- Exactly once under drawn fault schedules ------------------------------------------------------


faults_strategy = st.fixed_dictionaries({
    "cuts": st.dictionaries(st.integers(1, 40), st.sampled_from(["before", "after"]), max_size=4),
    "drops": st.sets(st.integers(1, 40), max_size=6),
    "reorder": st.booleans(),
    "refusals": st.sets(st.integers(1, 40), max_size=2),
    "segments": st.integers(1, 3),
    "events": st.integers(1, 600),
    "seed": st.integers(0, 2**16),
})


@settings(max_examples=25)
@given(faults_strategy)
def test_exactly_once_per_writer_under_drawn_faults(plan: dict[str, object]) -> None:
    """Acknowledged events are never lost, nothing is stored twice, and each key's events stay in order,
    whatever mix of cuts, lost and reordered acks and refused blocks the server throws in."""
    cuts: dict[int, str] = plan["cuts"]  # type: ignore[assignment]
    drops: set[int] = plan["drops"]  # type: ignore[assignment]
    refusals: set[int] = plan["refusals"]  # type: ignore[assignment]
    blocks = 0
    acks = 0

    def cut(block: AppendBlock) -> str | None:
        nonlocal blocks
        blocks += 1
        return cuts.get(blocks)

    def drop(reply: Command) -> bool:
        nonlocal acks
        if isinstance(reply, DataAppended):
            acks += 1
            return acks in drops
        return False

    def refuse(block: AppendBlock) -> bool:
        return blocks in refusals

    faults = Faults(cut=cut, drop_reply=drop, reorder_acks=bool(plan["reorder"]), invalid_event_number=refuse)
    history = History()
    names = [f"p/{i}" for i in range(int(plan["segments"]))]  # type: ignore[call-overload]

    async def scenario() -> None:
        async with FakeServer(faults=faults) as server, client(server.uri, seed=int(plan["seed"]),  # type: ignore[call-overload]
                                                               reconnect_attempts_max=12) as c:
            for name in names:
                await c.segments().create(name)
            writer = c.event_writer(names)
            pending: list[tuple[EventTag, asyncio.Future[None]]] = []
            for i in range(int(plan["events"])):  # type: ignore[call-overload]
                key = f"key{i % 7}"
                tag = EventTag(key, i)
                history.write_invoked(tag, key=key)
                pending.append((tag, await writer.write_event_future(tag.payload(24), routing_key=key)))
                if i % 50 == 0:
                    await asyncio.sleep(0)
            await writer.flush()
            for tag, future in pending:
                history.write_completed(tag, Outcome.ACKED if future.exception() is None else Outcome.UNKNOWN)
            writer.check_invariants()
            await writer.close()
            server.faults = Faults()
            for name in names:
                history.read_all("after", server.payloads(name), complete=True)

    run(scenario)
    report = check(history)
    assert report.ok, report.summary()


def test_reconnect_waits_follow_the_seeded_backoff_on_the_injected_clock() -> None:
    """A writer whose server went away sleeps on the client's clock exactly as ``Backoff`` with the
    client's seed says, and gives up after the configured attempts: a failing run replays from its seed."""
    class RecordingClock(ManualClock):
        def __init__(self) -> None:
            super().__init__()
            self.sleeps: list[float] = []

        async def sleep(self, seconds: float) -> None:
            task = asyncio.current_task()
            if task is not None and task.get_name().startswith("millstream-writer-"):
                self.sleeps.append(seconds)  # (the writer's session loop; not the keep-alive ticker)
            await super().sleep(seconds)

    async def scenario() -> None:
        server = FakeServer()
        await server.start()
        clock = RecordingClock()
        config = fast_config(reconnect_attempts_max=5, reconnect_delay_initial_seconds=0.01,
                             reconnect_delay_max_seconds=0.05)
        async with AsyncClient(server.uri, config=config, clock=clock, rng=random.Random(42)) as c:
            await c.segments().create("s")
            writer = c.event_writer(["s"])
            await writer.write_event(b"x")
            await writer.flush()
            await server.stop()
            await writer.write_event(b"y")
            flushing = asyncio.ensure_future(writer.flush())
            for attempt in range(1, 6):
                await until(lambda attempt=attempt: len(clock.sleeps) == attempt,  # type: ignore[misc]
                            "the writer sleeps before its next attempt")
                clock.advance(clock.sleeps[-1])
            with pytest.raises(ConnectionLostError):
                await flushing
            expected_rng = random.Random(42)
            random_uuid(expected_rng)  # the writer id was drawn first
            backoff = config.backoff(expected_rng)
            assert clock.sleeps == [backoff.delay(n) for n in range(1, 6)]
            with pytest.raises(ConnectionLostError):
                await writer.close()
    run(scenario)
