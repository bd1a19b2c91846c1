"""Replaying the steps ``StreamRun`` observed on the model (``millstream.model.stream_ordering``),
checking at each that the model allows it and that it has the values the implementation reported,
and comparing what the implementation shows with what the model holds.

``replay(model, step)`` takes one step.  Every value the step carries is checked against the model:
the event an append stored (writer, number, key), the offset a segment was acquired or released at,
the event a read returned and where, the end a segment was completed at and the successors (with
all their predecessors) the reader was given, a checkpoint's cut and the readers that owe it, the
positions a reader recorded, the offsets a crashed reader's segments went back at, the cut a reset
started from.

One difference is allowed, and counted: the spec lets only a least loaded reader acquire a segment,
and a reader give one up only while another holds two fewer -- an abstraction of the implementation's
timers and load policy.  The implementation's policy (Pravega's) lets a reader take up to its fair
share at once (``segments_to_acquire``) and weighs loads by lag, so it takes steps that break those
load guards and nothing else.  ``replay`` takes such a step as the spec's step without the load
guard (every other guard still holds: the reader is free, the segment unassigned or held at its
recorded offset) and counts it in ``Replay.load_relaxed``.  No invariant of the spec depends on the
load guards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from millstream.model import stream_ordering as so
from millstream.model.frozen_map import FrozenMap

__all__ = ["Replay", "replay"]

_PHANTOM = "~phantom"


@attrs.define
class Replay:
    """The model and what the replay saw: steps taken by name, load guards relaxed."""

    model: so.StreamState
    taken: dict[str, int] = attrs.field(factory=dict)
    load_relaxed: int = 0

    def apply(self, step: dict[str, Any]) -> None:
        self.model = replay(self, step)
        self.taken[step["a"]] = self.taken.get(step["a"], 0) + 1


def _check(condition: bool, step: dict[str, Any], what: str) -> None:
    if not condition:
        raise AssertionError(f"{step['a']}: {what} (step {_shown(step)})")


def _shown(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k != "payload"}


def _enabled(step: dict[str, Any], transition: Callable[..., so.StreamState], model: so.StreamState,
             *args: Any) -> so.StreamState:
    try:
        return transition(model, *args)
    except so.NotEnabled as error:
        raise AssertionError(f"the implementation took a step the model does not allow: {_shown(step)} ({error})"
                             ) from None


def _acquire_ignoring_load(model: so.StreamState, reader: str, segment: int) -> so.StreamState:
    """``AcquireSegment`` without its least-loaded guard: taken on a state where the reader is the only
    one online (the guard then holds), and the others put back."""
    alone = attrs.evolve(model, online=frozenset({reader}) & model.online)
    return attrs.evolve(so.acquire_segment(alone, reader, segment), online=model.online)


def _release_ignoring_load(model: so.StreamState, reader: str, segment: int) -> so.StreamState:
    """``ReleaseSegment`` without its "another reader holds two fewer" guard: taken with an idle
    phantom reader online (the guard then holds), and the phantom taken away."""
    empty: so.Offsets = FrozenMap()
    with_phantom = attrs.evolve(model, online=model.online | {_PHANTOM},
                                assigned=model.assigned.set(_PHANTOM, empty),
                                positions=model.positions.set(_PHANTOM, empty),
                                saved=model.saved.set(_PHANTOM, empty),
                                at_checkpoint=model.at_checkpoint.set(_PHANTOM, 0),
                                unsaved=model.unsaved.set(_PHANTOM, frozenset()))
    released = so.release_segment(with_phantom, reader, segment)
    return attrs.evolve(released, online=model.online, assigned=released.assigned.without(_PHANTOM),
                        positions=released.positions.without(_PHANTOM), saved=released.saved.without(_PHANTOM),
                        at_checkpoint=released.at_checkpoint.without(_PHANTOM),
                        unsaved=released.unsaved.without(_PHANTOM))


def _with_load_relaxed(state: Replay, step: dict[str, Any], strict: Callable[..., so.StreamState],
                       relaxed: Callable[..., so.StreamState], reader: str, segment: int) -> so.StreamState:
    try:
        return strict(state.model, reader, segment)
    except so.NotEnabled:
        pass
    result = _enabled(step, relaxed, state.model, reader, segment)
    state.load_relaxed += 1
    return result


def replay(state: Replay, step: dict[str, Any]) -> so.StreamState:
    """The model after ``step`` (see the module docstring); raises AssertionError naming what differs."""
    model = state.model
    action = step["a"]
    if action == "CreateSuccessors":
        after = _enabled(step, so.create_successors, model, frozenset(step["preds"]),
                         tuple(tuple(r) for r in step["ranges"]))
        first = len(model.segments) + 1
        _check(after.scaling.successors == frozenset(range(first, first + len(step["ranges"]))), step,
               "the successors are not numbered as the model numbers them")
        return after
    if action == "RecordEpoch":
        return _enabled(step, so.record_epoch, model)
    if action == "SealPredecessors":
        return _enabled(step, so.seal_predecessors, model)
    if action == "ActivateEpoch":
        return _enabled(step, so.activate_epoch, model)
    if action == "WriteEvent":
        return _enabled(step, so.write_event, model, step["w"], step["k"])
    if action == "AppendEvent":
        after = _enabled(step, so.append_event, model, step["w"], step["s"])
        stored = after.data[step["s"] - 1][-1]
        _check(stored == so.StoredEvent(step["w"], step["n"], step["k"]), step,
               f"the segment stored {step['w']}'s event {step['n']} (key {step['k']}), the model's next is "
               f"{stored}")
        return after
    if action == "AckEvent":
        return _enabled(step, so.ack_event, model, step["w"], step["s"])
    if action == "SegmentSealed":
        return _enabled(step, so.segment_sealed, model, step["w"], step["s"])
    if action == "AddReader":
        return _enabled(step, so.add_reader, model, step["r"])
    if action == "AcquireSegment":
        _check(model.unassigned.get(step["s"]) == step["o"], step,
               f"acquired at {step['o']}, the model has it unassigned at {model.unassigned.get(step['s'])}")
        return _with_load_relaxed(state, step, so.acquire_segment, _acquire_ignoring_load, step["r"], step["s"])
    if action == "ReleaseSegment":
        _check(model.assigned[step["r"]].get(step["s"]) == step["o"], step,
               f"released at {step['o']}, the model records {model.assigned[step['r']].get(step['s'])}")
        return _with_load_relaxed(state, step, so.release_segment, _release_ignoring_load, step["r"], step["s"])
    if action == "ReadNextEvent":
        after = _enabled(step, so.read_next_event, model, step["r"], step["s"])
        position = after.reads[-1]
        _check(position == (step["s"], step["o"]), step, f"the model's next event there is at {position}")
        _check(after.event_at(position) == so.StoredEvent(step["w"], step["n"], step["k"]), step,
               f"the model holds {after.event_at(position)} there")
        return after
    if action == "SegmentCompleted":
        segment = step["s"]
        _check(step["end"] == len(model.data[segment - 1]), step,
               f"completed at {step['end']}, the segment holds {len(model.data[segment - 1])} events")
        expected = {t: set(model.predecessors(t)) for t in model.successors(segment)}
        _check(step["succs"] == expected, step, f"the successors (with their predecessors) are {expected}")
        return _enabled(step, so.segment_completed, model, step["r"], segment)
    if action == "CreateCheckpoint":
        after = _enabled(step, so.create_checkpoint, model)
        _check(step["i"] == len(after.checkpoints), step, f"the model numbers it {len(after.checkpoints)}")
        created = after.checkpoints[-1]
        _check(step["cut"] == dict(created.cut), step, f"the model's cut starts as {dict(created.cut)}")
        _check(step["pending"] == set(created.pending), step, f"the model's readers owing it are {created.pending}")
        return after
    if action == "SurfaceCheckpoint":
        after = _enabled(step, so.surface_checkpoint, model, step["r"])
        _check(after.at_checkpoint[step["r"]] == step["i"], step,
               f"the model's reader owes checkpoint {after.at_checkpoint[step['r']]}")
        return after
    if action == "CheckpointReader":
        _check(model.at_checkpoint[step["r"]] == step["i"], step,
               f"the model's reader returned checkpoint {model.at_checkpoint[step['r']]}")
        _check(step["positions"] == dict(model.positions[step["r"]]), step,
               f"the model's reader is at {dict(model.positions[step['r']])}")
        return _enabled(step, so.checkpoint_reader, model, step["r"])
    if action == "ReaderOffline":
        _check(step["positions"] == dict(model.assigned[step["r"]]), step,
               f"the model records {dict(model.assigned[step['r']])} for the reader")
        return _enabled(step, so.reader_offline, model, step["r"])
    if action == "Reset":
        number = step["i"]
        _check(1 <= number <= len(model.checkpoints) and dict(model.checkpoints[number - 1].cut) == step["cut"],
               step, "the cut is no completed checkpoint's cut in the model")
        return _enabled(step, so.reset, model, number)
    raise AssertionError(f"no such step: {action}")
