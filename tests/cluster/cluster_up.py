"""``millstream cluster up`` as a child process, for the tests that run a whole cluster through it
(``test_cluster_cli.py``, ``test_cluster_kill.py``, ``test_cluster_tls.py``): started, waited for by its
"ready" line, its printed addresses and PIDs parsed, stopped with SIGINT -- and, whatever happens,
nothing it started left running (each PID it printed is SIGKILLed if it is still alive at the end)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

#: Bounds on waiting for ``cluster up`` to be ready and to stop (not speed checks: a loaded machine
#: starts ZooKeeper, three NATS servers and several Python processes).
UP_READY_SECONDS = 300.0
UP_STOP_SECONDS = 180.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class ClusterUp:
    """``millstream ARGUMENTS...`` (``cluster up ...``) run in ``directory``; a context manager that
    cleans up after it."""

    def __init__(self, arguments: Sequence[str], directory: Path) -> None:
        self.arguments = list(arguments)
        self.directory = directory
        self.stderr_path = directory / "cluster-up.stderr"
        self.process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        #: What it printed up to and including its ready line.
        self.text = ""
        #: Every PID it printed (ZooKeeper, the NATS servers, the nodes).
        self.pids: list[int] = []
        #: ZooKeeper's connect string.
        self.zookeeper = ""
        #: Node name -> (URI, PID).
        self.nodes: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> ClusterUp:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.kill_leftovers()

    def stderr(self) -> str:
        """What it wrote on stderr so far."""
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self) -> str:
        return self.stderr()[-3000:]

    def start(self) -> str:
        """Start it and wait (bounded) for ``millstream cluster ready``; return what it printed."""
        with self.stderr_path.open("w") as stderr:  # (the child keeps its own descriptor)
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import sys; from millstream.cli import main; sys.exit(main())",
                 *self.arguments], cwd=self.directory, stdout=subprocess.PIPE, stderr=stderr, text=True)
        process = self.process

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                self._lines.put(line)
            self._lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        printed = []
        while True:
            line = self._lines.get(timeout=UP_READY_SECONDS)
            assert line is not None, f"cluster up exited early: {process.wait()}: {self.stderr_tail()}"
            printed.append(line)
            if line.startswith("millstream cluster ready"):
                break
        self.text = text = "".join(printed)
        self.pids = [int(pid) for pid in re.findall(r"\(pid (\d+)", text)]
        found = re.search(r"^zookeeper (\S+) \(pid \d+\)$", text, re.M)
        assert found is not None, text
        self.zookeeper = found.group(1)
        self.nodes = {name: (uri, int(pid))
                      for name, uri, pid in re.findall(r"^(node-\d+) ((?:tcp|tls)://\S+) \(pid (\d+)", text, re.M)}
        return text

    @property
    def seeds(self) -> str:
        """Every node's URI, comma-separated: a client's seeds."""
        return ",".join(uri for uri, _ in self.nodes.values())

    def stop(self) -> int:
        """SIGINT, as Ctrl-C; its exit status once it stopped everything (bounded)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=UP_STOP_SECONDS)

    def kill_leftovers(self) -> None:
        """SIGKILL it if it still runs, and every PID it printed that is still alive (``cluster up``
        stops its children itself; this only catches what a failure left behind)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
