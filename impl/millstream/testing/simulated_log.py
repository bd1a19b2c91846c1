"""A simulated DurableDataLog: every completion, failure, crash and fencing scriptable and deterministic.

Theory of operation
-------------------
``SimulatedLogStorage`` is the "disk": it outlives log instances and holds the durable records, the
epoch, the truncation point and possibly a torn record at the tail.  ``SimulatedDurableDataLog`` is
one owner's view of it.  A record moves through three stages::

    appended (pending) --persist--> durable (in storage, still pending) --notify--> completed

``persist`` makes the *oldest* non-durable writes durable, so durable records always form a prefix
(the durability-in-order half of the contract).  ``notify`` delivers the completion of one durable
write, in any order (the "a notice may arrive late" half).  A write failure is final: the failing
write and every later pending one fail, and the log closes.  A crash loses what is not durable.

Two ways to drive it:

* ``auto_complete=True`` (the default): each loop iteration (``loop.call_soon``) persists and
  notifies everything pending, in order -- unless ``SimulatedFaults`` says otherwise: a write may be
  delayed by one iteration, the notices of one iteration may be shuffled, a write may fail before or
  after it became durable.  Faults come from a per-sequence script or from a seeded
  ``random.Random`` drawn once per write (and once per iteration for shuffling), so a seed replays a
  run exactly as long as the code under test is itself deterministic.
* ``auto_complete=False``: nothing happens until the test calls ``persist``, ``notify``,
  ``complete``, ``fail_write`` or ``crash``.

Fencing: ``initialize()`` bumps ``storage.epoch``.  An instance whose epoch is older learns it at its
next ``append``, ``persist`` or ``notify`` (or auto-complete iteration): every pending write fails
with ``DataLogFencedError`` (nothing of it becomes durable any more) and the instance closes.  Its
``truncate`` raises ``DataLogFencedError``.

Damage: each stored record keeps the CRC of its data, ``storage.corrupt(sequence)`` flips a byte in
place, and ``read()`` raises ``DataCorruptionError`` naming the sequence.  A torn record (left by
``crash(torn=True)`` or ``storage.tear_tail``) sits after the last durable record; ``read()`` drops it
silently and the next persisted record replaces it.
"""

from __future__ import annotations

import asyncio
import enum
import random
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import attrs

