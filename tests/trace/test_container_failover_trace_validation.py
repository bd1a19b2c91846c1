"""Runs of real container owners on shared simulated tiers are behaviours of
``spec/ContainerFailover.tla`` (checked by TLC through ``spec/TraceContainerFailover.tla``), and a
seeded implementation bug produces traces TLC rejects.

The runs are ``tests/trace/container_failover_run.py``'s: up to three owners of one container take it
over from each other (fencing the previous one through the log's epoch), append one unit each time,
flush to Tier 2 (a fenced owner that does not know it yet too: its chunk write lands, its flush
record's log write fails), let the processor write checkpoints, truncate the log, crash; a new owner's
reconciliation adopts what an earlier owner wrote but never recorded (all of the unflushed tail, or a
prefix of it).  Seeded: the same runs every time.

Default profile: 30 runs of 60 steps (over a thousand recorded spec steps besides the observations);
``MILLSTREAM_PROFILE=nightly``: 300 runs of 60 (over ten thousand).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from millstream.segmentstore.storage_writer import StorageWriter
from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.trace import container_failover_run as driver
from tests.trace.tla_trace import check_trace, tla

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
RUNS, STEPS = (300, 60) if DEEP else (30, 60)
EXIT_SAFETY, EXIT_DEADLOCK = 12, 11
ACTIONS = {"Start", "ClientAppend", "LogWriteFenced", "WriteChunk", "CommitFlush", "Adopt", "Checkpoint",
           "Truncate", "Crash", "Observe"}

TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
    Owners <- TraceOwners
    MaxAppends <- TraceMaxAppends
    MaxEpoch <- TraceMaxEpoch
    MaxCrashes <- TraceMaxCrashes
    MaxCheckpoints <- TraceMaxCheckpoints
INVARIANTS
    TypeOK
    NoAcknowledgedAppendLost
    OneWriterPerEpoch
    CurrentOwnerAgreesWithRecovery
    TruncationKeepsUnflushed
    LayoutCoversStorage
"""


def count(run: Sequence[TraceEvent], action: str) -> int:
    return sum(1 for event in run if event.action == action)


def trace_module(runs: Sequence[Sequence[TraceEvent]]) -> str:
    records = [[{"a": event.action, **event.fields} for event in events] for events in runs]

    def most(action: str) -> int:
        return max((count(run, action) for run in runs), default=0)

    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceOwners == {tla(set(driver.OWNERS))}
TraceMaxAppends == {most("ClientAppend")}
TraceMaxEpoch == {most("Start")}
TraceMaxCrashes == {most("Crash")}
TraceMaxCheckpoints == {most("Checkpoint")}
Traces == {tla(records)}
====
"""


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    return check_trace(workdir, "TraceContainerFailover", trace_module(runs), TRACE_CFG)


def test_container_failover_runs_are_accepted(tmp_path: Path) -> None:
    done = driver.record_runs(range(RUNS), STEPS)
    assert not any(run.refused for run in done), "a recovery refused what the tiers held"
    adoptions = [whole for run in done for _, whole in run.adoptions]
    assert any(adoptions), "no new owner adopted the whole of an earlier owner's unrecorded write"
    assert not all(adoptions), "no new owner adopted a prefix of the unflushed tail only"
    runs = [run.trace for run in done]
    steps = sum(1 for run in runs for event in run if event.action != "Observe")
    assert steps >= (10_000 if DEEP else 1_000), f"only {steps} recorded steps besides the observations"
    assert {event.action for run in runs for event in run} >= ACTIONS
    fenced_flushes = sum(1 for run in runs for before, after in itertools.pairwise(run)
                         if before.action == "WriteChunk" and after.action == "LogWriteFenced")
    assert fenced_flushes > 0, "no fenced owner's chunk write was recorded"
    outcome = check(runs, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert outcome.distinct is not None and outcome.distinct >= max(len(run) for run in runs)


def test_truncating_before_the_flush_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of mutant ``ContainerFailover_truncate_before_flush``, planted in the implementation: the
    StorageWriter truncates the log at a checkpoint whether or not the bytes before it are in Tier 2.
    TLC refuses the run at that truncation (the spec's Truncate needs the checkpoint's length flushed)."""
    monkeypatch.setattr(StorageWriter, "_eligible", lambda self, candidate: True)
    for run in driver.record_runs(range(RUNS), STEPS):
        truncations = [index for index, event in enumerate(run.trace) if event.action == "Truncate"]
        if not truncations:
            continue
        outcome = check([run.trace], tmp_path)
        if outcome.returncode == 0:
            continue  # every truncation in this run happened to be safe
        assert outcome.returncode in (EXIT_DEADLOCK, EXIT_SAFETY), outcome.output[-4000:]
        assert "run = 1" in outcome.output, outcome.output[-4000:]
        rejected_at = next(index for index in truncations if f"cursor = {index + 1}" in outcome.output)
        assert run.trace[rejected_at].action == "Truncate"
        return
    raise AssertionError("no run truncated the log early")
