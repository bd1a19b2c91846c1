"""The controller as a service, on the simulated tiers: scopes, streams, scaling, stream cuts,
truncation, the reader-group registry, bad input, restarts (including in the middle of a scale),
snapshots and two controllers on one log."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.client import ReaderGroupConfig, RetentionPolicy, ScalingPolicy, StreamConfig, StreamCut
from millstream.controller import METADATA_SEGMENT, Controller, StreamState, reader_group_state_segment
from millstream.errors import (
    InvalidArgumentError,
    InvalidScaleError,
    InvalidStreamCutError,
    ObjectClosedError,
    ReaderGroupExistsError,
    ReaderGroupNotFoundError,
    ScopeExistsError,
    ScopeNotEmptyError,
    ScopeNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSealedError,
    StreamSegmentNotExistsError,
)
from millstream.naming import segment_id, stream_segment_name
from tests.controller.helpers import Crash, FlakyStore, Harness, append_events, harness, run

FIXED2 = StreamConfig(scaling=ScalingPolicy.fixed(2))


class Unchanged:
    """Asserts that a failed call left the metadata (state and log) as it was."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def fails(self, error: type[Exception], call: Any, match: str | None = None) -> None:
        before = self.controller.state.to_snapshot()
        length = self.controller._log.length
        with pytest.raises(error, match=match):
            await call
        assert self.controller.state.to_snapshot() == before
        assert self.controller._log.length == length


def test_scopes_and_streams_with_typed_errors_that_change_nothing() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller()
            check = Unchanged(controller)
            assert await controller.create_scope("iot") is None
            await check.fails(ScopeExistsError, controller.create_scope("iot"))
            await check.fails(InvalidArgumentError, controller.create_scope("_system"))
            await check.fails(ScopeNotFoundError, controller.create_stream("nope", "s", FIXED2))
            await controller.create_stream("iot", "s", FIXED2)
            await check.fails(StreamExistsError, controller.create_stream("iot", "s", StreamConfig()))
            await check.fails(StreamNotFoundError, controller.get_stream("iot", "t"))
            await check.fails(ScopeNotFoundError, controller.list_streams("nope"))
            assert await controller.list_scopes() == ["iot"]
            assert await controller.list_streams("iot") == ["s"]
            described = await controller.get_stream("iot", "s")
            assert described.epoch == 0 and described.sealed is False and described.state == "active"
            assert [s.segment_id for s in described.segments] == [0, 1]
            for segment in described.segments:
                assert test.segment(segment.name).length == 0, "epoch 0's segments exist in the store"
            await controller.update_stream("iot", "s", StreamConfig(scaling=ScalingPolicy.fixed(2),
                                                                    retention=RetentionPolicy.by_size(10)))
            assert (await controller.get_stream("iot", "s")).config.retention == RetentionPolicy.by_size(10)
            await check.fails(ScopeNotEmptyError, controller.delete_scope("iot"))
            await check.fails(StreamNotSealedError, controller.delete_stream("iot", "s"))
            await controller.seal_stream("iot", "s")
            length = controller._log.length
            await controller.seal_stream("iot", "s")  # sealing twice: fine, and nothing recorded
            assert controller._log.length == length
            assert all(test.segment(stream_segment_name("iot", "s", i)).sealed for i in (0, 1))
            await check.fails(StreamSealedError, controller.scale_stream("iot", "s", [0], [(0.0, 0.5)]))
            await check.fails(StreamSealedError, controller.update_stream("iot", "s", StreamConfig()))
            await controller.delete_stream("iot", "s")
            await check.fails(StreamNotFoundError, controller.get_current_segments("iot", "s"))
            with pytest.raises(StreamSegmentNotExistsError):  # reading a deleted stream's segment
                test.segment(stream_segment_name("iot", "s", 0))
            await controller.delete_scope("iot")
            await check.fails(ScopeNotFoundError, controller.delete_scope("iot"))
            await controller.stop()
            with pytest.raises(ObjectClosedError):
                await controller.list_scopes()
    run(scenario)


