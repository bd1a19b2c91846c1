"""A writer with a stable writer id: exactly once across writer process restarts, without transactions.

``client.event_writer("scope/stream", serializer, writer_id="ingest-7")`` makes one; each event comes
with the application's own increasing sequence (a source offset, say):
``write_event(event, routing_key=key, sequence=n)``.  After a crash the application starts the
writer again with the same id and replays its source from any earlier offset: every event the
stream already holds comes back ``False`` (a duplicate, dropped), the rest are written -- across
scaling too.  What Pulsar's producer deduplication gives, and Kafka's idempotent producer (whose
producer id dies with the process) does not.

Theory of operation (``spec/StableWriter.tla``; its actions in parentheses).

* Identity.  The stable id maps to one wire writer id per segment, a UUID 5 of the id and the
  segment's name (``wire_writer_id``), and the wire's event number is the application's sequence: a
  block carries the sequence of its last event.  So each segment's writer-id attribute -- stored
  atomically with the data, compared-and-set by every append -- is the last sequence the segment
  stores for this writer id (the spec's ``Last``), and ``AppendSetup`` answers it.  Per segment,
  what is stored is a prefix of what was sent there, in sequence order.
* Starting (``WriterRestart``).  The writer reads the stream's history (every segment from its head,
  ``get_segments_between``), then its current segments, then each segment's attribute -- a segment
  that is no longer current only once its seal is visible, so that what it stores is final.  The
  *deduplication floor* of a point of the key space is the largest sequence stored over every
  segment that ever owned it (the key's chain across epochs): ``Floors``.
* Writing (``WriteEvent``).  A sequence must exceed the last one written through this writer
  (``InvalidSequenceError`` otherwise); an event at or below its key's floor is a duplicate: dropped,
  and ``write_event`` returns ``False``.  Why that is exactly right -- not fewer events (the current
  segment's attribute alone would store again what a predecessor holds) and not more (a floor over
  every predecessor of the current segment would drop an event of one key because a higher sequence
  of another key was stored) -- the spec's header argues, and its mutants show.
* The hold (``AppendEvent``'s guard).  A segment writer sends a block only when no event with a lower
  sequence is unacknowledged on an older segment (an earlier epoch's) that overlaps its own: after a
  merge, the successor would otherwise store 7 (moved from one predecessor) before 6 arrives from the
  other -- and then refuse 6 as stored.  A block is stored all at once, as its events would be one
  after another, so the guard must hold for each of them, that is for its last (the highest): a
  block of 5 and 7 waits for 6 as 7 alone would.  ``_held_by_older`` asks; every acknowledgement and
  hand-over wakes the held writers (``_release_holds``).
* Acknowledgements (``AckEvent``).  ``DataAppended`` acknowledges whole blocks; an ``AppendSetup`` (or
  a sealed segment's attribute) beyond what was acknowledged means a request of an earlier process
  of this writer id landed after this one started: every event at or below it is stored, and a
  block that straddles it is re-framed without them (``_trim_stored``).
* Sealed segments (``SegmentSealed``).  As the random-id writer does (``_writer``), plus: the sealed
  segment's final attribute raises the floor of the key ranges routed to it (a dead process's request
  may have stored there, after this process started, events it has yet to replay -- and their keys
  now go to successors that hold nothing of them), and moved events are merged into the successors'
  unsent events in sequence order (the hold guarantees none of them went out yet).
* A crash of the writer's process (``WriterCrash``) and its requests that still land
  (``ZombieAppend``) need nothing here: the compare-and-set refuses whatever they overtook, and the
  next ``AppendSetup`` tells the truth.
* Giving up.  Reconnecting is ``_writer``'s, within the per-outage reconnect budget
  (``ClientConfig.reconnect_budget_seconds``): an outage that outlasts it fails the whole writer with
  one ``ReconnectBudgetExceededError`` (``WriterShared.give_up``, which this writer's own shared state
  is given too) whose ``in_doubt`` lists every unacknowledged event, across segments, in the order
  written -- each with its place in the writer's sequence, as every writer's, and its
  ``application_sequence``.  That is all a restart needs: a new writer with the same id, given those
  events again with those sequences, drops whichever the stream holds.  Each event therefore carries
  both numbers, side by side, through every re-framing, trim and merge here.

What it does not do.  Two processes must not run with the same stable id at once (like Kafka's
``transactional.id`` or Pulsar's producer name): their events interleave under one identity and the
slower one's are dropped as duplicates.  Events need a routing key (a replay must reach the same
chain of segments).  The floors come from the segments the stream still holds: an event in a segment
that truncation removed is not recognised as a duplicate.  Per-event futures are not offered:
``flush`` says when everything written is durable.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar
from uuid import UUID

from millstream import limits
from millstream.client._config import ClientConfig, RandomSource
from millstream.client._in_doubt import InDoubtEvent
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._routing import StreamRouter, routing_key_fraction
from millstream.client._segment_writer_state import (
    EVENT_HEADER,
    EVENT_LENGTH_MAX,
    HEADER_LENGTH,
    SMALL_EVENT_HEADERS,
    SMALL_EVENT_LENGTH,
    Block,
)
from millstream.client._serializers import Serializer
from millstream.client._streams import SegmentWithRange
from millstream.client._writer import (
    OVER_BUDGET,
    REROUTE,
    SHIPPED,
    AsyncEventStreamWriter,
    SealedHandler,
    SegmentWriter,
    StreamBinding,
    WriterShared,
    _bad_key,
    _log,
    _settle,
)
from millstream.errors import (
    InternalError,
    InvalidArgumentError,
    InvalidSequenceError,
    ObjectClosedError,
    PayloadTooLargeError,
    ProtocolError,
)
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.wire import codec
from millstream.wire.commands import AppendSetup

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

__all__ = ["DUPLICATE", "AsyncSequencedEventStreamWriter", "Floors", "SequencedEventStreamWriter",
           "SequencedSegmentWriter", "SequencedStreamBinding", "SequencedWriterCore", "check_stable_writer_id",
           "wire_writer_id"]

T = TypeVar("T")
R = TypeVar("R")

#: ``SequencedSegmentWriter.append_sequenced`` result flag (besides ``_writer``'s): the event is at or
#: below its key's floor -- the stream holds it already -- and was dropped.
DUPLICATE: Final = 8

#: The UUID 5 namespace of wire writer ids derived from stable writer ids (fixed forever: changing it
#: would make every restarted writer a stranger to what it stored).
_STABLE_WRITER_NAMESPACE: Final = UUID("6f1c3b0e-5a57-4c21-9d0a-4d2a3c7be1a5")


def wire_writer_id(writer_id: str, segment: str) -> UUID:
    """The writer id a stable writer id appends to ``segment`` under (a UUID 5: never a random
    writer's UUID 4)."""
    return uuid.uuid5(_STABLE_WRITER_NAMESPACE, f"{writer_id}\x00{segment}")


def check_stable_writer_id(writer_id: object) -> str:
    """``writer_id`` if it is a usable stable writer id, else ``InvalidArgumentError``."""
    if not isinstance(writer_id, str) or not 0 < len(writer_id) <= limits.STABLE_WRITER_ID_LENGTH_MAX \
            or not writer_id.isprintable():
        raise InvalidArgumentError(
            f"a stable writer id is a printable str of 1 to {limits.STABLE_WRITER_ID_LENGTH_MAX} characters, "
            f"not {writer_id!r}")
    return writer_id


def _check_sequence(sequence: object) -> int:
    if type(sequence) is not int or not 0 < sequence < limits.STABLE_WRITER_SEQUENCE_LIMIT:
        if sequence is None:
            raise InvalidSequenceError("a writer with a stable writer id needs a sequence for every event "
                                       "(write_event(event, routing_key=..., sequence=n))")
        raise InvalidSequenceError(f"a sequence is an int in [1, 2**63), not {sequence!r}")
    return sequence


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


class SequencedShared(WriterShared):
    """``WriterShared`` plus what a writer with a stable id keeps for all its segments (under the lock):
    the floors, the last sequence written, how many duplicates were dropped."""

    __slots__ = ("duplicates", "floors", "last_sequence")

    def __init__(self, loop: asyncio.AbstractEventLoop, unacked_bytes_max: int) -> None:
        super().__init__(loop, unacked_bytes_max)
        self.floors = Floors()
        self.last_sequence = 0
        self.duplicates = 0


#: An event a sequenced segment writer holds: payload, routing key, application sequence, and its place
#: in the writer's sequence (``InDoubtEvent.sequence``; the two grow together, see ``append_sequenced``).
SequencedEvent = tuple[bytes, str | None, int, int]


class SequencedSegmentWriter(SegmentWriter):
    """A ``SegmentWriter`` whose event numbers are the application's sequences (see the module
    docstring): blocks end at their last event's sequence, a block is sent only when ``hold`` lets it,
    and an ``AppendSetup`` beyond what was acknowledged acknowledges what it covers.

    Each event carries two numbers: its application sequence (``_application_sequences``,
    ``Block.application_sequences``: what numbers it on the wire) and, as in every ``SegmentWriter``,
    its place in the writer's sequence (``_sequences``, ``Block.sequences``: what names it in the
    in-doubt set).  Both are taken under the writer's lock by the same ``append_sequenced`` and both
    only grow, so every re-framing, merge and trim here keeps them side by side, in the same order."""

    def __init__(self, segment: str, *, shared: SequencedShared, pool: ConnectionPool, locator: SegmentLocator,
                 token: str, writer_id: UUID, config: ClientConfig, on_sealed: SealedHandler,
                 segment_range: SegmentWithRange, hold: Callable[[SequencedSegmentWriter, int], bool],
                 progressed: Callable[[], None]) -> None:
        super().__init__(segment, shared=shared, pool=pool, locator=locator, token=token, writer_id=writer_id,
                         config=config, on_sealed=on_sealed)
        self._sequenced_shared = shared
        self.segment_range = segment_range
        self._hold = hold
        self._progressed = progressed
        self._application_sequences: list[int] = []  # the open block's events' application sequences
        #: The next block waits for an older overlapping segment's lower sequences (see ``_pump``).
        self.held = False

    # --- Producer side (any thread) -----------------------------------------------------------------

    def append(self, payload: bytes, routing_key: str | None, tracking: object) -> int:
        raise InternalError("a sequenced segment writer takes events through append_sequenced")

    def append_sequenced(self, payload: bytes, routing_key: str, sequence: int) -> int:
        """Add one event with its sequence; return ``SHIPPED``/``OVER_BUDGET`` flags, ``DUPLICATE`` (at
        or below its key's floor: dropped) or ``REROUTE`` (nothing added, the sequence not taken: the
        segment was sealed and its keys moved on).  Raises the writer's error, ``InvalidSequenceError``
        (not above the last sequence written) or ``PayloadTooLargeError`` -- nothing added then."""
        length = len(payload)
        if length > EVENT_LENGTH_MAX:
            raise PayloadTooLargeError(f"an event of {length} bytes exceeds the limit of {EVENT_LENGTH_MAX} bytes")
        shared = self._sequenced_shared
        lock = shared.lock
        lock.acquire()
        try:
            if shared.error is not None:
                shared.raise_error()
            if self._closing:
                if self._retired:
                    return REROUTE
                raise ObjectClosedError("the writer is closed")
            if sequence <= shared.last_sequence:
                raise InvalidSequenceError(
                    f"sequence {sequence} does not exceed {shared.last_sequence}, the last sequence written through "
                    "this writer: sequences must increase")
            floors = shared.floors
            shared.last_sequence = sequence
            # The event's place in the writer's sequence.  A duplicate takes one too: places then count
            # the application's calls (``events_written``), and a dropped event is as durable as an
            # acknowledged one -- the stream held it already -- so it is never in doubt.
            shared.sequence += 1
            if sequence <= floors.maximum and sequence <= floors.floor_of_key(routing_key):
                shared.duplicates += 1
                return DUPLICATE
            self._add_locked(payload, routing_key, sequence, shared.sequence)
            arm = -1
            if self._open_charge >= self._close_at:
                self.close_block()
                shipped = SHIPPED
            else:
                shipped = 0
                if self._open_count == 1:
                    arm = self._last_assigned
            over = OVER_BUDGET if shared.unacked_bytes > shared.unacked_bytes_max else 0
        finally:
            lock.release()
        if shipped:
            self._ship()
        elif arm >= 0:
            self._arm_batch_timer(arm)
        return shipped | over

    def _add_locked(self, payload: bytes, routing_key: str | None, sequence: int, place: int) -> None:
        """(Lock held.)  Frame one event (application sequence ``sequence``, place ``place`` in the
        writer's sequence) into the open block."""
        length = len(payload)
        self._parts.append(SMALL_EVENT_HEADERS[length] if length < SMALL_EVENT_LENGTH else EVENT_HEADER(0, length))
        self._parts.append(payload)
        self._keys.append(routing_key)
        self._application_sequences.append(sequence)
        self._sequences.append(place)
        length += HEADER_LENGTH
        if routing_key is not None:
            length += len(routing_key)
        self._open_charge += length
        self._open_count += 1
        self._sequenced_shared.unacked_bytes += length

    def close_block(self) -> None:
        """The open block leaves, numbered by its last event's sequence.  Caller holds the lock."""
        sequences = self._application_sequences
        self._application_sequences = []
        self._queue_open_block(sequences[-1], sequences)

    def lowest_unacknowledged_locked(self) -> int | None:
        """(Lock held.)  The lowest sequence this writer holds unacknowledged (None: none)."""
        for blocks in (self._inflight, self._outbox):
            if blocks:
                sequences = blocks[0].application_sequences
                assert sequences is not None
                return sequences[0]
        return self._application_sequences[0] if self._application_sequences else None

    # --- Loop side ---------------------------------------------------------------------------------

    def _drain_outbox(self) -> None:
        self._drain_scheduled = False
        outbox = self._outbox
        inflight = self._inflight
        while outbox:
            inflight.append(outbox.popleft())
        self._pump()

    def _pump(self) -> None:
        """Send the blocks not yet sent on this session, in order, until one must wait (``hold``, asked
        about the block's last sequence: sent, it makes the segment refuse every lower one)."""
        if not self._ready:
            return
        inflight = self._inflight
        if inflight and self._sent == 0 and inflight[0].application_sequences[0] <= self._acked:  # type: ignore[index]
            self._trim_stored(self._acked)  # written after a setup said these are stored
        while self._sent < len(inflight):
            block = inflight[self._sent]
            assert block.application_sequences is not None
            if self._hold(self, block.last_event_number):
                self.held = True
                return
            block.ever_sent = True
            before = self._sent
            self._send(block)
            if self._sent == before or not self._ready:
                return
        self.held = False

    def ship(self) -> None:
        """(Loop thread.)  Send what may be sent (after a hand-over, or when a hold was released)."""
        self._drain_outbox()

    def in_doubt_events(self) -> list[InDoubtEvent]:
        """(Loop thread.)  ``SegmentWriter.in_doubt_events``, each event with its application sequence."""
        self._drain_outbox()
        segment = self.segment
        with self._shared.lock:
            events = [InDoubtEvent(place, segment, key, payload, sequence) for block in self._inflight
                      for place, key, payload, sequence in zip(block.sequences, block.keys,
                                                               codec.iter_events(block.data),
                                                               block.application_sequences or (), strict=True)]
            events.extend(InDoubtEvent(place, segment, key, payload, sequence) for place, key, payload, sequence
                          in zip(self._sequences, self._keys, self._parts[1::2], self._application_sequences,
                                 strict=True))
        return events

    def _on_setup(self, reply: AppendSetup) -> None:
        if reply.writer_id != self._writer_id or self._ready:
            raise ProtocolError(f"unexpected AppendSetup for writer {reply.writer_id}")
        self._drain_outbox()  # (not ready: nothing is sent)
        stored = 0 if reply.last_event_number == NULL_ATTRIBUTE_VALUE else reply.last_event_number
        if stored < self._acked:
            self._end_session(ProtocolError(
                f"the server stores sequence {stored} for writer {self._writer_id} on {self.segment!r}, but "
                f"acknowledged {self._acked}: acknowledged events are missing"))
            return
        if stored > self._acked:
            self._trim_stored(stored)
        self._ready = True
        self._sent = 0
        self._pump()

    _REPLY_HANDLERS = {**SegmentWriter._REPLY_HANDLERS, AppendSetup: _on_setup}

    def _acknowledge_through(self, number: int, *, sent_on_this_session: bool) -> None:
        super()._acknowledge_through(number, sent_on_this_session=sent_on_this_session)
        self._progressed()

    def _trim_stored(self, stored: int) -> None:
        """``AckEvent``: the segment stores this writer id's events up to sequence ``stored`` -- some
        perhaps stored by an earlier process of the id, whose request landed after this one started.
        Acknowledge every block at or below it, and re-frame a block that straddles it without the
        events it covers.  Only blocks not sent on the current session are touched."""
        if self._sent:
            raise InternalError(f"writer {self._writer_id}: blocks sent on this session would be trimmed below "
                                f"sequence {stored}")
        # Settled here rather than by ``_acknowledge_through``, which takes its number as the new
        # acknowledged one and ships what waits: ``stored`` may lie beyond these blocks, and nothing may
        # be sent before the trim is done.
        inflight = self._inflight
        count = freed = 0
        while inflight and inflight[0].last_event_number <= stored:
            block = inflight.popleft()
            count += 1
            freed += block.charge
            _settle(block.future, None)
        if inflight and inflight[0].application_sequences[0] <= stored:  # type: ignore[index]
            freed += self._reframe_front(stored)
        self._acked = max(self._acked, stored)
        shared = self._sequenced_shared
        with shared.lock:
            shared.unacked_bytes -= freed
            self._blocks_unacked -= count
            self._close_at = 0 if self._blocks_unacked == 0 else self._target_bytes
            wake = shared.unacked_bytes <= shared.unacked_bytes_max // 2
        if wake:
            shared.wake_capacity_waiters()
        self._release_flush_waiters()
        self._progressed()

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

    def _release_flush_waiters(self) -> None:
        waiting = []
        for target, waiter in self._flush_waiters:
            if self._acked >= target:
                if not waiter.done():
                    waiter.set_result(True)
            else:
                waiting.append((target, waiter))
        self._flush_waiters = waiting

    # --- The hand-over after a seal (loop thread) ------------------------------------------------

    def acknowledge_stored(self, stored: int) -> None:
        """The session is over and the sealed segment stores this writer id's events up to ``stored``
        (its final attribute): acknowledge them (``_trim_stored``), so that only events it does not
        hold are handed over."""
        self._drain_outbox()
        if stored < self._acked:
            raise ProtocolError(f"segment {self.segment!r} stores sequence {stored} for writer {self._writer_id}, "
                                f"but {self._acked} was acknowledged")
        if stored > self._acked:
            self._trim_stored(stored)

    def retire_sequenced_locked(self) -> list[SequencedEvent]:
        """(Lock held.)  ``retire_locked``, with each event's application sequence (besides its place)."""
        sequences = [s for block in (*self._inflight, *self._outbox) for s in block.application_sequences or ()]
        sequences.extend(self._application_sequences)
        events = self.retire_locked()
        self._application_sequences = []
        return [(payload, key, sequence, place)
                for (payload, key, _, place), sequence in zip(events, sequences, strict=True)]

    def take_unsent_locked(self) -> list[SequencedEvent]:
        """(Lock held.)  Take out every event that never went out (blocks never sent, queued or open), in
        order, releasing their bytes: a hand-over merges events into them by sequence."""
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
        self._sequenced_shared.unacked_bytes -= freed
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

    def add_moved_locked(self, events: Iterable[SequencedEvent]) -> None:
        """(Lock held.)  Add events in sequence order (all above what this writer sent), each keeping its
        place in the writer's sequence, filling blocks up to the block size; ``close_open_block``
        ends the last."""
        for payload, key, sequence, place in events:
            self._add_locked(payload, key, sequence, place)
            if self._open_charge >= self._config.writer_block_bytes_max:
                self.close_block()

    def check_invariants(self) -> None:
        """Blocks hold increasing sequences above the acknowledged one, each numbered by its last; the
        events' places in the writer's sequence increase with them; the counts and charges agree."""
        with self._shared.lock:
            blocks = list(self._inflight) + list(self._outbox)
            previous = self._acked
            places: list[int] = []
            for block in blocks:
                sequences = block.application_sequences
                assert sequences is not None and len(sequences) == block.event_count > 0, block
                assert len(block.sequences) == len(block.keys) == block.event_count, block
                assert sequences[0] > previous and sequences == sorted(set(sequences)), (previous, sequences)
                assert block.last_event_number == sequences[-1]
                assert codec.count_events(block.data) == block.event_count
                assert block.charge == len(block.data) + sum(len(key) for key in block.keys if key is not None)
                previous = sequences[-1]
                places.extend(block.sequences)
            open_sequences = self._application_sequences
            assert open_sequences == sorted(set(open_sequences)) and all(s > previous for s in open_sequences)
            assert len(open_sequences) == len(self._sequences) == len(self._keys) == self._open_count
            assert len(self._parts) == 2 * self._open_count
            assert self._open_charge == sum(len(part) for part in self._parts) + sum(
                len(key) for key in self._keys if key is not None)
            places.extend(self._sequences)
            # Places and application sequences are taken together and both grow (``append_sequenced``);
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


class SequencedStreamBinding(StreamBinding, Protocol):
    """What a writer with a stable id asks about its stream besides ``StreamBinding``'s questions."""

    async def history(self) -> Sequence[SegmentWithRange]:
        """Every segment of the stream from its head, of every epoch."""
        ...

    async def stored_sequence(self, segment: str, writer_id: UUID) -> int:
        """The writer-id attribute of ``segment`` now (0: none), sealed or not."""
        ...


class SequencedWriterCore(AsyncEventStreamWriter[T]):
    """The stream writer under ``AsyncSequencedEventStreamWriter``: ``AsyncEventStreamWriter``'s routing,
    hand-over and flushing, with ``SequencedSegmentWriter``s (see the module docstring)."""

    def __init__(self, *, pool: ConnectionPool, locator: SegmentLocator, serializer: Serializer[T], token: str,
                 config: ClientConfig, rng: RandomSource, stream: SequencedStreamBinding, writer_id: str) -> None:
        super().__init__(pool=pool, locator=locator, router=None, serializer=serializer, token=token, config=config,
                         rng=rng, stream=stream)
        self._sequenced: SequencedShared = SequencedShared(asyncio.get_running_loop(), config.writer_unacked_bytes_max)
        self._shared = self._sequenced
        # (It replaces the base class's shared state, so it takes over the giving up that the base class
        # gave that: one segment writer giving up fails them all, with the in-doubt set of them all.)
        self._sequenced.give_up = self._give_up
        self._binding = stream
        self.writer_id = check_stable_writer_id(writer_id)
        self._floors_ready = False
        self._floors_lock = asyncio.Lock()

    @property
    def shared(self) -> SequencedShared:
        return self._sequenced

    @property
    def floors_ready(self) -> bool:
        return self._floors_ready

    async def ready(self) -> None:
        """``WriterRestart``: learn the stream's history, then its current segments (routing), then
        what every segment stores for this writer id -- a segment no longer current once its seal is
        visible -- and set the floors.  Raises what the controller or the segment stores raise (the
        writer stays unready: a later call asks again)."""
        if self._floors_ready:
            return
        async with self._floors_lock:
            if self._floors_ready:
                return
            history = list(await self._binding.history())
            await super().ready()
            router = self._router
            assert isinstance(router, StreamRouter)
            current = {s.name: s for s in router.segments()}
            segments = {s.name: s for s in history}
            segments.update(current)
            gate = asyncio.Semaphore(limits.STABLE_WRITER_ATTRIBUTE_READS_CONCURRENT_MAX)

            async def stored(segment: SegmentWithRange) -> tuple[SegmentWithRange, int]:
                async with gate:
                    wire = wire_writer_id(self.writer_id, segment.name)
                    if segment.name in current:
                        return segment, await self._binding.stored_sequence(segment.name, wire)
                    return segment, await self._binding.stored_event_number(segment.name, wire)
            found = await asyncio.gather(*(stored(s) for s in segments.values()))
            floors = Floors(found)
            with self._sequenced.lock:
                self._sequenced.floors = floors
                self._floors_ready = True
            _log.info("writer %s on %s: started with the floors of %d segments (largest sequence stored: %d)",
                      self.writer_id, self.stream, len(found), floors.maximum)

    def _new_writer_locked(self, segment: str) -> SegmentWriter:
        router = self._router
        assert isinstance(router, StreamRouter)
        segment_range = router.segment_named(segment)
        if segment_range is None:
            raise InternalError(f"a segment writer for {segment!r}, which is not routed to")
        writer = SequencedSegmentWriter(
            segment, shared=self._sequenced, pool=self._pool, locator=self._locator, token=self._token,
            writer_id=wire_writer_id(self.writer_id, segment), config=self._config, on_sealed=self._on_segment_sealed,
            segment_range=segment_range, hold=self._held_by_older, progressed=self._release_holds)
        self._writers[segment] = writer
        return writer

    # --- The per-event path (any thread) ----------------------------------------------------------

    def add_sequenced(self, event: T, routing_key: str, sequence: int) -> int:
        """Buffer one event with its sequence: ``append_sequenced``'s flags.  Raises
        ``InvalidSequenceError``, ``InvalidArgumentError`` (no routing key, or one the serializer
        refuses), ``PayloadTooLargeError`` -- nothing buffered then -- or the writer's error."""
        sequence = _check_sequence(sequence)
        if not self._floors_ready:
            raise InvalidArgumentError("the writer has not learnt the stream yet: await ready() first")
        if type(routing_key) is not str:
            if routing_key is None:
                raise InvalidArgumentError("a writer with a stable writer id needs a routing key for every event "
                                           "(a replay must reach the segments the first write reached)")
            raise _bad_key(routing_key)
        if self._identity and type(event) is bytes:
            payload: bytes = event  # type: ignore[assignment]
        else:
            payload = self._serialize(event)
            if type(payload) is not bytes:
                raise InvalidArgumentError(f"{self._serializer!r} returned {type(payload).__name__}, not bytes")
        for _ in range(limits.CLIENT_WRITER_REROUTES_MAX):
            segment = self._lookup(routing_key) or self._segment_for(routing_key)
            writer = self._writers.get(segment)
            if writer is None:
                writer = self._open_segment(segment, routing_key)
            assert isinstance(writer, SequencedSegmentWriter)
            flags = writer.append_sequenced(payload, routing_key, sequence)
            if not flags & REROUTE:
                return flags
        raise InternalError(f"an event was routed {limits.CLIENT_WRITER_REROUTES_MAX} times to segments whose keys "
                            "had moved on")

    # --- The hold ----------------------------------------------------------------------------------

    def _held_by_older(self, writer: SequencedSegmentWriter, sequence: int) -> bool:
        """Whether ``writer`` must not send ``sequence`` yet: a lower sequence is unacknowledged on a segment
        of an earlier epoch that overlaps ``writer``'s (it may still move to ``writer``)."""
        mine = writer.segment_range
        with self._sequenced.lock:
            for other in self._writers.values():
                if other is writer or not isinstance(other, SequencedSegmentWriter):
                    continue
                theirs = other.segment_range
                if theirs.epoch < mine.epoch and theirs.key_start < mine.key_end and mine.key_start < theirs.key_end:
                    lowest = other.lowest_unacknowledged_locked()
                    if lowest is not None and lowest < sequence:
                        return True
        return False

    def _release_holds(self) -> None:
        """(Loop thread.)  Something was acknowledged or handed over: let held writers try again."""
        for writer in list(self._writers.values()):
            if isinstance(writer, SequencedSegmentWriter) and writer.held:
                writer.ship()

    # --- Scaling -----------------------------------------------------------------------------------

    async def _on_segment_sealed(self, writer: SegmentWriter) -> None:
        """``SegmentSealed``: as ``AsyncEventStreamWriter._on_segment_sealed``, plus the floor of the
        ranges routed to the sealed segment is raised to its final attribute, and moved events are
        merged into each successor's unsent events by sequence."""
        assert isinstance(writer, SequencedSegmentWriter)
        stream = self._binding
        router = self._router
        assert isinstance(router, StreamRouter)
        sealed = router.segment_named(writer.segment)
        if sealed is None:
            raise InternalError(f"segment {writer.segment!r} has a writer but is not routed to")
        stored = await stream.stored_event_number(writer.segment, writer.writer_id)
        writer.acknowledge_stored(stored)
        successors = await stream.successors(sealed)
        shared = self._sequenced
        touched: dict[str, SequencedSegmentWriter] = {}
        created: list[SequencedSegmentWriter] = []
        with shared.lock:
            shared.raise_error()
            if self._closed:
                raise ObjectClosedError(f"the writer was closed before the events of sealed segment {sealed.name!r} "
                                        "moved to its successors")
            taken = router.replace(sealed, successors)
            self._follow_view(router)
            for pieces in taken.values():
                for piece in pieces:
                    shared.floors.raise_range(piece.key_start, piece.key_end, stored)
            events = writer.retire_sequenced_locked()
            del self._writers[writer.segment]
            moved: dict[str, list[SequencedEvent]] = {}
            for event in events:
                moved.setdefault(router.segment_for(event[1]), []).append(event)
            for name, mine in moved.items():
                target = self._writers.get(name)
                if target is None:
                    target = self._new_writer_locked(name)
                    created.append(target)  # type: ignore[arg-type]
                assert isinstance(target, SequencedSegmentWriter)
                touched[name] = target
                unsent = target.take_unsent_locked()
                target.add_moved_locked(heapq.merge(unsent, mine, key=lambda e: e[2]))
                target.close_open_block()
            self.hand_overs += 1
        _log.info("writer %s on %s: segment %s sealed (it stores sequences up to %d); %d unacknowledged events "
                  "moved to %s", self.writer_id, self.stream, sealed.name, stored, len(events), sorted(touched))
        for target in created:
            self._start(target)
        for target in touched.values():
            target.ship()
        self._release_holds()

    def check_invariants(self) -> None:
        super().check_invariants()
        with self._sequenced.lock:
            pieces = self._sequenced.floors.pieces()
            assert pieces[0][0] == 0.0 and pieces[-1][1] == 1.0
            assert max(value for _, _, value in pieces) == self._sequenced.floors.maximum or not pieces


class AsyncSequencedEventStreamWriter(Generic[T]):
    """Writes a stream exactly once across restarts of its process: a stable writer id and, per event,
    the application's increasing sequence (see the module docstring).  Made by
    ``AsyncClient.event_writer(stream, serializer, writer_id=...)``.

    ``write_event`` returns ``True`` when the event is taken (durable once ``flush`` returns) and
    ``False`` when the stream already holds it (a duplicate of what an earlier process of this writer
    id stored: dropped).  ``deduplication_floor(key)`` says up to which sequence a key's events count
    as duplicates."""

    def __init__(self, core: SequencedWriterCore[T]) -> None:
        self._core = core
        self._shared = core.shared

    @property
    def writer_id(self) -> str:
        return self._core.writer_id

    @property
    def stream(self) -> str | None:
        return self._core.stream

    @property
    def core(self) -> SequencedWriterCore[T]:
        return self._core

    @property
    def duplicates(self) -> int:
        """Events dropped so far because the stream held them already."""
        return self._shared.duplicates

    @property
    def last_sequence(self) -> int:
        """The last sequence written (or dropped) through this writer; the next must exceed it (0: none)."""
        return self._shared.last_sequence

    @property
    def events_written(self) -> int:
        """How many events ``write_event`` took -- dropped duplicates included -- the last one's place
        in the writer's sequence (``InDoubtEvent.sequence``)."""
        return self._core.events_written

    def in_doubt_events(self) -> tuple[InDoubtEvent, ...]:
        """Every event written and not acknowledged, over all segments, in the order written, each with
        its ``application_sequence``: what is in doubt if the writer fails now -- and, once it gave up,
        what its ``ReconnectBudgetExceededError`` carries as ``in_doubt`` (see the module docstring)."""
        return self._core.in_doubt_events()

    async def ready(self) -> None:
        """Learn the stream and the floors now (the first ``write_event`` does it otherwise)."""
        await self._core.ready()

    def deduplication_floor(self, routing_key: str) -> int:
        """The largest sequence the stream held from this writer id, when this writer started, among the
        segments ``routing_key`` has lived in -- raised when one of them is sealed under this writer
        (0: none).  An event of that key at or below it is dropped as a duplicate; this writer's own
        events do not raise it.  ``InvalidArgumentError`` before ``ready``."""
        if not self._core.floors_ready:
            raise InvalidArgumentError("the writer has not learnt the stream yet: call ready() or write first")
        if type(routing_key) is not str:
            raise _bad_key(routing_key)
        with self._shared.lock:
            return self._shared.floors.floor_of_key(routing_key)

    async def write_event(self, event: T, *, routing_key: str, sequence: int) -> bool:
        """Buffer ``event`` with its ``sequence`` (above every sequence written before through this writer)
        for the segment of ``routing_key``: ``True``; or drop it: ``False``, when the stream holds it
        already.  Waits only while too much is unacknowledged.  Raises ``InvalidSequenceError``,
        ``InvalidArgumentError``, ``PayloadTooLargeError`` (nothing written then) or the writer's error."""
        core = self._core
        if not core.floors_ready:
            await core.ready()
        flags = core.add_sequenced(event, routing_key, sequence)
        if flags & DUPLICATE:
            return False
        if flags & OVER_BUDGET:
            await self._shared.wait_for_capacity()
        elif flags:
            await core._after_shipping()
        return True

    async def flush(self) -> None:
        """Wait until every event written so far is durable.  Raises the writer's error, if any."""
        await self._core.flush()

    async def close(self, *, flush: bool = True) -> None:
        """Flush, then stop (``flush=False``: stop at once, what is unacknowledged stays in doubt; see
        ``AsyncEventStreamWriter.close``)."""
        await self._core.close(flush=flush)

    @property
    def closed(self) -> bool:
        return self._core.closed

    def check_invariants(self) -> None:
        self._core.check_invariants()

    async def __aenter__(self) -> AsyncSequencedEventStreamWriter[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _Runner(Protocol):
    """The blocking client's event-loop thread (``_blocking._LoopThread``)."""

    @property
    def thread(self) -> threading.Thread: ...

    def run(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None) -> R: ...


class SequencedEventStreamWriter(Generic[T]):
    """The blocking flavour of ``AsyncSequencedEventStreamWriter`` (made by ``Client.event_writer(stream,
    serializer, writer_id=...)``, ready when returned).  Thread-safe; the sequences of all threads
    together must increase."""

    def __init__(self, core: SequencedWriterCore[T], runner: _Runner) -> None:
        self._core = core
        self._shared = core.shared
        self._runner = runner

    @property
    def writer_id(self) -> str:
        return self._core.writer_id

    @property
    def core(self) -> SequencedWriterCore[T]:
        return self._core

    @property
    def duplicates(self) -> int:
        """Events dropped so far because the stream held them already."""
        return self._shared.duplicates

    @property
    def last_sequence(self) -> int:
        """The last sequence written (or dropped) through this writer (0: none)."""
        return self._shared.last_sequence

    @property
    def events_written(self) -> int:
        """See ``AsyncSequencedEventStreamWriter.events_written``."""
        return self._core.events_written

    def in_doubt_events(self) -> tuple[InDoubtEvent, ...]:
        """See ``AsyncSequencedEventStreamWriter.in_doubt_events``."""
        async def collect() -> tuple[InDoubtEvent, ...]:
            return self._core.in_doubt_events()
        return self._runner.run(collect())

    def deduplication_floor(self, routing_key: str) -> int:
        """See ``AsyncSequencedEventStreamWriter.deduplication_floor``."""
        if type(routing_key) is not str:
            raise _bad_key(routing_key)
        with self._shared.lock:
            return self._shared.floors.floor_of_key(routing_key)

    def write_event(self, event: T, *, routing_key: str, sequence: int) -> bool:
        """See ``AsyncSequencedEventStreamWriter.write_event``: ``True`` written, ``False`` a duplicate."""
        flags = self._core.add_sequenced(event, routing_key, sequence)
        if flags & DUPLICATE:
            return False
        if flags & OVER_BUDGET:
            self._runner.run(self._shared.wait_for_capacity())
        return True

    def flush(self) -> None:
        """Wait until every event written so far is durable.  Raises the writer's error, if any."""
        self._runner.run(self._core.flush())

    def close(self, *, flush: bool = True) -> None:
        """Flush, then stop (``flush=False``: stop at once; see ``AsyncEventStreamWriter.close``)."""
        self._runner.run(self._core.close(flush=flush))

    def __enter__(self) -> SequencedEventStreamWriter[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
