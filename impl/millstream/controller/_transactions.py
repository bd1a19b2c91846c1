"""Stream transactions in the controller: records, the lifecycle table and every decision, as pure
functions (no I/O, no clock: the time arrives as an argument).

Theory of operation (``spec/Transactions.tla``; the workflows that carry these decisions out are in
``_transaction_workflows``).  A transaction belongs to one stream.  ``create_transaction`` records it
OPEN in the stream's current epoch -- its *epoch* and that epoch's segments, one hidden transaction
segment per segment (``naming.transaction_segment_name``, on the parent's container) -- with a lease:
it lapses at ``deadline`` unless a ping moves the deadline on.  Writes go to the segment store
directly; the controller never sees them.

Committing durably marks the transaction COMMITTING and gives it the stream's next *commit order*
(``txns_committing``); the commit workflow then takes the committing transaction with the lowest
order and

1. records ``commit_started`` with its targets -- the segments of the active epoch when that epoch has
   the transaction's key ranges on the same containers (``commit_target``), otherwise a *roll*: a new
   duplicate of the transaction's epoch (its key ranges, the next epoch number) and, after it, a
   duplicate of the active epoch (``roll_epochs``); the stream is COMMITTING, which keeps scaling,
   sealing and truncation out until the commit is finished;
2. seals and merges every transaction segment onto its target (one segment-store operation each,
   idempotent: a merged source is gone);
3. after a roll, seals the duplicates and records both new epochs (``roll_epochs_created``: writers
   now see the active duplicate), then seals the old active epoch;
4. records ``commit_completed``: COMMITTED (with the old active epoch's sealed lengths after a roll).

Readers therefore meet a rolled transaction's events after everything written to the old active
epoch and before everything written to the new one.

Containers.  A merge is a container-local operation: a transaction segment can only be merged into a
segment of its parent's container.  The container of a segment is a hash of its whole name, epoch
included (``naming.container_of``), so a segment with the same key range in another epoch usually
lives elsewhere.  A roll therefore numbers each duplicate with the first unused segment number that
places it in the container of the segment it duplicates (``roll_epochs``): a duplicate of the
transaction's epoch sits with the transaction's segments, a duplicate of the active epoch with the
active segment it replaces -- so a transaction begun in the old active epoch commits straight into
the new one.  The spec's "same layout" is thus "same key ranges in the same containers": it differs
only for a stream that scaled back to key ranges it had before (new segments, other containers),
where the implementation rolls instead; readers of any key cannot tell the two apart, since both put
the same events at the same place of the key's sequence.  Aborting (the client, a lapsed lease, or a
fenced multi-commit whose value is already recorded) marks the transaction ABORTING
(``txns_aborting``); the abort workflow deletes its segments and records ``txn_aborted``.

The fenced multi-commit (``decide_fenced_commit``) is one planned record: if the value recorded for
the fence key is not lower than the request's, it aborts the listed transactions that are still open
and answers "already committed"; else, if every listed transaction is open, it marks them all
COMMITTING (consecutive orders, in the order the transactions began -- the spec's request is a set,
ordered by the transactions' identities, which a refinement numbers in the order they begin; the
order of the list does not matter) and records the value in the same record;
otherwise it refuses with a typed error and records nothing.  Because the controller appends every
record conditionally and plans again after catching up, the check and the record are one step.

The statuses and the records that move them form ``TRANSACTION_LIFECYCLE`` (STYLE.md #3); each record
type is the spec action(s) named in ``RECORD_ACTIONS``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from uuid import UUID

import attrs

from millstream import limits
from millstream.controller._epochs import EpochRecord, SegmentRecord
from millstream.errors import (
    FenceValueError,
    InternalError,
    InvalidArgumentError,
    LeaseExpiredError,
    LeaseTooLargeError,
    StreamSealedError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.naming import segment_id
from millstream.values import TransactionStatus

__all__ = [
    "RECORD_ACTIONS",
    "TRANSACTION_LIFECYCLE",
    "CommitStep",
    "FenceDecision",
    "FenceOutcome",
    "TransactionRecord",
    "TxnStatus",
    "check_fence",
    "check_lease",
    "check_transaction_id",
    "commit_queue",
    "commit_target",
    "decide_fenced_commit",
    "lease_deadline",
    "next_transaction_step",
    "ping_deadline",
    "roll_epochs",
]


#: A stream transaction's status: the one ``TransactionStatus`` the client and the controller share
#: (``millstream.values``; the values are the spec's names), under the name the controller's code uses.
TxnStatus = TransactionStatus


#: (status, record type) -> the status that record moves a transaction to.  Nothing else changes a
#: status (``InternalError``): the table is tested against the model's ``LIFECYCLE``.
TRANSACTION_LIFECYCLE: Final[Mapping[TxnStatus, Mapping[str, TxnStatus]]] = {
    TxnStatus.OPEN: {"txns_committing": TxnStatus.COMMITTING, "txns_aborting": TxnStatus.ABORTING},
    TxnStatus.COMMITTING: {"commit_completed": TxnStatus.COMMITTED},
    TxnStatus.ABORTING: {"txn_aborted": TxnStatus.ABORTED},
    TxnStatus.COMMITTED: {},
    TxnStatus.ABORTED: {},
}

#: Each transaction record type and the spec actions it is (``txn_created`` opens: ``Begin``).
RECORD_ACTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "txn_created": ("Begin",),
    "txn_pinged": ("Ping",),
    "txns_committing": ("Commit", "DecideFencedCommit/committed"),
    "txns_aborting": ("Abort", "ExpireLease", "DecideFencedCommit/already_committed"),
    "txn_aborted": ("FinishAbort",),
    "commit_started": ("StartCommit",),
    "roll_epochs_created": ("FinishCommit",),
    "commit_completed": ("FinishCommit",),
}

_HEX_ID: Final = re.compile(r"[0-9a-f]{32}")


def check_transaction_id(value: Any, field: str = "txn") -> str:
    """A transaction id as the controller keeps it: 32 lower-case hex digits (``UUID.hex``).  A
    ``UUID`` is accepted too.  Raises ``InvalidArgumentError``."""
    if isinstance(value, UUID):
        return value.hex
    if not isinstance(value, str) or not _HEX_ID.fullmatch(value):
        raise InvalidArgumentError(f"{field} must be a transaction id (32 lower-case hex digits), not {value!r}")
    return value


def check_lease(lease: Any) -> float:
    """A lease in seconds within the limits.  Raises ``LeaseTooLargeError``."""
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not math.isfinite(lease):
        raise LeaseTooLargeError(f"a lease is a number of seconds, not {lease!r}")
    if lease > limits.TRANSACTION_LEASE_SECONDS_MAX:
        raise LeaseTooLargeError(f"a lease of {lease} s exceeds the maximum of "
                                 f"{limits.TRANSACTION_LEASE_SECONDS_MAX} s")
    if lease < limits.TRANSACTION_LEASE_MIN_SECONDS:
        raise LeaseTooLargeError(f"a lease of {lease} s is below the minimum of "
                                 f"{limits.TRANSACTION_LEASE_MIN_SECONDS} s")
    return float(lease)


def check_fence(fence: Any) -> tuple[str, int] | None:
    """``(key, value)`` of a fenced multi-commit, checked (None: no fence).  Raises ``FenceValueError``
    for a value that is not an int in [0, ``FENCE_VALUE_MAX``] or a key that is not a non-empty str
    of at most ``FENCE_KEY_LENGTH_MAX`` characters."""
    if fence is None:
        return None
    if isinstance(fence, (str, bytes)) or not isinstance(fence, Sequence) or len(fence) != 2:
        raise FenceValueError(f"a fence is a (key, value) pair, not {fence!r}")
    key, value = fence
    if not isinstance(key, str) or not key or len(key) > limits.FENCE_KEY_LENGTH_MAX:
        raise FenceValueError(f"a fence key is a non-empty str of at most {limits.FENCE_KEY_LENGTH_MAX} "
                              f"characters, not {key!r}")
    if type(value) is not int or not 0 <= value <= limits.FENCE_VALUE_MAX:
        raise FenceValueError(f"a fence value is an int in [0, 2**63), not {value!r}")
    return key, value


def _max_execution_seconds(lease: float) -> float:
    return min(limits.TRANSACTION_EXECUTION_LEASES_MAX * lease, limits.TRANSACTION_EXECUTION_SECONDS_MAX)


def lease_deadline(opened: float, now: float, lease: float) -> float:
    """When a lease renewed at ``now`` lapses: ``now + lease``, but never past the maximum execution
    time counted from ``opened``."""
    return min(now + lease, opened + _max_execution_seconds(lease))


class TransactionRecord:
    """One transaction's durable record: its id (hex), epoch and that epoch's segments (by key),
    lease, times, status, commit order (0 until it commits) and ``number``: the how-manieth
    transaction of its stream it is (from 1, in the order of their ``txn_created`` records; 0 in
    snapshots from before it was kept) -- the spec's identity order, which a fenced multi-commit
    gives its commit orders in."""

    __slots__ = ("deadline", "epoch", "lease", "number", "opened", "order", "segments", "status", "txn_id")

    def __init__(self, txn_id: str, epoch: int, segments: Sequence[SegmentRecord], lease: float, opened: float,
                 deadline: float, number: int = 0) -> None:
        self.txn_id = txn_id
        self.epoch = epoch
        self.segments: tuple[SegmentRecord, ...] = tuple(segments)
        self.lease = lease
        self.opened = opened
        self.deadline = deadline
        self.status = TxnStatus.OPEN
        self.order = 0
        self.number = number

    @property
    def uuid(self) -> UUID:
        return UUID(hex=self.txn_id)

    def advance(self, record_type: str) -> None:
        following = TRANSACTION_LIFECYCLE[self.status].get(record_type)
        if following is None:
            raise InternalError(f"transaction {self.txn_id}: no transition from {self.status.value} on "
                                f"{record_type}")
        self.status = following

    def to_json(self) -> dict[str, Any]:
        return {"txn": self.txn_id, "epoch": self.epoch, "segments": [s.to_json() for s in self.segments],
                "lease": self.lease, "opened": self.opened, "deadline": self.deadline, "status": self.status.value,
                "order": self.order, "number": self.number}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> TransactionRecord:
        record = cls(value["txn"], int(value["epoch"]), [SegmentRecord.from_json(s) for s in value["segments"]],
                     float(value["lease"]), float(value["opened"]), float(value["deadline"]),
                     int(value.get("number", 0)))
        record.status = TxnStatus(value["status"])
        record.order = int(value["order"])
        return record

    def check_invariants(self) -> None:
        assert _HEX_ID.fullmatch(self.txn_id), self.txn_id
        assert self.segments and [s.key_start for s in self.segments] == sorted(s.key_start for s in self.segments)
        assert self.opened <= self.deadline <= self.opened + _max_execution_seconds(self.lease), self.to_json()
        assert (self.order > 0) == (self.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)), self.to_json()

    def __repr__(self) -> str:
        return f"TransactionRecord({self.txn_id!r}, {self.status.value}, epoch={self.epoch}, order={self.order})"


# --- Leases ------------------------------------------------------------------------------------------


def ping_deadline(record: TransactionRecord, now: float) -> float | None:
    """The deadline a ping at ``now`` sets, or None if it would not move (a ping may only extend).
    Raises ``TransactionNotOpenError`` unless OPEN, ``LeaseExpiredError`` once the lease lapsed."""
    if record.status is not TxnStatus.OPEN:
        raise TransactionNotOpenError(f"transaction {record.txn_id} is {record.status.value}: it takes no pings")
    if now >= record.deadline:
        raise LeaseExpiredError(f"the lease of transaction {record.txn_id} lapsed at {record.deadline}; it is "
                                "being aborted")
    deadline = lease_deadline(record.opened, now, record.lease)
    return deadline if deadline > record.deadline else None


def expired(transactions: Mapping[str, TransactionRecord], now: float) -> list[str]:
    """The open transactions whose lease lapsed by ``now``, oldest deadline first."""
    return [r.txn_id for r in sorted(transactions.values(), key=lambda r: (r.deadline, r.txn_id))
            if r.status is TxnStatus.OPEN and r.deadline <= now]


# --- Commit order, targets and rolls ------------------------------------------------------------------


def commit_queue(transactions: Mapping[str, TransactionRecord]) -> list[TransactionRecord]:
    """The committing transactions, lowest commit order first."""
    return sorted((r for r in transactions.values() if r.status is TxnStatus.COMMITTING), key=lambda r: r.order)


def _ranges(segments: Sequence[SegmentRecord]) -> list[tuple[float, float]]:
    return [(s.key_start, s.key_end) for s in segments]


#: ``colocated(a, b)``: whether segments ``a`` and ``b`` (ids of the stream) live in the same container.
Colocated = Callable[[int, int], bool]


def commit_target(txn_segments: Sequence[SegmentRecord], active: EpochRecord,
                  colocated: Colocated) -> list[int] | None:
    """The active segment each transaction segment merges into (by position), if the active epoch has
    exactly the transaction's key ranges, each in its transaction segment's container (the spec's "same
    layout"; see the module docstring); None if the transaction must roll."""
    if _ranges(txn_segments) != _ranges(active.segments):
        return None
    if not all(colocated(a.segment_id, b.segment_id) for a, b in zip(txn_segments, active.segments, strict=True)):
        return None
    return [s.segment_id for s in active.segments]


def _colocated_duplicates(originals: Sequence[SegmentRecord], epoch: int, next_number: int,
                          colocated: Colocated) -> tuple[tuple[SegmentRecord, ...], int]:
    """Duplicates of ``originals`` created in ``epoch``: each numbered with the first number from
    ``next_number`` on that puts it in its original's container.  Returns them and the next free number."""
    duplicates = []
    number = next_number
    for original in originals:
        for _ in range(limits.TRANSACTION_DUPLICATE_NUMBER_TRIES_MAX):
            candidate = segment_id(epoch, number)
            number += 1
            if colocated(original.segment_id, candidate):
                duplicates.append(SegmentRecord(candidate, original.key_start, original.key_end))
                break
        else:
            raise InternalError(f"no segment number from {next_number} on shares a container with segment "
                                f"{original.segment_id}")
    return tuple(duplicates), number


def roll_epochs(txn_segments: Sequence[SegmentRecord], active: EpochRecord, next_number: int, creation_time: float,
                colocated: Colocated) -> tuple[EpochRecord, EpochRecord, int]:
    """A roll's two epochs after ``active``: a duplicate of the transaction's epoch (its key ranges,
    created in ``active.epoch + 1``, each segment in its transaction segment's container), then a
    duplicate of ``active`` (created in ``active.epoch + 2``, each segment in the container of the one it
    replaces).  Segment numbers are fresh from ``next_number``; returns the epochs and the next free
    number."""
    duplicate_epoch, active_epoch = active.epoch + 1, active.epoch + 2
    duplicates, number = _colocated_duplicates(txn_segments, duplicate_epoch, next_number, colocated)
    again, number = _colocated_duplicates(active.segments, active_epoch, number, colocated)
    return EpochRecord(duplicate_epoch, creation_time, duplicates), EpochRecord(active_epoch, creation_time, again), \
        number


@attrs.frozen
class CommitStep:
    """What the transaction workflows of a stream do next: ``kind`` is ``"continue_commit"`` (a commit
    was started: merge what is left and finish it), ``"finish_abort"`` (``txn``), ``"start_commit"``
    (``txn``, the lowest commit order) or ``"finish_workflow"`` (another workflow is pending first)."""

    kind: str
    txn: str = ""


def next_transaction_step(pending: Mapping[str, Any] | None,
                          transactions: Mapping[str, TransactionRecord]) -> CommitStep | None:
    """The next step of a stream's transaction workflows (None: nothing to do).  A started commit is
    finished first; then aborts (their order does not matter); then the lowest commit order."""
    if pending is not None:
        return CommitStep("continue_commit", pending["txn"]) if pending["kind"] == "commit" \
            else CommitStep("finish_workflow")
    aborting = sorted(r.txn_id for r in transactions.values() if r.status is TxnStatus.ABORTING)
    if aborting:
        return CommitStep("finish_abort", aborting[0])
    queue = commit_queue(transactions)
    if queue:
        return CommitStep("start_commit", queue[0].txn_id)
    return None


# --- The fenced multi-commit --------------------------------------------------------------------------


class FenceOutcome(enum.Enum):
    """What a multi-commit answers (a refusal is a typed error, not an outcome)."""

    COMMITTED = "committed"
    """Every listed transaction is COMMITTING and the fence value is recorded."""
    ALREADY_COMMITTED = "already_committed"
    """The value recorded for the key was not lower: the listed open transactions are aborted."""


@attrs.frozen
class FenceDecision:
    """The decision and the record that carries it out (None: nothing to record)."""

    outcome: FenceOutcome
    record: dict[str, Any] | None
    recorded: int | None
    """The value recorded for the fence key once the record applies (None: no fence, or none yet)."""


def decide_fenced_commit(*, sealed: bool, transactions: Mapping[str, TransactionRecord], fences: Mapping[str, int],
                         txn_ids: Sequence[str], fence: tuple[str, int] | None) -> FenceDecision:
    """``commit_transactions(txn_ids, fence)`` against a stream's state (the spec's ``FenceOutcome``
    then ``DecideFencedCommit``): the fence first, then the open check, then the commit.  Raises
    ``InvalidArgumentError`` for an empty, over-long or repeating list, ``TransactionNotFoundError``
    for an id the stream does not know, ``TransactionNotOpenError`` for one that is not open,
    ``StreamSealedError`` on a sealed stream, ``InvalidArgumentError`` for one fence key too many --
    each with nothing to record.  The record (if any) is the caller's to append: ``txns_committing``
    (with the fence) or ``txns_aborting``."""
    if not txn_ids:
        raise InvalidArgumentError("commit_transactions lists at least one transaction")
    if len(txn_ids) > limits.TRANSACTIONS_PER_COMMIT_MAX:
        raise InvalidArgumentError(f"commit_transactions lists {len(txn_ids)} transactions; at most "
                                   f"{limits.TRANSACTIONS_PER_COMMIT_MAX}")
    if len(set(txn_ids)) != len(txn_ids):
        raise InvalidArgumentError("commit_transactions lists a transaction more than once")
    if fence is not None:
        key, value = fence
        recorded = fences.get(key)
        if recorded is not None and value <= recorded:
            to_abort = [t for t in txn_ids if t in transactions and transactions[t].status is TxnStatus.OPEN]
            aborting = {"type": "txns_aborting", "txns": to_abort, "reason": "fenced"} if to_abort else None
            return FenceDecision(FenceOutcome.ALREADY_COMMITTED, aborting, recorded)
        if recorded is None and len(fences) >= limits.FENCE_KEYS_PER_STREAM_MAX:
            raise InvalidArgumentError(f"the stream records {limits.FENCE_KEYS_PER_STREAM_MAX} fence keys already")
    unknown = [t for t in txn_ids if t not in transactions]
    if unknown:
        raise TransactionNotFoundError(f"the stream has no transaction {unknown[0]}")
    not_open = [transactions[t] for t in txn_ids if transactions[t].status is not TxnStatus.OPEN]
    if not_open:
        raise TransactionNotOpenError(f"transaction {not_open[0].txn_id} is {not_open[0].status.value}: nothing "
                                      "was committed or recorded")
    if sealed:
        raise StreamSealedError("the stream is sealed: its transactions cannot commit")
    # Commit orders go in the order the transactions began (``TransactionRecord.number``), whatever the
    # list's order: the spec's request is a set, and ``DecideFencedCommit`` orders it by identity.
    in_order = sorted(txn_ids, key=lambda t: (transactions[t].number, t))
    record: dict[str, Any] = {"type": "txns_committing", "txns": in_order,
                              "fence": None if fence is None else list(fence)}
    return FenceDecision(FenceOutcome.COMMITTED, record, None if fence is None else fence[1])
