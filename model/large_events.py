"""Large events through transient segments: ``spec/LargeEvents.tla`` in Python.

Every spec action is a function of the same name (``WriteOrdinary`` -> ``write_ordinary``,
``SendChunk`` -> ``send_chunk``, ``AppendChunk`` -> ``append_chunk``, ...) taking a state and the
action's parameters (which EventWriter, which connection, how many requests survived a drop) and
returning the next state; the state's fields are the spec's variables.  A guard that is client or
segment-store behaviour raises ``NotEnabled``; the spec's bounds on the environment
(``NumOrdinary``, ``MaxDisconnects``) are applied by the explorer in ``proofs/``.

Theory of operation.  One parent segment, one application.  Ordinary events go through the
ordinary writer and reach the parent in order (``pending``).  A large event is streamed through its
own EventWriter (``LargeEventWriter.stream_event``): the client's framing header (part 0), then its
chunks (parts 1..n).  One of at most ``inline_max`` chunks commits as a plain append through the
ordinary writer.  A larger one creates a transient segment (``CreateTransientSegment``) and sends
its parts as conditional appends -- part ``k`` expects the transient segment to hold exactly ``k``
parts -- pipelined on a connection.  A dropped connection loses the requests that had not reached
the segment store and every reply; the ones that had may still be applied, even after the writer
reconnected (the store serves connections independently).  On reconnect the writer resends every
part not yet acknowledged (``EventWriter._resend``); the offset check rejects a resend of a part
that is already stored, and that rejection tells the writer the part is there, because on one
connection nothing before it can be missing.  ``commit`` blocks the application until every part is
acknowledged and the ordinary writer is flushed, then merges the transient segment into the parent
(``MergeSegments``): one atomic concatenation.  ``close`` before ``commit`` deletes the transient
segment; the segment store deletes it too when the writer's connection is down, and the idle-expiry
sweep at any time.  A request for a deleted transient segment fails the large event.

Writer ``w`` (1-based, as in the spec) is ``writers[w - 1]``; its transient segment is
``transients[w - 1]`` and its requests on their way ``inflight[w - 1]``.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from millstream.model.durable_log import NotEnabled

__all__ = [
    "Call",
    "ChunkRequest",
    "EventWriterState",
    "Item",
    "ItemKind",
    "LargeEventsState",
    "TransientSegment",
    "TransientState",
    "WriterPhase",
    "abandon",
    "abort",
    "accepts",
    "append_chunk",
    "check_invariants",
    "commit",
    "create_transient",
    "delete_on_disconnect",
    "deliver_ordinary",
    "disconnect",
    "expire",
    "framed",
    "initial_state",
    "is_subsequence",
    "merge",
    "reconnect",
    "send_chunk",
    "whole_events",
    "write_ordinary",
]


class ItemKind(enum.Enum):
    """What an item in a segment is: an ordinary event or a part of a large one."""

    SMALL = "small"   # an ordinary event (one item)
    LARGE = "large"   # a part of a large event: its header (part 0) or a chunk

    def __repr__(self) -> str:
        return f"ItemKind.{self.name}"


class WriterPhase(enum.Enum):
    """An EventWriter's phase."""

    OPEN = "open"                # streaming its parts
    COMMITTING = "committing"    # inside `commit`: waiting for acknowledgements and the flush
    COMMITTED = "committed"      # merged (or, inline, handed to the ordinary writer)
    ABORTED = "aborted"          # closed without commit
    FAILED = "failed"            # its transient segment was gone
    ABANDONED = "abandoned"      # dropped without close, or its process died

    def __repr__(self) -> str:
        return f"WriterPhase.{self.name}"


class TransientState(enum.Enum):
    """A transient segment's lifecycle: not created, active, merged into its target, deleted."""

    NONE = "none"
    ACTIVE = "active"
    MERGED = "merged"
    DELETED = "deleted"

    def __repr__(self) -> str:
        return f"TransientState.{self.name}"


LIVE = frozenset({WriterPhase.OPEN, WriterPhase.COMMITTING})
DEAD = frozenset({WriterPhase.ABORTED, WriterPhase.FAILED, WriterPhase.ABANDONED})

