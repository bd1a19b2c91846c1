"""The tiering suite: what Tier 2 costs ingestion, and how fast a reader far behind the tail catches up.

Two questions, each answered by a ratio of figures measured in the same repeat:

1. *The cost of tiering.*  Pipelined 10 KB appends to one segment container on a durable FileLog,
   once without Tier 2 (everything stays in memory and the log) and once with a ``FileChunkStorage``
   on the same disk, flushing as it goes: ingestion MB/s with flushing on ÷ off.
2. *Catch-up reads.*  A segment of ``catch_up_bytes`` is written and flushed, its blocks evicted (the
   cache is small) and the page cache dropped for its chunk files; then a reader reads it from start
   to end while a tail appender keeps appending to another segment.  Catch-up MB/s ÷ a raw Python
   sequential read (1 MiB ``os.read`` calls) of a file of the same size, also dropped from the page
   cache.  The tail appender's p95 latency is reported with and without the catch-up reader, to show
   that the reader does not disturb it.

Every measurement is bounded in time and bytes; data goes to a temporary directory removed at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench import _suite
from bench._stats import Latency, LatencySamples, median_or_none
from bench._suite import Progress, Steps, fixed
from bench._system import MachineDescription, QuietWait, describe_machine, wait_until_quiet
from millstream.segmentstore.container import SegmentContainer, StorageSettings
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog

__all__ = ["TieringConfig", "TieringReport", "render_tiering_markdown", "run_tiering", "write_tiering_json"]

SUITE_NAME: Final = "tiering"
RECORD_BYTES: Final = 10_000
WINDOW: Final = 64
READ_BYTES: Final = 2 * 1024 * 1024
#: One ingestion measurement writes at most this much.
INGEST_BYTES_MAX: Final = 1024 * 1024 * 1024
#: The tail appender during catch-up: one 1 KB append at a time.
TAIL_RECORD_BYTES: Final = 1_000


@attrs.frozen
class TieringConfig:
    duration_seconds: float = 3.0
    warmup_seconds: float = 0.5
    repeat: int = 3
    catch_up_bytes: int = 128 * 1024 * 1024
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 20.0


@attrs.frozen
class IngestRun:
    tiering: bool
    megabytes_per_second: float
    appends: int
    flushed_megabytes: float
    log_truncations: int


@attrs.frozen
class CatchUpRun:
    megabytes: float
    catch_up_megabytes_per_second: float
    raw_megabytes_per_second: float
    ratio: float
    tier_two_reads: int
    tail_appends_during: int
    tail_latency_during: Latency
    tail_latency_alone: Latency


@attrs.frozen
class Repeat:
    ingest_off: IngestRun
    ingest_on: IngestRun
    catch_up: CatchUpRun
    quiet: list[QuietWait]


@attrs.frozen
class TieringReport:
    suite: str
    machine: MachineDescription
    config: TieringConfig
    repeats: list[Repeat]
    ingest_off_mb_s: float | None
    ingest_on_mb_s: float | None
    tiering_cost_ratio: float | None
    catch_up_mb_s: float | None
    raw_read_mb_s: float | None
    catch_up_ratio: float | None
    tail_p95_alone_ms: float | None
    tail_p95_during_ms: float | None


# --- ingestion -------------------------------------------------------------------------------------


async def _pipelined(container: SegmentContainer, name: str, seconds: float, bytes_max: int,
                     samples: LatencySamples | None = None, record_bytes: int = RECORD_BYTES,
                     window: int = WINDOW) -> int:
    """Keep ``window`` appends in flight for ``seconds`` (or ``bytes_max``); return appends acknowledged."""
    payload = bytes(record_bytes)
    deadline = time.perf_counter() + seconds
    done = 0

    async def one_lane() -> None:
        nonlocal done
        while time.perf_counter() < deadline and done * record_bytes < bytes_max:
            started = time.perf_counter()
            await container.append(name, payload)
            if samples is not None:
                samples.add(time.perf_counter() - started)
            done += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(window):
            group.create_task(one_lane())
    return done


async def _ingest(directory: Path, tiering: bool, config: TieringConfig) -> IngestRun:
    storage = FileChunkStorage(directory / "lts") if tiering else None
    settings = StorageSettings(cache_bytes_max=64 * 1024 * 1024, flush_age_seconds=0.5)
    try:
        async with SegmentContainer(0, FileLog(directory / "log"), chunk_storage=storage,
                                    storage_settings=settings, checkpoint_frame_count=50) as container:
            await container.create_segment("ingest")
            await _pipelined(container, "ingest", config.warmup_seconds, INGEST_BYTES_MAX)
            started = time.perf_counter()
            appends = await _pipelined(container, "ingest", config.duration_seconds, INGEST_BYTES_MAX)
            seconds = time.perf_counter() - started
            writer = container.storage_writer
            return IngestRun(tiering, appends * RECORD_BYTES / seconds / 1e6, appends,
                             (writer.flushed_bytes / 1e6) if writer else 0.0, writer.log_truncations if writer else 0)
    finally:
        if storage is not None:
            await storage.close()


# --- catch-up reads --------------------------------------------------------------------------------


def _drop_page_cache(root: Path) -> None:
    """Write back and drop from the page cache every file at or under ``root`` (so reads hit the disk)."""
    for path in [root] if root.is_file() else root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _raw_sequential_read(directory: Path, size: int) -> float:
    """MB/s of reading a ``size``-byte file in 1 MiB ``os.read`` calls, not from the page cache."""
    path = directory / "raw-read"
    block = os.urandom(1024 * 1024)
    with open(path, "wb") as file:
        for _ in range(size // len(block)):
            file.write(block)
    _drop_page_cache(directory / "raw-read")
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.perf_counter()
        total = 0
        while chunk := os.read(fd, len(block)):
            total += len(chunk)
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return total / seconds / 1e6


async def _catch_up(directory: Path, config: TieringConfig) -> tuple[CatchUpRun, float]:
    storage = FileChunkStorage(directory / "lts")
    size = config.catch_up_bytes
    # A cache far smaller than the segment: nearly all of it is evicted and must come from Tier 2.
    settings = StorageSettings(cache_bytes_max=min(8 * 1024 * 1024, size // 8), flush_age_seconds=0.2)
    try:
        async with SegmentContainer(0, FileLog(directory / "log"), chunk_storage=storage,
                                    storage_settings=settings) as container:
            await container.create_segment("cold")
            await container.create_segment("hot")
            await _pipelined(container, "cold", 600.0, size)
            await container.seal("cold")
            writer = container.storage_writer
            assert writer is not None
            deadline = time.perf_counter() + 120.0
            while writer.unflushed_bytes > 0 and time.perf_counter() < deadline:
                await writer.wait_for_progress(1.0)
            container.read_index.evict()
            _drop_page_cache(directory / "lts")
            alone = LatencySamples()
            await _pipelined(container, "hot", min(1.0, config.duration_seconds), size, alone, TAIL_RECORD_BYTES, 1)
            during = LatencySamples()
            reads_before = container.read_index.tier_two_reads
            stop = asyncio.Event()

            async def tail() -> int:
                count = 0
                payload = bytes(TAIL_RECORD_BYTES)
                while not stop.is_set():
                    started = time.perf_counter()
                    await container.append("hot", payload)
                    during.add(time.perf_counter() - started)
                    count += 1
                return count

            tail_task = asyncio.get_running_loop().create_task(tail())
            started = time.perf_counter()
            offset, length = 0, container.get_info("cold").length
            while offset < length:
                result = await container.read("cold", offset, min(READ_BYTES, length - offset))
                offset += len(result.data)
            seconds = time.perf_counter() - started
            stop.set()
            tail_appends = await tail_task
            megabytes = length / 1e6
            run = CatchUpRun(megabytes, megabytes / seconds, 0.0, 0.0,
                             container.read_index.tier_two_reads - reads_before, tail_appends,
                             during.summary(), alone.summary())
    finally:
        await storage.close()
    raw = _raw_sequential_read(directory, size)
    return attrs.evolve(run, raw_megabytes_per_second=raw, ratio=run.catch_up_megabytes_per_second / raw), raw


# --- the suite ---------------------------------------------------------------------------------------


def run_tiering(config: TieringConfig, data_root: Path, progress: Progress | None = None) -> TieringReport:
    machine = describe_machine(data_root, millstream.__version__)
    repeats = []
    steps = Steps(3 * config.repeat, progress)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-tiering-", dir=data_root) as temp:
        root = Path(temp)
        for number in range(config.repeat):
            quiet = []
            results: dict[str, Any] = {}
            for what in ("ingest-off", "ingest-on", "catch-up"):
                steps.next(f"repeat {number + 1}: {what}")
                quiet.append(wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, 0.5))
                directory = root / f"{number}-{what}"
                directory.mkdir()
                if what == "catch-up":
                    results[what] = asyncio.run(_catch_up(directory, config))[0]
                else:
                    results[what] = asyncio.run(_ingest(directory, what == "ingest-on", config))
                shutil.rmtree(directory)
            repeats.append(Repeat(results["ingest-off"], results["ingest-on"], results["catch-up"], quiet))
        steps.finish()

    return TieringReport(
        suite=SUITE_NAME, machine=machine, config=config, repeats=repeats,
        ingest_off_mb_s=median_or_none([r.ingest_off.megabytes_per_second for r in repeats]),
        ingest_on_mb_s=median_or_none([r.ingest_on.megabytes_per_second for r in repeats]),
        tiering_cost_ratio=median_or_none([r.ingest_on.megabytes_per_second / r.ingest_off.megabytes_per_second
                                   for r in repeats]),
        catch_up_mb_s=median_or_none([r.catch_up.catch_up_megabytes_per_second for r in repeats]),
        raw_read_mb_s=median_or_none([r.catch_up.raw_megabytes_per_second for r in repeats]),
        catch_up_ratio=median_or_none([r.catch_up.ratio for r in repeats]),
        tail_p95_alone_ms=median_or_none([r.catch_up.tail_latency_alone.p95_ms for r in repeats]),
        tail_p95_during_ms=median_or_none([r.catch_up.tail_latency_during.p95_ms for r in repeats]),
    )


def render_tiering_markdown(report: TieringReport) -> str:
    machine, config = report.machine, report.config
    lines = [
        f"## millstream bench --suite {report.suite}",
        "",
        f"{machine.date_utc} · millstream {machine.millstream_version} · {machine.cpu_count} CPUs "
        f"({machine.cpu_model}) · data on {machine.data_dir_filesystem.type}  ",
        f"Medians of {config.repeat} repeat(s); ingestion {config.duration_seconds:g} s of pipelined "
        f"{RECORD_BYTES:,} B appends ({WINDOW} in flight); catch-up over {config.catch_up_bytes / 1e6:,.0f} MB.",
        "",
        "| measurement | MB/s | ratio |",
        "|---|---|---|",
        f"| ingestion, Tier 2 off | {fixed(report.ingest_off_mb_s, 1)} | |",
        f"| ingestion, Tier 2 on (flushing) | {fixed(report.ingest_on_mb_s, 1)} | "
        f"{fixed(report.tiering_cost_ratio, 2)} (on ÷ off) |",
        f"| catch-up read from Tier 2 while appends continue | {fixed(report.catch_up_mb_s, 1)} | "
        f"{fixed(report.catch_up_ratio, 2)} (÷ raw read) |",
        f"| raw sequential read, 1 MiB reads, page cache dropped | {fixed(report.raw_read_mb_s, 1)} | |",
        "",
        f"Tail appender p95 (1 KB, one at a time): {fixed(report.tail_p95_alone_ms, 3)} ms alone, "
        f"{fixed(report.tail_p95_during_ms, 3)} ms during the catch-up read.",
    ]
    return "\n".join(lines) + "\n"


def write_tiering_json(report: TieringReport, output_dir: Path) -> Path:
    """The whole report, raw per-repeat results included, as ``tiering-<UTC date>.json``."""
    return _suite.write_json(report, output_dir)
