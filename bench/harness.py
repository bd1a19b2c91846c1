"""The peers harness: every workload, against every system, at every offered rate, in one run.

What one run does (``run_harness``):

1. Describes the machine and measures the disk's physical limit (``disk_limit``: one fdatasync, the raw
   group-commit loop at 1 MiB writes, fio if installed) -- in the same run, so every ratio against it
   is taken minutes apart at most.
2. For each workload, for each system it names: if the driver is not available here (its server or
   client is not installed), records why and moves on.  Otherwise starts the system's server as a
   separate process in a fresh directory, and runs the sweep: one *step* per offered rate, "max"
   first (relative rates such as "50%" are fractions of *this system's* max), each step preceded by
   a wait for a quiet machine.  The server is stopped and its data removed when the sweep ends.
   With ``repeat`` > 1 the sweeps of a workload run that many times, the systems taking turns in each
   repeat (millstream, then each peer, then millstream again...), so a noisy minute of the shared
   machine lands on one repeat of every system rather than on every repeat of one.
3. A step (``_run_step``): a fresh event loop, a session, the consumers positioned at the tail, the
   pacing loop (``_load.offer``) for warm-up + window, a bounded drain of acknowledgements and
   deliveries.  While the window is open, the CPU used by the writer (this process), the server and
   everybody else is recorded, so a reader can see how noisy the machine was.
4. Judges the workloads' targets (``Targets``) on ratios of figures from this run only: each ratio is
   taken within one repeat (millstream's max beside the peers' maxima of the same repeat; its MB/s
   beside the raw group-commit loop probed again right before that repeat), and the target is judged
   on the median over the repeats (every repeat's figure is reported with it).

Nothing here asserts a speed: a step that fails (a peer crashed, a drain timed out) is recorded with
its error and the run goes on; the report shows it.  Every wait is bounded (see ``bench.limits``,
"Benchmarks"), so a run ends by itself.  The data of every system lives under one temporary directory,
removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from io import StringIO
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench._disk import GroupCommitRun
from bench._keys import KeySpace
from bench._load import OfferPlan, StepRecorder, offer
from bench._processes import ServerProcess, free_port
from bench._stats import Latency, LatencySamples
from bench._suite import Steps
from bench._system import (
    CpuSample,
    CpuUsage,
    MachineDescription,
    QuietWait,
    describe_machine,
    wait_until_quiet,
)
from bench.disk_limit import DiskLimit, measure_disk_limit, measure_raw_loop
from bench.drivers import Driver
from bench.latency_loops import LatencyLoopsConfig, LatencyLoopsReport, run_latency_loops
from bench.limits import BENCH_DRAIN_TIMEOUT_SECONDS, BENCH_DRIVER_CALL_TIMEOUT_SECONDS, BENCH_STEP_BYTES_MAX
from bench.user_loops import UserLoopsConfig, UserLoopsReport, run_user_loops
from bench.workload import Rate, Workload

__all__ = [
    "HarnessConfig",
    "HarnessReport",
    "RawLoopProbe",
    "RoundTrip",
    "StepResult",
    "SystemRun",
    "TargetResult",
    "consumer_partitions",
    "judge_targets",
    "measure_round_trip",
    "measure_wakeup_lateness",
    "run_harness",
    "write_json",
]

#: A step whose achieved rate is below this share of the offered rate "fell behind" (shown in the table).
FELL_BEHIND_RATIO: Final = 0.95

#: Functions a profile summary lists.
PROFILE_LINES: Final = 25

#: Called before each step with (steps done, steps in all, what comes next), and once at the end.
Progress = Callable[[int, int, str], None]


@attrs.frozen(kw_only=True)
class HarnessConfig:
    suite: str
    workloads: tuple[Workload, ...]
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 10.0
    quiet_probe_seconds: float = 1.0
    disk_probe_seconds: float = 2.0
    use_fio: bool = True
    step_bytes_max: int = BENCH_STEP_BYTES_MAX
    drain_timeout_seconds: float = BENCH_DRAIN_TIMEOUT_SECONDS
    #: Profile millstream (writer and server) during the "max" step of each workload (first repeat).
    profile: bool = False
    #: Sweeps of every system per workload (see the module docstring); the targets take the median.
    repeat: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    #: The users' loops beside the raw loop (``bench.user_loops``; the quick suite runs them), or None.
    user_loops: UserLoopsConfig | None = None
    #: The per-event loop at half of max and a lone writer beside one fdatasync (``bench.latency_loops``;
    #: the quick suite runs them), or None.
    latency_loops: LatencyLoopsConfig | None = None


@attrs.frozen
class CpuWindow:
    """CPU during one measured window: seconds per party, and others' share of the whole machine; and
    what the server wrote to its disk meanwhile (where the bytes went: a store that keeps two copies
    writes each event's bytes twice)."""

    wall_seconds: float
    writer_cpu_seconds: float  # this process: the writer, its client library and the consumers
    server_cpu_seconds: float | None
    others_cpu_seconds: float
    others_percent: float
    idle_percent: float
    server_disk_write_bytes: int | None = None  # None: the server's counters could not be read
    steal_percent: float = 0.0  # of ``others_percent``: the hypervisor's (other virtual machines)


@attrs.frozen
class StepResult:
    rate_label: str
    offered_events_per_second: float | None  # None: "max" (unpaced)
    achieved_events_per_second: float | None
    achieved_megabytes_per_second: float | None
    sent: int  # events sent inside the window
    acknowledged: int  # acknowledgements that arrived inside the window
    delivered: int  # events the tail readers read inside the window
    write_latency: Latency
    end_to_end_latency: Latency | None  # None: the workload has no consumers
    cpu: CpuWindow | None
    quiet: QuietWait
    error: str | None = None
    #: The whole step, warm-up and drain included: after a clean drain all three are equal.
    sent_total: int = 0
    acknowledged_total: int = 0
    delivered_total: int = 0

    @property
    def fell_behind(self) -> bool:
        if self.offered_events_per_second is None or self.achieved_events_per_second is None:
            return False
        return self.achieved_events_per_second < FELL_BEHIND_RATIO * self.offered_events_per_second

    @property
    def writer_cpu_us_per_event(self) -> float | None:
        if self.cpu is None or not self.acknowledged:
            return None
        return 1e6 * self.cpu.writer_cpu_seconds / self.acknowledged

    @property
    def server_cpu_us_per_event(self) -> float | None:
        if self.cpu is None or self.cpu.server_cpu_seconds is None or not self.acknowledged:
            return None
        return 1e6 * self.cpu.server_cpu_seconds / self.acknowledged

    @property
    def server_disk_megabytes_per_second(self) -> float | None:
        """What the server process wrote to files per second of the window (its log, its copies)."""
        if self.cpu is None or self.cpu.server_disk_write_bytes is None or self.cpu.wall_seconds <= 0:
            return None
        return self.cpu.server_disk_write_bytes / self.cpu.wall_seconds / 1e6


@attrs.frozen
class SystemRun:
    """One system's sweep over one workload (or why it was skipped)."""

    workload: str
    system: str
    title: str
    equal_durability: bool
    available: bool
    detail: str  # version and where, or why it was skipped
    configuration: str
    steps: tuple[StepResult, ...] = ()
    error: str | None = None  # the server did not start, ...
    profile: str | None = None  # a profile summary (writer and server), with --profile
    repeat: int = 0  # which of the workload's repeated sweeps this is (from 0)

    def step(self, rate: Rate) -> StepResult | None:
        return next((step for step in self.steps if step.rate_label == rate.label), None)

    @property
    def max_step(self) -> StepResult | None:
        return self.step(Rate())


@attrs.frozen
class RawLoopProbe:
    """The raw group-commit loop at 1 MiB writes, measured right before one repeat of a workload whose
    MB/s target it is the yardstick of (the disk's speed moves between minutes on a shared host)."""

    workload: str
    repeat: int
    run: GroupCommitRun


@attrs.frozen
class TargetResult:
    workload: str
    description: str
    measured: float | None
    bound: float
    at_least: bool
    detail: str

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured >= self.bound if self.at_least else self.measured <= self.bound


@attrs.frozen
class HarnessReport:
    suite: str
    machine: MachineDescription
    data_root_reason: str
    config: HarnessConfig
    disk: DiskLimit
    runs: tuple[SystemRun, ...]
    targets: tuple[TargetResult, ...]
    wall_seconds: float
    quiet_waits: int
    quiet_waits_timed_out: int
    #: How late a 1 ms sleep wakes up on this machine, measured with the disk (scheduler noise: on a
    #: busy machine every hop between writer, server and fsync thread pays it).
    wakeup_lateness: Latency = attrs.field(factory=lambda: Latency.of([]))
    raw_loops: tuple[RawLoopProbe, ...] = ()
    #: What one message and its answer between two processes cost here, after the CPUs idled.
    round_trip: RoundTrip | None = None
    #: The README's loops, the batch and columnar calls, each beside the raw loop (``bench.user_loops``).
    user_loops: UserLoopsReport | None = None
    #: Latency as users see it (``bench.latency_loops``).
    latency_loops: LatencyLoopsReport | None = None

    def runs_of(self, workload: str) -> list[SystemRun]:
        """The sweeps of ``workload``: repeat by repeat, the systems in turn within each."""
        return [run for run in self.runs if run.workload == workload]


# --- running -------------------------------------------------------------------------------------------


def run_harness(config: HarnessConfig, drivers: Mapping[str, Driver], data_root: Path, data_root_reason: str,
                progress: Progress | None = None, *, clock: Callable[[], float] = time.monotonic) -> HarnessReport:
    """Run every workload of ``config`` against its systems (see the module docstring)."""
    started = clock()
    data_root.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix="millstream-harness-", dir=data_root))
    steps = Steps(1 + config.repeat * sum(len(w.rates) * len(w.systems) for w in config.workloads)
                  + (config.user_loops is not None) + (config.latency_loops is not None), progress)
    quiet_waits: list[QuietWait] = []
    try:
        machine = describe_machine(workspace, millstream.__version__)
        steps.next("the disk's physical limit")
        disk_dir = workspace / "disk"
        disk_dir.mkdir()
        quiet = _wait_quiet(config)
        quiet_waits.append(quiet)
        disk = measure_disk_limit(disk_dir, seconds=config.disk_probe_seconds, use_fio=config.use_fio, quiet=quiet)
        shutil.rmtree(disk_dir, ignore_errors=True)
        wakeup = measure_wakeup_lateness(config.disk_probe_seconds)
        round_trip = measure_round_trip(config.disk_probe_seconds)
        user_loops = None
        if config.user_loops is not None:
            steps.next("users' loops beside the raw loop")
            quiet = _wait_quiet(config)
            quiet_waits.append(quiet)
            user_loops = run_user_loops(config.user_loops, workspace, quiet)
        latency_loops = None
        if config.latency_loops is not None:
            steps.next("users' latency: the per-event loop at half of max, a lone writer")
            quiet = _wait_quiet(config)
            quiet_waits.append(quiet)
            latency_loops = run_latency_loops(config.latency_loops, workspace, quiet)
        runs: list[SystemRun] = []
        raw_loops: list[RawLoopProbe] = []
        for workload in config.workloads:
            for repeat in range(config.repeat):
                if workload.targets.megabytes_per_second_vs_raw_loop_min is not None:
                    raw_loops.append(_probe_raw_loop(config, workspace, workload.name, repeat, quiet_waits))
                for system in workload.systems:
                    workdir = workspace / f"{workload.name}-{system}-{repeat}"
                    run = _run_system(config, drivers.get(system), system, workload, workdir, steps, quiet_waits,
                                      profile=config.profile and repeat == 0)
                    runs.append(attrs.evolve(run, repeat=repeat))
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    steps.finish()
    return HarnessReport(
        suite=config.suite, machine=machine, data_root_reason=data_root_reason, config=config, disk=disk,
        runs=tuple(runs), targets=tuple(judge_targets(config.workloads, runs, disk, raw_loops)),
        wall_seconds=clock() - started, quiet_waits=len(quiet_waits),
        quiet_waits_timed_out=sum(1 for wait in quiet_waits if not wait.quiet), wakeup_lateness=wakeup,
        raw_loops=tuple(raw_loops), round_trip=round_trip, user_loops=user_loops, latency_loops=latency_loops)


