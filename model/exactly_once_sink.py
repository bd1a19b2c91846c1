"""Spark's micro-batch two-phase commit into a millstream stream: ``spec/ExactlyOnceSink.tla`` in Python.

Every spec action is a function of the same name (``DriverStart`` -> ``driver_start``, ``PlanBatch``
-> ``plan_batch``, ``TaskBegin`` -> ``task_begin``, ...) taking a state and the action's parameters
(a partition, an end offset, a transaction id) and returning the next state; the state's fields are
the spec's variables.  A guard that is protocol behaviour raises ``NotEnabled``; the spec's bound on
the environment (``MaxFaults``: driver crashes, task crashes and premature lease expiries) is
applied by the explorer in ``proofs/`` -- the model counts faults, it does not limit them.

Theory of operation.  Spark plans batch ``b`` by writing its end offset to the offset log
(``offsets/b``) before anything runs.  Each task begins one store transaction, writes its rows into
it (``MillstreamStreamWriter.write``) and reports a commit message: (transaction id, query id,
batch id).  With every message in, the driver calls the store's fenced multi-commit
(``Controller.commit_transactions(stream, ids, fence=(query id, b))``, modelled by
``fenced_commit``): atomically, if the fence recorded for the query is below ``b`` every listed
transaction commits and ``b`` is recorded, else every listed transaction is aborted and the answer
is "already committed"; a listed transaction that is no longer open makes the store reject the
call and change nothing.  Then Spark writes ``commits/b``.  A restart re-runs a batch whose
``offsets/b`` has no ``commits/b`` with the same id and offsets -- in new tasks, with new
transactions -- and the fence turns a second commit of the same batch into an abort.  Transactions
of tasks that died (or died with the driver) are never listed; their leases expire.

Batch ids start at 1, as in the spec (Spark's start at 0); one query, so the fence is one number.
The output row of input event ``e`` is ``e``.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from millstream.model.durable_log import NotEnabled

__all__ = [
    "CommitOutcome",
    "DriverPhase",
    "ExactlyOnceSinkState",
    "StoreTransaction",
    "TaskAttempt",
    "TaskPhase",
    "TransactionStatus",
    "abort_batch",
    "check_invariants",
    "commit_batch",
    "driver_crash",
    "driver_start",
    "expire_transaction",
    "fenced_commit",
    "initial_state",
    "plan_batch",
    "task_begin",
    "task_crash",
    "task_report",
    "task_retry",
    "task_write",
    "write_commit_log",
]


class DriverPhase(enum.Enum):
    """The driver's phase (the spec's ``driver``)."""

    DOWN = "down"
    IDLE = "idle"                # ready to plan the next batch
    RUNNING = "running"          # the batch's tasks run
    COMMITTED = "committed"      # the sink commit returned; commits/b not yet written
    ABORTING = "aborting"        # the store rejected the commit; the job fails

    def __repr__(self) -> str:
        return f"DriverPhase.{self.name}"


class TaskPhase(enum.Enum):
    """A task attempt's phase, per partition."""

    IDLE = "idle"                # no attempt running yet
    BEGUN = "begun"              # its store transaction is open
    WRITTEN = "written"          # its rows are in the transaction, flushed
    DONE = "done"                # its commit message reached the driver
    FAILED = "failed"            # it died; its transaction is orphaned

    def __repr__(self) -> str:
        return f"TaskPhase.{self.name}"


class TransactionStatus(enum.Enum):
    """A sink task's stream transaction: open, committed or aborted."""

    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"

    def __repr__(self) -> str:
        return f"TransactionStatus.{self.name}"


