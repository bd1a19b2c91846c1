"""The wire codec: bytes in, commands out (``Decoder.feed``); commands in, bytes out (``encode``).  No I/O.

Theory of operation.  A connection is a stream of frames.  Each frame is a fixed header -- the type
code of its command and the length of its fields -- followed by the fields.  The ``Decoder`` keeps
the bytes of at most one unfinished frame: as soon as a header is complete it is checked (a known
type code, a length within the decoder's ``frame_bytes_max``, at most ``FRAME_BYTES_MAX``) before a
byte of the body is awaited, so a peer can neither make it buffer more than one frame's worth nor
make it wait for a body it will reject anyway.  (The decoder buffers what arrives, never what a
header announces.)
Complete frames are decoded straight from the bytes the caller fed, without copying them first; only
a frame's ``data`` blob and its strings are copied out, so the commands owe nothing to the buffers.

The codec checks encoding, not meaning: a bool that is neither 0 nor 1, a string that is not UTF-8,
a field running past the end of its frame or bytes left over after the last field make a frame
malformed; a negative offset or an unknown segment are the store's to answer.  Any error poisons
the ``Decoder``: the stream has lost its framing (or its peer cannot be trusted), so every later
``feed`` raises the same error, and the server closes the connection.  Commands decoded earlier in
the same ``feed`` are dropped with it: nothing was acknowledged yet, and a writer re-sends
unacknowledged blocks after it reconnects.

This is millstream's protocol, not Pravega's: it borrows Pravega's type codes and command shapes,
but frame lengths are always exact (Pravega's ``AppendBlock`` header announces bytes that follow in
later frames), strings are standard UTF-8, and the fields are in the order tabled here.

Byte layout.  All integers are big-endian; ``i32``/``i64`` are signed, ``u8``/``u16``/``u32``/``u64``
unsigned::

    frame   := type:i32 | length:i32 | fields        length = bytes of fields, 0 <= length <= FRAME_BYTES_MAX
    i32     := 4 bytes                               sizes, counts, versions, codes, waits
    i64     := 8 bytes                               offsets, lengths, event numbers, request ids, values
    bool    := u8                                    0 or 1; any other value makes the frame malformed
    uuid    := 16 bytes                              a writer id, as ``UUID.bytes``
    u128    := high:u64 | low:u64                    an attribute id
    str     := n:u16 | n bytes of UTF-8              (at most 65,535 bytes)
    blob    := n:u32 | n bytes                       (at most what the frame has room for)
    event   := type:i32 (=0) | n:i32 | n bytes       inside append data: see ``encode_event``

The fields of each command, in order (the same order as the command class's attributes)::

     type  command                   fields
     -127  Hello                     high_version:i32 | low_version:i32
      100  KeepAlive                 (none)
        1  SetupAppend               request_id:i64 | writer_id:uuid | segment:str | token:str
        2  AppendSetup               request_id:i64 | segment:str | writer_id:uuid | last_event_number:i64
        3  AppendBlock               writer_id:uuid | last_event_number:i64 | event_count:i32 | request_id:i64
                                     | data:blob
        4  AppendBlockEnd            writer_id:uuid | size_of_whole_events:i32 | data:blob | event_count:i32
                                     | last_event_number:i64 | request_id:i64
        5  ConditionalAppend         writer_id:uuid | event_number:i64 | expected_offset:i64 | data:blob
                                     | request_id:i64
        6  AppendBlockPart           writer_id:uuid | data:blob
        7  DataAppended              request_id:i64 | writer_id:uuid | event_number:i64 | previous_event_number:i64
                                     | current_segment_write_offset:i64
        8  ConditionalCheckFailed    request_id:i64 | writer_id:uuid | event_number:i64
        9  ReadSegment               request_id:i64 | segment:str | offset:i64 | suggested_length:i32 | token:str
                                     | wait_ms:i32
       10  SegmentRead               request_id:i64 | segment:str | offset:i64 | at_tail:bool | end_of_segment:bool
                                     | data:blob
       11  GetSegmentInfo            request_id:i64 | segment:str | token:str
       12  SegmentInfo               request_id:i64 | segment:str | exists:bool | sealed:bool | deleted:bool
                                     | start_offset:i64 | length:i64 | last_modified:i64
       20  CreateSegment             request_id:i64 | segment:str | token:str
       21  SegmentCreated            request_id:i64 | segment:str
       28  SealSegment               request_id:i64 | segment:str | token:str
       29  SegmentSealed             request_id:i64 | segment:str
       30  DeleteSegment             request_id:i64 | segment:str | token:str
       31  SegmentDeleted            request_id:i64 | segment:str
       34  GetSegmentAttribute       request_id:i64 | segment:str | attribute_id:u128 | token:str
       35  SegmentAttribute          request_id:i64 | value:i64
       36  UpdateSegmentAttribute    request_id:i64 | segment:str | attribute_id:u128 | new_value:i64
                                     | expected_value:i64 | token:str
       37  SegmentAttributeUpdated   request_id:i64 | success:bool
       38  TruncateSegment           request_id:i64 | segment:str | offset:i64 | token:str
       39  SegmentTruncated          request_id:i64 | segment:str
       40  CreateTransientSegment    request_id:i64 | writer_id:uuid | parent:str | token:str
       50  WrongHost                 request_id:i64 | segment:str | correct_host:str
       51  SegmentIsSealed           request_id:i64 | segment:str | offset:i64
       52  SegmentAlreadyExists      request_id:i64 | segment:str
       53  NoSuchSegment             request_id:i64 | segment:str
       55  InvalidEventNumber        request_id:i64 | writer_id:uuid | event_number:i64
       56  SegmentIsTruncated        request_id:i64 | segment:str | start_offset:i64
       57  OperationUnsupported      request_id:i64 | operation:str
       58  MergeSegments             request_id:i64 | target:str | source:str | token:str
       59  SegmentsMerged            request_id:i64 | target:str | source:str | new_target_length:i64
       60  AuthTokenCheckFailed      request_id:i64 | reason:str
       61  ErrorMessage              request_id:i64 | segment:str | error_code:i32 | message:str
       64  GetEventBoundaries        request_id:i64 | segment:str | start_offset:i64 | end_offset:i64 | token:str
       65  EventBoundaries           request_id:i64 | segment:str | offsets:blob
       89  ConditionalBlockEnd       writer_id:uuid | event_number:i64 | expected_offset:i64 | data:blob
                                     | request_id:i64
      200  ControllerRequest         request_id:i64 | method:str | body:blob
      201  ControllerReply           request_id:i64 | body:blob

For example ``KeepAlive()`` is ``00000064 00000000`` and ``Hello(1, 1)`` is
``ffffff81 00000008 00000001 00000001``.  The table is executable: ``_LAYOUTS`` below holds the same
rows, the codec is built from them, and a test checks that this docstring shows them all.  The hot
commands (``AppendBlock``, ``DataAppended``, ``SegmentRead``) have hand-written codecs for speed; a
test checks them against the table-driven ones.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Final
from uuid import UUID

import attrs

from millstream import limits
from millstream.errors import (
    CommandTooLargeError,
    FrameTooLargeError,
    IncompatibleVersionError,
    InternalError,
    InvalidArgumentError,
    InvalidCommandError,
    MalformedEventError,
    MalformedFrameError,
    UnknownCommandError,
    WireProtocolError,
)
from millstream.wire import commands as _commands
from millstream.wire.commands import AppendBlock, Command, DataAppended, SegmentRead

__all__ = [
    "EVENT_HEADER_LENGTH",
    "FRAME_HEADER_LENGTH",
    "FRAME_BYTES_MAX",
    "OLDEST_COMPATIBLE_VERSION",
    "STRING_LENGTH_MAX",
    "WIRE_VERSION",
    "CommandTooLargeError",
    "Decoder",
    "FrameTooLargeError",
    "IncompatibleVersionError",
    "InvalidCommandError",
    "MalformedEventError",
    "MalformedFrameError",
    "UnknownCommandError",
    "WireProtocolError",
    "count_events",
    "decode_offsets",
    "encode",
    "encode_event",
    "encode_into",
    "encode_offsets",
    "iter_events",
    "negotiate",
    "negotiation_outcome",
]

# --- Limits and versions ---------------------------------------------------------------------------

#: The fields of one frame.  A decoder buffers at most one frame, so this bounds the memory a peer can
#: make a connection hold; a whole ``AppendBlock`` fits in one frame, which keeps every append under
#: ``limits.APPEND_LENGTH_BYTES_MAX`` (the same 2**24 - 1 that Pravega's servers accept).
FRAME_BYTES_MAX: Final = 16 * limits.MIB - 1

#: A string's UTF-8 bytes (its length travels as a u16).
STRING_LENGTH_MAX: Final = 0xFFFF

#: The protocol version this codec speaks, and the oldest one it still understands.  Bump
#: ``WIRE_VERSION`` whenever a layout above changes; raise ``OLDEST_COMPATIBLE_VERSION`` only when an
#: old layout stops being decoded.
WIRE_VERSION: Final = 1
OLDEST_COMPATIBLE_VERSION: Final = 1

_HEADER = struct.Struct(">ii")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
FRAME_HEADER_LENGTH: Final = _HEADER.size
EVENT_HEADER_LENGTH: Final = _HEADER.size
_EVENT_TYPE = 0
_U64_MASK = (1 << 64) - 1

#: Writer ids a decoder remembers (bytes -> UUID): building a UUID costs more than decoding the rest of
#: a ``DataAppended``, and a connection carries few writers.  The cache empties when full.
_UUID_CACHE_SIZE_MAX = 1024


# --- Errors ----------------------------------------------------------------------------------------


def negotiate(ours_high: int, ours_low: int, theirs_high: int, theirs_low: int) -> int:
    """The newest version both sides speak, given each side's ``Hello``.

    Raises ``IncompatibleVersionError`` if the ranges do not overlap or the peer's is empty, and
    ``InvalidArgumentError`` if ours is (that is the caller's bug, not the peer's)."""
    for value in (ours_high, ours_low, theirs_high, theirs_low):
        if type(value) is not int:
            raise InvalidArgumentError(f"versions are ints, not {value!r}")
    version = negotiation_outcome(ours_high, ours_low, theirs_high, theirs_low)
    if version is InvalidArgumentError:
        raise InvalidArgumentError(f"our version range [{ours_low}, {ours_high}] is empty")
    if version is IncompatibleVersionError:
        if theirs_low > theirs_high:
            raise IncompatibleVersionError(f"the peer's version range [{theirs_low}, {theirs_high}] is empty")
        raise IncompatibleVersionError(
            f"no common version: we speak [{ours_low}, {ours_high}], the peer [{theirs_low}, {theirs_high}]")
    assert isinstance(version, int)
    return version


def negotiation_outcome(ours_high: int, ours_low: int, theirs_high: int,
                        theirs_low: int) -> int | type[InvalidArgumentError] | type[IncompatibleVersionError]:
    """``negotiate``'s answer for int versions: the version, or the class of the error it raises.
    Formats no message, so CrossHair checks its contracts over all paths (``proofs/contracts_pure.py``)."""
    if ours_low > ours_high:
        return InvalidArgumentError
    if theirs_low > theirs_high:
        return IncompatibleVersionError
    version = min(ours_high, theirs_high)
    if version < max(ours_low, theirs_low):
        return IncompatibleVersionError
    return version


# --- The layout table ------------------------------------------------------------------------------

#: Each command's fields, as tabled in the module docstring (wrapped lines there, one string here).
_LAYOUTS: Final[dict[type[Command], str]] = {
    _commands.Hello: "high_version:i32 | low_version:i32",
    _commands.KeepAlive: "",
    _commands.SetupAppend: "request_id:i64 | writer_id:uuid | segment:str | token:str",
    _commands.AppendSetup: "request_id:i64 | segment:str | writer_id:uuid | last_event_number:i64",
    _commands.AppendBlock: "writer_id:uuid | last_event_number:i64 | event_count:i32 | request_id:i64 | data:blob",
    _commands.AppendBlockEnd: "writer_id:uuid | size_of_whole_events:i32 | data:blob | event_count:i32"
                              " | last_event_number:i64 | request_id:i64",
    _commands.ConditionalAppend: "writer_id:uuid | event_number:i64 | expected_offset:i64 | data:blob"
                                 " | request_id:i64",
    _commands.AppendBlockPart: "writer_id:uuid | data:blob",
    _commands.DataAppended: "request_id:i64 | writer_id:uuid | event_number:i64 | previous_event_number:i64"
                            " | current_segment_write_offset:i64",
    _commands.ConditionalCheckFailed: "request_id:i64 | writer_id:uuid | event_number:i64",
    _commands.ReadSegment: "request_id:i64 | segment:str | offset:i64 | suggested_length:i32 | token:str"
                           " | wait_ms:i32",
    _commands.SegmentRead: "request_id:i64 | segment:str | offset:i64 | at_tail:bool | end_of_segment:bool"
                           " | data:blob",
    _commands.GetSegmentInfo: "request_id:i64 | segment:str | token:str",
    _commands.SegmentInfo: "request_id:i64 | segment:str | exists:bool | sealed:bool | deleted:bool"
                           " | start_offset:i64 | length:i64 | last_modified:i64",
    _commands.CreateSegment: "request_id:i64 | segment:str | token:str",
    _commands.SegmentCreated: "request_id:i64 | segment:str",
    _commands.SealSegment: "request_id:i64 | segment:str | token:str",
    _commands.SegmentSealed: "request_id:i64 | segment:str",
    _commands.DeleteSegment: "request_id:i64 | segment:str | token:str",
    _commands.SegmentDeleted: "request_id:i64 | segment:str",
    _commands.GetSegmentAttribute: "request_id:i64 | segment:str | attribute_id:u128 | token:str",
    _commands.SegmentAttribute: "request_id:i64 | value:i64",
    _commands.UpdateSegmentAttribute: "request_id:i64 | segment:str | attribute_id:u128 | new_value:i64"
                                      " | expected_value:i64 | token:str",
    _commands.SegmentAttributeUpdated: "request_id:i64 | success:bool",
    _commands.TruncateSegment: "request_id:i64 | segment:str | offset:i64 | token:str",
    _commands.SegmentTruncated: "request_id:i64 | segment:str",
    _commands.CreateTransientSegment: "request_id:i64 | writer_id:uuid | parent:str | token:str",
    _commands.WrongHost: "request_id:i64 | segment:str | correct_host:str",
    _commands.SegmentIsSealed: "request_id:i64 | segment:str | offset:i64",
    _commands.SegmentAlreadyExists: "request_id:i64 | segment:str",
    _commands.NoSuchSegment: "request_id:i64 | segment:str",
    _commands.InvalidEventNumber: "request_id:i64 | writer_id:uuid | event_number:i64",
    _commands.SegmentIsTruncated: "request_id:i64 | segment:str | start_offset:i64",
    _commands.OperationUnsupported: "request_id:i64 | operation:str",
    _commands.MergeSegments: "request_id:i64 | target:str | source:str | token:str",
    _commands.SegmentsMerged: "request_id:i64 | target:str | source:str | new_target_length:i64",
    _commands.AuthTokenCheckFailed: "request_id:i64 | reason:str",
    _commands.ErrorMessage: "request_id:i64 | segment:str | error_code:i32 | message:str",
    _commands.GetEventBoundaries: "request_id:i64 | segment:str | start_offset:i64 | end_offset:i64 | token:str",
    _commands.EventBoundaries: "request_id:i64 | segment:str | offsets:blob",
    _commands.ConditionalBlockEnd: "writer_id:uuid | event_number:i64 | expected_offset:i64 | data:blob"
                                   " | request_id:i64",
    _commands.ControllerRequest: "request_id:i64 | method:str | body:blob",
    _commands.ControllerReply: "request_id:i64 | body:blob",
}

#: Fixed-size wire types: their ``struct`` codes.  ``str`` and ``blob`` are the variable-size ones.
_FIXED_CODES: Final = {"i32": "i", "i64": "q", "bool": "B", "uuid": "16s", "u128": "QQ"}
_VARIABLE = ("str", "blob")

_UuidCache = dict[bytes, UUID]
_Decode = Callable[[memoryview, _UuidCache], Command]
_Encode = Callable[[Command], bytes]


def _parse_layout(cls: type[Command], layout: str) -> list[tuple[str, str]]:
    """``"a:i64 | b:str"`` -> ``[("a", "i64"), ("b", "str")]``, checked against the class's attributes."""
    fields = [tuple(item.strip().split(":")) for item in layout.split("|")] if layout else []
    names = [attribute.name for attribute in attrs.fields(cls)]  # type: ignore[arg-type]
    if [field[0] for field in fields] != names or any(
            len(field) != 2 or (field[1] not in _FIXED_CODES and field[1] not in _VARIABLE) for field in fields):
        raise InternalError(f"the wire layout of {cls.__name__} ({layout!r}) does not match its fields {names}")
    return fields  # type: ignore[return-value]


