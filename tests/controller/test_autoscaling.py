"""Auto-scaling end to end inside a node: traffic counted by the segment store, moving averages and
decisions on the controller's manual clock -- half an hour of traffic in a fraction of a second."""

from __future__ import annotations

from millstream.client import ScalingPolicy, StreamConfig
from millstream.controller import Controller
from millstream.naming import stream_segment_name
from tests.controller.helpers import Harness, harness, run

TICK = 5.0


async def drive(test: Harness, controller: Controller, minutes: float, events_per_second: float,
                scope: str = "sc", stream: str = "st", event_bytes: int = 100,
                until_scaled: bool = False) -> list[tuple[float, int, int]]:
    """``minutes`` of ``events_per_second`` spread over the key space (each segment gets its share),
    counted by the server as appends are; one controller tick per 5 s (stopping at the first scale
    with ``until_scaled``).  Returns (time, epoch, segment count) at every epoch change."""
    changes: list[tuple[float, int, int]] = []
    record = controller.state.streams[(scope, stream)]
    epoch = record.current.epoch
    for _ in range(round(minutes * 60 / TICK)):
        record = controller.state.streams[(scope, stream)]
        for segment in record.current.segments:
            events = round(events_per_second * (segment.key_end - segment.key_start) * TICK)
            if events:
                test.server.statistics.record(stream_segment_name(scope, stream, segment.segment_id),
                                              events * event_bytes, events)
        test.clock.advance(TICK)
        await controller.tick()
        current = controller.state.streams[(scope, stream)].current
        if current.epoch != epoch:
            epoch = current.epoch
            changes.append((test.clock.monotonic(), epoch, len(current.segments)))
            if until_scaled:
                break
    return changes


async def stream_with(test: Harness, policy: ScalingPolicy) -> tuple[Controller, float]:
    controller = await test.controller()
    await controller.create_scope("sc")
    await controller.create_stream("sc", "st", StreamConfig(scaling=policy))
    await controller.tick()  # measuring starts here
    return controller, test.clock.monotonic()


def test_a_hot_segment_splits_and_its_children_cool_down_and_merge_back() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller, start = await stream_with(test, ScalingPolicy.by_event_rate(100, 2, 1))
            changes = await drive(test, controller, 12, events_per_second=1000, until_scaled=True)
            assert len(changes) == 1, changes
            split_at, epoch, count = changes[0]
            assert (epoch, count) == (1, 2), "1000 ev/s wants 10 parts; the scale factor allows 2"
            assert split_at - start >= 600, "no decision during the cooldown"
            segments = controller.state.streams[("sc", "st")].current.segments
            assert [(s.key_start, s.key_end) for s in segments] == [(0.0, 0.5), (0.5, 1.0)]
            # The traffic stops: the children, measured from their creation, cool down and merge back.
            changes = await drive(test, controller, 25, events_per_second=0)
            assert len(changes) == 1, changes
            merged_at, epoch, count = changes[0]
            assert (epoch, count) == (2, 1)
            assert merged_at - split_at >= 1200, "cold only after 20 minutes of measurements"
            assert controller.auto_scales == 2
            assert controller.state.streams[("sc", "st")].history.successors(segments[0].segment_id)
    run(scenario)


def test_a_steady_rate_near_the_target_does_not_oscillate() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller, _ = await stream_with(test, ScalingPolicy.by_event_rate(100, 2, 1))
            assert await drive(test, controller, 60, events_per_second=90) == [], "below target: no split"
        async with harness() as test:
            controller, _ = await stream_with(test, ScalingPolicy.by_event_rate(100, 2, 1))
            changes = await drive(test, controller, 60, events_per_second=150)
            # One split: each half then carries 75 ev/s -- neither above the target nor below half of it.
            assert [(epoch, count) for _, epoch, count in changes] == [(1, 2)]
            assert controller.auto_scales == 1
    run(scenario)


def test_min_segments_holds() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller, _ = await stream_with(test, ScalingPolicy.by_event_rate(100, 2, 3))
            assert len(controller.state.streams[("sc", "st")].current.segments) == 3
            assert await drive(test, controller, 30, events_per_second=0) == [], "cold, but at min_segments"
            first, second = (s.segment_id for s in controller.state.streams[("sc", "st")].current.segments[:2])
            await controller.scale_stream("sc", "st", [first], [(0.0, 1 / 6), (1 / 6, 1 / 3)])
            await controller.scale_stream("sc", "st", [second], [(1 / 3, 0.5), (0.5, 2 / 3)])
            assert len(controller.state.streams[("sc", "st")].current.segments) == 5
            changes = await drive(test, controller, 60, events_per_second=0)
            assert changes and changes[-1][2] == 3, changes
            assert min(count for _, _, count in changes) == 3, "never below min_segments"
    run(scenario)


def test_data_rate_policies_count_bytes() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller, _ = await stream_with(test, ScalingPolicy.by_data_rate(64, 3, 1))  # 64 KiB/s
            changes = await drive(test, controller, 12, events_per_second=100, event_bytes=2048)  # 200 KiB/s
            assert [(epoch, count) for _, epoch, count in changes] == [(1, 3)]
    run(scenario)
