"""The transactions suite: stream transactions per second, their commit latency, and transactional
against plain writing of the same events -- all in the same run, against one standalone node.

Setup.  A ``millstream standalone`` node in a process of its own (the harness's server command: durable
FileLog, fdatasync before every acknowledgement, Tier 2 in its data directory, the controller on the
same port, its transaction workflows on) and this process as the client, both on 127.0.0.1.  One
stream of ``segments`` fixed segments; every event is ``EVENT_BYTES`` bytes with a routing key drawn
in turn from ``ROUTING_KEYS`` keys, so a transaction's events land in every segment and its commit
merges one transaction segment per segment.

Measurements, each ``warmup_seconds`` unmeasured then ``duration_seconds`` measured, in every repeat
(the report gives medians over repeats):

* ``serial``: one transaction at a time -- ``begin``, ``EVENTS_PER_TXN`` events, ``commit`` (flush,
  then the controller records COMMITTING), then the status is asked until it is COMMITTED.  The
  commit latency is from the ``commit`` call to the first answer saying COMMITTED (the merges done and
  recorded: what every reader of every key sees); the status is asked every ``POLL_SECONDS``, so the
  figure is late by at most that.
* ``concurrent``: ``concurrency`` such lanes at once (commits queue in commit order at the
  controller; each lane asks every ``POLL_SECONDS * concurrency``, so the status requests add up to
  the same rate).  Transactions per second and latency under load.
* ``plain``: one ordinary ``EventStreamWriter`` writing the same events (same sizes, same keys),
  pipelined, with no flush until the end of the window; events/s is the events written over the time
  until that flush returned (all of them durable).  The ratio is transactional events/s
  (``concurrent``: committed and visible) over plain events/s.
* ``plain-flushed``: the same writer flushing after every ``EVENTS_PER_TXN`` events -- the durability
  points of a transaction per group, without its commit.

A transaction counts in the window where its COMMITTED was seen.  A window never closes empty: if no
transaction was seen COMMITTED by its nominal end (a loaded machine, a tiny ``duration_seconds``), it
stays open until the first one is, at most ``limits.TRANSACTION_COMPLETION_WAIT_SECONDS`` longer, and
rates divide by the window's real length.  Every measurement records the CPU
of this process, of the server and of everything else on the machine (others' CPU: the machine is
shared; quote medians).  Every wait is bounded: calls by ``bench.limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS``,
a commit's visibility by ``limits.TRANSACTION_COMPLETION_WAIT_SECONDS``, the server's start and stop
by the harness's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

import millstream
from bench import _suite
from bench._stats import Latency, LatencySamples, median_or_none
from bench._suite import CpuMeter, Progress, Repeat, Steps, Window, bounded, fixed, standalone_server
from bench._system import MachineDescription, QuietWait, describe_machine, wait_until_quiet
from millstream import limits

__all__ = ["TransactionsConfig", "TransactionsReport", "render_transactions_markdown", "replace_section",
           "run_transactions", "section_of", "write_transactions_json"]

SUITE_NAME: Final = "transactions"
#: The issue's unit of work: a transaction of 100 events of 100 bytes.
EVENTS_PER_TXN: Final = 100
EVENT_BYTES: Final = 100
#: Routing keys used in turn (many more than segments, so every transaction touches every segment).
ROUTING_KEYS: Final = 64
#: How often a waiting transaction's status is asked: the latency's resolution, against the load the
#: requests put on the controller (one lane asking every 2 ms is at most 500 small requests a second).
POLL_SECONDS: Final = 0.002
SCOPE: Final = "bench"
STREAM: Final = "transactions"
#: Where the generated section of BENCHMARKS.md begins and ends (the rest of the file is the peers
#: harness's, which rewrites it; this suite replaces only what lies between the markers).
SECTION_BEGIN: Final = "<!-- millstream bench --suite transactions: begin -->"
SECTION_END: Final = "<!-- millstream bench --suite transactions: end -->"
SCENARIOS: Final = ("serial", "concurrent", "plain", "plain-flushed")


@attrs.frozen
class TransactionsConfig:
    duration_seconds: float = 5.0
    warmup_seconds: float = 1.0
    repeat: int = 3
    segments: int = 4
    concurrency: int = 8
    quiet_idle_percent_min: float = 80.0
    quiet_timeout_seconds: float = 20.0


@attrs.frozen
class Measurement:
    scenario: str
    lanes: int
    poll_seconds: float | None
    transactions: int  # committed and seen COMMITTED in the window (0 for plain)
    events: int  # in the window: committed transactions' events, or plain events acknowledged
    transactions_per_second: float | None
    events_per_second: float
    megabytes_per_second: float
    commit_latency: Latency | None  # commit call -> COMMITTED seen
    decided_latency: Latency | None  # commit call -> COMMITTING answered (flush + the decision)
    window: Window
    quiet: QuietWait


@attrs.frozen
class Summary:
    """A scenario's medians over the repeats."""

    scenario: str
    transactions_per_second: float | None
    events_per_second: float | None
    megabytes_per_second: float | None
    commit_p50_ms: float | None
    commit_p95_ms: float | None
    decided_p50_ms: float | None
    decided_p95_ms: float | None
    others_percent: float | None
    client_cpu_us_per_event: float | None
    server_cpu_us_per_event: float | None


