"""FileLog beyond the conformance suite: ledgers and rollover, group commit failures, the fencing race
between two owners on one directory, the manifest, and the byte-level helpers."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import struct
import threading
import zlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from millstream import limits
from millstream.errors import (
    DataCorruptionError,
    DataLogFencedError,
    InternalError,
    InvalidArgumentError,
    ObjectClosedError,
    WriteFailedError,
)
from millstream.segmentstore import file_log
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord
from millstream.segmentstore.file_log import RECORD_HEADER_SIZE_BYTES, RECORD_MAGIC, FileLog

SCENARIO_TIMEOUT_SECONDS = 30.0


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_SECONDS))


def manifest_body(directory: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((directory / "manifest").read_bytes())["body"]
    return body


def ledger_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("ledger-*.log"))


def record_bytes(sequence: int, payload: bytes) -> bytes:
    """One record, framed as the module docstring says (an independent re-implementation)."""
    crc = zlib.crc32(struct.pack(">IQ", len(payload), sequence) + payload)
    return struct.pack(">IIQI", RECORD_MAGIC, len(payload), sequence, crc) + payload


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


async def recover(directory: Path, **options: Any) -> tuple[FileLog, list[LogRecord]]:
    log = FileLog(directory, **options)
    await log.initialize()
    return log, list(log.read())


async def contents(directory: Path) -> list[tuple[int, bytes]]:
    log, records = await recover(directory)
    await log.close()
    return [(record.address.sequence, record.data) for record in records]


# --- Layout ----------------------------------------------------------------------------------------


def test_records_are_laid_out_as_documented(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        assert await log.initialize() == 1
        first = await log.append(b"hello")
        second = await log.append(b"")
        assert first == LogAddress(1) and first.locator == (1, 0)
        assert second.locator == (1, RECORD_HEADER_SIZE_BYTES + 5)
        await log.close()
        assert (tmp_path / "ledger-00000001.log").read_bytes() == record_bytes(1, b"hello") + record_bytes(2, b"")

        body = manifest_body(tmp_path)
        assert body == {
            "epoch": 1,
            "format_version": 1,
            "ledgers": [{"epoch": 1, "first_sequence": 1, "number": 1, "sealed_length": None}],
            "truncation": None,
        }

    run(scenario())


def test_a_new_owner_seals_the_old_ledger_and_starts_its_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await log.append(b"abc")
        await log.close()
        log, records = await recover(tmp_path)
        assert [record.address.locator for record in records] == [(1, 0)]
        assert manifest_body(tmp_path)["ledgers"] == [
            {"epoch": 1, "first_sequence": 1, "number": 1, "sealed_length": RECORD_HEADER_SIZE_BYTES + 3},
            {"epoch": 2, "first_sequence": 2, "number": 2, "sealed_length": None},
        ]
        assert (await log.append(b"def")).locator == (2, 0)
        await log.close()

    run(scenario())


def test_damaged_manifest_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await log.close()
        manifest = (tmp_path / "manifest").read_bytes()
        (tmp_path / "manifest").write_bytes(manifest.replace(b'"epoch":1', b'"epoch":7', 1))
        with pytest.raises(DataCorruptionError, match="checksum mismatch"):
            await FileLog(tmp_path).initialize()
        (tmp_path / "manifest").write_bytes(b"not a manifest")
        with pytest.raises(DataCorruptionError, match="manifest"):
            await FileLog(tmp_path).initialize()

    run(scenario())


def test_orphan_ledger_files_are_removed(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await log.append(b"kept")
        await log.close()
        (tmp_path / "ledger-00000007.log").write_bytes(b"")  # a crashed rollover's new file
        log, records = await recover(tmp_path)
        assert [record.data for record in records] == [b"kept"]
        assert ledger_files(tmp_path) == ["ledger-00000001.log", "ledger-00000008.log"]
        await log.close()

    run(scenario())


# --- Rollover and truncation -----------------------------------------------------------------------


def test_rollover_spreads_records_over_small_ledgers_and_truncate_deletes_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path, ledger_size_bytes_max=300)
        await log.initialize()
        payloads = [bytes([i]) * 50 for i in range(40)]
        addresses: list[LogAddress] = []
        for start in range(0, 40, 3):  # groups of three: 210 bytes, so a ledger holds two groups
            addresses += await asyncio.gather(*(log.append(p) for p in payloads[start : start + 3]))
        await log.close()
        assert [address.sequence for address in addresses] == list(range(1, 41))
        ledgers = manifest_body(tmp_path)["ledgers"]
        assert len(ledgers) >= 6
        assert all(ledger["sealed_length"] is not None for ledger in ledgers[:-1])
        # A ledger overshoots its limit by less than one record: the group stops once it is full.
        assert all(300 <= ledger["sealed_length"] < 300 + 70 for ledger in ledgers[:-1])
        assert [ledger["number"] for ledger in ledgers] == list(range(1, len(ledgers) + 1))
        used = sorted({address.locator[0] for address in addresses})
        numbers = [ledger["number"] for ledger in ledgers]
        assert used == numbers or used == numbers[:-1]  # the last rollover may leave an empty ledger

        log, records = await recover(tmp_path, ledger_size_bytes_max=300)
        assert [record.data for record in records] == payloads
        assert [record.address.locator for record in records] == [address.locator for address in addresses]
        await log.truncate(records[29].address)
        kept_ledger = records[30].address.locator[0]
        assert ledger_files(tmp_path)[0] == f"ledger-{kept_ledger:08d}.log"
        assert manifest_body(tmp_path)["truncation"]["sequence"] == 31
        await log.close()
        assert await contents(tmp_path) == list(enumerate(payloads, start=1))[30:]

    run(scenario())


def test_truncate_at_a_ledgers_last_record_deletes_that_ledger(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path, ledger_size_bytes_max=1)  # every group rolls over
        await log.initialize()
        first = await log.append(b"a")
        second = await log.append(b"b")
        assert (first.locator[0], second.locator[0]) == (1, 2)
        await log.truncate(first)
        # Ledger 1 is gone, 2 stays; 3 appears when the writer thread rolls over after the second
        # record's group -- possibly after this line runs, so it is not asserted.
        assert ledger_files(tmp_path)[:1] == ["ledger-00000002.log"]
        assert manifest_body(tmp_path)["truncation"] == {"ledger": 2, "offset": 0, "sequence": 2}
        with pytest.raises(InvalidArgumentError):
            await log.truncate(LogAddress(2, (2, 5)))  # no record starts there
        await log.close()
        assert await contents(tmp_path) == [(2, b"b")]

    run(scenario())


# --- Failures --------------------------------------------------------------------------------------


def test_a_failing_fdatasync_fails_its_group_and_everything_after(tmp_path: Path) -> None:
    calls = []
    all_appended = threading.Event()

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        if len(calls) >= 2:
            # Hold the failing group until every append below is queued behind it.
            all_appended.wait(SCENARIO_TIMEOUT_SECONDS)
            raise OSError(errno.EIO, "injected")
        os.fdatasync(fd)

    async def scenario() -> None:
        log = FileLog(tmp_path, fdatasync=fdatasync)
        await log.initialize()
        assert (await log.append(b"durable")).sequence == 1
        futures = [log.append(bytes([i]) * 10) for i in range(20)]
        all_appended.set()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(outcome, WriteFailedError) for outcome in outcomes), outcomes
        assert "injected" in str(outcomes[0].__cause__)  # type: ignore[union-attr]
        with pytest.raises(ObjectClosedError) as caught:
            log.append(b"after the failure")
        assert isinstance(caught.value.__cause__, WriteFailedError)
        await log.close()

        # The outcome of the failed group is unknown: a new owner reads a contiguous prefix that
        # holds at least the acknowledged record, and numbering continues after whatever it found.
        log, records = await recover(tmp_path)
        assert records[0].data == b"durable"
        assert [record.address.sequence for record in records] == list(range(1, len(records) + 1))
        assert (await log.append(b"next")).sequence == len(records) + 1
        await log.close()

    run(scenario())


def test_close_gives_up_on_a_stuck_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    entered = threading.Event()

    def fdatasync(fd: int) -> None:
        entered.set()
        release.wait(SCENARIO_TIMEOUT_SECONDS)
        os.fdatasync(fd)

    async def scenario() -> None:
        log = FileLog(tmp_path, fdatasync=fdatasync)
        await log.initialize()
        future = log.append(b"stuck")
        await asyncio.to_thread(entered.wait, SCENARIO_TIMEOUT_SECONDS)
        monkeypatch.setattr(limits, "SHUTDOWN_TIMEOUT_SECONDS", 0.2)
        await log.close()
        with pytest.raises(WriteFailedError):
            await future
        release.set()
        writer = log._writer_thread
        assert writer is not None
        await asyncio.to_thread(writer.join, SCENARIO_TIMEOUT_SECONDS)
        assert not writer.is_alive()

    run(scenario())


def test_appending_beyond_the_in_flight_limit_is_a_caller_bug(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path, max_write_length_bytes=100, in_flight_bytes_max=250)
        await log.initialize()
        first = log.append(bytes(100))
        second = log.append(bytes(100))
        with pytest.raises(InternalError):
            log.append(bytes(100))  # 360 bytes with headers
        await asyncio.gather(first, second)
        await log.append(bytes(100))  # room again
        await log.close()

    run(scenario())


def test_options_are_validated() -> None:
    with pytest.raises(InvalidArgumentError):
        FileLog(Path("unused"), ledger_size_bytes_max=0)
    with pytest.raises(InvalidArgumentError):
        FileLog(Path("unused"), max_write_length_bytes=file_log.RECORD_PAYLOAD_LENGTH_BYTES_MAX + 1)
    with pytest.raises(InvalidArgumentError):
        FileLog(Path("unused"), max_write_length_bytes=100, in_flight_bytes_max=100)


# --- Torn tails and damage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        bytes(4096),  # the file system extended the file, the data never landed
        b"\xff" * 3,  # a header cut short
        record_bytes(3, b"x" * 100)[:-1],  # a record cut one byte short
        record_bytes(3, b"x" * 100)[:60] + bytes(61),  # a record whose payload landed partly
    ],
    ids=["zeros", "short-header", "short-record", "partial-payload"],
)
def test_torn_tails_are_dropped(tmp_path: Path, tail: bytes) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await asyncio.gather(log.append(b"one"), log.append(b"two"))
        await log.close()
        append_bytes(tmp_path / "ledger-00000001.log", tail)
        log, records = await recover(tmp_path)
        assert [record.data for record in records] == [b"one", b"two"]
        assert manifest_body(tmp_path)["ledgers"][0]["sealed_length"] == 2 * RECORD_HEADER_SIZE_BYTES + 6
        await log.close()

    run(scenario())


def test_an_intact_record_after_damage_is_found_at_any_offset(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await log.append(b"one")
        await log.close()
        append_bytes(tmp_path / "ledger-00000001.log", b"\x00\x01garbage" + record_bytes(2, b"two") + b"\x00")
        with pytest.raises(DataCorruptionError, match=r"ledger-00000001\.log.* offset 23 .* offset 32"):
            await FileLog(tmp_path).initialize()

    run(scenario())


def test_a_record_with_the_wrong_sequence_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await log.append(b"one")
        await log.close()
        append_bytes(tmp_path / "ledger-00000001.log", record_bytes(5, b"five"))
        with pytest.raises(DataCorruptionError, match="sequence 5, expected 2"):
            await FileLog(tmp_path).initialize()

    run(scenario())


def test_reading_in_tiny_chunks_crosses_every_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_log, "_READ_CHUNK_BYTES", 7)
    payloads = [bytes([i]) * size for i, size in enumerate([0, 1, 5, 6, 7, 8, 13, 100, 0, 3])]

    async def scenario() -> None:
        log = FileLog(tmp_path)
        await log.initialize()
        await asyncio.gather(*(log.append(payload) for payload in payloads))
        await log.close()
        append_bytes(tmp_path / "ledger-00000001.log", record_bytes(11, b"torn")[:-2])
        assert await contents(tmp_path) == list(enumerate(payloads, start=1))

    run(scenario())


# --- Fencing ---------------------------------------------------------------------------------------


def test_a_fenced_owner_may_not_truncate(tmp_path: Path) -> None:
    async def scenario() -> None:
        old = FileLog(tmp_path)
        await old.initialize()
        address = await old.append(b"a")
        new, _records = await recover(tmp_path)
        with pytest.raises(DataLogFencedError):
            await old.truncate(address)
        await old.close()
        await new.close()
        assert await contents(tmp_path) == [(1, b"a")]

    run(scenario())


@pytest.mark.parametrize("acknowledged_before_takeover", [0, 50, 400])
def test_fencing_race_between_two_owners_on_threads(tmp_path: Path, acknowledged_before_takeover: int) -> None:
    """The old owner appends flat out on its loop; the new owner initializes and reads on another
    thread with its own loop.  Every record the old owner was told is durable must be among those
    the new owner read; everything else the old owner wrote must fail with DataLogFencedError and
    never appear in the log."""
    taken_over: list[list[tuple[int, bytes]]] = []

    def new_owner() -> None:
        async def take_over() -> None:
            log, records = await recover(tmp_path)
            taken_over.append([(record.address.sequence, record.data) for record in records])
            await log.append(b"new owner")
            await log.close()

        asyncio.run(asyncio.wait_for(take_over(), SCENARIO_TIMEOUT_SECONDS))

    async def scenario() -> None:
        old = FileLog(tmp_path)
        await old.initialize()
        futures: list[asyncio.Future[LogAddress]] = []
        payloads: list[bytes] = []
        thread = threading.Thread(target=new_owner)
        acknowledged = 0
        while not taken_over or len(futures) - acknowledged < 2000:
            if len(futures) - acknowledged >= 100:  # a window of 100 in flight
                try:
                    await futures[acknowledged]
                except DataLogFencedError:
                    break
                acknowledged += 1
            if acknowledged >= acknowledged_before_takeover and not thread.is_alive() and not taken_over:
                thread.start()
            payload = f"old owner record {len(futures) + 1}".encode()
            try:
                futures.append(old.append(payload))
            except ObjectClosedError:
                break
            payloads.append(payload)
            await asyncio.sleep(0)
        await asyncio.to_thread(thread.join, SCENARIO_TIMEOUT_SECONDS)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await old.close()

        (read,) = taken_over
        assert read == list(enumerate(payloads[: len(read)], start=1))
        succeeded = [outcome for outcome in outcomes if isinstance(outcome, LogAddress)]
        failed = [outcome for outcome in outcomes if not isinstance(outcome, LogAddress)]
        assert all(isinstance(outcome, DataLogFencedError) for outcome in failed), failed[:3]
        assert [address.sequence for address in succeeded] == list(range(1, len(succeeded) + 1))
        assert len(succeeded) <= len(read)
        assert len(succeeded) >= acknowledged_before_takeover
        assert failed, "the old owner kept writing after the takeover, so some writes must fail"
        assert await contents(tmp_path) == [*read, (len(read) + 1, b"new owner")]

    run(scenario())


# --- Helpers ---------------------------------------------------------------------------------------


def test_write_all_resumes_after_partial_writes() -> None:
    written = bytearray()
    calls: list[int] = []

    def stingy_writev(_fd: int, buffers: list[Any]) -> int:
        calls.append(len(buffers))
        chunk = b"".join(bytes(buffer) for buffer in buffers)[:7]
        written.extend(chunk)
        return len(chunk)

    buffers: list[bytes | bytearray | memoryview] = [
        b"abc",
        bytearray(b"defgh"),
        b"",
        memoryview(b"ijklmnopqrstuv"),
    ]
    file_log._write_all(-1, buffers, stingy_writev)
    assert bytes(written) == b"abcdefghijklmnopqrstuv"
    assert len(calls) == 4


def test_write_all_splits_at_iov_max(tmp_path: Path) -> None:
    path = tmp_path / "many"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        buffers: list[bytes | bytearray | memoryview] = [bytes([i % 256]) for i in range(3 * file_log._IOV_MAX + 5)]
        file_log._write_all(fd, buffers)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(i % 256 for i in range(3 * file_log._IOV_MAX + 5))


def test_write_all_resumes_a_single_buffer_after_a_partial_write() -> None:
    written = bytearray()

    def stingy_writev(_fd: int, buffers: list[Any]) -> int:
        chunk = b"".join(bytes(buffer) for buffer in buffers)[:3]
        written.extend(chunk)
        return len(chunk)

    file_log._write_all(-1, [b"abcdefgh"], stingy_writev)
    assert bytes(written) == b"abcdefgh"
    with pytest.raises(OSError, match="wrote nothing"):
        file_log._write_all(-1, [b"abc"], lambda _fd, _buffers: 0)


# --- The hand-offs between the loop and the writer thread -----------------------------------------


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_close_releases_the_descriptor_the_writer_signals_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        before = open_descriptors()
        log = FileLog(tmp_path)
        await log.initialize()
        assert log._signal_fd >= 0  # this loop watches descriptors: the writer signals through one
        assert [await log.append(bytes([i])) for i in range(3)] == [LogAddress(1), LogAddress(2), LogAddress(3)]
        await log.close()
        assert log._signal_fd == -1
        assert open_descriptors() <= before

    run(scenario())


def test_a_loop_that_cannot_watch_descriptors_gets_the_messages_another_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot(*_args: Any) -> None:
        raise NotImplementedError

    async def scenario() -> None:
        monkeypatch.setattr(asyncio.get_running_loop(), "add_reader", cannot)
        log = FileLog(tmp_path)
        await log.initialize()
        assert log._signal_fd == -1
        futures = [log.append(bytes([i])) for i in range(50)]
        addresses = [await future for future in futures]
        assert [address.sequence for address in addresses] == list(range(1, 51))
        await log.close()

    run(scenario())
    assert asyncio.run(contents(tmp_path)) == [(i + 1, bytes([i])) for i in range(50)]


def test_a_writer_left_stuck_at_close_keeps_its_descriptor_until_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    entered = threading.Event()

    def fdatasync(fd: int) -> None:
        entered.set()
        release.wait(SCENARIO_TIMEOUT_SECONDS)
        os.fdatasync(fd)

    async def scenario() -> None:
        log = FileLog(tmp_path, fdatasync=fdatasync)
        await log.initialize()
        future = log.append(b"stuck")
        await asyncio.to_thread(entered.wait, SCENARIO_TIMEOUT_SECONDS)
        monkeypatch.setattr(limits, "SHUTDOWN_TIMEOUT_SECONDS", 0.2)
        await log.close()
        with pytest.raises(WriteFailedError):
            await future
        # Closed, its number could be reused by a file the writer would then signal into.
        signal_fd = log._signal_fd
        assert signal_fd >= 0
        os.fstat(signal_fd)  # still open
        release.set()
        writer = log._writer_thread
        assert writer is not None
        await asyncio.to_thread(writer.join, SCENARIO_TIMEOUT_SECONDS)
        assert not writer.is_alive()
        assert not future.cancelled() and isinstance(future.exception(), WriteFailedError)  # unchanged
        os.close(signal_fd)  # (the test's own cleanup of what a stuck writer leaves behind)

    run(scenario())
