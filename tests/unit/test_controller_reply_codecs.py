"""The controller's reply codecs (``values.CONTROLLER_REPLIES``): one per reply value, shared by the
server (``ControllerRpc`` encodes with it) and the client (``ControllerClient`` decodes with it).
Each codec round-trips every value through canonical JSON unchanged (Hypothesis); every controller
method has one, on both ends the same; the client refuses a reply its codec cannot decode as the
peer's ``ProtocolError``.  (The bytes each reply kind travels as are pinned by
``tests/controller/test_wire_replies.py``.)"""

from __future__ import annotations

import json
from typing import Any, Final, TypeVar
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream import values
from millstream.client._controller import CONTROLLER_METHODS, ControllerClient
from millstream.controller import METHODS
from millstream.errors import ProtocolError
from millstream.values import (
    CONTROLLER_REPLIES,
    CommitOutcome,
    MultiCommitResult,
    ReaderGroupConfig,
    ReaderGroupInfo,
    ReplyCodec,
    RetentionPolicy,
    ScalingPolicy,
    SegmentSlice,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamSegments,
    SuccessorSegment,
    TransactionInfo,
    TransactionStatus,
    canonical_json,
)

T = TypeVar("T")

#: The request every decoded reply answers (a reply does not repeat what its request named).
REQUEST: Final = {"scope": "iot", "stream": "s", "group": "g"}
STREAM: Final = "iot/s"

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # (no lone surrogates: UTF-8)
segment_ids = st.integers(0, 2**63 - 1)
offsets = st.integers(0, 2**63 - 1)
times = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
key_ranges = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=2, unique=True).map(sorted)
segments = st.builds(lambda segment_id, keys, name, uri: SegmentWithRange(segment_id, keys[0], keys[1], name, uri),
                     segment_ids, key_ranges, texts, st.one_of(st.just(""), texts))
predecessors = st.frozensets(segment_ids, max_size=4)
cuts = st.dictionaries(segment_ids, offsets, min_size=1, max_size=4).map(lambda positions: StreamCut(STREAM, positions))
scalings = st.one_of(
    st.integers(1, 16).map(ScalingPolicy.fixed),
    st.builds(ScalingPolicy.by_event_rate, st.floats(0.5, 1e6), st.integers(1, 8), st.integers(1, 16)),
    st.builds(ScalingPolicy.by_data_rate, st.floats(0.5, 1e6), st.integers(1, 8), st.integers(1, 16)))
retentions = st.one_of(st.just(RetentionPolicy.none()), st.just(RetentionPolicy.consumption()),
                       st.integers(1, 2**40).map(RetentionPolicy.by_size),
                       st.floats(0.5, 1e9).map(RetentionPolicy.by_time))
stream_configs = st.builds(StreamConfig, scaling=scalings, retention=retentions)
group_configs = st.builds(
    lambda bounds, seconds, retention: ReaderGroupConfig({STREAM: bounds}, automatic_checkpoint_seconds=seconds,
                                                         retention=retention),
    st.tuples(st.none() | cuts, st.none() | cuts), times, st.sampled_from(["none", "consumption"]))
statuses = st.sampled_from(TransactionStatus)
transaction_infos = st.builds(
    TransactionInfo, st.just(STREAM), st.uuids(), statuses, st.integers(0, 2**31), st.tuples(segments, segments),
    times, times, st.integers(0, 2**40), times)


def _round_trip(codec: ReplyCodec[T], value: T) -> T:
    """``value`` as the server sends it (canonical JSON) and as the client decodes it."""
    return codec.decode(json.loads(canonical_json(codec.encode(value))), REQUEST)


# --- One round-trip property per codec ------------------------------------------------------------------


@given(st.lists(texts, max_size=5))
def test_name_lists_round_trip(names: list[str]) -> None:
    for codec in (values.SCOPE_NAMES, values.STREAM_NAMES, values.READER_GROUP_NAMES):
        assert _round_trip(codec, names) == names


@given(st.integers(0, 2**63 - 1))
def test_epochs_and_generations_round_trip(number: int) -> None:
    assert _round_trip(values.EPOCH, number) == number
    assert _round_trip(values.GENERATION, number) == number


@given(texts)
def test_state_segments_and_uris_round_trip(text: str) -> None:
    assert _round_trip(values.STATE_SEGMENT, text) == text
    assert _round_trip(values.SEGMENT_URI, text) == text


