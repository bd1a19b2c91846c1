"""The large-events benchmark in its smallest configuration (16 MiB: one event streamed through a
transient segment against two classic 8 MiB events), through the CLI: it runs against a real
standalone node, moves every byte in every scenario, measures each client's memory from outside its
process, stops by itself and replaces only its own section of a Markdown file.  No figure here is a
speed or memory claim (a loaded CI machine may be arbitrarily slow), so nothing is compared against
a time or a size."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bench import large_events
from bench.large_events import SCENARIOS, SECTION_BEGIN, SECTION_END, replace_section, section_of
from millstream.cli import main

OTHERS = "# millstream benchmarks\n\n## quick-100B\n\nthe peers harness's tables\n"


def test_a_tiny_run_through_the_cli_moves_every_byte_and_replaces_only_its_section(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text(f"{OTHERS}\n{SECTION_BEGIN}\nstale figures\n{SECTION_END}\n\n## after\n", encoding="utf-8")
    result = CliRunner().invoke(main, [
        "bench", "--suite", "large-events", "--event-mib", "16", "--repeat", "1", "--quiet-timeout", "0",
        "--no-progress", "--output", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"),
        "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    text = markdown.read_text(encoding="utf-8")
    assert text.startswith(OTHERS) and text.endswith("\n## after\n") and "stale figures" not in text
    assert text.count(SECTION_BEGIN) == text.count(SECTION_END) == 1
    assert "## Large events" in text and "Large ÷ classic throughput" in text
    assert list((tmp_path / "data").iterdir()) == [], "the benchmark must remove its data"

    (raw,) = (tmp_path / "out").glob("large-events-*.json")
    report = json.loads(raw.read_text())
    (repeat,) = report["repeats"]
    assert [m["scenario"] for m in repeat["measurements"]] == list(SCENARIOS)
    for measurement in repeat["measurements"]:
        assert measurement["bytes"] == 16 * large_events.MIB, measurement
        expected_events = 1 if measurement["scenario"].endswith("large") else 2
        assert measurement["events"] == expected_events, measurement
        assert measurement["rss_baseline_bytes"] > 0 and measurement["rss_samples"] >= 1, measurement
        assert measurement["rss_peak_bytes"] >= measurement["rss_baseline_bytes"] or not measurement["peak_reset"]
        assert measurement["client_cpu_seconds"] is not None and measurement["server_cpu_seconds"] is not None
    assert report["write_ratio"] is not None and report["read_ratio"] is not None


def test_the_section_is_added_once_and_then_replaced() -> None:
    first = f"{SECTION_BEGIN}\none\n{SECTION_END}\n"
    document = replace_section(OTHERS, first)
    assert document == OTHERS + "\n" + first and section_of(document) == first
    second = f"{SECTION_BEGIN}\ntwo\n{SECTION_END}\n"
    assert replace_section(document, second) == OTHERS + "\n" + second
    assert section_of(OTHERS) is None
