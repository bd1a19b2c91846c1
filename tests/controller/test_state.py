"""The metadata state machine (pure): records applied in order, the stream lifecycle table, thinning
of recorded cuts, and the metadata log's record framing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.client import StreamConfig
from millstream.controller import (
    STREAM_TRANSITIONS,
    ControllerState,
    RecordedCut,
    StreamState,
    encode_record,
    initial_epoch,
    next_epoch,
    thin_recorded_cuts,
)
from millstream.errors import InternalError


def created() -> ControllerState:
    state = ControllerState()
    state.apply({"type": "scope_created", "scope": "sc", "time": 1.0})
    state.apply({"type": "stream_created", "scope": "sc", "stream": "st", "time": 2.0,
                 "config": StreamConfig().to_json_object(), "epoch": initial_epoch(1, 2.0).to_json()})
    return state


def test_a_scale_moves_through_its_states_and_records_its_epoch_once_durable() -> None:
    state = created()
    stream = state.streams[("sc", "st")]
    epoch, _ = next_epoch(stream.current, [0], [(0.0, 0.5), (0.5, 1.0)], 1, 3.0)
    steps = [
        ({"type": "scale_started", "seal": [0], "epoch": epoch.to_json(), "next_number": 3}, StreamState.SCALING),
        ({"type": "epoch_created", "epoch": 1}, StreamState.SCALING),
        ({"type": "segments_sealed", "lengths": {"0": 7}}, StreamState.SCALING),
        ({"type": "scale_completed", "epoch": 1}, StreamState.IDLE),
    ]
    for record, expected in steps:
        state.apply({"scope": "sc", "stream": "st", "time": 3.0, **record})
        assert stream.state is expected
        state.check_invariants()
    assert stream.current.epoch == 1 and stream.sealed_lengths == {0: 7} and stream.next_number == 3
    assert state.time_floor == 3.0


@pytest.mark.parametrize("kind", ["epoch_created", "scale_completed", "stream_sealed", "truncation_completed",
                                  "segments_sealed"])
def test_records_that_do_not_follow_the_lifecycle_table_are_refused(kind: str) -> None:
    state = created()
    assert (StreamState.IDLE, kind) not in STREAM_TRANSITIONS
    with pytest.raises(InternalError, match="no transition"):
        state.apply({"type": kind, "scope": "sc", "stream": "st", "time": 3.0, "epoch": 1, "lengths": {},
                     "cut": {}, "keep_from_epoch": 0})


def test_unknown_records_and_unknown_streams_are_refused() -> None:
    state = created()
    with pytest.raises(InternalError, match="unknown metadata record"):
        state.apply({"type": "teleport"})
    with pytest.raises(InternalError, match="unknown stream"):
        state.apply({"type": "seal_started", "scope": "sc", "stream": "nope"})
    with pytest.raises(InternalError, match="deleted while not sealed"):
        state.apply({"type": "delete_started", "scope": "sc", "stream": "st"})


def test_every_lifecycle_state_is_reachable_and_every_workflow_returns_to_idle() -> None:
    reachable = {StreamState.IDLE}
    for _ in STREAM_TRANSITIONS:
        reachable |= {after for (before, _), after in STREAM_TRANSITIONS.items() if before in reachable}
    assert reachable == set(StreamState)
    for state in set(StreamState) - {StreamState.IDLE, StreamState.DELETING}:
        assert StreamState.IDLE in {after for (before, _), after in STREAM_TRANSITIONS.items() if before is state}


@given(st.lists(st.floats(0, 1e6), min_size=0, max_size=60, unique=True), st.integers(2, 10))
def test_thinning_keeps_the_ends_and_the_bound(times: list[float], keep: int) -> None:
    cuts = [RecordedCut(t, {0: index}) for index, t in enumerate(sorted(times))]
    thinned = thin_recorded_cuts(cuts, keep)
    assert len(thinned) == min(len(cuts), keep)
    if cuts:
        assert thinned[0] is cuts[0] and thinned[-1] is cuts[-1]
    assert [c.time for c in thinned] == sorted(c.time for c in thinned)


def test_records_are_length_prefixed_canonical_json_with_a_size_limit() -> None:
    payload = b'{"scope":"sc","time":1.0,"type":"scope_created"}'
    assert encode_record({"type": "scope_created", "scope": "sc", "time": 1.0}) == len(payload).to_bytes(4, "big") \
        + payload
    with pytest.raises(InternalError, match="exceeds"):
        encode_record({"type": "huge", "data": "x" * (1 << 20)})
