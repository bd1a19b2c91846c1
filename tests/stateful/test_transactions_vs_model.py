"""Stream transactions, in lockstep with the model (``millstream.model.transactions``).

Hypothesis drives a real node -- a segment store on the simulated tiers with the controller attached,
reached by a real ``AsyncClient`` over TCP -- and the model through the same steps.  Every rule is
named after the model transition it takes (``spec/README.md``'s table): clients begin, write into,
ping, commit and abort transactions (``TransactionalEventStreamWriter``), a plain stream writer writes
concurrently and follows the stream through scales and rolls, a Spark-like caller sends fenced
multi-commits (sometimes twice, as after a lost reply), several transactions are committed one
after another in a drawn order (so the commit queue holds two or more, in an order other than the
one they began in), the stream scales while transactions are
open, time passes on an injected clock and leases lapse, and the controller is killed and restarted
from its metadata log.  The controller runs no workflow step by itself
(``ControllerConfig.transaction_workflows=False``): the rules ``start_commit``,
``merge_txn_segment``, ``finish_commit``, ``finish_abort`` and ``expire_lease`` run its steps one by
one, exactly when the model takes them.

After every step the two must agree on everything a client can observe: each transaction's status;
what a reader of each routing key reads, event by event (and what it will read once a roll in
progress finishes); which segments are sealed; which transaction segments are merged; the recorded
fence value; the commit queue, in the order the workflow will take it; and both sides' invariants.

Bounds (the model's ``NumTxns``, ``MaxTxnEvents``, ...): three transactions, three events each, six
plain events, three layouts (one segment; halves; a quarter and the rest -- all different, see
``_transactions``' note on "same layout"), a lease of three ticks, eight ticks, two crashes.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.client import (
    AsyncClient,
    ClientConfig,
    ScalingPolicy,
    StreamConfig,
    TransactionStatus,
    routing_key_fraction,
)
from millstream.client._transactions import AsyncTransaction
from millstream.controller import Controller, ControllerConfig, ControllerRpc, EpochRecord, LocalSegmentStore
from millstream.controller._transactions import commit_queue
from millstream.errors import LeaseExpiredError, StreamSegmentNotExistsError, TransactionNotOpenError
from millstream.model import transactions as tx
from millstream.naming import stream_segment_name
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from millstream.wire.codec import iter_events
from tests.server.raw import Tiers
from tests.transactions.helpers import keys_in, owner

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
SCOPE, STREAM = "sc", "st"
K1, K2, K3 = keys_in(0.0, 0.25)[0], keys_in(0.25, 0.5)[0], keys_in(0.5, 1.0)[0]
KEYS = (K1, K2, K3)
#: The stream's layouts as key ranges, and as the model sees them (which keys each segment owns).
RANGES = (((0.0, 1.0),), ((0.0, 0.5), (0.5, 1.0)), ((0.0, 0.25), (0.25, 1.0)))
LEASE_TICKS = 3
TXNS = 3
MAX_TXN_EVENTS = 3
MAX_PLAIN_EVENTS = 6
MAX_TIME = 8
MAX_CRASHES = 2
FENCE_KEY = "query"
START_TIME = 1_000_000.0
STEP_TIMEOUT_SECONDS = 30.0

LAYOUTS = tuple(tuple(frozenset(k for k in KEYS if a <= routing_key_fraction(k) < b) for a, b in ranges)
                for ranges in RANGES)
SETUP = tx.StreamSetup(LAYOUTS, LEASE_TICKS)

keys = st.sampled_from(KEYS)


class TransactionsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tiers = Tiers("simulated")
        self.clock = ManualClock(START_TIME)  # the controller's: leases and deadlines
        self.model = tx.initial_state(SETUP, TXNS, (FENCE_KEY,))
        self.txns: dict[int, AsyncTransaction[bytes]] = {}
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.run(self.server.start())
        self.controller = self.new_controller()
        self.run(self.controller.create_scope(SCOPE))
        self.run(self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(1))))
        self.client, self.writer, self.plain = self.run(self.connect())

    async def connect(self) -> tuple[AsyncClient, Any, Any]:
        # The client's clock never moves: its pinger never fires (pings are the ``ping`` rule's), and
        # nothing here waits on it.
        client = AsyncClient(self.server.uri, config=ClientConfig(), clock=ManualClock(), rng=random.Random(5))
        return (client, client.transactional_writer(f"{SCOPE}/{STREAM}", lease_seconds=LEASE_TICKS),
                client.event_writer(f"{SCOPE}/{STREAM}"))

    def new_controller(self) -> Controller:
        controller = Controller(LocalSegmentStore(self.server), clock=self.clock, now=self.clock.monotonic,
                                config=ControllerConfig(periodic=False, transaction_workflows=False),
                                rng=random.Random(len(self.txns) + self.model.crashes))
        self.run(controller.start())
        self.server.attach_controller(ControllerRpc(controller))
        return controller

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS))

    def teardown(self) -> None:
        try:
            self.run(self.client.close())
            self.run(self.controller.stop())
            self.run(self.server.stop())
        finally:
            self.loop.close()

    def step(self, transition: Any, *args: Any) -> None:
        self.model = transition(self.model, *args)

    def txn_id(self, t: int) -> str:
        return self.txns[t].txn_id.hex

    def status(self, t: int) -> tx.TxnStatus:
        return self.model.transaction(t).status

    # --- Rules: the clients ----------------------------------------------------------------------------

    @precondition(lambda self: self.model.up and any(r.status is tx.TxnStatus.NONE for r in self.model.txn))
    @rule()
    def begin(self) -> None:
        t = next(n for n in self.model.txn_ids if self.status(n) is tx.TxnStatus.NONE)
        self.txns[t] = self.run(self.writer.begin())
        self.step(tx.begin, t)
        assert self.txns[t].info.deadline == START_TIME + self.model.transaction(t).deadline

    def with_status(self, status: tx.TxnStatus) -> list[int]:
        return [t for t in self.model.txn_ids if self.status(t) is status]

    def writable(self) -> list[int]:
        return [t for t in self.with_status(tx.TxnStatus.OPEN)
                if len(self.model.transaction(t).written()) < MAX_TXN_EVENTS]

    @precondition(lambda self: self.writable())
    @rule(data=st.data(), key=keys)
    def write_event(self, data: st.DataObject, key: str) -> None:
        t = data.draw(st.sampled_from(self.writable()), label="t")
        number = len(self.model.transaction(t).written()) + 1
        self.run(self._write(self.txns[t], f"{t}|{key}|{number}".encode(), key))
        self.step(tx.write_event, t, key)

    @staticmethod
    async def _write(txn: AsyncTransaction[bytes], payload: bytes, key: str) -> None:
        await txn.write_event(payload, routing_key=key)
        await txn.flush()

    @precondition(lambda self: self.model.up and self.with_status(tx.TxnStatus.OPEN))
    @rule(data=st.data())
    def ping(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.with_status(tx.TxnStatus.OPEN)), label="t")
        record = self.model.transaction(t)
        if self.model.clock >= record.deadline:
            try:
                self.run(self.txns[t].ping())
            except LeaseExpiredError:
                return
            raise AssertionError("a ping after the lease lapsed was accepted")
        deadline = self.run(self.txns[t].ping())
        if record.deadline < self.model.clock + LEASE_TICKS:
            self.step(tx.ping, t)
        assert deadline == START_TIME + self.model.transaction(t).deadline

    @precondition(lambda self: self.model.clock < MAX_TIME)
    @rule()
    def tick(self) -> None:
        self.clock.advance(1)
        self.step(tx.tick)

    @precondition(lambda self: self.model.up and self.with_status(tx.TxnStatus.OPEN))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.with_status(tx.TxnStatus.OPEN)), label="t")
        assert self.run(self.txns[t].commit()) is TransactionStatus.COMMITTING
        self.step(tx.commit, t)

    @precondition(lambda self: self.model.up and len(self.with_status(tx.TxnStatus.OPEN)) >= 2)
    @rule(data=st.data())
    def commit_several(self, data: st.DataObject) -> None:
        """``Commit`` for two or more open transactions in a drawn order -- often not the order they
        began in -- before the workflow starts any of them, perhaps behind an earlier pending commit:
        the commit queue then holds several, and must hand them out in commit order, not start order."""
        chosen = data.draw(st.permutations(self.with_status(tx.TxnStatus.OPEN)), label="order")
        count = data.draw(st.integers(2, len(chosen)), label="count")
        for t in chosen[:count]:
            assert self.run(self.txns[t].commit()) is TransactionStatus.COMMITTING
            self.step(tx.commit, t)

    @precondition(lambda self: self.model.up and self.with_status(tx.TxnStatus.OPEN))
    @rule(data=st.data(), again=st.booleans())
    def abort(self, data: st.DataObject, again: bool) -> None:
        t = data.draw(st.sampled_from(self.with_status(tx.TxnStatus.OPEN)), label="t")
        assert self.run(self.txns[t].abort()) is TransactionStatus.ABORTING
        self.step(tx.abort, t)
        if again:  # harmless, changes nothing
            assert self.run(self.txns[t].abort()) is TransactionStatus.ABORTING

    @precondition(lambda self: self.model.plain < MAX_PLAIN_EVENTS)
    @rule(key=keys)
    def write_plain_event(self, key: str) -> None:
        async def write() -> None:
            await self.plain.write_event(f"0|{key}|{self.model.plain + 1}".encode(), routing_key=key)
            await self.plain.flush()
        self.run(write())
        self.step(tx.write_plain_event, key)

    @precondition(lambda self: self.model.up and self.txns)
    @rule(data=st.data(), value=st.integers(1, 3), retry=st.booleans())
    def commit_transactions(self, data: st.DataObject, value: int, retry: bool) -> None:
        """``RequestFencedCommit`` and the controller's ``DecideFencedCommit`` (and, with ``retry``,
        the same request again, as after a lost reply)."""
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.txns)), min_size=1, unique=True), label="txns")
        request = tx.FencedRequest(frozenset(chosen), FENCE_KEY, value)
        for _ in range(2 if retry else 1):
            self.step(tx.request_fenced_commit, request)
            self.step(tx.decide_fenced_commit, len(self.model.inbox))
            expected = self.model.fence_log[-1].outcome
            try:
                result = self.run(self.client.commit_transactions(f"{SCOPE}/{STREAM}", [self.txns[t] for t in chosen],
                                                                  fence=(FENCE_KEY, value)))
            except TransactionNotOpenError:
                assert expected is tx.FenceOutcome.REJECTED, expected
                continue
            assert result.outcome.value == expected.value, (result, expected)
            assert result.recorded == tx.recorded_value(self.model, FENCE_KEY)

    @precondition(lambda self: self.model.up and self.model.crashes < MAX_CRASHES)
    @rule()
    def crash_and_restart_controller(self) -> None:
        before = self.controller.state.to_snapshot()
        self.run(self.controller.stop())  # its process dies: nothing survives but what it recorded
        self.step(tx.crash_controller)
        self.controller = self.new_controller()
        self.step(tx.restart_controller)
        assert self.controller.state.to_snapshot() == before

    # --- Rules: the controller's steps ---------------------------------------------------------------

    @precondition(lambda self: self.model.up and self.model.workflow == tx.Workflow()
                  and self.model.layout_of(self.model.active) < len(LAYOUTS))
    @rule()
    def scale(self) -> None:
        current = self.controller.state.streams[(SCOPE, STREAM)].current
        ranges = RANGES[self.model.layout_of(self.model.active)]
        self.run(self.controller.scale_stream(SCOPE, STREAM, [s.segment_id for s in current.segments], list(ranges)))
        self.step(tx.scale)

    @precondition(lambda self: self.model.up and any(
        r.status is tx.TxnStatus.OPEN and self.model.clock >= r.deadline for r in self.model.txn))
    @rule()
    def expire_lease(self) -> None:
        lapsed = [t for t in self.model.txn_ids if self.status(t) is tx.TxnStatus.OPEN
                  and self.model.clock >= self.model.transaction(t).deadline]
        assert self.run(self.controller.expire_leases()) == len(lapsed)
        for t in lapsed:
            self.step(tx.expire_lease, t)

    @precondition(lambda self: self.model.up and self.with_status(tx.TxnStatus.ABORTING))
    @rule(data=st.data())
    def finish_abort(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.with_status(tx.TxnStatus.ABORTING)), label="t")
        self.run(self.controller.finish_abort(SCOPE, STREAM, self.txn_id(t)))
        self.step(tx.finish_abort, t)

    @precondition(lambda self: self.model.up and self.model.workflow == tx.Workflow() and self.model.commit_queue)
    @rule()
    def start_commit(self) -> None:
        lowest = min(self.model.commit_queue, key=lambda t: self.model.transaction(t).order)
        assert self.run(self.controller.start_commit(SCOPE, STREAM)) == self.txn_id(lowest)
        self.step(tx.start_commit, lowest)

    def unmerged(self) -> list[int]:
        if self.model.workflow == tx.Workflow():
            return []
        record = self.model.transaction(self.model.workflow.txn)
        return [i for i in range(1, len(record.segments) + 1) if i not in record.merged]

    @precondition(lambda self: self.model.up and self.unmerged())
    @rule(data=st.data())
    def merge_txn_segment(self, data: st.DataObject) -> None:
        position = data.draw(st.sampled_from(self.unmerged()), label="position")
        assert self.run(self.controller.merge_transaction_segment(SCOPE, STREAM, position)) is True
        self.step(tx.merge_txn_segment, position)

    @precondition(lambda self: self.model.up and self.model.workflow != tx.Workflow() and self.model.transaction(
        self.model.workflow.txn).merged == frozenset(range(1, len(self.model.transaction(
            self.model.workflow.txn).segments) + 1)))
    @rule()
    def finish_commit(self) -> None:
        assert self.run(self.controller.finish_commit(SCOPE, STREAM)) == self.txn_id(self.model.workflow.txn)
        self.step(tx.finish_commit)

    # --- What clients observe --------------------------------------------------------------------------

    def read_segment(self, name: str) -> list[tx.Event]:
        info = self.server.container_for(name).get_info(name)
        result = self.run(self.server.container_for(name).read(name, 0, info.length))
        assert len(result.data) == info.length
        events = []
        for payload in iter_events(bytes(result.data)):
            source, key, number = payload.decode().split("|")
            events.append(tx.Event(int(source), key, int(number)))
        return events

    def impl_epochs(self) -> list[tuple[Any, bool]]:
        """The stream's epochs as segments by key -- the history, and a roll's duplicate in progress
        (not readable) -- each with whether readers can reach it."""
        record = self.controller.state.streams[(SCOPE, STREAM)]
        epochs = [(epoch.segments, True) for epoch in record.history.epochs]
        pending = record.pending
        if pending is not None and pending["roll"] is not None and not pending["epochs_created"]:
            epochs.append((EpochRecord.from_json(pending["roll"]["duplicate"]).segments, False))
        return epochs

    @invariant()
    def clients_observe_what_the_model_says(self) -> None:
        self.model.check_invariants()
        self.controller.check_invariants()
        # Every transaction's status, as a client asks for it.
        controller = self.client.controller()
        for t, txn in self.txns.items():
            info = self.run(controller.get_transaction(SCOPE, STREAM, txn.txn_id))
            assert info.status.value == self.status(t).value, (t, info.status, self.status(t))
        # What a reader of each key reads now (and will, once a roll in progress finishes).
        epochs = self.impl_epochs()
        assert len(epochs) == len(self.model.epochs)
        contents = [[self.read_segment(stream_segment_name(SCOPE, STREAM, s.segment_id)) for s in segments]
                    for segments, _ in epochs]
        for key in KEYS:
            stream: list[tx.Event] = []
            readable: list[tx.Event] = []
            for (segments, reachable), content in zip(epochs, contents, strict=True):
                position = segments.index(owner(segments, key))
                mine = [e for e in content[position] if e.key == key]
                stream += mine
                if reachable:
                    readable += mine
            assert tuple(stream) == self.model.stream_of(key), (key, stream, self.model.stream_of(key))
            assert tuple(readable) == self.model.readable(key), (key, readable, self.model.readable(key))
        # Sealed exactly the epochs before the active one.
        for e, (segments, _) in enumerate(epochs, start=1):
            for segment in segments:
                name = stream_segment_name(SCOPE, STREAM, segment.segment_id)
                assert self.server.container_for(name).get_info(name).sealed == self.model.epoch(e).sealed, (e, name)
        # The transaction segments: merged ones gone, others there until the abort deletes them.
        for t, txn in self.txns.items():
            record = self.model.transaction(t)
            for position, segment in enumerate(txn.info.transaction_segments, start=1):
                gone = position in record.merged or record.status in (tx.TxnStatus.ABORTED, tx.TxnStatus.COMMITTED)
                try:
                    self.server.container_for(segment.name).get_info(segment.name)
                    present = True
                except StreamSegmentNotExistsError:
                    present = False
                assert present != gone, (t, position, record)
        recorded = self.run(self.client.get_fence(f"{SCOPE}/{STREAM}", FENCE_KEY))
        assert (recorded or 0) == tx.recorded_value(self.model, FENCE_KEY)
        # The commit queue: the committing transactions in the order the workflow will take them.
        queue = commit_queue(self.controller.state.streams[(SCOPE, STREAM)].transactions)
        expected = sorted(self.model.commit_queue, key=lambda t: self.model.transaction(t).order)
        assert [r.txn_id for r in queue] == [self.txn_id(t) for t in expected], (queue, expected)


TransactionsMachine.TestCase.settings = settings(
    max_examples=1000 if NIGHTLY else 50, stateful_step_count=80 if NIGHTLY else 30, deadline=None)
test_transactions_vs_model = TransactionsMachine.TestCase


class _Drawn:
    """``st.data()`` for a rule called by hand: every draw is ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.value


