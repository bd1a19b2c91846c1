"""An event the reader's serializer refuses (issue 20 item 1): every event before it is delivered
first; it raises ``UndecodableEventError`` naming its segment, offset and length, with its raw bytes,
again and again, and the reader stays *at* it (position, checkpoints) until the application skips
it explicitly; nothing is skipped implicitly.  The blocking reader, the asyncio reader, and the
segment reader."""

from __future__ import annotations

from pathlib import Path

import pytest

import millstream
from millstream.client import (
    AsyncClient,
    EventRead,
    ReaderGroupConfig,
    ScalingPolicy,
    StreamConfig,
)
from millstream.errors import InvalidArgumentError, UndecodableEventError
from tests.readers.helpers import FAST, run

#: good1, good2, bytes that are not UTF-8, good3 -- the issue's sequence.
PAYLOADS = [b"good1", b"good2", b"\xff\xfe", b"good3"]
HEADER_BYTES = 8  # type 0 | length, before each payload


def offsets_of(payloads: list[bytes]) -> list[int]:
    offsets, offset = [], 0
    for payload in payloads:
        offsets.append(offset)
        offset += HEADER_BYTES + len(payload)
    return offsets


OFFSETS = offsets_of(PAYLOADS)
BAD = 2


def one_segment_stream(client: millstream.Client, name: str) -> str:
    manager = client.stream_manager()
    manager.create_scope(name.split("/", maxsplit=1)[0])
    manager.create_stream(name, StreamConfig(scaling=ScalingPolicy.fixed(1)))
    with client.event_writer(name) as writer:  # bytes, so the bad one can be written
        for payload in PAYLOADS:
            writer.write_event(payload, routing_key="k")
    (segment,) = [s.name for s in manager.current_segments(name).segments]
    return segment


def next_event(reader: millstream.client.EventStreamReader[str]) -> EventRead[str]:
    """The next event (skipping empty reads and checkpoints); a decoding error propagates."""
    for _ in range(100):
        read = reader.read_next_event(1.0)
        if read.event is not None:
            return read
    raise AssertionError("no event within 100 reads")


def checkpoint_while_stuck(reader: millstream.client.EventStreamReader[str]) -> str | None:
    """Read until the reader, stuck at the undecodable event, hands out a checkpoint: until it has
    learned of it (a loaded machine may take longer than one read's wait), it meets the event again."""
    for _ in range(100):
        try:
            read = reader.read_next_event(1.0)
        except UndecodableEventError:
            continue
        if read.checkpoint_name is not None:
            return read.checkpoint_name
        assert read.event is None, f"no event may pass the undecodable one: {read!r}"
    raise AssertionError("no checkpoint within 100 reads")


