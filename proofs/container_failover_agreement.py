"""The Python model of ``ContainerFailover`` set up exactly as a TLC configuration sets up the spec."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import container_failover as cf
from proofs.tla_values import Function, Record, record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "Owners, MaxAppends, MaxEpoch, MaxCrashes, MaxCheckpoints"


@dataclass(frozen=True)
class Configuration:
    owners: tuple[str, ...]
    max_appends: int
    max_epoch: int
    max_crashes: int
    max_checkpoints: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        owners, max_appends, max_epoch, max_crashes, max_checkpoints = printed
        return cls(tuple(sorted(owners)), max_appends, max_epoch, max_crashes, max_checkpoints)


def initial_states(config: Configuration) -> list[cf.ContainerFailoverState]:
    return [cf.initial_state(config.owners)]


def successors(config: Configuration, state: cf.ContainerFailoverState) -> Iterator[
        tuple[str, cf.ContainerFailoverState]]:
    """Every enabled instance of ``Next``."""
    for owner in config.owners:
        me = state.own[owner]
        if me.status is cf.OwnerStatus.DOWN and cf.start_allowed(state, config.max_epoch):
            yield "Start", cf.start(state, owner)
        if state.current(owner) and len(state.history) < config.max_appends:
            yield "ClientAppend", cf.client_append(state, owner)
        if state.serving(owner) and me.epoch < state.log_epoch:
            yield "LogWriteFenced", cf.log_write_fenced(state, owner)
        if state.serving(owner) and me.storage + me.written < len(me.units):
            yield "WriteChunk", cf.write_chunk(state, owner)
        if state.current(owner) and me.written > 0:
            yield "CommitFlush", cf.commit_flush(state, owner)
        for chunk, count in cf.adoptions(state, owner):
            yield "Adopt", cf.adopt(state, owner, chunk, count)
        if state.current(owner) and state.checkpoints < config.max_checkpoints:
            yield "Checkpoint", cf.checkpoint(state, owner)
        for index in cf.truncation_points(state, owner):
            yield "Truncate", cf.truncate(state, owner, index)
        if me.status is not cf.OwnerStatus.DOWN and state.crashes < config.max_crashes:
            yield "Crash", cf.crash(state, owner)


def check(state: cf.ContainerFailoverState) -> None:
    cf.check_invariants(state)


def _layout(layout: cf.Layout) -> tuple[Record, ...]:
    return tuple(record(chunk=entry.chunk, len=entry.length) for entry in layout)


def _record(r: cf.Record) -> Record:
    return record(kind=r.kind, epoch=r.epoch, id=r.id, off=r.offset, length=r.length, storage=r.storage,
                  layout=_layout(r.layout))


def _function_over_ints(mapping: dict[int, Any]) -> Any:
    """TLC prints a function whose domain is 1..n as a sequence, any other as ``(k :> v @@ ...)``."""
    if sorted(mapping) == list(range(1, len(mapping) + 1)):
        return tuple(mapping[k] for k in range(1, len(mapping) + 1))
    return Function(frozenset(mapping.items()))


def project(config: Configuration, state: cf.ContainerFailoverState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    owners = {name: record(status=me.status.value, epoch=me.epoch, units=me.units, storage=me.storage,
                           layout=_layout(me.layout), written=me.written)
              for name, me in state.own.items()}
    return {
        "logEpoch": state.log_epoch,
        "log": tuple(_record(r) for r in state.log),
        "chunks": _function_over_ints(dict(state.chunks)),
        "own": record(**owners),
        "history": state.history,
        "crashes": state.crashes,
        "checkpoints": state.checkpoints,
    }
