"""Spark played in plain Python against the real sink and a real node, for the sink's stateful test
(``test_sink_vs_model``) and its trace validation (``test_sink_trace_validation``).

``SimulatedSpark`` is Spark's side of ``spec/ExactlyOnceSink.tla`` -- the checkpoint (offset log, commit
log), the driver and its tasks -- kept as the model's state (``millstream.model.exactly_once_sink``: the
spec's variables), and the store's side is real: tasks run the stream writer classes' ``write`` (the row
writer's and the Arrow writer's, Spark's task context stood in for), the driver commits and aborts
through a fresh writer each time (as Spark's commit process builds one), leases lapse on the
controller's manual clock.  Each step takes the model's transitions too, and records, as
``TraceEvent``s in the spec's vocabulary, what the implementation reported: the transaction a task
began (numbered in the order the store handed out new ids), the rows it wrote, the fenced
multi-commit's answer, and -- in ``observe`` -- every transaction's status, the recorded fence and
what a reader of the output stream reads.

Steps and their spec actions:

* ``driver_start`` / ``plan_batch`` / ``write_commit_log`` / ``driver_crash`` are Spark's own; a crash
  drops every commit message of the running batch (the tasks die with the driver).
* ``task_runs``: a task writes its rows and reports (TaskBegin, TaskWrite, TaskReport: the real
  ``write`` does all three in one call).  ``task_dies_after_writing`` drops its commit message
  (TaskBegin, TaskWrite, TaskCrash); ``task_dies_after_beginning`` opens its store transaction as
  ``write`` does at its first row and dies there (TaskBegin, TaskCrash).  ``task_retry`` is Spark's
  next attempt.
* ``commit_batch``: the driver's ``commit(messages, batch_id)`` (CommitBatch); the store refusing it
  (a listed transaction whose lease lapsed) leaves the driver aborting; ``abort_batch`` is ``abort``.
* ``expire_transaction``: the controller's clock moves to the earliest lease deadline among the open
  transactions and expires it (LeaseExpires).  The clock moves only there, and the n-th transaction
  gets a lease of ``LEASE_BASE_TICKS + n`` ticks, so deadlines grow with n: exactly one lapses, and
  no open transaction's deadline ever passes unnoticed.

A batch holds at least one event per partition: the sink begins no transaction for a task without
rows (and records no fence for a batch without any), which the spec abstracts away -- its tasks
always begin one.  Batch ids: the model's start at 1, Spark's at 0.
"""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar
from unittest import mock

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

import millstream
from millstream.client import ScalingPolicy, StreamConfig
from millstream.controller import Controller, ControllerConfig, ControllerRpc, LocalSegmentStore
from millstream.errors import TransactionNotOpenError
from millstream.model import exactly_once_sink as m
from millstream.server import SegmentStoreServer
from millstream.spark import (
    MillstreamBatchReader,
    MillstreamCommitMessage,
    MillstreamStreamArrowWriter,
    MillstreamStreamWriter,
    _store,
    _writer,
    fence_key,
    parse_sink_options,
    parse_source_options,
)
from millstream.spark._writer import TaskIdentity
from millstream.testing.clock import ManualClock
from millstream.testing.tracing import TraceEvent
from tests.server.raw import Tiers

__all__ = ["FAULTS", "PROGRESS", "WRITERS", "Node", "SimulatedSpark"]

T = TypeVar("T")

SCOPE, STREAM = "sc", "out"
QUERY = "q-7f3a"
#: The n-th transaction's lease is this many ticks of the controller's clock plus n.  Long in real
#: seconds too, so a task's pinger (on the real clock) never fires during a step.
LEASE_BASE_TICKS = 100
START_TIME = 1_000_000.0
STEP_TIMEOUT_SECONDS = 60.0
SCHEMA = StructType([StructField("value", BinaryType()), StructField("routing_key", StringType())])
ARROW_SCHEMA = pa.schema([("value", pa.binary()), ("routing_key", pa.string())])
WRITERS: tuple[type, ...] = (MillstreamStreamWriter, MillstreamStreamArrowWriter)
#: The store's transaction statuses as the spec has them (an abort or commit in progress has decided).
STATUS = {"open": m.TransactionStatus.OPEN, "committing": m.TransactionStatus.COMMITTED,
          "committed": m.TransactionStatus.COMMITTED, "aborting": m.TransactionStatus.ABORTED,
          "aborted": m.TransactionStatus.ABORTED}
