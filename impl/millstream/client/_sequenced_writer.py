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
  block of 5 and 7 waits for 6 as 7 alone would.  ``held_by_older`` asks; every acknowledgement and
  hand-over wakes the held writers (``ReleaseHolds``, ``_release_holds``).
* Acknowledgements (``AckEvent``).  ``DataAppended`` acknowledges whole blocks; an ``AppendSetup`` (or
  a sealed segment's attribute) beyond what was acknowledged means a request of an earlier process
  of this writer id landed after this one started: every event at or below it is stored, and a
  block that straddles it is re-framed without them (``trim_stored``).
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

Those decisions -- floors and duplicates, the hold, trimming what a setup says is stored,
re-numbering, the merge of moved events on a seal -- are a synchronous machine,
``_sequenced_writer_state`` (``SequencedSegmentWriterState``, ``Floors``, ``SequenceLedger``,
``held_by_older``, ``route_moved``; the spec's action names, events in, instructions out).  This
module is its adapter: the lock, the hand-off between the caller's thread and the event loop, the
connections and the controller's and segments' reads.

What it does not do.  Two processes must not run with the same stable id at once (like Kafka's
``transactional.id`` or Pulsar's producer name): their events interleave under one identity and the
slower one's are dropped as duplicates.  Events need a routing key (a replay must reach the same
chain of segments).  The floors come from the segments the stream still holds: an event in a segment
that truncation removed is not recognised as a duplicate.  Per-event futures are not offered:
``flush`` says when everything written is durable.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar
from uuid import UUID

from millstream import limits
from millstream.client._config import ClientConfig, RandomSource
from millstream.client._in_doubt import InDoubtEvent
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._routing import StreamRouter
from millstream.client._segment_writer_state import (
    ARM_BATCH_TIMER,
    Instruction,
    ReleaseHolds,
    Resend,
)
from millstream.client._sequenced_writer_state import (
    DUPLICATE,
    Floors,
    SequencedEvent,
    SequencedSegmentWriterState,
    SequenceLedger,
    held_by_older,
    route_moved,
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
)
from millstream.errors import (
    InternalError,
    InvalidArgumentError,
    InvalidSequenceError,
    ObjectClosedError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

__all__ = ["DUPLICATE", "AsyncSequencedEventStreamWriter", "Floors", "SequencedEventStreamWriter",
           "SequencedSegmentWriter", "SequencedStreamBinding", "SequencedWriterCore", "check_stable_writer_id",
           "wire_writer_id"]

T = TypeVar("T")
R = TypeVar("R")

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


class SequencedShared(WriterShared):
    """``WriterShared`` plus what a writer with a stable id keeps for all its segments (under the lock):
    its ``SequenceLedger`` (the floors, the last sequence written, how many duplicates were dropped)."""

    __slots__ = ("ledger",)

    def __init__(self, loop: asyncio.AbstractEventLoop, unacked_bytes_max: int) -> None:
        super().__init__(loop, unacked_bytes_max)
        self.ledger = SequenceLedger()


class SequencedSegmentWriter(SegmentWriter, SequencedSegmentWriterState):
    """The adapter of a ``SequencedSegmentWriterState`` (the machine it is, see
    ``_sequenced_writer_state``): ``SegmentWriter``'s lock, loop hand-off and append session, with
    sends that ask the hold (``hold``, the stream writer's ``held_by_older`` under the lock) and
    ``ReleaseHolds`` carried out by ``progressed``."""

    def __init__(self, segment: str, *, shared: SequencedShared, pool: ConnectionPool, locator: SegmentLocator,
                 token: str, writer_id: UUID, config: ClientConfig, on_sealed: SealedHandler,
                 segment_range: SegmentWithRange, hold: Callable[[SequencedSegmentWriterState, int], bool],
                 progressed: Callable[[], None]) -> None:
        super().__init__(segment, shared=shared, pool=pool, locator=locator, token=token, writer_id=writer_id,
                         config=config, on_sealed=on_sealed)
        self.start_sequenced(shared.ledger, segment_range)
        self._hold = hold
        self._progressed = progressed

    # --- Carrying out the machine's instructions (loop thread, lock not held) -------------------------

    def _execute(self, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            kind = type(instruction)
            if kind is Resend:  # through the hold
                self._ready = True
                self._sent = 0
                self._pump()
            elif kind is ReleaseHolds:
                self._progressed()
            else:
                super()._execute([instruction])

    # --- Loop side ---------------------------------------------------------------------------------

    def _drain_outbox(self) -> None:
        self._drain_scheduled = False
        self.take_closed()
        self._pump()

    def _pump(self) -> None:
        """Send the blocks not yet sent on this session, in order, until one must wait (the machine's
        ``next_to_send``, which asks the hold)."""
        if not self._ready:
            return
        with self._lock:
            instructions = self.trim_unsent()
        if instructions:
            self._execute(instructions)
        while (block := self.next_to_send(self._hold)) is not None:
            before = self._sent
            self._send(block)
            if self._sent == before or not self._ready:
                return

    def acknowledge_stored(self, stored: int) -> None:
        """The session is over and the sealed segment stores this writer id's events up to ``stored``
        (its final attribute): the machine's ``acknowledge_sealed``, carried out."""
        self._drain_outbox()
        with self._lock:
            instructions = self.acknowledge_sealed(stored)
        self._execute(instructions)

    def retire_sequenced_locked(self) -> list[SequencedEvent]:
        """(Lock held.)  The machine's ``retire_sequenced``; flushes already waiting get False."""
        events = self.retire_sequenced()
        waiters, self._flush_waiters = self._flush_waiters, []
        for _, waiter in waiters:
            if not waiter.done():
                waiter.set_result(False)
        return events

    def check_invariants(self) -> None:
        """The machine's invariants, under the lock."""
        with self._lock:
            SequencedSegmentWriterState.check_invariants(self)


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
                self._sequenced.ledger.floors = floors
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
        """Buffer one event with its sequence: ``write_sequenced``'s flags (``SHIPPED``, ``OVER_BUDGET``,
        ``DUPLICATE``).  Raises
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
        lock = self._sequenced.lock
        for _ in range(limits.CLIENT_WRITER_REROUTES_MAX):
            segment = self._lookup(routing_key) or self._segment_for(routing_key)
            writer = self._writers.get(segment)
            if writer is None:
                writer = self._open_segment(segment, routing_key)
            assert isinstance(writer, SequencedSegmentWriter)
            # The machine's ``write_sequenced`` under the lock (acquire/release: see ``SegmentWriter.append``),
            # then the adapter gets what it answers to the loop.
            generation = 0
            lock.acquire()
            try:
                flags = writer.write_sequenced(payload, routing_key, sequence)
                if flags & ARM_BATCH_TIMER:
                    generation = writer._last_assigned
            finally:
                lock.release()
            if flags & (ARM_BATCH_TIMER | SHIPPED):
                flags = writer.carry_out(flags, generation)
            if not flags & REROUTE:
                return flags
        raise InternalError(f"an event was routed {limits.CLIENT_WRITER_REROUTES_MAX} times to segments whose keys "
                            "had moved on")

    # --- The hold ----------------------------------------------------------------------------------

    def _held_by_older(self, writer: SequencedSegmentWriterState, sequence: int) -> bool:
        """(Any thread.)  The machine's ``held_by_older`` over every segment writer, under the lock."""
        with self._sequenced.lock:
            return held_by_older(writer, sequence, self._writers.values())

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
                shared.ledger.segment_sealed(pieces, stored)
            events = writer.retire_sequenced_locked()
            del self._writers[writer.segment]
            for name, mine in route_moved(events, router.segment_for).items():
                target = self._writers.get(name)
                if target is None:
                    target = self._new_writer_locked(name)
                    created.append(target)  # type: ignore[arg-type]
                assert isinstance(target, SequencedSegmentWriter)
                touched[name] = target
                target.receive_moved(mine)
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
            self._sequenced.ledger.floors.check_invariants()


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
        return self._shared.ledger.duplicates

    @property
    def last_sequence(self) -> int:
        """The last sequence written (or dropped) through this writer; the next must exceed it (0: none)."""
        return self._shared.ledger.last_sequence

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
            return self._shared.ledger.floors.floor_of_key(routing_key)

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
        return self._shared.ledger.duplicates

    @property
    def last_sequence(self) -> int:
        """The last sequence written (or dropped) through this writer (0: none)."""
        return self._shared.ledger.last_sequence

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
            return self._shared.ledger.floors.floor_of_key(routing_key)

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
