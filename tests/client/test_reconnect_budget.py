"""The reconnect budget is per outage (issue 20 item 5), on a simulated network in virtual time: a
writer survives several short outages that add up to more than its budget (it starts again whole
once a connection does useful work); one outage longer than the budget makes it give up -- at the
budget, on the injected clock -- with ``ReconnectBudgetExceededError`` naming every event in doubt,
across its segments, in the order written.  A budget of None never gives up."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

import pytest

from millstream.client import (
    AsyncClient,
    BytesSerializer,
    ClientConfig,
    FixedLocator,
    InDoubtEvent,
    SegmentWithRange,
    routing_key_fraction,
)
from millstream.client._sequenced_writer import AsyncSequencedEventStreamWriter, SequencedWriterCore
from millstream.errors import ConnectionLostError, ReconnectBudgetExceededError
from millstream.naming import segment_id, stream_segment_name
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.clock import ManualClock
from millstream.testing.network import SimulatedNetwork, VirtualTimeEventLoop
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage

T = TypeVar("T")

HOST, PORT = "store", 9090
BUDGET_SECONDS = 10.0
STEP_SECONDS = 0.01  # virtual time per step of the driver
TURNS_PER_STEP = 10
STEPS_MAX = 20_000  # 200 s of virtual time: every scenario ends far sooner


class World:
    """A segment store on a simulated network, everything on a loop whose time is ``clock``."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.loop = VirtualTimeEventLoop(self.clock)
        self.network = SimulatedNetwork(self.loop)
        self.storage = SimulatedLogStorage()
        self.server = SegmentStoreServer(lambda _container: SimulatedDurableDataLog(self.storage),
                                         config=ServerConfig(container_count=1), clock=self.clock)
        self.run(self.server.start())
        self.network.listen(HOST, PORT, self.server.protocol_factory)

    def client(self, **config: Any) -> AsyncClient:
        settings: dict[str, Any] = dict(connector=self.network.create_connection, reconnect_delay_max_seconds=1.0,
                                        reconnect_budget_seconds=BUDGET_SECONDS)
        settings.update(config)
        return AsyncClient(f"tcp://{HOST}:{PORT}", clock=self.clock, rng=random.Random(7),
                           config=ClientConfig(**settings))

    def run(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` to its end, virtual time passing in small steps while it waits."""
        task = self.loop.create_task(coroutine)  # type: ignore[arg-type]
        for _ in range(STEPS_MAX):
            for _ in range(TURNS_PER_STEP):
                if task.done():
                    return task.result()
                self.loop.run_until_complete(asyncio.sleep(0))
            self.clock.advance(STEP_SECONDS)
        task.cancel()
        raise AssertionError(f"{coroutine} did not finish within {STEPS_MAX * STEP_SECONDS:.0f} s of virtual time")

    def outage_begins(self) -> None:
        """The server becomes unreachable: every connection is cut and new ones are refused."""
        self.network.stop_listening(HOST, PORT)
        for link in self.network.open_links():
            self.network.cut(link)

    def outage_ends(self) -> None:
        self.network.listen(HOST, PORT, self.server.protocol_factory)

    def close(self) -> None:
        try:
            self.run(self.server.stop())
        finally:
            self.loop.close()


@pytest.fixture
def world() -> Any:
    made = World()
    try:
        yield made
    finally:
        made.close()


def test_short_outages_adding_up_to_more_than_the_budget_do_not_make_a_writer_give_up(world: World) -> None:
    """Three outages of 0.6 x budget each (1.8 x budget in all) while the writer is idle -- nothing to
    re-send, so no acknowledgement marks its return -- and one while it has events in flight."""
    async def scenario() -> None:
        async with world.client() as client:
            await client.segments().create("s")
            writer = client.event_writer(["s"])
            await writer.write_event(b"before")
            await writer.flush()
            for _ in range(3):
                world.outage_begins()
                await world.clock.sleep(0.6 * BUDGET_SECONDS)
                world.outage_ends()
                await world.clock.sleep(0.3 * BUDGET_SECONDS)  # it reconnects (its backoff is at most 1 s)
            await writer.write_event(b"in flight")
            world.outage_begins()
            await world.clock.sleep(0.6 * BUDGET_SECONDS)
            world.outage_ends()
            await writer.write_event(b"after")
            await writer.flush()
            (segment_writer,) = writer.segment_writers().values()
            assert segment_writer.reconnects >= 4 and segment_writer.failed is None
            assert writer.in_doubt_events() == ()
            await writer.close()
            read = await client.segment_reader("s").read_events()
            assert [event.value for event in read] == [b"before", b"in flight", b"after"]
    world.run(scenario())


def test_an_outage_longer_than_the_budget_ends_with_the_events_in_doubt(world: World) -> None:
    async def scenario() -> None:
        async with world.client() as client:
            segments = ["s/0", "s/1"]
            for name in segments:
                await client.segments().create(name)
            writer = client.event_writer(segments)
            for index in range(4):
                await writer.write_event(b"acked-%d" % index, routing_key=f"key-{index}")
            await writer.flush()
            world.outage_begins()
            began = world.clock.monotonic()
            futures = [await writer.write_event_future(b"doubt-%d" % index, routing_key=f"key-{index % 3}")
                       for index in range(6)]
            with pytest.raises(ReconnectBudgetExceededError) as raised:
                await writer.flush()
            gave_up = world.clock.monotonic()
            # The budget is what ended it: not before it was spent, and with no more than the last
            # refused attempt (refusals are instant) and the driver's step after it.
            assert BUDGET_SECONDS <= gave_up - began <= BUDGET_SECONDS + 0.1, gave_up - began
            error = raised.value
            assert isinstance(error, ConnectionLostError) and "reconnect budget" in str(error)
            router = writer.router
            assert router is not None
            expected = tuple(InDoubtEvent(5 + index, router.segment_for(f"key-{index % 3}"), f"key-{index % 3}",
                                          b"doubt-%d" % index) for index in range(6))
            assert error.in_doubt == expected
            assert {event.segment for event in expected} == set(segments), "the set spans both segments"
            assert writer.in_doubt_events() == expected and writer.events_written == 10
            assert all(isinstance(f.exception(), ReconnectBudgetExceededError) for f in futures)
            for call in (writer.flush(), writer.write_event(b"later")):
                with pytest.raises(ReconnectBudgetExceededError) as again:
                    await call
                assert again.value.in_doubt == expected
            world.outage_ends()
            with pytest.raises(ReconnectBudgetExceededError):
                await writer.close()
            read = [e.value for name in segments for e in await client.segment_reader(name).read_events()]
            assert sorted(read) == [b"acked-%d" % index for index in range(4)]
    world.run(scenario())


class FixedStream:
    """A stream of two fixed segments on the world's store, as a writer with a stable id asks about it
    (``SequencedStreamBinding``): the world has no controller, and nothing is sealed here."""

    stream = "s/a"

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self.segments = [SegmentWithRange(segment_id(0, n), n / 2, (n + 1) / 2,
                                          stream_segment_name("s", "a", segment_id(0, n))) for n in range(2)]

    async def history(self) -> list[SegmentWithRange]:
        return self.segments

    async def current_segments(self) -> list[SegmentWithRange]:
        return self.segments

    async def stored_sequence(self, segment: str, writer_id: UUID) -> int:
        return await self._client.segments().get_attribute(segment, writer_id.int) or 0

    async def stored_event_number(self, segment: str, writer_id: UUID) -> int:
        return await self._client.segments().stored_event_number_once_sealed(segment, writer_id)

    async def successors(self, sealed: SegmentWithRange) -> list[SegmentWithRange]:
        raise AssertionError(f"nothing is sealed in this test, yet {sealed.name} was")


def stable_writer(client: AsyncClient, stream: FixedStream) -> AsyncSequencedEventStreamWriter[bytes]:
    """A writer with the stable id ``ingest-7`` of ``stream`` (as ``event_writer(stream, writer_id=...)``
    makes one, with the fixed stream in place of the controller's)."""
    return AsyncSequencedEventStreamWriter(SequencedWriterCore(
        pool=client.pool, locator=FixedLocator(client.endpoint), serializer=BytesSerializer(), token="",
        config=client.config, rng=random.Random(11), stream=stream, writer_id="ingest-7"))


def test_a_writer_with_a_stable_id_gives_up_as_a_whole_with_its_sequences_in_doubt(world: World) -> None:
    """The sequenced writer is a stream writer too: one outage longer than the budget fails all its
    segment writers with one error whose ``in_doubt`` spans both segments, in the order written, each
    event with its place (dropped duplicates take places as well) and its application sequence -- what
    a restarted writer replays from."""
    keys = {half: next(f"key-{n}" for n in range(1000) if (routing_key_fraction(f"key-{n}") >= 0.5) == half)
            for half in (False, True)}

    def key(sequence: int) -> str:
        return keys[sequence % 2 == 1]

    async def scenario() -> None:
        async with world.client() as client:
            stream = FixedStream(client)
            for piece in stream.segments:
                await client.segments().create(piece.name)
            first = stable_writer(client, stream)
            for sequence in range(1, 5):
                assert await first.write_event(b"e%d" % sequence, routing_key=key(sequence), sequence=sequence)
            await first.close()
            writer = stable_writer(client, stream)  # a restart, replaying from sequence 3
            for sequence in range(3, 7):
                assert await writer.write_event(b"e%d" % sequence, routing_key=key(sequence),
                                                sequence=sequence) == (sequence > 4)
            await writer.flush()
            assert writer.in_doubt_events() == () and writer.events_written == 4 and writer.duplicates == 2
            world.outage_begins()
            for sequence in range(7, 13):
                assert await writer.write_event(b"e%d" % sequence, routing_key=key(sequence), sequence=sequence)
            with pytest.raises(ReconnectBudgetExceededError) as raised:
                await writer.flush()
            error = raised.value
            segment_of = {key(n): stream.segments[n % 2].name for n in range(2)}
            expected = tuple(InDoubtEvent(place, segment_of[key(sequence)], key(sequence), b"e%d" % sequence,
                                          application_sequence=sequence)
                             for place, sequence in zip(range(5, 11), range(7, 13), strict=True))
            assert error.in_doubt == expected
            assert {event.segment for event in expected} == {piece.name for piece in stream.segments}
            assert writer.in_doubt_events() == expected and writer.events_written == 10
            segment_writers = writer.core.segment_writers().values()
            assert len(segment_writers) == 2 and all(w.failed is error for w in segment_writers), (
                "one error fails every segment writer")
            with pytest.raises(ReconnectBudgetExceededError) as again:
                await writer.write_event(b"later", routing_key=key(13), sequence=13)
            assert again.value.in_doubt == expected
            writer.check_invariants()
            world.outage_ends()
            with pytest.raises(ReconnectBudgetExceededError):
                await writer.close(flush=False)
            # Nothing in doubt was stored (it never got through); a restart replays from the first.
            restarted = stable_writer(client, stream)
            for event in expected:
                assert event.application_sequence is not None
                assert await restarted.write_event(event.payload, routing_key=event.routing_key,
                                                   sequence=event.application_sequence)
            await restarted.close()
            read = [e.value for piece in stream.segments for e in await client.segment_reader(piece.name).read_events()]
            assert sorted(read, key=lambda value: int(value[1:])) == [b"e%d" % n for n in range(1, 13)]
    world.run(scenario())


def test_a_budget_of_none_waits_out_any_outage(world: World) -> None:
    async def scenario() -> None:
        async with world.client(reconnect_budget_seconds=None) as client:
            assert client.config.reconnect_budget_seconds == float("inf")
            await client.segments().create("s")
            writer = client.event_writer(["s"])
            await writer.write_event(b"before")
            await writer.flush()
            world.outage_begins()
            await writer.write_event(b"during")
            await world.clock.sleep(12 * BUDGET_SECONDS)  # far past any finite default
            assert writer.segment_writers()["s"].failed is None
            world.outage_ends()
            await writer.flush()
            info = await client.segments().info("s")
            assert info.length == 2 * 8 + len(b"before") + len(b"during")
            await writer.close()
    world.run(scenario())


ADMIN_CALLS: dict[str, Callable[[AsyncClient], Awaitable[Any]]] = {
    "segment info (retried as a whole)": lambda c: c.segments().info("s"),
    "segment create (connecting retried)": lambda c: c.segments().create("t"),
    "segment read": lambda c: c.segments().read("s", 0),
}


@pytest.mark.parametrize("call", sorted(ADMIN_CALLS))
def test_requests_give_up_after_the_same_budget(world: World, call: str) -> None:
    async def scenario() -> None:
        async with world.client() as client:
            await client.segments().create("s")
            world.outage_begins()
            for _ in range(100):  # the cut reaches the client (else a create sent meanwhile is lost)
                if not client.pool.connections():
                    break
                await asyncio.sleep(0)
            assert not client.pool.connections()
            began = world.clock.monotonic()
            with pytest.raises(ReconnectBudgetExceededError):
                await ADMIN_CALLS[call](client)
            assert BUDGET_SECONDS <= world.clock.monotonic() - began <= BUDGET_SECONDS + 0.1
    world.run(scenario())


# --- Every entry point, against a real node that goes away ---------------------------------------


class JumpingClock:
    """An injected clock whose ``sleep`` moves time forward at once, so a budget passes in a few loop
    turns; the keep-alive ticker and the reader's heartbeat sleep forever instead (they would move
    time on their own)."""

    FOREVER = ("millstream-keepalive", "millstream-reader-heartbeat")

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_name().startswith(self.FOREVER):
            await asyncio.get_running_loop().create_future()
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


async def _stream_writer_creation(client: AsyncClient, ready: dict[str, Any]) -> None:
    await client.event_writer("s/a").write_event(b"x")  # (learns the stream's segments first)


async def _write_and_flush(client: AsyncClient, ready: dict[str, Any]) -> None:
    writer = ready["writer"]
    await writer.write_event(b"in doubt")
    try:
        await writer.flush()
    except ReconnectBudgetExceededError as error:
        assert [event.payload for event in error.in_doubt] == [b"in doubt"]
        raise


async def _commit(client: AsyncClient, ready: dict[str, Any]) -> None:
    await ready["transaction"].commit()


async def _read(client: AsyncClient, ready: dict[str, Any]) -> None:
    for _ in range(1000):  # (each call waits 1 s of virtual time at most; the failed fetch surfaces)
        await ready["reader"].read_next_event(1.0)


ENTRY_POINTS: dict[str, Callable[[AsyncClient, dict[str, Any]], Awaitable[Any]]] = {
    "admin: list scopes": lambda c, r: c.stream_manager().list_scopes(),
    "admin: create a scope": lambda c, r: c.stream_manager().create_scope("t"),
    "stream writer creation": _stream_writer_creation,
    "writes and flush": _write_and_flush,
    "transaction begin": lambda c, r: c.transactional_writer("s/a").begin(),
    "transaction commit": _commit,
    "reader group": lambda c, r: c.reader_group("s/g"),
    "reader joins": lambda c, r: r["group"].reader("late"),
    "reader reads": _read,
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_gives_up_after_the_same_per_outage_budget(tmp_path: Any, entry: str) -> None:
    import millstream
    from millstream.client import ReaderConfig, ScalingPolicy, StreamConfig
    from tests.client.helpers import run

    async def scenario() -> None:
        clock = JumpingClock()
        client = AsyncClient(node.uri, clock=clock, rng=random.Random(3),
                             config=ClientConfig(reconnect_budget_seconds=BUDGET_SECONDS))
        ready: dict[str, Any] = {}
        try:
            manager = client.stream_manager()
            await manager.create_scope("s")
            await manager.create_stream("s/a", StreamConfig(scaling=ScalingPolicy.fixed(1)))
            writer = client.event_writer("s/a")
            await writer.write_event(b"first")
            await writer.flush()
            transaction = await client.transactional_writer("s/a").begin()
            await transaction.write_event(b"in a transaction")
            group = await client.reader_group("s/g", ["s/a"])
            reader = await group.reader("r", config=ReaderConfig(tail_wait_seconds=1.0))
            ready.update(writer=writer, transaction=transaction, group=group, reader=reader)
            began = clock.monotonic()  # (the writer's session loop may start counting while the node stops)
            await asyncio.get_running_loop().run_in_executor(None, node.close)  # the node goes away
            for _ in range(1000):  # until the client has seen its connections close (a request that is not
                if not client.pool.connections():  # harmless, sent on one still closing, is lost at once:
                    break  # its outcome is unknown, which is not what this test is about)
                await asyncio.sleep(0.01)
            assert not client.pool.connections()
            with pytest.raises(ReconnectBudgetExceededError):
                await ENTRY_POINTS[entry](client, ready)
            assert clock.monotonic() - began >= BUDGET_SECONDS, "given up before the budget was spent"
        finally:
            if "reader" in ready:  # (it cannot leave the group: the node is gone; do not spend budgets trying)
                await ready["reader"]._abandon()
            with contextlib.suppress(ConnectionLostError):
                await client.close()

    import contextlib

    node = millstream.standalone(tmp_path)
    try:
        run(scenario, timeout=120.0)  # (a loaded machine: closing waits out the budgets, on the jumping clock)
    finally:
        node.close()
