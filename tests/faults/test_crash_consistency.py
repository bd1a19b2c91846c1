"""Crash consistency against the real FileLog: SIGKILL a writer process at random points, recover, verify.

The campaign (``test_sigkill_campaign``) runs ``tests/faults/crash_writer.py`` as a child process
against one data directory, kills it with SIGKILL after a random (seeded) delay -- sometimes while
it is still recovering, mostly while it appends with many appends in flight -- and then recovers a
container in this process and checks, from the writer's journal (see ``crash_writer``):

(a) every acknowledged append is present, byte for byte, at its acknowledged offset; every
    acknowledged seal holds, with its acknowledged length; every acknowledged create exists;
(b) each segment's bytes parse completely as whole, valid records that the writer attempted (no
    garbage, no partial record, no duplicate, offsets contiguous), no rejected append is visible,
    and the append-count attribute (updated atomically with each append) equals the record count;
(c) nothing shrinks or changes across incarnations: a segment seen once is still there, its old
    bytes are a prefix of its new ones, and a sealed segment keeps its length;
(d) recovery never raised, and the recovered container's invariants hold.

Records present but never acknowledged are allowed -- their writer died not knowing the outcome --
but only if they were attempted and are whole.  The next incarnation then continues on the same
directory, so state accumulates across kills (a fresh directory every ``KILLS_PER_DIRECTORY`` kills
keeps the replay cost of a recovery bounded).

A seed replays the same schedule of kill delays and the same writer choices; the exact kill points
still depend on timing, so a failure prints its seed, its kill number and the directory it keeps.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

from millstream.errors import ContainerUnavailableError, WriteFailedError
from millstream.limits import READ_LENGTH_BYTES_MAX
from millstream.model.types import AttributeUpdate, AttributeUpdateType
from millstream.segmentstore.container import ContainerState, SegmentContainer
from millstream.segmentstore.file_log import FileLog
from millstream.segmentstore.operations import (
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentSealOperation,
    deserialize,
)
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from tests.faults import crash_writer
from tests.faults.crash_writer import (
    COUNT_ATTRIBUTE,
    Journal,
    ParsedRecord,
    drop_unterminated_line,
    make_record,
    parse_segment,
    read_journal,
    segment_name,
)

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
#: Kills per run: the issue asks for a bounded loop; nightly goes deep.
KILLS = 500 if NIGHTLY else 25
#: State accumulates over this many kills in one directory; then a fresh one starts.  Every recovery
#: replays the whole log (nothing truncates it yet), so this bounds what one recovery replays.
KILLS_PER_DIRECTORY = 10
SEED = int(os.environ.get("MILLSTREAM_CRASH_SEED", "20240611"))
#: How long after READY the kill comes (uniform).
KILL_DELAY_SECONDS = (0.05, 1.5)
#: The share of kills timed from the spawn instead (uniform in EARLY_KILL_DELAY_SECONDS): they land
#: in interpreter start-up, in recovery (the takeover's manifest writes, the replay) or in the first
#: creates and appends.
EARLY_KILL_PROBABILITY = 0.2
EARLY_KILL_DELAY_SECONDS = (0.05, 0.6)
#: Bounds on every wait.
READY_TIMEOUT_SECONDS = 30.0
REAP_TIMEOUT_SECONDS = 10.0
RECOVERY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.005


# --- Running the writer -----------------------------------------------------------------------------


@contextmanager
def writer_process(directory: Path, incarnation: int, seed: int) -> Iterator[subprocess.Popen[bytes]]:
    """The writer, running; it is killed and reaped on the way out whatever happens."""
    stderr_path = directory / f"writer-{incarnation}.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.crash_writer", str(directory),
             "--incarnation", str(incarnation), "--seed", str(seed)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=REAP_TIMEOUT_SECONDS)


def writer_failure(directory: Path, incarnation: int, process: subprocess.Popen[bytes]) -> str:
    stderr = (directory / f"writer-{incarnation}.stderr").read_text(errors="replace")
    return f"writer {incarnation} exited by itself with status {process.returncode}:\n{stderr}"


def is_ready(journal_path: Path, incarnation: int) -> bool:
    try:
        return f"READY {incarnation}\n".encode() in journal_path.read_bytes()
    except FileNotFoundError:
        return False


def run_and_kill(directory: Path, incarnation: int, seed: int, *, early: bool, delay_seconds: float) -> bool:
    """Run writer ``incarnation`` and SIGKILL it ``delay_seconds`` after it is READY (``early``: after
    it was spawned).  Returns whether it got READY."""
    journal = directory / "journal"
    with writer_process(directory, incarnation, seed) as process:
        if not early:
            deadline = time.monotonic() + READY_TIMEOUT_SECONDS
            while not is_ready(journal, incarnation):
                assert process.poll() is None, writer_failure(directory, incarnation, process)
                assert time.monotonic() < deadline, f"writer {incarnation} not ready in {READY_TIMEOUT_SECONDS} s"
                time.sleep(POLL_SECONDS)
        time.sleep(delay_seconds)
        assert process.poll() is None, writer_failure(directory, incarnation, process)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=REAP_TIMEOUT_SECONDS) == -signal.SIGKILL
    drop_unterminated_line(journal)
    return is_ready(journal, incarnation)


def random_kill(directory: Path, incarnation: int, rng: random.Random) -> bool:
    early = rng.random() < EARLY_KILL_PROBABILITY
    delay = rng.uniform(*(EARLY_KILL_DELAY_SECONDS if early else KILL_DELAY_SECONDS))
    return run_and_kill(directory, incarnation, rng.getrandbits(32), early=early, delay_seconds=delay)


# --- Checking a recovered container -----------------------------------------------------------------


@attrs.frozen
class SegmentSnapshot:
    """What one check saw of a segment, for the next check to compare with."""

    length: int
    sealed: bool
    digest: bytes  # blake2b of all its bytes


@attrs.define
class Statistics:
    kills: int = 0
    kills_before_ready: int = 0
    recoveries: int = 0
    acknowledged_appends_verified: int = 0  # distinct acknowledged appends, summed over directories
    acknowledged_bytes_verified: int = 0  # their record bytes
    bytes_verified: int = 0  # segment bytes parsed and compared, summed over every check
    unacknowledged_present: int = 0  # attempted, never acknowledged, found whole (outcome unknown)
    rejected_appends: int = 0  # refused (sealed under the writer): verified never to become visible
    seals_acknowledged: int = 0
    max_recovery_seconds: float = 0.0

    def summary(self, seed: int) -> str:
        return (f"crash campaign (seed {seed}): {self.kills} kills survived "
                f"({self.kills_before_ready} before the writer was ready), {self.recoveries} recoveries, "
                f"{self.acknowledged_appends_verified} acknowledged appends verified "
                f"({self.acknowledged_bytes_verified:,} bytes), {self.bytes_verified:,} bytes verified in all, "
                f"{self.unacknowledged_present} unacknowledged appends found whole, "
                f"{self.rejected_appends} rejected appends never visible, {self.seals_acknowledged} seals held, "
                f"max recovery {self.max_recovery_seconds * 1000:.0f} ms")


async def read_all(container: SegmentContainer, name: str, start: int, length: int) -> bytes:
    data = bytearray()
    offset = start
    while offset < length:
        result = await container.read(name, offset, READ_LENGTH_BYTES_MAX)
        assert result.data, f"{name}: empty read at {offset} of {length}"
        data += result.data
        offset += len(result.data)
    return bytes(data)


@attrs.define(repr=False)  # (its repr would print every byte; asyncio asks for it now and then)
class Recovered:
    """A recovered container's segments, parsed."""

    recovery_seconds: float
    data: dict[str, bytes]
    sealed: dict[str, bool]
    records: dict[str, list[ParsedRecord]]


