"""The controller's metadata log: records appended to a system segment with conditional appends,
replayed on start, compacted by snapshots.

Theory of operation (the state synchronizer pattern, as reader groups use it too).  The log is the
segment ``_system/_controller/metadata``.  Each change of the controller's state is one record,
appended with a *conditional* append at the length the controller last saw: if the segment is longer
(another controller instance wrote), the append fails, the controller reads what it missed, applies
it, and plans its change again.  A record is applied to memory only once its append is durable.

Byte layout (big-endian)::

    log     := record*
    record  := length:u32 | JSON object (canonical: UTF-8, sorted keys, no spaces), length bytes
               length <= limits.CONTROLLER_RECORD_BYTES_MAX

Every few thousand records the controller writes a *snapshot*: the whole state as JSON, cut into
``snapshot_part`` records ``{"type": "snapshot_part", "snapshot": n, "index": i, "count": k,
"data": <slice of the JSON text>}`` appended one after another, and then truncates the segment at
the first part.  Replay starts at the segment's start offset; a complete run of parts replaces the
state built so far, and an incomplete run (the controller stopped while writing it, so the segment
was not truncated either) is skipped -- the records before it hold the same state.  Replay is
therefore bounded by the snapshot interval plus one snapshot.

A record whose append's outcome is unknown (the container restarted under it) is retried by the
segment store layer; if the first attempt had landed, the retry finds the log longer and reads its
own record back at the expected offset: byte-equality with what it wrote tells that it succeeded.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any, Final

import attrs

from millstream import limits
from millstream.controller._segment_store import SegmentStore
from millstream.errors import BadOffsetError, DataCorruptionError, InternalError, MetadataConflictError
from millstream.naming import SYSTEM_SCOPE
from millstream.values import canonical_json

__all__ = ["METADATA_SEGMENT", "LoggedRecord", "MetadataConflictError", "MetadataLog", "encode_record"]

#: The system segment holding the controller's metadata log.
METADATA_SEGMENT: Final = f"{SYSTEM_SCOPE}/_controller/metadata"

_LENGTH: Final = struct.Struct(">I")


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One record's bytes.  Raises ``InternalError`` for a record over the size limit (the
    controller's limits keep every record below it)."""
    payload = canonical_json(record)
    if len(payload) > limits.CONTROLLER_RECORD_BYTES_MAX:
        raise InternalError(f"a {record.get('type')} record of {len(payload)} bytes exceeds "
                            f"{limits.CONTROLLER_RECORD_BYTES_MAX}")
    return _LENGTH.pack(len(payload)) + payload


@attrs.frozen
class LoggedRecord:
    """A record read back: where it starts, its bytes, and what it is -- a plain record, or a whole
    snapshot (``snapshot`` set, ``record`` None) assembled from its parts."""

    offset: int
    raw: bytes
    record: dict[str, Any] | None
    snapshot: dict[str, Any] | None = None


