"""The segment writer's machine, driven directly -- no event loop, no thread, no socket -- versus the model.

``millstream.client._segment_writer_state.SegmentWriterState`` is the decision logic of the client's
``SegmentWriter`` (see its module docstring); ``tests/stateful/test_writer_vs_model.py`` drives it through
its adapter, over a real server and a simulated network.  Here Hypothesis drives two machines (writers
``w0`` and ``w1`` of one segment) step by step, playing the segment store and the network itself, and
replays every step on ``millstream.model.idempotent_writer``:

* ``write_event`` -- the machine's ``write_event`` and the model's, with a payload naming the event;
* ``close_block`` -- what ``flush`` and the batch timer do: the open block closes and, if a session
  is up, goes out (``take_closed``, ``sending``, ``sent``, as the adapter does);
* ``deliver`` -- the store takes the first block a session sent: it stores it if its first number
  follows what it stores for the writer and the segment is open (the model's ``store``, event by
  event) and queues a ``DataAppended``; else it answers ``InvalidEventNumber`` or ``SegmentIsSealed``,
  which end the session;
* ``acknowledge`` -- a queued ``DataAppended`` reaches the machine (the model's ``acknowledge``);
* ``cut`` -- the connection breaks: what was sent on it and not yet taken by the store may still land
  later (``zombie``: the store takes it then, if its numbers still fit), its acknowledgements are lost;
* ``setup`` -- a new session's ``AppendSetup`` with what the store holds: the machine acknowledges that
  much and re-sends the rest, in order;
* ``seal`` and ``refuse`` -- the segment is sealed; a writer that met the seal learns what the segment
  stores for it, acknowledges it and fails (the model's ``refuse``);
* ``give_up`` -- a writer fails where it is (the model's ``give_up``).

After every step: both machines' ``check_invariants``; the model's; each machine's acknowledged number
is the model's; the completions it settled are exactly its acknowledged events' (and failed ones only
after ``fail``); the budget counts exactly what the machine holds; what it holds unacknowledged is the
model's ``written - acknowledged``, in order.  Plain Hypothesis: a failure shrinks to a list of these
steps.
"""

from __future__ import annotations

import concurrent.futures
import os
import uuid
from collections import deque

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from millstream.client._segment_writer_state import (
    ARM_BATCH_TIMER,
    OVER_BUDGET,
    REROUTE,
    SHIPPED,
    Block,
    EndSession,
    Instruction,
    ReleaseFlushes,
    Resend,
    SegmentWriterState,
    Settle,
    ShipClosed,
    Tracking,
    WakeCapacity,
    WriterBudget,
)
from millstream.errors import StreamSegmentSealedError
from millstream.model import idempotent_writer as iw
from millstream.testing.clock import ManualClock
from millstream.wire import codec

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
WRITERS = ("w0", "w1")
#: Small blocks and a small budget, so blocks close by size and writers go over budget.
BLOCK_BYTES_MAX = 64
UNACKED_BYTES_MAX = 256
#: The segment is sealed, and a writer gives up, only after this many events were written (so that
#: most steps of a run happen before: each ends what follows).
SEAL_AFTER_EVENTS = 12
GIVE_UP_AFTER_EVENTS = 8


def payload_of(writer: str, number: int) -> bytes:
    return f"{writer}:{number}".encode()


def event_of(payload: bytes) -> iw.Event:
    writer, number = payload.decode().split(":")
    return iw.Event(writer, int(number))


@attrs.define
class Session:
    """One writer's connection: blocks sent on it and not yet taken by the store, acknowledgements on
    their way back."""

    sent: deque[Block] = attrs.Factory(deque)
    replies: deque[int] = attrs.Factory(deque)


@attrs.define
class Writer:
    name: str
    state: SegmentWriterState
    budget: WriterBudget
    session: Session | None = None  # None: no session is set up
    #: Each event's completion (``Tracking``), by its number.
    futures: dict[int, concurrent.futures.Future[None]] = attrs.Factory(dict)
    ended: BaseException | None = None  # why the last session ended


