"""A reader group's shared state: ``ReaderGroupState``, a pure state machine whose updates are values,
and its codec (``ReaderGroupStateCodec``: the state and its updates as JSON).  No I/O, no clock, no
asyncio: the group handle that reads and writes it through a ``StateSynchronizer`` -- creating
readers, taking checkpoints, resetting the group, declaring readers offline -- is ``_reader_group``.

Theory of operation.  A reader group reads one or more streams; each segment is read by exactly one
reader of the group at a time.  The group's state lives in its state segment
(``<scope>/_RG<group>``, in the group's scope so that a token for the scope covers it; created by the
controller, which records its name -- groups made before it moved there keep theirs under
``_system/_readergroups/``) and is shared through a ``StateSynchronizer``: every reader keeps a copy
and changes it only by the updates below, each written with a conditional append against the latest
state (Pravega's ``ReaderGroupState``, reference 6.1-6.5; spec ``StreamOrdering.tla``, model
``millstream.model.stream_ordering``).  Segments are named by their qualified names
(``scope/stream/<n>.#epoch.<e>``), so one state spans several streams.

The state:

* ``readers`` -- the online readers, each with a heartbeat counter and its lag;
* ``assigned`` -- reader -> {segment -> *recorded offset*}: where the segment restarts if the reader
  crashes.  It is the offset the reader acquired the segment at, or the position it recorded at its
  last checkpoint (the application had persisted its state then), never the reader's live position;
* ``unassigned`` -- segment -> offset: segments no reader holds;
* ``future`` -- successor -> the predecessors it still waits for (and all of them): a successor becomes
  unassigned at offset 0 only once *every* predecessor has been read to its end, which keeps
  per-routing-key order across splits and merges;
* ``completed`` -- the end offsets of completed predecessors that future segments still wait beside,
  and ``ended`` -- segments read to their end with nothing after them to read (a sealed stream, or the
  end cut of a bounded read; ``end_offsets`` holds those cuts): a checkpoint's cut takes both, so it
  always covers the whole key space of every stream;
* ``checkpoints`` -- those in progress (at most ``limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX``:
  the readers that still owe their positions, and the positions so far) and the last few completed;
* ``config`` and ``generation`` -- the controller's configuration of the group and its generation,
  bumped by every reset.

Updates (``apply`` validates each against the state it meets and raises a typed error for one it
refuses, so a refused update is never written): ``ReaderGroupStateInit`` (a reset: new generation,
fresh offsets; readers stay online holding nothing; checkpoints in progress are dropped),
``AddReader``, ``RemoveReader`` (its segments return to the pool at given positions, or at their
recorded offsets, and a checkpoint it owed takes those), ``AcquireSegment``, ``ReleaseSegment`` (only
at the recorded offset: a reader releases right after a checkpoint, or a segment it has not read),
``SegmentCompleted`` (with the successors and all their predecessors, as the controller gave them),
``UpdateDistanceToTail`` (the reader's heartbeat and lag), ``CreateCheckpoint`` (the online readers owe
it their positions; it starts from the unassigned, completed and ended offsets) and
``CheckpointReader`` (a reader's positions, which also become its recorded offsets).  A reader that
owes a checkpoint may not acquire, release or complete a segment until it has recorded it.

Rebalancing policy (pure functions of the state, used by readers on their own timers): a reader's
relative load is its segment count times ``max(assumed lag, its lag) / max lag``; a reader acquires
``max(1, unassigned // readers, min(unassigned, round(total / readers) - owned))`` segments at a time,
and releases one when it holds more than one and its load exceeds the least loaded reader's by more
than ``max(1, unassigned)``.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final

import attrs

from millstream import limits
from millstream.client._streams import (
    ReaderGroupConfig,
    StreamCut,
    canonical_json,
)
from millstream.errors import (
    CheckpointLimitError,
    InternalError,
    InvalidArgumentError,
    ReaderExistsError,
    ReaderNotInGroupError,
)
from millstream.naming import parse_stream_segment_name

__all__ = [
    "SILENT_SUFFIX",
    "AcquireSegment",
    "AddReader",
    "Checkpoint",
    "CheckpointReader",
    "CheckpointState",
    "CreateCheckpoint",
    "FutureSegment",
    "ReaderGroupState",
    "ReaderGroupStateCodec",
    "ReaderGroupStateInit",
    "ReaderGroupUpdate",
    "ReaderInfo",
    "ReleaseSegment",
    "RemoveReader",
    "SegmentCompleted",
    "UpdateDistanceToTail",
    "stream_of",
    "validate_name",
]

#: Checkpoints whose name ends with this are *silent*: readers record them without surfacing them
#: to the application (used to take stream cuts of the group's position).
SILENT_SUFFIX: Final = "#silent"


# --- Small helpers ---------------------------------------------------------------------------------


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return types.MappingProxyType(dict(sorted(mapping.items())))


def validate_name(value: Any, what: str) -> str:
    """A reader id or checkpoint name: a non-empty printable str of at most
    ``limits.READER_GROUP_NAME_LENGTH_MAX`` characters."""
    if not isinstance(value, str) or not value or len(value) > limits.READER_GROUP_NAME_LENGTH_MAX \
            or not value.isprintable():
        raise InvalidArgumentError(f"a {what} is a non-empty printable str of at most "
                                   f"{limits.READER_GROUP_NAME_LENGTH_MAX} characters, not {value!r}")
    return value


def _offset(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative int, not {value!r}")
    return value


def _offsets(value: Any, what: str) -> Mapping[str, int]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} maps segment names to offsets, not {value!r}")
    checked: dict[str, int] = {}
    for segment, offset in value.items():
        parse_stream_segment_name(segment)
        checked[segment] = _offset(offset, f"the offset of {segment!r}")
    return _frozen(checked)


def _names(value: Any, what: str) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{what} is a collection of segment names, not {value!r}")
    names = frozenset(value)
    for name in names:
        parse_stream_segment_name(name)
    return names


def stream_of(segment: str) -> str:
    """``"scope/stream"`` of a qualified segment name."""
    scope, stream, _ = parse_stream_segment_name(segment)
    return f"{scope}/{stream}"


def _preference(reader: str, segment: str) -> int:
    """A stable, reader-specific order on segments (which to acquire first, which to release), so
    readers racing for segments prefer different ones.  blake2b: stable across processes."""
    return int.from_bytes(hashlib.blake2b(f"{reader}\x00{segment}".encode(), digest_size=8).digest(), "big")


# --- Values held in the state ----------------------------------------------------------------------


@attrs.frozen
class ReaderInfo:
    """An online reader: how many heartbeats it has written (others time its silence on their own
    clocks) and the lag it last reported, in seconds."""

    heartbeat: int = 0
    lag_seconds: float = 0.0


@attrs.frozen
class FutureSegment:
    """A successor waiting for predecessors: those not yet read to their end, and all of them."""

    waiting: frozenset[str]
    predecessors: frozenset[str]


@attrs.frozen
class CheckpointState:
    """A checkpoint in the group's state: the readers that still owe their positions (``pending``),
    and the positions recorded so far (segment -> offset).  Complete once nobody owes anything."""

    name: str
    silent: bool
    pending: frozenset[str]
    positions: Mapping[str, int]

    @property
    def complete(self) -> bool:
        return not self.pending


class Checkpoint:
    """A completed checkpoint: a consistent position of the whole group, one ``StreamCut`` per stream
    (``cuts``).  Reset the group to it with ``reset_to_checkpoint``; ``to_json``/``from_json`` store
    it.  Frozen."""

    __slots__ = ("_cuts", "_name")

    _name: str
    _cuts: Mapping[str, StreamCut]

    def __init__(self, name: str, cuts: Mapping[str, StreamCut]) -> None:
        validate_name(name, "checkpoint name")
        if not isinstance(cuts, Mapping) or not cuts:
            raise InvalidArgumentError(f"a checkpoint holds a stream cut per stream, not {cuts!r}")
        for stream, cut in cuts.items():
            if not isinstance(cut, StreamCut) or cut.stream != stream:
                raise InvalidArgumentError(f"the cut of {stream!r} must be a StreamCut of it, not {cut!r}")
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_cuts", _frozen(cuts))

    @property
    def name(self) -> str:
        return self._name

    @property
    def cuts(self) -> Mapping[str, StreamCut]:
        """Stream (``"scope/stream"``) -> its cut."""
        return self._cuts

    @classmethod
    def from_positions(cls, name: str, positions: Mapping[str, int]) -> Checkpoint:
        """The checkpoint of a complete ``CheckpointState``'s positions (grouped into streams)."""
        by_stream: dict[str, dict[int, int]] = {}
        for segment, offset in positions.items():
            scope, stream, identifier = parse_stream_segment_name(segment)
            by_stream.setdefault(f"{scope}/{stream}", {})[identifier] = offset
        return cls(name, {stream: StreamCut(stream, cut) for stream, cut in by_stream.items()})

    def to_json(self) -> str:
        """``{"cuts":{"scope/stream":{"<segment id>":offset}},"name":...}``, canonical."""
        return canonical_json({"name": self._name,
                               "cuts": {stream: cut.to_wire() for stream, cut in self._cuts.items()}}).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        import json

        try:
            value = json.loads(text)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"a checkpoint's JSON is malformed: {error}") from None
        if not isinstance(value, dict) or set(value) != {"name", "cuts"} or not isinstance(value["cuts"], dict):
            raise InvalidArgumentError(f"a checkpoint is {{\"name\": ..., \"cuts\": {{...}}}}, not {value!r:.200}")
        return cls(value["name"], {stream: StreamCut.from_wire(stream, cut) for stream, cut in value["cuts"].items()})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._name == other._name and self._cuts == other._cuts

    def __hash__(self) -> int:
        return hash((self._name, tuple(self._cuts.items())))

    def __setattr__(self, name: str, value: object) -> None:
        raise attrs.exceptions.FrozenInstanceError()

    def __repr__(self) -> str:
        return f"Checkpoint({self._name!r}, {dict(self._cuts)!r})"


