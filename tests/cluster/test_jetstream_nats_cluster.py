"""``millstream.testing.nats_cluster``: its docstring's example runs, it leaves no process behind (a test
that fails inside the block included), and a missing binary says how to install it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import millstream.testing.nats_cluster as nats_cluster_module
from millstream.testing.nats_cluster import NatsCluster, find_nats_server


def test_the_module_docstring_example_runs(tmp_path: Path) -> None:
    doc = nats_cluster_module.__doc__
    assert doc is not None
    example = textwrap.dedent(doc.split("included::\n\n", 1)[1])
    namespace = {"NatsCluster": NatsCluster, "directory": tmp_path}
    exec(compile(example, "nats_cluster docstring", "exec"), namespace)
    cluster = namespace["cluster"]
    assert isinstance(cluster, NatsCluster)
    assert len(cluster.servers) == 3 and all(server.process is None for server in cluster.servers)


def test_every_server_is_stopped_when_the_block_raises(tmp_path: Path) -> None:
    processes = []
    with pytest.raises(RuntimeError, match="a failing test"), NatsCluster(tmp_path, size=1) as cluster:
        processes = [server.process for server in cluster.servers]
        assert cluster.meta_leader() is None  # a lone server has no meta group
        raise RuntimeError("a failing test")
    assert processes and all(process is not None and process.poll() is not None for process in processes)


def test_a_missing_binary_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match=r"millstream\[cluster\]"):
        find_nats_server()
