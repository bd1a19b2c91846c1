"""``python -m bench.cluster`` (issue 23's measurement) runs end to end on a small window: every system
measured once, the ratios computed from the medians, and nothing left running.  (No figure is
checked: speed is the benchmark's business, never a test's.)"""

from __future__ import annotations

from pathlib import Path

from bench.cluster import run_cluster
from millstream.testing.nats_cluster import NatsCluster
from millstream.testing.zookeeper_server import ZooKeeperServer


def test_the_cluster_measurement_runs_every_system_and_computes_its_ratios(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """(``zookeeper``: only for its skip when ZooKeeper is not installed; ``cluster up`` starts its own.)"""
    NatsCluster(tmp_path / "probe", size=1)  # fails now, saying how to install it, if nats-server is missing
    report = run_cluster(events=200, repeats=1, data_dir=tmp_path / "run")
    assert sorted(report["rates"]) == ["cluster", "jetstream", "standalone"]
    assert all(len(rates) == 1 and rates[0] > 0 for rates in report["rates"].values())
    medians = report["medians"]
    assert report["cluster_over_jetstream"] == medians["cluster"] / medians["jetstream"]
    assert report["cluster_over_standalone"] == medians["cluster"] / medians["standalone"]


def test_the_cluster_section_says_the_ratios_and_the_verdict_and_replaces_its_old_self() -> None:
    """(Pure: a fabricated report.)  The section names each system with its median and every window, the
    two ratios and whether the 5x target was met; putting it into a file replaces its earlier section and
    keeps the rest."""
    from bench.cluster import render_cluster_markdown, replace_section, section_of

    report = {"events": 1_000, "event_bytes": 100, "repeats": 2,
              "rates": {"cluster": [90_000.0, 110_000.0], "jetstream": [6_000.0, 4_000.0],
                        "standalone": [150_000.0, 130_000.0]},
              "medians": {"cluster": 100_000.0, "jetstream": 5_000.0, "standalone": 140_000.0},
              "cluster_over_jetstream": 20.0, "cluster_over_standalone": 100_000 / 140_000}
    section = render_cluster_markdown(report, command="python -m bench --suite cluster")
    assert "| millstream cluster: 3 nodes, JetStream Tier-1 with replicas 3 | 100,000 | 90,000, 110,000 |" in section
    assert "**20.0x** (target ≥ 5x: met)" in section and "**0.71**" in section
    slow = render_cluster_markdown({**report, "cluster_over_jetstream": 4.0})
    assert "(target ≥ 5x: not met)" in slow
    document = replace_section("# Benchmarks\n\nother text\n", slow)
    assert section_of(document) is not None and "not met" in document
    updated = replace_section(document, section)
    assert section_of(updated) == section_of(section)
    assert "not met" not in updated and "other text" in updated and updated.count("suite cluster: begin") == 1
