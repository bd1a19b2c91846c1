"""The ExactlyOnceSink model beyond what the agreement proof shows: the scenarios the spec exists
for, the store's fenced multi-commit on its own, and invariants that do fail on bad states."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from millstream.model import exactly_once_sink as eos
from millstream.model.durable_log import NotEnabled

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _run_batch(state: eos.ExactlyOnceSinkState) -> eos.ExactlyOnceSinkState:
    """Every task of the running batch begins, writes and reports."""
    for p in state.partition_ids:
        state = eos.task_report(eos.task_write(eos.task_begin(state, p), p), p)
    return state


def _started(num_events: int = 4, partitions: int = 2) -> eos.ExactlyOnceSinkState:
    return eos.driver_start(eos.initial_state(num_events, partitions))


def test_every_spec_action_has_a_model_transition_of_the_same_name() -> None:
    actions = json.loads((SPEC / "manifest.json").read_text())["specs"]["ExactlyOnceSink"]["actions"]
    for action in actions:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()
        assert callable(getattr(eos, name, None)), f"{action} has no model transition {name}"
        assert name in eos.__all__


def test_a_batch_commits_its_rows_once_and_the_commit_log_follows() -> None:
    state = _run_batch(eos.plan_batch(_started(), 3))
    assert [state.rows(1, p) for p in (1, 2)] == [(1, 3), (2,)]
    state = eos.commit_batch(state)
    assert state.output == (1, 3, 2) and state.fence == 1 and state.commits == 0
    state = eos.write_commit_log(state)
    assert (state.commits, state.driver) == (1, eos.DriverPhase.IDLE)
    state.check_invariants()


def test_a_replay_after_the_store_committed_aborts_the_new_transactions() -> None:
    """The crash the fence exists for: after the sink commit, before commits/b."""
    state = eos.commit_batch(_run_batch(eos.plan_batch(_started(), 2)))
    state = eos.driver_crash(state)
    state = eos.driver_start(state)
    assert (state.driver, state.batch) == (eos.DriverPhase.RUNNING, 1), "the logged batch is re-run"
    state = _run_batch(state)
    replayed = state.listed
    assert replayed == (3, 4), "new tasks, new transactions"
    state = eos.commit_batch(state)
    assert state.output == (1, 2), "no duplicate"
    assert {state.transaction(t).status for t in replayed} == {eos.TransactionStatus.ABORTED}
    state = eos.write_commit_log(state)
    state.check_invariants()
    assert state.commits == 1 and not state.open_transactions


def test_without_the_fence_the_same_replay_duplicates() -> None:
    """What the public Pravega Spark connector does: commit whatever the tasks reported."""
    state = eos.commit_batch(_run_batch(eos.plan_batch(_started(), 2)))
    state = _run_batch(eos.driver_start(eos.driver_crash(state)))
    transactions, _, visible, outcome = eos.fenced_commit(state.transactions, 0, state.listed, state.batch)
    assert outcome is eos.CommitOutcome.COMMITTED and visible == (1, 2)
    duplicated = attrs.evolve(state, transactions=transactions, output=state.output + visible)
    with pytest.raises(AssertionError, match="ExactlyOnce"):
        duplicated.check_invariants()


def test_a_crashed_task_orphans_its_transaction_and_the_retry_commits_a_new_one() -> None:
    state = eos.plan_batch(_started(2, 1), 2)
    state = eos.task_write(eos.task_begin(state, 1), 1)
    state = eos.task_crash(state, 1)
    assert state.faults == 1 and state.open_transactions == {1}
    assert not state.held(1), "a dead attempt's transaction is an orphan: its expiry is no fault"
    state = eos.task_retry(state, 1)
    state = eos.commit_batch(_run_batch(state))
    assert state.output == (1, 2) and state.transaction(1).status is eos.TransactionStatus.OPEN
    state = eos.expire_transaction(state, 1)
    assert state.faults == 1 and not state.open_transactions
    state.check_invariants()


def test_a_lease_that_expires_under_a_live_task_is_a_fault_and_the_commit_is_rejected() -> None:
    state = _run_batch(eos.plan_batch(_started(2, 1), 2))
    assert state.held(1)
    state = eos.expire_transaction(state, 1)
    assert state.faults == 1
    state = eos.commit_batch(state)
    assert state.driver is eos.DriverPhase.ABORTING and state.output == () and state.fence == 0
    state = eos.abort_batch(state)
    assert state.driver is eos.DriverPhase.DOWN
    state = eos.driver_start(state)
    assert state.batch == 1, "the batch is re-run from the offset log"
    state = eos.write_commit_log(eos.commit_batch(_run_batch(state)))
    assert state.output == (1, 2)
    state.check_invariants()


def test_abort_lists_only_the_reported_transactions() -> None:
    state = eos.plan_batch(_started(2, 2), 2)
    state = eos.task_report(eos.task_write(eos.task_begin(state, 1), 1), 1)
    state = eos.task_crash(eos.task_begin(state, 2), 2)
    state = eos.abort_batch(state)
    assert state.transaction(1).status is eos.TransactionStatus.ABORTED
    assert state.transaction(2).status is eos.TransactionStatus.OPEN, "a failed task's slot is None"


def test_fenced_commit_outcomes() -> None:
    open_tx = eos.StoreTransaction(eos.TransactionStatus.OPEN, 2, (5,))
    gone = eos.StoreTransaction(eos.TransactionStatus.ABORTED, 2, (6,))
    assert eos.fenced_commit((open_tx, gone), 1, (1, 2), 2)[3] is eos.CommitOutcome.REJECTED
    assert eos.fenced_commit((open_tx, gone), 1, (1, 2), 2)[:3] == ((open_tx, gone), 1, ())
    transactions, fence, visible, outcome = eos.fenced_commit((open_tx,), 2, (1,), 2)
    assert outcome is eos.CommitOutcome.ALREADY_COMMITTED and fence == 2 and visible == ()
    assert transactions[0].status is eos.TransactionStatus.ABORTED
    transactions, fence, visible, outcome = eos.fenced_commit((open_tx,), 1, (1,), 2)
    assert (outcome, fence, visible) == (eos.CommitOutcome.COMMITTED, 2, (5,))


def test_disabled_actions_raise_not_enabled() -> None:
    state = eos.initial_state(2, 1)
    for action in (eos.commit_batch, eos.write_commit_log, eos.abort_batch, eos.driver_crash):
        with pytest.raises(NotEnabled):
            action(state)
    with pytest.raises(NotEnabled):
        eos.plan_batch(eos.driver_start(state), 3)
    with pytest.raises(NotEnabled):
        eos.task_begin(state, 1)
    with pytest.raises(NotEnabled):
        eos.expire_transaction(state, 1)


def test_invariants_reject_output_from_an_uncommitted_transaction() -> None:
    state = _run_batch(eos.plan_batch(_started(2, 1), 2))
    leaked = attrs.evolve(state, output=(1, 2), fence=1)
    with pytest.raises(AssertionError, match="NothingVisibleUncommitted"):
        leaked.check_invariants()
    ahead = attrs.evolve(eos.initial_state(2, 1), offsets=(2,), commits=1)   # commits/1 without a store commit
    with pytest.raises(AssertionError, match="CheckpointAgreesWithStore"):
        ahead.check_invariants()


def test_the_lifecycle_tables_are_exactly_what_the_state_graph_exercises() -> None:
    """Every driver, task and transaction transition of the CI configurations' state graphs is in
    the model's tables, and every table entry happens in some state graph."""
    from proofs import exactly_once_sink_agreement as agreement
    from proofs.explore import explore

    driver: set[tuple[eos.DriverPhase, eos.DriverPhase]] = set()
    task: set[tuple[eos.TaskPhase, eos.TaskPhase]] = set()
    transaction: set[tuple[eos.TransactionStatus, eos.TransactionStatus]] = set()
    for config in (agreement.Configuration(2, 2, 1), agreement.Configuration(2, 1, 2)):
        graph = explore(agreement.initial_states(config), lambda s, c=config: agreement.successors(c, s),
                        keep_edges=True)
        for before, after, label in graph.edges:
            assert isinstance(before, eos.ExactlyOnceSinkState) and isinstance(after, eos.ExactlyOnceSinkState)
            if before.driver is not after.driver:
                driver.add((before.driver, after.driver))
            if label.startswith("Task"):
                task.update((a.phase, b.phase) for a, b in zip(before.tasks, after.tasks, strict=True)
                            if a.phase is not b.phase)
            transaction.update((a.status, b.status) for a, b in zip(before.transactions, after.transactions,
                                                                    strict=False) if a.status is not b.status)

    def pairs(table: dict[Any, frozenset[Any]]) -> set[tuple[Any, Any]]:
        return {(a, b) for a, targets in table.items() for b in targets}

    assert driver == pairs(eos.DRIVER_TRANSITIONS)
    assert task == pairs(eos.TASK_TRANSITIONS)
    assert transaction == pairs(eos.TRANSACTION_TRANSITIONS)