@attrs.frozen
class TransactionsReport:
    suite: str
    machine: MachineDescription
    config: TransactionsConfig
    repeats: list[Repeat[Measurement]]
    summaries: list[Summary]
    transactional_over_plain: float | None  # median over repeats of concurrent events/s ÷ plain events/s
    wall_seconds: float

    def summary(self, scenario: str) -> Summary:
        return next(s for s in self.summaries if s.scenario == scenario)


# --- the client side -----------------------------------------------------------------------------------


def _keys() -> list[str]:
    return [f"key-{n}" for n in range(ROUTING_KEYS)]


class _Clock:
    """The window: which instants count, and the CPU at its ends.  A transactional window that saw no
    transaction COMMITTED by its nominal end stays open until the first one is (at most
    ``limits.TRANSACTION_COMPLETION_WAIT_SECONDS`` longer): an empty window measures nothing."""

    def __init__(self, warmup: float, duration: float, server_pid: int) -> None:
        now = time.perf_counter()
        self.start = now + warmup
        self.end = self.start + duration
        self.limit = self.end + limits.TRANSACTION_COMPLETION_WAIT_SECONDS
        self.cpu = CpuMeter(server_pid)
        self.counted = 0
        self._closed = asyncio.Event()

    @property
    def seconds(self) -> float:
        """The window's length (its nominal duration unless it had to wait for a first transaction)."""
        return self.end - self.start

    def count(self, at: float) -> bool:
        """Whether a transaction seen COMMITTED at ``at`` counts; the first one after an empty
        window's nominal end counts and closes the window there."""
        if self.start <= at < self.end:
            self.counted += 1
            return True
        if at >= self.end and self.counted == 0 and at < self.limit:
            self.end = at  # (the window closes at the first transaction seen: it counts, nothing after it)
            self.counted = 1
            self._closed.set()
            return True
        return False

    def running(self) -> bool:
        now = time.perf_counter()
        return now < self.end or (self.counted == 0 and now < self.limit)

    async def sample(self, *, wait_for_first: bool) -> None:
        """Read the CPU counters at the window's start and at its end (if ``wait_for_first``, the end
        of a window that had to wait for its first transaction: bounded by ``limit``)."""
        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        self.cpu.mark()
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        if wait_for_first and self.counted == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), max(0.0, self.limit - time.perf_counter()))
        self.cpu.mark()


async def _visible(txn: Any, poll_seconds: float) -> float:
    """Ask for ``txn``'s status every ``poll_seconds`` until it is COMMITTED; the time it was seen."""
    from millstream.client import TransactionStatus

    deadline = time.perf_counter() + limits.TRANSACTION_COMPLETION_WAIT_SECONDS
    while True:
        status = await bounded(txn.check_status())
        seen = time.perf_counter()
        if status is TransactionStatus.COMMITTED:
            return seen
        if status is not TransactionStatus.COMMITTING:
            raise RuntimeError(f"transaction {txn.txn_id} became {status.value}, not committed")
        if seen >= deadline:
            raise RuntimeError(f"transaction {txn.txn_id} was not committed after "
                               f"{limits.TRANSACTION_COMPLETION_WAIT_SECONDS} s")
        await asyncio.sleep(poll_seconds)


