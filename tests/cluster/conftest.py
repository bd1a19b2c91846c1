"""Fixtures for tests of a millstream cluster against real engines.

Each engine's fixtures sit in their own section below, in functions of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
