"""Stream transactions as a pure state machine: ``spec/Transactions.tla`` in Python.

Theory of operation.  A stream is a sequence of epochs; each epoch splits the routing keys into
segments by one of the stream's layouts, and a reader of a key reads that key's segment of each
epoch in turn (a successor only once its predecessor is sealed).  A transaction opened in the
active epoch gets one hidden transaction segment per segment of that epoch (the implementation
places each on its parent's container); a write goes, by key, into one of them: durable, invisible.
Committing durably marks the transaction COMMITTING and gives it the next commit order; the
controller's commit workflow then takes the committing transaction with the lowest order
(``start_commit``), merges -- seals and concatenates -- each of its segments onto the matching
segment of the target epoch (``merge_txn_segment``, one segment-store operation each), and marks it
COMMITTED (``finish_commit``).  The target is the active epoch when that has the transaction's
layout; otherwise the transaction *rolls*: it merges into a new duplicate of its own epoch, which
``finish_commit`` seals together with the old active epoch before a duplicate of the active epoch
becomes the active one, so readers meet it after everything written before the commit and before
everything written after it.  Aborting (by the client, by lease expiry, or by a fenced multi-commit
whose value is already recorded) marks it ABORTING; ``finish_abort`` deletes its segments.

The controller's state is durable; a crash loses only the fenced requests it has not answered, and
a restarted controller resumes from the rest.  The fenced multi-commit reads the recorded value for
its key as the controller receives it (again with ``read_fence`` if it changed since) and writes its
decision with a conditional write that succeeds only if that value is still the recorded one
(``decide_fenced_commit``): commit every listed transaction and record the value, or -- for a value
not above the recorded one -- abort the listed open transactions and answer "already committed", or
reject a request that lists a transaction that is not open.

Every spec action is a function of the same name in snake case (``Begin`` -> ``begin``,
``WriteEvent`` -> ``write_event``, ``MergeTxnSegment`` -> ``merge_txn_segment``,
``DecideFencedCommit`` -> ``decide_fenced_commit``, ...) taking a state and the action's
parameters and returning the next state.  A transition whose spec guard is false raises
``NotEnabled`` -- including the steps the spec leaves out because they would change nothing (a ping
that would not move the deadline, a read of a value already read).  The spec's bounds on the
environment (``MaxTxnEvents``, ``MaxPlainEvents``, ``MaxTime``, ``MaxCrashes``,
``MaxFencedRequests``) are applied by the explorer in ``proofs/``; ``NumTxns`` is
``initial_state``'s ``txn_count``.  Transactions, epochs and segment positions are numbered from 1,
as in the spec.  Nothing here does I/O, reads a clock or
draws a random number: time is ``tick``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from millstream.model.durable_log import NotEnabled
from millstream.model.frozen_map import FrozenMap

__all__ = [
    "ACTIONS",
    "LIFECYCLE",
    "PLAIN_WRITER",
    "ControllerStatus",
    "Epoch",
    "Event",
    "FenceDecision",
    "FenceOutcome",
    "FencedRequest",
    "InboxEntry",
    "NotEnabled",
    "StreamSetup",
    "Transaction",
    "TransactionsState",
    "TxnStatus",
    "Workflow",
    "abort",
    "begin",
    "check_invariants",
    "commit",
    "crash_controller",
    "decide_fenced_commit",
    "expire_lease",
    "fence_outcome",
    "finish_abort",
    "finish_commit",
    "initial_state",
    "merge_txn_segment",
    "ping",
    "read_fence",
    "readable",
    "recorded_value",
    "request_fenced_commit",
    "restart_controller",
    "scale",
    "settle",
    "start_commit",
    "stream_of",
    "tick",
    "write_event",
    "write_plain_event",
]


class TxnStatus(enum.Enum):
    """A stream transaction's status (the values are the spec's names)."""

    NONE = "none"
    """Not begun yet (the model's transactions are numbered up front)."""
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTING = "aborting"
    ABORTED = "aborted"

    def __repr__(self) -> str:
        return f"TxnStatus.{self.name}"


class ControllerStatus(enum.Enum):
    """Whether the controller is up or down (crashed, its workflows to be resumed)."""

    UP = "up"
    DOWN = "down"

    def __repr__(self) -> str:
        return f"ControllerStatus.{self.name}"


class FenceOutcome(enum.Enum):
    """The answer to a fenced multi-commit."""

    COMMITTED = "committed"
    """Every listed transaction is COMMITTING and the value is recorded."""
    ALREADY_COMMITTED = "already_committed"
    """The recorded value was not lower: the listed open transactions are aborted, nothing committed."""
    REJECTED = "rejected"
    """A listed transaction was not open: nothing changed, nothing recorded."""

    def __repr__(self) -> str:
        return f"FenceOutcome.{self.name}"


#: The lifecycle table: for each status, the events that move a transaction on, and where to.  An
#: event is the spec action that makes the change; the fenced decision adds its outcome.  Nothing
#: else changes a status (``tests/model`` checks this table against the spec's ``Lifecycle``).
LIFECYCLE: Final[Mapping[TxnStatus, Mapping[str, TxnStatus]]] = {
    TxnStatus.NONE: {"Begin": TxnStatus.OPEN},
    TxnStatus.OPEN: {
        "Commit": TxnStatus.COMMITTING,
        "DecideFencedCommit/committed": TxnStatus.COMMITTING,
        "Abort": TxnStatus.ABORTING,
        "ExpireLease": TxnStatus.ABORTING,
        "DecideFencedCommit/already_committed": TxnStatus.ABORTING,
    },
    TxnStatus.COMMITTING: {"FinishCommit": TxnStatus.COMMITTED},
    TxnStatus.COMMITTED: {},
    TxnStatus.ABORTING: {"FinishAbort": TxnStatus.ABORTED},
    TxnStatus.ABORTED: {},
}

#: The spec's actions, in the order the spec defines them (each is a function here in snake case).
ACTIONS: Final = (
    "Begin", "WriteEvent", "Ping", "Tick", "ExpireLease", "Commit", "Abort", "FinishAbort",
    "StartCommit", "MergeTxnSegment", "FinishCommit", "Scale", "WritePlainEvent", "CrashController",
    "RestartController", "RequestFencedCommit", "ReadFence", "DecideFencedCommit",
)

#: The source of the non-transactional writer's events (transactions are numbered from 1).
PLAIN_WRITER: Final = 0

Layout = tuple[frozenset[str], ...]


@attrs.frozen
class StreamSetup:
    """The constants a transition needs: the stream's layouts (epoch 1 has ``layouts[0]``; every
    scale moves to the next) and a lease's length in ticks."""

    layouts: tuple[Layout, ...]
    lease_ticks: int

    def __attrs_post_init__(self) -> None:
        if not self.layouts:
            raise ValueError("a stream needs at least one layout")
        keys = self.keys
        for layout in self.layouts:
            if frozenset().union(*layout) != keys or sum(len(part) for part in layout) != len(keys):
                raise ValueError(f"layout {layout!r} does not split the keys {sorted(keys)} into disjoint parts")
        if self.lease_ticks < 1:
            raise ValueError("a lease lasts at least one tick")

    @property
    def keys(self) -> frozenset[str]:
        return frozenset().union(*self.layouts[0])

    @property
    def positions(self) -> range:
        """Segment positions: 1 .. the number of segments of the widest layout."""
        return range(1, max(len(layout) for layout in self.layouts) + 1)

    def position_of(self, layout: int, key: str) -> int:
        """The position (from 1) of the segment that owns ``key`` in layout ``layout`` (from 1)."""
        for position, keys in enumerate(self.layouts[layout - 1], start=1):
            if key in keys:
                return position
        raise NotEnabled(f"no segment owns the key {key!r}")


@attrs.frozen(cache_hash=True)
class Event:
    """An event: who wrote it (a transaction, or ``PLAIN_WRITER``), its key, and its number among
    its source's events (the spec's ``src``, ``key``, ``n``)."""

    source: int
    key: str
    number: int


Segment = tuple[Event, ...]


@attrs.frozen(cache_hash=True)
class Epoch:
    """An epoch of the stream: its layout (from 1), whether sealed, one event sequence per segment."""

    layout: int
    sealed: bool
    segments: tuple[Segment, ...]


@attrs.frozen(cache_hash=True)
class Transaction:
    """A transaction's durable record.  ``segments`` are its transaction segments, one per position
    of its epoch's layout; after a merge or a deletion their contents stay, as a ghost of what it
    wrote.  ``opened`` is the time it began and ``deadline`` the time its lease lapses (the
    controller records both; a ping moves the deadline).  ``order`` is its commit order (0 until
    it commits), ``merged`` the positions merged so far; ``plain_before`` / ``plain_after``
    (ghosts) count the plain events written when its commit was requested and when it completed."""

    status: TxnStatus = TxnStatus.NONE
    epoch: int = 0
    order: int = 0
    opened: int = 0
    deadline: int = 0
    segments: tuple[Segment, ...] = ()
    merged: frozenset[int] = frozenset()
    plain_before: int = 0
    plain_after: int = 0

    def written(self) -> tuple[Event, ...]:
        """Every event written into it, segment by segment."""
        return tuple(event for segment in self.segments for event in segment)


NO_TRANSACTION: Final = Transaction()


@attrs.frozen
class Workflow:
    """The commit in progress (the stream's durable state): a transaction and its target epoch."""

    txn: int = 0
    target: int = 0


IDLE: Final = Workflow()


@attrs.frozen(cache_hash=True)
class FencedRequest:
    """``commit_transactions(txns, fence=(key, value))``."""

    txns: frozenset[int]
    key: str
    value: int

    def __attrs_post_init__(self) -> None:
        if not self.txns or min(self.txns) < 1:
            raise ValueError("a fenced multi-commit lists one or more transactions")
        if self.value < 1:
            raise ValueError("a fence value is a positive integer")


@attrs.frozen(cache_hash=True)
class InboxEntry:
    """A fenced request the controller has received, and the recorded value it read."""

    request: FencedRequest
    seen: int


@attrs.frozen(cache_hash=True)
class FenceDecision:
    """A fenced request answered (the ghost ``fenceLog``)."""

    request: FencedRequest
    outcome: FenceOutcome


@attrs.frozen(cache_hash=True)
class TransactionsState:
    """The spec's variables (plus ``setup``, the constants a transition needs)."""

    setup: StreamSetup
    controller: ControllerStatus
    crashes: int
    clock: int
    epochs: tuple[Epoch, ...]
    active: int
    txn: tuple[Transaction, ...]
    workflow: Workflow
    plain: int
    recorded: FrozenMap[str, int]
    inbox: tuple[InboxEntry, ...]
    sent: int
    fence_log: tuple[FenceDecision, ...]

    @property
    def txn_ids(self) -> range:
        return range(1, len(self.txn) + 1)

    def transaction(self, t: int) -> Transaction:
        if t not in self.txn_ids:
            raise NotEnabled(f"there is no transaction {t}")
        return self.txn[t - 1]

    def epoch(self, e: int) -> Epoch:
        return self.epochs[e - 1]

    def layout_of(self, e: int) -> int:
        return self.epochs[e - 1].layout

    @property
    def up(self) -> bool:
        return self.controller is ControllerStatus.UP

    @property
    def commit_queue(self) -> list[int]:
        return [t for t in self.txn_ids if self.txn[t - 1].status is TxnStatus.COMMITTING]

    @property
    def next_order(self) -> int:
        return 1 + sum(1 for record in self.txn if record.order > 0)

    def status(self, t: int) -> TxnStatus:
        """What ``Transaction.check_status`` reports for transaction ``t``."""
        return self.transaction(t).status

    def stream_of(self, key: str) -> tuple[Event, ...]:
        return stream_of(self, key)

    def readable(self, key: str) -> tuple[Event, ...]:
        return readable(self, key)

    def check_invariants(self) -> None:
        check_invariants(self)


def _new_epoch(setup: StreamSetup, layout: int) -> Epoch:
    return Epoch(layout, False, ((),) * len(setup.layouts[layout - 1]))


def initial_state(setup: StreamSetup, txn_count: int, fence_keys: Iterable[str] = ()) -> TransactionsState:
    """The spec's ``Init``: epoch 1 active, transactions ``1..txn_count`` not begun, nothing recorded."""
    return TransactionsState(
        setup=setup, controller=ControllerStatus.UP, crashes=0, clock=0, epochs=(_new_epoch(setup, 1),),
        active=1, txn=(NO_TRANSACTION,) * txn_count, workflow=IDLE, plain=0,
        recorded=FrozenMap((key, 0) for key in sorted(fence_keys)), inbox=(), sent=0, fence_log=())


# --- Queries: what a client can observe -----------------------------------------------------------


def _key_events(segment: Segment, key: str) -> tuple[Event, ...]:
    return tuple(event for event in segment if event.key == key)


def _stream_up_to(state: TransactionsState, key: str, last_epoch: int) -> tuple[Event, ...]:
    events: list[Event] = []
    for epoch in state.epochs[:last_epoch]:
        events += _key_events(epoch.segments[state.setup.position_of(epoch.layout, key) - 1], key)
    return tuple(events)


def stream_of(state: TransactionsState, key: str) -> tuple[Event, ...]:
    """The spec's ``StreamOf(k)``: the events of ``key`` every reader reads, in order (epoch by
    epoch, the segment that owns the key), including what is not readable yet."""
    return _stream_up_to(state, key, len(state.epochs))


def readable(state: TransactionsState, key: str) -> tuple[Event, ...]:
    """The spec's ``Readable(k)``: what readers can read now -- up to the active epoch (a roll's
    duplicate epoch lies beyond it until the commit finishes)."""
    return _stream_up_to(state, key, state.active)


def recorded_value(state: TransactionsState, key: str) -> int:
    """The value recorded for a fence key (0: none)."""
    return state.recorded.get(key, 0)


def fence_outcome(state: TransactionsState, entry: InboxEntry) -> FenceOutcome:
    """The spec's ``FenceOutcome(q)``: what the controller decides for a request, given the value it read."""
    if entry.request.value <= entry.seen:
        return FenceOutcome.ALREADY_COMMITTED
    if all(state.transaction(t).status is TxnStatus.OPEN for t in entry.request.txns):
        return FenceOutcome.COMMITTED
    return FenceOutcome.REJECTED


# --- Actions --------------------------------------------------------------------------------------


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _advance(record: Transaction, event: str, **changes: Any) -> Transaction:
    """Move a transaction through the lifecycle table (and change ``changes`` with it)."""
    following = LIFECYCLE[record.status].get(event)
    if following is None:
        raise NotEnabled(f"{event} is not enabled for a transaction that is {record.status.value}")
    return attrs.evolve(record, status=following, **changes)


def _with_txn(state: TransactionsState, t: int, record: Transaction) -> tuple[Transaction, ...]:
    return (*state.txn[:t - 1], record, *state.txn[t:])


def _with_epoch(epochs: tuple[Epoch, ...], e: int, epoch: Epoch) -> tuple[Epoch, ...]:
    return (*epochs[:e - 1], epoch, *epochs[e:])


def _append_to_segment(epoch: Epoch, position: int, events: Segment) -> Epoch:
    segments = list(epoch.segments)
    segments[position - 1] = segments[position - 1] + events
    return attrs.evolve(epoch, segments=tuple(segments))


def begin(state: TransactionsState, t: int) -> TransactionsState:
    """``Begin(t)``: open a transaction in the active epoch, one transaction segment per segment."""
    _require(state.up, "Begin")
    record = _advance(state.transaction(t), "Begin", epoch=state.active, opened=state.clock,
                      deadline=state.clock + state.setup.lease_ticks,
                      segments=((),) * len(state.setup.layouts[state.layout_of(state.active) - 1]))
    return attrs.evolve(state, txn=_with_txn(state, t, record))


def write_event(state: TransactionsState, t: int, key: str) -> TransactionsState:
    """``WriteEvent(t, k)``: an event into the transaction segment that owns ``key``: durable, invisible."""
    record = state.transaction(t)
    _require(record.status is TxnStatus.OPEN, "WriteEvent")
    position = state.setup.position_of(state.layout_of(record.epoch), key)
    segments = list(record.segments)
    segments[position - 1] = (*segments[position - 1], Event(t, key, len(record.written()) + 1))
    return attrs.evolve(state, txn=_with_txn(state, t, attrs.evolve(record, segments=tuple(segments))))


def ping(state: TransactionsState, t: int) -> TransactionsState:
    """``Ping(t)``: renew the lease of an open transaction whose lease has not lapsed (enabled only
    if the deadline moves)."""
    record = state.transaction(t)
    deadline = state.clock + state.setup.lease_ticks
    _require(state.up and record.status is TxnStatus.OPEN and state.clock < record.deadline < deadline, "Ping")
    return attrs.evolve(state, txn=_with_txn(state, t, attrs.evolve(record, deadline=deadline)))


def tick(state: TransactionsState) -> TransactionsState:
    """``Tick``: one unit of time passes."""
    return attrs.evolve(state, clock=state.clock + 1)


def expire_lease(state: TransactionsState, t: int) -> TransactionsState:
    """``ExpireLease(t)``: the controller aborts an open transaction whose lease lapsed."""
    record = state.transaction(t)
    _require(state.up and state.clock >= record.deadline, "ExpireLease")
    return attrs.evolve(state, txn=_with_txn(state, t, _advance(record, "ExpireLease")))


def commit(state: TransactionsState, t: int) -> TransactionsState:
    """``Commit(t)``: durably COMMITTING, with the next commit order; the workflow does the rest."""
    _require(state.up, "Commit")
    record = _advance(state.transaction(t), "Commit", order=state.next_order, plain_before=state.plain)
    return attrs.evolve(state, txn=_with_txn(state, t, record))


def abort(state: TransactionsState, t: int) -> TransactionsState:
    """``Abort(t)``: durably ABORTING."""
    _require(state.up, "Abort")
    return attrs.evolve(state, txn=_with_txn(state, t, _advance(state.transaction(t), "Abort")))


def finish_abort(state: TransactionsState, t: int) -> TransactionsState:
    """``FinishAbort(t)``: the abort workflow deletes the transaction segments."""
    _require(state.up, "FinishAbort")
    return attrs.evolve(state, txn=_with_txn(state, t, _advance(state.transaction(t), "FinishAbort")))


def start_commit(state: TransactionsState, t: int) -> TransactionsState:
    """``StartCommit(t)``: the workflow takes the committing transaction with the lowest commit order
    and picks its target: the active epoch if that has the transaction's layout, else a new
    duplicate of the transaction's epoch (a rolling transaction)."""
    record = state.transaction(t)
    _require(state.up and state.workflow == IDLE and record.status is TxnStatus.COMMITTING
             and all(record.order <= state.transaction(u).order for u in state.commit_queue), "StartCommit")
    layout = state.layout_of(record.epoch)
    if layout == state.layout_of(state.active):
        return attrs.evolve(state, workflow=Workflow(t, state.active))
    return attrs.evolve(state, epochs=(*state.epochs, _new_epoch(state.setup, layout)),
                        workflow=Workflow(t, len(state.epochs) + 1))


def merge_txn_segment(state: TransactionsState, position: int) -> TransactionsState:
    """``MergeTxnSegment(i)``: seal the workflow's transaction segment at ``position`` and concatenate
    it onto the target epoch's segment at the same position: one segment-store operation."""
    workflow = state.workflow
    _require(state.up and workflow != IDLE, "MergeTxnSegment")
    record = state.transaction(workflow.txn)
    target = state.epoch(workflow.target)
    _require(1 <= position <= len(record.segments) and position not in record.merged and not target.sealed,
             "MergeTxnSegment")
    epochs = _with_epoch(state.epochs, workflow.target,
                         _append_to_segment(target, position, record.segments[position - 1]))
    merged = attrs.evolve(record, merged=record.merged | {position})
    return attrs.evolve(state, epochs=epochs, txn=_with_txn(state, workflow.txn, merged))


def finish_commit(state: TransactionsState) -> TransactionsState:
    """``FinishCommit``: every segment merged, the transaction is COMMITTED; after a roll the
    duplicate and the old active epoch are sealed and a duplicate of the active epoch becomes the
    active one."""
    workflow = state.workflow
    _require(state.up and workflow != IDLE, "FinishCommit")
    record = state.transaction(workflow.txn)
    _require(record.merged == frozenset(range(1, len(record.segments) + 1)), "FinishCommit")
    committed = _advance(record, "FinishCommit", plain_after=state.plain)
    state = attrs.evolve(state, txn=_with_txn(state, workflow.txn, committed), workflow=IDLE)
    if workflow.target == state.active:
        return state
    epochs = _with_epoch(state.epochs, workflow.target, attrs.evolve(state.epoch(workflow.target), sealed=True))
    epochs = _with_epoch(epochs, state.active, attrs.evolve(state.epoch(state.active), sealed=True))
    return attrs.evolve(state, epochs=(*epochs, _new_epoch(state.setup, state.layout_of(state.active))),
                        active=len(epochs) + 1)


def scale(state: TransactionsState) -> TransactionsState:
    """``Scale``: seal the active epoch and begin one with the next layout (not during a commit)."""
    _require(state.up and state.workflow == IDLE and state.layout_of(state.active) < len(state.setup.layouts),
             "Scale")
    epochs = _with_epoch(state.epochs, state.active, attrs.evolve(state.epoch(state.active), sealed=True))
    return attrs.evolve(state, epochs=(*epochs, _new_epoch(state.setup, state.layout_of(state.active) + 1)),
                        active=len(epochs) + 1)


def write_plain_event(state: TransactionsState, key: str) -> TransactionsState:
    """``WritePlainEvent(k)``: the non-transactional writer appends to the active segment owning ``key``."""
    position = state.setup.position_of(state.layout_of(state.active), key)
    event = Event(PLAIN_WRITER, key, state.plain + 1)
    epochs = _with_epoch(state.epochs, state.active, _append_to_segment(state.epoch(state.active), position, (event,)))
    return attrs.evolve(state, epochs=epochs, plain=state.plain + 1)


def crash_controller(state: TransactionsState) -> TransactionsState:
    """``CrashController``: the controller dies; the requests it had not answered are lost."""
    _require(state.up, "CrashController")
    return attrs.evolve(state, controller=ControllerStatus.DOWN, crashes=state.crashes + 1, inbox=())


def restart_controller(state: TransactionsState) -> TransactionsState:
    """``RestartController``: a controller starts again from the durable state."""
    _require(not state.up, "RestartController")
    return attrs.evolve(state, controller=ControllerStatus.UP)


def request_fenced_commit(state: TransactionsState, request: FencedRequest) -> TransactionsState:
    """``RequestFencedCommit(r)``: a caller sends a fenced multi-commit (first attempt or retry); the
    controller receives it and reads the value recorded for its key."""
    _require(state.up, "RequestFencedCommit")
    entry = InboxEntry(request, recorded_value(state, request.key))
    return attrs.evolve(state, inbox=(*state.inbox, entry), sent=state.sent + 1)


def read_fence(state: TransactionsState, index: int) -> TransactionsState:
    """``ReadFence(i)``: the value recorded for request ``index``'s key (from 1) changed since the
    controller read it (its conditional write would fail): it reads the value again."""
    _require(state.up and 1 <= index <= len(state.inbox), "ReadFence")
    entry = state.inbox[index - 1]
    value = recorded_value(state, entry.request.key)
    _require(entry.seen != value, "ReadFence")
    inbox = (*state.inbox[:index - 1], attrs.evolve(entry, seen=value), *state.inbox[index:])
    return attrs.evolve(state, inbox=inbox)


def decide_fenced_commit(state: TransactionsState, index: int) -> TransactionsState:
    """``DecideFencedCommit(i)``: the decision for request ``index`` (from 1), one conditional write
    that applies only if the value read is still the recorded one."""
    _require(state.up and 1 <= index <= len(state.inbox), "DecideFencedCommit")
    entry = state.inbox[index - 1]
    request = entry.request
    _require(entry.seen == recorded_value(state, request.key), "DecideFencedCommit")
    outcome = fence_outcome(state, entry)
    records = list(state.txn)
    recorded = state.recorded
    if outcome is FenceOutcome.COMMITTED:
        for rank, t in enumerate(sorted(request.txns)):
            records[t - 1] = _advance(records[t - 1], "DecideFencedCommit/committed",
                                      order=state.next_order + rank, plain_before=state.plain)
        recorded = recorded.set(request.key, request.value)
    elif outcome is FenceOutcome.ALREADY_COMMITTED:
        for t in request.txns:
            if records[t - 1].status is TxnStatus.OPEN:
                records[t - 1] = _advance(records[t - 1], "DecideFencedCommit/already_committed")
    return attrs.evolve(
        state, txn=tuple(records), recorded=recorded, inbox=(*state.inbox[:index - 1], *state.inbox[index:]),
        fence_log=(*state.fence_log, FenceDecision(request, outcome)))


def settle(state: TransactionsState) -> TransactionsState:
    """Run the controller's workflows until they have nothing left to do: one schedule among the
    many the spec allows (commits one at a time in commit order, segments by position, then the
    aborts).  For tests that want the end state of a commit rather than its steps."""
    while state.up:
        if state.workflow != IDLE:
            record = state.transaction(state.workflow.txn)
            pending = sorted(set(range(1, len(record.segments) + 1)) - record.merged)
            state = merge_txn_segment(state, pending[0]) if pending else finish_commit(state)
        elif state.commit_queue:
            orders = {state.transaction(t).order: t for t in state.commit_queue}
            state = start_commit(state, orders[min(orders)])
        else:
            aborting = [t for t in state.txn_ids if state.transaction(t).status is TxnStatus.ABORTING]
            if not aborting:
                break
            state = finish_abort(state, aborting[0])
    return state


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def _places(state: TransactionsState) -> Iterable[tuple[int, int, Segment]]:
    for e, epoch in enumerate(state.epochs, start=1):
        for position, segment in enumerate(epoch.segments, start=1):
            yield e, position, segment


def _contains_block(segment: Segment, block: Segment) -> bool:
    return any(segment[start:start + len(block)] == block for start in range(len(segment) - len(block) + 1))


def check_invariants(state: TransactionsState) -> None:
    """Raise AssertionError naming the first spec invariant this state breaks."""
    txns = state.txn_ids
    committed_or_committing = (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
    assert 1 <= state.active <= len(state.epochs) and not state.epoch(state.active).sealed, "TypeOK"
    assert all(record.merged <= frozenset(range(1, len(record.segments) + 1)) for record in state.txn), "TypeOK"
    assert state.workflow.txn == 0 or state.workflow.txn in txns, "TypeOK"
    assert all(epoch.sealed == (e < state.active) for e, epoch in enumerate(state.epochs, start=1)), (
        "EpochsSealedInOrder")
    assert len(state.epochs) == state.active or (
        len(state.epochs) == state.active + 1 and state.workflow.target == len(state.epochs)), "EpochsSealedInOrder"

    sources = {event.source for _, _, segment in _places(state) for event in segment}
    assert all(state.transaction(t).status in committed_or_committing for t in sources - {PLAIN_WRITER}), (
        "NoAbortedRead")

    keys = sorted(state.setup.keys)
    streams = {key: stream_of(state, key) for key in keys}
    for _, position, segment in _places(state):
        for t in {event.source for event in segment} - {PLAIN_WRITER}:
            record = state.transaction(t)
            count = sum(1 for event in segment if event.source == t)
            assert position in record.merged and len(record.segments[position - 1]) == count and _contains_block(
                segment, record.segments[position - 1]), "NoPartialTransactionRead"
    for t in txns:
        record = state.transaction(t)
        for key in keys:
            seen = tuple(event for event in streams[key] if event.source == t)
            assert seen == _key_events(record.written(), key) or (
                not seen and record.status is not TxnStatus.COMMITTED), "NoPartialTransactionRead"

    for stream in streams.values():
        orders = [state.transaction(event.source).order for event in stream if event.source != PLAIN_WRITER]
        assert orders == sorted(orders), "CommitOrderPerKey"

    for stream in streams.values():
        for a, first in enumerate(stream):
            for second in stream[a + 1:]:
                if first.source != PLAIN_WRITER and second.source == PLAIN_WRITER:
                    assert second.number > state.transaction(first.source).plain_before, "CommitBetweenPlainWrites"
                if first.source == PLAIN_WRITER and second.source != PLAIN_WRITER:
                    after = state.transaction(second.source)
                    assert after.status is not TxnStatus.COMMITTED or first.number <= after.plain_after, (
                        "CommitBetweenPlainWrites")
                if first.source == PLAIN_WRITER and second.source == PLAIN_WRITER:
                    assert first.number < second.number, "CommitBetweenPlainWrites"

    for e, position, segment in _places(state):
        owned = state.setup.layouts[state.layout_of(e) - 1][position - 1]
        assert all(event.key in owned for event in segment), "EventsInTheirKeySegment"

    for me in state.txn:
        if me.status in (TxnStatus.ABORTING, TxnStatus.ABORTED):
            assert not me.merged, "NotBothCommittedAndAborted"
        if me.status in (TxnStatus.NONE, TxnStatus.OPEN):
            assert not me.merged and me.order == 0, "NotBothCommittedAndAborted"
    for decision in state.fence_log:
        if decision.outcome is FenceOutcome.COMMITTED:
            assert all(state.transaction(t).status in committed_or_committing for t in decision.request.txns), (
                "NotBothCommittedAndAborted")

    for j, later in enumerate(state.fence_log):
        for earlier in state.fence_log[:j]:
            if (earlier.request.key == later.request.key and earlier.outcome is FenceOutcome.COMMITTED
                    and later.request.value <= earlier.request.value):
                assert later.outcome is not FenceOutcome.COMMITTED, "AlreadyRecordedCommitsNothing"
    for key, value in state.recorded.items():
        committed_values = [d.request.value for d in state.fence_log
                            if d.request.key == key and d.outcome is FenceOutcome.COMMITTED]
        assert value == max(committed_values, default=0), "AlreadyRecordedCommitsNothing"
