"""A millstream process for a fault campaign: started, SIGKILLed and stopped by its PID.

A fault suite that kills whole processes (``millstream standalone``, a cluster's ``millstream serve
--zookeeper`` nodes) needs the same few things of each: start it again and again on the same
arguments, know when it listens (the "listening on" line every server command prints on stdout,
where scripts read it), kill it with SIGKILL and check that the kill -- not something else -- ended
it, stop it gracefully at the end, and show its log when anything goes wrong.  ``MillstreamProcess``
does that.  Each start is an *incarnation* with a log file of its own (``NAME-N.log``, the child's
stderr), so a failure shows what the process that failed said, not its successor.

Signals go to this child's PID only, never to processes found by name (other suites may run the
same commands beside it), and every wait is bounded.  The child is ``sys.executable`` running the
CLI with ``PYTHONUNBUFFERED`` set, so that its lines arrive when printed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from millstream.clock import Clock, SystemClock

__all__ = ["MillstreamProcess", "free_port"]

#: Bounds on a child's waits, unless the caller gives others: a loaded machine has taken seconds just
#: to import millstream, and a server recovers its containers before it listens.
READY_TIMEOUT_SECONDS = 120.0
REAP_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 30.0
#: How much of a log a failure message quotes (its end).
LOG_TAIL_CHARACTERS = 3000


def free_port() -> int:
    """A loopback port nothing listens on now (millstream's servers bind with SO_REUSEADDR, so a
    restarted one takes the same port again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MillstreamProcess:
    """``millstream ARGUMENTS...`` as a child process named ``name``, its stderr in ``logs``."""

    def __init__(self, name: str, arguments: Sequence[str], logs: Path, *, cwd: Path | None = None,
                 clock: Clock | None = None, ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
                 reap_timeout_seconds: float = REAP_TIMEOUT_SECONDS,
                 stop_timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> None:
        self.name = name
        self.arguments = tuple(arguments)
        self.logs = logs
        self.cwd = cwd
        self.clock = clock or SystemClock()
        self.ready_timeout_seconds = ready_timeout_seconds
        self.reap_timeout_seconds = reap_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        self.process: asyncio.subprocess.Process | None = None
        #: How many times it was started (the current incarnation's number; 0 before the first).
        self.incarnation = 0
        #: When (on ``clock``) the current incarnation was spawned.
        self.spawned_at = 0.0
        #: Seconds from spawn to its "listening" line, for every incarnation that got there.
        self.start_seconds: list[float] = []

    def __repr__(self) -> str:
        return f"MillstreamProcess({self.name!r}, incarnation {self.incarnation})"

    def log_path(self) -> Path:
        """The current incarnation's log (the child's stderr)."""
        return self.logs / f"{self.name}-{self.incarnation}.log"

    def log_tail(self) -> str:
        """The end of the current incarnation's log, for a failure message."""
        try:
            return self.log_path().read_text(errors="replace")[-LOG_TAIL_CHARACTERS:]
        except FileNotFoundError:
            return "(no log)"

    async def spawn(self) -> asyncio.subprocess.Process:
        """Start the next incarnation (without waiting for it to listen)."""
        self.incarnation += 1
        self.spawned_at = self.clock.monotonic()
        with self.log_path().open("wb") as log:  # (the child keeps its own descriptor)
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from millstream.cli import main; main()", *self.arguments,
                cwd=self.cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self.process

    async def wait_ready(self, expected_prefix: str) -> str:
        """Wait (at most ``ready_timeout_seconds``) for the first line on stdout and return it; an
        ``AssertionError`` quoting the log if it does not come or does not start with
        ``expected_prefix``."""
        process = self.process
        assert process is not None and process.stdout is not None, f"{self!r} was not spawned"
        try:
            line = await asyncio.wait_for(process.stdout.readline(), self.ready_timeout_seconds)
        except TimeoutError:
            raise AssertionError(f"{self.name} ({self.incarnation}) did not listen within "
                                 f"{self.ready_timeout_seconds} s: {self.log_tail()}") from None
        text = line.decode(errors="replace")
        assert text.startswith(expected_prefix), (
            f"{self.name} ({self.incarnation}) said {line!r} (exit {process.returncode}), not "
            f"{expected_prefix!r}...: {self.log_tail()}")
        self.start_seconds.append(self.clock.monotonic() - self.spawned_at)
        return text

    async def start(self, expected_prefix: str) -> str:
        """``spawn``, then ``wait_ready``."""
        await self.spawn()
        return await self.wait_ready(expected_prefix)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def kill(self, *, must_be_running: bool = True) -> None:
        """SIGKILL the current incarnation and reap it, asserting that the kill ended it.  With
        ``must_be_running`` false, an incarnation that is gone already (never spawned, or reaped) is
        left alone."""
        process = self.process
        if not must_be_running and (process is None or process.returncode is not None):
            return
        assert process is not None and process.returncode is None, \
            f"{self.name} ({self.incarnation}) exited by itself: {self.log_tail()}"
        process.send_signal(signal.SIGKILL)  # by PID: this child and nothing else
        returncode = await asyncio.wait_for(process.wait(), self.reap_timeout_seconds)
        assert returncode == -signal.SIGKILL, (f"{self.name} ({self.incarnation}) exited by itself ({returncode}) "
                                               f"before the kill: {self.log_tail()}")

    async def terminate(self) -> None:
        """SIGTERM (a graceful stop), then SIGKILL if it does not stop in time; reaped either way."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout_seconds)
        except TimeoutError:
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), self.reap_timeout_seconds)