from millstream.errors import (
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
from millstream.segmentstore.file_log import DEFAULT_MAX_WRITE_LENGTH_BYTES

__all__ = [
    "SimulatedDurableDataLog",
    "SimulatedFaults",
    "SimulatedLogStorage",
    "StoredRecord",
    "WriteFault",
]


_T = TypeVar("_T")

# --- The disk --------------------------------------------------------------------------------------


@attrs.define
class StoredRecord:
    """One durable record: its data and the CRC it had when written (``corrupt`` breaks the match)."""

    sequence: int
    data: bytes
    crc32: int


class SimulatedLogStorage:
    """What survives a simulated log instance: durable records, epoch, truncation point, torn tail.

    ``on_persisted`` (optional) is called with each sequence as it becomes durable -- trace recording
    hooks in here.  Plain attributes are for tests to inspect; the log changes them only through the
    underscore methods.
    """

    def __init__(self, *, on_persisted: Callable[[int], None] | None = None) -> None:
        self.on_persisted = on_persisted
        self.epoch = 0
        self._records: list[StoredRecord] = []  # sequences truncated_through + 1, ..., last_sequence
        self._last_sequence = 0  # highest durable sequence ever, truncated or not
        self._truncated_through = 0
        self._torn_tail: tuple[int, bytes] | None = None  # (sequence, the prefix that landed)

    # --- For tests -----------------------------------------------------------------------------------

    @property
    def records(self) -> list[tuple[int, bytes]]:
        """The durable, untruncated records as ``(sequence, data)``."""
        return [(record.sequence, record.data) for record in self._records]

    @property
    def last_sequence(self) -> int:
        """The highest sequence that ever became durable (0 if none)."""
        return self._last_sequence

    @property
    def truncated_through(self) -> int:
        """Every record up to and including this sequence is discarded (0 if none)."""
        return self._truncated_through

    @property
    def torn_tail(self) -> tuple[int, bytes] | None:
        """The torn record after the last durable one, as ``(sequence, bytes that landed)``."""
        return self._torn_tail

    def corrupt(self, sequence: int) -> None:
        """Damage durable record ``sequence`` in place (its CRC no longer matches).  Raises
        ``InvalidArgumentError`` if there is no such record."""
        record = self._record(sequence)
        if record is None:
            raise InvalidArgumentError(f"no durable record {sequence} to corrupt")
        record.data = bytes([record.data[0] ^ 0xFF]) + record.data[1:] if record.data else record.data
        if not record.data:
            record.crc32 ^= 0xFFFFFFFF  # nothing to flip in an empty record: damage its checksum
        assert zlib.crc32(record.data) != record.crc32

    def tear_tail(self, partial: bytes = b"\x00torn") -> None:
        """Leave a torn record after the last durable one, as a crash in the middle of writing the
        next record would.  It replaces a torn record already there: an owner that recovered in
        between sealed that one away, and its own next record (the one now torn) came after."""
        self._torn_tail = (self._last_sequence + 1, bytes(partial))

    def check_invariants(self) -> None:
        """Assert the storage's shape: contiguous sequences above the truncation point."""
        expected = list(range(self._truncated_through + 1, self._last_sequence + 1))
        assert [record.sequence for record in self._records] == expected
        assert self._torn_tail is None or self._torn_tail[0] == self._last_sequence + 1
        assert self.epoch >= 0

    # --- For the log ---------------------------------------------------------------------------------

    def _record(self, sequence: int) -> StoredRecord | None:
        index = sequence - self._truncated_through - 1
        return self._records[index] if 0 <= index < len(self._records) else None

    def _persist(self, sequence: int, data: bytes) -> None:
        if sequence != self._last_sequence + 1:
            raise InternalError(f"persisting {sequence} after {self._last_sequence}: out of order")
        # The new record is written where a torn one may lie; the torn bytes are gone.
        self._torn_tail = None
        self._records.append(StoredRecord(sequence, data, zlib.crc32(data)))
        self._last_sequence = sequence
        if self.on_persisted is not None:
            self.on_persisted(sequence)

    def _truncate(self, sequence: int) -> None:
        if sequence <= self._truncated_through:
            return
        del self._records[: sequence - self._truncated_through]
        self._truncated_through = sequence


# --- Faults ----------------------------------------------------------------------------------------


class WriteFault(enum.StrEnum):
    """What can go wrong with one write in auto-complete mode."""

    DELAY = "delay"
    """The write (and, to keep durability in order, every later one) waits one more loop iteration."""
    FAIL = "fail"
    """The write fails before it becomes durable: ``WriteFailedError``; the log closes."""
    UNKNOWN_OUTCOME = "unknown_outcome"
    """The write becomes durable, but its writer is told it failed: ``WriteFailedError``; the log
    closes.  The next owner reads it back."""


@attrs.frozen
class SimulatedFaults:
    """The faults an auto-completing log injects.

    ``script`` names faults by sequence (``{3: WriteFault.FAIL, 5: WriteFault.DELAY}``; plain
    strings work too) and wins over the probabilities.  Otherwise each write draws once from ``rng``
    and meets ``FAIL``, ``UNKNOWN_OUTCOME`` or ``DELAY`` with the given probabilities; and each loop
    iteration that delivers two or more notices draws once more and shuffles them with
    ``reorder_probability``.  Pass a ``random.Random(seed)``: the seed replays the faults.
    """

    rng: random.Random = attrs.field(factory=lambda: random.Random(0), eq=False)
    failure_probability: float = 0.0
    unknown_outcome_probability: float = 0.0
    delay_probability: float = 0.0
    reorder_probability: float = 0.0
    script: Mapping[int, WriteFault | str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        probabilities = (
            self.failure_probability,
            self.unknown_outcome_probability,
            self.delay_probability,
            self.reorder_probability,
        )
        if any(not 0.0 <= p <= 1.0 for p in probabilities):
            raise InvalidArgumentError(f"probabilities must lie in [0, 1]: {probabilities}")
        if self.failure_probability + self.unknown_outcome_probability + self.delay_probability > 1.0:
            raise InvalidArgumentError("failure, unknown-outcome and delay probabilities add up to over 1")
        for sequence, fault in self.script.items():
            WriteFault(fault)  # raises ValueError for an unknown name
            if sequence < 1:
                raise InvalidArgumentError(f"script names sequence {sequence}; sequences start at 1")

    def fault_for(self, sequence: int) -> WriteFault | None:
        """The fault for write ``sequence``; draws from ``rng`` exactly once unless scripted."""
        if sequence in self.script:
            return WriteFault(self.script[sequence])
        draw = self.rng.random()
        if draw < self.failure_probability:
            return WriteFault.FAIL
        draw -= self.failure_probability
        if draw < self.unknown_outcome_probability:
            return WriteFault.UNKNOWN_OUTCOME
        draw -= self.unknown_outcome_probability
        if draw < self.delay_probability:
            return WriteFault.DELAY
        return None

    def shuffle(self, notices: list[_T]) -> None:
        """Maybe shuffle one iteration's notices in place (draws only when there are two or more)."""
        if len(notices) >= 2 and self.rng.random() < self.reorder_probability:
            self.rng.shuffle(notices)


# --- The log ---------------------------------------------------------------------------------------


@attrs.define
class _PendingWrite:
    sequence: int
    data: bytes
    future: asyncio.Future[LogAddress]
    durable: bool = False
    fault: WriteFault | None = None
    on_done: OnDone | None = None


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    FAILED = "failed"  # a write failed or the log was fenced: it closed itself
    CLOSED = "closed"  # close() or crash()


_TRANSITIONS: dict[_State, frozenset[_State]] = {
    _State.NEW: frozenset({_State.OPEN, _State.CLOSED}),
    _State.OPEN: frozenset({_State.FAILED, _State.CLOSED}),
    _State.FAILED: frozenset({_State.CLOSED}),
    _State.CLOSED: frozenset(),
}


class SimulatedDurableDataLog(DurableDataLog):
    """One owner of a ``SimulatedLogStorage``.  See the module docstring.

    Test-driving methods (``persist``, ``notify``, ``complete``, ``fail_write``, ``crash``) raise
    ``InvalidArgumentError`` when asked for something impossible (notify a write that is not
    durable), ``ObjectClosedError`` once the log is closed, and ``InternalError`` before
    ``initialize()``.  When they find the log fenced they fail its pending writes with
    ``DataLogFencedError``, close it and return normally: the log's user sees the failure.
    """

    def __init__(
        self,
        storage: SimulatedLogStorage,
        *,
        max_write_length_bytes: int = DEFAULT_MAX_WRITE_LENGTH_BYTES,
        auto_complete: bool = True,
        faults: SimulatedFaults | None = None,
    ) -> None:
        if max_write_length_bytes < 0:
            raise InvalidArgumentError(f"max_write_length_bytes must be >= 0, not {max_write_length_bytes}")
        if faults is not None and not auto_complete:
            raise InvalidArgumentError("faults apply to auto_complete mode; in manual mode, script them")
        self._storage = storage
        self._max_write_length_bytes = max_write_length_bytes
        self._auto_complete = auto_complete
        self._faults = faults
        self._state = _State.NEW
        self._failure: DurableDataLogError | None = None
        self._epoch = 0
        self._next_sequence = 1
        self._recovered_next_sequence = 1
        self._pending: dict[int, _PendingWrite] = {}  # not yet notified, by sequence (ascending)
        self._persisted_through = 0  # highest sequence this instance made durable
        self._delivered_through = 0  # highest sequence whose success notice was delivered
        self._step: asyncio.Handle | None = None  # the scheduled auto-complete iteration

    # --- DurableDataLog ------------------------------------------------------------------------------

    @property
    def write_settings(self) -> WriteSettings:
        return WriteSettings(max_write_length_bytes=self._max_write_length_bytes)

    @property
    def epoch(self) -> int:
        return self._epoch

    async def initialize(self) -> int:
        """Take ownership: bump the storage's epoch (fencing older instances).  Returns the epoch.
        Raises ``ObjectClosedError`` if closed, ``InternalError`` if called twice."""
        self._require(_State.NEW)
        self._storage.epoch += 1
        self._epoch = self._storage.epoch
        self._next_sequence = self._recovered_next_sequence = self._storage.last_sequence + 1
        self._persisted_through = self._storage.last_sequence
        self._set_state(_State.OPEN)
        return self._epoch

    def read(self) -> Iterator[LogRecord]:
        """Yield the durable records above the truncation point; drop a torn tail silently.  Raises
        ``DataCorruptionError`` naming the sequence of a damaged record (after yielding those before
        it); ``InternalError`` unless called after ``initialize()`` and before the first append."""
        self._require(_State.OPEN)
        if self._next_sequence != self._recovered_next_sequence:
            raise InternalError("read() after the first append()")
        return self._read(list(self._storage._records))

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        """Queue one record (see ``DurableDataLog.append``).  A fenced instance returns a future that
        has already failed with ``DataLogFencedError``, and closes."""
        payload = bytes(data)  # a copy: the simulated disk must not change under the caller
        if len(payload) > self._max_write_length_bytes:
            raise PayloadTooLargeError(
                f"record of {len(payload)} bytes exceeds the log's limit of {self._max_write_length_bytes}"
            )
        self._require(_State.OPEN)
        future: asyncio.Future[LogAddress] = asyncio.get_running_loop().create_future()
        sequence = self._next_sequence
        self._next_sequence += 1
        fault = None if self._faults is None else self._faults.fault_for(sequence)
        self._pending[sequence] = _PendingWrite(sequence, payload, future, fault=fault, on_done=on_done)
        if self._fenced():
            self._fence()
        elif self._auto_complete and self._step is None:
            self._step = asyncio.get_running_loop().call_soon(self._auto_step)
        return future

    async def truncate(self, upto: LogAddress) -> None:
        """Discard records up to and including ``upto``.  Idempotent.  Raises
        ``InvalidArgumentError`` if ``upto`` is not durable, ``DataLogFencedError`` if a newer owner
        took over (as FileLog, the instance stays as it is: its next write fails),
        ``ObjectClosedError`` if closed."""
        self._require(_State.OPEN)
        if self._fenced():
            raise DataLogFencedError(f"simulated log: epoch {self._epoch} was fenced by a newer owner")
        if not 1 <= upto.sequence <= self._storage.last_sequence:
            raise InvalidArgumentError(f"{upto} is not a durable record of this log")
        self._storage._truncate(upto.sequence)

    async def close(self) -> None:
        """Deliver the notices of writes that are already durable, fail the rest with
        ``ObjectClosedError`` (they never become durable).  Idempotent."""
        if self._state is _State.CLOSED:
            return
        if self._state is _State.OPEN and self._fenced():
            self._fence()
        elif self._state is _State.OPEN:
            for write in list(self._pending.values()):
                if write.durable:
                    self._deliver(write)
        self._fail_pending(ObjectClosedError("simulated log: closed"))
        self._set_state(_State.CLOSED)

    # --- Driving it (auto_complete=False) ------------------------------------------------------------

    @property
    def pending_sequences(self) -> list[int]:
        """Sequences appended and not yet notified (durable or not), ascending."""
        return list(self._pending)

    @property
    def durable_pending_sequences(self) -> list[int]:
        """The pending sequences that are already durable (their notice is still due)."""
        return [sequence for sequence, write in self._pending.items() if write.durable]

    def persist(self, count: int = 1) -> list[int]:
        """Make the ``count`` oldest non-durable pending writes durable, in order; return their
        sequences.  Raises ``InvalidArgumentError`` if fewer are waiting."""
        self._require(_State.OPEN)
        waiting = [write for write in self._pending.values() if not write.durable]
        if count > len(waiting):
            raise InvalidArgumentError(f"persist({count}), but only {len(waiting)} writes wait")
        if self._fenced():
            self._fence()
            return []
        for write in waiting[:count]:
            self._make_durable(write)
        return [write.sequence for write in waiting[:count]]

    def notify(self, sequence: int) -> None:
        """Deliver the completion of durable write ``sequence`` (in any order).  Raises
        ``InvalidArgumentError`` if it is not a durable pending write."""
        self._require(_State.OPEN)
        write = self._pending.get(sequence)
        if write is None or not write.durable:
            raise InvalidArgumentError(f"write {sequence} is not durable and pending")
        if self._fenced():
            self._fence()
            return
        self._deliver(write)

    def complete(self, sequence: int) -> None:
        """Persist every write through ``sequence``, then notify ``sequence``."""
        self._require(_State.OPEN)
        waiting = [write for write in self._pending.values() if not write.durable]
        self.persist(sum(1 for write in waiting if write.sequence <= sequence))
        if self._state is _State.OPEN:
            self.notify(sequence)

    def fail_write(self, *, unknown_outcome: bool = False) -> None:
        """The oldest pending write fails, and with it every later pending write: their futures fail
        with ``WriteFailedError`` and the log closes.  With ``unknown_outcome`` the failing write is
        first made durable (it is on the disk; its writer was told it failed).

        A log never reports a failure for a write after confirming a later one (that confirmation
        says the earlier write is durable), so notices still due for writes older than the newest
        delivered one are delivered first, successfully.  Raises ``InvalidArgumentError`` if nothing
        else is pending."""
        self._require(_State.OPEN)
        for write in list(self._pending.values()):
            if write.durable and write.sequence < self._delivered_through:
                self._deliver(write)
        if not self._pending:
            raise InvalidArgumentError("fail_write(), but no write is pending")
        if self._fenced():
            self._fence()
            return
        oldest = next(iter(self._pending.values()))
        if unknown_outcome and not oldest.durable:
            self._make_durable(oldest)  # every earlier write was notified, so it is the next one
        self._fail(WriteFailedError(f"simulated log: write {oldest.sequence} failed (outcome unknown)"))

    def crash(self, *, torn: bool = False) -> None:
        """The process dies.  Writes that are not durable vanish -- with ``torn``, the oldest of them
        leaves a torn partial record at the storage's tail (if none is waiting, nothing was being
        written and nothing is torn) -- and every pending future fails with ``ObjectClosedError``, as
        nobody is left to hear of them.  Also allowed after a write failure."""
        self._require(_State.OPEN, _State.FAILED)
        waiting = [write for write in self._pending.values() if not write.durable]
        if torn and waiting and not self._fenced():  # a fenced writer's bytes never land
            self._storage.tear_tail(waiting[0].data[: len(waiting[0].data) // 2])
        self._fail_pending(ObjectClosedError("simulated log: the process crashed"))
        self._set_state(_State.CLOSED)

    # --- Introspection -------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert what must hold between steps: pending writes ascending, durable ones a prefix of
        them, nothing durable beyond what storage holds."""
        sequences = list(self._pending)
        assert sequences == sorted(sequences)
        assert all(sequence < self._next_sequence for sequence in sequences)
        flags = [write.durable for write in self._pending.values()]
        assert flags == sorted(flags, reverse=True), "durable pending writes must precede the others"
        assert self._persisted_through <= self._storage.last_sequence or self._fenced()
        assert self._state in _TRANSITIONS
        if self._state is not _State.OPEN:
            assert not self._pending
        self._storage.check_invariants()

    # --- Internals -----------------------------------------------------------------------------------

    def _require(self, *states: _State) -> None:
        if self._state in states:
            return
        if self._state is _State.NEW:
            raise InternalError("the simulated log is used before initialize()")
        if _State.NEW in states:
            if self._state is _State.CLOSED:
                raise ObjectClosedError("simulated log: closed")
            raise InternalError("initialize() may be called only once")
        error = ObjectClosedError(f"simulated log: {self._state.value}")
        error.__cause__ = self._failure
        raise error

    def _set_state(self, state: _State) -> None:
        if state not in _TRANSITIONS[self._state]:
            raise InternalError(f"simulated log state {self._state.value} -> {state.value}")
        self._state = state
        if state is not _State.OPEN and self._step is not None:
            self._step.cancel()
            self._step = None

    def _fenced(self) -> bool:
        return self._storage.epoch != self._epoch

    def _fence(self) -> None:
        self._fail(DataLogFencedError(f"simulated log: epoch {self._epoch} was fenced by a newer owner"))

    def _fail(self, failure: DurableDataLogError) -> None:
        """A final failure: every pending write fails with ``failure``'s kind; the log closes."""
        self._failure = failure
        self._fail_pending(failure)
        self._set_state(_State.FAILED)

    def _fail_pending(self, failure: BaseException) -> None:
        pending, self._pending = list(self._pending.values()), {}
        for write in pending:
            if not write.future.done():
                error = type(failure)(*failure.args)
                error.__cause__ = failure.__cause__
                write.future.set_exception(error)
            self._notify(write)

    def _make_durable(self, write: _PendingWrite) -> None:
        self._storage._persist(write.sequence, write.data)
        self._persisted_through = write.sequence
        write.durable = True

    def _deliver(self, write: _PendingWrite) -> None:
        del self._pending[write.sequence]
        self._delivered_through = max(self._delivered_through, write.sequence)
        if not write.future.done():  # the caller may have cancelled it; the record is durable anyway
            write.future.set_result(LogAddress(write.sequence, (write.sequence,)))
        self._notify(write)

    def _notify(self, write: _PendingWrite) -> None:
        # Tests drive this log from outside the event loop; the caller's on_done runs on the loop,
        # on its next turn, as a done-callback would.
        if write.on_done is not None:
            write.future.get_loop().call_soon(notify_done, write.on_done, write.future)

    def _auto_step(self) -> None:
        """One loop iteration of auto-complete: persist the non-durable writes in order (stopping at
        a delayed one), deliver their notices (maybe shuffled), then apply a failure if one is due."""
        self._step = None
        if self._state is not _State.OPEN:
            return
        if self._fenced():
            self._fence()
            return
        notices: list[_PendingWrite] = []
        failing: _PendingWrite | None = None
        for write in list(self._pending.values()):
            if write.durable:
                notices.append(write)
                continue
            if write.fault is WriteFault.DELAY:
                write.fault = None  # delayed once; it goes through next iteration
                break
            if write.fault in (WriteFault.FAIL, WriteFault.UNKNOWN_OUTCOME):
                failing = write
                break
            self._make_durable(write)
            notices.append(write)
        if self._faults is not None:
            self._faults.shuffle(notices)
        for write in notices:
            self._deliver(write)
        if failing is not None:
            self.fail_write(unknown_outcome=failing.fault is WriteFault.UNKNOWN_OUTCOME)
        elif self._pending:
            self._step = asyncio.get_running_loop().call_soon(self._auto_step)

    def _read(self, records: list[StoredRecord]) -> Iterator[LogRecord]:
        # A torn tail (self._storage.torn_tail) lies after these records: it is simply not yielded.
        for record in records:
            if zlib.crc32(record.data) != record.crc32:
                raise DataCorruptionError(f"simulated log: record at sequence {record.sequence} is damaged")
            yield LogRecord(LogAddress(record.sequence, (record.sequence,)), record.data)