# --- Updates ---------------------------------------------------------------------------------------


class ReaderGroupUpdate:
    """An update of the group's state: a frozen value with a JSON form (``type`` names it)."""

    TYPE: ClassVar[str] = ""

    def to_json_object(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json_object(value: Any) -> ReaderGroupUpdate:
        if not isinstance(value, dict) or value.get("type") not in _UPDATE_TYPES:
            raise InvalidArgumentError(f"not a reader group update: {value!r:.200}")
        try:
            return _UPDATE_TYPES[value["type"]].decode(value)
        except (KeyError, TypeError) as error:
            raise InvalidArgumentError(f"a malformed {value['type']} update ({error}): {value!r:.200}") from None

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        raise NotImplementedError


@attrs.frozen
class ReaderGroupStateInit(ReaderGroupUpdate):
    """A reset: the configuration of ``generation`` (its start offsets and its end cuts' offsets)."""

    TYPE: ClassVar[str] = "reader_group_state_init"
    config: ReaderGroupConfig
    generation: int
    start: Mapping[str, int]
    end_offsets: Mapping[str, int]

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "config": self.config.to_json_object(), "generation": self.generation,
                "start": dict(self.start), "end_offsets": dict(self.end_offsets)}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(ReaderGroupConfig.from_json_object(value["config"]), _offset(value["generation"], "generation"),
                   _offsets(value["start"], "start"), _offsets(value["end_offsets"], "end_offsets"))


