"""Server processes the harness starts, and the CPU any one process has used.

Every system under test runs as its own process beside the writer (the harness's own process), as a
user would run it: ``millstream standalone``, ``nats-server``, ``redis-server``.  On a 2-core machine
the writer and the server then each get a core.  ``ServerProcess``:

* starts the command with its output in a log file (read back into error messages when it fails);
* waits, bounded, until a TCP connection to its port succeeds (and, if given, a line matching
  ``ready_pattern`` has appeared in its output) -- or the process exits, which is an error naming its
  last output lines.  Given port 0, the server picks its own port and the pattern's first group says
  which: no other process can take a port between a probe and the server's bind;
* stops it with SIGTERM (or another signal: SIGINT lets a ``python -m cProfile`` server write its
  profile), waits, bounded, and SIGKILLs it if it lingers.  It is a context manager, so a failing
  step never leaves a server behind.

``process_cpu_seconds(pid)`` reads ``/proc/PID/stat`` (user + system time of all its threads): the
harness takes it at both ends of a measured window so that a report can say how much CPU the writer,
the server, and everybody else used.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from bench.limits import BENCH_SERVER_START_TIMEOUT_SECONDS, BENCH_SERVER_STOP_TIMEOUT_SECONDS

__all__ = ["STANDALONE_READY", "ServerFailedError", "ServerProcess", "free_port", "module_environment",
           "process_cpu_seconds", "process_disk_write_bytes"]

#: ``millstream standalone`` is ready when the command says so on stdout, once every service has started
#: (its port, in group 1).  The server's own log line "segment store listening on ..." comes earlier --
#: before the controller has started -- and must not count.
STANDALONE_READY: Final = r"(?m)^millstream standalone listening on tcp://127\.0\.0\.1:(\d+) "

_POLL_SECONDS: Final = 0.05
_LOG_TAIL_LINES: Final = 20


class ServerFailedError(RuntimeError):
    """A server the harness started did not come up (exited, or never accepted a connection)."""


#: The folder that holds the ``bench`` package: a clone's root (the benchmarks are not in the wheel).
CLONE_ROOT: Final = Path(__file__).resolve().parent.parent


def module_environment() -> dict[str, str]:
    """This process's environment, with the clone's root first on ``PYTHONPATH``: a child started as
    ``python -m bench.MODULE`` finds the benchmarks wherever the run was started from (the working
    directory need not be the clone)."""
    environment = dict(os.environ)
    paths = [str(CLONE_ROOT), *(p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p)]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return environment


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (every thread), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def process_disk_write_bytes(pid: int) -> int | None:
    """Bytes process ``pid`` (every thread) has sent towards the storage layer -- ``write_bytes`` of
    proc(5)'s ``/proc/PID/io``: what it wrote to files, counted as it dirties the page cache, so a
    write that a later ``fsync`` pushes out counts once -- or None if it is gone or cannot be read."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "write_bytes":
            return int(value)
    return None


class ServerProcess:
    """One server process; see the module docstring."""

    def __init__(self, name: str, command: Sequence[str], *, port: int, log_path: Path,
                 ready_pattern: str | None = None, stop_signal: int = signal.SIGTERM,
                 environment: dict[str, str] | None = None) -> None:
        self.name = name
        self.command = tuple(command)
        self.port = port
        self.log_path = log_path
        self._ready = re.compile(ready_pattern) if ready_pattern else None
        self._stop_signal = stop_signal
        self._environment = environment
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._process.pid

    def start(self, timeout_seconds: float = BENCH_SERVER_START_TIMEOUT_SECONDS) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(  # our own command line, no shell
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self._environment, start_new_session=True)
        try:
            self._wait_ready(timeout_seconds)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_seconds: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_seconds
        for _ in range(int(timeout_seconds / _POLL_SECONDS) + 1):
            if self._process.poll() is not None:
                raise ServerFailedError(
                    f"{self.name} exited with status {self._process.returncode} while starting:\n{self.log_tail()}")
            if self._line_seen() and self.port and _accepts(self.port):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_SECONDS)
        raise ServerFailedError(f"{self.name} did not accept connections on 127.0.0.1:{self.port} within "
                                f"{timeout_seconds:g} s:\n{self.log_tail()}")

    def _line_seen(self) -> bool:
        if self._ready is None:
            return True
        try:
            found = self._ready.search(self.log_path.read_text(errors="replace"))
        except OSError:
            return False
        if found is not None and not self.port:
            self.port = int(found.group(1))  # (port 0: the server said which port it took)
        return found is not None

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(no output)"

    def cpu_seconds(self) -> float | None:
        return None if self._process is None else process_cpu_seconds(self._process.pid)

    def disk_write_bytes(self) -> int | None:
        return None if self._process is None else process_disk_write_bytes(self._process.pid)

    def stop(self, timeout_seconds: float = BENCH_SERVER_STOP_TIMEOUT_SECONDS) -> int | None:
        """Signal the server, wait for it to exit (bounded), kill it if it does not; its exit status."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(self._stop_signal)
            try:
                process.wait(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=timeout_seconds)
        return process.returncode

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=_POLL_SECONDS):
            return True
    except OSError:
        return False
