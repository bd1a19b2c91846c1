"""The writer half of the crash-consistency test: a process that appends as fast as it can until it is killed.

Run from the repository root (``PYTHONPATH`` must reach it)::

    python -m tests.faults.crash_writer DATA_DIR --incarnation N --seed S

It opens ``SegmentContainer(0, FileLog(DATA_DIR / "log"))``, makes sure ``ACTIVE_SEGMENTS`` unsealed
segments exist, and then ``CONCURRENCY`` tasks append self-describing records (below) with many
appends in flight; now and then one task seals a segment and creates the next.  It never stops on
its own (until ``--max-seconds``, a safety net against an orphan): the test SIGKILLs it.

Everything it does is written to ``DATA_DIR / "journal"``, one line per event, each line with one
``os.write`` on an ``O_APPEND`` descriptor (so it reaches the page cache, which a SIGKILL does not
lose).  What a line claims is never ahead of what happened: an append is journalled as *attempted*
before it is issued and as *acknowledged* only after ``await container.append`` returned.  A kill
may cut the last line short; the test drops an unterminated last line before it reads the journal.

Journal lines (space-separated; ``I`` = incarnation, ``SEG`` = segment name)::

    READY I                         the container recovered and the segments exist
    T I SEG COUNTER LENGTH          append attempted (outcome unknown until A or R)
    A I SEG COUNTER LENGTH OFFSET DIGEST
                                    append acknowledged at OFFSET; DIGEST = crc32 of the record, hex
    R I SEG COUNTER ERROR           append rejected with a caller error: it must never become visible
    Q I SEG                         seal attempted
    S I SEG LENGTH                  seal acknowledged; the segment's final length
    C I SEG                         create acknowledged

A record (big-endian), 24 bytes of header and a payload that is a pure function of its key::

    offset  size    field
    0       4       magic            b"CWR1"
    4       4       incarnation      the writer process that made it (u32)
    8       4       segment number   N of the segment "seg-NNNN" it was meant for (u32)
    12      4       counter          per segment and incarnation, 0, 1, 2, ... (u32)
    16      4       payload length   (u32), at most RECORD_PAYLOAD_LENGTH_BYTES_MAX
    20      4       crc32            zlib.crc32 of bytes 0..20, then the payload
    24      length  payload          shake_128(b"SEG/I/COUNTER") -- see ``payload_for``

Each append also accumulates attribute ``COUNT_ATTRIBUTE`` by one, atomically with its data, so
after any crash a segment's count attribute must equal the number of records it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import os
import random
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import attrs

from millstream.errors import CallerError
from millstream.model.types import AttributeUpdate, AttributeUpdateType
from millstream.segmentstore.container import SegmentContainer
from millstream.segmentstore.file_log import FileLog

# --- The record format (shared with the checker) ---------------------------------------------------

RECORD_MAGIC = b"CWR1"
_HEADER = struct.Struct(">4sIIII")  # magic, incarnation, segment number, counter, payload length
_CRC = struct.Struct(">I")
RECORD_HEADER_SIZE_BYTES = _HEADER.size + _CRC.size
RECORD_PAYLOAD_LENGTH_MIN_BYTES = 10
#: About 200 KB: with the writer's DataFrame sizes (below) a large record spans two to four frames.
RECORD_PAYLOAD_LENGTH_BYTES_MAX = 200_000
#: The attribute every append accumulates by one.
COUNT_ATTRIBUTE = 1

# --- The writer's workload --------------------------------------------------------------------------

#: Unsealed segments the writer keeps; it appends to a random one of them.
ACTIVE_SEGMENTS = 3
#: Tasks appending at once (each keeps one append in flight; the container batches them into frames).
CONCURRENCY = 16
#: Per append: the chance that this task rotates a segment (seals one, creates the next).
ROTATE_PROBABILITY = 0.004
#: The DataFrame sizes an incarnation picks from: the default 1 MiB, and a small one so that records
#: of up to 200 KB span several frames (and a kill can cut a record between frames).
FRAME_LENGTHS_BYTES = (1024 * 1024, 64 * 1024)
#: Small ledgers, so that rollovers (a manifest rewrite) happen during the campaign and kills hit them.
LEDGER_SIZE_BYTES_MAX = 4 * 1024 * 1024
#: Checkpoint every few frames, so that recovery checks many checkpoints against its replay.
CHECKPOINT_FRAME_COUNTS = (5, 40)
#: The writer's pace when none is given: about 12 MB/s, in bursts of up to ``CONCURRENCY`` appends.
#: Unpaced it writes over 100 MB/s here, and every recovery replays the whole log: a campaign's
#: cost would be dominated by replaying data rather than by kills.
BYTES_PER_SECOND_DEFAULT = 12_000_000
#: The writer exits by itself (status EXIT_TIMED_OUT) after this long: no orphan outlives a dead test.
MAX_SECONDS_DEFAULT = 60.0
EXIT_TIMED_OUT = 3


def segment_name(number: int) -> str:
    return f"seg-{number:04d}"


def segment_number(name: str) -> int:
    return int(name.removeprefix("seg-"))


def payload_for(segment: str, incarnation: int, counter: int, length: int) -> bytes:
    """The payload of record ``counter`` of ``incarnation`` in ``segment``: deterministic, so the
    checker can regenerate every byte."""
    return hashlib.shake_128(f"{segment}/{incarnation}/{counter}".encode()).digest(length)


def make_record(segment: str, incarnation: int, counter: int, payload_length: int) -> bytes:
    header = _HEADER.pack(RECORD_MAGIC, incarnation, segment_number(segment), counter, payload_length)
    payload = payload_for(segment, incarnation, counter, payload_length)
    return header + _CRC.pack(zlib.crc32(payload, zlib.crc32(header))) + payload


def record_key(record: bytes | memoryview) -> tuple[str, int, int]:
    """``(segment, incarnation, counter)`` from a record's header (not checked: see ``parse_segment``)."""
    _magic, incarnation, number, counter, _length = _HEADER.unpack_from(record, 0)
    return segment_name(number), incarnation, counter