class CommitOutcome(enum.Enum):
    """What the fenced multi-commit answers."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"   # the fence was at or above the batch: all aborted
    REJECTED = "rejected"                     # a listed transaction was not open: nothing changed

    def __repr__(self) -> str:
        return f"CommitOutcome.{self.name}"


#: Which driver phases each driver action may leave from (the lifecycle as a table).
DRIVER_TRANSITIONS: dict[DriverPhase, frozenset[DriverPhase]] = {
    DriverPhase.DOWN: frozenset({DriverPhase.IDLE, DriverPhase.RUNNING}),
    DriverPhase.IDLE: frozenset({DriverPhase.RUNNING, DriverPhase.DOWN}),
    DriverPhase.RUNNING: frozenset({DriverPhase.COMMITTED, DriverPhase.ABORTING, DriverPhase.DOWN}),
    DriverPhase.COMMITTED: frozenset({DriverPhase.IDLE, DriverPhase.DOWN}),
    DriverPhase.ABORTING: frozenset({DriverPhase.DOWN}),
}

#: A task attempt's lifecycle.
TASK_TRANSITIONS: dict[TaskPhase, frozenset[TaskPhase]] = {
    TaskPhase.IDLE: frozenset({TaskPhase.BEGUN}),
    TaskPhase.BEGUN: frozenset({TaskPhase.WRITTEN, TaskPhase.FAILED}),
    TaskPhase.WRITTEN: frozenset({TaskPhase.DONE, TaskPhase.FAILED}),
    TaskPhase.DONE: frozenset(),
    TaskPhase.FAILED: frozenset({TaskPhase.IDLE}),
}

#: A store transaction's lifecycle: it ends once, committed or aborted.
TRANSACTION_TRANSITIONS: dict[TransactionStatus, frozenset[TransactionStatus]] = {
    TransactionStatus.OPEN: frozenset({TransactionStatus.COMMITTED, TransactionStatus.ABORTED}),
    TransactionStatus.COMMITTED: frozenset(),
    TransactionStatus.ABORTED: frozenset(),
}


@attrs.frozen
class TaskAttempt:
    """The current attempt of one partition's task; ``txn`` is 0 before it begins one."""

    phase: TaskPhase = TaskPhase.IDLE
    txn: int = 0


IDLE_TASK = TaskAttempt()


@attrs.frozen
class StoreTransaction:
    """A store (stream) transaction: the batch its task wrote for, and the rows written into it."""

    status: TransactionStatus
    batch: int
    rows: tuple[int, ...] = ()


def _task_phase(attempt: TaskAttempt, phase: TaskPhase, txn: int | None = None) -> TaskAttempt:
    assert phase in TASK_TRANSITIONS[attempt.phase], f"task {attempt.phase} -> {phase}"
    return TaskAttempt(phase, attempt.txn if txn is None else txn)


def _ended(transaction: StoreTransaction, status: TransactionStatus) -> StoreTransaction:
    assert status in TRANSACTION_TRANSITIONS[transaction.status], f"transaction {transaction.status} -> {status}"
    return attrs.evolve(transaction, status=status)


