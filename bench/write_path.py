"""The write-path suite: how close one segment container comes to what the disk can do.

What it answers (the issue's two targets, each a ratio of two figures measured in the same run):

1. *Throughput.*  100-byte appends batched by the processor should reach at least 40% of a raw Python
   group-commit loop's records/s **at the batch size the container achieved** (records per
   fdatasync).  Comparing at equal batch sizes separates the store's per-append CPU cost from the
   disk: both sides pay the same number of syncs per record.
2. *Latency.*  A lone appender's p95 acknowledgement latency should stay within twice one
   fdatasync's p95: the store should add little to the one sync it cannot avoid.

And, beside them (informational, not one of the issue's targets): the same 100-byte events as the
client path sends them -- many framed events per append (an ``AppendBlock``) -- in events/s
against the raw loop writing 100-byte records **at equal bytes per fdatasync**.  Why both: the
per-append figure is bounded by what one awaitable operation costs in CPython, whatever the store
does; the block figure is what a client writer gets.  To show that bound, each repeat also drives
a store that costs nothing (one future per append, no validation, no write) with the pipelined
scenario's own driver: its appends/s over the same raw loop is the highest ratio *any* store with
one awaitable operation per append could reach in CPython here (the "per-append ceiling").

How (``reference/performance-baselines.md``, "noise discipline"): every measurement waits first for
the machine to be quiet (bounded), records the CPU other processes used while it ran, and is
repeated; the report gives medians over repeats, and each ratio is the median of per-repeat ratios.
A repeat runs the fdatasync probe, then for each scenario the container followed at once by the raw
loop at that container's batch size, so the two sides of a ratio are minutes apart at most.

Everything is bounded: each measurement by ``duration_seconds`` (after ``warmup_seconds``) and by
``bytes_max`` written; each quiet wait by ``quiet_timeout_seconds``.  Data goes to fresh directories
under a temporary root that is removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench._container import ContainerRun, FloorRun, measure_per_append_floor, run_container_scenario
from bench._disk import FdatasyncRun, GroupCommitRun, measure_fdatasync, measure_group_commit
from bench._stats import median_or_none
from bench._suite import Progress, Steps
from bench._system import MachineDescription, QuietWait, describe_machine, wait_until_quiet
from bench.scenarios import SCENARIOS, Mode, Scenario

__all__ = [
    "Progress",
    "ScenarioSummary",
    "Target",
    "WritePathConfig",
    "WritePathReport",
    "run_write_path",
    "write_json",
]

SUITE_NAME: Final = "write-path"

#: The scenario each target is judged on.
THROUGHPUT_SCENARIO: Final = "pipelined-100B"
LATENCY_SCENARIO: Final = "lone-100B"
#: The scenario of the informational events-in-blocks ratio.
BLOCK_SCENARIO: Final = "block-100B"
THROUGHPUT_RATIO_MIN: Final = 0.40
LATENCY_RATIO_MAX: Final = 2.0

#: One measurement writes at most this much (a 10 KB scenario on a fast disk would otherwise write
#: gigabytes in a few seconds).
BYTES_PER_MEASUREMENT_MAX: Final = 1024 * 1024 * 1024

#: A probe of the machine's idleness lasts this long (the quiet wait is a series of them).
QUIET_PROBE_SECONDS: Final = 1.0


@attrs.frozen(kw_only=True)
class WritePathConfig:
    """How long, how often, and what."""

    duration_seconds: float = 2.5
    warmup_seconds: float = 0.5
    repeat: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    scenarios: tuple[Scenario, ...] = SCENARIOS
    fdatasync_write_bytes: int = 100
    bytes_max: int = BYTES_PER_MEASUREMENT_MAX
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 20.0
    quiet_probe_seconds: float = QUIET_PROBE_SECONDS


@attrs.frozen
class ScenarioRepeat:
    """One scenario in one repeat: the container, the raw loop at its batch size, and their ratio."""

    container: ContainerRun
    group_commit: GroupCommitRun
    throughput_ratio: float  # container appends/s ÷ raw loop records/s


@attrs.frozen
class Repeat:
    fdatasync: FdatasyncRun
    scenarios: dict[str, ScenarioRepeat]
    floor: FloorRun | None = None  # the per-append ceiling's driver against a store that costs nothing


@attrs.frozen
class ScenarioSummary:
    """Medians over repeats of one scenario (each ratio: the median of the per-repeat ratios)."""

    scenario: str
    driver: str
    record_bytes: int
    per_event: bool  # judged per event (blocks of events per append) rather than per append
    events_per_append: int
    appends_per_second: float | None
    events_per_second: float | None
    megabytes_per_second: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    appends_per_frame: float | None
    appends_per_fdatasync: float | None
    events_per_fdatasync: float | None
    log_bytes_per_fdatasync: float | None
    fdatasync_mean_ms: float | None
    own_cpu_us_per_append: float | None
    own_cpu_us_per_event: float | None
    raw_batch_records: float | None
    raw_records_per_second: float | None
    raw_own_cpu_us_per_record: float | None
    throughput_ratio: float | None
    others_cpu_percent_max: float | None  # the worst repeat


@attrs.frozen
class FdatasyncSummary:
    write_bytes: int
    syncs_per_second: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@attrs.frozen
class Target:
    """One of the issue's targets, judged on medians of per-repeat ratios."""

    description: str
    measured: float | None
    per_repeat: list[float]
    bound: float | None  # None: informational, no target
    at_least: bool  # the measured ratio must be >= bound (else <=)

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.bound is None:
            return None
        return self.measured >= self.bound if self.at_least else self.measured <= self.bound


