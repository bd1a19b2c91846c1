"""The streams suite: what routing keys cost a writer, a reader group's tail-read latency, and a stream
that auto-scales under load -- issue 5's figures, all in the same run.

Throughput (``keys``).  A ``millstream standalone`` node in a process of its own (the harness's
server command: durable FileLog, fdatasync before every acknowledgement) and this process as the
client, on 127.0.0.1.  One writer (``AsyncEventStreamWriter``) writes ``EVENT_BYTES``-byte events as
fast as it can -- pipelined, no flush until the end of the window -- to a stream of 1 or of 16
fixed segments, with a routing key per event drawn from ``ROUTING_KEYS`` keys (OpenMessaging's
RANDOM_NANO: ``bench._keys``), or with none.  Events/s is the events written in the
window over the time until the flush at its end returned (all of them durable).  The combinations
run interleaved in every repeat, keys and no keys in turn first (``repeat_order``: the node holds
more data with every window, so whichever ran second would meet more background work -- a drift
that alternating cancels); the headline is keys over no keys at the same segment count (median over
repeats).  At 1 segment a control runs beside them: ``HOT_KEYS`` keys, drawn the same way.  The
writer does the same work per event for 16 keys as for 10,000 (a lone segment needs no routing; 16
would take the same memo lookups), but 16 key objects stay in the CPU's cache, while each of 10,000,
met once every 10,000 events, is cold when the writer takes its reference and again when the
acknowledged block lets it go: the difference between the two is what the keys' memory costs.

Tail reads (``end-to-end``).  The same node; a stream of ``READERS`` fixed segments and a reader
group of ``READERS`` readers in this process, each reading as fast as it can; one writer writes keyed
events at a constant ``end_to_end_rate`` (paced, each event carrying the instant it was written).
The latency is from ``write_event`` to the reader's ``read_next_event`` returning it (one clock: the
same process).  Measured after a warm-up in which every reader has acquired its segments.

Scaling (``scaling``).  A stream with an event-rate policy, fed ``SCALING_EVENT_BYTES``-byte events
at a constant rate, showing the segment count and the write latency over time (a PNG).  The
controller's averaging windows (2 to 20 minutes), cooldown (10 minutes) and mute are Pravega's; so
that a run shows a few scales in a minute, the node runs in this process with the controller on a
``ScaledClock`` (its time passes ``time_factor`` times faster than real time; the segment store, the
connections and the client keep real time).  The controller then sees the real append counts spread
over ``time_factor`` times more time, so the policy's target is given in those terms: a segment
splits once it takes more than ``scaling_target_per_segment`` real events/s (the policy's target is
that over ``time_factor``).  Latency is from ``write_event`` to the acknowledgement (its block's
future), sampled per event; the segment count is the controller's current epoch, sampled every
``SCALING_SAMPLE_SECONDS``.  The node's logs are durable (FileLog) as in the standalone node.

Every measurement records the CPU of this process, of the server and of everything else on the
machine (others' CPU: the machine is shared; quote medians).  Every wait is bounded: calls by
``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS``, reads by the window, the server by the harness's limits.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench import _suite
from bench._keys import KeySpace
from bench._stats import Latency, LatencySamples, median_or_none
from bench._suite import CpuMeter, Progress, Steps, Window, bounded, standalone_server
from bench._system import MachineDescription, QuietWait, describe_machine, wait_until_quiet

__all__ = ["SCALING_FIGURE", "ScaledClock", "StreamsConfig", "StreamsReport", "plot_scaling", "render_streams_markdown",
           "replace_section", "run_streams", "section_of", "write_streams_json"]

SUITE_NAME: Final = "streams"
EVENT_BYTES: Final = 100
ROUTING_KEYS: Final = 10_000
#: The control: so few keys that their objects stay in the CPU's cache (see "Throughput" above).
HOT_KEYS: Final = 16
KEY_SEED: Final = 5
READERS: Final = 16
SCALING_EVENT_BYTES: Final = 10_000
#: The scaling run's resolution: segment count sampled, latencies bucketed, this often (real seconds).
SCALING_SAMPLE_SECONDS: Final = 1.0
#: The scaling run's plot, written beside BENCHMARKS.md (or into ``--figures``).
SCALING_FIGURE: Final = "bench-streams-scaling.png"
SCOPE: Final = "bench"
#: Where the generated section of BENCHMARKS.md begins and ends (the rest of the file is others').
SECTION_BEGIN: Final = "<!-- millstream bench --suite streams: begin -->"
SECTION_END: Final = "<!-- millstream bench --suite streams: end -->"
#: (name, segments, routing keys: 0 for none) of the throughput measurements, in the order they run in
#: a repeat (``repeat_order``): those of one segment count back to back.
THROUGHPUT: Final = (("keys-1", 1, ROUTING_KEYS), ("hotkeys-1", 1, HOT_KEYS), ("nokeys-1", 1, 0),
                     ("keys-16", 16, ROUTING_KEYS), ("nokeys-16", 16, 0))


@attrs.frozen
class StreamsConfig:
    duration_seconds: float = 3.0
    warmup_seconds: float = 0.5
    repeat: int = 3
    end_to_end_rate: float = 2000.0
    end_to_end_seconds: float = 5.0
    #: Readers get this long (real time) to join and acquire their segments before measuring.
    end_to_end_warmup_seconds: float = 3.0
    scaling_seconds: float = 60.0
    scaling_rate: float = 200.0
    scaling_target_per_segment: float = 60.0
    time_factor: float = 60.0
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 20.0


@attrs.frozen
class Throughput:
    name: str
    segments: int
    keyed: bool
    key_count: int  # the routing keys drawn from (0: none)
    events: int
    events_per_second: float
    window: Window
    quiet: QuietWait


@attrs.frozen
class EndToEnd:
    readers: int
    rate: float
    events_written: int
    events_read: int
    latency: Latency
    window: Window


@attrs.frozen
class ScalingSample:
    """One ``SCALING_SAMPLE_SECONDS`` of the scaling run."""

    at_seconds: float  # real seconds since the run began
    controller_minutes: float  # the controller's time since the run began
    segments: int
    events_acked: int
    p50_ms: float | None
    p99_ms: float | None


@attrs.frozen
class Scaling:
    rate: float
    event_bytes: int
    policy_target: float  # the policy's events/s per segment, on the controller's clock
    time_factor: float
    samples: list[ScalingSample]
    latency: Latency
    scales: int
    others_percent: float | None


@attrs.frozen
class StreamsReport:
    suite: str
    machine: MachineDescription
    config: StreamsConfig
    throughput: list[list[Throughput]]  # per repeat
    keys_over_nokeys: dict[int, float | None]  # segments -> median ratio
    hot_over_nokeys: dict[int, float | None]  # segments -> median ratio, where the control ran
    medians: dict[str, float | None]  # name -> median events/s
    end_to_end: list[EndToEnd]
    scaling: Scaling | None
    wall_seconds: float


class ScaledClock:
    """A ``millstream.clock.Clock`` on which time passes ``factor`` times faster than real time."""

    def __init__(self, factor: float) -> None:
        if factor <= 0:
            raise ValueError(f"a clock's factor must be positive, not {factor}")
        self.factor = factor
        self._origin = time.monotonic()

    def monotonic(self) -> float:
        return self._origin + (time.monotonic() - self._origin) * self.factor

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.factor)


def _keys(key_count: int, segments: int) -> list[str | None]:
    return KeySpace(keyed=key_count > 0, key_count=max(1, key_count), partitions=segments, seed=KEY_SEED).ring_keys


def repeat_order(number: int) -> tuple[tuple[str, int, int], ...]:
    """``THROUGHPUT`` in the order repeat ``number`` (from 0) runs it: each segment count's windows back
    to back, in ``THROUGHPUT``'s order (keys first) in even repeats and reversed (no keys first) in odd
    ones."""
    groups: list[list[tuple[str, int, int]]] = []
    for run in THROUGHPUT:
        if groups and groups[-1][0][1] == run[1]:
            groups[-1].append(run)
        else:
            groups.append([run])
    return tuple(run for group in groups for run in (group if number % 2 == 0 else group[::-1]))


async def _create_stream(client: Any, name: str, policy: Any) -> str:
    from millstream.client import StreamConfig

    manager = client.stream_manager()
    await bounded(manager.create_scope(SCOPE, exist_ok=True))
    await bounded(manager.create_stream(f"{SCOPE}/{name}", StreamConfig(scaling=policy)))
    return f"{SCOPE}/{name}"


# --- throughput ------------------------------------------------------------------------------------------


async def _throughput(port: int, name: str, segments: int, key_count: int, config: StreamsConfig, server_pid: int,
                      quiet: QuietWait) -> Throughput:
    from millstream.client import AsyncClient

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    try:
        writer = client.event_writer(f"{SCOPE}/tp-{segments}")
        keys = _keys(key_count, segments)
        ring = len(keys)
        payload = bytes(EVENT_BYTES)
        turn = 0

        async def write_until(end: float) -> int:
            nonlocal turn
            written = 0
            while time.perf_counter() < end:
                for _ in range(1000):
                    await writer.write_event(payload, routing_key=keys[turn % ring])
                    turn += 1
                written += 1000
            await bounded(writer.flush())
            return written

        try:
            await write_until(time.perf_counter() + config.warmup_seconds)
            cpu = CpuMeter(server_pid)
            cpu.mark()
            started = time.perf_counter()
            events = await write_until(started + config.duration_seconds)
            elapsed = time.perf_counter() - started
            cpu.mark()
            window = cpu.window()
        finally:
            await bounded(writer.close())
    finally:
        await bounded(client.close())
    return Throughput(name, segments, key_count > 0, key_count, events, events / elapsed, window, quiet)


# --- tail reads by a group of readers ---------------------------------------------------------------------


async def _end_to_end(port: int, config: StreamsConfig, server_pid: int) -> EndToEnd:
    from millstream.client import AsyncClient, ReaderConfig, ReaderGroupConfig

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    samples = LatencySamples()
    measuring = False
    window_start = float("inf")  # events written from here on are measured
    read = 0
    stop = asyncio.Event()
    try:
        stream = f"{SCOPE}/e2e"
        group = await bounded(client.reader_group(f"{SCOPE}/e2e-group", config=ReaderGroupConfig(
            [stream], automatic_checkpoint_seconds=0)))
        readers = [await bounded(group.reader(f"reader-{n}", config=ReaderConfig())) for n in range(READERS)]

        async def consume(reader: Any) -> None:
            nonlocal read
            while not stop.is_set():
                got = await reader.read_next_event(0.2)
                if got.event is None:
                    continue
                now = time.perf_counter()
                sent = float(bytes(got.event[:24]).decode())
                if measuring and sent >= window_start:
                    samples.add(now - sent)
                    read += 1

        writer = client.event_writer(stream)
        keys = _keys(ROUTING_KEYS, READERS)
        interval = 1.0 / config.end_to_end_rate
        written = 0
        async with asyncio.TaskGroup() as tasks:
            for reader in readers:
                tasks.create_task(consume(reader))
            begin = time.perf_counter()
            cpu = CpuMeter(server_pid)
            turn = 0
            end = begin + config.end_to_end_warmup_seconds + config.end_to_end_seconds
            while (now := time.perf_counter()) < end:
                if not measuring and now >= begin + config.end_to_end_warmup_seconds:
                    cpu.mark()
                    measuring, window_start = True, now
                due = begin + turn * interval
                if due > now:
                    await asyncio.sleep(due - now)
                stamp = f"{time.perf_counter():<24.6f}".encode()
                await writer.write_event(stamp + bytes(EVENT_BYTES - len(stamp)), routing_key=keys[turn % len(keys)])
                if measuring:
                    written += 1
                turn += 1
                if turn % 50 == 0:
                    await bounded(writer.flush())  # (a paced writer: its blocks go out at once)
            await bounded(writer.flush())
            await asyncio.sleep(0.5)  # the last events reach their readers
            measuring = False
            stop.set()
        cpu.mark()
        window = cpu.window()
        for reader in readers:
            await bounded(reader.close())
        await bounded(writer.close())
    finally:
        await bounded(client.close())
    return EndToEnd(READERS, config.end_to_end_rate, written, read, samples.summary(), window)


# --- the scaling run ---------------------------------------------------------------------------------------


async def _scaling(workdir: Path, config: StreamsConfig) -> Scaling:
    from millstream.client import AsyncClient, ScalingPolicy
    from millstream.controller import Controller, ControllerConfig, ControllerRpc, LocalSegmentStore
    from millstream.segmentstore.file_chunk_storage import FileChunkStorage
    from millstream.segmentstore.file_log import FileLog
    from millstream.server import SegmentStoreServer, ServerConfig

    storage = FileChunkStorage(workdir / "tier2")
    server = SegmentStoreServer(lambda container: FileLog(workdir / "tier1" / f"container-{container}"),
                                config=ServerConfig(host="127.0.0.1", port=0), chunk_storage=storage)
    await server.start()
    clock = ScaledClock(config.time_factor)
    controller = Controller(LocalSegmentStore(server), clock=clock, now=clock.monotonic, config=ControllerConfig())
    await controller.start()
    server.attach_controller(ControllerRpc(controller))
    client = AsyncClient(server.uri)
    target = config.scaling_target_per_segment / config.time_factor
    samples: list[ScalingSample] = []
    overall = LatencySamples()
    try:
        stream = await _create_stream(client, "scaling", ScalingPolicy.by_event_rate(target, 2, min_segments=1))
        record = controller.state.streams[(SCOPE, "scaling")]
        writer = client.event_writer(stream)
        keys = _keys(ROUTING_KEYS, 16)
        payload = bytes(SCALING_EVENT_BYTES)
        interval = 1.0 / config.scaling_rate
        bucket = LatencySamples()
        acked = 0
        pending: set[asyncio.Future[None]] = set()

        def acknowledged(sent: float) -> Callable[[asyncio.Future[None]], None]:
            def done(future: asyncio.Future[None]) -> None:
                nonlocal acked
                pending.discard(future)
                if not future.cancelled() and future.exception() is None:
                    latency = time.perf_counter() - sent
                    bucket.add(latency)
                    overall.add(latency)
                    acked += 1
            return done

        begin = time.perf_counter()
        controller_begin = clock.monotonic()
        cpu = CpuMeter()  # (the node is in this process: its CPU is this process's)
        cpu.mark()
        next_sample = begin + SCALING_SAMPLE_SECONDS
        turn = 0
        while (now := time.perf_counter()) < begin + config.scaling_seconds:
            due = begin + turn * interval
            if due > now:
                await asyncio.sleep(due - now)
            sent = time.perf_counter()
            future = await writer.write_event_future(payload, routing_key=keys[turn % len(keys)])
            if future not in pending:
                pending.add(future)
            future.add_done_callback(acknowledged(sent))
            turn += 1
            if turn % 10 == 0:
                await bounded(writer.flush())  # (paced: one event's block goes out without waiting for more)
            if time.perf_counter() >= next_sample:
                summary = bucket.summary()
                samples.append(ScalingSample(
                    at_seconds=time.perf_counter() - begin,
                    controller_minutes=(clock.monotonic() - controller_begin) / 60.0,
                    segments=len(record.current.segments), events_acked=acked, p50_ms=summary.p50_ms,
                    p99_ms=summary.p99_ms))
                bucket, acked = LatencySamples(), 0
                next_sample += SCALING_SAMPLE_SECONDS
        await bounded(writer.flush())
        await bounded(writer.close())
        cpu.mark()
        window = cpu.window()
        scales = len(record.history.epochs) - 1
    finally:
        await bounded(client.close())
        await controller.stop()
        await server.stop()
    return Scaling(config.scaling_rate, SCALING_EVENT_BYTES, target, config.time_factor, samples,
                   overall.summary(), scales, window.others_percent)


def plot_scaling(scaling: Scaling, path: Path) -> Path:
    """Segment count and write latency (p50, p99) over the scaling run, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 4.5))
    axes = figure.add_subplot(1, 1, 1)
    xs = [s.at_seconds for s in scaling.samples]
    axes.step(xs, [s.segments for s in scaling.samples], where="post", color="tab:blue", label="segments")
    axes.set_xlabel(f"seconds (the controller's clock runs {scaling.time_factor:g}x faster)")
    axes.set_ylabel("segments", color="tab:blue")
    axes.set_ylim(bottom=0)
    latency = axes.twinx()
    for field, style in (("p50_ms", "-"), ("p99_ms", ":")):
        points = [(s.at_seconds, getattr(s, field)) for s in scaling.samples if getattr(s, field) is not None]
        if points:
            px, py = zip(*points, strict=True)
            latency.plot(px, py, style, color="tab:red", label=f"write {field[:3]}")
    latency.set_ylabel("write latency (ms)", color="tab:red")
    latency.set_yscale("log")
    lines = axes.get_legend_handles_labels()
    more = latency.get_legend_handles_labels()
    axes.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    figure.suptitle(f"{scaling.event_bytes:,}-byte events at {scaling.rate:g}/s, by_event_rate policy "
                    f"({scaling.policy_target * scaling.time_factor:g} real events/s per segment)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", metadata={"Software": None})
    return path