def digest(record: bytes) -> str:
    return f"{zlib.crc32(record):08x}"


@attrs.frozen
class ParsedRecord:
    offset: int
    incarnation: int
    counter: int
    payload_length: int

    @property
    def length(self) -> int:
        return RECORD_HEADER_SIZE_BYTES + self.payload_length


class GarbageError(AssertionError):
    """A segment holds bytes that are not a sequence of whole, valid records of the writer."""


def parse_segment(name: str, data: bytes, start: int = 0) -> Iterator[ParsedRecord]:
    """Every record in ``data`` (a segment's bytes from offset ``start``), checked byte for byte against
    what the writer would have written.  Raises ``GarbageError`` naming the segment and offset at the
    first byte that is not part of such a record, including a record cut short by the end."""
    position = 0
    view = memoryview(data)
    while position < len(data):
        offset = start + position
        if len(data) - position < RECORD_HEADER_SIZE_BYTES:
            raise GarbageError(f"{name} @ {offset}: {len(data) - position} bytes left, less than a record header")
        magic, incarnation, number, counter, length = _HEADER.unpack_from(view, position)
        if magic != RECORD_MAGIC or number != segment_number(name):
            raise GarbageError(f"{name} @ {offset}: no record header here (magic {magic!r}, segment {number})")
        if not RECORD_PAYLOAD_LENGTH_MIN_BYTES <= length <= RECORD_PAYLOAD_LENGTH_BYTES_MAX:
            raise GarbageError(f"{name} @ {offset}: implausible payload length {length}")
        end = position + RECORD_HEADER_SIZE_BYTES + length
        if end > len(data):
            raise GarbageError(f"{name} @ {offset}: record of {length} payload bytes cut short by the segment's end")
        if bytes(view[position:end]) != make_record(name, incarnation, counter, length):
            raise GarbageError(f"{name} @ {offset}: record ({incarnation}, {counter}) differs from what was written")
        yield ParsedRecord(offset, incarnation, counter, length)
        position = end


# --- The journal (shared with the checker) ----------------------------------------------------------


@attrs.frozen
class Attempt:
    incarnation: int
    segment: str
    counter: int
    payload_length: int


@attrs.frozen
class Acknowledgement:
    attempt: Attempt
    offset: int
    digest: str


@attrs.define
class Journal:
    """What every writer incarnation attempted, and what it was told."""

    ready: set[int] = attrs.field(factory=set)
    attempts: dict[tuple[str, int, int], Attempt] = attrs.field(factory=dict)  # by (segment, incarnation, counter)
    acknowledged: list[Acknowledgement] = attrs.field(factory=list)
    rejected: set[tuple[str, int, int]] = attrs.field(factory=set)
    seal_attempts: set[str] = attrs.field(factory=set)
    sealed: dict[str, int] = attrs.field(factory=dict)  # segment -> acknowledged final length
    created: set[str] = attrs.field(factory=set)


def drop_unterminated_line(path: Path) -> int:
    """Cut a line the kill left half-written; return how many bytes were dropped."""
    data = path.read_bytes() if path.exists() else b""
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "r+b") as file:
            file.truncate(keep)
    return len(data) - keep


def read_journal(path: Path) -> Journal:
    """Parse the journal.  Raises ``ValueError`` for a malformed line (call ``drop_unterminated_line``
    first: every complete line must parse)."""
    journal = Journal()
    text = path.read_text() if path.exists() else ""
    for number, line in enumerate(text.splitlines(), start=1):
        kind, *fields = line.split(" ")
        try:
            if kind == "READY":
                journal.ready.add(int(fields[0]))
            elif kind == "T":
                attempt = Attempt(int(fields[0]), fields[1], int(fields[2]), int(fields[3]))
                journal.attempts[(attempt.segment, attempt.incarnation, attempt.counter)] = attempt
            elif kind == "A":
                key = (fields[1], int(fields[0]), int(fields[2]))
                attempt = journal.attempts[key]  # attempted before it was acknowledged, always
                if attempt.payload_length != int(fields[3]):
                    raise ValueError("acknowledged length differs from the attempt")
                journal.acknowledged.append(Acknowledgement(attempt, int(fields[4]), fields[5]))
            elif kind == "R":
                journal.rejected.add((fields[1], int(fields[0]), int(fields[2])))
            elif kind == "Q":
                journal.seal_attempts.add(fields[1])
            elif kind == "S":
                journal.sealed[fields[1]] = int(fields[2])
            elif kind == "C":
                journal.created.add(fields[1])
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, IndexError, KeyError) as error:
            raise ValueError(f"{path}:{number}: malformed journal line {line!r}: {error!r}") from error
    return journal