@attrs.frozen
class WritePathReport:
    machine: MachineDescription
    config: WritePathConfig
    data_root_reason: str
    repeats: list[Repeat]
    scenarios: list[ScenarioSummary]
    fdatasync: FdatasyncSummary
    targets: list[Target]
    quiet_waits: int
    quiet_waits_timed_out: int
    suite: str = SUITE_NAME


# --- running -------------------------------------------------------------------------------------------


def run_write_path(config: WritePathConfig, data_root: Path, data_root_reason: str,
                   progress: Progress | None = None) -> WritePathReport:
    """Run the suite with its data in a temporary directory under ``data_root`` (removed afterwards)."""
    data_root.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix="millstream-bench-", dir=data_root))
    steps = Steps(config.repeat * steps_per_repeat(config), progress)
    try:
        machine = describe_machine(workspace, millstream.__version__)
        repeats = [_run_repeat(config, workspace, number, steps) for number in range(1, config.repeat + 1)]
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    steps.finish()
    quiet = [wait for repeat in repeats for wait in _quiet_waits(repeat)]
    return WritePathReport(
        machine=machine, config=config, data_root_reason=data_root_reason, repeats=repeats,
        scenarios=[_summarize(scenario, repeats) for scenario in config.scenarios],
        fdatasync=_summarize_fdatasync(config, repeats), targets=_targets(config, repeats),
        quiet_waits=len(quiet), quiet_waits_timed_out=sum(1 for wait in quiet if not wait.quiet),
    )


def steps_per_repeat(config: WritePathConfig) -> int:
    """Measurements in one repeat: the fdatasync probe, container and raw loop per scenario, and the
    per-append floor when the throughput scenario runs."""
    floor = any(scenario.name == THROUGHPUT_SCENARIO for scenario in config.scenarios)
    return 1 + 2 * len(config.scenarios) + floor


def _run_repeat(config: WritePathConfig, workspace: Path, number: int, steps: Steps) -> Repeat:
    steps.next(f"repeat {number}/{config.repeat}: fdatasync probe")
    with _fresh_directory(workspace, f"r{number}-fdatasync") as directory:
        fdatasync = measure_fdatasync(
            directory, write_bytes=config.fdatasync_write_bytes, warmup_seconds=config.warmup_seconds,
            duration_seconds=config.duration_seconds, quiet=_wait_quiet(config))
    scenarios = {scenario.name: _run_scenario(config, workspace, number, scenario, steps)
                 for scenario in config.scenarios}
    floor = None
    throughput = next((s for s in config.scenarios if s.name == THROUGHPUT_SCENARIO), None)
    if throughput is not None:
        steps.next(f"repeat {number}/{config.repeat}: per-append floor (a store that costs nothing)")
        floor = measure_per_append_floor(throughput.window, warmup_seconds=config.warmup_seconds,
                                         duration_seconds=config.duration_seconds, quiet=_wait_quiet(config))
    return Repeat(fdatasync=fdatasync, scenarios=scenarios, floor=floor)


