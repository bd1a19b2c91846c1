"""The stable-id writer's decisions as a synchronous machine: events in, instructions out.

Theory of operation.  This is the client's half of ``millstream.model.stable_writer`` (the executable
mirror of ``spec/StableWriter.tla``): the decisions of a ``_sequenced_writer.SequencedSegmentWriter``
and of the stream writer above it, with no thread, no event loop, no connection and no future of
their own.  ``SequencedSegmentWriterState`` is ``_segment_writer_state.SegmentWriterState`` (blocks,
acknowledgements, resends, the budget) whose event numbers are the application's sequences; it
answers with the same instructions (``ReleaseHolds`` is its own: the base machine never gives it).  The adapter
(``_sequenced_writer``) feeds it what happens, serializes every call (the writer's lock; the methods
that touch only what is sent run on the event loop's thread, as the base machine's do) and carries
out what it answers.  A test drives the machines alone, against the model
(``tests/stateful/test_sequenced_writer_state_vs_model.py``), and the adapter over a real node
(``tests/stateful/test_stable_writer_vs_model.py``).

The spec's actions, and what they are here:

* ``WriterRestart`` -- the adapter reads what every segment the stream ever had stores for the
  writer id; ``Floors(stored)`` turns that into the deduplication floor of every point of the key
  space (the largest sequence stored over the key's chain of segments), kept in the writer's
  ``SequenceLedger`` with the last sequence written.  A restarted writer is a fresh machine given
  those floors.
* ``WriteEvent`` -- ``write_sequenced``: a sequence must exceed the last one written
  (``InvalidSequenceError``); an event at or below its key's floor is a duplicate (``DUPLICATE``:
  dropped, counted); else it is framed into the open block (``_add``), which closes, as the base
  machine's does, numbered by its last event's *sequence* (``close_block``).  Bit flags, as the base
  machine's ``write_event``: this step runs once per event.
* ``AppendEvent``'s guard, the hold -- ``next_to_send``: the next block not yet sent on this session
  goes out only if ``held_by_older`` (a function of all the writer's segment machines) says no lower
  sequence is unacknowledged on an older, overlapping segment -- asked about the block's last
  (highest) sequence, since a block is stored all at once.  Otherwise the machine is ``held`` until a
  ``ReleaseHolds`` lets it ask again.
* ``AckEvent`` -- ``acknowledge`` (a ``DataAppended``: whole blocks, then ``ReleaseHolds``) and
  ``setup`` (an ``AppendSetup``): what the segment stores may exceed what was acknowledged -- a
  request of an earlier process of this writer id landed after this one started -- so ``trim_stored``
  acknowledges every event at or below it and re-frames a block that straddles it
  (``_reframe_front``); then ``Resend``, which the adapter carries out through ``next_to_send``.
  ``trim_unsent`` does the same for blocks written after a setup said their sequences are stored.
* ``SegmentSealed`` -- ``acknowledge_sealed`` takes in the sealed segment's final attribute;
  ``SequenceLedger.segment_sealed`` raises the floor of the key ranges that were routed to it;
  ``retire_sequenced`` takes its unacknowledged events out; ``route_moved`` groups them by successor,
  and each successor's ``receive_moved`` merges them into its unsent events in sequence order
  (``merge_moved``; the hold guarantees none of theirs with a higher sequence went out).
* ``WriterCrash`` and ``ZombieAppend`` need nothing here: the store's compare-and-set refuses what a
  dead process's request overtook, and the next ``AppendSetup`` (``setup``) says what it stores.

Each event carries two numbers side by side through every re-framing, trim and merge: its
application sequence (``_application_sequences``, ``Block.application_sequences``: what numbers it on
the wire) and its place in the writer's sequence (``_sequences``, ``Block.sequences``: what names it
in the in-doubt set).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias
from uuid import UUID

from millstream.client._in_doubt import InDoubtEvent
from millstream.client._routing import routing_key_fraction
from millstream.client._segment_writer_state import (
    ARM_BATCH_TIMER,
    EVENT_HEADER,
    EVENT_LENGTH_MAX,
    HEADER_LENGTH,
    OVER_BUDGET,
    SHIPPED,
    SMALL_EVENT_HEADERS,
    SMALL_EVENT_LENGTH,
    Block,
    EndSession,
    Instruction,
    ReleaseFlushes,
    ReleaseHolds,
    Resend,
    SegmentWriterState,
    Settle,
    WakeCapacity,
    WriterBudget,
)
from millstream.client._streams import SegmentWithRange
from millstream.errors import (
    InternalError,
    InvalidSequenceError,
    ProtocolError,
)
from millstream.wire import codec

if TYPE_CHECKING:
    from millstream.client._segment_writer_state import Completion
    from millstream.clock import Clock

__all__ = ["DUPLICATE", "Floors", "KeyRange", "ReleaseHolds", "SequenceLedger", "SequencedEvent",
           "SequencedSegmentWriterState", "held_by_older", "merge_moved", "route_moved"]

#: ``SequencedSegmentWriterState.write_sequenced`` result flag (besides the base machine's): the event
#: is at or below its key's floor -- the stream holds it already -- and was dropped.
DUPLICATE: Final = 16

#: An event a sequenced segment writer holds: payload, routing key, application sequence, and its place
#: in the writer's sequence (``InDoubtEvent.sequence``; the two grow together, see ``write_sequenced``).
SequencedEvent: TypeAlias = tuple[bytes, str | None, int, int]


_RELEASE_HOLDS: Final = ReleaseHolds()
_RESEND: Final = Resend()


class Floors:
    """The deduplication floor of every point of [0, 1): the largest sequence stored for the writer id
    over every segment that ever owned the point.  Piecewise constant: ``_ends[i]`` ends the ``i``-th
    piece, whose floor is ``_values[i]``; ``maximum`` is the largest (a sequence above it needs no
    lookup).  Read and raised with the writer's lock held."""

    __slots__ = ("_ends", "_values", "maximum")

    def __init__(self, stored: Iterable[tuple[SegmentWithRange, int]] = ()) -> None:
        segments = list(stored)
        points = sorted({0.0, 1.0, *(s.key_start for s, _ in segments), *(s.key_end for s, _ in segments)})
        self._ends = points[1:]
        self._values = [0] * len(self._ends)
        self.maximum = 0
        for segment, value in segments:
            self.raise_range(segment.key_start, segment.key_end, value)

    def floor(self, fraction: float) -> int:
        """The floor at the point ``fraction`` of [0, 1)."""
        return self._values[bisect.bisect_right(self._ends, fraction)]

    def floor_of_key(self, routing_key: str) -> int:
        return self.floor(routing_key_fraction(routing_key))

    def _split_at(self, point: float) -> None:
        if point <= 0.0 or point >= 1.0:
            return
        index = bisect.bisect_left(self._ends, point)
        if self._ends[index] != point:  # the piece ending at _ends[index] contains the point: cut it
            self._ends.insert(index, point)
            self._values.insert(index, self._values[index])

    def raise_range(self, key_start: float, key_end: float, value: int) -> None:
        """Raise the floor of [``key_start``, ``key_end``) to at least ``value``."""
        if value <= 0:
            return
        self._split_at(key_start)
        self._split_at(key_end)
        start = bisect.bisect_right(self._ends, key_start)
        for index in range(start, len(self._ends)):
            if self._ends[index] > key_end:
                break
            self._values[index] = max(self._values[index], value)
        self.maximum = max(self.maximum, value)

    def pieces(self) -> list[tuple[float, float, int]]:
        """``(start, end, floor)`` of each piece, in key order (for tests and ``check_invariants``)."""
        starts = [0.0, *self._ends[:-1]]
        return list(zip(starts, self._ends, self._values, strict=True))

    def check_invariants(self) -> None:
        pieces = self.pieces()
        assert pieces[0][0] == 0.0 and pieces[-1][1] == 1.0
        assert max(value for _, _, value in pieces) == self.maximum or not pieces