def _probe_raw_loop(config: HarnessConfig, workspace: Path, workload: str, repeat: int,
                    quiet_waits: list[QuietWait]) -> RawLoopProbe:
    directory = workspace / f"raw-loop-{workload}-{repeat}"
    directory.mkdir()
    quiet = _wait_quiet(config)
    quiet_waits.append(quiet)
    try:
        return RawLoopProbe(workload, repeat, measure_raw_loop(directory, seconds=config.disk_probe_seconds,
                                                               quiet=quiet))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


#: The sleep whose lateness ``measure_wakeup_lateness`` times, and how many it takes at most.
_WAKEUP_SLEEP_SECONDS: Final = 0.001
_WAKEUP_SAMPLES_MAX: Final = 10_000


def measure_wakeup_lateness(seconds: float) -> Latency:
    """How much later than asked ``time.sleep(1 ms)`` returns, for about ``seconds``."""
    samples = LatencySamples()
    deadline = time.perf_counter() + seconds
    for _ in range(_WAKEUP_SAMPLES_MAX):
        started = time.perf_counter()
        if started >= deadline:
            break
        time.sleep(_WAKEUP_SLEEP_SECONDS)
        samples.add(max(0.0, time.perf_counter() - started - _WAKEUP_SLEEP_SECONDS))
    return samples.summary()