def test_the_blocking_reader_delivers_the_events_before_an_undecodable_one_then_stops_at_it(
        tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        segment = one_segment_stream(client, "s/a")
        group = client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
        reader = group.reader("r", millstream.StringSerializer(), config=FAST)
        first, second = next_event(reader), next_event(reader)
        assert (first.event, first.offset) == ("good1", OFFSETS[0])
        assert (second.event, second.offset) == ("good2", OFFSETS[1])
        # The bad event raises -- every time -- naming where it is, and the reader stays at it.
        for _ in range(3):
            with pytest.raises(UndecodableEventError) as raised:
                next_event(reader)
            error = raised.value
            assert isinstance(error, InvalidArgumentError)  # (what serializers raise: old handlers still match)
            assert (error.segment, error.offset, error.length) == (segment, OFFSETS[BAD], len(PAYLOADS[BAD]))
            assert error.next_offset == OFFSETS[BAD + 1] and error.payload == PAYLOADS[BAD]
            assert segment in str(error) and str(OFFSETS[BAD]) in str(error)
            assert reader.position().segments == {segment: OFFSETS[BAD]}
        # A checkpoint taken while it is stuck records the bad event's offset: it was not processed.
        future = group.initiate_checkpoint("stuck", timeout=20)
        assert checkpoint_while_stuck(reader) == "stuck"
        with pytest.raises(UndecodableEventError):
            reader.read_next_event(1.0)  # (records the checkpoint first, then meets the event again)
        assert future.result(20).cuts["s/a"].segment_names() == {segment: OFFSETS[BAD]}
        # Skipping is explicit, for exactly that event; then good3 follows.
        reader.skip(error.event_read)
        assert reader.position().segments == {segment: OFFSETS[BAD + 1]}
        third = next_event(reader)
        assert (third.event, third.offset) == ("good3", OFFSETS[3])
        with pytest.raises(InvalidArgumentError, match=r"(not|no longer) .* next event"):
            reader.skip(error.event_read)  # once skipped, it is not the next event any more
        reader.close()
        # Leaving at its position: the group restarts after good3 (the skip counted as processed).
        assert dict(group.state().unassigned) == {segment: OFFSETS[3] + HEADER_BYTES + len(PAYLOADS[3])}
        group.close()


def test_the_blocking_reader_skips_only_the_event_it_is_at(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        segment = one_segment_stream(client, "s/a")
        group = client.reader_group("s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
        reader = group.reader("r", millstream.StringSerializer(), config=FAST)
        first = next_event(reader)
        with pytest.raises(InvalidArgumentError, match=r"(not|no longer) .* next event"):
            reader.skip(first)  # returned already
        elsewhere = EventRead(None, "s/a", segment, OFFSETS[3], OFFSETS[3] + HEADER_BYTES + len(PAYLOADS[3]))
        with pytest.raises(InvalidArgumentError, match=r"(not|no longer) .* next event"):
            reader.skip(elsewhere)  # not the next event: nothing is skipped
        assert next_event(reader).event == "good2"
        with pytest.raises(InvalidArgumentError):
            reader.skip("the bad one")  # type: ignore[arg-type]
        reader.close()
        group.close()


def test_the_asyncio_reader_delivers_stops_and_skips_the_same_way(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            group = await client.reader_group(
                "s/g", config=ReaderGroupConfig(["s/a"], automatic_checkpoint_seconds=0))
            reader = await group.reader("r", millstream.StringSerializer(), config=FAST)
            values = []
            error: UndecodableEventError | None = None
            for _ in range(100):
                try:
                    read = await reader.read_next_event(1.0)
                except UndecodableEventError as raised:
                    error = raised
                    break
                if read.event is not None:
                    values.append(read.event)
            assert values == ["good1", "good2"] and error is not None
            assert (error.segment, error.offset, error.length) == (segment, OFFSETS[BAD], len(PAYLOADS[BAD]))
            assert reader.position().segments == {segment: OFFSETS[BAD]}
            with pytest.raises(UndecodableEventError):
                await reader.read_next_event(1.0)  # again: nothing skipped
            reader.skip(error.event_read)
            assert reader.position().segments == {segment: OFFSETS[BAD + 1]}
            # A checkpoint after the skip records the position after the skipped event (and after good3
            # if the reader returned it before it noticed the checkpoint).
            checkpoint = await group.initiate_checkpoint("skipped", timeout=20)
            returned: list[EventRead[str]] = []
            for _ in range(100):
                read = await reader.read_next_event(1.0)
                if read.checkpoint_name == "skipped":
                    break
                if read.event is not None:
                    returned.append(read)
            assert read.checkpoint_name == "skipped"
            expected = returned[-1].next_offset if returned else OFFSETS[BAD + 1]
            for _ in range(100):  # the next call records the checkpoint (then returns good3, if it is left)
                read = await reader.read_next_event(1.0 if not returned else 0.0)
                if read.event is not None:
                    returned.append(read)
                if returned:
                    break
            assert [(r.event, r.offset) for r in returned] == [("good3", OFFSETS[3])]
            assert (await checkpoint).cuts["s/a"].segment_names() == {segment: expected}
            await reader.close()
            await group.close()

    with millstream.standalone(tmp_path) as node:
        with millstream.connect(node.uri) as client:
            segment = one_segment_stream(client, "s/a")
        run(scenario)


def test_the_segment_reader_names_the_undecodable_event_and_stays_before_it(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        segment = one_segment_stream(client, "s/a")
        reader = client.segment_reader(segment, millstream.StringSerializer())
        assert [e.value for e in reader.read_events()] == ["good1", "good2"]
        for _ in range(2):
            with pytest.raises(UndecodableEventError) as raised:
                reader.read_events()
            assert (raised.value.segment, raised.value.offset, raised.value.length) == (
                segment, OFFSETS[BAD], len(PAYLOADS[BAD]))
            assert reader.offset == OFFSETS[BAD]
        reader.seek(raised.value.next_offset)
        assert [e.value for e in reader.read_events()] == ["good3"]
        reader.close()