class KeyRange(Protocol):
    """A part of the key space, [``key_start``, ``key_end``) (a ``SegmentWithRange``, a ``RoutedRange``)."""

    @property
    def key_start(self) -> float: ...

    @property
    def key_end(self) -> float: ...


class SequenceLedger:
    """What a writer with a stable id keeps for all its segments (under the writer's lock): the floors
    (the spec's ``floor``), the last sequence written (``written``) and how many duplicates were
    dropped."""

    __slots__ = ("duplicates", "floors", "last_sequence")

    def __init__(self, floors: Floors | None = None) -> None:
        self.floors = floors if floors is not None else Floors()
        self.last_sequence = 0
        self.duplicates = 0

    def segment_sealed(self, pieces: Iterable[KeyRange], stored: int) -> None:
        """``SegmentSealed``: the key ranges that were routed to a sealed segment (``pieces``) get its
        final attribute ``stored`` as their floor at least -- a dead process's request may have stored
        there, after this process started, events it has yet to replay, and their keys now go to
        successors that hold nothing of them."""
        for piece in pieces:
            self.floors.raise_range(piece.key_start, piece.key_end, stored)


def _first_sequence(block: Block) -> int:
    """The application sequence of ``block``'s first event (a sequenced writer's blocks all carry them)."""
    sequences = block.application_sequences
    assert sequences is not None
    return sequences[0]