async def _transactions(client: Any, lanes: int, config: TransactionsConfig, server_pid: int,
                        quiet: QuietWait, scenario: str) -> Measurement:
    writer = client.transactional_writer(f"{SCOPE}/{STREAM}")
    keys = _keys()
    payload = bytes(EVENT_BYTES)
    poll = POLL_SECONDS * lanes
    clock = _Clock(config.warmup_seconds, config.duration_seconds, server_pid)
    committed = LatencySamples()
    decided = LatencySamples()

    async def lane(number: int) -> None:
        turn = number
        while clock.running():
            txn = await bounded(writer.begin())
            for _ in range(EVENTS_PER_TXN):
                await txn.write_event(payload, routing_key=keys[turn % ROUTING_KEYS])
                turn += 1
            started = time.perf_counter()
            await bounded(txn.commit())
            answered = time.perf_counter()
            seen = await _visible(txn, poll)
            if clock.count(seen):
                committed.add(seen - started)
                decided.add(answered - started)

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(clock.sample(wait_for_first=True))
            for number in range(lanes):
                group.create_task(lane(number))
    finally:
        await bounded(writer.close())
    window = clock.cpu.window()
    counted = clock.counted
    events = counted * EVENTS_PER_TXN
    seconds = clock.seconds
    return Measurement(
        scenario=scenario, lanes=lanes, poll_seconds=poll, transactions=counted, events=events,
        transactions_per_second=counted / seconds, events_per_second=events / seconds,
        megabytes_per_second=events * EVENT_BYTES / seconds / 1e6,
        commit_latency=committed.summary() if counted else None, decided_latency=decided.summary() if counted else None,
        window=window, quiet=quiet)


async def _plain(client: Any, config: TransactionsConfig, server_pid: int, quiet: QuietWait, *, flushed: bool,
                 ) -> Measurement:
    """Write for the warm-up and flush; then write for the duration and flush (also after every group
    of ``EVENTS_PER_TXN`` if ``flushed``): events/s is every event of the second part over the time
    until its last flush returned (all of them durable)."""
    writer = client.event_writer(f"{SCOPE}/{STREAM}")
    keys = _keys()
    payload = bytes(EVENT_BYTES)
    clock = _Clock(config.warmup_seconds, config.duration_seconds, server_pid)

    async def write_until(end: float) -> int:
        written = turn = 0
        while time.perf_counter() < end:
            for _ in range(EVENTS_PER_TXN):
                await writer.write_event(payload, routing_key=keys[turn % ROUTING_KEYS])
                turn += 1
            written += EVENTS_PER_TXN
            if flushed:
                await bounded(writer.flush())
        await bounded(writer.flush())
        return written

    try:
        await write_until(clock.start)
        clock.cpu.mark()
        started = time.perf_counter()
        counted = await write_until(started + config.duration_seconds)
        elapsed = time.perf_counter() - started
        clock.cpu.mark()
    finally:
        await bounded(writer.close())
    return Measurement(
        scenario="plain-flushed" if flushed else "plain", lanes=1, poll_seconds=None, transactions=0, events=counted,
        transactions_per_second=None, events_per_second=counted / elapsed,
        megabytes_per_second=counted * EVENT_BYTES / elapsed / 1e6, commit_latency=None, decided_latency=None,
        window=clock.cpu.window(), quiet=quiet)


async def _measure(port: int, scenario: str, config: TransactionsConfig, server_pid: int, quiet: QuietWait,
                   ) -> Measurement:
    from millstream.client import AsyncClient

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    try:
        if scenario in ("plain", "plain-flushed"):
            return await _plain(client, config, server_pid, quiet, flushed=scenario == "plain-flushed")
        lanes = 1 if scenario == "serial" else config.concurrency
        return await _transactions(client, lanes, config, server_pid, quiet, scenario)
    finally:
        await bounded(client.close())


