"""Idempotent writers, the server and a simulated network that drops, delays and cuts, versus the model.

Hypothesis drives two real ``AsyncEventStreamWriter``s (each with a client, a connection pool and a
connection of its own) that write tagged events to one segment of a real ``SegmentStoreServer``
(one container, through its ``ContainerHost``, on the simulated Tier-1 log and Tier-2 storage),
over a ``SimulatedNetwork`` -- everything on one ``VirtualTimeEventLoop`` whose time is a
``ManualClock``, so a run replays exactly and timeouts fire only when a rule lets time pass.  The
rules are the operations and the faults: ``write_event``, ``flush``, ``cut_connection``,
``drop_replies``/``drop_requests`` (a direction of a connection goes dark), ``delay``, ``partition``,
``heal``, ``stall_tier1`` (Tier-1 writes wait, so appends pile up in the container),
``restart_container`` (a Tier-1 write fails; the host recovers a new container from the log),
``seal`` and ``advance_time``; each example first draws the disk's latency (``first_events``), so
that appends stay in flight in the container while connections break.

After every step the test reads the segment straight from the container and replays what it sees
on the model (``millstream.model.idempotent_writer``): each writer's events appear once, in order,
with no gap, and the segment only grows; what each writer was told (its per-event futures, and the
segment writer's own count, which must agree) must be stored already; the writer-id attributes the
server keeps must equal what each writer has stored; a writer that failed on the seal must have
been told of all of it that was stored; a flush that returned must have covered what was written
before it.  At the end the network heals, every writer flushes, and a reader reads the segment back
over the network: the history checker (``millstream.testing.history``) must find nothing lost,
duplicated, reordered, resurrected or phantom, and the reading must equal the model's segment.

A writer may give up (its reconnect attempts are bounded), but only after at least
``GIVE_UP_FAULTS_MIN`` faults since it last made progress: a writer that gives up after fewer is a
bug (a resend loop, a session that never recovers).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import hypothesis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from millstream.client import AsyncClient, ClientConfig
from millstream.errors import ConnectionLostError, ContainerUnavailableError, MillstreamError, StreamSegmentSealedError
from millstream.model import idempotent_writer as iw
from millstream.segmentstore.container import SegmentContainer
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag, History, Outcome, check
from millstream.testing.network import Direction, SimulatedNetwork, VirtualTimeEventLoop
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.wire import codec

T = TypeVar("T")

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
SEGMENT = "stateful/writers/0"
WRITERS = ("w0", "w1")
HOST, PORT = "store", 9090
#: Loop turns per settle: enough for a block to go out, be appended, written to Tier 1 and answered.
SETTLE_TURNS = 60
#: Virtual time advances in steps of at most this, so timers fire in their order, a turn apart.
TIME_STEP_SECONDS = 0.05
#: The final phase's bound: this long (virtual) after healing, every flush must have returned.
FINAL_SECONDS_MAX = 30.0
#: Bounded drives: a coroutine that needs more turns than this (without time passing) is stuck.
RUN_NOW_TURNS_MAX = 2000
#: See the module docstring.
GIVE_UP_FAULTS_MIN = 2
#: Small frames and frequent checkpoints, so events span frames and recovery meets checkpoints.
FRAME_BYTES_MAX = 2048
CHECKPOINT_FRAME_COUNT = 8

#: Timeouts chosen against the faults below: a delay's round trip (2 x 0.4 s) and a Tier-1 stall
#: (< 1 s) stay under the acknowledgement timeout, a partition (< 1 s) under the connect timeout, so
#: one fault alone cannot exhaust the reconnect attempts.
CLIENT_CONFIG = dict(connect_timeout_seconds=1.0, request_timeout_seconds=2.0, append_ack_timeout_seconds=1.0,
                     keepalive_interval_seconds=1.0, reconnect_attempts_max=12,
                     reconnect_delay_initial_seconds=0.01, reconnect_delay_max_seconds=1.0)
DELAYS_SECONDS = (0.05, 0.2, 0.4)
PARTITIONS_SECONDS = (0.2, 0.8)
STALLS_SECONDS = (0.1, 0.5, 0.9)
#: Tier-1 write latencies (for a whole example): with the processor's batching delay (<= 50 ms) and
#: the longest delay's round trip they stay under the acknowledgement timeout.
LATENCIES_SECONDS = (0.0, 0.05, 0.1)
ADVANCES_SECONDS = (0.005, 0.05, 0.3, 1.0, 2.5)
#: Payload sizes (a tag takes 30 bytes; a payload is at least that): small, and frame-spanning.
SIZES = (0, 100, 3000)


@attrs.define
class WriterRecord:
    """One writer and what the test knows of it."""

    name: str
    client: AsyncClient
    writer: Any  # AsyncEventStreamWriter[bytes]
    futures: list[asyncio.Future[None]] = attrs.field(factory=list)  # one per event, in order
    flushes: list[tuple[int, asyncio.Task[None]]] = attrs.field(factory=list)  # (events written before, task)
    acknowledged: int = 0
    faults_since_progress: int = 0
    failure: BaseException | None = None

    @property
    def segment_writer(self) -> Any:
        return self.writer.segment_writers().get(SEGMENT)


class WriterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.loop = VirtualTimeEventLoop(self.clock)
        self.network = SimulatedNetwork(self.loop)
        self.log_storage = SimulatedLogStorage()
        self.logs: list[SimulatedDurableDataLog] = []
        self.chunk_storage = SimulatedChunkStorage(clock=self.clock, rng=random.Random(0))
        self.tier1_stalled_until = 0.0
        self.tier1_latency_seconds = 0.0
        self.tier1_held = False
        self.tier1_log: SimulatedDurableDataLog | None = None
        self.tier1_appended_at: dict[int, float] = {}
        self.acks_at_risk = 0
        self.cuts_with_appends_in_flight = 0
        self.scratch = 0
        self.background: list[asyncio.Task[Any]] = []
        self.model = iw.initial_state(WRITERS)
        self.history = History()
        self.writers: dict[str, WriterRecord] = {}
        try:
            self.start()
        except BaseException:
            self.close_loop()  # (teardown is not called when __init__ fails)
            raise

    def start(self) -> None:
        self.server = SegmentStoreServer(
            self.open_log, clock=self.clock, chunk_storage=self.chunk_storage,
            config=ServerConfig(container_count=1, keepalive_interval_seconds=1.0, hello_timeout_seconds=2.0,
                                shutdown_drain_seconds=0.5),
            container_options={"restart_delay_seconds": 0.01, "stable_seconds": 0.0,
                               "frame_bytes_max": FRAME_BYTES_MAX, "checkpoint_frame_count": CHECKPOINT_FRAME_COUNT})
        self.run_now(self.server.start())
        self.network.listen(HOST, PORT, self.server.protocol_factory)
        self.run_now(self.container().create_segment(SEGMENT))
        for index, name in enumerate(WRITERS):
            client = self.new_client(index + 1)
            self.writers[name] = WriterRecord(name, client, self.run_now(self._event_writer(client)))

    def new_client(self, seed: int) -> AsyncClient:
        config = ClientConfig(connector=self.network.create_connection, **CLIENT_CONFIG)  # type: ignore[arg-type]
        return AsyncClient(f"tcp://{HOST}:{PORT}", config=config, clock=self.clock, rng=random.Random(seed))

    @staticmethod
    async def _event_writer(client: AsyncClient) -> Any:
        return client.event_writer([SEGMENT])  # (made on the loop, as the client asks)

    def open_log(self, container_id: int) -> SimulatedDurableDataLog:
        log = SimulatedDurableDataLog(self.log_storage, auto_complete=False)
        self.logs.append(log)
        return log

    # --- driving the loop ------------------------------------------------------------------------------

    def drive_tier1(self) -> None:
        """Tier 1 makes each pending write durable and confirms it, in order, once it has been pending
        for the latency in force -- unless stalled (or held by a rule that wants a write pending)."""
        if not self.logs:
            return
        log = self.logs[-1]
        if log._state.value != "open" or not log.pending_sequences:
            return
        now = self.clock.monotonic()
        if log is not self.tier1_log:
            self.tier1_log, self.tier1_appended_at = log, {}
        for sequence in log.pending_sequences:
            self.tier1_appended_at.setdefault(sequence, now)
        if self.tier1_held or now < self.tier1_stalled_until:
            return
        due = [s for s in log.pending_sequences if self.tier1_appended_at[s] + self.tier1_latency_seconds <= now]
        log.persist(max(0, len(due) - len(log.durable_pending_sequences)))
        for sequence in due:
            if log._state.value != "open":
                return
            log.notify(sequence)
            del self.tier1_appended_at[sequence]

    def turns(self, count: int = SETTLE_TURNS) -> None:
        async def spin() -> None:
            for _ in range(count):
                await asyncio.sleep(0)
                self.drive_tier1()
        self.loop.run_until_complete(spin())

    def run_now(self, coroutine: Awaitable[T], *, seconds_max: float = 0.0) -> T:
        """Run ``coroutine`` to its end, letting at most ``seconds_max`` of virtual time pass (in steps
        of 5 ms, only while it is not done after the turns before)."""
        task = self.loop.create_task(coroutine)  # type: ignore[arg-type]
        waited = 0.0
        for _ in range(RUN_NOW_TURNS_MAX // 10):
            if task.done():
                return task.result()
            self.turns(10)
            if not task.done() and waited < seconds_max:
                self.clock.advance(0.005)
                waited += 0.005
        task.cancel()
        self.turns(5)
        raise AssertionError(f"{coroutine} did not finish within {RUN_NOW_TURNS_MAX} turns and {waited:.3f} s")

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, in small steps, the loop settling after each."""
        remaining = seconds
        while remaining > 1e-12:
            step = min(TIME_STEP_SECONDS, remaining)
            self.clock.advance(step)
            remaining -= step
            self.turns(20)
        self.turns()

    def container(self) -> SegmentContainer:
        return self.server.container_for(SEGMENT)

    def container_running(self) -> bool:
        try:
            self.container()
        except ContainerUnavailableError:
            return False
        return True

    # --- comparing with the model -----------------------------------------------------------------------

    def read_segment(self) -> tuple[list[bytes], Any] | None:
        """The segment's events and info, read straight from the container (None while it restarts)."""
        try:
            container = self.container()
        except ContainerUnavailableError:
            return None
        info = container.get_info(SEGMENT)

        async def read() -> bytes:
            data, offset = bytearray(), info.start_offset
            while offset < info.length:
                result = await container.read(SEGMENT, offset, info.length - offset)
                assert result.data, f"an empty read at {offset} of {info.length}"
                data += result.data
                offset += len(result.data)
            return bytes(data)

        return list(codec.iter_events(self.run_now(read()))), info

    @staticmethod
    def events_of(payloads: list[bytes]) -> list[iw.Event]:
        events = []
        for payload in payloads:
            tag = EventTag.parse(payload)
            assert tag is not None, f"the segment holds an event nobody wrote: {payload[:40]!r}"
            events.append(iw.Event(tag.writer, tag.sequence))
        return events

    def sync(self) -> None:
        """Replay what the segment and the writers show on the model (see the module docstring)."""
        reading = self.read_segment()
        if reading is not None:
            payloads, info = reading
            self.model = iw.observe(self.model, self.events_of(payloads))
            assert info.sealed == self.model.sealed, (info.sealed, self.model.sealed)
            for name, record in self.writers.items():
                segment_writer = record.segment_writer
                if segment_writer is not None:
                    stored_number = info.attributes.get(segment_writer.writer_id.int, 0)
                    assert stored_number == self.model.writer(name).stored, (
                        f"{name}: the server's event number {stored_number}, but "
                        f"{self.model.writer(name).stored} events of it are in the segment")
        for name, record in self.writers.items():
            self.sync_writer(name, record, current=reading is not None)
        self.model.check_invariants()

    def sync_writer(self, name: str, record: WriterRecord, *, current: bool) -> None:
        acknowledged = 0
        for number, future in enumerate(record.futures, start=1):
            if not future.done():
                break
            if future.cancelled() or future.exception() is not None:
                assert record.segment_writer is not None and record.segment_writer.failed is not None, (
                    f"{name}: event {number} failed ({future}), but the writer has not")
                break
            acknowledged = number
        for future in record.futures[acknowledged:]:
            assert not (future.done() and not future.cancelled() and future.exception() is None), (
                f"{name}: an event was acknowledged after one before it was not")
        segment_writer = record.segment_writer
        if segment_writer is not None:
            assert segment_writer.acknowledged_event_number == acknowledged, (
                name, segment_writer.acknowledged_event_number, acknowledged)
            segment_writer.check_invariants()
        if acknowledged > record.acknowledged:
            record.acknowledged = acknowledged
            record.faults_since_progress = 0
        if current:  # (an acknowledgement is checked against a reading taken after it)
            self.model = iw.acknowledge(self.model, name, acknowledged)
        for target, task in record.flushes:
            if task.done() and not task.cancelled() and task.exception() is None:
                assert acknowledged >= target, f"{name}: flush returned with {acknowledged} of {target} acknowledged"
        failure = segment_writer.failed if segment_writer is not None else None
        if failure is not None and record.failure is None and current:
            record.failure = failure
            for future in record.futures:  # (retrieved: the writer's failure is what is judged)
                if future.done() and not future.cancelled():
                    future.exception()
            if isinstance(failure, StreamSegmentSealedError):
                # Refused: the writer read what the sealed segment stores for it and acknowledged
                # exactly that (the model refuses a refusal that was not told of a stored event).
                self.model = iw.refuse(self.model, name)
            else:
                # Gave up: reconnecting, or reading what the sealed segment stores, ran out of attempts.
                gave_up = (isinstance(failure, ConnectionLostError) and "gave up" in str(failure)) or (
                    isinstance(failure, ContainerUnavailableError) and "could not be read after" in str(failure))
                assert gave_up, f"{name} failed with {failure!r}"
                assert record.faults_since_progress >= GIVE_UP_FAULTS_MIN, (
                    f"{name} gave up after only {record.faults_since_progress} faults since its last "
                    f"acknowledgement: {failure}")
                self.model = iw.give_up(self.model, name)

    def settle(self) -> None:
        self.turns()
        self.sync()

    def fault(self) -> None:
        for record in self.writers.values():
            record.faults_since_progress += 1

    def breaking_a_connection(self) -> None:
        """(Coverage.)  Events stored but not yet acknowledged now depend on the writer's setup."""
        self.acks_at_risk += sum(w.stored - w.acknowledged for w in self.model.writers.values())

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.sync()
        self.network.check_invariants()
        self.server.check_invariants()

    # --- the writers ---------------------------------------------------------------------------------------

    @initialize(tier1_latency=st.sampled_from(LATENCIES_SECONDS),
                counts=st.tuples(st.integers(1, 6), st.integers(0, 6)), size=st.sampled_from(SIZES))
    def first_events(self, tier1_latency: float, counts: tuple[int, int], size: int) -> None:
        """The disk's speed for this example: each Tier-1 write takes ``tier1_latency``, so appends stay
        in flight in the container for that long and a writer that reconnects meanwhile re-sends blocks
        the container already holds.  And every example starts with events in flight, so that the first
        fault has something to hit."""
        self.tier1_latency_seconds = tier1_latency
        for name, count in zip(WRITERS, counts, strict=True):
            if count:
                self.write_event(name, count, size)

    @rule(name=st.sampled_from(WRITERS), count=st.integers(1, 6), size=st.sampled_from(SIZES))
    def write_event(self, name: str, count: int, size: int) -> None:
        record = self.writers[name]
        for _ in range(count):
            segment_writer = record.segment_writer
            if segment_writer is not None and segment_writer.failed is not None:
                # A failed writer refuses events with its error, and takes nothing.
                try:
                    self.run_now(record.writer.write_event(b"refused"))
                except type(segment_writer.failed):
                    break
                raise AssertionError(f"{name} has failed, yet it took another event")
            model, number = iw.write_event(self.model, name)
            tag = EventTag(name, number)
            try:
                future = self.run_now(record.writer.write_event_future(tag.payload(size)))
            except MillstreamError as error:
                # The writer failed while this call waited for its turn on the loop (a refusal that was
                # already on its way, e.g. the seal's): it refuses the event, as a failed writer does.
                segment_writer = record.segment_writer
                assert segment_writer is not None and type(segment_writer.failed) is type(error), (name, error)
                break
            self.model = model
            self.history.write_invoked(tag)
            record.futures.append(future)
        self.settle()

    @rule(name=st.sampled_from(WRITERS))
    def flush(self, name: str) -> None:
        """Ask for a flush; it returns when what was written is acknowledged (checked by ``sync``)."""
        record = self.writers[name]
        if any(not task.done() for _, task in record.flushes):
            return
        task = self.loop.create_task(record.writer.flush())
        record.flushes.append((self.model.writer(name).written, task))
        self.settle()

    # --- the network ---------------------------------------------------------------------------------------

    @precondition(lambda self: self.network.open_links())
    @rule(choice=st.integers(0, 3))
    def cut_connection(self, choice: int) -> None:
        links = self.network.open_links()
        self.breaking_a_connection()
        if self.logs and self.logs[-1].pending_sequences:
            self.cuts_with_appends_in_flight += 1
        self.network.cut(links[choice % len(links)])
        self.fault()
        self.settle()

    def _black_hole(self, choice: int, direction: Direction) -> None:
        links = [link for link in self.network.open_links() if not link.black_holed(direction)]
        if links:
            self.breaking_a_connection()
            self.network.black_hole(links[choice % len(links)], direction)
            self.fault()
        self.settle()

    @precondition(lambda self: self.network.open_links())
    @rule(choice=st.integers(0, 3))
    def drop_replies(self, choice: int) -> None:
        """The server's replies on one connection vanish from now on (acknowledgements are lost)."""
        self._black_hole(choice, Direction.TO_CLIENT)

    @precondition(lambda self: self.network.open_links())
    @rule(choice=st.integers(0, 3))
    def drop_requests(self, choice: int) -> None:
        """What a client sends on one connection vanishes from now on."""
        self._black_hole(choice, Direction.TO_SERVER)

    @rule(seconds=st.sampled_from(DELAYS_SECONDS), direction=st.sampled_from([None, *Direction]))
    def delay(self, seconds: float, direction: Direction | None) -> None:
        self.network.delay(seconds, direction)
        self.fault()
        self.settle()

    @rule(seconds=st.sampled_from(PARTITIONS_SECONDS))
    def partition(self, seconds: float) -> None:
        self.network.partition(seconds)
        self.fault()
        self.settle()

    @rule(what=st.sampled_from(["network", "tier1", "everything"]))
    def heal(self, what: str) -> None:
        """Faults end: the network's delays and partition (dead connections stay dead), Tier 1's stall."""
        if what != "tier1":
            self.network.heal()
        if what != "network":
            self.tier1_stalled_until = 0.0
        self.settle()

    # --- the store -----------------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from(STALLS_SECONDS))
    def stall_tier1(self, seconds: float) -> None:
        """Tier-1 writes wait for ``seconds``: appends pile up in the container, unacknowledged."""
        self.tier1_stalled_until = max(self.tier1_stalled_until, self.clock.monotonic() + seconds)
        self.fault()
        self.settle()

    @precondition(lambda self: self.container_running())
    @rule(unknown_outcome=st.booleans())
    def restart_container(self, unknown_outcome: bool) -> None:
        """A Tier-1 write fails (``unknown_outcome``: it is on the disk all the same); the container
        stops and its host recovers a new one from the log."""
        host = self.server.container_host(0)
        restarts = host.restarts
        log = self.logs[-1]
        self.tier1_held = True
        try:
            if not log.pending_sequences:
                # Nothing in flight: give the container a write of its own to fail.  (Its processor
                # may hold the frame back for a batching delay: let a little time pass if so.)
                self.scratch += 1
                self.background.append(self.loop.create_task(
                    self.container().create_segment(f"stateful/scratch/{self.scratch}")))
                for _ in range(40):
                    self.turns(20)
                    if log.pending_sequences:
                        break
                    self.clock.advance(0.005)
            assert log.pending_sequences, "the container wrote nothing to Tier 1"
            log.fail_write(unknown_outcome=unknown_outcome)
        finally:
            self.tier1_held = False
        self.fault()
        for _ in range(100):  # the host waits its restart delay (10 ms), then recovers
            self.advance(0.005)
            if host.restarts > restarts and self.container_running():
                break
        assert host.restarts == restarts + 1 and self.container_running(), (host.restarts, restarts)
        self.sync()

    @precondition(lambda self: not self.model.sealed and self.container_running()
                  and self.clock.monotonic() >= self.tier1_stalled_until
                  and sum(w.written for w in self.model.writers.values()) >= 4)
    @rule(really=st.integers(0, 2))
    def seal(self, really: int) -> None:
        """Seal the segment (one draw in three: sealing ends the writers, so it should come late)."""
        if really:
            return
        self.run_now(self.container().seal(SEGMENT), seconds_max=1.0)
        self.turns()
        reading = self.read_segment()
        assert reading is not None and reading[1].sealed
        self.model = iw.seal(iw.observe(self.model, self.events_of(reading[0])))
        self.sync()

    # --- time ----------------------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from(ADVANCES_SECONDS))
    def advance_time(self, seconds: float) -> None:
        """Time passes: delays end, acknowledgement deadlines and keep-alives expire, writers back off
        and reconnect, the host restarts containers, Tier 2 flushes."""
        self.advance(seconds)
        self.sync()

    # --- the end -------------------------------------------------------------------------------------------

    def final_check(self) -> None:
        """Heal everything, flush every writer, read the segment back over the network, check the history."""
        self.network.heal()
        self.tier1_stalled_until = 0.0
        for name, record in self.writers.items():  # (a flush still waiting covers less: add one)
            record.flushes.append((self.model.writer(name).written, self.loop.create_task(record.writer.flush())))
        waited = 0.0
        while any(not task.done() for record in self.writers.values() for _, task in record.flushes):
            assert waited < FINAL_SECONDS_MAX, (
                f"{FINAL_SECONDS_MAX} s after healing, a flush still waits: "
                f"{[(r.name, r.acknowledged, self.model.writer(r.name)) for r in self.writers.values()]}")
            self.advance(0.1)
            waited += 0.1
        self.settle()
        for name, record in self.writers.items():
            state = self.model.writer(name)
            errors = [task.exception() for _, task in record.flushes if not task.cancelled()]
            if state.status is iw.WriterStatus.ACTIVE:
                assert state.acknowledged == state.written, (name, state, errors)
                assert errors == [None] * len(errors), (name, errors)
            for future in record.futures:
                if future.done() and not future.cancelled():
                    future.exception()  # (retrieved: judged through the model above)
            for number in range(1, state.written + 1):
                tag = EventTag(name, number)
                if number <= state.acknowledged:
                    self.history.write_completed(tag, Outcome.ACKED)
                elif state.status is iw.WriterStatus.REFUSED:
                    self.history.write_completed(tag, Outcome.FAILED)  # it met the seal: never stored
                else:
                    self.history.write_completed(tag, Outcome.UNKNOWN)

        self.record_coverage()
        reader_client = self.new_client(99)
        payloads = self.run_now(self._read_back(reader_client))
        self.history.read_all("final", payloads, complete=True)
        report = check(self.history)
        assert report.ok, f"{report.summary()}\n{report}"
        assert self.events_of(payloads) == list(self.model.events), "the reader saw another segment than the model"

    def record_coverage(self) -> None:
        """What this example exercised, for ``--hypothesis-show-statistics``."""
        def bucket(count: int) -> str:
            return "0" if count == 0 else "1-3" if count <= 3 else "4-15" if count <= 15 else "16+"
        reconnects = sum(r.segment_writer.reconnects for r in self.writers.values() if r.segment_writer is not None)
        hypothesis.event("writer reconnects", bucket(reconnects))
        hypothesis.event("container restarts", bucket(self.server.container_host(0).restarts))
        hypothesis.event("events acknowledged", bucket(sum(w.acknowledged for w in self.model.writers.values())))
        hypothesis.event("stored, unacknowledged events when a connection broke", bucket(self.acks_at_risk))
        hypothesis.event("connections cut while Tier-1 writes were in flight", bucket(self.cuts_with_appends_in_flight))
        for state in self.model.writers.values():
            hypothesis.event(f"a writer ended {state.status.value}")
        hypothesis.event("sealed" if self.model.sealed else "not sealed")

    async def _read_back(self, client: AsyncClient) -> list[bytes]:
        try:
            reader = client.segment_reader(SEGMENT)
            payloads: list[bytes] = []
            for _ in range(100_000):
                events = await reader.read_events()
                if not events:
                    break
                payloads.extend(event.value for event in events)
            await reader.close()
            return payloads
        finally:
            await client.close()

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is None:  # (not while a step's failure propagates: it is the news)
                self.final_check()
        finally:
            self.shut_down()

    def shut_down(self) -> None:
        """Close the clients and stop the server, each bounded; then cancel whatever is left."""
        try:
            for record in self.writers.values():
                self._bounded(record.client.close)
            self._bounded(self.server.stop)
        finally:
            for record in self.writers.values():
                for future in record.futures:
                    if future.done() and not future.cancelled():
                        future.exception()  # (retrieved: what they say was judged, or the example failed)
            self.close_loop()

    def close_loop(self) -> None:
        """Cancel every task left and let the cancellations run (bounded), then close the loop."""
        for _ in range(20):
            tasks = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.wait(tasks, timeout=0))
            self.turns(5)
        for task in self.background:
            if task.done() and not task.cancelled():
                task.exception()
        self.loop.close()

    def _bounded(self, close: Callable[[], Awaitable[None]]) -> None:
        task = self.loop.create_task(close())  # type: ignore[arg-type]
        for _ in range(100):
            if task.done():
                break
            self.clock.advance(0.1)
            self.turns(20)
        if not task.done():
            task.cancel()
            self.turns(5)
        elif not task.cancelled():
            task.exception()  # (a writer that failed makes close raise: the checks above judged it)


WriterMachine.TestCase.settings = settings(
    settings.default,
    max_examples=2000 if NIGHTLY else 100,
    stateful_step_count=100 if NIGHTLY else 30,
)
TestWriterVsModel = WriterMachine.TestCase
