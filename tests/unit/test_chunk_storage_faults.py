"""The chunk storages beyond the conformance suite: the faults each one can inject and what they leave.

``FileChunkStorage``: its fault hooks turn into the contract's typed errors (``EIO``:
``StorageUnavailableError`` with the prefix that landed; ``ENOSPC``: ``StorageFullError``, likewise --
a chunk never shrinks), a blocked system call times out, and the name escaping round-trips on disk.
``SimulatedChunkStorage``: each named fault produces its typed error, torn writes are replayed by a
seed, capacity is enforced, and slowness waits on the injected clock.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream import limits
from millstream.errors import (
    ChunkNotFoundError,
    InvalidArgumentError,
    StorageFullError,
    StorageUnavailableError,
)
from millstream.segmentstore.file_chunk_storage import (
    DIRECTORY_SUFFIX,
    PATH_COMPONENT_LENGTH_MAX,
    WRITE_PIECE_LENGTH_BYTES,
    FileChunkFaults,
    FileChunkStorage,
    check_chunk_name,
    chunk_name,
    chunk_path,
)
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage

_T = TypeVar("_T")

SCENARIO_TIMEOUT_SECONDS = 30.0

#: How long a blocking hook holds its I/O thread at most, should the test fail to release it.
HOOK_BLOCK_SECONDS_MAX = 10.0


def run(scenario: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_SECONDS))


def fail_on_call(number: int, code: int) -> Callable[[str], None]:
    """A hook that raises ``OSError(code)`` on its ``number``-th call (1-based), and only then."""
    calls = 0

    def hook(name: str) -> None:
        nonlocal calls
        calls += 1
        if calls == number:
            raise OSError(code, os.strerror(code), name)

    return hook


async def contents(storage: FileChunkStorage | SimulatedChunkStorage, name: str) -> bytes:
    return await storage.read(name, 0, await storage.length(name))


# --- FileChunkStorage: injected I/O errors ---------------------------------------------------------


def test_file_fdatasync_eio_is_unavailable_and_the_bytes_stay(tmp_path: Path) -> None:
    faults = FileChunkFaults()
    storage = FileChunkStorage(tmp_path, faults=faults)

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"old")
        faults.before_sync = fail_on_call(1, errno.EIO)
        with pytest.raises(StorageUnavailableError, match="Input/output error"):
            await storage.write("c", 3, b"new")
        # The bytes reached the file before the sync failed; length says so (durability unknown).
        assert await contents(storage, "c") == b"oldnew"
        await storage.write("c", 6, b"!")
        assert await contents(storage, "c") == b"oldnew!"
        await storage.close()

    run(scenario())


def test_file_eio_in_the_middle_of_a_write_leaves_a_prefix(tmp_path: Path) -> None:
    data = os.urandom(3 * WRITE_PIECE_LENGTH_BYTES)
    storage = FileChunkStorage(tmp_path, faults=FileChunkFaults(before_write=fail_on_call(2, errno.EIO)))

    async def scenario() -> None:
        await storage.create("c")
        with pytest.raises(StorageUnavailableError):
            await storage.write("c", 0, data)
        assert await contents(storage, "c") == data[:WRITE_PIECE_LENGTH_BYTES]
        await storage.close()

    run(scenario())


@pytest.mark.parametrize("hook", ["before_write", "before_sync"])
def test_file_enospc_is_full_and_the_chunk_never_shrinks(tmp_path: Path, hook: str) -> None:
    """Out of space: ``StorageFullError``; what landed stays (a chunk's bytes never change, so a new
    owner may adopt them), and ``length`` says how much."""
    data = os.urandom(3 * WRITE_PIECE_LENGTH_BYTES)
    faults = FileChunkFaults()
    storage = FileChunkStorage(tmp_path, faults=faults)

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"kept")
        # The second pwrite (after a MiB landed), or the sync after all of it landed.
        setattr(faults, hook, fail_on_call(2 if hook == "before_write" else 1, errno.ENOSPC))
        with pytest.raises(StorageFullError):
            await storage.write("c", 4, data)
        landed = await storage.length("c") - 4
        assert landed == (WRITE_PIECE_LENGTH_BYTES if hook == "before_write" else len(data))
        assert await contents(storage, "c") == b"kept" + data[:landed]
        await storage.write("c", 4 + landed, b"!")  # the space came back
        await storage.close()
        return landed

    landed = run(scenario())
    assert (tmp_path / "c").read_bytes() == b"kept" + data[:landed] + b"!"


def test_file_concat_failures_keep_the_source(tmp_path: Path) -> None:
    source = os.urandom(2 * WRITE_PIECE_LENGTH_BYTES + 1)
    faults = FileChunkFaults()
    storage = FileChunkStorage(tmp_path, faults=faults)

    async def scenario() -> None:
        for name, data in [("t", b"target"), ("s", source)]:
            await storage.create(name)
            await storage.write(name, 0, data)
        for errno_code, error in ((errno.ENOSPC, StorageFullError), (errno.EIO, StorageUnavailableError)):
            faults.before_write = fail_on_call(2, errno_code)
            with pytest.raises(error):
                await storage.concat("t", "s")
            # The target grew by a prefix of the source (chunks never shrink); the source is still there.
            assert await contents(storage, "t") == b"target" + source[:WRITE_PIECE_LENGTH_BYTES]
            assert await contents(storage, "s") == source
            await storage.delete("t")
            await storage.create("t")
            await storage.write("t", 0, b"target")
        faults.before_write = None
        await storage.delete("t")
        await storage.create("t")
        assert await storage.concat("t", "s") == len(source)
        assert await storage.list() == ["t"]
        await storage.close()

    run(scenario())


def test_file_create_sync_eio_is_unavailable(tmp_path: Path) -> None:
    storage = FileChunkStorage(tmp_path, faults=FileChunkFaults(before_sync=fail_on_call(1, errno.EIO)))

    async def scenario() -> None:
        with pytest.raises(StorageUnavailableError):
            await storage.create("c")
        await storage.close()

    run(scenario())


def test_file_medium_gone_is_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = FileChunkStorage(root)
    root.rmdir()

    async def scenario() -> None:
        with pytest.raises(StorageUnavailableError):
            await storage.create("c")
        with pytest.raises(StorageUnavailableError):
            await storage.list()
        await storage.close()

    run(scenario())


# --- FileChunkStorage: timeouts --------------------------------------------------------------------


def test_file_blocked_call_times_out_and_a_queued_one_never_runs(tmp_path: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def block(name: str) -> None:
        entered.set()
        release.wait(HOOK_BLOCK_SECONDS_MAX)

    faults = FileChunkFaults()
    # One thread: calls run one after another, so the order below is deterministic.
    storage = FileChunkStorage(tmp_path, threads=1, call_timeout_seconds=0.2, faults=faults)

    async def scenario() -> None:
        await storage.create("c")
        faults.before_write = block
        started = time.monotonic()
        try:
            with pytest.raises(StorageUnavailableError, match=r"no answer within 0\.2 s"):
                await storage.write("c", 0, b"late")
            assert entered.is_set()
            with pytest.raises(StorageUnavailableError, match="no answer"):
                await storage.create("queued")  # waits behind the blocked write, times out, is cancelled
            assert time.monotonic() - started < HOOK_BLOCK_SECONDS_MAX / 2
        finally:
            release.set()
        faults.before_write = None
        # The timed-out write completes in its thread after all (the wart the module admits); the
        # queued create was cancelled before it ran.
        assert await contents(storage, "c") == b"late"
        assert await storage.list() == ["c"]
        await storage.close()

    run(scenario())


def test_file_constructor_validates_its_options(tmp_path: Path) -> None:
    for options in [
        {"threads": 0},
        {"threads": limits.CHUNK_STORAGE_THREADS_MAX + 1},
        {"call_timeout_seconds": 0.0},
        {"call_timeout_seconds": limits.CHUNK_STORAGE_CALL_TIMEOUT_SECONDS + 1},
    ]:
        with pytest.raises(InvalidArgumentError):
            FileChunkStorage(tmp_path, **options)  # type: ignore[arg-type]


# --- FileChunkStorage: names on disk ---------------------------------------------------------------

WEIRD_NAMES = [
    "seg/a b",
    "100%",
    ".",
    "..",
    ".hidden",
    "plus+",
    "日本/語",
    "x" * 2000,
    "x" * 2000 + "/2",  # shares its first directories with the name above
    "/" * limits.CHUNK_NAME_LENGTH_BYTES_MAX,  # 6144 escaped characters: longer than PATH_MAX
    "é" * (limits.CHUNK_NAME_LENGTH_BYTES_MAX // 2),
]


def test_file_names_round_trip_on_disk_and_leave_no_directories(tmp_path: Path) -> None:
    storage = FileChunkStorage(tmp_path)

    async def scenario() -> None:
        for name in WEIRD_NAMES:
            await storage.create(name)
            await storage.write(name, 0, name.encode()[:100])
        assert await storage.list() == sorted(WEIRD_NAMES)
        for name in WEIRD_NAMES:
            assert await contents(storage, name) == name.encode()[:100]
        assert (tmp_path / "seg%2Fa%20b").is_file()
        assert (tmp_path / "%2E").is_file()
        assert (tmp_path / "%2E.").is_file()
        assert all(not entry.startswith(".") for entry in os.listdir(tmp_path))
        await storage.delete("x" * 2000)
        assert await contents(storage, "x" * 2000 + "/2") == b"x" * 100
        for name in WEIRD_NAMES:
            if name != "x" * 2000:
                await storage.delete(name)
        assert await storage.list() == []
        assert os.listdir(tmp_path) == []  # directories of long names are removed once empty
        await storage.close()

    run(scenario())


def test_file_chunks_survive_a_new_instance(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = FileChunkStorage(tmp_path)
        for name in WEIRD_NAMES:
            await first.create(name)
        await first.write("seg/a b", 0, b"durable")
        await first.close()
        second = FileChunkStorage(tmp_path)
        assert await second.list() == sorted(WEIRD_NAMES)
        assert await contents(second, "seg/a b") == b"durable"
        await second.close()

    run(scenario())


def test_file_list_ignores_what_is_no_chunk(tmp_path: Path) -> None:
    storage = FileChunkStorage(tmp_path)

    async def scenario() -> None:
        await storage.create("A")
        # Non-canonical escapings, a hidden temp file, invalid UTF-8, an empty directory.
        for stray in ["%41", "%2e", ".tmp", "%FF", "trailing%2", "a%00b"]:
            (tmp_path / stray).write_bytes(b"")
        (tmp_path / ("y" * 10 + DIRECTORY_SUFFIX)).mkdir()
        assert await storage.list() == ["A"]
        with pytest.raises(ChunkNotFoundError):
            await storage.length("y" * 10)
        await storage.close()

    run(scenario())


def is_valid(name: str) -> bool:
    try:
        check_chunk_name(name)
    except InvalidArgumentError:
        return False
    return True


#: Names from an alphabet of the characters escaping treats specially (long enough to need
#: directories, with dots and escapes landing on piece boundaries), and arbitrary short text.
valid_names = (st.text(alphabet="ab.%+/ é€\U0001f600", min_size=1, max_size=500) | st.text(min_size=1)).filter(
    is_valid)


@given(valid_names)
def test_chunk_path_is_reversible_and_safe(name: str) -> None:
    path = chunk_path(name)
    assert chunk_name(path) == name
    assert all(component.isascii() and "/" not in component for component in path)
    assert all(len(component) <= PATH_COMPONENT_LENGTH_MAX + len(DIRECTORY_SUFFIX) for component in path)
    assert all(component.endswith(DIRECTORY_SUFFIX) for component in path[:-1])
    assert not path[-1].endswith(DIRECTORY_SUFFIX)
    assert not any(component.startswith(".") for component in path)


# --- SimulatedChunkStorage -------------------------------------------------------------------------


def test_simulated_unavailable_fails_every_call_and_changes_nothing() -> None:
    storage = SimulatedChunkStorage()

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"data")
        await storage.create("d")
        storage.faults.unavailable = True
        calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
            lambda: storage.create("e"),
            lambda: storage.write("c", 4, b"more"),
            lambda: storage.read("c", 0, 4),
            lambda: storage.length("c"),
            lambda: storage.concat("c", "d"),
            lambda: storage.delete("c"),
            storage.list,
        ]
        for call in calls:
            with pytest.raises(StorageUnavailableError):
                await call()
        assert storage.chunks() == {"c": b"data", "d": b""}
        storage.heal()
        assert await storage.list() == ["c", "d"]

    run(scenario())


def test_simulated_full_writes_nothing_but_reads_work() -> None:
    storage = SimulatedChunkStorage()

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"data")
        await storage.create("d")
        storage.faults.full = True
        calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
            lambda: storage.create("e"),
            lambda: storage.write("c", 4, b"more"),
            lambda: storage.concat("c", "d"),
        ]
        for call in calls:
            with pytest.raises(StorageFullError):
                await call()
        assert storage.chunks() == {"c": b"data", "d": b""}
        assert await storage.read("c", 0, 4) == b"data"
        await storage.delete("d")
        assert await storage.list() == ["c"]

    run(scenario())


def test_simulated_capacity_is_enforced_with_nothing_written() -> None:
    storage = SimulatedChunkStorage(capacity_bytes=10)

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"12345678")
        with pytest.raises(StorageFullError):
            await storage.write("c", 8, b"abc")
        assert storage.chunks() == {"c": b"12345678"}
        await storage.write("c", 8, b"ab")
        assert storage.used_bytes == 10
        await storage.create("empty")  # an empty chunk takes no room
        await storage.create("s")
        with pytest.raises(StorageFullError):
            await storage.write("s", 0, b"x")
        await storage.delete("c")
        await storage.write("s", 0, b"xyz")
        await storage.write("empty", 0, b"1234567")
        # A concat copies first: it needs room for the source even though it frees as much after.
        with pytest.raises(StorageFullError):
            await storage.concat("empty", "s")
        assert storage.chunks() == {"empty": b"1234567", "s": b"xyz"}

    run(scenario())


def test_simulated_torn_write_lands_a_prefix_that_length_reports() -> None:
    storage = SimulatedChunkStorage(rng=random.Random(7))
    data = bytes(range(200))

    async def scenario() -> None:
        await storage.create("c")
        storage.fail_writes(3)
        landed = 0
        for _ in range(3):
            before = storage.bytes_written
            with pytest.raises(StorageUnavailableError):
                await storage.write("c", landed, data)
            torn = storage.bytes_written - before
            assert await storage.length("c") == landed + torn
            assert await storage.read("c", landed, torn) == data[:torn]
            landed += torn
        await storage.write("c", landed, b"ok")  # the faults are used up
        assert storage.writes == 4
        assert storage.faults.write_failures_left == 0

    run(scenario())


def test_simulated_write_failure_tears_until_healed_and_concat_keeps_its_source() -> None:
    storage = SimulatedChunkStorage(rng=random.Random(3))
    source = bytes(range(50))

    async def scenario() -> None:
        await storage.create("t")
        await storage.create("s")
        await storage.write("s", 0, source)
        storage.fail_writes()
        for _ in range(5):
            with pytest.raises(StorageUnavailableError):
                await storage.write("t", await storage.length("t"), b"abc")
        grown = await storage.length("t")
        with pytest.raises(StorageUnavailableError):
            await storage.concat("t", "s")
        target = storage.chunks()["t"]
        assert target[grown:] == source[: len(target) - grown]
        assert storage.chunks()["s"] == source
        storage.heal()
        assert await storage.concat("t", "s") == len(target) + len(source)
        assert await storage.list() == ["t"]

    run(scenario())


def torn_prefixes(seed: int) -> list[int]:
    """The bytes landed by 20 failing 100-byte writes with ``seed``."""
    storage = SimulatedChunkStorage(rng=random.Random(seed))

    async def scenario() -> list[int]:
        await storage.create("c")
        storage.fail_writes()
        landed = []
        for _ in range(20):
            before = await storage.length("c")
            with pytest.raises(StorageUnavailableError):
                await storage.write("c", before, b"x" * 100)
            landed.append(await storage.length("c") - before)
        return landed

    return run(scenario())


def test_simulated_torn_writes_replay_from_a_seed() -> None:
    assert torn_prefixes(11) == torn_prefixes(11)
    assert torn_prefixes(11) != torn_prefixes(12)
    assert len(set(torn_prefixes(11))) > 1


def test_simulated_slowness_waits_on_the_clock() -> None:
    clock = ManualClock()
    storage = SimulatedChunkStorage(clock=clock)

    async def scenario() -> None:
        await storage.create("c")
        storage.faults.slowness_seconds = 5.0
        write = asyncio.get_running_loop().create_task(storage.write("c", 0, b"slow"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert clock.sleeping == 1
        assert storage.chunks() == {"c": b""}
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not write.done()
        clock.advance(0.1)
        await write
        assert storage.chunks() == {"c": b"slow"}

    run(scenario())


def test_simulated_call_slower_than_the_timeout_fails_having_done_nothing() -> None:
    clock = ManualClock()
    storage = SimulatedChunkStorage(clock=clock, call_timeout_seconds=2.0)

    async def scenario() -> None:
        await storage.create("c")
        storage.faults.slowness_seconds = 60.0
        write = asyncio.get_running_loop().create_task(storage.write("c", 0, b"never"))
        for _ in range(3):
            await asyncio.sleep(0)
        clock.advance(2.0)
        with pytest.raises(StorageUnavailableError, match=r"no answer within 2\.0 s"):
            await write
        assert storage.chunks() == {"c": b""}
        assert storage.writes == 0

    run(scenario())


def test_simulated_counters() -> None:
    storage = SimulatedChunkStorage()

    async def scenario() -> None:
        await storage.create("c")
        await storage.write("c", 0, b"abc")
        await storage.write("c", 3, b"de")
        storage.faults.full = True
        with pytest.raises(StorageFullError):
            await storage.write("c", 5, b"f")
        storage.heal()
        assert await storage.read("c", 1, 3) == b"bcd"
        assert (storage.writes, storage.bytes_written, storage.reads, storage.bytes_read) == (2, 5, 1, 3)

    run(scenario())


def test_simulated_constructor_validates_its_options() -> None:
    with pytest.raises(InvalidArgumentError):
        SimulatedChunkStorage(capacity_bytes=-1)
    with pytest.raises(InvalidArgumentError):
        SimulatedChunkStorage(call_timeout_seconds=0.0)