@attrs.frozen
class _FixedRun:
    """Consecutive fixed-size fields, packed and unpacked by one ``struct``."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    struct: struct.Struct
    plain: bool  # every field is an int that goes on the wire as it is


def _compile(fields: list[tuple[str, str]]) -> list[_FixedRun | tuple[str, str]]:
    """Group a layout into steps: runs of fixed fields (one ``struct`` each) and single str/blob fields."""
    steps: list[_FixedRun | tuple[str, str]] = []
    run: list[tuple[str, str]] = []

    def close_run() -> None:
        if run:
            kinds = tuple(kind for _, kind in run)
            steps.append(_FixedRun(tuple(name for name, _ in run), kinds,
                                   struct.Struct(">" + "".join(_FIXED_CODES[kind] for kind in kinds)),
                                   all(kind in ("i32", "i64") for kind in kinds)))
            run.clear()

    for name, kind in fields:
        if kind in _VARIABLE:
            close_run()
            steps.append((name, kind))
        else:
            run.append((name, kind))
    close_run()
    return steps


# --- Field helpers ---------------------------------------------------------------------------------


def _uuid(raw: bytes, cache: _UuidCache) -> UUID:
    writer_id = cache.get(raw)
    if writer_id is None:
        if len(cache) >= _UUID_CACHE_SIZE_MAX:
            cache.clear()
        writer_id = cache[raw] = UUID(bytes=raw)
    return writer_id


def _bool(raw: int) -> bool:
    if raw == 1:
        return True
    if raw == 0:
        return False
    raise MalformedFrameError(f"a bool must be 0 or 1, not {raw}")


_BOOL_BYTE: Final = {True: 1, False: 0}  # a KeyError for anything else (caught by ``encode``)


def _read_string(frame: memoryview, position: int) -> tuple[str, int]:
    (length,) = _U16.unpack_from(frame, position)
    position += 2
    end = position + length
    if end > len(frame):
        raise MalformedFrameError(f"a {length}-byte string runs past the end of its frame")
    try:
        return str(frame[position:end], "utf-8"), end
    except UnicodeDecodeError as error:
        raise MalformedFrameError(f"a string is not valid UTF-8: {error}") from None


def _read_blob(frame: memoryview, position: int) -> tuple[bytes, int]:
    (length,) = _U32.unpack_from(frame, position)
    position += 4
    end = position + length
    if end > len(frame):
        raise MalformedFrameError(f"a {length}-byte blob runs past the end of its frame")
    return bytes(frame[position:end]), end


def _encode_string(value: str) -> bytes:
    if type(value) is not str:
        raise TypeError(f"a str field holds {type(value).__name__}")
    encoded = value.encode("utf-8")  # UnicodeEncodeError for a lone surrogate
    if len(encoded) > STRING_LENGTH_MAX:
        raise InvalidCommandError(f"a string of {len(encoded)} UTF-8 bytes exceeds {STRING_LENGTH_MAX}")
    return _U16.pack(len(encoded)) + encoded


def _byte_length(data: bytes | bytearray | memoryview) -> int:
    """The length in bytes of a bytes-like object (``len`` counts items, which differ for e.g. an array)."""
    if type(data) is bytes or type(data) is bytearray:
        return len(data)
    return memoryview(data).nbytes  # TypeError for a non-buffer


def _frame_length(command: Command, length: int) -> int:
    if length > FRAME_BYTES_MAX:
        raise CommandTooLargeError(f"{type(command).__name__} needs a frame of {length} bytes; "
                                 f"the limit is {FRAME_BYTES_MAX}")
    return length


# --- Table-driven codecs ---------------------------------------------------------------------------


def _table_decoder(cls: type[Command], steps: list[_FixedRun | tuple[str, str]]) -> _Decode:
    def decode(frame: memoryview, cache: _UuidCache) -> Command:
        values: list[object] = []
        position = 0
        for step in steps:
            if isinstance(step, _FixedRun):
                raw = step.struct.unpack_from(frame, position)
                position += step.struct.size
                if step.plain:
                    values.extend(raw)
                    continue
                index = 0
                for kind in step.kinds:
                    value = raw[index]
                    index += 1
                    if kind == "uuid":
                        values.append(_uuid(value, cache))
                    elif kind == "bool":
                        values.append(_bool(value))
                    elif kind == "u128":
                        values.append(value << 64 | raw[index])
                        index += 1
                    else:
                        values.append(value)
            elif step[1] == "str":
                text, position = _read_string(frame, position)
                values.append(text)
            else:
                blob, position = _read_blob(frame, position)
                values.append(blob)
        if position != len(frame):
            raise MalformedFrameError(f"{len(frame) - position} bytes left after the fields of {cls.__name__}")
        return cls(*values)

    return decode


def _table_encoder(cls: type[Command], steps: list[_FixedRun | tuple[str, str]]) -> _Encode:
    type_code = cls.TYPE

    def encode(command: Command) -> bytes:
        parts: list[bytes] = [b""]
        length = 0
        for step in steps:
            if isinstance(step, _FixedRun):
                values: list[object] = []
                for name, kind in zip(step.names, step.kinds, strict=True):
                    value = getattr(command, name)
                    if kind == "uuid":
                        if type(value) is not UUID:
                            raise TypeError(f"{name} must be a UUID, not {type(value).__name__}")
                        values.append(value.bytes)
                    elif kind == "bool":
                        values.append(_BOOL_BYTE[value])
                    elif kind == "u128":
                        if type(value) is not int or not 0 <= value >> 64 <= _U64_MASK:
                            raise InvalidCommandError(f"{name} must be an unsigned 128-bit int, not {value!r}")
                        values.extend((value >> 64, value & _U64_MASK))
                    else:
                        values.append(value)
                part = step.struct.pack(*values)
            else:
                name, kind = step
                value = getattr(command, name)
                if kind == "str":
                    part = _encode_string(value)
                else:
                    data_length = _byte_length(value)
                    parts.append(_U32.pack(data_length))
                    length += 4 + data_length
                    parts.append(value)
                    continue
            parts.append(part)
            length += len(part)
        parts[0] = _HEADER.pack(type_code, _frame_length(command, length))
        return b"".join(parts)

    return encode


# --- Hand-written codecs for the hot commands ------------------------------------------------------
# Each is checked against the table-driven codec of the same command by the tests.

_APPEND_BLOCK_FIXED = struct.Struct(">16sqiqI")
_APPEND_BLOCK_HEADER = struct.Struct(">ii16sqiqI")  # frame header + the fixed fields and the data length


def _decode_append_block(frame: memoryview, cache: _UuidCache) -> Command:
    writer_id, last_event_number, event_count, request_id, length = _APPEND_BLOCK_FIXED.unpack_from(frame)
    if length != len(frame) - _APPEND_BLOCK_FIXED.size:
        raise MalformedFrameError(f"AppendBlock announces {length} bytes of data in a frame with room for "
                                  f"{len(frame) - _APPEND_BLOCK_FIXED.size}")
    return AppendBlock(_uuid(writer_id, cache), last_event_number, event_count, request_id,
                       bytes(frame[_APPEND_BLOCK_FIXED.size:]))


def _append_block_header(command: AppendBlock) -> bytes:
    length = _byte_length(command.data)
    return _APPEND_BLOCK_HEADER.pack(
        AppendBlock.TYPE, _frame_length(command, _APPEND_BLOCK_FIXED.size + length), command.writer_id.bytes,
        command.last_event_number, command.event_count, command.request_id, length)


def _encode_append_block(command: Command) -> bytes:
    assert type(command) is AppendBlock
    return _append_block_header(command) + command.data


_DATA_APPENDED_FIXED = struct.Struct(">q16sqqq")
_DATA_APPENDED_FRAME = struct.Struct(">iiq16sqqq")


def _decode_data_appended(frame: memoryview, cache: _UuidCache) -> Command:
    if len(frame) != _DATA_APPENDED_FIXED.size:
        raise MalformedFrameError(f"DataAppended has {_DATA_APPENDED_FIXED.size} bytes of fields, not {len(frame)}")
    request_id, writer_id, event_number, previous_event_number, write_offset = _DATA_APPENDED_FIXED.unpack_from(frame)
    return DataAppended(request_id, _uuid(writer_id, cache), event_number, previous_event_number, write_offset)


def _encode_data_appended(command: Command) -> bytes:
    assert type(command) is DataAppended
    return _DATA_APPENDED_FRAME.pack(
        DataAppended.TYPE, _DATA_APPENDED_FIXED.size, command.request_id, command.writer_id.bytes,
        command.event_number, command.previous_event_number, command.current_segment_write_offset)


_REQUEST_ID = struct.Struct(">q")
_SEGMENT_READ_REST = struct.Struct(">qBBI")  # offset, at_tail, end_of_segment, data length
_SEGMENT_READ_HEAD = struct.Struct(">iiq")  # frame header + request id


def _decode_segment_read(frame: memoryview, cache: _UuidCache) -> Command:
    (request_id,) = _REQUEST_ID.unpack_from(frame)
    segment, position = _read_string(frame, _REQUEST_ID.size)
    offset, at_tail, end_of_segment, length = _SEGMENT_READ_REST.unpack_from(frame, position)
    position += _SEGMENT_READ_REST.size
    if length != len(frame) - position:
        raise MalformedFrameError(f"SegmentRead announces {length} bytes of data in a frame with room for "
                                  f"{len(frame) - position}")
    return SegmentRead(request_id, segment, offset, _bool(at_tail), _bool(end_of_segment), bytes(frame[position:]))


def _segment_read_header(command: SegmentRead) -> bytes:
    segment = _encode_string(command.segment)
    length = _byte_length(command.data)
    fields_length = _REQUEST_ID.size + len(segment) + _SEGMENT_READ_REST.size + length
    return (_SEGMENT_READ_HEAD.pack(SegmentRead.TYPE, _frame_length(command, fields_length), command.request_id)
            + segment + _SEGMENT_READ_REST.pack(command.offset, _BOOL_BYTE[command.at_tail],
                                                _BOOL_BYTE[command.end_of_segment], length))


def _encode_segment_read(command: Command) -> bytes:
    assert type(command) is SegmentRead
    return _segment_read_header(command) + command.data


#: Commands whose data is appended to ``encode_into``'s buffer straight from the command (no copy
#: into an intermediate ``bytes`` first): the header function, then the data.
_HEADERS: Final[dict[type[Command], Callable[[Command], bytes]]] = {
    AppendBlock: _append_block_header,  # type: ignore[dict-item]
    SegmentRead: _segment_read_header,  # type: ignore[dict-item]
}

_TABLE_DECODERS: Final[dict[type[Command], _Decode]] = {}
_TABLE_ENCODERS: Final[dict[type[Command], _Encode]] = {}
for _cls, _layout in _LAYOUTS.items():
    _steps = _compile(_parse_layout(_cls, _layout))
    _TABLE_DECODERS[_cls] = _table_decoder(_cls, _steps)
    _TABLE_ENCODERS[_cls] = _table_encoder(_cls, _steps)
del _cls, _layout, _steps
if set(_LAYOUTS) != set(_commands.COMMAND_TYPES.values()):
    raise InternalError("every command needs a wire layout, and every layout a command")

_HOT_DECODERS: Final[dict[type[Command], _Decode]] = {
    AppendBlock: _decode_append_block, DataAppended: _decode_data_appended, SegmentRead: _decode_segment_read}
_HOT_ENCODERS: Final[dict[type[Command], _Encode]] = {
    AppendBlock: _encode_append_block, DataAppended: _encode_data_appended, SegmentRead: _encode_segment_read}

#: Type code -> decoder, and command class -> encoder: the hot ones where they exist.
_DECODERS: Final[dict[int, _Decode]] = {
    cls.TYPE: _HOT_DECODERS.get(cls, decode) for cls, decode in _TABLE_DECODERS.items()}
_ENCODERS: Final[dict[type[Command], _Encode]] = {
    cls: _HOT_ENCODERS.get(cls, encode) for cls, encode in _TABLE_ENCODERS.items()}

# --- Lists of offsets (``EventBoundaries.offsets``) --------------------------------------------------

_OFFSET = struct.Struct(">q")


def encode_offsets(offsets: Sequence[int]) -> bytes:
    """``offsets`` as a blob: each a big-endian i64, in order.  Raises ``InvalidCommandError`` for an
    offset that is not a non-negative 64-bit int."""
    for offset in offsets:
        if type(offset) is not int or not 0 <= offset < 1 << 63:
            raise InvalidCommandError(f"an offset is a non-negative 64-bit int, not {offset!r}")
    return struct.pack(f">{len(offsets)}q", *offsets)


def decode_offsets(blob: bytes) -> tuple[int, ...]:
    """The offsets of an ``encode_offsets`` blob, checked: a whole number of i64s, non-negative and
    ascending.  Raises ``MalformedFrameError`` otherwise (the peer sent it)."""
    if len(blob) % _OFFSET.size:
        raise MalformedFrameError(f"a list of offsets is a multiple of {_OFFSET.size} bytes long, not {len(blob)}")
    offsets = struct.unpack(f">{len(blob) // _OFFSET.size}q", blob)
    if any(offset < 0 for offset in offsets) or any(b <= a for a, b in itertools.pairwise(offsets)):
        raise MalformedFrameError("a list of offsets must be non-negative and strictly ascending")
    return offsets


#: What a faulty encoder call raises from inside: a field of the wrong type or out of range.
_ENCODING_FAILURES = (struct.error, TypeError, AttributeError, KeyError, UnicodeEncodeError, OverflowError)


# --- Encoding --------------------------------------------------------------------------------------


def encode(command: Command) -> bytes:
    """One frame holding ``command``.

    Raises ``InvalidCommandError`` if ``command`` is not a command or a field does not fit its wire
    type, and ``CommandTooLargeError`` if the frame would exceed ``FRAME_BYTES_MAX``."""
    try:
        encoder = _ENCODERS[type(command)]
    except KeyError:
        raise InvalidCommandError(f"not a wire command: {type(command).__name__}") from None
    try:
        return encoder(command)
    except _ENCODING_FAILURES as error:
        raise InvalidCommandError(f"cannot encode {type(command).__name__}: {error!r}") from error


def encode_into(buffer: bytearray, command: Command) -> int:
    """Append the frame holding ``command`` to ``buffer``; return its length.  A block's or a read's
    data is copied once, straight into ``buffer``.  On an error (as for ``encode``) ``buffer`` is
    left as it was."""
    header = _HEADERS.get(type(command))
    if header is None:
        frame = encode(command)
        buffer += frame
        return len(frame)
    try:
        head = header(command)
        data = command.data  # type: ignore[attr-defined]
    except _ENCODING_FAILURES as error:
        raise InvalidCommandError(f"cannot encode {type(command).__name__}: {error!r}") from error
    buffer += head
    buffer += data
    return len(head) + _byte_length(data)


# --- Decoding --------------------------------------------------------------------------------------


def _reject_header(type_code: int, length: int, length_max: int = FRAME_BYTES_MAX) -> None:
    """Raise the error a bad frame header deserves (``Decoder`` calls this only for a bad one)."""
    refusal = _header_refusal(type_code, length)
    if refusal is UnknownCommandError:
        raise UnknownCommandError(f"unknown command type {type_code}")
    if refusal is MalformedFrameError:
        raise MalformedFrameError(f"a frame of type {type_code} announces a negative length ({length})")
    if length > FRAME_BYTES_MAX:
        raise FrameTooLargeError(f"a frame of type {type_code} announces {length} bytes; "
                                 f"the limit is {FRAME_BYTES_MAX}")
    raise FrameTooLargeError(f"a frame of type {type_code} announces {length} bytes; the limit on this "
                             f"connection (not authenticated yet) is {length_max}")


def _header_refusal(type_code: int, length: int) -> type[WireProtocolError]:
    """The class of error a bad frame header deserves: an unknown type first, then a negative length
    (malformed), else too large.  Formats no message, so CrossHair checks it over all paths."""
    if type_code not in _DECODERS:
        return UnknownCommandError
    if length < 0:
        return MalformedFrameError
    return FrameTooLargeError


class Decoder:
    """Turns the bytes of one connection, fed in pieces of any size, into commands.

    Holds the bytes of at most one unfinished frame (``pending_bytes`` < 8 + ``frame_bytes_max``).
    ``frame_bytes_max`` (at most, and by default, ``FRAME_BYTES_MAX``) is the longest frame it
    accepts; a server lowers it for a connection that has not authenticated yet, and raises it
    afterwards.  After any ``WireProtocolError`` it is poisoned: ``error`` holds the error and every
    later ``feed`` raises it again.  The server then closes the connection."""

    __slots__ = ("_buffer", "_error", "_frame_length_max", "_uuids")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._buffer = bytearray()  # the start of one unfinished frame (its header already checked if whole)
        self._error: WireProtocolError | None = None
        self._uuids: _UuidCache = {}
        self._frame_length_max = FRAME_BYTES_MAX
        self.frame_bytes_max = frame_bytes_max

    @property
    def frame_bytes_max(self) -> int:
        """The longest frame (fields, without the header) this decoder accepts."""
        return self._frame_length_max

    @frame_bytes_max.setter
    def frame_bytes_max(self, value: int) -> None:
        """Raises ``InvalidArgumentError`` unless 0 <= ``value`` <= ``FRAME_BYTES_MAX``, or if a frame
        already buffered is longer than ``value`` allows."""
        if type(value) is not int or not 0 <= value <= FRAME_BYTES_MAX:
            raise InvalidArgumentError(f"frame_bytes_max must be an int in [0, {FRAME_BYTES_MAX}], not {value!r}")
        pending = self.pending_frame_length
        if pending is not None and pending - FRAME_HEADER_LENGTH > value:
            raise InvalidArgumentError(f"a frame of {pending} bytes is being received; it exceeds {value}")
        self._frame_length_max = value

    @property
    def pending_frame_length(self) -> int | None:
        """The whole length (header included) of the unfinished frame, once its header is buffered
        (and checked); else None."""
        if len(self._buffer) < FRAME_HEADER_LENGTH:
            return None
        return FRAME_HEADER_LENGTH + _HEADER.unpack_from(self._buffer)[1]  # type: ignore[no-any-return]

    def take_pending(self) -> bytearray:
        """Hand over the buffered start of the unfinished frame (whose header is buffered and checked)
        and forget it: the decoder is between frames again, and the caller gathers the rest of that
        frame itself and feeds it back whole.  (The server does this for large frames, which it
        receives into buffers of their own.)  Raises ``InvalidArgumentError`` if no whole header is
        buffered."""
        if self._error is not None or len(self._buffer) < FRAME_HEADER_LENGTH:
            raise InvalidArgumentError("no frame header is buffered")
        taken, self._buffer = self._buffer, bytearray()
        return taken

    @property
    def error(self) -> WireProtocolError | None:
        """The error that poisoned this decoder, or None."""
        return self._error

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished frame held until the rest arrives (non-zero at end of stream: the
        peer hung up mid-frame)."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Command]:
        """Every command completed by ``data``, in order.  ``data`` is not kept (copy what you need
        and reuse your buffer).  Raises a ``WireProtocolError`` for malformed input (and poisons the
        decoder); ``InvalidArgumentError`` if ``data`` is not bytes-like (the decoder is unchanged)."""
        if self._error is not None:
            raise self._error
        try:
            view = memoryview(data)
            if view.itemsize != 1 or view.ndim != 1:
                view = view.cast("B")
        except TypeError as error:
            raise InvalidArgumentError(f"feed takes a contiguous bytes-like object, not {type(data).__name__}") \
                from error
        try:
            return self._feed(view)
        except WireProtocolError as error:
            self._poison(error)
            raise
        except struct.error as error:  # a fixed field runs past the end of its frame
            malformed = MalformedFrameError(f"a frame ends inside its fields: {error}")
            self._poison(malformed)
            raise malformed from None

    def _poison(self, error: WireProtocolError) -> None:
        self._error = error
        self._buffer = bytearray()

    def _feed(self, view: memoryview) -> list[Command]:
        commands: list[Command] = []
        if self._buffer:
            view = self._finish_pending(view, commands)
        header = _HEADER.unpack_from
        decoders = _DECODERS
        uuids = self._uuids
        length_max = self._frame_length_max
        position = 0
        size = len(view)
        while size - position >= FRAME_HEADER_LENGTH:
            type_code, length = header(view, position)
            decode = decoders.get(type_code)
            if decode is None or length < 0 or length > length_max:
                _reject_header(type_code, length, length_max)
            end = position + FRAME_HEADER_LENGTH + length
            if end > size:
                break
            commands.append(decode(view[position + FRAME_HEADER_LENGTH:end], uuids))  # type: ignore[misc]
            position = end
        if position < size:
            self._buffer = bytearray(view[position:])
        return commands

    def _finish_pending(self, view: memoryview, commands: list[Command]) -> memoryview:
        """Complete the buffered frame from the front of ``view`` (decoding it into ``commands`` if it
        is now whole); return what is left of ``view``."""
        buffer = self._buffer
        if len(buffer) < FRAME_HEADER_LENGTH:
            taken = FRAME_HEADER_LENGTH - len(buffer)
            buffer += view[:taken]
            view = view[taken:]
            if len(buffer) < FRAME_HEADER_LENGTH:
                return view
            type_code, length = _HEADER.unpack_from(buffer)
            if type_code not in _DECODERS or length < 0 or length > self._frame_length_max:
                _reject_header(type_code, length, self._frame_length_max)
        type_code, length = _HEADER.unpack_from(buffer)
        taken = FRAME_HEADER_LENGTH + length - len(buffer)
        buffer += view[:taken]
        view = view[taken:]
        if len(buffer) == FRAME_HEADER_LENGTH + length:
            self._buffer = bytearray()  # (the old one is viewed below: never resize it again)
            commands.append(_DECODERS[type_code](memoryview(buffer)[FRAME_HEADER_LENGTH:], self._uuids))
        return view

    def check_invariants(self) -> None:
        """The buffer holds less than one frame, and a whole header in it was checked."""
        assert 0 <= self._frame_length_max <= FRAME_BYTES_MAX
        assert len(self._buffer) < FRAME_HEADER_LENGTH + self._frame_length_max, len(self._buffer)
        if self._error is not None:
            assert not self._buffer
        if len(self._buffer) >= FRAME_HEADER_LENGTH:
            type_code, length = _HEADER.unpack_from(self._buffer)
            assert type_code in _DECODERS and 0 <= length <= self._frame_length_max, (type_code, length)
            assert len(self._buffer) < FRAME_HEADER_LENGTH + length


# --- Events inside append data ---------------------------------------------------------------------


def encode_event(payload: bytes | bytearray | memoryview) -> bytes:
    """One framed event (``type:i32 = 0 | length:i32 | payload``), ready to add to a block.

    Raises ``CommandTooLargeError`` if the framed event could not fit in a frame, and
    ``InvalidArgumentError`` if ``payload`` is not bytes-like."""
    try:
        length = _byte_length(payload)
    except TypeError:
        raise InvalidArgumentError(f"an event payload is bytes-like, not {type(payload).__name__}") from None
    if length > FRAME_BYTES_MAX - EVENT_HEADER_LENGTH:
        raise CommandTooLargeError(f"an event of {length} bytes does not fit in a frame ({FRAME_BYTES_MAX} bytes)")
    return _HEADER.pack(_EVENT_TYPE, length) + payload


def _event_view(data: bytes | bytearray | memoryview) -> memoryview:
    try:
        view = memoryview(data)
        return view.cast("B") if view.itemsize != 1 or view.ndim != 1 else view
    except TypeError:
        raise InvalidArgumentError(f"append data is bytes-like, not {type(data).__name__}") from None


def _next_event(view: memoryview, position: int) -> int:
    """The end of the framed event at ``position``; raises ``MalformedEventError`` if it is not one."""
    if len(view) - position < EVENT_HEADER_LENGTH:
        raise MalformedEventError(f"{len(view) - position} bytes at offset {position} are too few for an event header")
    type_code, length = _HEADER.unpack_from(view, position)
    if type_code != _EVENT_TYPE:
        raise MalformedEventError(f"an event at offset {position} has type {type_code}, not {_EVENT_TYPE}")
    end: int = position + EVENT_HEADER_LENGTH + length
    if length < 0 or end > len(view):
        raise MalformedEventError(f"an event at offset {position} announces {length} bytes; "
                                  f"{len(view) - position - EVENT_HEADER_LENGTH} follow")
    return end


def iter_events(data: bytes | bytearray | memoryview) -> Iterator[bytes]:
    """The payloads of the framed events in ``data``, in order.  Raises ``MalformedEventError`` when it
    reaches something that is not a whole event (after yielding the events before it): use
    ``count_events`` first to check a block before acting on any of it."""
    view = _event_view(data)
    position = 0
    while position < len(view):
        end = _next_event(view, position)
        yield bytes(view[position + EVENT_HEADER_LENGTH:end])
        position = end


def count_events(data: bytes | bytearray | memoryview) -> int:
    """How many whole framed events ``data`` holds, without copying them.  Raises
    ``MalformedEventError`` unless ``data`` is exactly a sequence of whole events."""
    view = _event_view(data)
    count = position = 0
    while position < len(view):
        position = _next_event(view, position)
        count += 1
    return count