@attrs.frozen
class AddReader(ReaderGroupUpdate):
    TYPE: ClassVar[str] = "add_reader"
    reader: str

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(validate_name(value["reader"], "reader id"))


@attrs.frozen
class RemoveReader(ReaderGroupUpdate):
    """The reader goes offline; its segments return to the pool at ``positions`` where given (a
    position the application processed up to), else at their recorded offsets."""

    TYPE: ClassVar[str] = "remove_reader"
    reader: str
    positions: Mapping[str, int] | None = None

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader,
                "positions": None if self.positions is None else dict(self.positions)}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        positions = value["positions"]
        return cls(validate_name(value["reader"], "reader id"),
                   None if positions is None else _offsets(positions, "positions"))


@attrs.frozen
class AcquireSegment(ReaderGroupUpdate):
    TYPE: ClassVar[str] = "acquire_segment"
    reader: str
    segment: str

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader, "segment": self.segment}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(validate_name(value["reader"], "reader id"), str(value["segment"]))


@attrs.frozen
class ReleaseSegment(ReaderGroupUpdate):
    TYPE: ClassVar[str] = "release_segment"
    reader: str
    segment: str
    offset: int

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader, "segment": self.segment, "offset": self.offset}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(validate_name(value["reader"], "reader id"), str(value["segment"]),
                   _offset(value["offset"], "offset"))


@attrs.frozen
class SegmentCompleted(ReaderGroupUpdate):
    """The reader read ``segment`` to its end (``end_offset``).  ``successors`` maps each segment
    that took over its keys to all that segment's predecessors; empty when nothing follows it that
    the group reads (a sealed stream, or the end cut of a bounded read)."""

    TYPE: ClassVar[str] = "segment_completed"
    reader: str
    segment: str
    end_offset: int
    successors: Mapping[str, frozenset[str]] = attrs.field(factory=dict, converter=_frozen)

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader, "segment": self.segment, "end_offset": self.end_offset,
                "successors": {t: sorted(p) for t, p in self.successors.items()}}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        successors = value["successors"]
        if not isinstance(successors, dict):
            raise TypeError("successors is an object")
        return cls(validate_name(value["reader"], "reader id"), str(value["segment"]),
                   _offset(value["end_offset"], "end_offset"),
                   {str(t): _names(p, "predecessors") for t, p in successors.items()})


