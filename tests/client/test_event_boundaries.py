"""``AsyncSegments.event_boundaries``: the event boundaries a server knows of a segment, without reading
its bytes (issue 21: the Spark source plans ``maxRowsPerBatch`` from them instead of counting every
event).  Against the real server: every offset answered is where an event begins or the segment ends,
a huge range is answered within the reply's bound, bad arguments get typed errors.  Against the fake
server: a reply that lies (not ascending, outside the range, not whole offsets) is a ``ProtocolError``."""

from __future__ import annotations

from pathlib import Path

import pytest

import millstream
from millstream import limits
from millstream.client import BytesSerializer
from millstream.errors import InvalidArgumentError, ProtocolError, StreamSegmentNotExistsError
from millstream.segmentstore import event_boundaries as index
from millstream.wire import codec
from millstream.wire.commands import Command, EventBoundaries, GetEventBoundaries
from tests.client.fake_server import FakeServer, Faults
from tests.client.helpers import client, run

SEGMENT = "boundaries/events/0.#epoch.0"


def test_every_offset_answered_is_an_event_boundary_and_a_huge_range_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "SPACING_BYTES_MIN", 4096)  # (for the node's whole life: see event_boundaries)

    async def scenario(uri: str) -> None:
        async with client(uri) as c:
            segments = c.segments()
            await segments.create(SEGMENT)
            async with c.event_writer([SEGMENT], BytesSerializer()) as writer:
                for number in range(3000):
                    await writer.write_event(b"x" * (number % 97), routing_key="k")
                    if number % 200 == 199:
                        await writer.flush()  # several appends, so the index has entries
            length = (await segments.info(SEGMENT)).length
            data = b""
            while len(data) < length:
                data += (await segments.read(SEGMENT, len(data))).data
            starts = {0}
            position = 0
            while position < length:
                position += 8 + int.from_bytes(data[position + 4:position + 8], "big")
                starts.add(position)
            everything = await segments.event_boundaries(SEGMENT, 0, 2**63 - 1)
            assert everything[0] == 0 and everything[-1] == length
            assert list(everything) == sorted(set(everything))
            assert set(everything) <= starts
            assert 2 < len(everything) <= limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX  # the index answered
            middle = everything[len(everything) // 2]
            inner = await segments.event_boundaries(SEGMENT, 1, middle)
            assert inner == tuple(b for b in everything if 1 <= b <= middle) and inner[-1] == middle
            assert await segments.event_boundaries(SEGMENT, length + 1, 2**63 - 1) == ()
            with pytest.raises(InvalidArgumentError, match="beyond end_offset"):
                await segments.event_boundaries(SEGMENT, 10, 9)
            with pytest.raises(InvalidArgumentError, match="start_offset"):
                await segments.event_boundaries(SEGMENT, -1, 9)
            with pytest.raises(StreamSegmentNotExistsError):
                await segments.event_boundaries("boundaries/nothing/0.#epoch.0", 0, 10)
            assert await segments.event_boundaries(SEGMENT, 0, 0) == (0,)  # and the client still works

    with millstream.standalone(tmp_path) as node:
        run(lambda: scenario(node.uri))


@pytest.mark.parametrize("offsets", [codec.encode_offsets([5, 3]), codec.encode_offsets([5, 5]),
                                     codec.encode_offsets([0, 200]), b"\x00" * 12],
                         ids=["descending", "repeated", "outside the range", "not whole offsets"])
def test_a_reply_that_lies_is_a_protocol_error(offsets: bytes) -> None:
    def lie(command: Command) -> Command | None:
        if isinstance(command, GetEventBoundaries):
            return EventBoundaries(command.request_id, command.segment, offsets)
        return None

    async def scenario() -> None:
        async with FakeServer(faults=Faults(error_reply=lie)) as server, client(server.uri) as c:
            with pytest.raises(ProtocolError, match="event boundaries"):
                await c.segments().event_boundaries(SEGMENT, 0, 100)

    run(scenario)


def test_the_blocking_client_offers_it_too(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as c:
        c.segments().create(SEGMENT)
        assert c.segments().event_boundaries(SEGMENT, 0, 100) == (0,)  # empty: its start is its length
