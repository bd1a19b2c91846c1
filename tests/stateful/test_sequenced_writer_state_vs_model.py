"""The stable-id writer's machines, driven directly -- no event loop, no thread, no socket -- versus the model.

``millstream.client._sequenced_writer_state`` holds the decisions of a writer with a stable writer id
(see its module docstring); ``tests/stateful/test_stable_writer_vs_model.py`` drives them through
their adapter, over a real node.  Here Hypothesis drives the machines of one writer process -- a
``SequencedSegmentWriterState`` per segment, the ``SequenceLedger``, ``held_by_older``,
``route_moved`` -- playing the stream writer's adapter, the segment store, the controller and the
network itself, and replays every step on ``millstream.model.stable_writer`` (``spec/StableWriter.tla``):

* ``write_event`` -- the next source offset (after a restart: the key the source holds there) goes to
  the machine of the segment its key is routed to, with the offset as its sequence (``WriteEvent``);
  it must be dropped as a duplicate exactly when the model says so;
The network's steps are one rule, ``network``, that draws one of those enabled:

* ``close_block`` -- what ``flush`` and the batch timer do: the open block closes and goes out if the
  hold lets it;
* ``setup`` -- a new session's ``AppendSetup`` with what the store holds (``AckEvent`` of what an
  earlier session or process stored, with re-framing of a block that straddles it), then re-sends
  through the hold;
* ``deliver`` -- the store takes the first block a session sent: by compare-and-set on the writer-id
  attribute, as the server does (the comparison is the block before it on that session); each event
  stored must be the model's ``AppendEvent`` (a live process) -- so a block the hold should have kept
  back, or a stored event sent again, is a step the model refuses;
* ``acknowledge`` -- a ``DataAppended`` reaches the machine; ``cut`` -- a connection breaks, what it
  carried may still land (``land``);
* ``scale`` -- the controller splits or merges segments (the model's four steps in one);
  ``hand_over`` -- a machine meets its segment's seal: it takes in the final attribute, the floors of
  the keys routed to it rise, its events move to the successors, merged there by sequence
  (``SegmentSealed``);
* ``writer_crash`` -- the process dies: every request it sent may still land as a ``ZombieAppend``
  (``land``; a request the model cannot explain is lost instead), also after ``writer_restart``: a
  fresh set of machines, given the floors of what every segment stores, replays the source from an
  offset at or before the first event not acknowledged.

The model is acknowledged eagerly (``AckEvent`` whenever enabled), so it never holds an event the
machines have not; it hands a sealed segment over once it holds something there.  After every step:
every machine's ``check_invariants`` and the model's invariants (exactly once, nothing acknowledged
lost, per-key order) over the store's data, which must be the model's; the budget counts exactly what
the machines hold; what they hold unacknowledged is the model's in-flight set plus only events the
store holds; the routing and the floors are the model's.

The process and the model hand a sealed segment over at different moments (the process when it meets
the seal, the model whenever it holds something there), so routes, floors and unacknowledged events
are compared where they lead once every seal on the way is handed over (``canonical``).

Bounds: four cells starting in two segments, 12 source offsets, three scales, two crashes; small
blocks (one to three events).  Default profile: 100 examples x 100 steps (10-20 s on a loaded
machine); nightly: 1000 x 150.

Seeded by hand once each: (1) ``held_by_older`` answering "not held" (no hold): the nightly profile
finds it in seconds -- a successor sent a moved event above a lower one still unacknowledged on the
other predecessor, and then met events moved in below what it had sent (``check_invariants``), or
the store took it before the lower one (``AppendEvent`` refused); the default profile rarely reaches
a merge with that timing (the real-node test never does).  (2) ``_reframe_front`` keeping the event
at the stored sequence (``>=`` for ``>``): ``test_a_setup_inside_a_block_keeps_only_the_events_above_it``
below fails (the stateful test rarely reaches a setup inside a block: a dead process's multi-event
request must land between a restart's writes and its first setup).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import deque
from collections.abc import Callable

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from millstream.client._segment_writer_state import (
    SHIPPED,
    Block,
    EndSession,
    Instruction,
    ReleaseFlushes,
    ReleaseHolds,
    Resend,
    Settle,
    ShipClosed,
    WakeCapacity,
    WriterBudget,
)
from millstream.client._sequenced_writer_state import (
    DUPLICATE,
    Floors,
    SequencedSegmentWriterState,
    SequenceLedger,
    held_by_older,
    route_moved,
)
from millstream.client._streams import SegmentWithRange
from millstream.model import stable_writer as sw
from millstream.testing.clock import ManualClock
from millstream.wire import codec
from tests.trace.stream_run import keys_for_cells

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
WRITER = "w1"
GRID = 4
EVENTS = 12
MAX_SCALES = 3
MAX_CRASHES = 2
#: Small blocks (one to three events), and a budget never reached (it is the base machine's business).
BLOCK_BYTES_MAX = 40
UNACKED_BYTES_MAX = 1 << 20
#: The time an acknowledgement takes (the clock stands still otherwise: blocks then fill to their size).
ROUND_TRIP_SECONDS = 0.002
KEYS = keys_for_cells(GRID)


def payload_of(number: int, cell: int) -> bytes:
    return f"{number}:{cell}".encode()


def event_of(payload: bytes) -> tuple[int, int]:
    number, cell = payload.decode().split(":")
    return int(number), int(cell)


@attrs.define
class Session:
    """One machine's connection: blocks sent on it (with the comparison the store makes for each: the
    attribute the block before it leaves) not yet taken by the store, acknowledgements on the way back."""

    expected: int
    sent: deque[tuple[int, Block]] = attrs.Factory(deque)
    replies: deque[int] = attrs.Factory(deque)
    ready: bool = False


@attrs.define
class Zombie:
    """A block sent on a connection that broke (``crash``: 0 while its process lives), still on the way."""

    segment: int
    comparison: int
    block: Block
    crash: int


@attrs.define
class Machine:
    state: SequencedSegmentWriterState
    session: Session | None = None


class Process:
    """One writer process: its machines (by model segment id), its routing (cell -> segment), its ledger."""

    def __init__(self, routing: list[int], floors: Floors, clock: ManualClock) -> None:
        self.budget = WriterBudget(UNACKED_BYTES_MAX)
        self.ledger = SequenceLedger(floors)
        self.routing = routing
        self.machines: dict[int, Machine] = {}
        self.clock = clock


class SequencedWriterStateMachine(RuleBasedStateMachine):
    """One stable-id writer's machines against a store, a controller and a network played by the test."""

    @initialize()
    def start(self) -> None:
        self.clock = ManualClock()
        self.model = sw.initial_state([WRITER], GRID, [GRID // 2])
        self.attribute: dict[int, int] = {}  # the writer-id attribute of each segment (model id)
        self.stored: dict[int, list[tuple[int, int]]] = {}  # what each segment stores: (number, cell)
        self.sealed: set[int] = set()
        self.zombies: list[Zombie] = []
        for segment_id in range(1, len(self.model.segments) + 1):
            self.attribute[segment_id] = 0
            self.stored[segment_id] = []
        self.process: Process | None = self.new_process()

    # --- The model's side --------------------------------------------------------------------------------

    def take(self, transition: Callable[..., sw.StableWriterState], *args: object) -> None:
        try:
            self.model = transition(self.model, *args)
        except sw.NotEnabled as error:
            raise AssertionError(f"{transition.__name__}{args} is not a step the model allows: {error}") from None

    def settle(self) -> None:
        """The model's ``AckEvent`` wherever enabled, and ``SegmentSealed`` for every sealed segment it
        routes to that the process no longer does (once it holds something there)."""
        if WRITER not in self.model.alive or self.process is None:
            return
        progress = True
        while progress:
            progress = False
            for segment_id in sorted(self.model.routed(WRITER)):
                with contextlib.suppress(sw.NotEnabled):
                    self.model = sw.ack_event(self.model, WRITER, segment_id)
            for segment_id in sorted(self.model.routed(WRITER)):
                if segment_id in self.model.sealed:
                    with contextlib.suppress(sw.NotEnabled):
                        self.model = sw.segment_sealed(self.model, WRITER, segment_id)
                        progress = True

    def successor_for(self, segment_id: int, cell: int) -> int:
        return next(t for t in sorted(self.model.successors(segment_id)) if self.model.segment(t).covers(cell))

    def canonical(self, segment_id: int, cell: int, floor: int) -> tuple[int, int]:
        """Where ``cell``'s keys go from ``segment_id`` once every seal on the way is handed over -- the
        first open segment of the cell's chain -- and the floor they have there (raised by each sealed
        segment passed).  The process and the model hand over at different moments (the model only
        while it holds something in the sealed segment, the process when it meets the seal), so they
        are compared in this form."""
        while segment_id in self.sealed:
            floor = max(floor, self.attribute[segment_id])
            segment_id = self.successor_for(segment_id, cell)
        return segment_id, floor

    def canonical_event(self, number: int, cell: int, segment_id: int) -> tuple[int, int, int] | None:
        """Where an unacknowledged event ends up once every seal on its way is handed over (None: a
        sealed segment on the way stores it, so the hand-over acknowledges it)."""
        while segment_id in self.sealed:
            if number <= self.attribute[segment_id]:
                return None
            segment_id = self.successor_for(segment_id, cell)
        return number, cell, segment_id

    # --- The store ---------------------------------------------------------------------------------------

    def range_of(self, segment_id: int) -> SegmentWithRange:
        segment = self.model.segment(segment_id)
        return SegmentWithRange(((segment.epoch - 1) << 32) | (segment_id - 1), segment.lo / GRID, segment.hi / GRID,
                                f"sc/st/{segment_id - 1}.#epoch.{segment.epoch - 1}")

    def store(self, segment_id: int, comparison: int, block: Block, crash: int) -> bool:
        """The store takes ``block`` (sent to ``segment_id`` with ``comparison``): stored if the segment is
        open and the attribute equals the comparison, each event replayed on the model (an
        ``AppendEvent`` of a live process, a ``ZombieAppend`` of a dead one)."""
        if segment_id in self.sealed or self.attribute[segment_id] != comparison:
            return False
        for payload in codec.iter_events(block.data):
            number, cell = event_of(payload)
            before = len(self.model.data[segment_id - 1])
            if crash:
                self.take(sw.zombie_append, WRITER, segment_id, crash)
                event("a dead process's request landed" + (" after the restart" if self.process else ""))
            else:
                self.take(sw.append_event, WRITER, segment_id)
            assert self.model.data[segment_id - 1][before:] == (sw.StoredEvent(WRITER, number, cell),), (
                "the store took an event the model does not", segment_id, number, cell,
                self.model.data[segment_id - 1][before:])
            self.stored[segment_id].append((number, cell))
        self.attribute[segment_id] = block.last_event_number
        return True

    def zombie_explained(self, zombie: Zombie) -> bool:
        """Whether the model can take a dead process's block as ``ZombieAppend``s (else it is lost)."""
        model = self.model
        try:
            for payload in codec.iter_events(zombie.block.data):
                number, cell = event_of(payload)
                before = len(model.data[zombie.segment - 1])
                model = sw.zombie_append(model, WRITER, zombie.segment, zombie.crash)
                if model.data[zombie.segment - 1][before:] != (sw.StoredEvent(WRITER, number, cell),):
                    return False
        except sw.NotEnabled:
            return False
        return True

    # --- The adapter's side (as ``_sequenced_writer`` does) -------------------------------------------------

    def new_process(self) -> Process:
        """``WriterRestart``'s reads: route by the current epoch; floors from what every segment stores."""
        routing = [self.model.current_owner(cell) for cell in range(GRID)]
        floors = Floors((self.range_of(s), self.attribute[s]) for s in range(1, len(self.model.segments) + 1))
        return Process(routing, floors, self.clock)

    def machine(self, segment_id: int) -> Machine:
        process = self.process
        assert process is not None
        machine = process.machines.get(segment_id)
        if machine is None:
            state = SequencedSegmentWriterState(
                self.range_of(segment_id).name, writer_id=uuid.UUID(int=segment_id), budget=process.budget,
                ledger=process.ledger, clock=self.clock, block_bytes_max=BLOCK_BYTES_MAX,
                segment_range=self.range_of(segment_id))
            machine = process.machines[segment_id] = Machine(state)
        return machine

    def segment_of(self, machine: Machine) -> int:
        assert self.process is not None
        return next(s for s, m in self.process.machines.items() if m is machine)

    def held(self, state: SequencedSegmentWriterState, sequence: int) -> bool:
        assert self.process is not None
        return held_by_older(state, sequence, [m.state for m in self.process.machines.values()])

    def execute(self, machine: Machine, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, Settle):
                assert not instruction.futures  # a writer with a stable id offers no per-event futures
            elif isinstance(instruction, ShipClosed):
                self.ship(machine)
            elif isinstance(instruction, Resend):
                assert machine.session is not None
                machine.session.ready = True
                self.pump(machine)
            elif isinstance(instruction, ReleaseHolds):
                self.release_holds()
            elif isinstance(instruction, EndSession):
                raise AssertionError(f"the session ended: {instruction.reason}")
            else:
                assert isinstance(instruction, WakeCapacity | ReleaseFlushes), instruction

    def ship(self, machine: Machine) -> None:
        machine.state.take_closed()
        self.pump(machine)

    def pump(self, machine: Machine) -> None:
        session = machine.session
        if session is None or not session.ready:
            return
        self.execute(machine, machine.state.trim_unsent())
        while (block := machine.state.next_to_send(self.held)) is not None:
            machine.state.sending(block)
            session.sent.append((session.expected, block))
            session.expected = block.last_event_number
            machine.state.sent()
        if machine.state.held:
            event("a block was held for an older segment's lower sequence")

    def release_holds(self) -> None:
        assert self.process is not None
        for machine in list(self.process.machines.values()):
            if machine.state.held:
                self.ship(machine)

    def break_session(self, machine: Machine, *, lost: bool = False) -> None:
        session, machine.session = machine.session, None
        if session is not None and not lost:
            self.zombies.extend(Zombie(self.segment_of(machine), comparison, block, 0)
                                for comparison, block in session.sent)
        machine.state.session_ended()

    # --- Rules: the application ----------------------------------------------------------------------------

    def alive(self) -> bool:
        return WRITER in self.model.alive and self.process is not None

    @precondition(lambda self: self.alive() and self.model.written[WRITER] < EVENTS)
    @rule(data=st.data())
    def write_event(self, data: st.DataObject) -> None:
        assert self.process is not None
        number = self.model.written[WRITER] + 1
        source = self.model.source[WRITER]
        cell = source[number - 1] if number <= len(source) else data.draw(st.integers(0, GRID - 1), label="cell")
        stored = number <= self.canonical(self.model.table[WRITER][cell], cell, self.model.floor[WRITER][cell])[1]
        duplicate = sw.is_duplicate(self.model, WRITER, cell)
        machine = self.machine(self.process.routing[cell])
        flags = machine.state.write_sequenced(payload_of(number, cell), KEYS[cell], number)
        # Both drop it, or keep it, alike -- unless the stream stores it in a sealed segment on its way that
        # one of them has not handed over yet (that one then drops it at the hand-over).
        assert bool(flags & DUPLICATE) == duplicate or stored, (number, cell, flags, duplicate)
        assert not (flags & DUPLICATE or duplicate) or stored, (number, cell, flags, duplicate)
        if flags & DUPLICATE:
            event("a replayed event was dropped as a duplicate")
        self.take(sw.write_event, WRITER, cell)
        if flags & SHIPPED:
            self.ship(machine)

    def close_block(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(sorted(s for s, m in self.process.machines.items()
                                                      if m.state._open_count)), label="segment")
        machine = self.process.machines[segment_id]
        if machine.state.close_open_block():
            self.ship(machine)

    # --- Rules: sessions and the store (one rule: which of these is enabled changes at every step) ----------

    def network_actions(self) -> list[str]:
        actions = ["land"] if self.zombies else []
        if self.alive():
            assert self.process is not None
            machines = self.process.machines
            if any(m.state._open_count for m in machines.values()):
                actions.append("close_block")
            if any(self.can_set_up(s) for s in machines):
                actions.append("setup")
            if self.sessions_with("sent"):
                actions.append("deliver")
            if self.sessions_with("replies"):
                actions.append("acknowledge")
            if any(m.session is not None for m in machines.values()):
                actions.append("cut")
            if any(self.can_hand_over(s) for s in machines):
                actions.append("hand_over")
        return actions

    @precondition(lambda self: bool(self.network_actions()))
    @rule(data=st.data())
    def network(self, data: st.DataObject) -> None:
        action = data.draw(st.sampled_from(self.network_actions()), label="action")
        getattr(self, action)(data)

    def can_set_up(self, segment_id: int) -> bool:
        assert self.process is not None
        machine = self.process.machines[segment_id]
        return machine.session is None and segment_id not in self.sealed

    def setup(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(sorted(s for s in self.process.machines if self.can_set_up(s))),
                               label="segment")
        machine = self.process.machines[segment_id]
        machine.state.take_closed()
        stored = self.attribute[segment_id]
        machine.session = Session(expected=stored)
        if stored > machine.state.acknowledged_event_number:
            event("a setup acknowledged what an earlier session or process stored")
            if any((block.application_sequences or [0])[0] <= stored < block.last_event_number
                   for block in machine.state._inflight):
                event("a setup's stored sequence fell inside a block: re-framed")
        instructions = machine.state.setup(stored)
        assert isinstance(instructions[-1], Resend), instructions
        self.execute(machine, instructions)

    def sessions_with(self, what: str) -> list[int]:
        if not self.alive():
            return []
        assert self.process is not None
        return sorted(s for s, m in self.process.machines.items()
                      if m.session is not None and getattr(m.session, what))

    def deliver(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(self.sessions_with("sent")), label="segment")
        machine = self.process.machines[segment_id]
        assert machine.session is not None
        comparison, block = machine.session.sent.popleft()
        if segment_id in self.sealed:
            self.hand_over_segment(segment_id)  # SegmentIsSealed
        elif self.store(segment_id, comparison, block, 0):
            machine.session.replies.append(block.last_event_number)
        else:  # InvalidEventNumber: the connection closes, what it carried after the block is lost
            self.break_session(machine, lost=True)

    def acknowledge(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(self.sessions_with("replies")), label="segment")
        machine = self.process.machines[segment_id]
        assert machine.session is not None
        number = machine.session.replies.popleft()
        self.clock.advance(ROUND_TRIP_SECONDS)  # (a zero round trip would make every block one event)
        if number > machine.state.acknowledged_event_number:
            self.execute(machine, machine.state.acknowledge(number, sent_on_this_session=True))

    def cut(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(sorted(s for s, m in self.process.machines.items()
                                                      if m.session is not None)), label="segment")
        self.break_session(self.process.machines[segment_id])

    def land(self, data: st.DataObject) -> None:
        """The first request still on the way for a segment (per segment they land in order) lands, or is
        lost; a dead process's is lost if the model cannot explain it."""
        firsts: dict[tuple[int, int], int] = {}
        for index, zombie in enumerate(self.zombies):
            firsts.setdefault((zombie.segment, zombie.crash), index)
        index = data.draw(st.sampled_from(sorted(firsts.values())), label="zombie")
        zombie = self.zombies.pop(index)
        if data.draw(st.booleans(), label="lands") and (not zombie.crash or self.zombie_explained(zombie)):
            self.store(zombie.segment, zombie.comparison, zombie.block, zombie.crash)

    # --- Rules: scaling and the hand-over -------------------------------------------------------------------

    @precondition(lambda self: self.model.scales < MAX_SCALES)
    @rule(data=st.data())
    def scale(self, data: st.DataObject) -> None:
        predecessors, ranges = data.draw(st.sampled_from(list(sw.scale_requests(self.model))), label="scale")
        self.take(sw.create_successors, predecessors, ranges)
        for segment_id in range(len(self.attribute) + 1, len(self.model.segments) + 1):
            self.attribute[segment_id] = 0
            self.stored[segment_id] = []
        self.take(sw.record_epoch)
        self.take(sw.seal_predecessors)
        self.sealed |= predecessors
        self.take(sw.activate_epoch)

    def can_hand_over(self, segment_id: int) -> bool:
        """A machine learns of its segment's seal from a refused block: it must hold something."""
        assert self.process is not None
        return segment_id in self.sealed and self.process.machines[segment_id].state.lowest_unacknowledged() is not None

    def hand_over(self, data: st.DataObject) -> None:
        assert self.process is not None
        segment_id = data.draw(st.sampled_from(sorted(s for s in self.process.machines if self.can_hand_over(s))),
                               label="segment")
        self.hand_over_segment(segment_id)

    def hand_over_segment(self, segment_id: int) -> None:
        """``SegmentSealed``, as ``SequencedWriterCore._on_segment_sealed`` does."""
        process = self.process
        assert process is not None
        machine = process.machines[segment_id]
        self.break_session(machine, lost=True)  # the store refuses whatever else it carried
        stored = self.attribute[segment_id]
        self.execute(machine, machine.state.acknowledge_sealed(stored))
        cells = [cell for cell in range(GRID) if process.routing[cell] == segment_id]
        pieces = [SegmentWithRange(0, cell / GRID, (cell + 1) / GRID, "piece") for cell in cells]
        process.ledger.segment_sealed(pieces, stored)
        for cell in cells:  # (a successor may be sealed already: the process meets that seal next)
            process.routing[cell] = self.successor_for(segment_id, cell)
        events = machine.state.retire_sequenced()
        event("a sealed segment's events moved to its successors" if events else "a sealed segment was handed over")
        del process.machines[segment_id]
        names = {self.range_of(s).name: s for s in range(1, len(self.model.segments) + 1)}
        cell_of_key = {key: cell for cell, key in enumerate(KEYS)}
        moved = route_moved(events, lambda key: self.range_of(process.routing[cell_of_key[key or ""]]).name)
        targets = []
        for name, mine in moved.items():
            target = self.machine(names[name])
            target.state.receive_moved(mine)
            targets.append(target)
        for target in targets:
            self.ship(target)
        self.release_holds()

    # --- Rules: crashes and restarts -----------------------------------------------------------------------

    @precondition(lambda self: self.alive() and self.model.crashes < MAX_CRASHES)
    @rule()
    def writer_crash(self) -> None:
        self.crash()

    @precondition(lambda self: self.alive() and self.model.crashes < MAX_CRASHES and bool(self.sessions_with("sent")))
    @rule()
    def writer_crash_with_requests_on_the_way(self) -> None:
        """``writer_crash`` when some request is still on the way (what then lands is the interesting part)."""
        self.crash()

    def crash(self) -> None:
        process = self.process
        assert process is not None
        crash = self.model.crashes + 1
        for segment_id, machine in process.machines.items():
            if machine.session is not None:
                self.zombies.extend(Zombie(segment_id, comparison, block, crash)
                                    for comparison, block in machine.session.sent)
        for zombie in self.zombies:  # the dead process's earlier broken connections' requests too
            if not zombie.crash:
                zombie.crash = crash
        self.take(sw.writer_crash, WRITER)
        self.process = None

    @precondition(lambda self: WRITER not in self.model.alive)
    @rule(data=st.data())
    def writer_restart(self, data: st.DataObject) -> None:
        resume = data.draw(st.integers(0, self.model.written[WRITER]), label="resume after")
        self.take(sw.writer_restart, WRITER, resume)
        self.process = self.new_process()

    @rule()
    def advance_time(self) -> None:
        self.clock.advance(0.01)

    # --- Invariants ----------------------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        self.settle()
        self.model.check_invariants()
        for segment_id, events in self.stored.items():
            assert tuple(sw.StoredEvent(WRITER, n, c) for n, c in events) == self.model.data[segment_id - 1]
            assert self.attribute[segment_id] == self.model.last(segment_id, WRITER)
        process = self.process
        if process is None:
            return
        held: set[tuple[int, int, int] | None] = set()
        charged = 0
        for segment_id, machine in process.machines.items():
            machine.state.check_invariants()
            charged += machine.state.charged()
            for doubt in machine.state.in_doubt():
                number, cell = event_of(doubt.payload)
                assert doubt.application_sequence == number and doubt.routing_key == KEYS[cell]
                assert process.routing[cell] == segment_id, (number, cell, segment_id, process.routing)
                held.add(self.canonical_event(number, cell, segment_id))
        assert process.budget.unacked_bytes == charged
        inflight = {self.canonical_event(e.number, e.key, e.segment) for e in self.model.inflight[WRITER]}
        inflight.discard(None)
        held.discard(None)
        assert inflight <= held, ("the model has in flight what the writer does not", inflight - held)
        stored = {event for events in self.stored.values() for event in events}
        for extra in held - inflight:
            assert extra is not None and extra[:2] in stored, ("held, not in flight, not stored", extra)
        for cell in range(GRID):
            mine = self.canonical(process.routing[cell], cell, process.ledger.floors.floor_of_key(KEYS[cell]))
            model = self.canonical(self.model.table[WRITER][cell], cell, self.model.floor[WRITER][cell])
            assert mine == model, (cell, mine, model, process.routing, self.model.table[WRITER],
                                   process.ledger.floors.pieces(), self.model.floor[WRITER])
        process.ledger.floors.check_invariants()


SequencedWriterStateMachine.TestCase.settings = settings(
    settings.default,
    max_examples=1000 if NIGHTLY else 100,
    stateful_step_count=150 if NIGHTLY else 100,
    deadline=None,
)

TestSequencedWriterStateVsModel = SequencedWriterStateMachine.TestCase


def test_a_setup_inside_a_block_keeps_only_the_events_above_it() -> None:
    """``AckEvent`` by an ``AppendSetup`` whose sequence falls inside a block -- a dead process's request
    landed after this process wrote the same offsets: the block is re-framed without the stored
    events, each kept event with its place in the writer's sequence, and only it goes out."""
    clock = ManualClock()
    budget = WriterBudget(UNACKED_BYTES_MAX)
    segment = SegmentWithRange(0, 0.0, 1.0, "sc/st/0.#epoch.0")
    state = SequencedSegmentWriterState(segment.name, writer_id=uuid.UUID(int=1), budget=budget,
                                        ledger=SequenceLedger(), clock=clock, block_bytes_max=1024,
                                        segment_range=segment)
    assert state.write_sequenced(payload_of(4, 0), KEYS[0], 4) & SHIPPED  # nothing in flight: it leaves alone
    for number in (5, 6, 7):  # one block in flight: these wait for each other
        assert not state.write_sequenced(payload_of(number, 0), KEYS[0], number) & SHIPPED
    assert state.close_open_block()
    state.take_closed()
    assert [block.application_sequences for block in state._inflight] == [[4], [5, 6, 7]]

    instructions = state.setup(6)

    assert isinstance(instructions[-1], Resend) and any(isinstance(i, ReleaseHolds) for i in instructions)
    assert state.acknowledged_event_number == 6
    (block,) = state._inflight
    assert (block.application_sequences, block.sequences, block.last_event_number) == ([7], [4], 7)
    assert [event_of(payload) for payload in codec.iter_events(block.data)] == [(7, 0)]
    assert [(doubt.application_sequence, doubt.sequence) for doubt in state.in_doubt()] == [(7, 4)]
    assert budget.unacked_bytes == state.charged() == block.charge
    state.check_invariants()
    assert state.next_to_send(lambda _state, _sequence: False) is block