# --- the suite --------------------------------------------------------------------------------------------


async def _create_streams(port: int) -> None:
    from millstream.client import AsyncClient, ScalingPolicy

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    try:
        for segments in sorted({s for _, s, _ in THROUGHPUT}):
            await _create_stream(client, f"tp-{segments}", ScalingPolicy.fixed(segments))
        await _create_stream(client, "e2e", ScalingPolicy.fixed(READERS))
    finally:
        await bounded(client.close())


def run_streams(config: StreamsConfig, data_root: Path, progress: Progress | None = None, *,
                scaling: bool = True) -> StreamsReport:
    """Every measurement against one standalone node (started and stopped here), then the scaling run
    in this process; data in a temporary directory under ``data_root``, removed at the end."""
    started = time.perf_counter()
    machine = describe_machine(data_root, millstream.__version__)
    steps = Steps(len(THROUGHPUT) * config.repeat + 2, progress)
    repeats: list[list[Throughput]] = []
    end_to_end: list[EndToEnd] = []
    result: Scaling | None = None
    with tempfile.TemporaryDirectory(prefix="millstream-bench-streams-", dir=data_root) as temp:
        with standalone_server(Path(temp)) as server:
            port = server.port
            asyncio.run(_create_streams(port))
            for number in range(config.repeat):
                measured = []
                for name, segments, key_count in repeat_order(number):
                    steps.next(f"repeat {number + 1}: {name}")
                    quiet = wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, 0.5)
                    measured.append(asyncio.run(_throughput(port, name, segments, key_count, config, server.pid,
                                                            quiet)))
                repeats.append(measured)
            steps.next("end-to-end, 16 readers")
            end_to_end.append(asyncio.run(_end_to_end(port, config, server.pid)))
        shutil.rmtree(Path(temp) / "data", ignore_errors=True)
        if scaling:
            steps.next("scaling")
            result = asyncio.run(_scaling(Path(temp) / "scaling", config))
    steps.finish()
    medians = {name: median_or_none([m.events_per_second for r in repeats for m in r if m.name == name])
               for name, _, _ in THROUGHPUT}
    ratios = {segments: _ratio_over_nokeys(repeats, segments, ROUTING_KEYS)
              for segments in sorted({s for _, s, _ in THROUGHPUT})}
    hot = {segments: _ratio_over_nokeys(repeats, segments, HOT_KEYS)
           for segments in sorted({s for _, s, k in THROUGHPUT if k == HOT_KEYS})}
    return StreamsReport(SUITE_NAME, machine, config, repeats, ratios, hot, medians, end_to_end, result,
                         time.perf_counter() - started)


