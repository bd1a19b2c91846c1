"""Runs of the real controller and client with stream transactions are behaviours of
``spec/Transactions.tla`` (checked by TLC through ``spec/TraceTransactions.tla``), and seeded
implementation bugs produce traces TLC rejects.

The runs (``transaction_driver``): begins, writes, pings, commits and aborts from a real client over
TCP; leases lapsing on a manual clock; scales under open transactions, so commits roll; a plain
writer; fenced multi-commits of Spark-like batches (replays, retries, two at once); and the
controller dying at a seeded store change -- in the middle of a commit, a roll, an abort, a fenced
multi-commit -- and a new one finishing the work.  ``Observe`` steps compare the store's contents
(every segment of every epoch, event by event) with the spec's state along the way.

Default profile: 17 runs (over a thousand recorded spec steps besides the observations; under a
minute); ``MILLSTREAM_PROFILE=nightly``: 60 longer ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from millstream.controller import _state, _transaction_workflows, _transactions
from millstream.controller._transactions import TransactionRecord, TxnStatus
from millstream.testing.tracing import TraceEvent
from proofs.tlc import SPEC_DIR, TlcOutcome
from tests.trace.tla_trace import check_trace
from tests.trace.transaction_driver import RunShape, transaction_run
from tests.trace.transaction_trace import TRACE_CFG_NAME, trace_module, trace_steps

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
RUNS = 60 if DEEP else 17
SHAPE = RunShape(steps=90, txns=8, txn_events=4, plain_events=6, ticks=10, scales=3, crashes=3) if DEEP \
    else RunShape()
#: The planted bugs: TLC gets the first runs (of at most so many seeds) in which the bug made a difference.
MUTANT_RUNS = 3 if DEEP else 1
MUTANT_SEEDS_MAX = 200 if DEEP else 40
EXIT_SAFETY, EXIT_DEADLOCK = 12, 11
#: Every spec action the default runs must have exercised between them (the point of the runs).
ACTIONS = {"Begin", "WriteEvent", "Ping", "Tick", "ExpireLease", "Commit", "Abort", "FinishAbort", "StartCommit",
           "MergeTxnSegment", "FinishCommit", "Scale", "WritePlainEvent", "CrashController", "RestartController",
           "RequestFencedCommit", "DecideFencedCommit", "Observe"}


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    return check_trace(workdir, "TraceTransactions", trace_module(runs), (SPEC_DIR / TRACE_CFG_NAME).read_text())


def steps_of(workdir: Path) -> set[str]:
    text = (workdir / "TraceData.tla").read_text()
    return {action for action in ACTIONS | {"ReadFence"} if f'a |-> "{action}"' in text}


def test_runs_with_crashes_scales_leases_and_fences_are_accepted(tmp_path: Path) -> None:
    runs = [transaction_run(seed, SHAPE) for seed in range(RUNS)]
    steps = sum(1 for run in runs for step in trace_steps(run) if step["a"] != "Observe")
    assert steps >= 1_000, f"only {steps} recorded steps besides the observations"
    outcome = check(runs, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert steps_of(tmp_path) >= ACTIONS, ACTIONS - steps_of(tmp_path)
    # Every recorded step is a state of its run: TLC followed each run to its end.
    assert outcome.distinct is not None and outcome.distinct >= max(len(run) for run in runs)
    assert any(listed_out_of_begin_order(run) for run in runs), "no fenced multi-commit listed its transactions " \
        "in another order than they began and committed them"
    assert any(e.action == "DecideFencedCommit" and e.fields["outcome"] == "already_committed"
               for run in runs for e in run), "no replayed or retried batch was answered \"already committed\""
    assert any(r["type"] == "commit_started" and r["roll"] for run in runs for r in records(run)), \
        "no transaction committed after a scale (rolled)"
    crashed_mid_commit = [run for run in runs if any(
        e.action == "CrashController" and e.fields["at"].startswith(("merge", "seal", "create")) for e in run)]
    assert crashed_mid_commit, "no run had its controller die in the middle of a workflow"


def listed_out_of_begin_order(run: Sequence[TraceEvent]) -> bool:
    """Whether a fenced multi-commit of ``run`` that committed listed its transactions in another order
    than they began (the controller must give them commit orders as they began)."""
    begun = [e.fields["record"]["txn"] for e in run
             if e.action == "Record" and e.fields["record"]["type"] == "txn_created"]
    listed = {e.fields["request"]: e.fields["txns"] for e in run if e.action == "RequestFencedCommit"}
    return any(e.action == "DecideFencedCommit" and e.fields["outcome"] == "committed"
               and listed[e.fields["request"]] != sorted(listed[e.fields["request"]], key=begun.index) for e in run)


def rejected_step(outcome: TlcOutcome, runs: Sequence[Sequence[TraceEvent]]) -> str:
    """The action of the recorded step TLC could not take (a deadlock's last state names ``run`` and
    ``cursor``), or the invariant it found violated."""
    if outcome.returncode == EXIT_SAFETY and outcome.violated:
        return f"invariant {outcome.violated}"
    assert outcome.returncode == EXIT_DEADLOCK, outcome.output[-4000:]
    run = [int(m) for m in re.findall(r"/\\ run = (\d+)", outcome.output)]
    cursor = [int(m) for m in re.findall(r"/\\ cursor = (\d+)", outcome.output)]
    assert run and cursor, outcome.output[-4000:]
    return str(trace_steps(runs[run[-1] - 1])[cursor[-1] - 1]["a"])


def runs_where(bug_shows: Callable[[Sequence[TraceEvent]], bool]) -> list[list[TraceEvent]]:
    """The first ``MUTANT_RUNS`` seeded runs in which the planted bug made a difference (TLC gets only
    those: it stops at the first step it cannot take, and fewer runs cost it less)."""
    found = []
    for seed in range(MUTANT_SEEDS_MAX):
        run = transaction_run(seed, SHAPE)
        if bug_shows(run):
            found.append(run)
            if len(found) == MUTANT_RUNS:
                break
    assert found, f"the planted bug made no difference in {MUTANT_SEEDS_MAX} runs"
    return found


def records(run: Sequence[TraceEvent]) -> Iterator[dict[str, Any]]:
    return (e.fields["record"] for e in run if e.action == "Record")


def started_out_of_commit_order(run: Sequence[TraceEvent], *, as_begun: bool = False) -> bool:
    """Whether a commit of ``run`` started while a committing transaction with a lower commit order
    waited -- the orders as ``txns_committing`` records hand them out, or (``as_begun``) as the spec
    does: those of one record in the order the transactions began."""
    orders: dict[str, int] = {}
    committing: set[str] = set()
    begun: list[str] = []
    for record in records(run):
        if record["type"] == "txn_created":
            begun.append(record["txn"])
        elif record["type"] == "txns_committing":
            for txn in sorted(record["txns"], key=begun.index) if as_begun else record["txns"]:
                orders[txn] = len(orders) + 1
                committing.add(txn)
        elif record["type"] == "commit_started" and record["txn"] != min(committing, key=orders.__getitem__):
            return True
        elif record["type"] == "commit_completed":
            committing.discard(record["txn"])
    return False


def committed_a_replay(run: Sequence[TraceEvent]) -> bool:
    """Whether a fenced multi-commit of ``run`` committed with a value not above the recorded one."""
    values = {e.fields["request"]: e.fields["value"] for e in run if e.action == "RequestFencedCommit"}
    return any(e.action == "DecideFencedCommit" and e.fields["outcome"] == "committed"
               and values[e.fields["request"]] <= e.fields["seen"] for e in run)


def test_merging_out_of_commit_order_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of mutant Transactions_merge_out_of_commit_order, planted in the implementation: the
    commit workflow takes the committing transactions by id instead of by commit order (everywhere,
    so the controller's own checks agree with it)."""
    def by_id(transactions: dict[str, TransactionRecord]) -> list[TransactionRecord]:
        return sorted((r for r in transactions.values() if r.status is TxnStatus.COMMITTING),
                      key=lambda r: r.txn_id, reverse=True)

    for module in (_transactions, _transaction_workflows, _state):
        monkeypatch.setattr(module, "commit_queue", by_id)
    runs = runs_where(started_out_of_commit_order)
    assert rejected_step(check(runs, tmp_path), runs) == "StartCommit"


