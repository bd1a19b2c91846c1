"""The benchmarks' command line: ``python -m bench --suite NAME ...`` from a clone (``tox -e bench`` runs it).

``millstream bench ...`` runs the same command when millstream is installed from a clone (an
editable install); the installed package itself holds no benchmarks.  ``run(arguments, prog_name)``
is the one way in for both, so a report names the command line that made it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import click
from click.core import ParameterSource

from bench import HARNESS_SUITE_NAMES, SUITE_NAMES
from bench.scenarios import SCENARIOS
from millstream.cli._progress import Progress

__all__ = ["Invocation", "bench", "run"]


@attrs.frozen
class Invocation:
    """How the command was run: its name (``python -m bench``, ``millstream bench``) and arguments."""

    prog_name: str
    arguments: tuple[str, ...]


def run(arguments: Sequence[str], prog_name: str) -> None:
    """Run the command line ``arguments`` as ``prog_name``; exits the process (click's standalone mode)
    with the command's status."""
    bench.main(args=list(arguments), prog_name=prog_name, obj=Invocation(prog_name, tuple(arguments)))


@click.command(short_help="Benchmarks: the write path, tiering, and millstream beside its peers.",
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--suite", type=click.Choice(SUITE_NAMES), default="write-path", show_default=True,
              help="Which benchmark to run (quick, peers: millstream beside NATS JetStream and Redis Streams).")
@click.option("--workload", "workload_files", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Run the peers harness on this workload TOML file instead of a suite's (repeatable).")
@click.option("--system", "system_names", multiple=True, metavar="NAME",
              help="Peers harness: measure only this system (repeatable), e.g. millstream, nats-jetstream, "
                   "redis-streams.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Peers harness: also write the report to this Markdown file (e.g. BENCHMARKS.md); "
                   "transactions: replace its section of that file.")
@click.option("--figures", "figures_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Peers harness: where the PNG plots go.  Default: docs/bench beside --markdown, else "
                   "figures/ under --output.")
@click.option("--disk-probe", "disk_probe_seconds", type=click.FloatRange(0.01, 60.0), default=2.0,
              show_default=True, metavar="SECONDS",
              help="Peers harness: length of each probe of the disk's physical limit (raw loop, fio).")
@click.option("--fio/--no-fio", "use_fio", default=True, show_default=True,
              help="Peers harness: also measure the disk with fio, if it is installed.")
@click.option("--profile", is_flag=True, default=False,
              help="Peers harness: profile millstream's writer and server (cProfile) at max rate; the report "
                   "lists where the time goes.")
@click.option("--duration", "duration_seconds", type=click.FloatRange(0.01, 600.0), default=2.5,
              show_default=True, metavar="SECONDS", help="Length of each measurement (after its warm-up).")
@click.option("--warmup", "warmup_seconds", type=click.FloatRange(0.0, 60.0), default=0.5, show_default=True,
              metavar="SECONDS", help="Unmeasured run before each measurement.")
@click.option("--repeat", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Run every measurement this many times (the quick and peers suites: every system's sweep, "
                   "the systems taking turns); the report gives medians.")
@click.option("--scenario", "scenario_names", multiple=True, metavar="NAME",
              help="Run only this scenario (repeatable): " + ", ".join(s.name for s in SCENARIOS) + ".")
@click.option("--output", "output_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("bench-results"), show_default=True, help="Directory for the JSON file of raw results.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the logs are written (a temporary directory inside it, removed afterwards).  "
                   "Default: the system temp directory if it is on a disk, else the working directory.")
@click.option("--quiet-idle", "quiet_idle_percent_min", type=click.FloatRange(0.0, 100.0), default=80.0,
              show_default=True, metavar="PERCENT",
              help="Before each measurement, wait until the machine is at least this idle...")
@click.option("--quiet-timeout", "quiet_timeout_seconds", type=click.FloatRange(0.0, 600.0), default=20.0,
              show_default=True, metavar="SECONDS", help="...for at most this long (0: do not wait).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show progress on stderr.")
@click.option("--event-mib", "event_mib", type=click.IntRange(16, 1024), default=1024, show_default=True,
              metavar="MIB", help="large-events: the large event's size (and the classic 8 MiB events' total).")
@click.option("--scaling-seconds", "scaling_seconds", type=click.FloatRange(0.0, 3600.0), default=60.0,
              show_default=True, metavar="SECONDS", help="streams: length of the auto-scaling run (0: skip it).")
def bench(suite: str, workload_files: tuple[Path, ...], system_names: tuple[str, ...], markdown_path: Path | None,
          figures_dir: Path | None, disk_probe_seconds: float, use_fio: bool, profile: bool, duration_seconds: float,
          warmup_seconds: float,
          repeat: int, scenario_names: tuple[str, ...], output_dir: Path, data_dir: Path | None,
          quiet_idle_percent_min: float, quiet_timeout_seconds: float, progress: bool, event_mib: int,
          scaling_seconds: float) -> None:
    """Measure millstream against the machine's physical limit and against its peers, in the same run.

    The quick and peers suites (or --workload FILE) run the peers harness: one writer process (this
    one) against a `millstream standalone` server, NATS JetStream and Redis Streams, each started here
    on 127.0.0.1 with fsync before acknowledgement (peers that are not installed are skipped, with a
    message).  For every offered rate it reports p50/p95/p99 write and end-to-end latency and the
    throughput achieved, as Markdown tables and latency-throughput plots, beside the disk's limit
    measured in the same run.  Each system's sweep runs --repeat times, the systems taking turns; the
    targets are judged on medians.  `--suite quick --markdown BENCHMARKS.md` takes about 6 minutes.
    The quick suite also runs what users write -- the README's blocking loop, the asyncio loop, the
    batch call (write_events) and the columnar call (write_columns) -- each beside the raw group-commit
    loop (1,000 x 100 B per fdatasync) of the same round, --repeat rounds (bench/user_loops.py); and
    the per-event loop paced at half of its max in every repeat, and a lone writer at 1,000 events/s
    beside one fdatasync's p95 (bench/latency_loops.py).

    The transactions suite runs stream transactions of 100 x 100-byte events against a `millstream
    standalone` node in another process: transactions/s one at a time and 8 at once, the commit
    latency (commit call -> COMMITTED) p50/p95, and plain writing of the same events, in the same run;
    with --markdown it replaces (or adds) its own section of that file.

    The streams suite measures one writer with 10,000 random routing keys against none (1 and 16
    segments), tail-read latency with 16 readers in a group, and a stream auto-scaling under 10 KB events
    (--scaling-seconds; the plot goes beside --markdown).

    The cluster suite runs `millstream cluster up --nodes 3` (ZooKeeper, three JetStream servers,
    replicas 3) and writes 100-byte events into it beside JetStream R3 (asynchronous publishes, at most
    1,000 in flight) and a `millstream standalone` node, taking turns, --repeat windows each; it needs
    the `cluster` extra, ZooKeeper and nats-server.  With --markdown it replaces (or adds) its section.

    The large-events suite writes one large event (--event-mib, 1 GiB by default) and the same bytes as
    classic 8 MiB events against a `millstream standalone` node in another process, reads both back,
    and measures each client's peak RSS above its baseline from outside its process; with --markdown it
    replaces (or adds) its own section of that file.

    The write-path suite runs one segment container in this process on a durable FileLog and appends
    100-byte and 10,000-byte events: one appender awaiting each append, 16 concurrent ones, and one
    keeping a window in flight.  In the same run it measures a plain Python write + fdatasync loop at
    the batch size the container achieved, and one fdatasync alone.  It prints a Markdown table of
    medians to stdout and writes every raw figure to a JSON file under --output.

    With the defaults it takes a few minutes.  A quick look: --repeat 1 --duration 0.5.
    """
    from bench._report import render_markdown
    from bench._system import choose_data_root, filesystem_of
    from bench.scenarios import scenarios_named
    from bench.write_path import WritePathConfig, run_write_path, write_json

    context = click.get_current_context()

    def given(name: str) -> bool:
        return context.get_parameter_source(name) is not ParameterSource.DEFAULT

    # The suites with timings of their own keep them unless --duration or --warmup is given.
    duration = duration_seconds if given("duration_seconds") else None
    warmup = warmup_seconds if given("warmup_seconds") else None
    if workload_files or suite in HARNESS_SUITE_NAMES:
        _bench_harness(
            suite="custom" if workload_files else suite, workload_files=workload_files, system_names=system_names,
            markdown_path=markdown_path, figures_dir=figures_dir, disk_probe_seconds=disk_probe_seconds,
            use_fio=use_fio, profile=profile, repeat=repeat,
            duration_seconds=duration, warmup_seconds=warmup, output_dir=output_dir,
            data_dir=data_dir, quiet_idle_percent_min=quiet_idle_percent_min,
            quiet_timeout_seconds=quiet_timeout_seconds if given("quiet_timeout_seconds") else None,
            progress=progress)
        return
    if suite == "transactions":
        _bench_transactions(duration, warmup, repeat, output_dir, data_dir, markdown_path, quiet_idle_percent_min,
                            quiet_timeout_seconds, progress)
        return
    if suite == "streams":
        _bench_streams(duration, warmup, repeat, scaling_seconds, output_dir, data_dir, markdown_path, figures_dir,
                       quiet_idle_percent_min, quiet_timeout_seconds, progress)
        return
    if suite == "large-events":
        _bench_large_events(event_mib, repeat, output_dir, data_dir, markdown_path, quiet_idle_percent_min,
                            quiet_timeout_seconds, progress)
        return
    if suite == "cluster":
        _bench_cluster(repeat, data_dir, markdown_path)
        return
    if suite == "tiering":
        _bench_tiering(duration_seconds, warmup_seconds, repeat, output_dir, data_dir, quiet_idle_percent_min,
                       quiet_timeout_seconds, progress)
        return
    try:
        scenarios = scenarios_named(scenario_names) if scenario_names else SCENARIOS
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--scenario") from error
    data_root, reason = choose_data_root(data_dir, Path(tempfile.gettempdir()), Path.cwd())
    data_root.mkdir(parents=True, exist_ok=True)
    filesystem = filesystem_of(data_root)
    if filesystem.in_memory:
        click.echo(f"warning: {data_root} is on {filesystem.type}, in memory: fdatasync costs nothing there, so "
                   "the figures will not mean durability.  Use --data-dir on a disk.", err=True)
    config = WritePathConfig(duration_seconds=duration_seconds, warmup_seconds=warmup_seconds, repeat=repeat,
                             scenarios=scenarios, quiet_idle_percent_min=quiet_idle_percent_min,
                             quiet_timeout_seconds=quiet_timeout_seconds)
    with contextlib.ExitStack() as stack:
        report = run_write_path(config, data_root, reason, Progress(stack, suite) if progress else None)
    click.echo(render_markdown(report))
    path = write_json(report, output_dir)
    click.echo(f"raw results: {path}", err=True)


def _data_root(data_dir: Path | None) -> Path:
    """Where a suite's temporary directory goes (``--data-dir``, else the temp directory if it is on a
    disk, else the working directory), made if missing."""
    from bench._system import choose_data_root

    data_root, _ = choose_data_root(data_dir, Path(tempfile.gettempdir()), Path.cwd())
    data_root.mkdir(parents=True, exist_ok=True)
    return data_root


def _command_line() -> str:
    """The command as it was given, for a report to say how it was made."""
    context = click.get_current_context()
    invocation = context.find_object(Invocation)
    if invocation is None:  # (invoked as a plain click command, e.g. by a test's CliRunner)
        return context.command_path
    return " ".join([invocation.prog_name, *(shlex.quote(argument) for argument in invocation.arguments)])


def _show_section(section: str, markdown_path: Path | None, replace_section: Callable[[str, str], str]) -> None:
    """Put a suite's ``section`` into ``--markdown`` (replacing its old one, the rest of the file kept)
    if given, and print it."""
    if markdown_path is not None:
        existing = markdown_path.read_text(encoding="utf-8") if markdown_path.exists() else ""
        markdown_path.write_text(replace_section(existing, section), encoding="utf-8")
        click.echo(f"report: {markdown_path}", err=True)
    click.echo(section)


def _bench_cluster(repeat: int, data_dir: Path | None, markdown_path: Path | None) -> None:
    """The cluster suite (three nodes with replicas 3 beside JetStream R3 and standalone); with
    ``--markdown``, its section of that file is replaced (or added)."""
    from bench.cluster import SUITE_EVENTS, render_cluster_markdown, replace_section, run_cluster

    data_root = _data_root(data_dir)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-cluster-", dir=data_root) as directory:
        report = run_cluster(SUITE_EVENTS, repeat, Path(directory))
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())  # (a report's date, as the other suites')
    _show_section(render_cluster_markdown(report, command=_command_line(), date=date), markdown_path,
                  replace_section)


def _bench_tiering(duration_seconds: float, warmup_seconds: float, repeat: int, output_dir: Path,
                   data_dir: Path | None, quiet_idle_percent_min: float, quiet_timeout_seconds: float,
                   progress: bool) -> None:
    from bench.tiering import TieringConfig, render_tiering_markdown, run_tiering, write_tiering_json

    data_root = _data_root(data_dir)
    config = TieringConfig(duration_seconds=duration_seconds, warmup_seconds=warmup_seconds, repeat=repeat,
                           quiet_idle_percent_min=quiet_idle_percent_min, quiet_timeout_seconds=quiet_timeout_seconds)
    with contextlib.ExitStack() as stack:
        report = run_tiering(config, data_root, Progress(stack, "tiering") if progress else None)
    click.echo(render_tiering_markdown(report))
    click.echo(f"raw results: {write_tiering_json(report, output_dir)}", err=True)


def _bench_transactions(duration_seconds: float | None, warmup_seconds: float | None, repeat: int, output_dir: Path,
                        data_dir: Path | None, markdown_path: Path | None, quiet_idle_percent_min: float,
                        quiet_timeout_seconds: float, progress: bool) -> None:
    """The transactions suite; with ``--markdown``, its section of that file is replaced (or added)."""
    from bench.transactions import (
        TransactionsConfig,
        render_transactions_markdown,
        replace_section,
        run_transactions,
        write_transactions_json,
    )

    data_root = _data_root(data_dir)
    config = TransactionsConfig(repeat=repeat, quiet_idle_percent_min=quiet_idle_percent_min,
                                quiet_timeout_seconds=quiet_timeout_seconds)
    if duration_seconds is not None:
        config = attrs.evolve(config, duration_seconds=duration_seconds)
    if warmup_seconds is not None:
        config = attrs.evolve(config, warmup_seconds=warmup_seconds)
    with contextlib.ExitStack() as stack:
        report = run_transactions(config, data_root, Progress(stack, "transactions") if progress else None)
    _show_section(render_transactions_markdown(report, command=_command_line()), markdown_path, replace_section)
    click.echo(f"raw results: {write_transactions_json(report, output_dir)}", err=True)


def _bench_streams(duration_seconds: float | None, warmup_seconds: float | None, repeat: int, scaling_seconds: float,
                   output_dir: Path, data_dir: Path | None, markdown_path: Path | None, figures_dir: Path | None,
                   quiet_idle_percent_min: float, quiet_timeout_seconds: float, progress: bool) -> None:
    """The streams suite; with ``--markdown``, its section of that file is replaced (or added) and the
    scaling run's plot is written beside it (or into ``--figures``)."""
    from bench.streams import (
        SCALING_FIGURE,
        StreamsConfig,
        plot_scaling,
        render_streams_markdown,
        replace_section,
        run_streams,
        write_streams_json,
    )

    data_root = _data_root(data_dir)
    config = StreamsConfig(repeat=repeat, quiet_idle_percent_min=quiet_idle_percent_min,
                           quiet_timeout_seconds=quiet_timeout_seconds, scaling_seconds=scaling_seconds)
    if duration_seconds is not None:  # (the tail-read window too)
        config = attrs.evolve(config, duration_seconds=duration_seconds, end_to_end_seconds=duration_seconds)
    if warmup_seconds is not None:  # (the readers get at least a second to acquire their segments)
        config = attrs.evolve(config, warmup_seconds=warmup_seconds,
                              end_to_end_warmup_seconds=max(1.0, warmup_seconds))
    with contextlib.ExitStack() as stack:
        report = run_streams(config, data_root, Progress(stack, "streams") if progress else None,
                             scaling=scaling_seconds > 0)
    base = markdown_path.parent if markdown_path is not None else output_dir
    figures = figures_dir if figures_dir is not None else base
    figure = None
    if report.scaling is not None:
        path = plot_scaling(report.scaling, figures / SCALING_FIGURE)
        figure = os.path.relpath(path, base)
        click.echo(f"figure: {path}", err=True)
    _show_section(render_streams_markdown(report, command=_command_line(), figure=figure), markdown_path,
                  replace_section)
    click.echo(f"raw results: {write_streams_json(report, output_dir)}", err=True)


def _bench_large_events(event_mib: int, repeat: int, output_dir: Path, data_dir: Path | None,
                        markdown_path: Path | None, quiet_idle_percent_min: float, quiet_timeout_seconds: float,
                        progress: bool) -> None:
    """The large-events suite; with ``--markdown``, its section of that file is replaced (or added)."""
    from bench.large_events import (
        LargeEventsConfig,
        render_large_events_markdown,
        replace_section,
        run_large_events,
        write_large_events_json,
    )

    data_root = _data_root(data_dir)
    config = LargeEventsConfig(event_mib=event_mib, repeat=repeat, quiet_idle_percent_min=quiet_idle_percent_min,
                               quiet_timeout_seconds=quiet_timeout_seconds)
    with contextlib.ExitStack() as stack:
        report = run_large_events(config, data_root, Progress(stack, "large-events") if progress else None)
    _show_section(render_large_events_markdown(report, command=_command_line()), markdown_path, replace_section)
    click.echo(f"raw results: {write_large_events_json(report, output_dir)}", err=True)


def _keep_suite_sections(markdown: str, existing: str) -> str:
    """The peers harness's ``markdown`` with the sections the other suites (transactions, large events,
    streams) own in the ``existing`` file put back as they were: the harness rewrites the file, they
    are not its to drop."""
    from bench import _suite, cluster, large_events, streams, transactions

    for suite_module in (transactions, large_events, streams, cluster):
        kept = suite_module.section_of(existing)
        markdown = markdown if kept is None else suite_module.replace_section(markdown, kept)
    # `millstream pipeline bench` owns a section too (its markers: bench.pipeline, which needs
    # Spark to import, so they are spelled out here).
    pipeline = ("<!-- millstream pipeline bench: begin -->", "<!-- millstream pipeline bench: end -->")
    kept = _suite.section_of(existing, *pipeline)
    return markdown if kept is None else _suite.replace_section(markdown, kept, *pipeline)


def _bench_harness(*, suite: str, workload_files: tuple[Path, ...], system_names: tuple[str, ...],
                   markdown_path: Path | None, figures_dir: Path | None, disk_probe_seconds: float, use_fio: bool,
                   profile: bool, repeat: int,
                   duration_seconds: float | None, warmup_seconds: float | None, output_dir: Path,
                   data_dir: Path | None, quiet_idle_percent_min: float, quiet_timeout_seconds: float | None,
                   progress: bool) -> None:
    """The peers harness (``bench.harness``): workloads x systems x offered rates."""
    from bench._system import choose_data_root, filesystem_of
    from bench.benchmarks_md import render_markdown
    from bench.drivers import all_drivers
    from bench.harness import HarnessConfig, run_harness, write_json
    from bench.latency_loops import LatencyLoopsConfig
    from bench.plots import plot_report
    from bench.user_loops import UserLoopsConfig
    from bench.workload import SYSTEM_NAMES, load_workload, suite_workloads
    from millstream.errors import InvalidArgumentError

    unknown = [name for name in system_names if name not in SYSTEM_NAMES]
    if unknown:
        raise click.BadParameter(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEM_NAMES)}",
                                 param_hint="--system")
    try:
        workloads = (tuple(load_workload(path) for path in workload_files) if workload_files
                     else suite_workloads(suite))
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), param_hint="--workload") from error
    workloads = tuple(w.with_timing(duration_seconds=duration_seconds, warmup_seconds=warmup_seconds)
                      for w in workloads)
    if system_names:
        workloads = tuple(attrs.evolve(w, systems=tuple(s for s in w.systems if s in system_names))
                          for w in workloads)
    data_root, reason = choose_data_root(data_dir, Path(tempfile.gettempdir()), Path.cwd())
    data_root.mkdir(parents=True, exist_ok=True)
    filesystem = filesystem_of(data_root)
    if filesystem.in_memory:
        click.echo(f"warning: {data_root} is on {filesystem.type}, in memory: fsync costs nothing there, so the "
                   "figures will not mean durability.  Use --data-dir on a disk.", err=True)
    drivers = all_drivers()
    for name in sorted({s for w in workloads for s in w.systems}):
        availability = drivers[name].availability()
        if not availability.available:
            click.echo(f"skipping {name}: {availability.detail}", err=True)
    config = HarnessConfig(suite=suite, workloads=workloads, quiet_idle_percent_min=quiet_idle_percent_min,
                           disk_probe_seconds=disk_probe_seconds, use_fio=use_fio, profile=profile, repeat=repeat)
    if suite == "quick" and (not system_names or "millstream" in system_names):
        # The README's loops, the batch and columnar calls beside the raw loop (issue 26): as many events
        # as the harness's steps would send at about a million a second, so --duration scales them too.
        seconds = workloads[0].duration_seconds if workloads else 2.5
        config = attrs.evolve(config, user_loops=UserLoopsConfig(
            events=max(1_000, int(seconds * 200_000)), rounds=repeat, raw_seconds=disk_probe_seconds),
            # The per-event loop at half of its max in every repeat, and a lone writer at 1,000 events/s
            # beside one fdatasync (issue 26 items 3 and 4): the same scale.
            latency_loops=LatencyLoopsConfig(max_events=max(1_000, int(seconds * 40_000)), paced_seconds=seconds,
                                             repeats=repeat, lone_seconds=seconds, sync_seconds=disk_probe_seconds))
    if quiet_timeout_seconds is not None:
        config = attrs.evolve(config, quiet_timeout_seconds=quiet_timeout_seconds)
    with contextlib.ExitStack() as stack:
        report = run_harness(config, drivers, data_root, reason, Progress(stack, suite) if progress else None)
    if figures_dir is None:
        figures_dir = (markdown_path.parent / "docs" / "bench") if markdown_path is not None else output_dir / "figures"
    figures = plot_report(report, figures_dir)
    base = markdown_path.parent if markdown_path is not None else Path.cwd()
    links = {name: Path(os.path.relpath(path, base)).as_posix() for name, path in figures.items()}
    markdown = render_markdown(report, links, command=_command_line())
    if markdown_path is not None:
        existing = markdown_path.read_text(encoding="utf-8") if markdown_path.exists() else ""
        markdown_path.write_text(_keep_suite_sections(markdown, existing), encoding="utf-8")
        click.echo(f"report: {markdown_path}", err=True)
    click.echo(markdown)
    click.echo(f"raw results: {write_json(report, output_dir)}", err=True)
    click.echo(f"figures: {', '.join(str(path) for path in figures.values()) or 'none'}", err=True)