def _run_scenario(config: WritePathConfig, workspace: Path, number: int, scenario: Scenario,
                  steps: Steps) -> ScenarioRepeat:
    """The container, then at once the raw loop at the batch size the container achieved."""
    steps.next(f"repeat {number}/{config.repeat}: {scenario.name} container")
    with _fresh_directory(workspace, f"r{number}-{scenario.name}-container") as directory:
        container = run_container_scenario(
            scenario, directory, warmup_seconds=config.warmup_seconds, duration_seconds=config.duration_seconds,
            bytes_max=config.bytes_max, quiet=_wait_quiet(config))
    batch_records = raw_batch_records(scenario, container)
    steps.next(f"repeat {number}/{config.repeat}: {scenario.name} raw loop x {batch_records}")
    with _fresh_directory(workspace, f"r{number}-{scenario.name}-raw") as directory:
        group_commit = measure_group_commit(
            directory, record_bytes=scenario.record_bytes, batch_records=batch_records,
            warmup_seconds=config.warmup_seconds, duration_seconds=config.duration_seconds,
            bytes_max=config.bytes_max, quiet=_wait_quiet(config))
    return ScenarioRepeat(container=container, group_commit=group_commit,
                          throughput_ratio=container.events_per_second / group_commit.records_per_second)


def raw_batch_records(scenario: Scenario, container: ContainerRun) -> int:
    """Records per fdatasync for the raw loop: the appends per fdatasync the container achieved, or,
    for a scenario judged per event (blocks), as many records as make the bytes the container wrote
    per fdatasync (its framing included, which counts against it)."""
    if scenario.per_event:
        return max(1, round((container.log_bytes_per_fdatasync or scenario.record_bytes) / scenario.record_bytes))
    return max(1, round(container.appends_per_fdatasync or 1.0))


def _wait_quiet(config: WritePathConfig) -> QuietWait:
    return wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, config.quiet_probe_seconds)


@contextlib.contextmanager
def _fresh_directory(workspace: Path, name: str) -> Iterator[Path]:
    """A new directory under ``workspace`` for one measurement, removed when it ends."""
    path = workspace / name
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _quiet_waits(repeat: Repeat) -> list[QuietWait]:
    waits = [repeat.fdatasync.quiet] + ([repeat.floor.quiet] if repeat.floor is not None else [])
    for result in repeat.scenarios.values():
        waits += [result.container.quiet, result.group_commit.quiet]
    return waits


# --- summarizing ---------------------------------------------------------------------------------------


def _summarize(scenario: Scenario, repeats: list[Repeat]) -> ScenarioSummary:
    runs = [repeat.scenarios[scenario.name] for repeat in repeats]
    containers = [run.container for run in runs]
    return ScenarioSummary(
        scenario=scenario.name, driver=scenario.driver, record_bytes=scenario.record_bytes,
        per_event=scenario.per_event, events_per_append=scenario.events_per_append,
        appends_per_second=median_or_none(c.appends_per_second for c in containers),
        events_per_second=median_or_none(c.events_per_second for c in containers),
        megabytes_per_second=median_or_none(c.megabytes_per_second for c in containers),
        p50_ms=median_or_none(c.latency.p50_ms for c in containers),
        p95_ms=median_or_none(c.latency.p95_ms for c in containers),
        p99_ms=median_or_none(c.latency.p99_ms for c in containers),
        appends_per_frame=median_or_none(c.appends_per_frame for c in containers),
        appends_per_fdatasync=median_or_none(c.appends_per_fdatasync for c in containers),
        events_per_fdatasync=median_or_none(c.events_per_fdatasync for c in containers),
        log_bytes_per_fdatasync=median_or_none(c.log_bytes_per_fdatasync for c in containers),
        fdatasync_mean_ms=median_or_none(c.fdatasync_mean_ms for c in containers),
        own_cpu_us_per_append=median_or_none(c.own_cpu_us_per_append for c in containers),
        own_cpu_us_per_event=median_or_none(c.own_cpu_us_per_event for c in containers),
        raw_batch_records=median_or_none(run.group_commit.batch_records for run in runs),
        raw_records_per_second=median_or_none(run.group_commit.records_per_second for run in runs),
        raw_own_cpu_us_per_record=median_or_none(run.group_commit.own_cpu_us_per_record for run in runs),
        throughput_ratio=median_or_none(run.throughput_ratio for run in runs),
        others_cpu_percent_max=max(
            max(run.container.cpu.others_percent, run.group_commit.cpu.others_percent) for run in runs),
    )


