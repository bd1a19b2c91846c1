"""What users write, measured as they write it (issue 26 items 1 and 2): the README's blocking loop,
the asyncio loop, the batch call and the columnar call, each beside the raw group-commit loop
measured in the same run.

Theory of operation.  The harness's driver is a load generator (paced ticks, one future per block);
a user's program is a loop.  This module runs the loops a user writes, against a ``millstream
standalone`` node in a process of its own (as the harness runs it), on one stream of
``segments`` fixed segments:

* ``blocking`` -- the README's loop, exactly: ``client.event_writer(stream)``, ``write_event(event,
  routing_key=key)`` per event, one ``flush()`` at the end;
* ``asyncio`` -- the same with ``AsyncClient``: ``await writer.write_event(...)`` per event, ``await
  writer.flush()``;
* ``batch`` -- the blocking writer's ``write_events(events, routing_keys=keys)``, one call per
  ``batch_events`` events (what a Spark task hands over), ``flush()`` at the end;
* ``columnar`` -- ``write_columns(values, keys)`` with pyarrow arrays of the same batches.

Every loop writes the same ``events`` distinct payloads of ``event_bytes`` (from the harness's
``PayloadPool``) with keys in random order over ``key_count`` keys (the harness's ``KeySpace``),
built before the clock starts -- the user holds them.  A loop's events/s is its events over the time
from its first call to ``flush()`` returning (everything durable).  Each round runs the raw loop
(1,000 records of ``event_bytes`` per ``write`` + ``fdatasync``, ``_disk.measure_group_commit``) and
then every loop, in an order that rotates between rounds, so the two sides of each ratio are seconds
apart; the report gives each loop's ratio to the raw loop of its round, per round and as the median.
Absolute figures move several-fold with the host; the ratios are what the targets judge (``≥ 0.35``
for the per-event loops, ``≥ 0.6`` for the batch and columnar calls, issue 26 item 2).

Bounds: each loop writes ``events`` events (its flush is bounded by the client's own timeouts); the raw
loop runs ``raw_seconds``; the node starts within ``BENCH_SERVER_START_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from bench._disk import GroupCommitRun, measure_group_commit
from bench._keys import KeySpace
from bench._load import PayloadPool
from bench._suite import bounded, standalone_server
from bench._system import QuietWait

__all__ = ["LOOPS", "LoopRun", "UserLoopsConfig", "UserLoopsReport", "UserLoopsRound", "render_user_loops",
           "run_user_loops"]

#: The loops, in the order of the first round (later rounds rotate it).
LOOPS: Final = ("blocking", "asyncio", "batch", "columnar")
#: Records per fdatasync of the raw loop every ratio is taken against (issue 26: 1,000 x 100 B).
RAW_BATCH_RECORDS: Final = 1000
_SCOPE: Final = "bench"
#: The issue's bounds on each loop's ratio to the raw loop.
RATIO_MIN: Final = {"blocking": 0.35, "asyncio": 0.35, "batch": 0.6, "columnar": 0.6}


@attrs.frozen(kw_only=True)
class UserLoopsConfig:
    events: int = 200_000
    event_bytes: int = 100
    segments: int = 16
    key_count: int = 10_000
    batch_events: int = 10_000
    rounds: int = 3
    raw_seconds: float = 2.0
    key_seed: int = 1


@attrs.frozen
class LoopRun:
    loop: str
    events: int
    seconds: float
    events_per_second: float
    #: This process's CPU per event over the loop (the writer's; the server is another process).
    writer_cpu_us_per_event: float
    #: The CPU per event of the thread that runs the user's code (the blocking client's event loop
    #: thread, which sends blocks and reads acknowledgements, is the rest of the process's).
    caller_cpu_us_per_event: float = 0.0


@attrs.frozen
class UserLoopsRound:
    raw: GroupCommitRun
    loops: tuple[LoopRun, ...]  # in ``LOOPS`` order
    order: tuple[str, ...]  # the order they ran in (it rotates by round)

    def ratio(self, loop: str) -> float | None:
        for run in self.loops:
            if run.loop == loop:
                return run.events_per_second / self.raw.records_per_second
        return None


@attrs.frozen
class UserLoopsReport:
    config: UserLoopsConfig
    rounds: tuple[UserLoopsRound, ...]

    def median_ratio(self, loop: str) -> float | None:
        ratios = [r for r in (round_.ratio(loop) for round_ in self.rounds) if r is not None]
        return statistics.median(ratios) if ratios else None


def workload(config: UserLoopsConfig) -> tuple[list[bytes], list[str | None]]:
    """The events and keys every loop writes: distinct payloads, keys in random order."""
    pool = PayloadPool(config.event_bytes)
    keys = KeySpace(keyed=True, key_count=config.key_count, partitions=config.segments, seed=config.key_seed)
    payloads: list[bytes] = []
    routing_keys: list[str | None] = []
    for start in range(0, config.events, 50_000):
        count = min(50_000, config.events - start)
        payloads += pool.payloads(0.0, start, count)
        routing_keys += keys.keys(start, count)
    return payloads, routing_keys


def _timed(loop: str, events: int, body: Callable[[], None], profiler: Any = None) -> LoopRun:
    cpu_before = time.process_time()
    thread_before = time.thread_time()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    body()
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    thread = time.thread_time() - thread_before
    return LoopRun(loop, events, seconds, events / seconds, 1e6 * cpu / events, 1e6 * thread / events)


def run_loop(loop: str, uri: str, stream: str, payloads: Sequence[bytes], keys: Sequence[str | None],
             batch_events: int, profiler: Any = None) -> LoopRun:
    """One loop (see the module docstring), writing ``payloads`` with ``keys`` to ``stream``; with a
    ``cProfile.Profile``, profiled from the first write to the flush (on the caller's thread)."""
    import millstream

    if loop == "asyncio":
        async def write_async() -> None:
            async with millstream.AsyncClient(uri) as client:
                writer = client.event_writer(stream)
                await bounded(writer.ready())
                started = []

                async def body() -> None:
                    started.append(time.perf_counter())
                    for event, key in zip(payloads, keys, strict=True):
                        await writer.write_event(event, routing_key=key)
                    await writer.flush()
                cpu_before = time.process_time()
                thread_before = time.thread_time()
                if profiler is not None:
                    profiler.enable()
                await body()
                if profiler is not None:
                    profiler.disable()
                seconds = time.perf_counter() - started[0]
                cpu = time.process_time() - cpu_before
                thread = time.thread_time() - thread_before
                await writer.close()
                results.append(LoopRun(loop, len(payloads), seconds, len(payloads) / seconds,
                                       1e6 * cpu / len(payloads), 1e6 * thread / len(payloads)))
        results: list[LoopRun] = []
        asyncio.run(write_async())
        return results[0]
    with millstream.connect(uri) as client, client.event_writer(stream) as writer:
        if loop == "blocking":
            def body() -> None:
                for event, key in zip(payloads, keys, strict=True):  # the README's loop
                    writer.write_event(event, routing_key=key)
                writer.flush()
        elif loop == "batch":
            def body() -> None:
                for start in range(0, len(payloads), batch_events):
                    writer.write_events(payloads[start:start + batch_events],
                                        routing_keys=keys[start:start + batch_events])
                writer.flush()
        elif loop == "columnar":
            import pyarrow as pa

            columns = [(pa.array(payloads[start:start + batch_events], type=pa.binary()),
                        pa.array(keys[start:start + batch_events], type=pa.string()))
                       for start in range(0, len(payloads), batch_events)]

            def body() -> None:
                for values, routing_keys in columns:
                    writer.write_columns(values, routing_keys)
                writer.flush()
        else:
            raise ValueError(f"unknown loop {loop!r}; known: {', '.join(LOOPS)}")
        return _timed(loop, len(payloads), body, profiler)


def _create_stream(uri: str, stream: str, segments: int) -> None:
    import millstream
    from millstream.client import ScalingPolicy, StreamConfig

    with millstream.connect(uri) as client:
        manager = client.stream_manager()
        manager.create_scope(_SCOPE, exist_ok=True)
        manager.create_stream(stream, StreamConfig(scaling=ScalingPolicy.fixed(segments)))


def _stored_bytes(uri: str, stream: str) -> int:
    """The bytes the stream's segments hold (a check that a loop's events are stored)."""
    import millstream

    with millstream.connect(uri) as client:
        description = client.stream_manager().describe_stream(stream)
        segments = client.segments()
        return sum(segments.info(segment.name).length for segment in description.segments)


def run_user_loops(config: UserLoopsConfig, data_root: Path, quiet: QuietWait,
                   loops: Sequence[str] = LOOPS, progress: Callable[[str], None] | None = None,
                   stored: dict[tuple[int, str], int] | None = None) -> UserLoopsReport:
    """Every round: the raw loop, then each loop on a fresh stream (the order rotates by round).  With
    ``stored``, each loop's stream's stored bytes go there, by (round, loop): for tests."""
    payloads, keys = workload(config)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="millstream-user-loops-", dir=data_root) as temp:
        workdir = Path(temp)
        raw_dir = workdir / "raw"
        raw_dir.mkdir()
        with standalone_server(workdir / "node") as server:
            uri = f"tcp://127.0.0.1:{server.port}"
            for number in range(config.rounds):
                if progress is not None:
                    progress(f"user loops, round {number + 1}: the raw loop")
                raw = measure_group_commit(raw_dir, record_bytes=config.event_bytes,
                                           batch_records=RAW_BATCH_RECORDS, warmup_seconds=min(0.2, config.raw_seconds),
                                           duration_seconds=config.raw_seconds, bytes_max=1 << 30, quiet=quiet)
                order = list(loops[number % len(loops):]) + list(loops[:number % len(loops)])
                runs = []
                for loop in order:
                    if progress is not None:
                        progress(f"user loops, round {number + 1}: {loop}")
                    stream = f"{_SCOPE}/{loop}-{number}"
                    _create_stream(uri, stream, config.segments)
                    run = run_loop(loop, uri, stream, payloads, keys, config.batch_events)
                    if stored is not None:
                        stored[(number, loop)] = _stored_bytes(uri, stream)
                    runs.append(run)
                rounds.append(UserLoopsRound(raw, tuple(sorted(runs, key=lambda run: loops.index(run.loop))),
                                             tuple(order)))
    return UserLoopsReport(config, tuple(rounds))


