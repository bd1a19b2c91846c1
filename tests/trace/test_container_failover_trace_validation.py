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

from collections.abc import Sequence
from pathlib import Path

import pytest

from millstream.segmentstore.storage_writer import StorageWriter
from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.trace import container_failover_run as driver
from tests.trace.flat_trace import (
    DEEP,
    EXIT_DEADLOCK,
    EXIT_SAFETY,
    assert_accepted,
    fenced_flushes,
    most,
    recorded_steps,
    trace_data_module,
)
from tests.trace.tla_trace import check_trace, tla

RUNS, STEPS = (300, 60) if DEEP else (30, 60)
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


def trace_module(runs: Sequence[Sequence[TraceEvent]]) -> str:
    return trace_data_module(runs, {
        "TraceOwners": tla(set(driver.OWNERS)),
        "TraceMaxAppends": str(most(runs, "ClientAppend")),
        "TraceMaxEpoch": str(most(runs, "Start")),
        "TraceMaxCrashes": str(most(runs, "Crash")),
        "TraceMaxCheckpoints": str(most(runs, "Checkpoint")),
    })


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    return check_trace(workdir, "TraceContainerFailover", trace_module(runs), TRACE_CFG)


def test_container_failover_runs_are_accepted(tmp_path: Path) -> None:
    done = driver.record_runs(range(RUNS), STEPS)
    assert not any(run.refused for run in done), "a recovery refused what the tiers held"
    adoptions = [whole for run in done for _, whole in run.adoptions]
    assert any(adoptions), "no new owner adopted the whole of an earlier owner's unrecorded write"
    assert not all(adoptions), "no new owner adopted a prefix of the unflushed tail only"
    runs = [run.trace for run in done]
    steps = recorded_steps(runs)
    assert steps >= (10_000 if DEEP else 1_000), f"only {steps} recorded steps besides the observations"
    assert {event.action for run in runs for event in run} >= ACTIONS
    assert fenced_flushes(runs) > 0, "no fenced owner's chunk write was recorded"
    assert_accepted(check(runs, tmp_path), runs)


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
