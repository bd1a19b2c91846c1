"""The test ZooKeeper (``millstream.testing.zookeeper_server``): it serves once ``start`` returns, it
stops and is killed for good, and a restart on the same data directory keeps the data."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from millstream.errors import CoordinationUnavailableError
from millstream.testing.zookeeper_server import ZooKeeperServer, four_letter_word

from .conftest import _require_zookeeper


def _client(server: ZooKeeperServer) -> KazooClient:
    client = KazooClient(hosts=server.connect_string, timeout=10.0, connection_retry={"max_tries": 0})
    client.start(timeout=30.0)
    return client


def test_started_zookeeper_serves_and_a_restart_keeps_its_data(zookeeper_own: ZooKeeperServer) -> None:
    assert four_letter_word(zookeeper_own.host, zookeeper_own.port, "ruok") == "imok"
    client = _client(zookeeper_own)
    try:
        client.create("/kept", b"value")
    finally:
        client.stop()
        client.close()
    port = zookeeper_own.port
    zookeeper_own.kill()
    assert not zookeeper_own.running
    with pytest.raises(OSError):
        four_letter_word(zookeeper_own.host, port, "ruok", timeout_seconds=1.0)
    zookeeper_own.start()
    assert zookeeper_own.port == port
    client = _client(zookeeper_own)
    try:
        assert client.get("/kept")[0] == b"value"
    finally:
        client.stop()
        client.close()
    zookeeper_own.stop()
    assert not zookeeper_own.running


def test_a_server_that_cannot_start_fails_with_a_typed_error_and_leaves_nothing(tmp_path: Path) -> None:
    _require_zookeeper()
    with ZooKeeperServer(tmp_path / "first") as first:
        second = ZooKeeperServer(tmp_path / "second", port=first.port)  # the port is taken
        with pytest.raises(CoordinationUnavailableError, match="in use"):
            second.start(timeout_seconds=60.0)
        assert not second.running
