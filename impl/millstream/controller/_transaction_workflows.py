"""The controller's stream-transaction methods and workflows (``Controller`` inherits them).

Theory of operation (the decisions and records are ``_transactions``; ``spec/Transactions.tla`` is
the contract).  Requests -- ``create_transaction``, ``ping_transaction``, ``commit_transaction``,
``abort_transaction``, ``commit_transactions`` (the fenced multi-commit) -- each plan one record
against the state and append it with the controller's conditional append (``Controller._commit``),
so every decision is atomic and durable before it is answered; a request that commits or aborts
returns once its decision is recorded (COMMITTING or ABORTING) and leaves the rest to the stream's
*worker*.

The worker (one tracked task per stream with work, started by a decision, by ``tick`` and on start)
runs ``drive_transactions``: under the stream's lock, one step at a time -- first any workflow left
pending (a commit a crash interrupted, or a scale), then the aborts, then the committing transaction
with the lowest commit order, start to finish.  The steps are the spec's:

* ``start_commit`` (StartCommit): record ``commit_started`` with the targets (the active segments,
  or a roll's duplicates, which it creates);
* ``merge_transaction_segment`` (MergeTxnSegment): seal and merge one transaction segment onto its
  target -- idempotent on the store, so nothing records it;
* ``finish_commit`` (FinishCommit): after a roll seal the duplicates, create the active duplicates,
  record ``roll_epochs_created``, seal the old active epoch; record ``commit_completed``;
* ``finish_abort`` (FinishAbort): delete the transaction segments, record ``txn_aborted``;
* ``expire_leases`` (ExpireLease, on ``tick``): record ``txns_aborting`` for every lapsed lease.

Every step repeats safely after a crash at any point: a restarted controller finds the commit in
``pending`` and finishes it before any other change of the stream.  With
``ControllerConfig.transaction_workflows=False`` nothing runs a step by itself (not the worker, not
``tick``, not ``start``): the owner calls the step methods one by one -- the stateful test does, in
lockstep with the model.

Sealing a stream first finishes its committing transactions and aborts its open ones
(``_settle_transactions``): a sealed stream has no live transaction.

Tracing (``tests/trace``, against ``spec/Transactions.tla``).  Every decision above is a record, and
a test sees it land at the store.  A fenced multi-commit is the exception -- its request and a decision
that records nothing are visible nowhere else -- so a controller given a ``tracer`` reports them:
``RequestFencedCommit`` (``request``: a number per controller, ``scope``, ``stream``, ``txns``,
``key``, ``value``, and ``seen``: the value recorded for the key when it arrived, 0 for none) and
``DecideFencedCommit`` (``request``, ``outcome``: committed | already_committed | rejected, ``seen``:
the recorded value the decision was planned against, and ``recorded``: whether a record carries it --
then it takes effect when that record is durable).  Without a tracer this costs one comparison.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from millstream import limits
from millstream.controller._epochs import EpochRecord
from millstream.controller._state import ControllerState, StreamRecord, StreamState
from millstream.controller._transactions import (
    FenceOutcome,
    TransactionRecord,
    TxnStatus,
    check_fence,
    check_lease,
    check_transaction_id,
    commit_queue,
    commit_target,
    decide_fenced_commit,
    expired,
    lease_deadline,
    next_transaction_step,
    ping_deadline,
    roll_epochs,
)
from millstream.errors import (
    InternalError,
    InvalidArgumentError,
    RequestTimeoutError,
    StreamSealedError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.naming import transaction_segment_name
from millstream.randomness import random_uuid
from millstream.values import CommitOutcome, MultiCommitResult, SegmentWithRange, TransactionInfo, TransactionStatus

if TYPE_CHECKING:
    from millstream.controller._config import ControllerConfig
    from millstream.controller._segment_store import SegmentStore
    from millstream.randomness import RandomSource
    from millstream.segmentstore.tracing import Tracer

__all__ = ["TransactionWorkflows"]

log = logging.getLogger("millstream.controller")

_Key = tuple[str, str]
_T = TypeVar("_T")


class TransactionWorkflows:
    """Stream transactions: the ``Controller``'s methods for them (a mixin over its state, log,
    store and locks)."""

    if TYPE_CHECKING:  # provided by Controller
        _store: SegmentStore
        _state: ControllerState
        _rng: RandomSource
        _closed: bool
        _transaction_workers: dict[_Key, asyncio.Task[None]]
        _transaction_work: set[_Key]
        _tracer: Tracer | None
        _traced_requests: int
        config: ControllerConfig
        failed_transaction_runs: int

        def _check_open(self) -> None: ...
        def _time(self) -> float: ...
        def _stream(self, scope: str, stream: str) -> StreamRecord: ...
        async def _acquire_stream_lock(self, key: _Key) -> asyncio.Lock: ...
        def _name(self, stream: StreamRecord, identifier: int) -> str: ...
        async def _commit(self, plan: Callable[[ControllerState], dict[str, Any] | None]) -> dict[str, Any] | None:
            ...
        async def _locked(self, key: _Key, work: Callable[[], Awaitable[Any]]) -> Any: ...
        async def _finish_pending(self, key: _Key) -> None: ...

    # --- Helpers -----------------------------------------------------------------------------------

    def _transaction(self, scope: str, stream: str, txn_id: str) -> TransactionRecord:
        found = self._stream(scope, stream).transactions.get(txn_id)
        if found is None:
            raise TransactionNotFoundError(f"stream {scope}/{stream} has no transaction {txn_id}")
        return found

    @staticmethod
    def _closed_to_transactions(record: StreamRecord) -> bool:
        return record.sealed or record.state in (StreamState.SEALING, StreamState.DELETING)

    def _transaction_segment(self, stream: StreamRecord, record: TransactionRecord, position: int) -> str:
        """The hidden segment of ``record`` at ``position`` (from 1) of its epoch."""
        parent = self._name(stream, record.segments[position - 1].segment_id)
        return transaction_segment_name(parent, record.uuid)

    def _transaction_info(self, stream: StreamRecord, record: TransactionRecord) -> TransactionInfo:
        return TransactionInfo(stream.qualified_name, UUID(hex=record.txn_id), TransactionStatus(record.status.value),
                               record.epoch,
                               tuple(SegmentWithRange(s.segment_id, s.key_start, s.key_end,
                                                      self._name(stream, s.segment_id)) for s in record.segments),
                               record.lease, record.deadline, record.order, record.opened)

    def _colocation(self, stream: StreamRecord) -> Callable[[int, int], bool]:
        def colocated(a: int, b: int) -> bool:
            return self._store.container_of(self._name(stream, a)) == self._store.container_of(self._name(stream, b))
        return colocated

    def _kick(self, key: _Key) -> None:
        """There may be transaction work on ``key``: make sure its worker runs (not in stepping mode)."""
        if not self.config.transaction_workflows or self._closed:
            return
        self._transaction_work.add(key)
        worker = self._transaction_workers.get(key)
        if worker is None or worker.done():
            self._transaction_workers[key] = asyncio.get_running_loop().create_task(
                self._work(key), name=f"controller-transactions-{key[0]}/{key[1]}")

    async def _work(self, key: _Key) -> None:
        try:
            while key in self._transaction_work and not self._closed:
                self._transaction_work.discard(key)
                if key not in self._state.streams:
                    return
                if await self.drive_transactions(*key) >= limits.TRANSACTION_WORKFLOW_STEPS_PER_RUN_MAX:
                    self._transaction_work.add(key)  # more to do: another run (after others had a turn)
                    await asyncio.sleep(0)
        except Exception:  # logged and left recorded: the next tick kicks the worker again
            self.failed_transaction_runs += 1
            log.exception("controller: the transaction workflows of %s/%s failed; will retry", *key)
        finally:
            if self._transaction_workers.get(key) is asyncio.current_task():
                del self._transaction_workers[key]

    async def _stop_transaction_workers(self) -> None:
        workers = list(self._transaction_workers.values())
        self._transaction_workers.clear()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    def _kick_all(self) -> None:
        """Kick the worker of every stream with transaction work recorded (start and every tick)."""
        for key, stream in self._state.streams.items():
            if (stream.pending is not None and stream.pending["kind"] == "commit") or any(
                    r.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING) for r in stream.transactions.values()):
                self._kick(key)

    async def _stepping(self, key: _Key, work: Callable[[], Awaitable[_T]]) -> _T:
        """Run one workflow step holding the stream's lock (without finishing what is pending first)."""
        self._check_open()
        lock = await self._acquire_stream_lock(key)
        try:
            return await work()
        finally:
            lock.release()

    # --- Requests ----------------------------------------------------------------------------------

    async def create_transaction(self, scope: str, stream: str, lease: float | None = None) -> TransactionInfo:
        """Begin a transaction on the stream's current epoch with ``lease`` seconds (default
        ``limits.TRANSACTION_LEASE_DEFAULT_SECONDS``).  Raises ``LeaseTooLargeError``,
        ``StreamSealedError``, ``StreamNotFoundError``; ``InvalidArgumentError`` beyond the limits on
        live transactions."""
        self._check_open()
        lease = check_lease(limits.TRANSACTION_LEASE_DEFAULT_SECONDS if lease is None else lease)
        txn_id = random_uuid(self._rng).hex

        def plan(state: ControllerState) -> dict[str, Any]:
            record = self._stream(scope, stream)
            if self._closed_to_transactions(record):
                raise StreamSealedError(f"stream {scope}/{stream} is sealed: it takes no transactions")
            if record.active_transaction_count >= limits.TRANSACTIONS_ACTIVE_PER_STREAM_MAX:
                raise InvalidArgumentError(f"stream {scope}/{stream} has {limits.TRANSACTIONS_ACTIVE_PER_STREAM_MAX} "
                                           "live transactions already (the limit)")
            if state.active_transactions >= limits.TRANSACTIONS_ACTIVE_MAX:
                raise InvalidArgumentError(f"the controller has {limits.TRANSACTIONS_ACTIVE_MAX} live transactions "
                                           "already (the limit)")
            if txn_id in record.transactions:
                raise InternalError(f"transaction id {txn_id} drawn twice")
            now = self._time()
            epoch = record.current
            return {"type": "txn_created", "scope": scope, "stream": stream, "txn": txn_id, "epoch": epoch.epoch,
                    "segments": [s.to_json() for s in epoch.segments], "lease": lease, "opened": now,
                    "deadline": lease_deadline(now, now, lease)}
        await self._commit(plan)
        # Recorded first, then the segments: a crash in between leaves an open transaction without
        # segments, whose caller never learned its id; its lease lapses and the abort deletes nothing.
        record_stream = self._stream(scope, stream)
        record = record_stream.transactions[txn_id]
        for position in range(1, len(record.segments) + 1):
            await self._store.create_segment(self._transaction_segment(record_stream, record, position))
        if record.status is not TxnStatus.OPEN:  # aborted while its segments were being made
            for position in range(1, len(record.segments) + 1):
                await self._store.delete(self._transaction_segment(record_stream, record, position))
            raise TransactionNotOpenError(f"transaction {txn_id} was {record.status.value} before it began")
        return self._transaction_info(record_stream, record)

    async def ping_transaction(self, scope: str, stream: str, txn: str) -> float:
        """Renew an open transaction's lease (``Ping``): its deadline becomes now + lease (never past the
        maximum execution time).  Raises ``TransactionNotFoundError``, ``TransactionNotOpenError``,
        ``LeaseExpiredError``."""
        self._check_open()
        txn_id = check_transaction_id(txn)

        def plan(state: ControllerState) -> dict[str, Any] | None:
            deadline = ping_deadline(self._transaction(scope, stream, txn_id), self._time())
            if deadline is None:
                return None
            return {"type": "txn_pinged", "scope": scope, "stream": stream, "txn": txn_id, "deadline": deadline}
        await self._commit(plan)
        return self._transaction(scope, stream, txn_id).deadline

    async def commit_transaction(self, scope: str, stream: str, txn: str) -> TransactionStatus:
        """Commit an open transaction (``Commit``): it is COMMITTING, with the stream's next commit order,
        when this returns; the worker makes it visible.  Raises ``TransactionNotFoundError``,
        ``TransactionNotOpenError`` (committing twice), ``StreamSealedError``."""
        self._check_open()
        txn_id = check_transaction_id(txn)

        def plan(state: ControllerState) -> dict[str, Any] | None:
            record = self._stream(scope, stream)
            decision = decide_fenced_commit(sealed=self._closed_to_transactions(record),
                                            transactions=record.transactions, fences=record.fences,
                                            txn_ids=[txn_id], fence=None)
            return None if decision.record is None else {"scope": scope, "stream": stream, **decision.record}
        await self._commit(plan)
        key = (scope, stream)
        self._kick(key)
        return TransactionStatus(self._transaction(scope, stream, txn_id).status.value)

    async def abort_transaction(self, scope: str, stream: str, txn: str) -> TransactionStatus:
        """Abort an open transaction (``Abort``): ABORTING when this returns; the worker deletes its
        segments.  Aborting an aborting or aborted one changes nothing.  Raises
        ``TransactionNotFoundError``, ``TransactionNotOpenError`` (it is committing or committed)."""
        self._check_open()
        txn_id = check_transaction_id(txn)

        def plan(state: ControllerState) -> dict[str, Any] | None:
            record = self._transaction(scope, stream, txn_id)
            if record.status in (TxnStatus.ABORTING, TxnStatus.ABORTED):
                return None
            if record.status is not TxnStatus.OPEN:
                raise TransactionNotOpenError(f"transaction {txn_id} is {record.status.value}: it cannot be aborted")
            return {"type": "txns_aborting", "scope": scope, "stream": stream, "txns": [txn_id], "reason": "client"}
        await self._commit(plan)
        self._kick((scope, stream))
        return TransactionStatus(self._transaction(scope, stream, txn_id).status.value)

    async def get_transaction(self, scope: str, stream: str, txn: str) -> TransactionInfo:
        """The transaction's record: status, epoch and segments, lease, deadline, commit order."""
        self._check_open()
        txn_id = check_transaction_id(txn)
        return self._transaction_info(self._stream(scope, stream), self._transaction(scope, stream, txn_id))

    async def list_transactions(self, scope: str, stream: str) -> dict[UUID, TransactionStatus]:
        """Every transaction the stream knows (the live ones and the latest finished), with its status."""
        self._check_open()
        record = self._stream(scope, stream)
        return {UUID(hex=t): TransactionStatus(r.status.value) for t, r in sorted(record.transactions.items())}

    async def commit_transactions(self, scope: str, stream: str, txns: Sequence[str],
                                  fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """The fenced multi-commit (``RequestFencedCommit`` + ``DecideFencedCommit``): commit every listed
        transaction and record ``fence = (key, value)`` if the value recorded for ``key`` is lower (or
        none is); otherwise abort the listed transactions that are open and answer
        ``already_committed``.  One record decides, so a retry -- after a lost reply, a crash of the
        caller or of the controller -- finds the value recorded and commits nothing twice.  Returns the
        outcome and the value recorded for the fence key.  Raises (recording nothing) ``FenceValueError``,
        ``InvalidArgumentError``, ``TransactionNotFoundError``, ``TransactionNotOpenError``,
        ``StreamSealedError``."""
        self._check_open()
        txn_ids = [check_transaction_id(t, "txns") for t in txns]
        checked = check_fence(fence)
        outcome: list[FenceOutcome] = []
        recorded: list[int | None] = []
        traced = self._trace_fenced_request(scope, stream, txn_ids, checked)

        def plan(state: ControllerState) -> dict[str, Any] | None:
            record = self._stream(scope, stream)
            try:
                decision = decide_fenced_commit(sealed=self._closed_to_transactions(record),
                                                transactions=record.transactions, fences=record.fences,
                                                txn_ids=txn_ids, fence=checked)
            except TransactionNotOpenError:
                if traced is not None:
                    traced("rejected", record, False)
                raise
            if traced is not None:
                traced(decision.outcome.value, record, decision.record is not None)
            outcome[:] = [decision.outcome]
            recorded[:] = [decision.recorded]
            return None if decision.record is None else {"scope": scope, "stream": stream, **decision.record}
        await self._commit(plan)
        self._kick((scope, stream))
        return MultiCommitResult(CommitOutcome(outcome[0].value), recorded[0])

    def _trace_fenced_request(self, scope: str, stream: str, txn_ids: list[str], fence: tuple[str, int] | None,
                              ) -> Callable[[str, StreamRecord, bool], None] | None:
        """With a tracer and a fence: report the request (``RequestFencedCommit``) and return what
        reports its decision (``DecideFencedCommit``); else None."""
        tracer = self._tracer
        received = self._state.streams.get((scope, stream))
        if tracer is None or fence is None or received is None:
            return None
        key, value = fence
        self._traced_requests += 1
        request = self._traced_requests
        tracer("RequestFencedCommit", request=request, scope=scope, stream=stream, txns=list(txn_ids), key=key,
               value=value, seen=received.fences.get(key, 0))

        def decided(outcome: str, stream_record: StreamRecord, recorded: bool) -> None:
            tracer("DecideFencedCommit", request=request, outcome=outcome, seen=stream_record.fences.get(key, 0),
                   recorded=recorded)
        return decided

    async def get_fence(self, scope: str, stream: str, key: str) -> int | None:
        """The value recorded for fence ``key`` on the stream (None: none yet)."""
        self._check_open()
        if not isinstance(key, str) or not key or len(key) > limits.FENCE_KEY_LENGTH_MAX:
            raise InvalidArgumentError(f"a fence key is a non-empty str of at most {limits.FENCE_KEY_LENGTH_MAX} "
                                       f"characters, not {key!r}")
        return self._stream(scope, stream).fences.get(key)

    # --- The steps (the worker runs them; in stepping mode the owner does, one by one) ---------------

    async def expire_leases(self) -> int:
        """``ExpireLease``: mark ABORTING every open transaction whose lease lapsed (one record per
        stream); the worker deletes their segments.  Returns how many expired."""
        self._check_open()
        count = 0
        for key in list(self._state.streams):
            def plan(state: ControllerState, key: _Key = key) -> dict[str, Any] | None:
                record = state.streams.get(key)
                lapsed = [] if record is None else expired(record.transactions, self._time())
                if not lapsed:
                    return None
                return {"type": "txns_aborting", "scope": key[0], "stream": key[1], "txns": lapsed, "reason": "lease"}
            applied = await self._commit(plan)
            if applied is not None:
                count += len(applied["txns"])
                log.info("transactions of %s/%s whose leases lapsed: %s", key[0], key[1], applied["txns"])
                self._kick(key)
        return count

    async def start_commit(self, scope: str, stream: str) -> str | None:
        """``StartCommit``: begin committing the committing transaction with the lowest commit order;
        returns its id (None: none is committing).  Raises ``InternalError`` if a workflow is pending."""
        key = (scope, self._stream(scope, stream).name)
        return await self._stepping(key, lambda: self._start_commit_locked(key))

    async def merge_transaction_segment(self, scope: str, stream: str, position: int) -> bool:
        """``MergeTxnSegment(position)``: seal and merge the committing transaction's segment at
        ``position`` (from 1) onto its target; False if it was merged already."""
        key = (scope, self._stream(scope, stream).name)
        return await self._stepping(key, lambda: self._merge_locked(key, position))

    async def finish_commit(self, scope: str, stream: str) -> str:
        """``FinishCommit``: (after a roll: seal the duplicates, create and record the new epochs, seal
        the old active epoch) record the transaction COMMITTED; returns its id."""
        key = (scope, self._stream(scope, stream).name)
        return await self._stepping(key, lambda: self._finish_commit_locked(key))

    async def finish_abort(self, scope: str, stream: str, txn: str) -> None:
        """``FinishAbort``: delete an aborting transaction's segments and record it ABORTED."""
        key = (scope, self._stream(scope, stream).name)
        txn_id = check_transaction_id(txn)
        await self._stepping(key, lambda: self._finish_abort_locked(key, txn_id))

    async def drive_transactions(self, scope: str, stream: str) -> int:
        """Run the stream's transaction workflows until nothing is left (or the per-run step limit):
        a pending workflow, then aborts, then commits in commit order.  Returns the steps run."""
        key = (scope, self._stream(scope, stream).name)
        steps = 0
        while steps < limits.TRANSACTION_WORKFLOW_STEPS_PER_RUN_MAX:
            if key not in self._state.streams or not await self._locked(key, lambda: self._one_step_locked(key)):
                break
            steps += 1
        return steps

    async def _one_step_locked(self, key: _Key) -> bool:
        """(Lock held; ``_locked`` finished any pending workflow.)  One decision of the workflows."""
        stream = self._state.streams.get(key)
        if stream is None:
            return False
        step = next_transaction_step(stream.pending, stream.transactions)
        if step is None:
            return False
        if step.kind == "finish_abort":
            await self._finish_abort_locked(key, step.txn)
        elif step.kind == "start_commit":
            await self._start_commit_locked(key)
            await self._finish_commit_locked(key)
        else:  # a workflow still pending after _locked finished it: cannot happen
            raise InternalError(f"stream {key}: workflow step {step} after the pending one was finished")
        return True

    async def _start_commit_locked(self, key: _Key) -> str | None:
        stream = self._state.streams[key]
        if stream.pending is not None:
            raise InternalError(f"stream {key[0]}/{key[1]}: a commit starts while a {stream.pending['kind']} is "
                                "pending")
        queue = commit_queue(stream.transactions)
        if not queue:
            return None
        txn_id = queue[0].txn_id

        def plan(state: ControllerState) -> dict[str, Any]:
            record = state.streams[key]
            transaction = commit_queue(record.transactions)[0]
            if transaction.txn_id != txn_id or record.pending is not None:
                raise InternalError(f"stream {key}: the commit queue changed under the stream's lock")
            colocated = self._colocation(record)
            targets = commit_target(transaction.segments, record.current, colocated)
            roll = None
            next_number = record.next_number
            if targets is None:
                duplicate, active, next_number = roll_epochs(transaction.segments, record.current,
                                                             record.next_number, self._time(), colocated)
                roll = {"duplicate": duplicate.to_json(), "active": active.to_json()}
                targets = [s.segment_id for s in duplicate.segments]
            return {"type": "commit_started", "scope": key[0], "stream": key[1], "txn": txn_id, "targets": targets,
                    "roll": roll, "next_number": next_number}
        await self._commit(plan)
        await self._create_duplicates(key)
        return txn_id

    async def _create_duplicates(self, key: _Key) -> None:
        """A roll's duplicates of the transaction's epoch exist (idempotent: a resumed step repeats it)."""
        stream = self._state.streams[key]
        assert stream.pending is not None
        if stream.pending["roll"] is not None and not stream.pending["epochs_created"]:
            for identifier in stream.pending["targets"]:
                await self._store.create_segment(self._name(stream, identifier))

    def _committing(self, key: _Key) -> tuple[StreamRecord, TransactionRecord, dict[str, Any]]:
        stream = self._state.streams[key]
        pending = stream.pending
        if pending is None or pending["kind"] != "commit":
            raise InternalError(f"stream {key[0]}/{key[1]} is not committing a transaction")
        return stream, stream.transactions[pending["txn"]], pending

    async def _merge_locked(self, key: _Key, position: int) -> bool:
        stream, record, pending = self._committing(key)
        if type(position) is not int or not 1 <= position <= len(record.segments):
            raise InvalidArgumentError(f"transaction {record.txn_id} has segments 1..{len(record.segments)}, not "
                                       f"{position!r}")
        if pending["epochs_created"]:
            return False  # every segment was merged before the roll's duplicates were sealed
        await self._create_duplicates(key)
        target = self._name(stream, pending["targets"][position - 1])
        return await self._store.merge(target, self._transaction_segment(stream, record, position))

    async def _finish_commit_locked(self, key: _Key) -> str:
        stream, record, pending = self._committing(key)
        roll = pending["roll"]
        if not pending["epochs_created"]:
            for position in range(1, len(record.segments) + 1):  # (a resumed commit: whatever is left)
                await self._merge_locked(key, position)
        lengths: dict[str, int] = {}
        if roll is not None:
            duplicate = EpochRecord.from_json(roll["duplicate"])
            if not pending["epochs_created"]:
                sealed = {str(s.segment_id): await self._store.seal(self._name(stream, s.segment_id))
                          for s in duplicate.segments}
                for segment in EpochRecord.from_json(roll["active"]).segments:
                    await self._store.create_segment(self._name(stream, segment.segment_id))
                await self._commit(self._transaction_step(key, {"type": "roll_epochs_created", "lengths": sealed}))
            old_active = stream.history.epoch(duplicate.epoch - 1)
            if old_active is None:
                raise InternalError(f"stream {key}: the epoch before the roll's duplicate {duplicate.epoch} is gone")
            for segment in old_active.segments:
                lengths[str(segment.segment_id)] = await self._store.seal(self._name(stream, segment.segment_id))
        await self._commit(self._transaction_step(key, {"type": "commit_completed", "txn": record.txn_id,
                                                        "lengths": lengths}))
        log.info("stream %s/%s: transaction %s committed%s", key[0], key[1], record.txn_id,
                 " (rolled)" if roll is not None else "")
        return record.txn_id

    def _transaction_step(self, key: _Key, record: dict[str, Any]) -> Callable[[ControllerState], dict[str, Any]]:
        def plan(state: ControllerState) -> dict[str, Any]:
            stream = state.streams.get(key)
            if stream is None or stream.state is not StreamState.COMMITTING:
                raise InternalError(f"stream {key}: a {record['type']} step found it "
                                    f"{'gone' if stream is None else stream.state.value}")
            return {"scope": key[0], "stream": key[1], **record}
        return plan

    async def _finish_abort_locked(self, key: _Key, txn_id: str) -> None:
        stream = self._state.streams[key]
        record = stream.transactions.get(txn_id)
        if record is None or record.status is not TxnStatus.ABORTING:
            raise InternalError(f"transaction {txn_id} of {key[0]}/{key[1]} is not aborting: "
                                f"{None if record is None else record.status.value}")
        for position in range(1, len(record.segments) + 1):
            await self._store.delete(self._transaction_segment(stream, record, position))

        def plan(state: ControllerState) -> dict[str, Any]:
            current = state.streams.get(key)
            found = None if current is None else current.transactions.get(txn_id)
            if found is None or found.status is not TxnStatus.ABORTING:
                raise InternalError(f"transaction {txn_id} stopped aborting under the stream's lock")
            return {"type": "txn_aborted", "scope": key[0], "stream": key[1], "txn": txn_id}
        await self._commit(plan)

    # --- Sealing ---------------------------------------------------------------------------------

    async def _settle_transactions(self, key: _Key) -> None:
        """(Lock held, nothing pending.)  Before a seal: abort every open transaction, then finish every
        abort and commit -- whatever ``transaction_workflows`` says, since a sealed stream takes none."""
        stream = self._state.streams[key]
        if any(r.status is TxnStatus.OPEN for r in stream.transactions.values()):
            def plan(state: ControllerState) -> dict[str, Any] | None:
                current = state.streams[key]
                open_ids = sorted(t for t, r in current.transactions.items() if r.status is TxnStatus.OPEN)
                return {"type": "txns_aborting", "scope": key[0], "stream": key[1], "txns": open_ids,
                        "reason": "sealed"} if open_ids else None
            await self._commit(plan)
        for _ in range(limits.TRANSACTION_WORKFLOW_STEPS_PER_RUN_MAX):
            if not await self._one_step_locked(key):
                return
        raise RequestTimeoutError(f"stream {key[0]}/{key[1]} has more transaction work than one run does")

    async def _seal_with_transactions(self, key: _Key, plan_seal: Callable[[ControllerState], dict[str, Any] | None],
                                      ) -> dict[str, Any] | None:
        """(Lock held.)  Settle the transactions, then record the seal -- again if a transaction was
        begun or committed meanwhile (the seal's plan refuses while any is live)."""
        live = False  # the last plan met transactions begun or committed while they were settled

        def plan(state: ControllerState) -> dict[str, Any] | None:
            nonlocal live
            record = plan_seal(state)
            stream = state.streams.get(key)
            live = record is not None and stream is not None and stream.active_transaction_count > 0
            return None if live else record
        for _ in range(limits.TRANSACTION_SEAL_ROUNDS_MAX):
            await self._settle_transactions(key)
            record = await self._commit(plan)
            if not live:
                return record
        raise RequestTimeoutError(f"stream {key[0]}/{key[1]} kept taking transactions while it was being sealed; "
                                  "try again")
