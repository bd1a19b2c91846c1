"""Stream transactions in the controller as a service, on the simulated tiers (and on files for a
whole-node restart): commit order, aborts, rolling across a scale, lease expiry on a manual clock,
sealing, the fenced multi-commit, bad input that changes nothing, and a controller that dies at every
step of a commit and of a fenced multi-commit -- after which a restarted controller finishes the work
exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

import pytest

from millstream import limits
from millstream.client import ScalingPolicy, StreamConfig
from millstream.controller import Controller, StreamState, TxnStatus
from millstream.errors import (
    FenceValueError,
    InvalidArgumentError,
    LeaseExpiredError,
    LeaseTooLargeError,
    StreamSealedError,
    StreamSegmentNotExistsError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.naming import stream_segment_name
from millstream.values import CommitOutcome, MultiCommitResult, TransactionInfo, TransactionStatus
from millstream.wire import encode_event
from tests.controller.helpers import Crash, Harness, harness, run
from tests.controller.test_controller import Unchanged
from tests.server.raw import Tiers
from tests.transactions.helpers import (
    SCOPE,
    STREAM,
    CrashingStore,
    Ev,
    exists,
    keys_in,
    read_key,
    transaction_segments,
    write_plain,
    write_txn,
)

LOW, HIGH = keys_in(0.0, 0.25)[0], keys_in(0.75, 1.0)[0]  # one key in each half of the key space
MIDDLE = keys_in(0.25, 0.5)[0]


def fixed(segments: int) -> StreamConfig:
    return StreamConfig(scaling=ScalingPolicy.fixed(segments))


async def stream(controller: Controller, segments: int = 2) -> None:
    await controller.create_scope(SCOPE)
    await controller.create_stream(SCOPE, STREAM, fixed(segments))


def events(source: str, count: int = 2, keys: tuple[str, ...] = (LOW, HIGH)) -> list[Ev]:
    return [Ev(source, key, n) for key in keys for n in range(1, count + 1)]


def of(source: str, key: str, count: int = 2) -> list[Ev]:
    return [Ev(source, key, n) for n in range(1, count + 1)]


def status(controller: Controller, info: TransactionInfo) -> TxnStatus:
    return controller.state.streams[(SCOPE, STREAM)].transactions[info.txn_id.hex].status


async def split(controller: Controller) -> None:
    """Scale the current epoch's every segment into halves of [0, 1) (or its one segment into two)."""
    current = controller.state.streams[(SCOPE, STREAM)].current
    await controller.scale_stream(SCOPE, STREAM, [s.segment_id for s in current.segments], [(0.0, 0.5), (0.5, 1.0)])


async def merge_all(controller: Controller) -> None:
    current = controller.state.streams[(SCOPE, STREAM)].current
    await controller.scale_stream(SCOPE, STREAM, [s.segment_id for s in current.segments], [(0.0, 1.0)])


# --- Commit order, atomicity, aborts ------------------------------------------------------------------


def test_commits_land_whole_in_commit_order_and_aborted_transactions_vanish() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            first, second, dropped = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(3)]
            await write_plain(test, controller, events("plain", 1))
            for info, name in ((first, "first"), (second, "second"), (dropped, "dropped")):
                await write_txn(test, info, events(name))
            assert await read_key(test, controller, LOW) == of("plain", LOW, 1), "transactions stay invisible"
            assert await controller.commit_transaction(SCOPE, STREAM, second.txn_id.hex) is TransactionStatus.COMMITTING
            await controller.commit_transaction(SCOPE, STREAM, first.txn_id.hex)
            await controller.abort_transaction(SCOPE, STREAM, dropped.txn_id.hex)
            assert await read_key(test, controller, LOW) == of("plain", LOW, 1), "decided, not merged yet"
            orders = [controller.state.streams[(SCOPE, STREAM)].transactions[i.txn_id.hex].order
                      for i in (second, first)]
            assert orders == [1, 2]
            assert await controller.drive_transactions(SCOPE, STREAM) == 3  # an abort, then two commits
            for key in (LOW, HIGH):
                assert await read_key(test, controller, key) == [
                    *of("plain", key, 1), *of("second", key), *of("first", key)]
            assert [status(controller, i) for i in (first, second, dropped)] == [
                TxnStatus.COMMITTED, TxnStatus.COMMITTED, TxnStatus.ABORTED]
            for name in transaction_segments(dropped) + transaction_segments(first):
                assert not exists(test, name), "merged or deleted: no transaction segment is left"
            assert controller.state.streams[(SCOPE, STREAM)].current.epoch == 0, "no roll was needed"
            replayed = await test.controller()
            assert replayed.state.to_snapshot() == controller.state.to_snapshot()
    run(scenario)


