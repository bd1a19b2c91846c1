"""The client's stream values: validation, canonical JSON, round trips and pasteable reprs."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.client import (
    ReaderGroupConfig,
    RetentionPolicy,
    ScalingPolicy,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamSegments,
    canonical_json,
    split_stream_name,
)
from millstream.errors import InvalidArgumentError

policies = st.one_of(
    st.integers(1, 1024).map(ScalingPolicy.fixed),
    st.builds(ScalingPolicy.by_event_rate, st.floats(0.5, 1e6), st.integers(1, 64), st.integers(1, 1024)),
    st.builds(ScalingPolicy.by_data_rate, st.floats(0.5, 1e6), st.integers(1, 64), st.integers(1, 1024)))
retentions = st.one_of(st.just(RetentionPolicy.none()), st.just(RetentionPolicy.consumption()),
                       st.integers(1, 2**40).map(RetentionPolicy.by_size),
                       st.floats(0.001, 1e9).map(RetentionPolicy.by_time))
cuts = st.builds(StreamCut, st.just("sc/st"), st.dictionaries(st.integers(0, 2**40), st.integers(0, 2**40),
                                                              min_size=1, max_size=5))


@given(policies, retentions)
def test_configs_round_trip_through_json_and_repr(scaling: ScalingPolicy, retention: RetentionPolicy) -> None:
    config = StreamConfig(scaling=scaling, retention=retention)
    assert StreamConfig.from_json_object(config.to_json_object()) == config
    assert eval(repr(scaling)) == scaling and eval(repr(retention)) == retention


@given(cuts)
def test_stream_cuts_are_canonical_frozen_values(cut: StreamCut) -> None:
    text = cut.to_json()
    assert StreamCut.from_json(text) == cut and StreamCut.from_json(text).to_json() == text
    assert canonical_json({"positions": cut.to_wire(), "stream": cut.stream}).decode() == text
    assert hash(StreamCut("sc/st", dict(reversed(list(cut.positions.items()))))) == hash(cut)
    assert eval(repr(cut)) == cut
    with pytest.raises(AttributeError):
        cut._stream = "other/stream"  # type: ignore[misc]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: ScalingPolicy.fixed(0), "segments"),
    (lambda: ScalingPolicy.by_event_rate(0, 2), "target"),
    (lambda: ScalingPolicy.by_event_rate(10, 0), "scale_factor"),
    (lambda: ScalingPolicy("elastic", 1.0, 2, 1), "scaling type"),
    (lambda: RetentionPolicy.by_size(0), "size_bytes"),
    (lambda: RetentionPolicy.by_time(-1), "seconds"),
    (lambda: RetentionPolicy("size", 0.0), "positive limit"),
    (lambda: StreamConfig(scaling="fixed"), "ScalingPolicy"),
    (lambda: StreamCut("nostream", {0: 0}), "scope/stream"),
    (lambda: StreamCut("sc/st", {}), "maps segment ids"),
    (lambda: StreamCut("sc/st", {0: -1}), "offset"),
    (lambda: StreamCut.from_json("{"), "malformed"),
    (lambda: StreamCut.from_json('{"stream": "sc/st", "positions": {"01": 0}}'), "decimal"),
    (lambda: StreamCut.from_json('{"stream": "sc/st", "positions": {"0": 0}, "x": 1}'), "unknown fields"),
    (lambda: SegmentWithRange(0, 0.5, 0.5, "n"), "empty key range"),
    (lambda: ReaderGroupConfig([]), "at least one stream"),
    (lambda: ReaderGroupConfig({"sc/st": (StreamCut("sc/other", {0: 0}), None)}), "StreamCut of 'sc/st'"),
    (lambda: ReaderGroupConfig(["sc/st"], retention="forever"), "retention"),
    (lambda: split_stream_name("sc/st/x"), "scope/stream"),
    (lambda: split_stream_name("_sys/st"), "must be 1-255"),
])
def test_bad_values_are_refused_with_a_clear_error(build: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        build()  # type: ignore[operator]


def test_time_retention_takes_timedeltas_and_reader_group_configs_round_trip() -> None:
    assert RetentionPolicy.by_time(datetime.timedelta(hours=1)) == RetentionPolicy.by_time(3600)
    cut = StreamCut("sc/st", {0: 5})
    config = ReaderGroupConfig({"sc/st": (cut, None), "sc/other": (None, None)}, automatic_checkpoint_seconds=5,
                               retention="consumption")
    assert ReaderGroupConfig.from_json_object(config.to_json_object()) == config
    assert config.start_cut("sc/st") == cut and config.end_cut("sc/st") is None
    assert list(config.streams) == ["sc/other", "sc/st"] and hash(config) == hash(ReaderGroupConfig(
        {"sc/other": (None, None), "sc/st": (cut, None)}, automatic_checkpoint_seconds=5, retention="consumption"))


def test_stream_segments_find_the_segment_owning_a_key() -> None:
    segments = StreamSegments(1, tuple(SegmentWithRange(i, i / 4, (i + 1) / 4, f"sc/st/{i}.#epoch.0")
                                       for i in range(4)))
    assert [segments.segment_for(key).segment_id for key in (0.0, 0.24, 0.25, 0.5, 0.99, 1.0)] == [0, 0, 1, 2, 3, 3]
    assert segments.segments[2].owns(0.5) and not segments.segments[2].owns(0.75)
    segment = SegmentWithRange(2**32 + 3, 0.0, 1.0, "n")
    assert (segment.epoch, segment.number) == (1, 3)


def test_the_client_and_the_server_know_the_same_controller_methods() -> None:
    from millstream.client import CONTROLLER_METHODS
    from millstream.controller import METHODS

    assert set(CONTROLLER_METHODS) == set(METHODS)
    # Methods the client re-sends after a broken connection are the ones whose repetition is harmless.
    for name, repeatable in CONTROLLER_METHODS.items():
        if name.startswith(("get_", "list_", "check_")):
            assert repeatable, name
        if name.startswith(("create_", "delete_", "scale_")):
            assert not repeatable, name
