"""The disk's physical limit, measured in the same run as the systems it bounds.

Three probes, each bounded in time, on the same filesystem as the servers' data:

* one ``fdatasync`` after a 100-byte write (``_disk.measure_fdatasync``): the floor for any durable
  acknowledgement;
* the raw Python group-commit loop at **1 MiB writes** (``_disk.measure_group_commit`` with one
  1 MiB record per write + fdatasync): issue 9's yardstick for large events -- millstream's MB/s with
  10 KB events over 16 segments should reach half of it;
* ``fio``, if installed (Debian ``fio``): sequential 1 MiB writes and 4 KiB writes, each followed by
  ``fdatasync`` (``--ioengine=sync --fdatasync=1``), as a second opinion that is not Python.  A
  missing fio is reported as such, not an error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import attrs

from bench._disk import FdatasyncRun, GroupCommitRun, measure_fdatasync, measure_group_commit
from bench._system import QuietWait
from bench.limits import BENCH_FIO_GRACE_SECONDS
from millstream.limits import MIB

__all__ = ["DiskLimit", "FioRun", "measure_disk_limit", "measure_raw_loop", "parse_fio_output", "run_fio"]

#: Bytes one raw-loop probe writes at most.
_PROBE_BYTES_MAX = 1024 * MIB
#: The file fio lays out and rewrites (it writes it sequentially, again and again, for --runtime).
_FIO_FILE_BYTES = 256 * MIB


@attrs.frozen
class FioRun:
    block_bytes: int
    megabytes_per_second: float
    writes_per_second: float
    sync_p50_ms: float | None
    sync_p95_ms: float | None
    command: str


@attrs.frozen
class DiskLimit:
    fdatasync: FdatasyncRun
    group_commit_1mib: GroupCommitRun
    fio: tuple[FioRun, ...]
    fio_note: str  # what fio said, or why it did not run


def measure_disk_limit(directory: Path, *, seconds: float, use_fio: bool, quiet: QuietWait) -> DiskLimit:
    """Every probe, in ``directory`` (which must exist; the probes' files are removed afterwards)."""
    warmup = min(0.5, seconds / 4)
    fdatasync = measure_fdatasync(directory, write_bytes=100, warmup_seconds=warmup, duration_seconds=seconds,
                                  quiet=quiet)
    group_commit = measure_raw_loop(directory, seconds=seconds, quiet=quiet)
    (directory / "fdatasync.probe").unlink(missing_ok=True)
    fio_runs: list[FioRun] = []
    note = "fio not installed (apt-get install -y fio)"
    fio = shutil.which("fio")
    if not use_fio:
        note = "fio not run (--no-fio)"
    elif fio is not None:
        try:
            fio_runs = [run_fio(fio, directory, block_bytes=size, seconds=seconds) for size in (MIB, 4096)]
            note = "fio ran"
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            note = f"fio failed: {error}"
    return DiskLimit(fdatasync=fdatasync, group_commit_1mib=group_commit, fio=tuple(fio_runs), fio_note=note)


def run_fio(fio: str, directory: Path, *, block_bytes: int, seconds: float) -> FioRun:
    """One fio job: sequential writes of ``block_bytes``, fdatasync after each, for ``seconds``."""
    command = [fio, "--name=millstream-disk-limit", f"--directory={directory}", "--rw=write",
               f"--bs={block_bytes}", f"--size={_FIO_FILE_BYTES}", "--ioengine=sync", "--fdatasync=1",
               f"--runtime={max(1, round(seconds))}", "--time_based", "--output-format=json", "--unlink=1"]
    completed = subprocess.run(command, capture_output=True, text=True, check=False,
                               timeout=seconds + BENCH_FIO_GRACE_SECONDS)
    if completed.returncode != 0:
        raise ValueError(f"exit {completed.returncode}: {completed.stderr.strip()[:300]}")
    run = parse_fio_output(completed.stdout, block_bytes)
    return attrs.evolve(run, command=" ".join(["fio", *command[1:]]).replace(str(directory), "DATA"))


def parse_fio_output(text: str, block_bytes: int) -> FioRun:
    """The figures of fio's ``--output-format=json`` (fio may print notices before the JSON)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    document: dict[str, Any] = json.loads(text[start:])
    job = document["jobs"][0]
    write = job["write"]
    percentiles = job.get("sync", {}).get("lat_ns", {}).get("percentile", {})
    return FioRun(
        block_bytes=block_bytes,
        megabytes_per_second=float(write["bw_bytes"]) / 1e6,
        writes_per_second=float(write["iops"]),
        sync_p50_ms=_percentile_ms(percentiles, "50.000000"),
        sync_p95_ms=_percentile_ms(percentiles, "95.000000"),
        command="",
    )


def _percentile_ms(percentiles: dict[str, Any], key: str) -> float | None:
    value = percentiles.get(key)
    return None if value is None else float(value) / 1e6


def measure_raw_loop(directory: Path, *, seconds: float, quiet: QuietWait) -> GroupCommitRun:
    """The raw group-commit loop at 1 MiB writes alone, in ``directory`` (its file removed afterwards):
    the yardstick of the MB/s targets, probed again before each repeat that judges one."""
    try:
        return measure_group_commit(directory, record_bytes=MIB, batch_records=1, warmup_seconds=min(0.5, seconds / 4),
                                    duration_seconds=seconds, bytes_max=_PROBE_BYTES_MAX, quiet=quiet)
    finally:
        (directory / "group-commit.log").unlink(missing_ok=True)
