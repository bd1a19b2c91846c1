"""The stream-aware writer against the fake segment store and a fake controller: seals that land while
blocks are in flight to several segments, during a reconnect, after a lost acknowledgement, with the
successors on another server; a stream sealed as a whole; bad streams.

Every scenario ends with the same check: read back each segment in epoch order (a segment's epoch is
the one that created it, so each key's events are read predecessor first) and give the history
checker (``millstream.testing.history``) the events written and how each write ended.  It must find
no event lost, duplicated, reordered per (writer, key), or resurrected, and the writer's own
invariants must hold.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.client import AsyncEventStreamWriter, SegmentWithRange, StreamRouter
from millstream.client._writer import REROUTE
from millstream.errors import (
    InvalidArgumentError,
    ObjectClosedError,
    StreamNotFoundError,
    StreamSealedError,
    StreamSegmentSealedError,
)
from millstream.testing.history import EventTag, History, Outcome, check
from millstream.wire import codec
from millstream.wire.commands import AppendBlock, Command, DataAppended, SetupAppend
from tests.client.fake_server import FakeServer, Faults
from tests.client.helpers import client, run, until
from tests.streams.fake_controller import ControllerFakeServer, FakeController

STREAM = "s/t"
KEYS = [f"key-{i}" for i in range(64)]


class Recorder:
    """Writes tagged events through a stream writer and records them in a ``History``."""

    def __init__(self, writer: AsyncEventStreamWriter[bytes], name: str = "w") -> None:
        self.writer = writer
        self.name = name
        self.history = History()
        self.futures: list[tuple[EventTag, asyncio.Future[None]]] = []
        self.next = 0

    async def write(self, count: int, keys: Sequence[str | None] = KEYS, *, keyless_unordered: bool = False) -> None:
        """``keyless_unordered``: keyless events promise no order among themselves (they go round robin
        to whichever segments are current), so each is recorded under a key of its own."""
        for _ in range(count):
            tag = EventTag(self.name, self.next)
            key = keys[self.next % len(keys)]
            self.next += 1
            recorded = f"~keyless-{tag.sequence}" if key is None and keyless_unordered else key
            self.history.write_invoked(tag, key=recorded)
            future = await self.writer.write_event_future(tag.payload(key=key), routing_key=key)
            self.futures.append((tag, future))

    def settle(self) -> None:
        for tag, future in self.futures:
            if not future.done():
                self.history.write_completed(tag, Outcome.UNKNOWN)
            elif future.exception() is None:
                self.history.write_completed(tag, Outcome.ACKED)
            elif isinstance(future.exception(), StreamSealedError):
                self.history.write_completed(tag, Outcome.FAILED)  # refused: no segment takes it
            else:
                self.history.write_completed(tag, Outcome.UNKNOWN)


def read_in_epoch_order(controller: FakeController) -> list[bytes]:
    """Every segment of the stream, epoch by epoch (each once, in the epoch that created it)."""
    record = controller.streams[tuple(STREAM.split("/"))]  # type: ignore[index]
    payloads: list[bytes] = []
    seen: set[str] = set()
    for epoch in record.epochs:
        for segment in epoch:
            if segment.name not in seen:
                seen.add(segment.name)
                data = bytes(controller.home[segment.name].segments[segment.name].data)
                payloads.extend(codec.iter_events(data))
    return payloads


def verify(recorder: Recorder, controller: FakeController, *, expect_acked: int | None = None) -> None:
    recorder.settle()
    recorder.history.read_all("epoch-order", read_in_epoch_order(controller), complete=True)
    report = check(recorder.history)
    assert report.ok, report.summary()
    if expect_acked is not None:
        assert report.acked == expect_acked, report.summary()
        assert report.reads == expect_acked, report.summary()


def segments_of(controller: FakeController) -> list[SegmentWithRange]:
    return controller.streams[tuple(STREAM.split("/"))].current  # type: ignore[index]


# --- Seals while blocks are in flight --------------------------------------------------------------


def test_a_seal_while_blocks_are_in_flight_to_several_segments_moves_them_to_the_successors() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller, faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            controller.create_stream(STREAM, 4, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(2000)
            first = segments_of(controller)
            await until(lambda: all(server.segments[s.name].blocks > 0 for s in first), "blocks reached every segment")
            # Split the first segment and merge the last two: three seals land while acknowledgements
            # for blocks already stored are held back, and more blocks are on their way.
            controller.scale(STREAM, [first[0].segment_id], [(0.0, 0.125), (0.125, 0.25)], server=server)
            controller.scale(STREAM, [first[2].segment_id, first[3].segment_id], [(0.5, 1.0)], server=server)
            await recorder.write(2000)
            await until(lambda: writer.hand_overs == 3, "the three sealed segments handed their events over")
            writer.check_invariants()
            server.release_acks()
            await writer.flush()
            writer.check_invariants()
            assert all(future.done() and future.exception() is None for _, future in recorder.futures), \
                "every future -- moved events' too -- completes once durable"
            router = writer.router
            assert isinstance(router, StreamRouter)
            assert sorted(s.name for s in router.segments()) == sorted(s.name for s in segments_of(controller))
            assert set(writer.segment_writers()) <= {s.name for s in segments_of(controller)}
            # Successors got the moved events, fresh writer ids (one SetupAppend each, from 0).
            await writer.close()
            verify(recorder, controller, expect_acked=4000)
    run(scenario)


def test_a_lost_acknowledgement_before_a_seal_does_not_duplicate_the_stored_block() -> None:
    """The writer-id attribute, not the acknowledgements that happened to arrive, decides what moves."""
    async def scenario() -> None:
        controller = FakeController()
        dropped: list[Command] = []

        def drop(reply: Command) -> bool:
            if type(reply) is DataAppended and not dropped and lost_one.is_set():
                dropped.append(reply)
                return True
            return False

        lost_one = asyncio.Event()
        async with ControllerFakeServer(controller, faults=Faults(drop_reply=drop)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            controller.create_stream(STREAM, 1, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(100)
            await writer.flush()
            lost_one.set()
            await recorder.write(1)  # stored; its acknowledgement is lost
            await until(lambda: bool(dropped), "an acknowledgement was lost")
            (only,) = segments_of(controller)
            controller.scale(STREAM, [only.segment_id], [(0.0, 0.5), (0.5, 1.0)], server=server)
            await recorder.write(50)  # meets the seal
            await writer.flush()
            assert writer.hand_overs == 1
            await writer.close()
            verify(recorder, controller, expect_acked=151)
    run(scenario)


def test_a_seal_during_a_reconnect_is_learned_from_append_setup_and_the_rest_moves_on() -> None:
    async def scenario() -> None:
        controller = FakeController()
        cut_done: list[AppendBlock] = []

        def cut(block: AppendBlock) -> str | None:
            if not armed or cut_done:
                return None
            cut_done.append(block)
            # Stored, then the connection breaks before the acknowledgement; the scale seals the
            # segment before the writer is back.
            segment = segments_of(controller)[0]
            asyncio.get_running_loop().call_soon(
                lambda: controller.scale(STREAM, [segment.segment_id], [(0.0, 0.25), (0.25, 0.5)], server=server))
            return "after"

        armed = False
        async with ControllerFakeServer(controller, faults=Faults()) as server, client(server.uri) as c:
            server.faults.cut = cut
            controller.create_stream(STREAM, 2, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(500)
            await writer.flush()
            armed = True
            await recorder.write(500)
            await writer.flush()
            assert cut_done and writer.hand_overs == 1
            sealed_name = controller.streams[("s", "t")].epochs[0][0].name
            assert sealed_name not in writer.segment_writers()
            # The reconnect set up on the sealed segment again and learned what it stores.
            setups = [c for c in server.received if type(c) is SetupAppend]
            assert len(setups) >= 4  # 2 at first, the reconnect, and at least one successor
            writer.check_invariants()
            await writer.close()
            verify(recorder, controller, expect_acked=1000)
    run(scenario)


def test_successors_on_another_server_are_reached_on_a_connection_of_their_own() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as home, FakeServer() as other, client(home.uri) as c:
            controller.create_stream(STREAM, 2, home)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(300)
            first = segments_of(controller)
            # Every successor lives on the other server; the seal lands with blocks in flight.
            controller.scale(STREAM, [first[0].segment_id], [(0.0, 0.25), (0.25, 0.5)], server=other)
            await recorder.write(300)
            controller.scale(STREAM, [first[1].segment_id], [(0.5, 1.0)], server=other)
            await recorder.write(300)
            await writer.flush()
            assert writer.hand_overs == 2
            assert other.connection_count >= 1
            assert all(other.segments[s.name].blocks > 0 for s in segments_of(controller))
            assert {type(cmd).__name__ for cmd in other.received} >= {"SetupAppend", "AppendBlock"}
            await writer.close()
            verify(recorder, controller, expect_acked=900)
    run(scenario)


def test_scaling_again_before_the_writer_caught_up_follows_the_chain_of_successors() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller, faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0) as c:
            controller.create_stream(STREAM, 1, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(500)
            (only,) = segments_of(controller)
            left, right = controller.scale(STREAM, [only.segment_id], [(0.0, 0.5), (0.5, 1.0)], server=server)
            # Before the writer learns of it, the left half splits again and then merges back with the right.
            a, b = controller.scale(STREAM, [left.segment_id], [(0.0, 0.25), (0.25, 0.5)], server=server)
            controller.scale(STREAM, [a.segment_id, b.segment_id, right.segment_id], [(0.0, 1.0)], server=server)
            await recorder.write(500)
            server.release_acks()
            await writer.flush()
            assert writer.hand_overs >= 2
            (last,) = segments_of(controller)
            assert set(writer.segment_writers()) == {last.name}
            writer.check_invariants()
            await writer.close()
            verify(recorder, controller, expect_acked=1000)
    run(scenario)


# --- Sealed streams and segments -------------------------------------------------------------------


def test_a_stream_sealed_as_a_whole_fails_the_writer_with_stream_sealed_error() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 2, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            await recorder.write(200)
            await writer.flush()
            controller.seal_stream(STREAM)
            with pytest.raises(StreamSealedError):
                for _ in range(1000):
                    await recorder.write(1)
                    await asyncio.sleep(0.001)
            with pytest.raises(StreamSealedError):
                await writer.flush()
            with pytest.raises(StreamSealedError):
                await writer.write_event(b"more")
            failed = [future for _, future in recorder.futures[200:] if future.done()]
            assert failed and all(isinstance(f.exception(), StreamSealedError) for f in failed)
            with pytest.raises(StreamSealedError):
                await writer.close()
            verify(recorder, controller, expect_acked=200)
            # A new writer for a sealed stream is refused on its first call.
            late = c.event_writer(STREAM)
            with pytest.raises(StreamSealedError):
                await late.write_event(b"x")
    run(scenario)


def test_a_segment_sealed_outside_a_scale_is_a_typed_error() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 1, server)
            writer = c.event_writer(STREAM)
            await writer.write_event(b"first", routing_key="k")
            await writer.flush()
            controller.seal_segments(segments_of(controller))  # behind the controller's back
            await writer.write_event(b"second", routing_key="k")
            with pytest.raises(StreamSegmentSealedError, match="not by a scale"):
                await writer.flush()
            # The event stays with the writer, unacknowledged, for whoever wants to look.
            assert writer.unacknowledged_events(segments_of(controller)[0].name) == [b"second"]
            with pytest.raises(StreamSegmentSealedError):
                await writer.close()
    run(scenario)


def test_an_unknown_or_malformed_stream_is_refused_with_a_typed_error() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            with pytest.raises(InvalidArgumentError):
                c.event_writer("no-slash")
            writer = c.event_writer("s/missing")
            with pytest.raises(StreamNotFoundError):
                await writer.write_event(b"x")
            with pytest.raises(StreamNotFoundError):
                await writer.write_event_future(b"x")
            # Not a failure of the writer: once the stream exists, the next call goes through.
            controller.create_stream("s/missing", 1, server)
            await writer.write_event(b"x")
            await writer.close()
            assert server.payloads("s/missing/0.#epoch.0") == [b"x"]
            with pytest.raises(ObjectClosedError):
                await writer.write_event(b"y")
    run(scenario)


# --- Routing ---------------------------------------------------------------------------------------


def test_keyless_events_spread_evenly_over_the_current_segments() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 4, server)
            async with c.event_writer(STREAM) as writer:
                for i in range(400):
                    await writer.write_event(b"e%d" % i)
                await writer.flush()
                counts = [len(server.payloads(s.name)) for s in segments_of(controller)]
                assert counts == [100, 100, 100, 100]
                first = segments_of(controller)
                controller.scale(STREAM, [first[0].segment_id], [(0.0, 0.125), (0.125, 0.25)], server=server)
                for i in range(10_000):  # until the writer meets the seal and moves on
                    await writer.write_event(b"f%d" % i)
                    if writer.hand_overs:
                        break
                    await asyncio.sleep(0.0005)
                await writer.flush()
                before = {s.name: len(server.payloads(s.name)) for s in segments_of(controller)}
                for i in range(500):
                    await writer.write_event(b"g%d" % i)
            after = {s.name: len(server.payloads(s.name)) for s in segments_of(controller)}
            assert [after[name] - before[name] for name in after] == [100] * 5, (before, after)
    run(scenario)


def test_keys_route_by_their_position_in_the_key_space() -> None:
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 3, server)
            async with c.event_writer(STREAM) as writer:
                for key in KEYS:
                    await writer.write_event(key.encode(), routing_key=key)
            from millstream.client import routing_key_fraction
            for segment in segments_of(controller):
                expected = [k.encode() for k in KEYS if segment.owns(routing_key_fraction(k))]
                assert server.payloads(segment.name) == expected
    run(scenario)


def test_a_one_segment_view_takes_every_text_key_and_no_other_until_it_splits() -> None:
    """While the stream has one segment the writer sends every event there without consulting the
    memo or the router; a key that is not a ``str`` is still refused, and once the segment splits
    keys route by their hash again."""
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 1, server)
            writer = c.event_writer(STREAM)
            (only,) = segments_of(controller)
            for key in KEYS[:20]:
                await writer.write_event(key.encode(), routing_key=key)
            await writer.write_event(b"keyless")
            assert writer._single == only.name
            for bad in (5, b"k", ("k",)):
                with pytest.raises(InvalidArgumentError, match="routing key"):
                    await writer.write_event(b"refused", routing_key=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="routing key"):
                await writer.write_event(b"refused", routing_key=["k"])  # type: ignore[arg-type]
            await writer.flush()
            assert server.payloads(only.name) == [k.encode() for k in KEYS[:20]] + [b"keyless"]
            controller.scale(STREAM, [only.segment_id], [(0.0, 0.5), (0.5, 1.0)], server=server)
            await writer.write_event(b"meets the seal", routing_key="k")
            await until(lambda: writer.hand_overs == 1, "the hand-over")
            assert writer._single is None
            for key in KEYS:
                await writer.write_event(key.encode(), routing_key=key)
            await writer.flush()
            writer.check_invariants()
            await writer.close()
            from millstream.client import routing_key_fraction
            successors = segments_of(controller)
            assert len(successors) == 2 and only not in successors
            for segment in successors:
                expected = [k.encode() for k in KEYS if segment.owns(routing_key_fraction(k))]
                assert [p for p in server.payloads(segment.name) if p != b"meets the seal"] == expected
    run(scenario)


def test_an_event_routed_by_a_stale_view_is_routed_again() -> None:
    """White box: what the blocking flavour's caller thread can meet when the loop thread hands a
    sealed segment over between routing an event and buffering it."""
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller) as server, client(server.uri) as c:
            controller.create_stream(STREAM, 1, server)
            writer = c.event_writer(STREAM)
            await writer.write_event(b"before", routing_key="k")
            await writer.flush()
            (only,) = segments_of(controller)
            old = writer.segment_writers()[only.name]
            controller.scale(STREAM, [only.segment_id], [(0.0, 0.5), (0.5, 1.0)], server=server)
            await writer.write_event(b"meets the seal", routing_key="k")
            await until(lambda: writer.hand_overs == 1, "the hand-over")
            assert old.retired and old.append(b"late", "k", None) == REROUTE
            # A caller that routed by the old view reaches the retired writer or, once it is gone, a
            # segment no longer routed to: both send the event on by the new view.
            assert writer._add(b"stale", "k", None) is not None  # the normal path, by the new view
            stale = writer._open_segment(only.name, "k")
            assert stale.segment != only.name and not stale.retired
            await writer.flush()
            writer.check_invariants()
            await writer.close()
            stored = [p for s in segments_of(controller) for p in server.payloads(s.name)]
            assert sorted(stored) == [b"meets the seal", b"stale"]
            assert server.payloads(only.name) == [b"before"]
    run(scenario)


def test_routing_keys_count_against_the_unacknowledged_bytes_budget() -> None:
    """Each unacknowledged event keeps its key (to re-route it after a seal): a writer of tiny events
    with long keys must still stop at its budget."""
    async def scenario() -> None:
        controller = FakeController()
        async with ControllerFakeServer(controller, faults=Faults(hold_acks=True)) as server, client(
                server.uri, append_ack_timeout_seconds=10.0, writer_unacked_bytes_max=20_000) as c:
            controller.create_stream(STREAM, 2, server)
            writer = c.event_writer(STREAM)
            written = 0

            async def write_many() -> None:
                nonlocal written
                for i in range(200):  # 200 x (10 + 8) framed bytes alone would fit 5 times over
                    await writer.write_event(b"e%09d" % i, routing_key=f"{i:04d}" + "k" * 996)
                    written += 1

            task = asyncio.ensure_future(write_many())
            await until(lambda: written >= 15, "some events were written")
            await asyncio.sleep(0.2)  # several batch windows: every open block closed and was charged
            assert not task.done() and written < 40, f"{written} events of 1,010 charged bytes under 20,000"
            writer.check_invariants()
            server.release_acks()
            await asyncio.wait_for(task, 10)
            await writer.close()
            stored = [p for s in segments_of(controller) for p in server.payloads(s.name)]
            assert sorted(stored) == [b"e%09d" % i for i in range(200)]
    run(scenario)


# --- Drawn interleavings ---------------------------------------------------------------------------

_STEP = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 120)),
    st.tuples(st.just("split"), st.integers(0, 15)),
    st.tuples(st.just("merge"), st.integers(0, 15)),
    st.tuples(st.just("split_late"), st.integers(0, 15)),  # successors recorded, the seal lands later
    st.tuples(st.just("seal_late"), st.just(0)),
    st.tuples(st.just("cut"), st.just(0)),
    st.tuples(st.just("hold"), st.just(0)),
    st.tuples(st.just("release"), st.just(0)),
    st.tuples(st.just("flush"), st.just(0)),
)


@settings(max_examples=400 if os.environ.get("MILLSTREAM_PROFILE") == "nightly" else 25)
@given(st.lists(_STEP, min_size=1, max_size=25), st.integers(1, 3), st.integers(0, 2**16))
def test_per_key_order_and_exactly_once_under_drawn_scales_and_faults(
        steps: list[tuple[str, int]], segments: int, seed: int) -> None:
    """Writes, splits, merges, seals that land late, cut connections and held acknowledgements in any
    order: reading every segment in epoch order finds every event once, per key in the order written."""
    controller = FakeController()
    late: list[list[SegmentWithRange]] = []

    async def scenario() -> None:
        async with ControllerFakeServer(controller, faults=Faults()) as server, client(
                server.uri, seed=seed, append_ack_timeout_seconds=5.0, reconnect_attempts_max=12) as c:
            controller.create_stream(STREAM, segments, server)
            writer = c.event_writer(STREAM)
            recorder = Recorder(writer)
            for kind, value in steps:
                current = segments_of(controller)
                if kind == "write":
                    await recorder.write(value, keys=[*KEYS[:12], None], keyless_unordered=True)
                elif kind in ("split", "split_late"):
                    victim = current[value % len(current)]
                    middle = (victim.key_start + victim.key_end) / 2
                    if victim.key_start < middle < victim.key_end:
                        seal_now = kind == "split"
                        controller.scale(STREAM, [victim.segment_id],
                                         [(victim.key_start, middle), (middle, victim.key_end)], server=server,
                                         seal_now=seal_now)
                        if not seal_now:
                            late.append([victim])
                elif kind == "merge" and len(current) > 1:
                    first = value % (len(current) - 1)
                    pair = current[first:first + 2]
                    controller.scale(STREAM, [s.segment_id for s in pair], [(pair[0].key_start, pair[1].key_end)],
                                     server=server)
                elif kind == "seal_late" and late:
                    controller.seal_segments(late.pop(0))
                elif kind == "cut":
                    server.cut_all()
                elif kind == "hold":
                    server.faults.hold_acks = True
                elif kind == "release":
                    server.release_acks()
                elif kind == "flush" and not server.faults.hold_acks:
                    await writer.flush()
                await asyncio.sleep(0)
            for pending in late:
                controller.seal_segments(pending)
            server.release_acks()
            await writer.flush()
            writer.check_invariants()
            await writer.close()
            recorder.settle()
            recorder.history.read_all("epoch-order", read_in_epoch_order(controller), complete=True)
            report = check(recorder.history)
            assert report.ok and report.acked == report.written == report.reads, report.summary()

    run(scenario)
