"""The wire codec: every command round-trips, frames survive any split of the stream, the documented
byte layout is the real one, and bad input gets a typed error.

Theory of operation: one Hypothesis strategy per command, built from strategies for the wire types
(``STRATEGIES``; a test checks that every command class has one).  Round trips go through ``encode``
and a fresh ``Decoder``; stream tests encode many commands and feed the bytes back cut at drawn
points.  The layout itself is pinned twice: a few frames are compared with bytes written out by
hand, and the table in ``codec``'s docstring is compared with the table the codec is built from.
The fuzz tests (anything but a ``WireProtocolError`` is a bug) are in ``test_wire_fuzz.py``.
"""

from __future__ import annotations

import array
import inspect
import struct
import uuid

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream import errors, limits
from millstream.wire import codec, commands
from millstream.wire import commands as c
from millstream.wire.codec import (
    FRAME_BYTES_MAX,
    OLDEST_COMPATIBLE_VERSION,
    STRING_LENGTH_MAX,
    WIRE_VERSION,
    Decoder,
    FrameTooLargeError,
    IncompatibleVersionError,
    InvalidCommandError,
    MalformedEventError,
    MalformedFrameError,
    UnknownCommandError,
    WireProtocolError,
    count_events,
    decode_offsets,
    encode,
    encode_event,
    encode_into,
    encode_offsets,
    iter_events,
    negotiate,
)

# --- Field strategies ------------------------------------------------------------------------------