def test_manual_split_and_merge_with_successors_predecessors_and_validation() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller()
            check = Unchanged(controller)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "st", FIXED2)
            await append_events(test, stream_segment_name("sc", "st", 0), 3)
            await check.fails(InvalidScaleError, controller.scale_stream("sc", "st", [0], [(0.0, 0.25)]),
                              match="exactly the same keys")
            await check.fails(InvalidScaleError, controller.scale_stream("sc", "st", [5], [(0.0, 0.5)]),
                              match="not in the stream's current epoch")
            assert await controller.scale_stream("sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)]) == 1
            a, b = segment_id(1, 2), segment_id(1, 3)
            current = await controller.get_current_segments("sc", "st")
            assert current.epoch == 1 and [s.segment_id for s in current.segments] == [a, b, 1]
            assert all(s.uri == test.server.uri for s in current.segments)
            assert test.segment(stream_segment_name("sc", "st", 0)).sealed
            assert test.segment(stream_segment_name("sc", "st", 0)).length == 3 * 18
            await check.fails(InvalidScaleError, controller.scale_stream("sc", "st", [0], [(0.0, 0.5)]),
                              match="not in the stream's current epoch")  # sealed already
            assert await controller.scale_stream("sc", "st", [b, 1], [(0.25, 1.0)]) == 2
            c = segment_id(2, 4)
            successors = await controller.get_successors("sc", "st", 0)
            assert [(s.segment.segment_id, sorted(s.predecessors)) for s in successors] == [(a, [0]), (b, [0])]
            successors = await controller.get_successors("sc", "st", 1)
            assert [(s.segment.segment_id, sorted(s.predecessors)) for s in successors] == [(c, [1, b])]
            assert await controller.get_successors("sc", "st", c) == []  # active
            await check.fails(InvalidArgumentError, controller.get_successors("sc", "st", 77))
            stream = controller.state.streams[("sc", "st")]
            assert stream.sealed_lengths == {0: 54, b: 0, 1: 0} and stream.state is StreamState.IDLE
            await controller.seal_stream("sc", "st")
            assert await controller.get_successors("sc", "st", c) == [], "sealed with the stream"
    run(scenario)


def test_stream_cuts_truncation_and_segments_between() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller()
            check = Unchanged(controller)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "st", FIXED2)
            s0, s1 = (stream_segment_name("sc", "st", i) for i in (0, 1))
            await append_events(test, s0, 2)
            await append_events(test, s1, 4)
            assert (await controller.get_head_cut("sc", "st")).to_wire() == {"0": 0, "1": 0}
            assert (await controller.get_tail_cut("sc", "st")).to_wire() == {"0": 36, "1": 72}
            await controller.scale_stream("sc", "st", [0, 1], [(0.0, 1.0)])
            merged = segment_id(1, 2)
            await append_events(test, stream_segment_name("sc", "st", merged), 1)
            assert (await controller.get_tail_cut("sc", "st")).to_wire() == {str(merged): 18}
            between = await controller.get_segments_between("sc", "st", None, None)
            assert [(s.segment.segment_id, s.start_offset, s.end_offset, sorted(s.predecessors)) for s in between] == [
                (0, 0, 36, []), (1, 0, 72, []), (merged, 0, None, [0, 1])]
            await check.fails(InvalidStreamCutError, controller.truncate_stream("sc", "st", {0: 18}),
                              match="exactly once")
            await check.fails(InvalidStreamCutError, controller.truncate_stream("sc", "st", {0: 99, 1: 0}),
                              match="beyond the end")
            await check.fails(InvalidStreamCutError, controller.truncate_stream("sc", "st", {merged: 19}),
                              match="beyond the end")
            await controller.truncate_stream("sc", "st", {0: 18, 1: 72})
            assert test.segment(s0).start_offset == 18 and test.segment(s1).start_offset == 72
            await check.fails(InvalidStreamCutError, controller.truncate_stream("sc", "st", {0: 0, 1: 72}),
                              match="before the head")
            await check.fails(InvalidStreamCutError, controller.check_stream_cut("sc", "st", {0: 0, 1: 0}))
            # (Its one event is 18 bytes: 5 would cut it in two -- refused before anything is recorded.)
            await check.fails(InvalidStreamCutError, controller.check_stream_cut("sc", "st", {merged: 5}),
                              match="not an event boundary: it lies inside the header of the event at 0")
            await check.fails(InvalidStreamCutError, controller.truncate_stream("sc", "st", {merged: 9}),
                              match=r"offset 9 in segment \d+ of sc/st is not an event boundary")
            await controller.check_stream_cut("sc", "st", {merged: 18})
            await controller.truncate_stream("sc", "st", {merged: 18})
            with pytest.raises(StreamSegmentNotExistsError):
                test.segment(s0)  # wholly before the cut: deleted
            stream = controller.state.streams[("sc", "st")]
            assert stream.head == {merged: 18} and stream.history.first_epoch == 1, "epoch 0 forgotten"
            await check.fails(InvalidStreamCutError, controller.check_stream_cut("sc", "st", {0: 18, 1: 72}),
                              match="truncated away")
    run(scenario)


