"""``millstream demo``: the main job -- a store, a sensor workload, the reference pipeline, a driver
killed mid-run and restarted from its checkpoint, and a verification of every output row.

Theory of operation.  Everything runs on one asyncio loop in this process except Spark:

1. *The store*: a standalone ``Node`` (segment store and controller) on loopback, in a temporary
   directory or the one given.  Its controller's auto-scale cooldown is shortened
   (``ControllerConfig.auto_scale_cooldown_seconds``, the public knob) so the input stream may split
   within minutes; the moving averages still need their two-minute window, so the first split comes
   about two minutes after the stream is created.
2. *The workload* (``SensorWorkload``): sensors write readings keyed by sensor id into
   ``iot/sensors``, an auto-scaling stream (by event rate, with a target far below the rate written,
   so it splits); the writer follows the split.  Writing goes on for at least ``min_write_seconds``,
   until ``after_split_seconds`` after the split and until the last pipeline run has processed data
   (at most ``max_write_seconds``), then the watermark markers follow.
3. *The pipeline* (``millstream pipeline run``) runs as a separate process in a session of its own,
   so its session is the driver's Python, its JVM and its Python workers.  Each run but the
   last is killed with SIGKILL to that whole session -- a driver machine dying -- at a seeded point
   (after a few micro-batches, at a seeded fraction of the trigger interval), and the next run starts
   from the same checkpoint: Spark re-runs the batch its offset log holds without a commit-log entry,
   and the sink's fence makes a batch the store already committed a no-op.  The last run is stopped
   gracefully once its progress shows the watermark past every window (so every window was emitted).
   The runs read without admission control (``maxRowsPerBatch``): a batch capped by rows advances
   each segment by a share of rows, not of event time, so after a backlog (a restart) segments that
   take different rates drift apart in event time, and a drift beyond the watermark delay drops the
   slower segment's readings as late -- Spark's semantics, not a loss, but not the answer computed
   here.  For the same reason the input stream starts with one segment: its split seals every
   segment at once, so no successor starts behind a segment that was read to the tail.
4. *The verification*: both streams are read back with the plain client (every segment between the
   head and the tail, in order) and compared with ``expected_output`` of the regenerated events: input
   events written vs stored, expected rows (computed in plain Python), output rows, duplicates,
   missing, unexpected and wrong rows -- PASS only if each expected row is there exactly once.

``PipelineProcess``, ``read_stream`` and ``checkpoint_batches`` are reused by the crash campaign
(``tests/faults/test_pipeline_kill.py``).  Every wait is bounded (the constants below); a run that
exceeds one fails the demo with ``DemoError`` naming what it waited for, after killing the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import attrs

from millstream.client import AsyncClient, ScalingPolicy, StreamConfig, split_stream_name
from millstream.clock import Clock, SystemClock
from millstream.errors import InvalidArgumentError, MillstreamError
from millstream.spark.pipeline import PipelineConfig, kill_session
from millstream.spark.workload import SensorWorkload, Verification, splitmix64, verify

__all__ = [
    "DemoConfig",
    "DemoError",
    "DemoResult",
    "PipelineProcess",
    "checkpoint_batches",
    "pipeline_arguments",
    "read_stream",
    "run_demo",
]

#: A pipeline run must print "started" within this long: a JVM starts in 5-10 s on an idle machine,
#: and several times that on a busy two-core one.
PIPELINE_START_TIMEOUT_SECONDS: Final = 300.0
#: A run must report its next micro-batches within this long (the first batch warms up Spark's
#: workers and RocksDB: 4-13 s measured, more under load).
PIPELINE_PROGRESS_TIMEOUT_SECONDS: Final = 300.0
#: After SIGTERM a run stops its query (``STOP_TIMEOUT_MS`` in the pipeline) and exits; past this it
#: is killed.
PIPELINE_STOP_TIMEOUT_SECONDS: Final = 90.0
#: A process killed with SIGKILL is gone at once; waiting longer means it was not ours to kill.
PIPELINE_KILL_WAIT_SECONDS: Final = 30.0
#: After the last event, the pipeline must have emitted every window within this long.
DRAIN_TIMEOUT_SECONDS: Final = 600.0
#: The writer sends a slice of the rate this often (20 slices per second: smooth enough for the
#: auto-scaler's 5-second samples, coarse enough to cost nothing).
WRITE_TICK_SECONDS: Final = 0.05
#: How often the demo asks the controller whether the input stream has split.
SCALE_POLL_SECONDS: Final = 2.0
#: The controller's auto-scale cooldown for the demo's node (the default, 10 minutes, is longer
#: than the demo): a new segment's averages are trusted after this long.
DEMO_AUTO_SCALE_COOLDOWN_SECONDS: Final = 10.0
#: ... and its mute after an auto-scale: longer than any demo, so the stream splits exactly once.  A
#: second split would seal only some segments; after a restart's backlog the source would read those
#: to their end in one batch and their successors from the next, behind the segments read to the
#: tail, and a lag beyond the watermark delay would make readings late (see step 3 above).
DEMO_AUTO_SCALE_MUTE_SECONDS: Final = 3600.0
#: The longest line a pipeline run may print on stdout (its progress lines are a few hundred bytes).
PIPELINE_LINE_BYTES_MAX: Final = 1 << 20


class DemoError(MillstreamError):
    """The demo could not run to its verification (a pipeline run failed to start, stopped making
    progress, or exited on its own).  Raised after every process the demo started has stopped."""


@attrs.frozen(kw_only=True)
class DemoConfig:
    """The demo's knobs; the defaults take a few minutes.  ``kills`` runs are killed before the last
    one; ``seed`` decides the workload and the kill points."""

    data_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    seed: int = 7
    sensors: int = 16
    events_per_second: int = 200
    target_events_per_second: float = 10.0
    initial_segments: int = 1
    output_segments: int = 2
    min_write_seconds: float = 60.0
    after_split_seconds: float = 20.0
    max_write_seconds: float = 360.0
    kills: int = 1
    trigger_interval_seconds: float = 1.0
    keep_data: bool = False
    input_stream: str = "iot/sensors"
    output_stream: str = "iot/alerts"
    spark_master: str = "local[2]"

    def __attrs_post_init__(self) -> None:
        if self.kills < 0 or self.kills > 100:
            raise InvalidArgumentError(f"kills must lie in [0, 100], not {self.kills}")
        if not 0 < self.min_write_seconds <= self.max_write_seconds:
            raise InvalidArgumentError("min_write_seconds must be positive and at most max_write_seconds")
        if self.target_events_per_second * self.initial_segments >= self.events_per_second:
            raise InvalidArgumentError(
                f"the scaling target ({self.target_events_per_second} events/s per segment, "
                f"{self.initial_segments} segments) must be below the rate written ({self.events_per_second}/s), "
                "or the stream never splits")
        self.workload()  # validates the workload's part
        split_stream_name(self.input_stream)
        split_stream_name(self.output_stream)

    def workload(self) -> SensorWorkload:
        return SensorWorkload(seed=self.seed, sensors=self.sensors, events_per_second=self.events_per_second)


# --- reading streams and checkpoints ---------------------------------------------------------------


async def read_stream(client: AsyncClient, stream: str) -> list[bytes]:
    """Every event of ``stream`` from its head to its tail now, segment by segment in epoch order
    (what ``segments_between`` lists), with the plain client -- no Spark involved."""
    manager = client.stream_manager()
    tail = await manager.tail_cut(stream)
    slices = await manager.segments_between(stream, None, tail)
    events: list[bytes] = []
    for piece in slices:
        reader = client.segment_reader(piece.segment.name, offset=piece.start_offset)
        try:
            while piece.end_offset is None or reader.offset < piece.end_offset:
                batch = await reader.read_events(wait_seconds=0.0)
                if not batch:
                    break
                for event in batch:
                    if piece.end_offset is not None and event.offset >= piece.end_offset:
                        break
                    events.append(event.value)
        finally:
            await reader.close()
    return events


def checkpoint_batches(checkpoint: Path) -> tuple[int | None, int | None]:
    """The newest batch id in Spark's offset log and in its commit log (None: none yet).  An offset
    entry without its commit entry is the batch Spark re-runs on the next start."""

    def newest(folder: Path) -> int | None:
        try:
            names = [entry.name for entry in folder.iterdir()]
        except FileNotFoundError:
            return None
        ids = [int(name) for name in names if name.isdigit()]
        return max(ids) if ids else None

    return newest(checkpoint / "offsets"), newest(checkpoint / "commits")


def checkpoint_query_id(checkpoint: Path) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (the sink's fence is keyed by it)."""
    try:
        return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


