"""The peers harness end to end against real servers, in a few seconds each: a tiny workload (paced
and "max", keyed, one tail reader) against a ``millstream standalone`` process, and against NATS
JetStream and Redis Streams when they are installed here (skipped, saying why, when not).

Structure and consistency only -- every event sent is acknowledged and read back, the figures add up,
the server is gone afterwards -- never a speed: a loaded CI machine may be arbitrarily slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.drivers import all_drivers
from bench.harness import HarnessConfig, HarnessReport, run_harness
from bench.workload import parse_workload

TINY = """
name = "smoke"
event_bytes = 200
segments = 2
routing_keys = "random"
routing_key_count = 100
consumers = 1
rates = ["max", 500]
duration_seconds = 0.6
warmup_seconds = 0.2
systems = ["{system}"]
"""


def _run(system: str, tmp_path: Path) -> HarnessReport:
    workload = parse_workload(TINY.replace("{system}", system))
    config = HarnessConfig(suite="smoke", workloads=(workload,), quiet_timeout_seconds=0.0, disk_probe_seconds=0.05,
                           use_fio=False, drain_timeout_seconds=20.0)
    report = run_harness(config, all_drivers(), tmp_path, "test")
    assert list(tmp_path.iterdir()) == [], "the harness must remove the server's data"
    return report


@pytest.mark.parametrize("system", ["millstream", "nats-jetstream", "redis-streams"])
def test_a_tiny_workload_runs_end_to_end_against_a_real_server(system: str, tmp_path: Path) -> None:
    availability = all_drivers()[system].availability()
    if not availability.available:
        pytest.skip(f"{system} is not installed here: {availability.detail}")
    report = _run(system, tmp_path)
    (run,) = report.runs
    assert run.available and run.error is None, run.error
    assert [step.rate_label for step in run.steps] == ["max", "500/s"]
    for step in run.steps:
        assert step.error is None, step.error
        # Every event sent was acknowledged and read back by the tail reader (the drain saw to it) ...
        assert step.sent_total == step.acknowledged_total == step.delivered_total > 0
        # ... and what the window counted is consistent.  (How much fell inside the window is a matter
        # of speed: a peer that acknowledges in bursts on a loaded machine may put none in it.)
        assert step.acknowledged == step.write_latency.count <= step.acknowledged_total
        assert step.delivered == step.end_to_end_latency.count <= step.delivered_total  # type: ignore[union-attr]
        assert step.cpu is not None and step.cpu.server_cpu_seconds is not None
        # (Only readable, not positive: on a tmpfs the storage layer sees no writes.)
        assert step.cpu.server_disk_write_bytes is not None and step.cpu.server_disk_write_bytes >= 0
        assert step.achieved_megabytes_per_second == pytest.approx(step.achieved_events_per_second * 200 / 1e6)
    assert sum(step.acknowledged for step in run.steps) > 0, "nothing came back inside any window"
    # The paced step offered 500 events/s for 0.6 s: it cannot have acknowledged more than it sent.
    paced = run.steps[1]
    assert paced.acknowledged <= 500 * 0.8 + 1
