"""Where a micro-batch's time goes, seen from inside the data source (opt-in, for measuring only).

Spark reports a micro-batch's parts from the driver JVM (``durationMs``: ``latestOffset``,
``queryPlanning``, ``addBatch``, ``commitOffsets``), but not which Python process ran what in them:
the source's planner, the tasks' Python workers, the driver's worker that builds the sink's writer
and the one that commits.  With ``MILLSTREAM_SPARK_TIMELINE`` naming a file in the driver's
environment -- Spark's Python workers inherit it -- every step of the source and the sink appends
one JSON line there when it ends (``span``): the step, its start (wall-clock seconds, comparable with
Spark's progress ``timestamp``), its duration, the process id, how old the process was at the
step's start (a young process is a Python worker Spark has just started, not one it reused), and
the step's own figures (batch id, rows, transactions).  ``summarize`` turns the lines into
per-step counts and medians, and says how many processes ran each step and how many of them were
started for it (``python -m millstream.spark._timeline FILE``).

Steps (one line each, when they end):

* the source's planner: ``source.latest_offset``, ``source.partitions``, ``source.commit``;
* a source task: ``source.read`` (the rows it gave);
* the driver's writer build (before each batch's tasks, and again for the commit): ``sink.writer``;
* a sink task: ``sink.write`` (rows; inside it ``sink.begin``, the transaction's begin, and
  ``sink.flush``, until its bytes are durable);
* the driver's commit: ``sink.commit`` (inside it ``sink.multi_commit``, the fenced commit, and
  ``sink.merge_wait``, until the store has merged the batch).

Off (the variable unset), a step costs one environment lookup.  Lines are short single writes to
a file opened for appending, so processes writing at once do not interleave within a line.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

__all__ = ["ENVIRONMENT_VARIABLE", "YOUNG_PROCESS_SECONDS", "Timeline", "current", "span", "summarize"]

#: The environment variable naming the file the steps are appended to (unset: nothing is recorded).
ENVIRONMENT_VARIABLE: Final = "MILLSTREAM_SPARK_TIMELINE"

#: A process this young at a step's start was started for the step (Python workers Spark reuses are
#: seconds to hours older; starting one and importing pyspark, pyarrow and millstream takes about a
#: second on a quiet machine, several under load).
YOUNG_PROCESS_SECONDS: Final = 30.0


def process_age_seconds() -> float | None:
    """How long this process has run (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            up_seconds = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return up_seconds - started_ticks / os.sysconf("SC_CLK_TCK")


class Timeline:
    """Records steps to ``path`` (None: records nothing).  ``now`` stamps a step's start (wall-clock
    seconds), ``monotonic`` measures its duration, ``age`` says how old the process is."""

    def __init__(self, path: Path | None, *, now: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 age: Callable[[], float | None] = process_age_seconds) -> None:
        self.path = path
        self._now = now
        self._monotonic = monotonic
        self._age = age

    @contextlib.contextmanager
    def span(self, step: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Time the ``with`` block as ``step``; the block may add figures to the dict it is given.
        Recorded when the block ends (with ``"failed": true`` if it raised)."""
        if self.path is None:
            yield fields
            return
        start, began, age = self._now(), self._monotonic(), self._age()
        failed = True
        try:
            yield fields
            failed = False
        finally:
            record = {"step": step, "start": round(start, 6),
                      "duration_ms": round(1000 * (self._monotonic() - began), 3),
                      "pid": os.getpid(), "process_age_seconds": None if age is None else round(age, 3),
                      **fields}
            if failed:
                record["failed"] = True
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps(record, default=str) + "\n")


_OFF: Final = Timeline(None)


def current() -> Timeline:
    """This process's timeline: recording to ``MILLSTREAM_SPARK_TIMELINE``'s file, or off."""
    path = os.environ.get(ENVIRONMENT_VARIABLE)
    return Timeline(Path(path)) if path else _OFF


def span(step: str, **fields: Any) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """``current().span(step, **fields)``."""
    return current().span(step, **fields)


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per step: how often it ran, the median and largest duration (ms), how many processes ran it
    and how many of those were started for it (younger than ``YOUNG_PROCESS_SECONDS`` the first time
    they ran it), and the sum of its ``rows``, if it counts rows."""
    by_step: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_step.setdefault(str(record["step"]), []).append(record)
    summary = {}
    for step, runs in sorted(by_step.items()):
        durations = [float(run["duration_ms"]) for run in runs]
        first_age: dict[int, float | None] = {}
        for run in sorted(runs, key=lambda run: float(run["start"])):
            first_age.setdefault(int(run["pid"]), run.get("process_age_seconds"))
        entry: dict[str, Any] = {
            "count": len(runs), "median_ms": statistics.median(durations), "max_ms": max(durations),
            "processes": len(first_age),
            "processes_started": sum(1 for age in first_age.values()
                                     if age is not None and age < YOUNG_PROCESS_SECONDS)}
        rows = [int(run["rows"]) for run in runs if "rows" in run]
        if rows:
            entry["rows"] = sum(rows)
        summary[step] = entry
    return summary


def main(arguments: list[str]) -> int:
    """``python -m millstream.spark._timeline FILE``: print ``summarize`` of FILE as JSON."""
    if len(arguments) != 1:
        sys.stderr.write("usage: python -m millstream.spark._timeline FILE\n")
        return 2
    with open(arguments[0], encoding="utf-8") as file:
        records = [json.loads(line) for line in file if line.strip()]
    sys.stdout.write(json.dumps(summarize(records), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
