"""A hostile peer's ``GetEventBoundaries`` (issue 21): negative offsets, a start beyond the end, a range
as large as an i64 allows, a segment that does not exist or does not hold events -- each gets its typed
reply at once, a reply no larger than ``limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX`` offsets, and the
connection goes on serving (the next request on it is answered)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import millstream
from millstream import limits
from millstream.client import BytesSerializer
from millstream.errors import InvalidArgumentError
from millstream.wire import (
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    Command,
    Decoder,
    ErrorMessage,
    EventBoundaries,
    GetEventBoundaries,
    GetSegmentInfo,
    Hello,
    NoSuchSegment,
    SegmentInfo,
    decode_offsets,
    encode,
)
from millstream.wire.error_codes import ERROR_CODES

EVENTS = "hostile/boundaries/0.#epoch.0"
BYTES = "hostile/bytes/0.#epoch.0"
I64_MAX = 2**63 - 1
REPLY_TIMEOUT_SECONDS = 30.0


async def conversation(port: int, requests: list[Command]) -> list[Command]:
    """Send Hello and ``requests`` on one raw connection; return the replies, one per request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = Decoder()
    replies: list[Command] = []
    try:
        writer.write(encode(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)) + b"".join(encode(r) for r in requests))
        await writer.drain()
        while len(replies) < len(requests) + 1:
            data = await asyncio.wait_for(reader.read(65536), REPLY_TIMEOUT_SECONDS)
            assert data, f"the node closed the connection after {replies}"
            replies.extend(decoder.feed(data))
    finally:
        writer.close()
    assert isinstance(replies[0], Hello)
    return sorted(replies[1:], key=_request_id)


def _request_id(reply: Command) -> int:
    """The request a reply answers (every reply to these requests names one)."""
    request_id = getattr(reply, "request_id", None)
    assert isinstance(request_id, int), f"a reply without a request id: {reply!r}"
    return request_id


def test_bad_and_huge_requests_get_bounded_typed_replies_and_the_connection_serves_on(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as c:
        c.segments().create(EVENTS)
        with c.event_writer([EVENTS], BytesSerializer()) as writer:
            for number in range(500):
                writer.write_event(bytes(number % 50), routing_key="k")
        length = c.segments().info(EVENTS).length
        c.segments().create(BYTES)
        byte_stream = c.byte_stream_writer(BYTES)
        byte_stream.write(b"not events")
        byte_stream.flush()
        requests: list[Command] = [
            GetEventBoundaries(1, EVENTS, -5, 10, ""),
            GetEventBoundaries(2, EVENTS, 10, -5, ""),
            GetEventBoundaries(3, EVENTS, 100, 99, ""),
            GetEventBoundaries(4, EVENTS, 0, I64_MAX, ""),
            GetEventBoundaries(5, EVENTS, I64_MAX, I64_MAX, ""),
            GetEventBoundaries(6, "hostile/nothing/0.#epoch.0", 0, I64_MAX, ""),
            GetEventBoundaries(7, BYTES, 0, I64_MAX, ""),
            GetSegmentInfo(8, EVENTS, ""),
        ]
        replies = asyncio.run(conversation(int(node.uri.rsplit(":", 1)[1]), requests))
        byte_stream.close()
    invalid = {cls: code for code, cls in ERROR_CODES.items()}[InvalidArgumentError]
    for reply in replies[:3] + replies[6:7]:
        assert isinstance(reply, ErrorMessage) and reply.error_code == invalid, reply
    whole = replies[3]
    assert isinstance(whole, EventBoundaries)
    offsets = decode_offsets(whole.offsets)
    assert offsets[0] == 0 and offsets[-1] == length and len(offsets) <= limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX
    beyond = replies[4]
    assert isinstance(beyond, EventBoundaries) and decode_offsets(beyond.offsets) == ()
    assert isinstance(replies[5], NoSuchSegment)
    info = replies[7]
    assert isinstance(info, SegmentInfo) and info.length == length  # the connection still serves
