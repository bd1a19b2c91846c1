"""Runs of the real sink are behaviours of ``spec/ExactlyOnceSink.tla`` (checked by TLC through
``spec/TraceExactlyOnceSink.tla``), and a seeded implementation bug produces traces TLC rejects.

The runs (``sink_run.random_run``): Spark played in plain Python -- the offset and commit logs, a
driver that crashes at any step and restarts from them, tasks of both stream writer classes that die
before or after writing and are retried -- against a real node whose controller runs on a manual
clock, so leases lapse when a run says so.  Every recorded step is a spec action with the values the
implementation reported (the transaction a task began, the rows it wrote, the fenced multi-commit's
answer), and after every step an ``Observe`` compares what the store shows (statuses, the recorded
fence, what a reader reads) with the spec's state.

Default profile: 20 runs of up to 60 steps over 24 input events (over a thousand recorded events);
``MILLSTREAM_PROFILE=nightly``: over ten times as many.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from millstream.spark import _writer
from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.spark.sink_run import random_run
from tests.trace.tla_trace import check_trace, tla

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
RUNS, STEPS = (200, 150) if DEEP else (20, 60)
NUM_EVENTS, PARTITIONS, MAX_FAULTS = 24, 2, 3
EXIT_SAFETY, EXIT_DEADLOCK = 12, 11
#: Every spec action the runs must have exercised between them, and the observations.
ACTIONS = {"DriverStart", "PlanBatch", "TaskBegin", "TaskWrite", "TaskReport", "TaskCrash", "TaskRetry",
           "CommitBatch", "AbortBatch", "WriteCommitLog", "DriverCrash", "LeaseExpires", "Observe"}

TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
    NumEvents <- TraceNumEvents
    Partitions <- TracePartitions
    MaxFaults <- TraceMaxFaults
INVARIANTS
    TypeOK
    ExactlyOnce
    NothingVisibleUncommitted
    CheckpointAgreesWithStore
"""


def trace_module(runs: Sequence[Sequence[TraceEvent]], *, num_events: int, partitions: int, max_faults: int) -> str:
    """The ``TraceData`` module for ``TraceExactlyOnceSink`` holding ``runs``."""
    records = [[{"a": event.action, **event.fields} for event in events] for events in runs]
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceNumEvents == {num_events}
TracePartitions == {partitions}
TraceMaxFaults == {max_faults}
Traces == {tla(records)}
====
"""


def sink_run(seed: int) -> list[TraceEvent]:
    return random_run(seed, steps=STEPS, num_events=NUM_EVENTS, partitions=PARTITIONS, max_faults=MAX_FAULTS)


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    data = trace_module(runs, num_events=NUM_EVENTS, partitions=PARTITIONS, max_faults=MAX_FAULTS)
    return check_trace(workdir, "TraceExactlyOnceSink", data, TRACE_CFG)


def test_sink_runs_with_faults_are_accepted(tmp_path: Path) -> None:
    runs = [sink_run(seed) for seed in range(RUNS)]
    recorded = sum(len(run) for run in runs)
    assert recorded >= (10_000 if DEEP else 1_000), f"only {recorded} recorded events"
    assert {event.action for run in runs for event in run} >= ACTIONS
    outcomes = {event.fields["outcome"] for run in runs for event in run if event.action == "CommitBatch"}
    assert outcomes == {"committed", "already_committed", "rejected"}, outcomes
    outcome = check(runs, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    # Every recorded event is one step: the runs' states are all there.
    assert outcome.distinct is not None and outcome.distinct >= max(len(run) for run in runs)


def test_a_commit_without_the_fence_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of mutant ExactlyOnceSink_commit_without_fence, planted in the implementation: the
    stream writers' commit calls the store's multi-commit without the (query, batch) fence."""
    commit = _writer._SinkProtocol.commit

    def without_fence(self: Any, messages: Any, batch_id: int, *, fence: Any) -> None:
        commit(self, messages, batch_id, fence=None)

    monkeypatch.setattr(_writer._SinkProtocol, "commit", without_fence)
    runs = [sink_run(seed) for seed in range(2)]
    assert any(event.action == "CommitBatch" for run in runs for event in run), "the bug must get a chance"
    outcome = check(runs, tmp_path)
    assert outcome.returncode in (EXIT_DEADLOCK, EXIT_SAFETY), outcome.output[-4000:]