@attrs.frozen(cache_hash=True)
class ExactlyOnceSinkState:
    """Spark's checkpoint (``offsets``, ``commits``), the driver and its tasks, and the store.

    ``num_events`` and ``partitions`` are the configuration (the spec's constants): the input is
    events ``1..num_events`` and every batch runs ``partitions`` tasks.  Transaction ``t`` is
    ``transactions[t - 1]``; partition ``p``'s attempt is ``tasks[p - 1]``.
    """

    num_events: int
    partitions: int
    offsets: tuple[int, ...]
    commits: int
    driver: DriverPhase
    batch: int
    tasks: tuple[TaskAttempt, ...]
    transactions: tuple[StoreTransaction, ...]
    fence: int
    output: tuple[int, ...]
    faults: int

    # --- Pure queries ------------------------------------------------------------------------------

    @property
    def last_end(self) -> int:
        """The end offset of the last batch in the offset log (0 if none)."""
        return self.offsets[-1] if self.offsets else 0

    def batch_start(self, batch: int) -> int:
        """Batch ``batch`` covers offsets ``batch_start(batch) + 1 .. end(batch)``."""
        return 0 if batch == 1 else self.offsets[batch - 2]

    def end(self, batch: int) -> int:
        return 0 if batch == 0 else self.offsets[batch - 1]

    def rows(self, batch: int, partition: int) -> tuple[int, ...]:
        """The rows ``partition`` writes for ``batch``: the batch's events routed to it, in order."""
        return tuple(e for e in range(self.batch_start(batch) + 1, self.end(batch) + 1)
                     if (e - 1) % self.partitions + 1 == partition)

    def task(self, partition: int) -> TaskAttempt:
        return self.tasks[partition - 1]

    def transaction(self, txn: int) -> StoreTransaction:
        return self.transactions[txn - 1]

    @property
    def transaction_ids(self) -> range:
        return range(1, len(self.transactions) + 1)

    @property
    def partition_ids(self) -> range:
        return range(1, self.partitions + 1)

    def held(self, txn: int) -> bool:
        """A live task attempt (of a live driver) holds ``txn``: its lease expiring is a fault."""
        return self.driver is not DriverPhase.DOWN and any(
            attempt.txn == txn and attempt.phase in (TaskPhase.BEGUN, TaskPhase.WRITTEN, TaskPhase.DONE)
            for attempt in self.tasks)

    @property
    def listed(self) -> tuple[int, ...]:
        """The transactions of the batch's commit messages, in partition order."""
        return tuple(attempt.txn for attempt in self.tasks)

    @property
    def job_failed(self) -> bool:
        return self.driver is DriverPhase.ABORTING or (
            self.driver is DriverPhase.RUNNING and any(a.phase is TaskPhase.FAILED for a in self.tasks))

    @property
    def open_transactions(self) -> frozenset[int]:
        return frozenset(t for t in self.transaction_ids if self.transaction(t).status is TransactionStatus.OPEN)

    def check_invariants(self) -> None:
        check_invariants(self)


def initial_state(num_events: int, partitions: int) -> ExactlyOnceSinkState:
    """The spec's ``Init``: ``num_events`` input events over ``partitions``, nothing committed, the driver down."""
    if num_events < 0 or partitions < 1:
        raise ValueError(f"need num_events >= 0 and partitions >= 1, got {num_events}, {partitions}")
    return ExactlyOnceSinkState(
        num_events=num_events, partitions=partitions, offsets=(), commits=0, driver=DriverPhase.DOWN,
        batch=0, tasks=(IDLE_TASK,) * partitions, transactions=(), fence=0, output=(), faults=0)


# --- The store's fenced multi-commit --------------------------------------------------------------


def fenced_commit(
    transactions: tuple[StoreTransaction, ...], fence: int, txn_ids: tuple[int, ...], batch: int,
) -> tuple[tuple[StoreTransaction, ...], int, tuple[int, ...], CommitOutcome]:
    """``commit_transactions(ids, fence=(query, batch))`` on one query's fence, atomically.

    Returns the new transactions, the new fence, the rows that became visible (in the order of
    ``txn_ids``) and the outcome.
    """
    table = list(transactions)
    if fence >= batch:
        for txn in txn_ids:
            if table[txn - 1].status is TransactionStatus.OPEN:
                table[txn - 1] = _ended(table[txn - 1], TransactionStatus.ABORTED)
        return tuple(table), fence, (), CommitOutcome.ALREADY_COMMITTED
    if any(table[txn - 1].status is not TransactionStatus.OPEN for txn in txn_ids):
        return transactions, fence, (), CommitOutcome.REJECTED
    visible: list[int] = []
    for txn in txn_ids:
        table[txn - 1] = _ended(table[txn - 1], TransactionStatus.COMMITTED)
        visible.extend(table[txn - 1].rows)
    return tuple(table), batch, tuple(visible), CommitOutcome.COMMITTED


def _abort(transactions: tuple[StoreTransaction, ...], ids: set[int]) -> tuple[StoreTransaction, ...]:
    return tuple(_ended(tx, TransactionStatus.ABORTED) if t in ids and tx.status is TransactionStatus.OPEN else tx
                 for t, tx in enumerate(transactions, start=1))