#: An EventWriter's lifecycle: phase -> {the spec action that moves it (after "/": the outcome that
#: decides where to, when the action has two): the phase that follows}.
WRITER_TRANSITIONS: dict[WriterPhase, dict[str, WriterPhase]] = {
    WriterPhase.OPEN: {
        "Commit": WriterPhase.COMMITTING,
        "Commit/inline": WriterPhase.COMMITTED,
        "AppendChunk/gone": WriterPhase.FAILED,
        "Abort": WriterPhase.ABORTED,
        "Abandon": WriterPhase.ABANDONED,
    },
    WriterPhase.COMMITTING: {
        "Merge": WriterPhase.COMMITTED,
        "Merge/gone": WriterPhase.FAILED,
        "AppendChunk/gone": WriterPhase.FAILED,
    },
    WriterPhase.COMMITTED: {},
    WriterPhase.ABORTED: {},
    WriterPhase.FAILED: {},
    WriterPhase.ABANDONED: {},
}

#: A transient segment's lifecycle: created once, then merged or deleted, once (state -> {spec action:
#: the state that follows}).
TRANSIENT_TRANSITIONS: dict[TransientState, dict[str, TransientState]] = {
    TransientState.NONE: {"CreateTransient": TransientState.ACTIVE},
    TransientState.ACTIVE: {
        "Merge": TransientState.MERGED,
        "Abort": TransientState.DELETED,
        "DeleteOnDisconnect": TransientState.DELETED,
        "Expire": TransientState.DELETED,
    },
    TransientState.MERGED: {},
    TransientState.DELETED: {},
}


@attrs.frozen
class Item:
    """One unit in a segment: an ordinary event, or part ``part`` of large event ``event``."""

    kind: ItemKind
    event: int
    part: int


@attrs.frozen
class Call:
    """One of the application's calls that places an event: an ordinary write or a large commit."""

    kind: ItemKind
    event: int


@attrs.frozen
class EventWriterState:
    """``sent``: parts handed to the current connection (the next to send); ``acked``: parts
    acknowledged; ``conn``: the current connection's number; ``up``: whether it is connected."""

    phase: WriterPhase = WriterPhase.OPEN
    sent: int = 0
    acked: int = 0
    conn: int = 0
    up: bool = True


@attrs.frozen
class TransientSegment:
    """A transient segment: its state and the items written to it."""

    state: TransientState = TransientState.NONE
    data: tuple[Item, ...] = ()


DELETED = TransientSegment(TransientState.DELETED)


@attrs.frozen
class ChunkRequest:
    """A conditional append of part ``part`` (expecting the transient segment to hold ``part``
    parts), sent on connection ``conn``."""

    part: int
    conn: int


@attrs.frozen(cache_hash=True)
class LargeEventsState:
    """``parts`` (the chunks of each writer's event) and ``inline_max`` are the configuration."""

    parts: tuple[int, ...]
    inline_max: int
    parent: tuple[Item, ...]
    pending: tuple[tuple[Item, ...], ...]
    issued: tuple[Call, ...]
    writers: tuple[EventWriterState, ...]
    transients: tuple[TransientSegment, ...]
    inflight: tuple[tuple[ChunkRequest, ...], ...]
    disconnects: int

    # --- Pure queries ------------------------------------------------------------------------------

    @property
    def writer_ids(self) -> range:
        return range(1, len(self.parts) + 1)

    def writer(self, w: int) -> EventWriterState:
        return self.writers[w - 1]

    def transient(self, w: int) -> TransientSegment:
        return self.transients[w - 1]

    def requests(self, w: int) -> tuple[ChunkRequest, ...]:
        return self.inflight[w - 1]

    def items(self, w: int) -> int:
        """How many parts writer ``w`` sends: its header and its chunks."""
        return self.parts[w - 1] + 1

    def inline(self, w: int) -> bool:
        return self.parts[w - 1] <= self.inline_max

    def live(self, w: int) -> bool:
        return self.writer(w).phase in LIVE

    @property
    def blocked(self) -> bool:
        """The application's thread is inside a large event's commit."""
        return any(writer.phase is WriterPhase.COMMITTING for writer in self.writers)

    @property
    def ordinary_issued(self) -> int:
        return sum(1 for call in self.issued if call.kind is ItemKind.SMALL)

    def connections_with_requests(self, w: int) -> frozenset[int]:
        return frozenset(request.conn for request in self.requests(w))

    def current_requests(self, w: int) -> int:
        """How many of ``w``'s requests on their way were sent on its current connection."""
        return sum(1 for request in self.requests(w) if request.conn == self.writer(w).conn)

    def all_acked(self, w: int) -> bool:
        return self.writer(w).acked == self.items(w)

    @property
    def flushed(self) -> bool:
        return not self.pending

    def visible_events(self) -> tuple[Call, ...]:
        """The events a reader of the parent sees, in order (each event by its first item)."""
        return tuple(Call(item.kind, item.event) for item in self.parent if item.part == 0)

    def check_invariants(self) -> None:
        check_invariants(self)


