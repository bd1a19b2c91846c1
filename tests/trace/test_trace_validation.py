"""Implementation traces are behaviours of ``spec/DurableLog.tla`` (checked by TLC), and a seeded
implementation bug produces traces TLC rejects."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from millstream.segmentstore.data_frame import ENTRY_HEADER_LENGTH, FRAME_HEADER_LENGTH
from millstream.segmentstore.metadata_transaction import ContainerMetadataUpdateTransaction
from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.trace.driver import FRAME_BYTES_MAX, file_log_run, machine_run, simulated_run
from tests.trace.tla_trace import TRACE_CFG, check_trace, trace_module

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
SIMULATED_RUNS = 200 if DEEP else 24
EXIT_DEADLOCK = 11


def check(traces: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    data = trace_module(traces, frame_capacity=FRAME_BYTES_MAX - FRAME_HEADER_LENGTH, entry_header=ENTRY_HEADER_LENGTH)
    return check_trace(workdir, "TraceDurableLog", data, TRACE_CFG)


def test_simulated_runs_with_faults_are_accepted(tmp_path: Path) -> None:
    traces = [simulated_run(seed) for seed in range(SIMULATED_RUNS)]
    actions = {event.action for trace in traces for event in trace}
    assert actions >= {"Submit", "Process", "SealFrame", "Persist", "Complete", "FailWrite", "Crash", "Recover"}
    outcome = check(traces, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    # Every recorded event is one step: the runs' states are all there.
    assert outcome.distinct is not None and outcome.distinct >= max(len(trace) for trace in traces)


def test_machine_runs_without_an_event_loop_are_accepted(tmp_path: Path) -> None:
    """The OperationProcessor machine driven directly -- its actions, without the asyncio executor."""
    traces = [machine_run(seed) for seed in range(SIMULATED_RUNS)]
    actions = {event.action for trace in traces for event in trace}
    assert actions >= {"Submit", "Process", "SealFrame", "Persist", "Complete", "FailWrite", "Crash", "Recover"}
    outcome = check(traces, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert outcome.distinct is not None and outcome.distinct >= max(len(trace) for trace in traces)


def test_file_log_runs_are_accepted(tmp_path: Path) -> None:
    traces = [file_log_run(tmp_path / f"log-{seed}", seed) for seed in range(3)]
    assert all(any(event.action == "Recover" for event in trace) for trace in traces)
    outcome = check(traces, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]


@pytest.mark.parametrize("run", [simulated_run, machine_run], ids=["executor", "machine"])
def test_a_seeded_bug_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  run: Callable[[int], list[TraceEvent]]) -> None:
    """The bug of mutant DurableLog_validate_against_committed, planted in the implementation:
    operations are validated against the committed metadata, ignoring frames still in flight."""
    validate = ContainerMetadataUpdateTransaction.pre_process

    def against_committed_only(self: ContainerMetadataUpdateTransaction, operation: object) -> None:
        committed = ContainerMetadataUpdateTransaction(self.metadata, None)
        committed.next_segment_id = self.next_segment_id
        validate(committed, operation)  # type: ignore[arg-type]

    monkeypatch.setattr(ContainerMetadataUpdateTransaction, "pre_process", against_committed_only)
    traces = [run(seed) for seed in range(SIMULATED_RUNS)]
    outcome = check(traces, tmp_path)
    assert outcome.returncode in (EXIT_DEADLOCK, 12), outcome.output[-4000:]