async def recover(log_directory: Path) -> Recovered:
    """Start a container on the directory (recovery must not raise), read every segment, stop it."""
    started = time.monotonic()
    container = SegmentContainer(0, FileLog(log_directory))
    await container.start()
    recovery_seconds = time.monotonic() - started
    try:
        assert container.state is ContainerState.RUNNING
        container.check_invariants()
        recovered = Recovered(recovery_seconds, {}, {}, {})
        for name in container.segment_names():
            info = container.get_info(name)
            assert info.start_offset == 0, f"{name} was truncated, but nobody truncates"
            data = await read_all(container, name, 0, info.length)
            records = list(parse_segment(name, data))  # (b): whole, valid records, contiguous, to the end
            assert info.attributes.get(COUNT_ATTRIBUTE, 0) == len(records), (
                f"{name}: count attribute {info.attributes.get(COUNT_ATTRIBUTE)} but {len(records)} records: "
                "an append's data and its attribute update were not applied together")
            recovered.data[name] = data
            recovered.sealed[name] = info.sealed
            recovered.records[name] = records
        return recovered
    finally:
        await container.stop()


@attrs.frozen
class Lost:
    """What the torn-write test cut away: appends (by key), seals and creates (by segment name)."""

    appends: frozenset[tuple[str, int, int]] = frozenset()
    seals: frozenset[str] = frozenset()
    creates: frozenset[str] = frozenset()


