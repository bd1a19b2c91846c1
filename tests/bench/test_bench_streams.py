"""The streams benchmark in a tiny configuration, through the CLI: it runs against a real standalone
node and an in-process one, stops by itself, reports every measurement consistently, plots the
scaling run and replaces only its own section of a Markdown file.  No figure here is a speed claim
(a loaded CI machine may be arbitrarily slow), so nothing is compared against a time."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench import large_events, transactions
from bench.cli import _keep_suite_sections
from bench.streams import (
    HOT_KEYS,
    READERS,
    ROUTING_KEYS,
    SCALING_FIGURE,
    SECTION_BEGIN,
    SECTION_END,
    THROUGHPUT,
    ScaledClock,
    repeat_order,
    replace_section,
)
from millstream.cli import main

OTHERS = "# millstream benchmarks\n\n## quick-100B\n\nthe peers harness's tables\n"


def test_repeats_alternate_which_of_keys_and_no_keys_runs_first_at_each_segment_count() -> None:
    first, second = repeat_order(0), repeat_order(1)
    assert sorted(first) == sorted(second) == sorted(THROUGHPUT)
    assert [name for name, _, _ in first] == ["keys-1", "hotkeys-1", "nokeys-1", "keys-16", "nokeys-16"]
    assert [name for name, _, _ in second] == ["nokeys-1", "hotkeys-1", "keys-1", "nokeys-16", "keys-16"]
    assert repeat_order(2) == first and repeat_order(3) == second


def test_a_tiny_run_through_the_cli_measures_everything_and_replaces_only_its_section(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text(f"{OTHERS}\n{SECTION_BEGIN}\nstale figures\n{SECTION_END}\n\n## after\n", encoding="utf-8")
    result = CliRunner().invoke(main, [
        "bench", "--suite", "streams", "--duration", "0.3", "--warmup", "0.1", "--repeat", "1",
        "--scaling-seconds", "2", "--quiet-timeout", "0", "--no-progress", "--output", str(tmp_path / "out"),
        "--data-dir", str(tmp_path / "data"), "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    text = markdown.read_text(encoding="utf-8")
    assert text.startswith(OTHERS) and text.endswith("\n## after\n") and "stale figures" not in text
    assert text.count(SECTION_BEGIN) == text.count(SECTION_END) == 1
    assert "keys / no keys" in text and f"]({SCALING_FIGURE})" in text
    assert (tmp_path / SCALING_FIGURE).read_bytes().startswith(b"\x89PNG")
    assert list((tmp_path / "data").iterdir()) == [], "the benchmark must remove its data"

    report = json.loads((tmp_path / "out" / "streams.json").read_text())
    (repeat,) = report["throughput"]
    assert [(m["name"], m["segments"], m["key_count"]) for m in repeat] == list(repeat_order(0))
    for m in repeat:
        assert m["events"] > 0 and m["window"]["server_cpu_seconds"] is not None
        assert m["keyed"] == (m["key_count"] > 0)
    for segments in ("1", "16"):
        keyed = next(m for m in repeat if m["segments"] == int(segments) and m["key_count"] == ROUTING_KEYS)
        plain = next(m for m in repeat if m["segments"] == int(segments) and not m["keyed"])
        assert report["keys_over_nokeys"][segments] == keyed["events_per_second"] / plain["events_per_second"]
        writer_keys, writer_none = (1e6 * m["window"]["client_cpu_seconds"] / m["events"] for m in (keyed, plain))
        assert f"writer {writer_keys:,.2f} / {writer_none:,.2f} µs" in text  # (one repeat: the medians are these)
    # The control (1 segment only): its own ratio over the same no-keys window, and its line.
    hot = next(m for m in repeat if m["key_count"] == HOT_KEYS)
    plain = next(m for m in repeat if m["segments"] == 1 and not m["keyed"])
    assert hot["segments"] == 1 and list(report["hot_over_nokeys"]) == ["1"]
    assert report["hot_over_nokeys"]["1"] == hot["events_per_second"] / plain["events_per_second"]
    assert f"the control: {HOT_KEYS} keys / no keys = **{report['hot_over_nokeys']['1']:,.3f}**" in text
    assert f"| 1 segment | {HOT_KEYS} random (the control) |" in text
    (e2e,) = report["end_to_end"]
    assert e2e["readers"] == READERS and 0 < e2e["events_read"] <= e2e["events_written"]
    assert e2e["latency"]["count"] == e2e["events_read"] and e2e["latency"]["p50_ms"] > 0
    scaling = report["scaling"]
    assert scaling["samples"] and all(s["segments"] >= 1 for s in scaling["samples"])
    assert scaling["latency"]["count"] > 0


def test_the_section_is_added_once_and_then_replaced() -> None:
    first = replace_section(OTHERS, f"{SECTION_BEGIN}\none\n{SECTION_END}\n")
    assert first.startswith(OTHERS.rstrip("\n")) and first.count(SECTION_BEGIN) == 1
    second = replace_section(first, f"{SECTION_BEGIN}\ntwo\n{SECTION_END}\n")
    assert "one" not in second and "two" in second and second.count(SECTION_BEGIN) == 1


def test_the_scaled_clock_runs_faster_and_sleeps_shorter() -> None:
    clock = ScaledClock(100.0)
    began, real = clock.monotonic(), time.monotonic()
    asyncio.run(clock.sleep(5.0))  # 50 ms of real time
    assert time.monotonic() - real < 2.0
    assert clock.monotonic() - began >= 5.0
    with pytest.raises(ValueError):
        ScaledClock(0.0)


def test_the_peers_harness_rewriting_the_file_keeps_the_streams_section() -> None:
    # (It once kept the transactions and large-events sections only: a quick run dropped this one.)
    sections = [f"{module.SECTION_BEGIN}\n{name} figures\n{module.SECTION_END}\n"
                for module, name in ((transactions, "transactions"), (large_events, "large-events"))]
    ours = f"{SECTION_BEGIN}\nstreams figures\n{SECTION_END}\n"
    existing = OTHERS + "\n" + "\n".join([*sections, ours])
    fresh = "# millstream benchmarks\n\n## quick-100B\n\nnew tables\n"
    rewritten = _keep_suite_sections(fresh, existing)
    assert rewritten == fresh + "\n" + "\n".join([*sections, ours])
    assert _keep_suite_sections(fresh, "") == fresh
    assert _keep_suite_sections(rewritten, rewritten) == rewritten
