"""Latency as users see it (``bench.latency_loops``, issue 26 items 3 and 4): the per-event loop paced
at half of its max, and a lone writer beside one fdatasync -- at tiny sizes against a real ``millstream
standalone`` process, and in the quick suite's report.

Structure and consistency only -- every repeat is reported, every written event is measured, the
lone writer's probe and the fdatasync probe sit side by side -- never a speed or a latency: a loaded CI
machine may be arbitrarily slow."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from bench import latency_loops
from bench._system import QuietWait
from bench.benchmarks_md import render_markdown
from bench.drivers import all_drivers
from bench.harness import HarnessConfig, run_harness
from bench.latency_loops import LatencyLoopsConfig, render_latency_loops, run_latency_loops
from bench.user_loops import UserLoopsConfig
from bench.workload import parse_workload

TINY = LatencyLoopsConfig(segments=2, key_count=50, max_events=1_000, paced_seconds=0.2, repeats=2, lone_rate=200.0,
                          lone_seconds=0.2, sync_seconds=0.05)


def test_every_repeat_is_paced_at_half_its_own_max_and_the_lone_writer_sits_beside_one_fdatasync(
        tmp_path: Path) -> None:
    report = run_latency_loops(TINY, tmp_path, QuietWait(quiet=False, waited_seconds=0.0, idle_percent=None))
    assert list(tmp_path.iterdir()) == [], "the loops must remove the node's data"
    assert len(report.half_max) == 2
    for run in report.half_max:
        assert run.max_events_per_second > 0
        assert run.offered_events_per_second == run.max_events_per_second / 2
        assert run.latency.count > 0 and run.latency.p95_ms is not None and run.latency.p95_ms > 0
        assert run.achieved_events_per_second > 0
    lone = report.lone
    assert lone.events > 0 and lone.latency.count == lone.events  # every event waited for, one at a time
    assert lone.sync.syncs > 0 and lone.sync.write_bytes == 100
    mine, sync = lone.latency.p95_ms, lone.sync.latency.p95_ms
    assert mine is not None and sync is not None and lone.p95_over_sync == mine / sync
    lines = "\n".join(render_latency_loops(report))
    assert lines.count("\n| 1 |") == 1 and lines.count("\n| 2 |") == 1  # every repeat, not a median alone
    assert "| one `fdatasync` |" in lines and "| lone writer |" in lines


@pytest.mark.skipif(not all_drivers()["millstream"].availability().available, reason="millstream driver unavailable")
def test_the_quick_suites_report_shows_the_latency_loops(tmp_path: Path) -> None:
    tiny = parse_workload('name = "tiny"\nevent_bytes = 100\nsegments = 2\nrouting_keys = "random"\n'
                          'routing_key_count = 100\nrates = ["max"]\nduration_seconds = 0.3\nwarmup_seconds = 0.1\n'
                          'systems = ["millstream"]\n')
    config = HarnessConfig(suite="quick", workloads=(tiny,), quiet_timeout_seconds=0.0, disk_probe_seconds=0.05,
                           use_fio=False, user_loops=UserLoopsConfig(events=1_000, segments=2, key_count=50,
                                                                     batch_events=300, rounds=1, raw_seconds=0.05),
                           latency_loops=TINY)
    report = run_harness(config, all_drivers(), tmp_path, "test")
    assert report.latency_loops is not None and len(report.latency_loops.half_max) == 2
    markdown = render_markdown(report)
    assert "## Latency as users see it: the per-event loop at half of max, a lone writer" in markdown


class _Clock:
    """A clock that moves only when the loop sleeps, counting its reads."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


class _Writer:
    """A writer whose events of one tick share one block's future, acknowledged when the loop next
    sleeps (the clock has moved by then)."""

    def __init__(self) -> None:
        self.events = 0
        self.flushed = False
        self._open: concurrent.futures.Future[None] | None = None

    def write_event_future(self, event: bytes, *, routing_key: str | None = None) -> concurrent.futures.Future[None]:
        self.events += 1
        if self._open is None:
            self._open = concurrent.futures.Future()
        return self._open

    def acknowledge(self) -> None:
        if self._open is not None:
            self._open.set_result(None)
            self._open = None

    def flush(self) -> None:
        self.acknowledge()
        self.flushed = True


def test_the_paced_loop_keeps_its_books_per_tick_not_per_event() -> None:
    """The pacing's own work must stay small beside ``write_event_future``'s: reading the clock (and
    recording) for every event made the loop at "half of max" saturate the writer's process and
    measure its own backlog (p95 of 190 ms with the offered rate never reached).  With a clock that
    moves only between ticks, every event of a tick is stamped with when the tick's first event fell
    due, and the clock is read per tick (and per block's acknowledgement), not per event."""
    clock = _Clock()
    writer = _Writer()
    tick = latency_loops.PACING_TICK_SECONDS

    def sleep(seconds: float) -> None:
        assert seconds == tick
        clock.now += tick
        writer.acknowledge()  # the tick's block is acknowledged while the loop sleeps

    rate = 200 / tick  # 200 events due every tick
    latency, achieved = latency_loops.paced_loop(writer, [b"x" * 100] * 7, ["a", "b", None] * 3, rate, 20 * tick,
                                                 clock=clock, sleep=sleep)
    assert writer.flushed
    assert writer.events == latency.count > 0 and achieved == pytest.approx(writer.events / (20 * tick))
    ticks = writer.events // 200
    assert ticks >= 19
    assert clock.reads <= 3 * ticks + 10 < writer.events / 10  # per tick, not per event
    # Each event is stamped with when the first event of its tick fell due (a tick before it was
    # written), and its block was acknowledged a tick after: two ticks, every one.
    assert latency.p50_ms == pytest.approx(2_000 * tick) and latency.max_ms == pytest.approx(2_000 * tick)
