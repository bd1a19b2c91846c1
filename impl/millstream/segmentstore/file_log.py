"""FileLog: the default Tier-1 durable data log -- ledger files on local disk, group commit, CRCs, fencing.

Theory of operation
-------------------
The log is a directory.  Its records live in *ledger files*, appended in sequence order; a small
*manifest* says which ledgers make up the log, which epoch owns it and where it was truncated.

* Ownership.  ``initialize()`` takes ``flock(manifest.lock)``, bumps the epoch and writes the manifest
  *first* -- that write is what fences the previous owner -- then scans every unsealed ledger, seals it
  at the end of its last intact record, creates a fresh ledger for the new epoch and writes the
  manifest again.  Every manifest write replaces the file (temp file, fsync, ``os.replace``, fsync of
  the directory), so every version has a new inode.
* Fencing.  The owner remembers the inode of the manifest version it wrote last and keeps that file
  open (so the inode number cannot be reused by a later version while it compares).  After each group
  commit's ``fdatasync`` and *before* completing any future it ``stat``s the manifest: another inode
  means another owner bumped the epoch, so the group and everything pending fail with
  ``DataLogFencedError``.  Why that is enough: the new owner writes its epoch before it scans.  A
  group whose check saw our inode was written before that epoch write, so the new owner's scan sees
  it and keeps it; a group written later lies beyond the sealed length the new owner records, and no
  reader ever looks there.  The old owner's own manifest writes (rollover, truncate) re-check the
  inode under the lock and raise ``DataLogFencedError`` when it changed.
* Group commit.  ``append()`` runs on the event loop: it numbers the record, puts it on a queue and
  returns a future -- no system call, no thread hop per record.  One writer thread per log takes
  everything queued, frames it (header + CRC), writes it with ``os.writev``, calls ``fdatasync``
  once, checks fencing and completes the whole group's futures, in order, with one message to the
  loop.  ``writev`` and ``fdatasync`` release the GIL, so the loop keeps queueing the next group
  while the disk works on this one.
* The two hand-offs.  A lone appender pays both on every write, so each is one system call and a
  few bytecodes: the loop wakes a sleeping writer by releasing a lock the writer blocks on (a
  binary semaphore, not a ``threading.Condition``, whose Python-level bookkeeping costs more than
  the wake-up itself), and the writer sends its messages through a deque and an ``eventfd`` the
  loop watches (not ``call_soon_threadsafe``, which costs a socket send, two receives and a handle
  per message).  Messages are run on the loop in the order they were sent.
* Rollover.  A group ends where the current ledger reaches ``ledger_size_bytes_max`` (so a ledger
  overshoots by less than one record); after it the writer creates the next ledger, seals the current
  one in the manifest and continues there.  Truncation deletes whole ledger files.
* Failure is final.  A failing ``writev``/``fdatasync`` (or rollover) fails that group and everything
  queued after it with ``WriteFailedError`` (outcome unknown) and the log closes itself.

What recovery cannot tell apart (admitted warts):

* A fenced write's outcome is unknown too.  A group written before the new owner's scan but checked
  after its epoch write fails with ``DataLogFencedError`` and is nevertheless in the log.
* A damaged *last* record of an unsealed ledger looks exactly like a torn one and is dropped.  That
  loses nothing acknowledged only if the damage is a crash's; bit rot in the very last acknowledged
  record goes unnoticed.
* If a crash lands pages of an unsynced group out of order (a hole, then an intact record), the scan
  reports mid-log corruption although nothing acknowledged was lost.  It refuses to start rather than
  guess; this errs on the side of keeping evidence.

On-disk layout
--------------
Inside ``directory`` (created if missing)::

    manifest               which ledgers make up the log (format below)
    manifest.lock          empty; flock()ed around every read-modify-write of the manifest
    manifest.tmp           transient: the next manifest version, renamed over ``manifest`` once synced
    ledger-00000001.log    records (format below), named by ledger number (8 decimal digits)
    ledger-00000002.log    ...

A record (all integers unsigned big-endian)::

    offset  size    field
    0       4       magic     0x4D534C31 (b"MSL1"); marks a record start, so that recovery can tell a
                              torn tail (nothing intact after it) from damage in the middle of a ledger
    4       4       length    payload bytes, 0 ..= RECORD_PAYLOAD_LENGTH_BYTES_MAX
    8       8       sequence  the record's LogAddress.sequence: 1, 2, 3, ... over the log's whole life
    16      4       crc32     zlib.crc32 over bytes 4..16 (length and sequence), then the payload
    20      length  payload

A ledger holds records back to back from offset 0.  A sealed ledger's records end exactly at its
``sealed_length``; bytes beyond it (a torn tail, or a fenced owner's late writes) are never read.

The manifest is one line of UTF-8 that is itself valid JSON::

    {"body":<BODY>,"crc32":"<8 lowercase hex digits>"}\\n

The CRC is ``zlib.crc32`` of the exact bytes of ``<BODY>``, which is compact JSON with sorted keys::

    {"epoch": E,                 # the current owner's epoch (0 = never owned)
     "format_version": 1,
     "ledgers": [                # ascending by number; only the last one may be unsealed
        {"epoch": e,             # the epoch that created the ledger
         "first_sequence": s,    # sequence of its first record (of the next one, while it is empty)
         "number": n,
         "sealed_length": L},    # bytes of intact records, or null while an owner may still write
        ...],
     "truncation": {"ledger": n, "offset": o, "sequence": s} or null}
                                 # the first record kept: sequence s at byte o of ledger n
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import errno
import fcntl
import itertools
import json
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

import attrs

from millstream import limits
from millstream.errors import (
    DamagedRecordError,
    DataCorruptionError,
    DataLogFencedError,
    DurableDataLogError,
    InternalError,
    InvalidArgumentError,
    ObjectClosedError,
    PayloadTooLargeError,
    WriteFailedError,
)
from millstream.segmentstore.durable_data_log import (
    DurableDataLog,
    LogAddress,
    LogRecord,
    OnDone,
    WriteSettings,
    notify_done,
)

__all__ = [
    "DEFAULT_MAX_WRITE_LENGTH_BYTES",
    "FileLog",
    "RECORD_HEADER_SIZE_BYTES",
    "RECORD_MAGIC",
    "RECORD_PAYLOAD_LENGTH_BYTES_MAX",
    "WRITE_LENGTH_SLACK_BYTES",
]

_logger = logging.getLogger(__name__)

# --- Formats ---------------------------------------------------------------------------------------

#: b"MSL1" ("millstream log, version 1") as a big-endian u32.
RECORD_MAGIC: Final = 0x4D534C31
_RECORD_MAGIC_BYTES: Final = RECORD_MAGIC.to_bytes(4, "big")

#: magic u32 | length u32 | sequence u64 | crc32 u32
_HEADER: Final = struct.Struct(">IIQI")
RECORD_HEADER_SIZE_BYTES: Final = _HEADER.size
#: The part of the header the CRC covers (length, sequence), packed on its own.
_LENGTH_SEQUENCE: Final = struct.Struct(">IQ")

#: The largest payload a record header may claim.  Recovery treats a larger length as damage (so a
#: corrupt length cannot make it read gigabytes); a FileLog cannot be configured to write more.
RECORD_PAYLOAD_LENGTH_BYTES_MAX: Final = 64 * limits.MIB

#: Room above ``DATA_FRAME_SIZE_BYTES_MAX`` in the default record limit, so that a frame builder that
#: counts its own header or rounds slightly differently is never refused a full frame.
WRITE_LENGTH_SLACK_BYTES: Final = 4 * limits.KIB

#: The default ``max_write_length_bytes``: one full DataFrame plus slack.
DEFAULT_MAX_WRITE_LENGTH_BYTES: Final = limits.DATA_FRAME_SIZE_BYTES_MAX + WRITE_LENGTH_SLACK_BYTES

_MANIFEST_FORMAT_VERSION: Final = 1
_MANIFEST_NAME: Final = "manifest"
_MANIFEST_LOCK_NAME: Final = "manifest.lock"
_MANIFEST_TEMP_NAME: Final = "manifest.tmp"
_MANIFEST_PREFIX: Final = b'{"body":'
_MANIFEST_SUFFIX: Final = re.compile(rb',"crc32":"([0-9a-f]{8})"\}\n')
_MANIFEST_SUFFIX_LENGTH: Final = len(b',"crc32":"00000000"}\n')
_LEDGER_NAME: Final = re.compile(r"ledger-(\d{8})\.log")

# --- Limits (module-level so tests can shrink them) ------------------------------------------------

#: Recovery and read() read ledgers in chunks of this size: large enough to amortise system calls,
#: small enough that reading a 256 MiB ledger never holds more than about one chunk and one record.
_READ_CHUNK_BYTES = 4 * limits.MIB

#: Payloads at least this large are handed to writev as their own buffer (no copy); smaller ones are
#: copied behind their header into one group buffer, which keeps the iovec count low (IOV_MAX is 1024).
_COPY_THRESHOLD_BYTES = 16 * limits.KIB

#: writev takes at most this many buffers per call (POSIX IOV_MAX; Linux says 1024).
_IOV_MAX: Final = max(16, os.sysconf("SC_IOV_MAX")) if "SC_IOV_MAX" in os.sysconf_names else 16

#: How long a manifest read-modify-write waits for another process's flock.  Longer than any
#: initialize() scan of an unsealed ledger (256 MiB at a slow disk's 100 MB/s is under 3 s).
_MANIFEST_LOCK_TIMEOUT_SECONDS = 60.0

#: Longest single poll interval while waiting for that flock.
_MANIFEST_LOCK_POLL_SECONDS_MAX: Final = 0.05

#: The idle writer wakes at least this often (a bounded wait; it rechecks its state and sleeps again).
_WRITER_IDLE_WAIT_SECONDS: Final = 1.0


def _ledger_name(number: int) -> str:
    return f"ledger-{number:08d}.log"


# --- The manifest ----------------------------------------------------------------------------------


@attrs.frozen
class _Ledger:
    """One ledger file as the manifest lists it."""

    number: int
    epoch: int
    first_sequence: int
    sealed_length: int | None


@attrs.frozen
class _TruncationPoint:
    """The first record kept: ``sequence`` at byte ``offset`` of ledger ``ledger``."""

    sequence: int
    ledger: int
    offset: int


@attrs.frozen
class _Manifest:
    epoch: int
    ledgers: tuple[_Ledger, ...]
    truncation: _TruncationPoint | None

    def ledger(self, number: int) -> _Ledger | None:
        for ledger in self.ledgers:
            if ledger.number == number:
                return ledger
        return None


def _encode_manifest(manifest: _Manifest) -> bytes:
    """The manifest's bytes (layout in the module docstring)."""
    body_object: dict[str, Any] = {
        "epoch": manifest.epoch,
        "format_version": _MANIFEST_FORMAT_VERSION,
        "ledgers": [
            {
                "epoch": ledger.epoch,
                "first_sequence": ledger.first_sequence,
                "number": ledger.number,
                "sealed_length": ledger.sealed_length,
            }
            for ledger in manifest.ledgers
        ],
        "truncation": (
            None
            if manifest.truncation is None
            else {
                "ledger": manifest.truncation.ledger,
                "offset": manifest.truncation.offset,
                "sequence": manifest.truncation.sequence,
            }
        ),
    }
    body = json.dumps(body_object, sort_keys=True, separators=(",", ":")).encode()
    return _MANIFEST_PREFIX + body + b',"crc32":"%08x"}\n' % zlib.crc32(body)