def test_tail_cuts_are_recorded_on_the_clock_and_found_by_time() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(tail_cut_interval_seconds=60.0)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "st", StreamConfig())
            segment = stream_segment_name("sc", "st", 0)
            start = test.clock.monotonic()
            await controller.tick()  # the first tick only schedules the recording
            for minute in range(1, 4):
                await append_events(test, segment, 1)
                test.clock.advance(60.0)
                await controller.tick()
                assert len(controller.state.streams[("sc", "st")].recorded_cuts) == minute
            test.clock.advance(60.0)
            await controller.tick()  # nothing was written: nothing new recorded
            assert len(controller.state.streams[("sc", "st")].recorded_cuts) == 3
            at = await controller.get_cut_at("sc", "st", start + 150.0)
            assert at.to_wire() == {"0": 36}
            assert (await controller.get_cut_at("sc", "st", start)).to_wire() == {"0": 0}, "before any: the head"
            for bad in (-5, -0.5, float("nan"), float("inf"), "1", True):
                with pytest.raises(InvalidArgumentError, match="a time is a finite number"):
                    await controller.get_cut_at("sc", "st", bad)  # type: ignore[arg-type]
    run(scenario)


def test_retention_by_size_time_and_consumption() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(tail_cut_interval_seconds=60.0)
            await controller.create_scope("sc")
            configs = {"size": RetentionPolicy.by_size(40), "time": RetentionPolicy.by_time(150),
                       "used": RetentionPolicy.consumption()}
            for name, retention in configs.items():
                await controller.create_stream("sc", name, StreamConfig(retention=retention))
            group = ReaderGroupConfig(["sc/used"], retention="consumption")
            await controller.create_reader_group("sc", "g", group)
            await controller.tick()
            for _ in range(5):
                for name in configs:
                    await append_events(test, stream_segment_name("sc", name, 0), 1)  # 18 bytes a minute
                test.clock.advance(60.0)
                await controller.tick()
            streams = controller.state.streams
            # Size: the newest recorded cut leaving >= 40 of the 90 bytes is at 36 (54 left).
            assert streams[("sc", "size")].head == {0: 36}
            # Time: the newest cut recorded at least 150 s ago (at minute 2 of 5) is at 36.
            assert streams[("sc", "time")].head == {0: 36}
            assert test.segment(stream_segment_name("sc", "size", 0)).start_offset == 36
            # Consumption: nothing until the subscriber reports; then its cut.
            assert streams[("sc", "used")].head == {0: 0}
            await controller.update_subscriber_cut("sc", "g", "sc/used", {0: 54})
            test.clock.advance(60.0)
            await controller.tick()
            assert streams[("sc", "used")].head == {0: 54}
            assert controller.retention_truncations >= 3
    run(scenario)


def test_reader_group_registry() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller()
            check = Unchanged(controller)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "a", FIXED2)
            config = ReaderGroupConfig(["sc/a"])
            await check.fails(StreamNotFoundError, controller.create_reader_group("sc", "g", ReaderGroupConfig(
                ["sc/missing"])))
            other = StreamCut("sc/a", {0: 5, 1: 0})  # beyond segment 0's end
            await check.fails(InvalidStreamCutError, controller.create_reader_group("sc", "g", ReaderGroupConfig(
                {"sc/a": (other, None)})))
            reply = await controller.create_reader_group("sc", "g", config)
            assert reply == reader_group_state_segment("sc", "g") == "sc/_RGg"
            assert test.segment(reply).length == 0
            await check.fails(ReaderGroupExistsError, controller.create_reader_group("sc", "g", config))
            described = await controller.get_reader_group("sc", "g")
            assert described.generation == 0 and described.config == config
            assert await controller.list_reader_groups("sc") == ["g"]
            start = StreamCut("sc/a", {0: 0, 1: 0})
            assert (await controller.update_reader_group("sc", "g", ReaderGroupConfig(
                {"sc/a": (start, None)}), expected_generation=0)) == 1
            await check.fails(InvalidArgumentError, controller.update_reader_group("sc", "g", config,
                                                                                expected_generation=0))
            await check.fails(InvalidStreamCutError, controller.update_subscriber_cut("sc", "g", "sc/b", {0: 0}))
            await check.fails(InvalidStreamCutError, controller.update_subscriber_cut("sc", "g", "sc/a", {0: 0}))
            await controller.update_subscriber_cut("sc", "g", "sc/a", {0: 0, 1: 0})
            await check.fails(ScopeNotEmptyError, controller.delete_scope("sc"))
            await controller.delete_reader_group("sc", "g")
            with pytest.raises(StreamSegmentNotExistsError):
                test.segment(reply)
            await check.fails(ReaderGroupNotFoundError, controller.get_reader_group("sc", "g"))
            await check.fails(ReaderGroupNotFoundError, controller.delete_reader_group("sc", "g"))
    run(scenario)


