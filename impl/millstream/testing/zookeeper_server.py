"""A standalone ZooKeeper on loopback, for tests and for a local development cluster.

ZooKeeper comes from Debian's ``zookeeper`` package (3.8): ``/usr/share/java/zookeeper.jar``, whose
manifest names every jar it needs, and a JRE (``java`` on the ``PATH``).  Debian's ``zkServer.sh``
reads its configuration and log directories from fixed places under ``/etc``; this module runs the
server's standalone main class itself instead, with a configuration of its own in the data directory:

* ``clientPortAddress=127.0.0.1`` and a client port that was free a moment before (or the one given);
* the admin server (an HTTP server on port 8080 by default) off -- two servers on one machine would
  fight for its port;
* the four-letter words ``ruok`` and ``srvr`` allowed: ``srvr`` answers ``Mode: standalone`` only once
  the server serves requests, and that is what ``start`` waits for (bounded; never a fixed sleep);
* a short ``tickTime`` and a session timeout range wide enough that tests may ask for sessions of a
  second or less (ZooKeeper clamps a client's requested timeout into ``[minSessionTimeout,
  maxSessionTimeout]``).

``stop`` ends the server with SIGTERM (it closes its sessions' connections; the sessions themselves
survive in the data directory and expire on a restarted server only after their timeout), ``kill``
with SIGKILL, and ``start`` after either restarts it on the same data directory and port: data and
sessions persist, so a test can stop ZooKeeper past a session timeout and watch the session expire.

The server's output goes to ``zookeeper.out`` in the data directory; a failure to start quotes its
tail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from millstream.errors import CoordinationUnavailableError, InvalidArgumentError

__all__ = ["ZOOKEEPER_JAR", "ZooKeeperServer", "zookeeper_installed", "zookeeper_server"]

#: Where Debian's ``zookeeper`` package puts the server (``.ci/run`` installs it when absent).
ZOOKEEPER_JAR = Path(os.environ.get("MILLSTREAM_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))

#: How long ``start`` waits for the server to serve: a JVM starting on a loaded two-core machine
#: takes a few seconds; a minute means something is wrong.
START_TIMEOUT_SECONDS = 60.0

#: How long ``stop`` waits for the JVM to exit after SIGTERM before it sends SIGKILL.
STOP_TIMEOUT_SECONDS = 20.0

#: Between two readiness probes while the server starts (a probe is one loopback connection).
_PROBE_INTERVAL_SECONDS = 0.05

#: One four-letter-word probe: connect, send, read the reply.
_PROBE_TIMEOUT_SECONDS = 2.0

#: ZooKeeper's tick: the unit of its timeouts.  200 ms lets tests ask for sessions down to 400 ms.
_TICK_MS = 200

#: The longest session a client may ask for (ZooKeeper's default cap is 20 ticks, 4 s here).
_SESSION_TIMEOUT_MS_MAX = 60_000


def zookeeper_installed() -> bool:
    """Whether a ZooKeeper server can be started here: the jar and a ``java`` are present."""
    return ZOOKEEPER_JAR.is_file() and shutil.which("java") is not None


def _free_port() -> int:
    # The port is free now; another process could take it before ZooKeeper binds it, in which case
    # ``start`` fails with the server's own message ("Address already in use").
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as the JVM binds it: TIME_WAIT is no obstacle)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def four_letter_word(host: str, port: int, word: str, *, timeout_seconds: float = _PROBE_TIMEOUT_SECONDS) -> str:
    """Send a four-letter word (``ruok``, ``srvr``) and return the reply.  Raises ``OSError`` if the
    server cannot be reached."""
    with socket.create_connection((host, port), timeout=timeout_seconds) as connection:
        connection.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = connection.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer:
    """One standalone ZooKeeper process on loopback.  ``start``/``stop``/``kill`` may be repeated;
    the data directory and port stay the same."""

    host = "127.0.0.1"

    def __init__(self, data_dir: str | os.PathLike[str], *, port: int | None = None,
                 java: str | None = None, jar: Path = ZOOKEEPER_JAR) -> None:
        if port is not None and not 0 < port < 65536:
            raise InvalidArgumentError(f"port must be in 1..65535, not {port}")
        self.data_dir = Path(data_dir)
        self.port = port if port is not None else _free_port()
        self._java = java or shutil.which("java") or "java"
        self._jar = jar
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        """``host:port``, what a ZooKeeper client takes."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={_TICK_MS}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr",
            f"minSessionTimeout={2 * _TICK_MS}",
            f"maxSessionTimeout={_SESSION_TIMEOUT_MS_MAX}",
            # Tests create few znodes; no snapshot purging needed, but keep the defaults explicit.
            "autopurge.purgeInterval=0",
            "",
        ]))
        return config

    def start(self, *, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Start the server and return once it serves requests.  Raises ``CoordinationUnavailableError``
        (and leaves no process behind) if it exits or does not serve within ``timeout_seconds``."""
        if self.running:
            raise InvalidArgumentError(f"ZooKeeper on {self.connect_string} is running already")
        if not zookeeper_installed() and self._jar == ZOOKEEPER_JAR:
            raise CoordinationUnavailableError(
                f"ZooKeeper is not installed ({ZOOKEEPER_JAR} and java are needed: apt-get install zookeeper)")
        if not _port_free(self.host, self.port):
            # Checked first: a probe of a port another server holds would be answered by that server.
            raise CoordinationUnavailableError(f"cannot start ZooKeeper on {self.connect_string}: the port is in use")
        config = self._write_config()
        output = open(self.data_dir / "zookeeper.out", "ab")  # noqa: SIM115  (the child holds it)
        try:
            self._process = subprocess.Popen(
                [self._java, "-Xmx256m", f"-Dzookeeper.log.dir={self.data_dir}", "-cp", str(self._jar),
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            output.close()
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise CoordinationUnavailableError(
                    f"ZooKeeper on {self.connect_string} exited with {code} while starting:\n{self._output_tail()}")
            with contextlib.suppress(OSError):
                if "Mode:" in four_letter_word(self.host, self.port, "srvr"):
                    return
            if time.monotonic() >= deadline:
                self.kill()
                raise CoordinationUnavailableError(
                    f"ZooKeeper on {self.connect_string} did not serve within {timeout_seconds} s:\n"
                    f"{self._output_tail()}")
            time.sleep(_PROBE_INTERVAL_SECONDS)  # a poll interval while waiting for a condition

    def _output_tail(self, lines: int = 20) -> str:
        try:
            text = (self.data_dir / "zookeeper.out").read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:])

    def _end(self, sig: signal.Signals) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self._process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL if it lingers).  Idempotent."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the server (SIGKILL): nothing it has not written survives.  Idempotent."""
        self._end(signal.SIGKILL)

    def restart(self, *, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Stop and start again on the same data directory and port."""
        self.stop()
        self.start(timeout_seconds=timeout_seconds)

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({str(self.data_dir)!r}, port={self.port})"


@contextlib.contextmanager
def zookeeper_server(data_dir: str | os.PathLike[str] | None = None) -> Iterator[ZooKeeperServer]:
    """A started ZooKeeper on loopback, in ``data_dir`` (a temporary directory, removed afterwards,
    when not given), stopped on exit."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="millstream-zookeeper-"))
        server = ZooKeeperServer(data_dir)
        server.start()
        stack.callback(server.kill)  # (after stop, a no-op; if a test left it half-stopped, a sure end)
        stack.callback(server.stop)
        yield server
