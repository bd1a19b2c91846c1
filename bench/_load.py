"""Offering one rate to one system: the pacing loop, and the bookkeeping of what came back.

Theory of operation.  One asyncio loop in the harness's process is the writer.  The pacing loop
(``offer``) looks at the clock, works out how many events are due at the offered rate since the step
began (``floor(elapsed * rate) + 1 - sent``), and once a pacing tick's worth is due
(``BENCH_PACING_TICK_SECONDS`` of events, at least one) hands them to the driver as one ``Batch`` --
at most ``BENCH_TICK_EVENTS_MAX`` events or ``BENCH_TICK_BYTES_MAX`` bytes -- then yields and looks
again; until then it sleeps.  (Sending each event the moment it fell due kept the loop spinning at
moderate rates, a core of the writer's process spent on pacing beside the client under test.)  At
"max" (no rate) every tick is a full batch and the only brake is backpressure.  The events of a
batch share one send time: at a fixed rate, the moment its first event fell due (or, if later, the
moment the loop was free again after the previous batch) -- so the wait for a tick's worth, and for
room when the system is behind, count as latency; at "max", the moment it is handed over.  It rides
in the first 8 bytes of their payload (little-endian double, ``time.monotonic()``: one clock for the
whole machine on Linux, so a reader in any process could use it).

Write latency is from the send time to the acknowledgement the driver reports; end-to-end latency
from the send time to the moment a consumer reads the event.  What is *measured* is what comes back
inside the window ``[window_start, window_end)`` that follows the warm-up: the acknowledgements (and
deliveries) that arrive in it, with their latencies, and achieved throughput is their number divided
by the window's length -- as OpenMessaging Benchmark counts a producer's rate.  At a rate the system
keeps up with, that is the offered rate; at "max" it is what the system sustains, however deep the
queue in front of it.  An offered rate the system cannot take shows up as achieved < offered, and as
latency.  After the window the harness waits (bounded) until every event sent is acknowledged and
delivered, so a lost event is an error, not a silently smaller count.

Backpressure is the harness's, the same for every system: when more than ``BENCH_IN_FLIGHT_EVENTS_MAX``
events (or ``BENCH_IN_FLIGHT_BYTES_MAX`` bytes) are sent and not acknowledged, the pacing loop waits
for acknowledgements (bounded: no acknowledgement for ``BENCH_DRAIN_TIMEOUT_SECONDS`` fails the step).

Bounds: the loop stops at the window's end, after ``bytes_max`` bytes, or after ``ticks_max`` ticks,
whichever comes first, and a driver's ``write`` that has not returned ``write_timeout_seconds`` after
the window fails the step; then ``drain`` waits (bounded) for the acknowledgements and the consumers.
The window opens and closes on time (timer callbacks), so the CPU read at its ends covers it exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import attrs

from bench._histogram import LatencyHistogram
from bench._keys import splitmix64
from bench.limits import (
    BENCH_DRAIN_TIMEOUT_SECONDS,
    BENCH_IN_FLIGHT_BYTES_MAX,
    BENCH_IN_FLIGHT_EVENTS_MAX,
    BENCH_PACING_TICK_SECONDS,
    BENCH_PAYLOAD_POOL_SIZE,
    BENCH_TICK_BYTES_MAX,
    BENCH_TICK_EVENTS_MAX,
)

__all__ = [
    "SEND_TIME",
    "Batch",
    "BatchAcknowledgements",
    "OfferPlan",
    "PayloadPool",
    "Producer",
    "StepRecorder",
    "StepStalledError",
    "make_payload",
    "offer",
    "send_time_of",
]

#: The send time's place in every payload: the first 8 bytes, a little-endian double.
SEND_TIME: Final = struct.Struct("<d")

#: Ticks per second of pacing the loop may take at most (a tick is one batch or one short sleep):
#: far above what Python's event loop manages, so only a broken clock ever meets it.
_TICKS_PER_SECOND_MAX: Final = 200_000


class StepStalledError(RuntimeError):
    """A step made no progress: no acknowledgement (or no delivery) for the drain timeout."""


def make_payload(sent_at: float, event_bytes: int) -> bytes:
    """An event of ``event_bytes`` whose first 8 bytes are the send time."""
    return SEND_TIME.pack(sent_at) + b"\xa5" * (event_bytes - SEND_TIME.size)


def send_time_of(payload: bytes | memoryview) -> float:
    return float(SEND_TIME.unpack_from(payload)[0])


class PayloadPool:
    """The distinct payloads of a workload: ``BENCH_PAYLOAD_POOL_SIZE`` byte strings of ``event_bytes``,
    each the send time (8 bytes) and a tail of its own -- a slice of one seeded random buffer at the
    slot's offset, which makes the tails distinct (two equal slices of random bytes at different
    offsets would need the buffer to repeat itself).  Event ``i`` of a step takes slot ``i mod size``;
    each event is its own ``bytes`` object, as a user's are."""

    __slots__ = ("_buffer", "_tail_bytes", "size")

    def __init__(self, event_bytes: int, *, seed: int = 26, size: int = BENCH_PAYLOAD_POOL_SIZE) -> None:
        if event_bytes < SEND_TIME.size + 8:
            raise ValueError(f"an event of the harness holds its send time and a distinct tail: at least "
                             f"{SEND_TIME.size + 8} bytes, not {event_bytes}")
        self.size = size
        self._tail_bytes = event_bytes - SEND_TIME.size
        self._buffer = _seeded_bytes(seed, self._tail_bytes + size)

    def tail(self, slot: int) -> bytes:
        """The distinct part of pool slot ``slot``."""
        start = slot % self.size
        return self._buffer[start:start + self._tail_bytes]

    def payloads(self, sent_at: float, first: int, count: int) -> list[bytes]:
        """The payloads of events ``first .. first + count - 1`` of a step, all sent at ``sent_at``."""
        stamp = SEND_TIME.pack(sent_at)
        buffer = self._buffer
        tail_bytes = self._tail_bytes
        size = self.size
        return [stamp + buffer[start:start + tail_bytes]
                for start in ((first + index) % size for index in range(count))]