def framed(w: int, parts: int) -> tuple[Item, ...]:
    """Large event ``w`` as readers must see it: its header, then its ``parts`` chunks in order."""
    return tuple(Item(ItemKind.LARGE, w, part) for part in range(parts + 1))


def initial_state(parts: tuple[int, ...], inline_max: int) -> LargeEventsState:
    """The spec's ``Init``: one writer per large event (``parts[i]`` chunks each), events of at most
    ``inline_max`` chunks written inline; nothing written yet."""
    if any(n < 1 for n in parts) or inline_max < 0:
        raise ValueError(f"every event needs at least one chunk and inline_max >= 0, got {parts}, {inline_max}")
    n = len(parts)
    return LargeEventsState(
        parts=tuple(parts), inline_max=inline_max, parent=(), pending=(), issued=(),
        writers=(EventWriterState(),) * n, transients=(TransientSegment(),) * n, inflight=((),) * n,
        disconnects=0)


# --- Actions --------------------------------------------------------------------------------------


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _at(values: tuple[Any, ...], w: int, value: Any) -> tuple[Any, ...]:
    return (*values[:w - 1], value, *values[w:])


def _writer(state: LargeEventsState, w: int, **changes: Any) -> tuple[EventWriterState, ...]:
    current = state.writer(w)
    phase = changes.get("phase", current.phase)
    assert phase is current.phase or phase in WRITER_TRANSITIONS[current.phase].values(), (
        f"writer {current.phase} -> {phase}")
    return _at(state.writers, w, attrs.evolve(current, **changes))


def _transient(state: LargeEventsState, w: int, segment: TransientSegment) -> tuple[TransientSegment, ...]:
    current = state.transient(w).state
    assert segment.state is current or segment.state in TRANSIENT_TRANSITIONS[current].values(), (
        f"transient {current} -> {segment.state}")
    return _at(state.transients, w, segment)


def write_ordinary(state: LargeEventsState) -> LargeEventsState:
    """``WriteOrdinary``: the application writes an ordinary event (not while blocked in a commit)."""
    _require(not state.blocked, "WriteOrdinary")
    event = state.ordinary_issued + 1
    return attrs.evolve(state, pending=(*state.pending, (Item(ItemKind.SMALL, event, 0),)),
                        issued=(*state.issued, Call(ItemKind.SMALL, event)))


def deliver_ordinary(state: LargeEventsState) -> LargeEventsState:
    """``DeliverOrdinary``: the ordinary writer's oldest append reaches the parent."""
    _require(bool(state.pending), "DeliverOrdinary")
    return attrs.evolve(state, parent=state.parent + state.pending[0], pending=state.pending[1:])


def create_transient(state: LargeEventsState, w: int) -> LargeEventsState:
    """``CreateTransient(w)``: the writer's data outgrew the inline limit; ``CreateTransientSegment``."""
    me = state.writer(w)
    _require(not state.inline(w) and me.phase is WriterPhase.OPEN and me.up
             and state.transient(w).state is TransientState.NONE, "CreateTransient")
    return attrs.evolve(state, transients=_transient(state, w, TransientSegment(TransientState.ACTIVE)))


