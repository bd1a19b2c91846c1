"""The write-path report as Markdown (the table the issue asks for; the JSON file has everything)."""

from __future__ import annotations

from bench._stats import median_or_none
from bench.write_path import WritePathReport

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
    """The report: a header naming the machine and run, the per-append scenarios, the per-append
    ceiling, events in blocks, the disk, the targets."""
    sections = [_header(report), _scenarios(report), _floor(report), _blocks(report), _disk(report), _targets(report)]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"


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
        for s in report.scenarios if not s.per_event
    ]
    if not rows:
        return []
    return [
        "### The container against the raw group-commit loop (one event per append)",
        "",
        *_table(header, rows),
        "",
        "appends/frame and appends/fdatasync: what the processor and the FileLog batched (counted outside the "
        "container).  The raw loop writes records of the same size, as many per `os.write` + `os.fdatasync` as "
        "the container put into one fdatasync.  CPU µs: this process (every thread, user + kernel) per append or "
        "record.  container ÷ raw: appends/s ÷ records/s, the median of per-repeat ratios.  Others' CPU: what "
        "other processes used during the measurement, % of the whole machine.",
    ]


def _floor(report: WritePathReport) -> list[str]:
    floors = [repeat.floor for repeat in report.repeats if repeat.floor is not None]
    if not floors:
        return []
    appends = median_or_none(floor.appends_per_second for floor in floors)
    cpu = median_or_none(floor.own_cpu_us_per_append for floor in floors)
    rows = [[f"1 x window {floors[0].window}, one task and one future per append, nothing else",
             _count(appends), _fixed(cpu, 2)]]
    return [
        "### The per-append ceiling: the same driver against a store that costs nothing",
        "",
        *_table(["driver", "appends/s", "CPU µs/append"], rows),
        "",
        "No validation, no framing, no write, no sync: what one awaitable operation per append costs in "
        "CPython on this machine now.  No store driven one append per event can beat it; its ratio to the raw "
        "loop (in Targets) bounds the per-append throughput ratio.",
    ]


def _blocks(report: WritePathReport) -> list[str]:
    header = ["scenario", "writer", "events/s", "MB/s", "block p50 ms", "block p95 ms", "block p99 ms",
              "events/fdatasync", "log KB/fdatasync", "CPU µs/event",
              "raw loop records/s (same bytes per fdatasync)", "raw CPU µs/record", "container ÷ raw",
              "others' CPU % (max)"]
    rows = [
        [s.scenario, s.driver, _count(s.events_per_second), _fixed(s.megabytes_per_second, 1),
         _fixed(s.p50_ms, 3), _fixed(s.p95_ms, 3), _fixed(s.p99_ms, 3), _count(s.events_per_fdatasync),
         _fixed(None if s.log_bytes_per_fdatasync is None else s.log_bytes_per_fdatasync / 1000, 1),
         _fixed(s.own_cpu_us_per_event, 2),
         f"{_count(s.raw_records_per_second)} (x {_count(s.raw_batch_records)})",
         _fixed(s.raw_own_cpu_us_per_record, 2), _fixed(s.throughput_ratio, 2), _fixed(s.others_cpu_percent_max, 1)]
        for s in report.scenarios if s.per_event
    ]
    if not rows:
        return []
    return [
        "### What the client path sends: 100-byte events travelling in blocks (informational)",
        "",
        *_table(header, rows),
        "",
        "Each append is one `AppendBlock` as the server appends it: the events framed as on the wire (8-byte "
        "header each) and the writer's event number as a compare-and-set attribute update.  Latency is per "
        "block.  The raw loop writes 100-byte records, as many per `os.write` + `os.fdatasync` as make the bytes "
        "the container wrote per fdatasync (its framing counts against it).  This is not issue 2's per-append "
        "target; it is what a client writer's events get.",
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
