"""A writer with a stable id and application sequences, across process restarts and scaling, as a pure
state machine: ``spec/StableWriter.tla`` in Python.

Every spec action is a function of the same name here (``WriteEvent`` -> ``write_event``,
``WriterRestart`` -> ``writer_restart``, ``ZombieAppend`` -> ``zombie_append``, ...) that takes a state
and explicit parameters and returns the next state; the state's fields are the spec's variables.  A
transition whose spec guard is false raises ``NotEnabled``.  Nothing here does I/O, reads a clock or
draws a random number.  The bounds the spec puts on the environment (``Events``, ``MaxScales``,
``MaxCrashes``) are applied by the explorer in ``proofs/``, not here.

Theory of operation (the spec's header argues it at length):

* The application writes its source's events in order, each with its offset as the sequence
  (``write_event``); ``source`` records the key at each offset, so a replay writes the same key.
* The store keeps, per segment, the writer's ``last`` sequence stored there and stores only above
  it; a refusal at or below it acknowledges (``ack_event``).  Per segment, the writer's events are
  stored in sequence order: the writer sends them so, and *holds* an event while a lower sequence
  is unacknowledged on an older segment that overlaps its own (it may still move there).
* A sealed segment (``segment_sealed``): the writer learns its final ``last``, drops what it holds,
  raises its cells' floor to it, routes its cells to the successors and moves the rest there.
* The process dies (``writer_crash``); what it had sent may still land (``zombie_append``).  The
  application restarts it (``writer_restart``) and replays from any offset at or before its first
  unacknowledged event; the writer routes by the current epoch and learns each cell's *floor* -- the
  largest sequence stored over every segment that ever owned the cell -- once every segment outside
  the current epoch is sealed.  A replayed event at or below its key's floor is a duplicate: dropped
  (``is_duplicate`` says so before ``write_event`` takes it).

Segment ids are 1-based and dense, epochs numbered from 1, keys named by their cell, as in the spec.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import attrs

from millstream.model.durable_log import NotEnabled
from millstream.model.errors import InternalError
from millstream.model.frozen_map import FrozenMap
from millstream.model.stream_ordering import IDLE, InflightEvent, ScalePhase, Scaling, Segment, StoredEvent

__all__ = [
    "InflightEvent",
    "NotEnabled",
    "StableWriterState",
    "StoredEvent",
    "ZombieEvent",
    "ack_event",
    "activate_epoch",
    "append_event",
    "create_successors",
    "initial_state",
    "is_duplicate",
    "record_epoch",
    "scale_requests",
    "seal_predecessors",
    "segment_sealed",
    "write_event",
    "writer_crash",
    "writer_restart",
    "zombie_append",
]


@attrs.frozen
class ZombieEvent:
    """An event a dead process had sent to ``segment`` (``crash``: the crash that killed it, from 1)."""

    number: int
    key: int
    segment: int
    crash: int


@attrs.frozen(cache_hash=True)
class StableWriterState:
    """The spec's variables under their model names (``segs`` -> ``segments``; the rest keep their
    names).  ``table[w][cell]`` is the segment writer ``w`` routes that cell's keys to,
    ``floor[w][cell]`` the deduplication floor of the cell, ``source[w]`` the key at each offset."""

    segments: tuple[Segment, ...]
    epochs: tuple[frozenset[int], ...]
    scaling: Scaling
    scales: int
    sealed: frozenset[int]
    data: tuple[tuple[StoredEvent, ...], ...]
    source: FrozenMap[str, tuple[int, ...]]
    written: FrozenMap[str, int]
    table: FrozenMap[str, tuple[int, ...]]
    inflight: FrozenMap[str, tuple[InflightEvent, ...]]
    floor: FrozenMap[str, tuple[int, ...]]
    alive: frozenset[str]
    zombie: FrozenMap[str, frozenset[ZombieEvent]]
    crashes: int

    @property
    def grid(self) -> int:
        return len(next(iter(self.table.values()))) if self.table else 0

    @property
    def current(self) -> frozenset[int]:
        return self.epochs[-1]

    def segment(self, segment_id: int) -> Segment:
        return self.segments[segment_id - 1]

    def successors(self, segment_id: int) -> frozenset[int]:
        """The next epoch's segments that overlap a sealed segment."""
        last = max(e for e, members in enumerate(self.epochs, start=1) if segment_id in members)
        if last == len(self.epochs):
            raise InternalError(f"segment {segment_id} has no successors yet")
        mine = self.segment(segment_id)
        return frozenset(t for t in self.epochs[last] if self.segment(t).overlaps(mine))

    def cells(self, segment_ids: Iterable[int]) -> frozenset[int]:
        return frozenset(cell for s in segment_ids for cell in self.segment(s).cells)

    def partitions(self, segment_ids: Iterable[int]) -> bool:
        counts = [0] * self.grid
        for segment_id in segment_ids:
            for cell in self.segment(segment_id).cells:
                counts[cell] += 1
        return all(count == 1 for count in counts)

    def current_owner(self, cell: int) -> int:
        return next(s for s in sorted(self.current) if self.segment(s).covers(cell))

    def last(self, segment_id: int, writer: str) -> int:
        """``Last(s, w)``: the writer-id attribute, the largest sequence the segment stores for ``writer``."""
        return max((e.number for e in self.data[segment_id - 1] if e.writer == writer), default=0)

    def chain(self, cell: int) -> frozenset[int]:
        """``ChainOf(c)``: every segment that ever owned the cell."""
        return frozenset(s for s in range(1, len(self.segments) + 1) if self.segment(s).covers(cell))

    def floor_of(self, writer: str, cell: int) -> int:
        """``FloorOf(w, c)``: the largest sequence stored for ``writer`` over the cell's chain."""
        return max(self.last(s, writer) for s in self.chain(cell))

    def routed(self, writer: str) -> frozenset[int]:
        return frozenset(self.table[writer])

    def older(self, first: int, second: int) -> bool:
        """``Older(f, s)``: ``first`` overlaps ``second`` and was created in an earlier epoch."""
        return (self.segment(first).overlaps(self.segment(second))
                and self.segment(first).epoch < self.segment(second).epoch)

    def held(self, writer: str, segment_id: int, number: int) -> bool:
        """``Held(w, s, n)``: a lower sequence is unacknowledged on an older segment overlapping ``segment_id``."""
        return any(e.number < number and self.older(e.segment, segment_id) for e in self.inflight[writer])

    def resume(self, writer: str) -> int:
        """``Resume(w)``: the offset just before the writer's first unacknowledged event."""
        inflight = self.inflight[writer]
        return inflight[0].number - 1 if inflight else self.written[writer]

    def all_events(self) -> Iterator[tuple[int, int, StoredEvent]]:
        """``(segment id, 1-based offset, event)`` of every stored event."""
        for segment_id, events in enumerate(self.data, start=1):
            for offset, event in enumerate(events, start=1):
                yield segment_id, offset, event

    def check_invariants(self) -> None:
        """The spec's invariants, evaluated on this state; raises InternalError naming the first broken."""
        for name, holds in _invariants(self):
            if not holds:
                raise InternalError(f"model invariant {name} is violated")