class SequencedSegmentWriterState(SegmentWriterState):
    """``SegmentWriterState`` for a writer with a stable id: blocks end at their last event's sequence,
    a block goes out only when the hold lets it (``next_to_send``), and what a segment says it stores
    beyond what was acknowledged is acknowledged (``trim_stored``).  See the module docstring."""

    __slots__ = ("_application_sequences", "_ledger", "held", "segment_range")

    def __init__(self, segment: str, *, writer_id: UUID, budget: WriterBudget, ledger: SequenceLedger,
                 clock: Clock, block_bytes_max: int, segment_range: SegmentWithRange) -> None:
        super().__init__(segment, writer_id=writer_id, budget=budget, clock=clock, block_bytes_max=block_bytes_max)
        self.start_sequenced(ledger, segment_range)

    def start_sequenced(self, ledger: SequenceLedger, segment_range: SegmentWithRange) -> None:
        """Set up what the stable-id machine adds (``__init__``'s, for an adapter that initialises
        ``SegmentWriterState`` itself)."""
        self._ledger = ledger
        self.segment_range = segment_range
        self._application_sequences: list[int] = []  # the open block's events' application sequences
        #: The next block waits for an older overlapping segment's lower sequences (``next_to_send``).
        self.held = False

    # --- WriteEvent ----------------------------------------------------------------------------------

    def write_event(self, payload: bytes, routing_key: str | None, tracking: object) -> int:
        raise InternalError("a sequenced segment writer takes events through write_sequenced")

    def write_sequenced(self, payload: bytes, routing_key: str, sequence: int) -> int:
        """``WriteEvent``: add one event with its sequence; return ``SHIPPED`` / ``ARM_BATCH_TIMER`` /
        ``OVER_BUDGET`` flags (as ``write_event``), ``DUPLICATE`` (at or below its key's floor:
        dropped) or ``REROUTE`` alone (nothing added, the sequence not taken: the segment was sealed
        and its keys moved on).  Raises the writer's error, ``ObjectClosedError``,
        ``InvalidSequenceError`` (not above the last sequence written) or ``PayloadTooLargeError`` --
        nothing added then.  The per-event step."""
        length = len(payload)
        shared = self._shared
        if length > EVENT_LENGTH_MAX or shared.error is not None or self._closing:
            return self._refuse(length)
        ledger = self._ledger
        if sequence <= ledger.last_sequence:
            raise InvalidSequenceError(
                f"sequence {sequence} does not exceed {ledger.last_sequence}, the last sequence written through "
                "this writer: sequences must increase")
        ledger.last_sequence = sequence
        # The event's place in the writer's sequence.  A duplicate takes one too: places then count
        # the application's calls (``events_written``), and a dropped event is as durable as an
        # acknowledged one -- the stream held it already -- so it is never in doubt.
        shared.sequence += 1
        floors = ledger.floors
        if sequence <= floors.maximum and sequence <= floors.floor_of_key(routing_key):
            ledger.duplicates += 1
            return DUPLICATE
        self._application_sequences.append(sequence)  # (``_add``, inlined: the per-event step)
        self._frame(payload, routing_key, shared.sequence)
        if self._open_charge >= self._close_at:
            self.close_block()
            flags = SHIPPED
        elif self._open_count == 1:
            flags = ARM_BATCH_TIMER
        else:
            flags = 0
        if shared.unacked_bytes > shared.unacked_bytes_max:
            return flags | OVER_BUDGET
        return flags

    def _add(self, payload: bytes, routing_key: str | None, sequence: int, place: int) -> None:
        """Frame one event (application sequence ``sequence``, place ``place`` in the writer's
        sequence) into the open block."""
        self._application_sequences.append(sequence)
        self._frame(payload, routing_key, place)

    def close_block(self) -> None:
        """The open block leaves, numbered by its last event's sequence."""
        sequences = self._application_sequences
        self._application_sequences = []
        self._queue_open_block(sequences[-1], sequences)

    # --- AppendEvent's guard: the hold ---------------------------------------------------------------

    def lowest_unacknowledged(self) -> int | None:
        """The lowest sequence this writer holds unacknowledged (None: none)."""
        for blocks in (self._inflight, self._outbox):
            if blocks:
                sequences = blocks[0].application_sequences
                assert sequences is not None
                return sequences[0]
        return self._application_sequences[0] if self._application_sequences else None

    def next_to_send(self, held: Callable[[SequencedSegmentWriterState, int], bool]) -> Block | None:
        """The next block to send on this session (the caller sends it: ``sending``, ``sent``), or None:
        every block went out, or the next is ``held`` -- ``held(self, its last sequence)``, which
        ``held_by_older`` answers: sent, it would make the segment refuse every lower sequence."""
        inflight = self._inflight
        if self._sent >= len(inflight):
            self.held = False
            return None
        block = inflight[self._sent]
        if held(self, block.last_event_number):
            self.held = True
            return None
        block.ever_sent = True
        return block

    # --- AckEvent ------------------------------------------------------------------------------------

    def setup(self, stored: int) -> list[Instruction]:
        """``AppendSetup``: the segment stores this writer id's sequences up to ``stored`` -- perhaps
        beyond anything this process sent (an earlier process's request landed): acknowledge that much
        (``trim_stored``), then ``Resend`` (through ``next_to_send``); or, if ``stored`` is below what
        was acknowledged (acknowledged events are missing), ``EndSession`` alone."""
        self.take_closed()
        if stored < self._acked:
            return [EndSession(ProtocolError(
                f"the server stores sequence {stored} for writer {self._writer_id} on {self.segment!r}, but "
                f"acknowledged {self._acked}: acknowledged events are missing"))]
        instructions: list[Instruction] = self.trim_stored(stored) if stored > self._acked else []
        self._sent = 0
        instructions.append(_RESEND)
        return instructions

    def acknowledge(self, number: int, *, sent_on_this_session: bool) -> list[Instruction]:
        """``AckEvent`` by a ``DataAppended``: the base machine's, then ``ReleaseHolds``."""
        instructions = super().acknowledge(number, sent_on_this_session=sent_on_this_session)
        instructions.append(_RELEASE_HOLDS)
        return instructions

    def trim_unsent(self) -> list[Instruction]:
        """Before sending on a session: blocks written after a setup said their first sequences are
        stored are trimmed (``trim_stored`` of what was acknowledged).  Nothing if there are none."""
        inflight = self._inflight
        if inflight and self._sent == 0 and _first_sequence(inflight[0]) <= self._acked:
            return self.trim_stored(self._acked)
        return []

    def trim_stored(self, stored: int) -> list[Instruction]:
        """``AckEvent``: the segment stores this writer id's events up to sequence ``stored`` -- some
        perhaps stored by an earlier process of the id, whose request landed after this one started.
        Acknowledge every block at or below it, and re-frame a block that straddles it without the
        events it covers.  Only blocks not sent on the current session are touched (``InternalError``
        otherwise)."""
        if self._sent:
            raise InternalError(f"writer {self._writer_id}: blocks sent on this session would be trimmed below "
                                f"sequence {stored}")
        # Not ``acknowledge``, which takes its number as the new acknowledged one and closes what
        # waits: ``stored`` may lie beyond these blocks, and nothing may be sent before the trim is done.
        self.take_closed()
        inflight = self._inflight
        count = freed = 0
        futures: list[Completion] = []
        while inflight and inflight[0].last_event_number <= stored:
            block = inflight.popleft()
            count += 1
            freed += block.charge
            if block.future is not None:
                futures.append(block.future)
        if inflight and _first_sequence(inflight[0]) <= stored:
            freed += self._reframe_front(stored)
        self._acked = max(self._acked, stored)
        shared = self._shared
        shared.unacked_bytes -= freed
        self._blocks_unacked -= count
        self._close_at = 0 if self._blocks_unacked == 0 else self._target_bytes
        instructions: list[Instruction] = [Settle(futures, None)] if futures else []
        if shared.unacked_bytes <= shared.unacked_bytes_max // 2:
            instructions.append(WakeCapacity())
        instructions.append(ReleaseFlushes(self._acked))
        instructions.append(_RELEASE_HOLDS)
        return instructions

    def _reframe_front(self, stored: int) -> int:
        """The first block straddles ``stored``: keep only its events above it, in a block of their own.
        Returns the charge freed."""
        old = self._inflight[0]
        assert old.application_sequences is not None
        events = zip(codec.iter_events(old.data), old.keys, old.application_sequences, old.sequences, strict=True)
        kept = [(payload, key, sequence, place) for payload, key, sequence, place in events if sequence > stored]
        parts: list[bytes] = []
        charge = 0
        for payload, key, _, _ in kept:
            length = len(payload)
            parts.append(SMALL_EVENT_HEADERS[length] if length < SMALL_EVENT_LENGTH else EVENT_HEADER(0, length))
            parts.append(payload)
            charge += length + HEADER_LENGTH + (len(key) if key is not None else 0)
        new = Block(b"".join(parts), [key for _, key, _, _ in kept], charge, len(kept), old.last_event_number,
                    old.future, [place for _, _, _, place in kept], [sequence for _, _, sequence, _ in kept])
        self._inflight[0] = new
        return old.charge - charge

    # --- SegmentSealed -------------------------------------------------------------------------------

    def acknowledge_sealed(self, stored: int) -> list[Instruction]:
        """The session is over and the sealed segment stores this writer id's events up to ``stored``
        (its final attribute): acknowledge them (``trim_stored``), so that only events it does not hold
        are handed over.  ``ProtocolError`` if ``stored`` is below what was acknowledged."""
        self.take_closed()
        if stored < self._acked:
            raise ProtocolError(f"segment {self.segment!r} stores sequence {stored} for writer {self._writer_id}, "
                                f"but {self._acked} was acknowledged")
        return self.trim_stored(stored) if stored > self._acked else []

    def retire_sequenced(self) -> list[SequencedEvent]:
        """``retire``, with each event's application sequence (besides its place) and without the
        completions (a writer with a stable id offers none per event)."""
        sequences = [s for block in (*self._inflight, *self._outbox) for s in block.application_sequences or ()]
        sequences.extend(self._application_sequences)
        events = self.retire()
        self._application_sequences = []
        return [(payload, key, sequence, place)
                for (payload, key, _, place), sequence in zip(events, sequences, strict=True)]

    def take_unsent(self) -> list[SequencedEvent]:
        """Take out every event that never went out (blocks never sent, queued or open), in order,
        releasing their bytes: a hand-over merges events into them by sequence."""
        taken: list[Block] = []
        while self._inflight and not self._inflight[-1].ever_sent:
            taken.append(self._inflight.pop())
        taken.reverse()
        taken.extend(self._outbox)
        self._outbox.clear()
        events: list[SequencedEvent] = []
        freed = self._open_charge
        for block in taken:
            assert block.application_sequences is not None
            events.extend(zip(codec.iter_events(block.data), block.keys, block.application_sequences,
                              block.sequences, strict=True))
            freed += block.charge
        events.extend(zip(self._parts[1::2], self._keys, self._application_sequences, self._sequences, strict=True))
        self._blocks_unacked -= len(taken)
        self._shared.unacked_bytes -= freed
        self._parts = []
        self._keys = []
        self._sequences = []
        self._application_sequences = []
        self._open_charge = self._open_count = 0
        self._open_future = None
        last = self._inflight[-1].last_event_number if self._inflight else self._acked
        self._last_assigned = last
        self._sent = min(self._sent, len(self._inflight))
        self._close_at = 0 if self._blocks_unacked == 0 else self._target_bytes
        return events

    def add_moved(self, events: Iterable[SequencedEvent]) -> None:
        """Add events in sequence order (all above what this writer sent), each keeping its place in the
        writer's sequence, filling blocks up to the block size; ``close_open_block`` ends the last."""
        for payload, key, sequence, place in events:
            self._add(payload, key, sequence, place)
            if self._open_charge >= self._block_bytes_max:
                self.close_block()

    def receive_moved(self, moved: Iterable[SequencedEvent]) -> None:
        """``SegmentSealed`` at a successor: ``moved`` (in sequence order) joins the events this writer
        never sent, merged by sequence (``merge_moved``), and they leave in blocks, the last closed now."""
        self.add_moved(merge_moved(self.take_unsent(), moved))
        self.close_open_block()

    # --- What it holds -------------------------------------------------------------------------------

    def in_doubt(self) -> list[InDoubtEvent]:
        """The events not acknowledged -- in flight, queued, open -- in order, each with its application
        sequence."""
        segment = self.segment
        events = [InDoubtEvent(place, segment, key, payload, sequence)
                  for block in itertools.chain(self._inflight, self._outbox)
                  for place, key, payload, sequence in zip(block.sequences, block.keys, codec.iter_events(block.data),
                                                           block.application_sequences or (), strict=True)]
        events.extend(InDoubtEvent(place, segment, key, payload, sequence) for place, key, payload, sequence
                      in zip(self._sequences, self._keys, self._parts[1::2], self._application_sequences,
                             strict=True))
        return events

    def check_invariants(self) -> None:
        """Blocks hold increasing sequences above the acknowledged one, each numbered by its last; the
        events' places in the writer's sequence increase with them; the counts and charges agree.  (The
        first events not sent may lie at or below the acknowledged sequence: written after a setup said
        the segment stores them, and taken out by ``trim_unsent`` before anything is sent.)"""
        blocks = list(self._inflight) + list(self._outbox)
        previous = self._acked
        places: list[int] = []
        for block in blocks:
            sequences = block.application_sequences
            assert sequences is not None and len(sequences) == block.event_count > 0, block
            assert len(block.sequences) == len(block.keys) == block.event_count, block
            assert sequences[0] > previous or (previous == self._acked and not block.ever_sent), (previous, sequences)
            assert sequences == sorted(set(sequences)), sequences
            assert block.last_event_number == sequences[-1]
            assert codec.count_events(block.data) == block.event_count
            assert block.charge == len(block.data) + sum(len(key) for key in block.keys if key is not None)
            previous = sequences[-1]
            places.extend(block.sequences)
        open_sequences = self._application_sequences
        assert open_sequences == sorted(set(open_sequences))
        assert not open_sequences or open_sequences[0] > previous or previous == self._acked, (previous, open_sequences)
        assert len(open_sequences) == len(self._sequences) == len(self._keys) == self._open_count
        assert len(self._parts) == 2 * self._open_count
        assert self._open_charge == sum(len(part) for part in self._parts) + sum(
            len(key) for key in self._keys if key is not None)
        places.extend(self._sequences)
        # Places and application sequences are taken together and both grow (``write_sequenced``);
        # merges are by sequence, so the places of what this writer holds grow too.
        assert places == sorted(set(places)) and all(0 < place <= self._shared.sequence for place in places), (
            places, self._shared.sequence)
        if blocks:
            assert self._last_assigned == previous, (self._last_assigned, previous)
        ever = [block.ever_sent for block in self._inflight]
        assert ever == sorted(ever, reverse=True), "a block never sent precedes one that was"
        assert 0 <= self._sent <= len(self._inflight)
        if self._failed is None and not self._closing:
            assert len(blocks) == self._blocks_unacked, (len(blocks), self._blocks_unacked)
        if self._retired:
            assert self._closing and not blocks and not self._open_count


