"""A simulated ChunkStorage: in memory, deterministic, with named faults a test switches on and off.

Theory of operation
-------------------
Chunks are bytearrays in a dict; every call takes effect in one step of the event loop, so a
call is atomic unless a fault says otherwise.  A call goes through the same stages every time, and
each fault names the stage where it strikes:

1. Closed, then arguments (``ObjectClosedError``, ``InvalidArgumentError``) -- the same checks, and the
   same ``check_chunk_name``, as ``FileChunkStorage``.
2. Latency: with ``faults.slowness_seconds`` > 0 the call awaits ``clock.sleep`` that long first.  A
   call slower than ``call_timeout_seconds`` sleeps only that long and then fails with
   ``StorageUnavailableError``, having done nothing (the file storage's timeout, made deterministic).
3. ``faults.unavailable``: the call fails with ``StorageUnavailableError``; nothing changed.
4. The chunk checks: ``ChunkNotFoundError``, ``ChunkExistsError``, ``BadOffsetError``.
5. Room (``create``, ``write``, ``concat``): ``faults.full``, or a write that would take the bytes held
   over ``capacity_bytes``, fails with ``StorageFullError``; nothing written.  A concat needs room for a
   copy of the source, as on a file system, where it is a copy followed by a delete.
6. Write failure (``write``, ``concat``): while ``faults.write_failure`` is set, or for the next
   ``faults.write_failures_left`` writes, the call lands a prefix of its bytes -- its length drawn from
   the seeded ``rng``, anywhere from none to all of them (all: the data landed, the acknowledgement
   was lost) -- and fails with ``StorageUnavailableError`` (a concat keeps its source).  ``length``
   reports what landed, as the contract says.
7. The operation itself, and the counters (``writes``, ``bytes_written``, ``reads``, ``bytes_read``).

The ``rng`` is drawn exactly once per failed write, so a seed replays the torn prefixes exactly.
Tests switch faults through ``storage.faults`` (or ``fail_writes`` and ``heal``) and inspect the
medium with ``chunks()`` (a snapshot), ``used_bytes`` and the counters.
"""

from __future__ import annotations

import builtins
import random

import attrs

from millstream.clock import Clock, SystemClock
from millstream.errors import (
    BadOffsetError,
    ChunkExistsError,
    ChunkNotFoundError,
    InvalidArgumentError,
    ObjectClosedError,
    StorageFullError,
    StorageUnavailableError,
)
from millstream.limits import CHUNK_STORAGE_CALL_TIMEOUT_SECONDS
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.file_chunk_storage import (
    check_chunk_data,
    check_chunk_name,
    check_chunk_prefix,
    check_chunk_range,
)

__all__ = ["SimulatedChunkFaults", "SimulatedChunkStorage"]


@attrs.define
class SimulatedChunkFaults:
    """The faults in force; a test sets and clears the fields at will (see the module docstring)."""

    unavailable: bool = False
    """Every call (but ``close``) fails with ``StorageUnavailableError``; nothing changes."""
    full: bool = False
    """``create``, ``write`` and ``concat`` fail with ``StorageFullError``; nothing is written."""
    write_failure: bool = False
    """Every ``write`` and ``concat`` lands a random prefix and fails with ``StorageUnavailableError``."""
    write_failures_left: int = 0
    """The next this many calls of ``write`` or ``concat`` fail as with ``write_failure``."""
    slowness_seconds: float = 0.0
    """Every call (but ``close``) first sleeps this long on the storage's clock."""


