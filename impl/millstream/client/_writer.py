"""The idempotent event writer: per-segment append sessions, adaptive blocks, exactly-once resends.

Theory of operation.  An ``AsyncEventStreamWriter`` serializes each event, asks its ``Router`` for
the segment, and hands the payload to that segment's ``SegmentWriter``.  A segment writer has a
random writer id of its own and numbers its events 1, 2, 3, ...; it frames each event
(``type 0 | length | payload``) into an open block and closes the block -- giving it the number of
its last event -- when nothing else is in flight or when the block reaches the size the
``BlockSizeTracker`` asks for (see ``_batching``); an acknowledgement that leaves nothing in flight
closes it too, and so does the end of the batch window (a timer per block, armed by its first
event).  Closed blocks are kept, in order, until acknowledged.

Those decisions -- numbering, blocks, acknowledgements, resends, the hand-over on a seal -- are a
synchronous machine, ``_segment_writer_state.SegmentWriterState`` (the client's half of
``millstream.model.idempotent_writer``, with its action names: events in, instructions out).  A
``SegmentWriter`` is that machine plus its adapter: the lock, the hand-off between the caller's
thread and the event loop, the append session, futures and timers.

Per event the writer does a few plain operations under one lock (serialize, route, frame, count);
everything else -- closing a block, sending it, acknowledgements, reconnecting -- happens per block.
That lock (``WriterShared.lock``) is what lets the blocking flavour run the per-event path on the
caller's thread while the event loop thread sends blocks and reads acknowledgements: a block closed on
the caller's thread goes into a FIFO outbox that the loop drains, so blocks always enter the wire in
the order they were numbered.

Batches.  ``write_events`` (and ``write_columns``, its columnar form) checks a whole batch first --
serialized, keys one per event, no event too large -- so a bad batch raises before any of it is
written; then routes every event, groups them into one run per segment (in the batch's order: a key's
events are one run) and hands each run to its machine in one step under the lock
(``SegmentWriterState.write_events``), which fills and closes blocks as single events would.  Per
batch, not per event: one lock step, one await or none, one flag check per segment.  A batch larger
than half the writer's budget is added a slice at a time, waiting for capacity between slices.  When
NumPy and pyarrow are installed and every event has a key, a batch does not even go event by event:
``_framing`` groups it by segment and frames it in columns, routing each distinct key once per view
(``KeyRoutes``), and each segment's machine cuts its blocks from the framed bytes
(``SegmentWriterState.write_framed``).  A thread that is not the loop's hands what a step answered
(blocks to send, batch timers) to the loop through ``WriterShared.post``: one wake-up of the loop per
burst, not one per segment.

The append session (the ``Session`` of ``_connection``) is a loop per segment writer: find the
segment's server, take a connection, send ``SetupAppend`` and wait for ``AppendSetup``, whose
``last_event_number`` is the last number the server stored for this writer id -- stored atomically
with the data, by compare-and-set.  Blocks up to that number are acknowledged by it (their
acknowledgement may have been lost with the old connection); the rest are re-sent in order, with the
same numbers and the same bytes, so a block is stored once however often it is sent.  A number beyond
anything this writer id ever sent means another writer has the id (two clients made with the same
seeded ``rng``): the writer fails with ``WriterIdInUseError`` rather than take it as an
acknowledgement of events the segment never stored.  (A writer with a *stable* id, which resumes what
an earlier process of the id stored, is ``_sequenced_writer``'s.)  A
``DataAppended`` acknowledges every block up to its event number (acknowledgements are cumulative, so
a lost one is covered by the next and a stale or reordered one is ignored).  When the connection
breaks, or no acknowledgement comes within the ack timeout (the last one was lost), the session ends
and starts again after a jittered, capped backoff, within the per-outage reconnect budget
(``ClientConfig.reconnect_budget_seconds``; see ``_append_session``): one outage that outlasts it
makes the writer give up.  ``InvalidEventNumber`` (the server saw a number
that does not follow what it stored -- e.g. a resend racing the old connection's last block) is
handled like a broken connection: the next ``AppendSetup`` tells the truth.

Errors.  A failure that retrying cannot fix (the segment is sealed or missing, the token is refused,
reconnecting gave up) fails the segment writer and becomes the writer's error: it fails the
futures of every unacknowledged event and is raised by the next ``write_event`` and by ``flush``.
(A sealed segment of a writer of named segments first has its writer-id attribute read: what the
segment stores is acknowledged, and only the rest fails.)
The events stay in the segment writer, in order (``unacknowledged_events``).  Giving up reconnecting
stops every segment writer of the writer where it is and fails them all with one
``ReconnectBudgetExceededError`` whose ``in_doubt`` lists every unacknowledged event, across segments,
by its place in the writer's sequence (``InDoubtEvent``; ``in_doubt_events()`` gives the same set at
any time): each event carries that place from ``append`` on, through blocks and hand-overs.  (A
writer with a stable id, ``_sequenced_writer``, gives each also its application sequence.)

Streams and scaling.  A writer made for a stream (``event_writer("scope/stream")``) routes by the
stream's key ranges (``StreamRouter``) and does not fail when a segment is sealed: the server
answers ``SegmentIsSealed`` only after acknowledging every block it stored before the seal, and the
writer reads the writer-id attribute besides (what the segment stores for it), so whatever is still
unacknowledged was not stored.  ``_on_segment_sealed`` then asks the controller for the successors
and, in one step under the lock, patches the router and moves those events -- in order, each to the
successor owning its key -- into the successors' writers (fresh writer ids, fresh numbers), ahead of
any newer event for their keys.  The sealed segment's writer is *retired*: an event that another
thread routed to it a moment before the step is sent back to be routed again (``REROUTE``), and
``flush`` follows moved events to where they went.  A stream sealed as a whole has no successors:
``StreamSealedError`` becomes the writer's error.  Each event keeps its routing key until it is
acknowledged, for this re-routing.

Memory.  Bytes written and not yet acknowledged (all segments of a writer; an event counts its framed
bytes and its routing key's characters, which also count toward its block's size) are bounded by the
config's ``writer_unacked_bytes_max``: beyond it ``write_event`` waits until acknowledgements bring
them under half of it.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import functools
import itertools
import logging
import operator
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar, cast
from uuid import UUID

from millstream import limits
from millstream.client._append_session import AppendSession
from millstream.client._config import ClientConfig, RandomSource, random_uuid
from millstream.client._framing import (
    ColumnBatch,
    KeyRoutes,
    arrow_values,
    bytes_batch,
    column_batch,
    frame_runs,
    slice_bounds,
)
from millstream.client._in_doubt import InDoubtEvent
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._routing import Router, StreamRouter
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
from millstream.client._segments import AsyncSegments
from millstream.client._serializers import Serializer, is_identity
from millstream.errors import (
    ConnectionLostError,
    InternalError,
    InvalidArgumentError,
    InvalidEventNumberError,
    InvalidSequenceError,
    MillstreamError,
    ObjectClosedError,
    OperationUnsupportedError,
    PayloadTooLargeError,
    ProtocolError,
    ReconnectBudgetExceededError,
    RetryableError,
    StreamSegmentSealedError,
)
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.values import SegmentWithRange
from millstream.wire.commands import AppendBlock, AppendSetup, DataAppended

__all__ = ["OVER_BUDGET", "REROUTE", "SHIPPED", "AsyncEventStreamWriter", "SegmentWriter", "StreamBinding", "Tracking",
           "WriterShared"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: A per-event completion: an ``asyncio.Future`` (the async flavour) or a ``concurrent.futures.Future``.
Completion = asyncio.Future[None] | concurrent.futures.Future[None]

#: What a segment writer calls when its segment turns out sealed (instead of failing the writer).
SealedHandler = Callable[["SegmentWriter"], Awaitable[None]]


def _router_not_ready(routing_key: str | None) -> str:
    """A stream writer's router before the writer has learned the stream's segments.  Never called: the
    async flavour awaits ``ready()`` before its first event, the blocking flavour is made ready before
    it is handed out."""
    raise InternalError("a stream writer routed an event before it learned the stream's segments")


#: What ``write_events`` takes for events of a bytes writer, and for keys (checked per batch, in C).
_BYTES_TYPE: Final = frozenset({bytes})
_KEY_TYPES: Final = frozenset({str, type(None)})

#: The memo lookup of a router that has none: always a miss.
_NO_MEMO: Final[dict[str, str]] = {}


def _single_segment(router: Router | None) -> str | None:
    """The segment ``router`` sends every event to, if its view has only one (else None)."""
    return getattr(router, "single_segment", None)


def _memo_lookup(router: Router | None) -> Callable[[str | None], str | None]:
    """``router``'s memo's ``get`` (a C call; see ``_routing``), or one that always misses."""
    memo = getattr(router, "memo", None)
    return memo.get if isinstance(memo, dict) else _NO_MEMO.get  # type: ignore[return-value]


def _settle(future: Completion | None, error: BaseException | None) -> None:
    if future is not None and not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class WriterShared(WriterBudget):
    """What the segment writers of one event writer share: the budget they count together
    (``WriterBudget``: unacknowledged bytes, the count of events written, the first error), the lock
    that guards it and every segment writer's machine, the loop and its thread, the waiters for
    capacity and what giving up does to them all (``give_up``, set by ``AsyncEventStreamWriter``)."""

    __slots__ = ("_capacity_waiters", "_posted", "_wake_pending", "give_up", "lock", "loop", "loop_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, unacked_bytes_max: int) -> None:
        super().__init__(unacked_bytes_max)
        self.lock = threading.Lock()
        self.loop = loop
        self.loop_thread = threading.get_ident()  # built on the loop's thread
        self._capacity_waiters: list[asyncio.Future[None]] = []
        # Work other threads hand the loop (drains, batch timers), run in one loop callback: one
        # wake-up of the loop (a write to its self-pipe) per burst, not per block (see ``post``).
        self._posted: collections.deque[Callable[[], object]] = collections.deque()
        self._wake_pending = False
        #: (Loop thread.)  Giving up: stop every segment writer where it is, make the error from the
        #: in-doubt set (the argument), fail them all with it and return it.
        self.give_up: Callable[[Callable[[tuple[InDoubtEvent, ...]], BaseException]], BaseException] | None = None

    def post(self, callback: Callable[[], object]) -> None:
        """(Any thread but the loop's.)  Run ``callback`` on the loop thread soon.  Callbacks posted
        before the loop runs them go in one wake-up of the loop: ``call_soon_threadsafe`` writes to
        the loop's self-pipe each time (a system call on each side), and a batch that ships blocks of
        16 segments would otherwise pay 16.  The flag is cleared before the queue is drained, and a
        poster appends before reading it, so a callback is never left behind (at worst, one wake-up
        too many)."""
        self._posted.append(callback)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._run_posted)
            except BaseException:  # the loop is closed: the next post tries again, and raises too
                self._wake_pending = False
                raise

    def _run_posted(self) -> None:
        """(Loop thread.)  Run what other threads posted, in the order posted (one failing does not
        hold the others back: each was a loop callback of its own before)."""
        self._wake_pending = False
        posted = self._posted
        while posted:
            callback = posted.popleft()
            try:
                callback()
            except Exception:
                _log.exception("a writer callback failed on the event loop")

    def fail(self, error: BaseException) -> None:
        """Record the writer's first error (under the lock) and wake whoever waits for capacity."""
        with self.lock:
            if self.error is None:
                self.error = error
        self.wake_capacity_waiters()

    def wake_capacity_waiters(self) -> None:
        """(Loop thread.)  Let waiting writers re-check the budget."""
        waiters, self._capacity_waiters = self._capacity_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_capacity(self) -> None:
        """(Loop thread.)  Wait until at most half the budget is unacknowledged; raise the writer's error
        (``ObjectClosedError`` once the writer is closed)."""
        while True:
            with self.lock:
                self.raise_error()
                if self.closed:
                    raise ObjectClosedError("the writer is closed")
                if self.unacked_bytes <= self.unacked_bytes_max // 2:
                    return
            waiter = self.loop.create_future()
            self._capacity_waiters.append(waiter)
            await waiter


class SegmentWriter(SegmentWriterState, AppendSession):
    """The writer's session with one segment: the adapter that runs a ``SegmentWriterState`` (the
    machine it is: numbering, blocks, acknowledgements, resends, the hand-over on a seal) on threads
    and an event loop, over an append session (``AppendSession``: connections and reconnects).

    It owns every hand-off: ``append`` runs the machine's per-event step under the writer's lock on
    any thread, and gets what it answers to the loop (a closed block to send, a batch timer to arm);
    everything else runs on the event loop (the ``..._locked`` methods with the lock held), calls the
    machine under the lock and carries out its instructions outside it (``_execute``: futures are
    settled, waiters woken and blocks sent without the lock).  With ``on_sealed``, a sealed segment
    does not fail the writer at once: ``on_sealed(self)`` runs instead (the stream layer's hand-over,
    which ends with ``retire_locked``; for named segments, acknowledging what the segment stores
    before failing the rest), and what it raises fails the writer."""

    def __init__(self, segment: str, *, shared: WriterShared, pool: ConnectionPool, locator: SegmentLocator,
                 token: str, writer_id: UUID, config: ClientConfig, on_sealed: SealedHandler | None = None) -> None:
        SegmentWriterState.__init__(self, segment, writer_id=writer_id, budget=shared, clock=pool.clock,
                                    block_bytes_max=config.writer_block_bytes_max)
        AppendSession.__init__(self, segment, pool=pool, locator=locator, token=token, writer_id=writer_id,
                               config=config)
        self._on_sealed = on_sealed
        self._shared: WriterShared = shared
        self._lock = shared.lock
        self._drain_scheduled = False
        self._flush_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._task: asyncio.Task[None] | None = None

    # --- The session loop's questions (see AppendSession) -------------------------------------------

    _RETRYABLE = (RetryableError, InvalidEventNumberError)

    def _oldest_sent_at(self) -> float:
        return self._inflight[0].sent_at

    def _may_continue(self) -> bool:
        return not self._closing and self._failed is None

    def _progress(self) -> int:
        return self._acked

    async def _ended_for_good(self, reason: BaseException) -> None:
        if isinstance(reason, StreamSegmentSealedError) and self._on_sealed is not None:
            await self._hand_over(reason)
        else:
            self._fail(reason)

    # --- Carrying out the machine's instructions (loop thread, lock not held) -------------------------

    def _execute(self, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            kind = type(instruction)
            if kind is Settle:
                error = instruction.error  # type: ignore[union-attr]
                for future in instruction.futures:  # type: ignore[union-attr]
                    _settle(future, error)
            elif kind is ShipClosed:
                self._drain_outbox()
            elif kind is WakeCapacity:
                self._shared.wake_capacity_waiters()
            elif kind is ReleaseFlushes:
                if self._flush_waiters:
                    self._release_flush_waiters_through(instruction.number)  # type: ignore[union-attr]
            elif kind is Resend:
                self._ready = True
                self._sent = 0
                for block in self._inflight:
                    self._send(block)
                    if not self._ready:
                        break
            elif kind is EndSession:
                self._end_session(instruction.reason)  # type: ignore[union-attr]
            else:
                raise InternalError(f"a segment writer cannot carry out {instruction!r}")

    def _release_flush_waiters_through(self, number: int) -> None:
        waiting = []
        for target, waiter in self._flush_waiters:
            if number >= target:
                if not waiter.done():
                    waiter.set_result(True)
            else:
                waiting.append((target, waiter))
        self._flush_waiters = waiting

    # --- Producer side (any thread) ----------------------------------------------------------------

    def append(self, payload: bytes, routing_key: str | None, tracking: Tracking | None) -> int:
        """The machine's ``write_event`` under the writer's lock, on any thread; then get a closed block
        to the loop (``_ship``) or arm the new open block's batch timer.  Returns ``SHIPPED`` /
        ``OVER_BUDGET`` flags, or ``REROUTE`` (nothing added: the segment was sealed and its keys now go
        elsewhere).  Raises the writer's error, or ``PayloadTooLargeError`` (nothing added)."""
        # acquire/release, not ``with``: on the per-event path the context-manager protocol costs
        # twice what the lock itself does (measured on 3.11: ~410 vs ~200 ns per event)
        generation = 0
        lock = self._lock
        lock.acquire()
        try:
            flags = self.write_event(payload, routing_key, tracking)
            if flags & ARM_BATCH_TIMER:
                generation = self._last_assigned
        finally:
            lock.release()
        return self.carry_out(flags, generation) if flags else 0

    def carry_out(self, flags: int, generation: int) -> int:
        """(Any thread, lock not held.)  What ``write_event`` answered: ship the block it closed, or arm
        the batch timer of the block it opened (after event ``generation``).  Returns the caller's part
        of ``flags`` (``SHIPPED``, ``OVER_BUDGET``, ``REROUTE``)."""
        if flags & ARM_BATCH_TIMER:
            self._arm_batch_timer(generation)
            return flags & ~ARM_BATCH_TIMER
        if flags & SHIPPED:
            self._ship()
        return flags

    def _arm_batch_timer(self, generation: int) -> None:
        """Close the block that follows event ``generation`` once the batch window has passed (per block,
        not per event: only the first event of an open block arms it)."""
        shared = self._shared
        delay = self.batch_window()
        if threading.get_ident() == shared.loop_thread:
            shared.loop.call_later(delay, self._batch_window_passed, generation)
        else:
            shared.post(functools.partial(shared.loop.call_later, delay, self._batch_window_passed, generation))

    def _batch_window_passed(self, generation: int) -> None:
        with self._lock:
            closed = self.batch_window_passed(generation)
        if closed:
            self._drain_outbox()

    def _ship(self) -> None:
        """Get queued blocks to the loop: drain now on the loop thread, else schedule a drain there."""
        shared = self._shared
        if threading.get_ident() == shared.loop_thread:
            self._drain_outbox()
        elif not self._drain_scheduled:
            self._drain_scheduled = True
            shared.post(self._drain_outbox)

    # --- Loop side ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the session loop (on the event loop)."""
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"millstream-writer-{self.segment}-{self._writer_id}")

    def _drain_outbox(self) -> None:
        self._drain_scheduled = False  # cleared before taking: a block queued meanwhile schedules a new drain
        # Without the lock: the outbox is a deque, whose append (a producer, under the lock) and popleft
        # (here, the loop thread only) are atomic.
        blocks = self.take_closed()
        if self._ready:
            for block in blocks:
                self._send(block)

    def _send(self, block: Block) -> None:
        connection = self._connection
        assert connection is not None and self._ready
        self.sending(block)
        try:
            connection.send(AppendBlock(self._writer_id, block.last_event_number, block.event_count,
                                        self._request_id, block.data))
        except ConnectionLostError:
            return  # the connection is closing: the session ends and re-sends after setting up again
        self.sent()

    async def _hand_over(self, reason: StreamSegmentSealedError) -> None:
        """The segment is sealed: let the stream layer move the events on (``on_sealed``).  Whatever it
        raises becomes this writer's failure -- the events stay here, unacknowledged."""
        assert self._on_sealed is not None
        _log.info("writer %s on %s: %s; handing its events over to the successors", self._writer_id, self.segment,
                  reason)
        try:
            await self._on_sealed(self)
        except MillstreamError as error:
            self._fail(error)
        except Exception as error:  # a bug in the hand-over: fail loudly rather than leave flush waiting
            _log.exception("writer %s on %s: the hand-over failed", self._writer_id, self.segment)
            self._fail(error)

    def _gave_up(self, reason: BaseException, attempts: int) -> BaseException:
        """Give up for the whole writer: every segment writer stops where it is (no acknowledgement is
        taken in after this), and the error names every event not acknowledged (``in_doubt``)."""
        def make(in_doubt: tuple[InDoubtEvent, ...]) -> BaseException:
            error = ReconnectBudgetExceededError(
                f"the writer for segment {self.segment!r} gave up after {attempts} reconnect attempts: an outage "
                f"outlasted the reconnect budget of {self._config.reconnect_budget_seconds:g} s "
                "(ClientConfig.reconnect_budget_seconds); "
                f"{len(in_doubt)} event{'s' if len(in_doubt) != 1 else ''} written through it may or may not be "
                f"stored (error.in_doubt); last error: {reason}", in_doubt)
            error.__cause__ = reason
            return error
        give_up = self._shared.give_up
        return give_up(make) if give_up is not None else make(tuple(self.in_doubt_events()))

    def halt(self) -> None:
        """(Loop thread.)  Stop where it is, at once: detach from the connection (no reply is taken in
        after this) and stop the session loop (unless it is the caller).  The writer is failing."""
        with self._lock:
            self.stop_taking_events()
        self._leave_session()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def in_doubt_events(self) -> list[InDoubtEvent]:
        """(Loop thread.)  The events not acknowledged -- in flight, queued, open -- in order."""
        self._drain_outbox()
        with self._lock:
            return self.in_doubt()

    def _on_setup(self, reply: AppendSetup) -> None:
        if reply.writer_id != self._writer_id or self._ready:
            raise ProtocolError(f"unexpected AppendSetup for writer {reply.writer_id}")
        self._drain_outbox()  # (not ready: nothing is sent)
        stored = 0 if reply.last_event_number == NULL_ATTRIBUTE_VALUE else reply.last_event_number
        with self._lock:
            instructions = self.setup(stored)
        self._execute(instructions)

    def _on_acknowledged(self, reply: DataAppended) -> None:
        number = reply.event_number
        if reply.previous_event_number >= number:
            raise ProtocolError(f"DataAppended for writer {self._writer_id} goes backwards "
                                f"({reply.previous_event_number} -> {number})")
        if number <= self._acked:
            return  # stale or reordered: a later acknowledgement covered it already
        self._drain_outbox()
        self._acknowledge_through(number, sent_on_this_session=self._ready)

    _REPLY_HANDLERS = {DataAppended: _on_acknowledged, AppendSetup: _on_setup}

    def _acknowledge_through(self, number: int, *, sent_on_this_session: bool) -> None:
        """Every block up to event ``number`` is durable: the machine's ``acknowledge``, carried out."""
        with self._lock:
            instructions = self.acknowledge(number, sent_on_this_session=sent_on_this_session)
        self._execute(instructions)

    def _fail(self, error: BaseException) -> None:
        """A failure retrying cannot fix: fail every unacknowledged event's future and every waiter, and
        make ``error`` the writer's error.  The events themselves stay (``unacknowledged_events``)."""
        if self._failed is not None:
            return
        # INFO, not WARNING: the error reaches the caller (next call, flush, futures); no need to say it twice.
        _log.info("writer %s on %s failed: %s", self._writer_id, self.segment, error)
        self._drain_outbox()
        with self._lock:
            instructions = self.fail(error)
        self._execute(instructions)
        waiters, self._flush_waiters = self._flush_waiters, []
        for _, waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._shared.fail(error)

    async def flush(self) -> bool:
        """Send the open block and wait until every event added so far is acknowledged: True.  False if
        the segment was sealed and the events were handed over instead (``retire_locked``): the caller
        flushes where they went.  Raises the segment writer's failure."""
        with self._lock:
            self.close_open_block()
            target = self._last_assigned
            if self._retired:
                return False
        self._drain_outbox()
        if self._failed is not None:
            raise self._failed.with_traceback(None)
        if self._acked >= target:
            return True
        if self._task is None or self._task.done():
            raise ObjectClosedError(f"the writer for segment {self.segment!r} is closed")
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, waiter))
        return await waiter

    async def stop(self) -> None:
        """Stop the session loop and detach; unacknowledged events stay (the writer is closed)."""
        with self._lock:
            self.stop_taking_events()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._leave_session()
        closed = ObjectClosedError(f"the writer for segment {self.segment!r} was closed")
        waiters, self._flush_waiters = self._flush_waiters, []
        for _, waiter in waiters:
            if not waiter.done():
                waiter.set_exception(closed)

    def unacknowledged_events(self) -> list[bytes]:
        """(Loop thread.)  The payloads not yet acknowledged, in order: in flight, then the open block."""
        self._drain_outbox()
        with self._lock:
            return self.unacknowledged_payloads()

    # --- The hand-over after a seal (loop thread; see the stream writer) ---------------------------

    def acknowledge_stored(self, stored: int) -> None:
        """The session is over and the server says it stores this writer's events up to ``stored``
        (the writer-id attribute, read after the seal): acknowledge them, so that only events the
        segment does not hold are handed over.  Raises ``WriterIdInUseError`` if ``stored`` is beyond
        anything sent, ``ProtocolError`` if it is below what was acknowledged or ends no block."""
        self._drain_outbox()
        with self._lock:
            self.check_stored(stored)
        if stored > self._acked:
            self._acknowledge_through(stored, sent_on_this_session=False)

    def retire_locked(self) -> list[tuple[bytes, str | None, Completion | None, int]]:
        """(Lock held.)  The machine's ``retire`` -- every unacknowledged event taken out, in order, as
        ``(payload, routing key, the future its block shared, its place in the writer's sequence)`` --
        and flushes already waiting get False (``flush`` answers False from now on)."""
        events = self.retire()
        waiters, self._flush_waiters = self._flush_waiters, []
        for _, waiter in waiters:
            if not waiter.done():
                waiter.set_result(False)
        return events

    def ship(self) -> None:
        """(Loop thread.)  Send what closed blocks wait (or queue them until the session is ready)."""
        self._drain_outbox()

    def check_invariants(self) -> None:
        """The machine's invariants, under the lock."""
        with self._lock:
            SegmentWriterState.check_invariants(self)