# --- one run of the pipeline -----------------------------------------------------------------------


def pipeline_arguments(config: PipelineConfig) -> list[str]:
    """The ``millstream pipeline run`` arguments that describe ``config``."""
    arguments = ["--controller", config.controller, "--input", config.input_stream, "--output",
                 config.output_stream, "--checkpoint", str(config.checkpoint), "--window-seconds",
                 str(config.window_seconds), "--watermark-delay-seconds", str(config.watermark_delay_seconds),
                 "--alert-threshold", str(config.alert_threshold_c), "--alert-readings",
                 str(config.alert_readings_min), "--trigger", config.trigger, "--interval",
                 repr(config.trigger_interval_seconds), "--state-memory-mb", str(config.state_memory_mb),
                 "--shuffle-partitions", str(config.shuffle_partitions), "--spark-master", config.master]
    if config.max_rows_per_batch is not None:
        arguments += ["--max-rows-per-batch", str(config.max_rows_per_batch)]
    return arguments


def pipeline_command(config: PipelineConfig) -> list[str]:
    """The command line of a run: this interpreter, the ``millstream`` CLI, ``pipeline run ...``."""
    return [sys.executable, "-c", "from millstream.cli import main; main()", "pipeline", "run",
            *pipeline_arguments(config)]


class PipelineProcess:
    """One run of ``millstream pipeline run`` in a session of its own.

    ``start`` launches it (stderr, Spark's logs, goes to ``log_path``); a tracked task reads its
    stdout: the ``started`` line, then one ``progress`` line per micro-batch (``progress``).
    ``kill`` sends SIGKILL to the whole session; ``stop`` sends SIGTERM (a graceful ``query.stop()``)
    and kills after ``PIPELINE_STOP_TIMEOUT_SECONDS``.  ``close`` makes sure the group is gone."""

    def __init__(self, config: PipelineConfig, log_path: Path, *, environment: dict[str, str] | None = None,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self._environment = environment or {}
        self._clock = clock or SystemClock()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.started: dict[str, Any] | None = None
        self.progress: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                       **self._environment}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = await asyncio.to_thread(self.log_path.open, "ab")
        try:
            self._process = await asyncio.create_subprocess_exec(
                *pipeline_command(self.config), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=log, env=environment, start_new_session=True, limit=PIPELINE_LINE_BYTES_MAX)
        finally:
            log.close()  # the child has its own descriptor
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"pipeline-{self._process.pid}")

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            while line := await self._process.stdout.readline():
                word, _, rest = line.decode("utf-8", "replace").strip().partition(" ")
                try:
                    value = json.loads(rest) if rest.startswith("{") else None
                except ValueError:
                    value = None
                if value is None:
                    continue  # not one of ours (a library printing to stdout)
                if word == "started":
                    self.started = value
                elif word == "progress":
                    self.progress.append(value)
                elif word == "failed":
                    self.failure = str(value.get("error"))
                self._changed.set()
            self.returncode = await self._process.wait()
        finally:
            self._changed.set()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None and self.returncode is None

    async def wait_until(self, predicate: Callable[[PipelineProcess], bool], what: str, timeout_seconds: float) -> None:
        """Wait until ``predicate(self)`` holds; ``DemoError`` if the run exits first or the time runs out."""
        deadline = self._clock.monotonic() + timeout_seconds
        while not predicate(self):
            if self.returncode is not None:
                raise DemoError(f"pipeline run (pid {self.pid}) exited with status {self.returncode} while the demo "
                                f"waited for {what}" + (f": {self.failure}" if self.failure else "")
                                + f" (its log: {self.log_path})")
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise DemoError(f"pipeline run (pid {self.pid}) did not reach {what} within {timeout_seconds:.0f} s "
                                f"(its log: {self.log_path})")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))

    def data_batches(self) -> int:
        """Micro-batches of this run that read input."""
        return sum(1 for record in self.progress if (record.get("input_rows") or 0) > 0)

    def kill(self) -> None:
        """SIGKILL every process of the run's session: driver, JVM and Python workers (``kill_session``)."""
        if self._process is not None and self._process.returncode is None:
            kill_session(self._process.pid)

    async def wait_exit(self, timeout_seconds: float) -> int:
        assert self._process is not None and self._reader is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout_seconds)
        except TimeoutError:
            raise DemoError(f"pipeline run (pid {self.pid}) did not exit within {timeout_seconds:.0f} s") from None
        assert self.returncode is not None
        return self.returncode

    async def stop(self) -> int:
        """SIGTERM (the run stops its query and exits), then SIGKILL if it takes too long."""
        if self._process is None:
            return 0
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGTERM)
        try:
            return await self.wait_exit(PIPELINE_STOP_TIMEOUT_SECONDS)
        except DemoError:
            self.kill()
            return await self.wait_exit(PIPELINE_KILL_WAIT_SECONDS)

    async def close(self) -> None:
        """Kill the group if it still runs (and any worker it left), and finish the reader task."""
        if self._process is None:
            return
        self.kill()
        kill_session(self._process.pid)  # workers outlive a driver that exited on its own
        if self._reader is not None:
            with contextlib.suppress(TimeoutError, DemoError):
                await self.wait_exit(PIPELINE_KILL_WAIT_SECONDS)


