"""``StateSynchronizer``: a state shared by many clients through one segment of records.

Theory of operation (Pravega's state synchronizer).  The segment holds a *full state* record
followed by *update* records.  Every client keeps a local copy: it reads the records it has not seen
and applies each update to its copy with the codec's pure ``apply``, so every client that has read
up to the same offset holds the same state.  To change the state a client *plans* its change against
its copy (a function of the state: a list of updates, a full state, or nothing), applies it locally
(which validates it: a refused update raises and nothing is written), and appends the record with a
**conditional append at the offset it has read up to**.  If the segment is longer than that, another
client wrote first: the append is refused (``BadOffsetError``), the client reads what it missed and
plans again -- optimistic concurrency without locks, bounded by
``limits.READER_GROUP_STATE_UPDATE_ATTEMPTS_MAX`` attempts.  An append whose outcome is unknown (the
connection broke) is settled by reading on: every record carries a random id, and finding one's own id
among the records read means it landed.

Compaction.  Once ``compaction_bytes`` of update records follow the last full state, the client that
just wrote appends its whole state as a new full-state record (conditionally, like any other) and
truncates the segment before it.  A client whose offset falls below the truncation point reads from
the segment's new start, which is a full state.  Truncating below an earlier full state than someone
else's is harmless (the start offset only moves forward; a stale truncation is refused and ignored).

Byte layout.  Records are framed as events (``type:i32 = 0 | length:i32 | payload``, big-endian, the
framing ``conditional_append`` applies), each payload canonical JSON (UTF-8, sorted keys, no spaces)::

    {"id": "<32 hex>", "state": <the codec's JSON of a full state>}
    {"id": "<32 hex>", "updates": [<the codec's JSON of an update>, ...]}

A conditional append is atomic, so a read that reached the segment's tail never ends inside a record;
one that does is corruption (``DataCorruptionError``), as is an update record with no full state
before it.  Long polls (``wait_for_change``) let a client sleep until somebody writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

from millstream import limits
from millstream.client._config import RandomSource
from millstream.client._segments import AsyncSegments
from millstream.client._streams import canonical_json
from millstream.errors import (
    BadOffsetError,
    ConnectionLostError,
    ContainerUnavailableError,
    DataCorruptionError,
    InvalidArgumentError,
    RetryableError,
    StreamSegmentTruncatedError,
    WrongHostError,
)

__all__ = ["NewState", "StateSynchronizer", "SynchronizerCodec"]

S = TypeVar("S")
U = TypeVar("U")

_HEADER: Final = struct.Struct(">ii")


class SynchronizerCodec(Protocol[S, U]):
    """How a synchronizer's state and updates look as JSON, and how an update changes a state.
    ``apply`` is pure and deterministic (every client must reach the same state); it raises a typed
    error for an update the state refuses."""

    def encode_state(self, state: S) -> Any: ...

    def decode_state(self, value: Any) -> S: ...

    def encode_update(self, update: U) -> Any: ...

    def decode_update(self, value: Any) -> U: ...

    def apply(self, state: S, update: U) -> S: ...


class NewState(Generic[S]):
    """A plan that writes a whole state (initialisation), rather than updates."""

    __slots__ = ("state",)

    def __init__(self, state: S) -> None:
        self.state = state


Plan = Callable[[S | None], Sequence[U] | NewState[S] | None]


class StateSynchronizer(Generic[S, U]):
    """A local copy of the state kept in ``segment`` (which must exist), and conditional updates of
    it.  Calls are serialized by a lock; none waits without a bound (reads and appends are bounded by
    the client's request limits, retries by the attempt limit)."""

    def __init__(self, segments: AsyncSegments, segment: str, codec: SynchronizerCodec[S, U], *,
                 rng: RandomSource, compaction_bytes: int = limits.READER_GROUP_STATE_COMPACTION_BYTES,
                 attempts_max: int = limits.READER_GROUP_STATE_UPDATE_ATTEMPTS_MAX) -> None:
        if type(compaction_bytes) is not int or compaction_bytes < 1:
            raise InvalidArgumentError(f"compaction_bytes must be a positive int, not {compaction_bytes!r}")
        self._segments = segments
        self.segment = segment
        self._codec = codec
        self._rng = rng
        self._compaction_bytes = compaction_bytes
        self._attempts_max = attempts_max
        self._state: S | None = None
        self._offset = 0  # where the next record starts (everything before it is applied)
        self._bytes_since_state = 0  # bytes of update records after the last full state read or written
        self._lock = asyncio.Lock()
        self.conflicts = 0  # refused conditional appends so far (for tests and diagnostics)
        self.compactions = 0

    @property
    def state(self) -> S | None:
        """The local copy (None while the segment holds no state yet)."""
        return self._state

    @property
    def offset(self) -> int:
        """How far the segment has been read and applied."""
        return self._offset

    # --- Reading -----------------------------------------------------------------------------------

    async def fetch_updates(self) -> bool:
        """Read and apply every record not seen yet; return whether the state changed."""
        async with self._lock:
            before = self._offset
            await self._fetch_locked()
            return self._offset != before

    async def _fetch_locked(self, *, first: bytes = b"") -> set[str]:
        """Read from ``_offset`` to the tail (``first``: bytes already read from there); apply; return
        the ids of the records read."""
        ids: set[str] = set()
        pending = bytearray(first)
        self._apply_records(pending, ids)
        fetch = self._offset + len(pending)
        for _ in range(limits.READER_GROUP_STATE_UPDATE_ATTEMPTS_MAX):  # truncations met while reading
            try:
                while True:
                    result = await self._segments.read_following_moves(self.segment, fetch)
                    pending += result.data
                    fetch += len(result.data)
                    self._apply_records(pending, ids)
                    if result.at_tail or result.end_of_segment:
                        if pending:
                            raise DataCorruptionError(
                                f"state segment {self.segment!r} ends inside a record at offset {self._offset}")
                        return ids
            except StreamSegmentTruncatedError:
                # Compacted past us: start again from the segment's start, a full state.
                start = (await self._segments.following_moves(
                    self.segment, lambda: self._segments.info(self.segment), what=f"info of {self.segment!r}",
                )).start_offset
                self._state = None
                self._offset = fetch = start
                pending = bytearray()
        raise RetryableError(f"state segment {self.segment!r} kept being truncated under its reader")

    def _apply_records(self, pending: bytearray, ids: set[str]) -> None:
        """Apply the whole records at the front of ``pending`` (consumed)."""
        position = 0
        size = len(pending)
        while size - position >= _HEADER.size:
            kind, length = _HEADER.unpack_from(pending, position)
            if kind != 0 or length < 0 or length > limits.EVENT_LENGTH_BYTES_MAX:
                raise DataCorruptionError(f"state segment {self.segment!r} holds no record at offset "
                                          f"{self._offset} (type {kind}, length {length})")
            end = position + _HEADER.size + length
            if end > size:
                break
            record = self._decode(bytes(pending[position + _HEADER.size:end]))
            ids.add(record["id"])
            if "state" in record:
                self._state = self._codec.decode_state(record["state"])
                self._bytes_since_state = 0
            else:
                if self._state is None:
                    raise DataCorruptionError(f"state segment {self.segment!r} has updates at offset "
                                              f"{self._offset} with no state before them")
                state = self._state
                for update in record["updates"]:
                    state = self._codec.apply(state, self._codec.decode_update(update))
                self._state = state
                self._bytes_since_state += end - position
            self._offset += end - position
            position = end
        del pending[:position]

    def _decode(self, payload: bytes) -> dict[str, Any]:
        try:
            record = json.loads(payload)
        except ValueError as error:
            raise DataCorruptionError(f"a record of state segment {self.segment!r} is not JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("id"), str) or (
                ("state" in record) == isinstance(record.get("updates"), list)):
            raise DataCorruptionError(f"a record of state segment {self.segment!r} is malformed: {record!r:.200}")
        return record

    async def wait_for_change(self, wait_seconds: float) -> bool:
        """Wait up to ``wait_seconds`` for someone to write (a long poll at the segment's tail), then
        apply what arrived; return whether the state changed."""
        offset = self._offset
        try:
            result = await self._segments.read_following_moves(
                self.segment, offset, length=limits.READER_TAIL_READ_LENGTH_BYTES, wait_seconds=wait_seconds)
        except StreamSegmentTruncatedError:
            return await self.fetch_updates()  # compacted past us meanwhile
        if not result.data:
            return False
        async with self._lock:
            if self._offset != offset:  # someone else of ours read on meanwhile
                return True
            await self._fetch_locked(first=result.data)
            return True

    # --- Writing -----------------------------------------------------------------------------------

    async def update(self, plan: Plan[S, U]) -> bool:
        """Plan against the latest state and write the plan conditionally, planning again after every
        conflict.  ``plan(state)`` returns updates, a ``NewState`` or None (nothing to do).  Returns
        whether something was written.  Raises whatever ``apply`` raises for a refused update (nothing
        written), ``RetryableError`` after too many conflicts, and the segment's errors."""
        async with self._lock:
            if self._offset == 0 and self._state is None:
                await self._fetch_locked()
            for _ in range(self._attempts_max):
                planned = plan(self._state)
                if planned is None or (not isinstance(planned, NewState) and not planned):
                    return False
                record_id = f"{self._rng.getrandbits(128):032x}"
                if isinstance(planned, NewState):
                    new_state = planned.state
                    record = {"id": record_id, "state": self._codec.encode_state(new_state)}
                else:
                    if self._state is None:
                        raise InvalidArgumentError(f"state segment {self.segment!r} holds no state to update yet")
                    new_state = self._state
                    for update in planned:
                        new_state = self._codec.apply(new_state, update)
                    record = {"id": record_id, "updates": [self._codec.encode_update(u) for u in planned]}
                payload = canonical_json(record)
                try:
                    # Its container moving (WrongHost: nothing appended) is waited out; a container that
                    # stopped under the append (ContainerUnavailable) leaves the outcome unknown, as a
                    # lost connection does.
                    length = await self._segments.following_moves(
                        self.segment, functools.partial(self._segments.conditional_append, self.segment,
                                                        [payload], expected_offset=self._offset),
                        what=f"update {self.segment!r}", retry_on=(WrongHostError,))
                except BadOffsetError:
                    self.conflicts += 1
                    await self._fetch_locked()
                    continue
                except (ConnectionLostError, ContainerUnavailableError):
                    # Unknown outcome: read on; our record's id tells whether it landed.
                    if record_id in await self._fetch_locked():
                        return True
                    continue
                self._state = new_state
                self._offset = length
                if isinstance(planned, NewState):
                    self._bytes_since_state = 0
                else:
                    self._bytes_since_state += _HEADER.size + len(payload)
                    if self._bytes_since_state >= self._compaction_bytes:
                        await self._compact_locked()
                return True
            raise RetryableError(f"state segment {self.segment!r}: {self._attempts_max} conflicting updates in a row")

    async def _compact_locked(self) -> None:
        """Append the whole state and truncate before it (skipped if someone wrote meanwhile)."""
        if self._state is None:
            return
        payload = canonical_json({"id": f"{self._rng.getrandbits(128):032x}",
                                  "state": self._codec.encode_state(self._state)})
        start = self._offset
        try:
            self._offset = await self._segments.conditional_append(self.segment, [payload], expected_offset=start)
        except (BadOffsetError, ConnectionLostError, ContainerUnavailableError, WrongHostError):
            return  # another writer went first (or the outcome is unknown): the next update tries again
        self._bytes_since_state = 0
        self.compactions += 1
        # Someone may have truncated further already (refused), or the outcome may be unknown: either
        # way the next compaction truncates again.
        with contextlib.suppress(BadOffsetError, ConnectionLostError, ContainerUnavailableError, WrongHostError):
            await self._segments.truncate(self.segment, start)

    def __repr__(self) -> str:
        return f"StateSynchronizer({self.segment!r}, offset={self._offset})"