# --- The writer ---------------------------------------------------------------------------------------


class Writer:
    def __init__(self, data_dir: Path, incarnation: int, seed: int, bytes_per_second: float) -> None:
        self.data_dir = data_dir
        self.bytes_per_second = bytes_per_second
        self.bytes_issued = 0
        self.started = 0.0
        self.incarnation = incarnation
        self.rng = random.Random(seed)
        self.journal_fd = os.open(data_dir / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.container: SegmentContainer
        self.active: list[str] = []
        self.next_number = 0
        self.counters: dict[str, int] = {}
        self.rotating = False

    def note(self, *fields: object) -> None:
        os.write(self.journal_fd, (" ".join(str(field) for field in fields) + "\n").encode())

    def payload_length(self) -> int:
        """Log-uniform between the limits (most records small, some large), and now and then the largest."""
        if self.rng.random() < 0.02:
            return RECORD_PAYLOAD_LENGTH_BYTES_MAX
        low, high = math.log(RECORD_PAYLOAD_LENGTH_MIN_BYTES), math.log(RECORD_PAYLOAD_LENGTH_BYTES_MAX)
        return int(math.exp(self.rng.uniform(low, high)))

    async def run(self) -> None:
        self.container = SegmentContainer(
            0,
            FileLog(self.data_dir / "log", ledger_size_bytes_max=LEDGER_SIZE_BYTES_MAX),
            frame_bytes_max=self.rng.choice(FRAME_LENGTHS_BYTES),
            checkpoint_frame_count=self.rng.choice(CHECKPOINT_FRAME_COUNTS),
        )
        await self.container.start()
        names = self.container.segment_names()
        self.next_number = max((segment_number(name) + 1 for name in names), default=0)
        self.active = [name for name in names if not self.container.get_info(name).sealed]
        while len(self.active) < ACTIVE_SEGMENTS:
            await self.create_next()
        self.note("READY", self.incarnation)
        self.started = asyncio.get_running_loop().time()
        async with asyncio.TaskGroup() as group:
            for _ in range(CONCURRENCY):
                group.create_task(self.append_forever())

    async def create_next(self) -> None:
        name = segment_name(self.next_number)
        self.next_number += 1
        await self.container.create_segment(name)
        self.note("C", self.incarnation, name)
        self.active.append(name)

    async def rotate(self) -> None:
        self.rotating = True
        victim = self.rng.choice(self.active)
        self.active.remove(victim)  # before the seal is issued: no new append picks it
        self.note("Q", self.incarnation, victim)
        length = await self.container.seal(victim)
        self.note("S", self.incarnation, victim, length)
        await self.create_next()
        self.rotating = False

    async def pace(self, length: int) -> None:
        """Sleep while the bytes issued so far run ahead of ``bytes_per_second``."""
        self.bytes_issued += length
        ahead = self.bytes_issued / self.bytes_per_second - (asyncio.get_running_loop().time() - self.started)
        if ahead > 0:
            await asyncio.sleep(ahead)

    async def append_forever(self) -> None:
        update = (AttributeUpdate(COUNT_ATTRIBUTE, AttributeUpdateType.ACCUMULATE, 1),)
        while True:
            if not self.rotating and self.rng.random() < ROTATE_PROBABILITY:
                await self.rotate()
                continue
            segment = self.rng.choice(self.active)
            counter = self.counters.get(segment, 0)
            self.counters[segment] = counter + 1
            length = self.payload_length()
            record = make_record(segment, self.incarnation, counter, length)
            # The segment may be sealed while this task sleeps: then the append is rejected (and the
            # checker makes sure it never becomes visible).
            await self.pace(len(record))
            self.note("T", self.incarnation, segment, counter, length)
            try:
                offset = await self.container.append(segment, record, update)
            except CallerError as error:  # e.g. sealed under us; nothing was appended
                self.note("R", self.incarnation, segment, counter, type(error).__name__)
                continue
            self.note("A", self.incarnation, segment, counter, length, offset, digest(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--bytes-per-second", type=float, default=BYTES_PER_SECOND_DEFAULT)
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS_DEFAULT)
    arguments = parser.parse_args(argv)
    writer = Writer(arguments.data_dir, arguments.incarnation, arguments.seed, arguments.bytes_per_second)

    async def bounded() -> None:
        await asyncio.wait_for(writer.run(), arguments.max_seconds)

    try:
        asyncio.run(bounded())
    except TimeoutError:
        print(f"crash_writer: not killed within {arguments.max_seconds} s", file=sys.stderr)
        return EXIT_TIMED_OUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
