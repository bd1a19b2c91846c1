"""The controller's metadata as a state machine: records in, state changed (no I/O).

Theory of operation.  Everything the controller knows -- scopes, streams (configuration, epochs,
sealed lengths, head, recorded tail cuts, the workflow running on each), reader groups -- is the
fold of the records of its metadata log (``_metadata_log``) over the empty state.  A record is a JSON
object with a ``type``; ``ControllerState.apply`` applies one.  The controller *plans* a change
against the state (raising the caller's typed error if it is invalid), appends the record durably,
and only then applies it, so memory never holds what the log does not; replay on start applies the
same records in the same order and reaches the same state.  ``apply`` itself trusts its record (it
was validated before it was written) and raises ``InternalError`` if it cannot be applied -- a bug, or
a log written by something else.

A stream runs at most one workflow at a time; its ``state`` and the records that move it form a
table (``STREAM_TRANSITIONS``, STYLE.md #3)::

    IDLE --scale_started--> SCALING --epoch_created--> SCALING --segments_sealed--> SCALING
         --scale_completed--> IDLE
    IDLE --seal_started--> SEALING --stream_sealed--> IDLE (sealed)
    IDLE --truncation_started--> TRUNCATING --truncation_completed--> IDLE
    IDLE (sealed) --delete_started--> DELETING --stream_deleted--> (gone)
    IDLE --commit_started--> COMMITTING [--roll_epochs_created--> COMMITTING] --commit_completed--> IDLE

Stream transactions (``_transactions``) live in their stream's record: their own records
(``txn_created``, ``txn_pinged``, ``txns_committing``, ``txns_aborting``, ``txn_aborted``) change
only the transactions' statuses (``TRANSACTION_LIFECYCLE``), the commit order and the fence values;
the commit workflow is a stream workflow like the others (COMMITTING).

Each workflow records its intent first (with everything needed to finish it, e.g. the new epoch's
segment ids), then each step once done; a controller that restarts finds the workflow in ``pending``
and resumes it from the last recorded step (each step is idempotent on the segment store).

A snapshot (``to_snapshot``/``from_snapshot``) is the whole state as one JSON object.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

from millstream import limits
from millstream.controller._epochs import EpochRecord, SegmentRecord, StreamHistory, initial_epoch
from millstream.controller._transactions import TransactionRecord, TxnStatus, commit_queue
from millstream.errors import InternalError
from millstream.values import ReaderGroupConfig, StreamConfig

__all__ = [
    "STREAM_TRANSITIONS",
    "ControllerState",
    "ReaderGroupRecord",
    "RecordedCut",
    "StreamRecord",
    "StreamState",
    "thin_recorded_cuts",
]

SNAPSHOT_FORMAT: Final = 1


class StreamState(enum.Enum):
    IDLE = "idle"  # no workflow runs (the stream may be sealed)
    SCALING = "scaling"
    SEALING = "sealing"
    TRUNCATING = "truncating"
    DELETING = "deleting"
    COMMITTING = "committing"  # a stream transaction's commit workflow runs


#: (state, record type) -> next state.  Anything not listed cannot happen (InternalError).
STREAM_TRANSITIONS: Final[dict[tuple[StreamState, str], StreamState]] = {
    (StreamState.IDLE, "stream_updated"): StreamState.IDLE,
    (StreamState.IDLE, "tail_cut_recorded"): StreamState.IDLE,
    (StreamState.IDLE, "scale_started"): StreamState.SCALING,
    (StreamState.SCALING, "epoch_created"): StreamState.SCALING,
    (StreamState.SCALING, "segments_sealed"): StreamState.SCALING,
    (StreamState.SCALING, "scale_completed"): StreamState.IDLE,
    (StreamState.IDLE, "seal_started"): StreamState.SEALING,
    (StreamState.SEALING, "stream_sealed"): StreamState.IDLE,
    (StreamState.IDLE, "truncation_started"): StreamState.TRUNCATING,
    (StreamState.TRUNCATING, "truncation_completed"): StreamState.IDLE,
    (StreamState.IDLE, "delete_started"): StreamState.DELETING,
    (StreamState.IDLE, "commit_started"): StreamState.COMMITTING,
    (StreamState.COMMITTING, "roll_epochs_created"): StreamState.COMMITTING,
    (StreamState.COMMITTING, "commit_completed"): StreamState.IDLE,
}


class RecordedCut:
    """A tail cut the controller recorded, with the time it recorded it."""

    __slots__ = ("cut", "time")

    def __init__(self, time: float, cut: Mapping[int, int]) -> None:
        self.time = time
        self.cut: dict[int, int] = dict(cut)

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "cut": _cut_json(self.cut)}

    def __repr__(self) -> str:
        return f"RecordedCut({self.time!r}, {self.cut!r})"


def thin_recorded_cuts(cuts: list[RecordedCut], keep: int) -> list[RecordedCut]:
    """``cuts`` (ordered by time) reduced to ``keep`` by dropping, one at a time, the inner cut whose
    removal leaves the smallest gap in time (the first and the last always stay)."""
    result = list(cuts)
    while len(result) > max(keep, 2):
        gaps = [(result[i + 1].time - result[i - 1].time, i) for i in range(1, len(result) - 1)]
        _, index = min(gaps)
        del result[index]
    return result


def _cut_json(cut: Mapping[int, int]) -> dict[str, int]:
    return {str(identifier): offset for identifier, offset in cut.items()}


def _cut_of(value: Mapping[str, int]) -> dict[int, int]:
    return {int(identifier): int(offset) for identifier, offset in value.items()}


class StreamRecord:
    """One stream's metadata."""

    __slots__ = ("config", "created_time", "fences", "finished_transactions", "head", "history", "name",
                 "next_commit_order", "next_number", "next_transaction_number", "pending", "recorded_cuts", "scope",
                 "sealed", "sealed_lengths", "state", "transactions")

    def __init__(self, scope: str, name: str, config: StreamConfig, created_time: float, epoch: EpochRecord) -> None:
        self.scope = scope
        self.name = name
        self.config = config
        self.created_time = created_time
        self.history = StreamHistory([epoch])
        self.next_number = len(epoch.segments)
        self.state = StreamState.IDLE
        self.sealed = False
        #: The running workflow's parameters (see the records that start them), or None.
        self.pending: dict[str, Any] | None = None
        #: Final lengths of sealed segments (known once their seal is recorded).
        self.sealed_lengths: dict[int, int] = {}
        #: Where the stream begins: the last truncation's cut (epoch 0 at offset 0 at first).
        self.head: dict[int, int] = {s.segment_id: 0 for s in epoch.segments}
        self.recorded_cuts: list[RecordedCut] = []
        #: Stream transactions by id (hex): every unfinished one and the latest finished ones.
        self.transactions: dict[str, TransactionRecord] = {}
        #: The finished transactions still remembered, oldest first (forgotten beyond the limit).
        self.finished_transactions: list[str] = []
        #: The commit order the next committing transaction gets.
        self.next_commit_order = 1
        #: The ``number`` the next transaction begun gets (the order transactions began in).
        self.next_transaction_number = 1
        #: Fence key -> the highest value a fenced multi-commit recorded.
        self.fences: dict[str, int] = {}

    @property
    def active_transaction_count(self) -> int:
        """Transactions not finished (open, committing or aborting)."""
        return len(self.transactions) - len(self.finished_transactions)

    @property
    def qualified_name(self) -> str:
        return f"{self.scope}/{self.name}"

    @property
    def current(self) -> EpochRecord:
        return self.history.current

    def describe_state(self) -> str:
        if self.state is StreamState.IDLE:
            return "sealed" if self.sealed else "active"
        return str(self.state.value)

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope, "stream": self.name, "config": self.config.to_json_object(),
            "time": self.created_time, "epochs": self.history.to_json(), "next_number": self.next_number,
            "state": self.state.value, "sealed": self.sealed, "pending": self.pending,
            "sealed_lengths": _cut_json(self.sealed_lengths), "head": _cut_json(self.head),
            "recorded_cuts": [c.to_json() for c in self.recorded_cuts],
            "transactions": [r.to_json() for _, r in sorted(self.transactions.items())],
            "finished_transactions": list(self.finished_transactions), "next_commit_order": self.next_commit_order,
            "next_transaction_number": self.next_transaction_number, "fences": dict(sorted(self.fences.items())),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StreamRecord:
        history = StreamHistory.from_json(value["epochs"])
        record = cls(value["scope"], value["stream"], StreamConfig.from_json_object(value["config"]),
                     float(value["time"]), history.epochs[0])
        record.history = history
        record.next_number = int(value["next_number"])
        record.state = StreamState(value["state"])
        record.sealed = bool(value["sealed"])
        record.pending = value["pending"]
        record.sealed_lengths = _cut_of(value["sealed_lengths"])
        record.head = _cut_of(value["head"])
        record.recorded_cuts = [RecordedCut(float(c["time"]), _cut_of(c["cut"])) for c in value["recorded_cuts"]]
        # (Snapshots written before stream transactions existed have none of these.)
        record.transactions = {r.txn_id: r for r in map(TransactionRecord.from_json, value.get("transactions", ()))}
        record.finished_transactions = list(value.get("finished_transactions", ()))
        record.next_commit_order = int(value.get("next_commit_order", 1))
        record.next_transaction_number = int(value.get("next_transaction_number", 1))
        record.fences = {str(k): int(v) for k, v in value.get("fences", {}).items()}
        return record

    def check_invariants(self) -> None:
        self.history.check_invariants()
        assert (self.state is StreamState.IDLE) == (self.pending is None), (self.state, self.pending)
        assert all(self.history.segment(i) is not None for i in self.head), self.head
        numbers = [s.number for s in self.history.segments()]
        assert not numbers or max(numbers) < self.next_number, (numbers, self.next_number)
        times = [c.time for c in self.recorded_cuts]
        assert times == sorted(times), times
        assert len(self.recorded_cuts) <= limits.CONTROLLER_RETENTION_CUTS_PER_STREAM_MAX
        if self.sealed:
            assert all(s.segment_id in self.sealed_lengths for s in self.current.segments)
        self._check_transactions()

    def _check_transactions(self) -> None:
        finished = [t for t, r in self.transactions.items() if r.status.finished]
        assert sorted(finished) == sorted(self.finished_transactions), (finished, self.finished_transactions)
        assert len(self.finished_transactions) <= limits.TRANSACTIONS_FINISHED_PER_STREAM_MAX
        assert self.active_transaction_count <= limits.TRANSACTIONS_ACTIVE_PER_STREAM_MAX
        orders = [r.order for r in self.transactions.values() if r.order]
        assert len(set(orders)) == len(orders) and all(o < self.next_commit_order for o in orders), orders
        numbers = [r.number for r in self.transactions.values() if r.number]
        assert len(set(numbers)) == len(numbers) and all(n < self.next_transaction_number for n in numbers), numbers
        for txn_id, record in self.transactions.items():
            assert txn_id == record.txn_id
            record.check_invariants()
        if self.sealed:
            assert all(r.status.finished for r in self.transactions.values()), "a sealed stream has live transactions"
        if self.state is StreamState.COMMITTING:
            assert self.pending is not None and self.pending["kind"] == "commit"
            committing = self.transactions[self.pending["txn"]]
            assert committing.status is TxnStatus.COMMITTING
            assert commit_queue(self.transactions)[0] is committing, "a commit started out of commit order"
            assert len(self.pending["targets"]) == len(committing.segments)
        assert len(self.fences) <= limits.FENCE_KEYS_PER_STREAM_MAX
        assert all(type(v) is int and 0 <= v <= limits.FENCE_VALUE_MAX for v in self.fences.values())


