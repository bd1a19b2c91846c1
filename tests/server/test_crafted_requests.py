"""Crafted requests (issue 19, item 6): a name of 100 KB, JSON nested thousands of levels deep, a
segment name of 60 KB -- each gets a typed error reply that fits the wire, the connection carries on,
and the server logs nothing unexpected.  Bad bytes from a peer are the peer's fault in the error tree."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import millstream
from millstream import errors, limits
from millstream.auth import Permission, issue_token
from millstream.controller._rpc import check_json_depth, parse_request
from millstream.naming import container_of, quote, validate_scope_or_stream_name, validate_segment_name
from millstream.wire import (
    AuthTokenCheckFailed,
    CommandTooLargeError,
    ControllerReply,
    ControllerRequest,
    CreateSegment,
    ErrorMessage,
    FrameTooLargeError,
    GetSegmentInfo,
    IncompatibleVersionError,
    InvalidCommandError,
    MalformedEventError,
    MalformedFrameError,
    ReadSegment,
    SegmentCreated,
    SetupAppend,
    UnknownCommandError,
    WireProtocolError,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, run, serving

INVALID_ARGUMENT = error_code_of(errors.InvalidArgumentError())
SECRET = b"a-test-secret-of-enough-bytes"


def unexpected(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Records at ERROR or above from millstream (an unexpected error, a traceback)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("millstream") and r.levelno >= logging.ERROR]


def test_a_100_kb_scope_name_and_deep_json_get_typed_replies_on_an_open_connection(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream")
    huge = "s" * 100_000
    deep = b'{"scope": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"

    with millstream.standalone(tmp_path / "data") as node:
        async def scenario() -> None:
            client = await RawClient.connect(node.port)
            for request_id, body in ((1, json.dumps({"scope": huge}).encode()), (2, deep),
                                     (3, json.dumps({"scope": "ok", "x" * 100_000: 1}).encode()),
                                     (4, b"[" * 10_000)):
                reply = await client.request(ControllerRequest(request_id, "create_scope", body))
                assert isinstance(reply, ErrorMessage) and reply.request_id == request_id, reply
                assert reply.error_code == INVALID_ARGUMENT, reply
                assert len(reply.message.encode()) <= limits.SERVER_ERROR_TEXT_BYTES_MAX, len(reply.message)
            # The connection carries on, and the node answers properly formed requests.
            reply = await client.request(ControllerRequest(9, "create_scope", b'{"scope": "fine"}'))
            assert isinstance(reply, ControllerReply), reply
            await client.close()
        run(scenario)
    assert unexpected(caplog) == []


@pytest.mark.parametrize("tiers", ["simulated"], indirect=True)
def test_segment_names_beyond_the_limit_are_refused_before_use(tiers: Tiers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream")
    long_name = "sc/" + "n" * 60_000

    async def scenario() -> None:
        async with serving(tiers) as server:
            cached = container_of.cache_info().currsize
            client = await RawClient.connect(server.port)
            for request in (CreateSegment(1, long_name, ""), GetSegmentInfo(2, long_name, ""),
                            ReadSegment(3, long_name, 0, 10, "", 0)):
                reply = await client.request(request)
                assert isinstance(reply, ErrorMessage) and reply.error_code == INVALID_ARGUMENT, reply
                assert "1024 UTF-8 bytes" in reply.message and len(reply.message) < 400, reply.message
            setup = await client.request(SetupAppend(4, __import__("uuid").uuid4(), long_name, ""))
            assert isinstance(setup, ErrorMessage) and setup.error_code == INVALID_ARGUMENT, setup
            # Nothing of the long name was remembered (container_of caches the names it hashes).
            assert container_of.cache_info().currsize == cached
            assert await client.request(CreateSegment(5, "sc/short", "")) == SegmentCreated(5, "sc/short")
            await client.close()
    run(scenario)
    assert unexpected(caplog) == []


def test_a_refusal_quoting_a_long_name_still_fits_its_reply(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With authentication on, the refusal names the resource the token does not cover -- for a
    segment name near the wire's 65,535-byte limit that text alone would not fit a reply."""
    caplog.set_level(logging.INFO, logger="millstream")
    token = issue_token(SECRET, "elsewhere/*", Permission.READ_UPDATE, 4_000_000_000.0)
    name = "a" * 65_000

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), auth_secret=SECRET) as server:
            client = await RawClient.connect(server.port)
            reply = await client.request(GetSegmentInfo(1, name, token))
            assert isinstance(reply, AuthTokenCheckFailed) and reply.request_id == 1, reply
            assert len(reply.reason.encode()) <= limits.SERVER_ERROR_TEXT_BYTES_MAX
            reply = await client.request(GetSegmentInfo(2, "elsewhere/s/0.#epoch.0", token))
            assert reply.request_id == 2 and not isinstance(reply, AuthTokenCheckFailed), reply
            await client.close()
    run(scenario)
    assert unexpected(caplog) == []