def test_a_multi_commit_ordered_as_listed_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug the stateful test found (fixed in the controller): a fenced multi-commit giving its
    transactions commit orders in the order the caller listed them, not the order they began."""
    decide = _transactions.decide_fenced_commit

    def as_listed(**arguments: Any) -> _transactions.FenceDecision:
        decision = decide(**arguments)
        if decision.record is None or decision.record["type"] != "txns_committing":
            return decision
        return attrs.evolve(decision, record={**decision.record, "txns": list(arguments["txn_ids"])})

    monkeypatch.setattr(_transaction_workflows, "decide_fenced_commit", as_listed)
    runs = runs_where(lambda run: started_out_of_commit_order(run, as_begun=True))
    assert rejected_step(check(runs, tmp_path), runs) == "StartCommit"


def test_a_fence_check_that_ignores_the_recorded_value_is_rejected(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A fenced multi-commit decided as if no value were recorded: a replayed batch commits again."""
    decide = _transactions.decide_fenced_commit

    def forgetful(**arguments: Any) -> _transactions.FenceDecision:
        return decide(**{**arguments, "fences": {}})

    monkeypatch.setattr(_transaction_workflows, "decide_fenced_commit", forgetful)
    monkeypatch.setitem(_state._APPLY, "txns_committing", _recording_without_check)
    runs = runs_where(committed_a_replay)
    assert rejected_step(check(runs, tmp_path), runs) == "DecideFencedCommit"


def _recording_without_check(state: _state.ControllerState, record: dict[str, Any]) -> None:
    """``_txns_committing`` without its "the fence only grows" check, so the planted bug is not
    caught by the controller itself (only by the spec)."""
    stream = state._stream(record)
    for txn_id in record["txns"]:
        transaction = state._transaction(stream, txn_id, "txns_committing")
        transaction.advance("txns_committing")
        transaction.order = stream.next_commit_order
        stream.next_commit_order += 1
    if record.get("fence") is not None:
        key, value = record["fence"]
        stream.fences[key] = max(int(value), stream.fences.get(key, 0))
