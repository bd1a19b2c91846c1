"""A Spark standalone cluster from the PySpark installation: a master and workers, each its own JVM.

Theory of operation.  PySpark's package holds a whole Spark (``SPARK_HOME`` is the package's folder):
``bin/spark-class org.apache.spark.deploy.master.Master`` starts a master, ``...deploy.worker.Worker
spark://HOST:PORT`` a worker that registers with it, and a driver whose master is that URL gets an
executor JVM on each worker -- with Python workers of its own, which reach the store over TCP like
any client.  ``StandaloneCluster`` starts the master on a free loopback port (its web UI on another,
which it polls for ``aliveworkers``), then the workers, each with ``cores`` cores and
``memory_mb`` of memory for executors (small: a two-core machine runs it beside the store and the
driver), each in a session of its own with its logs and work directory under ``directory``.
``stop`` -- always, on any exit from the ``with`` -- sends SIGTERM to every process of each session
(a worker stops its executors), then SIGKILL to what is left after ``STOP_TIMEOUT_SECONDS``.

A driver for such a cluster needs small executors too: ``pipeline.spark_conf`` asks for one core
and ``pipeline.EXECUTOR_MEMORY`` per executor when its master is a ``spark://`` URL.  The Python workers on the
executors run the interpreter ``PYSPARK_PYTHON`` names (this one by default), which must import
millstream -- on one machine it is the same installation; on several, install it on each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from millstream.clock import Clock, SystemClock
from millstream.errors import MillstreamError, RequestTimeoutError
from millstream.spark.pipeline import session_members

__all__ = ["ClusterError", "StandaloneCluster", "spark_home"]

#: The master and every worker must be up within this long (a JVM starts in seconds; a loaded
#: two-core machine takes tens of them).
START_TIMEOUT_SECONDS: Final = 180.0
#: ``stop`` waits this long after SIGTERM before SIGKILL.
STOP_TIMEOUT_SECONDS: Final = 30.0
#: How often the master's state is polled while waiting.
POLL_SECONDS: Final = 0.5
#: Heap of the master and worker daemons themselves (they only schedule; executors get ``memory_mb``).
DAEMON_MEMORY: Final = "256m"


class ClusterError(MillstreamError):
    """The cluster could not start (a process exited, or it was not up in time).  Raised after every
    process it started has been stopped."""


def spark_home() -> Path:
    """The Spark installation inside the PySpark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class StandaloneCluster:
    """A master and ``workers`` workers on loopback (see the module docstring).  ``with
    StandaloneCluster(directory) as cluster:`` -- ``cluster.url`` is the master URL."""

    def __init__(self, directory: Path, *, workers: int = 2, cores: int = 1, memory_mb: int = 1024,
                 clock: Clock | None = None) -> None:
        self.directory = Path(directory)
        self.workers = workers
        self.cores = cores
        self.memory_mb = memory_mb
        self._clock = clock or SystemClock()
        self._processes: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.ui_port = 0

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _environment(self, name: str) -> dict[str, str]:
        home = spark_home()
        logs = self.directory / name
        logs.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / "work"),
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY, "SPARK_WORKER_CORES": str(self.cores),
                "SPARK_WORKER_MEMORY": f"{self.memory_mb}m",
                "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}

    def _launch(self, name: str, arguments: list[str]) -> subprocess.Popen[bytes]:
        environment = self._environment(name)
        log = (self.directory / name / "out.log").open("ab")
        try:
            process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *arguments],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=environment, start_new_session=True)
        finally:
            log.close()
        self._processes.append(process)
        return process

    def state(self) -> dict[str, Any]:
        """The master's state (its web UI's ``/json/``: workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            state: dict[str, Any] = json.loads(response.read())
            return state

    def _wait(self, what: str, ready: Any) -> None:
        deadline = self._clock.monotonic() + START_TIMEOUT_SECONDS
        while True:
            for process in self._processes:
                if process.poll() is not None:
                    raise ClusterError(f"{what}: a cluster process exited with {process.returncode} "
                                       f"(logs under {self.directory})")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            if self._clock.monotonic() > deadline:
                raise RequestTimeoutError(f"{what}: not within {START_TIMEOUT_SECONDS:.0f} s (logs under "
                                          f"{self.directory})")
            time.sleep(POLL_SECONDS)  # processes outside our control: a bounded poll

    def start(self) -> None:
        """Start the master, then the workers; return once every worker is alive at the master."""
        try:
            self.port, self.ui_port = _free_port(), _free_port()
            self._launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                    "--port", str(self.port), "--webui-port", str(self.ui_port)])
            self._wait("the master's start", lambda: "aliveworkers" in self.state())
            for number in range(1, self.workers + 1):
                self._launch(f"worker-{number}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", "0",
                    "--cores", str(self.cores), "--memory", f"{self.memory_mb}m",
                    "--work-dir", str(self.directory / f"worker-{number}" / "work"), self.url])
            self._wait(f"{self.workers} workers alive", lambda: self.state().get("aliveworkers") == self.workers)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM every process of every session the cluster started (workers stop their executors),
        then SIGKILL what is left; idempotent."""
        processes, self._processes = self._processes, []
        for process in reversed(processes):  # workers first, the master last
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_SECONDS)
        for process in processes:
            for pid in [process.pid, *session_members(process.pid)]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_SECONDS)

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
