"""Every command of the client/server contract, end to end over TCP, on files and on simulated tiers."""

from __future__ import annotations

import asyncio
import uuid

from millstream.errors import BadOffsetError, ReservedSegmentError, StreamSegmentNotExistsError
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.naming import transaction_segment_name
from millstream.wire import (
    AppendBlockEnd,
    AppendBlockPart,
    AppendSetup,
    ConditionalAppend,
    ConditionalCheckFailed,
    CreateSegment,
    DataAppended,
    DeleteSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetSegmentInfo,
    MergeSegments,
    NoSuchSegment,
    ReadSegment,
    SealSegment,
    SegmentAlreadyExists,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    SegmentSealed,
    SegmentTruncated,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    iter_events,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, block, events, run, serving


def test_segment_administration_and_attributes(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            assert await client.request(CreateSegment(1, "sc/st/0", "")) == SegmentCreated(1, "sc/st/0")
            assert await client.request(CreateSegment(2, "sc/st/0", "")) == SegmentAlreadyExists(2, "sc/st/0")
            info = await client.request(GetSegmentInfo(3, "sc/st/0", ""))
            assert isinstance(info, SegmentInfo) and info.last_modified > 0, info  # (its creation's time)
            assert info == SegmentInfo(3, "sc/st/0", True, False, False, 0, 0, info.last_modified)
            assert await client.request(GetSegmentInfo(4, "sc/none", "")) == SegmentInfo(
                4, "sc/none", False, False, False, 0, 0, 0)
            # Attributes: absent reads as NULL; compare-and-set against "absent", then against a value.
            assert await client.request(GetSegmentAttribute(5, "sc/st/0", 99, "")) == SegmentAttribute(
                5, NULL_ATTRIBUTE_VALUE)
            assert await client.request(UpdateSegmentAttribute(6, "sc/st/0", 99, 7, NULL_ATTRIBUTE_VALUE, "")) \
                == SegmentAttributeUpdated(6, True)
            assert await client.request(UpdateSegmentAttribute(7, "sc/st/0", 99, 8, 1, "")) \
                == SegmentAttributeUpdated(7, False)
            assert await client.request(GetSegmentAttribute(8, "sc/st/0", 99, "")) == SegmentAttribute(8, 7)
            # Truncate: at an event boundary; inside an event, and beyond the length (typed error codes).
            writer = uuid.uuid4()
            await client.request(SetupAppend(9, writer, "sc/st/0", ""))
            assert isinstance(await client.request(block(writer, 1, [b"01234", b"56789"], 10)), DataAppended)
            reply = await client.request(TruncateSegment(11, "sc/st/0", 5, ""))
            assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(BadOffsetError())
            assert "is not an event boundary" in reply.message
            assert await client.request(TruncateSegment(11, "sc/st/0", 13, "")) == SegmentTruncated(11, "sc/st/0")
            reply = await client.request(TruncateSegment(12, "sc/st/0", 500, ""))
            assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(BadOffsetError())
            assert await client.request(ReadSegment(13, "sc/st/0", 0, 100, "", 0)) == SegmentIsTruncated(
                13, "sc/st/0", 13)
            # Seal is idempotent on the wire.
            assert await client.request(SealSegment(14, "sc/st/0", "")) == SegmentSealed(14, "sc/st/0")
            assert await client.request(SealSegment(15, "sc/st/0", "")) == SegmentSealed(15, "sc/st/0")
            info = await client.request(GetSegmentInfo(16, "sc/st/0", ""))
            assert isinstance(info, SegmentInfo) and info.sealed and info.start_offset == 13 and info.length == 26
            assert await client.request(SealSegment(17, "sc/none", "")) == NoSuchSegment(17, "sc/none")
            # Delete.
            assert await client.request(DeleteSegment(18, "sc/st/0", "")) == SegmentDeleted(18, "sc/st/0")
            assert await client.request(DeleteSegment(19, "sc/st/0", "")) == NoSuchSegment(19, "sc/st/0")
            assert await client.request(GetSegmentInfo(20, "sc/st/0", "")) == SegmentInfo(
                20, "sc/st/0", False, False, False, 0, 0, 0)
            await client.close()
    run(scenario)


def test_appends_reads_and_merges(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            segment = "sc/st/1"
            await client.request(CreateSegment(1, segment, ""))
            writer = uuid.uuid4()
            assert await client.request(SetupAppend(2, writer, segment, "")) == AppendSetup(
                2, segment, writer, NULL_ATTRIBUTE_VALUE)
            first = [b"a" * 10, b"b" * 20]
            assert await client.request(block(writer, 2, first, 3)) == DataAppended(
                3, writer, 2, NULL_ATTRIBUTE_VALUE, len(events(*first)))
            # Conditional: right offset -> appended; wrong offset -> ConditionalCheckFailed, connection open.
            length = len(events(*first))
            reply = await client.request(ConditionalAppend(writer, 3, length, events(b"c"), 4))
            assert reply == DataAppended(4, writer, 3, 2, length + len(events(b"c")))
            assert await client.request(ConditionalAppend(writer, 4, 0, events(b"d"), 5)) == ConditionalCheckFailed(
                5, writer, 4)
            # A streamed block: parts, then the end.
            whole = events(b"e" * 5, b"f" * 6)
            await client.send(AppendBlockPart(writer, whole[:7]))
            reply = await client.request(AppendBlockEnd(writer, len(whole), whole[7:], 2, 6, 6))
            assert isinstance(reply, DataAppended) and reply.event_number == 6 and reply.previous_event_number == 3
            total = reply.current_segment_write_offset
            # The stored event number comes back in SetupAppend and as the attribute.
            assert await client.request(SetupAppend(7, writer, segment, "")) == AppendSetup(7, segment, writer, 6)
            assert await client.request(GetSegmentAttribute(8, segment, writer.int, "")) == SegmentAttribute(8, 6)
            # Reads: whole, from an offset, at the tail, beyond the end.
            read = await client.request(ReadSegment(9, segment, 0, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead) and read.at_tail and not read.end_of_segment
            assert list(iter_events(read.data)) == [b"a" * 10, b"b" * 20, b"c", b"e" * 5, b"f" * 6]
            read = await client.request(ReadSegment(10, segment, length, 9, "", 0))
            assert isinstance(read, SegmentRead) and read.offset == length and read.data == events(b"c")
            reply = await client.request(ReadSegment(11, segment, total + 1, 10, "", 0))
            assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(BadOffsetError())
            assert await client.request(ReadSegment(12, "sc/none", 0, 10, "", 0)) == NoSuchSegment(12, "sc/none")
            # A transaction segment: the controller creates it (in process, as here), its writer appends
            # over the wire; only the controller merges it (a commit): a client's merge is refused.
            transaction = transaction_segment_name(segment, uuid.uuid4())
            container = server.container_for(segment)
            await container.create_segment(transaction)
            reply = await client.request(CreateSegment(13, transaction_segment_name(segment, uuid.uuid4()), ""))
            assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(ReservedSegmentError())
            other = uuid.uuid4()
            await client.request(SetupAppend(14, other, transaction, ""))
            await client.request(block(other, 1, [b"txn"], 15))
            reply = await client.request(MergeSegments(16, segment, transaction, ""))
            assert isinstance(reply, ErrorMessage) and reply.error_code == error_code_of(ReservedSegmentError())
            await container.seal(transaction)
            assert await container.merge(segment, transaction) == total
            assert await client.request(GetSegmentInfo(17, transaction, "")) == SegmentInfo(
                17, transaction, False, False, False, 0, 0, 0)
            # Seal mid-stream: the writer's next block gets SegmentIsSealed with the final length.
            await client.request(SealSegment(18, segment, ""))
            final = total + len(events(b"txn"))
            assert await client.request(block(writer, 7, [b"late"], 19)) == SegmentIsSealed(19, segment, final)
            assert await client.request(block(writer, 8, [b"later"], 20)) == SegmentIsSealed(20, segment, final)
            read = await client.request(ReadSegment(21, segment, total, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead) and read.end_of_segment and read.at_tail
            await client.close()
    run(scenario)


def test_tail_reads_wait_and_are_woken(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            reader = await RawClient.connect(server.port)
            writer_connection = await RawClient.connect(server.port)
            segment = "sc/tail"
            await reader.request(CreateSegment(1, segment, ""))
            # Nothing there: a read with wait_ms=0 answers at once, empty and at the tail.
            empty = await reader.request(ReadSegment(2, segment, 0, 100, "", 0))
            assert isinstance(empty, SegmentRead) and empty.data == b"" and empty.at_tail
            # A long poll with a short wait times out empty ...
            started = asyncio.get_running_loop().time()
            empty = await reader.request(ReadSegment(3, segment, 0, 100, "", 100))
            assert isinstance(empty, SegmentRead) and empty.data == b""
            assert asyncio.get_running_loop().time() - started >= 0.09
            # ... and a long one is woken by an append from another connection.
            await reader.send(ReadSegment(4, segment, 0, 100, "", 20_000))
            await asyncio.sleep(0.05)
            writer = uuid.uuid4()
            await writer_connection.request(SetupAppend(1, writer, segment, ""))
            started = asyncio.get_running_loop().time()
            await writer_connection.request(block(writer, 1, [b"wake up"], 2))
            woken = await reader.receive()
            assert isinstance(woken, SegmentRead) and woken.request_id == 4 and woken.data == events(b"wake up")
            assert asyncio.get_running_loop().time() - started < 5.0
            await reader.close()
            await writer_connection.close()
    run(scenario)


def test_error_codes_round_trip_to_typed_errors() -> None:
    from millstream.wire.error_codes import error_from_code
    assert isinstance(error_from_code(error_code_of(BadOffsetError("x")), "x"), BadOffsetError)
    assert isinstance(error_from_code(error_code_of(StreamSegmentNotExistsError("x")), "x"),
                      StreamSegmentNotExistsError)