#: Spark's own steps, and the faults (bounded by ``max_faults``).
PROGRESS = ("driver_start", "plan_batch", "task_runs", "task_retry", "commit_batch", "abort_batch",
            "write_commit_log")
FAULTS = ("driver_crash", "task_dies_after_writing", "task_dies_after_beginning", "expire_transaction")


class Node:
    """A segment store and a controller on a loop thread of their own; the controller's clock is manual."""

    def __init__(self, *, segments: int = 2) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sink-run-node", daemon=True)
        self.thread.start()
        self.clock = ManualClock(START_TIME)
        self.tiers = Tiers("simulated")
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.run(self.server.start())
        self.controller = Controller(LocalSegmentStore(self.server), clock=self.clock, now=self.clock.monotonic,
                                     config=ControllerConfig(periodic=False), rng=random.Random(11))
        self.run(self.controller.start())
        self.server.attach_controller(ControllerRpc(self.controller))
        self.run(self.controller.create_scope(SCOPE))
        self.run(self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(segments))))

    @property
    def uri(self) -> str:
        return self.server.uri

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS), self.loop)
        return future.result()

    def advance_to(self, when: float) -> None:
        async def advance() -> None:  # on the loop: the clock wakes its sleepers there
            self.clock.advance(max(0.0, when - self.clock.monotonic()))

        self.run(advance())

    def stop(self) -> None:
        try:
            _store.close_shared_clients()
            self.run(self.controller.stop())
            self.run(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


def feed(writer_class: type, rows: list[dict[str, Any]]) -> Iterator[Any]:
    """What Spark hands ``write``: ``Row``s, or Arrow record batches (one per row, to cross several)."""
    if writer_class is MillstreamStreamArrowWriter:
        return iter([pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA) for row in rows])
    return iter([Row(**row) for row in rows])


