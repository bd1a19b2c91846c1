"""Turning recorded transaction runs (``transaction_driver``) into the ``TraceData`` module that
``spec/TraceTransactions.tla`` reads.

Each run's events become the spec's actions, one record each (``a`` names the action), carrying the
values the implementation reported for TLC to compare with the spec's:

==========================  =====================================================================
recorded                    spec action(s)
==========================  =====================================================================
record ``txn_created``      ``Begin(t)``: its epoch, open time, deadline (ticks), positions
``WriteEvent``              ``WriteEvent(t, k)``
record ``txn_pinged``       ``Ping(t)``: the new deadline
``Tick``                    ``Tick``
record ``txns_committing``  ``Commit(t)`` for each listed transaction -- or, with a fence, the
                            fenced decision the controller reported planning (``DecideFencedCommit``)
record ``txns_aborting``    ``Abort(t)`` (reason client), ``ExpireLease(t)`` for each (lease), or the
                            fenced decision (fenced)
record ``txn_aborted``      ``FinishAbort(t)``
record ``commit_started``   ``StartCommit(t)``: the target epoch (the active one or a roll's duplicate)
``Merged``                  ``MergeTxnSegment(p)``: the transaction, the target epoch, the events
record ``commit_completed`` ``FinishCommit`` -- of a commit that rolls, at ``roll_epochs_created``
                            instead (see below), ``commit_completed`` then being a step inside it
record ``epoch_created``    ``Scale`` (the other records of a scale are steps inside it)
``WritePlainEvent``         ``WritePlainEvent(k)``
``CrashController``         ``CrashController``
``RestartController``       ``RestartController``
``RequestFencedCommit``     ``RequestFencedCommit(r)``: the value the controller read
``DecideFencedCommit``      (``ReadFence(i)`` if the value it planned against is not the one the spec
                            has the request holding, then) ``DecideFencedCommit(i)`` -- at once if it
                            records nothing, else when its record lands: outcome, what it committed
                            and aborted
``Observe``                 a step that changes nothing and compares the store's contents
==========================  =====================================================================

A rolled commit finishes in two records: ``roll_epochs_created`` makes the roll's epochs part of the
history (the new active epoch is the stream's current one from then on: a transaction begun after it
begins there), then the old active epoch is sealed and ``commit_completed`` marks the transaction
COMMITTED.  The spec's ``FinishCommit`` is one step; it is mapped to the first record, where the
stream's epochs change, and the second is bookkeeping that changes nothing the runs observe: the
``Observe`` steps come only at quiet moments, and plain writes only while no commit workflow runs
(``transaction_driver``) -- a plain write landing in the old active epoch between the two records
would be one the spec does not have there (it puts writes after ``FinishCommit`` in the new epoch;
readers see no difference until the commit is COMMITTED, but the trace could not be matched).

Transactions are numbered as they begin, events ``[src, key, n]`` as the spec writes them (the
plain writer's source is 0), times in ticks since the run began, epochs from 1.  Everything of
another stream, and every other record type, is not a transaction step and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from millstream.client import routing_key_fraction
from millstream.naming import (
    TRANSACTION_DELIMITER,
    parse_stream_segment_name,
    segment_id_parts,
    stream_segment_name,
)
from millstream.testing.tracing import TraceEvent
from tests.trace.tla_trace import tla
from tests.trace.transaction_driver import KEYS, LEASE_TICKS, SCOPE, START_TIME, STREAM, TICK_SECONDS

__all__ = ["TRACE_CFG_NAME", "TraceConversionError", "trace_module", "trace_steps"]

TRACE_CFG_NAME = "TraceTransactions.cfg"
PLAIN_WRITER = 0


class TraceConversionError(AssertionError):
    """The recorded run cannot be written as spec steps at all (the recording itself is inconsistent)."""


def _ticks(seconds: float) -> int:
    ticks = (float(seconds) - START_TIME) / TICK_SECONDS
    if ticks != int(ticks):
        raise TraceConversionError(f"time {seconds} is not a whole number of ticks after the start")
    return int(ticks)


def _epoch_of(segment_name: str) -> int:
    """The spec's epoch (from 1) of a stream segment: every segment is created in its own epoch."""
    return segment_id_parts(parse_stream_segment_name(segment_name)[2])[0] + 1