def test_a_transaction_begun_before_a_scale_rolls_between_the_writes_before_and_after_its_commit() -> None:
    """Begun on one segment; the stream splits; the commit rolls the transaction into a duplicate of its
    epoch, after everything written before and before everything written after -- and a transaction
    begun in the split epoch then commits straight into the epoch the roll made active."""
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller, 1)
            rolled = await controller.create_transaction(SCOPE, STREAM, 30)
            await write_txn(test, rolled, events("rolled"))
            await write_plain(test, controller, [Ev("plain", LOW, 1), Ev("plain", HIGH, 1)])
            await split(controller)
            direct = await controller.create_transaction(SCOPE, STREAM, 30)
            await write_txn(test, direct, events("direct"))
            await write_plain(test, controller, [Ev("plain", LOW, 2), Ev("plain", HIGH, 2)])
            await controller.commit_transaction(SCOPE, STREAM, rolled.txn_id.hex)
            assert await controller.start_commit(SCOPE, STREAM) == rolled.txn_id.hex
            record = controller.state.streams[(SCOPE, STREAM)]
            assert record.state is StreamState.COMMITTING and record.pending["roll"] is not None
            assert await controller.merge_transaction_segment(SCOPE, STREAM, 1) is True
            assert await controller.merge_transaction_segment(SCOPE, STREAM, 1) is False, "a repeat merges nothing"
            await write_plain(test, controller, [Ev("plain", LOW, 3)])  # during the roll: still epoch 1
            assert await read_key(test, controller, LOW) == of("plain", LOW, 3), "the duplicate is not readable"
            tail = await controller.get_tail_cut(SCOPE, STREAM)
            assert await controller.finish_commit(SCOPE, STREAM) == rolled.txn_id.hex  # (merges what is left)
            assert [e.epoch for e in record.history.epochs] == [0, 1, 2, 3]
            assert record.state is StreamState.IDLE and status(controller, rolled) is TxnStatus.COMMITTED
            await write_plain(test, controller, [Ev("plain", LOW, 4), Ev("plain", HIGH, 3)])
            assert await read_key(test, controller, LOW) == [*of("plain", LOW, 3), *of("rolled", LOW),
                                                            Ev("plain", LOW, 4)]
            assert await read_key(test, controller, HIGH) == [*of("plain", HIGH, 2), *of("rolled", HIGH),
                                                             Ev("plain", HIGH, 3)]
            assert set(tail.positions) == {s.segment_id for s in record.history.epoch(1).segments}
            # Begun in epoch 1; the active epoch 3 is its duplicate, in the same containers: no roll.
            await controller.commit_transaction(SCOPE, STREAM, direct.txn_id.hex)
            await controller.drive_transactions(SCOPE, STREAM)
            assert [e.epoch for e in record.history.epochs] == [0, 1, 2, 3]
            assert await read_key(test, controller, LOW) == [*of("plain", LOW, 3), *of("rolled", LOW),
                                                            Ev("plain", LOW, 4), *of("direct", LOW)]
            successors = await controller.get_successors(SCOPE, STREAM, record.history.epoch(1).segments[0].segment_id)
            assert [s.segment.segment_id for s in successors] == [
                s.segment_id for s in record.history.epoch(2).segments if s.key_start < 0.5]
            replayed = await test.controller()
            assert replayed.state.to_snapshot() == controller.state.to_snapshot()
    run(scenario)