# --- The stream-level decisions ------------------------------------------------------------------------


def held_by_older(writer: SequencedSegmentWriterState, sequence: int, writers: Iterable[SegmentWriterState]) -> bool:
    """``Held``: whether ``writer`` must not send ``sequence`` yet -- a lower sequence is unacknowledged
    on a segment of an earlier epoch that overlaps ``writer``'s (it may still move to ``writer``).
    ``writers``: every segment machine of the writer (with the writer's lock held)."""
    mine = writer.segment_range
    for other in writers:
        if other is writer or not isinstance(other, SequencedSegmentWriterState):
            continue
        theirs = other.segment_range
        if theirs.epoch < mine.epoch and theirs.key_start < mine.key_end and mine.key_start < theirs.key_end:
            lowest = other.lowest_unacknowledged()
            if lowest is not None and lowest < sequence:
                return True
    return False


def route_moved(events: Iterable[SequencedEvent], segment_for: Callable[[str | None], str],
                ) -> dict[str, list[SequencedEvent]]:
    """A sealed segment's events (``retire_sequenced``), grouped by the successor that now owns each
    one's key (``segment_for``: the router, patched), each group in the order retired (by sequence)."""
    moved: dict[str, list[SequencedEvent]] = {}
    for event in events:
        moved.setdefault(segment_for(event[1]), []).append(event)
    return moved


def merge_moved(unsent: Iterable[SequencedEvent], moved: Iterable[SequencedEvent]) -> Iterable[SequencedEvent]:
    """A successor's unsent events and the events moved to it, each in sequence order, merged by sequence."""
    return heapq.merge(unsent, moved, key=lambda event: event[2])
