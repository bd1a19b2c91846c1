"""The exactly-once sink's commit protocol, in lockstep with the model (``millstream.model.exactly_once_sink``).

Hypothesis plays Spark -- its checkpoint, the driver and its tasks -- against a real node through the
sink's own code (``tests/spark/sink_run.py`` says how each step maps to the spec's actions): tasks run
both stream writer classes' ``write``, the driver commits and aborts through a fresh writer of a drawn
class each time, the driver crashes at any step, tasks die before or after writing and are retried,
leases lapse on the controller's manual clock.  One rule draws Spark's next step among those enabled,
so a run is mostly progress; the fault rules interleave with it (at most ``MAX_FAULTS``).

After every step both sides must agree on what a reader and Spark can observe: each transaction's
status, the fence the store records for the query, and the events a reader of the output stream
reads (as a multiset: the model's output is in commit order, a reader's is per segment); and the
model's invariants hold (ExactlyOnce: the output is exactly the committed batches' events).

Seeded by hand when written, each caught within the default examples: the row writer committing
without the fence (the recorded fence stays None where the model has batch 0); a commit that lists
only its first transaction (transaction 2 open where the model has it committed); an abort that
aborts nothing (transaction 1 open where the model has it aborted).

Bounds: 6 input events, 2 partitions, at most 3 faults (driver crashes, task crashes, lapsed leases
that a live task held).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.spark.sink_run import PROGRESS, Node, SimulatedSpark

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
NUM_EVENTS = 6
PARTITIONS = 2
MAX_FAULTS = 3


class SinkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.node = Node()
        self.spark = SimulatedSpark(self.node, num_events=NUM_EVENTS, partitions=PARTITIONS, max_faults=MAX_FAULTS)

    def teardown(self) -> None:
        self.node.stop()

    def take(self, step: str, data: st.DataObject) -> None:
        parameters = {name: data.draw(st.sampled_from(values), label=name)
                      for name, values in self.spark.choices(step).items()}
        self.spark.perform(step, **parameters)

    @rule(data=st.data())
    def spark_progresses(self, data: st.DataObject) -> None:
        """One step of Spark's own progress, drawn among those enabled (a reader reads if none is)."""
        enabled = [step for step in PROGRESS if self.spark.enabled(step)]
        if not enabled:
            assert sorted(self.spark.read_output()) == sorted(self.spark.model.output)
            return
        self.take(data.draw(st.sampled_from(enabled), label="step"), data)

    @precondition(lambda self: self.spark.enabled("driver_crash"))
    @rule(data=st.data())
    def driver_crash(self, data: st.DataObject) -> None:
        self.take("driver_crash", data)

    @precondition(lambda self: self.spark.enabled("task_dies_after_writing"))
    @rule(data=st.data())
    def task_dies_after_writing(self, data: st.DataObject) -> None:
        self.take("task_dies_after_writing", data)

    @precondition(lambda self: self.spark.enabled("task_dies_after_beginning"))
    @rule(data=st.data())
    def task_dies_after_beginning(self, data: st.DataObject) -> None:
        self.take("task_dies_after_beginning", data)

    @precondition(lambda self: self.spark.enabled("expire_transaction"))
    @rule(data=st.data())
    def expire_transaction(self, data: st.DataObject) -> None:
        self.take("expire_transaction", data)

    @invariant()
    def agree(self) -> None:
        model: Any = self.spark.model
        model.check_invariants()
        statuses, fence, output = self.spark.observe()
        assert len(statuses) == len(model.transactions), "the store began a transaction the model did not"
        for txn, status in enumerate(statuses, start=1):
            assert status is model.transaction(txn).status, f"transaction {txn}"
        assert fence == model.fence, "the recorded fence"
        assert sorted(output) == sorted(model.output), "what a reader of the output reads"


SinkMachine.TestCase.settings = settings(
    max_examples=300 if NIGHTLY else 30, stateful_step_count=40 if NIGHTLY else 25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_sink_protocol_against_the_model = SinkMachine.TestCase
