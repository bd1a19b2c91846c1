"""The Python model of ``DurableLog`` set up exactly as a TLC configuration sets up the spec.

``Configuration`` carries the spec's constants; ``successors`` enumerates every enabled action
instance of the model the way ``Next`` does (one successor per enabled instance, labelled with the
spec action's name); ``project`` maps a model state onto the value TLC prints for the same state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import durable_log as dl
from millstream.model.errors import (
    BadOffsetError,
    ContainerUnavailableError,
    MillstreamError,
    StreamSegmentExistsError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentNotSealedError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
)
from millstream.model.segment import ContainerMetadata, Request
from millstream.model.types import NO_OFFSET, OperationKind
from proofs.tla_values import Record, record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "Segments, InitiallyActive, Requests, MaxOps, FrameCapacity, EntryHeader, MaxFailures"

NO_SEGMENT = "none"

#: The spec's error names for the model's error classes.
ERROR_NAMES: dict[type[MillstreamError] | None, str] = {
    None: "ok",
    StreamSegmentNotExistsError: "not_exists",
    StreamSegmentMergedError: "merged",
    StreamSegmentExistsError: "exists",
    StreamSegmentSealedError: "sealed",
    BadOffsetError: "bad_offset",
    StreamSegmentNotSealedError: "not_sealed",
    StreamSegmentTruncatedError: "truncated",
    ContainerUnavailableError: "unavailable",
}


@dataclass(frozen=True)
class Configuration:
    """The constants of one TLC configuration, read from what TLC itself printed."""

    segments: frozenset[str]
    initially_active: frozenset[str]
    requests: tuple[Record, ...]
    max_ops: int
    frame_capacity: int
    entry_header: int
    max_failures: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        """From the tuple ``<<Segments, InitiallyActive, Requests, MaxOps, FrameCapacity,
        EntryHeader, MaxFailures>>`` as parsed from TLC's output."""
        segments, active, requests, max_ops, capacity, header, failures = printed
        ordered = tuple(sorted(requests, key=repr))
        return cls(frozenset(segments), frozenset(active), ordered, max_ops, capacity, header, failures)

    @property
    def frame_numbers(self) -> range:
        return range(1, self.max_ops * max(r["size"] for r in self.requests) + 1)


def _request(spec_request: Record, operation_id: int) -> Request:
    """The model request for a spec request submitted as operation ``operation_id``.  Data bytes are
    labelled with the operation id, as the spec labels a run."""
    source = spec_request["src"]
    return Request(
        kind=OperationKind(spec_request["kind"]),
        segment="" if spec_request["seg"] == NO_SEGMENT else spec_request["seg"],
        source=None if source == NO_SEGMENT else source,
        data=bytes([operation_id]) * spec_request["len"],
        offset=spec_request["off"],
        size=spec_request["size"],
    )


def check(state: dl.ContainerState) -> None:
    state.check_invariants()


def initial_states(config: Configuration) -> list[dl.ContainerState]:
    layout = dl.FrameLayout(config.frame_capacity, config.entry_header)
    return [dl.initial_state(layout, config.initially_active)]


def successors(config: Configuration, state: dl.ContainerState) -> Iterator[tuple[str, dl.ContainerState]]:
    """Every enabled instance of ``Next``, in no particular order."""
    running = state.status is dl.ContainerStatus.RUNNING
    if running and state.submitted < config.max_ops:
        for spec_request in config.requests:
            yield "Submit", dl.submit(state, _request(spec_request, state.submitted + 1))
    if running and state.queue:
        yield "Process", dl.process(state)
    if running and state.open_frame.entries:
        yield "SealFrame", dl.seal_frame(state)
    if running and state.pending:
        yield "Persist", dl.persist(state)
    if running:
        assert all(k in config.frame_numbers for k in state.unnotified), "FrameNumbers bound too small"
        for frame_number in sorted(state.unnotified):
            yield "Complete", dl.complete(state, frame_number)
    if running and state.failures < config.max_failures:
        if state.pending or any(k > state.committed for k in state.unnotified):
            yield "FailWrite", dl.fail_write(state)
        yield "Crash", dl.crash(state)
    if not running:
        yield "Recover", dl.recover(state)


# --- Projection onto the spec's variables ----------------------------------------------------------


def _operation(operation: dl.Operation) -> Record:
    request = operation.request
    return record(
        kind=request.kind.value, seg=request.segment or NO_SEGMENT, src=request.source or NO_SEGMENT,
        len=len(request.data), off=request.offset, size=request.size,
        id=operation.id, seq=operation.sequence_number, at=operation.offset)


def _frame(frame: dl.Frame) -> tuple[Record, ...]:
    return tuple(record(op=_operation(e.operation), first=e.first, last=e.last) for e in frame)


def _metadata(config: Configuration, metadata: ContainerMetadata) -> Record:
    segments = {}
    for name in config.segments:
        segment = metadata.get(name)
        if segment is None:
            segments[name] = record(state="absent", start=0, data=())
        else:
            runs = tuple(record(id=run.operation_id, len=len(run.data)) for run in segment.runs)
            segments[name] = record(state=segment.status.value, start=segment.start_offset, data=runs)
    return record(**segments)


def _result(result: dl.Result) -> Record:
    return record(r=result.kind.value, err=ERROR_NAMES[result.error], at=result.offset)


def project(config: Configuration, state: dl.ContainerState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    results = [_result(r) for r in state.results]
    results += [record(r="none", err="ok", at=NO_OFFSET)] * (config.max_ops - len(results))
    return {
        "status": state.status.value,
        "queue": tuple(_operation(op) for op in state.queue),
        "submitted": state.submitted,
        "nextSeq": state.next_sequence_number,
        "open": record(entries=_frame(state.open_frame.entries), used=state.open_frame.used),
        "view": _metadata(config, state.view),
        "pending": tuple(_frame(f) for f in state.pending),
        "log": tuple(_frame(f) for f in state.log),
        "committed": state.committed,
        "unnotified": frozenset(state.unnotified),
        "meta": _metadata(config, state.metadata),
        "results": tuple(results),
        "failures": state.failures,
    }
