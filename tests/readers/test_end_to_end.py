"""Reader groups against ``millstream.standalone`` over TCP: readers sharing a 16-segment stream, a
crashed reader's segments returned (by heartbeat timeout and explicitly), per-key order across a split
and a merge while readers follow the tail, checkpoint then reset re-reading exactly the events after
the checkpoint, bounded reads, truncated data, automatic checkpoints publishing the group's position
for consumption-based retention, and bad input (typed errors, state unchanged)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

import millstream
from millstream.client import (
    AsyncClient,
    Checkpoint,
    Position,
    ReaderConfig,
    ReaderGroupConfig,
    RetentionPolicy,
    ScalingPolicy,
    StreamConfig,
    StreamCut,
)
from millstream.client._streams import canonical_json
from millstream.errors import (
    CheckpointFailedError,
    InvalidArgumentError,
    InvalidStreamCutError,
    ReaderExistsError,
    ReaderGroupNotFoundError,
    TruncatedDataError,
)
from millstream.naming import parse_stream_segment_name
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag, History, Outcome, check
from tests.readers.helpers import FAST, Drain, TaggedWriter, run, tags_of, wait_until

KEYS = [f"key-{i}" for i in range(40)]


def fixed(segments: int, retention: RetentionPolicy | None = None) -> StreamConfig:
    return StreamConfig(scaling=ScalingPolicy.fixed(segments), retention=retention or RetentionPolicy.none())


async def stream(client: AsyncClient, name: str, config: StreamConfig) -> None:
    manager = client.stream_manager()
    await manager.create_scope(name.split("/", maxsplit=1)[0], exist_ok=True)
    await manager.create_stream(name, config)


def test_many_readers_share_a_16_segment_stream_and_read_each_event_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/wide", fixed(16))
            history = History()
            writer = TaggedWriter(client, "s/wide", history)
            await writer.write(800, KEYS)
            group = await client.reader_group(
                "s/g", config=ReaderGroupConfig(["s/wide"], automatic_checkpoint_seconds=0.1))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            # One reader first (it takes all 16 segments), then three more join while it reads: the
            # first gives segments up at its checkpoints until all four hold four each.
            drains = [Drain(await group.reader("r0", config=FAST), log, stop).start()]
            await wait_until(lambda: len(log) >= 100, what="the first reader to read")
            for index in range(1, 4):
                drains.append(Drain(await group.reader(f"r{index}", config=FAST), log, stop).start())

            def balanced() -> bool:
                return sorted(len(d.reader.segments) for d in drains) == [4, 4, 4, 4]
            await wait_until(lambda: len(log) >= 800 and balanced(), what="4 segments each")
            owned = {d.reader.reader_id: set(d.reader.segments) for d in drains}
            assert len(set().union(*owned.values())) == 16
            # Now the load is shared: new events spread over all four readers, each reading its own segments.
            counts = [len(d.events) for d in drains]
            await writer.write(800, KEYS)
            await wait_until(lambda: len(log) >= 1600, what="every event read")
            stop.set()
            for drain in drains:
                await drain.join()
            shares = [len(d.events) - before for d, before in zip(drains, counts, strict=True)]
            assert sum(shares) == 800 and min(shares) > 800 / 16, shares
            record = [payload for _, payload in log]
            history.read_all("all", record, complete=True)
            report = check(history)
            assert report.ok and report.reads == 1600, report.summary()
            state = await group.state()
            assert all(c.complete for c in state.checkpoints) or state.outstanding_checkpoints
            state.check_invariants()

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_a_crashed_readers_segments_return_to_the_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(4))
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(200, KEYS)
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            watchful = ReaderConfig(time_unit_seconds=0.02, heartbeat_seconds=0.05, offline_timeout_seconds=0.5,
                                    tail_wait_seconds=1.0)
            victim = await group.reader("victim", config=watchful)
            survivor = await group.reader("survivor", config=watchful)
            log: list[tuple[str, bytes]] = []
            victim_stop, survivor_stop = asyncio.Event(), asyncio.Event()
            victim_drain = Drain(victim, log, victim_stop).start()
            survivor_drain = Drain(survivor, log, survivor_stop).start()
            await wait_until(lambda: len(victim.segments) == 2 and len(survivor.segments) == 2
                             and len(victim_drain.events) > 10, what="both readers reading")
            # A checkpoint records where both are; then the victim reads on and dies without a word.
            checkpoint = await (await group.initiate_checkpoint("before-crash", timeout=20))
            victim_segments = set(victim.segments)
            await asyncio.sleep(0.05)
            victim_stop.set()
            await victim_drain.join()
            await victim._abandon()
            # The survivor stops seeing its heartbeats and declares it offline: it gets every segment,
            # restarting the victim's at their checkpointed offsets.
            every = {s for cut in checkpoint.cuts.values() for s in cut.segment_names()}
            await wait_until(lambda: set(survivor.segments) == every, what="the survivor to take the victim's segments")
            assert victim_segments <= every and (await group.online_readers()) == ["survivor"]
            assert await group.reader_offline("victim") is False  # gone already
            await writer.write(100, KEYS)
            await wait_until(lambda: len({p for _, p in log}) == 300, what="every event read")
            survivor_stop.set()
            await survivor_drain.join()
            # Every event read; only what the victim read after the checkpoint was read twice.
            seen = [p for _, p in log]
            history.read_all("all", list(dict.fromkeys(seen)), complete=True)
            report = check(history)
            assert report.ok, report.summary()
            after_checkpoint = set(victim_drain.events) - set(victim_drain.before_checkpoint["before-crash"])
            twice = {p for p in seen if seen.count(p) > 1}
            assert twice <= after_checkpoint and len(seen) == 300 + len(twice)

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_reader_offline_returns_segments_at_the_given_position(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(2))
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(40, KEYS)
            group = await client.reader_group("s/g", ["s/a"])
            first = await group.reader("first", config=FAST)
            read = []
            while len(read) < 10:
                event = await first.read_next_event(1.0)
                if event.event is not None:
                    read.append(event.event)
            position = first.position()
            assert Position.from_json(position.to_json()) == position
            await first._abandon()
            assert await group.reader_offline("first", position) is True
            assert await group.reader_offline("first") is False  # not online any more
            second = await group.reader("second", config=FAST)
            rest = []
            while len(rest) < 30:
                event = await second.read_next_event(1.0)
                if event.event is not None:
                    rest.append(event.event)
            assert not set(read) & set(rest) and len(set(read) | set(rest)) == 40
            history.read_all("p", read + rest, complete=True)
            assert check(history).ok

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_reading_across_a_split_and_a_merge_keeps_per_key_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/scaled", fixed(2))
            manager = client.stream_manager()
            history = History()
            writer = TaggedWriter(client, "s/scaled", history)
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/scaled"],
                                                                              automatic_checkpoint_seconds=0.2))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            # Every reader joins before any reads, so the group shares the segments from the start
            # (readers give segments up only at checkpoints, or before reading them).
            readers = [await group.reader(f"r{i}", config=FAST) for i in range(3)]
            drains = [Drain(reader, log, stop).start() for reader in readers]
            # Readers follow the tail while the stream splits and then merges under them.
            await writer.write(150, KEYS)
            segments = (await manager.current_segments("s/scaled")).segments
            await manager.split_segment("s/scaled", segments[0].segment_id)  # [0, .5) -> two quarters
            await writer.write(150, KEYS)
            current = (await manager.current_segments("s/scaled")).segments
            await manager.merge_segments("s/scaled", [current[1].segment_id, current[2].segment_id])  # [.25, 1)
            await writer.write(150, KEYS)
            await wait_until(lambda: len(log) >= 450, what="every event read")
            stop.set()
            for drain in drains:
                await drain.join()
            history.read_all("all", [p for _, p in log], complete=True)
            report = check(history)
            assert report.ok and report.reads == 450, report.summary()
            # Per key, events come back in the order written (the checker's "reordered" is per writer and key).
            order: dict[str, list[int]] = {}
            for tag in tags_of([p for _, p in log]):
                order.setdefault(writer.keys[tag.sequence], []).append(tag.sequence)
            assert all(seq == sorted(seq) for seq in order.values())
            state = await group.state()
            assert len(state.held) == 2 and not state.future  # the last epoch's two segments

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_checkpoint_then_reset_rereads_exactly_the_events_after_the_checkpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(3))
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(300, KEYS)
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            # Every reader joins before any reads, so the group shares the segments from the start
            # (readers give segments up only at checkpoints, or before reading them).
            readers = [await group.reader(f"r{i}", config=FAST) for i in range(2)]
            drains = [Drain(reader, log, stop).start() for reader in readers]
            await wait_until(lambda: len(log) >= 60 and all(d.events for d in drains), what="some reading")
            future = await group.initiate_checkpoint("cp", timeout=20)
            checkpoint = await future
            assert set(checkpoint.cuts) == {"s/a"} and Checkpoint.from_json(checkpoint.to_json()) == checkpoint
            assert await group.checkpoint("cp") == checkpoint
            await writer.write(100, KEYS)
            await wait_until(lambda: len(log) >= 400, what="everything read")
            # Each reader's events before it returned the checkpoint are before it; the rest after it.
            before = {p for d in drains for p in d.before_checkpoint["cp"]}
            after = {p for _, p in log} - before
            assert len(before) + len(after) == 400 and before and after
            generation = await group.reset_to_checkpoint(checkpoint)
            assert generation == 1 and (await group.state()).generation == 1
            await wait_until(lambda: len(log) >= 400 + len(after), what="the events after the checkpoint again")
            await asyncio.sleep(0.3)  # nothing more may come
            stop.set()
            for drain in drains:
                await drain.join()
            again = [p for _, p in log[400:]]
            assert len(again) == len(after) and set(again) == after, (
                f"exactly the events after the checkpoint, once: {len(again)} read again, {len(after)} after it; "
                f"{len(set(again) - after)} read again were before it, {len(after - set(again))} after it missing, "
                f"checkpoint {checkpoint!r}")
            history.read_all("first", [p for _, p in log[:400]], complete=True)
            history.read_all("after-reset", again)
            report = check(history)
            assert report.ok, report.summary()

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_bounded_reads_stop_at_the_end_cut(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(2))
            manager = client.stream_manager()
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(60, KEYS)
            segments = (await manager.current_segments("s/a")).segments
            await manager.split_segment("s/a", segments[1].segment_id)
            await writer.write(40, KEYS)
            end = await manager.tail_cut("s/a")
            await writer.write(50, KEYS)  # beyond the end cut
            group = await client.reader_group("s/bounded", config=ReaderGroupConfig({"s/a": (None, end)},
                                                                                    automatic_checkpoint_seconds=0))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            # Every reader joins before any reads, so the group shares the segments from the start
            # (readers give segments up only at checkpoints, or before reading them).
            readers = [await group.reader(f"r{i}", config=FAST) for i in range(2)]
            drains = [Drain(reader, log, stop).start() for reader in readers]
            await wait_until(lambda: all(d.ended for d in drains), what="end of stream for both readers")
            stop.set()
            for drain in drains:
                await drain.join()
            assert sorted(t.sequence for t in tags_of([p for _, p in log])) == list(range(1, 101))
            state = await group.state()
            assert state.finished and {s: o for s, o in state.ended.items()} == end.segment_names()

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_truncated_data_raises_a_typed_error_and_skips_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(1))
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(20, KEYS)
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            tail = await client.stream_manager().tail_cut("s/a")
            await client.stream_manager().truncate_stream("s/a", tail)
            await writer.write(5, KEYS)
            reader = await group.reader("r", config=FAST)
            with pytest.raises(TruncatedDataError):
                for _ in range(100):
                    await reader.read_next_event(0.2)
            with pytest.raises(TruncatedDataError):  # again: the reader stays before the missing data
                await reader.read_next_event(0.2)
            assert reader.position().segments == {"s/a/0.#epoch.0": 0}
            # The application decides to go on from the head.
            await group.reset_to_stream_cuts({"s/a": await client.stream_manager().head_cut("s/a")})
            got = []
            while len(got) < 5:
                event = await reader.read_next_event(1.0)
                if event.event is not None:
                    got.append(event.event)
            assert [t.sequence for t in tags_of(got)] == [21, 22, 23, 24, 25]

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_automatic_checkpoints_publish_the_groups_position_for_consumption_retention(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(2, RetentionPolicy.consumption()))
            history = History()
            writer = TaggedWriter(client, "s/a", history)
            await writer.write(50, KEYS)
            group = await client.reader_group("s/g", config=ReaderGroupConfig(
                ["s/a"], automatic_checkpoint_seconds=0.1, retention="consumption"))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            drain = Drain(await group.reader("r", config=FAST), log, stop).start()
            tail = await client.stream_manager().tail_cut("s/a")

            async def published() -> dict[int, int] | None:  # (runs on the node's loop)
                return node.controller._state.groups[("s", "g")].subscriber_cuts.get("s/a")
            await wait_until(lambda: len(log) == 50 and bool(drain.checkpoints)
                             and node.run(published()) == dict(tail.positions),
                             what="an automatic checkpoint at the tail, published")
            stop.set()
            await drain.join()
            assert all(name.startswith("auto-") for name in drain.checkpoints)

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_bad_input_gives_typed_errors_and_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/a", fixed(1))
            await stream(client, "s/b", fixed(1))
            with pytest.raises(ReaderGroupNotFoundError):
                await client.reader_group("s/missing")
            group = await client.reader_group("s/g", ["s/a"])
            reader = await group.reader("r", config=FAST)
            before = canonical_json((await group.state()).to_json_object())
            with pytest.raises(ReaderExistsError):
                await group.reader("r")
            other = await client.stream_manager().head_cut("s/b")
            with pytest.raises(InvalidStreamCutError):
                await group.reset_to_stream_cuts({"s/a": other})  # a cut of another stream
            with pytest.raises(InvalidStreamCutError):
                await group.reset_to_stream_cuts({"s/b": other})  # a stream the group does not read
            with pytest.raises(InvalidArgumentError):
                await group.reset_to_checkpoint("never-taken")
            with pytest.raises(InvalidArgumentError):
                await group.initiate_checkpoint("")
            with pytest.raises(InvalidArgumentError):
                await reader.read_next_event(-1)
            assert canonical_json((await group.state()).to_json_object()) == before
            info = await client.controller().get_reader_group("s", "g")
            assert info.generation == 0
            # A checkpoint nobody answers times out as a typed error; deleting the group ends its readers.
            await reader._abandon()
            waiting = await group.initiate_checkpoint("unanswered", timeout=0.3)
            with pytest.raises(CheckpointFailedError, match="did not record"):
                await waiting
            # A reset abandons a checkpoint in progress (its positions would mix two generations).
            waiting = await group.initiate_checkpoint("dropped", timeout=20)
            await group.reset_to_stream_cuts({"s/a": await client.stream_manager().head_cut("s/a")})
            with pytest.raises(CheckpointFailedError, match="abandoned"):
                await waiting
            await group.delete()
            with pytest.raises(ReaderGroupNotFoundError):
                await client.reader_group("s/g")
            again = await client.reader_group("s/g2", ["s/a"])
            await client.controller().delete_reader_group("s", "g2")
            with pytest.raises(ReaderGroupNotFoundError):
                await again.reader("late")

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_blocking_flavour(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope("s")
        manager.create_stream("s/a", fixed(2))
        segments = [s.name for s in manager.current_segments("s/a").segments]
        with client.event_writer(segments, millstream.StringSerializer()) as writer:
            for index in range(30):
                writer.write_event(json.dumps(index), routing_key=f"k{index}")
        group = client.reader_group("g", ["s/a"])
        assert group.qualified_name == "s/g"
        reader = group.reader("r", millstream.StringSerializer(), config=FAST)
        values = []
        while len(values) < 10:
            read = reader.read_next_event(1.0)
            if read.event is not None:
                values.append(int(read.event))
        # A checkpoint taken while this thread reads: returned by the next call, completed by the one after.
        future = group.initiate_checkpoint("cp", timeout=10)
        checkpoint_seen = False
        while not future.done():
            read = reader.read_next_event(0.2)
            if read.checkpoint_name == "cp":
                checkpoint_seen = True
                position_at_checkpoint = reader.position()
            elif read.event is not None:
                values.append(int(read.event))
        assert checkpoint_seen
        checkpoint = future.result(5)
        assert checkpoint.cuts["s/a"] == StreamCut("s/a", {parse_stream_segment_name(s)[2]: o for s, o in
                                                           position_at_checkpoint.segments.items()})
        while len(values) < 30:
            read = reader.read_next_event(1.0)
            if read.event is not None:
                values.append(int(read.event))
        assert sorted(values) == list(range(30))
        assert reader.read_next_event(0.1).event is None
        reader.close()  # leaves at its position: the end of what was written
        assert group.online_readers() == []
        assert dict(group.state().unassigned) == manager.tail_cut("s/a").segment_names()
        group.close()


def test_readers_follow_a_stream_writer_while_the_stream_splits_and_merges(tmp_path: Path) -> None:
    """The stream-aware writer writes continuously while the stream scales four times under it; three
    readers read concurrently: every event once, per-key order intact across every scale."""
    events = 3000

    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/live", fixed(2))
            manager = client.stream_manager()
            history = History()
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/live"],
                                                                              automatic_checkpoint_seconds=0.2))
            readers = [await group.reader(f"r{i}", config=FAST) for i in range(3)]
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            drains = [Drain(reader, log, stop).start() for reader in readers]
            written = 0

            async def write() -> None:
                nonlocal written
                writer = client.event_writer("s/live")
                for sequence in range(1, events + 1):
                    key = KEYS[sequence % len(KEYS)]
                    tag = EventTag("w", sequence)
                    history.write_invoked(tag, key=key)
                    await writer.write_event(tag.payload(64, key=key), routing_key=key)
                    written = sequence
                    if sequence % 100 == 0:
                        await asyncio.sleep(0)  # (let the scaling and the readers run between blocks)
                await writer.flush()
                await writer.close()
                history.writes_completed([EventTag("w", n) for n in range(1, events + 1)], Outcome.ACKED)

            async def scale() -> None:
                for step, kind in enumerate(["split", "split", "merge", "merge"], start=1):
                    await wait_until(lambda step=step: written >= step * events // 5, what="writing to go on")
                    current = (await manager.current_segments("s/live")).segments
                    if kind == "split":
                        widest = max(current, key=lambda s: s.key_end - s.key_start)
                        await manager.split_segment("s/live", widest.segment_id)
                    else:
                        await manager.merge_segments("s/live", [current[0].segment_id, current[1].segment_id])

            await asyncio.gather(write(), scale())
            await wait_until(lambda: len(log) >= events, what="every event read")
            await asyncio.sleep(0.2)  # nothing more may come
            stop.set()
            for drain in drains:
                await drain.join()
            history.read_all("group", [p for _, p in log], complete=True)
            report = check(history)
            assert report.ok and report.reads == events, report.summary()
            assert (await manager.describe_stream("s/live")).epoch == 4

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_a_group_over_two_streams_checkpoints_both_and_ends_when_both_are_sealed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await stream(client, "s/x", fixed(2))
            await stream(client, "s/y", fixed(1))
            history = History()
            await TaggedWriter(client, "s/x", history, name="wx").write(30, KEYS)
            await TaggedWriter(client, "s/y", history, name="wy").write(30, KEYS)
            group = await client.reader_group("g", ["s/x", "s/y"])
            assert group.qualified_name == "s/g"
            readers = [await group.reader(f"r{i}", config=FAST) for i in range(2)]
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            drains = [Drain(reader, log, stop).start() for reader in readers]
            await wait_until(lambda: len(log) == 60, what="both streams read")
            checkpoint = await (await group.initiate_checkpoint("both", timeout=20))
            manager = client.stream_manager()
            assert dict(checkpoint.cuts) == {"s/x": await manager.tail_cut("s/x"), "s/y": await manager.tail_cut("s/y")}
            await manager.seal_stream("s/x")
            await manager.seal_stream("s/y")
            await wait_until(lambda: all(d.ended for d in drains), what="the end of both streams")
            stop.set()
            for drain in drains:
                await drain.join()
            history.read_all("group", [p for _, p in log], complete=True)
            report = check(history)
            assert report.ok and report.reads == 60, report.summary()
            state = await group.state()
            assert state.finished and set(state.ended) == {"s/x/0.#epoch.0", "s/x/1.#epoch.0", "s/y/0.#epoch.0"}

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_rebalancing_and_offline_detection_follow_the_injected_clock(tmp_path: Path) -> None:
    """With a manual clock nothing time-driven happens until the test moves time: a reader takes its
    first segments only after its (seeded) random delay, and a silent reader is declared offline
    exactly when the timeout has passed on the clock."""
    async def scenario() -> None:
        clock = ManualClock(100.0)
        async with AsyncClient(node.uri) as setup:
            await stream(setup, "s/a", fixed(2))
            history = History()
            await TaggedWriter(setup, "s/a", history).write(20, KEYS)
        async with AsyncClient(node.uri, clock=clock, rng=random.Random(7)) as client:
            group = await client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            config = ReaderConfig(time_unit_seconds=1.0, heartbeat_seconds=1.0, offline_timeout_seconds=5.0,
                                  tail_wait_seconds=1.0)
            a = await group.reader("a", config=config)
            b = await group.reader("b", config=config)
            for _ in range(5):
                assert (await a.read_next_event(0)).event is None and (await b.read_next_event(0)).event is None
            assert a.segments == [] and b.segments == []  # no time has passed: nobody acquired yet
            clock.advance(1.0)  # past every first delay (at most one time unit)
            await a.read_next_event(0)
            await b.read_next_event(0)
            assert len(a.segments) == 1 and len(b.segments) == 1
            payloads = []
            for _ in range(500):
                for reader in (a, b):
                    read = await reader.read_next_event(0)
                    if read.event is not None:
                        payloads.append(read.event)
                if len(payloads) == 20:
                    break
                await asyncio.sleep(0.005)
            history.read_all("p", payloads, complete=True)
            assert check(history).ok
            # b goes silent.  a declares it offline once 5 s of the clock pass without b's heartbeat.
            await b._abandon()

            async def tick(seconds: float) -> None:
                for _ in range(int(seconds)):
                    clock.advance(1.0)
                    await asyncio.sleep(0.05)  # (a's heartbeat round trip runs in real time)
            await tick(4)
            assert await group.online_readers() == ["a", "b"]
            await tick(3)
            await wait_until(lambda: "b" not in a.synchronizer.state.readers, what="b declared offline")
            assert await group.online_readers() == ["a"]

    with millstream.standalone(tmp_path) as node:
        run(scenario)