async def _create_stream(port: int, segments: int) -> None:
    from millstream.client import AsyncClient, ScalingPolicy, StreamConfig

    client = AsyncClient(f"tcp://127.0.0.1:{port}")
    try:
        manager = client.stream_manager()
        await bounded(manager.create_scope(SCOPE, exist_ok=True))
        await bounded(manager.create_stream(f"{SCOPE}/{STREAM}", StreamConfig(scaling=ScalingPolicy.fixed(segments))))
    finally:
        await bounded(client.close())


# --- the suite -----------------------------------------------------------------------------------------


def run_transactions(config: TransactionsConfig, data_root: Path, progress: Progress | None = None,
                     ) -> TransactionsReport:
    """Run every scenario ``config.repeat`` times against one standalone node (started and stopped
    here, its data in a temporary directory under ``data_root``, removed at the end)."""
    started = time.perf_counter()
    machine = describe_machine(data_root, millstream.__version__)
    repeats = []
    steps = Steps(len(SCENARIOS) * config.repeat, progress)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-transactions-", dir=data_root) as temp:
        with standalone_server(Path(temp)) as server:
            port = server.port
            asyncio.run(_create_stream(port, config.segments))
            for number in range(config.repeat):
                measurements = []
                for scenario in SCENARIOS:
                    steps.next(f"repeat {number + 1}: {scenario}")
                    quiet = wait_until_quiet(config.quiet_idle_percent_min, config.quiet_timeout_seconds, 0.5)
                    measurements.append(asyncio.run(_measure(port, scenario, config, server.pid, quiet)))
                repeats.append(Repeat(measurements))
        shutil.rmtree(Path(temp) / "data", ignore_errors=True)
    steps.finish()
    ratios = [r.of("concurrent").events_per_second / r.of("plain").events_per_second for r in repeats
              if r.of("plain").events_per_second]
    return TransactionsReport(
        suite=SUITE_NAME, machine=machine, config=config, repeats=repeats,
        summaries=[_summary(scenario, [r.of(scenario) for r in repeats]) for scenario in SCENARIOS],
        transactional_over_plain=median_or_none(ratios), wall_seconds=time.perf_counter() - started)


def _summary(scenario: str, measurements: Sequence[Measurement]) -> Summary:
    def per_event(cpu: Callable[[Measurement], float | None]) -> float | None:
        return median_or_none([None if not m.events or cpu(m) is None else 1e6 * cpu(m) / m.events  # type: ignore[operator]
                               for m in measurements])

    return Summary(
        scenario=scenario,
        transactions_per_second=median_or_none([m.transactions_per_second for m in measurements]),
        events_per_second=median_or_none([m.events_per_second for m in measurements]),
        megabytes_per_second=median_or_none([m.megabytes_per_second for m in measurements]),
        commit_p50_ms=median_or_none([m.commit_latency.p50_ms if m.commit_latency else None for m in measurements]),
        commit_p95_ms=median_or_none([m.commit_latency.p95_ms if m.commit_latency else None for m in measurements]),
        decided_p50_ms=median_or_none([m.decided_latency.p50_ms if m.decided_latency else None
                                       for m in measurements]),
        decided_p95_ms=median_or_none([m.decided_latency.p95_ms if m.decided_latency else None
                                       for m in measurements]),
        others_percent=median_or_none([m.window.others_percent for m in measurements]),
        client_cpu_us_per_event=per_event(lambda m: m.window.client_cpu_seconds),
        server_cpu_us_per_event=per_event(lambda m: m.window.server_cpu_seconds),
    )


# --- the report ----------------------------------------------------------------------------------------