def test_a_merge_back_to_one_segment_rolls_a_split_transaction_into_two_duplicates() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller, 2)
            info = await controller.create_transaction(SCOPE, STREAM, 30)
            await write_txn(test, info, events("t", 3, (LOW, MIDDLE, HIGH)))
            await merge_all(controller)
            await write_plain(test, controller, [Ev("plain", MIDDLE, 1)])
            await controller.commit_transaction(SCOPE, STREAM, info.txn_id.hex)
            await controller.drive_transactions(SCOPE, STREAM)
            record = controller.state.streams[(SCOPE, STREAM)]
            assert [len(e.segments) for e in record.history.epochs] == [2, 1, 2, 1]
            for key in (LOW, MIDDLE, HIGH):
                assert [e for e in await read_key(test, controller, key) if e.source == "t"] == of("t", key, 3)
            assert (await read_key(test, controller, MIDDLE))[0] == Ev("plain", MIDDLE, 1)
    run(scenario)


# --- Leases -------------------------------------------------------------------------------------------


def test_a_lease_lapses_on_the_manual_clock_unless_pinged_and_the_controller_aborts_it() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller()  # workflows on: the worker deletes what expires
            await stream(controller)
            kept, lapsed = [await controller.create_transaction(SCOPE, STREAM, 10) for _ in range(2)]
            await write_txn(test, lapsed, events("lapsed"))
            assert kept.deadline == test.clock.monotonic() + 10
            test.clock.advance(6)
            assert await controller.ping_transaction(SCOPE, STREAM, kept.txn_id.hex) == \
                test.clock.monotonic() + 10
            test.clock.advance(4)  # lapsed's deadline, exactly
            await controller.tick()
            assert status(controller, lapsed) in (TxnStatus.ABORTING, TxnStatus.ABORTED)
            assert status(controller, kept) is TxnStatus.OPEN
            await drain_worker(controller)
            assert status(controller, lapsed) is TxnStatus.ABORTED
            assert not any(exists(test, name) for name in transaction_segments(lapsed))
            with pytest.raises(TransactionNotOpenError):
                await controller.ping_transaction(SCOPE, STREAM, lapsed.txn_id.hex)
            test.clock.advance(7)  # past kept's deadline, before a tick noticed
            with pytest.raises(LeaseExpiredError):
                await controller.ping_transaction(SCOPE, STREAM, kept.txn_id.hex)
            # The spec lets a lapsed but not yet expired transaction commit; the controller does too.
            await controller.commit_transaction(SCOPE, STREAM, kept.txn_id.hex)
            await controller.tick()
            await drain_worker(controller)
            assert status(controller, kept) is TxnStatus.COMMITTED
    run(scenario)


async def drain_worker(controller: Controller) -> None:
    """Let the controller's transaction workers finish (bounded)."""
    for _ in range(1000):
        workers = [w for w in controller._transaction_workers.values() if not w.done()]
        if not workers:
            return
        await asyncio.wait(workers, timeout=5)
    raise AssertionError("the transaction workers never finished")


def test_pings_stop_extending_at_the_maximum_execution_time() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            info = await controller.create_transaction(SCOPE, STREAM, 1)
            cap = info.opened + min(limits.TRANSACTION_EXECUTION_LEASES_MAX * 1.0,
                                       limits.TRANSACTION_EXECUTION_SECONDS_MAX)
            for _ in range(int((cap - info.opened) / 0.9) + 5):
                test.clock.advance(0.9)
                try:
                    deadline = await controller.ping_transaction(SCOPE, STREAM, info.txn_id.hex)
                except LeaseExpiredError:
                    break
                assert deadline <= cap
            else:
                raise AssertionError("pings kept the transaction open past its maximum execution time")
            assert test.clock.monotonic() >= cap
            assert await controller.expire_leases() == 1
    run(scenario)


# --- Sealing --------------------------------------------------------------------------------------------


def test_sealing_commits_the_committing_and_aborts_the_open_transactions_first() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            committing, still_open = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(2)]
            await write_txn(test, committing, events("committing"))
            await write_txn(test, still_open, events("open"))
            await controller.commit_transaction(SCOPE, STREAM, committing.txn_id.hex)
            await controller.seal_stream(SCOPE, STREAM)
            assert controller.state.streams[(SCOPE, STREAM)].sealed
            assert status(controller, committing) is TxnStatus.COMMITTED
            assert status(controller, still_open) is TxnStatus.ABORTED
            assert await read_key(test, controller, LOW) == of("committing", LOW)
            with pytest.raises(StreamSealedError):
                await controller.create_transaction(SCOPE, STREAM)
            await controller.delete_stream(SCOPE, STREAM)
            assert controller.state.active_transactions == 0
    run(scenario)


