"""The large-events suite: one large event against the same bytes as classic 8 MiB events, written and
read, and the client's memory while it does so -- all in the same run, against one standalone node.

What it answers (issue 8's Evidence, PDP-43's requirement that large events perform comparably):

1. *Throughput.*  Writing one event of ``event_mib`` MiB (1 GiB by default) through
   ``LargeEventWriter.stream_event`` -- streamed into a transient segment and merged at commit --
   against writing the same number of bytes as ``event_mib / 8`` classic 8 MiB events through the
   same writer's ``write_event`` (flushed at the end); and reading the large event through
   ``EventTooLargeError`` -> ``EventRead.stream_event()`` (a bounded ``EventReader``, read in
   ``PIECE_BYTES`` pieces) against reading the classic events with ``read_next_event``.  Target: each
   large-event figure within 15% of its classic one (``THROUGHPUT_RATIO_TOLERANCE``) -- read as PDP-43
   means it, "no worse than the same bytes as classic events": a large event that is faster meets it
   (the report gives the ratio either way).
2. *Memory.*  The client's peak resident set above its own baseline while it writes or reads, measured
   from outside the client process: each measurement runs its client in a fresh process of its own,
   which connects and prepares, reports ready, and waits; this process then reads its ``VmRSS``
   (the baseline), resets its peak (``/proc/PID/clear_refs``, where the kernel allows it) and tells it
   to go, samples ``VmRSS`` every ``RSS_SAMPLE_SECONDS`` while it runs, and reads the kernel's
   ``VmHWM`` at the end.  The peak is the higher of the two (the sampled maximum alone when the reset
   was refused: the kernel's peak would include the start-up).  Target: under 64 MiB above the
   baseline for the large event (``RSS_ABOVE_BASELINE_BYTES_MAX``); the classic events' figure is
   beside it for comparison (an 8 MiB event is held whole by the application and in the writer's
   window).

Setup.  A ``millstream standalone`` node in a process of its own (durable FileLog, fdatasync before
every acknowledgement, Tier 2 in its data directory, the controller on the same port), started and
stopped here; clients in their own processes; all on 127.0.0.1.  Every repeat writes to two fresh
one-segment streams (one per kind of event), reads each back through a fresh reader group, and deletes
them.  Payload bytes come from one ``PIECE_BYTES`` random buffer written again and again: the client
never holds the large event.  Every measurement waits first for a quiet machine (bounded) and records
the CPU of the client, of the server and of everything else (the machine is shared: quote medians).
Every wait is bounded: a client's start by ``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS``, its run by that
plus a second per 4 MiB it moves (``_step_timeout``), the server's start and stop by the harness's limits.

Run it as ``python -m bench --suite large-events [--event-mib N] [--repeat R] [--markdown FILE]``;
``--markdown`` replaces (or adds) its own section of that file.  ``tox -e bench`` runs a small form.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench import _suite
from bench import limits as bench_limits
from bench._processes import module_environment
from bench._stats import median_or_none
from bench._suite import CpuMeter, Progress, Repeat, Steps, bounded, fixed, standalone_server
from bench._system import MachineDescription, QuietWait, describe_machine, wait_until_quiet
from millstream import limits

__all__ = ["LargeEventsConfig", "LargeEventsReport", "render_large_events_markdown", "replace_section",
           "run_large_events", "section_of", "write_large_events_json"]

SUITE_NAME: Final = "large-events"
MIB: Final = 1024 * 1024
#: A classic event at the classic limit: what PDP-43 compares a large event with.
CLASSIC_EVENT_BYTES: Final = limits.EVENT_LENGTH_BYTES_MAX
#: The application's writes and the EventReader's reads: 1 MiB at a time.
PIECE_BYTES: Final = 1 * MIB
#: How often the client's resident set is sampled from outside.
RSS_SAMPLE_SECONDS: Final = 0.005
THROUGHPUT_RATIO_TOLERANCE: Final = 0.15
RSS_ABOVE_BASELINE_BYTES_MAX: Final = 64 * MIB
SCOPE: Final = "bench"
ROUTING_KEY: Final = "large"
#: Measurements in the order a repeat runs them (a read needs its write before it).
SCENARIOS: Final = ("write-large", "read-large", "write-classic", "read-classic")
SECTION_BEGIN: Final = "<!-- millstream bench --suite large-events: begin -->"
SECTION_END: Final = "<!-- millstream bench --suite large-events: end -->"


@attrs.frozen
class LargeEventsConfig:
    #: At least twice the inline limit (8 MiB), so the large event is streamed through a transient segment.
    event_mib: int = attrs.field(default=1024, validator=attrs.validators.and_(
        attrs.validators.ge(16), attrs.validators.le(limits.LARGE_EVENT_LENGTH_BYTES_MAX // MIB)))
    repeat: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 20.0

    @property
    def total_bytes(self) -> int:
        """The bytes each measurement moves: one large event, or as many classic events."""
        return self.event_mib * MIB

    @property
    def classic_events(self) -> int:
        return self.total_bytes // CLASSIC_EVENT_BYTES


@attrs.frozen
class Measurement:
    scenario: str
    events: int
    bytes: int
    seconds: float  # from "go" to the last byte durable (written) or returned (read)
    mib_per_second: float
    rss_baseline_bytes: int
    rss_peak_bytes: int  # the higher of the sampled maximum and the kernel's peak (when it was reset)
    rss_samples: int
    peak_reset: bool  # the kernel's peak was reset after the baseline (else the sampled maximum only)
    client_cpu_seconds: float | None
    server_cpu_seconds: float | None
    others_percent: float | None  # of the whole machine, this suite's client and server excluded
    quiet: QuietWait

    @property
    def rss_above_baseline_bytes(self) -> int:
        return max(0, self.rss_peak_bytes - self.rss_baseline_bytes)


@attrs.frozen
class Summary:
    """A scenario's medians over the repeats."""

    scenario: str
    mib_per_second: float | None
    seconds: float | None
    rss_above_baseline_mib: float | None
    rss_above_baseline_mib_max: float | None  # the worst repeat
    rss_baseline_mib: float | None
    client_cpu_seconds: float | None
    server_cpu_seconds: float | None
    others_percent: float | None


