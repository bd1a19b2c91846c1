"""Container failover across the two storage tiers: ``spec/ContainerFailover.tla`` in Python.

Every spec action is a function of the same name (``Start`` -> ``start``, ``ClientAppend`` ->
``client_append``, ``LogWriteFenced`` -> ``log_write_fenced``, ...) taking a state and an owner and
returning the next state; the state's fields are the spec's variables.  Guards that are container
behaviour raise ``NotEnabled``; the spec's bounds on the environment (``MaxAppends``, ``MaxEpoch``,
``MaxCrashes``, ``MaxCheckpoints``) are applied by the explorer in ``proofs/``.

The protocol in one paragraph: an owner takes over by bumping the log's epoch (fencing older owners,
whose next log write fails) and recovering -- metadata from the log (from its first record, a
checkpoint once truncated), bytes from LTS up to the storage length and from the log's append
records beyond it.  It appends (a log record each), flushes in two steps (write into its own chunk,
named by its epoch; then commit the new layout with a log record), checkpoints, and truncates the
log at a checkpoint once everything before it is in LTS.  Before its first chunk write, a new owner
may adopt a verified prefix of what an older owner wrote into its chunk but never recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from millstream.model.durable_log import NotEnabled
from millstream.model.frozen_map import FrozenMap

__all__ = [
    "ContainerFailoverState",
    "LayoutEntry",
    "OwnerState",
    "OwnerStatus",
    "Record",
    "adopt",
    "adoption_candidates",
    "adoptions",
    "checkpoint",
    "client_append",
    "commit_flush",
    "crash",
    "initial_state",
    "log_write_fenced",
    "recovered",
    "recovered_meta",
    "start",
    "start_allowed",
    "truncate",
    "truncation_points",
    "verified",
    "write_chunk",
]


class OwnerStatus(enum.Enum):
    """Whether a would-be owner of the container is serving it."""

    DOWN = "down"
    SERVING = "serving"

    def __repr__(self) -> str:
        return f"OwnerStatus.{self.name}"


@attrs.frozen
class LayoutEntry:
    """``length`` units of the chunk of epoch ``chunk``, counted from the chunk's start."""

    chunk: int
    length: int


Layout = tuple[LayoutEntry, ...]


@attrs.frozen(cache_hash=True)
class Record:
    """A Tier-1 log record (``kind``: append, flush or checkpoint; unused fields are 0 / empty)."""

    kind: str
    epoch: int
    id: int = 0
    offset: int = 0
    length: int = 0
    storage: int = 0
    layout: Layout = ()


@attrs.frozen(cache_hash=True)
class OwnerState:
    """What an owner holds in memory."""

    status: OwnerStatus = OwnerStatus.DOWN
    epoch: int = 0
    units: tuple[int, ...] = ()
    storage: int = 0
    layout: Layout = ()
    written: int = 0


DOWN = OwnerState()


@attrs.frozen(cache_hash=True)
class ContainerFailoverState:
    """The spec's variables: the log (and its epoch), the Tier-2 chunks, each owner's state, and
    counters the configurations bound."""

    log_epoch: int
    log: tuple[Record, ...]
    chunks: FrozenMap[int, tuple[int, ...]]
    own: FrozenMap[str, OwnerState]
    history: tuple[int, ...]
    crashes: int
    checkpoints: int

    def serving(self, owner: str) -> bool:
        return self.own[owner].status is OwnerStatus.SERVING

    def current(self, owner: str) -> bool:
        """Serving with the log's epoch: its log writes succeed."""
        return self.serving(owner) and self.own[owner].epoch == self.log_epoch

    @property
    def has_current_owner(self) -> bool:
        return any(self.current(owner) for owner in self.own)


def initial_state(owners: Iterable[str]) -> ContainerFailoverState:
    """The spec's ``Init``: an empty log and no chunks; every owner down."""
    return ContainerFailoverState(
        log_epoch=0, log=(), chunks=FrozenMap(), own=FrozenMap((o, DOWN) for o in sorted(owners)),
        history=(), crashes=0, checkpoints=0)


# --- Recovery -------------------------------------------------------------------------------------


@attrs.frozen
class Meta:
    length: int = 0
    storage: int = 0
    layout: Layout = ()


def recovered_meta(log: tuple[Record, ...]) -> Meta:
    """The metadata a recovering owner rebuilds (the spec's ``RecoveredMeta``)."""
    records = list(log)
    meta = Meta()
    if records and records[0].kind == "checkpoint":
        first = records.pop(0)
        meta = Meta(first.length, first.storage, first.layout)
    for record in records:
        if record.kind == "append":
            meta = attrs.evolve(meta, length=record.offset)
        elif record.kind == "flush":
            meta = attrs.evolve(meta, storage=record.storage, layout=record.layout)
    return meta