def _ratio_over_nokeys(repeats: list[list[Throughput]], segments: int, key_count: int) -> float | None:
    """The median over the repeats of events/s with ``key_count`` keys over events/s with none, at
    ``segments`` segments (each ratio within one repeat)."""
    per_repeat = []
    for measured in repeats:
        keyed = next(m for m in measured if m.segments == segments and m.key_count == key_count)
        plain = next(m for m in measured if m.segments == segments and m.key_count == 0)
        per_repeat.append(keyed.events_per_second / plain.events_per_second)
    return median_or_none(per_repeat)


def _fixed(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _cpu_per_event(report: StreamsReport, segments: int, key_count: int = ROUTING_KEYS) -> str:
    """CPU per event of the writer and of the server, ``key_count`` keys against none (medians over the
    repeats).

    Throughput swings by tens of percent between windows on a shared machine (the server's Tier-2
    flushes and the neighbours' load come and go), while the CPU each side spends per event is steady.
    The server cannot tell keyed events from keyless ones (keys never travel), so what keys cost is
    the writer's extra CPU per event -- the writer is the bottleneck of this measurement."""
    def per_event(keys: int, side: str) -> float | None:
        values = []
        for repeat in report.throughput:
            for m in repeat:
                cpu = m.window.client_cpu_seconds if side == "writer" else m.window.server_cpu_seconds
                if m.segments == segments and m.key_count == keys and m.events and cpu is not None:
                    values.append(1e6 * cpu / m.events)
        return median_or_none(values)

    writer_keys, writer_none = per_event(key_count, "writer"), per_event(0, "writer")
    server_keys, server_none = per_event(key_count, "server"), per_event(0, "server")
    share = None if writer_keys is None or not writer_none else writer_none / writer_keys
    return (f"CPU per event, keys / none: writer {_fixed(writer_keys, 2)} / {_fixed(writer_none, 2)} µs (events per "
            f"writer CPU second, keys / none = **{_fixed(share, 3)}**), server {_fixed(server_keys, 2)} / "
            f"{_fixed(server_none, 2)} µs")


def render_streams_markdown(report: StreamsReport, *, command: str = "millstream bench --suite streams",
                            figure: str | None = None) -> str:
    """The suite's section of BENCHMARKS.md, between its markers."""
    config = report.config
    lines = [SECTION_BEGIN, "", "## Streams: routing keys, a reader group's tail reads, auto-scaling", "",
             f"Generated by `{command}` ({report.wall_seconds:.0f} s) on {report.machine.cpu_count} CPUs "
             f"(millstream {report.machine.millstream_version}).  One writer, {EVENT_BYTES}-byte events, "
             f"{ROUTING_KEYS:,} random routing keys or none, against a standalone node in another process "
             f"(durable FileLog); {config.duration_seconds:g} s windows, medians of {config.repeat} interleaved "
             "repeats (keys and no keys first in turn).  The machine is shared: others' CPU is recorded for each "
             f"window.  The control: {HOT_KEYS} keys, whose objects stay in the CPU's cache -- the same routing "
             "work per event, without a cold key object to touch.", "",
             "| stream | routing keys | events/s (median) | per repeat | others' CPU % (median) |",
             "|---|---|---|---|---|"]
    for name, segments, key_count in THROUGHPUT:
        runs = [m for r in report.throughput for m in r if m.name == name]
        others = median_or_none([m.window.others_percent for m in runs if m.window.others_percent is not None])
        keys = ("none" if key_count == 0 else f"{key_count:,} random" if key_count == ROUTING_KEYS
                else f"{key_count:,} random (the control)")
        lines.append(f"| {segments} segment{'s' if segments > 1 else ''} | {keys} "
                     f"| {_fixed(report.medians[name])} | {', '.join(_fixed(m.events_per_second) for m in runs)} "
                     f"| {_fixed(others, 1)} |")
    lines.append("")
    for segments, ratio in report.keys_over_nokeys.items():
        verdict = "n/a" if ratio is None else ("within" if ratio >= 0.9 else "NOT within")
        keyed = [m.events_per_second for r in report.throughput for m in r
                 if m.segments == segments and m.key_count == ROUTING_KEYS]
        plain = [m.events_per_second for r in report.throughput for m in r if m.segments == segments and not m.keyed]
        of_medians = median_or_none(keyed) / median_or_none(plain) if keyed and plain else None  # type: ignore[operator]
        of_best = max(keyed) / max(plain) if keyed and plain else None
        lines.append(f"- {segments} segment(s): keys / no keys = **{_fixed(ratio, 3)}** (median of the per-repeat "
                     f"ratios: {verdict} the 10% budget); ratio of the medians {_fixed(of_medians, 3)}, of the "
                     f"least disturbed (best) windows {_fixed(of_best, 3)}; {_cpu_per_event(report, segments)}")
    for segments, ratio in report.hot_over_nokeys.items():
        lines.append(f"- {segments} segment(s), the control: {HOT_KEYS} keys / no keys = **{_fixed(ratio, 3)}**; "
                     f"{_cpu_per_event(report, segments, HOT_KEYS)}.  The control does the writer's work per "
                     f"event for {ROUTING_KEYS:,} keys, but its key objects stay in the CPU's cache: the gap between "
                     "the two ratios is what cold key objects cost (each is touched when the event is taken and "
                     "when its block is acknowledged), the rest of the keys' cost is the work.")
    lines.append("")
    for e2e in report.end_to_end:
        latency = e2e.latency
        lines += [f"Tail reads: {e2e.readers} readers in a group over a {e2e.readers}-segment stream, one writer "
                  f"at {e2e.rate:,.0f} keyed events/s: {e2e.events_read:,} of {e2e.events_written:,} events read "
                  f"in the window; end-to-end latency (write call to read) p50 {_fixed(latency.p50_ms, 2)} ms, "
                  f"p95 {_fixed(latency.p95_ms, 2)} ms, p99 {_fixed(latency.p99_ms, 2)} ms, max "
                  f"{_fixed(latency.max_ms, 2)} ms (others' CPU {_fixed(e2e.window.others_percent, 1)} %).", ""]
    if report.scaling is not None:
        s = report.scaling
        counts = [sample.segments for sample in s.samples]
        lines += [f"Scaling: {s.event_bytes:,}-byte events at {s.rate:g}/s for {config.scaling_seconds:g} s into a "
                  f"stream with `by_event_rate` (split above {s.policy_target * s.time_factor:g} real events/s per "
                  f"segment, scale factor 2, min 1 segment); the controller's clock ran {s.time_factor:g}x faster "
                  f"than real time, so its 2-20 minute averaging windows and 10 minute cooldown pass in seconds. "
                  f"Segments: {' -> '.join(str(c) for i, c in enumerate(counts) if i == 0 or c != counts[i - 1])} "
                  f"({s.scales} scale(s)); write latency p50 {_fixed(s.latency.p50_ms, 2)} ms, p99 "
                  f"{_fixed(s.latency.p99_ms, 2)} ms over the run (others' CPU {_fixed(s.others_percent, 1)} %)."]
        if figure is not None:
            lines += ["", f"![segment count and write latency over the scaling run]({figure})"]
        lines.append("")
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def replace_section(document: str, section: str) -> str:
    """``document`` with its streams section replaced by ``section`` (appended if it has none)."""
    return _suite.replace_section(document, section, SECTION_BEGIN, SECTION_END)


def section_of(document: str) -> str | None:
    """The streams section of ``document`` (markers included), if it has one -- for a writer of the rest
    of the file (the peers harness) to keep it."""
    return _suite.section_of(document, SECTION_BEGIN, SECTION_END)


def write_streams_json(report: StreamsReport, output_dir: Path) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / f"{SUITE_NAME}.json"
    path.write_text(json.dumps(attrs.asdict(report, value_serializer=_json_value), indent=1), encoding="utf-8")
    return path


def _json_value(_instance: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return value

