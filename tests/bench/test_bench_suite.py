"""What the benchmark suites share (``bench._suite``): the CPU of a measured window (whose
share counts as others'), bounded calls, progress, and the report plumbing the suites' JSON files and
BENCHMARKS.md sections are written with."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from bench import limits as bench_limits
from bench._suite import (
    MISSING,
    CpuMeter,
    CpuSpan,
    Repeat,
    Steps,
    Window,
    bounded,
    fixed,
    replace_section,
    section_of,
    write_json,
)
from bench._system import CpuUsage
from millstream.errors import InternalError

#: A pid no process has (above the kernel's largest pid_max, 2**22).
NO_SUCH_PID = 2**31 - 1


def usage(others_cpu_seconds: float, wall_seconds: float = 2.0) -> CpuUsage:
    return CpuUsage(wall_seconds=wall_seconds, own_cpu_seconds=0.5, others_cpu_seconds=others_cpu_seconds,
                    others_percent=0.0, idle_percent=50.0)


def test_others_share_excludes_every_watched_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    # 2 s on 2 CPUs is 4 CPU-seconds: 1.5 s of busy time beyond this process, 0.5 s of it the server's.
    assert CpuSpan(usage(1.5), (0.5,)).others_percent == pytest.approx(25.0)
    assert CpuSpan(usage(1.5), (0.5, 0.25)).others_percent == pytest.approx(18.75)
    assert CpuSpan(usage(1.5), ()).others_percent == pytest.approx(37.5)
    # Coarse ticks can make ours exceed the machine's: never a negative share.
    assert CpuSpan(usage(0.1), (0.5,)).others_percent == 0.0
    # A watched process that could not be read leaves others' share unknown, not counted as noise.
    assert CpuSpan(usage(1.5), (None,)).others_percent is None
    assert CpuSpan(usage(1.5), (0.5, None)).others_percent is None


def test_a_window_is_the_client_the_server_and_everybody_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert Window.of(CpuSpan(usage(1.5), (0.5,))) == Window(2.0, 0.5, 0.5, pytest.approx(25.0))
    assert Window.of(CpuSpan(usage(1.5), ())) == Window(2.0, 0.5, None, pytest.approx(37.5))
    assert Window.of(CpuSpan(usage(1.5), (None,))) == Window(2.0, 0.5, None, None)
    with pytest.raises(InternalError):
        Window.of(CpuSpan(usage(1.5), (0.5, 0.5)))
    # The JSON the suites write names these fields in this order.
    assert [field.name for field in attrs.fields(Window)] == [
        "wall_seconds", "client_cpu_seconds", "server_cpu_seconds", "others_percent"]


def test_the_meter_reads_a_busy_child_process_and_says_when_one_is_gone() -> None:
    busy = "import time\nend = time.perf_counter() + 0.4\nwhile time.perf_counter() < end: pass\nprint('done')"
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter(child.pid, NO_SUCH_PID)
        meter.mark()
        with pytest.raises(InternalError):
            meter.span()  # one end is not a window
        meter.check_invariants()
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        meter.mark()  # (the child has finished its loop but not exited: its counters are still there)
        meter.check_invariants()
    finally:
        child.wait(timeout=bench_limits.BENCH_SERVER_STOP_TIMEOUT_SECONDS)
    span = meter.span()
    child_cpu, gone = span.processes
    assert child_cpu is not None and child_cpu > 0.0, "the child spun a CPU for 0.4 s"
    assert gone is None and span.others_percent is None
    assert span.usage.wall_seconds > 0.0
    with pytest.raises(InternalError):
        meter.mark()  # a window has two ends

    alone = CpuMeter()
    alone.mark()
    alone.mark()
    window = alone.window()
    assert window.server_cpu_seconds is None and window.others_percent is not None and window.others_percent >= 0.0


def test_a_bounded_call_returns_its_result_or_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    async def answer() -> int:
        return 42

    async def never() -> None:
        await asyncio.Event().wait()

    assert asyncio.run(bounded(answer())) == 42
    monkeypatch.setattr(bench_limits, "BENCH_DRIVER_CALL_TIMEOUT_SECONDS", 0.05)
    with pytest.raises(TimeoutError):
        asyncio.run(bounded(never()))


def test_steps_count_for_the_progress_indicator() -> None:
    seen: list[tuple[int, int, str]] = []
    steps = Steps(2, lambda done, total, label: seen.append((done, total, label)))
    steps.next("one")
    steps.next("two")
    steps.finish()
    assert seen == [(0, 2, "one"), (1, 2, "two"), (2, 2, "done")]
    quiet = Steps(1, None)  # nobody watching: counts all the same
    quiet.next("one")
    quiet.finish()
    assert quiet.done == 1


@attrs.frozen
class _Measured:
    scenario: str
    value: float | None


@attrs.frozen
class _Machine:
    date_utc: str


@attrs.frozen
class _Report:
    suite: str
    machine: _Machine
    repeats: list[Repeat[_Measured]]


def test_a_report_is_written_as_json_named_by_suite_and_date(tmp_path: Path) -> None:
    repeat = Repeat([_Measured("a", 1.5), _Measured("b", None)])
    assert repeat.of("b") == _Measured("b", None)
    with pytest.raises(StopIteration):
        repeat.of("c")
    report = _Report("demo", _Machine("2026-11-22T23:31:28Z"), [repeat])
    path = write_json(report, tmp_path / "out")
    assert path == tmp_path / "out" / "demo-20261122T233128Z.json"
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "suite": "demo",')
    assert json.loads(text) == {"suite": "demo", "machine": {"date_utc": "2026-11-22T23:31:28Z"}, "repeats": [
        {"measurements": [{"scenario": "a", "value": 1.5}, {"scenario": "b", "value": None}]}]}


def test_figures_are_fixed_point_with_a_dash_for_none() -> None:
    assert fixed(1234.5678, 2) == "1,234.57"
    assert fixed(0.0, 0) == "0"
    assert fixed(None, 3) == MISSING == "—"


BEGIN, END = "<!-- demo: begin -->", "<!-- demo: end -->"
OTHERS = "# benchmarks\n\nsomeone else's tables\n"


def test_a_section_is_added_once_replaced_in_place_and_found() -> None:
    first = f"{BEGIN}\none\n{END}\n"
    added = replace_section(OTHERS, first, BEGIN, END)
    assert added == OTHERS + "\n" + first
    assert replace_section("", first, BEGIN, END) == first
    assert replace_section("\n\n", first, BEGIN, END) == first
    second = f"{BEGIN}\ntwo\n{END}\n"
    around = added + "## after\n"
    replaced = replace_section(around, second, BEGIN, END)
    assert replaced == OTHERS + "\n" + second + "## after\n"
    assert section_of(replaced, BEGIN, END) == second
    assert section_of(OTHERS, BEGIN, END) is None
    # Markers out of order are not a section: appended, not spliced.
    backwards = f"{END}\n{BEGIN}\n"
    assert section_of(backwards, BEGIN, END) is None
    assert replace_section(backwards, first, BEGIN, END) == backwards + "\n" + first


def test_steal_is_counted_as_others_and_reported_as_the_part_of_it_that_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hypervisor's steal is busy time no process of this machine used: it stays in others' share
    (the machine was not ours to use), and is also reported on its own, never above that share."""
    from bench._system import CpuSample

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.sysconf", lambda name: 100)  # 100 ticks a second
    start = CpuSample(at_seconds=10.0, busy_ticks=1_000, total_ticks=5_000, own_cpu_seconds=1.0, steal_ticks=200)
    # 2 s on 2 CPUs = 400 ticks of capacity; 300 busy ticks, 50 of them ours, 120 of them stolen.
    end = CpuSample(at_seconds=12.0, busy_ticks=1_300, total_ticks=5_400, own_cpu_seconds=1.5, steal_ticks=320)
    usage = CpuUsage.between(start, end)
    assert usage.others_cpu_seconds == pytest.approx(2.5)
    assert usage.others_percent == pytest.approx(62.5) and usage.steal_percent == pytest.approx(30.0)
    assert usage.idle_percent == pytest.approx(25.0)
    # Coarse ticks: steal can never be reported above others' share.
    ours = CpuSample(at_seconds=12.0, busy_ticks=1_300, total_ticks=5_400, own_cpu_seconds=3.9, steal_ticks=320)
    capped = CpuUsage.between(start, ours)
    assert capped.steal_percent == capped.others_percent == pytest.approx(2.5)  # (3.0 - 2.9) s of 4