i32s = st.integers(-(2**31), 2**31 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
request_ids = i64s
offsets = st.one_of(st.integers(0, 2**40), i64s)
event_numbers = i64s
writer_ids = st.uuids()
segment_names = st.text(max_size=30)  # any Unicode (Hypothesis leaves out lone surrogates, as UTF-8 must)
tokens = st.text(max_size=20)
messages = st.text(max_size=60)
attribute_ids = st.integers(0, 2**128 - 1)
events = st.lists(st.binary(max_size=40), max_size=8).map(lambda payloads: b"".join(map(encode_event, payloads)))
blobs = st.one_of(st.binary(max_size=200), events)
versions = i32s

# --- One strategy per command ----------------------------------------------------------------------

STRATEGIES: dict[type[c.Command], st.SearchStrategy[c.Command]] = {
    c.Hello: st.builds(c.Hello, high_version=versions, low_version=versions),
    c.KeepAlive: st.builds(c.KeepAlive),
    c.SetupAppend: st.builds(c.SetupAppend, request_id=request_ids, writer_id=writer_ids, segment=segment_names,
                             token=tokens),
    c.AppendSetup: st.builds(c.AppendSetup, request_id=request_ids, segment=segment_names, writer_id=writer_ids,
                             last_event_number=event_numbers),
    c.AppendBlock: st.builds(c.AppendBlock, writer_id=writer_ids, last_event_number=event_numbers,
                             event_count=i32s, request_id=request_ids, data=blobs),
    c.AppendBlockEnd: st.builds(c.AppendBlockEnd, writer_id=writer_ids, size_of_whole_events=i32s, data=blobs,
                                event_count=i32s, last_event_number=event_numbers, request_id=request_ids),
    c.ConditionalAppend: st.builds(c.ConditionalAppend, writer_id=writer_ids, event_number=event_numbers,
                                   expected_offset=offsets, data=blobs, request_id=request_ids),
    c.AppendBlockPart: st.builds(c.AppendBlockPart, writer_id=writer_ids, data=blobs),
    c.DataAppended: st.builds(c.DataAppended, request_id=request_ids, writer_id=writer_ids, event_number=event_numbers,
                              previous_event_number=event_numbers, current_segment_write_offset=offsets),
    c.ConditionalCheckFailed: st.builds(c.ConditionalCheckFailed, request_id=request_ids, writer_id=writer_ids,
                                        event_number=event_numbers),
    c.ReadSegment: st.builds(c.ReadSegment, request_id=request_ids, segment=segment_names, offset=offsets,
                             suggested_length=i32s, token=tokens, wait_ms=i32s),
    c.SegmentRead: st.builds(c.SegmentRead, request_id=request_ids, segment=segment_names, offset=offsets,
                             at_tail=st.booleans(), end_of_segment=st.booleans(), data=blobs),
    c.GetSegmentInfo: st.builds(c.GetSegmentInfo, request_id=request_ids, segment=segment_names, token=tokens),
    c.SegmentInfo: st.builds(c.SegmentInfo, request_id=request_ids, segment=segment_names, exists=st.booleans(),
                             sealed=st.booleans(), deleted=st.booleans(), start_offset=offsets, length=offsets,
                             last_modified=i64s),
    c.GetEventBoundaries: st.builds(c.GetEventBoundaries, request_id=request_ids, segment=segment_names,
                                    start_offset=offsets, end_offset=offsets, token=tokens),
    c.EventBoundaries: st.builds(c.EventBoundaries, request_id=request_ids, segment=segment_names,
                                 offsets=st.lists(st.integers(0, 2**63 - 1), max_size=20, unique=True).map(
                                     lambda values: encode_offsets(sorted(values)))),
    c.CreateSegment: st.builds(c.CreateSegment, request_id=request_ids, segment=segment_names, token=tokens),
    c.SegmentCreated: st.builds(c.SegmentCreated, request_id=request_ids, segment=segment_names),
    c.SealSegment: st.builds(c.SealSegment, request_id=request_ids, segment=segment_names, token=tokens),
    c.SegmentSealed: st.builds(c.SegmentSealed, request_id=request_ids, segment=segment_names),
    c.DeleteSegment: st.builds(c.DeleteSegment, request_id=request_ids, segment=segment_names, token=tokens),
    c.SegmentDeleted: st.builds(c.SegmentDeleted, request_id=request_ids, segment=segment_names),
    c.GetSegmentAttribute: st.builds(c.GetSegmentAttribute, request_id=request_ids, segment=segment_names,
                                     attribute_id=attribute_ids, token=tokens),
    c.SegmentAttribute: st.builds(c.SegmentAttribute, request_id=request_ids, value=i64s),
    c.UpdateSegmentAttribute: st.builds(c.UpdateSegmentAttribute, request_id=request_ids, segment=segment_names,
                                        attribute_id=attribute_ids, new_value=i64s, expected_value=i64s,
                                        token=tokens),
    c.SegmentAttributeUpdated: st.builds(c.SegmentAttributeUpdated, request_id=request_ids, success=st.booleans()),
    c.TruncateSegment: st.builds(c.TruncateSegment, request_id=request_ids, segment=segment_names, offset=offsets,
                                 token=tokens),
    c.SegmentTruncated: st.builds(c.SegmentTruncated, request_id=request_ids, segment=segment_names),
    c.WrongHost: st.builds(c.WrongHost, request_id=request_ids, segment=segment_names, correct_host=messages),
    c.SegmentIsSealed: st.builds(c.SegmentIsSealed, request_id=request_ids, segment=segment_names, offset=offsets),
    c.SegmentAlreadyExists: st.builds(c.SegmentAlreadyExists, request_id=request_ids, segment=segment_names),
    c.NoSuchSegment: st.builds(c.NoSuchSegment, request_id=request_ids, segment=segment_names),
    c.InvalidEventNumber: st.builds(c.InvalidEventNumber, request_id=request_ids, writer_id=writer_ids,
                                    event_number=event_numbers),
    c.SegmentIsTruncated: st.builds(c.SegmentIsTruncated, request_id=request_ids, segment=segment_names,
                                    start_offset=offsets),
    c.OperationUnsupported: st.builds(c.OperationUnsupported, request_id=request_ids, operation=messages),
    c.MergeSegments: st.builds(c.MergeSegments, request_id=request_ids, target=segment_names, source=segment_names,
                               token=tokens),
    c.SegmentsMerged: st.builds(c.SegmentsMerged, request_id=request_ids, target=segment_names,
                                source=segment_names, new_target_length=offsets),
    c.AuthTokenCheckFailed: st.builds(c.AuthTokenCheckFailed, request_id=request_ids, reason=messages),
    c.ErrorMessage: st.builds(c.ErrorMessage, request_id=request_ids, segment=segment_names, error_code=i32s,
                              message=messages),
    c.ControllerRequest: st.builds(c.ControllerRequest, request_id=request_ids, method=messages, body=blobs),
    c.ControllerReply: st.builds(c.ControllerReply, request_id=request_ids, body=blobs),
    c.CreateTransientSegment: st.builds(c.CreateTransientSegment, request_id=request_ids, writer_id=writer_ids,
                                        parent=segment_names, token=tokens),
    c.ConditionalBlockEnd: st.builds(c.ConditionalBlockEnd, writer_id=writer_ids, event_number=event_numbers,
                                     expected_offset=offsets, data=st.binary(max_size=200), request_id=request_ids),
}

#: Any command.
any_command = st.one_of(*STRATEGIES.values())
HOT = (c.AppendBlock, c.DataAppended, c.SegmentRead)


def defined_command_classes() -> set[type[c.Command]]:
    """Every command class in ``millstream.wire.commands``, found by looking rather than by a list."""
    return {value for _, value in inspect.getmembers(commands, inspect.isclass)
            if issubclass(value, c.Command) and value is not c.Command}


def decode_all(data: bytes) -> list[c.Command]:
    decoder = Decoder()
    result = decoder.feed(data)
    assert decoder.pending_bytes == 0
    decoder.check_invariants()
    return result


# --- Coverage of the command set -------------------------------------------------------------------


def test_every_command_class_has_a_strategy_and_a_unique_type_code() -> None:
    classes = defined_command_classes()
    assert set(STRATEGIES) == classes
    assert set(commands.COMMAND_TYPES.values()) == classes
    assert len({cls.TYPE for cls in classes}) == len(classes)
    assert all(commands.COMMAND_TYPES[cls.TYPE] is cls for cls in classes)


def test_commands_are_frozen_slotted_values() -> None:
    for cls in defined_command_classes():
        assert attrs.has(cls) and "__dict__" not in dir(cls), cls
    command = c.SegmentSealed(1, "s")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        command.segment = "t"  # type: ignore[misc]


def test_pravega_type_codes_where_pravega_has_the_command() -> None:
    """pravega-behaviour.md section 9: the codes we reuse keep Pravega's numbers."""
    pravega = {c.Hello: -127, c.SetupAppend: 1, c.AppendSetup: 2, c.AppendBlock: 3, c.AppendBlockEnd: 4,
               c.ConditionalAppend: 5, c.DataAppended: 7, c.ConditionalCheckFailed: 8, c.ReadSegment: 9,
               c.SegmentRead: 10, c.GetSegmentInfo: 11, c.SegmentInfo: 12, c.CreateSegment: 20,
               c.SegmentCreated: 21, c.SealSegment: 28, c.SegmentSealed: 29, c.DeleteSegment: 30,
               c.SegmentDeleted: 31, c.TruncateSegment: 38, c.SegmentTruncated: 39, c.WrongHost: 50,
               c.SegmentIsSealed: 51, c.SegmentAlreadyExists: 52, c.NoSuchSegment: 53, c.InvalidEventNumber: 55,
               c.SegmentIsTruncated: 56, c.OperationUnsupported: 57, c.MergeSegments: 58, c.SegmentsMerged: 59,
               c.AuthTokenCheckFailed: 60, c.ErrorMessage: 61, c.KeepAlive: 100, c.CreateTransientSegment: 40,
               c.ConditionalBlockEnd: 89}
    assert {cls: cls.TYPE for cls in pravega} == pravega
    attribute_codes = {cls.TYPE for cls in (c.GetSegmentAttribute, c.SegmentAttribute, c.UpdateSegmentAttribute,
                                            c.SegmentAttributeUpdated)}
    assert attribute_codes == {34, 35, 36, 37}


# --- Round trips -----------------------------------------------------------------------------------


@given(any_command)
def test_round_trip(command: c.Command) -> None:
    frame = encode(command)
    assert decode_all(frame) == [command]
    buffer = bytearray(b"prefix")
    assert encode_into(buffer, command) == len(frame)
    assert buffer == b"prefix" + frame


@pytest.mark.parametrize("cls", HOT, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_hand_written_codecs_agree_with_the_layout_table(cls: type[c.Command], data: st.DataObject) -> None:
    command = data.draw(STRATEGIES[cls])
    frame = encode(command)
    assert frame == codec._TABLE_ENCODERS[cls](command)
    fields = memoryview(frame)[codec.FRAME_HEADER_LENGTH:]
    assert codec._TABLE_DECODERS[cls](fields, {}) == command == codec._DECODERS[cls.TYPE](fields, {})


@given(st.lists(any_command, max_size=25), st.data())
def test_a_stream_cut_anywhere_decodes_to_the_same_commands(sent: list[c.Command], data: st.DataObject) -> None:
    stream = b"".join(map(encode, sent))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = Decoder()
    received: list[c.Command] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += decoder.feed(stream[start:end])
        decoder.check_invariants()
    assert received == sent
    assert decoder.pending_bytes == 0


@settings(max_examples=20)
@given(st.lists(any_command, min_size=1, max_size=6))
def test_a_stream_fed_byte_by_byte(sent: list[c.Command]) -> None:
    stream = b"".join(map(encode, sent))
    decoder = Decoder()
    received: list[c.Command] = []
    for index in range(len(stream)):
        received += decoder.feed(stream[index:index + 1])
        decoder.check_invariants()
        assert decoder.pending_bytes <= max(map(len, map(encode, sent)))
    assert received == sent


def test_feed_takes_any_bytes_like_object_and_keeps_none_of_it() -> None:
    command = c.SegmentRead(7, "s", 0, True, False, b"abcdef")
    frame = bytearray(encode(command))
    decoder = Decoder()
    assert decoder.feed(memoryview(frame)[:5]) == []
    result = decoder.feed(frame[5:])
    frame[-6:] = b"XXXXXX"  # the caller reuses its buffer: the command must not change
    assert result == [command] and type(result[0].data) is bytes  # type: ignore[attr-defined]
    items = array.array("B", encode(c.KeepAlive()))
    assert decoder.feed(memoryview(items).cast("B").cast("c")) == [c.KeepAlive()]


def test_feed_refuses_a_non_bytes_argument_without_poisoning() -> None:
    decoder = Decoder()
    with pytest.raises(errors.InvalidArgumentError):
        decoder.feed("text")  # type: ignore[arg-type]
    assert decoder.error is None and decoder.feed(encode(c.KeepAlive())) == [c.KeepAlive()]


def test_encoding_accepts_any_bytes_like_data() -> None:
    writer = uuid.UUID(int=5)
    data = array.array("I", [1, 2])  # 8 bytes in 2 items: the length on the wire counts bytes
    for value in (bytearray(b"12345678"), memoryview(b"12345678"), data):
        command = c.AppendBlockPart(writer, value)  # type: ignore[arg-type]
        assert decode_all(encode(command)) == [c.AppendBlockPart(writer, bytes(value))]
        block = c.AppendBlock(writer, 1, 1, 2, value)  # type: ignore[arg-type]
        assert decode_all(encode(block)) == [c.AppendBlock(writer, 1, 1, 2, bytes(value))]
        buffer = bytearray()
        encode_into(buffer, block)
        assert buffer == encode(block)


def test_longest_string_round_trips() -> None:
    longest = "é" * (STRING_LENGTH_MAX // 2) + "x"  # 65,535 UTF-8 bytes
    command = c.ErrorMessage(1, longest, 2, "")
    assert decode_all(encode(command)) == [command]


def test_writer_ids_are_cached_within_bounds() -> None:
    decoder = Decoder()
    writers = [uuid.UUID(int=index) for index in range(codec._UUID_CACHE_SIZE_MAX + 10)]
    sent = [c.DataAppended(1, writer, 2, 1, 3) for writer in writers + writers[:3]]
    assert decoder.feed(b"".join(map(encode, sent))) == sent
    assert len(decoder._uuids) <= codec._UUID_CACHE_SIZE_MAX


# --- The documented layout -------------------------------------------------------------------------

WRITER = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")


def frame_bytes(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text.replace(" ", "").replace("\n", ""))


@pytest.mark.parametrize(("command", "expected"), [
    (c.KeepAlive(), "00000064 00000000"),
    (c.Hello(1, 1), "ffffff81 00000008 00000001 00000001"),
    (c.DataAppended(request_id=1, writer_id=WRITER, event_number=5, previous_event_number=-1,
                    current_segment_write_offset=300),
     "00000007 00000030 0000000000000001 00112233445566778899aabbccddeeff 0000000000000005 ffffffffffffffff"
     " 000000000000012c"),
    (c.SegmentRead(request_id=2, segment="s/é", offset=16, at_tail=True, end_of_segment=False, data=b"\x01\x02"),
     "0000000a 0000001e 0000000000000002 0004 732fc3a9 0000000000000010 01 00 00000002 0102"),
    (c.AppendBlock(writer_id=WRITER, last_event_number=9, event_count=2, request_id=3,
                   data=encode_event(b"a") + encode_event(b"")),
     "00000003 00000039 00112233445566778899aabbccddeeff 0000000000000009 00000002 0000000000000003 00000011"
     " 00000000 00000001 61 00000000 00000000"),
    (c.UpdateSegmentAttribute(request_id=4, segment="a", attribute_id=(1 << 64) | 2, new_value=7,
                              expected_value=-(2**63), token=""),
     "00000024 0000002d 0000000000000004 0001 61 0000000000000001 0000000000000002 0000000000000007"
     " 8000000000000000 0000"),
])
def test_layout_spot_checks(command: c.Command, expected: str) -> None:
    assert encode(command).hex(" ", 4) == frame_bytes(expected).hex(" ", 4)
    assert decode_all(frame_bytes(expected)) == [command]


def render_layout_table(width: int = 118) -> str:
    """The codec's own layout table, rendered as the module docstring shows it."""
    lines = ["     type  command                   fields"]
    for cls, layout in codec._LAYOUTS.items():
        prefix = f"    {cls.TYPE:>5}  {cls.__name__:<26}"
        fields = layout.split(" | ") if layout else ["(none)"]
        line = prefix + fields[0]
        for field in fields[1:]:
            if len(line) + 3 + len(field) > width:
                lines.append(line)
                line = " " * len(prefix) + "| " + field
            else:
                line += " | " + field
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_docstring_shows_the_layout_the_codec_uses() -> None:
    assert codec.__doc__ is not None
    table = render_layout_table()
    assert table in codec.__doc__, "regenerate the table in codec's docstring:\n" + table
    assert set(codec._LAYOUTS) == defined_command_classes()


# --- Malformed frames ------------------------------------------------------------------------------


def header(type_code: int, length: int) -> bytes:
    return struct.pack(">ii", type_code, length)


@pytest.mark.parametrize(("frame", "error"), [
    (header(c.SegmentAttributeUpdated.TYPE, 9) + bytes(8) + b"\x02", MalformedFrameError),  # bool 2
    (header(c.SegmentCreated.TYPE, 12) + bytes(8) + b"\x00\x02\xc3\x28", MalformedFrameError),  # not UTF-8
    (header(c.SegmentCreated.TYPE, 12) + bytes(8) + b"\x00\x02\xed\xa0", MalformedFrameError),  # surrogate
    (header(c.SegmentCreated.TYPE, 11) + bytes(8) + b"\x00\x05a", MalformedFrameError),  # string past the end
    (header(c.SegmentCreated.TYPE, 12) + bytes(8) + b"\x00\x01ab", MalformedFrameError),  # trailing byte
    (header(c.KeepAlive.TYPE, 1) + b"\x00", MalformedFrameError),  # trailing byte
    (header(c.DataAppended.TYPE, 47) + bytes(47), MalformedFrameError),  # short fixed fields (hot)
    (header(c.DataAppended.TYPE, 49) + bytes(49), MalformedFrameError),
    (header(c.SegmentAttribute.TYPE, 15) + bytes(15), MalformedFrameError),  # short fixed fields (table)
    (header(c.AppendBlock.TYPE, 40) + bytes(36) + b"\x00\x00\x00\x05", MalformedFrameError),  # blob past the end
    (header(c.AppendBlock.TYPE, 41) + bytes(36) + b"\x00\x00\x00\x00" + b"x", MalformedFrameError),  # trailing
    (header(c.AppendBlockPart.TYPE, 21) + bytes(16) + b"\x00\x00\x00\x02" + b"x", MalformedFrameError),
    (header(c.SegmentRead.TYPE, 24) + bytes(10) + b"\x00" * 8 + b"\x00\x03" + bytes(4), MalformedFrameError),
    (header(c.Hello.TYPE, -1), MalformedFrameError),  # negative length
    (header(c.Hello.TYPE, FRAME_BYTES_MAX + 1), FrameTooLargeError),
    (header(12345, 0), UnknownCommandError),
    (header(0, 0), UnknownCommandError),  # an event's type is not a command
])
def test_malformed_frames_are_rejected_and_poison_the_decoder(frame: bytes, error: type[Exception]) -> None:
    decoder = Decoder()
    with pytest.raises(error) as raised:
        decoder.feed(encode(c.KeepAlive()) + frame)  # the good frame before is dropped with the bad one
    assert isinstance(raised.value, WireProtocolError)
    assert decoder.error is raised.value
    decoder.check_invariants()
    for later in (b"", encode(c.KeepAlive())):
        with pytest.raises(error) as again:
            decoder.feed(later)
        assert again.value is raised.value


@pytest.mark.parametrize("type_code", [c.AppendBlock.TYPE, 12345])
def test_a_bad_header_is_rejected_before_its_body_arrives(type_code: int) -> None:
    too_long = header(type_code, FRAME_BYTES_MAX + 1)
    decoder = Decoder()
    assert decoder.feed(encode(c.KeepAlive()) + too_long[:5]) == [c.KeepAlive()]
    with pytest.raises(UnknownCommandError if type_code == 12345 else FrameTooLargeError):
        decoder.feed(too_long[5:])  # the header is whole now: rejected without waiting for 16 MiB
    assert decoder.pending_bytes == 0


def test_the_longest_frame_is_awaited_and_decoded() -> None:
    data = bytes(FRAME_BYTES_MAX - 20)  # AppendBlockPart: 16 (writer) + 4 (length) + data
    command = c.AppendBlockPart(WRITER, data)
    frame = encode(command)
    assert len(frame) == codec.FRAME_HEADER_LENGTH + FRAME_BYTES_MAX
    decoder = Decoder()
    assert decoder.feed(frame[:100]) == []
    decoder.check_invariants()
    assert decoder.feed(frame[100:]) == [command]


def test_errors_split_by_whose_fault() -> None:
    """Bad bytes received are the peer's fault (issue 19: not a ``CallerError``); a command the caller
    cannot encode is the caller's."""
    assert issubclass(WireProtocolError, errors.ProtocolError) and issubclass(WireProtocolError, errors.PeerError)
    assert not issubclass(WireProtocolError, errors.CallerError)
    for error in (MalformedFrameError, FrameTooLargeError, UnknownCommandError, MalformedEventError,
                  IncompatibleVersionError):
        assert issubclass(error, WireProtocolError), error
    assert issubclass(InvalidCommandError, errors.InvalidArgumentError)
    assert not issubclass(InvalidCommandError, errors.PeerError)
    assert issubclass(codec.CommandTooLargeError, InvalidCommandError)
    assert issubclass(codec.CommandTooLargeError, errors.PayloadTooLargeError)
    assert FRAME_BYTES_MAX == limits.APPEND_LENGTH_BYTES_MAX


# --- Encoding errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    c.SegmentAttribute(2**63, 0),  # i64 out of range
    c.Hello(2**31, 0),  # i32 out of range
    c.SegmentAttribute(1.5, 0),  # type: ignore[arg-type]
    c.SegmentCreated(1, "x" * (STRING_LENGTH_MAX + 1)),
    c.SegmentCreated(1, "\ud800"),  # a lone surrogate has no UTF-8
    c.SegmentCreated(1, b"bytes"),  # type: ignore[arg-type]
    c.SegmentRead(1, "x" * (STRING_LENGTH_MAX + 1), 0, True, False, b""),  # hot path
    c.SegmentAttributeUpdated(1, 2),  # type: ignore[arg-type]
    c.SegmentAttributeUpdated(1, None),  # type: ignore[arg-type]
    c.SegmentRead(1, "s", 0, "yes", False, b""),  # type: ignore[arg-type]
    c.DataAppended(1, WRITER.bytes, 2, 1, 0),  # type: ignore[arg-type]
    c.AppendBlock(str(WRITER), 1, 1, 1, b""),  # type: ignore[arg-type]
    c.InvalidEventNumber(1, str(WRITER), 1),  # type: ignore[arg-type]
    c.GetSegmentAttribute(1, "s", -1, ""),
    c.GetSegmentAttribute(1, "s", 2**128, ""),
    c.AppendBlockPart(WRITER, "text"),  # type: ignore[arg-type]
    c.AppendBlock(WRITER, 1, 1, 1, "text"),  # type: ignore[arg-type]
    "not a command",
])
def test_unencodable_commands_are_refused(command: c.Command) -> None:
    with pytest.raises(InvalidCommandError):
        encode(command)
    buffer = bytearray(b"kept")
    with pytest.raises(InvalidCommandError):
        encode_into(buffer, command)
    assert buffer == b"kept"


@pytest.mark.parametrize("make", [
    lambda data: c.AppendBlock(WRITER, 1, 1, 1, data),
    lambda data: c.SegmentRead(1, "s", 0, True, False, data),
    lambda data: c.AppendBlockPart(WRITER, data),
])
def test_a_frame_over_the_limit_is_refused(make) -> None:  # type: ignore[no-untyped-def]
    command = make(bytes(FRAME_BYTES_MAX))
    with pytest.raises(codec.CommandTooLargeError):
        encode(command)
    buffer = bytearray()
    with pytest.raises(errors.PayloadTooLargeError):
        encode_into(buffer, command)
    assert buffer == b""


# --- Version negotiation ---------------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "theirs", "expected"), [
    ((1, 1), (1, 1), 1),
    ((5, 2), (3, 1), 3),  # they are older: their newest
    ((3, 1), (5, 2), 3),  # we are older: our newest
    ((5, 1), (5, 5), 5),
    ((5, 5), (9, 1), 5),
    ((4, 2), (2, 2), 2),  # the ranges touch
    ((5, 4), (3, 1), IncompatibleVersionError),  # they are too old for us
    ((3, 1), (5, 4), IncompatibleVersionError),  # we are too old for them
    ((5, 1), (3, 4), IncompatibleVersionError),  # their range is empty
    ((1, 3), (5, 1), errors.InvalidArgumentError),  # ours is empty: our bug
])
def test_negotiate(ours: tuple[int, int], theirs: tuple[int, int], expected: int | type[Exception]) -> None:
    if isinstance(expected, int):
        assert negotiate(*ours, *theirs) == expected
    else:
        with pytest.raises(expected) as raised:
            negotiate(*ours, *theirs)
        if expected is errors.InvalidArgumentError:
            assert not isinstance(raised.value, IncompatibleVersionError)