async def busy_history(controller: Controller, test: Harness) -> None:
    """Scopes, streams, scales, a truncation, a seal, a reader group: something to replay."""
    await controller.create_scope("one")
    await controller.create_scope("two")
    await controller.create_stream("one", "a", FIXED2)
    await controller.create_stream("one", "b", StreamConfig(scaling=ScalingPolicy.by_event_rate(10, 2, 2)))
    await controller.create_stream("two", "c", StreamConfig())
    await append_events(test, stream_segment_name("one", "a", 0), 2)
    await controller.scale_stream("one", "a", [0], [(0.0, 0.25), (0.25, 0.5)])
    await controller.scale_stream("one", "a", [1], [(0.5, 0.75), (0.75, 1.0)])
    await controller.truncate_stream("one", "a", {0: 18, 1: 0})
    await controller.seal_stream("two", "c")
    await controller.create_reader_group("one", "readers", ReaderGroupConfig(["one/a", "one/b"]))


def test_a_restarted_controller_replays_everything() -> None:
    async def scenario() -> None:
        async with harness() as test:
            first = await test.controller()
            await busy_history(first, test)
            before = first.state.to_snapshot()
            await first.stop()
            second = await test.controller()
            assert second.state.to_snapshot() == before
            assert (await second.get_stream("one", "a")).epoch == 2
    run(scenario)


def test_snapshots_keep_replay_short_and_restore_the_same_state() -> None:
    async def scenario() -> None:
        async with harness() as test:
            first = await test.controller(snapshot_records=4)
            await busy_history(first, test)
            for index in range(12):
                await first.create_scope(f"extra-{index}")
            before = first.state.to_snapshot()
            info = test.segment(METADATA_SEGMENT)
            assert info.start_offset > 0, "the log was truncated before a snapshot"
            await first.stop()
            second = await test.controller(snapshot_records=4)
            assert second.state.to_snapshot() == before
            assert second.state.records_since_snapshot < 4
    run(scenario)


@pytest.mark.parametrize(("operation", "fail_on", "epoch_created"), [
    ("create_segment", 2, False),  # the successors are being created
    ("append", 2, False),  # recording epoch_created (after scale_started)
    ("seal", 1, True),  # sealing the predecessor
    ("append", 3, True),  # recording the sealed lengths
])
@pytest.mark.parametrize("kind", ["simulated", "files"])
def test_a_scale_interrupted_anywhere_resumes_when_the_node_restarts(
        operation: str, fail_on: int, epoch_created: bool, kind: str, tmp_path: Any) -> None:
    from tests.server.raw import Tiers

    async def scenario() -> None:
        tiers = Tiers(kind, tmp_path)
        async with harness(tiers=tiers) as test:
            flaky = FlakyStore(test.store())
            first = await test.controller(store=flaky)
            await first.create_scope("sc")
            await first.create_stream("sc", "st", FIXED2)
            await append_events(test, stream_segment_name("sc", "st", 0), 2)
            flaky.arm(operation, fail_on)
            with pytest.raises(Crash):
                await first.scale_stream("sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)])
            stream = first.state.streams[("sc", "st")]
            assert stream.state is StreamState.SCALING and stream.pending is not None
            assert stream.pending["epoch_created"] is epoch_created
        async with harness(tiers=tiers) as test:  # the whole node restarts: containers replay their logs
            second = await test.controller()  # and the controller resumes the scale on start
            stream = second.state.streams[("sc", "st")]
            assert stream.state is StreamState.IDLE and stream.current.epoch == 1
            assert test.segment(stream_segment_name("sc", "st", 0)).sealed
            assert stream.sealed_lengths[0] == 36
            for new in (segment_id(1, 2), segment_id(1, 3)):
                assert test.segment(stream_segment_name("sc", "st", new)).length == 0
            assert await second.scale_stream("sc", "st", [segment_id(1, 2)], [(0.0, 0.25)]) == 2
    run(scenario)


def test_a_workflow_left_pending_is_finished_before_the_next_change_of_its_stream() -> None:
    async def scenario() -> None:
        async with harness() as test:
            flaky = FlakyStore(test.store())
            controller = await test.controller(store=flaky)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "st", FIXED2)
            flaky.arm("seal", 1)
            with pytest.raises(Crash):
                await controller.seal_stream("sc", "st")
            assert controller.state.streams[("sc", "st")].state is StreamState.SEALING
            await controller.seal_stream("sc", "st")  # finishes the pending seal, then nothing to do
            assert controller.state.streams[("sc", "st")].sealed
            await controller.delete_stream("sc", "st")
    run(scenario)