class _SnapshotAssembler:
    """Collects consecutive snapshot parts; yields the snapshot when the last one arrives."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._number = -1
        self._count = 0
        self._offset = 0

    def feed(self, offset: int, record: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
        if record.get("type") != "snapshot_part":
            self._parts = []
            return None
        index, count, number = record["index"], record["count"], record["snapshot"]
        if index == 0:
            self._parts, self._number, self._count, self._offset = [], number, count, offset
        elif not self._parts or number != self._number or index != len(self._parts) or count != self._count:
            self._parts = []  # a broken run: ignore it
            return None
        self._parts.append(record["data"])
        if len(self._parts) < self._count:
            return None
        text = "".join(self._parts)
        self._parts = []
        try:
            snapshot = json.loads(text)
        except ValueError as error:
            raise DataCorruptionError(f"snapshot {number} of the controller's metadata is not JSON: {error}") from None
        return self._offset, snapshot


class MetadataLog:
    """The metadata log on ``store``'s segment ``segment``."""

    def __init__(self, store: SegmentStore, segment: str = METADATA_SEGMENT) -> None:
        self._store = store
        self.segment = segment
        self._length = 0
        self._assembler = _SnapshotAssembler()
        self._next_snapshot = 0
        #: Bytes of records appended or read since the last snapshot (when to write the next one).
        self.bytes_since_snapshot = 0

    @property
    def length(self) -> int:
        """The log's length as far as this instance knows."""
        return self._length

    async def open(self) -> list[LoggedRecord]:
        """Create the segment if missing; return everything to replay, in order."""
        await self._store.create_segment(self.segment)
        info = await self._store.get_info(self.segment)
        if info is None:
            raise InternalError(f"{self.segment} vanished right after it was created")
        self._length = info.start_offset
        return await self._read_to(info.length)

    async def catch_up(self) -> list[LoggedRecord]:
        """What others appended since this instance last read or wrote."""
        info = await self._store.get_info(self.segment)
        if info is None:
            raise DataCorruptionError(f"the controller's metadata segment {self.segment} was deleted")
        return await self._read_to(info.length)

    async def _read_to(self, end: int) -> list[LoggedRecord]:
        pending = bytearray()
        start = self._length
        offset = start
        while offset < end:
            result = await self._store.read(self.segment, offset, min(end - offset, limits.READ_LENGTH_BYTES_MAX))
            if not result.data:
                raise DataCorruptionError(f"{self.segment}: nothing to read at {offset} below its length {end}")
            pending += result.data
            offset += len(result.data)
        records: list[LoggedRecord] = []
        position = 0
        while position < len(pending):
            if len(pending) - position < _LENGTH.size:
                raise DataCorruptionError(f"{self.segment}: a record header is cut short at {start + position}")
            (length,) = _LENGTH.unpack_from(pending, position)
            end_of_record = position + _LENGTH.size + length
            if length > limits.CONTROLLER_RECORD_BYTES_MAX or end_of_record > len(pending):
                raise DataCorruptionError(f"{self.segment}: the record at {start + position} announces "
                                          f"{length} bytes")
            raw = bytes(pending[position:end_of_record])
            try:
                record = json.loads(raw[_LENGTH.size:])
            except ValueError as error:
                raise DataCorruptionError(f"{self.segment}: the record at {start + position} is not JSON: "
                                          f"{error}") from None
            if not isinstance(record, dict) or not isinstance(record.get("type"), str):
                raise DataCorruptionError(f"{self.segment}: the record at {start + position} has no type")
            records.append(self._received(start + position, raw, record))
            position = end_of_record
        self._length = end
        return [r for r in records if r.record is not None or r.snapshot is not None]

    def _received(self, offset: int, raw: bytes, record: dict[str, Any]) -> LoggedRecord:
        self.bytes_since_snapshot += len(raw)
        if record["type"] != "snapshot_part":
            self._assembler.feed(offset, record)
            return LoggedRecord(offset, raw, record)
        self._next_snapshot = max(self._next_snapshot, int(record["snapshot"]) + 1)
        assembled = self._assembler.feed(offset, record)
        if assembled is None:
            return LoggedRecord(offset, raw, None)
        self.bytes_since_snapshot = 0
        return LoggedRecord(assembled[0], raw, None, assembled[1])

    async def append(self, data: bytes) -> int:
        """Append one encoded record at the known length; return its offset.  Raises
        ``MetadataConflictError`` if the log is longer than this instance knew (nothing appended)."""
        offset = self._length
        try:
            self._length = await self._store.append(self.segment, data, expected_offset=offset)
        except BadOffsetError:
            raise MetadataConflictError(f"{self.segment} is no longer {offset} bytes long") from None
        self.bytes_since_snapshot += len(data)
        return offset

    async def write_snapshot(self, snapshot: Mapping[str, Any]) -> None:
        """Append ``snapshot`` as parts, then truncate the log before them.  Raises
        ``MetadataConflictError`` if another instance wrote meanwhile (the partial snapshot is then
        skipped on replay, and nothing was truncated)."""
        text = canonical_json(snapshot).decode("utf-8")
        part_length = limits.CONTROLLER_RECORD_BYTES_MAX // 2  # room for JSON escapes of the slice
        pieces = [text[i:i + part_length] for i in range(0, len(text), part_length)] or [""]
        number = self._next_snapshot
        self._next_snapshot += 1
        first = self._length
        for index, piece in enumerate(pieces):
            await self.append(encode_record({"type": "snapshot_part", "snapshot": number, "index": index,
                                             "count": len(pieces), "data": piece}))
        await self._store.truncate(self.segment, first)
        self.bytes_since_snapshot = 0
