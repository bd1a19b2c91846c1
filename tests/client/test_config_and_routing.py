"""Pure pieces of the client: backoff, addresses, configuration, the routing hash, the block-size rule."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream import limits
from millstream.client import (
    Backoff,
    BlockSizeTracker,
    BytesSerializer,
    ClientConfig,
    Endpoint,
    JsonSerializer,
    KeySpaceRouter,
    StringSerializer,
    SystemRandomSource,
    parse_uri,
    routing_key_fraction,
)
from millstream.client._config import random_uuid
from millstream.errors import InvalidArgumentError

# --- Backoff ---------------------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap_then_gives_up() -> None:
    backoff = Backoff(initial_seconds=0.01, maximum_seconds=0.1, attempts_max=6, rng=random.Random(3))
    delays = [backoff.delay(n) for n in range(1, 7)]
    bases = [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    for delay, base in zip(delays, bases, strict=True):
        assert delay is not None and 0.5 * base <= delay < base
    assert backoff.delay(7) is None, "attempts beyond the budget mean: give up"


def test_backoff_is_a_function_of_the_seed() -> None:
    def schedule(seed: int) -> list[float | None]:
        backoff = Backoff(initial_seconds=0.01, maximum_seconds=5.0, attempts_max=12, rng=random.Random(seed))
        return [backoff.delay(n) for n in range(1, 13)]
    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


@given(st.integers(1, 200))
def test_backoff_never_exceeds_the_cap(failures: int) -> None:
    backoff = Backoff(initial_seconds=limits.CLIENT_RECONNECT_DELAY_INITIAL_SECONDS,
                      maximum_seconds=limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX, attempts_max=200,
                      rng=random.Random(failures))
    delay = backoff.delay(failures)
    assert delay is not None and 0 < delay < limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX


def test_the_default_reconnect_budget_is_bounded() -> None:
    """By default an outage may last ``CLIENT_RECONNECT_BUDGET_SECONDS``: the waits add up to exactly
    that (the last one is cut to end with it), then the schedule gives up."""
    backoff = ClientConfig().backoff(random.Random(1))
    total = 0.0
    failures = 1
    while (delay := backoff.delay(failures, total)) is not None:
        assert 0 < delay <= limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX
        total += delay
        failures += 1
    assert total == pytest.approx(limits.CLIENT_RECONNECT_BUDGET_SECONDS)
    assert total < 60.0, f"a writer pointed at a dead server gives up within a minute, not {total:.1f} s"
    initial = ClientConfig().backoff(random.Random(1), initial_connect=True)
    assert initial.budget_seconds == limits.CLIENT_INITIAL_CONNECT_BUDGET_SECONDS <= 10.0


def test_bad_backoff_settings_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        Backoff(initial_seconds=1.0, maximum_seconds=0.5, attempts_max=3, rng=random.Random(1))
    with pytest.raises(InvalidArgumentError):
        Backoff(initial_seconds=0.1, maximum_seconds=0.5, attempts_max=0, rng=random.Random(1))


# --- Configuration, addresses, randomness ----------------------------------------------------------


def test_config_values_may_only_shrink_below_their_limits() -> None:
    assert ClientConfig().request_timeout_seconds == limits.CLIENT_REQUEST_TIMEOUT_SECONDS
    assert ClientConfig(request_timeout_seconds=0.5).request_timeout_seconds == 0.5
    for bad in (0, -1.0, limits.CLIENT_REQUEST_TIMEOUT_SECONDS * 2, "3", True):
        with pytest.raises(InvalidArgumentError):
            ClientConfig(request_timeout_seconds=bad)
    with pytest.raises(InvalidArgumentError):
        ClientConfig(writer_unacked_bytes_max=limits.CLIENT_WRITER_UNACKED_BYTES_MAX + 1)


def test_the_budgets_may_be_raised_or_unlimited_and_the_attempt_count_is_optional() -> None:
    """Unlike the limits above, the budgets are the application's choice (issue 20 item 5)."""
    config = ClientConfig(reconnect_budget_seconds=3600, initial_connect_budget_seconds=120.0)
    assert (config.reconnect_budget_seconds, config.initial_connect_budget_seconds) == (3600, 120.0)
    forever = ClientConfig(reconnect_budget_seconds=None, initial_connect_budget_seconds=math.inf)
    assert forever.reconnect_budget_seconds == forever.initial_connect_budget_seconds == math.inf
    assert ClientConfig().reconnect_attempts_max is None
    backoff = forever.backoff(random.Random(2))
    # Never gives up, however long the outage; every wait is still capped.
    assert all(0 < (backoff.delay(n, 1e9) or 0) <= limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX for n in range(1, 500))
    for name in ("reconnect_budget_seconds", "initial_connect_budget_seconds"):
        for bad in (0, -1.0, float("nan"), "10", True):
            with pytest.raises(InvalidArgumentError):
                ClientConfig(**{name: bad})
    for bad_count in (0, 2.5, True):
        with pytest.raises(InvalidArgumentError):
            ClientConfig(reconnect_attempts_max=bad_count)


