"""Runs of real ``ContainerManager``s moving a container between simulated hosts are behaviours of
``spec/Cluster.tla`` (checked by TLC through ``spec/TraceCluster.tla``), and a seeded implementation bug
produces traces TLC rejects.

The runs are ``tests/trace/cluster_run.py``'s: three hosts, one container, a simulated coordination
layer (the run assigns; claims in memory: deterministic and seed-replayable, unlike a real ZooKeeper),
one shared simulated Tier 1 and Tier 2.  Sessions expire under running hosts (zombies that keep
serving and writing until fenced), the container is reassigned and fenced by the new owner's log
open, zombies' appends and flush records are refused, Tier-2 flushes and truncation run, hosts crash
and restart.

Default profile: 40 runs of 50 steps (over a thousand recorded spec steps besides the observations);
``MILLSTREAM_PROFILE=nightly``: 400 runs of 50 (over ten thousand).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from millstream.cluster._containers import ContainerManager
from millstream.testing.tracing import TraceEvent
from proofs.tlc import TlcOutcome
from tests.trace import cluster_run as driver
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

RUNS, STEPS = (400, 50) if DEEP else (40, 50)
ACTIONS = {"Assign", "Start", "ClientAppend", "QuorumCommit", "Acknowledge", "LogWriteFenced", "WriteChunk",
           "CommitFlush", "Truncate", "SessionExpires", "Reconnect", "Crash", "Restart", "Observe"}

TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
    Hosts <- TraceHosts
    Containers <- TraceContainers
    Replicas <- TraceReplicas
    MaxAppends <- TraceMaxAppends
    MaxCrashes <- TraceMaxCrashes
    MaxExpiries <- TraceMaxExpiries
    MaxReplicaLosses <- TraceMaxReplicaLosses
INVARIANTS
    TypeOK
    OneWriterPerEpoch
    FencedBeforeServing
    NoAcknowledgedAppendLost
    ReadersSeeOnlyDurable
    LayoutCoversStorage
"""


def trace_module(runs: Sequence[Sequence[TraceEvent]]) -> str:
    return trace_data_module(runs, {
        "TraceHosts": tla(set(driver.HOSTS)),
        "TraceContainer": tla(driver.CONTAINER),
        "TraceContainers": "{TraceContainer}",
        "TraceReplicas": "3",
        "TraceMaxAppends": str(most(runs, "ClientAppend")),
        "TraceMaxCrashes": str(most(runs, "Crash")),
        "TraceMaxExpiries": str(most(runs, "SessionExpires")),
        "TraceMaxReplicaLosses": "0",
    })


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    return check_trace(workdir, "TraceCluster", trace_module(runs), TRACE_CFG)


def test_cluster_runs_are_accepted(tmp_path: Path) -> None:
    done = driver.record_runs(range(RUNS), STEPS)
    runs = [run.trace for run in done]
    steps = recorded_steps(runs)
    assert steps >= (10_000 if DEEP else 1_000), f"only {steps} recorded steps besides the observations"
    assert {event.action for run in runs for event in run} >= ACTIONS
    assert fenced_flushes(runs) > 0, "no zombie's chunk write was recorded with its refused flush record"
    fenced_appends = sum(1 for run in runs for before, after in itertools.pairwise(run)
                         if before.action != "WriteChunk" and after.action == "LogWriteFenced")
    assert fenced_appends > 0, "no zombie's append was refused"
    cut = sum(1 for run in done if run.cut is not None)
    assert cut <= len(done) // 4, f"{cut} of {len(done)} runs were cut at a partial adoption"
    assert_accepted(check(runs, tmp_path), runs)


def test_serving_on_after_the_session_is_lost_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the implementation: a ``ContainerManager`` told that its host's session expired
    (``session_lost``) keeps its containers running, so a zombie that has learnt it may have lost its
    containers still serves them (the rule is to stop rather than risk two owners).  TLC refuses the
    run at the observation after that host's ``Reconnect`` (the spec's zombie stops every container)."""
    monkeypatch.setattr(ContainerManager, "session_lost", lambda self, error: None)
    for seed in range(RUNS):
        run = driver.record_runs(range(seed, seed + 1), STEPS)[0]
        reconnects = [index for index, event in enumerate(run.trace) if event.action == "Reconnect"
                      and run.trace[index + 1].fields["serving"] >= {event.fields["h"]}]
        if not reconnects:
            continue
        outcome = check([run.trace], tmp_path)
        assert outcome.returncode in (EXIT_DEADLOCK, EXIT_SAFETY), outcome.output[-4000:]
        assert "run = 1" in outcome.output, outcome.output[-4000:]
        # (the Observe right after the first such Reconnect is the step TLC cannot take)
        assert f"cursor = {reconnects[0] + 2}" in outcome.output, outcome.output[-4000:]
        return
    raise AssertionError("no host kept serving after its session was lost")
