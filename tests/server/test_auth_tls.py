"""Token authentication and TLS, end to end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import uuid
from pathlib import Path

import pytest
import trustme

from millstream.auth import Permission, issue_token
from millstream.wire import (
    AppendSetup,
    AuthTokenCheckFailed,
    CreateSegment,
    DataAppended,
    GetSegmentInfo,
    MergeSegments,
    ReadSegment,
    SegmentCreated,
    SegmentInfo,
    SegmentRead,
    SetupAppend,
)
from tests.server.raw import RawClient, Tiers, block, events, run, serving

SECRET = b"a-test-secret-of-enough-bytes"
NOW = 1_700_000_000.0


def test_requests_need_a_token_that_covers_the_stream_and_the_permission(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    clock = [NOW]
    update = issue_token(SECRET, "iot/sensors", Permission.READ_UPDATE, NOW + 60)
    read_only = issue_token(SECRET, "iot/sensors", Permission.READ, NOW + 60)
    scope_wide = issue_token(SECRET, "iot/*", Permission.READ_UPDATE, NOW + 60)
    forged = issue_token(b"not-the-server-secret!!", "*", Permission.READ_UPDATE, NOW + 60)
    segment = "iot/sensors/0.#epoch.0"

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), auth_secret=SECRET, wall_clock=lambda: clock[0]) as server:
            client = await RawClient.connect(server.port)
            refusals = 0
            for request_id, token in enumerate(("", read_only, forged, issue_token(SECRET, "iot/other",
                                                                                    Permission.READ_UPDATE, NOW + 60))):
                reply = await client.request(CreateSegment(request_id, segment, token))
                assert isinstance(reply, AuthTokenCheckFailed) and reply.request_id == request_id, reply
                refusals += 1
            # Nothing happened: the segment does not exist.
            assert await client.request(GetSegmentInfo(10, segment, read_only)) == SegmentInfo(
                10, segment, False, False, False, 0, 0, 0)
            assert await client.request(CreateSegment(11, segment, update)) == SegmentCreated(11, segment)
            writer = uuid.uuid4()
            assert isinstance(await client.request(SetupAppend(12, writer, segment, read_only)), AuthTokenCheckFailed)
            assert isinstance(await client.request(SetupAppend(13, writer, segment, scope_wide)), AppendSetup)
            assert isinstance(await client.request(block(writer, 1, [b"signed"], 14)), DataAppended)
            read = await client.request(ReadSegment(15, segment, 0, 100, read_only, 0))
            assert isinstance(read, SegmentRead) and read.data == events(b"signed")
            # A merge needs the update permission on both segments.
            reply = await client.request(MergeSegments(16, segment, "other/stream/0", scope_wide))
            assert isinstance(reply, AuthTokenCheckFailed)
            # Expiry follows the injected wall clock.
            clock[0] = NOW + 61
            reply = await client.request(ReadSegment(17, segment, 0, 100, read_only, 0))
            assert isinstance(reply, AuthTokenCheckFailed) and "expired" in reply.reason
            await client.close()
            logged = [r for r in caplog.records if "refused" in r.getMessage()]
            assert len(logged) == refusals + 3, "each refusal is logged once"
    run(scenario)


def test_tls_round_trip_and_a_plain_client_does_not_disturb_the_server(tmp_path: Path) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("localhost", "127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    authority.configure_trust(client_context)

    async def scenario() -> None:
        async with serving(Tiers("files", tmp_path), ssl_context=server_context) as server:
            assert server.uri.startswith("tls://127.0.0.1:")
            # A client that speaks plain TCP to the TLS port gets nowhere ...
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"\x00\x00\x00\x14\x00\x00\x00\x00not a tls handshake")
            await writer.drain()
            # The server closes it (reading reaches the end, perhaps after a TLS alert) well in time.
            with contextlib.suppress(ConnectionResetError):
                await asyncio.wait_for(reader.read(), 5.0)
            assert reader.at_eof() or writer.is_closing()
            writer.close()
            # ... while a TLS client is served.
            client = await RawClient.connect(server.port, ssl_context=client_context, server_hostname="localhost")
            assert await client.request(CreateSegment(1, "sc/tls", "")) == SegmentCreated(1, "sc/tls")
            writer_id = uuid.uuid4()
            await client.request(SetupAppend(2, writer_id, "sc/tls", ""))
            big = bytes(range(256)) * 4096  # 1 MiB: several TLS records
            assert isinstance(await client.request(block(writer_id, 1, [big], 3)), DataAppended)
            data = b""
            while len(data) < len(events(big)):
                read = await client.request(ReadSegment(4, "sc/tls", len(data), 1 << 20, "", 0))
                assert isinstance(read, SegmentRead)
                data += read.data
            assert data == events(big)
            await client.close()
            # A client that does not trust the server's authority cannot connect.
            with pytest.raises(ssl.SSLError):
                await RawClient.connect(server.port, ssl_context=ssl.create_default_context(),
                                        server_hostname="localhost")
    run(scenario)
