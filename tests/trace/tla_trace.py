"""Turning recorded implementation traces into a TLA+ module for ``spec/TraceDurableLog.tla``."""

from __future__ import annotations

import shutil
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from millstream.testing.tracing import TraceEvent
from proofs.tlc import SPEC_DIR, TlcOutcome, run_tlc

__all__ = ["ERROR_NAMES", "check_trace", "trace_module"]

NO_SEGMENT = "none"

#: The spec's names for the implementation's rejection errors.
ERROR_NAMES = {
    "StreamSegmentNotExistsError": "not_exists",
    "StreamSegmentMergedError": "merged",
    "StreamSegmentExistsError": "exists",
    "StreamSegmentSealedError": "sealed",
    "BadOffsetError": "bad_offset",
    "StreamSegmentNotSealedError": "not_sealed",
    "StreamSegmentTruncatedError": "truncated",
}


def tla(value: Any) -> str:
    """A Python value as a TLA+ expression (dicts are records, sets are sets, lists/tuples sequences)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "[" + ", ".join(f"{key} |-> {tla(item)}" for key, item in value.items()) + "]"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(tla(item) for item in value)) + "}"
    if isinstance(value, (list, tuple)):
        return "<<" + ",\n   ".join(tla(item) for item in value) + ">>"
    raise TypeError(f"cannot write {value!r} as TLA+")


def _records(events: Sequence[TraceEvent]) -> tuple[list[dict[str, Any]], set[str], int, int]:
    """The trace as TLA+ records, the segment names it uses, its operations and its stops."""
    records: list[dict[str, Any]] = []
    segments: set[str] = set()
    queue: deque[dict[str, Any]] = deque()
    ids_by_sequence: dict[int, int] = {}
    operations = stops = 0
    for event in events:
        fields = event.fields
        if event.action == "Submit":
            operations += 1
            request = {"kind": fields["kind"], "seg": fields["segment"] or NO_SEGMENT,
                       "src": fields["source"] or NO_SEGMENT, "len": fields["length"], "off": fields["offset"],
                       "size": 1}
            segments.update(name for name in (fields["segment"], fields["source"]) if name)
            record = {"a": "Submit", "req": request, "id": operations}
            queue.append(record)
            records.append(record)
        elif event.action == "Process":
            submitted = queue.popleft()
            if fields["error"] is None:
                submitted["req"]["size"] = fields["size"]  # the size is known once it is serialized
                ids_by_sequence[fields["sequence_number"]] = submitted["id"]
                records.append({"a": "Process", "err": "ok", "seq": fields["sequence_number"],
                                "at": fields["offset"]})
            else:
                records.append({"a": "Process", "err": ERROR_NAMES[fields["error"]], "seq": 0, "at": -1})
        elif event.action in ("SealFrame", "Persist"):
            records.append({"a": event.action, "frame": fields["frame"]})
        elif event.action == "Complete":
            acked = {ids_by_sequence[sequence] for sequence in fields["acked"]}
            records.append({"a": "Complete", "frame": fields["frame"], "acked": acked})
        elif event.action in ("FailWrite", "Crash"):
            stops += 1
            queue.clear()
            records.append({"a": event.action})
        elif event.action == "Recover":
            records.append({"a": "Recover"})
        else:
            raise ValueError(f"unknown trace event {event}")
    for record in records:
        record.pop("id", None)
    return records, segments, operations, stops


def trace_module(traces: Sequence[Sequence[TraceEvent]], *, frame_capacity: int, entry_header: int) -> str:
    """The ``TraceData`` module for ``TraceDurableLog`` holding ``traces``."""
    converted = [_records(events) for events in traces]
    segments = set().union(*(c[1] for c in converted)) or {"unused"}
    requests = {tla(record["req"]) for c in converted for record in c[0] if record["a"] == "Submit"}
    max_ops = max((c[2] for c in converted), default=0)
    max_failures = max((c[3] for c in converted), default=0)
    runs = ",\n".join(tla(c[0]) for c in converted)
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceSegments == {tla(segments)}
TraceInitiallyActive == {{}}
TraceRequests == {{{", ".join(sorted(requests))}}}
TraceMaxOps == {max_ops}
TraceFrameCapacity == {frame_capacity}
TraceEntryHeader == {entry_header}
TraceMaxFailures == {max_failures}
Traces == <<{runs}>>
====
"""


TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
    Segments <- TraceSegments
    InitiallyActive <- TraceInitiallyActive
    Requests <- TraceRequests
    MaxOps <- TraceMaxOps
    FrameCapacity <- TraceFrameCapacity
    EntryHeader <- TraceEntryHeader
    MaxFailures <- TraceMaxFailures
INVARIANTS
    TypeOK
    NothingVisibleBeforeDurable
    VisibleIsFoldOfCommitted
    ViewIsChain
    SequenceNumbersIncrease
    LogReplaysCleanly
    AckedAreDurable
    AckedAppendsReadable
    StartWithinLength
"""


def check_trace(workdir: Path, module: str, trace_data: str, cfg: str) -> TlcOutcome:
    """TLC over ``spec/<module>.tla`` (a Trace module) in ``workdir``: every spec copied there, the
    recorded runs as the ``TraceData`` module ``trace_data``, the configuration text ``cfg``; deadlock
    checking on, so a run the spec cannot follow is rejected.  Shared by every trace validation."""
    for path in SPEC_DIR.glob("*.tla"):
        shutil.copy(path, workdir / path.name)
    (workdir / "TraceData.tla").write_text(trace_data)
    (workdir / "trace.cfg").write_text(cfg)
    return run_tlc(workdir, module, "trace.cfg", check_deadlock=True)