def check(recovered: Recovered, journal: Journal, *, lost: Lost = Lost()) -> int:
    """Check (a) and (b) against the journal; return how many records are present unacknowledged.
    ``lost`` names what may be missing although acknowledged (see the torn-write test)."""
    acknowledged = {(ack.attempt.segment, ack.attempt.incarnation, ack.attempt.counter) for ack in journal.acknowledged}
    unacknowledged_present = 0
    by_offset: dict[str, dict[int, ParsedRecord]] = {}
    for name, records in recovered.records.items():
        seen: set[tuple[int, int]] = set()
        for record in records:
            key = (name, record.incarnation, record.counter)
            assert (record.incarnation, record.counter) not in seen, f"{name} @ {record.offset}: duplicate {key}"
            seen.add((record.incarnation, record.counter))
            attempt = journal.attempts.get(key)
            assert attempt is not None, f"{name} @ {record.offset}: {key} was never attempted"
            assert attempt.payload_length == record.payload_length, f"{name} @ {record.offset}: wrong length"
            assert key not in journal.rejected, f"{name} @ {record.offset}: {key} was rejected, yet it is visible"
            assert key not in lost.appends, f"{name} @ {record.offset}: {key} should be lost with the torn record"
            if key not in acknowledged:
                unacknowledged_present += 1
        by_offset[name] = {record.offset: record for record in records}
    for ack in journal.acknowledged:
        attempt = ack.attempt
        key = (attempt.segment, attempt.incarnation, attempt.counter)
        if key in lost.appends:
            continue
        assert attempt.segment in by_offset, f"acknowledged {key} at {ack.offset}, but the segment is gone"
        record = by_offset[attempt.segment].get(ack.offset)
        assert record is not None, f"acknowledged {key} at {ack.offset}: no record starts there"
        assert (record.incarnation, record.counter) == (attempt.incarnation, attempt.counter), (
            f"acknowledged {key} at {ack.offset}, but ({record.incarnation}, {record.counter}) is there")
        # parse_segment compared every byte of the record with what the writer wrote; the digest the
        # writer journalled at the acknowledgement must match those bytes too.
        assert record.payload_length == attempt.payload_length
        stored = recovered.data[attempt.segment][ack.offset:ack.offset + record.length]
        assert crash_writer.digest(stored) == ack.digest, f"acknowledged {key} at {ack.offset}: digest differs"
    for name, length in journal.sealed.items():
        if name in lost.seals:
            assert not recovered.sealed.get(name), f"the seal of {name} should be lost with the torn record"
            continue
        assert recovered.sealed.get(name), f"the seal of {name} was acknowledged, but it is not sealed"
        assert len(recovered.data[name]) == length, f"{name} sealed at {length}, now {len(recovered.data[name])}"
    for name in journal.created - lost.creates:
        assert name in recovered.data, f"the creation of {name} was acknowledged, but it does not exist"
    return unacknowledged_present


def snapshot(recovered: Recovered) -> dict[str, SegmentSnapshot]:
    return {name: SegmentSnapshot(len(data), recovered.sealed[name], hashlib.blake2b(data).digest())
            for name, data in recovered.data.items()}


