"""Latency-versus-throughput plots of a harness report (PNG, matplotlib's Agg backend, no display).

One figure per workload, as the seed's figures: throughput on x, latency on y, a line per system
through its offered rates.  Latency is the 95th percentile (the seed's choice; the tables give p50
and p99 too) and always on a log scale; throughput is events/s on a log scale for small events, MB/s
on a linear scale for large ones (>= 1,000 bytes), as the seed plots them.  Systems at millstream's
durability are solid lines; default-durability peers dotted, and labelled so.  A workload with tail
readers gets a second panel with end-to-end latency.

``matplotlib`` is imported only here, when plotting (the ``bench`` extra installs it); a report can
be rendered as Markdown without it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Final

from bench.harness import HarnessReport, StepResult, SystemRun

__all__ = ["LARGE_EVENT_BYTES", "plot_report", "plot_workload", "points"]

#: Events at least this large are plotted against MB/s on a linear axis, smaller ones against events/s.
LARGE_EVENT_BYTES: Final = 1000

_COLOURS: Final = {"millstream": "#1b6ac9", "nats-jetstream": "#2a9d3c", "redis-streams": "#c9301b",
                   "nats-jetstream-default": "#2a9d3c", "redis-streams-everysec": "#c9301b"}


def points(run: SystemRun, *, end_to_end: bool, megabytes: bool) -> list[tuple[float, float]]:
    """(throughput, p95 ms) of each successful step of a run, in order of throughput."""
    result = []
    for step in run.steps:
        x = _throughput(step, megabytes)
        latency = step.end_to_end_latency if end_to_end else step.write_latency
        if step.error is None and x and latency is not None and latency.p95_ms is not None:
            result.append((x, max(latency.p95_ms, 1e-3)))
    return sorted(result)


def _throughput(step: StepResult, megabytes: bool) -> float | None:
    return step.achieved_megabytes_per_second if megabytes else step.achieved_events_per_second


def plot_workload(report: HarnessReport, workload_name: str, path: Path) -> Path | None:
    """Write the figure of one workload to ``path``; None if no system has a point to plot."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    workload = next(w for w in report.config.workloads if w.name == workload_name)
    runs = [run for run in report.runs_of(workload_name) if run.steps]
    megabytes = workload.event_bytes >= LARGE_EVENT_BYTES
    panels = [False, True] if workload.consumers else [False]
    if not any(points(run, end_to_end=panel, megabytes=megabytes) for run in runs for panel in panels):
        return None
    figure = Figure(figsize=(6.4 * len(panels), 4.4), dpi=100, layout="constrained")
    for index, end_to_end in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        _panel(axes, runs, end_to_end=end_to_end, megabytes=megabytes)
    figure.suptitle("\n".join(textwrap.wrap(f"{workload.name}: {workload.description}", 60 * len(panels))),
                    fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", metadata={"Software": None})
    return path


def _panel(axes: Any, runs: list[SystemRun], *, end_to_end: bool, megabytes: bool) -> None:
    labelled: set[str] = set()
    for run in runs:  # a system's repeated sweeps: one colour, one legend entry
        series = points(run, end_to_end=end_to_end, megabytes=megabytes)
        if not series:
            continue
        xs, ys = zip(*series, strict=True)
        label = None if run.system in labelled else run.title
        labelled.add(run.system)
        axes.plot(xs, ys, marker="o", markersize=4, linewidth=1.5, linestyle="-" if run.equal_durability else ":",
                  color=_COLOURS.get(run.system), label=label)
    axes.set_yscale("log")
    if not megabytes:
        from matplotlib.ticker import NullFormatter

        axes.set_xscale("log")
        axes.xaxis.set_minor_formatter(NullFormatter())  # minor labels (3 x 10^3, 4 x 10^3 ...) overlap
    axes.set_xlabel("throughput (MB/s)" if megabytes else "throughput (events/s)")
    axes.set_ylabel(("end-to-end" if end_to_end else "write") + " latency p95 (ms)")
    axes.grid(True, which="both", linewidth=0.3, alpha=0.6)
    axes.legend(fontsize=7)


def plot_report(report: HarnessReport, directory: Path) -> dict[str, Path]:
    """Every workload's figure as ``<directory>/<suite>-<workload>.png``; workload name -> path."""
    written = {}
    for workload in report.config.workloads:
        path = plot_workload(report, workload.name, directory / f"{report.suite}-{workload.name}.png")
        if path is not None:
            written[workload.name] = path
    return written