def _layout(epoch: Mapping[str, Any]) -> list[set[str]]:
    """An epoch record's segments as the spec's layout: which keys each segment owns, by position."""
    segments = sorted((float(start), float(end)) for _, start, end in epoch["segments"])
    return [{k for k in KEYS if start <= routing_key_fraction(k) < end} for start, end in segments]


class _Converter:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.layouts: list[list[set[str]]] = []
        self.txn_of: dict[str, int] = {}  # transaction id (hex) -> t
        self.parents: dict[str, list[str]] = {}  # hex -> its epoch's segment names, by position
        self.written: dict[int, int] = {}
        self.plain = 0
        self.ticks = 0
        self.crashes = 0
        self.sent = 0
        self.inbox: list[list[Any]] = []  # [request, seen] as the spec's inbox holds them
        self.planned: dict[str, Any] | None = None  # a fenced decision waiting for its record to land
        self.scale_epoch: Mapping[str, Any] | None = None
        self.requests: set[tuple[frozenset[int], str, int]] = set()
        self.committing: str | None = None  # the transaction whose commit started and has not completed
        self.finished = False  # whether its FinishCommit is in the steps already (a roll's epochs created)

    def t(self, hex_id: str) -> int:
        if hex_id not in self.txn_of:
            raise TraceConversionError(f"transaction {hex_id} was never begun in this run")
        return self.txn_of[hex_id]

    def event(self, payload: str) -> dict[str, Any]:
        source, key, number = payload.split("|")
        return {"src": PLAIN_WRITER if source == "plain" else self.t(source), "key": key, "n": int(number)}

    def add(self, action: str, **fields: Any) -> None:
        self.steps.append({"a": action, **fields})

    # --- Events -----------------------------------------------------------------------------------

    def convert(self, events: Sequence[TraceEvent]) -> None:
        for event in events:
            handler = getattr(self, f"on_{event.action}", None)
            if handler is None:
                raise TraceConversionError(f"unknown trace event {event}")
            handler(**event.fields)
        if not self.layouts:
            raise TraceConversionError("the run never created its stream")

    # (The handlers are named after the events they take.)

    def on_Record(self, record: Mapping[str, Any]) -> None:
        if (record.get("scope"), record.get("stream")) != (SCOPE, STREAM):
            return
        handler = getattr(self, f"record_{record['type']}", None)
        if handler is not None:
            handler(record)

    def on_WriteEvent(self, txn: str, key: str, number: int) -> None:
        t = self.t(txn)
        self.written[t] = self.written.get(t, 0) + 1
        if number != self.written[t]:
            raise TraceConversionError(f"event {number} of transaction {t} recorded as its {self.written[t]}th")
        self.add("WriteEvent", t=t, k=key)

    def on_WritePlainEvent(self, key: str, number: int) -> None:
        self.plain += 1
        if number != self.plain:
            raise TraceConversionError(f"plain event {number} recorded as the {self.plain}th")
        self.add("WritePlainEvent", k=key)

    def on_Tick(self) -> None:
        self.ticks += 1
        self.add("Tick")

    def on_CrashController(self, at: str, landed: bool) -> None:
        self.crashes += 1
        self.inbox.clear()
        self.planned = None
        self.add("CrashController")

    def on_RestartController(self) -> None:
        self.add("RestartController")

    def on_Merged(self, target: str, source: str, content: Sequence[str]) -> None:
        parent, _, hex_id = source.rpartition(TRANSACTION_DELIMITER)
        t = self.t(hex_id)
        self.add("MergeTxnSegment", t=t, p=self.parents[hex_id].index(parent) + 1, target=_epoch_of(target),
                 content=[self.event(p) for p in content])

    def on_RequestFencedCommit(self, request: int, scope: str, stream: str, txns: Sequence[str], key: str,
                               value: int, seen: int) -> None:
        if (scope, stream) != (SCOPE, STREAM):
            return
        listed = frozenset(self.t(h) for h in txns)
        self.requests.add((listed, key, value))
        self.sent += 1
        self.inbox.append([request, seen])
        self.add("RequestFencedCommit", txns=set(listed), key=key, value=value, seen=seen)

    def on_DecideFencedCommit(self, request: int, outcome: str, seen: int, recorded: bool) -> None:
        decision = {"request": request, "outcome": outcome, "seen": seen}
        if recorded:
            self.planned = decision  # (a plan made again after a conflict replaces the last one)
        else:
            self.decide(decision, set(), set())

    def on_Observe(self, epochs: Sequence[Mapping[str, Any]], current: int, statuses: Mapping[str, str],
                   fences: Mapping[str, int]) -> None:
        if set(statuses) != set(self.txn_of):
            raise TraceConversionError(f"the controller knows transactions {sorted(statuses)}, the trace "
                                       f"{sorted(self.txn_of)}")
        by_t = sorted((self.t(h), status) for h, status in statuses.items())
        self.add("Observe",
                 epochs=[{"segs": [[self.event(p) for p in segment] for segment in epoch["segments"]],
                          "sealed": _sealed(epoch["sealed"])} for epoch in epochs],
                 active=current + 1, status=[status for _, status in by_t],
                 fences=[{"key": k, "value": v} for k, v in sorted(fences.items())])

    # --- The fenced multi-commit ----------------------------------------------------------------------

    def decide(self, decision: Mapping[str, Any], committing: set[int], aborting: set[int]) -> None:
        index = next((n for n, (request, _) in enumerate(self.inbox, start=1) if request == decision["request"]),
                     None)
        if index is None:
            raise TraceConversionError(f"a decision on request {decision['request']}, which is not waiting")
        if self.inbox[index - 1][1] != decision["seen"]:
            self.inbox[index - 1][1] = decision["seen"]
            self.add("ReadFence", i=index, seen=decision["seen"])
        del self.inbox[index - 1]
        self.add("DecideFencedCommit", i=index, seen=decision["seen"], outcome=decision["outcome"],
                 committing=committing, aborting=aborting)

    def landed_decision(self, record: Mapping[str, Any], outcome: str) -> Mapping[str, Any]:
        decision, self.planned = self.planned, None
        if decision is None or decision["outcome"] != outcome:
            raise TraceConversionError(f"a fenced {record['type']} record landed, the controller planned {decision}")
        return decision

    # --- Records ----------------------------------------------------------------------------------------

    def record_stream_created(self, record: Mapping[str, Any]) -> None:
        self.layouts.append(_layout(record["epoch"]))

    def record_scale_started(self, record: Mapping[str, Any]) -> None:
        self.scale_epoch = record["epoch"]

    def record_epoch_created(self, record: Mapping[str, Any]) -> None:
        if self.scale_epoch is None:
            raise TraceConversionError("epoch_created without scale_started")
        self.layouts.append(_layout(self.scale_epoch))
        self.scale_epoch = None
        self.add("Scale")

    def record_txn_created(self, record: Mapping[str, Any]) -> None:
        hex_id = record["txn"]
        self.txn_of[hex_id] = t = len(self.txn_of) + 1
        segments = sorted(record["segments"], key=lambda s: float(s[1]))
        self.parents[hex_id] = [stream_segment_name(SCOPE, STREAM, int(s[0])) for s in segments]
        self.add("Begin", t=t, epoch=int(record["epoch"]) + 1, opened=_ticks(record["opened"]),
                 deadline=_ticks(record["deadline"]), positions=len(segments))

    def record_txn_pinged(self, record: Mapping[str, Any]) -> None:
        self.add("Ping", t=self.t(record["txn"]), deadline=_ticks(record["deadline"]))

    def record_txns_committing(self, record: Mapping[str, Any]) -> None:
        listed = [self.t(h) for h in record["txns"]]
        if record.get("fence") is None:
            for t in listed:
                self.add("Commit", t=t)
            return
        self.decide(self.landed_decision(record, "committed"), set(listed), set())

    def record_txns_aborting(self, record: Mapping[str, Any]) -> None:
        listed = [self.t(h) for h in record["txns"]]
        reason = record["reason"]
        if reason == "fenced":
            self.decide(self.landed_decision(record, "already_committed"), set(), set(listed))
        elif reason in ("client", "lease"):
            for t in listed:
                self.add("Abort" if reason == "client" else "ExpireLease", t=t)
        else:
            raise TraceConversionError(f"transactions aborted for a reason the runs never cause: {reason!r}")

    def record_txn_aborted(self, record: Mapping[str, Any]) -> None:
        self.add("FinishAbort", t=self.t(record["txn"]))

    def record_commit_started(self, record: Mapping[str, Any]) -> None:
        roll = record["roll"]
        target = int(roll["duplicate"]["epoch"]) + 1 if roll is not None else \
            segment_id_parts(int(record["targets"][0]))[0] + 1
        self.add("StartCommit", t=self.t(record["txn"]), target=target)
        self.committing = record["txn"]
        self.finished = False

    def record_roll_epochs_created(self, record: Mapping[str, Any]) -> None:
        if self.committing is None:
            raise TraceConversionError("roll_epochs_created without commit_started")
        self.add("FinishCommit", t=self.t(self.committing))
        self.finished = True

    def record_commit_completed(self, record: Mapping[str, Any]) -> None:
        if record["txn"] != self.committing:
            raise TraceConversionError(f"commit_completed of {record['txn']}, started {self.committing}")
        if not self.finished:
            self.add("FinishCommit", t=self.t(record["txn"]))
        self.committing = None


