"""The write-path benchmark in a tiny configuration: it runs, stops by itself, and reports what it
should -- structure and internal consistency only.  No figure here is a speed claim (a loaded CI machine
may be arbitrarily slow), so nothing is compared against a time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench._container import WRITER_ID, _keep_blocks_in_flight, _Phase, block_of_events
from bench._report import render_markdown
from bench._stats import Latency, percentile
from bench._system import choose_data_root, filesystem_of
from bench.scenarios import SCENARIOS, Mode, Scenario, scenarios_named
from bench.write_path import (
    WritePathConfig,
    WritePathReport,
    raw_batch_records,
    run_write_path,
    steps_per_repeat,
    write_json,
)
from millstream import __version__
from millstream.cli import main
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.file_log import FileLog
from millstream.wire.codec import count_events, iter_events

TINY = WritePathConfig(duration_seconds=0.2, warmup_seconds=0.0, repeat=2, quiet_timeout_seconds=0.0,
                       bytes_max=4 * 1024 * 1024)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> WritePathReport:
    steps: list[tuple[int, int, str]] = []
    data_root = tmp_path_factory.mktemp("bench-data")
    result = run_write_path(TINY, data_root, "test", lambda done, total, step: steps.append((done, total, step)))
    # One step per measurement (a probe, container and raw loop per scenario, the per-append floor, per
    # repeat), then "done".
    assert steps_per_repeat(TINY) == 1 + 2 * len(SCENARIOS) + 1
    total = TINY.repeat * steps_per_repeat(TINY)
    assert steps == [(done, total, steps[done][2]) for done in range(total)] + [(total, total, "done")]
    assert list(data_root.iterdir()) == [], "the benchmark must remove its data"
    return result


def test_every_scenario_is_measured_and_counted_consistently(report: WritePathReport) -> None:
    assert [summary.scenario for summary in report.scenarios] == [scenario.name for scenario in SCENARIOS]
    assert len(report.repeats) == TINY.repeat
    for repeat in report.repeats:
        assert repeat.fdatasync.syncs == repeat.fdatasync.latency.count >= 1
        assert set(repeat.scenarios) == {scenario.name for scenario in SCENARIOS}
        for scenario in SCENARIOS:
            result = repeat.scenarios[scenario.name]
            container, raw = result.container, result.group_commit
            assert container.appends == container.latency.count >= 1
            assert container.events == container.appends * scenario.events_per_append
            assert container.frames >= 1 and container.fdatasyncs >= 1
            assert container.appends_per_fdatasync == pytest.approx(container.appends / container.fdatasyncs)
            assert raw.records == raw.batches * raw.batch_records >= 1
            assert raw.batch_records == raw_batch_records(scenario, container)
            if scenario.per_event:
                # Blocks: the raw loop wrote as many bytes per fdatasync as the container did.
                assert container.log_bytes_per_fdatasync is not None
                assert raw.batch_records == max(1, round(container.log_bytes_per_fdatasync / scenario.record_bytes))
                assert container.events_per_second == pytest.approx(
                    container.appends_per_second * scenario.events_per_append)
            else:
                # The raw loop ran at the batch size the container achieved.
                assert raw.batch_records == max(1, round(container.appends_per_fdatasync))
                assert container.events_per_second == container.appends_per_second
            assert result.throughput_ratio == pytest.approx(container.events_per_second / raw.records_per_second)
            assert not container.quiet.quiet and container.quiet.waited_seconds == 0.0  # timeout 0: no wait
            # Awaiting appenders never have more in flight than there are of them.
            if scenario.window == 1:
                assert container.appends_per_fdatasync <= scenario.appenders


def test_targets_are_ratios_of_the_same_run(report: WritePathReport) -> None:
    throughput, ceiling, block, latency_p95, latency_p50 = report.targets
    assert throughput.per_repeat == [repeat.scenarios["pipelined-100B"].throughput_ratio for repeat in report.repeats]
    assert throughput.bound == 0.40 and throughput.at_least and throughput.met is not None
    # The ceiling: a store that costs nothing, driven as pipelined-100B is, over that scenario's raw loop.
    assert ceiling.bound is None and ceiling.met is None
    floors = [repeat.floor for repeat in report.repeats]
    assert all(floor is not None and floor.appends >= 1 and floor.window == 1000 for floor in floors)
    assert ceiling.per_repeat == [
        pytest.approx(floor.appends_per_second / repeat.scenarios["pipelined-100B"].group_commit.records_per_second)
        for floor, repeat in zip(floors, report.repeats, strict=True) if floor is not None]
    # Events in blocks: informational, never a target of its own.
    assert block.bound is None and block.met is None and "informational" in block.description
    assert block.per_repeat == [repeat.scenarios["block-100B"].throughput_ratio for repeat in report.repeats]
    assert latency_p95.bound == 2.0 and not latency_p95.at_least and latency_p95.met is not None
    assert latency_p50.bound is None and latency_p50.met is None
    first = report.repeats[0]
    assert latency_p95.per_repeat[0] == pytest.approx(
        first.scenarios["lone-100B"].container.latency.p95_ms / first.fdatasync.latency.p95_ms)


def test_markdown_and_json_carry_the_report(report: WritePathReport, tmp_path: Path) -> None:
    markdown = render_markdown(report)
    for scenario in SCENARIOS:
        assert f"| {scenario.name} |" in markdown
    assert "### Targets" in markdown and "fdatasync" in markdown
    assert "per-append ceiling" in markdown and "travelling in blocks" in markdown
    # A block scenario's row is in the block table only, not among the per-append rows.
    per_append, _, rest = markdown.partition("### The per-append ceiling")
    assert "| block-100B |" not in per_append and "| block-100B |" in rest
    document = json.loads(write_json(report, tmp_path / "out").read_text())
    assert document["suite"] == "write-path"
    assert {"cpu_count", "cpu_model", "kernel", "python", "data_dir_filesystem", "date_utc"} <= set(
        document["machine"])
    assert [s["name"] for s in document["config"]["scenarios"]] == [s.name for s in SCENARIOS]
    assert [t["met"] for t in document["targets"]] == [t.met for t in report.targets]
    assert set(document["repeats"][0]["scenarios"]["lone-100B"]) == {"container", "group_commit", "throughput_ratio"}


def test_cli_runs_one_scenario(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "bench", "--suite", "write-path", "--scenario", "lone-100B", "--repeat", "1", "--duration", "0.05",
        "--warmup", "0", "--quiet-timeout", "0", "--no-progress", "--output", str(tmp_path / "out"),
        "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert "| lone-100B |" in result.stdout and "pipelined-100B" not in result.stdout
    [written] = (tmp_path / "out").glob("write-path-*.json")
    assert json.loads(written.read_text())["config"]["repeat"] == 1


def test_cli_version_help_and_bad_scenario() -> None:
    runner = CliRunner()
    assert __version__ in runner.invoke(main, ["--version"]).output
    help_text = runner.invoke(main, ["bench", "--help"]).output
    assert "--suite" in help_text and "pipelined-100B" in help_text
    result = runner.invoke(main, ["bench", "--scenario", "nonsense"])
    assert result.exit_code == 2 and "nonsense" in result.output


def test_helpers() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert Latency.of([]).p95_ms is None
    assert scenarios_named(["pipelined-10KB", "lone-100B"]) == (SCENARIOS[0], SCENARIOS[5])
    with pytest.raises(ValueError, match="nonsense"):
        scenarios_named(["nonsense"])
    assert filesystem_of(Path("/proc")).type == "proc"
    assert choose_data_root(Path("/somewhere"), Path("/tmp"), Path.cwd()) == (Path("/somewhere"), "--data-dir")


def test_the_tiering_suite_measures_both_ratios_on_a_tiny_run(tmp_path: Path) -> None:
    from bench.tiering import TieringConfig, render_tiering_markdown, run_tiering, write_tiering_json

    config = TieringConfig(duration_seconds=0.2, warmup_seconds=0.05, repeat=1, catch_up_bytes=4 * 1024 * 1024,
                           quiet_timeout_seconds=0.0)
    report = run_tiering(config, tmp_path)
    (repeat,) = report.repeats
    assert repeat.ingest_off.appends > 0 and repeat.ingest_on.appends > 0
    assert not repeat.ingest_off.tiering and repeat.ingest_on.tiering
    assert repeat.catch_up.megabytes >= 4 * 1024 * 1024 / 1e6
    assert repeat.catch_up.tier_two_reads >= 4, "the catch-up reader read evicted bytes back from Tier 2"
    assert report.catch_up_ratio is not None and report.catch_up_ratio > 0
    assert report.tiering_cost_ratio is not None and report.tiering_cost_ratio > 0
    assert "catch-up read from Tier 2" in render_tiering_markdown(report)
    assert write_tiering_json(report, tmp_path / "out").read_text().startswith("{")


def test_blocks_are_framed_events_chained_by_event_number(tmp_path: Path) -> None:
    block = block_of_events(100, 7)
    assert count_events(block) == 7 and list(iter_events(block)) == [bytes(100)] * 7

    async def run() -> tuple[int, dict[int, int]]:
        async with SegmentContainer(0, FileLog(tmp_path / "log")) as container:
            await container.create_segment("bench")
            phase = _Phase(issued_max=5)
            # Three blocks in flight at once: each compares with the event number of the block before
            # it, which is still in flight -- the chain holds only if every one of them is stored.
            await _keep_blocks_in_flight(container, block, 7, 3, phase)
            info = container.get_info("bench")
            return info.length, info.attributes

    length, attributes = asyncio.run(run())
    assert length == 5 * len(block)
    assert attributes == {WRITER_ID: 5 * 7}


def test_only_a_block_scenario_carries_several_events_per_append() -> None:
    assert Scenario(Mode.BLOCK, 100, window=4, events_per_append=1000).name == "block-100B"
    with pytest.raises(ValueError, match="block"):
        Scenario(Mode.BLOCK, 100)
    with pytest.raises(ValueError, match="block"):
        Scenario(Mode.PIPELINED, 100, window=10, events_per_append=10)
