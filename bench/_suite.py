"""What the benchmark suites share: the CPU of a measured window, bounded calls, the standalone node
they measure, their progress, and the plumbing of their reports.

The suites (``streams``, ``transactions``, ``large_events``, ``tiering``, ``write_path``) each
measure something different, but around the measurement they do the same things, and this module is
the one place each of those things is written:

* **A measured window's CPU.**  ``CpuMeter`` reads the counters at the window's two ends: the
  machine's and this process's (``_system.CpuSample``) and those of the other processes the suite
  started (the server, a client process), by pid (``_processes.process_cpu_seconds``).  ``CpuSpan``
  is what was used in between.  *Others'* CPU is the machine's busy time minus ours -- this process
  and every watched one: on a shared machine it is the noise a report must show.  When a watched
  process's CPU cannot be read (it is gone), others' share is unknown (None), never a figure that
  silently counts our own server as noise.  ``Window`` is the record the client/server suites keep
  of it: this process (the client), the server, everybody else.
* **Bounded calls.**  ``bounded(awaitable)``: every call a suite makes to the store is bounded by
  ``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS``, so a wedged node fails the run instead of hanging it.
* **The node.**  ``standalone_server``: a ``millstream standalone`` node in a process of its own, as
  a user runs it (durable FileLog, the controller on the same port), data in the suite's temporary
  directory.
* **Progress.**  ``Steps`` counts a suite's measurements for the progress indicator.
* **Reports.**  ``Repeat`` (one repeat's measurements, found by scenario), ``fixed`` (a figure, or a
  dash where there is none), ``replace_section``/``section_of`` (a suite's own section of
  ``BENCHMARKS.md``, between its markers, the rest of the file left as it was) and ``write_json``
  (the raw results as ``<suite>-<UTC date>.json``).

Real time and the real machine are read directly (``time.perf_counter``, ``/proc``), as in
``_system``: measuring them is the point.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TypeVar

import attrs

from bench import limits as bench_limits
from bench._processes import STANDALONE_READY, ServerProcess, module_environment, process_cpu_seconds
from bench._system import CpuSample, CpuUsage
from millstream.errors import InternalError

__all__ = [
    "CpuMeter",
    "CpuSpan",
    "Progress",
    "Repeat",
    "Steps",
    "Window",
    "bounded",
    "fixed",
    "replace_section",
    "section_of",
    "standalone_server",
    "write_json",
]

#: Called before each step with (steps done, steps in all, what comes next), and once at the end.
Progress = Callable[[int, int, str], None]

#: What ``fixed`` writes for a figure that was not measured.
MISSING: Final = "—"

T = TypeVar("T")


# --- a measured window's CPU ----------------------------------------------------------------------------


@attrs.frozen
class _Reading:
    machine: CpuSample  # the machine's ticks and this process's CPU
    processes: tuple[float | None, ...]  # each watched process's CPU seconds; None if it could not be read


@attrs.frozen
class CpuSpan:
    """CPU used between a window's two ends: the machine's and this process's (``usage``) and each
    watched process's (``processes``, in the order the meter was given their pids; None where a
    process could not be read at either end)."""

    usage: CpuUsage
    processes: tuple[float | None, ...]

    @property
    def others_percent(self) -> float | None:
        """What every other process used, in percent of the whole machine: its busy time less this
        process's and every watched one's.  None if a watched process's CPU is unknown."""
        others = self.usage.others_cpu_seconds  # (everything but this process)
        for seconds in self.processes:
            if seconds is None:
                return None
            others -= seconds
        return 100.0 * max(0.0, others) / (self.usage.wall_seconds * (os.cpu_count() or 1))


@attrs.frozen
class Window:
    """CPU during one measured window: this process (the client), the server, everything else."""

    wall_seconds: float
    client_cpu_seconds: float
    server_cpu_seconds: float | None  # None: no server was watched, or it could not be read
    others_percent: float | None  # of the whole machine, server excluded

    @classmethod
    def of(cls, span: CpuSpan) -> Window:
        """The window of a span that watched the server, or nothing (a node in this process)."""
        if len(span.processes) > 1:
            raise InternalError(f"a window has one server, not {len(span.processes)} watched processes")
        server = span.processes[0] if span.processes else None
        return cls(span.usage.wall_seconds, span.usage.own_cpu_seconds, server, span.others_percent)