class ReaderGroupRecord:
    """One reader group's registration."""

    __slots__ = ("config", "created_time", "generation", "name", "scope", "state_segment", "subscriber_cuts")

    def __init__(self, scope: str, name: str, config: ReaderGroupConfig, state_segment: str,
                 created_time: float) -> None:
        self.scope = scope
        self.name = name
        self.config = config
        self.state_segment = state_segment
        self.created_time = created_time
        self.generation = 0
        #: "scope/stream" -> the cut the group last reported as consumed.
        self.subscriber_cuts: dict[str, dict[int, int]] = {}

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "group": self.name, "config": self.config.to_json_object(),
                "state_segment": self.state_segment, "time": self.created_time, "generation": self.generation,
                "subscriber_cuts": {s: _cut_json(c) for s, c in self.subscriber_cuts.items()}}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ReaderGroupRecord:
        record = cls(value["scope"], value["group"], ReaderGroupConfig.from_json_object(value["config"]),
                     value["state_segment"], float(value["time"]))
        record.generation = int(value["generation"])
        record.subscriber_cuts = {s: _cut_of(c) for s, c in value["subscriber_cuts"].items()}
        return record


class ControllerState:
    """Scopes, streams and reader groups; changed only by ``apply``."""

    def __init__(self) -> None:
        self.scopes: dict[str, float] = {}  # scope -> creation time
        self.streams: dict[tuple[str, str], StreamRecord] = {}
        self.groups: dict[tuple[str, str], ReaderGroupRecord] = {}
        #: The latest time any record carried: recorded times never go backwards, even if the clock does.
        self.time_floor = 0.0
        #: Records applied since the last snapshot (and their bytes): when to snapshot next.
        self.records_since_snapshot = 0
        #: Stream transactions not finished, over all streams.
        self.active_transactions = 0

    # --- Queries -----------------------------------------------------------------------------------

    def streams_of(self, scope: str) -> list[StreamRecord]:
        return [s for (sc, _), s in sorted(self.streams.items()) if sc == scope]

    def groups_of(self, scope: str) -> list[ReaderGroupRecord]:
        return [g for (sc, _), g in sorted(self.groups.items()) if sc == scope]

    def subscribers_of(self, qualified_stream: str) -> list[ReaderGroupRecord]:
        """The reader groups with consumption retention that read the stream."""
        return [g for g in self.groups.values()
                if g.config.retention == "consumption" and qualified_stream in g.config.streams]

    # --- Applying records --------------------------------------------------------------------------

    def apply(self, record: Mapping[str, Any]) -> None:
        """Apply one record (validated before it was written)."""
        kind = record.get("type")
        handler = _APPLY.get(kind)  # type: ignore[arg-type]
        if handler is None:
            raise InternalError(f"unknown metadata record type {kind!r}")
        time = record.get("time")
        if isinstance(time, (int, float)):
            self.time_floor = max(self.time_floor, float(time))
        handler(self, record)
        self.records_since_snapshot += 1

    def _stream(self, record: Mapping[str, Any]) -> StreamRecord:
        stream = self.streams.get((record["scope"], record["stream"]))
        if stream is None:
            raise InternalError(f"a {record['type']} record for unknown stream {record['scope']}/{record['stream']}")
        return stream

    def _move(self, stream: StreamRecord, kind: str) -> None:
        following = STREAM_TRANSITIONS.get((stream.state, kind))
        if following is None:
            raise InternalError(f"stream {stream.qualified_name}: no transition from {stream.state.value} on {kind}")
        stream.state = following

    def _scope_created(self, record: Mapping[str, Any]) -> None:
        if record["scope"] in self.scopes:
            raise InternalError(f"scope {record['scope']} created twice")
        self.scopes[record["scope"]] = float(record["time"])

    def _scope_deleted(self, record: Mapping[str, Any]) -> None:
        self.scopes.pop(record["scope"])

    def _stream_created(self, record: Mapping[str, Any]) -> None:
        key = (record["scope"], record["stream"])
        if key in self.streams or record["scope"] not in self.scopes:
            raise InternalError(f"stream {key} cannot be created")
        self.streams[key] = StreamRecord(record["scope"], record["stream"],
                                         StreamConfig.from_json_object(record["config"]), float(record["time"]),
                                         EpochRecord.from_json(record["epoch"]))

    def _stream_updated(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "stream_updated")
        stream.config = StreamConfig.from_json_object(record["config"])

    def _scale_started(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "scale_started")
        new_epoch = EpochRecord.from_json(record["epoch"])
        if new_epoch.epoch != stream.current.epoch + 1:
            raise InternalError(f"scale of {stream.qualified_name} to epoch {new_epoch.epoch} from "
                                f"{stream.current.epoch}")
        stream.pending = {"kind": "scale", "seal": list(record["seal"]), "epoch": record["epoch"],
                          "epoch_created": False, "sealed": False, "manual": bool(record.get("manual", True))}
        stream.next_number = max(stream.next_number, int(record["next_number"]))

    def _epoch_created(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "epoch_created")
        assert stream.pending is not None
        stream.history = stream.history.with_epoch(EpochRecord.from_json(stream.pending["epoch"]))
        stream.pending["epoch_created"] = True

    def _segments_sealed(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "segments_sealed")
        assert stream.pending is not None
        stream.sealed_lengths.update(_cut_of(record["lengths"]))
        stream.pending["sealed"] = True

    def _scale_completed(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "scale_completed")
        stream.pending = None

    def _seal_started(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "seal_started")
        stream.pending = {"kind": "seal"}

    def _stream_sealed(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "stream_sealed")
        stream.sealed_lengths.update(_cut_of(record["lengths"]))
        stream.sealed = True
        stream.pending = None

    def _truncation_started(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "truncation_started")
        stream.pending = {"kind": "truncate", "cut": dict(record["cut"])}

    def _truncation_completed(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "truncation_completed")
        stream.head = _cut_of(record["cut"])
        keep_from = int(record["keep_from_epoch"])
        if keep_from > stream.history.first_epoch:
            stream.history = stream.history.without_epochs_before(keep_from)
            stream.sealed_lengths = {i: n for i, n in stream.sealed_lengths.items()
                                     if stream.history.segment(i) is not None}
        stream.recorded_cuts = [c for c in stream.recorded_cuts
                                if all(stream.history.segment(i) is not None for i in c.cut)]
        stream.pending = None

    def _delete_started(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        if not stream.sealed:
            raise InternalError(f"stream {stream.qualified_name} deleted while not sealed")
        self._move(stream, "delete_started")
        stream.pending = {"kind": "delete"}

    def _stream_deleted(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        if stream.state is not StreamState.DELETING:
            raise InternalError(f"stream {stream.qualified_name} deleted from {stream.state.value}")
        self.active_transactions -= stream.active_transaction_count
        del self.streams[(stream.scope, stream.name)]

    def _tail_cut_recorded(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "tail_cut_recorded")
        stream.recorded_cuts.append(RecordedCut(float(record["time"]), _cut_of(record["cut"])))
        stream.recorded_cuts = thin_recorded_cuts(stream.recorded_cuts,
                                                  limits.CONTROLLER_RETENTION_CUTS_PER_STREAM_MAX)

    def _reader_group_created(self, record: Mapping[str, Any]) -> None:
        key = (record["scope"], record["group"])
        if key in self.groups or record["scope"] not in self.scopes:
            raise InternalError(f"reader group {key} cannot be created")
        self.groups[key] = ReaderGroupRecord(record["scope"], record["group"],
                                             ReaderGroupConfig.from_json_object(record["config"]),
                                             record["state_segment"], float(record["time"]))

    def _reader_group_updated(self, record: Mapping[str, Any]) -> None:
        group = self.groups[(record["scope"], record["group"])]
        group.config = ReaderGroupConfig.from_json_object(record["config"])
        group.generation = int(record["generation"])
        group.subscriber_cuts = {s: c for s, c in group.subscriber_cuts.items() if s in group.config.streams}

    def _reader_group_deleted(self, record: Mapping[str, Any]) -> None:
        del self.groups[(record["scope"], record["group"])]

    def _subscriber_cut_updated(self, record: Mapping[str, Any]) -> None:
        group = self.groups[(record["scope"], record["group"])]
        group.subscriber_cuts[record["stream"]] = _cut_of(record["cut"])

    # --- Stream transactions ---------------------------------------------------------------------

    def _transaction(self, stream: StreamRecord, txn_id: str, kind: str) -> TransactionRecord:
        found = stream.transactions.get(txn_id)
        if found is None:
            raise InternalError(f"a {kind} record for unknown transaction {txn_id} of {stream.qualified_name}")
        return found

    def _finished(self, stream: StreamRecord, txn_id: str) -> None:
        stream.finished_transactions.append(txn_id)
        self.active_transactions -= 1
        while len(stream.finished_transactions) > limits.TRANSACTIONS_FINISHED_PER_STREAM_MAX:
            del stream.transactions[stream.finished_transactions.pop(0)]

    def _txn_created(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        txn_id = record["txn"]
        if txn_id in stream.transactions:
            raise InternalError(f"transaction {txn_id} of {stream.qualified_name} created twice")
        stream.transactions[txn_id] = TransactionRecord(
            txn_id, int(record["epoch"]), [SegmentRecord.from_json(s) for s in record["segments"]],
            float(record["lease"]), float(record["opened"]), float(record["deadline"]),
            stream.next_transaction_number)
        stream.next_transaction_number += 1
        self.active_transactions += 1

    def _txn_pinged(self, record: Mapping[str, Any]) -> None:
        transaction = self._transaction(self._stream(record), record["txn"], "txn_pinged")
        if transaction.status is not TxnStatus.OPEN or not record["deadline"] > transaction.deadline:
            raise InternalError(f"transaction {transaction.txn_id}: a ping that does not extend an open lease")
        transaction.deadline = float(record["deadline"])

    def _txns_committing(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        for txn_id in record["txns"]:
            transaction = self._transaction(stream, txn_id, "txns_committing")
            transaction.advance("txns_committing")
            transaction.order = stream.next_commit_order
            stream.next_commit_order += 1
        fence = record.get("fence")
        if fence is not None:
            key, value = fence
            if stream.fences.get(key, -1) >= value:
                raise InternalError(f"fence {key!r} of {stream.qualified_name} would go from "
                                    f"{stream.fences.get(key)} to {value}")
            stream.fences[key] = int(value)

    def _txns_aborting(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        for txn_id in record["txns"]:
            self._transaction(stream, txn_id, "txns_aborting").advance("txns_aborting")

    def _txn_aborted(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._transaction(stream, record["txn"], "txn_aborted").advance("txn_aborted")
        self._finished(stream, record["txn"])

    def _commit_started(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        transaction = self._transaction(stream, record["txn"], "commit_started")
        queue = commit_queue(stream.transactions)
        if not queue or queue[0] is not transaction:
            raise InternalError(f"transaction {transaction.txn_id} of {stream.qualified_name} started its commit "
                                "out of commit order")
        self._move(stream, "commit_started")
        stream.pending = {"kind": "commit", "txn": transaction.txn_id, "targets": list(record["targets"]),
                          "roll": record["roll"], "epochs_created": False}
        stream.next_number = max(stream.next_number, int(record["next_number"]))

    def _roll_epochs_created(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "roll_epochs_created")
        assert stream.pending is not None and stream.pending["roll"] is not None
        roll = stream.pending["roll"]
        stream.history = stream.history.with_epoch(EpochRecord.from_json(roll["duplicate"])).with_epoch(
            EpochRecord.from_json(roll["active"]))
        stream.sealed_lengths.update(_cut_of(record["lengths"]))
        stream.pending["epochs_created"] = True

    def _commit_completed(self, record: Mapping[str, Any]) -> None:
        stream = self._stream(record)
        self._move(stream, "commit_completed")
        assert stream.pending is not None
        transaction = self._transaction(stream, stream.pending["txn"], "commit_completed")
        if transaction.txn_id != record["txn"]:
            raise InternalError(f"commit_completed for {record['txn']} while {transaction.txn_id} commits")
        transaction.advance("commit_completed")
        stream.sealed_lengths.update(_cut_of(record["lengths"]))
        stream.pending = None
        self._finished(stream, transaction.txn_id)

    # --- Snapshots ---------------------------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        return {"format": SNAPSHOT_FORMAT, "time_floor": self.time_floor,
                "scopes": dict(sorted(self.scopes.items())),
                "streams": [s.to_json() for _, s in sorted(self.streams.items())],
                "groups": [g.to_json() for _, g in sorted(self.groups.items())]}

    @classmethod
    def from_snapshot(cls, value: Mapping[str, Any]) -> ControllerState:
        if value.get("format") != SNAPSHOT_FORMAT:
            raise InternalError(f"unknown snapshot format {value.get('format')!r}")
        state = cls()
        state.time_floor = float(value["time_floor"])
        state.scopes = {k: float(v) for k, v in value["scopes"].items()}
        for raw in value["streams"]:
            stream = StreamRecord.from_json(raw)
            state.streams[(stream.scope, stream.name)] = stream
            state.active_transactions += stream.active_transaction_count
        for raw in value["groups"]:
            group = ReaderGroupRecord.from_json(raw)
            state.groups[(group.scope, group.name)] = group
        return state

    def check_invariants(self) -> None:
        for (scope, name), stream in self.streams.items():
            assert scope in self.scopes and (stream.scope, stream.name) == (scope, name)
            stream.check_invariants()
        for (scope, name), group in self.groups.items():
            assert scope in self.scopes and (group.scope, group.name) == (scope, name)
            assert set(group.subscriber_cuts) <= set(group.config.streams)
        assert len(self.scopes) <= limits.CONTROLLER_SCOPES_MAX
        assert len(self.streams) <= limits.CONTROLLER_STREAMS_MAX
        assert len(self.groups) <= limits.CONTROLLER_READER_GROUPS_MAX
        assert self.active_transactions == sum(s.active_transaction_count for s in self.streams.values())
        assert self.active_transactions <= limits.TRANSACTIONS_ACTIVE_MAX


_APPLY: Final = {
    "scope_created": ControllerState._scope_created,
    "scope_deleted": ControllerState._scope_deleted,
    "stream_created": ControllerState._stream_created,
    "stream_updated": ControllerState._stream_updated,
    "scale_started": ControllerState._scale_started,
    "epoch_created": ControllerState._epoch_created,
    "segments_sealed": ControllerState._segments_sealed,
    "scale_completed": ControllerState._scale_completed,
    "seal_started": ControllerState._seal_started,
    "stream_sealed": ControllerState._stream_sealed,
    "truncation_started": ControllerState._truncation_started,
    "truncation_completed": ControllerState._truncation_completed,
    "delete_started": ControllerState._delete_started,
    "stream_deleted": ControllerState._stream_deleted,
    "tail_cut_recorded": ControllerState._tail_cut_recorded,
    "reader_group_created": ControllerState._reader_group_created,
    "reader_group_updated": ControllerState._reader_group_updated,
    "reader_group_deleted": ControllerState._reader_group_deleted,
    "subscriber_cut_updated": ControllerState._subscriber_cut_updated,
    "txn_created": ControllerState._txn_created,
    "txn_pinged": ControllerState._txn_pinged,
    "txns_committing": ControllerState._txns_committing,
    "txns_aborting": ControllerState._txns_aborting,
    "txn_aborted": ControllerState._txn_aborted,
    "commit_started": ControllerState._commit_started,
    "roll_epochs_created": ControllerState._roll_epochs_created,
    "commit_completed": ControllerState._commit_completed,
}


def initial_stream_epoch(config: StreamConfig, creation_time: float) -> EpochRecord:
    """Epoch 0 of a new stream with ``config``."""
    return initial_epoch(config.scaling.initial_segments, creation_time)


def record_types() -> Iterable[str]:
    return _APPLY.keys()