def _decode_manifest(data: bytes, path: Path) -> _Manifest:
    """Parse and validate a manifest.  Raises ``DataCorruptionError`` naming ``path`` if it is damaged."""

    def damaged(reason: str) -> DataCorruptionError:
        return DataCorruptionError(f"{path}: damaged manifest: {reason}")

    if not data.startswith(_MANIFEST_PREFIX) or len(data) < len(_MANIFEST_PREFIX) + _MANIFEST_SUFFIX_LENGTH:
        raise damaged("unexpected framing")
    body = data[len(_MANIFEST_PREFIX) : -_MANIFEST_SUFFIX_LENGTH]
    suffix = _MANIFEST_SUFFIX.fullmatch(data[-_MANIFEST_SUFFIX_LENGTH:])
    if suffix is None:
        raise damaged("unexpected framing")
    if zlib.crc32(body) != int(suffix.group(1), 16):
        raise damaged("checksum mismatch")
    try:
        parsed = json.loads(body)
    except ValueError as error:
        raise damaged(f"not JSON ({error})") from error

    def natural(container: object, key: str, *, nullable: bool = False) -> int | None:
        value = container.get(key, "missing") if isinstance(container, dict) else "missing"
        if value is None and nullable:
            return None
        if type(value) is not int or value < 0:
            raise damaged(f"field {key!r} is {value!r}")
        return value

    def required(container: object, key: str) -> int:
        value = natural(container, key)
        assert value is not None  # natural() only returns None when nullable
        return value

    if required(parsed, "format_version") != _MANIFEST_FORMAT_VERSION:
        raise damaged(f"unknown format version {parsed['format_version']}")
    raw_ledgers = parsed.get("ledgers")
    if not isinstance(raw_ledgers, list):
        raise damaged("field 'ledgers' is not a list")
    ledgers = tuple(
        _Ledger(
            number=required(raw, "number"),
            epoch=required(raw, "epoch"),
            first_sequence=required(raw, "first_sequence"),
            sealed_length=natural(raw, "sealed_length", nullable=True),
        )
        for raw in raw_ledgers
    )
    numbers = [ledger.number for ledger in ledgers]
    if numbers != sorted(set(numbers)):
        raise damaged(f"ledger numbers {numbers} are not strictly increasing")
    if any(ledger.sealed_length is None for ledger in ledgers[:-1]):
        raise damaged("a ledger other than the last is unsealed")
    raw_truncation = parsed.get("truncation", "missing")
    truncation = None
    if raw_truncation is not None:
        truncation = _TruncationPoint(
            sequence=required(raw_truncation, "sequence"),
            ledger=required(raw_truncation, "ledger"),
            offset=required(raw_truncation, "offset"),
        )
        if truncation.ledger not in numbers:
            raise damaged(f"the truncation point names ledger {truncation.ledger}, which is not listed")
    return _Manifest(epoch=required(parsed, "epoch"), ledgers=ledgers, truncation=truncation)


# --- Records ---------------------------------------------------------------------------------------


