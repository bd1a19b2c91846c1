"""The segment container's write path as a pure state machine: ``spec/DurableLog.tla`` in Python.

Every spec action is a function of the same name here (``Submit`` -> ``submit``, ``SealFrame`` ->
``seal_frame``, ...) that takes a state and returns the next one; the state's fields are the spec's
variables.  Nothing here does I/O, reads a clock or draws a random number.  A transition whose
spec guard is false raises ``NotEnabled``.

Bounds that the spec puts on the environment (``MaxOps``, ``MaxFailures``) are not part of the
container's behaviour; the exhaustive explorer in ``proofs/`` applies them.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator

import attrs

from millstream.model.errors import (
    ContainerUnavailableError,
    DataCorruptionError,
    InternalError,
    MillstreamError,
    NotEnabled,
)
from millstream.model.frozen_map import FrozenMap
from millstream.model.segment import (
    ContainerMetadata,
    Request,
    SegmentMetadata,
    SegmentStatus,
    apply,
    assigned_offset,
    validate,
)
from millstream.model.types import NO_OFFSET, OperationKind

__all__ = [
    "ContainerState",
    "ContainerStatus",
    "Entry",
    "FrameLayout",
    "NotEnabled",
    "OpenFrame",
    "Operation",
    "Result",
    "ResultKind",
    "complete",
    "crash",
    "fail_write",
    "initial_state",
    "operations_ending_in",
    "persist",
    "process",
    "recover",
    "seal_frame",
    "submit",
]


class ContainerStatus(enum.Enum):
    """Whether the container is running or stopped (crashed, awaiting recovery)."""

    RUNNING = "running"
    STOPPED = "stopped"

    def __repr__(self) -> str:
        return f"ContainerStatus.{self.name}"


class ResultKind(enum.Enum):
    """What the client has been told about an operation (the spec's ``results[i].r``)."""

    PENDING = "pending"
    ACKED = "acked"
    REJECTED = "rejected"
    FAILED = "failed"

    def __repr__(self) -> str:
        return f"ResultKind.{self.name}"


@attrs.frozen
class Result:
    """What the client has been told about an operation: its kind, the error (rejected, failed) or the
    offset it was given (acknowledged)."""

    kind: ResultKind
    error: type[MillstreamError] | None = None
    offset: int = NO_OFFSET


PENDING = Result(ResultKind.PENDING)
FAILED = Result(ResultKind.FAILED, ContainerUnavailableError)


@attrs.frozen(cache_hash=True)
class Operation:
    """A request with the id the container gave it and, once processed, its sequence number and
    assigned offset (the spec's ``seq`` and ``at``; 0 and NO_OFFSET until then)."""

    id: int
    request: Request
    sequence_number: int = 0
    offset: int = NO_OFFSET


@attrs.frozen(cache_hash=True)
class Entry:
    """One piece of one operation's record inside a DataFrame."""

    operation: Operation
    first: bool
    last: bool


Frame = tuple[Entry, ...]


@attrs.frozen
class OpenFrame:
    """The DataFrame being built: its entries and the units they use."""

    entries: Frame = ()
    used: int = 0


EMPTY_FRAME = OpenFrame()


@attrs.frozen
class FrameLayout:
    """A DataFrame holds ``capacity`` units; every entry costs ``entry_header`` of them."""

    capacity: int
    entry_header: int

    def __attrs_post_init__(self) -> None:
        if self.capacity <= self.entry_header:
            raise ValueError("a frame must have room for an entry header and one unit")

    def has_room(self, used: int) -> bool:
        return self.capacity - used >= self.entry_header + 1


@attrs.frozen(cache_hash=True)
class ContainerState:
    """The spec's variables (plus the constants a transition needs: layout and initial metadata)."""

    layout: FrameLayout
    initial: ContainerMetadata
    status: ContainerStatus
    queue: tuple[Operation, ...]
    submitted: int
    next_sequence_number: int
    open_frame: OpenFrame
    view: ContainerMetadata
    pending: tuple[Frame, ...]
    log: tuple[Frame, ...]
    committed: int
    unnotified: frozenset[int]
    metadata: ContainerMetadata
    results: tuple[Result, ...]
    failures: int

    def check_invariants(self) -> None:
        """The spec's invariants, evaluated on this state; raises InternalError naming the first broken."""
        for name, holds in _invariants(self):
            if not holds:
                raise InternalError(f"model invariant {name} is violated")


def initial_state(layout: FrameLayout, active_segments: Iterable[str] = ()) -> ContainerState:
    """The spec's ``Init``: a running container whose ``active_segments`` predate the log."""
    initial: ContainerMetadata = FrozenMap(
        (name, SegmentMetadata(SegmentStatus.ACTIVE)) for name in sorted(active_segments))
    return ContainerState(
        layout=layout, initial=initial, status=ContainerStatus.RUNNING, queue=(), submitted=0,
        next_sequence_number=1, open_frame=EMPTY_FRAME, view=initial, pending=(), log=(),
        committed=0, unnotified=frozenset(), metadata=initial, results=(), failures=0,
    )


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _fold(metadata: ContainerMetadata, operations: Iterable[Operation]) -> ContainerMetadata:
    for operation in operations:
        metadata = apply(metadata, operation.request, operation.id)
    return metadata


def operations_ending_in(frames: Iterable[Frame]) -> Iterator[Operation]:
    """The operations whose record ends in ``frames``, in order (the spec's ``OpsOf``)."""
    for frame in frames:
        for entry in frame:
            if entry.last:
                yield entry.operation


# --- Actions ---------------------------------------------------------------------------------------


def submit(state: ContainerState, request: Request) -> ContainerState:
    """``Submit(r)``: a client hands the container a request; it joins the queue."""
    _require(state.status is ContainerStatus.RUNNING, "Submit")
    operation = Operation(id=state.submitted + 1, request=request)
    return attrs.evolve(
        state, submitted=operation.id, queue=(*state.queue, operation), results=(*state.results, PENDING))


def process(state: ContainerState) -> ContainerState:
    """``Process``: validate the head of the queue against the chain; reject it, or serialize it."""
    _require(state.status is ContainerStatus.RUNNING and bool(state.queue), "Process")
    operation, queue = state.queue[0], state.queue[1:]
    error = validate(state.view, operation.request)
    if error is not None:
        results = _with_result(state.results, operation.id, Result(ResultKind.REJECTED, error))
        return attrs.evolve(state, queue=queue, results=results)
    operation = attrs.evolve(
        operation, sequence_number=state.next_sequence_number,
        offset=assigned_offset(state.view, operation.request))
    sealed, open_frame = _pack(state.layout, state.open_frame, operation)
    return attrs.evolve(
        state, queue=queue, pending=state.pending + sealed, open_frame=open_frame,
        view=apply(state.view, operation.request, operation.id),
        next_sequence_number=state.next_sequence_number + 1)


def seal_frame(state: ContainerState) -> ContainerState:
    """``SealFrame``: seal the partly filled frame and hand it to Tier 1."""
    _require(state.status is ContainerStatus.RUNNING and bool(state.open_frame.entries), "SealFrame")
    return attrs.evolve(state, pending=(*state.pending, state.open_frame.entries), open_frame=EMPTY_FRAME)


def persist(state: ContainerState) -> ContainerState:
    """``Persist``: Tier 1 makes the oldest in-flight frame durable."""
    _require(state.status is ContainerStatus.RUNNING and bool(state.pending), "Persist")
    return attrs.evolve(
        state, log=(*state.log, state.pending[0]), pending=state.pending[1:],
        unnotified=state.unnotified | {len(state.log) + 1})


def complete(state: ContainerState, frame_number: int) -> ContainerState:
    """``Complete(k)``: the notice for durable frame k commits every frame up to k, from the head."""
    _require(state.status is ContainerStatus.RUNNING and frame_number in state.unnotified, "Complete")
    unnotified = state.unnotified - {frame_number}
    if frame_number <= state.committed:
        return attrs.evolve(state, unnotified=unnotified)  # a late notice: already covered
    done = list(operations_ending_in(state.log[state.committed:frame_number]))
    results = list(state.results)
    for operation in done:
        results[operation.id - 1] = Result(ResultKind.ACKED, offset=operation.offset)
    return attrs.evolve(
        state, unnotified=unnotified, metadata=_fold(state.metadata, done), committed=frame_number,
        results=tuple(results))


def _stop(state: ContainerState) -> ContainerState:
    results = tuple(FAILED if result.kind is ResultKind.PENDING else result for result in state.results)
    return attrs.evolve(
        state, status=ContainerStatus.STOPPED, failures=state.failures + 1, results=results, queue=(),
        open_frame=EMPTY_FRAME, pending=(), unnotified=frozenset(), view=state.metadata)


def fail_write(state: ContainerState) -> ContainerState:
    """``FailWrite``: a Tier-1 write fails; everything unacknowledged fails and the container stops."""
    _require(
        state.status is ContainerStatus.RUNNING
        and (bool(state.pending) or any(k > state.committed for k in state.unnotified)),
        "FailWrite")
    return _stop(state)


def crash(state: ContainerState) -> ContainerState:
    """``Crash``: the process dies; only the durable log remains."""
    _require(state.status is ContainerStatus.RUNNING, "Crash")
    return _stop(state)


def recover(state: ContainerState) -> ContainerState:
    """``Recover``: rebuild the metadata by replaying the durable log.

    Raises ``DataCorruptionError`` if an operation in the log is not valid where it stands (the
    spec's ``LogReplaysCleanly`` says this cannot happen).
    """
    _require(state.status is ContainerStatus.STOPPED, "Recover")
    metadata = state.initial
    for operation in operations_ending_in(state.log):
        if validate(metadata, operation.request) is not None or (
                assigned_offset(metadata, operation.request) != operation.offset):
            raise DataCorruptionError(f"operation {operation.sequence_number} does not replay")
        metadata = apply(metadata, operation.request, operation.id)
    sequence_numbers = [entry.operation.sequence_number for frame in state.log for entry in frame]
    return attrs.evolve(
        state, status=ContainerStatus.RUNNING, metadata=metadata, view=metadata, committed=len(state.log),
        next_sequence_number=max(sequence_numbers, default=0) + 1)


# --- Helpers ---------------------------------------------------------------------------------------


def _with_result(results: tuple[Result, ...], operation_id: int, result: Result) -> tuple[Result, ...]:
    return (*results[: operation_id - 1], result, *results[operation_id:])


def _pack(layout: FrameLayout, frame: OpenFrame, operation: Operation) -> tuple[tuple[Frame, ...], OpenFrame]:
    """Serialize ``operation`` starting in ``frame`` (the spec's ``Pack``): the frames that filled
    up, in order, and the frame left open."""
    sealed: list[Frame] = []
    remaining, first = operation.request.size, True
    while True:
        piece = min(remaining, layout.capacity - frame.used - layout.entry_header)
        last = piece == remaining
        frame = OpenFrame((*frame.entries, Entry(operation, first, last)),
                          frame.used + layout.entry_header + piece)
        if not last:
            sealed.append(frame.entries)
            frame, remaining, first = EMPTY_FRAME, remaining - piece, False
            continue
        if layout.has_room(frame.used):
            return tuple(sealed), frame
        sealed.append(frame.entries)
        return tuple(sealed), EMPTY_FRAME


# --- Invariants (the spec's, in Python) -------------------------------------------------------------


def _invariants(state: ContainerState) -> Iterator[tuple[str, bool]]:
    running = state.status is ContainerStatus.RUNNING
    committed_frames = state.log[: state.committed]
    committed_ops = list(operations_ending_in(committed_frames))
    yield "TypeOK", (0 <= state.committed <= len(state.log) and state.layout.has_room(state.open_frame.used)
                     and len(state.results) == state.submitted)
    yield "NothingVisibleBeforeDurable", all(k <= len(state.log) for k in state.unnotified)
    yield "VisibleIsFoldOfCommitted", not running or state.metadata == _fold(state.initial, committed_ops)
    uncommitted = (*state.log[state.committed:], *state.pending, state.open_frame.entries)
    yield "ViewIsChain", not running or state.view == _fold(state.metadata, operations_ending_in(uncommitted))
    entries = [entry for frame in (*state.log, *state.pending, state.open_frame.entries) for entry in frame]
    yield "SequenceNumbersIncrease", (
        all(entry.operation.sequence_number < state.next_sequence_number for entry in entries)
        and all(
            (later.operation.sequence_number > earlier.operation.sequence_number) if later.first
            else later.operation == earlier.operation
            for earlier, later in itertools.pairwise(entries)))
    yield "LogReplaysCleanly", _replays_cleanly(state)
    acked = {op.id: op.offset for op in committed_ops if state.results[op.id - 1].kind is ResultKind.ACKED}
    yield "AckedAreDurable", (
        all(acked.get(i + 1) == result.offset for i, result in enumerate(state.results)
            if result.kind is ResultKind.ACKED)
        and all(state.results[op.id - 1].kind in (ResultKind.ACKED, ResultKind.FAILED) for op in committed_ops))
    yield "AckedAppendsReadable", _acked_appends_readable(state, committed_ops)
    yield "StartWithinLength", all(segment.start_offset <= segment.length
                                   for metadata in (state.metadata, state.view) for segment in metadata.values())


def _replays_cleanly(state: ContainerState) -> bool:
    metadata = state.initial
    for operation in operations_ending_in(state.log):
        if validate(metadata, operation.request) is not None:
            return False
        if assigned_offset(metadata, operation.request) != operation.offset:
            return False
        metadata = apply(metadata, operation.request, operation.id)
    return True


def _acked_appends_readable(state: ContainerState, committed_ops: list[Operation]) -> bool:
    for index, operation in enumerate(committed_ops):
        request = operation.request
        if request.kind is not OperationKind.APPEND or not request.data:
            continue
        if state.results[operation.id - 1].kind is not ResultKind.ACKED:
            continue
        later = committed_ops[index + 1:]
        if any((op.request.kind in (OperationKind.DELETE, OperationKind.CREATE)
                and op.request.segment == request.segment)
               or (op.request.kind is OperationKind.MERGE and op.request.source == request.segment)
               for op in later):
            continue
        segment = state.metadata.get(request.segment)
        if segment is None or _run_at(segment, operation.offset) != (operation.id, request.data):
            return False
        # Readable relative to the start, unless the client truncated beyond it later.
        if segment.start_offset > operation.offset and not any(
                op.request.kind is OperationKind.TRUNCATE and op.request.segment == request.segment
                and op.request.offset > operation.offset for op in later):
            return False
    return True


def _run_at(segment: SegmentMetadata, offset: int) -> tuple[int, bytes] | None:
    position = 0
    for run in segment.runs:
        if position == offset:
            return run.operation_id, run.data
        position += len(run.data)
    return None
