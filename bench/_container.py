"""Driving one SegmentContainer on a real FileLog, and counting what its write path did.

What is measured.  One container, in this process, on a ``FileLog`` in a fresh directory on the real
disk; one segment; appends of ``record_bytes`` zero bytes.  Appenders start, run for a warm-up (so the
processor's batching statistics and the disk settle), then for ``duration_seconds`` of measurement,
then stop issuing and wait for what is in flight.  An append counts if its acknowledgement arrives
inside the measurement window; its latency is from calling ``SegmentContainer.append`` to getting the
offset back, as the appender sees it.

How the container batched.  The container is not asked (it has no statistics API); it is watched
from outside, through its two injection points:

* the ``DurableDataLog`` it is given is a ``CountingLog`` proxy that forwards every call to the
  FileLog and counts ``append`` calls -- one per DataFrame, i.e. one Tier-1 record;
* the FileLog's ``fdatasync`` is a ``TimedFdatasync`` that counts and times the group commits.

Appends per fdatasync is then the batch size the physical-limit loop must be run at for a fair ratio.

Appenders.  ``await_each``: await every append before the next (one appender = a lone writer; 16 of
them = 16 independent writers).  ``keep_in_flight``: one appender that keeps a window of appends in
flight, each as its own task (``SegmentContainer.append`` is a coroutine, so a task is what it takes
to have it in flight) -- how a client writer with many events outstanding would drive a container
if every event were its own append.  ``keep_blocks_in_flight``: what the server really does for a
client writer -- every ``AppendBlock`` (many framed events) is one append carrying the writer's
event number as a compare-and-set attribute update, several blocks in flight.  The block's bytes
are built once, before the measurement: building them is the client's work, in another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Final

import attrs

from bench._stats import Latency, LatencySamples
from bench._system import CpuSample, CpuUsage, QuietWait
from bench.scenarios import Mode, Scenario
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.durable_data_log import DurableDataLog, LogAddress, LogRecord, OnDone, WriteSettings
from millstream.segmentstore.file_log import FileLog
from millstream.wire.codec import encode_event

__all__ = [
    "ContainerRun",
    "CountingLog",
    "FloorRun",
    "TimedFdatasync",
    "block_of_events",
    "measure_per_append_floor",
    "run_container_scenario",
]

SEGMENT_NAME: Final = "bench"

#: The writer id of the block scenario's writer (the attribute its event numbers are stored under).
WRITER_ID: Final = 0x6D696C6C_73747265_616D2D62_656E6368

#: How long the appenders may take to collect the acknowledgements still in flight when the
#: measurement ends.  Far more than any sane Tier-1 latency; a container that misses it is broken.
_DRAIN_TIMEOUT_SECONDS: Final = 30.0


class TimedFdatasync:
    """Stands in for ``os.fdatasync`` in a FileLog (its injection point): counts the calls (one per
    group commit) and the seconds they took.  Called from the FileLog's single writer thread only; the
    loop thread reads the counters, which is safe for plain ints and floats under the GIL."""

    __slots__ = ("calls", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, fd: int) -> None:
        started = time.perf_counter()
        os.fdatasync(fd)
        self.seconds += time.perf_counter() - started
        self.calls += 1


class CountingLog(DurableDataLog):
    """A DurableDataLog that forwards every call to ``inner`` and counts the records appended (each one
    is a DataFrame) and their bytes."""

    def __init__(self, inner: DurableDataLog) -> None:
        self._inner = inner
        self.records = 0
        self.record_bytes = 0

    @property
    def write_settings(self) -> WriteSettings:
        return self._inner.write_settings

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    async def initialize(self) -> int:
        return await self._inner.initialize()

    def read(self) -> Iterator[LogRecord]:
        return self._inner.read()

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        self.records += 1
        self.record_bytes += len(data)
        return self._inner.append(data, on_done)

    async def truncate(self, upto: LogAddress) -> None:
        await self._inner.truncate(upto)

    async def close(self) -> None:
        await self._inner.close()


@attrs.frozen
class ContainerRun:
    """What one scenario achieved in one measurement window."""

    scenario: str
    record_bytes: int
    appenders: int
    window: int
    events_per_append: int  # 1 but for blocks
    appends: int  # acknowledged inside the window
    events: int  # appends x events_per_append
    seconds: float
    appends_per_second: float
    events_per_second: float
    megabytes_per_second: float  # event payload bytes (framing not counted), 10^6 per MB
    latency: Latency
    frames: int  # DataFrames (Tier-1 records) appended to the log inside the window
    fdatasyncs: int  # group commits inside the window
    appends_per_frame: float | None
    appends_per_fdatasync: float | None
    events_per_fdatasync: float | None
    frames_per_fdatasync: float | None
    log_bytes_per_fdatasync: float | None
    fdatasync_mean_ms: float | None  # as the FileLog's writer thread saw it
    own_cpu_us_per_append: float | None  # this process's CPU (every thread) per acknowledged append
    own_cpu_us_per_event: float | None
    limited_by_bytes: bool  # the appenders hit the bytes bound before the window ended
    cpu: CpuUsage
    quiet: QuietWait


#: How long a measurement window stays open past its duration waiting for its first acknowledgement.
FIRST_ACKNOWLEDGEMENT_WAIT_SECONDS_MAX = 30.0


class _Phase:
    """Shared by the appenders and the timer: whether appends are being measured, whether to stop."""

    __slots__ = ("acknowledged", "exhausted", "first_acknowledged", "issued", "issued_max", "measuring", "samples",
                 "stopped")

    def __init__(self, issued_max: int) -> None:
        self.measuring = False
        self.stopped = False
        self.issued = 0
        self.issued_max = issued_max
        self.acknowledged = 0
        self.samples = LatencySamples()
        self.exhausted = asyncio.Event()  # an appender reached issued_max
        self.first_acknowledged = asyncio.Event()  # an append was acknowledged while measuring

    def may_issue(self) -> bool:
        if self.stopped:
            return False
        if self.issued >= self.issued_max:
            self.exhausted.set()
            return False
        return True

    def record(self, started: float, finished: float) -> None:
        if self.measuring:
            self.acknowledged += 1
            self.samples.add(finished - started)
            if self.acknowledged == 1:
                self.first_acknowledged.set()


@attrs.frozen
class _Counters:
    """Everything the measurement window is the difference of."""

    cpu: CpuSample
    frames: int
    frame_bytes: int
    fdatasyncs: int
    fdatasync_seconds: float

    @classmethod
    def now(cls, log: CountingLog, fdatasync: TimedFdatasync) -> _Counters:
        return cls(CpuSample.now(), log.records, log.record_bytes, fdatasync.calls, fdatasync.seconds)


#: ``SegmentContainer.append`` as the appenders call it (a coroutine function: ``create_task`` needs one).
Append = Callable[[str, bytes], Coroutine[Any, Any, int]]


async def _await_each(append: Append, payload: bytes, phase: _Phase) -> None:
    """Append, await the acknowledgement, repeat."""
    clock = time.perf_counter
    while phase.may_issue():
        phase.issued += 1
        started = clock()
        await append(SEGMENT_NAME, payload)
        phase.record(started, clock())


async def _keep_in_flight(append: Append, payload: bytes, window: int, phase: _Phase) -> None:
    """Keep ``window`` appends in flight: top the window up whenever acknowledgements made room."""
    await _keep_window(partial(append, SEGMENT_NAME, payload), window, phase, "appends")


async def _keep_blocks_in_flight(container: SegmentContainer, block: bytes, events: int, window: int,
                                 phase: _Phase) -> None:
    """Keep ``window`` blocks of ``events`` events in flight, as the server appends a writer's blocks:
    each carries ReplaceIfEquals(writer id, its last event number, the previous block's)."""
    last_event_number = NULL_ATTRIBUTE_VALUE

    def next_block() -> Coroutine[Any, Any, int]:
        nonlocal last_event_number
        number = (0 if last_event_number == NULL_ATTRIBUTE_VALUE else last_event_number) + events
        update = AttributeUpdate(WRITER_ID, AttributeUpdateType.REPLACE_IF_EQUALS, number, last_event_number)
        last_event_number = number
        return container.append(SEGMENT_NAME, block, (update,))

    await _keep_window(next_block, window, phase, "blocks")


async def _keep_window(issue: Callable[[], Coroutine[Any, Any, int]], window: int, phase: _Phase,
                       what: str) -> None:
    """Keep ``window`` calls of ``issue`` (each an append, as its own task) in flight while ``phase``
    lets them be issued, topping the window up whenever acknowledgements made room; then collect the
    ones in flight (bounded).  The first failure ends it and is raised."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    in_flight: set[asyncio.Task[int]] = set()
    failures: list[BaseException] = []
    room = asyncio.Event()

    def on_done(started: float, task: asyncio.Task[int]) -> None:
        in_flight.discard(task)
        if task.cancelled():
            failures.append(asyncio.CancelledError())
        elif (error := task.exception()) is not None:
            failures.append(error)
        else:
            phase.record(started, clock())
        room.set()

    try:
        while not failures and phase.may_issue():
            while len(in_flight) < window and phase.may_issue():
                phase.issued += 1
                task = loop.create_task(issue())
                task.add_done_callback(partial(on_done, clock()))
                in_flight.add(task)
            room.clear()
            await room.wait()
        if in_flight:
            _done, pending = await asyncio.wait(set(in_flight), timeout=_DRAIN_TIMEOUT_SECONDS)
            if pending:
                raise TimeoutError(f"{len(pending)} {what} unacknowledged {_DRAIN_TIMEOUT_SECONDS} s after the end")
    finally:
        for task in in_flight:  # only after a failure or cancellation: the tasks are ours to end
            task.cancel()
    if failures:
        raise failures[0]


def block_of_events(record_bytes: int, events: int) -> bytes:
    """``events`` framed events of ``record_bytes`` bytes each, as a client puts them into a block."""
    return encode_event(bytes(record_bytes)) * events


async def _time_window(phase: _Phase, warmup_seconds: float, duration_seconds: float,
                       log: CountingLog, fdatasync: TimedFdatasync) -> tuple[_Counters, _Counters]:
    """Warm up, open the measurement window, close it after ``duration_seconds`` (or when the
    appenders ran out of their bound), and tell the appenders to stop."""
    try:
        await asyncio.sleep(warmup_seconds)
        start = _Counters.now(log, fdatasync)
        phase.measuring = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(phase.exhausted.wait(), duration_seconds)
        # On a loaded machine a short window may close before the first acknowledgement: a measurement
        # of nothing.  Keep it open (bounded) until there is one.
        if phase.acknowledged == 0 and not phase.exhausted.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(phase.first_acknowledged.wait(), FIRST_ACKNOWLEDGEMENT_WAIT_SECONDS_MAX)
        phase.measuring = False
        end = _Counters.now(log, fdatasync)
    finally:
        phase.stopped = True
    return start, end


async def _drive(scenario: Scenario, directory: Path, warmup_seconds: float, duration_seconds: float,
                 bytes_max: int) -> tuple[_Phase, _Counters, _Counters]:
    fdatasync = TimedFdatasync()
    tier_one: DurableDataLog = FileLog(directory, fdatasync=fdatasync)
    if os.environ.get("MILLSTREAM_BENCH_METRICS"):
        # As a node serving metrics measures its log (millstream.metrics): the cost of metrics on this path.
        from millstream.metrics import NodeMetrics
        tier_one = NodeMetrics(lambda: None).meter_log(0, tier_one)
    log = CountingLog(tier_one)
    if scenario.mode is Mode.BLOCK:
        payload = block_of_events(scenario.record_bytes, scenario.events_per_append)
    else:
        payload = bytes(scenario.record_bytes)
    phase = _Phase(issued_max=max(1, bytes_max // len(payload)))
    async with SegmentContainer(0, log) as container:
        await container.create_segment(SEGMENT_NAME)
        async with asyncio.TaskGroup() as group:
            window = group.create_task(_time_window(phase, warmup_seconds, duration_seconds, log, fdatasync))
            for _ in range(scenario.appenders):
                if scenario.mode is Mode.BLOCK:
                    group.create_task(_keep_blocks_in_flight(
                        container, payload, scenario.events_per_append, scenario.window, phase))
                elif scenario.window == 1:
                    group.create_task(_await_each(container.append, payload, phase))
                else:
                    group.create_task(_keep_in_flight(container.append, payload, scenario.window, phase))
    start, end = window.result()
    return phase, start, end


def run_container_scenario(scenario: Scenario, directory: Path, *, warmup_seconds: float, duration_seconds: float,
                           bytes_max: int, quiet: QuietWait) -> ContainerRun:
    """Run ``scenario`` against a new container whose FileLog lives in ``directory`` (on its own event loop)."""
    phase, start, end = asyncio.run(_drive(scenario, directory, warmup_seconds, duration_seconds, bytes_max))
    cpu = CpuUsage.between(start.cpu, end.cpu)
    appends = phase.acknowledged
    events = appends * scenario.events_per_append
    frames = end.frames - start.frames
    fdatasyncs = end.fdatasyncs - start.fdatasyncs
    return ContainerRun(
        scenario=scenario.name, record_bytes=scenario.record_bytes, appenders=scenario.appenders,
        window=scenario.window, events_per_append=scenario.events_per_append, appends=appends, events=events,
        seconds=cpu.wall_seconds, appends_per_second=appends / cpu.wall_seconds,
        events_per_second=events / cpu.wall_seconds,
        megabytes_per_second=events * scenario.record_bytes / cpu.wall_seconds / 1e6,
        latency=phase.samples.summary(), frames=frames, fdatasyncs=fdatasyncs,
        appends_per_frame=_ratio(appends, frames), appends_per_fdatasync=_ratio(appends, fdatasyncs),
        events_per_fdatasync=_ratio(events, fdatasyncs), frames_per_fdatasync=_ratio(frames, fdatasyncs),
        log_bytes_per_fdatasync=_ratio(end.frame_bytes - start.frame_bytes, fdatasyncs),
        fdatasync_mean_ms=_ratio(1e3 * (end.fdatasync_seconds - start.fdatasync_seconds), fdatasyncs),
        own_cpu_us_per_append=_ratio(1e6 * cpu.own_cpu_seconds, appends),
        own_cpu_us_per_event=_ratio(1e6 * cpu.own_cpu_seconds, events),
        limited_by_bytes=phase.exhausted.is_set(), cpu=cpu, quiet=quiet,
    )


# --- the per-append floor -------------------------------------------------------------------------------

#: Appends one floor measurement issues at most (it is bounded by its duration long before).
_FLOOR_APPENDS_MAX: Final = 50_000_000


@attrs.frozen
class FloorRun:
    """The pipelined driver against a store that costs nothing: the most appends/s that *any* store
    with one awaitable operation per append can be driven at, in CPython, on this machine now."""

    window: int
    appends: int
    seconds: float
    appends_per_second: float
    own_cpu_us_per_append: float | None
    cpu: CpuUsage
    quiet: QuietWait


class _NullStore:
    """``append`` is one future per call, all of a loop turn's completed together on the next turn --
    less than any store can do (no validation, no framing, no write, no sync)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._pending: list[asyncio.Future[int]] = []

    async def append(self, name: str, data: bytes) -> int:
        future: asyncio.Future[int] = self._loop.create_future()
        if not self._pending:
            self._loop.call_soon(self._complete)
        self._pending.append(future)
        return await future

    def _complete(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            if not future.done():
                future.set_result(0)


async def _drive_floor(window: int, warmup_seconds: float, duration_seconds: float) -> tuple[_Phase, CpuSample,
                                                                                                CpuSample]:
    phase = _Phase(issued_max=_FLOOR_APPENDS_MAX)
    store = _NullStore()

    async def time_window() -> tuple[CpuSample, CpuSample]:
        try:
            await asyncio.sleep(warmup_seconds)
            start = CpuSample.now()
            phase.measuring = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(phase.exhausted.wait(), duration_seconds)
            phase.measuring = False
            return start, CpuSample.now()
        finally:
            phase.stopped = True

    async with asyncio.TaskGroup() as group:
        timer = group.create_task(time_window())
        group.create_task(_keep_in_flight(store.append, b"", window, phase))
    start, end = timer.result()
    return phase, start, end


def measure_per_append_floor(window: int, *, warmup_seconds: float, duration_seconds: float,
                             quiet: QuietWait) -> FloorRun:
    """Drive a store that costs nothing as the pipelined scenario drives the container (one task per
    append, ``window`` in flight), on its own event loop."""
    phase, start, end = asyncio.run(_drive_floor(window, warmup_seconds, duration_seconds))
    cpu = CpuUsage.between(start, end)
    return FloorRun(window=window, appends=phase.acknowledged, seconds=cpu.wall_seconds,
                    appends_per_second=phase.acknowledged / cpu.wall_seconds,
                    own_cpu_us_per_append=_ratio(1e6 * cpu.own_cpu_seconds, phase.acknowledged), cpu=cpu,
                    quiet=quiet)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None
