"""Bad input never crashes the server or disturbs other connections: each kind is answered with a
typed reply or a closed connection, logged once, while a bystander connection keeps working."""

from __future__ import annotations

import logging
import struct
import uuid

import pytest

from millstream.errors import PayloadTooLargeError, ProtocolError
from millstream.naming import container_of
from millstream.server import ServerConfig
from millstream.wire import (
    FRAME_BYTES_MAX,
    AppendBlock,
    AppendSetup,
    CreateSegment,
    DataAppended,
    ErrorMessage,
    Hello,
    InvalidEventNumber,
    OperationUnsupported,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    WrongHost,
    encode,
    encode_event,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, block, events, run, serving

HEADER = struct.Struct(">ii")


class Bystander:
    """A connection that writes and reads back between the bad inputs: it must never notice them."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.writer = uuid.uuid4()
        self.number = 0
        self.request_id = 1000

    @classmethod
    async def start(cls, port: int) -> Bystander:
        bystander = cls(await RawClient.connect(port))
        assert await bystander.client.request(CreateSegment(1, "sc/bystander", "")) == SegmentCreated(
            1, "sc/bystander")
        assert isinstance(await bystander.client.request(SetupAppend(2, bystander.writer, "sc/bystander", "")),
                          AppendSetup)
        return bystander

    async def still_works(self) -> None:
        self.number += 1
        self.request_id += 1
        reply = await self.client.request(block(self.writer, self.number, [f"ok {self.number}".encode()],
                                                self.request_id))
        assert isinstance(reply, DataAppended) and reply.event_number == self.number, reply
        self.request_id += 1
        read = await self.client.request(ReadSegment(self.request_id, "sc/bystander", 0, 1 << 20, "", 0))
        assert isinstance(read, SegmentRead)
        assert read.data == events(*(f"ok {n}".encode() for n in range(1, self.number + 1)))


def closing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "millstream.server"
            and r.levelno == logging.WARNING and "closing connection" in r.getMessage()]


async def closed_once(client: RawClient, caplog: pytest.LogCaptureFixture, before: int, what: str) -> list[object]:
    replies = await client.expect_closed()
    warnings = closing_warnings(caplog)
    assert len(warnings) == before + 1, f"{what}: expected one warning, got {warnings[before:]}"
    assert what in warnings[-1], warnings[-1]
    return replies  # type: ignore[return-value]


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_broken_frames_close_only_their_connection(tiers: Tiers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")

    async def scenario() -> None:
        async with serving(tiers) as server:
            bystander = await Bystander.start(server.port)
            cases = [
                ("unknown command type", HEADER.pack(4242, 0), "UnknownCommandError"),
                ("length over the limit", HEADER.pack(CreateSegment.TYPE, FRAME_BYTES_MAX + 1), "FrameTooLargeError"),
                ("negative length", HEADER.pack(CreateSegment.TYPE, -5), "MalformedFrameError"),
                # A SegmentRead whose at_tail bool is 7.
                ("bad bool", HEADER.pack(10, 8 + 2 + 8 + 2 + 4) + struct.pack(">qH", 1, 0) + struct.pack(">q", 0)
                 + bytes([7, 0]) + struct.pack(">I", 0), "MalformedFrameError"),
                ("fields past the end", HEADER.pack(CreateSegment.TYPE, 3) + b"abc", "MalformedFrameError"),
                ("garbage", bytes(range(256)) * 4, "Error"),
            ]
            for what, data, error in cases:
                before = len(closing_warnings(caplog))
                client = await RawClient.connect(server.port)
                await client.send_bytes(data)
                assert await closed_once(client, caplog, before, error) == [], what
                await bystander.still_works()
            # A peer that hangs up inside a frame.
            before = len(closing_warnings(caplog))
            client = await RawClient.connect(server.port)
            await client.send_bytes(encode(CreateSegment(1, "sc/x", ""))[:-2])
            client.writer.write_eof()
            await closed_once(client, caplog, before, "inside a frame")
            await bystander.still_works()
            # A request before Hello; a Hello no version of which the server speaks.
            for what, command in (("before Hello", CreateSegment(1, "sc/early", "")),
                                  ("incompatible", Hello(99, 98))):
                before = len(closing_warnings(caplog))
                client = await RawClient.connect(server.port, hello=False)
                await client.send(command)
                await closed_once(client, caplog, before, what)
                await bystander.still_works()
            # A command only the store sends is answered OperationUnsupported; the connection stays.
            client = await RawClient.connect(server.port)
            assert await client.request(SegmentCreated(77, "sc/x")) == OperationUnsupported(77, "SegmentCreated")
            assert await client.request(CreateSegment(78, "sc/still-open", "")) == SegmentCreated(78, "sc/still-open")
            await client.close()
            await bystander.still_works()
            await bystander.client.close()
    run(scenario)


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_bad_appends_close_the_writers_connection_with_a_typed_reply(
        tiers: Tiers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")

    async def scenario() -> None:
        async with serving(tiers) as server:
            bystander = await Bystander.start(server.port)
            segment = "sc/bad-appends"
            setup_client = await RawClient.connect(server.port)
            await setup_client.request(CreateSegment(1, segment, ""))
            await setup_client.close()

            async def writer_connection() -> tuple[RawClient, uuid.UUID]:
                client = await RawClient.connect(server.port)
                writer = uuid.uuid4()
                await client.request(SetupAppend(1, writer, segment, ""))
                assert isinstance(await client.request(block(writer, 5, [b"first"], 2)), DataAppended)
                return client, writer

            # An event number that does not increase.
            before = len(closing_warnings(caplog))
            client, writer = await writer_connection()
            await client.send(block(writer, 5, [b"again"], 3))
            assert await closed_once(client, caplog, before, "does not follow") == [InvalidEventNumber(3, writer, 5)]
            await bystander.still_works()
            # An event count that does not match the block.
            before = len(closing_warnings(caplog))
            client, writer = await writer_connection()
            await client.send(AppendBlock(writer, 9, 3, 4, events(b"a", b"b")))
            assert await closed_once(client, caplog, before, "announces 3 events") == [InvalidEventNumber(4, writer, 9)]
            await bystander.still_works()
            # Data that is not whole events.
            before = len(closing_warnings(caplog))
            client, writer = await writer_connection()
            await client.send(AppendBlock(writer, 9, 1, 5, events(b"abc")[:-1]))
            replies = await closed_once(client, caplog, before, "malformed events")
            assert len(replies) == 1 and isinstance(replies[0], ErrorMessage)
            await bystander.still_works()
            # An event over EVENT_LENGTH_BYTES_MAX (8 MiB).
            before = len(closing_warnings(caplog))
            client, writer = await writer_connection()
            await client.send(AppendBlock(writer, 9, 1, 6, encode_event(bytes(8 * 1024 * 1024 + 1))))
            replies = await closed_once(client, caplog, before, "exceeds")
            assert len(replies) == 1 and isinstance(replies[0], ErrorMessage)
            assert replies[0].error_code == error_code_of(PayloadTooLargeError())
            await bystander.still_works()
            # An append without SetupAppend.
            before = len(closing_warnings(caplog))
            client = await RawClient.connect(server.port)
            await client.send(block(uuid.uuid4(), 1, [b"who am I"], 7))
            replies = await closed_once(client, caplog, before, "without SetupAppend")
            assert len(replies) == 1 and isinstance(replies[0], ErrorMessage)
            assert replies[0].error_code == error_code_of(ProtocolError())
            await bystander.still_works()
            # Nothing of the refused blocks was stored: the segment holds the four accepted "first"s.
            read = await bystander.client.request(ReadSegment(1, segment, 0, 1 << 20, "", 0))
            assert isinstance(read, SegmentRead) and read.data == events(*[b"first"] * 4)
            await bystander.client.close()
    run(scenario)


def test_segments_of_containers_this_server_does_not_own_get_wrong_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tiers = Tiers("simulated", tmp_path)
    owned = name = foreign = None
    for index in range(100):
        name = f"sc/stream-{index}"
        if container_of(name, 4) == 0 and owned is None:
            owned = name
        if container_of(name, 4) != 0 and foreign is None:
            foreign = name
    assert owned and foreign

    async def scenario() -> None:
        async with serving(tiers, config=ServerConfig(container_count=4, owned_containers={0})) as server:
            client = await RawClient.connect(server.port)
            assert await client.request(CreateSegment(1, owned, "")) == SegmentCreated(1, owned)
            assert await client.request(CreateSegment(2, foreign, "")) == WrongHost(2, foreign, "")
            assert await client.request(SetupAppend(3, uuid.uuid4(), foreign, "")) == WrongHost(3, foreign, "")
            assert await client.request(ReadSegment(4, foreign, 0, 10, "", 0)) == WrongHost(4, foreign, "")
            # The connection carries on.
            assert isinstance(await client.request(ReadSegment(5, owned, 0, 10, "", 0)), SegmentRead)
            await client.close()
    run(scenario)


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_a_peer_hanging_up_inside_a_large_frame_is_closed_and_logged_once(
        tiers: Tiers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")

    async def scenario() -> None:
        async with serving(tiers) as server:
            bystander = await Bystander.start(server.port)
            client = await RawClient.connect(server.port)
            writer = uuid.uuid4()
            await client.request(CreateSegment(1, "sc/cut", ""))
            await client.request(SetupAppend(2, writer, "sc/cut", ""))
            frame = encode(block(writer, 1, [bytes(300_000)], 3))  # larger than one read
            before = len(closing_warnings(caplog))
            await client.send_bytes(frame[:200_000])
            client.writer.write_eof()
            await closed_once(client, caplog, before, "inside a frame")
            await bystander.still_works()
            read = await bystander.client.request(ReadSegment(1, "sc/cut", 0, 100, "", 0))
            assert isinstance(read, SegmentRead) and read.data == b"", "nothing of the cut block was stored"
            await bystander.client.close()
    run(scenario)
