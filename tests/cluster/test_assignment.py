"""The container -> host map (``millstream.cluster._assignment.assign``): balanced, minimal movement,
deterministic -- for any hosts, count and previous map (Hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.cluster._assignment import assign, check_assignment, moved
from millstream.errors import InvalidArgumentError

_HOST_IDS = [f"host-{index}" for index in range(8)]


@st.composite
def _situations(draw: st.DrawFn) -> tuple[list[str], int, dict[int, str]]:
    """Live hosts, a container count, and a previous map onto any hosts (live, gone or both)."""
    container_count = draw(st.integers(min_value=0, max_value=40))
    hosts = draw(st.lists(st.sampled_from(_HOST_IDS), max_size=6, unique=True))
    previous = draw(st.dictionaries(st.integers(min_value=0, max_value=max(0, container_count - 1)),
                                    st.sampled_from(_HOST_IDS), max_size=container_count))
    return hosts, container_count, previous


def _most_that_can_stay(hosts: list[str], container_count: int, previous: dict[int, str]) -> int:
    """An upper bound on the containers any balanced map can leave where they are, found by another
    route: each live host keeps at most ``base`` of what it holds, and at most ``extra`` hosts may keep
    one more (those that hold more than ``base``)."""
    if not hosts:
        return 0
    base, extra = divmod(container_count, len(hosts))
    held = [sum(1 for host in previous.values() if host == live) for live in hosts]
    over_base = sum(1 for count in held if count > base)
    return sum(min(count, base) for count in held) + min(extra, over_base)


@given(_situations())
def test_every_container_gets_exactly_one_live_host_and_counts_differ_by_at_most_one(
        situation: tuple[list[str], int, dict[int, str]]) -> None:
    hosts, container_count, previous = situation
    result = assign(hosts, container_count, previous)
    assert check_assignment(result, set(hosts), container_count) is None
    if hosts:
        assert sorted(result) == list(range(container_count))


@given(_situations())
def test_a_container_moves_only_if_its_host_left_or_balance_requires(
        situation: tuple[list[str], int, dict[int, str]]) -> None:
    hosts, container_count, previous = situation
    result = assign(hosts, container_count, previous)
    stayed = {container for container, host in result.items() if previous.get(container) == host}
    assert len(stayed) == _most_that_can_stay(hosts, container_count, previous)
    # A host at or under its floor loses nothing.
    if hosts:
        base = container_count // len(hosts)
        for host in hosts:
            mine = {container for container, owner in previous.items() if owner == host}
            if len(mine) <= base:
                assert all(result[container] == host for container in mine), (host, mine, result)


@given(_situations(), st.randoms(use_true_random=False))
def test_the_map_depends_on_the_inputs_only_not_their_order(
        situation: tuple[list[str], int, dict[int, str]], rng: random.Random) -> None:
    hosts, container_count, previous = situation
    shuffled = list(hosts)
    rng.shuffle(shuffled)
    reordered = dict(sorted(previous.items(), reverse=True))
    assert assign(shuffled, container_count, reordered) == assign(hosts, container_count, previous)


@given(_situations())
def test_recomputing_from_the_result_moves_nothing(situation: tuple[list[str], int, dict[int, str]]) -> None:
    """A leader elected anew, reading its predecessor's map with the same hosts, writes the same map."""
    hosts, container_count, previous = situation
    result = assign(hosts, container_count, previous)
    again = assign(hosts, container_count, result)
    assert again == result and not moved(result, again)


def test_a_joining_host_takes_only_its_share_and_a_leaving_hosts_containers_spread() -> None:
    first = assign(["a", "b"], 6)
    assert sorted(first.values()) == ["a"] * 3 + ["b"] * 3
    joined = assign(["a", "b", "c"], 6, first)
    assert len(moved(first, joined)) == 2 and {joined[c] for c in moved(first, joined)} == {"c"}
    left = assign(["a", "c"], 6, joined)
    assert moved(joined, left) == {c for c, host in joined.items() if host == "b"}
    assert assign([], 6, left) == {}


@pytest.mark.parametrize(("hosts", "count", "current"), [
    (["a"], -1, {}),
    ([""], 3, {}),
    (["a"], 2, {2: "a"}),
])
def test_bad_input_is_refused_with_a_typed_error(hosts: list[str], count: int, current: dict[int, str]) -> None:
    with pytest.raises(InvalidArgumentError):
        assign(hosts, count, current)