def watermark_ms(record: dict[str, Any]) -> int | None:
    """A progress record's watermark in ms since the epoch (Spark prints it as ISO-8601 UTC)."""
    text = record.get("watermark")
    if not isinstance(text, str):
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def final_watermark_ms(workload: SensorWorkload, readings: int) -> int:
    """The watermark once the markers after ``readings`` readings are read: past every window's end."""
    marker = json.loads(workload.end_markers(readings)[0][1])
    return int(marker["ts_ms"]) - 1000 * workload.watermark_delay_seconds


# --- the workload writer ---------------------------------------------------------------------------


@attrs.define
class WriteReport:
    """What the writer did, and the two events that pace it: ``restarted`` (set by the demo once the
    last pipeline run has processed data: writing goes on until then, so every run has live input)
    and ``done`` (set by the writer after the markers)."""

    readings: int = 0
    markers: int = 0
    split_after_seconds: float | None = None
    segments_before: int = 0
    segments_after: int = 0
    restarted: asyncio.Event = attrs.field(factory=asyncio.Event)
    done: asyncio.Event = attrs.field(factory=asyncio.Event)


async def write_workload(client: AsyncClient, config: DemoConfig, report: WriteReport, clock: Clock,
                         out: Callable[[str], None], started: float) -> None:
    """Write readings at ``events_per_second`` until the stream has split (and a while after) and the
    last pipeline run is under way -- but never beyond ``max_write_seconds`` -- then the markers;
    ``report`` says how many and when the split came."""
    workload = config.workload()
    manager = client.stream_manager()
    report.segments_before = len((await manager.describe_stream(config.input_stream)).segments)
    writer = client.event_writer(config.input_stream)
    begin = clock.monotonic()
    next_poll = begin + SCALE_POLL_SECONDS
    try:
        while True:
            now = clock.monotonic()
            elapsed = now - begin
            if elapsed >= config.max_write_seconds:
                break
            if report.split_after_seconds is not None and report.restarted.is_set() and elapsed >= max(
                    config.min_write_seconds, report.split_after_seconds + config.after_split_seconds):
                break
            due = int(elapsed * config.events_per_second)
            for routing_key, payload in workload.events(report.readings, due - report.readings):
                await writer.write_event(payload, routing_key=routing_key)
            report.readings = max(report.readings, due)
            if now >= next_poll and report.split_after_seconds is None:
                next_poll = now + SCALE_POLL_SECONDS
                description = await manager.describe_stream(config.input_stream)
                if description.epoch > 0:
                    report.split_after_seconds = elapsed
                    report.segments_after = len(description.segments)
                    out(f"[{now - started:5.0f}s] {config.input_stream} scaled by the controller's auto-scaler: epoch "
                        f"{description.epoch}, {report.segments_before} -> {len(description.segments)} segments "
                        "(the writer follows; the source reads successors after their predecessors)")
            await clock.sleep(WRITE_TICK_SECONDS)
        await writer.flush()  # every reading is stored before the first marker
        for routing_key, payload in workload.end_markers(report.readings):
            await writer.write_event(payload, routing_key=routing_key)
        report.markers = workload.sensors
        await writer.flush()
    finally:
        await writer.close()
        report.done.set()