def test_a_hello_negotiates_our_version_with_ourselves() -> None:
    assert 1 <= OLDEST_COMPATIBLE_VERSION <= WIRE_VERSION
    [hello] = decode_all(encode(c.Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)))
    assert isinstance(hello, c.Hello)
    assert negotiate(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION, hello.high_version, hello.low_version) == WIRE_VERSION
    with pytest.raises(errors.InvalidArgumentError):
        negotiate(1.0, 1, 1, 1)  # type: ignore[arg-type]


# --- Events inside append data ---------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=30))
def test_events_round_trip(payloads: list[bytes]) -> None:
    block = b"".join(map(encode_event, payloads))
    assert list(iter_events(block)) == payloads
    assert count_events(block) == len(payloads)
    assert list(iter_events(memoryview(bytearray(block)))) == payloads


def test_event_layout() -> None:
    assert encode_event(b"hi") == bytes.fromhex("00000000 00000002 6869")
    assert encode_event(bytearray(b"")) == bytes(8)


GOOD_EVENT = encode_event(b"ok")


@pytest.mark.parametrize("block", [
    b"\x00\x00\x00",  # a header cut short
    struct.pack(">ii", 1, 0),  # not type 0
    struct.pack(">ii", 0, -1),  # negative length
    struct.pack(">ii", 0, 3) + b"ab",  # payload cut short
    struct.pack(">ii", 0, 2**31 - 1),
])
def test_malformed_blocks(block: bytes) -> None:
    with pytest.raises(MalformedEventError):
        count_events(GOOD_EVENT + block)
    events = iter_events(GOOD_EVENT + block)
    assert next(events) == b"ok"  # events before the fault are yielded ...
    with pytest.raises(MalformedEventError):
        next(events)  # ... then the fault is raised


def test_event_argument_errors() -> None:
    with pytest.raises(errors.InvalidArgumentError):
        encode_event("text")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError):
        count_events(12)  # type: ignore[arg-type]
    with pytest.raises(codec.CommandTooLargeError):
        encode_event(bytes(FRAME_BYTES_MAX - codec.EVENT_HEADER_LENGTH + 1))
    assert len(encode_event(bytes(FRAME_BYTES_MAX - codec.EVENT_HEADER_LENGTH))) == FRAME_BYTES_MAX


@given(st.lists(st.integers(0, 2**63 - 1), max_size=50, unique=True))
def test_offsets_round_trip_and_a_blob_that_is_not_a_list_of_them_is_malformed(values: list[int]) -> None:
    ascending = sorted(values)
    assert decode_offsets(encode_offsets(ascending)) == tuple(ascending)
    if len(ascending) > 1:
        with pytest.raises(MalformedFrameError, match="ascending"):
            decode_offsets(encode_offsets(ascending[::-1]))
    with pytest.raises(MalformedFrameError, match="multiple of 8"):
        decode_offsets(encode_offsets(ascending) + b"\x00")
    with pytest.raises(InvalidCommandError, match="non-negative 64-bit"):
        encode_offsets([*ascending, -1])