class SimulatedSpark:
    """Spark's side of the sink protocol, stepped by a caller; see the module docstring."""

    def __init__(self, node: Node, *, num_events: int, partitions: int, max_faults: int) -> None:
        self.node = node
        self.max_faults = max_faults
        self.model = m.initial_state(num_events, partitions)
        #: The model's transaction ``t`` is the store's ``txn_ids[t - 1]``; its lease runs out at ``deadlines[t - 1]``.
        self.txn_ids: list[str] = []
        self.deadlines: list[float] = []
        #: The running batch's commit messages by partition (the driver's, once a task reported).
        self.messages: dict[int, MillstreamCommitMessage] = {}
        self.attempts = 0
        self.events: list[TraceEvent] = []

    # --- What may happen next ----------------------------------------------------------------------

    def idle_partitions(self) -> list[int]:
        return [p for p in self.model.partition_ids if self.model.task(p).phase is m.TaskPhase.IDLE]

    def failed_partitions(self) -> list[int]:
        return [p for p in self.model.partition_ids if self.model.task(p).phase is m.TaskPhase.FAILED]

    def running(self) -> bool:
        return self.model.driver is m.DriverPhase.RUNNING and not self.model.job_failed

    def enabled(self, step: str) -> bool:
        state = self.model
        may_fault = state.faults < self.max_faults
        return {
            "driver_start": state.driver is m.DriverPhase.DOWN,
            "plan_batch": state.driver is m.DriverPhase.IDLE and state.last_end + state.partitions <= state.num_events,
            "task_runs": self.running() and bool(self.idle_partitions()),
            "task_retry": state.driver is m.DriverPhase.RUNNING and bool(self.failed_partitions()),
            "commit_batch": state.driver is m.DriverPhase.RUNNING and all(
                a.phase is m.TaskPhase.DONE for a in state.tasks),
            "abort_batch": state.job_failed,
            "write_commit_log": state.driver is m.DriverPhase.COMMITTED,
            "driver_crash": state.driver is not m.DriverPhase.DOWN and may_fault,
            "task_dies_after_writing": self.running() and bool(self.idle_partitions()) and may_fault,
            "task_dies_after_beginning": self.running() and bool(self.idle_partitions()) and may_fault,
            "expire_transaction": bool(state.open_transactions) and (
                may_fault or not state.held(min(state.open_transactions))),
        }[step]

    def choices(self, step: str) -> dict[str, list[Any]]:
        """The parameters ``step`` takes, each with the values it may take now."""
        state = self.model
        if step == "plan_batch":
            return {"end": list(range(state.last_end + state.partitions, state.num_events + 1))}
        if step in ("task_runs", "task_dies_after_writing"):
            return {"partition": self.idle_partitions(), "writer_class": list(WRITERS)}
        if step == "task_dies_after_beginning":
            return {"partition": self.idle_partitions()}
        if step == "task_retry":
            return {"partition": self.failed_partitions()}
        if step in ("commit_batch", "abort_batch"):
            return {"writer_class": list(WRITERS)}
        return {}

    def perform(self, step: str, **parameters: Any) -> None:
        assert self.enabled(step), f"{step} is not enabled"
        getattr(self, step)(**parameters)

    # --- Helpers -----------------------------------------------------------------------------------

    def step(self, transition: Any, *args: Any, **observed: Any) -> None:
        """Take the model's ``transition`` and record it (the spec's action name) with what was observed."""
        self.model = transition(self.model, *args)
        action = "".join(part.capitalize() for part in transition.__name__.split("_"))
        self.events.append(TraceEvent("LeaseExpires" if action == "ExpireTransaction" else action, observed))

    @property
    def lease_ticks(self) -> int:
        """The lease of the next transaction a task begins."""
        return LEASE_BASE_TICKS + len(self.txn_ids) + 1

    def writer(self, writer_class: type) -> Any:
        """A fresh writer, as Spark builds one for every task, commit and abort."""
        options = {"controller": self.node.uri, "stream": f"{SCOPE}/{STREAM}",
                   "transactionLeaseSeconds": str(self.lease_ticks)}
        return writer_class(parse_sink_options(options), SCHEMA)

    def begun(self, txn_id: str | None) -> int:
        """A task began the store transaction ``txn_id`` with lease ``lease_ticks``: its number (by first
        appearance: a reused id gets its old number, which the model and the spec refuse)."""
        assert txn_id is not None, "a task with rows begins a transaction"
        if txn_id not in self.txn_ids:
            self.deadlines.append(self.node.clock.monotonic() + self.lease_ticks)
            self.txn_ids.append(txn_id)
        return self.txn_ids.index(txn_id) + 1

    def rows(self, partition: int) -> list[dict[str, Any]]:
        events = self.model.rows(self.model.batch, partition)
        assert events, "every planned batch gives each partition a row"
        return [{"value": str(event).encode(), "routing_key": f"key-{event % 3}"} for event in events]

    def run_task(self, writer_class: type, partition: int) -> MillstreamCommitMessage:
        self.attempts += 1
        identity = TaskIdentity(QUERY, self.model.batch - 1, partition - 1, self.attempts)
        with mock.patch.object(_writer, "current_task", lambda *, streaming: identity):  # Spark's task context
            message: MillstreamCommitMessage = self.writer(writer_class).write(
                feed(writer_class, self.rows(partition)))
        assert (message.batch_id, message.partition_id) == (self.model.batch - 1, partition - 1)
        return message

    def write_task(self, writer_class: type, partition: int) -> MillstreamCommitMessage:
        """A task's ``write``, recorded as TaskBegin and TaskWrite with what it reported."""
        message = self.run_task(writer_class, partition)
        self.step(m.task_begin, partition, p=partition, txn=self.begun(message.txn_id))
        self.step(m.task_write, partition, p=partition, ok=True, rows=message.events)
        return message

    # --- Spark's driver ----------------------------------------------------------------------------

    def driver_start(self) -> None:
        self.messages.clear()
        self.step(m.driver_start)

    def plan_batch(self, end: int) -> None:
        self.messages.clear()
        self.step(m.plan_batch, end, e=end)

    def commit_batch(self, writer_class: type) -> None:
        messages = [self.messages[p] for p in self.model.partition_ids]
        answers: list[str] = []
        commit = millstream.Client.commit_transactions

        def spied(client: millstream.Client, *args: Any, **kwargs: Any) -> Any:
            result = commit(client, *args, **kwargs)
            answers.append(result.outcome.value)
            return result

        try:
            with mock.patch.object(millstream.Client, "commit_transactions", spied):
                self.writer(writer_class).commit(messages, self.model.batch - 1)
        except TransactionNotOpenError:
            answers.append("rejected")
        assert len(answers) == 1, f"one fenced multi-commit per commit call, not {answers}"
        self.step(m.commit_batch, outcome=answers[0])

    def abort_batch(self, writer_class: type) -> None:
        reported = [self.messages.get(p) if self.model.task(p).phase is m.TaskPhase.DONE else None
                    for p in self.model.partition_ids]
        self.writer(writer_class).abort(reported, self.model.batch - 1)
        self.messages.clear()
        self.step(m.abort_batch)  # the query stops; a user may start it again (driver_start)

    def write_commit_log(self) -> None:
        self.messages.clear()
        self.step(m.write_commit_log)

    def driver_crash(self) -> None:
        self.messages.clear()
        self.step(m.driver_crash)

    # --- Spark's tasks -----------------------------------------------------------------------------

    def task_runs(self, partition: int, writer_class: type) -> None:
        message = self.write_task(writer_class, partition)
        self.step(m.task_report, partition, p=partition)
        self.messages[partition] = message

    def task_dies_after_writing(self, partition: int, writer_class: type) -> None:
        self.write_task(writer_class, partition)  # its commit message never reaches the driver
        self.step(m.task_crash, partition, p=partition)

    def task_dies_after_beginning(self, partition: int) -> None:
        # What ``write`` does at its first row, through the same shared client; then the task is gone.
        client = _store.shared_client(self.node.uri, "")
        writer = client.transactional_writer(f"{SCOPE}/{STREAM}", lease_seconds=self.lease_ticks)
        try:
            txn = self.begun(str(writer.begin().txn_id))
        finally:
            writer.close()
        self.step(m.task_begin, partition, p=partition, txn=txn)
        self.step(m.task_crash, partition, p=partition)

    def task_retry(self, partition: int) -> None:
        self.step(m.task_retry, partition, p=partition)

    # --- The store's leases ------------------------------------------------------------------------

    def expire_transaction(self) -> None:
        txn = min(self.model.open_transactions)  # the earliest deadline: leases grow with the number
        self.node.advance_to(self.deadlines[txn - 1])
        expired = self.node.run(self.node.controller.expire_leases())
        assert expired == 1, f"exactly the earliest lease lapsed, not {expired}"
        self.step(m.expire_transaction, txn, t=txn)

    # --- What the implementation shows -------------------------------------------------------------

    def statuses(self) -> list[m.TransactionStatus]:
        return [STATUS[self.node.run(self.node.controller.get_transaction(
            SCOPE, STREAM, uuid.UUID(txn_id).hex)).status.value] for txn_id in self.txn_ids]

    def recorded_fence(self) -> int:
        """The fence the store records for the query, as a spec batch number (0: none)."""
        with millstream.connect(self.node.uri) as client:
            recorded = client.get_fence(f"{SCOPE}/{STREAM}", fence_key(QUERY))
        return 0 if recorded is None else recorded + 1

    def read_output(self) -> list[int]:
        parsed = parse_source_options({"controller": self.node.uri, "stream": f"{SCOPE}/{STREAM}"})
        reader = MillstreamBatchReader(parsed, StructType([StructField("value", BinaryType())]))
        return [int(row["value"]) for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]

    def observe(self) -> tuple[list[m.TransactionStatus], int, list[int]]:
        """What the store shows now -- statuses, fence, output -- recorded as an ``Observe`` event."""
        statuses, fence, output = self.statuses(), self.recorded_fence(), self.read_output()
        self.events.append(TraceEvent("Observe", {"status": [s.value for s in statuses], "fence": fence,
                                                  "count": len(output), "events": set(output)}))
        return statuses, fence, output


def random_run(seed: int, *, steps: int, num_events: int = 6, partitions: int = 2, max_faults: int = 3,
               observe_every: int = 1) -> list[TraceEvent]:
    """A seeded run: Spark's progress with faults interleaved (about one step in four), every
    parameter drawn from ``random.Random(seed)``; an ``Observe`` after every ``observe_every`` steps."""
    rng = random.Random(seed)
    node = Node()
    try:
        spark = SimulatedSpark(node, num_events=num_events, partitions=partitions, max_faults=max_faults)
        for index in range(steps):
            progress = [s for s in PROGRESS if spark.enabled(s)]
            faults = [s for s in FAULTS if spark.enabled(s)]
            pool = faults if faults and (not progress or rng.random() < 0.25) else progress
            if not pool:
                break
            step = rng.choice(pool)
            spark.perform(step, **{name: rng.choice(values) for name, values in spark.choices(step).items()})
            if (index + 1) % observe_every == 0:
                spark.observe()
        spark.observe()
        return spark.events
    finally:
        node.stop()