# --- The fenced multi-commit ----------------------------------------------------------------------------


def test_a_replayed_batch_commits_nothing_and_its_new_transactions_are_aborted() -> None:
    """A Spark driver commits batch 7 with two tasks' transactions; it dies before its own commit log,
    replays batch 7 in new tasks with new transactions, and commits again: the fence turns that into
    "already committed" and aborts the replay's transactions; batch 8 commits."""
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            batch = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(2)]
            for n, info in enumerate(batch):
                await write_txn(test, info, events(f"task{n}"))
            reply = await controller.commit_transactions(SCOPE, STREAM, [i.txn_id.hex for i in batch], ("query", 7))
            assert reply == MultiCommitResult(CommitOutcome.COMMITTED, 7)
            replay = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(2)]
            for n, info in enumerate(replay):
                await write_txn(test, info, events(f"replay{n}"))
            again = await controller.commit_transactions(SCOPE, STREAM, [i.txn_id.hex for i in replay], ("query", 7))
            assert again == MultiCommitResult(CommitOutcome.ALREADY_COMMITTED, 7)
            retried = await controller.commit_transactions(SCOPE, STREAM, [i.txn_id.hex for i in batch], ("query", 7))
            assert retried == MultiCommitResult(CommitOutcome.ALREADY_COMMITTED, 7), "a retry after a lost reply"
            later = await controller.create_transaction(SCOPE, STREAM, 30)
            await write_txn(test, later, events("batch8"))
            assert (await controller.commit_transactions(SCOPE, STREAM, [later.txn_id.hex], ("query", 8))).outcome is \
                CommitOutcome.COMMITTED
            await controller.drive_transactions(SCOPE, STREAM)
            assert [status(controller, i) for i in batch + replay + [later]] == [
                TxnStatus.COMMITTED] * 2 + [TxnStatus.ABORTED] * 2 + [TxnStatus.COMMITTED]
            assert await read_key(test, controller, LOW) == [*of("task0", LOW), *of("task1", LOW),
                                                            *of("batch8", LOW)]
            assert await controller.get_fence(SCOPE, STREAM, "query") == 8
            assert await controller.get_fence(SCOPE, STREAM, "other") is None
    run(scenario)


# --- Crashes at every step --------------------------------------------------------------------------


async def _prepare(test: Harness, store: CrashingStore, rolled: bool, fenced: bool) -> tuple[Controller, list[dict]]:
    controller = await test.controller(store=store, transaction_workflows=False)
    await stream(controller, 1 if rolled else 2)
    infos = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(2)]
    for n, info in enumerate(infos):
        await write_txn(test, info, events(f"t{n}"))
    await write_plain(test, controller, [Ev("plain", LOW, 1)])
    if rolled:
        await split(controller)
    return controller, infos


async def _decide(controller: Controller, infos: list[dict], fenced: bool) -> None:
    if fenced:
        reply = await controller.commit_transactions(SCOPE, STREAM, [i.txn_id.hex for i in infos], ("q", 1))
        assert reply.outcome is CommitOutcome.COMMITTED
    else:
        for info in infos:
            await controller.commit_transaction(SCOPE, STREAM, info.txn_id.hex)


async def _check_committed_once(test: Harness, controller: Controller, infos: list[dict]) -> None:
    for info in infos:
        assert status(controller, info) is TxnStatus.COMMITTED
    assert await read_key(test, controller, LOW) == [Ev("plain", LOW, 1), *of("t0", LOW), *of("t1", LOW)]
    assert await read_key(test, controller, HIGH) == [*of("t0", HIGH), *of("t1", HIGH)]
    record = controller.state.streams[(SCOPE, STREAM)]
    assert record.state is StreamState.IDLE and record.pending is None
    controller.check_invariants()