def test_two_controllers_on_one_log_catch_up_instead_of_overwriting() -> None:
    async def scenario() -> None:
        async with harness() as test:
            first = await test.controller()
            second = await test.controller()
            await first.create_scope("a")
            await second.create_scope("b")  # its append finds the log longer: catch up, plan again
            assert set(second.state.scopes) == {"a", "b"}
            with pytest.raises(ScopeExistsError):
                await second.create_scope("a")
            await first.create_stream("a", "s", StreamConfig())  # first catches up with "b" too
            assert set(first.state.scopes) == {"a", "b"}
            third = await test.controller()
            assert third.state.to_snapshot() == first.state.to_snapshot()
    run(scenario)


def test_a_record_whose_append_landed_but_looked_failed_is_recognised() -> None:
    from millstream.errors import BadOffsetError, ContainerUnavailableError

    async def scenario() -> None:
        async with harness() as test:
            flaky = FlakyStore(test.store())
            controller = await test.controller(store=flaky)
            # As after a container restart: the store re-sent the append and found the log longer --
            # by the record itself.  The controller reads it back and knows it succeeded.
            flaky.arm("append", 1, landed_then=BadOffsetError)
            assert await controller.create_scope("a") is None
            assert list(controller.state.scopes) == ["a"]
            # An error with an unknown outcome reaches the caller; the next change catches up.
            flaky.arm("append", 1, landed_then=ContainerUnavailableError)
            with pytest.raises(ContainerUnavailableError):
                await controller.create_scope("b")
            await controller.create_scope("c")
            assert sorted(controller.state.scopes) == ["a", "b", "c"]
            replayed = await test.controller()
            assert replayed.state.to_snapshot() == controller.state.to_snapshot()
    run(scenario)


def test_the_controller_state_survives_a_server_restart_on_files(tmp_path: Any) -> None:
    from tests.server.raw import Tiers

    async def scenario() -> None:
        tiers = Tiers("files", tmp_path)
        async with harness(tiers=tiers) as test:
            controller = await test.controller()
            await busy_history(controller, test)
            before = controller.state.to_snapshot()
        async with harness(tiers=tiers) as test:
            controller = await test.controller()
            assert controller.state.to_snapshot() == before
    run(scenario)


def test_a_change_that_waits_too_long_for_its_streams_lock_times_out_and_changes_nothing() -> None:
    """While a scale holds a stream's lock (its store is slow to create the successors), another change
    of that stream waits at most ``stream_lock_wait_seconds`` and then fails with the typed, retryable
    ``RequestTimeoutError``, leaving the metadata as it was; the scale then finishes and the change
    succeeds when tried again."""
    import asyncio

    from millstream.errors import RequestTimeoutError

    class SlowToCreate(FlakyStore):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.creating = asyncio.Event()
            self.gate = asyncio.Event()
            self.gate.set()

        async def create_segment(self, name: str) -> bool:
            self.creating.set()
            await self.gate.wait()
            return await super().create_segment(name)

    async def scenario() -> None:
        async with harness() as test:
            store = SlowToCreate(test.store())
            controller = await test.controller(store=store, stream_lock_wait_seconds=0.05)
            await controller.create_scope("sc")
            await controller.create_stream("sc", "st", FIXED2)
            store.gate.clear()
            store.creating.clear()
            scaling = asyncio.ensure_future(controller.scale_stream("sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)]))
            await asyncio.wait_for(store.creating.wait(), 5)  # the scale holds the lock now
            check = Unchanged(controller)
            loop = asyncio.get_running_loop()
            began = loop.time()
            await check.fails(RequestTimeoutError, controller.seal_stream("sc", "st"), match="busy with another change")
            waited = loop.time() - began
            # The configured wait, not some other bound (generous above: a loaded machine is slow).
            assert 0.05 <= waited < 2.0, waited
            await check.fails(RequestTimeoutError, controller.scale_stream("sc", "st", [1], [(0.5, 0.75), (0.75, 1.0)]),
                              match="busy with another change")
            store.gate.set()
            assert await asyncio.wait_for(scaling, 5) == 1
            await controller.seal_stream("sc", "st")
            assert controller.state.streams[("sc", "st")].sealed

    run(scenario)
