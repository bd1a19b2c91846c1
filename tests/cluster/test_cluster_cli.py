"""The cluster's commands (``millstream.cli.cluster``): ``cluster status`` against a fixture cluster,
``serve --zookeeper`` refusing wrong addresses at once (naming them), and ``cluster up`` as a
subprocess -- waited for by its "ready" line, read back with ``cluster status``, stopped with SIGINT,
every child gone."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import time
from pathlib import Path

from click.testing import CliRunner

from millstream.cli import main
from millstream.cluster import ClusterNode
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.server import ServerConfig
from millstream.testing.nats_cluster import NatsCluster
from millstream.testing.zookeeper_server import ZooKeeperServer

from .cluster_up import UP_READY_SECONDS, ClusterUp, alive
from .zookeeper_helpers import SESSION_TIMEOUT_SECONDS, cluster_name, file_logs, in_loop, wait_until

CONTAINER_COUNT = 4
ROOT = Path(__file__).resolve().parents[2]



def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(zookeeper: str, cluster: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["cluster", "status", "--zookeeper", zookeeper, "--cluster", cluster, *extra])
    return result.exit_code, result.output


@in_loop
async def test_cluster_status_shows_the_hosts_the_map_and_who_owns_what(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    cluster = cluster_name()
    storage = FileChunkStorage(tmp_path / "tier2")
    nodes = [ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host, open_log=file_logs(tmp_path),
                         chunk_storage=storage, config=ServerConfig(container_count=CONTAINER_COUNT),
                         session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0)
             for host in ("a", "b")]
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        await wait_until(lambda: all(len(node.serving) == 2 for node in nodes), "two nodes serving two each")
        code, output = await asyncio.to_thread(_status, zookeeper.connect_string, cluster, "--json")
        assert code == 0, output
        status = json.loads(output)
        assert status["cluster"] == cluster and status["zookeeper"] == zookeeper.connect_string
        assert status["container_count"] == CONTAINER_COUNT and status["map_version"] >= 0
        assert status["leader"] in ("a", "b")
        assert {host: entry["address"] for host, entry in status["hosts"].items()} == {
            node.host_id: node.address for node in nodes}
        for node in nodes:
            assert set(status["hosts"][node.host_id]["containers"]) == node.serving
            for container_id in node.serving:
                container = status["containers"][str(container_id)]
                assert container["host"] == container["claimed_by"] == node.host_id
                assert container["claimed_under"] <= status["map_version"]
        code, output = await asyncio.to_thread(_status, zookeeper.connect_string, cluster)
        assert code == 0, output
        assert f"cluster {cluster} on ZooKeeper {zookeeper.connect_string}: 2 host(s), 4 container(s)" in output
        for node in nodes:
            assert re.search(rf"^{node.host_id} +{re.escape(node.address)} +\d,\d$", output, re.M), output
        # A cluster nobody started: no hosts, no map.
        code, output = await asyncio.to_thread(_status, zookeeper.connect_string, cluster_name(), "--json")
        assert code == 0 and json.loads(output)["hosts"] == {} and json.loads(output)["map_version"] == -1
    finally:
        for node in nodes:
            await node.stop()
        await storage.close()


def test_wrong_zookeeper_and_nats_addresses_fail_at_once_naming_them(tmp_path: Path,
                                                                    zookeeper: ZooKeeperServer) -> None:
    wrong = f"127.0.0.1:{_unused_port()}"
    code, output = _status(wrong, "x", "--timeout", "1")
    assert code == 1 and f"ZooKeeper at {wrong} did not answer within 1.0 s" in output
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--zookeeper", wrong, "--connect-timeout", "1", "--data-dir",
                                  str(tmp_path / "node"), "--port", "0", "--quiet"])
    assert result.exit_code == 1 and f"ZooKeeper at {wrong} did not answer within 1.0 s" in result.output
    nats_wrong = f"127.0.0.1:{_unused_port()}"
    result = runner.invoke(main, ["serve", "--zookeeper", zookeeper.connect_string, "--tier1",
                                  f"jetstream://{nats_wrong}", "--connect-timeout", "1", "--data-dir",
                                  str(tmp_path / "node"), "--port", "0", "--quiet"])
    assert result.exit_code == 1 and f"NATS JetStream at {nats_wrong}" in result.output, result.output
    result = runner.invoke(main, ["serve", "--zookeeper", zookeeper.connect_string, "--tier1", "nats://h:1",
                                  "--data-dir", str(tmp_path / "node")])
    assert result.exit_code == 2 and "jetstream://HOST:PORT" in result.output
    result = runner.invoke(main, ["serve", "--zookeeper", zookeeper.connect_string, "--owned-containers", "0",
                                  "--data-dir", str(tmp_path / "node")])
    assert result.exit_code == 2 and "--owned-containers" in result.output
    result = runner.invoke(main, ["serve", "--zookeeper", zookeeper.connect_string])
    assert result.exit_code == 2 and "--data-dir" in result.output


def test_help_texts_say_what_the_cluster_commands_do() -> None:
    runner = CliRunner()
    assert "--zookeeper" in runner.invoke(main, ["serve", "--help"]).output
    for command, phrase in ((["cluster", "status"], "which host each container is given to"),
                            (["cluster", "up"], "serves until you press Ctrl-C")):
        result = runner.invoke(main, [*command, "--help"])
        assert result.exit_code == 0 and phrase in " ".join(result.output.split())


def _readme_cluster_commands() -> tuple[list[str], str]:
    """The README's "A cluster on one machine" commands: ``cluster up``'s arguments, and the status line."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## A cluster on one machine\n", 1)[1].split("\n## ", 1)[0]
    install, status = re.findall(r"```sh\n(.*?)```", section, re.S)
    up = next(line for line in install.splitlines() if line.startswith("millstream cluster up"))
    assert up == "millstream cluster up --nodes 3 --data-dir ./cluster"
    return shlex.split(up)[1:], status.strip()


