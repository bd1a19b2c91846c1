"""One segment writer's state as a synchronous machine: events in, instructions out.

Theory of operation.  This is the client's half of ``millstream.model.idempotent_writer`` (and of
``spec/StreamOrdering.tla``'s writer): the decisions of a ``_writer.SegmentWriter``, with no thread,
no event loop, no connection and no future of its own.  An adapter (``_writer.SegmentWriter``) feeds
it what happens -- an event written, an ``AppendSetup``, a ``DataAppended``, a failure, a seal -- and
carries out what it answers: send these blocks, settle these completions, wake whoever waits for
budget, release flushes, end the session.  The adapter also serializes every call (the writer's
lock): the machine is not thread-safe, and needs not be.  A test drives the machine alone, against
the model (``tests/stateful/test_segment_writer_state_vs_model.py``), and the adapter through the
event loop (``tests/stateful/test_writer_vs_model.py``).

The model's actions, and what they are here:

* ``write_event`` -- ``write_event``: the event takes its place in the writer's sequence (shared by all
  segments of the writer: ``WriterBudget.sequence``) and is framed (``type 0 | length | payload``)
  into the open block.  Its *event number* -- the model's -- is given when its block closes
  (``close_block``): blocks are numbered by their last event, and a block closes when nothing is in
  flight, when it reaches the size the ``BlockSizeTracker`` asks for, or when the batch window has
  passed (``batch_window_passed``).  This step runs once per event, so it answers with bit flags
  (``SHIPPED``, ``OVER_BUDGET``, ``REROUTE``, ``ARM_BATCH_TIMER``) rather than instruction objects:
  nothing is made per event.  ``write_events`` is the same step for a run of events (the batch path):
  all or nothing, blocks closing at the block size within the run; ``write_framed`` is it for a run
  framed already (the columnar path), whose blocks are cut from the run's bytes.  The open block's
  parts are framed bytes: a header and a payload per ``write_event``, a run of events per
  ``write_framed``.
* ``store`` -- the server's; the machine learns of it through ``acknowledge`` and ``setup``.
* ``acknowledge`` -- ``acknowledge``: a ``DataAppended`` for event ``n`` acknowledges every block up to
  ``n`` (cumulative: a stale or reordered one is ignored; one that ends no block sent is a protocol
  error).  ``setup``: an ``AppendSetup`` says what the segment stores for this writer id; that much is
  acknowledged (its acknowledgement may have been lost with the old connection), the rest is re-sent,
  in order, with the same numbers and bytes -- so a block is stored once however often it is sent.
  A number beyond anything this writer id ever sent is another writer's: ``WriterIdInUseError``.
* ``seal`` / ``refuse`` -- a writer of named segments fails (``fail``) once what the segment stores is
  acknowledged; a stream writer hands its events over to the successors (``retire`` takes them out,
  ``write_moved_event`` adds them to a successor's machine, keeping their places in the sequence).
* ``give_up`` -- ``fail``: every unacknowledged event's completion fails; the events stay
  (``in_doubt``, ``unacknowledged_payloads``).

Instructions are small slotted values (``Settle``, ``WakeCapacity``, ``ReleaseFlushes``, ``ShipClosed``,
``Resend``, ``EndSession``), answered as a list per step (per block, not per event).  Time arrives
through the injected clock (``now`` is read only when a block closes or is sent), completions through
the factory a caller hands in with an event (``Tracking``): the machine stores them and answers which
to settle, and never touches one.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeAlias, cast
from uuid import UUID

from millstream import limits
from millstream.client._batching import BlockSizeTracker
from millstream.client._in_doubt import InDoubtEvent
from millstream.errors import ObjectClosedError, PayloadTooLargeError, ProtocolError, WriterIdInUseError
from millstream.wire import codec

__all__ = ["ARM_BATCH_TIMER", "OVER_BUDGET", "REROUTE", "SHIPPED", "Block", "EndSession", "Instruction",
           "ReleaseFlushes", "ReleaseHolds", "Resend", "SegmentWriterState", "Settle", "ShipClosed", "Tracking",
           "WakeCapacity", "WriterBudget"]

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from millstream.clock import Clock

    #: A per-event completion: an ``asyncio.Future`` (the async flavour) or a
    #: ``concurrent.futures.Future``.  The machine only keeps them and says which to settle.
    Completion: TypeAlias = asyncio.Future[None] | concurrent.futures.Future[None]

EVENT_HEADER: Final = struct.Struct(">ii").pack
HEADER_LENGTH: Final = 8
#: Event headers for payloads under this many bytes, made once (indexing a list beats packing a struct).
SMALL_EVENT_LENGTH: Final = 4096
SMALL_EVENT_HEADERS: Final = [EVENT_HEADER(0, length) for length in range(SMALL_EVENT_LENGTH)]
EVENT_LENGTH_MAX: Final = limits.EVENT_LENGTH_BYTES_MAX


def _event_header(length: int) -> bytes:
    """The header of an event of ``length`` bytes (``write_events``' runs with events of 4 KiB or more)."""
    return EVENT_HEADER(0, length)

#: ``SegmentWriterState.write_event`` results (bit flags): the per-event step's instructions.
SHIPPED: Final = 1  # a block was closed: ship it (and an async caller yields once, for acknowledgements)
OVER_BUDGET: Final = 2  # too much is unacknowledged: the caller waits for capacity
REROUTE: Final = 4  # nothing added: the segment was sealed and its keys moved on; route the event again
ARM_BATCH_TIMER: Final = 8  # a new open block: close it when the batch window has passed (``batch_window_passed``)


class Block:
    """A closed block: framed events numbered up to ``last_event_number``, their routing keys (what
    re-routes them if the segment is sealed under them), their places in the writer's sequence
    (``sequences``: what names them in the in-doubt set), what they are charged against the writer's
    budget (``charge``: the framed bytes plus the keys' characters), and the completion its tracked
    events share (a block is stored all together or not at all, so one answers for all of them).  A
    writer with a stable id (``_sequenced_writer``) numbers events by the application's sequences:
    ``application_sequences`` holds each event's (None for a writer with a random id; not to be
    confused with ``sequences``, the places, which every writer keeps), and ``ever_sent`` says whether
    the block ever went out (a block never sent may be re-framed)."""

    __slots__ = ("application_sequences", "charge", "data", "event_count", "ever_sent", "future", "keys",
                 "last_event_number", "sent_at", "sequences")

    def __init__(self, data: bytes, keys: list[str | None], charge: int, event_count: int, last_event_number: int,
                 future: Completion | None, sequences: list[int], application_sequences: list[int] | None = None,
                 ) -> None:
        self.data = data
        self.keys = keys
        self.sequences = sequences
        self.charge = charge
        self.event_count = event_count
        self.last_event_number = last_event_number
        self.future = future
        self.sent_at = 0.0
        self.application_sequences = application_sequences
        self.ever_sent = False


class Tracking:
    """Asks ``write_event`` for the completion of the event's block: ``factory`` makes one if the open
    block has none yet; ``future`` is what the event got."""

    __slots__ = ("factory", "future")

    def __init__(self, factory: Callable[[], Completion]) -> None:
        self.factory = factory
        self.future: Completion | None = None


class WriterBudget:
    """What the segment writers of one event writer count together: the unacknowledged bytes against
    their bound, the count of events written (``sequence``: the last event's place in the writer's
    sequence), the writer's first error and whether it is closed.  Plain values: the adapter's
    ``_writer.WriterShared`` adds the lock that guards them and the waiters for capacity."""

    __slots__ = ("closed", "error", "sequence", "unacked_bytes", "unacked_bytes_max")

    def __init__(self, unacked_bytes_max: int) -> None:
        self.unacked_bytes = 0
        self.unacked_bytes_max = unacked_bytes_max
        self.error: BaseException | None = None
        self.closed = False
        self.sequence = 0

    def raise_error(self) -> None:
        error = self.error
        if error is not None:
            raise error.with_traceback(None)


# --- Instructions ------------------------------------------------------------------------------------


class Settle:
    """Complete each of ``futures`` (those not done yet): with ``error``, or durable if it is None."""

    __slots__ = ("error", "futures")

    def __init__(self, futures: list[Completion], error: BaseException | None) -> None:
        self.futures = futures
        self.error = error


class WakeCapacity:
    """At most half the budget is unacknowledged: let writers waiting for capacity re-check it."""

    __slots__ = ()


class ReleaseFlushes:
    """Every event up to ``number`` is acknowledged: release the flushes waiting for no more."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


class ShipClosed:
    """Closed blocks wait: take them to the session (``take_closed``) and send them if it is ready."""

    __slots__ = ()


class Resend:
    """The session is set up: send every block in flight, from the first, in order (each announced by
    ``sending`` and counted by ``sent``) -- blocks closed meanwhile too."""

    __slots__ = ()


class EndSession:
    """End the current session with ``reason`` (the session loop decides what comes next)."""

    __slots__ = ("reason",)

    def __init__(self, reason: BaseException) -> None:
        self.reason = reason


class ReleaseHolds:
    """(A writer with a stable id: ``_sequenced_writer_state``.)  Something was acknowledged or handed
    over: let every held segment writer of the writer ask ``next_to_send`` again (an older segment's
    lower sequences may be gone)."""

    __slots__ = ()


Instruction: TypeAlias = "Settle | WakeCapacity | ReleaseFlushes | ShipClosed | Resend | EndSession | ReleaseHolds"

_WAKE: Final = WakeCapacity()
_SHIP: Final = ShipClosed()
_RESEND: Final = Resend()


class SegmentWriterState:
    """The state of one writer id's appends to one segment: the open block, the closed blocks on their
    way to the session (``_outbox``), the blocks closed and not acknowledged (``_inflight``, in number
    order; the first ``_sent`` of them went out on the current session), the numbering, what was
    acknowledged, the batching and the budget.  See the module docstring for the actions."""

    __slots__ = ("_acked", "_block_bytes_max", "_blocks_unacked", "_clock", "_close_at", "_closing",
                 "_failed", "_inflight", "_keys", "_last_assigned", "_open_charge", "_open_count", "_open_future",
                 "_outbox", "_parts", "_retired", "_sent", "_sent_max", "_sequences", "_shared", "_target_bytes",
                 "_tracker", "_writer_id", "segment")

    def __init__(self, segment: str, *, writer_id: UUID, budget: WriterBudget, clock: Clock,
                 block_bytes_max: int) -> None:
        self.segment = segment
        self._writer_id = writer_id
        self._shared = budget
        self._clock = clock
        self._block_bytes_max = block_bytes_max
        # The open block.
        self._parts: list[bytes] = []  # framed events: header, payload, ... (or runs of them: write_framed)
        self._keys: list[str | None] = []  # the open block's routing keys, one per event
        self._sequences: list[int] = []  # the open block's events' places in the writer's sequence
        # The open block's charge: its framed bytes (what goes on the wire) and its routing keys'
        # characters (kept until acknowledged, never sent).  Blocks close by it.
        self._open_charge = 0
        self._open_count = 0
        self._open_future: Completion | None = None  # shared by the open block's tracked events
        # Numbering and batching.
        self._last_assigned = 0  # the last event number given to a closed block
        self._blocks_unacked = 0  # closed and not acknowledged
        self._tracker = BlockSizeTracker(now=clock.monotonic(), block_bytes_max=block_bytes_max,
                                         window_seconds_max=limits.CLIENT_WRITER_BATCH_WINDOW_SECONDS_MAX)
        self._target_bytes = self._tracker.target()
        self._close_at = 0  # close the open block at this many bytes: 0 while nothing is in flight, else the target
        self._outbox: deque[Block] = deque()  # closed blocks on their way to _inflight (a FIFO)
        self._closing = False
        self._retired = False  # sealed and handed over: writes answer REROUTE
        # Acknowledgements and sends.
        self._inflight: deque[Block] = deque()  # closed, not acknowledged, in number order (_sent: a prefix)
        self._acked = 0  # the last event number acknowledged
        self._sent = 0  # how many of _inflight (a prefix) went out on the current session
        self._sent_max = 0  # the largest event number ever sent under this writer id (any session)
        self._failed: BaseException | None = None

    # --- Questions -----------------------------------------------------------------------------------

    @property
    def acknowledged_event_number(self) -> int:
        """The last event number acknowledged (0: none)."""
        return self._acked

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def retired(self) -> bool:
        """Whether the segment was sealed and this writer's events were handed over elsewhere."""
        return self._retired

    @property
    def last_assigned(self) -> int:
        """The number of the last event of the last block closed (what a flush waits for)."""
        return self._last_assigned

    # --- write_event ---------------------------------------------------------------------------------

    def write_event(self, payload: bytes, routing_key: str | None, tracking: Tracking | None) -> int:
        """``write_event``: add one event to the open block; return ``SHIPPED`` (a block closed),
        ``ARM_BATCH_TIMER`` (a new open block: close it within the batch window, after event
        ``last_assigned``), ``OVER_BUDGET`` -- or ``REROUTE`` alone (nothing added: the segment was
        sealed and its keys now go elsewhere).  With ``tracking``, also hand out the completion of the
        event's block.  Raises the writer's error, ``ObjectClosedError`` or ``PayloadTooLargeError``
        (nothing added).  The per-event step: every line here is paid per event."""
        length = len(payload)
        shared = self._shared
        if length > EVENT_LENGTH_MAX or shared.error is not None or self._closing:
            return self._refuse(length)
        parts = self._parts
        parts.append(SMALL_EVENT_HEADERS[length] if length < SMALL_EVENT_LENGTH else EVENT_HEADER(0, length))
        parts.append(payload)
        self._keys.append(routing_key)
        sequence = shared.sequence = shared.sequence + 1
        self._sequences.append(sequence)
        length += HEADER_LENGTH
        if routing_key is not None:  # the key is kept until acknowledged: it is charged too
            length += len(routing_key)
        charge = self._open_charge = self._open_charge + length
        count = self._open_count = self._open_count + 1
        unacked = shared.unacked_bytes = shared.unacked_bytes + length
        if tracking is not None:
            future = self._open_future
            if future is None:
                future = self._open_future = tracking.factory()
            tracking.future = future
        if charge >= self._close_at:
            self.close_block()
            flags = SHIPPED
        elif count == 1:
            flags = ARM_BATCH_TIMER
        else:
            flags = 0
        if unacked > shared.unacked_bytes_max:
            return flags | OVER_BUDGET
        return flags


    def write_events(self, payloads: Sequence[bytes], routing_keys: Sequence[str | None],
                     sequences: Sequence[int]) -> int:
        """``write_event`` for a run of events bound for this segment, in order (the batch path:
        ``payloads[i]`` with ``routing_keys[i]`` at place ``sequences[i]`` of the writer's sequence,
        which the caller took from ``WriterBudget.sequence`` for the whole batch).  All or nothing:
        raises ``PayloadTooLargeError``, the writer's error or ``ObjectClosedError`` -- or answers
        ``REROUTE`` alone -- before adding any of them.  Blocks close as the run fills them (at the
        block size, so a long run leaves in blocks no larger than one ``write_event`` would make) and
        the open block closes at the end if it is due; the flags are ``write_event``'s (``SHIPPED``:
        one block or more closed, ``ARM_BATCH_TIMER``: the run left a new open block)."""
        if not payloads:
            return 0
        lengths = list(map(len, payloads))
        longest = max(lengths)
        if longest > EVENT_LENGTH_MAX or self._shared.error is not None or self._closing:
            return self._refuse(longest)
        # Per run, not per event: every per-event step below is a C loop (map, accumulate, zip, chain).
        if None in routing_keys:
            key_lengths = [0 if key is None else len(key) for key in routing_keys]
        else:
            key_lengths = list(map(len, cast(Sequence[str], routing_keys)))  # (no None: checked)
        count = len(payloads)
        # ends[i]: the open block's charge before event i, counted from where the open block began
        # (an event is charged its framed bytes and its routing key's characters).
        ends = list(map(operator.add, itertools.accumulate(map(operator.add, lengths, key_lengths),
                                                           initial=self._open_charge),
                        range(0, HEADER_LENGTH * (count + 1), HEADER_LENGTH)))
        added = ends[-1] - ends[0]
        header = SMALL_EVENT_HEADERS.__getitem__ if longest < SMALL_EVENT_LENGTH else _event_header
        block_bytes_max = self._block_bytes_max
        opened = self._open_count == 0
        closed = False
        start = 0
        while start < count:
            began = ends[start] - self._open_charge  # where the open block began, on the ends scale
            # The first event that brings the open block to the block size ends it (as write_event's would).
            end = bisect.bisect_left(ends, began + block_bytes_max, start + 1, count + 1)
            full = end <= count
            end = min(end, count)
            self._parts.extend(itertools.chain.from_iterable(zip(map(header, lengths[start:end]),
                                                                 payloads[start:end], strict=True)))
            self._keys.extend(routing_keys[start:end])
            self._sequences.extend(sequences[start:end])
            self._open_charge = ends[end] - began
            self._open_count += end - start
            start = end
            if full:
                self.close_block()
                opened = closed = True
        return self._end_run(added, opened=opened, closed=closed)

    def write_framed(self, data: bytes, framed_ends: Sequence[int], charge_ends: Sequence[int],
                     routing_keys: Sequence[str | None], sequences: Sequence[int]) -> int:
        """``write_events`` for a run of events already framed (the columnar path: ``data`` holds the
        run's events, ``type 0 | length | payload`` each, event ``i`` at
        ``data[framed_ends[i]:framed_ends[i + 1]]``; ``charge_ends[i]`` is what events ``0..i-1`` are
        charged -- framed bytes and keys' characters -- so ``charge_ends[0] == framed_ends[0] == 0``).
        No object is made per event: blocks are cut from ``data`` where the charges reach the block
        size, as ``write_events`` would cut them, and leave as those bytes.  All or nothing, with
        ``write_events``' flags; the caller checked every event's length."""
        count = len(routing_keys)
        if not count:
            return 0
        shared = self._shared
        if shared.error is not None or self._closing:
            return self._refuse(0)
        open_charge = self._open_charge
        block_bytes_max = self._block_bytes_max
        opened = self._open_count == 0
        closed = False
        start = 0
        while start < count:
            # charge_ends on the open block's scale: the open block began at -open_charge.
            began = int(charge_ends[start]) - open_charge
            end = bisect.bisect_left(charge_ends, began + block_bytes_max, start + 1, count + 1)
            full = end <= count
            end = min(end, count)
            first = int(framed_ends[start])
            last = int(framed_ends[end])
            self._parts.append(data if first == 0 and last == len(data) else data[first:last])
            self._keys.extend(routing_keys[start:end])
            self._sequences.extend(sequences[start:end])
            open_charge = self._open_charge = int(charge_ends[end]) - began
            self._open_count += end - start
            start = end
            if full:
                self.close_block()
                open_charge = 0
                opened = closed = True
        return self._end_run(int(charge_ends[count]), opened=opened, closed=closed)

    def _end_run(self, added: int, *, opened: bool, closed: bool) -> int:
        """The end of ``write_events`` / ``write_framed``: charge the run's ``added`` bytes, close the
        open block if that leaves it due, and answer the run's flags -- ``SHIPPED`` if a block closed
        (``closed``: one did within the run), ``ARM_BATCH_TIMER`` if the run left an open block it
        began (``opened``), ``OVER_BUDGET``."""
        shared = self._shared
        shared.unacked_bytes += added
        if self._open_count and self._open_charge >= self._close_at:
            self.close_block()
            closed = True
        flags = SHIPPED if closed else 0
        if self._open_count and opened:
            flags |= ARM_BATCH_TIMER
        if shared.unacked_bytes > shared.unacked_bytes_max:
            flags |= OVER_BUDGET
        return flags

    def _open_payloads(self) -> list[bytes]:
        """The open block's payloads, in order (its parts are framed bytes: a header and a payload per
        ``write_event``, or a run of whole events per ``write_framed``)."""
        return list(codec.iter_events(b"".join(self._parts)))

    def _refuse(self, length: int) -> int:
        """Why an event of ``length`` bytes is not added (the per-event step's rare case, out of its
        way): raises ``PayloadTooLargeError``, the writer's error or ``ObjectClosedError`` -- or
        answers ``REROUTE`` (the segment was sealed and its keys moved on)."""
        if length > EVENT_LENGTH_MAX:
            raise PayloadTooLargeError(f"an event of {length} bytes exceeds the limit of {EVENT_LENGTH_MAX} bytes")
        if self._shared.error is not None:
            self._shared.raise_error()
        if self._retired:
            return REROUTE
        raise ObjectClosedError("the writer is closed")
    def close_block(self) -> None:
        """Number the open block's events (by its last) and queue the block for the session."""
        self._queue_open_block(self._last_assigned + self._open_count, None)

    def _queue_open_block(self, last_event_number: int, application_sequences: list[int] | None) -> None:
        """The open block leaves as one ``Block`` numbered up to ``last_event_number`` (a writer with a
        stable id passes its events' application sequences), and a new open block starts."""
        self._last_assigned = last_event_number
        block = Block(b"".join(self._parts), self._keys, self._open_charge, self._open_count, last_event_number,
                      self._open_future, self._sequences, application_sequences)
        self._parts = []
        self._keys = []
        self._sequences = []
        self._open_charge = 0
        self._open_count = 0
        self._open_future = None
        self._blocks_unacked += 1
        self._tracker.block_closed(self._clock.monotonic(), len(block.data))
        self._target_bytes = self._close_at = self._tracker.target()
        self._outbox.append(block)

    def batch_window(self) -> float:
        """How long an open block may wait (seconds): when ``ARM_BATCH_TIMER`` asks, call
        ``batch_window_passed`` this much later."""
        return self._tracker.window()

    def batch_window_passed(self, generation: int) -> bool:
        """The batch window of the block opened after event ``generation`` has passed: close it, unless
        it left already (it filled, or an acknowledgement closed it).  True: a block closed
        (``ShipClosed``)."""
        if (self._last_assigned != generation or not self._open_count or self._failed is not None
                or self._closing):
            return False
        self.close_block()
        return True

    def close_open_block(self) -> bool:
        """Close the open block, if any (a flush, or the end of a hand-over: its events leave now).
        True: a block closed."""
        if self._open_count and self._failed is None and not self._closing:
            self.close_block()
            return True
        return False

    # --- Sends ---------------------------------------------------------------------------------------

    def take_closed(self) -> list[Block]:
        """Move the closed blocks queued for the session into ``_inflight``; return them (the adapter
        sends them if the session is ready, in this order, each followed by ``sent``)."""
        outbox = self._outbox
        inflight = self._inflight
        taken = []
        while outbox:
            block = outbox.popleft()
            inflight.append(block)
            taken.append(block)
        return taken

    def sending(self, block: Block) -> None:
        """``block`` is about to go out: the acknowledgement timeout counts from now."""
        block.sent_at = self._clock.monotonic()
        self._sent_max = max(self._sent_max, block.last_event_number)

    def sent(self) -> None:
        """The block ``sending`` announced went out on the current session."""
        self._sent += 1

    def session_ended(self) -> None:
        """The session ended: nothing is out on a session any more (a new one re-sends from the first)."""
        self._sent = 0

    # --- acknowledge ---------------------------------------------------------------------------------

    def setup(self, stored: int) -> list[Instruction]:
        """``AppendSetup``: the segment stores this writer id's events up to ``stored``.  Acknowledge
        that much, then re-send every block after it, in order (``Resend``, last: the adapter carries
        out the acknowledgement's instructions before the session counts as ready) -- or, if
        ``stored`` is beyond anything ever sent (another writer has the id) or below what was
        acknowledged (acknowledged events are missing), ``EndSession`` alone."""
        self.take_closed()
        if stored > self._sent_max:
            return [EndSession(self.id_in_use(stored))]
        if stored < self._acked:
            return [EndSession(ProtocolError(
                f"the server stores event number {stored} for writer {self._writer_id} on {self.segment!r}, but "
                f"acknowledged {self._acked}: acknowledged events are missing"))]
        instructions = self.acknowledge(stored, sent_on_this_session=False) if stored > self._acked else []
        # A block the acknowledgement closed goes out with the re-sends, after the older blocks: not
        # shipped on its own (before them).
        instructions = [instruction for instruction in instructions if instruction is not _SHIP]
        self.take_closed()
        self._sent = 0
        instructions.append(_RESEND)
        return instructions

    def acknowledge(self, number: int, *, sent_on_this_session: bool) -> list[Instruction]:
        """``acknowledge``: every block up to event ``number`` is durable -- settle their completions,
        free their bytes, and close the open block if that leaves it due.  Ignored if ``number`` is
        not beyond what was acknowledged (stale or reordered).  Raises ``ProtocolError`` (changing
        nothing) if ``number`` ends no block, or if it was not sent on this session and should have
        been."""
        if number <= self._acked:
            return []
        inflight = self._inflight
        count = 0
        for block in inflight:
            if block.last_event_number > number:
                break
            count += 1
        if count == 0 or inflight[count - 1].last_event_number != number:
            raise ProtocolError(f"the server acknowledged event {number} of writer {self._writer_id}, which ends "
                                "no block this writer sent")
        if sent_on_this_session and count > self._sent:
            raise ProtocolError(f"the server acknowledged event {number} of writer {self._writer_id} before it "
                                "was sent on this connection")
        freed = 0
        futures: list[Completion] = []
        last = inflight[0]
        for _ in range(count):
            last = inflight.popleft()
            freed += last.charge
            if last.future is not None:
                futures.append(last.future)
        self._sent = max(self._sent - count, 0)
        self._acked = number
        shared = self._shared
        shared.unacked_bytes -= freed
        self._blocks_unacked -= count
        if sent_on_this_session:
            self._tracker.acknowledged(self._clock.monotonic(), last.sent_at)
            self._target_bytes = self._tracker.target()
        self._close_at = 0 if self._blocks_unacked == 0 else self._target_bytes
        instructions: list[Instruction] = [Settle(futures, None)] if futures else []
        if self._open_count and self._failed is None and self._open_charge >= self._close_at:
            self.close_block()
            instructions.append(_SHIP)
        if shared.unacked_bytes <= shared.unacked_bytes_max // 2:
            instructions.append(_WAKE)
        instructions.append(ReleaseFlushes(number))
        return instructions

    def check_stored(self, stored: int) -> None:
        """After a seal, the segment says it stores this writer id's events up to ``stored``: raise
        ``WriterIdInUseError`` if that is beyond anything sent, ``ProtocolError`` if below what was
        acknowledged (then ``acknowledge(stored, sent_on_this_session=False)`` takes it in)."""
        self.take_closed()
        if stored > self._sent_max:
            raise self.id_in_use(stored)
        if stored < self._acked:
            raise ProtocolError(f"segment {self.segment!r} stores event number {stored} for writer "
                                f"{self._writer_id}, but {self._acked} was acknowledged")

    def id_in_use(self, stored: int) -> WriterIdInUseError:
        """The segment stores event number ``stored`` for this writer id, beyond anything this writer
        ever sent: another writer has the id (two clients made with the same seeded ``rng``).  Taking
        ``stored`` as an acknowledgement would report this writer's events durable, and the segment
        never stored them."""
        return WriterIdInUseError(
            f"writer id {self._writer_id} already holds events on segment {self.segment!r} (event number {stored}; "
            f"this writer sent {self._sent_max} so far): another writer uses the same id -- are two clients made "
            "with the same seeded rng?  None of this writer's unacknowledged events were stored by it")

    # --- refuse, give_up ------------------------------------------------------------------------------

    def fail(self, error: BaseException) -> list[Instruction]:
        """``refuse`` or ``give_up``: a failure retrying cannot fix.  ``error`` becomes this writer's
        failure; every unacknowledged event's completion fails with it (``Settle``).  The events
        themselves stay (``in_doubt``).  Nothing if it failed already."""
        if self._failed is not None:
            return []
        self._failed = error
        self.take_closed()
        futures: list[Completion] = []
        for block in self._inflight:
            if block.future is not None:
                futures.append(block.future)
                block.future = None
        open_future, self._open_future = self._open_future, None
        if open_future is not None:
            futures.append(open_future)
        return [Settle(futures, error)] if futures else []

    def stop_taking_events(self) -> None:
        """The writer is closing (or halting): it takes no more events; what it holds stays."""
        self._closing = True

    # --- seal: the hand-over of a stream writer -------------------------------------------------------

    def retire(self) -> list[tuple[bytes, str | None, Completion | None, int]]:
        """Take every unacknowledged event out -- in flight, queued, open; in order -- as ``(payload,
        routing key, the completion its block shared, its place in the writer's sequence)``, release
        their bytes from the budget and retire: ``write_event`` answers ``REROUTE`` from now on."""
        events: list[tuple[bytes, str | None, Completion | None, int]] = []
        freed = self._open_charge
        for block in itertools.chain(self._inflight, self._outbox):
            future = block.future
            events.extend((payload, key, future, sequence) for payload, key, sequence in zip(
                codec.iter_events(block.data), block.keys, block.sequences, strict=True))
            freed += block.charge
        open_future = self._open_future
        events.extend((payload, key, open_future, sequence) for payload, key, sequence in zip(
            self._open_payloads(), self._keys, self._sequences, strict=True))
        self._shared.unacked_bytes -= freed
        self._inflight.clear()
        self._outbox.clear()
        self._parts = []
        self._keys = []
        self._sequences = []
        self._open_charge = self._open_count = 0
        self._open_future = None
        self._blocks_unacked = 0
        self._last_assigned = self._acked  # the numbers after it are never used by this writer id
        self._close_at = 0
        self._sent = 0
        self._closing = self._retired = True
        return events

    def _frame(self, payload: bytes, routing_key: str | None, sequence: int) -> None:
        """Frame one event (place ``sequence`` in the writer's sequence) into the open block, charging
        it to the budget.  (``write_event`` does the same inline: it runs once per event.)"""
        length = len(payload)
        self._parts.append(SMALL_EVENT_HEADERS[length] if length < SMALL_EVENT_LENGTH else EVENT_HEADER(0, length))
        self._parts.append(payload)
        self._keys.append(routing_key)
        self._sequences.append(sequence)
        length += HEADER_LENGTH
        if routing_key is not None:
            length += len(routing_key)
        self._open_charge += length
        self._open_count += 1
        self._shared.unacked_bytes += length

    def write_moved_event(self, payload: bytes, routing_key: str | None,
                          factory: Callable[[], Completion] | None, sequence: int) -> Completion | None:
        """Add an event handed over from a sealed predecessor (keeping its place in the writer's
        sequence), ahead of anything newer for its key; with ``factory``, return the completion of its
        block.  Moved events fill blocks up to the block size (they are all here at once);
        ``close_open_block`` ends the last."""
        self._frame(payload, routing_key, sequence)
        future = None
        if factory is not None:
            future = self._open_future
            if future is None:
                future = self._open_future = factory()
        if self._open_charge >= self._block_bytes_max:
            self.close_block()
        return future

    # --- What it holds ---------------------------------------------------------------------------------

    def in_doubt(self) -> list[InDoubtEvent]:
        """The events not acknowledged -- in flight, queued, open -- in order."""
        segment = self.segment
        events = [InDoubtEvent(sequence, segment, key, payload)
                  for block in itertools.chain(self._inflight, self._outbox)
                  for sequence, key, payload in zip(block.sequences, block.keys, codec.iter_events(block.data),
                                                    strict=True)]
        events.extend(InDoubtEvent(sequence, segment, key, payload) for sequence, key, payload
                      in zip(self._sequences, self._keys, self._open_payloads(), strict=True))
        return events

    def unacknowledged_payloads(self) -> list[bytes]:
        """The payloads not yet acknowledged, in order: in flight, queued, then the open block."""
        payloads = [payload for block in itertools.chain(self._inflight, self._outbox)
                    for payload in codec.iter_events(block.data)]
        payloads.extend(self._open_payloads())
        return payloads

    def charged(self) -> int:
        """What this writer holds against the budget (its open block and closed blocks)."""
        return self._open_charge + sum(block.charge for block in itertools.chain(self._inflight, self._outbox))

    def check_invariants(self) -> None:
        """Blocks are numbered consecutively after the acknowledged one; the counts agree."""
        blocks = list(self._inflight) + list(self._outbox)
        expected = self._acked
        for block in blocks:
            assert block.event_count > 0 and block.last_event_number == expected + block.event_count, (
                block.last_event_number, expected, block.event_count)
            assert codec.count_events(block.data) == block.event_count
            expected = block.last_event_number
        assert expected == self._last_assigned, (expected, self._last_assigned)
        if self._failed is None and not self._closing:
            assert len(blocks) == self._blocks_unacked, (len(blocks), self._blocks_unacked)
        assert 0 <= self._sent <= len(self._inflight)
        assert self._close_at == (0 if self._blocks_unacked == 0 else self._target_bytes) or self._failed, (
            self._close_at, self._blocks_unacked, self._target_bytes)
        assert codec.count_events(b"".join(self._parts)) == self._open_count == len(self._keys) == len(self._sequences)
        assert self._open_charge == sum(len(part) for part in self._parts) + sum(
            len(key) for key in self._keys if key is not None)
        for block in blocks:
            assert len(block.keys) == block.event_count == len(block.sequences)
            assert block.charge == len(block.data) + sum(len(key) for key in block.keys if key is not None)
        if self._retired:
            assert self._closing and not blocks and not self._open_count
