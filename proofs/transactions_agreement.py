"""The Python model of ``Transactions`` set up exactly as a TLC configuration sets up the spec.

``successors`` tries every instance of ``Next`` on the model -- a transition that raises
``NotEnabled`` is not a successor, so the model's own guards decide what is enabled -- and applies
the spec's bounds on the environment (``MaxTxnEvents``, ``MaxPlainEvents``, ``MaxTime``,
``MaxCrashes``, ``MaxFencedRequests``) here, as ``Next`` does.  ``project`` maps a model state onto
the value TLC prints for the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import transactions as tx
from proofs.tla_values import Record, record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = ("Keys, Layouts, NumTxns, MaxTxnEvents, MaxPlainEvents, Lease, MaxTime, MaxCrashes, "
             "FencedRequests, MaxFencedRequests")


@dataclass(frozen=True)
class Configuration:
    setup: tx.StreamSetup
    num_txns: int
    max_txn_events: int
    max_plain_events: int
    max_time: int
    max_crashes: int
    fenced_requests: tuple[tx.FencedRequest, ...]
    max_fenced_requests: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        (keys, layouts, num_txns, max_txn_events, max_plain_events, lease, max_time, max_crashes,
         requests, max_requests) = printed
        setup = tx.StreamSetup(tuple(tuple(frozenset(part) for part in layout) for layout in layouts), lease)
        assert setup.keys == frozenset(keys)
        fenced = tuple(sorted((tx.FencedRequest(frozenset(r["txns"]), r["key"], r["value"]) for r in requests),
                              key=repr))
        return cls(setup, num_txns, max_txn_events, max_plain_events, max_time, max_crashes, fenced, max_requests)

    @property
    def fence_keys(self) -> frozenset[str]:
        return frozenset(request.key for request in self.fenced_requests)


def initial_states(config: Configuration) -> list[tx.TransactionsState]:
    return [tx.initial_state(config.setup, config.num_txns, config.fence_keys)]


def successors(config: Configuration, state: tx.TransactionsState) -> Iterator[tuple[str, tx.TransactionsState]]:
    """Every enabled instance of ``Next``."""
    keys = sorted(config.setup.keys)
    attempts: list[tuple[str, Callable[[], tx.TransactionsState]]] = []
    for t in state.txn_ids:
        attempts.append(("Begin", lambda t=t: tx.begin(state, t)))
        if len(state.transaction(t).written()) < config.max_txn_events:
            attempts += [("WriteEvent", lambda t=t, k=k: tx.write_event(state, t, k)) for k in keys]
        attempts += [
            ("Ping", lambda t=t: tx.ping(state, t)),
            ("ExpireLease", lambda t=t: tx.expire_lease(state, t)),
            ("Commit", lambda t=t: tx.commit(state, t)),
            ("Abort", lambda t=t: tx.abort(state, t)),
            ("FinishAbort", lambda t=t: tx.finish_abort(state, t)),
            ("StartCommit", lambda t=t: tx.start_commit(state, t)),
        ]
    attempts += [("MergeTxnSegment", lambda i=i: tx.merge_txn_segment(state, i)) for i in config.setup.positions]
    attempts += [("FinishCommit", lambda: tx.finish_commit(state)), ("Scale", lambda: tx.scale(state))]
    if state.clock < config.max_time:
        attempts.append(("Tick", lambda: tx.tick(state)))
    if state.plain < config.max_plain_events:
        attempts += [("WritePlainEvent", lambda k=k: tx.write_plain_event(state, k)) for k in keys]
    if state.crashes < config.max_crashes:
        attempts.append(("CrashController", lambda: tx.crash_controller(state)))
    attempts.append(("RestartController", lambda: tx.restart_controller(state)))
    if state.sent < config.max_fenced_requests:
        attempts += [("RequestFencedCommit", lambda r=r: tx.request_fenced_commit(state, r))
                     for r in config.fenced_requests]
    for i in range(1, config.max_fenced_requests + 1):
        attempts += [("ReadFence", lambda i=i: tx.read_fence(state, i)),
                     ("DecideFencedCommit", lambda i=i: tx.decide_fenced_commit(state, i))]
    for label, attempt in attempts:
        try:
            yield label, attempt()
        except tx.NotEnabled:
            continue


def check(state: tx.TransactionsState) -> None:
    tx.check_invariants(state)


def _event(event: tx.Event) -> Record:
    return record(src=event.source, key=event.key, n=event.number)


def _segments(segments: tuple[tx.Segment, ...]) -> tuple[tuple[Record, ...], ...]:
    return tuple(tuple(_event(event) for event in segment) for segment in segments)


def _txn(me: tx.Transaction) -> Record:
    return record(status=me.status.value, epoch=me.epoch, order=me.order, opened=me.opened, deadline=me.deadline,
                  tsegs=_segments(me.segments), merged=frozenset(me.merged), plainBefore=me.plain_before,
                  plainAfter=me.plain_after)


def _request(request: tx.FencedRequest, **more: Any) -> Record:
    return record(txns=frozenset(request.txns), key=request.key, value=request.value, **more)


def project(config: Configuration, state: tx.TransactionsState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    # TLC prints a function whose domain is a set of strings as a record, and one over {} as <<>>.
    recorded: Any = record(**dict(state.recorded)) if state.recorded else ()
    return {
        "controller": state.controller.value,
        "crashes": state.crashes,
        "clock": state.clock,
        "epochs": tuple(record(layout=e.layout, sealed=e.sealed, segs=_segments(e.segments)) for e in state.epochs),
        "active": state.active,
        "txn": tuple(_txn(me) for me in state.txn),
        "workflow": record(txn=state.workflow.txn, target=state.workflow.target),
        "plain": state.plain,
        "recorded": recorded,
        "inbox": tuple(_request(entry.request, seen=entry.seen) for entry in state.inbox),
        "sent": state.sent,
        "fenceLog": tuple(_request(d.request, outcome=d.outcome.value) for d in state.fence_log),
    }
