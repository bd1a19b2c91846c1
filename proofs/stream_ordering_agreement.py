"""The Python model of ``StreamOrdering`` set up exactly as a TLC configuration sets up the spec.

``successors`` enumerates the instances of ``Next`` the way TLC does -- one successor per enabled
instance, labelled with the spec action's name -- by trying every instance on the model and keeping
those whose guard holds (a guard that fails raises ``NotEnabled``); the spec's bounds on the
environment are applied here.  ``project`` maps a model state onto the value TLC prints for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from millstream.model import stream_ordering as so
from proofs.tla_values import Function, Record, record

__all__ = ["CONSTANTS", "Configuration", "Instance", "check", "initial_states", "instances", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = ("Writers, Readers, InitialReaders, Grid, Keys, InitialSplits, EventsPerWriter, MaxScales, "
             "MaxCheckpoints, MaxCrashes, MaxResets")


@dataclass(frozen=True)
class Configuration:
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    initial_readers: frozenset[str]
    grid: int
    keys: tuple[int, ...]
    initial_splits: frozenset[int]
    events_per_writer: int
    max_scales: int
    max_checkpoints: int
    max_crashes: int
    max_resets: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        (writers, readers, initial_readers, grid, keys, splits, events, scales, checkpoints, crashes,
         resets) = printed
        return cls(tuple(sorted(writers)), tuple(sorted(readers)), frozenset(initial_readers), grid,
                   tuple(sorted(keys)), frozenset(splits), events, scales, checkpoints, crashes, resets)


def initial_states(config: Configuration) -> list[so.StreamState]:
    return [so.initial_state(config.writers, config.readers, config.initial_readers, config.grid,
                             config.initial_splits)]


#: One instance of an action: its label, the model transition, and the arguments after the state.
Instance = tuple[str, Callable[..., so.StreamState], tuple[Any, ...]]


def instances(config: Configuration, state: so.StreamState) -> Iterator[Instance]:
    """The instances of ``Next`` that may be enabled.  The spec quantifies segments over all of
    ``SegmentIds``; the ids left out here fail the action's first guard, so they add no successor."""
    if state.scales < config.max_scales:
        for predecessors, ranges in so.scale_requests(state):
            yield "CreateSuccessors", so.create_successors, (predecessors, ranges)
    yield "RecordEpoch", so.record_epoch, ()
    yield "SealPredecessors", so.seal_predecessors, ()
    yield "ActivateEpoch", so.activate_epoch, ()
    for w in config.writers:
        if state.written[w] < config.events_per_writer:
            for k in config.keys:
                yield "WriteEvent", so.write_event, (w, k)
        for s in sorted(state.routed(w)):
            yield "AppendEvent", so.append_event, (w, s)
            yield "AckEvent", so.ack_event, (w, s)
            yield "SegmentSealed", so.segment_sealed, (w, s)
    for r in config.readers:
        yield "AddReader", so.add_reader, (r,)
        for s in sorted(state.unassigned):
            yield "AcquireSegment", so.acquire_segment, (r, s)
        for s in sorted(state.owned(r)):
            yield "ReleaseSegment", so.release_segment, (r, s)
            yield "ReadNextEvent", so.read_next_event, (r, s)
            yield "SegmentCompleted", so.segment_completed, (r, s)
        yield "SurfaceCheckpoint", so.surface_checkpoint, (r,)
        yield "CheckpointReader", so.checkpoint_reader, (r,)
        if state.crashes < config.max_crashes:
            yield "ReaderOffline", so.reader_offline, (r,)
    if len(state.checkpoints) < config.max_checkpoints:
        yield "CreateCheckpoint", so.create_checkpoint, ()
    if state.resets < config.max_resets:
        for i in range(1, config.max_checkpoints + 1):
            yield "Reset", so.reset, (i,)


def successors(config: Configuration, state: so.StreamState) -> Iterator[tuple[str, so.StreamState]]:
    """Every enabled instance of ``Next``: the instances whose guard holds in the model."""
    for label, transition, arguments in instances(config, state):
        try:
            yield label, transition(state, *arguments)
        except so.NotEnabled:
            continue


def check(state: so.StreamState) -> None:
    state.check_invariants()


# --- Projection onto the spec's variables --------------------------------------------------------


def _int_map(mapping: Mapping[int, Any]) -> Any:
    """TLC prints a function whose domain is 1..n as a sequence, any other as ``(k :> v @@ ...)``."""
    if sorted(mapping) == list(range(1, len(mapping) + 1)):
        return tuple(mapping[k] for k in range(1, len(mapping) + 1))
    return Function(frozenset(mapping.items()))


def _per_name(mapping: Mapping[str, Any], value: Callable[[Any], Any]) -> Record:
    return record(**{name: value(item) for name, item in mapping.items()})


def project(config: Configuration, state: so.StreamState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    return {
        "segs": tuple(record(lo=s.lo, hi=s.hi, epoch=s.epoch) for s in state.segments),
        "epochs": tuple(state.epochs),
        "scaling": record(phase=state.scaling.phase.value, preds=state.scaling.predecessors,
                          succs=state.scaling.successors),
        "scales": state.scales,
        "sealed": state.sealed,
        "data": tuple(tuple(record(w=e.writer, n=e.number, k=e.key) for e in events) for events in state.data),
        "written": _per_name(state.written, int),
        "table": _per_name(state.table, lambda route: Function(frozenset(enumerate(route)))),
        "inflight": _per_name(
            state.inflight, lambda events: tuple(record(n=e.number, k=e.key, seg=e.segment) for e in events)),
        "online": state.online,
        "assigned": _per_name(state.assigned, _int_map),
        "unassigned": _int_map(state.unassigned),
        "future": _int_map(state.future),
        "pos": _per_name(state.positions, _int_map),
        "atCkpt": _per_name(state.at_checkpoint, int),
        "saved": _per_name(state.saved, _int_map),
        "ckpts": tuple(record(pending=c.pending, cut=_int_map(c.cut)) for c in state.checkpoints),
        "crashes": state.crashes,
        "resets": state.resets,
        "reads": state.reads,
        "origin": _int_map(state.origin),
        "unsaved": _per_name(state.unsaved, frozenset),
    }
