"""The write-path report as Markdown (the table the issue asks for; the JSON file has everything)."""

from __future__ import annotations

from millstream.bench.write_path import WritePathReport

__all__ = ["render_markdown"]

_MISSING = "—"


def _count(value: float | None) -> str:
    return _MISSING if value is None else f"{value:,.0f}"


def _fixed(value: float | None, digits: int) -> str:
    return _MISSING if value is None else f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render_markdown(report: WritePathReport) -> str:
    """The report: a header naming the machine and run, the scenario table, the disk, the targets."""
    return "\n".join([*_header(report), "", *_scenarios(report), "", *_disk(report), "", *_targets(report)]) + "\n"


def _header(report: WritePathReport) -> list[str]:
    machine, config = report.machine, report.config
    revision = f" ({machine.source_revision})" if machine.source_revision else ""
    filesystem = machine.data_dir_filesystem
    return [
        f"## millstream bench --suite {report.suite}",
        "",
        f"{machine.date_utc} · millstream {machine.millstream_version}{revision} · {machine.cpu_count} CPUs "
        f"({machine.cpu_model}) · {machine.kernel} · {machine.python}  ",
        f"Data in `{machine.data_dir}` on {filesystem.type} ({filesystem.source} at {filesystem.mount_point}): "
        f"{report.data_root_reason}.  ",
        f"Medians of {config.repeat} repeat(s); each measurement {config.duration_seconds:g} s after a "
        f"{config.warmup_seconds:g} s warm-up.  Quiet waits (≥ {config.quiet_idle_percent_min:g}% idle, up to "
        f"{config.quiet_timeout_seconds:g} s): {report.quiet_waits}, of which {report.quiet_waits_timed_out} "
        "timed out.",
    ]


def _scenarios(report: WritePathReport) -> list[str]:
    header = ["scenario", "appenders", "appends/s", "MB/s", "p50 ms", "p95 ms", "p99 ms", "appends/frame",
              "appends/fdatasync", "CPU µs/append", "raw loop records/s (same batch)", "raw CPU µs/record",
              "container ÷ raw", "others' CPU % (max)"]
    rows = [
        [s.scenario, s.driver, _count(s.appends_per_second), _fixed(s.megabytes_per_second, 1),
         _fixed(s.p50_ms, 3), _fixed(s.p95_ms, 3), _fixed(s.p99_ms, 3), _fixed(s.appends_per_frame, 1),
         _fixed(s.appends_per_fdatasync, 1), _fixed(s.own_cpu_us_per_append, 1),
         f"{_count(s.raw_records_per_second)} (x {_count(s.raw_batch_records)})",
         _fixed(s.raw_own_cpu_us_per_record, 1), _fixed(s.throughput_ratio, 2), _fixed(s.others_cpu_percent_max, 1)]
        for s in report.scenarios
    ]
    return [
        "### The container against the raw group-commit loop",
        "",
        *_table(header, rows),
        "",
        "appends/frame and appends/fdatasync: what the processor and the FileLog batched (counted outside the "
        "container).  The raw loop writes records of the same size, as many per `os.write` + `os.fdatasync` as "
        "the container put into one fdatasync.  CPU µs: this process (every thread, user + kernel) per append or "
        "record.  container ÷ raw: appends/s ÷ records/s, the median of per-repeat ratios.  Others' CPU: what "
        "other processes used during the measurement, % of the whole machine.",
    ]


def _disk(report: WritePathReport) -> list[str]:
    sync = report.fdatasync
    rows = [[f"one `fdatasync` after a {sync.write_bytes} B write", _count(sync.syncs_per_second),
             _fixed(sync.p50_ms, 3), _fixed(sync.p95_ms, 3), _fixed(sync.p99_ms, 3)]]
    return ["### The disk, same run", "", *_table(["probe", "syncs/s", "p50 ms", "p95 ms", "p99 ms"], rows)]


def _targets(report: WritePathReport) -> list[str]:
    rows = []
    for target in report.targets:
        bound = _MISSING if target.bound is None else ("≥ " if target.at_least else "≤ ") + f"{target.bound:g}"
        met = {True: "yes", False: "**no**", None: _MISSING}[target.met]
        per_repeat = ", ".join(f"{ratio:.2f}" for ratio in target.per_repeat) or _MISSING
        rows.append([target.description, _fixed(target.measured, 2), per_repeat, bound, met])
    return ["### Targets", "", *_table(["ratio", "median", "per repeat", "target", "met"], rows)]