@pytest.mark.parametrize(("uri", "endpoint"), [
    ("tcp://127.0.0.1:9090", Endpoint("127.0.0.1", 9090, False)),
    ("tls://store.example:443", Endpoint("store.example", 443, True)),
    ("tcp://[::1]:9090", Endpoint("::1", 9090, False)),
    ("tcp://localhost:1/", Endpoint("localhost", 1, False)),
])
def test_uris_parse(uri: str, endpoint: Endpoint) -> None:
    assert parse_uri(uri) == endpoint
    assert parse_uri(str(endpoint)) == endpoint


@pytest.mark.parametrize("uri", [
    "127.0.0.1:9090", "http://127.0.0.1:9090", "tcp://127.0.0.1", "tcp://:9090", "tcp://h:99999",
    "tcp://h:1/path", "tcp://user:pw@h:1", "tcp://h:1?x=1", "", 9090,
])
def test_bad_uris_are_refused_with_a_typed_error(uri: object) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_uri(uri)  # type: ignore[arg-type]


def test_writer_ids_come_from_the_random_source() -> None:
    assert random_uuid(random.Random(5)) == random_uuid(random.Random(5))
    assert random_uuid(random.Random(5)).version == 4
    system = SystemRandomSource()
    assert random_uuid(system) != random_uuid(system)
    assert all(0.0 <= system.random() < 1.0 for _ in range(100))
    assert all(0 <= system.getrandbits(12) < 4096 for _ in range(100))


# --- Routing ---------------------------------------------------------------------------------------


def test_the_routing_hash_is_stable_across_processes() -> None:
    """Never the built-in ``hash`` (randomized per process): two processes must route a key alike."""
    keys = ["sensor-17", "", "ключ", "🙂", "a" * 1000]
    script = ("import sys; from millstream.client import routing_key_fraction as f; "
              f"print([f(k) for k in {keys!r}])")
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert outputs == {f"{[routing_key_fraction(k) for k in keys]}\n"}


@given(st.text())
def test_the_routing_hash_lies_in_the_unit_interval(key: str) -> None:
    assert 0.0 <= routing_key_fraction(key) < 1.0


def test_keys_spread_evenly_over_equal_slices() -> None:
    segments = [f"s/{i}" for i in range(16)]
    router = KeySpaceRouter(segments)
    counts = Counter(router.segment_for(f"key-{i}") for i in range(32_000))
    assert set(counts) == set(segments)
    assert max(counts.values()) < 1.15 * 2000 and min(counts.values()) > 0.85 * 2000, counts


def test_a_key_always_goes_to_the_segment_owning_its_point() -> None:
    segments = ["a", "b", "c"]
    router = KeySpaceRouter(segments)
    for i in range(300):
        key = f"k{i}"
        fraction = routing_key_fraction(key)
        assert router.segment_for(key) == segments[int(fraction * 3)] == router.segment_for_fraction(fraction)
        assert router.segment_for(key) == router.segment_for(key)