def _summarize_fdatasync(config: WritePathConfig, repeats: list[Repeat]) -> FdatasyncSummary:
    runs = [repeat.fdatasync for repeat in repeats]
    return FdatasyncSummary(
        write_bytes=config.fdatasync_write_bytes,
        syncs_per_second=median_or_none(run.syncs_per_second for run in runs),
        p50_ms=median_or_none(run.latency.p50_ms for run in runs),
        p95_ms=median_or_none(run.latency.p95_ms for run in runs),
        p99_ms=median_or_none(run.latency.p99_ms for run in runs),
    )


def _targets(config: WritePathConfig, repeats: list[Repeat]) -> list[Target]:
    names = {scenario.name for scenario in config.scenarios}
    targets: list[Target] = []
    if THROUGHPUT_SCENARIO in names:
        ratios = [repeat.scenarios[THROUGHPUT_SCENARIO].throughput_ratio for repeat in repeats]
        targets.append(Target(
            description=f"{THROUGHPUT_SCENARIO}: container appends/s ÷ raw group commit records/s at equal "
                        "records per fdatasync",
            measured=median_or_none(ratios), per_repeat=ratios, bound=THROUGHPUT_RATIO_MIN, at_least=True))
        ceilings = [repeat.floor.appends_per_second / raw.records_per_second
                    for repeat in repeats if repeat.floor is not None
                    for raw in [repeat.scenarios[THROUGHPUT_SCENARIO].group_commit]]
        targets.append(Target(
            description=f"{THROUGHPUT_SCENARIO} per-append ceiling (informational): a store that costs nothing, "
                        "driven the same way (one task and one future per append), ÷ the same raw loop",
            measured=median_or_none(ceilings), per_repeat=ceilings, bound=None, at_least=True))
    if BLOCK_SCENARIO in names:
        ratios = [repeat.scenarios[BLOCK_SCENARIO].throughput_ratio for repeat in repeats]
        targets.append(Target(
            description=f"{BLOCK_SCENARIO} (informational, not issue 2's per-append target): container events/s "
                        "÷ raw group commit records/s at equal bytes per fdatasync, events travelling in blocks",
            measured=median_or_none(ratios), per_repeat=ratios, bound=None, at_least=True))
    if LATENCY_SCENARIO in names:
        for percentile, bound in (("p95", LATENCY_RATIO_MAX), ("p50", None)):
            ratios = _latency_ratios(repeats, percentile)
            targets.append(Target(
                description=f"{LATENCY_SCENARIO}: append {percentile} ÷ one fdatasync's {percentile}"
                            + ("" if bound is not None else " (informational)"),
                measured=median_or_none(ratios), per_repeat=ratios, bound=bound, at_least=False))
    return targets


def _latency_ratios(repeats: list[Repeat], percentile: str) -> list[float]:
    ratios = []
    for repeat in repeats:
        append_ms = getattr(repeat.scenarios[LATENCY_SCENARIO].container.latency, f"{percentile}_ms")
        sync_ms = getattr(repeat.fdatasync.latency, f"{percentile}_ms")
        if append_ms is not None and sync_ms:
            ratios.append(append_ms / sync_ms)
    return ratios


# --- output --------------------------------------------------------------------------------------------


def write_json(report: WritePathReport, output_dir: Path) -> Path:
    """Write the whole report, raw per-repeat results included, as ``<suite>-<UTC date>.json``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.machine.date_utc.replace("-", "").replace(":", "")
    path = output_dir / f"{report.suite}-{stamp}.json"
    document = attrs.asdict(report, value_serializer=_to_json)
    # Properties are not attrs fields: add the ones a reader of the file needs.
    for scenario, fields in zip(report.config.scenarios, document["config"]["scenarios"], strict=True):
        fields["name"] = scenario.name
    for target, fields in zip(report.targets, document["targets"], strict=True):
        fields["met"] = target.met
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return path


def _to_json(_instance: object, _field: object, value: Any) -> Any:
    if isinstance(value, Mode):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
