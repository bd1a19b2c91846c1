"""The Python model of ``LargeEvents`` set up exactly as a TLC configuration sets up the spec."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import large_events as le
from proofs.tla_values import Record, record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "Parts, InlineMax, NumOrdinary, MaxDisconnects"


@dataclass(frozen=True)
class Configuration:
    parts: tuple[int, ...]
    inline_max: int
    num_ordinary: int
    max_disconnects: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        parts, inline_max, num_ordinary, max_disconnects = printed
        return cls(tuple(parts), inline_max, num_ordinary, max_disconnects)


def initial_states(config: Configuration) -> list[le.LargeEventsState]:
    return [le.initial_state(config.parts, config.inline_max)]


def successors(config: Configuration, state: le.LargeEventsState) -> Iterator[tuple[str, le.LargeEventsState]]:
    """Every enabled instance of ``Next``; the bounds on ordinary writes and drops are the explorer's."""
    if state.ordinary_issued < config.num_ordinary and not state.blocked:
        yield "WriteOrdinary", le.write_ordinary(state)
    if state.pending:
        yield "DeliverOrdinary", le.deliver_ordinary(state)
    for w in state.writer_ids:
        me = state.writer(w)
        segment = state.transient(w).state
        created = segment is not le.TransientState.NONE
        if not state.inline(w) and me.phase is le.WriterPhase.OPEN and me.up and not created:
            yield "CreateTransient", le.create_transient(state, w)
        if state.live(w) and not state.inline(w) and created and me.up and me.sent < state.items(w):
            yield "SendChunk", le.send_chunk(state, w)
        for conn in range(config.max_disconnects + 1):
            if conn in state.connections_with_requests(w):
                yield "AppendChunk", le.append_chunk(state, w, conn)
        if state.live(w) and me.up and created and state.disconnects < config.max_disconnects:
            for kept in range(state.current_requests(w) + 1):
                yield "Disconnect", le.disconnect(state, w, kept)
        if state.live(w) and not me.up:
            yield "Reconnect", le.reconnect(state, w)
        if me.phase is le.WriterPhase.OPEN and not state.blocked and (state.inline(w) or created):
            yield "Commit", le.commit(state, w)
        if me.phase is le.WriterPhase.COMMITTING and me.up and state.all_acked(w) and state.flushed:
            yield "Merge", le.merge(state, w)
        if me.phase is le.WriterPhase.OPEN:
            yield "Abort", le.abort(state, w)
            yield "Abandon", le.abandon(state, w)
        if not me.up and segment is le.TransientState.ACTIVE:
            yield "DeleteOnDisconnect", le.delete_on_disconnect(state, w)
        if segment is le.TransientState.ACTIVE:
            yield "Expire", le.expire(state, w)


def check(state: le.LargeEventsState) -> None:
    le.check_invariants(state)


def _item(item: le.Item) -> Record:
    return record(kind=item.kind.value, ev=item.event, part=item.part)


def project(config: Configuration, state: le.LargeEventsState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    return {
        "parent": tuple(_item(item) for item in state.parent),
        "pending": tuple(tuple(_item(item) for item in block) for block in state.pending),
        "issued": tuple(record(kind=call.kind.value, ev=call.event) for call in state.issued),
        "ew": tuple(record(phase=me.phase.value, sent=me.sent, acked=me.acked, conn=me.conn, up=me.up)
                    for me in state.writers),
        "tseg": tuple(record(state=segment.state.value, data=tuple(_item(item) for item in segment.data))
                      for segment in state.transients),
        "inflight": tuple(tuple(record(part=r.part, conn=r.conn) for r in requests) for requests in state.inflight),
        "disconnects": state.disconnects,
    }
