"""Segment names and the segment -> container map."""

from __future__ import annotations

from collections import Counter
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.errors import InvalidArgumentError
from millstream.naming import (
    container_of,
    jump_consistent_hash,
    parse_stream_segment_name,
    primary_segment_name,
    segment_id,
    segment_id_parts,
    stream_segment_name,
    transaction_segment_name,
    transient_segment_name,
    validate_scope_or_stream_name,
)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_segment_id_round_trips_through_its_name(epoch: int, number: int) -> None:
    identifier = segment_id(epoch, number)
    assert segment_id_parts(identifier) == (epoch, number)
    name = stream_segment_name("iot", "sensors", identifier)
    assert parse_stream_segment_name(name) == ("iot", "sensors", identifier)


def test_hidden_segments_live_with_their_parent() -> None:
    parent = stream_segment_name("iot", "sensors", segment_id(3, 7))
    assert parent == "iot/sensors/7.#epoch.3"
    hidden = [transaction_segment_name(parent, UUID(int=5)), transient_segment_name(parent, "ab12")]
    for name in hidden:
        assert primary_segment_name(name) == parent
        assert container_of(name, 16) == container_of(parent, 16)


def test_container_map_is_stable_and_spread() -> None:
    # Pinned when the map was written: clients, controllers and stores in other processes (and
    # other versions) must keep agreeing, so a change here is a breaking change of the cluster.
    assert [container_of(f"s/t/{n}.#epoch.0", 4) for n in range(8)] == [3, 2, 3, 0, 1, 1, 0, 3]
    assert jump_consistent_hash(0, 1) == 0
    assert [jump_consistent_hash(k, 10) for k in (1, 2, 3, 2**63)] == [6, 6, 8, 5]
    spread = Counter(container_of(f"scope/stream/{n}.#epoch.0", 8) for n in range(8000))
    assert set(spread) == set(range(8)) and min(spread.values()) > 800, spread


@given(st.integers(0, 2**64 - 1), st.integers(1, 50))
def test_jump_hash_moves_few_keys_when_buckets_grow(key: int, buckets: int) -> None:
    before, after = jump_consistent_hash(key, buckets), jump_consistent_hash(key, buckets + 1)
    assert 0 <= before < buckets
    assert after in (before, buckets)  # a key either stays or moves to the new bucket


@pytest.mark.parametrize("name", ["", "_system", "a/b", "x" * 256, "sp ace", 7])
def test_bad_scope_and_stream_names(name: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_scope_or_stream_name(name)  # type: ignore[arg-type]


def test_system_names_only_when_asked() -> None:
    assert validate_scope_or_stream_name("_system", system=True) == "_system"
    assert validate_scope_or_stream_name("iot.sensors-2") == "iot.sensors-2"