def render_user_loops(report: UserLoopsReport) -> list[str]:
    """The report's Markdown section: a row per loop, its ratio to the raw loop per round and median."""
    config = report.config
    lines = ["## What users write: the README's loops, the batch and columnar calls", "",
             f"{config.events:,} distinct {config.event_bytes}-byte events (a pool of 65,536), keys in random "
             f"order over {config.key_count:,}, one stream of {config.segments} segments on a standalone node, "
             f"durable at `flush()`; batches of {config.batch_events:,} events.  Each round runs the raw "
             f"group-commit loop ({RAW_BATCH_RECORDS:,} x {config.event_bytes} B per `write` + `fdatasync`) "
             "and then every loop, in an order that rotates by round; ratios are to the raw loop of the same "
             "round.", ""]
    header = ["loop", "events/s (median)", "writer CPU µs/event (median)", "of it, the caller's thread",
              "÷ raw loop, per round",
              "÷ raw loop (median)", "target"]
    rows = []
    for loop in dict.fromkeys(run.loop for round_ in report.rounds for run in round_.loops):
        runs = [run for round_ in report.rounds for run in round_.loops if run.loop == loop]
        ratios = [round_.ratio(loop) for round_ in report.rounds]
        median = report.median_ratio(loop)
        bound = RATIO_MIN.get(loop)
        rows.append([
            f"`{loop}`", f"{statistics.median(run.events_per_second for run in runs):,.0f}",
            f"{statistics.median(run.writer_cpu_us_per_event for run in runs):.2f}",
            f"{statistics.median(run.caller_cpu_us_per_event for run in runs):.2f}",
            ", ".join("—" if ratio is None else f"{ratio:.2f}" for ratio in ratios),
            "—" if median is None else f"{median:.2f}",
            "—" if bound is None else f"≥ {bound:g}" + ("" if median is None else (" ✓" if median >= bound else " ✗")),
        ])
    raw = ", ".join(f"{round_.raw.records_per_second:,.0f}" for round_ in report.rounds)
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"Raw loop, records/s per round: {raw}."]
    return lines