@attrs.frozen
class LargeEventsReport:
    suite: str
    machine: MachineDescription
    config: LargeEventsConfig
    repeats: list[Repeat[Measurement]]
    summaries: list[Summary]
    write_ratio: float | None  # median over repeats of large MiB/s ÷ classic MiB/s
    read_ratio: float | None
    wall_seconds: float

    def summary(self, scenario: str) -> Summary:
        return next(s for s in self.summaries if s.scenario == scenario)


# --- the client process ----------------------------------------------------------------------------------


def _step_timeout(total_bytes: int) -> float:
    """A client run's bound: the call timeout, plus a second for every 4 MiB it moves (a loaded, shared
    disk may write a GiB in minutes, not in the call timeout)."""
    return bench_limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS + total_bytes / (4 * MIB)


async def _client(port: int, scenario: str, stream: str, group: str, total_bytes: int) -> dict[str, Any]:
    """One measurement's client: prepare, say "ready", wait for "go", run, report, wait for "exit"."""
    from millstream.client import AsyncClient, ReaderGroupConfig
    from millstream.errors import EventTooLargeError

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    piece = memoryview(os.urandom(PIECE_BYTES))
    loop = asyncio.get_running_loop()
    try:
        writer: Any = None
        reader: Any = None
        if scenario.startswith("write"):
            writer = client.large_event_writer(stream)
            classic = bytes(piece) * (CLASSIC_EVENT_BYTES // PIECE_BYTES) if scenario == "write-classic" else b""
        else:
            readers = await client.reader_group(group, config=ReaderGroupConfig([stream]))
            reader = await readers.reader("bench")
        print("ready", flush=True)
        if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "go":
            raise RuntimeError("the bench did not say go")
        started = time.perf_counter()
        events = moved = 0
        if scenario == "write-large":
            event = writer.stream_event(ROUTING_KEY)
            while moved < total_bytes:
                moved += await event.write(piece[:min(PIECE_BYTES, total_bytes - moved)])
            await event.commit()
            events = 1
        elif scenario == "write-classic":
            while moved < total_bytes:
                await writer.write_event(classic, routing_key=ROUTING_KEY)
                moved += len(classic)
                events += 1
            await writer.flush()
        else:
            while moved < total_bytes:
                try:
                    read = await reader.read_next_event(1.0)
                except EventTooLargeError as error:
                    async with error.event_read.stream_event() as streamed:
                        while data := await streamed.read(PIECE_BYTES):
                            moved += len(data)
                    events += 1
                    continue
                if read.event is not None:
                    moved += len(read.event)
                    events += 1
        seconds = time.perf_counter() - started
        if writer is not None:
            await writer.close()
        if reader is not None:
            await reader.close()
        return {"seconds": seconds, "events": events, "bytes": moved}
    finally:
        await client.close()


def client_main(argv: Sequence[str]) -> None:
    """``python -m bench.large_events PORT SCENARIO STREAM GROUP BYTES``: one client."""
    port, scenario, stream, group, total = argv
    result = asyncio.run(asyncio.wait_for(_client(int(port), scenario, stream, group, int(total)),
                                          _step_timeout(int(total)) * 2))
    print(json.dumps(result), flush=True)
    sys.stdin.readline()  # "exit": the bench reads our peak and CPU first


# --- watching it from outside -----------------------------------------------------------------------------


def _status_bytes(pid: int, field: str) -> int | None:
    """``field`` (``VmRSS``, ``VmHWM``) of process ``pid`` in bytes, or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak(pid: int) -> bool:
    """Reset the kernel's peak resident set of ``pid`` to its current one (``clear_refs`` 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class _RssWatch:
    """Samples a process's ``VmRSS`` every ``RSS_SAMPLE_SECONDS`` on a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="millstream-bench-rss", daemon=True)

    def __enter__(self) -> _RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # Sample first, then look at the stop flag: an operation over before this thread got going
        # still gets its one sample (the loop used to check first, and a fast run could end with none).
        while True:
            rss = _status_bytes(self._pid, "VmRSS")
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            if self._stop.wait(RSS_SAMPLE_SECONDS):
                return


def _line(process: subprocess.Popen[str], timeout_seconds: float, what: str) -> str:
    """The client's next line of output, within ``timeout_seconds``."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline() if process.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_seconds)
    if reader.is_alive() or not result or not result[0]:
        process.kill()
        raise RuntimeError(f"the {what} client did not answer within {timeout_seconds:g} s (exit code "
                           f"{process.poll()})")
    return result[0].strip()


def _measure(port: int, scenario: str, stream: str, group: str, config: LargeEventsConfig, server_pid: int,
             log: Path) -> Measurement:
    quiet = wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, 0.5)
    timeout = _step_timeout(config.total_bytes)
    with log.open("a") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.large_events", str(port), scenario, stream, group,
             str(config.total_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            env=module_environment())
    try:
        if _line(process, bench_limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS, scenario) != "ready":
            raise RuntimeError(f"the {scenario} client did not get ready")
        baseline = _status_bytes(process.pid, "VmRSS") or 0
        reset = _reset_peak(process.pid)
        cpu = CpuMeter(process.pid, server_pid)  # others' share excludes the client's and the server's
        cpu.mark()
        assert process.stdin is not None
        with _RssWatch(process.pid) as watch:
            process.stdin.write("go\n")
            process.stdin.flush()
            result = json.loads(_line(process, timeout, scenario))
        cpu.mark()
        kernel_peak = _status_bytes(process.pid, "VmHWM") if reset else None
        process.stdin.write("exit\n")
        process.stdin.flush()
        process.wait(bench_limits.BENCH_SERVER_STOP_TIMEOUT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if result["bytes"] != config.total_bytes:
        raise RuntimeError(f"{scenario}: moved {result['bytes']} bytes, not {config.total_bytes}")
    span = cpu.span()
    (client_cpu, server_cpu), others = span.processes, span.others_percent
    seconds = result["seconds"]
    return Measurement(
        scenario=scenario, events=result["events"], bytes=result["bytes"], seconds=seconds,
        mib_per_second=result["bytes"] / MIB / seconds, rss_baseline_bytes=baseline,
        rss_peak_bytes=max(watch.peak, kernel_peak or 0), rss_samples=watch.samples, peak_reset=reset,
        client_cpu_seconds=client_cpu, server_cpu_seconds=server_cpu, others_percent=others, quiet=quiet)


# --- the suite ---------------------------------------------------------------------------------------------


async def _streams(port: int, create: Sequence[str], delete: Sequence[str]) -> None:
    """Create one-segment streams ``create`` (no retention), and seal and delete ``delete``."""
    from millstream.client import AsyncClient, RetentionPolicy, ScalingPolicy, StreamConfig

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    try:
        manager = client.stream_manager()
        await bounded(manager.create_scope(SCOPE, exist_ok=True))
        for stream in create:
            await bounded(manager.create_stream(stream, StreamConfig(
                scaling=ScalingPolicy.fixed(1), retention=RetentionPolicy.none())))
        for stream in delete:
            await bounded(manager.seal_stream(stream))
            await bounded(manager.delete_stream(stream))
    finally:
        await client.close()


def run_large_events(config: LargeEventsConfig, data_root: Path, progress: Progress | None = None,
                     ) -> LargeEventsReport:
    """Run every scenario ``config.repeat`` times against one standalone node (started and stopped here,
    its data in a temporary directory under ``data_root``, removed at the end)."""
    started = time.perf_counter()
    machine = describe_machine(data_root, millstream.__version__)
    repeats = []
    steps = Steps(len(SCENARIOS) * config.repeat, progress)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-large-events-", dir=data_root) as temp:
        with standalone_server(Path(temp)) as server:
            port = server.port
            for number in range(1, config.repeat + 1):
                streams = {kind: f"{SCOPE}/{kind}-{number}" for kind in ("large", "classic")}
                asyncio.run(_streams(port, list(streams.values()), []))
                measurements = []
                for scenario in SCENARIOS:
                    steps.next(f"repeat {number}: {scenario}")
                    kind = scenario.split("-")[1]
                    measurements.append(_measure(port, scenario, streams[kind], f"{SCOPE}/{kind}-readers-{number}",
                                                 config, server.pid, Path(temp) / "clients.log"))
                asyncio.run(_streams(port, [], list(streams.values())))
                repeats.append(Repeat(measurements))
        shutil.rmtree(Path(temp) / "data", ignore_errors=True)
    steps.finish()

    def ratio(large: str, classic: str) -> float | None:
        return median_or_none([r.of(large).mib_per_second / r.of(classic).mib_per_second for r in repeats])

    return LargeEventsReport(
        suite=SUITE_NAME, machine=machine, config=config, repeats=repeats,
        summaries=[_summary(scenario, [r.of(scenario) for r in repeats]) for scenario in SCENARIOS],
        write_ratio=ratio("write-large", "write-classic"), read_ratio=ratio("read-large", "read-classic"),
        wall_seconds=time.perf_counter() - started)


def _summary(scenario: str, measurements: Sequence[Measurement]) -> Summary:
    above = [m.rss_above_baseline_bytes / MIB for m in measurements]
    return Summary(
        scenario=scenario,
        mib_per_second=median_or_none([m.mib_per_second for m in measurements]),
        seconds=median_or_none([m.seconds for m in measurements]),
        rss_above_baseline_mib=median_or_none(above), rss_above_baseline_mib_max=max(above) if above else None,
        rss_baseline_mib=median_or_none([m.rss_baseline_bytes / MIB for m in measurements]),
        client_cpu_seconds=median_or_none([m.client_cpu_seconds for m in measurements]),
        server_cpu_seconds=median_or_none([m.server_cpu_seconds for m in measurements]),
        others_percent=median_or_none([m.others_percent for m in measurements]))


# --- the report --------------------------------------------------------------------------------------------


def ratio_met(ratio: float | None) -> str:
    if ratio is None:
        return "not measured"
    return "met" if ratio >= 1.0 - THROUGHPUT_RATIO_TOLERANCE else "**not met**"


def render_large_events_markdown(report: LargeEventsReport, *,
                                 command: str = "millstream bench --suite large-events") -> str:
    """The suite's section of ``BENCHMARKS.md`` (and its stdout report), between the markers."""
    machine, config = report.machine, report.config
    others = [m.others_percent for r in report.repeats for m in r.measurements if m.others_percent is not None]
    noise = (f"other processes used {min(others):.0f} to {max(others):.0f}% of the machine during the measured "
             "windows" if others else "others' CPU was not measured")
    classic_mib = CLASSIC_EVENT_BYTES // MIB
    what = {"write-large": f"write one {config.event_mib} MiB event (`stream_event`, commit)",
            "read-large": f"read it (`EventTooLargeError` → `stream_event()`, {PIECE_BYTES // MIB} MiB reads)",
            "write-classic": f"write {config.classic_events} x {classic_mib} MiB events (`write_event`, flush)",
            "read-classic": "read them (`read_next_event`)"}
    rows = [f"| {what[s.scenario]} | {fixed(s.mib_per_second, 1)} | {fixed(s.seconds, 2)} "
            f"| {fixed(s.rss_above_baseline_mib, 1)} | {fixed(s.rss_above_baseline_mib_max, 1)} "
            f"| {fixed(s.rss_baseline_mib, 1)} | {fixed(s.client_cpu_seconds, 2)} "
            f"| {fixed(s.server_cpu_seconds, 2)} | {fixed(s.others_percent, 0)} |" for s in report.summaries]
    large_rss = max((report.summary(s).rss_above_baseline_mib_max or 0.0) for s in ("write-large", "read-large"))
    rss_limit = RSS_ABOVE_BASELINE_BYTES_MAX // MIB
    resets = all(m.peak_reset for r in report.repeats for m in r.measurements)
    lines = [
        SECTION_BEGIN,
        "## Large events",
        "",
        f"> Generated by `{command}`; do not edit by hand -- run the command again to refresh it.",
        "",
        f"{machine.date_utc} · millstream {machine.millstream_version} · {machine.cpu_count} CPUs "
        f"({machine.cpu_model}) · data on {machine.data_dir_filesystem.type}  ",
        "One `millstream standalone` node (FileLog with fdatasync before every acknowledgement, the controller on "
        "the same port) in its own process; each measurement's client in a fresh process of its own; all on "
        f"127.0.0.1.  Every repeat writes {config.event_mib} MiB twice -- as one large event and as "
        f"{config.classic_events} classic {classic_mib} MiB events, each into a fresh one-segment stream -- and "
        f"reads each back.  Medians of {config.repeat} repeat(s); {noise}.  The run took "
        f"{report.wall_seconds / 60:.1f} min.",
        "",
        "| measurement | MiB/s | seconds | client peak RSS above baseline, MiB (median) | worst | baseline "
        "RSS MiB | client CPU s | server CPU s | others' CPU % |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Large ÷ classic throughput, same bytes, same repeat: writing **{fixed(report.write_ratio, 2)}** "
        f"({ratio_met(report.write_ratio)}), reading **{fixed(report.read_ratio, 2)}** "
        f"({ratio_met(report.read_ratio)}); target: large at most {THROUGHPUT_RATIO_TOLERANCE:.0%} slower "
        "than classic.",
        f"Client peak RSS above its baseline with the large event, worst repeat: **{large_rss:.1f} MiB** "
        f"({'met' if large_rss < rss_limit else '**not met**'}; target under {rss_limit} MiB).",
        "",
        "Peak RSS is measured from outside the client process: its `VmRSS` when it is ready (connected, its "
        "writer or reader made) is the baseline; then, while it runs, `VmRSS` is sampled every "
        f"{RSS_SAMPLE_SECONDS * 1000:g} ms and the kernel's `VmHWM` is read at the end"
        + (" (reset to the baseline first through `/proc/PID/clear_refs`)" if resets else
           " (the kernel refused to reset its peak here, so the sampled maximum alone)")
        + ".  Seconds: from the client's go to the last byte durable (commit or flush returned) or returned to "
        "the application.  A classic event is held whole by the application and by the writer until "
        "acknowledged; the large event never is.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def replace_section(document: str, section: str) -> str:
    """``document`` with its large-events section (between the markers) replaced by ``section``, or with
    ``section`` appended if it has none."""
    return _suite.replace_section(document, section, SECTION_BEGIN, SECTION_END)


def section_of(document: str) -> str | None:
    """The large-events section of ``document`` (markers included), if it has one -- for a writer of the
    rest of the file (the peers harness) to keep it."""
    return _suite.section_of(document, SECTION_BEGIN, SECTION_END)


def write_large_events_json(report: LargeEventsReport, output_dir: Path) -> Path:
    """The whole report, raw per-repeat results included, as ``large-events-<UTC date>.json``."""
    return _suite.write_json(report, output_dir)


if __name__ == "__main__":
    client_main(sys.argv[1:])
