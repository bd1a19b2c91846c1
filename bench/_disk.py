"""The physical limit, measured in plain Python on the same disk in the same run.

Two loops, each as little as a durable log can do and stay durable:

* **One fdatasync after a small write** (``measure_fdatasync``): the floor for a lone appender's
  acknowledgement latency -- no store can acknowledge a durable write sooner than one sync.
* **Group commit** (``measure_group_commit``): per batch, ``b"".join`` of N ready-made records,
  ``os.write`` of the result to a file opened with ``O_APPEND`` (so the file grows, as a ledger does)
  and one ``os.fdatasync``.  This is the ceiling for a store that puts N records into each sync:
  millstream's appends/s divided by this loop's records/s at the *same* N is the share of the disk's
  capacity the store delivers.  No framing and no checksums: those are the store's costs.

Both loops are bounded by a deadline, a count and bytes written, and take their own warm-up first
(the first syncs on a new file also write its metadata).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

import attrs

from bench._stats import Latency, LatencySamples
from bench._system import CpuSample, CpuUsage, QuietWait

__all__ = ["FdatasyncRun", "GroupCommitRun", "measure_fdatasync", "measure_group_commit"]

#: Syncs one fdatasync probe makes at most (a fast disk does about 10 k/s).
_FDATASYNC_COUNT_MAX: Final = 100_000

#: Batches one group-commit run writes at most.
_BATCH_COUNT_MAX: Final = 1_000_000

_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


@attrs.frozen
class FdatasyncRun:
    """One ``fdatasync`` after each ``write_bytes`` write: the latency of the sync call alone."""

    write_bytes: int
    syncs: int
    seconds: float
    syncs_per_second: float
    latency: Latency
    cpu: CpuUsage
    quiet: QuietWait


@attrs.frozen
class GroupCommitRun:
    """``batch_records`` records of ``record_bytes`` per write + fdatasync; latency is per batch."""

    record_bytes: int
    batch_records: int
    batches: int
    records: int
    seconds: float
    records_per_second: float
    megabytes_per_second: float
    batch_latency: Latency
    own_cpu_us_per_record: float | None  # this process's CPU (mostly the kernel's, in fdatasync) per record
    cpu: CpuUsage
    quiet: QuietWait


def measure_fdatasync(directory: Path, *, write_bytes: int, warmup_seconds: float, duration_seconds: float,
                      quiet: QuietWait) -> FdatasyncRun:
    """Write ``write_bytes``, then time ``os.fdatasync`` alone; repeat for ``duration_seconds``."""
    record = b"\x5a" * write_bytes
    clock = time.perf_counter
    fd = os.open(directory / "fdatasync.probe", _FILE_FLAGS, 0o600)
    try:
        _sync_until(fd, record, clock() + warmup_seconds, _FDATASYNC_COUNT_MAX, LatencySamples())
        samples = LatencySamples()
        before = CpuSample.now()
        syncs = _sync_until(fd, record, before.at_seconds + duration_seconds, _FDATASYNC_COUNT_MAX, samples)
        cpu = CpuUsage.between(before, CpuSample.now())
    finally:
        os.close(fd)
    return FdatasyncRun(write_bytes=write_bytes, syncs=syncs, seconds=cpu.wall_seconds,
                        syncs_per_second=syncs / cpu.wall_seconds, latency=samples.summary(), cpu=cpu, quiet=quiet)


def _sync_until(fd: int, record: bytes, deadline: float, count_max: int, samples: LatencySamples) -> int:
    clock = time.perf_counter
    count = 0
    while count < count_max and clock() < deadline:
        _write_all(fd, record)
        started = clock()
        os.fdatasync(fd)
        samples.add(clock() - started)
        count += 1
    return count


def measure_group_commit(directory: Path, *, record_bytes: int, batch_records: int, warmup_seconds: float,
                         duration_seconds: float, bytes_max: int, quiet: QuietWait) -> GroupCommitRun:
    """Group commit at ``batch_records`` per fdatasync for ``duration_seconds`` (or ``bytes_max``)."""
    batch = [b"\xa5" * record_bytes] * batch_records
    batch_bytes = record_bytes * batch_records
    batches_max = max(1, min(_BATCH_COUNT_MAX, bytes_max // max(1, batch_bytes)))
    clock = time.perf_counter
    fd = os.open(directory / "group-commit.log", _FILE_FLAGS, 0o600)
    try:
        _commit_until(fd, batch, clock() + warmup_seconds, max(1, batches_max // 10), LatencySamples())
        samples = LatencySamples()
        before = CpuSample.now()
        batches = _commit_until(fd, batch, before.at_seconds + duration_seconds, batches_max, samples)
        cpu = CpuUsage.between(before, CpuSample.now())
    finally:
        os.close(fd)
    records = batches * batch_records
    return GroupCommitRun(
        record_bytes=record_bytes, batch_records=batch_records, batches=batches, records=records,
        seconds=cpu.wall_seconds, records_per_second=records / cpu.wall_seconds,
        megabytes_per_second=records * record_bytes / cpu.wall_seconds / 1e6,
        batch_latency=samples.summary(),
        own_cpu_us_per_record=1e6 * cpu.own_cpu_seconds / records if records else None, cpu=cpu, quiet=quiet,
    )


def _commit_until(fd: int, batch: list[bytes], deadline: float, count_max: int, samples: LatencySamples) -> int:
    clock = time.perf_counter
    join = b"".join
    count = 0
    while count < count_max and clock() < deadline:
        started = clock()
        _write_all(fd, join(batch))
        os.fdatasync(fd)
        samples.add(clock() - started)
        count += 1
    return count


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a regular file rarely takes less, but may)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