def initial_state(writers: Iterable[str], grid: int, initial_splits: Iterable[int] = ()) -> StableWriterState:
    """The spec's ``Init``: one epoch of segments between the boundaries; every writer's process runs,
    has written nothing and knows floor 0 everywhere."""
    bounds = sorted({0, grid, *initial_splits})
    if bounds[0] != 0 or bounds[-1] != grid:
        raise ValueError(f"initial splits must lie strictly inside the {grid} cells")
    segments = tuple(Segment(lo, hi, 1) for lo, hi in itertools.pairwise(bounds))
    ids = range(1, len(segments) + 1)
    owner = tuple(next(s for s in ids if segments[s - 1].covers(cell)) for cell in range(grid))
    names = sorted(writers)
    return StableWriterState(
        segments=segments, epochs=(frozenset(ids),), scaling=IDLE, scales=0, sealed=frozenset(),
        data=tuple(() for _ in ids), source=FrozenMap((w, ()) for w in names),
        written=FrozenMap((w, 0) for w in names), table=FrozenMap((w, owner) for w in names),
        inflight=FrozenMap((w, ()) for w in names), floor=FrozenMap((w, (0,) * grid) for w in names),
        alive=frozenset(names), zombie=FrozenMap((w, frozenset()) for w in names), crashes=0)


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