@attrs.frozen
class UpdateDistanceToTail(ReaderGroupUpdate):
    """A reader's heartbeat, carrying its lag behind the tails of its segments (seconds)."""

    TYPE: ClassVar[str] = "update_distance_to_tail"
    reader: str
    lag_seconds: float

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "reader": self.reader, "lag_seconds": self.lag_seconds}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        lag = value["lag_seconds"]
        if isinstance(lag, bool) or not isinstance(lag, (int, float)) or not 0 <= lag < float("inf"):
            raise TypeError("lag_seconds is a non-negative number")
        return cls(validate_name(value["reader"], "reader id"), float(lag))


@attrs.frozen
class CreateCheckpoint(ReaderGroupUpdate):
    TYPE: ClassVar[str] = "create_checkpoint"
    name: str

    @property
    def silent(self) -> bool:
        return self.name.endswith(SILENT_SUFFIX)

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "name": self.name}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(validate_name(value["name"], "checkpoint name"))


@attrs.frozen
class CheckpointReader(ReaderGroupUpdate):
    """A reader's positions for checkpoint ``name`` (every segment it holds)."""

    TYPE: ClassVar[str] = "checkpoint_reader"
    name: str
    reader: str
    positions: Mapping[str, int] = attrs.field(converter=_frozen)

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.TYPE, "name": self.name, "reader": self.reader, "positions": dict(self.positions)}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> ReaderGroupUpdate:
        return cls(validate_name(value["name"], "checkpoint name"), validate_name(value["reader"], "reader id"),
                   _offsets(value["positions"], "positions"))


_UPDATE_TYPES: Final[dict[str, type[ReaderGroupUpdate]]] = {
    cls.TYPE: cls for cls in (ReaderGroupStateInit, AddReader, RemoveReader, AcquireSegment, ReleaseSegment,
                              SegmentCompleted, UpdateDistanceToTail, CreateCheckpoint, CheckpointReader)
}


# --- The state -------------------------------------------------------------------------------------