class CpuMeter:
    """Reads the CPU counters at the two ends of a measured window (``mark`` at each): the machine's,
    this process's, and those of the processes ``pids``."""

    __slots__ = ("_pids", "_readings")

    def __init__(self, *pids: int) -> None:
        self._pids = pids
        self._readings: list[_Reading] = []

    def mark(self) -> None:
        """Read the counters now: the window's start, then its end."""
        if len(self._readings) == 2:
            raise InternalError("a window has two ends; both were already marked")
        self._readings.append(_Reading(CpuSample.now(), tuple(process_cpu_seconds(pid) for pid in self._pids)))

    def span(self) -> CpuSpan:
        """What was used between the two marks."""
        if len(self._readings) != 2:
            raise InternalError(f"a window needs both ends marked, not {len(self._readings)}")
        start, end = self._readings
        processes = tuple(None if before is None or after is None else after - before
                          for before, after in zip(start.processes, end.processes, strict=True))
        return CpuSpan(CpuUsage.between(start.machine, end.machine), processes)

    def window(self) -> Window:
        """The span as a client/server ``Window`` (the meter watched the server, or nothing)."""
        return Window.of(self.span())

    def check_invariants(self) -> None:
        assert len(self._readings) <= 2, self._readings
        assert all(len(reading.processes) == len(self._pids) for reading in self._readings)
        assert all(a.machine.at_seconds <= b.machine.at_seconds for a, b in itertools.pairwise(self._readings))


# --- calls and the node ---------------------------------------------------------------------------------


async def bounded(awaitable: Awaitable[T]) -> T:
    """``await awaitable``, for at most ``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS`` (else ``TimeoutError``)."""
    return await asyncio.wait_for(awaitable, bench_limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS)


def standalone_server(workdir: Path) -> ServerProcess:
    """A ``millstream standalone`` node on a port of its own choosing (``.port`` once started), its data
    in ``workdir/data`` and its output in ``workdir/server.log`` (a context manager: started on entry,
    stopped on exit).  A port probed free and handed over could be taken by another process first."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "bench._serve", "standalone", "--data-dir", str(data),
               "--port", "0"]
    return ServerProcess("millstream", command, port=0, log_path=workdir / "server.log",
                         ready_pattern=STANDALONE_READY, environment=module_environment())


# --- progress -------------------------------------------------------------------------------------------


class Steps:
    """Counts a suite's measurements for the progress indicator (``progress`` None: nobody watches)."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self._progress = progress

    def next(self, label: str) -> None:
        """Say that ``label`` comes next."""
        if self._progress is not None:
            self._progress(min(self.done, self.total), self.total, label)
        self.done += 1

    def skip(self, count: int) -> None:
        """``count`` measurements will not run (their system is missing or did not start)."""
        self.done += count

    def finish(self) -> None:
        if self._progress is not None:
            self._progress(self.total, self.total, "done")


# --- reports --------------------------------------------------------------------------------------------


class _Measured(Protocol):
    @property
    def scenario(self) -> str: ...


M = TypeVar("M", bound=_Measured)


@attrs.frozen
class Repeat(Generic[M]):
    """One repeat of a suite: its measurements, in the order they ran."""

    measurements: list[M]

    def of(self, scenario: str) -> M:
        return next(m for m in self.measurements if m.scenario == scenario)


def fixed(value: float | None, digits: int) -> str:
    """``value`` with thousands separators and ``digits`` decimals, or a dash if it was not measured."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def replace_section(document: str, section: str, begin: str, end: str) -> str:
    """``document`` with its section between the markers ``begin`` and ``end`` replaced by ``section``,
    or with ``section`` appended (after a blank line) if it has none."""
    first, last = document.find(begin), document.find(end)
    if first >= 0 and last > first:
        return document[:first] + section.rstrip("\n") + document[last + len(end):]
    return (document.rstrip("\n") + "\n\n" if document.strip() else "") + section


def section_of(document: str, begin: str, end: str) -> str | None:
    """The section of ``document`` between ``begin`` and ``end`` (markers included), if it has one --
    for a writer of the rest of the file to keep it."""
    first, last = document.find(begin), document.find(end)
    return document[first:last + len(end)] + "\n" if first >= 0 and last > first else None


def write_json(report: Any, output_dir: Path) -> Path:
    """Write ``report`` (an attrs record with ``suite`` and ``machine.date_utc``) as
    ``<suite>-<UTC date>.json`` under ``output_dir``: every field, raw per-repeat results included."""
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.machine.date_utc.replace(":", "").replace("-", "")
    path = output_dir / f"{report.suite}-{stamp}.json"
    path.write_text(json.dumps(attrs.asdict(report), indent=2, default=str) + "\n")
    return path
