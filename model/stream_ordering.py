"""One stream end to end as a pure state machine: ``spec/StreamOrdering.tla`` in Python.

Every spec action is a function of the same name here (``WriteEvent`` -> ``write_event``,
``SegmentSealed`` -> ``segment_sealed``, ``CheckpointReader`` -> ``checkpoint_reader``, ...) that takes
a state and explicit parameters (which writer, key, reader, segment) and returns the next state; the
state's fields are the spec's variables.  A transition whose spec guard is false raises
``NotEnabled``.  Nothing here does I/O, reads a clock or draws a random number.  The bounds the spec
puts on the environment (``EventsPerWriter``, ``MaxScales``, ``MaxCheckpoints``, ``MaxCrashes``,
``MaxResets``) are applied by the explorer in ``proofs/``, not here.

Theory of operation (the spec's header says it at length):

* **Key space.**  [0, 1) is cut into ``grid`` cells; a routing key is named by the cell its hash falls
  in.  A segment owns cells ``[lo, hi)``; every epoch's segments cover the cells exactly.
* **Scaling** is four steps, each its own transition: ``create_successors`` (split one segment of the
  current epoch in two, or merge two adjacent ones), ``record_epoch``, ``seal_predecessors``,
  ``activate_epoch``.  Successors of a sealed segment are the next epoch's segments overlapping it.
* **Writers** number their events (writer id + event number make a write idempotent) and route each
  by their own cell -> segment table.  The store appends a writer's next event for a segment only if
  it does not hold that event yet (idempotence is membership: each event at most once per segment,
  none it does not hold refused -- the spec's header says why not "above the largest number stored"),
  and refuses a sealed segment; the writer then learns what the segment stores, drops it, routes the
  sealed segment's cells to its successors and resends the rest there, in order.
* **The reader group's state** (``assigned``, ``unassigned``, ``future``, ``checkpoints``) changes only
  by the group-state updates: acquire, release, segment completed (successors wait for every
  predecessor), create checkpoint, checkpoint reader, reader offline, reset.  A reader that owes a
  checkpoint returns it from ``read_next_event`` (``surface_checkpoint``) and records its positions
  on the next call (``checkpoint_reader``), once its application has persisted its state
  (``saved``).  A crash returns the reader's segments at their recorded offsets.
* **Ghost state**: ``reads`` is the group's ledger of delivered positions since the last reset (a
  crash voids what the reader delivered that its application had not persisted: ``unsaved``, in the
  segments it holds and in any it released); ``origin`` is the cut the group last started from.

Segment ids are 1-based and dense (a segment's id is its index in ``segments`` plus one), epochs are
numbered from 1, and checkpoints are numbered from 1 (``0`` in ``at_checkpoint`` means none), as in
the spec.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator

import attrs

from millstream.model.durable_log import NotEnabled
from millstream.model.errors import InternalError
from millstream.model.frozen_map import FrozenMap

__all__ = [
    "Checkpoint",
    "InflightEvent",
    "NotEnabled",
    "Position",
    "ScalePhase",
    "Scaling",
    "Segment",
    "StoredEvent",
    "StreamState",
    "ack_event",
    "acquire_segment",
    "activate_epoch",
    "add_reader",
    "append_event",
    "checkpoint_reader",
    "create_checkpoint",
    "create_successors",
    "initial_state",
    "read_next_event",
    "reader_offline",
    "record_epoch",
    "release_segment",
    "reset",
    "scale_requests",
    "seal_predecessors",
    "segment_completed",
    "segment_sealed",
    "surface_checkpoint",
    "write_event",
]

#: ``(segment id, offset)``: the ``offset``-th event (1-based) of a segment.
Position = tuple[int, int]
Offsets = FrozenMap[int, int]

EMPTY: Offsets = FrozenMap()


class ScalePhase(enum.Enum):
    """How far the scale in progress got (the spec's ``scaling.phase``)."""

    IDLE = "idle"
    CREATED = "created"
    RECORDED = "recorded"
    SEALED = "sealed"

    def __repr__(self) -> str:
        return f"ScalePhase.{self.name}"


@attrs.frozen
class Segment:
    """Cells ``[lo, hi)`` of the key space; ``epoch`` is the epoch that created it."""

    lo: int
    hi: int
    epoch: int

    def covers(self, cell: int) -> bool:
        return self.lo <= cell < self.hi

    def overlaps(self, other: Segment) -> bool:
        return self.lo < other.hi and other.lo < self.hi

    @property
    def cells(self) -> range:
        return range(self.lo, self.hi)


@attrs.frozen
class StoredEvent:
    """An event as a segment stores it: its writer, the writer's number for it, its routing key."""

    writer: str
    number: int
    key: int


@attrs.frozen
class InflightEvent:
    """An event its writer has not seen acknowledged, and the segment it is routed to."""

    number: int
    key: int
    segment: int


@attrs.frozen
class Scaling:
    """The spec's ``scaling``: how far the scale in progress got, the segments it seals
    (``predecessors``) and those it creates (``successors``)."""

    phase: ScalePhase
    predecessors: frozenset[int] = frozenset()
    successors: frozenset[int] = frozenset()


IDLE = Scaling(ScalePhase.IDLE)


@attrs.frozen
class Checkpoint:
    """``pending``: the readers that still owe their positions; ``cut``: segment -> offset."""

    pending: frozenset[str]
    cut: Offsets

    @property
    def complete(self) -> bool:
        return not self.pending


@attrs.frozen(cache_hash=True)
class StreamState:
    """The spec's variables under their model names (``segs`` -> ``segments``, ``pos`` ->
    ``positions``, ``atCkpt`` -> ``at_checkpoint``, ``ckpts`` -> ``checkpoints``; the rest keep their
    names).  ``table[w][cell]`` is the segment writer ``w`` routes that cell's keys to."""

    segments: tuple[Segment, ...]
    epochs: tuple[frozenset[int], ...]
    scaling: Scaling
    scales: int
    sealed: frozenset[int]
    data: tuple[tuple[StoredEvent, ...], ...]
    written: FrozenMap[str, int]
    table: FrozenMap[str, tuple[int, ...]]
    inflight: FrozenMap[str, tuple[InflightEvent, ...]]
    online: frozenset[str]
    assigned: FrozenMap[str, Offsets]
    unassigned: Offsets
    future: FrozenMap[int, frozenset[int]]
    positions: FrozenMap[str, Offsets]
    at_checkpoint: FrozenMap[str, int]
    saved: FrozenMap[str, Offsets]
    checkpoints: tuple[Checkpoint, ...]
    crashes: int
    resets: int
    reads: tuple[Position, ...]
    origin: Offsets
    unsaved: FrozenMap[str, frozenset[Position]]

    # --- The key space, segments and epochs --------------------------------------------------------

    @property
    def grid(self) -> int:
        """The number of cells: the first epoch covers them all."""
        return max(segment.hi for segment in self.segments)

    @property
    def current(self) -> frozenset[int]:
        """The last recorded epoch's segments."""
        return self.epochs[-1]

    def segment(self, segment_id: int) -> Segment:
        return self.segments[segment_id - 1]

    def successors(self, segment_id: int) -> frozenset[int]:
        """The segments that replaced a sealed segment: the next epoch's that overlap it."""
        last = max(e for e, members in enumerate(self.epochs, start=1) if segment_id in members)
        if last == len(self.epochs):
            raise InternalError(f"segment {segment_id} has no successors yet")
        mine = self.segment(segment_id)
        return frozenset(t for t in self.epochs[last] if self.segment(t).overlaps(mine))

    def predecessors(self, segment_id: int) -> frozenset[int]:
        """The previous epoch's segments that a segment replaced (none for the first epoch's)."""
        mine = self.segment(segment_id)
        if mine.epoch == 1:
            return frozenset()
        return frozenset(p for p in self.epochs[mine.epoch - 2] if self.segment(p).overlaps(mine))

    def partitions(self, segment_ids: Iterable[int]) -> bool:
        """Whether the segments cover every cell exactly once."""
        counts = [0] * self.grid
        for segment_id in segment_ids:
            for cell in self.segment(segment_id).cells:
                counts[cell] += 1
        return all(count == 1 for count in counts)

    def cells(self, segment_ids: Iterable[int]) -> frozenset[int]:
        return frozenset(cell for s in segment_ids for cell in self.segment(s).cells)

    # --- What clients observe ----------------------------------------------------------------------

    def event_at(self, position: Position) -> StoredEvent:
        segment_id, offset = position
        return self.data[segment_id - 1][offset - 1]

    def all_positions(self) -> Iterator[Position]:
        for segment_id, events in enumerate(self.data, start=1):
            for offset in range(1, len(events) + 1):
                yield segment_id, offset

    def stored_numbers(self, segment_id: int, writer: str) -> frozenset[int]:
        """``StoredNumbers(s, w)``: the numbers of the writer's events the segment stores."""
        return frozenset(e.number for e in self.data[segment_id - 1] if e.writer == writer)

    def routed(self, writer: str) -> frozenset[int]:
        """The segments a writer routes some cell to."""
        return frozenset(self.table[writer])

    def route(self, writer: str, key: int) -> int:
        """The segment a writer sends an event with routing key ``key`` to."""
        return self.table[writer][key]

    def owned(self, reader: str) -> frozenset[int]:
        return frozenset(self.assigned[reader])

    def load(self, reader: str) -> int:
        return len(self.assigned[reader])

    def pending(self, reader: str) -> bool:
        """Whether the reader owes positions to a checkpoint."""
        return any(reader in c.pending for c in self.checkpoints)

    @property
    def checkpoint_in_progress(self) -> bool:
        return any(not c.complete for c in self.checkpoints)

    def free(self, reader: str) -> bool:
        """Online and owing no checkpoint: may read and change its assignment."""
        return reader in self.online and self.at_checkpoint[reader] == 0 and not self.pending(reader)

    @property
    def held(self) -> frozenset[int]:
        """The segments the group holds: assigned to some reader, or unassigned."""
        return frozenset(self.unassigned).union(*(self.assigned[r] for r in self.assigned))

    @property
    def completed_waiting(self) -> frozenset[int]:
        """Completed predecessors that some future segment still waits beside."""
        return frozenset().union(*(self.predecessors(t) - waits for t, waits in self.future.items()))

    def after(self, position: Position, cut: Offsets) -> bool:
        """Whether a position lies after a cut: beyond its offset, or in a later segment."""
        segment_id, offset = position
        if segment_id in cut:
            return offset > cut[segment_id]
        mine = self.segment(segment_id)
        return any(mine.overlaps(self.segment(x)) and mine.epoch > self.segment(x).epoch for x in cut)

    @property
    def drained(self) -> bool:
        """Nothing left to read: nothing in flight, every held segment read to its end and open."""
        return (all(not events for events in self.inflight.values())
                and not self.unassigned and not self.future
                and all(offset == len(self.data[s - 1]) and s not in self.sealed
                        for offsets in self.positions.values() for s, offset in offsets.items()))

    def check_invariants(self) -> None:
        """The spec's invariants, evaluated on this state; raises InternalError naming the first broken."""
        for name, holds in _invariants(self):
            if not holds:
                raise InternalError(f"model invariant {name} is violated")


def initial_state(writers: Iterable[str], readers: Iterable[str], initial_readers: Iterable[str], grid: int,
                  initial_splits: Iterable[int] = ()) -> StreamState:
    """The spec's ``Init``: one epoch of segments between the boundaries, every segment unassigned."""
    bounds = sorted({0, grid, *initial_splits})
    if bounds[0] != 0 or bounds[-1] != grid:
        raise ValueError(f"initial splits must lie strictly inside the {grid} cells")
    segments = tuple(Segment(lo, hi, 1) for lo, hi in itertools.pairwise(bounds))
    ids = range(1, len(segments) + 1)
    owner = tuple(next(s for s in ids if segments[s - 1].covers(cell)) for cell in range(grid))
    readers = sorted(readers)
    writers = sorted(writers)
    start: Offsets = FrozenMap((s, 0) for s in ids)
    return StreamState(
        segments=segments, epochs=(frozenset(ids),), scaling=IDLE, scales=0, sealed=frozenset(),
        data=tuple(() for _ in ids), written=FrozenMap((w, 0) for w in writers),
        table=FrozenMap((w, owner) for w in writers), inflight=FrozenMap((w, ()) for w in writers),
        online=frozenset(initial_readers), assigned=FrozenMap((r, EMPTY) for r in readers), unassigned=start,
        future=FrozenMap(), positions=FrozenMap((r, EMPTY) for r in readers),
        at_checkpoint=FrozenMap((r, 0) for r in readers), saved=FrozenMap((r, EMPTY) for r in readers),
        checkpoints=(), crashes=0, resets=0, reads=(), origin=start,
        unsaved=FrozenMap((r, frozenset()) for r in readers),
    )


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _override(base: Offsets, updates: Offsets) -> Offsets:
    return FrozenMap({**base, **updates})


# --- The controller scales the stream -----------------------------------------------------------


def scale_requests(state: StreamState) -> Iterator[tuple[frozenset[int], tuple[tuple[int, int], ...]]]:
    """The scales the spec's ``CreateSuccessors`` may start, one per choice it makes: every split
    of a segment of the current epoch at an interior boundary, then every merge of two adjacent ones.
    Each is ``(predecessors, successor ranges in key order)``."""
    for s in sorted(state.current):
        segment = state.segment(s)
        for boundary in range(1, state.grid):
            if segment.lo < boundary < segment.hi:
                yield frozenset({s}), ((segment.lo, boundary), (boundary, segment.hi))
    for s in sorted(state.current):
        for t in sorted(state.current):
            if state.segment(s).hi == state.segment(t).lo:
                yield frozenset({s, t}), ((state.segment(s).lo, state.segment(t).hi),)


def create_successors(state: StreamState, predecessors: frozenset[int],
                      ranges: tuple[tuple[int, int], ...]) -> StreamState:
    """``CreateSuccessors``: create the successor segments (for the epoch about to be recorded) that
    will replace ``predecessors``, which must be segments of the current epoch whose cells the ranges
    cover exactly."""
    _require(state.scaling.phase is ScalePhase.IDLE, "CreateSuccessors")
    _require(bool(predecessors) and predecessors <= state.current, "CreateSuccessors")
    # The ranges are non-empty, in key order, contiguous, and span exactly the predecessors' cells.
    _require(all(lo < hi for lo, hi in ranges), "CreateSuccessors")
    _require(all(left[1] == right[0] for left, right in itertools.pairwise(ranges)), "CreateSuccessors")
    new_cells = frozenset(cell for lo, hi in ranges for cell in range(lo, hi))
    _require(bool(ranges) and new_cells == state.cells(predecessors), "CreateSuccessors")
    epoch = len(state.epochs) + 1
    first = len(state.segments) + 1
    return attrs.evolve(
        state,
        segments=(*state.segments, *(Segment(lo, hi, epoch) for lo, hi in ranges)),
        data=(*state.data, *(() for _ in ranges)),
        scaling=Scaling(ScalePhase.CREATED, frozenset(predecessors), frozenset(range(first, first + len(ranges)))),
        scales=state.scales + 1,
    )


def record_epoch(state: StreamState) -> StreamState:
    """``RecordEpoch``: the new epoch is the current one without the predecessors, with the successors."""
    _require(state.scaling.phase is ScalePhase.CREATED, "RecordEpoch")
    epoch = (state.current - state.scaling.predecessors) | state.scaling.successors
    return attrs.evolve(state, epochs=(*state.epochs, epoch),
                        scaling=attrs.evolve(state.scaling, phase=ScalePhase.RECORDED))


def seal_predecessors(state: StreamState) -> StreamState:
    """``SealPredecessors``: the store refuses appends to the predecessors from now on."""
    _require(state.scaling.phase is ScalePhase.RECORDED, "SealPredecessors")
    return attrs.evolve(state, sealed=state.sealed | state.scaling.predecessors,
                        scaling=attrs.evolve(state.scaling, phase=ScalePhase.SEALED))


def activate_epoch(state: StreamState) -> StreamState:
    """``ActivateEpoch``: the scale is complete; the next one may begin."""
    _require(state.scaling.phase is ScalePhase.SEALED, "ActivateEpoch")
    return attrs.evolve(state, scaling=IDLE)


# --- Writers ------------------------------------------------------------------------------------


def write_event(state: StreamState, writer: str, key: int) -> StreamState:
    """``WriteEvent(w, k)``: the writer numbers the event and routes it by its table."""
    _require(writer in state.written and 0 <= key < state.grid, "WriteEvent")
    number = state.written[writer] + 1
    event = InflightEvent(number, key, state.route(writer, key))
    return attrs.evolve(state, written=state.written.set(writer, number),
                        inflight=state.inflight.set(writer, (*state.inflight[writer], event)))


def _unstored(state: StreamState, writer: str, segment_id: int) -> list[InflightEvent]:
    stored = state.stored_numbers(segment_id, writer)
    return [e for e in state.inflight[writer] if e.segment == segment_id and e.number not in stored]


def append_event(state: StreamState, writer: str, segment_id: int) -> StreamState:
    """``AppendEvent(w, s)``: the store appends the writer's first event for the segment that it
    does not hold yet, unless the segment is sealed."""
    _require(segment_id in state.routed(writer) and segment_id not in state.sealed, "AppendEvent")
    unstored = _unstored(state, writer, segment_id)
    _require(bool(unstored), "AppendEvent")
    event = unstored[0]
    data = list(state.data)
    data[segment_id - 1] = (*data[segment_id - 1], StoredEvent(writer, event.number, event.key))
    return attrs.evolve(state, data=tuple(data))


def ack_event(state: StreamState, writer: str, segment_id: int) -> StreamState:
    """``AckEvent(w, s)``: acknowledgements reach the writer for every in-flight event for the segment
    that it stores."""
    _require(segment_id in state.routed(writer), "AckEvent")
    stored = state.stored_numbers(segment_id, writer)
    inflight = state.inflight[writer]
    _require(any(e.segment == segment_id and e.number in stored for e in inflight), "AckEvent")
    kept = tuple(e for e in inflight if e.segment != segment_id or e.number not in stored)
    return attrs.evolve(state, inflight=state.inflight.set(writer, kept))


def segment_sealed(state: StreamState, writer: str, segment_id: int) -> StreamState:
    """``SegmentSealed(w, s)``: an append met a sealed segment.  The writer learns what the
    segment stores (SetupAppend), drops that, routes its cells to the successors and resends the rest there."""
    _require(segment_id in state.routed(writer) and segment_id in state.sealed, "SegmentSealed")
    inflight = state.inflight[writer]
    _require(any(e.segment == segment_id for e in inflight), "SegmentSealed")
    stored = state.stored_numbers(segment_id, writer)
    successors = state.successors(segment_id)
    route = tuple(
        next(t for t in successors if state.segment(t).covers(cell)) if target == segment_id else target
        for cell, target in enumerate(state.table[writer]))
    kept = tuple(
        attrs.evolve(e, segment=route[e.key]) if e.segment == segment_id else e
        for e in inflight if e.segment != segment_id or e.number not in stored)
    return attrs.evolve(state, table=state.table.set(writer, route), inflight=state.inflight.set(writer, kept))


# --- The reader group ---------------------------------------------------------------------------


def add_reader(state: StreamState, reader: str) -> StreamState:
    """``AddReader(r)``: a reader joins the group (new, or restarted after a crash), holding nothing."""
    _require(reader in state.assigned and reader not in state.online, "AddReader")
    return attrs.evolve(state, online=state.online | {reader})


def _take(state: StreamState, reader: str, segment_id: int, offset: int) -> StreamState:
    return attrs.evolve(
        state,
        assigned=state.assigned.set(reader, state.assigned[reader].set(segment_id, offset)),
        positions=state.positions.set(reader, state.positions[reader].set(segment_id, offset)),
        saved=state.saved.set(reader, state.saved[reader].set(segment_id, offset)))


def _give_up(state: StreamState, reader: str, segment_id: int) -> StreamState:
    return attrs.evolve(
        state,
        assigned=state.assigned.set(reader, state.assigned[reader].without(segment_id)),
        positions=state.positions.set(reader, state.positions[reader].without(segment_id)),
        saved=state.saved.set(reader, state.saved[reader].without(segment_id)))


def acquire_segment(state: StreamState, reader: str, segment_id: int) -> StreamState:
    """``AcquireSegment(r, s)``: a least loaded free reader takes an unassigned segment at its offset."""
    _require(state.free(reader) and segment_id in state.unassigned, "AcquireSegment")
    _require(all(state.load(reader) <= state.load(q) for q in state.online), "AcquireSegment")
    offset = state.unassigned[segment_id]
    return attrs.evolve(_take(state, reader, segment_id, offset), unassigned=state.unassigned.without(segment_id))


def release_segment(state: StreamState, reader: str, segment_id: int) -> StreamState:
    """``ReleaseSegment(r, s)``: a reader holding two more segments than another gives one up, at the
    offset recorded for it (it has read nothing there since)."""
    _require(state.free(reader) and segment_id in state.assigned[reader], "ReleaseSegment")
    offset = state.assigned[reader][segment_id]
    _require(state.positions[reader][segment_id] == offset, "ReleaseSegment")
    _require(any(state.load(q) + 2 <= state.load(reader) for q in state.online - {reader}), "ReleaseSegment")
    return attrs.evolve(_give_up(state, reader, segment_id), unassigned=state.unassigned.set(segment_id, offset))


def read_next_event(state: StreamState, reader: str, segment_id: int) -> StreamState:
    """``ReadNextEvent(r, s)``: the reader returns the next event of one of its segments."""
    _require(state.free(reader) and segment_id in state.positions[reader], "ReadNextEvent")
    offset = state.positions[reader][segment_id]
    _require(offset < len(state.data[segment_id - 1]), "ReadNextEvent")
    return attrs.evolve(
        state, positions=state.positions.set(reader, state.positions[reader].set(segment_id, offset + 1)),
        reads=(*state.reads, (segment_id, offset + 1)),
        unsaved=state.unsaved.set(reader, state.unsaved[reader] | {(segment_id, offset + 1)}))


def segment_completed(state: StreamState, reader: str, segment_id: int) -> StreamState:
    """``SegmentCompleted(r, s)``: a sealed segment read to its end leaves the group; its successors
    become future segments, and unassigned at offset 0 once every predecessor has completed."""
    _require(state.free(reader) and segment_id in state.assigned[reader], "SegmentCompleted")
    _require(segment_id in state.sealed, "SegmentCompleted")
    _require(state.positions[reader][segment_id] == len(state.data[segment_id - 1]), "SegmentCompleted")
    held = state.held
    waiting = {t: waits - {segment_id} for t, waits in state.future.items()}
    for t in state.successors(segment_id) - held:
        if t not in waiting:
            waiting[t] = state.predecessors(t) - {segment_id}
    ready = {t for t, waits in waiting.items() if not waits}
    future = FrozenMap((t, waits) for t, waits in waiting.items() if t not in ready)
    unassigned = _override(state.unassigned, FrozenMap((t, 0) for t in ready))
    unsaved = frozenset(p for p in state.unsaved[reader] if p[0] != segment_id)
    return attrs.evolve(_give_up(state, reader, segment_id), future=future, unassigned=unassigned,
                        unsaved=state.unsaved.set(reader, unsaved))


def create_checkpoint(state: StreamState) -> StreamState:
    """``CreateCheckpoint``: the online readers owe it their positions; its cut starts with the
    unassigned offsets and the ends of completed predecessors that futures still wait beside."""
    _require(not state.checkpoint_in_progress, "CreateCheckpoint")
    ends = FrozenMap((p, len(state.data[p - 1])) for p in state.completed_waiting)
    checkpoint = Checkpoint(state.online, _override(state.unassigned, ends))
    return attrs.evolve(state, checkpoints=(*state.checkpoints, checkpoint))


def surface_checkpoint(state: StreamState, reader: str) -> StreamState:
    """``SurfaceCheckpoint(r)``: ``read_next_event`` returns the checkpoint the reader owes instead of
    an event."""
    _require(reader in state.online and state.at_checkpoint[reader] == 0 and state.pending(reader),
             "SurfaceCheckpoint")
    number = next(i for i, c in enumerate(state.checkpoints, start=1) if reader in c.pending)
    return attrs.evolve(state, at_checkpoint=state.at_checkpoint.set(reader, number))


def checkpoint_reader(state: StreamState, reader: str) -> StreamState:
    """``CheckpointReader(r)``: the next ``read_next_event`` call.  The application has persisted its
    state; the reader records its positions in the checkpoint and as its recorded offsets."""
    _require(reader in state.online and state.at_checkpoint[reader] != 0, "CheckpointReader")
    number = state.at_checkpoint[reader]
    mine = state.positions[reader]
    checkpoint = state.checkpoints[number - 1]
    recorded = Checkpoint(checkpoint.pending - {reader}, _override(checkpoint.cut, mine))
    checkpoints = (*state.checkpoints[:number - 1], recorded, *state.checkpoints[number:])
    return attrs.evolve(state, saved=state.saved.set(reader, mine), checkpoints=checkpoints,
                        assigned=state.assigned.set(reader, mine),
                        at_checkpoint=state.at_checkpoint.set(reader, 0),
                        unsaved=state.unsaved.set(reader, frozenset()))


def reader_offline(state: StreamState, reader: str) -> StreamState:
    """``ReaderOffline(r)``: a reader crashed.  Its segments return to the pool at their recorded
    offsets, a checkpoint it owed takes those offsets, and what it delivered that its application had
    not persisted (``unsaved``: in the segments it holds or released) is void (the group must deliver
    it again)."""
    _require(reader in state.online, "ReaderOffline")
    recorded = state.assigned[reader]
    lost = state.unsaved[reader]
    checkpoints = tuple(
        Checkpoint(c.pending - {reader}, _override(c.cut, recorded)) if reader in c.pending else c
        for c in state.checkpoints)
    reads = tuple(p for p in state.reads if p not in lost)
    return attrs.evolve(
        state, online=state.online - {reader}, unassigned=_override(state.unassigned, recorded),
        checkpoints=checkpoints, reads=reads, assigned=state.assigned.set(reader, EMPTY),
        positions=state.positions.set(reader, EMPTY), saved=state.saved.set(reader, EMPTY),
        at_checkpoint=state.at_checkpoint.set(reader, 0), crashes=state.crashes + 1,
        unsaved=state.unsaved.set(reader, frozenset()))


def reset(state: StreamState, checkpoint: int) -> StreamState:
    """``Reset(i)``: the application restarts the group from completed checkpoint number ``checkpoint``
    (1-based): a new generation whose unassigned segments are the checkpoint's cut."""
    _require(1 <= checkpoint <= len(state.checkpoints) and not state.checkpoint_in_progress, "Reset")
    cut = state.checkpoints[checkpoint - 1].cut
    nothing = FrozenMap((r, EMPTY) for r in state.assigned)
    return attrs.evolve(
        state, unassigned=cut, future=FrozenMap(), assigned=nothing, positions=nothing, saved=nothing,
        at_checkpoint=FrozenMap((r, 0) for r in state.at_checkpoint), reads=(), origin=cut,
        resets=state.resets + 1, unsaved=FrozenMap((r, frozenset()) for r in state.unsaved))


# --- Invariants (the spec's, in Python) ---------------------------------------------------------


def _per_key_order(state: StreamState) -> bool:
    events = [state.event_at(p) for p in state.reads]
    for i, (earlier, first) in enumerate(zip(state.reads, events, strict=True)):
        for later, second in zip(state.reads[i + 1:], events[i + 1:], strict=True):
            if first.key != second.key:
                continue
            if earlier[0] == later[0]:
                in_order = earlier[1] < later[1]
            else:
                in_order = state.segment(earlier[0]).epoch < state.segment(later[0]).epoch
            if not in_order or (first.writer == second.writer and first.number >= second.number):
                return False
    return True


def _invariants(state: StreamState) -> Iterator[tuple[str, bool]]:
    readers = list(state.assigned)
    yield "TypeOK", (
        state.sealed <= frozenset(range(1, len(state.segments) + 1))
        and len(state.data) == len(state.segments)
        and state.online <= frozenset(readers)
        and all(frozenset(state.positions[r]) == state.owned(r) == frozenset(state.saved[r]) for r in readers)
        and all(not state.assigned[r] and state.at_checkpoint[r] == 0 for r in readers if r not in state.online))
    yield "EpochsCoverKeySpace", (
        all(state.partitions(epoch) for epoch in state.epochs) and not (state.sealed & state.current))
    yield "SuccessorsCoverPredecessors", (
        all(state.cells(before - after) == state.cells(after - before)
            for before, after in itertools.pairwise(state.epochs))
        and (state.scaling.phase is ScalePhase.IDLE
             or state.cells(state.scaling.predecessors) == state.cells(state.scaling.successors)))
    yield "WritersRouteByKey", all(
        all(state.segment(target).covers(cell) for cell, target in enumerate(state.table[w]))
        and all(e.segment == state.table[w][e.key] for e in state.inflight[w])
        for w in state.table)
    stored = [state.event_at(p) for p in state.all_positions()]
    yield "EventsStoredOnce", len(set(stored)) == len(stored)
    stored_by = {(e.writer, e.number) for e in stored}
    yield "NoAcknowledgedEventLost", all(
        (w, n) in stored_by
        for w, count in state.written.items()
        for n in range(1, count + 1)
        if all(e.number != n for e in state.inflight[w]))
    owners = [s for r in readers for s in state.assigned[r]]
    yield "OneHolderPerSegment", (
        len(set(owners)) == len(owners)
        and not (set(owners) & (set(state.unassigned) | set(state.future)))
        and not (set(state.unassigned) & set(state.future)))
    yield "CheckpointCutsCoverKeySpace", all(
        state.partitions(c.cut) and all(offset <= len(state.data[s - 1]) for s, offset in c.cut.items())
        for c in state.checkpoints if c.complete)
    delivered = [state.event_at(p) for p in state.reads]
    yield "NoDuplicateReads", len(set(delivered)) == len(delivered)
    yield "PerKeyOrder", _per_key_order(state)
    yield "ExactlyOnceAfterReset", (
        all(state.after(p, state.origin) for p in state.reads)
        and (not state.drained
             or {p for p in state.all_positions() if state.after(p, state.origin)} <= set(state.reads)))
