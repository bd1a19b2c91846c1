"""``millstream pipeline run|bench`` and ``millstream demo``: the Spark side of millstream from the shell.

These are the only commands that use Spark (the ``spark`` extra: ``pip install "millstream[spark]"``),
and they import ``millstream.spark`` only when they run, so the rest of the CLI works without it.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click

from millstream.cli._group import main
from millstream.cli._logging import configure_logging, report_logging_options

__all__ = ["demo", "pipeline"]


def _need_spark() -> None:
    """A clear message, not an ImportError trace, when the spark extra is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            f"this command needs Spark ({error}): python3 -m pip install \"millstream[spark]\" "
            "(pyspark>=4.2, pyarrow, protobuf) and a Java runtime (17 or later)") from None


def _decimal(ctx: click.Context, param: click.Parameter, value: str) -> Decimal:
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise click.BadParameter(f"{value!r} is not a number") from None
    if not number.is_finite():
        raise click.BadParameter(f"{value!r} is not a finite number")
    return number


@main.group(short_help="The reference Spark pipeline: sensor readings to window aggregates and alerts.")
def pipeline() -> None:
    """The reference Spark Structured Streaming pipeline (millstream.spark.pipeline).

    It reads JSON sensor readings from a stream, parses them, groups them into tumbling event-time
    windows per sensor behind a watermark, computes aggregates and threshold alerts, and writes them
    exactly once to another stream -- through a checkpoint, with the RocksDB state store (changelog
    checkpointing, bounded memory).  `millstream demo` runs it against a workload and checks every
    row.

    \b
    Example, with `millstream standalone --data-dir ./data` running:
      millstream pipeline run --controller tcp://127.0.0.1:9090 \\
          --input iot/sensors --output iot/alerts --checkpoint ./ckpt
    """


@pipeline.command("run", short_help="Run the reference pipeline until stopped (or until caught up).")
@click.option("--controller", required=True, metavar="URI", help="The store: tcp://HOST:PORT.")
@click.option("--input", "input_stream", default="iot/sensors", show_default=True, metavar="SCOPE/STREAM",
              help="The stream of sensor readings (JSON events).")
@click.option("--output", "output_stream", default="iot/alerts", show_default=True, metavar="SCOPE/STREAM",
              help="Where aggregates and alerts go (one JSON event per row).")