def _sealed(flags: Sequence[bool]) -> bool | str:
    """An epoch's segments are all sealed or none is, in the spec; "partly" (which the spec's
    ``sealed`` never equals, so TLC rejects the step) if the store says otherwise."""
    return flags[0] if all(flag == flags[0] for flag in flags) else "partly"


def trace_steps(events: Sequence[TraceEvent]) -> list[dict[str, Any]]:
    """One run's spec steps, as ``Traces[run]`` holds them (``a`` names the action)."""
    converter = _Converter()
    converter.convert(events)
    return converter.steps


def trace_module(runs: Sequence[Sequence[TraceEvent]]) -> str:
    """The ``TraceData`` module for ``TraceTransactions`` holding ``runs``."""
    converted = []
    for events in runs:
        converter = _Converter()
        converter.convert(events)
        converted.append(converter)
    layouts: list[list[set[str]]] = []
    first: list[int] = []
    for converter in converted:
        first.append(len(layouts) + 1)
        layouts += converter.layouts
    requests = {(listed, key, value) for c in converted for listed, key, value in c.requests}
    fenced = "{" + ", ".join(sorted(tla({"txns": set(listed), "key": key, "value": value})
                                    for listed, key, value in requests)) + "}"
    runs_tla = ",\n".join(tla(c.steps) for c in converted)
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceKeys == {tla(set(KEYS))}
TraceLayouts == {tla(layouts)}
TraceFirstLayout == {tla(first)}
TraceNumTxns == {max((len(c.txn_of) for c in converted), default=0)}
TraceMaxTxnEvents == {max((n for c in converted for n in c.written.values()), default=0)}
TraceMaxPlainEvents == {max((c.plain for c in converted), default=0)}
TraceLease == {LEASE_TICKS}
TraceMaxTime == {max((c.ticks for c in converted), default=0)}
TraceMaxCrashes == {max((c.crashes for c in converted), default=0)}
TraceFencedRequests == {fenced}
TraceMaxFencedRequests == {max((c.sent for c in converted), default=0)}
Traces == <<{runs_tla}>>
====
"""
