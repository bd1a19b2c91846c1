"""``millstream bench``: the benchmark suites that ship with millstream (``millstream.bench``)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import click
from millstream.bench import SUITE_NAMES
from millstream.bench.scenarios import SCENARIOS
from millstream.cli._group import main
from millstream.cli._progress import Progress

__all__ = ["bench"]


@main.command(short_help="Measure the write path against the disk's physical limit.")
@click.option("--suite", type=click.Choice(SUITE_NAMES), default="write-path", show_default=True,
              help="Which benchmark to run.")
@click.option("--duration", "duration_seconds", type=click.FloatRange(0.01, 600.0), default=2.5,
              show_default=True, metavar="SECONDS", help="Length of each measurement (after its warm-up).")
@click.option("--warmup", "warmup_seconds", type=click.FloatRange(0.0, 60.0), default=0.5, show_default=True,
              metavar="SECONDS", help="Unmeasured run before each measurement.")
@click.option("--repeat", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Run every measurement this many times; the report gives medians.")
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
def bench(suite: str, duration_seconds: float, warmup_seconds: float, repeat: int, scenario_names: tuple[str, ...],
          output_dir: Path, data_dir: Path | None, quiet_idle_percent_min: float, quiet_timeout_seconds: float,
          progress: bool) -> None:
    """Measure millstream against the machine's physical limit, in the same run.

    The write-path suite runs one segment container in this process on a durable FileLog and appends
    100-byte and 10,000-byte events: one appender awaiting each append, 16 concurrent ones, and one
    keeping a window in flight.  In the same run it measures a plain Python write + fdatasync loop at
    the batch size the container achieved, and one fdatasync alone.  It prints a Markdown table of
    medians to stdout and writes every raw figure to a JSON file under --output.

    With the defaults it takes a few minutes.  A quick look: --repeat 1 --duration 0.5.
    """
    from millstream.bench._report import render_markdown
    from millstream.bench._system import choose_data_root, filesystem_of
    from millstream.bench.scenarios import scenarios_named
    from millstream.bench.write_path import WritePathConfig, run_write_path, write_json

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


def _bench_tiering(duration_seconds: float, warmup_seconds: float, repeat: int, output_dir: Path,
                   data_dir: Path | None, quiet_idle_percent_min: float, quiet_timeout_seconds: float,
                   progress: bool) -> None:
    from millstream.bench._system import choose_data_root
    from millstream.bench.tiering import TieringConfig, render_tiering_markdown, run_tiering, write_tiering_json

    data_root, _ = choose_data_root(data_dir, Path(tempfile.gettempdir()), Path.cwd())
    data_root.mkdir(parents=True, exist_ok=True)
    config = TieringConfig(duration_seconds=duration_seconds, warmup_seconds=warmup_seconds, repeat=repeat,
                           quiet_idle_percent_min=quiet_idle_percent_min, quiet_timeout_seconds=quiet_timeout_seconds)
    with contextlib.ExitStack() as stack:
        report = run_tiering(config, data_root, Progress(stack, "tiering") if progress else None)
    click.echo(render_tiering_markdown(report))
    click.echo(f"raw results: {write_tiering_json(report, output_dir)}", err=True)
