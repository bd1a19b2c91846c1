"""The controller against random histories (a Hypothesis state machine on the simulated tiers):
whatever sequence of creations, scales, seals, truncations, appends and controller restarts happens,
the metadata stays consistent with the segment store and a restarted controller replays exactly
the same state."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.client import ScalingPolicy, StreamConfig
from millstream.controller import Controller, ControllerConfig, LocalSegmentStore, StreamState
from millstream.errors import (
    InvalidScaleError,
    InvalidStreamCutError,
    StreamSealedError,
    StreamSegmentNotExistsError,
)
from millstream.naming import stream_segment_name
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from millstream.wire import encode_event
from tests.server.raw import Tiers

STREAMS = ("a", "b")

#: Each example starts a server: a couple of dozen by default, many more in the nightly profile.
NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tiers = Tiers("simulated")
        self.clock = ManualClock(1_000.0)
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.run(self.server.start())
        self.controller = self.new_controller()
        self.run(self.controller.create_scope("sc"))
        self.created: set[str] = set()
        self.restarts = 0

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, 30))

    def new_controller(self) -> Controller:
        controller = Controller(LocalSegmentStore(self.server), clock=self.clock, now=self.clock.monotonic,
                                config=ControllerConfig(periodic=False, snapshot_records=7))
        self.run(controller.start())
        return controller

    def teardown(self) -> None:
        try:
            self.run(self.controller.stop())
            self.run(self.server.stop())
        finally:
            self.loop.close()

    def stream(self, name: str) -> Any:
        return self.controller.state.streams[("sc", name)]

    @rule(name=st.sampled_from(STREAMS), segments=st.integers(1, 3))
    def create_stream(self, name: str, segments: int) -> None:
        if name in self.created:
            return
        self.run(self.controller.create_stream("sc", name, StreamConfig(scaling=ScalingPolicy.fixed(segments))))
        self.created.add(name)

    @precondition(lambda self: self.created)
    @rule(data=st.data(), events=st.integers(1, 4))
    def append(self, data: st.DataObject, events: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.created)))
        stream = self.stream(name)
        if stream.sealed:
            return
        segment = data.draw(st.sampled_from(stream.current.segments))
        segment_name = stream_segment_name("sc", name, segment.segment_id)
        self.run(self.server.container_for(segment_name).append(segment_name, encode_event(b"e") * events))

    @precondition(lambda self: self.created)
    @rule(data=st.data(), parts=st.integers(2, 3), merge=st.booleans())
    def scale(self, data: st.DataObject, parts: int, merge: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.created)))
        stream = self.stream(name)
        segments = stream.current.segments
        index = data.draw(st.integers(0, len(segments) - 1))
        if merge and index + 1 < len(segments):
            chosen = segments[index:index + 2]
            seal, ranges = [s.segment_id for s in chosen], [(chosen[0].key_start, chosen[1].key_end)]
        else:
            target = segments[index]
            width = target.key_end - target.key_start
            bounds = [target.key_start + width * i / parts for i in range(parts)] + [target.key_end]
            seal, ranges = [target.segment_id], list(itertools.pairwise(bounds))
        if data.draw(st.booleans(), label="bad ranges"):
            ranges = ranges[:-1] or [(0.0, 0.001)]  # a gap: must be refused, changing nothing
            before = self.controller.state.to_snapshot()
            try:
                self.run(self.controller.scale_stream("sc", name, seal, ranges))
            except (InvalidScaleError, StreamSealedError):
                assert self.controller.state.to_snapshot() == before
                return
            raise AssertionError("a scale leaving keys uncovered was accepted")
        if stream.sealed:
            return
        epoch = stream.current.epoch
        assert self.run(self.controller.scale_stream("sc", name, seal, ranges)) == epoch + 1

    @precondition(lambda self: self.created)
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        self.run(self.controller.seal_stream("sc", data.draw(st.sampled_from(sorted(self.created)))))

    @precondition(lambda self: self.created)
    @rule(data=st.data(), stale=st.booleans())
    def truncate_at_tail(self, data: st.DataObject, stale: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.created)))
        if stale:  # the first epoch at offset 0: before the head once anything was truncated
            cut = {s.segment_id: 0 for s in self.stream(name).history.epochs[0].segments}
            try:
                self.run(self.controller.truncate_stream("sc", name, cut))
            except InvalidStreamCutError:
                return
            return
        tail = dict(self.run(self.controller.get_tail_cut("sc", name)).positions)
        self.run(self.controller.truncate_stream("sc", name, tail))
        assert self.stream(name).head == tail

    @rule()
    def restart_controller(self) -> None:
        before = self.controller.state.to_snapshot()
        self.run(self.controller.stop())
        self.controller = self.new_controller()
        assert self.controller.state.to_snapshot() == before
        self.restarts += 1

    @invariant()
    def metadata_agrees_with_the_store(self) -> None:
        self.controller.check_invariants()
        for name in self.created:
            stream = self.stream(name)
            assert stream.state is StreamState.IDLE
            for segment in stream.history.segments():
                segment_name = stream_segment_name("sc", name, segment.segment_id)
                try:
                    info = self.server.container_for(segment_name).get_info(segment_name)
                except StreamSegmentNotExistsError:
                    # Only segments wholly before the head are deleted.
                    assert segment.segment_id not in stream.head and not stream.history.is_current(
                        segment.segment_id), (name, segment)
                    continue
                current = stream.history.is_current(segment.segment_id)
                assert info.sealed == (stream.sealed or not current), (name, segment, info)
                if info.sealed:
                    assert stream.sealed_lengths[segment.segment_id] == info.length
                if segment.segment_id in stream.head:
                    assert info.start_offset == stream.head[segment.segment_id]


ControllerMachine.TestCase.settings = settings(max_examples=600 if NIGHTLY else 25,
                                               stateful_step_count=60 if NIGHTLY else 25, deadline=None)
test_controller_state_machine = ControllerMachine.TestCase