# --- the demo --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DemoResult:
    """What ``millstream demo`` found: the verification table's counts and how the run went (kills,
    the split, the sink's fence and last commit, its duration)."""

    verification: Verification
    readings: int
    kills: tuple[str, ...]
    split_after_seconds: float | None
    segments: tuple[int, int]
    fence: int | None
    last_commit: int | None
    elapsed_seconds: float

    kills_wanted: int

    @property
    def passed(self) -> bool:
        """Every row exactly once, the input stream split during the run, and the driver was killed
        as often as asked."""
        return (self.verification.passed and self.split_after_seconds is not None
                and len(self.kills) == self.kills_wanted)


def _enough_batches(run: PipelineProcess, *, batches: int, done: asyncio.Event) -> bool:
    return run.data_batches() >= batches or done.is_set()


def _draw(seed: int, *parts: int) -> int:
    value = splitmix64(seed)
    for part in parts:
        value = splitmix64(value ^ part)
    return value


async def run_demo(config: DemoConfig, *, out: Callable[[str], None] = print, clock: Clock | None = None) -> DemoResult:
    """Run the main job (module docstring) and return its verification."""
    from millstream.controller import ControllerConfig
    from millstream.spark import fence_key
    from millstream.standalone import Node

    clock = clock or SystemClock()
    started = clock.monotonic()

    def say(line: str) -> None:
        out(f"[{clock.monotonic() - started:5.0f}s] {line}")

    if config.data_dir is not None:
        if config.data_dir.exists() and any(config.data_dir.iterdir()):
            raise InvalidArgumentError(f"{config.data_dir} is not empty: the demo needs a fresh directory")
        workdir = config.data_dir
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="millstream-demo-"))
    workload = config.workload()
    node = Node(workdir / "store", port=0,
                controller_config=ControllerConfig(auto_scale_cooldown_seconds=DEMO_AUTO_SCALE_COOLDOWN_SECONDS,
                                                   auto_scale_mute_seconds=DEMO_AUTO_SCALE_MUTE_SECONDS))
    await node.start()
    runs: list[PipelineProcess] = []
    try:
        say(f"store listening on {node.uri} (data in {workdir})")
        async with AsyncClient(node.uri) as client:
            manager = client.stream_manager()
            for stream in (config.input_stream, config.output_stream):
                await manager.create_scope(split_stream_name(stream)[0], exist_ok=True)
            await manager.create_stream(config.input_stream, StreamConfig(scaling=ScalingPolicy.by_event_rate(
                config.target_events_per_second, 2, config.initial_segments)))
            await manager.create_stream(config.output_stream,
                                        StreamConfig(scaling=ScalingPolicy.fixed(config.output_segments)))
            say(f"{config.input_stream}: auto-scaling by event rate (target {config.target_events_per_second:g} "
                f"events/s per segment, {config.initial_segments} segments to start); {config.output_stream}: "
                f"{config.output_segments} segments")
            pipeline = PipelineConfig(
                controller=node.uri, input_stream=config.input_stream, output_stream=config.output_stream,
                checkpoint=workdir / "checkpoint", window_seconds=workload.window_seconds,
                watermark_delay_seconds=workload.watermark_delay_seconds,
                alert_threshold_c=workload.alert_threshold_c, alert_readings_min=workload.alert_readings_min,
                trigger_interval_seconds=config.trigger_interval_seconds, master=config.spark_master)
            report = WriteReport()
            say(f"writing {config.sensors} sensors at {config.events_per_second} events/s (seed {config.seed}), "
                "keyed by sensor id")
            kills: list[str] = []
            async with asyncio.TaskGroup() as group:
                group.create_task(write_workload(client, config, report, clock, out, started))
                for number in range(1, config.kills + 2):
                    run = PipelineProcess(pipeline, workdir / f"pipeline-run-{number}.log", clock=clock)
                    runs.append(run)
                    await run.start()
                    await run.wait_until(lambda r: r.started is not None, "its start", PIPELINE_START_TIMEOUT_SECONDS)
                    assert run.started is not None
                    say(f"pipeline run {number} started (pid {run.pid}, query {run.started['query_id'][:8]}...)"
                        + ("" if number == 1 else " from the checkpoint"))
                    if number == config.kills + 1:
                        await run.wait_until(lambda r: r.data_batches() >= 1 or report.done.is_set(),
                                             "a micro-batch with data", PIPELINE_PROGRESS_TIMEOUT_SECONDS)
                        report.restarted.set()
                        break
                    batches = 2 + _draw(config.seed, 1, number) % 4
                    await run.wait_until(functools.partial(_enough_batches, batches=batches, done=report.done),
                                         f"{batches} micro-batches with data", PIPELINE_PROGRESS_TIMEOUT_SECONDS)
                    await clock.sleep(config.trigger_interval_seconds * (_draw(config.seed, 2, number) % 1000) / 1000)
                    offsets, commits = checkpoint_batches(pipeline.checkpoint)
                    run.kill()
                    await run.wait_exit(PIPELINE_KILL_WAIT_SECONDS)
                    in_flight = (f"batch {offsets} logged in offsets/ but not committed: Spark re-runs it"
                                 if offsets is not None and offsets != commits else
                                 f"between batches (last committed: {commits})")
                    kills.append(f"run {number}: SIGKILL after {run.data_batches()} micro-batches with data, "
                                 f"{in_flight}")
                    say(f"SIGKILL to every process of the Spark driver's session (run {number}: driver, JVM, workers): "
                        f"{in_flight}")
                final = runs[-1]
                await report.done.wait()
                target = final_watermark_ms(workload, report.readings)
                say(f"wrote {report.readings:,} readings and {report.markers} watermark markers; waiting for the "
                    "pipeline to emit every window")
                await final.wait_until(lambda r: any((watermark_ms(p) or 0) >= target for p in r.progress),
                                       "a watermark past every window", DRAIN_TIMEOUT_SECONDS)
                status = await final.stop()
                say(f"pipeline run {len(runs)} stopped (status {status}) after {len(final.progress)} micro-batches")
            offsets, commits = checkpoint_batches(pipeline.checkpoint)
            query_id = checkpoint_query_id(pipeline.checkpoint)
            fence = None if query_id is None else await client.get_fence(config.output_stream, fence_key(query_id))
            say("reading both streams back with the plain client")
            input_events = await read_stream(client, config.input_stream)
            output_events = await read_stream(client, config.output_stream)
        written = [workload.payload(index) for index in range(report.readings)]
        written += [payload for _, payload in workload.end_markers(report.readings)]
        verification = verify(workload, written, input_events, output_events)
        return DemoResult(verification=verification, readings=report.readings, kills=tuple(kills),
                          split_after_seconds=report.split_after_seconds,
                          segments=(report.segments_before, report.segments_after), fence=fence, last_commit=commits,
                          elapsed_seconds=clock.monotonic() - started, kills_wanted=config.kills)
    finally:
        for run in runs:
            await run.close()
        await node.stop()
        if config.data_dir is None and not config.keep_data:
            shutil.rmtree(workdir, ignore_errors=True)


