"""DataFrames: the unit of writing to Tier 1.  Many operation records per frame; a record that does not
fit spans frames.

Byte layout (big-endian)::

    frame  := version:u8 (=0) | flags:u8 (=0) | content_length:u32 | crc32:u32 | content
    content:= entry*
    entry  := payload_length:u32 | flags:u8 | sequence_number:i64 | payload
              flags bit 0 = first entry of its record, bit 1 = last entry of its record

A record (one serialized operation) is cut into entries; every entry repeats the record's sequence
number, so a record that a crash cut short still names its number.  ``crc32`` covers ``content``;
it is checked right after a frame is built and right after it is read back.

Packing rule (the spec's ``Pack``, with ``capacity`` = max frame length - frame header and
``entry_header`` = 13 bytes): a frame takes a new entry while it has room for an entry header and
one payload byte; a record takes as much of the frame as fits and continues in the next frame; a
frame is sealed as soon as it is full, or when the processor flushes it.

Reading back (``DataFrameReader``) applies the recovery rules for records cut short: a first entry
while a record is open discards the open record (its tail never became durable); a continuation
entry with no record open is allowed only at the very start of the read (the log was truncated in
the middle of a record) and is skipped; anywhere else it is corruption; a record still open at the
end of the log is discarded.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator

import attrs

from millstream.errors import DataCorruptionError, InternalError
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord

__all__ = [
    "ENTRY_HEADER_LENGTH",
    "FRAME_HEADER_LENGTH",
    "DataFrameBuilder",
    "DataFrameReader",
    "SealedFrame",
    "decode_frame",
]

_FRAME_HEADER = struct.Struct(">BBII")
_ENTRY_HEADER = struct.Struct(">IBq")
FRAME_HEADER_LENGTH = _FRAME_HEADER.size
ENTRY_HEADER_LENGTH = _ENTRY_HEADER.size
FIRST, LAST = 1, 2
_WHOLE = FIRST | LAST
_pack_entry_header = _ENTRY_HEADER.pack
VERSION = 0

#: Frames with at most this much content are copied to be checksummed: a copy of a few KiB costs
#: less than the memoryview that avoids it (callgrind: a 130-byte frame's seal takes 3.2 k
#: instructions by copy, 4.7 k through a view).  Larger frames -- up to 1 MiB -- use the view.
_CRC_COPY_BYTES_MAX = 16 * 1024


class SealedFrame:
    """A frame ready for Tier 1: its bytes, and how full it is (for the batching statistics).

    (A plain slotted class rather than a frozen attrs one: one is built per Tier-1 write, and a frozen
    class's ``__init__`` costs several times as much.)"""

    __slots__ = ("content_length", "data")

    def __init__(self, data: bytearray, content_length: int) -> None:
        self.data = data
        self.content_length = content_length

    def __repr__(self) -> str:
        return f"SealedFrame({self.data!r}, {self.content_length})"


class DataFrameBuilder:
    """Packs records into frames of at most ``frame_bytes_max`` bytes.

    ``on_sealed(frame)`` is called for each frame as it is sealed: during ``append`` for frames a
    record continues beyond, and from ``flush``.
    """

    __slots__ = ("_buffer", "_capacity_end", "_on_sealed")

    def __init__(self, frame_bytes_max: int, on_sealed: Callable[[SealedFrame], None]) -> None:
        if frame_bytes_max < FRAME_HEADER_LENGTH + ENTRY_HEADER_LENGTH + 1:
            raise ValueError(f"a frame of {frame_bytes_max} bytes cannot hold an entry")
        self._capacity_end = frame_bytes_max
        self._on_sealed = on_sealed
        self._buffer = bytearray(FRAME_HEADER_LENGTH)

    @property
    def capacity(self) -> int:
        """Content bytes one frame holds (the spec's FrameCapacity)."""
        return self._capacity_end - FRAME_HEADER_LENGTH

    @property
    def open_length(self) -> int:
        """Content bytes in the frame being built."""
        return len(self._buffer) - FRAME_HEADER_LENGTH

    def append(self, sequence_number: int, head: bytes, tail: bytes | memoryview = b"") -> bool:
        """Add the record ``head + tail`` (``tail`` is not copied until it goes into a frame).

        Frames the record fills *before its last entry* are sealed here.  Returns True if the frame
        holding the record's last entry is full: the caller must ``flush()`` it -- after accepting
        the operation, so that the operation commits with the frame that holds its end.
        """
        length = len(head) + len(tail)
        buffer = self._buffer
        end = self._capacity_end
        if len(buffer) + length <= end - ENTRY_HEADER_LENGTH:
            buffer += _pack_entry_header(length, _WHOLE, sequence_number)
            buffer += head
            buffer += tail
            return end - len(buffer) <= ENTRY_HEADER_LENGTH
        return self._append_spanning(sequence_number, head, tail)

    def _append_spanning(self, sequence_number: int, head: bytes, tail: bytes | memoryview) -> bool:
        """Cut the record ``head + tail`` into entries, each copied straight into its frame (a large
        record is never first joined into one buffer: that would copy it twice more)."""
        length = len(head) + len(tail)
        with memoryview(head) as head_view, memoryview(tail) as tail_view:
            position, flags = 0, FIRST
            while True:
                room = self._capacity_end - len(self._buffer) - ENTRY_HEADER_LENGTH
                piece = min(length - position, room)
                last = position + piece == length
                if last:
                    flags |= LAST
                buffer = self._buffer
                buffer += _pack_entry_header(piece, flags, sequence_number)
                end = position + piece
                if position < len(head_view):
                    buffer += head_view[position:min(end, len(head_view))]
                if end > len(head_view):
                    buffer += tail_view[max(position - len(head_view), 0):end - len(head_view)]
                position = end
                flags = 0
                if last:
                    return self._capacity_end - len(buffer) < ENTRY_HEADER_LENGTH + 1
                self._seal()

    def flush(self) -> bool:
        """Seal the frame being built, if it holds anything; return whether a frame was sealed."""
        if len(self._buffer) == FRAME_HEADER_LENGTH:
            return False
        self._seal()
        return True

    def _seal(self) -> None:
        buffer = self._buffer
        content_length = len(buffer) - FRAME_HEADER_LENGTH
        if content_length <= _CRC_COPY_BYTES_MAX:
            crc = zlib.crc32(buffer[FRAME_HEADER_LENGTH:])
        else:
            with memoryview(buffer) as view:  # (released before anyone may resize the buffer)
                crc = zlib.crc32(view[FRAME_HEADER_LENGTH:])
        _FRAME_HEADER.pack_into(buffer, 0, VERSION, 0, content_length, crc)
        self._buffer = bytearray(FRAME_HEADER_LENGTH)
        # Check the frame right before it leaves (STYLE.md #6): a wrong length or CRC here is a bug.
        if len(buffer) > self._capacity_end:
            raise InternalError(f"frame of {len(buffer)} bytes exceeds {self._capacity_end}")
        self._on_sealed(SealedFrame(buffer, content_length))


@attrs.frozen
class Entry:
    """One entry of a frame read back."""

    sequence_number: int
    first: bool
    last: bool
    payload: memoryview


def decode_frame(data: bytes | bytearray | memoryview, where: str) -> Iterator[Entry]:
    """The entries of one frame.  Raises ``DataCorruptionError`` (naming ``where``) on a bad frame."""
    view = memoryview(data)
    if len(view) < FRAME_HEADER_LENGTH:
        raise DataCorruptionError(f"{where}: frame of {len(view)} bytes is shorter than its header")
    version, _flags, content_length, crc = _FRAME_HEADER.unpack_from(view, 0)
    if version != VERSION:
        raise DataCorruptionError(f"{where}: unknown frame version {version}")
    if content_length != len(view) - FRAME_HEADER_LENGTH:
        raise DataCorruptionError(f"{where}: frame says {content_length} content bytes, holds "
                                  f"{len(view) - FRAME_HEADER_LENGTH}")
    if zlib.crc32(view[FRAME_HEADER_LENGTH:]) != crc:
        raise DataCorruptionError(f"{where}: frame CRC mismatch")
    position = FRAME_HEADER_LENGTH
    while position < len(view):
        if position + ENTRY_HEADER_LENGTH > len(view):
            raise DataCorruptionError(f"{where}: entry header cut at byte {position}")
        length, flags, sequence_number = _ENTRY_HEADER.unpack_from(view, position)
        position += ENTRY_HEADER_LENGTH
        if length == 0 or position + length > len(view) or flags & ~(FIRST | LAST):
            raise DataCorruptionError(f"{where}: malformed entry at byte {position - ENTRY_HEADER_LENGTH}")
        yield Entry(sequence_number, bool(flags & FIRST), bool(flags & LAST), view[position:position + length])
        position += length


@attrs.frozen
class ReadRecord:
    """A complete record read back, with the address of the frame holding its last entry, the
    number of the frame holding its first, and the address of the frame before that (None if it
    was the first frame read)."""

    sequence_number: int
    data: memoryview
    address: LogAddress
    first_frame: int
    address_before: LogAddress | None


class DataFrameReader:
    """Reassembles records from the frames of a log, applying the rules for records cut short."""

    def __init__(self, records: Iterable[LogRecord]) -> None:
        self._records = records
        #: The highest sequence number seen in any entry, complete or not.
        self.highest_sequence_number = 0
        #: Frames read so far, and the address of the last one.
        self.frame_count = 0
        self.last_address: LogAddress | None = None

    def __iter__(self) -> Iterator[ReadRecord]:
        open_sequence: int | None = None
        open_frame = 0
        open_before: LogAddress | None = None
        previous_address: LogAddress | None = None
        parts: list[memoryview] = []
        at_start = True
        skipped_sequence: int | None = None
        previous_sequence = 0
        for log_record in self._records:
            where = f"log record {log_record.address.sequence}"
            self.frame_count += 1
            previous_address, self.last_address = self.last_address, log_record.address
            for entry in decode_frame(log_record.data, where):
                self.highest_sequence_number = max(self.highest_sequence_number, entry.sequence_number)
                if entry.first:
                    # An open record here never got its tail: a crash cut it short.  Drop it.
                    if entry.sequence_number <= previous_sequence:
                        raise DataCorruptionError(f"{where}: sequence number {entry.sequence_number} "
                                                  f"does not follow {previous_sequence}")
                    open_sequence, parts = entry.sequence_number, [entry.payload]
                    open_frame, open_before = log_record.address.sequence, previous_address
                    previous_sequence = entry.sequence_number
                elif open_sequence is None:
                    # Allowed only before any record began: the log was truncated inside this record,
                    # which may continue over several frames.
                    if not at_start or skipped_sequence not in (None, entry.sequence_number):
                        raise DataCorruptionError(f"{where}: a record continues that never began")
                    skipped_sequence = entry.sequence_number
                    at_start = not entry.last
                    continue
                elif entry.sequence_number != open_sequence:
                    raise DataCorruptionError(f"{where}: entry of {entry.sequence_number} inside record "
                                              f"{open_sequence}")
                else:
                    parts.append(entry.payload)
                at_start = False
                if entry.last and open_sequence is not None:
                    # (bytes of each part: CrossHair's model of bytes.join takes no memoryviews, and
                    # records spanning frames are rare enough for the extra copy not to matter.)
                    data = parts[0] if len(parts) == 1 else memoryview(b"".join(bytes(p) for p in parts))
                    yield ReadRecord(open_sequence, data, log_record.address, open_frame, open_before)
                    open_sequence, parts = None, []