def check_growth(previous: dict[str, SegmentSnapshot], recovered: Recovered) -> None:
    """(c): a segment never disappears, shrinks, or changes its old bytes; a sealed one never changes."""
    for name, before in previous.items():
        assert name in recovered.data, f"{name} existed (length {before.length}) and is gone"
        data = recovered.data[name]
        assert len(data) >= before.length, f"{name} shrank from {before.length} to {len(data)}"
        assert hashlib.blake2b(data[:before.length]).digest() == before.digest, f"{name}: old bytes changed"
        if before.sealed:
            assert recovered.sealed[name] and len(data) == before.length, f"{name} was sealed and changed"


def recover_and_check(directory: Path, statistics: Statistics, previous: dict[str, SegmentSnapshot],
                      ) -> tuple[dict[str, SegmentSnapshot], int]:
    """Recover, check (a)-(d); return the new snapshots and how many records are present unacknowledged."""
    journal = read_journal(directory / "journal")
    recovered = asyncio.run(asyncio.wait_for(recover(directory / "log"), RECOVERY_TIMEOUT_SECONDS))
    statistics.recoveries += 1
    statistics.max_recovery_seconds = max(statistics.max_recovery_seconds, recovered.recovery_seconds)
    unacknowledged_present = check(recovered, journal)
    check_growth(previous, recovered)
    statistics.bytes_verified += sum(len(data) for data in recovered.data.values())
    return snapshot(recovered), unacknowledged_present


# --- The campaign -----------------------------------------------------------------------------------


def test_sigkill_campaign(tmp_path: Path) -> None:
    print(f"crash campaign: seed {SEED}, {KILLS} kills (MILLSTREAM_CRASH_SEED replays the schedule)")
    rng = random.Random(SEED)
    statistics = Statistics()
    for first_kill in range(0, KILLS, KILLS_PER_DIRECTORY):
        directory = tmp_path / f"campaign-{first_kill // KILLS_PER_DIRECTORY:03d}"
        directory.mkdir()
        previous: dict[str, SegmentSnapshot] = {}
        unacknowledged_present = 0
        for incarnation in range(first_kill + 1, min(first_kill + KILLS_PER_DIRECTORY, KILLS) + 1):
            try:
                ready = random_kill(directory, incarnation, rng)
                statistics.kills += 1
                statistics.kills_before_ready += not ready
                previous, unacknowledged_present = recover_and_check(directory, statistics, previous)
            except AssertionError as error:
                raise AssertionError(
                    f"seed {SEED}, kill {incarnation}, directory {directory} (kept): {error}") from error
        journal = read_journal(directory / "journal")
        assert journal.acknowledged, f"{directory}: no append was ever acknowledged: the campaign tested nothing"
        statistics.acknowledged_appends_verified += len(journal.acknowledged)
        statistics.acknowledged_bytes_verified += sum(
            crash_writer.RECORD_HEADER_SIZE_BYTES + ack.attempt.payload_length for ack in journal.acknowledged)
        statistics.unacknowledged_present += unacknowledged_present
        statistics.rejected_appends += len(journal.rejected)
        statistics.seals_acknowledged += len(journal.sealed)
        shutil.rmtree(directory)  # passed: free the disk (a failing directory is kept as evidence)
    assert statistics.kills == KILLS
    # Most kills must land while appends are in flight, or the campaign proves little.
    assert statistics.kills_before_ready <= KILLS // 2, statistics
    print(statistics.summary(SEED))


# --- A torn last write -------------------------------------------------------------------------------

_LOG_RECORD = struct.Struct(">IIQI")  # FileLog: magic, length, sequence, crc32 (file_log's docstring)
_LOG_MAGIC = 0x4D534C31
_FRAME_HEADER = struct.Struct(">BBII")  # DataFrame: version, flags, content length, crc32 (data_frame)
_ENTRY_HEADER = struct.Struct(">IBq")  # entry: payload length, flags (1 first, 2 last), sequence number


def ledger_records(path: Path) -> list[tuple[int, int, bytes]]:
    """``(offset, sequence, payload)`` of each intact record at the start of a ledger file, parsed here
    independently of file_log (its layout is documented byte by byte)."""
    data = path.read_bytes()
    records = []
    position = 0
    while position + _LOG_RECORD.size <= len(data):
        magic, length, sequence, crc = _LOG_RECORD.unpack_from(data, position)
        end = position + _LOG_RECORD.size + length
        if magic != _LOG_MAGIC or end > len(data):
            break
        payload = data[position + _LOG_RECORD.size:end]
        if zlib.crc32(payload, zlib.crc32(data[position + 4:position + 16])) != crc:
            break
        records.append((position, sequence, payload))
        position = end
    return records


