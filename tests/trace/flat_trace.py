"""Shared by the trace validations whose recorded events are already the spec's actions, each with
its fields as the spec's record has them (``Cluster.tla``'s and ``ContainerFailover.tla``'s): the
``TraceData`` module TLC reads, the counts their tests assert on, and TLC's verdict on them.

Each test keeps its own configuration (constants, invariants), its own driver, and what it asserts
about its runs; this holds only what they did alike."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.trace.tla_trace import tla

__all__ = ["DEEP", "EXIT_DEADLOCK", "EXIT_SAFETY", "assert_accepted", "count", "fenced_flushes", "most",
           "recorded_steps", "trace_data_module"]

#: ``MILLSTREAM_PROFILE=nightly``: ten times the runs.
DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
#: TLC's exit codes for a violated invariant and for a state with no successor (a trace step the spec
#: cannot take).
EXIT_SAFETY, EXIT_DEADLOCK = 12, 11

Run = Sequence[TraceEvent]


def count(run: Run, action: str) -> int:
    """How many of ``run``'s events are ``action``."""
    return sum(1 for event in run if event.action == action)


def most(runs: Sequence[Run], action: str) -> int:
    """The largest number of ``action`` events in any one run (a bound the trace spec's constants need)."""
    return max((count(run, action) for run in runs), default=0)


def recorded_steps(runs: Sequence[Run]) -> int:
    """Spec steps recorded besides the observations."""
    return sum(1 for run in runs for event in run if event.action != "Observe")


def fenced_flushes(runs: Sequence[Run]) -> int:
    """Chunk writes whose flush record the log then refused (a fenced owner's write that landed)."""
    return sum(1 for run in runs for before, after in itertools.pairwise(run)
               if before.action == "WriteChunk" and after.action == "LogWriteFenced")


def trace_data_module(runs: Sequence[Run], definitions: Mapping[str, str]) -> str:
    """The ``TraceData`` module: ``definitions`` (name -> TLA+ expression, in order), then ``Traces``,
    each run a sequence of records ``[a |-> action, field |-> value, ...]``."""
    records = [[{"a": event.action, **event.fields} for event in events] for events in runs]
    lines = "".join(f"{name} == {expression}\n" for name, expression in definitions.items())
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
{lines}Traces == {tla(records)}
====
"""


def assert_accepted(outcome: TlcOutcome, runs: Sequence[Run]) -> None:
    """TLC accepted every run, exploring at least as many states as the longest run has steps."""
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert outcome.distinct is not None and outcome.distinct >= max(len(run) for run in runs)