@pytest.mark.parametrize("fenced", [False, True], ids=["commit", "fenced"])
@pytest.mark.parametrize("rolled", [False, True], ids=["direct", "rolled"])
def test_a_controller_that_dies_at_any_step_of_a_commit_finishes_it_once_after_a_restart(
        rolled: bool, fenced: bool) -> None:
    """Dry run: count the store changes of deciding and driving the commits.  Then, for every change n
    and both ways of dying (before the change reaches the store, or right after), a fresh node dies
    there; a new controller starts on the same store -- resuming what was recorded -- and the caller
    retries its request if it never got an answer.  Both transactions end committed, each event
    visible exactly once, in commit order, and the replayed state is the live one's."""
    async def count() -> int:
        async with harness() as test:
            store = CrashingStore(test.store())
            controller, infos = await _prepare(test, store, rolled, fenced)
            store.arm(0)
            await _decide(controller, infos, fenced)
            await controller.drive_transactions(SCOPE, STREAM)
            await _check_committed_once(test, controller, infos)
            return len(store.calls)

    async def crash_at(n: int, landed: bool) -> None:
        async with harness() as test:
            store = CrashingStore(test.store())
            controller, infos = await _prepare(test, store, rolled, fenced)
            store.arm(n, landed=landed)
            answered = False
            try:
                await _decide(controller, infos, fenced)
                answered = True
                await controller.drive_transactions(SCOPE, STREAM)
                raise AssertionError(f"change {n} was not reached")
            except Crash:
                pass
            await controller.stop()  # the process is gone; its durable state is in the store
            restarted = await test.controller(store=store.inner)  # resumes a commit left pending on start
            if not answered:  # the caller never got an answer: it sends the request again
                if fenced:
                    reply = await restarted.commit_transactions(SCOPE, STREAM, [i.txn_id.hex for i in infos], ("q", 1))
                    assert reply.recorded == 1
                else:
                    for info in infos:
                        if status(restarted, info) is TxnStatus.OPEN:
                            await restarted.commit_transaction(SCOPE, STREAM, info.txn_id.hex)
                        else:
                            with pytest.raises(TransactionNotOpenError):  # committing twice is refused
                                await restarted.commit_transaction(SCOPE, STREAM, info.txn_id.hex)
            await drain_worker(restarted)
            await restarted.drive_transactions(SCOPE, STREAM)
            await _check_committed_once(test, restarted, infos)
            assert (await test.controller()).state.to_snapshot() == restarted.state.to_snapshot()

    async def scenario() -> None:
        changes = await count()
        assert changes >= (4 if not rolled else 10), changes
        for n in range(1, changes + 1):
            for landed in (False, True):
                await crash_at(n, landed)
    run(scenario, 120)


def test_a_whole_node_restart_on_files_in_the_middle_of_a_roll_finishes_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        tiers = Tiers("files", tmp_path)
        async with harness(tiers=tiers) as test:
            store = CrashingStore(test.store())
            controller, infos = await _prepare(test, store, True, False)
            await _decide(controller, infos, False)
            await controller.start_commit(SCOPE, STREAM)
            await controller.merge_transaction_segment(SCOPE, STREAM, 1)
            store.arm(3)  # (create the duplicate again, find segment 1 merged, then die sealing the duplicate)
            with pytest.raises(Crash):
                await controller.finish_commit(SCOPE, STREAM)
            assert store.calls[-1][0] == "seal"
        async with harness(tiers=tiers) as test:  # the containers replay their logs; the controller its own
            restarted = await test.controller()
            await drain_worker(restarted)
            await _check_committed_once(test, restarted, infos)
            assert len(restarted.state.streams[(SCOPE, STREAM)].history.epochs) == 6  # 0, split, 2 rolls x 2
    run(scenario)


# --- Bad input ----------------------------------------------------------------------------------------