def log_frames(log_directory: Path) -> list[bytes]:
    """Every DataFrame in the log, in order (the manifest names the ledgers and their sealed lengths)."""
    body = json.loads((log_directory / "manifest").read_bytes())["body"]
    frames = []
    for ledger in body["ledgers"]:
        records = ledger_records(log_directory / f"ledger-{ledger['number']:08d}.log")
        if ledger["sealed_length"] is not None:
            records = [r for r in records if r[0] + _LOG_RECORD.size + len(r[2]) <= ledger["sealed_length"]]
        frames += [payload for _offset, _sequence, payload in records]
    return frames


def log_operations(frames: list[bytes]) -> list[tuple[int, bytes]]:
    """Every whole serialized operation in the log, with the index of the frame holding its last entry
    (an independent decoder: records cut short by earlier crashes are dropped, as recovery drops them)."""
    open_parts: list[bytes] = []
    operations: list[tuple[int, bytes]] = []
    for index, frame in enumerate(frames):
        _version, _flags, content_length, crc = _FRAME_HEADER.unpack_from(frame, 0)
        content = frame[_FRAME_HEADER.size:]
        assert len(content) == content_length and zlib.crc32(content) == crc
        position = 0
        while position < len(content):
            length, flags, _sequence = _ENTRY_HEADER.unpack_from(content, position)
            piece = content[position + _ENTRY_HEADER.size:position + _ENTRY_HEADER.size + length]
            position += _ENTRY_HEADER.size + length
            if flags & 1:
                open_parts = [piece]  # a record still open here was cut short by an earlier crash
            else:
                open_parts.append(piece)
            if flags & 2:
                operations.append((index, b"".join(open_parts)))
                open_parts = []
    return operations


def lost_with_last_frame(frames: list[bytes]) -> tuple[Lost, dict[str, int]]:
    """What vanishes if the last frame does: the operations ending in it.  Also the bytes of appends
    that vanish, by segment."""
    operations = [(index, deserialize(data, 0)) for index, data in log_operations(frames)]
    names = {op.segment_id: op.name for _index, op in operations if isinstance(op, StreamSegmentMapOperation)}
    appends: set[tuple[str, int, int]] = set()
    seals: set[str] = set()
    creates: set[str] = set()
    lost_bytes: dict[str, int] = collections.defaultdict(int)
    for index, op in operations:
        if index != len(frames) - 1:
            continue
        if isinstance(op, StreamSegmentAppendOperation):
            key = crash_writer.record_key(op.data)
            assert names[op.segment_id] == key[0]
            appends.add(key)
            lost_bytes[key[0]] += len(op.data)
        elif isinstance(op, StreamSegmentSealOperation):
            seals.add(names[op.segment_id])
        elif isinstance(op, StreamSegmentMapOperation):
            creates.add(op.name)
    return Lost(frozenset(appends), frozenset(seals), frozenset(creates)), lost_bytes


