"""Recorded scale + read runs are behaviours of ``spec/StreamOrdering.tla`` (checked by TLC through
``spec/TraceStreamOrdering.tla``), and a seeded implementation bug produces a trace TLC rejects.

The runs (``tests.trace.stream_scenarios``): a node with the controller, two stream-aware writers and
a reader group of up to three readers, driven by seeded random choices -- writes, manual splits and
merges, the auto-scaler on a manual clock, readers joining, reading, leaving, crashing (declared
offline, or by the others' timeout), checkpoints and resets to them -- then read to the end.  Every
step is read off the implementation (``tests.trace.stream_run``) and becomes one TLC step with the
values the implementation reported; TLC checks every invariant of the spec in every state and that
each run ends with everything read.

Default profile: 14 runs of 30 choices (over a thousand recorded steps; under a minute);
``MILLSTREAM_PROFILE=nightly``: 60 runs of 60.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from millstream.client import _reader_group as reader_group
from proofs.tlc import SPEC_DIR, TlcOutcome
from tests.trace.stream_scenarios import GRID, INITIAL_SPLITS, READERS, WRITERS, recorded_run
from tests.trace.stream_tla import TRACE_CFG_NAME, trace_module
from tests.trace.tla_trace import check_trace

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
RUNS = 60 if DEEP else 14
CHOICES = 60 if DEEP else 30
EXIT_INVARIANT, EXIT_DEADLOCK = 12, 11
#: Runs with the seeded bug: enough that some merge's successor is handed out early.
SEEDED_RUNS_MAX = 40


def check(runs: Sequence[Sequence[dict[str, Any]]], workdir: Path) -> TlcOutcome:
    data = trace_module(runs, writers=WRITERS, readers=READERS, grid=GRID, initial_splits=INITIAL_SPLITS)
    return check_trace(workdir, "TraceStreamOrdering", data, (SPEC_DIR / TRACE_CFG_NAME).read_text())


def test_recorded_scale_and_read_runs_are_accepted(tmp_path: Path) -> None:
    runs = [recorded_run(seed, CHOICES) for seed in range(RUNS)]
    for seed, run in enumerate(runs):
        assert run.diverged is None, f"run {seed} disagreed with the model: {run.diverged}"
    steps = sum(len(run.steps) for run in runs)
    assert steps >= 1_000, f"only {steps} recorded steps"
    actions = {step["a"] for run in runs for step in run.steps}
    # The runs exercise scaling (both ways round a seal), crashes, checkpoints and resets.
    assert actions >= {"CreateSuccessors", "SealPredecessors", "SegmentSealed", "AppendEvent", "AcquireSegment",
                       "ReadNextEvent", "SegmentCompleted", "CreateCheckpoint", "SurfaceCheckpoint",
                       "CheckpointReader", "ReaderOffline", "Reset"}, actions
    outcome = check([run.steps for run in runs], tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    # Every recorded step is one TLC step: one distinct state per step, plus each run's initial state.
    assert outcome.distinct == sum(len(run.steps) for run in runs) + len(runs), outcome.output[-2000:]


def test_a_seeded_bug_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of mutant "successor readable before all predecessors complete", planted in the
    implementation: when a reader completes a segment, every future successor becomes unassigned at
    once, whether or not its other predecessors have been read to their end."""
    completed = reader_group._TRANSITIONS[reader_group.SegmentCompleted]

    def too_early(state: reader_group.ReaderGroupState, update: Any) -> reader_group.ReaderGroupState:
        after = completed(state, update)
        if not after.future:
            return after
        unassigned = {**after.unassigned, **dict.fromkeys(after.future, 0)}
        return attrs.evolve(after, unassigned=reader_group._frozen(unassigned), future=reader_group._frozen({}),
                            completed=reader_group._frozen({}))

    monkeypatch.setitem(reader_group._TRANSITIONS, reader_group.SegmentCompleted, too_early)
    diverged = None
    for seed in range(SEEDED_RUNS_MAX):
        run = recorded_run(seed, CHOICES)
        if run.diverged is not None:
            diverged = run
            break
    assert diverged is not None, f"no run of {SEEDED_RUNS_MAX} met the seeded bug"
    outcome = check([diverged.steps], tmp_path)
    assert outcome.returncode in (EXIT_DEADLOCK, EXIT_INVARIANT), outcome.output[-4000:]
    # TLC stopped short of the end of the run: a step it could not take, or a state breaking an invariant.
    assert outcome.distinct is not None and outcome.distinct <= len(diverged.steps), outcome.output[-4000:]
