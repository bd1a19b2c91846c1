"""The users' loops (``bench.user_loops``, issue 26): the README's blocking loop, the asyncio loop, the
batch and the columnar call, each beside the raw group-commit loop of its round -- at tiny sizes
against a real ``millstream standalone`` process, and in the quick suite's report.

Structure and consistency only -- every loop's events are stored, the ratios are of the same round's
figures, the order rotates, the report shows them -- never a speed: a loaded CI machine may be
arbitrarily slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._system import QuietWait
from bench.benchmarks_md import render_markdown
from bench.drivers import all_drivers
from bench.harness import HarnessConfig, run_harness
from bench.user_loops import LOOPS, RATIO_MIN, UserLoopsConfig, render_user_loops, run_user_loops, workload
from bench.workload import parse_workload

TINY = UserLoopsConfig(events=3_000, event_bytes=100, segments=4, key_count=100, batch_events=700, rounds=2,
                       raw_seconds=0.05)


def test_every_loop_writes_the_same_distinct_events_with_random_keys() -> None:
    payloads, keys = workload(TINY)
    assert len(payloads) == len(keys) == 3_000
    assert len(set(payloads)) == 3_000 and {len(p) for p in payloads} == {100}
    assert len(set(keys)) == 100 and keys != sorted(keys)  # (sorted would be keys in sequence)


def test_each_loop_stores_its_events_and_is_measured_beside_the_raw_loop_of_its_round(tmp_path: Path) -> None:
    stored: dict[tuple[int, str], int] = {}
    report = run_user_loops(TINY, tmp_path, QuietWait(quiet=False, waited_seconds=0.0, idle_percent=None),
                            stored=stored)
    assert list(tmp_path.iterdir()) == [], "the loops must remove the node's data"
    assert len(report.rounds) == 2
    assert [r.order for r in report.rounds] == [LOOPS, (*LOOPS[1:], LOOPS[0])]  # the order rotates
    for number, round_ in enumerate(report.rounds):
        assert round_.raw.batch_records == 1000 and round_.raw.record_bytes == 100 and round_.raw.records > 0
        assert [run.loop for run in round_.loops] == list(LOOPS)
        for run in round_.loops:
            assert run.events == 3_000 and run.events_per_second > 0 and run.writer_cpu_us_per_event > 0
            assert round_.ratio(run.loop) == run.events_per_second / round_.raw.records_per_second
            # Every event durable at flush(): the stream holds each one, framed (8-byte header).
            assert stored[(number, run.loop)] == 3_000 * (100 + 8)
    lines = "\n".join(render_user_loops(report))
    for loop in LOOPS:
        assert f"`{loop}`" in lines
        assert f"≥ {RATIO_MIN[loop]:g}" in lines
    assert "Raw loop, records/s per round" in lines


@pytest.mark.skipif(not all_drivers()["millstream"].availability().available, reason="millstream driver unavailable")
def test_the_quick_suites_report_shows_the_users_loops(tmp_path: Path) -> None:
    tiny = parse_workload('name = "tiny"\nevent_bytes = 100\nsegments = 2\nrouting_keys = "random"\n'
                          'routing_key_count = 100\nrates = ["max"]\nduration_seconds = 0.3\nwarmup_seconds = 0.1\n'
                          'systems = ["millstream"]\n')
    config = HarnessConfig(suite="quick", workloads=(tiny,), quiet_timeout_seconds=0.0, disk_probe_seconds=0.05,
                           use_fio=False, user_loops=UserLoopsConfig(events=1_000, segments=2, key_count=50,
                                                                     batch_events=300, rounds=1, raw_seconds=0.05))
    report = run_harness(config, all_drivers(), tmp_path, "test")
    assert report.user_loops is not None and len(report.user_loops.rounds) == 1
    markdown = render_markdown(report)
    assert "## What users write: the README's loops, the batch and columnar calls" in markdown
    assert all(f"| `{loop}` |" in markdown for loop in LOOPS)