def test_a_torn_last_write_loses_exactly_the_operations_ending_in_it(tmp_path: Path) -> None:
    """Cut the last ledger record short, as a crash that tore the last write would, and recover.

    What is correct here needs care.  A real crash can only tear bytes that were not yet
    fdatasynced, and nothing in them was acknowledged.  Which bytes were synced is not knowable
    after a SIGKILL (the page cache keeps every written byte), so this test cuts the last record
    whatever it holds -- and that record was most likely synced and acknowledged.  The log cannot
    tell such damage from a torn write (file_log's docstring admits it), so "nothing acknowledged
    is lost" cannot be asserted.  What must hold is: recovery succeeds; the operations whose last
    entry lay in the cut record vanish entirely (a record spanning frames included); every other
    acknowledged append is present byte for byte; each segment's bytes are a prefix of what the
    uncut log recovers to; and a writer continuing on the torn log loses nothing more.
    """
    print(f"torn write: seed {SEED} (MILLSTREAM_CRASH_SEED)")
    rng = random.Random(SEED)
    directory = tmp_path / "torn"
    directory.mkdir()
    for incarnation in range(1, 6):  # bounded: normally the first run leaves records to cut
        run_and_kill(directory, incarnation, rng.getrandbits(32), early=False, delay_seconds=rng.uniform(0.2, 0.6))
        body = json.loads((directory / "log" / "manifest").read_bytes())["body"]
        last = directory / "log" / f"ledger-{body['ledgers'][-1]['number']:08d}.log"
        records = ledger_records(last)
        if body["ledgers"][-1]["sealed_length"] is None and records:
            break
    else:
        pytest.fail("five writer runs left no record in the last ledger to tear")
    full = tmp_path / "full"
    shutil.copytree(directory, full)
    lost, lost_bytes = lost_with_last_frame(log_frames(directory / "log"))
    offset, _sequence, payload = records[-1]
    record_length = _LOG_RECORD.size + len(payload)
    cut = rng.randint(1, record_length - 1)  # what is left of the last record: at least one byte short
    os.truncate(last, offset + cut)

    journal = read_journal(directory / "journal")
    whole = asyncio.run(asyncio.wait_for(recover(full / "log"), RECOVERY_TIMEOUT_SECONDS))
    check(whole, journal)
    torn = asyncio.run(asyncio.wait_for(recover(directory / "log"), RECOVERY_TIMEOUT_SECONDS))
    check(torn, journal, lost=lost)
    for name, data in whole.data.items():
        if name in lost.creates:
            assert name not in torn.data, f"{name}: its creation was torn away, yet it exists"
            continue
        assert data.startswith(torn.data[name]), f"{name}: the torn log's bytes are not a prefix of the whole log's"
        assert len(data) - len(torn.data[name]) == lost_bytes[name], (
            f"{name}: the torn log lost {len(data) - len(torn.data[name])} bytes, but the torn frame ended "
            f"{lost_bytes[name]} bytes of appends")
        assert torn.sealed[name] == (whole.sealed[name] and name not in lost.seals)
    assert set(torn.data) == set(whole.data) - lost.creates
    acknowledged_lost = sum((a.attempt.segment, a.attempt.incarnation, a.attempt.counter) in lost.appends
                            for a in journal.acknowledged)

    # The log stays usable: another writer appends on top of the torn one, and all is still well.
    run_and_kill(directory, 99, rng.getrandbits(32), early=False, delay_seconds=0.3)
    after = asyncio.run(asyncio.wait_for(recover(directory / "log"), RECOVERY_TIMEOUT_SECONDS))
    check(after, read_journal(directory / "journal"), lost=lost)
    check_growth(snapshot(torn), after)
    print(f"torn write: kept {cut} of the last record's {record_length} bytes; {len(lost.appends)} appends "
          f"ended in it ({acknowledged_lost} acknowledged, which only this simulation can lose); "
          f"{len(journal.acknowledged) - acknowledged_lost} acknowledged appends kept")


# --- A failing fdatasync, in process -----------------------------------------------------------------