# --- The controller scales the stream (as in StreamOrdering) ------------------------------------


def scale_requests(state: StableWriterState) -> Iterator[tuple[frozenset[int], tuple[tuple[int, int], ...]]]:
    """The scales ``CreateSuccessors`` may start: every split of a current segment at an interior
    boundary, then every merge of two adjacent ones, as ``(predecessors, successor ranges)``."""
    for s in sorted(state.current):
        segment = state.segment(s)
        for boundary in range(1, state.grid):
            if segment.lo < boundary < segment.hi:
                yield frozenset({s}), ((segment.lo, boundary), (boundary, segment.hi))
    for s in sorted(state.current):
        for t in sorted(state.current):
            if state.segment(s).hi == state.segment(t).lo:
                yield frozenset({s, t}), ((state.segment(s).lo, state.segment(t).hi),)


def create_successors(state: StableWriterState, predecessors: frozenset[int],
                      ranges: tuple[tuple[int, int], ...]) -> StableWriterState:
    """``CreateSuccessors``: the successors that will replace ``predecessors`` (current segments whose
    cells the ranges cover exactly, in key order)."""
    _require(state.scaling.phase is ScalePhase.IDLE, "CreateSuccessors")
    _require(bool(predecessors) and predecessors <= state.current, "CreateSuccessors")
    _require(bool(ranges) and all(lo < hi for lo, hi in ranges), "CreateSuccessors")
    _require(all(left[1] == right[0] for left, right in itertools.pairwise(ranges)), "CreateSuccessors")
    _require(frozenset(c for lo, hi in ranges for c in range(lo, hi)) == state.cells(predecessors),
             "CreateSuccessors")
    epoch = len(state.epochs) + 1
    first = len(state.segments) + 1
    return attrs.evolve(
        state, segments=(*state.segments, *(Segment(lo, hi, epoch) for lo, hi in ranges)),
        data=(*state.data, *(() for _ in ranges)),
        scaling=Scaling(ScalePhase.CREATED, frozenset(predecessors), frozenset(range(first, first + len(ranges)))),
        scales=state.scales + 1)


def record_epoch(state: StableWriterState) -> StableWriterState:
    """``RecordEpoch``: the current epoch without the predecessors, with the successors."""
    _require(state.scaling.phase is ScalePhase.CREATED, "RecordEpoch")
    epoch = (state.current - state.scaling.predecessors) | state.scaling.successors
    return attrs.evolve(state, epochs=(*state.epochs, epoch),
                        scaling=attrs.evolve(state.scaling, phase=ScalePhase.RECORDED))


def seal_predecessors(state: StableWriterState) -> StableWriterState:
    """``SealPredecessors``: the store refuses appends to the predecessors from now on."""
    _require(state.scaling.phase is ScalePhase.RECORDED, "SealPredecessors")
    return attrs.evolve(state, sealed=state.sealed | state.scaling.predecessors,
                        scaling=attrs.evolve(state.scaling, phase=ScalePhase.SEALED))


def activate_epoch(state: StableWriterState) -> StableWriterState:
    """``ActivateEpoch``: the scale is complete."""
    _require(state.scaling.phase is ScalePhase.SEALED, "ActivateEpoch")
    return attrs.evolve(state, scaling=IDLE)


# --- The writer -----------------------------------------------------------------------------------


def is_duplicate(state: StableWriterState, writer: str, key: int) -> bool:
    """Whether ``write_event(state, writer, key)`` drops its event as a duplicate (at or below the floor)."""
    return state.written[writer] + 1 <= state.floor[writer][key]