def _seeded_bytes(seed: int, length: int) -> bytes:
    """``length`` pseudo-random bytes from SplitMix64 (``_keys``: the harness's one generator, seeded)."""
    words = []
    state = seed
    for _ in range((length + 7) // 8):
        value, state = splitmix64(state)
        words.append(value.to_bytes(8, "little"))
    return b"".join(words)[:length]


@attrs.frozen
class Batch:
    """Events ``first_sequence .. first_sequence + count - 1`` of a step, all sent at ``sent_at``, with
    their distinct ``payloads`` (drawn from the step's ``PayloadPool``).  The driver gets their routing
    keys or partitions from the ``KeySpace``."""

    sent_at: float
    payloads: list[bytes]
    count: int
    first_sequence: int


class Producer(Protocol):
    """What the pacing loop needs of a driver's session."""

    async def write(self, batch: Batch) -> None:
        """Hand the batch's events to the system's client.  Return as soon as they are handed over
        (await only what the client itself makes you await); report acknowledgements to the step's
        ``StepRecorder`` as they arrive."""
        ...


class StepRecorder:
    """What happened to the events of one step: sent, acknowledged, delivered, and their latencies.

    Drivers call ``acknowledged`` and ``delivered`` (from callbacks or tasks on the loop's thread);
    the pacing loop calls ``sent`` and ``begin_window``/``end_window``.
    """

    def __init__(self, *, event_bytes: int, clock: Callable[[], float] = time.monotonic,
                 in_flight_events_max: int = BENCH_IN_FLIGHT_EVENTS_MAX,
                 in_flight_bytes_max: int = BENCH_IN_FLIGHT_BYTES_MAX) -> None:
        self.clock = clock
        self.event_bytes = event_bytes
        self.window_start = math.inf
        self.window_end = math.inf
        self.write_latency = LatencyHistogram()
        self.end_to_end_latency = LatencyHistogram()
        self.sent_total = 0
        self.acknowledged_total = 0
        self.delivered_total = 0
        self.sent_measured = 0
        self.acknowledged_measured = 0
        self.delivered_measured = 0
        self.errors: list[str] = []
        self.in_flight_max = max(1, min(in_flight_events_max, in_flight_bytes_max // max(1, event_bytes)))
        self._room = asyncio.Event()
        self._progress = asyncio.Event()
        self._window_hooks: list[Callable[[str], None]] = []
        self.window_opened = False
        self.window_closed = False

    # -- the window ----------------------------------------------------------------------------------

    def on_window(self, hook: Callable[[str], None]) -> None:
        """Call ``hook("begin")`` and ``hook("end")`` when the measured window opens and closes."""
        self._window_hooks.append(hook)

    def plan_window(self, start: float, end: float) -> None:
        """The measured window, known before the first event is sent (so that an event counts as measured
        or not the same way when it is sent, acknowledged and delivered)."""
        self.window_start = start
        self.window_end = end

    def begin_window(self) -> None:
        self.window_opened = True
        for hook in self._window_hooks:
            hook("begin")

    def end_window(self, at: float) -> None:
        """The window closes at ``at`` (earlier than planned if the step ran out of bytes: nothing was
        sent after ``at``).  Only the first call counts."""
        if self.window_closed:
            return
        self.window_closed = True
        self.window_end = min(self.window_end, at)
        for hook in self._window_hooks:
            hook("end")

    @property
    def window_seconds(self) -> float | None:
        if math.isinf(self.window_start) or math.isinf(self.window_end) or self.window_end <= self.window_start:
            return None  # not run yet, or the step ended (out of bytes) before its warm-up did
        return self.window_end - self.window_start

    def _measured(self, at: float) -> bool:
        return self.window_start <= at < self.window_end

    # -- what drivers report -------------------------------------------------------------------------

    def sent(self, sent_at: float, count: int) -> None:
        self.sent_total += count
        if self._measured(sent_at):
            self.sent_measured += count

    def acknowledged(self, sent_at: float, count: int = 1, at: float | None = None) -> None:
        """``count`` events sent at ``sent_at`` are durable (the system acknowledged them) now, or at
        ``at`` (on ``clock``) when the driver read the clock as the acknowledgement reached it."""
        self.acknowledged_total += count
        now = self.clock() if at is None else at
        if self._measured(now):
            self.acknowledged_measured += count
            self.write_latency.record(now - sent_at, count)
        if self.sent_total - self.acknowledged_total <= self.in_flight_max * 3 // 4:
            self._room.set()
        self._progress.set()

    def delivered(self, sent_at: float, count: int = 1) -> None:
        """A consumer read ``count`` events sent at ``sent_at`` now."""
        self.delivered_total += count
        now = self.clock()
        if self._measured(now):
            self.delivered_measured += count
            self.end_to_end_latency.record(now - sent_at, count)
        self._progress.set()

    def failed(self, message: str) -> None:
        """The driver saw an error it could not recover from (reported; the step fails at its end)."""
        self.errors.append(message)
        self._progress.set()
        self._room.set()

    # -- waits ---------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.sent_total - self.acknowledged_total

    async def wait_for_room(self, count: int, deadline: float,
                            stall_seconds: float = BENCH_DRAIN_TIMEOUT_SECONDS) -> bool:
        """Wait while sending ``count`` more would exceed the in-flight bound.  False if ``deadline``
        (on ``clock``) came first; ``StepStalledError`` if ``stall_seconds`` pass with no
        acknowledgement at all."""
        while self.in_flight + count > self.in_flight_max and self.in_flight > 0 and not self.errors:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            self._room.clear()
            before = self.acknowledged_total
            try:
                await asyncio.wait_for(self._room.wait(), min(remaining, stall_seconds))
            except TimeoutError:
                if self.acknowledged_total == before and remaining > stall_seconds:
                    raise StepStalledError(
                        f"no acknowledgement for {stall_seconds:g} s with {self.in_flight:,} events in flight"
                    ) from None
        return True

    async def wait_until(self, done: Callable[[], bool], what: str, timeout_seconds: float) -> None:
        """Wait until ``done()`` (or an error was reported), for at most ``timeout_seconds`` in all."""
        deadline = self.clock() + timeout_seconds
        while not done() and not self.errors:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise StepStalledError(f"still waiting for {what} after {timeout_seconds:g} s")
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)

    async def drain(self, *, consumers: bool, timeout_seconds: float = BENCH_DRAIN_TIMEOUT_SECONDS) -> None:
        """Wait for every sent event's acknowledgement, then (with consumers) for every measured event
        to be delivered; at most ``timeout_seconds`` each, else ``StepStalledError``."""
        await self.wait_until(lambda: self.acknowledged_total >= self.sent_total,
                              f"{self.in_flight:,} acknowledgements", timeout_seconds)
        if consumers:
            await self.wait_until(lambda: self.delivered_total >= self.acknowledged_total,
                                  "the consumers to read every event", timeout_seconds)

    def check_invariants(self) -> None:
        assert 0 <= self.acknowledged_measured <= self.acknowledged_total <= self.sent_total
        assert self.sent_measured <= self.sent_total and self.delivered_measured <= self.delivered_total
        assert self.write_latency.count == self.acknowledged_measured
        assert self.end_to_end_latency.count == self.delivered_measured
        self.write_latency.check_invariants()
        self.end_to_end_latency.check_invariants()


class BatchAcknowledgements:
    """The done-callback for the per-event futures of one batch (``future.add_done_callback(acks)``).

    The futures of a block of events complete together, in one turn of the event loop; recording each
    on its own would cost a histogram update per event -- harness overhead charged to the system under
    test.  Instead the first completion of a turn schedules one ``call_soon`` that records all of that
    turn's completions at once.  Their acknowledgement time is read as each completion's callback runs
    (the moment an application's own callback would learn of it), and the latest of them is recorded
    for all: not when the deferred recording runs, a loop turn later, behind whatever else that turn
    does (a pacing tick's worth of sends).  A failed or cancelled future is reported to the recorder as
    the step's error.

    A client whose events share futures (millstream's writer hands every event of a block the block's
    one future) is tracked with ``track(future)`` instead: one callback per distinct future, counting
    the events it answers for, rather than one per event -- the same latencies, recorded when the same
    future completes, without a callback per event on a future that is one object.
    """

    __slots__ = ("_acknowledged_at", "_counts", "_pending", "_recorder", "_scheduled", "_sent_at", "_what")

    def __init__(self, recorder: StepRecorder, sent_at: float, what: str) -> None:
        self._recorder = recorder
        self._sent_at = sent_at
        self._what = what
        self._pending = 0
        self._scheduled = False
        self._acknowledged_at = 0.0  # when the latest completion not yet recorded was seen
        #: Events per tracked future whose callback has not run yet.
        self._counts: dict[asyncio.Future[Any], int] = {}

    def __call__(self, future: asyncio.Future[Any]) -> None:
        self._completed(future, 1)

    def track(self, future: asyncio.Future[Any]) -> None:
        """One more event is answered by ``future`` (which may answer for others too)."""
        counts = self._counts
        count = counts.get(future)
        if count is None:
            counts[future] = 1
            future.add_done_callback(self._tracked_done)
        else:  # the callback has not run: it will count this event too
            counts[future] = count + 1

    def _tracked_done(self, future: asyncio.Future[Any]) -> None:
        self._completed(future, self._counts.pop(future))

    def _completed(self, future: asyncio.Future[Any], count: int) -> None:
        if future.cancelled():
            self._recorder.failed(f"{self._what} was cancelled")
            return
        error = future.exception()
        if error is not None:
            self._recorder.failed(f"{self._what} failed: {error!r}")
            return
        self._pending += count
        self._acknowledged_at = self._recorder.clock()
        if not self._scheduled:
            self._scheduled = True
            future.get_loop().call_soon(self._record)

    def _record(self) -> None:
        count, self._pending, self._scheduled = self._pending, 0, False
        self._recorder.acknowledged(self._sent_at, count, self._acknowledged_at)


@attrs.frozen
class OfferPlan:
    """One step: offer ``rate`` events/s (None: as fast as taken) for ``warmup_seconds`` unmeasured,
    then ``duration_seconds`` measured, at most ``bytes_max`` bytes in all."""

    rate: float | None
    warmup_seconds: float
    duration_seconds: float
    event_bytes: int
    bytes_max: int

    @property
    def tick_events_max(self) -> int:
        return max(1, min(BENCH_TICK_EVENTS_MAX, BENCH_TICK_BYTES_MAX // self.event_bytes))


async def offer(producer: Producer, plan: OfferPlan, recorder: StepRecorder,
                sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                write_timeout_seconds: float = BENCH_DRAIN_TIMEOUT_SECONDS) -> int:
    """Run the pacing loop of one step (see the module docstring); the number of events sent."""
    clock = recorder.clock
    started = clock()
    window_start = started + plan.warmup_seconds
    window_end = window_start + plan.duration_seconds
    ticks_max = math.ceil((plan.warmup_seconds + plan.duration_seconds) * _TICKS_PER_SECOND_MAX) + 1
    tick_events_max = min(plan.tick_events_max, recorder.in_flight_max)
    recorder.plan_window(window_start, window_end)
    # The window opens and closes on time (the CPU meters read then), even while the loop waits for
    # room or for a driver's write.
    loop = asyncio.get_running_loop()
    opening = loop.call_later(plan.warmup_seconds, recorder.begin_window)
    closing = loop.call_later(plan.warmup_seconds + plan.duration_seconds, lambda: recorder.end_window(clock()))
    # One deadline for the whole loop instead of a timeout per write: ``wait_for`` costs a task and a
    # timer per tick, which at a few thousand ticks a second is a load of its own on the writer process.
    # Nothing else in the loop outlives the window (the sleeps and the wait for room end by then).
    deadline = loop.time() + (window_end - clock()) + write_timeout_seconds
    sent = 0
    try:
        async with asyncio.timeout_at(deadline):
            sent = await _pace(producer, plan, recorder, sleep, started, window_end, ticks_max, tick_events_max)
    except TimeoutError:
        raise StepStalledError(f"a write did not return for {write_timeout_seconds:g} s after the window") from None
    finally:
        opening.cancel()
        closing.cancel()
    if not recorder.window_opened:  # the step ended before its warm-up did
        recorder.begin_window()
    recorder.end_window(clock())
    return sent


async def _pace(producer: Producer, plan: OfferPlan, recorder: StepRecorder,
                sleep: Callable[[float], Awaitable[None]], started: float, window_end: float, ticks_max: int,
                tick_events_max: int) -> int:
    """The ticks of ``offer``; the number of events sent."""
    clock = recorder.clock
    rate = plan.rate
    tick_min = 1 if rate is None else max(1, min(tick_events_max, int(rate * BENCH_PACING_TICK_SECONDS)))
    pool = PayloadPool(plan.event_bytes)
    sent = 0
    sent_bytes = 0
    free_since = started  # when the loop was last free to send (the previous batch handed over)
    for _ in range(ticks_max):
        now = clock()
        if now >= window_end or sent_bytes >= plan.bytes_max or recorder.errors:
            break
        if rate is None:
            count = tick_events_max
        else:
            due = math.floor((now - started) * rate) + 1 - sent
            if due < tick_min:  # sleep until a tick's worth is due (the last of them falls due then)
                ready_at = started + (sent + tick_min - 1) / rate
                if now < ready_at:
                    await sleep(min(ready_at, window_end) - now)
                    continue
                due = tick_min  # the clock is there: a tick's worth is due (whatever the floor's rounding says)
            count = min(due, tick_events_max)
        count = min(count, max(1, (plan.bytes_max - sent_bytes) // plan.event_bytes))
        if not await recorder.wait_for_room(count, window_end):
            break
        now = clock()
        if now >= window_end:
            break
        # The send time (see the module docstring): at a fixed rate, when the first event fell due, or
        # when the loop was free again if that was later; at max, now.
        sent_at = now if rate is None else min(now, max(started + sent / rate, free_since))
        recorder.sent(sent_at, count)  # before the write: a driver may report acknowledgements inside it
        batch = Batch(sent_at=sent_at, payloads=pool.payloads(sent_at, sent, count), count=count,
                      first_sequence=sent)
        await producer.write(batch)
        sent += count
        sent_bytes += count * plan.event_bytes
        await sleep(0)  # let acknowledgements and consumers run between ticks
        free_since = clock()
    return sent