@given(times)
def test_lease_deadlines_round_trip(deadline: float) -> None:
    assert _round_trip(values.LEASE_DEADLINE, deadline) == deadline


@given(st.none() | st.integers(-(2**63), 2**63 - 1))
def test_fence_values_round_trip(value: int | None) -> None:
    assert _round_trip(values.FENCE_VALUE, value) == value


def test_no_reply_round_trips() -> None:
    assert values.NO_REPLY.encode(None) == {}
    assert _round_trip(values.NO_REPLY, None) is None


@given(cuts)
def test_stream_cuts_round_trip(cut: StreamCut) -> None:
    assert _round_trip(values.STREAM_CUT, cut) == cut


@given(stream_configs, st.booleans(), st.integers(0, 2**31), st.lists(segments, max_size=3),
       st.sampled_from(["active", "scaling", "sealing", "sealed", "truncating", "deleting"]))
def test_stream_descriptions_round_trip(config: StreamConfig, sealed: bool, epoch: int,
                                        listed: list[SegmentWithRange], state: str) -> None:
    description = StreamDescription("iot", "s", config, sealed, epoch, tuple(listed), state)
    assert _round_trip(values.STREAM_DESCRIPTION, description) == description


@given(st.integers(0, 2**31), st.lists(segments, max_size=3))
def test_stream_segments_round_trip(epoch: int, listed: list[SegmentWithRange]) -> None:
    current = StreamSegments(epoch, tuple(listed))
    assert _round_trip(values.STREAM_SEGMENTS, current) == current


@given(st.lists(st.builds(SuccessorSegment, segments, predecessors), max_size=3))
def test_successors_round_trip(successors: list[SuccessorSegment]) -> None:
    assert _round_trip(values.SUCCESSORS, successors) == successors


@given(st.lists(st.builds(SegmentSlice, segments, offsets, st.none() | offsets, predecessors), max_size=3))
def test_segment_slices_round_trip(slices: list[SegmentSlice]) -> None:
    assert _round_trip(values.SEGMENT_SLICES, slices) == slices


@given(group_configs, texts, st.integers(0, 2**40))
def test_reader_group_infos_round_trip(config: ReaderGroupConfig, state_segment: str, generation: int) -> None:
    info = ReaderGroupInfo("iot", "g", config, state_segment, generation)
    assert _round_trip(values.READER_GROUP_INFO, info) == info


@given(transaction_infos)
def test_transaction_infos_round_trip(info: TransactionInfo) -> None:
    assert _round_trip(values.TRANSACTION_INFO, info) == info


@given(statuses)
def test_transaction_statuses_round_trip(status: TransactionStatus) -> None:
    assert _round_trip(values.TRANSACTION_STATUS, status) is status


@given(st.dictionaries(st.uuids(), statuses, max_size=4))
def test_lists_of_transactions_round_trip(listed: dict[UUID, TransactionStatus]) -> None:
    assert _round_trip(values.TRANSACTION_STATUSES, listed) == listed


@given(st.sampled_from(CommitOutcome), st.none() | st.integers(-(2**63), 2**63 - 1))
def test_multi_commit_results_round_trip(outcome: CommitOutcome, recorded: int | None) -> None:
    result = MultiCommitResult(outcome, recorded)
    assert _round_trip(values.MULTI_COMMIT_RESULT, result) == result


# --- Both ends use them --------------------------------------------------------------------------------


def test_every_controller_method_has_one_codec_on_both_ends() -> None:
    assert set(CONTROLLER_REPLIES) == set(METHODS) == set(CONTROLLER_METHODS)


class _Replying(ControllerClient):
    """A client whose every call is answered with ``reply`` (the codec path only: no connection)."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self._reply = reply

    async def call(self, method: str, body: Any = None) -> dict[str, Any]:
        return self._reply


def test_the_client_decodes_with_the_servers_codec() -> None:
    import asyncio
    cut = StreamCut(STREAM, {0: 5, 1: 7})
    client = _Replying(values.STREAM_CUT.encode(cut))
    assert asyncio.run(client.get_head_cut("iot", "s")) == cut


@pytest.mark.parametrize("reply", [{}, {"cut": "nonsense"}, {"cut": {"x": 1}}])
def test_a_reply_the_codec_cannot_decode_is_the_peers_fault(reply: dict[str, Any]) -> None:
    import asyncio
    with pytest.raises(ProtocolError, match="get_head_cut"):
        asyncio.run(_Replying(reply).get_head_cut("iot", "s"))