def test_keyless_events_are_spread_round_robin() -> None:
    router = KeySpaceRouter(["a", "b", "c"])
    assert [router.segment_for(None) for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_the_key_memo_is_bounded() -> None:
    router = KeySpaceRouter(["a", "b"], memo_size_max=10)
    for i in range(100):
        router.segment_for(f"k{i}")
        assert len(router._memo) <= 10


@pytest.mark.parametrize("segments", [[], "abc", ["a", "a"], ["a", ""], [3]])
def test_bad_segment_lists_are_refused(segments: object) -> None:
    with pytest.raises(InvalidArgumentError):
        KeySpaceRouter(segments)  # type: ignore[arg-type]


def test_a_routing_key_must_be_text() -> None:
    with pytest.raises(InvalidArgumentError):
        KeySpaceRouter(["a", "b"]).segment_for(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        KeySpaceRouter(["a"]).segment_for(17)  # type: ignore[arg-type]


# --- Serializers -----------------------------------------------------------------------------------


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False,
                                                                                        allow_infinity=False),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10))
def test_json_round_trips(value: object) -> None:
    serializer = JsonSerializer()
    assert serializer.deserialize(serializer.serialize(value)) == value


def test_serializers_refuse_what_they_cannot_encode_with_a_typed_error() -> None:
    with pytest.raises(InvalidArgumentError):
        JsonSerializer().serialize({"x": object()})
    with pytest.raises(InvalidArgumentError):
        JsonSerializer().serialize(float("nan"))
    with pytest.raises(InvalidArgumentError):
        JsonSerializer().deserialize(b"{not json")
    with pytest.raises(InvalidArgumentError):
        StringSerializer().serialize("\ud800")
    with pytest.raises(InvalidArgumentError):
        StringSerializer().deserialize(b"\xff")
    with pytest.raises(InvalidArgumentError):
        BytesSerializer().serialize("text")  # type: ignore[arg-type]
    assert BytesSerializer().serialize(bytearray(b"ab")) == b"ab"
    assert StringSerializer().deserialize(StringSerializer().serialize("héllo")) == "héllo"


# --- The block-size rule ---------------------------------------------------------------------------


def test_a_slow_writer_sends_every_event_as_it_comes() -> None:
    tracker = BlockSizeTracker(now=0.0, block_bytes_max=512 * 1024, window_seconds_max=0.02)
    now = 0.0
    for _ in range(20):
        now += 0.1  # one 108-byte event every 100 ms
        tracker.block_closed(now, 108)
        tracker.acknowledged(now + 0.001, now)
    assert tracker.target() < 108, "a target below one event closes the block at every event"


def test_under_load_blocks_grow_toward_half_a_round_trip_of_arrivals() -> None:
    tracker = BlockSizeTracker(now=0.0, block_bytes_max=512 * 1024, window_seconds_max=0.02)
    now = 0.0
    rate = 30e6  # 30 MB/s arriving
    for _ in range(50):
        size = max(tracker.target(), 108)
        now += size / rate
        tracker.block_closed(now, size)
        tracker.acknowledged(now, now - 0.004)  # a 4 ms round trip
    assert tracker.round_trip_seconds == pytest.approx(0.004)
    assert tracker.target() == pytest.approx(rate * 0.002, rel=0.05)


def test_the_block_size_is_capped_by_the_window_and_the_block_limit() -> None:
    tracker = BlockSizeTracker(now=0.0, block_bytes_max=100_000, window_seconds_max=0.02)
    tracker.block_closed(1.0, 1_000_000)  # 1 MB/s
    tracker.acknowledged(2.0, 1.0)  # a 1 s round trip: the 20 ms window applies
    assert tracker.target() == 20_000
    tracker.block_closed(1.001, 1_000_000)  # ~1 GB/s
    assert tracker.target() == 100_000