# --- Profiles: function calls per event (load-independent) ---------------------------------------------


def calls_per_event(loop: str, uri: str, stream: str, payloads: Sequence[bytes], keys: Sequence[str | None],
                    batch_events: int) -> float:
    """Python function calls per event of ``loop`` on the thread that runs the user's code (cProfile):
    all of the writer's work for the asyncio loop; the caller's share for the blocking ones (their
    event loop thread sends blocks and reads acknowledgements per block, not per event)."""
    import cProfile
    import pstats

    import millstream
    from millstream.client import _framing

    _framing._modules()  # import NumPy and pyarrow.compute first: a one-time import is no per-event cost
    profiler = cProfile.Profile()
    if loop == "asyncio-batch":
        async def write() -> None:
            async with millstream.AsyncClient(uri) as client:
                writer = client.event_writer(stream)
                await bounded(writer.ready())
                profiler.enable()
                for start in range(0, len(payloads), batch_events):
                    await writer.write_events(payloads[start:start + batch_events],
                                              routing_keys=keys[start:start + batch_events])
                await writer.flush()
                profiler.disable()
                await writer.close()
        asyncio.run(write())
    else:
        run_loop(loop, uri, stream, payloads, keys, batch_events, profiler)
    stats = pstats.Stats(profiler)
    return float(stats.total_calls) / len(payloads)  # type: ignore[attr-defined]


def main(arguments: Sequence[str] | None = None) -> None:
    """``python -m bench.user_loops [EVENTS] [ROUNDS]``: calls per event of every loop (cProfile), then
    ROUNDS interleaved rounds of events/s beside the raw loop, as Markdown."""
    import sys

    from bench._system import wait_until_quiet

    args = list(sys.argv[1:] if arguments is None else arguments)
    events = int(args[0]) if args else 50_000
    rounds = int(args[1]) if len(args) > 1 else 3
    config = UserLoopsConfig(events=events, rounds=rounds)
    payloads, keys = workload(config)
    with tempfile.TemporaryDirectory(prefix="millstream-user-loops-") as temp, \
            standalone_server(Path(temp) / "node") as server:
        uri = f"tcp://127.0.0.1:{server.port}"
        print("| loop | Python function calls per event (cProfile) |\n|---|---|")
        for loop in ("blocking", "batch", "columnar", "asyncio", "asyncio-batch"):
            stream = f"{_SCOPE}/profile-{loop}"
            _create_stream(uri, stream, config.segments)
            print(f"| `{loop}` | {calls_per_event(loop, uri, stream, payloads, keys, config.batch_events):.1f} |")
    quiet = wait_until_quiet(0.0, 0.0, 0.1)
    print()
    print("\n".join(render_user_loops(run_user_loops(config, Path(tempfile.gettempdir()), quiet))))


if __name__ == "__main__":
    main()