def render_transactions_markdown(report: TransactionsReport, *, command: str = "millstream bench --suite "
                                 "transactions") -> str:
    """The suite's section of ``BENCHMARKS.md`` (and its stdout report), between ``SECTION_BEGIN`` and
    ``SECTION_END``."""
    machine, config = report.machine, report.config
    others = [m.window.others_percent for r in report.repeats for m in r.measurements
              if m.window.others_percent is not None]
    noise = (f"other processes used {min(others):.0f} to {max(others):.0f}% of the machine during the measured "
             "windows" if others else "others' CPU was not measured")
    rows = []
    for summary in report.summaries:
        lanes = 1 if summary.scenario != "concurrent" else config.concurrency
        what = {"serial": "transactions, one at a time", "concurrent": f"transactions, {lanes} at once",
                "plain": "plain writer, same events (pipelined)",
                "plain-flushed": f"plain writer, flushing every {EVENTS_PER_TXN} events"}[summary.scenario]
        rows.append(f"| {what} | {fixed(summary.transactions_per_second, 1)} | {fixed(summary.events_per_second, 0)} "
                    f"| {fixed(summary.megabytes_per_second, 2)} | {fixed(summary.commit_p50_ms, 1)} "
                    f"| {fixed(summary.commit_p95_ms, 1)} | {fixed(summary.decided_p50_ms, 1)} "
                    f"| {fixed(summary.decided_p95_ms, 1)} | {fixed(summary.client_cpu_us_per_event, 1)} "
                    f"| {fixed(summary.server_cpu_us_per_event, 1)} | {fixed(summary.others_percent, 0)} |")
    lines = [
        SECTION_BEGIN,
        "## Stream transactions",
        "",
        f"> Generated by `{command}`; do not edit by hand -- run the command again to refresh it.",
        "",
        f"{machine.date_utc} · millstream {machine.millstream_version} · {machine.cpu_count} CPUs "
        f"({machine.cpu_model}) · data on {machine.data_dir_filesystem.type}  ",
        f"One `millstream standalone` node (FileLog with fdatasync before every acknowledgement, the controller "
        f"on the same port) in its own process, this client in another, on 127.0.0.1.  One stream of "
        f"{config.segments} segments; each transaction is {EVENTS_PER_TXN} events of {EVENT_BYTES} B over "
        f"{ROUTING_KEYS} routing keys (so it merges into every segment).  Medians of {config.repeat} repeat(s) of "
        f"{config.warmup_seconds:g} s warm-up + {config.duration_seconds:g} s measured; {noise}.  The run took "
        f"{report.wall_seconds / 60:.1f} min.",
        "",
        "| measurement | transactions/s | events/s | MB/s | commit → COMMITTED p50 ms | p95 | commit → COMMITTING "
        "p50 ms | p95 | client CPU µs/event | server CPU µs/event | others' CPU % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Transactional ÷ plain writing of the same events (events/s, {config.concurrency} transactions at once "
        f"against one plain writer, same repeat): **{fixed(report.transactional_over_plain, 2)}**.",
        "",
        f"Commit latency: from the `commit()` call (which flushes the transaction's events first) to the first "
        f"status answer saying COMMITTED -- every transaction segment merged and the commit recorded, so every "
        f"reader of every key sees it; asked every {POLL_SECONDS * 1000:g} ms (one at a time) or every "
        f"{POLL_SECONDS * config.concurrency * 1000:g} ms per transaction ({config.concurrency} at once), so it is "
        "late by at most that.  COMMITTING: the controller recorded the decision (commit order taken).  CPU "
        "µs/event: CPU seconds of the client process and of the server process in the window, per event counted.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def replace_section(document: str, section: str) -> str:
    """``document`` with its transactions section (between the markers) replaced by ``section``, or
    with ``section`` appended if it has none."""
    return _suite.replace_section(document, section, SECTION_BEGIN, SECTION_END)


def section_of(document: str) -> str | None:
    """The transactions section of ``document`` (markers included), if it has one -- for a writer of
    the rest of the file (the peers harness) to keep it."""
    return _suite.section_of(document, SECTION_BEGIN, SECTION_END)


def write_transactions_json(report: TransactionsReport, output_dir: Path) -> Path:
    """The whole report, raw per-repeat results included, as ``transactions-<UTC date>.json``."""
    return _suite.write_json(report, output_dir)