# --- Actions --------------------------------------------------------------------------------------


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _driver(state: ExactlyOnceSinkState, phase: DriverPhase, **changes: Any) -> ExactlyOnceSinkState:
    assert phase in DRIVER_TRANSITIONS[state.driver], f"driver {state.driver} -> {phase}"
    return attrs.evolve(state, driver=phase, **changes)


def _with_task(state: ExactlyOnceSinkState, partition: int, attempt: TaskAttempt) -> tuple[TaskAttempt, ...]:
    return (*state.tasks[:partition - 1], attempt, *state.tasks[partition:])


def _with_transaction(state: ExactlyOnceSinkState, txn: int, tx: StoreTransaction) -> tuple[StoreTransaction, ...]:
    return (*state.transactions[:txn - 1], tx, *state.transactions[txn:])


def driver_start(state: ExactlyOnceSinkState) -> ExactlyOnceSinkState:
    """``DriverStart``: the query (re)starts from its checkpoint; a logged, uncommitted batch is re-run."""
    _require(state.driver is DriverPhase.DOWN, "DriverStart")
    if len(state.offsets) > state.commits:
        return _driver(state, DriverPhase.RUNNING, batch=len(state.offsets))
    return _driver(state, DriverPhase.IDLE, batch=0)


def plan_batch(state: ExactlyOnceSinkState, end: int) -> ExactlyOnceSinkState:
    """``PlanBatch(e)``: write ``offsets/b`` with end offset ``end``, then run the batch."""
    _require(state.driver is DriverPhase.IDLE and state.last_end < end <= state.num_events, "PlanBatch")
    return _driver(state, DriverPhase.RUNNING, offsets=(*state.offsets, end), batch=len(state.offsets) + 1)


def task_begin(state: ExactlyOnceSinkState, partition: int) -> ExactlyOnceSinkState:
    """``TaskBegin(p)``: the task attempt begins its store transaction."""
    _require(state.driver is DriverPhase.RUNNING and state.task(partition).phase is TaskPhase.IDLE, "TaskBegin")
    txn = len(state.transactions) + 1
    return attrs.evolve(
        state, transactions=(*state.transactions, StoreTransaction(TransactionStatus.OPEN, state.batch)),
        tasks=_with_task(state, partition, _task_phase(state.task(partition), TaskPhase.BEGUN, txn)))


def task_write(state: ExactlyOnceSinkState, partition: int) -> ExactlyOnceSinkState:
    """``TaskWrite(p)``: write and flush the partition's rows; a transaction whose lease expired fails the task."""
    attempt = state.task(partition)
    _require(state.driver is DriverPhase.RUNNING and attempt.phase is TaskPhase.BEGUN, "TaskWrite")
    tx = state.transaction(attempt.txn)
    if tx.status is not TransactionStatus.OPEN:
        return attrs.evolve(state, tasks=_with_task(state, partition, _task_phase(attempt, TaskPhase.FAILED)))
    return attrs.evolve(
        state, transactions=_with_transaction(state, attempt.txn, attrs.evolve(tx, rows=state.rows(state.batch,
                                                                                                   partition))),
        tasks=_with_task(state, partition, _task_phase(attempt, TaskPhase.WRITTEN)))


def task_report(state: ExactlyOnceSinkState, partition: int) -> ExactlyOnceSinkState:
    """``TaskReport(p)``: the commit message reaches the driver."""
    attempt = state.task(partition)
    _require(state.driver is DriverPhase.RUNNING and attempt.phase is TaskPhase.WRITTEN, "TaskReport")
    return attrs.evolve(state, tasks=_with_task(state, partition, _task_phase(attempt, TaskPhase.DONE)))


def task_crash(state: ExactlyOnceSinkState, partition: int) -> ExactlyOnceSinkState:
    """``TaskCrash(p)``: the attempt dies before reporting; its transaction is orphaned (a fault)."""
    attempt = state.task(partition)
    _require(state.driver is DriverPhase.RUNNING and attempt.phase in (TaskPhase.BEGUN, TaskPhase.WRITTEN),
             "TaskCrash")
    return attrs.evolve(state, tasks=_with_task(state, partition, _task_phase(attempt, TaskPhase.FAILED)),
                        faults=state.faults + 1)