def test_a_fenced_multi_commit_orders_its_transactions_as_they_began() -> None:
    """The spec's request is a set, given commit orders by the transactions' identities (here: the
    order they began), so a list in another order -- here [2, 1] -- commits 1 first; also after a
    restart from the metadata log.  (A Hypothesis run found the controller taking the list's order.)"""
    for crashes in (0, 1):
        machine = TransactionsMachine()
        try:
            for _ in range(3):
                machine.begin()
            for _ in range(crashes):
                machine.crash_and_restart_controller()
            machine.commit_transactions(_Drawn([2, 1]), value=1, retry=False)  # type: ignore[arg-type]
            machine.clients_observe_what_the_model_says()
            machine.start_commit()
            machine.clients_observe_what_the_model_says()
        finally:
            machine.teardown()


class _DrawnInTurn:
    """``st.data()`` for a rule called by hand: the draws are ``values``, in turn.  (It and ``_Drawn``
    stand in for Hypothesis' ``DataObject``, which cannot be built by hand: hence the calls'
    ``type: ignore[arg-type]``.)"""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


def test_commits_queued_out_of_start_order_are_taken_in_commit_order() -> None:
    """Three transactions begin 1, 2, 3; 1 commits, then 3 and 2 while 1's commit is still pending.
    The queue is 1, 3, 2 (commit order), not 1, 2, 3 (start order): the controller's queue says so and
    its workflow takes 3 before 2.  (Keying the controller's ``commit_queue`` by ``number`` -- start
    order -- fails here at the queue check after the commits.)"""
    machine = TransactionsMachine()
    try:
        for _ in range(3):
            machine.begin()
        machine.commit(_Drawn(1))  # type: ignore[arg-type]
        machine.commit_several(_DrawnInTurn([3, 2], 2))  # type: ignore[arg-type]
        machine.clients_observe_what_the_model_says()
        for expected in (1, 3, 2):
            assert machine.model.workflow == tx.Workflow()
            machine.start_commit()
            assert machine.model.workflow.txn == expected
            for position in machine.unmerged():
                machine.merge_txn_segment(_Drawn(position))  # type: ignore[arg-type]
            machine.finish_commit()
            machine.clients_observe_what_the_model_says()
        assert [machine.status(t) for t in (1, 2, 3)] == [tx.TxnStatus.COMMITTED] * 3
    finally:
        machine.teardown()
