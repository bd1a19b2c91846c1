"""Turning the steps ``StreamRun`` observed into a ``TraceData`` module for ``spec/TraceStreamOrdering.tla``.

Steps are the records ``stream_run`` emits (``{"a": <spec action>, ...}``); each becomes a TLA+ record
with the same fields.  Maps from segment ids (a checkpoint's cut, the positions a reader recorded, a
crashed reader's segments, a completed segment's successors with their predecessors) are written as
sets of pairs, which the trace spec compares with ``Pairs(f)``; scale ranges as sequences of
``<<lo, hi>>``.  The payload a read returned is left out (the spec's events carry none; the writer,
number and key it carries are in the step).  The constants are the runs' own: their writers, readers,
grid and initial boundaries, and bounds that are the most any run used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.trace.tla_trace import tla

__all__ = ["TRACE_CFG_NAME", "trace_module"]

TRACE_CFG_NAME = "TraceStreamOrdering.cfg"

_MAPS = ("cut", "positions")


def _record(step: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for field, value in step.items():
        if field == "payload":
            continue
        if field in _MAPS:
            record[field] = {(segment, offset) for segment, offset in value.items()}
        elif field == "succs":
            record[field] = {(successor, frozenset(predecessors)) for successor, predecessors in value.items()}
        elif field == "ranges":
            record[field] = [tuple(r) for r in value]
        else:
            record[field] = value
    return record


def _count(run: Sequence[dict[str, Any]], action: str) -> int:
    return sum(1 for step in run if step["a"] == action)


def trace_module(runs: Sequence[Sequence[dict[str, Any]]], *, writers: Sequence[str], readers: Sequence[str],
                 grid: int, initial_splits: Sequence[int]) -> str:
    """The ``TraceData`` module holding ``runs`` (each a list of steps)."""
    if not runs:
        raise ValueError("no runs to validate")
    events = max((sum(1 for s in run if s["a"] == "WriteEvent" and s["w"] == w) for run in runs for w in writers),
                 default=0)
    bounds = {name: max(_count(run, action) for run in runs) for name, action in (
        ("TraceMaxScales", "CreateSuccessors"), ("TraceMaxCheckpoints", "CreateCheckpoint"),
        ("TraceMaxCrashes", "ReaderOffline"), ("TraceMaxResets", "Reset"))}
    body = ",\n".join(tla([_record(step) for step in run]) for run in runs)
    constants = "\n".join(f"{name} == {value}" for name, value in bounds.items())
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceWriters == {tla(set(writers))}
TraceReaders == {tla(set(readers))}
TraceInitialReaders == {{}}
TraceGrid == {grid}
TraceKeys == 0..{grid - 1}
TraceInitialSplits == {tla(set(initial_splits))}
TraceEventsPerWriter == {events}
{constants}
Traces == <<{body}>>
====
"""
