"""The exactly-once sink's commit protocol, in lockstep with the model (``millstream.model.exactly_once_sink``).

Hypothesis plays Spark -- its checkpoint (the offset log and the commit log), the driver and its tasks,
in plain Python -- against a real node: a segment store on the simulated tiers with a controller on an
injected clock, reached over TCP by the sink's own code.  Tasks run the writer classes' ``write``
(the row writer's and the Arrow writer's, drawn per task, with Spark's task context stood in for),
the driver commits and aborts through a *fresh* writer of a drawn class each time (as Spark's commit
process builds one), and the model takes the same steps:

* ``driver_start`` / ``plan_batch`` / ``write_commit_log`` / ``driver_crash`` are Spark's own; a
  crash drops every commit message of the running batch (the tasks die with the driver) and a restart
  re-runs a logged batch with no ``commits`` entry -- with the same batch id and new transactions.
* ``task_runs`` is a task that writes its rows and reports: the model's TaskBegin, TaskWrite and
  TaskReport (the real ``write`` does all three in one call).  ``task_dies_after_writing`` drops its
  commit message (TaskBegin, TaskWrite, TaskCrash); ``task_dies_after_beginning`` opens its store
  transaction as ``write`` does at its first row and dies there (TaskBegin, TaskCrash).  ``task_retry``
  is Spark's next attempt.
* ``commit_batch`` is the driver's ``commit(messages, batch_id)``: the fenced multi-commit, then the
  wait for the merge; the store refusing it (a listed transaction whose lease lapsed) is the model's
  REJECTED, after which ``abort_batch`` is the driver's ``abort`` and the query stops.
* ``expire_transaction`` moves the controller's clock to the earliest lease deadline among the open
  transactions and expires it: every transaction begins one tick after the one before, so deadlines
  are distinct and exactly one lapses (the model may expire any open transaction; this test expires
  them in the order their leases run out, as the store does).

After every step both sides must agree on what a reader and Spark can observe: each transaction's
status, the fence the store records for the query, and the events a reader of the output stream
reads (as a multiset: the model's output is in commit order, a reader's is per segment); and the
model's invariants hold (ExactlyOnce: the output is exactly the committed batches' events).

Bounds: 6 input events, 2 partitions, at most 3 faults (driver crashes, task crashes, lapsed leases
that a live task held).  A batch holds at least one event per partition: the sink begins no
transaction for a task without rows (and records no fence for a batch without any), which the spec
abstracts away -- its tasks always begin one.  Batch ids: the model's start at 1, Spark's at 0.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
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
from tests.server.raw import Tiers

T = TypeVar("T")

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
SCOPE, STREAM = "sc", "out"
QUERY = "q-7f3a"
NUM_EVENTS = 6
PARTITIONS = 2
MAX_FAULTS = 3
#: The sink's lease, in ticks of the controller's clock (each begin moves it one tick).  Long in real
#: seconds too, so a task's pinger (on the real clock) never fires during a step.
LEASE_TICKS = 500
START_TIME = 1_000_000.0
STEP_TIMEOUT_SECONDS = 60.0
SCHEMA = StructType([StructField("value", BinaryType()), StructField("routing_key", StringType())])
ARROW_SCHEMA = pa.schema([("value", pa.binary()), ("routing_key", pa.string())])
WRITERS = (MillstreamStreamWriter, MillstreamStreamArrowWriter)
#: The store's transaction statuses as the model has them (an abort or commit in progress has decided).
STATUS = {"open": m.TransactionStatus.OPEN, "committing": m.TransactionStatus.COMMITTED,
          "committed": m.TransactionStatus.COMMITTED, "aborting": m.TransactionStatus.ABORTED,
          "aborted": m.TransactionStatus.ABORTED}


class Node:
    """A segment store and a controller on a loop thread of their own; the controller's clock is manual."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sink-vs-model-node", daemon=True)
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
        self.run(self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(2))))

    @property
    def uri(self) -> str:
        return self.server.uri

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS), self.loop)
        return future.result()

    def advance_to(self, when: float) -> None:
        async def advance() -> None:
            self.clock.advance(max(0.0, when - self.clock.monotonic()))

        self.run(advance())

    def stop(self) -> None:
        try:
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


class SinkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.node = Node()
        self.model = m.initial_state(NUM_EVENTS, PARTITIONS)
        self.options = {"controller": self.node.uri, "stream": f"{SCOPE}/{STREAM}",
                        "transactionLeaseSeconds": str(LEASE_TICKS)}
        #: The model's transaction ``t`` is the store's ``txn_ids[t - 1]``; its lease runs out at ``deadlines[t - 1]``.
        self.txn_ids: list[str] = []
        self.deadlines: list[float] = []
        #: The running batch's commit messages by partition (the driver's, once a task reported).
        self.messages: dict[int, MillstreamCommitMessage] = {}
        self.attempts = 0

    def teardown(self) -> None:
        try:
            _store.close_shared_clients()
        finally:
            self.node.stop()

    # --- Helpers -----------------------------------------------------------------------------------

    def step(self, transition: Any, *args: Any) -> None:
        self.model = transition(self.model, *args)

    def writer(self, writer_class: type) -> Any:
        """A fresh writer, as Spark builds one for every task, commit and abort."""
        return writer_class(parse_sink_options(self.options), SCHEMA)

    def begun(self, txn_id: str | None) -> None:
        """A task began the store transaction ``txn_id``: the model's next transaction; the clock ticks."""
        assert txn_id is not None, "a task with rows begins a transaction"
        self.txn_ids.append(txn_id)
        self.deadlines.append(self.node.clock.monotonic() + LEASE_TICKS)
        self.node.advance_to(self.node.clock.monotonic() + 1)

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
        assert (message.batch_id, message.partition_id, message.events) == (
            self.model.batch - 1, partition - 1, len(self.rows(partition)))
        self.begun(message.txn_id)
        return message

    def idle_partitions(self) -> list[int]:
        return [p for p in self.model.partition_ids if self.model.task(p).phase is m.TaskPhase.IDLE]

    def running(self) -> bool:
        return self.model.driver is m.DriverPhase.RUNNING and not self.model.job_failed

    def status(self, txn: int) -> m.TransactionStatus:
        info = self.node.run(self.node.controller.get_transaction(SCOPE, STREAM, uuid.UUID(self.txn_ids[txn - 1]).hex))
        return STATUS[info.status.value]

    # --- Spark making progress ---------------------------------------------------------------------

    def progress(self) -> list[Any]:
        """The steps a fault-free Spark may take next (the faults are rules of their own)."""
        state, steps = self.model, []
        if state.driver is m.DriverPhase.DOWN:
            steps.append(self.driver_start)
        if state.driver is m.DriverPhase.IDLE and state.last_end + PARTITIONS <= NUM_EVENTS:
            steps.append(self.plan_batch)
        if self.running() and self.idle_partitions():
            steps.append(self.task_runs)
        if state.driver is m.DriverPhase.RUNNING and any(a.phase is m.TaskPhase.FAILED for a in state.tasks):
            steps.append(self.task_retry)
        if state.driver is m.DriverPhase.RUNNING and all(a.phase is m.TaskPhase.DONE for a in state.tasks):
            steps.append(self.commit_batch)
        if state.job_failed:
            steps.append(self.abort_batch)
        if state.driver is m.DriverPhase.COMMITTED:
            steps.append(self.write_commit_log)
        return steps or [self.reader_reads]

    @rule(data=st.data())
    def spark_progresses(self, data: st.DataObject) -> None:
        """One step of Spark's own progress, drawn among those enabled: a single rule, so that a run
        is mostly progress and the fault rules below (bounded by ``MAX_FAULTS``) interleave with it."""
        data.draw(st.sampled_from(self.progress()), label="step")(data)

    # --- Spark's driver ----------------------------------------------------------------------------

    def driver_start(self, data: st.DataObject) -> None:
        self.messages.clear()
        self.step(m.driver_start)

    def plan_batch(self, data: st.DataObject) -> None:
        end = data.draw(st.integers(self.model.last_end + PARTITIONS, NUM_EVENTS), label="end")
        self.messages.clear()
        self.step(m.plan_batch, end)

    def commit_batch(self, data: st.DataObject) -> None:
        writer_class = data.draw(st.sampled_from(WRITERS), label="driver's writer")
        messages = [self.messages[p] for p in self.model.partition_ids]
        try:
            self.writer(writer_class).commit(messages, self.model.batch - 1)
        except TransactionNotOpenError:
            self.step(m.commit_batch)
            assert self.model.driver is m.DriverPhase.ABORTING, "the store refused a batch the model commits"
            return
        self.step(m.commit_batch)
        assert self.model.driver is m.DriverPhase.COMMITTED, "the store committed a batch the model refuses"

    def abort_batch(self, data: st.DataObject) -> None:
        writer_class = data.draw(st.sampled_from(WRITERS), label="driver's writer")
        reported = [self.messages.get(p) if self.model.task(p).phase is m.TaskPhase.DONE else None
                    for p in self.model.partition_ids]
        self.writer(writer_class).abort(reported, self.model.batch - 1)
        self.messages.clear()
        self.step(m.abort_batch)  # the query stops; a user may start it again (driver_start)

    def write_commit_log(self, data: st.DataObject) -> None:
        self.messages.clear()
        self.step(m.write_commit_log)

    @precondition(lambda self: self.model.driver is not m.DriverPhase.DOWN and self.model.faults < MAX_FAULTS)
    @rule()
    def driver_crash(self) -> None:
        self.messages.clear()
        self.step(m.driver_crash)

    # --- Spark's tasks -----------------------------------------------------------------------------

    def task_runs(self, data: st.DataObject) -> None:
        writer_class = data.draw(st.sampled_from(WRITERS), label="task's writer")
        partition = data.draw(st.sampled_from(self.idle_partitions()), label="partition")
        message = self.run_task(writer_class, partition)
        self.step(m.task_begin, partition)
        self.step(m.task_write, partition)
        self.step(m.task_report, partition)
        self.messages[partition] = message

    @precondition(lambda self: self.running() and self.idle_partitions() and self.model.faults < MAX_FAULTS)
    @rule(data=st.data(), writer_class=st.sampled_from(WRITERS))
    def task_dies_after_writing(self, data: st.DataObject, writer_class: type) -> None:
        partition = data.draw(st.sampled_from(self.idle_partitions()), label="partition")
        self.run_task(writer_class, partition)  # its commit message never reaches the driver
        self.step(m.task_begin, partition)
        self.step(m.task_write, partition)
        self.step(m.task_crash, partition)

    @precondition(lambda self: self.running() and self.idle_partitions() and self.model.faults < MAX_FAULTS)
    @rule(data=st.data())
    def task_dies_after_beginning(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(self.idle_partitions()), label="partition")
        # What ``write`` does at its first row, through the same shared client; then the task is gone.
        client = _store.shared_client(self.node.uri, "")
        writer = client.transactional_writer(f"{SCOPE}/{STREAM}", lease_seconds=LEASE_TICKS)
        try:
            self.begun(str(writer.begin().txn_id))
        finally:
            writer.close()
        self.step(m.task_begin, partition)
        self.step(m.task_crash, partition)

    def task_retry(self, data: st.DataObject) -> None:
        failed = [p for p in self.model.partition_ids if self.model.task(p).phase is m.TaskPhase.FAILED]
        self.step(m.task_retry, data.draw(st.sampled_from(failed), label="partition"))

    # --- The store's leases ------------------------------------------------------------------------

    def open_transactions(self) -> list[int]:
        return sorted(self.model.open_transactions)

    @precondition(lambda self: self.open_transactions() and (
        self.model.faults < MAX_FAULTS or not self.model.held(min(self.model.open_transactions))))
    @rule()
    def expire_transaction(self) -> None:
        txn = min(self.open_transactions())  # the earliest deadline: transactions begin one tick apart
        self.node.advance_to(self.deadlines[txn - 1])
        assert self.node.run(self.node.controller.expire_leases()) == 1, "exactly the earliest lease lapsed"
        self.step(m.expire_transaction, txn)

    # --- What both sides show ----------------------------------------------------------------------

    @invariant()
    def agree(self) -> None:
        self.model.check_invariants()
        for txn in self.model.transaction_ids:
            assert self.status(txn) is self.model.transaction(txn).status, f"transaction {txn}"
        with millstream.connect(self.node.uri) as client:
            recorded = client.get_fence(f"{SCOPE}/{STREAM}", fence_key(QUERY))
        assert recorded == (None if self.model.fence == 0 else self.model.fence - 1), "the recorded fence"
        assert sorted(self.read_output()) == sorted(self.model.output), "what a reader of the output reads"

    def reader_reads(self, data: st.DataObject) -> None:
        """A reader of the output stream (what remains once the input is consumed)."""
        assert sorted(self.read_output()) == sorted(self.model.output)

    def read_output(self) -> list[int]:
        parsed = parse_source_options({"controller": self.node.uri, "stream": f"{SCOPE}/{STREAM}"})
        reader = MillstreamBatchReader(parsed, StructType([StructField("value", BinaryType())]))
        return [int(row["value"]) for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]


SinkMachine.TestCase.settings = settings(
    max_examples=300 if NIGHTLY else 30, stateful_step_count=40 if NIGHTLY else 25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_sink_protocol_against_the_model = SinkMachine.TestCase
