"""What idempotent writers and a reader of their segment may observe: a pure state machine.

Theory of operation.  Writers append numbered events to one segment: a writer numbers its events
1, 2, 3, ... as it is handed them (``write_event``).  The store keeps, for each writer, the last
number it stored, and stores the writer's next event only if it is the one after that, so however
often an event is sent (a resend after a lost acknowledgement, a race between an old connection and
a new one) it is stored once, and a writer's events are stored in the order written (``store``).
Acknowledgements are cumulative and come only for what is stored (``acknowledge``).  Sealing the
segment (``seal``) ends storing; a writer whose next event meets the seal fails, and by then it has
been told of every event of it that was stored (``refuse``: the store answers its setup with the
last number it stored, and its blocks in order).  A writer may also give up (``give_up``: it ran out
of reconnect attempts); what it had not seen acknowledged may or may not be stored then -- and may
still *become* stored, if a send of it was in flight -- but always in order and once.

So what a reader of the segment sees is an interleaving of each writer's events ``1..k`` (``k``
between what the writer saw acknowledged and what it wrote), each once, in its writer's order; it
only grows; and after the seal it never changes.  ``observe`` checks a reading against that and
turns the new events into ``store`` steps.

The state's fields are plain values (frozen attrs, tuples, ``FrozenMap``s); every transition returns
a new state, and one whose guard is false raises ``NotEnabled`` naming the broken rule.  Nothing here
does I/O, reads a clock or draws a random number.  ``tests/stateful/test_writer_vs_model.py`` drives
it from the real writer, server and a simulated network.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs

from millstream.model.durable_log import NotEnabled
from millstream.model.frozen_map import FrozenMap

__all__ = [
    "Event",
    "NotEnabled",
    "SegmentState",
    "WriterState",
    "WriterStatus",
    "acknowledge",
    "give_up",
    "initial_state",
    "observe",
    "refuse",
    "seal",
    "store",
    "write_event",
]


class WriterStatus(enum.Enum):
    """A writer's lifecycle: ACTIVE -> REFUSED (the segment was sealed) or GAVE_UP (retries ran out)."""

    ACTIVE = "active"
    REFUSED = "refused"
    GAVE_UP = "gave_up"

    def __repr__(self) -> str:
        return f"WriterStatus.{self.name}"


#: status -> the statuses it may move to.
WRITER_TRANSITIONS: dict[WriterStatus, frozenset[WriterStatus]] = {
    WriterStatus.ACTIVE: frozenset({WriterStatus.REFUSED, WriterStatus.GAVE_UP}),
    WriterStatus.REFUSED: frozenset(),
    WriterStatus.GAVE_UP: frozenset(),
}


@attrs.frozen(order=True)
class Event:
    """An event as the segment stores it: its writer and the writer's number for it (from 1)."""

    writer: str
    number: int


@attrs.frozen
class WriterState:
    """How far one writer got: events numbered (``written``), stored, and acknowledged to it."""

    written: int = 0
    stored: int = 0
    acknowledged: int = 0
    status: WriterStatus = WriterStatus.ACTIVE


@attrs.frozen
class SegmentState:
    """The segment's events in order, whether it is sealed, and each writer's progress."""

    writers: FrozenMap[str, WriterState]
    events: tuple[Event, ...] = ()
    sealed: bool = False

    def writer(self, name: str) -> WriterState:
        try:
            return self.writers[name]
        except KeyError:
            raise NotEnabled(f"there is no writer {name!r} (writers: {sorted(self.writers)})") from None

    def check_invariants(self) -> None:
        """Each writer's events appear once each, numbered 1..stored in order; acknowledged <= stored
        <= written; a refused writer was told of everything stored of it."""
        seen: dict[str, int] = {name: 0 for name in self.writers}
        for event in self.events:
            assert event.writer in seen, f"an event of an unknown writer: {event}"
            assert event.number == seen[event.writer] + 1, f"{event} follows event {seen[event.writer]}"
            seen[event.writer] = event.number
        for name, state in self.writers.items():
            assert seen[name] == state.stored, (name, seen[name], state)
            assert 0 <= state.acknowledged <= state.stored <= state.written, (name, state)
            if state.status is WriterStatus.REFUSED:
                assert self.sealed and state.acknowledged == state.stored, (name, state)


def initial_state(writers: Iterable[str]) -> SegmentState:
    """An empty, open segment and writers that have written nothing."""
    names = list(writers)
    if len(set(names)) != len(names):
        raise NotEnabled(f"writer names must be distinct: {names}")
    return SegmentState(FrozenMap((name, WriterState()) for name in names))