class SegmentWriterStateMachine(RuleBasedStateMachine):
    """Two segment writer machines against a store played by the test, versus the model."""

    @initialize()
    def start(self) -> None:
        self.clock = ManualClock()
        self.model = iw.initial_state(WRITERS)
        self.writers: dict[str, Writer] = {}
        for name in WRITERS:
            budget = WriterBudget(UNACKED_BYTES_MAX)
            state = SegmentWriterState("scope/stream/0.#epoch.0", writer_id=uuid.UUID(int=len(self.writers) + 1),
                                       budget=budget, clock=self.clock, block_bytes_max=BLOCK_BYTES_MAX)
            self.writers[name] = Writer(name, state, budget)
        self.stored: dict[str, int] = dict.fromkeys(WRITERS, 0)  # the writer-id attributes
        self.segment: list[iw.Event] = []
        self.sealed = False
        self.zombies: deque[tuple[str, Block]] = deque()  # sent on a broken connection, still on the way

    # --- Carrying out instructions (as the adapter does) -------------------------------------------------

    def execute(self, writer: Writer, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, Settle):
                for future in instruction.futures:
                    if not future.done():
                        if instruction.error is None:
                            future.set_result(None)
                        else:
                            future.set_exception(instruction.error)
            elif isinstance(instruction, ShipClosed):
                self.ship(writer)
            elif isinstance(instruction, Resend):
                assert writer.session is not None
                for block in writer.state._inflight:
                    self.send(writer, block)
            elif isinstance(instruction, EndSession):
                writer.ended = instruction.reason
                self.break_session(writer)
            else:
                assert isinstance(instruction, WakeCapacity | ReleaseFlushes), instruction

    def send(self, writer: Writer, block: Block) -> None:
        assert writer.session is not None
        writer.state.sending(block)
        writer.session.sent.append(block)
        writer.state.sent()

    def ship(self, writer: Writer) -> None:
        blocks = writer.state.take_closed()
        if writer.session is not None:
            for block in blocks:
                self.send(writer, block)

    def break_session(self, writer: Writer) -> None:
        session, writer.session = writer.session, None
        if session is not None:
            self.zombies.extend((writer.name, block) for block in session.sent)
        writer.state.session_ended()

    def take(self, name: str, block: Block) -> bool:
        """The store takes ``block`` of writer ``name``: stored (True) if its numbers follow what it holds
        and the segment is open."""
        if self.sealed or block.last_event_number - block.event_count != self.stored[name]:
            return False
        for payload in codec.iter_events(block.data):
            event = event_of(payload)
            assert event.writer == name
            self.model = iw.store(self.model, name, event.number)
            self.segment.append(event)
        self.stored[name] = block.last_event_number
        return True

    def active(self, name: str) -> bool:
        return self.writers[name].state.failed is None

    # --- Rules ------------------------------------------------------------------------------------------

    @precondition(lambda self: any(self.active(name) for name in WRITERS))
    @rule(data=st.data(), tracked=st.booleans())
    def write_event(self, data: st.DataObject, tracked: bool) -> None:
        name = data.draw(st.sampled_from([name for name in WRITERS if self.active(name)]), label="writer")
        writer = self.writers[name]
        self.model, number = iw.write_event(self.model, name)
        tracking = Tracking(concurrent.futures.Future) if tracked else None
        flags = writer.state.write_event(payload_of(name, number), f"key-{number % 3}", tracking)
        assert not flags & REROUTE
        assert bool(flags & OVER_BUDGET) == (writer.budget.unacked_bytes > UNACKED_BYTES_MAX)
        if tracking is not None:
            assert tracking.future is not None
            writer.futures[number] = tracking.future  # type: ignore[assignment]
        if flags & SHIPPED:
            self.ship(writer)
        elif flags & ARM_BATCH_TIMER:
            assert writer.state._open_count == 1

    @precondition(lambda self: any(self.active(name) for name in WRITERS))
    @rule(data=st.data(), count=st.integers(1, 12))
    def write_events(self, data: st.DataObject, count: int) -> None:
        """The batch path: a run of ``count`` events in one step -- the model's ``write_event`` for
        each, in order (blocks close at the block size within the run)."""
        name = data.draw(st.sampled_from([name for name in WRITERS if self.active(name)]), label="writer")
        writer = self.writers[name]
        opened_before = writer.state._open_count > 0
        numbers = []
        for _ in range(count):
            self.model, number = iw.write_event(self.model, name)
            numbers.append(number)
        base = writer.budget.sequence + 1
        writer.budget.sequence += count
        flags = writer.state.write_events([payload_of(name, number) for number in numbers],
                                          [f"key-{number % 3}" for number in numbers], list(range(base, base + count)))
        assert not flags & REROUTE
        assert bool(flags & OVER_BUDGET) == (writer.budget.unacked_bytes > UNACKED_BYTES_MAX)
        assert writer.state._open_charge < max(BLOCK_BYTES_MAX, writer.state._close_at) or not writer.state._open_count
        if flags & ARM_BATCH_TIMER:  # a new open block is left for the timer
            assert writer.state._open_count and (flags & SHIPPED or not opened_before)
        if flags & SHIPPED:
            self.ship(writer)

    @precondition(lambda self: any(w.state._open_count for w in self.writers.values()))
    @rule(data=st.data(), by_timer=st.booleans())
    def close_block(self, data: st.DataObject, by_timer: bool) -> None:
        name = data.draw(st.sampled_from([w.name for w in self.writers.values() if w.state._open_count]),
                         label="writer")
        writer = self.writers[name]
        if by_timer:
            self.clock.advance(writer.state.batch_window())
            closed = writer.state.batch_window_passed(writer.state.last_assigned)
        else:
            closed = writer.state.close_open_block()
        if closed:
            self.ship(writer)

    @precondition(lambda self: any(w.session is not None and w.session.sent for w in self.writers.values()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([w.name for w in self.writers.values()
                                          if w.session is not None and w.session.sent]), label="writer")
        writer = self.writers[name]
        assert writer.session is not None
        block = writer.session.sent.popleft()
        if self.take(name, block):
            writer.session.replies.append(block.last_event_number)
        else:  # InvalidEventNumber or SegmentIsSealed: the session ends
            writer.ended = StreamSegmentSealedError("sealed") if self.sealed else None
            self.break_session(writer)

    @precondition(lambda self: bool(self.zombies))
    @rule()
    def zombie(self) -> None:
        name, block = self.zombies.popleft()
        self.take(name, block)  # nobody hears the answer

    @precondition(lambda self: any(w.session is not None and w.session.replies for w in self.writers.values()))
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([w.name for w in self.writers.values()
                                          if w.session is not None and w.session.replies]), label="writer")
        writer = self.writers[name]
        assert writer.session is not None
        number = writer.session.replies.popleft()
        if writer.state.failed is not None:
            return  # a failed writer takes nothing in (its adapter has detached)
        before = writer.state.acknowledged_event_number
        self.execute(writer, writer.state.acknowledge(number, sent_on_this_session=True))
        if number > before:
            self.model = iw.acknowledge(self.model, name, number)

    @precondition(lambda self: any(w.session is not None for w in self.writers.values()))
    @rule(name=st.sampled_from(WRITERS))
    def cut(self, name: str) -> None:
        writer = self.writers[name]
        if writer.session is not None:
            writer.session.replies.clear()
            self.break_session(writer)

    def can_set_up(self, name: str) -> bool:
        writer = self.writers[name]
        return writer.session is None and writer.state.failed is None and not self.sealed

    @precondition(lambda self: any(self.can_set_up(name) for name in WRITERS))
    @rule(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([name for name in WRITERS if self.can_set_up(name)]), label="writer")
        writer = self.writers[name]
        self.ship(writer)  # (no session: nothing is sent)
        writer.session = Session()
        stored = self.stored[name]
        before = writer.state.acknowledged_event_number
        instructions = writer.state.setup(stored)
        assert not any(isinstance(i, EndSession) for i in instructions), instructions
        assert isinstance(instructions[-1], Resend)
        self.execute(writer, instructions)
        if stored > before:
            self.model = iw.acknowledge(self.model, name, stored)

    @precondition(lambda self: not self.sealed and sum(
        self.model.writer(name).written for name in WRITERS) >= SEAL_AFTER_EVENTS)
    @rule()
    def seal(self) -> None:
        self.sealed = True
        self.model = iw.seal(self.model)

    @precondition(lambda self: self.sealed and any(self.active(name) for name in WRITERS))
    @rule(data=st.data())
    def refuse(self, data: st.DataObject) -> None:
        """A writer met the seal: it reads what the segment stores for it, acknowledges that, and fails."""
        name = data.draw(st.sampled_from([name for name in WRITERS if self.active(name)]), label="writer")
        writer = self.writers[name]
        self.break_session(writer)
        stored = self.stored[name]
        writer.state.check_stored(stored)
        if stored > writer.state.acknowledged_event_number:
            self.execute(writer, writer.state.acknowledge(stored, sent_on_this_session=False))
            self.model = iw.acknowledge(self.model, name, stored)
        self.execute(writer, writer.state.fail(StreamSegmentSealedError("sealed")))
        self.model = iw.refuse(self.model, name)

    def may_give_up(self, name: str) -> bool:
        return self.active(name) and self.model.writer(name).written >= GIVE_UP_AFTER_EVENTS

    @precondition(lambda self: any(self.may_give_up(name) for name in WRITERS))
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([name for name in WRITERS if self.may_give_up(name)]), label="writer")
        writer = self.writers[name]
        self.break_session(writer)
        self.execute(writer, writer.state.fail(ConnectionAbortedError("gave up")))
        self.model = iw.give_up(self.model, name)

    @rule()
    def advance_time(self) -> None:
        """Time passes (the batch tracker measures it; and a run whose writers all failed goes on)."""
        self.clock.advance(0.01)

    # --- Invariants ---------------------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        self.model.check_invariants()
        assert tuple(self.segment) == self.model.events
        for name, writer in self.writers.items():
            state = writer.state
            state.check_invariants()
            expected = self.model.writer(name)
            assert state.acknowledged_event_number == expected.acknowledged, (name, state.acknowledged_event_number,
                                                                              expected)
            assert writer.budget.unacked_bytes == state.charged(), (name, writer.budget.unacked_bytes)
            held = [event_of(payload) for payload in state.unacknowledged_payloads()]
            assert held == [iw.Event(name, n) for n in range(expected.acknowledged + 1, expected.written + 1)], (
                name, held, expected)
            assert [event.sequence for event in state.in_doubt()] == list(
                range(expected.acknowledged + 1, expected.written + 1))
            for number, future in writer.futures.items():
                if number <= expected.acknowledged:
                    assert future.done() and future.exception() is None, (name, number)
                elif state.failed is None:
                    assert not future.done(), (name, number)
                else:
                    assert future.done() and future.exception() is state.failed, (name, number)


SegmentWriterStateMachine.TestCase.settings = settings(
    settings.default,
    max_examples=2000 if NIGHTLY else 200,
    stateful_step_count=100 if NIGHTLY else 40,
    deadline=None,
)

TestSegmentWriterStateVsModel = SegmentWriterStateMachine.TestCase