def write_event(state: StableWriterState, writer: str, key: int) -> StableWriterState:
    """``WriteEvent(w, k)``: the event at the writer's next source offset (a replay: the key the
    source holds there); dropped as a duplicate at or below its key's floor, else in flight."""
    _require(writer in state.alive and 0 <= key < state.grid, "WriteEvent")
    number = state.written[writer] + 1
    source = state.source[writer]
    _require(number > len(source) or source[number - 1] == key, "WriteEvent")
    if number > len(source):
        state = attrs.evolve(state, source=state.source.set(writer, (*source, key)))
    inflight = state.inflight
    if number > state.floor[writer][key]:
        inflight = inflight.set(writer, (*inflight[writer], InflightEvent(number, key, state.table[writer][key])))
    return attrs.evolve(state, written=state.written.set(writer, number), inflight=inflight)


def append_event(state: StableWriterState, writer: str, segment_id: int) -> StableWriterState:
    """``AppendEvent(w, s)``: the store appends the writer's lowest in-flight event for the segment
    above its ``last``, unless the segment is sealed or the event is held."""
    _require(writer in state.alive and segment_id in state.routed(writer) and segment_id not in state.sealed,
             "AppendEvent")
    last = state.last(segment_id, writer)
    unstored = [e for e in state.inflight[writer] if e.segment == segment_id and e.number > last]
    _require(bool(unstored), "AppendEvent")
    event = unstored[0]
    _require(not state.held(writer, segment_id, event.number), "AppendEvent")
    data = list(state.data)
    data[segment_id - 1] = (*data[segment_id - 1], StoredEvent(writer, event.number, event.key))
    return attrs.evolve(state, data=tuple(data))


def ack_event(state: StableWriterState, writer: str, segment_id: int) -> StableWriterState:
    """``AckEvent(w, s)``: every in-flight event for the segment at or below its ``last`` is acknowledged."""
    _require(writer in state.alive and segment_id in state.routed(writer), "AckEvent")
    last = state.last(segment_id, writer)
    inflight = state.inflight[writer]
    _require(any(e.segment == segment_id and e.number <= last for e in inflight), "AckEvent")
    kept = tuple(e for e in inflight if e.segment != segment_id or e.number > last)
    return attrs.evolve(state, inflight=state.inflight.set(writer, kept))


def segment_sealed(state: StableWriterState, writer: str, segment_id: int) -> StableWriterState:
    """``SegmentSealed(w, s)``: the writer learns the sealed segment's final ``last``, drops what it
    holds, raises the floor of its cells to it, routes them to the successors and moves the rest."""
    _require(writer in state.alive and segment_id in state.routed(writer) and segment_id in state.sealed,
             "SegmentSealed")
    inflight = state.inflight[writer]
    _require(any(e.segment == segment_id for e in inflight), "SegmentSealed")
    last = state.last(segment_id, writer)
    successors = state.successors(segment_id)
    table = state.table[writer]
    route = tuple(next(t for t in sorted(successors) if state.segment(t).covers(cell)) if target == segment_id
                  else target for cell, target in enumerate(table))
    kept = tuple(attrs.evolve(e, segment=route[e.key]) if e.segment == segment_id else e
                 for e in inflight if e.segment != segment_id or e.number > last)
    floor = tuple(max(f, last) if table[cell] == segment_id else f for cell, f in enumerate(state.floor[writer]))
    return attrs.evolve(state, table=state.table.set(writer, route), inflight=state.inflight.set(writer, kept),
                        floor=state.floor.set(writer, floor))


