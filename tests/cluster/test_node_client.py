"""Clients find their way in a cluster (issue 23): a writer whose server goes away (its connection is
lost: the host died or the container moved) asks where the segment lives again instead of retrying
the cached host until its budget runs out, and delivers every event once."""

from __future__ import annotations

from millstream.client import AsyncClient
from millstream.client._config import Endpoint, parse_uri
from millstream.wire.commands import AppendBlock
from tests.client.fake_server import FakeSegment, FakeServer, Faults
from tests.client.helpers import fast_config, run


class MovingLocator:
    """Says ``old`` until told to forget, then ``new``: a segment whose container moved."""

    def __init__(self, old: Endpoint, new: Endpoint) -> None:
        self.old, self.new = old, new
        self.forgotten = 0

    async def endpoint_for(self, segment: str) -> Endpoint:
        return self.new if self.forgotten else self.old

    def forget(self, segment: str) -> None:
        self.forgotten += 1


def test_a_writer_whose_connection_is_lost_asks_again_where_the_segment_lives() -> None:
    def always_cut(block: AppendBlock) -> str:
        return "before"  # the old host never stores anything: its connection drops with each block

    async def scenario() -> None:
        async with FakeServer(faults=Faults(cut=always_cut)) as old, FakeServer() as new:
            for server in (old, new):
                server.segments["s"] = FakeSegment()
            locator = MovingLocator(parse_uri(old.uri), parse_uri(new.uri))
            async with AsyncClient(old.uri, config=fast_config(), locator=locator) as client, \
                    client.event_writer(["s"]) as writer:
                for index in range(10):
                    await writer.write_event(b"event %d" % index)
                await writer.flush()
            assert locator.forgotten >= 1
            assert new.payloads("s") == [b"event %d" % index for index in range(10)]  # each once, in order
            assert old.payloads("s") == []
    run(scenario)


def test_a_read_whose_host_went_away_asks_again_where_the_segment_lives() -> None:
    async def scenario() -> None:
        async with FakeServer() as new:
            new.segments["s"] = FakeSegment(bytearray(b"on the new host"))
            async with FakeServer() as old:
                old.segments["s"] = FakeSegment(bytearray(b"on the old host"))
                locator = MovingLocator(parse_uri(old.uri), parse_uri(new.uri))
                client = AsyncClient(old.uri, config=fast_config(), locator=locator)
                assert (await client.segments().read("s", 0)).data == b"on the old host"
            # The old host is gone (its container moved): the next read finds the new one.
            try:
                assert (await client.segments().read("s", 0)).data == b"on the new host"
                assert locator.forgotten >= 1
            finally:
                await client.close()
    run(scenario)