def _lts_unit(chunks: FrozenMap[int, tuple[int, ...]], layout: Layout, position: int) -> int:
    for entry in layout:
        if position <= entry.length:
            units = chunks.get(entry.chunk, ())
            return units[position - 1] if position <= len(units) else 0
        position -= entry.length
    return 0


def _log_unit(log: tuple[Record, ...], position: int) -> int:
    for record in log:
        if record.kind == "append" and record.offset == position:
            return record.id
    return 0


def recovered(state: ContainerFailoverState) -> tuple[int, ...]:
    """What a recovering owner reads as the segment (the spec's ``Recovered``)."""
    meta = recovered_meta(state.log)
    return tuple(_lts_unit(state.chunks, meta.layout, p) if p <= meta.storage else _log_unit(state.log, p)
                 for p in range(1, meta.length + 1))


# --- Actions --------------------------------------------------------------------------------------


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _with_owner(state: ContainerFailoverState, owner: str, value: OwnerState) -> FrozenMap[str, OwnerState]:
    return state.own.set(owner, value)


def start_allowed(state: ContainerFailoverState, max_epoch: int) -> bool:
    """Takeovers of a container with a serving owner are bounded; recovering an orphan always works."""
    return state.log_epoch < max_epoch if state.has_current_owner else True


def start(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``Start(o)``: bump the log's epoch (fencing older owners) and recover from the log and LTS."""
    _require(state.own[owner].status is OwnerStatus.DOWN, "Start")
    meta = recovered_meta(state.log)
    fresh = OwnerState(OwnerStatus.SERVING, state.log_epoch + 1, recovered(state), meta.storage, meta.layout, 0)
    return attrs.evolve(state, log_epoch=state.log_epoch + 1, own=_with_owner(state, owner, fresh))


def client_append(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``ClientAppend(o)``: an append, made durable by one log record."""
    _require(state.current(owner), "ClientAppend")
    me = state.own[owner]
    unit = len(state.history) + 1
    record = Record("append", state.log_epoch, id=unit, offset=len(me.units) + 1)
    return attrs.evolve(
        state, log=(*state.log, record), history=(*state.history, unit),
        own=_with_owner(state, owner, attrs.evolve(me, units=(*me.units, unit))))


def log_write_fenced(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``LogWriteFenced(o)``: a fenced owner's log write fails; it learns it and stops."""
    _require(state.serving(owner) and state.own[owner].epoch < state.log_epoch, "LogWriteFenced")
    return attrs.evolve(state, own=_with_owner(state, owner, DOWN))


def target_chunk(state: ContainerFailoverState, owner: str) -> int:
    """The chunk an owner writes into: the one its own epoch names (never another epoch's)."""
    return state.own[owner].epoch


def write_chunk(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``WriteChunk(o)``: write every unit beyond what LTS holds into the owner's chunk (no log write)."""
    me = state.own[owner]
    _require(state.serving(owner) and me.storage + me.written < len(me.units), "WriteChunk")
    chunk = target_chunk(state, owner)
    new = me.units[me.storage + me.written:]
    return attrs.evolve(
        state, chunks=state.chunks.set(chunk, state.chunks.get(chunk, ()) + new),
        own=_with_owner(state, owner, attrs.evolve(me, written=len(me.units) - me.storage)))


def _flushed_layout(state: ContainerFailoverState, owner: str) -> Layout:
    me = state.own[owner]
    chunk = target_chunk(state, owner)
    if me.layout and me.layout[-1].chunk == chunk:
        return (*me.layout[:-1], LayoutEntry(chunk, me.layout[-1].length + me.written))
    return (*me.layout, LayoutEntry(chunk, me.written))


def commit_flush(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``CommitFlush(o)``: commit the written units with one log record holding the new layout."""
    me = state.own[owner]
    _require(state.current(owner) and me.written > 0, "CommitFlush")
    layout = _flushed_layout(state, owner)
    storage = me.storage + me.written
    return attrs.evolve(
        state, log=(*state.log, Record("flush", state.log_epoch, storage=storage, layout=layout)),
        own=_with_owner(state, owner, attrs.evolve(me, layout=layout, storage=storage, written=0)))


def _last_chunk(me: OwnerState) -> int:
    """The chunk of the layout's last entry; 0 (no epoch's) for an empty layout."""
    return me.layout[-1].chunk if me.layout else 0


def _adopt_base(me: OwnerState, chunk: int) -> int:
    """The units of ``chunk`` the layout already takes (counted from the chunk's start)."""
    return me.layout[-1].length if _last_chunk(me) == chunk else 0


def adoption_candidates(state: ContainerFailoverState, owner: str) -> list[int]:
    """Older epochs' chunks an owner may adopt from: the layout's last one, or one it does not name."""
    me = state.own[owner]
    named = {entry.chunk for entry in me.layout}
    return [chunk for chunk in sorted(state.chunks)
            if chunk < me.epoch and (chunk == _last_chunk(me) or chunk not in named)]


def verified(state: ContainerFailoverState, owner: str, chunk: int, count: int) -> bool:
    """The spec's ``Verified``: ``chunk`` holds ``count`` more units beyond what the layout takes from
    it, each equal to the unflushed unit at its place."""
    me = state.own[owner]
    units = state.chunks.get(chunk, ())
    base = _adopt_base(me, chunk)
    return (base + count <= len(units)
            and units[base:base + count] == me.units[me.storage:me.storage + count])


def adoptions(state: ContainerFailoverState, owner: str) -> list[tuple[int, int]]:
    """Every (chunk, count) ``Adopt(o)`` may choose: before the owner's first chunk write, a verified
    prefix of an older chunk's unrecorded units."""
    me = state.own[owner]
    if not state.current(owner) or target_chunk(state, owner) in state.chunks:
        return []
    return [(chunk, count) for chunk in adoption_candidates(state, owner)
            for count in range(1, len(me.units) - me.storage + 1) if verified(state, owner, chunk, count)]


def adopt(state: ContainerFailoverState, owner: str, chunk: int, count: int) -> ContainerFailoverState:
    """``Adopt(o)``: record ``count`` units an older owner wrote into ``chunk`` but never recorded (a
    verified prefix of the unflushed units) with one flush record naming that chunk; nothing is written."""
    _require((chunk, count) in adoptions(state, owner), "Adopt")
    me = state.own[owner]
    if _last_chunk(me) == chunk:
        layout = (*me.layout[:-1], LayoutEntry(chunk, me.layout[-1].length + count))
    else:
        layout = (*me.layout, LayoutEntry(chunk, count))
    storage = me.storage + count
    return attrs.evolve(
        state, log=(*state.log, Record("flush", state.log_epoch, storage=storage, layout=layout)),
        own=_with_owner(state, owner, attrs.evolve(me, layout=layout, storage=storage)))


def checkpoint(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``Checkpoint(o)``: a metadata snapshot in the log."""
    _require(state.current(owner), "Checkpoint")
    me = state.own[owner]
    record = Record("checkpoint", state.log_epoch, length=len(me.units), storage=me.storage, layout=me.layout)
    return attrs.evolve(state, log=(*state.log, record), checkpoints=state.checkpoints + 1)


def truncation_points(state: ContainerFailoverState, owner: str) -> list[int]:
    """Indexes (1-based, > 1) of checkpoints everything before which is in LTS."""
    if not state.current(owner):
        return []
    storage = state.own[owner].storage
    return [i for i in range(2, len(state.log) + 1)
            if state.log[i - 1].kind == "checkpoint" and state.log[i - 1].length <= storage]


def truncate(state: ContainerFailoverState, owner: str, index: int) -> ContainerFailoverState:
    """``Truncate(o)``: drop the log before the checkpoint at ``index`` (1-based)."""
    _require(index in truncation_points(state, owner), "Truncate")
    return attrs.evolve(state, log=state.log[index - 1:])


def crash(state: ContainerFailoverState, owner: str) -> ContainerFailoverState:
    """``Crash(o)``: the owner's process dies; its memory is gone."""
    _require(state.own[owner].status is not OwnerStatus.DOWN, "Crash")
    return attrs.evolve(state, own=_with_owner(state, owner, DOWN), crashes=state.crashes + 1)


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def check_invariants(state: ContainerFailoverState) -> None:
    """Raise AssertionError naming the first spec invariant this state breaks."""
    meta = recovered_meta(state.log)
    assert recovered(state) == state.history, "NoAcknowledgedAppendLost"
    epochs = [record.epoch for record in state.log]
    assert all(e <= state.log_epoch for e in epochs) and epochs == sorted(epochs), "OneWriterPerEpoch"
    for owner, me in state.own.items():
        if state.current(owner):
            assert (me.units, me.storage, me.layout) == (state.history, meta.storage, meta.layout), (
                "CurrentOwnerAgreesWithRecovery")
    if state.log and state.log[0].kind == "checkpoint":
        assert state.log[0].length <= meta.storage, "TruncationKeepsUnflushed"
    assert sum(entry.length for entry in meta.layout) == meta.storage, "LayoutCoversStorage"
