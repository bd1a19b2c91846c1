"""The machine a benchmark runs on: what it is, how busy it is, and where to put the data.

This module is the benchmark's window onto the (shared, noisy) machine, following
``reference/performance-baselines.md``: a measurement is only worth something if the machine was quiet
when it started and if we know how much CPU *other* processes took while it ran.

* CPU accounting reads the first line of ``/proc/stat`` (ticks of all CPUs, all processes) and
  ``os.times()`` (this process, every thread -- the FileLog writer thread included).  What other
  processes used is the machine's busy time minus ours.  ``iowait`` counts as idle: a CPU waiting for
  our ``fdatasync`` is not doing anyone else's work.
* Quiet means at least ``idle_percent_min`` of the machine idle over one probe interval.  The wait for
  it is bounded; a benchmark that never saw quiet still runs, and says so in its report.

Real time is read directly here (``time.perf_counter``, ``time.sleep``): measuring the real machine is
this module's whole purpose, so an injected clock would have nothing to stand in for.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "CpuSample",
    "CpuUsage",
    "Filesystem",
    "MachineDescription",
    "QuietWait",
    "choose_data_root",
    "describe_machine",
    "filesystem_of",
    "wait_until_quiet",
]

_PROC_STAT: Final = Path("/proc/stat")
_PROC_MOUNTS: Final = Path("/proc/mounts")
_PROC_CPUINFO: Final = Path("/proc/cpuinfo")

#: Filesystems that keep data in memory: fdatasync there costs nothing, so a write-path benchmark on
#: one measures Python, not durability.
MEMORY_FILESYSTEMS: Final = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})

#: ``git describe`` of the source tree, when it is a checkout; a slow or missing git is not waited for.
_GIT_TIMEOUT_SECONDS: Final = 5.0


@attrs.frozen
class CpuSample:
    """One reading of the machine's and this process's CPU counters, and the time it was taken."""

    at_seconds: float  # time.perf_counter()
    busy_ticks: int  # all CPUs, all processes: user + nice + system + irq + softirq + steal
    total_ticks: int  # the same plus idle and iowait
    own_cpu_seconds: float  # this process, all threads: user + system
    #: Of ``busy_ticks``, the time the hypervisor ran something else on this machine's virtual CPUs
    #: while they had work: other tenants of the host, invisible from inside but for this count.
    steal_ticks: int = 0

    @classmethod
    def now(cls) -> CpuSample:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()
        if fields[0] != "cpu" or len(fields) < 9:
            raise RuntimeError(f"{_PROC_STAT}: unexpected first line {fields!r}")
        user, nice, system, idle, iowait, irq, softirq, steal = (int(value) for value in fields[1:9])
        times = os.times()
        return cls(
            at_seconds=time.perf_counter(),
            busy_ticks=user + nice + system + irq + softirq + steal,
            total_ticks=user + nice + system + idle + iowait + irq + softirq + steal,
            own_cpu_seconds=times.user + times.system,
            steal_ticks=steal,
        )


@attrs.frozen
class CpuUsage:
    """CPU used between two samples.  Percentages are of the whole machine (all CPUs)."""

    wall_seconds: float
    own_cpu_seconds: float
    others_cpu_seconds: float
    others_percent: float
    idle_percent: float
    #: The part of ``others_percent`` that was the hypervisor's steal (other virtual machines).
    steal_percent: float = 0.0

    @classmethod
    def between(cls, start: CpuSample, end: CpuSample) -> CpuUsage:
        ticks_per_second = os.sysconf("SC_CLK_TCK")
        wall = max(end.at_seconds - start.at_seconds, 1e-9)
        total_ticks = max(end.total_ticks - start.total_ticks, 1)
        busy_ticks = end.busy_ticks - start.busy_ticks
        own = end.own_cpu_seconds - start.own_cpu_seconds
        # Ticks are 10 ms coarse, so over a short window ours can exceed the machine's; never negative.
        others = max(0.0, busy_ticks / ticks_per_second - own)
        capacity = wall * (os.cpu_count() or 1)
        return cls(
            wall_seconds=wall,
            own_cpu_seconds=own,
            others_cpu_seconds=others,
            others_percent=100.0 * others / capacity,
            idle_percent=100.0 * (total_ticks - busy_ticks) / total_ticks,
            steal_percent=min(100.0 * others / capacity,
                              100.0 * (end.steal_ticks - start.steal_ticks) / ticks_per_second / capacity),
        )


@attrs.frozen
class QuietWait:
    """How the wait for a quiet machine before one measurement ended."""

    quiet: bool  # False: gave up after the timeout (or did not look: timeout 0) and measured anyway
    waited_seconds: float
    idle_percent: float | None  # of the last probe; None if none was taken


def wait_until_quiet(idle_percent_min: float, timeout_seconds: float, probe_seconds: float) -> QuietWait:
    """Sleep in probes of ``probe_seconds`` until one probe finds the machine at least
    ``idle_percent_min`` idle, for at most about ``timeout_seconds`` (0: do not wait at all)."""
    started = time.perf_counter()
    idle: float | None = None
    if timeout_seconds <= 0:
        return QuietWait(quiet=False, waited_seconds=0.0, idle_percent=None)
    probes_max = max(1, int(timeout_seconds / probe_seconds))
    for _ in range(probes_max):
        before = CpuSample.now()
        time.sleep(probe_seconds)
        idle = CpuUsage.between(before, CpuSample.now()).idle_percent
        if idle >= idle_percent_min:
            return QuietWait(quiet=True, waited_seconds=time.perf_counter() - started, idle_percent=idle)
    return QuietWait(quiet=False, waited_seconds=time.perf_counter() - started, idle_percent=idle)


@attrs.frozen
class Filesystem:
    """The mounted filesystem a path lies on."""

    type: str
    source: str
    mount_point: str

    @property
    def in_memory(self) -> bool:
        return self.type in MEMORY_FILESYSTEMS


def filesystem_of(path: Path) -> Filesystem:
    """The filesystem holding ``path`` (the longest mount point that contains it, per /proc/mounts)."""
    resolved = str(path.resolve())
    best = Filesystem(type="unknown", source="unknown", mount_point="/")
    best_length = -1
    try:
        lines = _PROC_MOUNTS.read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        source, mount_point, fs_type = (_unescape_mount_field(field) for field in fields[:3])
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= best_length:  # later mounts over the same point win
            best, best_length = Filesystem(type=fs_type, source=source, mount_point=mount_point), len(mount_point)
    return best


def _unescape_mount_field(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def choose_data_root(requested: Path | None, temp_dir: Path, working_dir: Path) -> tuple[Path, str]:
    """Where the benchmark's data directories go, and why there.

    ``requested`` (``--data-dir``) wins.  Otherwise the system temp directory, unless it is kept in
    memory (tmpfs on many distributions), where fdatasync is free and the benchmark would be
    meaningless; then the working directory.
    """
    if requested is not None:
        return requested, "--data-dir"
    if not filesystem_of(temp_dir).in_memory:
        return temp_dir, "the temp directory is on a disk"
    return working_dir, f"{temp_dir} is in memory ({filesystem_of(temp_dir).type}), so the working directory"


@attrs.frozen
class MachineDescription:
    """What the report says about where it was measured."""

    cpu_count: int
    cpu_model: str
    kernel: str
    python: str
    millstream_version: str
    source_revision: str | None
    data_dir: str
    data_dir_filesystem: Filesystem
    date_utc: str


def describe_machine(data_dir: Path, millstream_version: str) -> MachineDescription:
    return MachineDescription(
        cpu_count=os.cpu_count() or 1,
        cpu_model=_cpu_model(),
        kernel=f"{platform.system()} {platform.release()}",
        python=f"{platform.python_implementation()} {platform.python_version()}",
        millstream_version=millstream_version,
        source_revision=_source_revision(),
        data_dir=str(data_dir),
        data_dir_filesystem=filesystem_of(data_dir),
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _cpu_model() -> str:
    try:
        for line in _PROC_CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _source_revision() -> str | None:
    """``git describe --always --dirty`` of the tree millstream was imported from, if it is a checkout:
    a report of an edited tree should say so."""
    package_dir = Path(sys.modules["millstream"].__file__ or ".").parent
    try:
        completed = subprocess.run(
            ["git", "-C", str(package_dir), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=_GIT_TIMEOUT_SECONDS, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout.strip() or None if completed.returncode == 0 else None