@click.option("--checkpoint", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Spark's checkpoint location; run again with the same one to resume.")
@click.option("--window-seconds", type=click.IntRange(1, 86_400), default=10, show_default=True,
              help="The tumbling event-time window.")
@click.option("--watermark-delay-seconds", type=click.IntRange(1, 86_400), default=10, show_default=True,
              help="How far the watermark trails the newest event time (readings later than that are dropped).")
@click.option("--alert-threshold", callback=_decimal, default="80.00", show_default=True, metavar="CELSIUS",
              help="A reading at or above this temperature is hot.")
@click.option("--alert-readings", type=click.IntRange(1), default=3, show_default=True,
              help="A window with at least this many hot readings raises an alert.")
@click.option("--trigger", type=click.Choice(["processing-time", "available-now"]), default="processing-time",
              show_default=True,
              help="processing-time: a micro-batch every --interval until SIGTERM/SIGINT; available-now: "
                   "everything readable at start, then exit.")
@click.option("--interval", type=click.FloatRange(0.0, 3600.0, min_open=True), default=1.0, show_default=True,
              metavar="SECONDS", help="The processing-time trigger's interval.")
@click.option("--max-rows-per-batch", type=click.IntRange(1), default=None, metavar="N",
              help="Admission control: at most N input events per micro-batch (default: all available).")
@click.option("--state-memory-mb", type=click.IntRange(16, 1 << 20), default=256, show_default=True,
              help="RocksDB's memory bound per executor JVM (a soft limit).")
@click.option("--shuffle-partitions", type=click.IntRange(1, 1024), default=2, show_default=True,
              help="Partitions of the window state (fixed by the checkpoint once it exists).")
@click.option("--spark-master", "--master", "master", default="local[2]", show_default=True, metavar="URL",
              help="The Spark master: local[N], or a standalone cluster's spark://HOST:PORT (its executors must "
                   "reach --controller over TCP and import millstream; each gets one core and 512 MiB).")
@report_logging_options
def pipeline_run(controller: str, input_stream: str, output_stream: str, checkpoint: Path, window_seconds: int,
                 watermark_delay_seconds: int, alert_threshold: Decimal, alert_readings: int, trigger: str,
                 interval: float, max_rows_per_batch: int | None, state_memory_mb: int, shuffle_partitions: int,
                 master: str, log_level: str, log_format: str, quiet: bool) -> None:
    """Run the reference pipeline (millstream.spark.pipeline) from --input to --output.

    It prints one `started {...}` line, then one `progress {...}` line of JSON per micro-batch
    (batch id, input and output rows, durations, watermark), and `stopped {...}` when it ends:
    after SIGTERM or Ctrl-C (the query stops; a batch it interrupted is re-run on the next start and
    written once), or, with --trigger available-now, once it has caught up.  A query that fails
    prints `failed {"error": ...}` and exits with status 1.  Spark's own logs go to stderr.
    """
    _need_spark()
    from millstream.errors import InvalidArgumentError
    from millstream.spark.pipeline import PipelineConfig, run

    try:
        config = PipelineConfig(
            controller=controller, input_stream=input_stream, output_stream=output_stream, checkpoint=checkpoint,
            window_seconds=window_seconds, watermark_delay_seconds=watermark_delay_seconds,
            alert_threshold_c=alert_threshold, alert_readings_min=alert_readings, trigger=trigger,
            trigger_interval_seconds=interval, max_rows_per_batch=max_rows_per_batch,
            state_memory_mb=state_memory_mb, shuffle_partitions=shuffle_partitions, master=master)
    except InvalidArgumentError as error:
        raise click.UsageError(str(error)) from None
    configure_logging(log_level, log_format, quiet)
    sys.exit(run(config))


@pipeline.command("bench", short_help="Spark throughput and latency: millstream vs Spark's rate and noop.")
@click.option("--rows", type=click.IntRange(1_000, 100_000_000), default=1_000_000, show_default=True,
              help="Events in the source and sink throughput runs.")
@click.option("--pipeline-seconds", type=click.FloatRange(5.0, 3600.0), default=60.0, show_default=True,
              help="How long the reference pipeline runs for the per-batch latency figures.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store and the checkpoints go (default: a temporary directory, removed after).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the raw figures to this JSON file.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Replace the pipeline's section of this Markdown file (e.g. BENCHMARKS.md), keeping the rest.")
@click.option("--figures", "figures_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Draw rows/s per query into DIR/pipeline-throughput.png (needs the bench extra: matplotlib).")
@click.option("--ceiling", is_flag=True, default=False,
              help="Measure only Spark's own Python data source machinery (a trivial Python source and sink, "
                   "no store) beside Spark's rate source and noop sink: the most any Python data source can reach "
                   "here, in rows/s and per micro-batch.")
def pipeline_bench(rows: int, pipeline_seconds: float, data_dir: Path | None, json_path: Path | None,
                   markdown_path: Path | None, figures_dir: Path | None, ceiling: bool) -> None:
    """Measure the Spark side, everything in one run on this machine:

    \b
      source: rows/s from a millstream stream through the Arrow read path into Spark's noop sink,
              as bytes (all columns, and the value alone) and parsed as JSON, beside Spark's built-in
              rate source into the same sink;
      sink:   rows/s from the rate source into a millstream stream (Arrow and row writers, one
              store transaction per task, fenced commit), beside the rate source into noop;
      pipeline: the reference pipeline's per-micro-batch durations (median, p90, max, and where
              they go) while sensor readings are written at 10,000 events/s.

    Prints a Markdown table with the ratios and targets of issue 21.  With --ceiling, instead: a
    trivial Python streaming source (prebuilt Arrow batches of 100-byte values) and a trivial Python
    Arrow sink (it discards), beside rate -> noop, and the reference pipeline's logic on the rate
    source into that sink beside the same into noop -- the same session settings, no store.

    \b
    Example (what `tox -e bench` runs last):
      millstream pipeline bench --rows 1000000 --pipeline-seconds 30 \\
          --markdown BENCHMARKS.md --figures docs/bench
    """
    _need_spark()
    if ceiling and markdown_path is not None:
        raise click.UsageError("--ceiling measures no millstream query: it does not replace BENCHMARKS.md's section "
                               "(drop --markdown; --json keeps its figures)")
    from millstream.cli.bench import load_benchmarks

    spark_bench = load_benchmarks("bench.pipeline")  # (the clone's bench/pipeline.py; not in the package)
    BenchConfig, bench_main = spark_bench.BenchConfig, spark_bench.main

    command = " ".join(["millstream", *sys.argv[1:]]) if sys.argv[1:2] == ["pipeline"] else "millstream pipeline bench"
    sys.exit(bench_main(BenchConfig(rows=rows, pipeline_seconds=pipeline_seconds, data_dir=data_dir,
                                    json_path=json_path, markdown_path=markdown_path, figures_dir=figures_dir,
                                    ceiling=ceiling),
                        command=command))


@main.command(short_help="The main job: a store, a workload, the Spark pipeline, a driver kill, a verification.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="An empty directory for the store, the checkpoint and the pipeline's logs (kept).  "
                   "Default: a temporary directory, removed afterwards.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=7, show_default=True,
              help="Decides the workload and where the driver is killed.")
@click.option("--sensors", type=click.IntRange(1, 10_000), default=16, show_default=True)
@click.option("--rate", "events_per_second", type=click.IntRange(10, 100_000), default=200, show_default=True,
              metavar="EVENTS/S", help="Readings written per second.")
@click.option("--kills", type=click.IntRange(0, 100), default=1, show_default=True,
              help="How many times the Spark driver is killed (SIGKILL) and restarted from its checkpoint.")
@click.option("--min-write-seconds", type=click.FloatRange(1.0, 3600.0), default=60.0, show_default=True,
              help="Write readings for at least this long...")
@click.option("--max-write-seconds", type=click.FloatRange(1.0, 3600.0), default=360.0, show_default=True,
              help="...and at most this long, however long the input stream takes to split.")
@click.option("--keep", "keep_data", is_flag=True, help="Keep the temporary directory (its path is printed).")
@click.option("--spark-master", default="local[2]", show_default=True, metavar="URL",
              help="Where the pipeline runs: local[N], or a Spark standalone cluster's spark://HOST:PORT (its "
                   "executors reach the demo's store on this machine's loopback, so the cluster runs here too).")
@report_logging_options
def demo(data_dir: Path | None, seed: int, sensors: int, events_per_second: int, kills: int,
         min_write_seconds: float, max_write_seconds: float, keep_data: bool, spark_master: str,
         log_level: str, log_format: str, quiet: bool) -> None:
    """Run the main job and check it, in a few minutes on a laptop.

    \b
    1. start a standalone store (segment store and controller) on loopback;
    2. write a sensor workload (readings keyed by sensor id) into iot/sensors, a stream that
       auto-scales by event rate -- it splits about two minutes in, and the writer follows;
    3. run the reference Spark pipeline (`millstream pipeline run`) as a separate process, SIGKILL
       the Spark driver (every process of its session) mid-run and restart it from its checkpoint;
    4. read both streams back and print a verification table: input events, the expected window
       aggregates and alerts computed in plain Python, output rows, duplicates, missing.

    Exit status 0 and PASS when every expected row is in iot/alerts exactly once; 1 and FAIL
    otherwise.  Needs the spark extra and Java: python3 -m pip install ".[spark]".
    """
    _need_spark()
    from millstream.errors import InvalidArgumentError
    from millstream.spark.demo import DemoConfig, DemoError
    from millstream.spark.demo import main as demo_main

    try:
        config = DemoConfig(data_dir=data_dir, seed=seed, sensors=sensors, events_per_second=events_per_second,
                            kills=kills, min_write_seconds=min_write_seconds, max_write_seconds=max_write_seconds,
                            keep_data=keep_data, spark_master=spark_master)
    except InvalidArgumentError as error:
        raise click.UsageError(str(error)) from None
    configure_logging(log_level, log_format, quiet)
    try:
        status = demo_main(config, out=_echo)
    except (DemoError, InvalidArgumentError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from error
    sys.exit(status)


def _echo(line: Any) -> None:
    click.echo(line)