def render(result: DemoResult, config: DemoConfig) -> str:
    """The demo's closing report: the verification table, then PASS or FAIL."""
    split = (f"yes, after {result.split_after_seconds:.0f} s ({result.segments[0]} -> {result.segments[1]} segments)"
             if result.split_after_seconds is not None else f"NO (not within {config.max_write_seconds:.0f} s)")
    extra = [("input stream split during the run", "", split),
             ("Spark driver killed (SIGKILL)", f"{len(result.kills)}",
              "times, restarted from its checkpoint each time"),
             ("store fence / Spark's last commit", f"{result.fence}", f"/ {result.last_commit} (batch ids)")]
    lines = ["", "millstream demo -- verification", ""]
    lines.extend(f"  {kill}" for kill in result.kills)
    lines.append("")
    lines.append(result.verification.table(extra))
    lines.append("")
    if result.passed:
        lines.append(f"PASS: every expected row exactly once, across {len(result.kills)} driver kill(s) and a "
                     f"split of the input stream ({result.elapsed_seconds:.0f} s)")
    else:
        reasons = []
        if not result.verification.passed:
            reasons.append("the output is not the expected rows exactly once")
        if result.split_after_seconds is None:
            reasons.append("the input stream did not split")
        if len(result.kills) != result.kills_wanted:
            reasons.append(f"{len(result.kills)} of {result.kills_wanted} driver kills happened")
        lines.append("FAIL: " + "; ".join(reasons))
    return "\n".join(lines)


def main(config: DemoConfig, out: Callable[[str], None] = print) -> int:
    """Run the demo, print the report, return the exit status (0 PASS, 1 FAIL)."""
    result = asyncio.run(run_demo(config, out=out))
    out(render(result, config))
    return 0 if result.passed else 1
