"""Process-level faults: SIGKILL a writer with a stable writer id again and again, restart it, and let it
replay its source from an earlier offset -- exactly once across the restarts, while the stream scales.

The campaign runs ``millstream.standalone`` in this process and the application as a child process
(``tests/faults/stable_writer_process.py``): it writes a deterministic source of ``EVENTS`` events
(16 routing keys) through ``event_writer(stream, writer_id="ingest-7")``, each with its source offset
as the sequence, flushing every 50 events and journalling the offset it has committed.  The child is
SIGKILLed at a seeded random moment -- mostly once it has committed a few more flushes, sometimes
right after it started -- with events unacknowledged, in flight or on the wire; meanwhile this process
splits and merges the stream under it.  A new child then replays the source from a random offset at
or before the last one committed, so events the stream holds come again: the writer must drop every
one of them and write every other once.  After the last kill a child runs the source to its end.

Then every segment the stream ever had is read back in epoch order and the history checker must
report 0 lost, 0 duplicated, 0 reordered per routing key, nothing phantom.  Default: 4 kills of a
2,000-event source; ``MILLSTREAM_PROFILE=nightly``: 40 kills of 20,000.  ``MILLSTREAM_WRITER_KILL_SEED``
replays the schedule (the exact kill points still depend on timing, so a failure prints its seed).
Every wait is bounded; children are killed and reaped by their PID on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

import millstream as ms
from millstream.client import AsyncClient, ScalingPolicy, StreamConfig
from millstream.testing.history import EventTag, History, Outcome, check
from tests.faults.stable_writer_process import FLUSH_EVERY, WRITER_ID, source_key

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
KILLS = 40 if NIGHTLY else 4
EVENTS = 20_000 if NIGHTLY else 2_000
SEED = int(os.environ.get("MILLSTREAM_WRITER_KILL_SEED", "20261126"))
STREAM = "faults/restarts"
#: How far back (in flushes) a restart may resume before the last committed offset.
REPLAY_FLUSHES_MAX = 4
#: The share of kills that come right after the child is ready (its floors learnt, little written).
EARLY_KILL_PROBABILITY = 0.25
#: Kills come this long after the child reached its target (uniform): mid-write or mid-flush.
KILL_DELAY_SECONDS = (0.0, 0.05)
#: The share of incarnations under which the stream scales (a split or a merge, at a random point).
SCALE_PROBABILITY = 0.75
#: The share of kills that come right after a scale (mid-hand-over, successors nearly empty).
SCALE_THEN_KILL_PROBABILITY = 0.5
SEGMENTS_MAX = 6
#: Bounds on every wait (generous: importing millstream alone has taken seconds on a busy machine).
READY_TIMEOUT_SECONDS = 120.0
PROGRESS_TIMEOUT_SECONDS = 120.0
FINISH_TIMEOUT_SECONDS = 600.0
REAP_TIMEOUT_SECONDS = 30.0


@attrs.define
class Statistics:
    kills: int = 0
    early_kills: int = 0
    scales: int = 0
    replayed: int = 0  # offsets written again after a restart (at or before the last commit)
    duplicates: list[int] = attrs.field(factory=list)  # per incarnation that committed, dropped so far

    def summary(self, report: object, elapsed: float) -> str:
        return (f"writer-restart campaign (seed {SEED}): {self.kills} kills ({self.early_kills} right after start), "
                f"{self.scales} scales, {self.replayed} offsets replayed, duplicates dropped per incarnation "
                f"{self.duplicates}; {report}; {elapsed:.1f} s")


@attrs.define
class JournalState:
    ready: bool = False
    committed: int = 0
    duplicates: int = 0
    done: bool = False


def read_journal(path: Path, incarnation: int) -> JournalState:
    """What incarnation ``incarnation`` journalled (an unterminated last line is dropped)."""
    state = JournalState()
    if not path.exists():
        return state
    text = path.read_text()
    lines = text.split("\n")[:-1]  # (the last element is "" or a line cut short by the kill)
    for line in lines:
        fields = line.split()
        if not fields or int(fields[1]) != incarnation:
            continue
        if fields[0] == "READY":
            state.ready = True
        elif fields[0] in ("C", "DONE"):
            state.committed = max(state.committed, int(fields[2]))
            state.duplicates = int(fields[3])
            state.done = state.done or fields[0] == "DONE"
    return state


@contextlib.contextmanager
def child(uri: str, journal: Path, incarnation: int, resume_after: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.stable_writer_process", uri, STREAM, str(journal),
             "--incarnation", str(incarnation), "--resume-after", str(resume_after), "--events", str(EVENTS)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=REAP_TIMEOUT_SECONDS)


def wait_for(condition: object, timeout: float, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``condition()`` until true (bounded); fail with the child's stderr if it died first."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if process.poll() is not None and not condition():  # type: ignore[operator]
            raise AssertionError(f"the writer process exited ({process.returncode}) before {what}:\n"
                                 f"{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.01)


def scale(manager: ms.StreamManager, rng: random.Random) -> None:
    """Split the widest segment, or merge the narrowest adjacent pair (keeping 2..SEGMENTS_MAX)."""
    current = manager.current_segments(STREAM).segments
    if len(current) < SEGMENTS_MAX and (len(current) <= 2 or rng.random() < 0.5):
        widest = max(current, key=lambda s: s.key_end - s.key_start)
        manager.split_segment(STREAM, widest.segment_id, 2)
    else:
        pair = min(itertools.pairwise(sorted(current, key=lambda s: s.key_start)),
                   key=lambda p: p[1].key_end - p[0].key_start)
        manager.merge_segments(STREAM, [pair[0].segment_id, pair[1].segment_id])


def run_incarnation(uri: str, manager: ms.StreamManager, tmp: Path, incarnation: int, resume_after: int,
                    rng: random.Random, statistics: Statistics, *, last: bool) -> JournalState:
    journal = tmp / "journal"
    log = tmp / f"writer-{incarnation}.log"
    committed_before = resume_after
    with child(uri, journal, incarnation, resume_after, log) as process:
        wait_for(lambda: read_journal(journal, incarnation).ready, READY_TIMEOUT_SECONDS, "the writer started",
                 process, log)
        scale_at = (resume_after + rng.randint(0, 3 * FLUSH_EVERY)) if rng.random() < SCALE_PROBABILITY else None
        if last:
            target = EVENTS
        elif rng.random() < EARLY_KILL_PROBABILITY:
            target = None
            statistics.early_kills += 1
        else:
            target = min(EVENTS - FLUSH_EVERY, committed_before + rng.randint(1, 4) * FLUSH_EVERY)
        if target is not None:
            def reached() -> bool:
                nonlocal scale_at
                state = read_journal(journal, incarnation)
                if scale_at is not None and state.committed >= scale_at:
                    scale(manager, rng)
                    statistics.scales += 1
                    scale_at = None
                return state.committed >= target or state.done
            wait_for(reached, FINISH_TIMEOUT_SECONDS if last else PROGRESS_TIMEOUT_SECONDS,
                     f"the writer committed offset {target}", process, log)
        if last:
            assert process.wait(timeout=REAP_TIMEOUT_SECONDS) == 0, log.read_text()[-3000:]
        else:
            if rng.random() < SCALE_THEN_KILL_PROBABILITY:
                # A scale just before the kill: the successors hold little or nothing of this writer yet,
                # so the replay's duplicates are found only in the predecessors (the key's chain).
                scale(manager, rng)
                statistics.scales += 1
            time.sleep(rng.uniform(*KILL_DELAY_SECONDS))  # (a fault's timing: any moment is valid)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=REAP_TIMEOUT_SECONDS)
            statistics.kills += 1
    state = read_journal(journal, incarnation)
    if state.committed:
        statistics.duplicates.append(state.duplicates)
    return state


async def read_back(uri: str) -> list[bytes]:
    """Every event of every segment the stream ever had, segment by segment in epoch order."""
    async with AsyncClient(uri) as client:
        scope, name = STREAM.split("/", 1)
        events: list[bytes] = []
        for piece in await client.controller().get_segments_between(scope, name, None, None):
            segment = piece.segment.name
            length = (await client.segments().info(segment)).length
            data = b""
            while len(data) < length:
                data += bytes((await client.segments().read(segment, len(data))).data)
            position = 0
            while position < len(data):
                size = int.from_bytes(data[position + 4:position + 8], "big")
                events.append(data[position + 8:position + 8 + size])
                position += 8 + size
        return events


def test_sigkill_a_stable_writer_and_replay_its_source(tmp_path: Path) -> None:
    print(f"writer-restart campaign: seed {SEED}, {KILLS} kills of a {EVENTS}-event source "
          "(MILLSTREAM_WRITER_KILL_SEED replays the schedule)")
    rng = random.Random(SEED)
    statistics = Statistics()
    started = time.monotonic()
    with ms.standalone(tmp_path / "data") as node, ms.connect(node.uri) as admin:
        manager = admin.stream_manager()
        manager.create_scope(STREAM.split("/", 1)[0])
        manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(2)))
        committed = 0
        for incarnation in range(1, KILLS + 2):
            resume_after = rng.randint(max(0, committed - REPLAY_FLUSHES_MAX * FLUSH_EVERY), committed)
            statistics.replayed += committed - resume_after
            state = run_incarnation(node.uri, manager, tmp_path, incarnation, resume_after, rng, statistics,
                                    last=incarnation == KILLS + 1)
            committed = max(committed, state.committed)
        assert state.done and committed == EVENTS
        events = asyncio.run(read_back(node.uri))
    history = History()
    for offset in range(1, EVENTS + 1):
        tag = EventTag(WRITER_ID, offset)
        history.write_invoked(tag, key=source_key(offset))
        history.write_completed(tag, Outcome.ACKED)  # (the last incarnation flushed the whole source)
    history.read_all("read-back", events, complete=True)
    report = check(history)
    summary = statistics.summary(report.summary(), time.monotonic() - started)
    print(summary)
    assert report.ok, summary
    assert len(events) == EVENTS, summary
    assert statistics.kills == KILLS, summary
    assert sum(statistics.duplicates) > 0, f"no restart replayed anything the stream held: {summary}"
