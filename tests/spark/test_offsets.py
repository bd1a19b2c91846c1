"""Source offsets (plain Python): one spelling per position, stable through Spark's log and a restart,
the same text as the stream cut's own JSON, and an offset of another stream refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.client import StreamCut
from millstream.errors import InvalidArgumentError, InvalidStreamCutError
from millstream.spark import cut_of, offset_of
from millstream.spark._offsets import offset_json

SEGMENT_IDS = st.one_of(st.integers(0, 40), st.integers(0, 2**40))
CUTS = st.dictionaries(SEGMENT_IDS, st.integers(0, 2**40), min_size=1, max_size=12).map(
    lambda positions: StreamCut("sc/st", positions))


def test_keys_are_strings_in_sorted_string_order() -> None:
    cut = StreamCut("sc/st", {10: 5, 2: 7, 4294967296: 0, 1: 3})
    offset = offset_of(cut)
    assert list(offset) == ["positions", "stream"]
    assert list(offset["positions"]) == ["1", "10", "2", "4294967296"], "string order, not numeric order"
    assert offset_json(offset) == '{"positions": {"1": 3, "10": 5, "2": 7, "4294967296": 0}, "stream": "sc/st"}'


@given(CUTS)
def test_an_offset_reads_back_as_spark_logs_it_and_keeps_its_text(cut: StreamCut) -> None:
    offset = offset_of(cut)
    logged = offset_json(offset)  # what Spark writes to offsets/<batch>
    restored = json.loads(logged)  # what the planner gets after a restart
    assert offset_json(offset_of(cut_of(restored, "sc/st"))) == logged, "the same position, the same text"
    assert cut_of(logged, "sc/st") == cut
    assert json.loads(cut.to_json()) == offset, "the stream cut's own JSON: pasteable as the start option"
    assert offset_of(StreamCut("sc/st", dict(reversed(list(cut.positions.items()))))) == offset


@given(CUTS, CUTS)
def test_equal_texts_mean_equal_positions(a: StreamCut, b: StreamCut) -> None:
    assert (offset_json(offset_of(a)) == offset_json(offset_of(b))) == (a == b)


def test_an_offset_of_another_stream_is_refused_naming_both() -> None:
    offset = offset_of(StreamCut("sc/other", {0: 4}))
    with pytest.raises(InvalidStreamCutError, match=r"position of stream 'sc/other', but the query reads 'sc/st'"):
        cut_of(offset, "sc/st", what="the start offset")


@pytest.mark.parametrize("bad", [
    "not json", [1, 2], {"positions": {"0": 1}}, {"positions": {"0": 1}, "stream": "sc/st", "epoch": 3},
    {"positions": {}, "stream": "sc/st"}, {"positions": {"0": -1}, "stream": "sc/st"},
    {"positions": {"00": 1}, "stream": "sc/st"}, {"positions": {"0": "1"}, "stream": "sc/st"},
])
def test_what_is_not_an_offset_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        cut_of(bad, "sc/st")