def _iter_records(file: BinaryIO, start: int, end: int) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, sequence, payload)`` for each intact record in bytes ``[start, end)`` of ``file``.

    Raises ``DamagedRecordError`` at the first record that is damaged, or that ``end`` (or the end of the
    file) cuts short.  Reads in ``_READ_CHUNK_BYTES`` chunks, so memory stays at about one chunk plus
    one record whatever the file's size.
    """
    file.seek(start)
    buffer = bytearray()
    base = start  # file offset of buffer[0]
    position = 0  # index in buffer of the next record
    unread = end - start  # bytes of [start, end) not yet read into buffer
    need = RECORD_HEADER_SIZE_BYTES  # bytes the next record needs in buffer before it can be parsed
    while True:
        # Parse every complete record the buffer holds.  The memoryview must be released before the
        # buffer is resized below, so no slice of it outlives this block.
        with memoryview(buffer) as view:
            while True:
                available = len(buffer) - position
                if available < RECORD_HEADER_SIZE_BYTES:
                    need = RECORD_HEADER_SIZE_BYTES
                    break
                magic, length, sequence, crc = _HEADER.unpack_from(view, position)
                offset = base + position
                if magic != RECORD_MAGIC:
                    raise DamagedRecordError(offset, "no record header (bad magic)")
                if length > RECORD_PAYLOAD_LENGTH_BYTES_MAX:
                    raise DamagedRecordError(offset, f"implausible length {length}")
                need = RECORD_HEADER_SIZE_BYTES + length
                if available < need:
                    break
                payload = bytes(view[position + RECORD_HEADER_SIZE_BYTES : position + need])
                if zlib.crc32(payload, zlib.crc32(view[position + 4 : position + 16])) != crc:
                    raise DamagedRecordError(offset, "checksum mismatch")
                yield offset, sequence, payload
                position += need
        if unread == 0:
            if position == len(buffer):
                return
            raise DamagedRecordError(base + position, "incomplete record (cut short by the end)")
        del buffer[:position]
        base += position
        position = 0
        chunk = file.read(min(unread, max(_READ_CHUNK_BYTES, need - len(buffer))))
        if not chunk:  # the file is shorter than ``end``: treat what is there as all there is
            unread = 0
            continue
        buffer += chunk
        unread -= len(chunk)


def _is_intact_record_at(fd: int, offset: int, end: int, sequence_min: int) -> bool:
    """Whether an intact record (magic, sane header, matching CRC) starts at ``offset``."""
    header = os.pread(fd, RECORD_HEADER_SIZE_BYTES, offset)
    if len(header) < RECORD_HEADER_SIZE_BYTES:
        return False
    magic, length, sequence, crc = _HEADER.unpack(header)
    if (
        magic != RECORD_MAGIC
        or length > RECORD_PAYLOAD_LENGTH_BYTES_MAX
        or offset + RECORD_HEADER_SIZE_BYTES + length > end
        or sequence < sequence_min
    ):
        return False
    payload = os.pread(fd, length, offset + RECORD_HEADER_SIZE_BYTES)
    return len(payload) == length and zlib.crc32(payload, zlib.crc32(header[4:16])) == int(crc)


def _find_intact_record(file: BinaryIO, start: int, end: int, sequence_min: int) -> int | None:
    """The offset of the first intact record at any byte offset in ``[start, end)``, or None."""
    fd = file.fileno()
    chunk_start = start
    while chunk_start < end:
        chunk = os.pread(fd, min(_READ_CHUNK_BYTES, end - chunk_start), chunk_start)
        if not chunk:
            return None
        index = chunk.find(_RECORD_MAGIC_BYTES)
        while index != -1:
            if _is_intact_record_at(fd, chunk_start + index, end, sequence_min):
                return chunk_start + index
            index = chunk.find(_RECORD_MAGIC_BYTES, index + 1)
        if chunk_start + len(chunk) >= end:
            return None
        # Overlap by three bytes so that a magic number split across two chunks is still found.
        chunk_start += max(1, len(chunk) - (len(_RECORD_MAGIC_BYTES) - 1))
    return None


def _scan_ledger(path: Path, first_sequence: int, sealed_length: int | None) -> tuple[int, int]:
    """Find where a ledger's intact records end.  Returns ``(sealed_length, next_sequence)``.

    Records must be intact and numbered ``first_sequence, first_sequence + 1, ...``.  In a sealed
    ledger (``sealed_length`` given) they must fill exactly ``sealed_length`` bytes.  In an unsealed
    one, at the first record that is not intact the rest of the file is searched for any later
    intact record: if there is one, the damage is in the middle of the log; otherwise it is a torn
    tail and the ledger is sealed before it.  Damage in the middle, a wrong sequence or a missing
    file raise ``DataCorruptionError`` naming the file and offset.  Nothing is modified.
    """
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed by the with statement right below)
    except FileNotFoundError as error:
        raise DataCorruptionError(f"{path}: listed in the manifest but missing") from error
    with file:
        # A snapshot of the size: an older owner may still be appending, and its writes land as a
        # growing prefix, so everything below this size is as it will stay.
        size = os.fstat(file.fileno()).st_size
        end = size if sealed_length is None else sealed_length
        if size < end:
            raise DataCorruptionError(f"{path}: file has {size} bytes, fewer than its sealed length {end}")
        expected = first_sequence
        valid_end = 0
        try:
            for offset, sequence, payload in _iter_records(file, 0, end):
                if sequence != expected:
                    raise DataCorruptionError(
                        f"{path}: record at offset {offset} has sequence {sequence}, expected {expected}"
                    )
                expected += 1
                valid_end = offset + RECORD_HEADER_SIZE_BYTES + len(payload)
        except DamagedRecordError as bad:
            later = None if sealed_length is not None else _find_intact_record(file, bad.offset + 1, end, expected)
            if sealed_length is not None or later is not None:
                raise DataCorruptionError(
                    f"{path}: record at offset {bad.offset} is damaged ({bad.reason})"
                    + ("" if later is None else f", yet an intact record follows at offset {later}")
                ) from None
            return bad.offset, expected  # a torn tail: never acknowledged, dropped
        return valid_end, expected


def _read_ledgers(directory: Path, manifest: _Manifest, next_sequence: int) -> Iterator[LogRecord]:
    """Yield every record from the truncation point on.  See ``FileLog.read``."""
    point = manifest.truncation
    expected = 1 if point is None else point.sequence
    for ledger in manifest.ledgers:
        if point is not None and ledger.number < point.ledger:
            continue
        path = directory / _ledger_name(ledger.number)
        start = point.offset if point is not None and ledger.number == point.ledger else 0
        if start == 0 and ledger.first_sequence != expected:
            raise DataCorruptionError(f"{path}: ledger starts at sequence {ledger.first_sequence}, expected {expected}")
        if ledger.sealed_length is None:
            continue  # our own new ledger: empty until the first append
        if start > ledger.sealed_length:
            raise DataCorruptionError(f"{path}: truncation offset {start} beyond sealed length")
        try:
            file = open(path, "rb")  # noqa: SIM115 (closed by the with statement right below)
        except FileNotFoundError as error:
            raise DataCorruptionError(f"{path}: listed in the manifest but missing") from error
        with file:
            size = os.fstat(file.fileno()).st_size
            if size < ledger.sealed_length:
                raise DataCorruptionError(
                    f"{path}: file has {size} bytes, fewer than its sealed length {ledger.sealed_length}"
                )
            try:
                for offset, sequence, payload in _iter_records(file, start, ledger.sealed_length):
                    if sequence != expected:
                        raise DataCorruptionError(
                            f"{path}: record at offset {offset} has sequence {sequence}, expected {expected}"
                        )
                    expected += 1
                    yield LogRecord(LogAddress(sequence, (ledger.number, offset)), payload)
            except DamagedRecordError as bad:
                raise DataCorruptionError(f"{path}: record at offset {bad.offset} is damaged ({bad.reason})") from None
    if expected != next_sequence:
        raise DataCorruptionError(
            f"{directory}: the log ends at sequence {expected - 1}, but recovery found {next_sequence - 1}"
        )


# --- The manifest store: the only code that writes the manifest ------------------------------------


@attrs.frozen
class _Ownership:
    """What ``initialize`` learned and created."""

    manifest: _Manifest
    next_sequence: int
    ledger_number: int


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ManifestStore:
    """The manifest of one directory and the ownership this process holds over it.

    Every method is a read-modify-write under ``flock(manifest.lock)`` (between processes and between
    FileLog instances) and under ``_mutex`` (between this instance's writer thread and its truncate
    and initialize threads).  ``check_owner`` is the exception: its fast path takes no lock.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._path = directory / _MANIFEST_NAME
        self._mutex = threading.Lock()
        self._manifest = _Manifest(epoch=0, ledgers=(), truncation=None)
        # The manifest version we wrote last, kept open: an open file's inode cannot be freed, so a
        # later version can never get the same inode number while we compare against it.
        self._own_fd: int | None = None
        self._own_identity: tuple[int, int] | None = None  # (st_dev, st_ino) of that version
        self._closed = False

    @property
    def manifest(self) -> _Manifest:
        return self._manifest

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``_mutex`` and ``flock(manifest.lock)``.  Raises ``DurableDataLogError`` if another
        process holds the flock for longer than ``_MANIFEST_LOCK_TIMEOUT_SECONDS``."""
        if not self._mutex.acquire(timeout=_MANIFEST_LOCK_TIMEOUT_SECONDS):
            raise DurableDataLogError(f"{self._directory}: manifest busy in this process")
        try:
            if self._closed:
                raise ObjectClosedError(f"{self._directory}: the log is closed")
            self._directory.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(self._directory / _MANIFEST_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                # flock has no timeout, so poll.  This is I/O at the edge; no decision depends on
                # the time it reads.
                deadline = time.monotonic() + _MANIFEST_LOCK_TIMEOUT_SECONDS
                pause = 0.001
                while True:
                    try:
                        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise DurableDataLogError(
                                f"{self._directory}: another process held {_MANIFEST_LOCK_NAME} for "
                                f"over {_MANIFEST_LOCK_TIMEOUT_SECONDS} s"
                            ) from None
                        time.sleep(pause)
                        pause = min(pause * 2, _MANIFEST_LOCK_POLL_SECONDS_MAX)
                yield  # closing lock_fd below releases the flock
            finally:
                os.close(lock_fd)
        finally:
            self._mutex.release()

    def _load(self) -> _Manifest | None:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return None
        return _decode_manifest(data, self._path)

    def _write(self, manifest: _Manifest) -> None:
        """Replace the manifest atomically and durably; remember the new version as ours.  Caller
        holds ``_locked()``.  Raises ``OSError``; the manifest is then the old or the new version."""
        temp_path = self._directory / _MANIFEST_TEMP_NAME
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, [_encode_manifest(manifest)])
            os.fsync(fd)
            status = os.fstat(fd)
            os.replace(temp_path, self._path)
        except BaseException:
            os.close(fd)
            raise
        # check_owner's fast path may now see a new inode before we record it; its slow path waits
        # for _mutex, which we hold, so it then sees the identity below.
        previous_fd = self._own_fd
        self._own_fd = fd
        self._own_identity = (status.st_dev, status.st_ino)
        self._manifest = manifest
        if previous_fd is not None:
            os.close(previous_fd)
        _fsync_directory(self._directory)

    def _is_ours(self) -> bool:
        try:
            status = os.stat(self._path)
        except FileNotFoundError:
            return False
        return (status.st_dev, status.st_ino) == self._own_identity

    def _fenced_error(self) -> DataLogFencedError:
        """The error for a fenced owner, naming the newer owner's epoch when the manifest says it."""
        try:
            newer = self._load()
        except (OSError, DataCorruptionError):
            newer = None
        at = "" if newer is None else f" at epoch {newer.epoch}"
        return DataLogFencedError(
            f"{self._directory}: another owner took the log over{at} (this owner had epoch {self._manifest.epoch})"
        )

    def _require_ours(self) -> None:
        """Caller holds ``_locked()``.  Raises ``DataLogFencedError`` if another owner replaced our
        manifest (its epoch is newer)."""
        if not self._is_ours():
            raise self._fenced_error()

    def check_owner(self) -> None:
        """Raise ``DataLogFencedError`` if another owner has written the manifest since we last did.

        Called by the writer thread after each group's fdatasync.  One ``stat`` on the fast path.
        """
        if self._is_ours():
            return
        with self._mutex:  # a manifest write of ours may be between its replace and its bookkeeping
            if not self._is_ours():
                raise self._fenced_error()

    def take_ownership(self) -> _Ownership:
        """``initialize``'s disk work (see the module docstring).  Raises ``DataCorruptionError`` if the
        manifest or an unsealed ledger is damaged (the new epoch is then written: older owners are
        fenced, nothing else changed), ``DurableDataLogError`` if the disk fails."""
        try:
            with self._locked():
                loaded = self._load()
                manifest = self._manifest if loaded is None else loaded
                manifest = attrs.evolve(manifest, epoch=manifest.epoch + 1)
                self._write(manifest)  # fences the previous owner: this must precede the scan
                # Only the last ledger can be unsealed (the decoder checks), and only it decides where
                # the log ends; the earlier ones are validated by read().
                ledgers = list(manifest.ledgers)
                next_sequence = 1 if manifest.truncation is None else manifest.truncation.sequence
                if ledgers:
                    last = ledgers[-1]
                    length, next_sequence = _scan_ledger(
                        self._directory / _ledger_name(last.number), last.first_sequence, last.sealed_length
                    )
                    ledgers[-1] = attrs.evolve(last, sealed_length=length)
                if manifest.truncation is not None and next_sequence < manifest.truncation.sequence:
                    raise DataCorruptionError(
                        f"{self._path}: the log ends at sequence {next_sequence - 1}, below its "
                        f"truncation point {manifest.truncation.sequence}"
                    )
                number = self._remove_orphans(manifest) + 1
                fd = os.open(self._directory / _ledger_name(number), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.close(fd)  # made durable by the directory fsync of the manifest write below
                ledgers.append(_Ledger(number, manifest.epoch, next_sequence, None))
                manifest = attrs.evolve(manifest, ledgers=tuple(ledgers))
                self._write(manifest)
                return _Ownership(manifest=manifest, next_sequence=next_sequence, ledger_number=number)
        except OSError as error:
            raise DurableDataLogError(f"{self._directory}: initialize failed: {error}") from error

    def _remove_orphans(self, manifest: _Manifest) -> int:
        """Delete ledger files the manifest does not list (left by a crash between creating or
        deleting a file and writing the manifest; never written to).  Returns the highest ledger
        number in use, so the next one is fresh."""
        listed = {ledger.number for ledger in manifest.ledgers}
        highest = max(listed, default=0)
        for entry in os.scandir(self._directory):
            match = _LEDGER_NAME.fullmatch(entry.name)
            if match is not None and int(match.group(1)) not in listed:
                highest = max(highest, int(match.group(1)))
                os.unlink(entry.path)
        return highest

    def roll_over(self, number: int, length: int, first_sequence: int) -> int:
        """Seal ledger ``number`` at ``length`` and add the next ledger, starting at ``first_sequence``.
        Returns the new ledger's number.  Raises ``DataLogFencedError`` (nothing changed) or
        ``OSError`` (the manifest is the old or the new version)."""
        with self._locked():
            self._require_ours()
            manifest = self._manifest
            last = manifest.ledgers[-1]
            if last.number != number or last.sealed_length is not None:
                raise InternalError(f"rollover of ledger {number}, but the manifest ends with {last}")
            fresh = last.number + 1
            fd = os.open(self._directory / _ledger_name(fresh), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            self._write(
                attrs.evolve(
                    manifest,
                    ledgers=(
                        *manifest.ledgers[:-1],
                        attrs.evolve(last, sealed_length=length),
                        _Ledger(fresh, manifest.epoch, first_sequence, None),
                    ),
                )
            )
            return fresh

    def truncate(self, sequence: int, number: int, offset: int) -> None:
        """Make the record after ``sequence`` (which lies at ``offset`` of ledger ``number``) the first
        one kept, then delete the ledger files wholly before it.  Raises ``DataLogFencedError``,
        ``InvalidArgumentError`` if no such record is there (nothing changed), or ``OSError``."""
        with self._locked():
            self._require_ours()
            manifest = self._manifest
            if manifest.truncation is not None and sequence < manifest.truncation.sequence:
                return  # already truncated at or beyond it
            ledger = manifest.ledger(number)
            path = self._directory / _ledger_name(number)
            if ledger is None:
                raise InvalidArgumentError(f"ledger {number} is not part of {self._directory}")
            fd = os.open(path, os.O_RDONLY)
            try:
                end = os.fstat(fd).st_size if ledger.sealed_length is None else ledger.sealed_length
                intact = _is_intact_record_at(fd, offset, end, sequence)
                header = os.pread(fd, RECORD_HEADER_SIZE_BYTES, offset)
            finally:
                os.close(fd)
            if not intact or _HEADER.unpack(header)[2] != sequence:
                raise InvalidArgumentError(f"no record {sequence} at offset {offset} of {path}")
            point = _TruncationPoint(
                sequence=sequence + 1,
                ledger=number,
                offset=offset + RECORD_HEADER_SIZE_BYTES + _HEADER.unpack(header)[1],
            )
            # A point at the very end of a sealed ledger is the start of the next one: that lets the
            # sealed ledger be deleted too.
            index = manifest.ledgers.index(ledger)
            while index + 1 < len(manifest.ledgers) and manifest.ledgers[index].sealed_length == point.offset:
                index += 1
                point = _TruncationPoint(point.sequence, manifest.ledgers[index].number, 0)
            doomed = [kept.number for kept in manifest.ledgers[:index]]
            self._write(attrs.evolve(manifest, ledgers=manifest.ledgers[index:], truncation=point))
            for doomed_number in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._directory / _ledger_name(doomed_number))

    def close(self) -> None:
        """Release the open manifest version.  Idempotent."""
        if not self._mutex.acquire(timeout=limits.SHUTDOWN_TIMEOUT_SECONDS):
            _logger.error("%s: manifest still busy at close; leaving its descriptor open", self._directory)
            return
        try:
            self._closed = True
            if self._own_fd is not None:
                os.close(self._own_fd)
                self._own_fd = None
        finally:
            self._mutex.release()


# --- Writing ---------------------------------------------------------------------------------------


def _write_all(
    fd: int,
    buffers: list[bytes | bytearray | memoryview],
    writev: Callable[[int, list[bytes | bytearray | memoryview]], int] = os.writev,
) -> None:
    """Write every byte of ``buffers`` to ``fd``, ``_IOV_MAX`` buffers per call, resuming after
    partial writes.  Raises ``OSError``; how much was written is then unknown."""
    if len(buffers) == 1:  # (a group of small records: one buffer, nearly always written at once)
        written = writev(fd, buffers)
        if written == len(buffers[0]):
            return
        if written > 0:
            buffers[0] = memoryview(buffers[0])[written:]
        # else the loop below tries again, and raises if that writes nothing either
    index = 0
    while index < len(buffers):
        written = writev(fd, buffers[index : index + _IOV_MAX])
        if written <= 0 and any(len(buffer) for buffer in buffers[index : index + _IOV_MAX]):
            raise OSError(errno.EIO, "writev wrote nothing")
        while index < len(buffers) and written >= len(buffers[index]):
            written -= len(buffers[index])
            index += 1
        if written:
            buffers[index] = memoryview(buffers[index])[written:]


def _as_bytes(data: memoryview) -> memoryview:
    """A byte-formatted view of ``data`` (so ``len`` counts bytes).  Raises ``InvalidArgumentError``
    if it is not contiguous."""
    if not data.c_contiguous:
        raise InvalidArgumentError("append() needs a contiguous buffer")
    return data if data.format == "B" and data.ndim == 1 else data.cast("B")


class _State(enum.Enum):
    NEW = "new"
    INITIALIZING = "initializing"
    OPEN = "open"
    FAILED = "failed"  # a write failed or the log was fenced: it closed itself; close() releases it
    CLOSED = "closed"


_TRANSITIONS: Final[dict[_State, frozenset[_State]]] = {
    _State.NEW: frozenset({_State.INITIALIZING, _State.CLOSED}),
    _State.INITIALIZING: frozenset({_State.OPEN, _State.CLOSED}),
    _State.OPEN: frozenset({_State.FAILED, _State.CLOSED}),
    _State.FAILED: frozenset({_State.CLOSED}),
    _State.CLOSED: frozenset(),
}

#: A queued append: sequence, payload, future, the caller's on_done (or None).
_Pending = tuple[int, "bytes | bytearray | memoryview", "asyncio.Future[LogAddress]", "OnDone | None"]


def _error_like(failure: BaseException) -> BaseException:
    """A fresh exception of ``failure``'s type and message (each future gets its own, so that
    tracebacks of different awaiters do not pile onto one object)."""
    error = type(failure)(*failure.args)
    error.__cause__ = failure.__cause__
    return error


def _drain(queue: collections.deque[_Pending]) -> list[_Pending]:
    """Take everything from ``queue``, which another thread may be draining at the same time."""
    taken: list[_Pending] = []
    popleft = queue.popleft
    for _ in range(len(queue)):
        try:
            taken.append(popleft())
        except IndexError:  # the other thread took the rest
            break
    return taken


class FileLog(DurableDataLog):
    """A DurableDataLog kept in ``directory`` on the local disk.  See the module docstring.

    Threads.  ``append``, ``truncate``, ``close`` and the completion of futures run on the event loop
    that ran ``initialize``.  The writer thread reaches that loop only through ``_post`` (its
    messages, in order).  The hand-off between them is a ``collections.deque`` (its ``append`` and
    ``popleft`` are atomic), so an append takes no lock; the writer sleeps on ``_wake`` only when the
    queue is empty, and an append wakes it only then.  State changes happen under ``_condition``.  An
    append that races with the writer failing lands in a queue that the writer's last message (run on
    the loop, hence after that append) drains and fails.
    """

    def __init__(
        self,
        directory: Path,
        *,
        ledger_size_bytes_max: int = limits.FILE_LOG_LEDGER_SIZE_BYTES_MAX,
        max_write_length_bytes: int = DEFAULT_MAX_WRITE_LENGTH_BYTES,
        in_flight_bytes_max: int = limits.DATA_LOG_IN_FLIGHT_BYTES_MAX,
        fdatasync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        """Raises ``InvalidArgumentError`` if an option is out of range.  Touches no file."""
        if ledger_size_bytes_max < 1:
            raise InvalidArgumentError(f"ledger_size_bytes_max must be positive, not {ledger_size_bytes_max}")
        if not 0 <= max_write_length_bytes <= RECORD_PAYLOAD_LENGTH_BYTES_MAX:
            raise InvalidArgumentError(
                f"max_write_length_bytes must lie in [0, {RECORD_PAYLOAD_LENGTH_BYTES_MAX}], "
                f"not {max_write_length_bytes}"
            )
        if in_flight_bytes_max < max_write_length_bytes + RECORD_HEADER_SIZE_BYTES:
            raise InvalidArgumentError("in_flight_bytes_max must hold at least one largest record")
        self._directory = Path(directory)
        self._ledger_size_max_bytes = ledger_size_bytes_max
        self._max_write_length_bytes = max_write_length_bytes
        self._in_flight_bytes_max = in_flight_bytes_max
        self._fdatasync = fdatasync
        self._store = _ManifestStore(self._directory)
        self._epoch = 0
        self._loop: asyncio.AbstractEventLoop | None = None

        # Shared with the writer thread.  _state and _failure change under _condition.  The queue is
        # bounded by in_flight_bytes_max: every record counts its header, so even empty records are
        # limited in number.
        self._condition = threading.Condition(threading.Lock())
        self._state = _State.NEW
        self._failure: DurableDataLogError | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        # The writer's sleep.  It announces it in _writer_waiting, looks at the queue once more and
        # blocks on _wake, a lock used as a binary semaphore: held means "no wake-up pending".  Only
        # the loop thread releases it (_wake_writer), and only while it is held, so a wake-up is
        # never released twice; the writer only acquires it.
        self._writer_waiting = False
        self._wake = threading.Lock()
        self._wake.acquire()
        # The writer's messages to the loop (see _post): callbacks run in order by _run_messages,
        # which the loop calls when _signal_fd (an eventfd) becomes readable.  _signalled says a
        # signal is on its way, so a burst of messages costs one system call.  Bounded: one message
        # per group the writer completes (groups are bounded by in_flight_bytes_max) and one at exit.
        self._messages: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._signal_fd = -1  # -1: the loop cannot watch a descriptor; messages go by call_soon_threadsafe
        self._signalled = False
        self._writer_batch: list[_Pending] = []  # taken by the writer, not yet all completed
        self._writer_done = 0  # how many of _writer_batch the writer has completed

        # Loop thread only.
        self._next_sequence = 1
        self._in_flight_bytes = 0  # record bytes appended and not yet completed or failed
        self._recovered_next_sequence = 1
        self._blocking_calls: set[asyncio.Future[Any]] = set()
        self._writer_thread: threading.Thread | None = None
        self._writer_exited: asyncio.Future[None] | None = None

        # Writer thread only (set before it starts).
        self._ledger_fd = -1
        self._ledger_number = 0
        self._ledger_offset = 0
        self._writer_sequence = 1

    # --- DurableDataLog ------------------------------------------------------------------------------

    @property
    def write_settings(self) -> WriteSettings:
        return WriteSettings(max_write_length_bytes=self._max_write_length_bytes)

    @property
    def epoch(self) -> int:
        return self._epoch

    async def initialize(self) -> int:
        """Take ownership of the directory, fence older owners, recover, start the writer thread.

        The disk work runs in a worker thread.  Raises ``DataCorruptionError`` if the manifest or the
        tail of the last ledger is damaged, ``DurableDataLogError`` if the disk fails,
        ``ObjectClosedError`` if closed, ``InternalError`` if called twice.  On any error (and on
        cancellation) this instance is closed; the takeover may still have happened, so older owners
        may be fenced either way.
        """
        with self._condition:
            if self._state is _State.CLOSED:
                raise ObjectClosedError(f"{self._directory}: the log is closed")
            if self._state is not _State.NEW:
                raise InternalError("initialize() may be called only once")
            self._set_state(_State.INITIALIZING)
        loop = asyncio.get_running_loop()
        self._loop = loop
        try:
            ownership: _Ownership = await self._run_blocking(self._store.take_ownership)
        except Exception:
            with self._condition:
                if self._current_state() is _State.INITIALIZING:
                    self._set_state(_State.CLOSED)
            self._store.close()  # the worker has finished: release the manifest it may have written
            raise
        except BaseException:  # cancelled: the worker may still run; close() waits for it
            with self._condition:
                if self._current_state() is _State.INITIALIZING:
                    self._set_state(_State.CLOSED)
            raise
        with self._condition:
            if self._current_state() is not _State.INITIALIZING:  # close() may have come first
                raise ObjectClosedError(f"{self._directory}: closed during initialize()")
            self._epoch = ownership.manifest.epoch
            self._next_sequence = ownership.next_sequence
            self._recovered_next_sequence = ownership.next_sequence
            self._writer_sequence = ownership.next_sequence
            self._ledger_number = ownership.ledger_number
            self._ledger_offset = 0
            try:
                self._ledger_fd = os.open(
                    self._directory / _ledger_name(ownership.ledger_number), os.O_WRONLY | os.O_APPEND
                )
            except OSError as error:
                self._set_state(_State.CLOSED)
                raise DurableDataLogError(f"{self._directory}: cannot open the new ledger: {error}") from error
            self._writer_exited = loop.create_future()
            self._watch_signal_fd(loop)
            # Daemon: a writer stuck in fdatasync on a dead disk must not keep the process alive.
            self._writer_thread = threading.Thread(
                target=self._writer_main, name=f"FileLog writer {self._directory}", daemon=True
            )
            self._set_state(_State.OPEN)
        self._writer_thread.start()
        return self._epoch

    def read(self) -> Iterator[LogRecord]:
        """Yield every record from the truncation point on, across ledgers, in sequence order.

        Call after ``initialize()`` and before the first ``append()`` (else ``InternalError``).
        Blocks the calling thread for the disk reads (recovery runs before the container serves
        anything).  A damaged record, a gap or a duplicate raises ``DataCorruptionError`` naming the
        ledger file and byte offset; the records before it were yielded, nothing was modified.
        """
        if self._state is not _State.OPEN:
            raise self._not_open_error()
        if self._next_sequence != self._recovered_next_sequence:
            raise InternalError("read() after the first append()")
        return _read_ledgers(self._directory, self._store.manifest, self._recovered_next_sequence)

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        """Queue one record; the future completes with its address once it is durable.

        Raises ``PayloadTooLargeError`` if ``data`` exceeds ``write_settings``, ``ObjectClosedError``
        if the log is closed or failed, ``InternalError`` before ``initialize()`` or if the caller
        lets more than ``in_flight_bytes_max`` of records be in flight (the caller bounds that).
        Nothing is queued when it raises.  The future fails with ``WriteFailedError`` or
        ``DataLogFencedError`` if the write fails, ``ObjectClosedError`` if ``close()`` came first.
        Cancelling the future does not withdraw the write.

        This is the hot path: a few attribute reads, one future, one deque append; no lock and no
        system call unless the writer is asleep.
        """
        if type(data) is memoryview:
            data = _as_bytes(data)
        length = len(data)
        if length > self._max_write_length_bytes:
            raise PayloadTooLargeError(
                f"record of {length} bytes exceeds the log's limit of {self._max_write_length_bytes}"
            )
        if self._state is not _State.OPEN:
            raise self._not_open_error()
        in_flight_bytes = self._in_flight_bytes + length + RECORD_HEADER_SIZE_BYTES
        if in_flight_bytes > self._in_flight_bytes_max:
            raise InternalError(f"{in_flight_bytes} bytes in flight exceed {self._in_flight_bytes_max}")
        future = self._loop.create_future()  # type: ignore[union-attr]  # set before OPEN
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        self._in_flight_bytes = in_flight_bytes
        self._queue.append((sequence, data, future, on_done))
        if self._writer_waiting:
            self._wake_writer()
        return future

    async def truncate(self, upto: LogAddress) -> None:
        """Discard every record up to and including ``upto`` (an address this log returned).

        Writes the new truncation point to the manifest, then deletes the ledger files wholly before
        it.  Idempotent; an address below the current truncation point does nothing.  Raises
        ``InvalidArgumentError`` if ``upto`` is not a durable record of this log,
        ``DataLogFencedError`` if another owner took over, ``ObjectClosedError`` if closed,
        ``DurableDataLogError`` if the disk fails (the truncation then may or may not have happened).
        """
        if self._state is not _State.OPEN:
            raise self._not_open_error()
        if len(upto.locator) != 2 or not 1 <= upto.sequence < self._next_sequence:
            raise InvalidArgumentError(f"{upto} is not an address of this log")
        number, offset = upto.locator
        try:
            await self._run_blocking(self._store.truncate, upto.sequence, number, offset)
        except OSError as error:
            raise DurableDataLogError(f"{self._directory}: truncate failed: {error}") from error

    async def close(self) -> None:
        """Stop accepting appends; let the writer finish the group it is writing (for up to
        ``SHUTDOWN_TIMEOUT_SECONDS``), fail still-queued appends with ``ObjectClosedError``, stop the
        writer thread and release the files.  Idempotent.

        If the writer is stuck in a system call past the timeout, the records it holds fail with
        ``WriteFailedError`` and the (daemon) thread is left to finish that call on its own.
        """
        loop = asyncio.get_running_loop()
        with self._condition:
            if self._state is not _State.CLOSED:
                self._set_state(_State.CLOSED)
        self._wake_writer()
        self._fail_records(_drain(self._queue), ObjectClosedError(f"{self._directory}: the log was closed"))
        if self._blocking_calls:
            await asyncio.wait(set(self._blocking_calls), timeout=limits.SHUTDOWN_TIMEOUT_SECONDS)
        if self._writer_exited is not None and self._writer_thread is not None:
            if self._writer_exited.get_loop() is not loop:
                raise InternalError("close() must run on the event loop that ran initialize()")
            try:
                await asyncio.wait_for(asyncio.shield(self._writer_exited), limits.SHUTDOWN_TIMEOUT_SECONDS)
            except TimeoutError:
                with self._condition:
                    stuck = self._writer_batch[self._writer_done :]
                _logger.error("%s: writer stuck for %s s at close", self._directory, limits.SHUTDOWN_TIMEOUT_SECONDS)
                self._fail_records(stuck, WriteFailedError(f"{self._directory}: writer stuck at close"))
            else:
                self._writer_thread.join(timeout=limits.SHUTDOWN_TIMEOUT_SECONDS)  # it has returned
        self._unwatch_signal_fd()
        self._store.close()

    # --- Introspection -------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert what must hold between operations (call from the loop thread)."""
        assert self._state in _TRANSITIONS
        assert 1 <= self._recovered_next_sequence <= self._next_sequence
        # (After close() gave up on a stuck writer, its late completions may count bytes twice.)
        assert 0 <= self._in_flight_bytes <= self._in_flight_bytes_max or self._state is _State.CLOSED
        assert self._writer_sequence <= self._next_sequence or self._state is not _State.OPEN
        assert self._epoch in (0, self._store.manifest.epoch)
        if self._state is _State.CLOSED and self._writer_exited is not None and self._writer_exited.done():
            assert not self._queue

    # --- Internals -----------------------------------------------------------------------------------

    def _current_state(self) -> _State:
        """``_state``, read through a call so that type checkers do not carry a narrowing of it
        across an ``await`` (during which other code may change it)."""
        return self._state

    def _set_state(self, state: _State) -> None:
        """Caller holds ``_condition``."""
        if state not in _TRANSITIONS[self._state]:
            raise InternalError(f"FileLog state {self._state.value} -> {state.value}")
        self._state = state

    def _not_open_error(self) -> Exception:
        if self._state in (_State.NEW, _State.INITIALIZING):
            return InternalError("the log is used before initialize() completed")
        error = ObjectClosedError(f"{self._directory}: the log is {self._state.value}")
        error.__cause__ = self._failure
        return error

    async def _run_blocking(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function`` in a worker thread.  If the caller is cancelled the thread still runs to
        the end (it cannot be stopped); ``close()`` waits for it."""
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(None, function, *args)
        self._blocking_calls.add(work)
        work.add_done_callback(self._forget_blocking_call)
        return await asyncio.shield(work)

    def _forget_blocking_call(self, work: asyncio.Future[Any]) -> None:
        self._blocking_calls.discard(work)
        if not work.cancelled():
            work.exception()  # retrieved: its awaiter may have been cancelled and gone

    def _fail_records(self, records: list[_Pending], failure: BaseException) -> None:
        """Fail the futures of ``records`` (loop thread)."""
        for _sequence, data, future, on_done in records:
            self._in_flight_bytes -= len(data) + RECORD_HEADER_SIZE_BYTES
            if not future.done():
                future.set_exception(_error_like(failure))
            notify_done(on_done, future)

    def _complete_group(
        self, batch: list[_Pending], start: int, stop: int, addresses: list[LogAddress], group_bytes: int
    ) -> None:
        """Complete the durable group ``batch[start:stop]``, in order (loop thread; one call per group)."""
        self._in_flight_bytes -= group_bytes
        for (_sequence, _data, future, on_done), address in zip(
                itertools.islice(batch, start, stop), addresses, strict=True):
            if not future.done():  # the caller may have cancelled it; the record is durable anyway
                future.set_result(address)
            if on_done is not None:
                notify_done(on_done, future)

    def _on_writer_exit(self, unfinished: list[_Pending], failure: DurableDataLogError | None) -> None:
        """The writer thread's last message (loop thread).  Runs after every append that could have
        raced with the writer's exit, so draining the queue here leaves nothing behind."""
        leftover = unfinished + _drain(self._queue)
        if failure is None:
            self._fail_records(leftover, ObjectClosedError(f"{self._directory}: the log was closed"))
        else:
            self._fail_records(leftover, failure)
        if self._writer_exited is not None and not self._writer_exited.done():
            self._writer_exited.set_result(None)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop, after everything posted before it (writer thread)."""
        assert self._loop is not None
        if self._signal_fd < 0:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
                self._loop.call_soon_threadsafe(callback, *args)
            return
        # Queue the message, then signal unless a signal is on its way.  The loop clears _signalled
        # before it drains the queue, so a message it does not find was queued after the clearing,
        # and then this thread saw the flag clear and signals again: no message is left unseen.
        self._messages.append((callback, args))
        if not self._signalled:
            self._signalled = True
            # (try/except rather than contextlib.suppress, which costs a dozen bytecodes per message)
            try:  # noqa: SIM105
                os.eventfd_write(self._signal_fd, 1)
            except OSError:  # (only if the descriptor is gone: nobody listens then)
                pass

    def _run_messages(self) -> None:
        """Run the writer's messages, in order (loop thread; the loop calls it when signalled)."""
        try:  # noqa: SIM105  (as in _post)
            os.eventfd_read(self._signal_fd)
        except BlockingIOError:  # (a signal whose messages an earlier call ran)
            pass
        self._signalled = False
        messages = self._messages
        while messages:
            callback, args = messages.popleft()
            try:
                callback(*args)
            except Exception as error:  # a bug; as with call_soon, report it and run the rest
                assert self._loop is not None
                self._loop.call_exception_handler(
                    {"message": "FileLog message failed", "exception": error, "callback": callback})

    def _watch_signal_fd(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create the eventfd the writer signals its messages on and have ``loop`` watch it."""
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            loop.add_reader(fd, self._run_messages)
        except NotImplementedError:  # a loop that cannot watch descriptors (not on Linux)
            os.close(fd)
            return
        self._signal_fd = fd

    def _unwatch_signal_fd(self) -> None:
        """Stop watching the eventfd; close it once the writer thread has ended (loop thread)."""
        fd = self._signal_fd
        if fd < 0 or self._loop is None:
            return
        self._loop.remove_reader(fd)
        if self._writer_thread is None or not self._writer_thread.is_alive():
            self._signal_fd = -1
            os.close(fd)
        # else the writer is stuck in a system call: it may still signal when it returns, so the
        # descriptor stays open (closed, its number could be reused by a file it would then write to).

    def _wake_writer(self) -> None:
        """Wake the writer if it sleeps or is about to (loop thread)."""
        self._writer_waiting = False
        wake = self._wake
        if wake.locked():  # (only this thread releases it, so it is still held below)
            wake.release()

    # --- The writer thread ---------------------------------------------------------------------------

    def _writer_main(self) -> None:
        failure: DurableDataLogError | None = None
        try:
            self._writer_loop()
        except DurableDataLogError as error:  # fenced at a group or a rollover
            failure = error
        except OSError as error:
            failure = WriteFailedError(
                f"{self._directory}: writing {_ledger_name(self._ledger_number)} failed: {error}"
            )
            failure.__cause__ = error
        except Exception as error:
            # A bug.  Still fail every pending write rather than leave its future hanging forever.
            failure = WriteFailedError(f"{self._directory}: writer thread failed: {error!r}")
            failure.__cause__ = error
        finally:
            with contextlib.suppress(OSError):
                os.close(self._ledger_fd)
            with self._condition:
                unfinished = self._writer_batch[self._writer_done :]
                self._writer_batch = []
                if failure is not None:
                    self._failure = failure
                    if self._state is _State.OPEN:
                        self._set_state(_State.FAILED)
            self._post(self._on_writer_exit, unfinished, failure)

    def _take_batch(self) -> list[_Pending] | None:
        """Everything queued, once there is something; None once the log stops being open."""
        queue = self._queue
        while self._state is _State.OPEN:
            if queue:
                batch = _drain(queue)
                with self._condition:  # close() reads these if the writer gets stuck
                    self._writer_batch = batch
                    self._writer_done = 0
                return batch
            # Announce the sleep, then look again: an append that missed the announcement queued its
            # record before this second look, so nothing is left sleeping.  (close() changes the
            # state, then wakes us.)  A wake-up left pending from an earlier look returns at once.
            self._writer_waiting = True
            if not queue and self._state is _State.OPEN:
                self._wake.acquire(timeout=_WRITER_IDLE_WAIT_SECONDS)
            self._writer_waiting = False
        return None  # close() fails what is still queued; a failure's last message does too

    def _writer_loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            index = 0
            while index < len(batch):
                index = self._write_group(batch, index)
                self._writer_done = index
                if self._ledger_offset >= self._ledger_size_max_bytes:
                    self._roll_over()

    def _write_group(self, batch: list[_Pending], index: int) -> int:
        """Write, sync and complete ``batch[index:]`` up to where the ledger fills; return where the
        group ended.  Raises ``OSError`` or ``DataLogFencedError``; the group's futures are then
        not completed."""
        ledger = self._ledger_number
        start_offset = offset = self._ledger_offset
        offset_max = self._ledger_size_max_bytes
        first_sequence = sequence_expected = self._writer_sequence
        buffers: list[bytes | bytearray | memoryview] = []
        addresses: list[LogAddress] = []
        small = bytearray()
        # Locals: this loop runs once per record, holding the GIL that the event loop also needs.
        crc32 = zlib.crc32
        pack_length_sequence = _LENGTH_SEQUENCE.pack
        pack_header = _HEADER.pack
        add_address = addresses.append
        for sequence, data, _future, _on_done in itertools.islice(batch, index, None):
            if offset >= offset_max:
                break
            if sequence != sequence_expected:
                raise InternalError(f"writer expected sequence {sequence_expected}, got {sequence}")
            length = len(data)
            crc = crc32(data, crc32(pack_length_sequence(length, sequence)))
            small += pack_header(RECORD_MAGIC, length, sequence, crc)
            if length < _COPY_THRESHOLD_BYTES:
                small += data
            else:
                buffers.append(small)
                buffers.append(data)
                small = bytearray()
            add_address(LogAddress(sequence, (ledger, offset)))
            offset += RECORD_HEADER_SIZE_BYTES + length
            sequence_expected += 1
        if small:
            buffers.append(small)
        _write_all(self._ledger_fd, buffers)
        self._fdatasync(self._ledger_fd)
        self._ledger_offset = offset
        self._writer_sequence = sequence_expected
        self._store.check_owner()  # before completing anything: see "Fencing" in the module docstring
        stop = index + sequence_expected - first_sequence
        self._post(self._complete_group, batch, index, stop, addresses, offset - start_offset)
        return stop

    def _roll_over(self) -> None:
        number = self._store.roll_over(self._ledger_number, self._ledger_offset, self._writer_sequence)
        fd = os.open(self._directory / _ledger_name(number), os.O_WRONLY | os.O_APPEND)
        os.close(self._ledger_fd)
        self._ledger_fd = fd
        self._ledger_number = number
        self._ledger_offset = 0