class StreamBinding(Protocol):
    """What a stream writer asks about its stream (``_stream_writer.ControllerStreamBinding`` asks the
    controller and the segment store)."""

    @property
    def stream(self) -> str:
        """``"scope/stream"``."""
        ...

    async def current_segments(self) -> Sequence[SegmentWithRange]:
        """The segments of the stream's current epoch.  Raises ``StreamNotFoundError``,
        ``StreamSealedError``."""
        ...

    async def stored_event_number(self, segment: str, writer_id: UUID) -> int:
        """The last event number ``segment`` stores for ``writer_id`` (0: none)."""
        ...

    async def successors(self, sealed: SegmentWithRange) -> Sequence[SegmentWithRange]:
        """The segments that took over the sealed segment's keys (not empty).  Raises
        ``StreamSealedError`` when the whole stream is sealed, ``StreamSegmentSealedError`` when the
        segment was sealed by anything but a scale."""
        ...


def _no_sequences() -> InvalidSequenceError:
    """A sequence given to a writer with a random id, which cannot resume after a restart."""
    return InvalidSequenceError(
        "this writer has a random writer id: it cannot resume after a restart, so it takes no sequences; "
        "make it with a stable writer id (event_writer(stream, serializer, writer_id=...)) to write with sequences")


def _bad_key(routing_key: object) -> InvalidArgumentError:
    """An unhashable routing key (the memo lookup raised ``TypeError``)."""
    return InvalidArgumentError(f"a routing key is a str or None, not {type(routing_key).__name__}")


