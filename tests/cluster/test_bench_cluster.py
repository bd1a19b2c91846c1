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