class FailingFdatasync:
    """``os.fdatasync`` until call ``fail_at``, which and every later call fail with EIO.  Thread-safe
    (the FileLog's writer thread calls it)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.calls += 1
            failing = self.calls >= self.fail_at
        if failing:
            raise OSError(errno.EIO, "injected: fdatasync failed")
        os.fdatasync(fd)


@pytest.mark.parametrize("fail_at", [5, 20, 60])
def test_a_failing_fdatasync_stops_the_container_and_loses_nothing_acknowledged(tmp_path: Path, fail_at: int) -> None:
    """The FileLog's fdatasync fails at call ``fail_at`` while 8 tasks append: the container stops
    with the error, every append in flight fails with ContainerUnavailableError (outcome unknown),
    later calls too, and a container recovered from the same directory shows every acknowledged append."""
    segments = [segment_name(number) for number in range(3)]
    journal = Journal()
    outcomes = collections.Counter[str]()
    update = (AttributeUpdate(COUNT_ATTRIBUTE, AttributeUpdateType.ACCUMULATE, 1),)

    async def appender(container: SegmentContainer, task: int) -> None:
        rng = random.Random(task)
        for counter in itertools.count():
            segment = rng.choice(segments)
            attempt = crash_writer.Attempt(task, segment, counter, rng.choice([10, 300, 5_000, 70_000, 200_000]))
            journal.attempts[(segment, task, counter)] = attempt
            record = make_record(segment, task, counter, attempt.payload_length)
            try:
                # Bounded: with the bug pinned by test_a_log_failing_while_the_next_frame_is_sealed_...
                # an append can wait forever.
                offset = await asyncio.wait_for(container.append(segment, record, update), STOP_TIMEOUT_SECONDS)
            except ContainerUnavailableError:  # the only error an append may see here
                outcomes["unavailable"] += 1
                return
            outcomes["acknowledged"] += 1
            journal.acknowledged.append(crash_writer.Acknowledgement(attempt, offset, crash_writer.digest(record)))

    async def scenario() -> None:
        fdatasync = FailingFdatasync(fail_at)
        container = SegmentContainer(0, FileLog(tmp_path / "log", fdatasync=fdatasync), frame_bytes_max=64 * 1024)
        await container.start()
        for segment in segments:
            await container.create_segment(segment)
            journal.created.add(segment)
        assert fdatasync.calls < fail_at, "the set-up used up the fdatasync calls before the failure"
        async with asyncio.TaskGroup() as group:
            for task in range(8):
                group.create_task(appender(container, task))
        # (A TimeoutError here is the bug that test_a_log_failing_while_the_next_frame_is_sealed_... pins.)
        cause = await asyncio.wait_for(asyncio.shield(container.stopped), STOP_TIMEOUT_SECONDS)
        assert isinstance(cause, WriteFailedError), repr(cause)
        assert "injected: fdatasync failed" in str(cause)
        assert container.state is ContainerState.STOPPED
        with pytest.raises(ContainerUnavailableError):
            await container.append(segments[0], b"late")
        with pytest.raises(ContainerUnavailableError):
            await container.create_segment("late")
        await container.stop()  # releases what is left; must not raise

    asyncio.run(asyncio.wait_for(scenario(), RECOVERY_TIMEOUT_SECONDS))
    assert outcomes["unavailable"] == 8, outcomes  # every appender ended on an append that failed
    assert outcomes["acknowledged"] > 0 or fail_at == 5, outcomes
    recovered = asyncio.run(asyncio.wait_for(recover(tmp_path / "log"), RECOVERY_TIMEOUT_SECONDS))
    unacknowledged_present = check(recovered, journal)
    print(f"fdatasync failing at call {fail_at}: {dict(outcomes)}, {unacknowledged_present} unacknowledged "
          "appends present after recovery")


def test_a_log_failing_while_the_next_frame_is_sealed_stops_the_container() -> None:
    """Deterministic: the failure of frame 3 reaches the processor only after it began sealing frame 4
    (the second append spans frames, so the seal happens while its record is cut)."""

    async def scenario() -> None:
        log = SimulatedDurableDataLog(SimulatedLogStorage(), auto_complete=False)
        container = SegmentContainer(0, log, clock=ManualClock(), frame_bytes_max=200)
        await container.start()

        async def turns() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        await turns()
        log.complete(log.pending_sequences[-1])  # the first checkpoint
        async with asyncio.TaskGroup() as group:
            group.create_task(container.create_segment("a"))
            await turns()
            log.complete(log.pending_sequences[-1])
        first = asyncio.ensure_future(container.append("a", b"first"))
        await turns()  # its frame is in flight
        second = asyncio.ensure_future(container.append("a", b"second" * 100))
        await asyncio.sleep(0)  # queued: the processor's wake-up is scheduled ...
        log.fail_write()  # ... before the notice of the failed frame
        try:
            for append in (first, second):
                with pytest.raises(ContainerUnavailableError):
                    await asyncio.wait_for(asyncio.shield(append), 2.0)
            cause = await asyncio.wait_for(asyncio.shield(container.stopped), 2.0)
            assert isinstance(cause, WriteFailedError), repr(cause)
            assert container.state is ContainerState.STOPPED
        finally:
            for append in (first, second):
                append.cancel()

    asyncio.run(scenario())