def _columns(writer: AsyncEventStreamWriter[T], values: object, routing_keys: object,
             ) -> ColumnBatch | tuple[list[bytes], list[str | None] | None]:
    """``write_columns``' input, checked (see there for what is refused): as a ``ColumnBatch``, which
    is framed in columns (``_framing``), when NumPy and pyarrow are installed and every event has a
    ``str`` key -- else as ``write_events``' sequences: the bytes of each event cut from the column
    by Arrow or by slicing the buffer, keys read the same way."""
    if not writer._identity:
        raise OperationUnsupportedError(
            f"write_columns takes events already serialized to bytes, but this writer's serializer is "
            f"{writer.serializer!r}: make the writer with the bytes serializer, or use write_events")
    if isinstance(values, tuple):
        if len(values) != 2:
            raise InvalidArgumentError("columnar values are an Arrow binary array or a (buffer, offsets) pair")
        buffer, offsets = values
        try:
            view = memoryview(buffer).cast("B")
            ends = list(map(int, offsets))
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"columnar values: a bytes-like buffer and integer offsets ({error})") from None
        if not ends or ends[0] < 0 or ends[-1] > len(view) or ends != sorted(ends):
            raise InvalidArgumentError(f"columnar offsets must rise from 0 or more to at most the buffer's "
                                       f"{len(view)} bytes")
        array = arrow_values(view, ends) if routing_keys is not None else None
        batch = None if array is None else column_batch(array, routing_keys)
        if batch is not None:
            return batch
        payloads = _cut(view.tobytes(), ends)
    else:
        pa = _pyarrow()
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not isinstance(values, pa.Array) or not (pa.types.is_binary(values.type)
                                                   or pa.types.is_large_binary(values.type)):
            raise InvalidArgumentError("columnar values are a pyarrow binary or large_binary array (or a "
                                       f"(buffer, offsets) pair), not {type(values).__name__}")
        if values.null_count:
            raise InvalidArgumentError(f"columnar values hold {values.null_count} null(s): every event needs bytes")
        batch = column_batch(values, routing_keys)
        if batch is not None:
            return batch
        payloads = _cut(*_arrow_column(values, pa.types.is_large_binary(values.type)))
    keys: list[str | None] | None
    if routing_keys is None:
        keys = None
    elif isinstance(routing_keys, Sequence) and not isinstance(routing_keys, (str, bytes)):
        keys = list(routing_keys)
    else:
        pa = _pyarrow()
        if isinstance(routing_keys, pa.ChunkedArray):
            routing_keys = routing_keys.combine_chunks()
        if not isinstance(routing_keys, pa.Array) or not (pa.types.is_string(routing_keys.type)
                                                         or pa.types.is_large_string(routing_keys.type)):
            raise InvalidArgumentError("routing keys are a pyarrow string array, a sequence of str, or None, not "
                                       f"{type(routing_keys).__name__}")
        if routing_keys.null_count:  # a null key is no key
            keys = routing_keys.to_pylist()
        else:
            data, ends = _arrow_column(routing_keys, pa.types.is_large_string(routing_keys.type))
            if data.isascii():  # (byte offsets are character offsets: decode once, cut the text)
                text = data.decode("ascii")
                keys = list(map(text.__getitem__, map(slice, ends, ends[1:])))
            else:
                keys = list(map(str, _cut(data, ends), itertools.repeat("utf-8")))
    if keys is not None and len(keys) != len(payloads):
        raise InvalidArgumentError(f"write_columns got {len(payloads)} values and {len(keys)} routing keys: give one "
                                   "key per value (or routing_keys=None)")
    return payloads, keys