def send_chunk(state: LargeEventsState, w: int) -> LargeEventsState:
    """``SendChunk(w)``: the next part goes out as a conditional append on the current connection."""
    me = state.writer(w)
    _require(state.live(w) and not state.inline(w) and state.transient(w).state is not TransientState.NONE
             and me.up and me.sent < state.items(w), "SendChunk")
    return attrs.evolve(state, inflight=_at(state.inflight, w, (*state.requests(w), ChunkRequest(me.sent, me.conn))),
                        writers=_writer(state, w, sent=me.sent + 1))


def accepts(state: LargeEventsState, w: int, request: ChunkRequest) -> bool:
    """The segment store's conditional append: accepted only at the expected offset."""
    segment = state.transient(w)
    return segment.state is TransientState.ACTIVE and len(segment.data) == request.part


def append_chunk(state: LargeEventsState, w: int, conn: int) -> LargeEventsState:
    """``AppendChunk(w, c)``: the segment store handles connection ``conn``'s oldest request; the
    reply reaches the writer only on its current, live connection."""
    _require(conn in state.connections_with_requests(w), "AppendChunk")
    requests = state.requests(w)
    index = next(i for i, request in enumerate(requests) if request.conn == conn)
    request = requests[index]
    me = state.writer(w)
    segment = state.transient(w)
    transients = state.transients
    if accepts(state, w, request):
        transients = _transient(state, w, attrs.evolve(
            segment, data=(*segment.data, Item(ItemKind.LARGE, w, request.part))))
    writers = state.writers
    if request.conn == me.conn and me.up and state.live(w):
        if segment.state is TransientState.ACTIVE:
            writers = _writer(state, w, acked=request.part + 1)   # stored, now or before
        else:
            writers = _writer(state, w, phase=WriterPhase.FAILED)  # the transient segment is gone
    return attrs.evolve(state, inflight=_at(state.inflight, w, (*requests[:index], *requests[index + 1:])),
                        transients=transients, writers=writers)


def disconnect(state: LargeEventsState, w: int, kept: int) -> LargeEventsState:
    """``Disconnect(w, kept)``: the connection drops; of the requests sent on it and still on their
    way, the first ``kept`` reached the segment store, the rest are lost (a fault)."""
    me = state.writer(w)
    current = state.current_requests(w)
    _require(state.live(w) and me.up and state.transient(w).state is not TransientState.NONE
             and 0 <= kept <= current, "Disconnect")
    requests = state.requests(w)
    return attrs.evolve(state, inflight=_at(state.inflight, w, requests[:len(requests) - current + kept]),
                        writers=_writer(state, w, up=False), disconnects=state.disconnects + 1)