def test_names_are_quoted_by_a_prefix() -> None:
    with pytest.raises(errors.InvalidArgumentError) as raised:
        validate_scope_or_stream_name("x" * 100_000, what="scope")
    assert len(str(raised.value)) < 300 and "(100000 characters)" in str(raised.value)
    with pytest.raises(errors.InvalidArgumentError) as raised:
        validate_segment_name("y" * 5000)
    assert len(str(raised.value)) < 300 and "5000" in str(raised.value)
    assert validate_scope_or_stream_name("_system", system=True) == "_system"
    assert validate_segment_name("sc/s/0.#epoch.0") == "sc/s/0.#epoch.0"
    with pytest.raises(errors.InvalidArgumentError):
        validate_segment_name("é" * 513)  # 513 characters, 1,026 bytes
    assert validate_segment_name("é" * 512) == "é" * 512
    nested: list[object] = []
    for _ in range(10_000):
        nested = [nested]
    assert len(quote(nested)) < 100  # no recursion, a short prefix
    assert quote(10**5000).startswith("<an int of")


def test_controller_bodies_are_bounded_before_they_are_parsed() -> None:
    check_json_depth(b'{"a": [[[["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]]]]}', 5)  # brackets in a string
    check_json_depth(b'{"a": "\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 5)  # an escaped quote
    with pytest.raises(errors.InvalidArgumentError, match="deeper than 5"):
        check_json_depth(b"[" * 6 + b"]" * 6, 5)
    with pytest.raises(errors.InvalidArgumentError, match="deeper than"):
        parse_request("create_scope", b"[" * 1_000_000)
    with pytest.raises(errors.PayloadTooLargeError):
        parse_request("create_scope", b" " * (limits.CONTROLLER_REQUEST_BODY_BYTES_MAX + 1))
    with pytest.raises(errors.InvalidArgumentError, match="segment ids in decimal"):
        parse_request("truncate_stream", json.dumps({"scope": "a", "stream": "b", "cut": {"1" * 5000: 0}}).encode())
    with pytest.raises(errors.InvalidArgumentError) as raised:
        parse_request("ping_transaction", json.dumps({"scope": "a", "stream": "b", "txn": "f" * 100_000}).encode())
    assert len(str(raised.value)) < 300


def test_wire_errors_are_the_peers_fault_and_encoding_errors_the_callers() -> None:
    """DESIGN section 9: bad bytes from a peer are a ``PeerError`` (``ProtocolError``), never a
    ``CallerError``; what a caller hands ``encode`` is the caller's (``InvalidArgumentError``)."""
    for error in (WireProtocolError, MalformedFrameError, FrameTooLargeError, UnknownCommandError,
                  MalformedEventError, IncompatibleVersionError):
        assert issubclass(error, errors.ProtocolError) and issubclass(error, errors.PeerError), error
        assert not issubclass(error, errors.CallerError), error
    assert issubclass(errors.ProtocolError, errors.PeerError) and not issubclass(errors.PeerError, errors.CallerError)
    for error in (InvalidCommandError, CommandTooLargeError):
        assert issubclass(error, errors.InvalidArgumentError) and not issubclass(error, errors.PeerError), error
    assert issubclass(CommandTooLargeError, errors.PayloadTooLargeError)
    assert error_code_of(MalformedEventError("x")) == error_code_of(errors.ProtocolError())