def _cut(data: bytes, ends: list[int]) -> list[bytes]:
    """``data[ends[i]:ends[i + 1]]`` for every ``i``: one bytes object per value, cut in a C loop."""
    return list(map(data.__getitem__, map(slice, ends, ends[1:])))


def _arrow_column(array: Any, large: bool) -> tuple[bytes, list[int]]:
    """A binary or string Arrow array's data (one copy of its buffer) and its ``len + 1`` offsets into
    it: cutting events out of them is a C loop, where ``to_pylist`` makes a scalar per value."""
    _, offsets, data = array.buffers()
    first = array.offset
    ends = memoryview(offsets).cast("q" if large else "i")[first:first + len(array) + 1].tolist()
    return (b"" if data is None else data.to_pybytes()), ends


def _pyarrow() -> Any:
    """``pyarrow``, imported when a columnar call needs it (``import millstream`` does not)."""
    try:
        import pyarrow
    except ImportError as error:
        raise OperationUnsupportedError(
            f"write_columns with Arrow arrays needs pyarrow ({error}): pip install \"millstream[spark]\" -- or pass "
            "a (buffer, offsets) pair") from None
    return pyarrow


def _picker(indexes: list[int]) -> Callable[[Sequence[T]], Sequence[T]]:
    """Gathers ``indexes`` of a sequence, in order, as a sequence (``itemgetter`` returns a lone item
    bare, so one index gets a slice)."""
    if len(indexes) == 1:
        index = indexes[0]
        return lambda sequence: sequence[index:index + 1]
    return operator.itemgetter(*indexes)