class SimulatedChunkStorage(ChunkStorage):
    """In-memory chunks with scriptable faults.  ``capacity_bytes`` bounds the bytes of all chunks
    together (None: unbounded).  ``rng`` decides torn prefixes; pass ``random.Random(seed)``."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        capacity_bytes: int | None = None,
        call_timeout_seconds: float = CHUNK_STORAGE_CALL_TIMEOUT_SECONDS,
    ) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise InvalidArgumentError(f"capacity_bytes must not be negative: {capacity_bytes}")
        if call_timeout_seconds <= 0:
            raise InvalidArgumentError(f"call_timeout_seconds must be positive: {call_timeout_seconds}")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = rng if rng is not None else random.Random(0)
        self.capacity_bytes = capacity_bytes
        self.call_timeout_seconds = call_timeout_seconds
        self.faults = SimulatedChunkFaults()
        #: Calls of ``write`` that reached the medium (failed ones included), and the bytes they landed.
        self.writes = 0
        self.bytes_written = 0
        #: Calls of ``read`` that returned data, and the bytes they returned.
        self.reads = 0
        self.bytes_read = 0
        self._chunks: dict[str, bytearray] = {}
        self._closed = False

    # --- For tests -----------------------------------------------------------------------------------

    def chunks(self) -> dict[str, bytes]:
        """A snapshot: every chunk's name and bytes."""
        return {name: bytes(data) for name, data in self._chunks.items()}

    @property
    def used_bytes(self) -> int:
        """Bytes held by all chunks together."""
        return sum(len(data) for data in self._chunks.values())

    def fail_writes(self, count: int | None = None) -> None:
        """Make writes fail (torn): the next ``count`` of them, or every one until ``heal`` if None."""
        if count is None:
            self.faults.write_failure = True
        elif count < 0:
            raise InvalidArgumentError(f"cannot fail {count} writes")
        else:
            self.faults.write_failures_left = count

    def heal(self) -> None:
        """Clear every fault (in place: a test holding ``storage.faults`` sees it)."""
        for field in attrs.fields(SimulatedChunkFaults):
            setattr(self.faults, field.name, field.default)

    def check_invariants(self) -> None:
        assert all(name and isinstance(data, bytearray) for name, data in self._chunks.items())
        assert self.faults.write_failures_left >= 0
        assert self.bytes_written >= 0
        assert self.bytes_read >= 0

    # --- The interface -------------------------------------------------------------------------------

    async def create(self, name: str) -> None:
        self._check_open()
        check_chunk_name(name)
        await self._reach_medium(f"create {name!r}")
        if name in self._chunks:
            raise ChunkExistsError(f"chunk {name!r} exists")
        self._check_room(f"create {name!r}", 0)
        self._chunks[name] = bytearray()

    async def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        check_chunk_name(name)
        check_chunk_data(offset, data)
        payload = bytes(data)
        what = f"write {name!r} at {offset}"
        await self._reach_medium(what)
        chunk = self._chunk(name)
        if offset != len(chunk):
            raise BadOffsetError(f"{what}: the chunk's length is {len(chunk)}")
        self._check_room(what, len(payload))
        self.writes += 1
        torn = self._torn_length(len(payload))
        landed = len(payload) if torn is None else torn
        chunk += payload[:landed]
        self.bytes_written += landed
        if torn is not None:
            raise StorageUnavailableError(f"{what}: failed after {torn} of {len(payload)} bytes landed (simulated)")

    async def read(self, name: str, offset: int, length: int) -> bytes:
        self._check_open()
        check_chunk_name(name)
        check_chunk_range(offset, length)
        what = f"read {name!r} [{offset}, +{length})"
        await self._reach_medium(what)
        chunk = self._chunk(name)
        if offset < 0 or length < 0 or offset + length > len(chunk):
            raise BadOffsetError(f"{what}: the chunk's length is {len(chunk)}")
        self.reads += 1
        self.bytes_read += length
        return bytes(chunk[offset : offset + length])

    async def length(self, name: str) -> int:
        self._check_open()
        check_chunk_name(name)
        await self._reach_medium(f"length of {name!r}")
        return len(self._chunk(name))

    async def concat(self, target: str, source: str) -> int:
        self._check_open()
        check_chunk_name(target)
        check_chunk_name(source)
        if target == source:
            raise InvalidArgumentError(f"cannot concat chunk {target!r} onto itself")
        what = f"concat {source!r} onto {target!r}"
        await self._reach_medium(what)
        target_chunk, source_chunk = self._chunk(target), self._chunk(source)
        self._check_room(what, len(source_chunk))
        torn = self._torn_length(len(source_chunk))
        if torn is not None:
            target_chunk += source_chunk[:torn]
            raise StorageUnavailableError(
                f"{what}: failed after {torn} of {len(source_chunk)} bytes landed (simulated)")
        target_chunk += source_chunk
        del self._chunks[source]
        return len(target_chunk)

    async def delete(self, name: str) -> None:
        self._check_open()
        check_chunk_name(name)
        await self._reach_medium(f"delete {name!r}")
        self._chunk(name)
        del self._chunks[name]

    async def list(self, prefix: str = "") -> builtins.list[str]:
        self._check_open()
        check_chunk_prefix(prefix)
        await self._reach_medium(f"list {prefix!r}")
        return sorted(name for name in self._chunks if name.startswith(prefix))

    async def close(self) -> None:
        self._closed = True

    # --- Stages ----------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("the chunk storage is closed")

    async def _reach_medium(self, what: str) -> None:
        """Stages 2 and 3: latency (maybe a timeout), then availability."""
        delay = self.faults.slowness_seconds
        if delay > 0:
            await self.clock.sleep(min(delay, self.call_timeout_seconds))
            if delay >= self.call_timeout_seconds:
                raise StorageUnavailableError(f"{what}: no answer within {self.call_timeout_seconds} s (simulated)")
        if self.faults.unavailable:
            raise StorageUnavailableError(f"{what}: the medium is unavailable (simulated)")

    def _chunk(self, name: str) -> bytearray:
        try:
            return self._chunks[name]
        except KeyError:
            raise ChunkNotFoundError(f"no chunk {name!r}") from None

    def _check_room(self, what: str, needed_bytes: int) -> None:
        if self.faults.full:
            raise StorageFullError(f"{what}: the medium is full (simulated); nothing written")
        if self.capacity_bytes is not None and self.used_bytes + needed_bytes > self.capacity_bytes:
            raise StorageFullError(
                f"{what}: {needed_bytes} more bytes exceed the capacity of {self.capacity_bytes} "
                f"({self.used_bytes} used); nothing written")

    def _torn_length(self, length: int) -> int | None:
        """Stage 6: None if the write of ``length`` bytes succeeds; else how many of them land before it
        fails -- any number from none to all (then only the acknowledgement was lost)."""
        if self.faults.write_failures_left > 0:
            self.faults.write_failures_left -= 1
        elif not self.faults.write_failure:
            return None
        return self.rng.randint(0, length)
