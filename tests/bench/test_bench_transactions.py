"""The transactions benchmark in a tiny configuration, through the CLI: it runs against a real
standalone node, stops by itself, reports every scenario consistently and replaces only its own
section of a Markdown file.  No figure here is a speed claim (a loaded CI machine may be arbitrarily
slow), so nothing is compared against a time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from click.testing import CliRunner

from bench.transactions import (
    EVENTS_PER_TXN,
    SCENARIOS,
    SECTION_BEGIN,
    SECTION_END,
    _Clock,
    replace_section,
    section_of,
)
from millstream.cli import main

OTHERS = "# millstream benchmarks\n\n## quick-100B\n\nthe peers harness's tables\n"


def test_a_tiny_run_through_the_cli_measures_every_scenario_and_replaces_only_its_section(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text(f"{OTHERS}\n{SECTION_BEGIN}\nstale figures\n{SECTION_END}\n\n## after\n", encoding="utf-8")
    result = CliRunner().invoke(main, [
        "bench", "--suite", "transactions", "--duration", "0.4", "--warmup", "0.1", "--repeat", "1",
        "--quiet-timeout", "0", "--no-progress", "--output", str(tmp_path / "out"), "--data-dir",
        str(tmp_path / "data"), "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    text = markdown.read_text(encoding="utf-8")
    assert text.startswith(OTHERS) and text.endswith("\n## after\n") and "stale figures" not in text
    assert text.count(SECTION_BEGIN) == text.count(SECTION_END) == 1
    assert "## Stream transactions" in text and "Transactional ÷ plain" in text
    assert list((tmp_path / "data").iterdir()) == [], "the benchmark must remove its data"

    (raw,) = (tmp_path / "out").glob("transactions-*.json")
    report = json.loads(raw.read_text())
    (repeat,) = report["repeats"]
    measured = {m["scenario"]: m for m in repeat["measurements"]}
    assert list(measured) == list(SCENARIOS)
    for name in ("serial", "concurrent"):
        m = measured[name]
        assert m["transactions"] >= 1, f"{name}: no transaction became visible in the window"
        assert m["events"] == m["transactions"] * EVENTS_PER_TXN
        assert m["commit_latency"]["count"] == m["decided_latency"]["count"] == m["transactions"]
        assert m["commit_latency"]["p50_ms"] >= m["decided_latency"]["p50_ms"] > 0, "COMMITTED comes after COMMITTING"
    assert measured["serial"]["lanes"] == 1 and measured["concurrent"]["lanes"] > 1
    for name in ("plain", "plain-flushed"):
        assert measured[name]["events"] >= EVENTS_PER_TXN and measured[name]["events"] % EVENTS_PER_TXN == 0
    for m in measured.values():
        assert m["window"]["wall_seconds"] > 0 and m["window"]["server_cpu_seconds"] is not None
    plain = measured["plain"]["events_per_second"]
    assert report["transactional_over_plain"] == measured["concurrent"]["events_per_second"] / plain


def test_the_section_is_added_once_and_then_replaced() -> None:
    first = f"{SECTION_BEGIN}\none\n{SECTION_END}\n"
    added = replace_section(OTHERS, first)
    assert added == OTHERS + "\n" + first
    second = f"{SECTION_BEGIN}\ntwo\n{SECTION_END}\n"
    assert replace_section(added, second) == OTHERS + "\n" + second
    assert replace_section("", first) == first
    assert section_of(OTHERS) is None and section_of(replace_section(added, second) + "## after\n") == second


def test_a_window_that_saw_no_transaction_by_its_end_stays_open_for_the_first() -> None:
    """On a loaded machine a short window may end before any commit is visible: it must then wait for
    the first one (bounded), not report an empty measurement."""
    clock = _Clock(0.0, 0.0, os.getpid())
    assert clock.running(), "nothing counted yet: the lanes go on past the nominal end"
    seen = time.perf_counter()
    assert clock.count(seen) and clock.counted == 1 and clock.end == seen
    assert not clock.count(time.perf_counter()), "the window closed at its first transaction"
    assert not clock.running() and clock.seconds == seen - clock.start
    ordinary = _Clock(0.0, 3600.0, os.getpid())
    assert ordinary.count(time.perf_counter()) and ordinary.count(time.perf_counter()) and ordinary.counted == 2