def writer_crash(state: StableWriterState, writer: str) -> StableWriterState:
    """``WriterCrash(w)``: the process dies; what it had in flight may still land (zombie), and the
    application resumes at the latest from just before its first unacknowledged event."""
    _require(writer in state.alive, "WriterCrash")
    crash = state.crashes + 1
    zombies = frozenset(ZombieEvent(e.number, e.key, e.segment, crash) for e in state.inflight[writer])
    return attrs.evolve(
        state, alive=state.alive - {writer}, zombie=state.zombie.set(writer, state.zombie[writer] | zombies),
        written=state.written.set(writer, state.resume(writer)), inflight=state.inflight.set(writer, ()),
        crashes=crash)


def zombie_append(state: StableWriterState, writer: str, segment_id: int, crash: int) -> StableWriterState:
    """``ZombieAppend(w, s, g)``: the lowest request for the segment that the process killed by crash
    ``crash`` had sent lands -- above the segment's ``last``, not held, the segment open."""
    _require(writer in state.zombie and segment_id not in state.sealed, "ZombieAppend")
    mine = [z for z in state.zombie[writer] if z.segment == segment_id and z.crash == crash]
    _require(bool(mine), "ZombieAppend")
    event = min(mine, key=lambda z: z.number)
    _require(event.number > state.last(segment_id, writer), "ZombieAppend")
    _require(not any(f.crash == crash and f.number < event.number and state.older(f.segment, segment_id)
                     for f in state.zombie[writer]), "ZombieAppend")
    data = list(state.data)
    data[segment_id - 1] = (*data[segment_id - 1], StoredEvent(writer, event.number, event.key))
    return attrs.evolve(state, data=tuple(data), zombie=state.zombie.set(writer, state.zombie[writer] - {event}))


def writer_restart(state: StableWriterState, writer: str, resume_after: int) -> StableWriterState:
    """``WriterRestart(w, j)``: the application starts the writer again and replays its source from
    offset ``resume_after + 1``; the writer routes by the current epoch and learns each cell's floor
    -- once every segment outside the current epoch is sealed."""
    _require(writer in state.written and writer not in state.alive, "WriterRestart")
    _require(frozenset(range(1, len(state.segments) + 1)) - state.current <= state.sealed, "WriterRestart")
    _require(0 <= resume_after <= state.written[writer], "WriterRestart")
    cells = range(state.grid)
    return attrs.evolve(
        state, alive=state.alive | {writer}, written=state.written.set(writer, resume_after),
        table=state.table.set(writer, tuple(state.current_owner(c) for c in cells)),
        floor=state.floor.set(writer, tuple(state.floor_of(writer, c) for c in cells)))


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def _invariants(state: StableWriterState) -> Iterator[tuple[str, bool]]:
    yield "TypeOK", (
        state.sealed <= frozenset(range(1, len(state.segments) + 1))
        and len(state.data) == len(state.segments)
        and all(0 <= state.written[w] <= len(state.source[w]) for w in state.written)
        and all(not state.inflight[w] for w in state.written if w not in state.alive))
    yield "WritersRouteByKey", all(
        all(state.segment(target).covers(cell) for cell, target in enumerate(state.table[w]))
        and all(e.segment == state.table[w][e.key] for e in state.inflight[w])
        and all(a.number < b.number for a, b in itertools.pairwise(state.inflight[w]))
        for w in state.table)
    stored = [(e.writer, e.number) for _, _, e in state.all_events()]
    yield "EventsStoredOnce", len(set(stored)) == len(stored)
    yield "StoredAsWritten", all(
        e.number <= len(state.source[e.writer]) and state.source[e.writer][e.number - 1] == e.key
        for _, _, e in state.all_events())
    stored_set = set(stored)
    yield "NoAcknowledgedEventLost", all(
        (w, n) in stored_set
        for w, count in state.written.items() for n in range(1, count + 1)
        if all(e.number != n for e in state.inflight[w]))
    yield "PerKeyOrder", _per_key_order(state)


def _per_key_order(state: StableWriterState) -> bool:
    events = list(state.all_events())
    for s, i, first in events:
        for t, j, second in events:
            if first.writer != second.writer or first.key != second.key:
                continue
            before = i < j if s == t else state.segment(s).epoch < state.segment(t).epoch
            if before and first.number >= second.number:
                return False
    return True