@attrs.frozen
class RoundTrip:
    """One byte to another process over a loopback socket pair and back, each after an idle
    millisecond: the wall time, and the CPU both processes spent per round trip."""

    latency: Latency
    #: Both processes, per round trip, the caller's waking from its sleep included (None: the echo's
    #: figure did not come back).
    cpu_us: float | None


#: The echo process of ``measure_round_trip``: answers each byte; at the end writes the CPU seconds it
#: spent after the first byte to stdout.
_ECHO_SCRIPT: Final = """\
import socket, sys, time
peer = socket.socket(fileno=int(sys.argv[1]))
first = peer.recv(1)
peer.sendall(first)
began = time.process_time()
while True:
    data = peer.recv(1)
    if not data:
        break
    peer.sendall(data)
print(time.process_time() - began, flush=True)
"""
_ROUND_TRIPS_MAX: Final = 5_000


def measure_round_trip(seconds: float) -> RoundTrip | None:
    """Round trips to an echo process for about ``seconds``, each after a 1 ms sleep, as a write
    and its acknowledgement make them at a moderate rate: what a hop between processes costs on this
    machine once its CPUs have idled (in a virtual machine, waking one up is the dear part).  None
    if the echo process cannot be started."""
    mine, theirs = socket.socketpair()
    try:
        echo = subprocess.Popen([sys.executable, "-c", _ECHO_SCRIPT, str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True)
    except OSError:
        mine.close()
        theirs.close()
        return None
    theirs.close()
    samples = LatencySamples()
    echoed_cpu: float | None = None
    try:
        mine.settimeout(BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
        mine.sendall(b"x")  # the first answer waits for the echo to start: not measured
        mine.recv(1)
        own_began = time.process_time()
        deadline = time.perf_counter() + seconds
        for _ in range(_ROUND_TRIPS_MAX):
            if time.perf_counter() >= deadline:
                break
            time.sleep(_WAKEUP_SLEEP_SECONDS)
            started = time.perf_counter()
            mine.sendall(b"x")
            if mine.recv(1) != b"x":
                return None
            samples.add(time.perf_counter() - started)
        own = time.process_time() - own_began
        mine.shutdown(socket.SHUT_WR)
        output, _ = echo.communicate(timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
        with contextlib.suppress(ValueError):
            echoed_cpu = float(output.strip())
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        mine.close()
        if echo.poll() is None:
            echo.kill()
        echo.wait()
    summary = samples.summary()
    count = summary.count
    cpu_us = None if echoed_cpu is None or not count else 1e6 * (own + echoed_cpu) / count
    return RoundTrip(summary, cpu_us)


def _wait_quiet(config: HarnessConfig) -> QuietWait:
    return wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, config.quiet_probe_seconds)


def _run_system(config: HarnessConfig, driver: Driver | None, system: str, workload: Workload, workdir: Path,
                steps: Steps, quiet_waits: list[QuietWait], *, profile: bool) -> SystemRun:
    if driver is None:
        steps.skip(len(workload.rates))
        return SystemRun(workload=workload.name, system=system, title=system, equal_durability=False,
                         available=False, detail="no driver of that name", configuration="")
    base = SystemRun(workload=workload.name, system=system, title=driver.title,
                     equal_durability=driver.equal_durability, available=False, detail="",
                     configuration=driver.configuration())
    availability = driver.availability()
    if not availability.available:
        steps.skip(len(workload.rates))
        return attrs.evolve(base, detail=availability.detail)
    base = attrs.evolve(base, available=True, detail=availability.detail)
    keys = KeySpace(keyed=workload.routing_keys, key_count=workload.routing_key_count, partitions=workload.segments,
                    seed=workload.seed)
    profiling = profile and system == "millstream"
    server_profile = workdir / "server.prof" if profiling else None
    port = free_port()
    server = driver.server(workdir, port, profile_path=server_profile)
    results: list[StepResult] = []
    writer_profile: str | None = None
    try:
        server.start()
    except Exception as error:  # a server that does not start is reported, not fatal
        steps.skip(len(workload.rates))
        shutil.rmtree(workdir, ignore_errors=True)
        return attrs.evolve(base, error=f"server did not start: {error}")
    try:
        maximum: float | None = None
        for rate in workload.rates:
            steps.next(f"{workload.name} · {system} · {rate.label}")
            if rate.percent_of_max is not None and not maximum:
                results.append(_skipped_step(rate, "no maximum was measured for this system"))
                continue
            quiet = _wait_quiet(config)
            quiet_waits.append(quiet)
            with _maybe_profile(profiling and rate.is_max) as profiler:
                result = _run_step(config, driver, server, workload, keys, rate, maximum, quiet)
            if profiler is not None:
                writer_profile = _profile_summary(profiler)
            if rate.is_max and result.error is None:
                maximum = result.achieved_events_per_second
            results.append(result)
    finally:
        server.stop()
        summary = _combine_profiles(writer_profile, server_profile)
        shutil.rmtree(workdir, ignore_errors=True)
    return attrs.evolve(base, steps=tuple(results), profile=summary)


def _skipped_step(rate: Rate, reason: str) -> StepResult:
    return StepResult(rate_label=rate.label, offered_events_per_second=None, achieved_events_per_second=None,
                      achieved_megabytes_per_second=None, sent=0, acknowledged=0, delivered=0,
                      write_latency=Latency.of([]), end_to_end_latency=None, cpu=None,
                      quiet=QuietWait(quiet=False, waited_seconds=0.0, idle_percent=None), error=reason)


def consumer_partitions(partitions: int, consumers: int) -> list[list[int]]:
    """Partitions dealt round-robin to ``consumers`` readers (each gets at least one)."""
    if not 0 <= consumers <= partitions:
        raise ValueError(f"{consumers} consumers for {partitions} partitions")
    return [list(range(index, partitions, consumers)) for index in range(consumers)]


def _run_step(config: HarnessConfig, driver: Driver, server: ServerProcess, workload: Workload, keys: KeySpace,
              rate: Rate, maximum: float | None, quiet: QuietWait) -> StepResult:
    offered = rate.resolve(maximum)
    plan = OfferPlan(rate=offered, warmup_seconds=workload.warmup_seconds, duration_seconds=workload.duration_seconds,
                     event_bytes=workload.event_bytes, bytes_max=config.step_bytes_max)
    recorder: StepRecorder | None = None
    cpu = _CpuMeter(server)
    error: str | None = None
    try:
        recorder = asyncio.run(_step(driver, server.port, workload, keys, plan, cpu, config.drain_timeout_seconds))
    except Exception as failure:  # a failed step is reported with what it measured
        error = _describe(failure)
        recorder = getattr(failure, "recorder", None)
    if recorder is None:
        return attrs.evolve(_skipped_step(rate, error or "no result"), offered_events_per_second=offered,
                            quiet=quiet)
    recorder.check_invariants()
    if recorder.errors and error is None:
        error = "; ".join(recorder.errors[:3])
    window = recorder.window_seconds
    achieved = recorder.acknowledged_measured / window if window else None
    return StepResult(
        rate_label=rate.label, offered_events_per_second=offered,
        achieved_events_per_second=achieved,
        achieved_megabytes_per_second=None if achieved is None else achieved * workload.event_bytes / 1e6,
        sent=recorder.sent_measured, acknowledged=recorder.acknowledged_measured,
        delivered=recorder.delivered_measured, write_latency=recorder.write_latency.summary(),
        end_to_end_latency=recorder.end_to_end_latency.summary() if workload.consumers else None,
        cpu=cpu.window(), quiet=quiet, error=error, sent_total=recorder.sent_total,
        acknowledged_total=recorder.acknowledged_total, delivered_total=recorder.delivered_total)


class _StepFailed(Exception):
    """Carries what a failed step measured up to its failure, out of ``asyncio.run``."""

    def __init__(self, cause: BaseException, recorder: StepRecorder) -> None:
        super().__init__(_describe(cause))
        self.recorder = recorder


async def _step(driver: Driver, port: int, workload: Workload, keys: KeySpace, plan: OfferPlan, cpu: _CpuMeter,
                drain_timeout_seconds: float) -> StepRecorder:
    recorder = StepRecorder(event_bytes=workload.event_bytes)
    recorder.on_window(cpu.mark)
    session = await asyncio.wait_for(driver.open_session(port, workload, keys, recorder),
                                     BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
    try:
        consumers = [await asyncio.wait_for(session.open_consumer(partitions), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
                     for partitions in consumer_partitions(workload.segments, workload.consumers)]
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            for consumer in consumers:
                group.create_task(consumer.run(stop))
            try:
                await offer(session, plan, recorder)
                await recorder.drain(consumers=bool(consumers), timeout_seconds=drain_timeout_seconds)
            finally:
                stop.set()
    except Exception as failure:
        raise _StepFailed(failure, recorder) from failure
    finally:
        await asyncio.wait_for(session.close(), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
    return recorder


def _describe(failure: BaseException) -> str:
    if isinstance(failure, _StepFailed):
        return str(failure)
    if isinstance(failure, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in failure.exceptions[:3])
    return f"{type(failure).__name__}: {failure}"


class _CpuMeter:
    """Samples at the window's two ends: the machine's CPU and this process's (``CpuSample``), the
    server's CPU and the bytes it has written to files."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self._begin: tuple[CpuSample, float | None, int | None] | None = None
        self._end: tuple[CpuSample, float | None, int | None] | None = None

    def mark(self, what: str) -> None:
        sample = (CpuSample.now(), self._server.cpu_seconds(), self._server.disk_write_bytes())
        if what == "begin":
            self._begin = sample
        else:
            self._end = sample

    def window(self) -> CpuWindow | None:
        if self._begin is None or self._end is None:
            return None
        (start, server_start, written_start), (end, server_end, written_end) = self._begin, self._end
        usage = CpuUsage.between(start, end)
        server = None if server_start is None or server_end is None else max(0.0, server_end - server_start)
        written = None if written_start is None or written_end is None else max(0, written_end - written_start)
        others = max(0.0, usage.others_cpu_seconds - (server or 0.0))
        capacity = usage.wall_seconds * (os.cpu_count() or 1)
        return CpuWindow(wall_seconds=usage.wall_seconds, writer_cpu_seconds=usage.own_cpu_seconds,
                         server_cpu_seconds=server, others_cpu_seconds=others,
                         others_percent=100.0 * others / capacity, idle_percent=usage.idle_percent,
                         server_disk_write_bytes=written,
                         steal_percent=min(usage.steal_percent, 100.0 * others / capacity))


@contextlib.contextmanager
def _maybe_profile(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield profiler
    finally:
        profiler.disable()


def _profile_summary(profiler: Any) -> str:
    out = StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(PROFILE_LINES)
    return _trim_profile(out.getvalue())


def _combine_profiles(writer: str | None, server_path: Path | None) -> str | None:
    parts = []
    if writer:
        parts.append("writer process (cProfile of the \"max\" step, by own time):\n" + writer)
    if server_path is not None:
        if server_path.is_file():
            out = StringIO()
            pstats.Stats(str(server_path), stream=out).sort_stats("tottime").print_stats(PROFILE_LINES)
            parts.append("server process (cProfile of the whole sweep, by own time):\n" + _trim_profile(out.getvalue()))
        else:
            parts.append("server process: no profile was written (did it exit on SIGINT?)")
    return "\n\n".join(parts) or None


def _trim_profile(text: str) -> str:
    """pstats output without its header lines about files and ordering."""
    lines = text.strip().splitlines()
    start = next((index for index, line in enumerate(lines) if "function calls" in line), 0)
    return "\n".join(line.rstrip() for line in lines[start:])


# --- targets -------------------------------------------------------------------------------------------


def judge_targets(workloads: Sequence[Workload], runs: Sequence[SystemRun], disk: DiskLimit,
                  raw_loops: Sequence[RawLoopProbe] = ()) -> list[TargetResult]:
    """Each workload's targets for millstream, as ratios of this run's figures (None: not measurable).
    With repeated sweeps, each figure is taken within one repeat and the target judged on their median.
    An MB/s target divides by the raw loop probed before the same repeat, if there is one, else by
    ``disk``'s."""
    results: list[TargetResult] = []
    for workload in workloads:
        swept = [run for run in runs if run.workload == workload.name]
        repeats = sorted({run.repeat for run in swept}) or [0]
        probes = {probe.repeat: probe.run for probe in raw_loops if probe.workload == workload.name}
        per_repeat = [_judge_repeat(workload, [run for run in swept if run.repeat == repeat],
                                    probes.get(repeat, disk.group_commit_1mib), repeat in probes)
                      for repeat in repeats]
        results += [_median_target(list(judged)) for judged in zip(*per_repeat, strict=True)]
    return results


def _median_target(judged: list[TargetResult]) -> TargetResult:
    """One target judged in each repeat -> the target judged on the median of the repeats' figures."""
    if len(judged) == 1:
        return judged[0]
    measured = [(target, target.measured) for target in judged if target.measured is not None]
    if not measured:
        return attrs.evolve(judged[0], detail=f"not measured in any of {len(judged)} repeats")
    median = statistics.median(figure for _, figure in measured)
    closest = min(measured, key=lambda pair: abs(pair[1] - median))[0]
    each = ", ".join("—" if target.measured is None else f"{target.measured:.2f}" for target in judged)
    return attrs.evolve(closest, measured=median,
                        detail=f"median of {len(judged)} repeats ({each}); the middle one: {closest.detail}")


def _judge_repeat(workload: Workload, runs: Sequence[SystemRun], raw_loop: GroupCommitRun,
                  probed_for_repeat: bool) -> list[TargetResult]:
    """``workload``'s targets on the sweeps of one repeat (one result per target, always in one order);
    ``raw_loop``: the yardstick of its MB/s target."""
    results: list[TargetResult] = []
    targets = workload.targets
    mine = next((run for run in runs if run.system == "millstream"), None)
    mine_max = mine.max_step if mine else None
    mine_rate = mine_max.achieved_events_per_second if mine_max and mine_max.error is None else None
    if targets.events_per_second_vs_best_peer_min is not None:
        peers = [(run.max_step.achieved_events_per_second, run.system) for run in runs
                 if run.system != "millstream" and run.equal_durability
                 and run.max_step is not None and run.max_step.error is None
                 and run.max_step.achieved_events_per_second]
        best = max(peers, default=None)
        measured = mine_rate / best[0] if mine_rate and best else None
        detail = (f"millstream {_rate(mine_rate)} ÷ {best[1]} {_rate(best[0])}" if best
                  else "no equal-durability peer was measured" if mine_rate else "millstream was not measured")
        results.append(TargetResult(workload.name, "events/s at max ÷ best equal-durability peer's", measured,
                                    targets.events_per_second_vs_best_peer_min, True, detail))
    if targets.write_p95_ms_at_half_max_max is not None:
        half = mine.step(Rate(percent_of_max=50.0)) if mine else None
        p95 = half.write_latency.p95_ms if half and half.error is None else None
        detail = (f"at {_rate(half.offered_events_per_second)} offered, {_rate(half.achieved_events_per_second)} "
                  "achieved" if half and half.offered_events_per_second else "not measured")
        results.append(TargetResult(workload.name, "p95 write latency (ms) at half of max", p95,
                                    targets.write_p95_ms_at_half_max_max, False, detail))
    if targets.megabytes_per_second_vs_raw_loop_min is not None:
        raw = raw_loop.megabytes_per_second
        mine_mb = mine_max.achieved_megabytes_per_second if mine_max and mine_max.error is None else None
        measured = mine_mb / raw if mine_mb and raw else None
        disk = mine_max.server_disk_megabytes_per_second if mine_max and mine_max.error is None else None
        results.append(TargetResult(
            workload.name, "MB/s at max ÷ raw group-commit loop at 1 MiB writes", measured,
            targets.megabytes_per_second_vs_raw_loop_min, True,
            f"millstream {_megabytes(mine_mb)} ÷ raw loop {_megabytes(raw)}"
            + (" (probed right before)" if probed_for_repeat else "")
            + (f"; the server wrote {_megabytes(disk)} to its disk, {disk / mine_mb:.2f}x the events' bytes "
               "(the log, and the Tier-2 copy)" if disk is not None and mine_mb else "")))
    if targets.end_to_end_p95_ms_max is not None and targets.end_to_end_rate is not None:
        step = mine.step(Rate(events_per_second=targets.end_to_end_rate)) if mine else None
        latency = step.end_to_end_latency if step and step.error is None else None
        results.append(TargetResult(
            workload.name, f"end-to-end p95 (ms) at {targets.end_to_end_rate:,.0f} events/s",
            latency.p95_ms if latency else None, targets.end_to_end_p95_ms_max, False,
            f"{latency.count:,} events read by the tail reader(s)" if latency else "not measured"))
    return results


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}/s"


def _megabytes(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:,.1f} MB/s"


# --- output --------------------------------------------------------------------------------------------


def write_json(report: HarnessReport, output_dir: Path) -> Path:
    """Everything, raw figures included, as ``<suite>-<UTC date>.json``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.machine.date_utc.replace("-", "").replace(":", "")
    path = output_dir / f"{report.suite}-{stamp}.json"
    document = attrs.asdict(report, value_serializer=_to_json)
    for run_fields, run in zip(document["runs"], report.runs, strict=True):
        for step_fields, step in zip(run_fields["steps"], run.steps, strict=True):
            step_fields["fell_behind"] = step.fell_behind
            step_fields["writer_cpu_us_per_event"] = step.writer_cpu_us_per_event
            step_fields["server_cpu_us_per_event"] = step.server_cpu_us_per_event
            step_fields["server_disk_megabytes_per_second"] = step.server_disk_megabytes_per_second
    for target_fields, target in zip(document["targets"], report.targets, strict=True):
        target_fields["met"] = target.met
    path.write_text(json.dumps(document, indent=2, allow_nan=False, default=str) + "\n")
    return path


def _to_json(_instance: object, _field: object, value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