def test_the_first_batch_and_rows_across_three_partitions() -> None:
    """A started driver runs no batch (batch 0, which ``TypeOK`` requires while no batch is logged),
    nor does a crashed one; the first batch may end at offset 1; with three partitions each gets every
    third event.  Kills the mutants starting or crashing the driver into batch -1 or 1, ``last_end`` 1
    on an empty offset log, and routing rows by ``(e + 1) % partitions`` (the same as ``e - 1`` for one
    or two partitions, which every other test uses)."""
    started = eos.driver_start(eos.initial_state(3, 3))
    assert started.batch == 0 and started.last_end == 0
    started.check_invariants()
    crashed = eos.driver_crash(started)
    assert crashed.batch == 0
    crashed.check_invariants()
    assert eos.plan_batch(started, 1).offsets == (1,)
    planned = eos.plan_batch(started, 3)
    assert [planned.rows(1, partition) for partition in (1, 2, 3)] == [(1,), (2,), (3,)]


def test_the_driver_commits_only_when_running_and_every_task_is_done() -> None:
    """``CommitBatch`` needs the driver running and every task done.  Kills ``... and all(...)`` ->
    ``... or all(...)`` in ``commit_batch``'s guard (a batch was committed with a task still writing)."""
    state = eos.plan_batch(_started(), 2)
    begun = eos.task_begin(state, 1)
    for not_ready in (state, begun, eos.task_write(begun, 1)):
        with pytest.raises(NotEnabled):
            eos.commit_batch(not_ready)
    done = _run_batch(state)
    assert eos.commit_batch(done).driver is eos.DriverPhase.COMMITTED
    with pytest.raises(NotEnabled):
        eos.commit_batch(eos.driver_crash(done))


def test_a_sink_may_start_with_no_events_but_not_fewer() -> None:
    """``Init`` takes any ``NumEvents >= 0`` (a query with nothing to write yet) and at least one
    partition.  Kills ``num_events < 0`` -> ``<= 0`` in ``initial_state`` (seed-2711 sample: an empty
    input was refused)."""
    empty = eos.initial_state(0, 1)
    assert empty.num_events == 0 and empty.last_end == 0
    empty.check_invariants()
    with pytest.raises(NotEnabled):
        eos.plan_batch(eos.driver_start(empty), 1)   # nothing to plan
    for num_events, partitions in ((-1, 1), (2, 0)):
        with pytest.raises(ValueError, match="need num_events >= 0 and partitions >= 1"):
            eos.initial_state(num_events, partitions)