def _with(state: SegmentState, name: str, writer: WriterState) -> SegmentState:
    return attrs.evolve(state, writers=state.writers.set(name, writer))


def write_event(state: SegmentState, name: str) -> tuple[SegmentState, int]:
    """Writer ``name`` is handed its next event; returns the new state and the event's number.
    Enabled while the writer is active (a failed writer refuses new events)."""
    writer = state.writer(name)
    if writer.status is not WriterStatus.ACTIVE:
        raise NotEnabled(f"writer {name!r} {writer.status.value}: it takes no more events")
    number = writer.written + 1
    return _with(state, name, attrs.evolve(writer, written=number)), number


def store(state: SegmentState, name: str, number: int) -> SegmentState:
    """The segment stores event ``number`` of writer ``name``.  Enabled only for the writer's next
    event (not one stored already: a duplicate; not a later one: a reordering or a gap), one it has
    written (else a phantom), and only while the segment is open."""
    writer = state.writer(name)
    if state.sealed:
        raise NotEnabled(f"event {number} of {name!r} stored after the seal")
    if number <= writer.stored:
        raise NotEnabled(f"event {number} of {name!r} stored again (a duplicate: {writer.stored} stored so far)")
    if number > writer.written:
        raise NotEnabled(f"event {number} of {name!r} stored, but only {writer.written} were written (a phantom)")
    if number != writer.stored + 1:
        raise NotEnabled(f"event {number} of {name!r} stored after event {writer.stored} (out of order, or "
                         f"events {writer.stored + 1}..{number - 1} were skipped)")
    return attrs.evolve(_with(state, name, attrs.evolve(writer, stored=number)),
                        events=(*state.events, Event(name, number)))


def acknowledge(state: SegmentState, name: str, number: int) -> SegmentState:
    """Writer ``name`` has seen its events up to ``number`` acknowledged (cumulative).  Enabled only
    for stored events (an acknowledgement promises durability) and never backwards."""
    writer = state.writer(name)
    if number < writer.acknowledged:
        raise NotEnabled(f"{name!r}: acknowledged {number} after {writer.acknowledged} (acknowledgements "
                         "never go backwards)")
    if number > writer.stored:
        raise NotEnabled(f"{name!r}: event {number} acknowledged, but only {writer.stored} are in the segment "
                         "(an acknowledged event is missing: lost)")
    return _with(state, name, attrs.evolve(writer, acknowledged=number))


def seal(state: SegmentState) -> SegmentState:
    """The segment is sealed: nothing more is stored.  Sealing a sealed segment changes nothing."""
    return attrs.evolve(state, sealed=True)


def refuse(state: SegmentState, name: str) -> SegmentState:
    """Writer ``name`` failed because the segment is sealed.  Enabled only after the seal, and only once
    the writer has been told of every event of it the segment holds."""
    writer = state.writer(name)
    if not state.sealed:
        raise NotEnabled(f"{name!r} was refused, but the segment is not sealed")
    if writer.status is not WriterStatus.ACTIVE:
        raise NotEnabled(f"{name!r} was refused, but it is {writer.status.value} already")
    if writer.acknowledged != writer.stored:
        raise NotEnabled(f"{name!r} failed on the seal having seen {writer.acknowledged} events acknowledged, but "
                         f"the segment holds {writer.stored} of them")
    return _with(state, name, attrs.evolve(writer, status=WriterStatus.REFUSED))


def give_up(state: SegmentState, name: str) -> SegmentState:
    """Writer ``name`` ran out of reconnect attempts.  What it had not seen acknowledged may still be
    stored later (a send of it may be in flight), in order and once, as before."""
    writer = state.writer(name)
    if writer.status is not WriterStatus.ACTIVE:
        raise NotEnabled(f"{name!r} gave up, but it is {writer.status.value} already")
    return _with(state, name, attrs.evolve(writer, status=WriterStatus.GAVE_UP))


def observe(state: SegmentState, events: Sequence[Event]) -> SegmentState:
    """A reader saw the segment hold ``events``: they must start with every event seen before (a
    segment only grows; nothing stored, acknowledged or not, goes away or changes), and each new one
    is a ``store`` step."""
    known = len(state.events)
    if len(events) < known or tuple(events[:known]) != state.events:
        first = next((i for i, (a, b) in enumerate(zip(events, state.events, strict=False)) if a != b),
                     min(len(events), known))
        raise NotEnabled(f"the segment changed under a reader: position {first} held "
                         f"{state.events[first] if first < known else None}, now "
                         f"{events[first] if first < len(events) else 'nothing'} ({known} events seen before, "
                         f"{len(events)} now)")
    for event in events[known:]:
        state = store(state, event.writer, event.number)
    return state
