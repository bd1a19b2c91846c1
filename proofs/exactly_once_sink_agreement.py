"""The Python model of ``ExactlyOnceSink`` set up exactly as a TLC configuration sets up the spec."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import exactly_once_sink as eos
from proofs.tla_values import record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "NumEvents, Partitions, MaxFaults"


@dataclass(frozen=True)
class Configuration:
    num_events: int
    partitions: int
    max_faults: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        num_events, partitions, max_faults = printed
        return cls(num_events, partitions, max_faults)


def initial_states(config: Configuration) -> list[eos.ExactlyOnceSinkState]:
    return [eos.initial_state(config.num_events, config.partitions)]


def successors(config: Configuration, state: eos.ExactlyOnceSinkState) -> Iterator[
        tuple[str, eos.ExactlyOnceSinkState]]:
    """Every enabled instance of ``Next``, in its order; the fault bound is the explorer's."""
    running = state.driver is eos.DriverPhase.RUNNING
    faults_left = state.faults < config.max_faults
    if state.driver is eos.DriverPhase.DOWN:
        yield "DriverStart", eos.driver_start(state)
    if state.driver is eos.DriverPhase.IDLE:
        for end in range(state.last_end + 1, config.num_events + 1):
            yield "PlanBatch", eos.plan_batch(state, end)
    for partition in state.partition_ids:
        phase = state.task(partition).phase
        if running and phase is eos.TaskPhase.IDLE:
            yield "TaskBegin", eos.task_begin(state, partition)
        if running and phase is eos.TaskPhase.BEGUN:
            yield "TaskWrite", eos.task_write(state, partition)
        if running and phase is eos.TaskPhase.WRITTEN:
            yield "TaskReport", eos.task_report(state, partition)
        if running and phase in (eos.TaskPhase.BEGUN, eos.TaskPhase.WRITTEN) and faults_left:
            yield "TaskCrash", eos.task_crash(state, partition)
        if running and phase is eos.TaskPhase.FAILED:
            yield "TaskRetry", eos.task_retry(state, partition)
    if state.job_failed:
        yield "AbortBatch", eos.abort_batch(state)
    if running and all(a.phase is eos.TaskPhase.DONE for a in state.tasks):
        yield "CommitBatch", eos.commit_batch(state)
    if state.driver is eos.DriverPhase.COMMITTED:
        yield "WriteCommitLog", eos.write_commit_log(state)
    if state.driver is not eos.DriverPhase.DOWN and faults_left:
        yield "DriverCrash", eos.driver_crash(state)
    for txn in sorted(state.open_transactions):
        if faults_left or not state.held(txn):
            yield "ExpireTransaction", eos.expire_transaction(state, txn)


def check(state: eos.ExactlyOnceSinkState) -> None:
    eos.check_invariants(state)


def project(config: Configuration, state: eos.ExactlyOnceSinkState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    return {
        "offsets": state.offsets,
        "commits": state.commits,
        "driver": state.driver.value,
        "batch": state.batch,
        "tasks": tuple(record(phase=a.phase.value, txn=a.txn) for a in state.tasks),
        "txns": tuple(record(status=tx.status.value, batch=tx.batch, rows=tx.rows) for tx in state.transactions),
        "fence": state.fence,
        "output": state.output,
        "faults": state.faults,
    }