def test_cluster_up_starts_everything_serves_and_stops_everything_on_sigint(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """The README's cluster commands, as written (in a fresh directory).  (``zookeeper``: only for its
    skip when ZooKeeper is not installed; ``cluster up`` starts its own.)"""
    NatsCluster(tmp_path / "probe", size=1)  # fails now, saying how to install it, if nats-server is missing
    up, status_line = _readme_cluster_commands()
    with ClusterUp(up, tmp_path) as cluster_up:
        text = cluster_up.start()
        zookeeper_address = re.search(r"^zookeeper (\S+) \(pid \d+\)$", text, re.M)
        assert zookeeper_address is not None, text
        pids = cluster_up.pids
        assert len(pids) == 1 + 3 + 3, text  # ZooKeeper, three NATS servers, three nodes
        nodes = re.findall(r"^node-(\d) (tcp://127\.0\.0\.1:\d+) ", text, re.M)
        assert [index for index, _ in nodes] == ["1", "2", "3"], text
        zookeeper_connect = zookeeper_address.group(1)
        port = zookeeper_connect.rpartition(":")[2]
        assert status_line == "millstream cluster status --zookeeper 127.0.0.1:PORT"
        result = CliRunner().invoke(main, shlex.split(status_line.replace("PORT", port))[1:])
        assert result.exit_code == 0 and "3 host(s), 4 container(s)" in result.output, result.output
        code, output = _status(zookeeper_address.group(1), "millstream", "--json")
        assert code == 0, output
        status = json.loads(output)
        assert sorted(status["hosts"]) == ["node-1", "node-2", "node-3"]
        assert {f"tcp://{entry['address']}" for entry in status["hosts"].values()} == {uri for _, uri in nodes}
        assert all(container["claimed_by"] == container["host"] for container in status["containers"].values())
        assert all(alive(pid) for pid in pids)
        # A node killed: the cluster carries on, and its containers move to the other two.
        found = re.search(r"^node-2 \S+ \(pid (\d+)", text, re.M)
        assert found, text
        killed = int(found.group(1))
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + UP_READY_SECONDS

        def moved() -> bool:
            code, output = _status(zookeeper_connect, "millstream", "--json")
            status = json.loads(output) if code == 0 else {"hosts": {}}
            return sorted(status["hosts"]) == ["node-1", "node-3"] and all(
                container["host"] in status["hosts"] and container["claimed_by"] == container["host"]
                for container in status["containers"].values())
        while not moved():
            assert time.monotonic() < deadline, "node-2's containers did not move to the other nodes"
            time.sleep(0.2)
        assert cluster_up.process is not None and cluster_up.process.poll() is None
        assert cluster_up.stop() == 0
        assert [pid for pid in pids if alive(pid)] == []
        assert "node-2 exited with status -9" in cluster_up.stderr()