def test_bad_requests_raise_typed_errors_and_change_nothing() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            info = await controller.create_transaction(SCOPE, STREAM, 30)
            done = await controller.create_transaction(SCOPE, STREAM, 30)
            await controller.commit_transaction(SCOPE, STREAM, done.txn_id.hex)
            await controller.drive_transactions(SCOPE, STREAM)
            unknown = "0" * 32
            same = Unchanged(controller)
            await same.fails(TransactionNotOpenError, controller.commit_transaction(SCOPE, STREAM, done.txn_id.hex),
                             "committed")
            await same.fails(TransactionNotFoundError, controller.commit_transaction(SCOPE, STREAM, unknown))
            await same.fails(TransactionNotOpenError, controller.abort_transaction(SCOPE, STREAM, done.txn_id.hex))
            await same.fails(LeaseTooLargeError, controller.create_transaction(SCOPE, STREAM, 10_000))
            await same.fails(LeaseTooLargeError, controller.create_transaction(SCOPE, STREAM, 0.5))
            await same.fails(FenceValueError,
                             controller.commit_transactions(SCOPE, STREAM, [info.txn_id.hex], ("q", 1.5)))
            await same.fails(FenceValueError,
                             controller.commit_transactions(SCOPE, STREAM, [info.txn_id.hex], ("q", "2")))
            await same.fails(TransactionNotOpenError,
                             controller.commit_transactions(SCOPE, STREAM, [info.txn_id.hex, done.txn_id.hex],
                                                            ("q", 1)))
            await same.fails(TransactionNotFoundError,
                             controller.commit_transactions(SCOPE, STREAM, [info.txn_id.hex, unknown], ("q", 1)))
            await same.fails(InvalidArgumentError, controller.commit_transactions(SCOPE, STREAM, [], ("q", 1)))
            await same.fails(InvalidArgumentError, controller.commit_transaction(SCOPE, STREAM, "not-an-id"))
            assert status(controller, info) is TxnStatus.OPEN
            # Writing to a committed transaction: its segments were merged away; nothing lands anywhere.
            name = transaction_segments(done)[0]
            with pytest.raises(StreamSegmentNotExistsError):
                await test.container(name).append(name, encode_event(b"late"))
            parent = stream_segment_name(SCOPE, STREAM, done.segments[0].segment_id)
            assert test.segment(parent).length == 0
            # Aborting twice is harmless: the second time records nothing.
            await controller.abort_transaction(SCOPE, STREAM, info.txn_id.hex)
            before, length = controller.state.to_snapshot(), controller._log.length
            assert await controller.abort_transaction(SCOPE, STREAM, info.txn_id.hex) is TransactionStatus.ABORTING
            assert (controller.state.to_snapshot(), controller._log.length) == (before, length)
    run(scenario)


def test_the_limits_on_live_and_remembered_transactions(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            await stream(controller)
            monkeypatch.setattr(limits, "TRANSACTIONS_ACTIVE_PER_STREAM_MAX", 3)
            monkeypatch.setattr(limits, "TRANSACTIONS_FINISHED_PER_STREAM_MAX", 2)
            infos = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(3)]
            await Unchanged(controller).fails(InvalidArgumentError, controller.create_transaction(SCOPE, STREAM, 30),
                                              "live transactions")
            for info in infos:
                await controller.abort_transaction(SCOPE, STREAM, info.txn_id.hex)
            await controller.drive_transactions(SCOPE, STREAM)
            record = controller.state.streams[(SCOPE, STREAM)]
            finished = sorted(i.txn_id.hex for i in infos)  # (aborts finish in the order of their ids)
            assert record.finished_transactions == finished[1:], "the first to finish is forgotten"
            with pytest.raises(TransactionNotFoundError):
                await controller.get_transaction(SCOPE, STREAM, finished[0])
            listed = await controller.list_transactions(SCOPE, STREAM)
            assert listed == {UUID(hex=t): TransactionStatus.ABORTED for t in finished[1:]}
            replayed = await test.controller()
            assert replayed.state.to_snapshot() == controller.state.to_snapshot()
    run(scenario)


def test_snapshots_carry_transactions_fences_and_a_commit_in_progress() -> None:
    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False, snapshot_records=3)
            await stream(controller, 1)
            infos = [await controller.create_transaction(SCOPE, STREAM, 30) for _ in range(3)]
            await write_txn(test, infos[0], events("a"))
            await split(controller)
            await controller.commit_transactions(SCOPE, STREAM, [infos[0].txn_id.hex], ("q", 3))
            await controller.start_commit(SCOPE, STREAM)
            await controller.abort_transaction(SCOPE, STREAM, infos[1].txn_id.hex)
            before = controller.state.to_snapshot()
            await controller.stop()
            replayed = await test.controller(transaction_workflows=False, snapshot_records=3)
            assert replayed.state.to_snapshot() == before
            assert replayed.state.records_since_snapshot < 3
            await replayed.drive_transactions(SCOPE, STREAM)
            assert status(replayed, infos[0]) is TxnStatus.COMMITTED
            assert await read_key(test, replayed, LOW) == of("a", LOW)
    run(scenario)