def reconnect(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Reconnect(w)``: a new connection; every part not yet acknowledged will be resent."""
    me = state.writer(w)
    _require(state.live(w) and not me.up, "Reconnect")
    return attrs.evolve(state, writers=_writer(state, w, up=True, conn=me.conn + 1, sent=me.acked))


def commit(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Commit(w)``: an inline event becomes one plain append through the ordinary writer; a larger
    one starts committing (it needs its transient segment to have been created)."""
    _require(state.writer(w).phase is WriterPhase.OPEN and not state.blocked, "Commit")
    issued = (*state.issued, Call(ItemKind.LARGE, w))
    if state.inline(w):
        return attrs.evolve(state, issued=issued, pending=(*state.pending, framed(w, state.parts[w - 1])),
                            writers=_writer(state, w, phase=WriterPhase.COMMITTED))
    _require(state.transient(w).state is not TransientState.NONE, "Commit")
    return attrs.evolve(state, issued=issued, writers=_writer(state, w, phase=WriterPhase.COMMITTING))


def merge(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Merge(w)``: once every part is acknowledged and the ordinary writer is flushed,
    ``MergeSegments`` -- the whole event appears at once, or the commit fails if the transient
    segment is gone."""
    me = state.writer(w)
    _require(me.phase is WriterPhase.COMMITTING and me.up and state.all_acked(w) and state.flushed, "Merge")
    segment = state.transient(w)
    if segment.state is TransientState.ACTIVE:
        return attrs.evolve(state, parent=state.parent + segment.data,
                            transients=_transient(state, w, TransientSegment(TransientState.MERGED)),
                            writers=_writer(state, w, phase=WriterPhase.COMMITTED))
    return attrs.evolve(state, writers=_writer(state, w, phase=WriterPhase.FAILED))


def abort(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Abort(w)``: ``close`` without ``commit`` deletes the transient segment."""
    _require(state.writer(w).phase is WriterPhase.OPEN, "Abort")
    transients = state.transients
    if state.transient(w).state is TransientState.ACTIVE:
        transients = _transient(state, w, DELETED)
    return attrs.evolve(state, writers=_writer(state, w, phase=WriterPhase.ABORTED), transients=transients)


def abandon(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Abandon(w)``: the EventWriter is dropped without ``close`` (or its process dies)."""
    _require(state.writer(w).phase is WriterPhase.OPEN, "Abandon")
    return attrs.evolve(state, writers=_writer(state, w, phase=WriterPhase.ABANDONED, up=False))


def delete_on_disconnect(state: LargeEventsState, w: int) -> LargeEventsState:
    """``DeleteOnDisconnect(w)``: the segment store deletes the transient segment of a writer whose
    connection is down."""
    _require(not state.writer(w).up and state.transient(w).state is TransientState.ACTIVE, "DeleteOnDisconnect")
    return attrs.evolve(state, transients=_transient(state, w, DELETED))


def expire(state: LargeEventsState, w: int) -> LargeEventsState:
    """``Expire(w)``: the idle-expiry sweep deletes the transient segment."""
    _require(state.transient(w).state is TransientState.ACTIVE, "Expire")
    return attrs.evolve(state, transients=_transient(state, w, DELETED))


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def whole_events(parent: tuple[Item, ...], parts: tuple[int, ...]) -> bool:
    """The parent is a sequence of whole events: each large header is followed by exactly its
    chunks, in order, with nothing in between (the spec's ``Whole``)."""
    position = 0
    while position < len(parent):
        item = parent[position]
        if item.kind is ItemKind.SMALL:
            position += 1
            continue
        expected = framed(item.event, parts[item.event - 1])
        if parent[position:position + len(expected)] != expected:
            return False
        position += len(expected)
    return True


def is_subsequence(sub: tuple[Call, ...], seq: tuple[Call, ...]) -> bool:
    """Whether ``sub``'s calls appear in ``seq`` in the same order (not necessarily adjacent)."""
    remaining = iter(seq)
    return all(any(call == candidate for candidate in remaining) for call in sub)


def check_invariants(state: LargeEventsState) -> None:
    """Raise AssertionError naming the first spec invariant this state breaks."""
    for w in state.writer_ids:
        me = state.writer(w)
        assert (me.acked <= me.sent or not me.up) and me.sent <= state.items(w), "TypeOK"
        assert me.conn <= state.disconnects, "TypeOK"
    assert whole_events(state.parent, state.parts), "WholeEvents"
    assert all(state.transient(w).state is not TransientState.MERGED or Call(ItemKind.LARGE, w) in
               state.visible_events() for w in state.writer_ids), "WholeEvents"
    visible = state.visible_events()
    assert len(set(visible)) == len(visible), "EachEventOnce"
    for w in state.writer_ids:
        if state.writer(w).phase in DEAD:
            assert all(item.kind is not ItemKind.LARGE or item.event != w for item in state.parent), "NoTraceOfDead"
            assert state.transient(w).state is not TransientState.MERGED, "NoTraceOfDead"
    for w in state.writer_ids:
        data = state.transient(w).data
        assert data == framed(w, state.parts[w - 1])[:len(data)], "TransientHoldsPrefix"
    assert is_subsequence(visible, state.issued), "OrderFollowsCalls"
    for w in state.writer_ids:
        if state.writer(w).phase is WriterPhase.COMMITTED:
            assert Call(ItemKind.LARGE, w) in visible or framed(w, state.parts[w - 1]) in state.pending, \
                "CommittedEventsAppear"
