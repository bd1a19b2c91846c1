"""The Python model of ``StableWriter`` set up exactly as a TLC configuration sets up the spec.

``successors`` enumerates the instances of ``Next`` the way TLC does -- one successor per enabled
instance, labelled with the spec action's name -- by trying every instance on the model and keeping
those whose guard holds (a guard that fails raises ``NotEnabled``); the spec's bounds on the
environment are applied here.  ``project`` maps a model state onto the value TLC prints for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from millstream.model import stable_writer as sw
from proofs.tla_values import Function, Record, record

__all__ = ["CONSTANTS", "Configuration", "Instance", "check", "initial_states", "instances", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "Writers, Grid, Keys, InitialSplits, Events, MaxScales, MaxCrashes"


@dataclass(frozen=True)
class Configuration:
    writers: tuple[str, ...]
    grid: int
    keys: tuple[int, ...]
    initial_splits: frozenset[int]
    events: int
    max_scales: int
    max_crashes: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        writers, grid, keys, splits, events, scales, crashes = printed
        return cls(tuple(sorted(writers)), grid, tuple(sorted(keys)), frozenset(splits), events, scales, crashes)


def initial_states(config: Configuration) -> list[sw.StableWriterState]:
    return [sw.initial_state(config.writers, config.grid, config.initial_splits)]


#: One instance of an action: its label, the model transition, and the arguments after the state.
Instance = tuple[str, Callable[..., sw.StableWriterState], tuple[Any, ...]]


def instances(config: Configuration, state: sw.StableWriterState) -> Iterator[Instance]:
    """The instances of ``Next`` that may be enabled.  The spec quantifies segments over all of
    ``SegmentIds``; the ids left out here fail the action's first guard, so they add no successor."""
    if state.scales < config.max_scales:
        for predecessors, ranges in sw.scale_requests(state):
            yield "CreateSuccessors", sw.create_successors, (predecessors, ranges)
    yield "RecordEpoch", sw.record_epoch, ()
    yield "SealPredecessors", sw.seal_predecessors, ()
    yield "ActivateEpoch", sw.activate_epoch, ()
    segments = range(1, len(state.segments) + 1)
    for w in config.writers:
        if state.written[w] < config.events:
            for k in config.keys:
                yield "WriteEvent", sw.write_event, (w, k)
        for s in sorted(state.routed(w)):
            yield "AppendEvent", sw.append_event, (w, s)
            yield "AckEvent", sw.ack_event, (w, s)
            yield "SegmentSealed", sw.segment_sealed, (w, s)
        if state.crashes < config.max_crashes:
            yield "WriterCrash", sw.writer_crash, (w,)
        for s in segments:
            for g in range(1, config.max_crashes + 1):
                yield "ZombieAppend", sw.zombie_append, (w, s, g)
        for j in range(config.events + 1):
            yield "WriterRestart", sw.writer_restart, (w, j)


def successors(config: Configuration, state: sw.StableWriterState) -> Iterator[tuple[str, sw.StableWriterState]]:
    """Every enabled instance of ``Next``: the instances whose guard holds in the model."""
    for label, transition, arguments in instances(config, state):
        try:
            yield label, transition(state, *arguments)
        except sw.NotEnabled:
            continue


def check(state: sw.StableWriterState) -> None:
    state.check_invariants()


def _per_name(mapping: Mapping[str, Any], value: Callable[[Any], Any]) -> Record:
    return record(**{name: value(item) for name, item in mapping.items()})


def _cells(values: tuple[int, ...]) -> Function:
    return Function(frozenset(enumerate(values)))


def project(config: Configuration, state: sw.StableWriterState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    return {
        "segs": tuple(record(lo=s.lo, hi=s.hi, epoch=s.epoch) for s in state.segments),
        "epochs": tuple(state.epochs),
        "scaling": record(phase=state.scaling.phase.value, preds=state.scaling.predecessors,
                          succs=state.scaling.successors),
        "scales": state.scales,
        "sealed": state.sealed,
        "data": tuple(tuple(record(w=e.writer, n=e.number, k=e.key) for e in events) for events in state.data),
        "source": _per_name(state.source, tuple),
        "written": _per_name(state.written, int),
        "table": _per_name(state.table, _cells),
        "inflight": _per_name(
            state.inflight, lambda events: tuple(record(n=e.number, k=e.key, seg=e.segment) for e in events)),
        "floor": _per_name(state.floor, _cells),
        "alive": state.alive,
        "zombie": _per_name(state.zombie, lambda events: frozenset(
            record(n=z.number, k=z.key, seg=z.segment, g=z.crash) for z in events)),
        "crashes": state.crashes,
    }