@attrs.frozen
class ReaderGroupState:
    """The group's shared state (see the module docstring).  Frozen: ``apply`` returns a new state."""

    config: ReaderGroupConfig
    generation: int
    readers: Mapping[str, ReaderInfo]
    assigned: Mapping[str, Mapping[str, int]]
    unassigned: Mapping[str, int]
    future: Mapping[str, FutureSegment]
    completed: Mapping[str, int]
    ended: Mapping[str, int]
    end_offsets: Mapping[str, int]
    checkpoints: tuple[CheckpointState, ...]
    checkpoints_created: int

    @classmethod
    def initial(cls, config: ReaderGroupConfig, generation: int, start: Mapping[str, int],
                end_offsets: Mapping[str, int]) -> ReaderGroupState:
        """A group of ``generation`` that nobody reads yet, its segments unassigned at ``start``."""
        _check_start(config, start, end_offsets)
        return cls(config, generation, _frozen({}), _frozen({}), _frozen(start), _frozen({}), _frozen({}),
                   _frozen({}), _frozen(end_offsets), (), 0)

    # --- Queries -----------------------------------------------------------------------------------

    @property
    def online(self) -> frozenset[str]:
        return frozenset(self.readers)

    def segments_of(self, reader: str) -> Mapping[str, int]:
        """The segments ``reader`` holds, with their recorded offsets (empty if it is not online)."""
        return self.assigned.get(reader, _EMPTY)

    @property
    def held(self) -> frozenset[str]:
        """Segments assigned to a reader or unassigned."""
        return frozenset(self.unassigned).union(*(set(mine) for mine in self.assigned.values()))

    @property
    def outstanding_checkpoints(self) -> tuple[CheckpointState, ...]:
        return tuple(c for c in self.checkpoints if not c.complete)

    def checkpoint(self, name: str) -> CheckpointState | None:
        return next((c for c in self.checkpoints if c.name == name), None)

    def pending_checkpoint(self, reader: str) -> CheckpointState | None:
        """The oldest checkpoint in progress that ``reader`` owes its positions to."""
        return next((c for c in self.checkpoints if reader in c.pending), None)

    def free(self, reader: str) -> bool:
        """Online and owing no checkpoint: may acquire, release and complete segments."""
        return reader in self.readers and self.pending_checkpoint(reader) is None

    @property
    def finished(self) -> bool:
        """Nothing is left to read: no segment is held or waits for predecessors (every stream is
        sealed and read to its end, or a bounded read reached its end cuts)."""
        return not self.unassigned and not self.future and not any(self.assigned.values())

    def relative_loads(self) -> dict[str, float]:
        """Reader -> segments held x max(assumed lag, its lag) / the largest such lag."""
        if not self.readers:
            return {}
        lags = {r: max(limits.READER_ASSUMED_LAG_SECONDS, info.lag_seconds) for r, info in self.readers.items()}
        largest = max(lags.values())
        return {r: len(self.assigned[r]) * lags[r] / largest for r in self.readers}

    def ranking(self, reader: str) -> int:
        """``reader``'s place when readers are ordered by load, most loaded first (ties by id)."""
        loads = self.relative_loads()
        order = sorted(loads, key=lambda r: (-loads[r], r))
        return order.index(reader) if reader in loads else len(order)

    def segments_to_acquire(self, reader: str) -> int:
        """How many unassigned segments ``reader`` should take now (0 if there are none)."""
        unassigned = len(self.unassigned)
        if not unassigned or reader not in self.readers:
            return 0
        readers = len(self.readers)
        total = unassigned + sum(len(mine) for mine in self.assigned.values())
        owned = len(self.assigned[reader])
        return min(unassigned, max(1, unassigned // readers, min(unassigned, round(total / readers) - owned)))

    def acquisition_order(self, reader: str) -> list[str]:
        """The unassigned segments in the order ``reader`` prefers them."""
        return sorted(self.unassigned, key=lambda s: (_preference(reader, s), s))

    def should_release(self, reader: str) -> bool:
        """Whether ``reader`` holds too much: more than one segment, and a load above the least loaded
        reader's by more than ``max(1, unassigned segments)``."""
        if len(self.assigned.get(reader, ())) <= 1:
            return False
        loads = self.relative_loads()
        return loads[reader] > min(loads.values()) + max(1, len(self.unassigned))

    def release_choice(self, reader: str, candidates: Iterable[str]) -> str | None:
        """Which of ``candidates`` (segments ``reader`` may give up) it releases first."""
        return max(candidates, key=lambda s: (_preference(reader, s), s), default=None)

    def checkpoint_value(self, name: str) -> Checkpoint | None:
        """The completed checkpoint ``name`` as stream cuts (None if it is unknown or in progress)."""
        found = self.checkpoint(name)
        if found is None or not found.complete:
            return None
        return Checkpoint.from_positions(name, found.positions)

    # --- Transitions -------------------------------------------------------------------------------

    def apply(self, update: ReaderGroupUpdate) -> ReaderGroupState:
        """The state after ``update``.  Raises ``ReaderExistsError``, ``ReaderNotInGroupError``,
        ``CheckpointLimitError`` or ``InvalidArgumentError`` for an update this state refuses."""
        handler = _TRANSITIONS.get(type(update))
        if handler is None:
            raise InvalidArgumentError(f"not a reader group update: {update!r}")
        return handler(self, update)

    # --- Invariants --------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``InternalError`` naming the first broken invariant."""
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise InternalError(f"reader group state: {message}")

        require(set(self.assigned) == set(self.readers), "every online reader, and only those, has an assignment")
        require(len(self.readers) <= limits.READER_GROUP_READERS_MAX, "too many readers")
        owners: dict[str, str] = {}
        for reader, mine in self.assigned.items():
            for segment in mine:
                require(segment not in owners, f"{segment} is assigned to {owners.get(segment)} and {reader}")
                owners[segment] = reader
        held = set(owners)
        for name, collection in (("unassigned", self.unassigned), ("future", self.future),
                                 ("completed", self.completed), ("ended", self.ended)):
            require(not (held & set(collection)), f"a segment is both assigned and {name}")
            held |= set(collection)
        require(len(held) == len(owners) + len(self.unassigned) + len(self.future) + len(self.completed)
                + len(self.ended), "a segment has two holders among unassigned, future, completed and ended")
        require(len(held) <= limits.READER_GROUP_SEGMENTS_MAX, "too many segments")
        for successor, waits in self.future.items():
            require(bool(waits.waiting) and waits.waiting <= waits.predecessors,
                    f"future {successor} waits for nothing, or for a non-predecessor")
            require(not (waits.waiting & (set(self.completed) | set(self.ended))),
                    f"future {successor} waits for a completed predecessor")
        beside = set().union(*(w.predecessors - w.waiting for w in self.future.values()))
        require(set(self.completed) == beside, "completed holds exactly the predecessors futures wait beside")
        streams = set(self.config.streams)
        for segment in held | set(self.end_offsets):
            require(stream_of(segment) in streams, f"{segment} is not a segment of the group's streams")
        outstanding = self.outstanding_checkpoints
        require(len(outstanding) <= limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX, "too many checkpoints")
        require(len(self.checkpoints) - len(outstanding) <= limits.READER_GROUP_CHECKPOINTS_KEPT,
                "too many completed checkpoints kept")
        require(len({c.name for c in self.checkpoints}) == len(self.checkpoints), "two checkpoints share a name")
        for checkpoint in outstanding:
            require(checkpoint.pending <= self.online, f"checkpoint {checkpoint.name} waits for an offline reader")
        for checkpoint in self.checkpoints:
            if checkpoint.complete:
                require({stream_of(s) for s in checkpoint.positions} == streams,
                        f"checkpoint {checkpoint.name} lacks a stream")

    # --- JSON --------------------------------------------------------------------------------------

    def to_json_object(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json_object(), "generation": self.generation,
            "readers": {r: [info.heartbeat, info.lag_seconds] for r, info in self.readers.items()},
            "assigned": {r: dict(mine) for r, mine in self.assigned.items()},
            "unassigned": dict(self.unassigned),
            "future": {t: [sorted(f.waiting), sorted(f.predecessors)] for t, f in self.future.items()},
            "completed": dict(self.completed), "ended": dict(self.ended), "end_offsets": dict(self.end_offsets),
            "checkpoints": [[c.name, sorted(c.pending), dict(c.positions)] for c in self.checkpoints],
            "checkpoints_created": self.checkpoints_created,
        }

    @classmethod
    def from_json_object(cls, value: Any) -> ReaderGroupState:
        try:
            readers = {validate_name(r, "reader id"): ReaderInfo(_offset(h, "heartbeat"), float(lag))
                       for r, (h, lag) in value["readers"].items()}
            state = cls(
                ReaderGroupConfig.from_json_object(value["config"]), _offset(value["generation"], "generation"),
                _frozen(readers),
                _frozen({r: _offsets(mine, "assigned") for r, mine in value["assigned"].items()}),
                _offsets(value["unassigned"], "unassigned"),
                _frozen({str(t): FutureSegment(_names(w, "waiting"), _names(p, "predecessors"))
                         for t, (w, p) in value["future"].items()}),
                _offsets(value["completed"], "completed"), _offsets(value["ended"], "ended"),
                _offsets(value["end_offsets"], "end_offsets"),
                tuple(CheckpointState(validate_name(n, "checkpoint name"), n.endswith(SILENT_SUFFIX),
                                      frozenset(validate_name(r, "reader id") for r in pending),
                                      _offsets(positions, "positions"))
                      for n, pending, positions in value["checkpoints"]),
                _offset(value["checkpoints_created"], "checkpoints_created"))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"not a reader group state ({error!r})") from None
        return state

    def __repr__(self) -> str:
        return (f"ReaderGroupState(generation={self.generation}, readers={sorted(self.readers)}, "
                f"assigned={ {r: dict(m) for r, m in self.assigned.items()} }, unassigned={dict(self.unassigned)}, "
                f"future={ {t: sorted(f.waiting) for t, f in self.future.items()} }, ended={dict(self.ended)}, "
                f"checkpoints={[(c.name, sorted(c.pending)) for c in self.checkpoints]})")


_EMPTY: Final[Mapping[str, int]] = _frozen({})


def _check_start(config: ReaderGroupConfig, start: Mapping[str, int], end_offsets: Mapping[str, int]) -> None:
    _offsets(start, "start")
    _offsets(end_offsets, "end_offsets")
    streams = set(config.streams)
    for segment in (*start, *end_offsets):
        if stream_of(segment) not in streams:
            raise InvalidArgumentError(f"{segment} is not a segment of the group's streams {sorted(streams)}")
    missing = streams - {stream_of(s) for s in start}
    if missing:
        raise InvalidArgumentError(f"no start offsets for {sorted(missing)}")
    if len(start) > limits.READER_GROUP_SEGMENTS_MAX:
        raise InvalidArgumentError(f"a reader group holds at most {limits.READER_GROUP_SEGMENTS_MAX} segments")


def _online(state: ReaderGroupState, reader: str) -> Mapping[str, int]:
    mine = state.assigned.get(reader)
    if mine is None:
        raise ReaderNotInGroupError(f"reader {reader!r} is not online in the group")
    return mine


def _free(state: ReaderGroupState, reader: str, what: str) -> Mapping[str, int]:
    mine = _online(state, reader)
    owed = state.pending_checkpoint(reader)
    if owed is not None:
        raise InvalidArgumentError(f"reader {reader!r} owes checkpoint {owed.name!r} its positions: it may not "
                                   f"{what} until it has recorded them")
    return mine


def _with_assignment(state: ReaderGroupState, reader: str, mine: Mapping[str, int], **changes: Any) -> ReaderGroupState:
    assigned = dict(state.assigned)
    assigned[reader] = _frozen(mine)
    return attrs.evolve(state, assigned=_frozen(assigned), **changes)


def _kept(checkpoints: Iterable[CheckpointState]) -> tuple[CheckpointState, ...]:
    """Every checkpoint in progress and the newest ``READER_GROUP_CHECKPOINTS_KEPT`` completed ones."""
    checkpoints = tuple(checkpoints)
    complete = [c for c in checkpoints if c.complete]
    dropped = {c.name for c in complete[:max(0, len(complete) - limits.READER_GROUP_CHECKPOINTS_KEPT)]}
    return tuple(c for c in checkpoints if c.name not in dropped)


def _state_init(state: ReaderGroupState, update: ReaderGroupStateInit) -> ReaderGroupState:
    if update.generation <= state.generation:
        raise InvalidArgumentError(f"the group is at generation {state.generation} already, not below "
                                   f"{update.generation}")
    _check_start(update.config, update.start, update.end_offsets)
    return attrs.evolve(
        state, config=update.config, generation=update.generation,
        assigned=_frozen({r: _EMPTY for r in state.readers}), unassigned=_frozen(update.start), future=_frozen({}),
        completed=_frozen({}), ended=_frozen({}), end_offsets=_frozen(update.end_offsets),
        # Completed checkpoints stay (a later reset may return to one) if they cover the same streams.
        checkpoints=_kept(c for c in state.checkpoints
                          if c.complete and {stream_of(s) for s in c.positions} == set(update.config.streams)))


def _add_reader(state: ReaderGroupState, update: AddReader) -> ReaderGroupState:
    validate_name(update.reader, "reader id")
    if update.reader in state.readers:
        raise ReaderExistsError(f"reader {update.reader!r} is online in the group already")
    if len(state.readers) >= limits.READER_GROUP_READERS_MAX:
        raise InvalidArgumentError(f"a reader group has at most {limits.READER_GROUP_READERS_MAX} readers")
    readers = dict(state.readers)
    readers[update.reader] = ReaderInfo()
    return _with_assignment(attrs.evolve(state, readers=_frozen(readers)), update.reader, {})


def _remove_reader(state: ReaderGroupState, update: RemoveReader) -> ReaderGroupState:
    mine = _online(state, update.reader)
    returned = dict(mine)
    if update.positions is not None:
        unknown = set(update.positions) - set(mine)
        if unknown:
            raise InvalidArgumentError(f"reader {update.reader!r} does not hold {sorted(unknown)}")
        returned.update(update.positions)
    checkpoints = tuple(
        CheckpointState(c.name, c.silent, c.pending - {update.reader}, _frozen({**c.positions, **returned}))
        if update.reader in c.pending else c for c in state.checkpoints)
    readers = {r: info for r, info in state.readers.items() if r != update.reader}
    assigned = {r: m for r, m in state.assigned.items() if r != update.reader}
    return attrs.evolve(state, readers=_frozen(readers), assigned=_frozen(assigned),
                        unassigned=_frozen({**state.unassigned, **returned}), checkpoints=_kept(checkpoints))


def _acquire_segment(state: ReaderGroupState, update: AcquireSegment) -> ReaderGroupState:
    mine = _free(state, update.reader, "acquire segments")
    if update.segment not in state.unassigned:
        raise InvalidArgumentError(f"segment {update.segment!r} is not unassigned")
    unassigned = dict(state.unassigned)
    offset = unassigned.pop(update.segment)
    return _with_assignment(state, update.reader, {**mine, update.segment: offset}, unassigned=_frozen(unassigned))


def _release_segment(state: ReaderGroupState, update: ReleaseSegment) -> ReaderGroupState:
    mine = dict(_free(state, update.reader, "release segments"))
    if update.segment not in mine:
        raise InvalidArgumentError(f"reader {update.reader!r} does not hold {update.segment!r}")
    if mine[update.segment] != update.offset:
        raise InvalidArgumentError(
            f"reader {update.reader!r} may release {update.segment!r} only at its recorded offset "
            f"{mine[update.segment]} (right after a checkpoint), not at {update.offset}")
    del mine[update.segment]
    return _with_assignment(state, update.reader, mine,
                            unassigned=_frozen({**state.unassigned, update.segment: update.offset}))


def _segment_completed(state: ReaderGroupState, update: SegmentCompleted) -> ReaderGroupState:
    mine = dict(_free(state, update.reader, "complete segments"))
    segment = update.segment
    if segment not in mine:
        raise InvalidArgumentError(f"reader {update.reader!r} does not hold {segment!r}")
    if update.end_offset < mine[segment]:
        raise InvalidArgumentError(f"segment {segment!r} cannot end at {update.end_offset}, before its recorded "
                                   f"offset {mine[segment]}")
    del mine[segment]
    if not update.successors:
        return _with_assignment(state, update.reader, mine, ended=_frozen({**state.ended, segment: update.end_offset}))
    held = state.held | set(state.ended) | set(state.completed)
    future = {t: FutureSegment(f.waiting - {segment}, f.predecessors) for t, f in state.future.items()}
    for successor, predecessors in update.successors.items():
        parse_stream_segment_name(successor)
        if segment not in predecessors or stream_of(successor) != stream_of(segment):
            raise InvalidArgumentError(f"{successor!r} is not a successor of {segment!r} (predecessors "
                                       f"{sorted(predecessors)})")
        if successor in future or successor in held:
            continue  # (a successor the group holds already is left alone)
        future[successor] = FutureSegment(frozenset(predecessors) - {segment}, frozenset(predecessors))
    ready = {t for t, f in future.items() if not f.waiting}
    unassigned = {**state.unassigned, **{t: 0 for t in ready}}
    waiting = {t: f for t, f in future.items() if t not in ready}
    beside = set().union(*(f.predecessors - f.waiting for f in waiting.values()))
    completed = {p: e for p, e in {**state.completed, segment: update.end_offset}.items() if p in beside}
    if len(set(unassigned) | set(waiting) | set(completed) | set(state.ended) | state.held) \
            > limits.READER_GROUP_SEGMENTS_MAX:
        raise InvalidArgumentError(f"a reader group holds at most {limits.READER_GROUP_SEGMENTS_MAX} segments")
    return _with_assignment(state, update.reader, mine, unassigned=_frozen(unassigned), future=_frozen(waiting),
                            completed=_frozen(completed))


def _update_distance_to_tail(state: ReaderGroupState, update: UpdateDistanceToTail) -> ReaderGroupState:
    _online(state, update.reader)
    readers = dict(state.readers)
    readers[update.reader] = ReaderInfo(readers[update.reader].heartbeat + 1, update.lag_seconds)
    return attrs.evolve(state, readers=_frozen(readers))


def _create_checkpoint(state: ReaderGroupState, update: CreateCheckpoint) -> ReaderGroupState:
    validate_name(update.name, "checkpoint name")
    if state.checkpoint(update.name) is not None:
        raise InvalidArgumentError(f"the group has a checkpoint named {update.name!r} already")
    if len(state.outstanding_checkpoints) >= limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX:
        raise CheckpointLimitError(f"{limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX} checkpoints are in progress "
                                   f"already: {[c.name for c in state.outstanding_checkpoints]}")
    positions = {**state.ended, **state.completed, **state.unassigned}
    checkpoint = CheckpointState(update.name, update.silent, state.online, _frozen(positions))
    return attrs.evolve(state, checkpoints=_kept((*state.checkpoints, checkpoint)),
                        checkpoints_created=state.checkpoints_created + 1)


def _checkpoint_reader(state: ReaderGroupState, update: CheckpointReader) -> ReaderGroupState:
    mine = _online(state, update.reader)
    owed = state.pending_checkpoint(update.reader)
    if owed is None or owed.name != update.name:
        raise InvalidArgumentError(f"reader {update.reader!r} owes checkpoint "
                                   f"{None if owed is None else owed.name!r}, not {update.name!r}")
    if set(update.positions) != set(mine):
        raise InvalidArgumentError(f"reader {update.reader!r} holds {sorted(mine)}, not {sorted(update.positions)}")
    for segment, offset in update.positions.items():
        if offset < mine[segment]:
            raise InvalidArgumentError(f"reader {update.reader!r} cannot be at {offset} in {segment!r}, before its "
                                       f"recorded offset {mine[segment]}")
    checkpoints = tuple(
        CheckpointState(c.name, c.silent, c.pending - {update.reader}, _frozen({**c.positions, **update.positions}))
        if c.name == update.name else c for c in state.checkpoints)
    return _with_assignment(state, update.reader, update.positions, checkpoints=_kept(checkpoints))


_TRANSITIONS: Final[dict[type[ReaderGroupUpdate], Callable[[ReaderGroupState, Any], ReaderGroupState]]] = {
    ReaderGroupStateInit: _state_init,
    AddReader: _add_reader,
    RemoveReader: _remove_reader,
    AcquireSegment: _acquire_segment,
    ReleaseSegment: _release_segment,
    SegmentCompleted: _segment_completed,
    UpdateDistanceToTail: _update_distance_to_tail,
    CreateCheckpoint: _create_checkpoint,
    CheckpointReader: _checkpoint_reader,
}


class ReaderGroupStateCodec:
    """The synchronizer codec of ``ReaderGroupState`` (its JSON and its updates')."""

    def encode_state(self, state: ReaderGroupState) -> Any:
        return state.to_json_object()

    def decode_state(self, value: Any) -> ReaderGroupState:
        return ReaderGroupState.from_json_object(value)

    def encode_update(self, update: ReaderGroupUpdate) -> Any:
        return update.to_json_object()

    def decode_update(self, value: Any) -> ReaderGroupUpdate:
        return ReaderGroupUpdate.from_json_object(value)

    def apply(self, state: ReaderGroupState, update: ReaderGroupUpdate) -> ReaderGroupState:
        return state.apply(update)