def task_retry(state: ExactlyOnceSinkState, partition: int) -> ExactlyOnceSinkState:
    """``TaskRetry(p)``: Spark starts a new attempt of a failed task."""
    attempt = state.task(partition)
    _require(state.driver is DriverPhase.RUNNING and attempt.phase is TaskPhase.FAILED, "TaskRetry")
    return attrs.evolve(state, tasks=_with_task(state, partition, IDLE_TASK))


def abort_batch(state: ExactlyOnceSinkState) -> ExactlyOnceSinkState:
    """``AbortBatch``: the job failed; ``abort`` aborts the reported transactions; the query stops."""
    _require(state.job_failed, "AbortBatch")
    reported = {a.txn for a in state.tasks if a.phase is TaskPhase.DONE}
    return _driver(state, DriverPhase.DOWN, transactions=_abort(state.transactions, reported), batch=0,
                   tasks=(IDLE_TASK,) * state.partitions)


def commit_batch(state: ExactlyOnceSinkState) -> ExactlyOnceSinkState:
    """``CommitBatch``: the driver's sink commit, the store's fenced multi-commit."""
    _require(state.driver is DriverPhase.RUNNING and all(a.phase is TaskPhase.DONE for a in state.tasks),
             "CommitBatch")
    transactions, fence, visible, outcome = fenced_commit(state.transactions, state.fence, state.listed, state.batch)
    if outcome is CommitOutcome.REJECTED:
        return _driver(state, DriverPhase.ABORTING)
    return _driver(state, DriverPhase.COMMITTED, transactions=transactions, fence=fence,
                   output=state.output + visible)


def write_commit_log(state: ExactlyOnceSinkState) -> ExactlyOnceSinkState:
    """``WriteCommitLog``: Spark writes ``commits/b``."""
    _require(state.driver is DriverPhase.COMMITTED, "WriteCommitLog")
    return _driver(state, DriverPhase.IDLE, commits=state.batch, batch=0, tasks=(IDLE_TASK,) * state.partitions)


def driver_crash(state: ExactlyOnceSinkState) -> ExactlyOnceSinkState:
    """``DriverCrash``: the driver dies and its tasks with it (a fault)."""
    _require(state.driver is not DriverPhase.DOWN, "DriverCrash")
    return _driver(state, DriverPhase.DOWN, batch=0, tasks=(IDLE_TASK,) * state.partitions, faults=state.faults + 1)


def expire_transaction(state: ExactlyOnceSinkState, txn: int) -> ExactlyOnceSinkState:
    """``ExpireTransaction(t)``: the store's lease aborts an open transaction (a fault if it is held)."""
    _require(txn in state.transaction_ids and state.transaction(txn).status is TransactionStatus.OPEN,
             "ExpireTransaction")
    return attrs.evolve(
        state, transactions=_with_transaction(state, txn, _ended(state.transaction(txn), TransactionStatus.ABORTED)),
        faults=state.faults + (1 if state.held(txn) else 0))


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def check_invariants(state: ExactlyOnceSinkState) -> None:
    """Raise AssertionError naming the first spec invariant this state breaks."""
    assert state.commits <= len(state.offsets) and 0 <= state.batch <= len(state.offsets), "TypeOK"
    assert all(a.txn <= len(state.transactions) for a in state.tasks), "TypeOK"
    end = state.end(state.fence)
    assert len(state.output) == end and set(state.output) == set(range(1, end + 1)), "ExactlyOnce"
    committed = [tx for tx in state.transactions if tx.status is TransactionStatus.COMMITTED]
    assert all(tx.batch <= state.fence for tx in committed), "NothingVisibleUncommitted"
    assert len(state.output) == sum(len(tx.rows) for tx in committed), "NothingVisibleUncommitted"
    assert state.commits <= state.fence <= min(state.commits + 1, len(state.offsets)), "CheckpointAgreesWithStore"