def _carry_out_on_loop(work: list[tuple[SegmentWriter, int, int]]) -> None:
    """(Loop thread.)  A batch's answers (``AsyncEventStreamWriter._carry_out_batch``): arm each new
    open block's batch timer and send each writer's closed blocks."""
    for writer, flags, generation in work:
        if flags & ARM_BATCH_TIMER:
            writer._arm_batch_timer(generation)
        if flags & SHIPPED:
            writer._drain_outbox()


def _chain_completion(old: Completion, news: Sequence[Completion]) -> None:
    """Complete ``old`` -- the future that the events of a handed-over block shared -- once every
    block they moved into (``news``) is durable, or with the first failure among them."""
    remaining = len(news)

    def done(future: Completion) -> None:
        nonlocal remaining
        if old.done():
            return
        if future.cancelled():
            _settle(old, ObjectClosedError("the writer was closed before the event was acknowledged"))
            return
        error = future.exception()
        if error is not None:
            _settle(old, error)
            return
        remaining -= 1
        if remaining == 0:
            _settle(old, None)

    for new in news:
        new.add_done_callback(done)


class AsyncEventStreamWriter(Generic[T]):
    """Writes events to a stream (or a set of segments), exactly once per event, in order per routing key.

    Made by ``AsyncClient.event_writer``.  ``write_event`` returns as soon as the event is buffered
    (it waits only when too much is unacknowledged); ``flush`` waits until everything written so far is
    durable; ``close`` flushes and stops.  Errors surface on the next call or on ``flush``.

    A stream writer (``stream``: ``event_writer("scope/stream")``) learns the stream's current
    segments on its first call (``ready``), routes each key by its position in [0, 1)
    (``StreamRouter``), and follows the stream as it scales: when a segment turns out sealed, its
    unacknowledged events move to the successors that own their keys, ahead of anything newer
    (``_on_segment_sealed``).  A stream sealed as a whole fails it with ``StreamSealedError``."""

    def __init__(self, *, pool: ConnectionPool, locator: SegmentLocator, router: Router | None,
                 serializer: Serializer[T], token: str, config: ClientConfig, rng: RandomSource,
                 stream: StreamBinding | None = None) -> None:
        if (router is None) == (stream is None):
            raise InternalError("a writer routes by a router of its own or by a stream's segments, not both")
        self._shared = WriterShared(asyncio.get_running_loop(), config.writer_unacked_bytes_max)
        self._shared.give_up = self._give_up
        self._lock = self._shared.lock
        self._pool = pool
        self._locator = locator
        self._router = router
        self._segment_for: Callable[[str | None], str] = (
            router.segment_for if router is not None else _router_not_ready)
        #: The router's memo lookup, tried first on the per-event path (None: a miss, ask ``_segment_for``).
        self._lookup: Callable[[str | None], str | None]
        #: While the router's view has one segment: that segment, for every key that is a ``str`` (and
        #: for no key) without asking the memo or the router (None: ask them).
        self._single: str | None
        #: Counts the router's views (``_follow_view``); the columnar path's key routes (None: none
        #: yet) hold for the view they were made in.
        self._view_generation = 0
        self._key_routes: KeyRoutes | None = None
        self._follow_view(router)
        #: Whether the router still routes to a segment (a stream's view changes; a fixed router's not).
        self._routes_to: Callable[[str], bool] | None = None
        self._stream = stream
        self._ready_lock = asyncio.Lock()
        self._serializer = serializer
        self._serialize = serializer.serialize
        self._identity = is_identity(serializer)
        self._token = token
        self._config = config
        self._rng = rng
        self._writers: dict[str, SegmentWriter] = {}
        self._shipped = 0  # blocks shipped since the last yield to the loop
        self._closed = False
        #: Sealed segments whose events this writer handed over to successors (evidence for tests).
        self.hand_overs = 0

    @property
    def router(self) -> Router | None:
        """How events are routed (a stream writer's ``StreamRouter`` once it is ready, else None)."""
        return self._router

    @property
    def stream(self) -> str | None:
        """The stream written to (``"scope/stream"``), or None for a writer of named segments."""
        return None if self._stream is None else self._stream.stream

    @property
    def serializer(self) -> Serializer[T]:
        return self._serializer

    def segment_writers(self) -> dict[str, SegmentWriter]:
        """The segment writers made so far, by segment (for the stream layer and tests)."""
        return dict(self._writers)

    def unacknowledged_events(self, segment: str) -> list[bytes]:
        """The serialized events written to ``segment`` and not acknowledged, in order."""
        writer = self._writers.get(segment)
        return [] if writer is None else writer.unacknowledged_events()

    def in_doubt_events(self) -> tuple[InDoubtEvent, ...]:
        """Every event written and not acknowledged, over all segments, in the order written (by
        ``InDoubtEvent.sequence``): what is in doubt if the writer fails now -- and, once it failed,
        what it failed with (a ``ReconnectBudgetExceededError`` carries the same set as ``in_doubt``)."""
        events = [event for writer in self._writers.values() for event in writer.in_doubt_events()]
        return tuple(sorted(events, key=lambda event: event.sequence))

    @property
    def events_written(self) -> int:
        """How many events were written through this writer (the last one's ``sequence``)."""
        return self._shared.sequence

    def _give_up(self, make_error: Callable[[tuple[InDoubtEvent, ...]], BaseException]) -> BaseException:
        """(Loop thread.)  A segment writer gave up reconnecting: the writer as a whole fails.  Every
        segment writer stops where it is first -- no acknowledgement is taken in after this -- so the
        in-doubt set the error carries is final; then they all fail with that error."""
        writers = list(self._writers.values())
        for writer in writers:
            writer.halt()
        error = make_error(self.in_doubt_events())
        for writer in writers:
            writer._fail(error)
        return error

    async def ready(self) -> None:
        """A stream writer: learn the stream's current segments (once; concurrent callers wait for the
        first).  Raises ``StreamNotFoundError``, ``StreamSealedError`` (and the writer stays unready,
        so a later call asks again).  A writer of named segments is always ready."""
        if self._router is not None:
            return
        stream = self._stream
        assert stream is not None
        async with self._ready_lock:
            if self._router is not None:
                return
            self._shared.raise_error()
            if self._closed:
                raise ObjectClosedError("the writer is closed")
            router = StreamRouter(await stream.current_segments())
            with self._shared.lock:
                self._router = router
                self._routes_to = router.routes_to
                self._segment_for = router.segment_for
                self._follow_view(router)

    def _follow_view(self, router: Router | None) -> None:
        """Take the per-event shortcuts from ``router``'s current view (at start, and with the lock
        held whenever the view changes): its memo's lookup and its single segment, if it has one; and
        drop the columnar path's key routes (``_framing.KeyRoutes``, made for the old view)."""
        self._view_generation += 1
        self._lookup = _memo_lookup(router)
        self._single = _single_segment(router)

    # --- The per-event path, shared with the blocking flavour -------------------------------------

    def _add(self, event: T, routing_key: str | None, tracking: Tracking | None) -> int:
        """Buffer one event (any thread), once ``ready()`` has returned."""
        if self._identity and type(event) is bytes:
            payload: bytes = event  # type: ignore[assignment]  # (checked: no cast() call per event)
        else:
            payload = self._serialize(event)
            if type(payload) is not bytes:
                raise InvalidArgumentError(f"{self._serializer!r} returned {type(payload).__name__}, not bytes")
        single = self._single
        if single is not None and (routing_key is None or type(routing_key) is str):
            segment = single
        else:
            try:
                segment = self._lookup(routing_key) or self._segment_for(routing_key)
            except TypeError:
                raise _bad_key(routing_key) from None
        writer = self._writers.get(segment)
        if writer is None:
            writer = self._open_segment(segment, routing_key)
        # ``writer.append``'s three steps, here: one call fewer on the per-event path.
        generation = 0
        lock = self._lock
        lock.acquire()
        try:
            flags = writer.write_event(payload, routing_key, tracking)
            if flags & ARM_BATCH_TIMER:
                generation = writer.last_assigned
        finally:
            lock.release()
        if flags:
            if flags & REROUTE:
                return self._append_rerouted(payload, routing_key, tracking)
            return writer.carry_out(flags, generation)
        return 0

    def _append_rerouted(self, payload: bytes, routing_key: str | None, tracking: Tracking | None) -> int:
        """The event was routed to a segment whose keys moved on (it was sealed and handed over after
        the event was routed, on another thread): route it again, now by the new view."""
        for _ in range(limits.CLIENT_WRITER_REROUTES_MAX):
            segment = self._segment_for(routing_key)
            writer = self._writers.get(segment)
            if writer is None:
                writer = self._open_segment(segment, routing_key)
            flags = writer.append(payload, routing_key, tracking)
            if not flags & REROUTE:
                return flags
        raise InternalError(f"an event was routed {limits.CLIENT_WRITER_REROUTES_MAX} times to segments whose keys "
                            "had moved on")

    # --- The batch path, shared with the blocking flavour ----------------------------------------------

    def _prepare_batch(self, events: Sequence[T], routing_keys: Sequence[str | None] | None,
                       ) -> tuple[list[bytes], list[str | None]]:
        """A batch's payloads and keys, checked before anything of it is written: ``InvalidArgumentError``
        for a batch that is not a sequence, keys that are not one per event or not ``str``/None, an
        event the serializer refuses; ``PayloadTooLargeError`` for an event over
        ``limits.EVENT_LENGTH_BYTES_MAX`` (naming its index)."""
        if isinstance(events, (str, bytes, bytearray, memoryview)) or not isinstance(events, Sequence):
            raise InvalidArgumentError(f"write_events takes a sequence of events, not {type(events).__name__}")
        count = len(events)
        if self._identity and set(map(type, events)) <= _BYTES_TYPE:
            payloads = cast(list[bytes], list(events))  # (checked: all bytes)
        else:
            serialize = self._serialize
            payloads = []
            for index, event in enumerate(events):
                try:
                    payload = serialize(event)
                except InvalidArgumentError as error:
                    raise InvalidArgumentError(f"event {index} of the batch: {error}") from None
                if type(payload) is not bytes:
                    raise InvalidArgumentError(f"{self._serializer!r} returned {type(payload).__name__}, not bytes "
                                               f"(event {index} of the batch)")
                payloads.append(payload)
        if routing_keys is None:
            keys: list[str | None] = [None] * count
        else:
            if isinstance(routing_keys, (str, bytes)) or not isinstance(routing_keys, Sequence):
                raise InvalidArgumentError("routing_keys is a sequence with one key per event (or None), not "
                                           f"{type(routing_keys).__name__}")
            if len(routing_keys) != count:
                raise InvalidArgumentError(f"write_events got {count} events and {len(routing_keys)} routing keys: "
                                           "give one key per event (or routing_keys=None)")
            keys = list(routing_keys)
            if not set(map(type, keys)) <= _KEY_TYPES:
                index = next(i for i, key in enumerate(keys) if not (type(key) is str or key is None))
                raise _bad_key(keys[index])
        if payloads:
            longest = max(map(len, payloads))
            if longest > limits.EVENT_LENGTH_BYTES_MAX:
                index = next(i for i, payload in enumerate(payloads) if len(payload) == longest)
                raise PayloadTooLargeError(f"event {index} of the batch has {longest} bytes, over the limit of "
                                           f"{limits.EVENT_LENGTH_BYTES_MAX} bytes: nothing of the batch was written")
        return payloads, keys

    def _batch_slices(self, payloads: list[bytes]) -> list[tuple[int, int]]:
        """``[start, end)`` slices of a prepared batch, each at most half the writer's budget of
        unacknowledged bytes (and at least one event): a batch larger than the budget is added a slice
        at a time, waiting for capacity in between, so the budget bounds the writer's memory still."""
        slice_bytes_max = max(self._shared.unacked_bytes_max // 2, 1)
        count = len(payloads)
        if not count:
            return []
        # ends[i]: the framed bytes of events 0..i (8 header bytes each), a C loop over the batch.
        ends = list(map(operator.add, itertools.accumulate(map(len, payloads)), range(8, 8 * count + 1, 8)))
        slices = []
        start = 0
        base = 0
        while start < count:
            # The first event that brings the slice to the bound ends it.
            end = min(bisect.bisect_left(ends, base + slice_bytes_max, start) + 1, count)
            slices.append((start, end))
            base = ends[end - 1]
            start = end
        return slices

    def _add_batch(self, payloads: list[bytes], keys: list[str | None], routed: int = 0) -> int:
        """Buffer a prepared slice of a batch (any thread), once ``ready()`` has returned: route every
        event, group them into one run per segment (in order), and hand each run to its segment
        writer's machine (``SegmentWriterState.write_events``) in one step under the writer's lock.
        Returns ``OVER_BUDGET`` (the caller waits for capacity) or 0; raises the writer's error or
        ``ObjectClosedError`` before any of the slice is added."""
        single = self._single
        count = len(payloads)
        if single is not None:
            runs: dict[str, list[int]] = {single: list(range(count))}
        else:
            # Per batch, not per event: the memo's lookups, the sort and the grouping are C loops; only a
            # key the memo misses (a new key, or no key: spread round robin) costs a router call.
            segments: list[str | None] = list(map(self._lookup, keys))
            if None in segments:
                segment_for = self._segment_for
                index = segments.index(None)
                while True:
                    segments[index] = segment_for(keys[index])
                    try:
                        index = segments.index(None, index + 1)
                    except ValueError:
                        break
            by_segment = cast(list[str], segments).__getitem__  # (every None was routed above)
            runs = {segment: list(indexes) for segment, indexes in itertools.groupby(
                sorted(range(count), key=by_segment), key=by_segment)}
        if not self._open_runs(runs, routed):  # the view changed meanwhile: route this slice again
            return self._add_batch(payloads, keys, routed + 1)
        writers = self._writers
        answers: list[tuple[SegmentWriter, int, int]] = []
        rerouted: list[int] = []
        lock = self._lock
        lock.acquire()
        try:
            base = self._take_places_locked(count)
            for segment, indexes in runs.items():
                writer = writers.get(segment)
                if writer is None or writer.retired:
                    rerouted.extend(indexes)
                    continue
                if len(indexes) == count:  # the whole slice goes to one segment, in order
                    flags = writer.write_events(payloads, keys, range(base, base + count))
                else:
                    pick = _picker(indexes)  # (one C call gathers a run: no call per event)
                    flags = writer.write_events(pick(payloads), pick(keys), pick(range(base, base + count)))
                if flags & REROUTE:
                    rerouted.extend(indexes)
                elif flags:
                    answers.append((writer, flags, writer.last_assigned))
        finally:
            lock.release()
        result = self._carry_out_batch(answers)
        # A segment sealed and handed over between routing and the step: its events go where its keys
        # went, one by one, in the batch's order (per key, the order holds: a key's events are one run).
        for index in sorted(rerouted):
            result |= self._append_rerouted(payloads[index], keys[index], None) & OVER_BUDGET
        return result

    def _column_slices(self, batch: ColumnBatch) -> list[tuple[int, int]]:
        """``_batch_slices`` for a columnar batch: at most half the writer's budget each."""
        return slice_bounds(batch, max(self._shared.unacked_bytes_max // 2, 1))

    def _add_columns(self, batch: ColumnBatch, routed: int = 0) -> int:
        """``_add_batch`` for a columnar batch (any thread, once ``ready()`` has returned): route each
        distinct key once (the router's memo first: a scale empties it, so keys follow the new view),
        frame each segment's events in columns (``_framing.frame_runs``) and hand each segment's run
        to its machine (``SegmentWriterState.write_framed``) in one step under the writer's lock.
        Returns ``OVER_BUDGET`` or 0; raises the writer's error or ``ObjectClosedError`` before any of
        the slice is added."""
        routes = self._key_routes
        if routes is None or routes.generation != self._view_generation:
            routes = self._key_routes = KeyRoutes(self._view_generation)
        runs = frame_runs(batch, routes.route(batch.keys, self._route_key, batch.key_list))
        if not self._open_runs([run.segment for run in runs], routed):  # the view changed: route it again
            return self._add_columns(batch, routed + 1)
        writers = self._writers
        answers: list[tuple[SegmentWriter, int, int]] = []
        rerouted: list[Any] = []
        lock = self._lock
        lock.acquire()
        try:
            base = self._take_places_locked(len(batch))
            for run in runs:
                writer = writers.get(run.segment)
                if writer is None or writer.retired:
                    rerouted.append(run.positions)
                    continue
                flags = writer.write_framed(run.data, run.framed_ends, run.charge_ends, run.routing_keys,
                                            (run.positions + base).tolist())
                if flags & REROUTE:
                    rerouted.append(run.positions)
                elif flags:
                    answers.append((writer, flags, writer.last_assigned))
        finally:
            lock.release()
        result = self._carry_out_batch(answers)
        if rerouted:
            # A segment sealed and handed over between routing and the step: its events go where its
            # keys went, one by one, in the batch's order (as ``_add_batch``'s do).
            positions = sorted(itertools.chain.from_iterable(run_positions.tolist() for run_positions in rerouted))
            for payload, key in zip(batch.payloads(positions), batch.routing_keys(positions), strict=True):
                result |= self._append_rerouted(payload, key, None) & OVER_BUDGET
        return result

    def _open_runs(self, segments: Iterable[str], routed: int) -> bool:
        """Make sure each of a batch's ``segments`` has its segment writer.  False if one turned out to
        be routed to no more (the view changed since the batch was routed: route it again, the
        ``routed + 1``-th time); ``InternalError`` if that happened too often."""
        writers = self._writers
        for segment in segments:
            if segment not in writers and self._open_segment(segment, None).segment != segment:
                if routed >= limits.CLIENT_WRITER_REROUTES_MAX:
                    raise InternalError(f"a batch was routed {routed} times to segments whose keys had moved on")
                return False
        return True

    def _take_places_locked(self, count: int) -> int:
        """(Lock held.)  A batch of ``count`` events takes its places in the writer's sequence: the
        first one's is returned.  Raises the writer's error or ``ObjectClosedError`` first."""
        shared = self._shared
        shared.raise_error()
        if self._closed:
            raise ObjectClosedError("the writer is closed")
        base = shared.sequence + 1
        shared.sequence += count
        return base

    def _route_key(self, routing_key: str) -> str:
        """The segment of ``routing_key`` now (the memo first): for ``KeyRoutes``, once per new key."""
        return self._lookup(routing_key) or self._segment_for(routing_key)

    def _carry_out_batch(self, answers: list[tuple[SegmentWriter, int, int]]) -> int:
        """What a batch's machine steps answered (``(writer, flags, generation)`` each): arm the batch
        timers and ship the closed blocks -- on another thread than the loop's, in one hand-off to
        the loop for the whole batch (one wake-up, not one per segment).  Returns ``OVER_BUDGET`` if
        any step answered it."""
        result = 0
        for _, flags, _ in answers:
            result |= flags & OVER_BUDGET
        work = [(writer, flags, generation) for writer, flags, generation in answers
                if flags & (ARM_BATCH_TIMER | SHIPPED)]
        if not work:
            return result
        shared = self._shared
        if threading.get_ident() == shared.loop_thread:
            _carry_out_on_loop(work)
        else:
            shared.post(functools.partial(_carry_out_on_loop, work))
        return result

    def _open_segment(self, segment: str, routing_key: str | None) -> SegmentWriter:
        """The segment writer for ``segment``, made now -- or, if the view changed since the event was
        routed there, for the segment the event's key is routed to now."""
        shared = self._shared
        for _ in range(limits.CLIENT_WRITER_REROUTES_MAX):
            with shared.lock:
                shared.raise_error()
                if self._closed:
                    raise ObjectClosedError("the writer is closed")
                writer = self._writers.get(segment)
                if writer is not None:
                    return writer
                routes_to = self._routes_to
                if routes_to is None or routes_to(segment):
                    writer = self._new_writer_locked(segment)
                    break
            segment = self._segment_for(routing_key)
        else:
            raise InternalError(f"an event was routed {limits.CLIENT_WRITER_REROUTES_MAX} times to segments whose "
                                "keys had moved on")
        self._start(writer)
        return writer

    def _new_writer_locked(self, segment: str) -> SegmentWriter:
        writer = SegmentWriter(segment, shared=self._shared, pool=self._pool, locator=self._locator, token=self._token,
                               writer_id=random_uuid(self._rng), config=self._config,
                               on_sealed=self._on_named_segment_sealed if self._stream is None
                               else self._on_segment_sealed)
        self._writers[segment] = writer
        return writer

    def _start(self, writer: SegmentWriter) -> None:
        shared = self._shared
        if threading.get_ident() == shared.loop_thread:
            writer.start()
        else:
            shared.loop.call_soon_threadsafe(writer.start)

    # --- Scaling: a sealed segment's events move to its successors ----------------------------------

    async def _on_named_segment_sealed(self, writer: SegmentWriter) -> None:
        """A writer of named segments: ``writer``'s segment is sealed and there is nowhere to move its
        events.  Learn what the segment stores for this writer first (its writer-id attribute) and
        acknowledge that much -- a block whose first send raced a reconnect may be stored although its
        acknowledgement never came -- then fail the rest, which the segment does not hold.  (Failing
        them all would report stored events as failed: a caller that wrote them again would store
        them twice.)  The attribute is read once the seal is visible (before that it may still grow);
        if it cannot be read, that error fails the writer instead: a retryable one, whose events'
        outcome is unknown."""
        segments = AsyncSegments(pool=self._pool, locator=self._locator, token=self._token, rng=self._rng)
        writer.acknowledge_stored(await segments.stored_event_number_once_sealed(writer.segment, writer.writer_id))
        raise StreamSegmentSealedError(f"segment {writer.segment!r} is sealed: events of writer {writer.writer_id} "
                                       f"after event number {writer.acknowledged_event_number} were not stored")

    async def _on_segment_sealed(self, writer: SegmentWriter) -> None:
        """``SegmentSealed(w, s)`` of ``spec/StreamOrdering.tla``: ``writer``'s segment is sealed.

        1. Learn what the segment stores for this writer (its writer-id attribute, stored with the data)
           and acknowledge that much: only events it does not hold move on, so none is stored twice.
        2. Ask the controller for the successors (``StreamSealedError`` if the stream was sealed).
        3. In one step under the writer's lock: route the sealed segment's keys to the successors,
           take every event the segment writer still holds -- including any written to its keys while
           1 and 2 were waiting -- and append each, in order, to the successor that owns its key.  A
           newer event for those keys is routed only after this step (one routed before it, on another
           thread, meets the retired writer and is routed again), so it lands behind them: per-key
           order holds.  The futures of moved events complete when their new blocks are durable.

        Runs in the sealed segment writer's task; what it raises fails the writer (``SegmentWriter``)."""
        stream = self._stream
        router = self._router
        assert stream is not None and isinstance(router, StreamRouter)
        sealed = router.segment_named(writer.segment)
        if sealed is None:
            raise InternalError(f"segment {writer.segment!r} has a writer but is not routed to")
        writer.acknowledge_stored(await stream.stored_event_number(writer.segment, writer.writer_id))
        successors = await stream.successors(sealed)
        shared = self._shared
        make_future = shared.loop.create_future
        touched: dict[str, SegmentWriter] = {}
        created: list[SegmentWriter] = []
        chains: dict[int, tuple[Completion, dict[int, Completion]]] = {}
        with shared.lock:
            shared.raise_error()
            if self._closed:
                raise ObjectClosedError(f"the writer was closed before the events of sealed segment {sealed.name!r} "
                                        "moved to its successors")
            router.replace(sealed, successors)  # (raises, changing nothing, if they do not fit)
            self._follow_view(router)  # (a lookup by the old view meets REROUTE)
            events = writer.retire_locked()
            del self._writers[writer.segment]
            for payload, key, old, sequence in events:
                name = router.segment_for(key)
                target = touched.get(name) or self._writers.get(name)
                if target is None:
                    target = self._new_writer_locked(name)
                    created.append(target)
                touched[name] = target
                new = target.write_moved_event(payload, key, None if old is None else make_future, sequence)
                if old is not None and new is not None:
                    chains.setdefault(id(old), (old, {}))[1][id(new)] = new
            for target in touched.values():
                target.close_open_block()
            self.hand_overs += 1
        _log.info("stream %s: segment %s sealed; %d unacknowledged events moved to %s", stream.stream, sealed.name,
                  len(events), sorted(touched) or [s.name for s in successors])
        for old, news in chains.values():
            _chain_completion(old, list(news.values()))
        for target in created:
            self._start(target)
        for target in touched.values():
            target.ship()

    # --- API ---------------------------------------------------------------------------------------

    async def write_event(self, event: T, *, routing_key: str | None = None, sequence: None = None) -> None:
        """Buffer ``event`` for its segment (by ``routing_key``; None spreads keyless events evenly).
        Waits only while too much is unacknowledged.  Raises the writer's error if it has failed,
        ``InvalidArgumentError`` for an event the serializer refuses, ``PayloadTooLargeError`` for one
        over ``limits.EVENT_LENGTH_BYTES_MAX`` (nothing is written then); a stream writer's first call
        raises what ``ready`` raises.  ``sequence`` is for writers with a stable writer id
        (``event_writer(stream, serializer, writer_id=...)``): given here, ``InvalidSequenceError``."""
        if sequence is not None:
            raise _no_sequences()
        if self._router is None:  # a stream writer's first event
            await self.ready()
        flags = self._add(event, routing_key, None)
        if flags:
            if flags & OVER_BUDGET:
                await self._shared.wait_for_capacity()
            else:
                await self._after_shipping()

    async def write_events(self, events: Sequence[T], *, routing_keys: Sequence[str | None] | None = None) -> None:
        """Write a batch: ``write_event`` for each of ``events``, in order, with ``routing_keys[i]`` as
        the key of ``events[i]`` (one key per event; None, or ``routing_keys=None``, for no key: spread
        evenly).  The same guarantees -- order per key, exactly once, durable at ``flush()`` -- for one
        await per batch (or per slice of half the writer's budget, for a batch larger than that)
        instead of one per event.

        Validation is all-or-nothing: ``InvalidArgumentError`` (not a sequence, keys not one per
        event, a key that is not a ``str``, an event the serializer refuses) and
        ``PayloadTooLargeError`` (an event over ``limits.EVENT_LENGTH_BYTES_MAX``) are raised before
        any event of the batch is written.  The writer's error (or ``ObjectClosedError``) is raised
        before any event of a slice is written; slices already written stay written."""
        if self._router is None:
            await self.ready()
        payloads, keys = self._prepare_batch(events, routing_keys)
        columns = bytes_batch(payloads, keys)
        if columns is not None:  # framed in columns (_framing)
            await self._write_column_batch(columns)
            return
        for start, end in self._batch_slices(payloads):
            if self._add_batch(payloads[start:end], keys[start:end]) & OVER_BUDGET:
                await self._shared.wait_for_capacity()
            else:
                await asyncio.sleep(0)  # let the loop read acknowledgements

    async def write_columns(self, values: object, routing_keys: object = None) -> None:
        """Write a batch held in columns -- what a Spark task or a pandas user holds -- as
        ``write_events`` does (same guarantees, same all-or-nothing validation).

        ``values``: the events' bytes, *already serialized* (the writer's serializer is not applied: a
        writer whose serializer is not the bytes one is refused, ``OperationUnsupportedError``), as a
        ``pyarrow`` ``BinaryArray`` / ``LargeBinaryArray`` (or a ``ChunkedArray`` of them), or as a
        pair ``(buffer, offsets)``: a bytes-like buffer (a NumPy ``uint8`` array, ``bytes``...) and
        ``len + 1`` offsets into it (event ``i`` is ``buffer[offsets[i]:offsets[i + 1]]``).
        ``routing_keys``: an Arrow string array, a sequence of ``str``/None, or None (no keys); a null
        key is no key.  A null value, offsets that go backwards or past the buffer, or lengths that
        differ: ``InvalidArgumentError``, before anything is written.  Arrow input needs ``pyarrow``
        (the ``spark`` extra: ``pip install "millstream[spark]"``); without it,
        ``OperationUnsupportedError``."""
        if self._router is None:
            await self.ready()
        columns = _columns(self, values, routing_keys)
        if isinstance(columns, ColumnBatch):
            await self._write_column_batch(columns)
            return
        payloads, keys = columns
        await self.write_events(cast(Sequence[T], payloads), routing_keys=keys)  # (a bytes writer: checked)

    async def _write_column_batch(self, columns: ColumnBatch) -> None:
        """Add a checked columnar batch a slice at a time (see ``write_events``)."""
        for start, end in self._column_slices(columns):
            if self._add_columns(columns.slice(start, end)) & OVER_BUDGET:
                await self._shared.wait_for_capacity()
            else:
                await asyncio.sleep(0)  # let the loop read acknowledgements

    async def write_event_future(self, event: T, *, routing_key: str | None = None) -> asyncio.Future[None]:
        """``write_event``, and a future that completes when the event is durable (or fails with the
        writer's error).  Events that travel in the same block share one future (they are stored all
        together), so a future costs a little per block, not per event; do not cancel it."""
        if self._router is None:
            await self.ready()
        tracking = Tracking(self._shared.loop.create_future)
        flags = self._add(event, routing_key, tracking)
        if flags & OVER_BUDGET:
            await self._shared.wait_for_capacity()
        elif flags:
            await self._after_shipping()
        return tracking.future  # type: ignore[return-value]

    async def _after_shipping(self) -> None:
        """A block went out: let the loop read acknowledgements -- once per round over the segments (an
        event-loop turn costs a selector call; with many segments, blocks are small and many)."""
        self._shipped += 1
        if self._shipped >= len(self._writers):
            self._shipped = 0
            await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait until every event written so far is durable -- events that moved from a sealed segment
        to its successors included.  Raises the writer's error, if any."""
        for _ in range(limits.CLIENT_WRITER_FLUSH_ROUNDS_MAX):
            writers = list(self._writers.values())
            results = await asyncio.gather(*(writer.flush() for writer in writers), return_exceptions=True)
            self._shared.raise_error()
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if all(results):
                return
            # A segment was sealed while we waited and its events moved on: wait for where they went.
        raise InternalError(f"flush saw segments sealed under it {limits.CLIENT_WRITER_FLUSH_ROUNDS_MAX} times")

    async def close(self, *, flush: bool = True) -> None:
        """Flush, then stop.  Raises the writer's error (after stopping) if the flush failed.  With
        ``flush=False`` (an interrupted program) stop at once instead: what is not acknowledged stays
        in doubt (``in_doubt_events()``), its futures fail with ``ObjectClosedError``, which is raised."""
        if self._closed:
            return
        if not flush:
            abandoned = ObjectClosedError("the writer was closed without flushing: its unacknowledged events are in "
                                          "doubt")
            for writer in list(self._writers.values()):
                writer.halt()
                writer._fail(abandoned)
        try:
            await self.flush()
        finally:
            with self._shared.lock:
                self._closed = self._shared.closed = True
            self._shared.wake_capacity_waiters()
            for writer in list(self._writers.values()):
                await writer.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncEventStreamWriter[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def check_invariants(self) -> None:
        """Every segment writer's invariants; the budget counts exactly what they hold; a stream
        writer's view covers [0, 1) and has a writer only for segments it routes to."""
        total = 0
        for writer in self._writers.values():
            writer.check_invariants()
            with self._shared.lock:
                total += writer.charged()
        with self._shared.lock:
            assert total == self._shared.unacked_bytes, (total, self._shared.unacked_bytes)
            router = self._router
            assert self._single == _single_segment(router), (self._single, router)  # the same view
            if isinstance(router, StreamRouter):
                router.check_invariants()
                for segment, writer in self._writers.items():
                    assert router.routes_to(segment) and not writer.retired, segment
