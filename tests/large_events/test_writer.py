"""The large-event writer against a node over TCP: events appear whole and in call order among the
writer's ordinary events, inline ones take no transient segment, several may be open at once, aborts
and failures leave no trace, a reconnect in the middle of an event resends without duplication, an
expired transient segment or a sealed target fails the event with a retryable error (and a retry
succeeds), and bad input gets typed errors with nothing merged."""

from __future__ import annotations

import asyncio
import mmap
from pathlib import Path

import pytest

from millstream import limits
from millstream.client import AsyncEventWriter, EventWriterPhase, LargeEventConfig, routing_key_fraction
from millstream.errors import (
    InvalidArgumentError,
    LargeEventFailedError,
    ObjectClosedError,
    PayloadTooLargeError,
    RetryableError,
    TransientSegmentError,
)
from millstream.testing.history import EventTag
from tests.large_events.helpers import (
    SMALL,
    create_stream,
    decode_events,
    large_payload,
    node_and_client,
    run,
    segment_bytes,
    stream_events,
)


async def stream_into(writer: AsyncEventWriter, payload: bytes, piece: int = 700) -> None:
    for start in range(0, len(payload), piece):
        await writer.write(payload[start:start + piece])


def test_events_appear_whole_and_in_call_order_with_ordinary_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (node, client):
            await create_stream(client, "le/one")
            server = node.server
            assert server is not None
            writer = client.large_event_writer("le/one", config=SMALL)
            big = [large_payload(EventTag("big", n), 9_000 + 1_000 * n, key="k") for n in range(3)]
            inline = large_payload(EventTag("inline", 1), 3_000, key="k")
            await writer.write_event(b"ordinary-1", routing_key="k")
            first = writer.stream_event("k")
            await stream_into(first, big[0])
            assert first.transient_segment is not None and first.phase is EventWriterPhase.OPEN
            await writer.write_event(b"ordinary-2", routing_key="k")  # written before the commit: lands before
            await first.commit()
            assert first.phase is EventWriterPhase.COMMITTED and first.transient_segment is None
            # Two open at once: the later one is committed first, and lands first.
            slow, fast = writer.stream_event("k"), writer.stream_event("k")
            await stream_into(slow, big[1][:5000])
            await stream_into(fast, big[2])
            small = writer.stream_event("k")
            await small.write(inline)
            await fast.commit()
            created_before_inline = server.transients.created_total
            await small.commit()  # at most the inline limit: one plain append, no transient segment
            assert small.inline and server.transients.created_total == created_before_inline
            await stream_into(slow, big[1][5000:])
            await writer.write_event(b"ordinary-3", routing_key="k")
            await slow.commit()
            # An aborted one leaves nothing, in the segment or among the transient segments.
            aborted = writer.stream_event("k")
            await stream_into(aborted, large_payload(EventTag("aborted", 1), 20_000))
            await aborted.close()
            assert aborted.phase is EventWriterPhase.ABORTED
            await writer.close()
            (events,) = (await stream_events(client, "le/one")).values()
            assert events == [b"ordinary-1", b"ordinary-2", big[0], big[2], inline, b"ordinary-3", big[1]]
            assert len(server.transients) == 0
            assert server.transients.deleted_by["abort"] >= 1
            names = server.container_for("le/one/0.#epoch.0").segment_names()
            assert [n for n in names if "#transient." in n] == []
    run(scenario)


def test_a_reconnect_in_the_middle_of_an_event_resends_without_duplicating(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/cut")
            writer = client.large_event_writer("le/cut", config=SMALL)
            payload = large_payload(EventTag("cut", 1), 60_000)
            event = writer.stream_event("k")
            cuts = 0
            for start in range(0, len(payload), 3_000):
                await event.write(payload[start:start + 3_000])
                if start % 12_000 == 0:
                    for connection in client.pool.connections():  # every connection breaks at once
                        connection.close()
                    cuts += 1
            await event.commit()
            pipeline_reconnects = event.pipeline.reconnects if event.pipeline else 0
            assert pipeline_reconnects >= 1, "the pipeline never had to reconnect: the test cut nothing"
            (events,) = (await stream_events(client, "le/cut")).values()
            assert events == [payload], "the event must appear once, whole, byte for byte"
            await writer.close()
    run(scenario)


def test_an_expired_transient_segment_fails_the_event_with_a_retryable_error_and_a_retry_succeeds(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path, transient_idle_seconds=0.3,
                                   transient_sweep_interval_seconds=0.05) as (node, client):
            await create_stream(client, "le/idle")
            writer = client.large_event_writer("le/idle", config=SMALL)
            payload = large_payload(EventTag("idle", 1), 12_000)
            stale = writer.stream_event("k")
            await stream_into(stale, payload[:8_000])
            await stale.flush()
            await asyncio.sleep(0.6)  # the application stops streaming: the store's idle sweep deletes it
            assert node.server is not None and node.server.transients.deleted_by["idle"] == 1
            with pytest.raises(LargeEventFailedError, match="nothing of it was merged") as failed:
                await stream_into(stale, payload[8_000:])
                await stale.commit()
            assert isinstance(failed.value, RetryableError) and stale.phase is EventWriterPhase.FAILED
            with pytest.raises(LargeEventFailedError):
                await stale.commit()
            # Write it again: it goes through.
            again = writer.stream_event("k")
            await stream_into(again, payload)
            await again.commit()
            await writer.close()
            (events,) = (await stream_events(client, "le/idle")).values()
            assert events == [payload]
    run(scenario)


def test_a_large_event_across_a_seal_of_its_target_fails_and_goes_to_the_successor_when_retried(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (_, client):
            await create_stream(client, "le/scale")
            writer = client.large_event_writer("le/scale", config=SMALL)
            await writer.write_event(b"before", routing_key="k")
            payload = large_payload(EventTag("scale", 1), 15_000)
            event = writer.stream_event("k")
            await stream_into(event, payload)
            sealed = (await client.stream_manager().current_segments("le/scale")).segments[0]
            await client.stream_manager().scale_stream("le/scale", [sealed.segment_id], [(0.0, 0.5), (0.5, 1.0)])
            with pytest.raises(LargeEventFailedError, match="nothing of it was merged"):
                await event.commit()
            retry = writer.stream_event("k")
            await stream_into(retry, payload)
            await retry.commit()
            await writer.write_event(b"after", routing_key="k")
            await writer.close()
            successors = await client.stream_manager().current_segments("le/scale")
            target = successors.segment_for(routing_key_fraction("k")).name
            by_segment = await stream_events(client, "le/scale")
            assert by_segment[target] == [payload, b"after"]
            assert decode_events(await segment_bytes(client, sealed.name)) == [b"before"]
    run(scenario)


def test_bad_input_gets_typed_errors_and_merges_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node_and_client(tmp_path) as (node, client):
            await create_stream(client, "le/bad")
            writer = client.large_event_writer("le/bad", config=SMALL)
            # Over 1 GiB in one write (the default limit; the memory is never touched, let alone sent).
            huge = mmap.mmap(-1, limits.LARGE_EVENT_LENGTH_BYTES_MAX + 1)
            try:
                over = writer.stream_event("k")
                await over.write(b"x" * 5_000)
                with pytest.raises(PayloadTooLargeError, match="nothing of it is merged"):
                    await over.write(memoryview(huge))
                assert over.phase is EventWriterPhase.ABORTED
            finally:
                huge.close()
            # Over the limit bit by bit (a smaller limit, same rule).
            tight = client.large_event_writer("le/bad", config=LargeEventConfig(
                inline_bytes_max=1024, chunk_bytes=512, unacked_bytes_max=2048, event_length_max=6_000))
            creeping = tight.stream_event("k")
            await creeping.write(b"y" * 5_000)
            with pytest.raises(PayloadTooLargeError):
                await creeping.write(b"y" * 1_001)
            with pytest.raises(ObjectClosedError):
                await creeping.commit()
            # Commit after close, writes and commits after commit.
            closed = writer.stream_event("k")
            await closed.write(b"z" * 9_000)
            await closed.close()
            with pytest.raises(ObjectClosedError):
                await closed.commit()
            with pytest.raises(ObjectClosedError):
                await closed.write(b"more")
            done = writer.stream_event("k")
            await done.write(b"w" * 100)
            await done.commit()
            with pytest.raises(ObjectClosedError):
                await done.write(b"after commit")
            with pytest.raises(ObjectClosedError):
                await done.commit()
            with pytest.raises(InvalidArgumentError):
                await writer.stream_event("k").write("not bytes")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError):
                writer.stream_event(17)  # type: ignore[arg-type]
            # A transient segment named as a target: by a list, by a router, as a byte stream.
            target = "le/bad/0.#epoch.0"
            transient = f"{target}#transient.0123"
            with pytest.raises(TransientSegmentError):
                client.large_event_writer([transient])
            routed = client.large_event_writer(_FixedRouter(transient), config=SMALL)
            misrouted = routed.stream_event("k")
            with pytest.raises(LargeEventFailedError, match="TransientSegmentError"):
                await misrouted.write(b"v" * 5_000)
            with pytest.raises(TransientSegmentError):
                await client.byte_stream_writer(transient)
            await routed.close()
            await tight.close()
            await writer.close()
            (events,) = (await stream_events(client, "le/bad")).values()
            assert events == [b"w" * 100], "nothing but the one committed event was merged"
            assert node.server is not None and len(node.server.transients) == 0
    run(scenario)


class _FixedRouter:
    """A router that sends every key to one segment (here: a transient segment's name)."""

    def __init__(self, segment: str) -> None:
        self.segment = segment

    def segment_for(self, routing_key: str | None) -> str:
        return self.segment


def test_the_blocking_flavour_over_named_segments(tmp_path: Path) -> None:
    import millstream
    from millstream.client import connect

    with millstream.standalone(tmp_path) as node, connect(node.uri) as client:
        client.segments().create("le/b/0")
        with client.large_event_writer(["le/b/0"], config=SMALL) as writer:
            writer.write_event(b"first")
            with writer.stream_event("k") as event:
                for _ in range(10):
                    assert event.write(b"0123456789" * 100) == 1000
                event.flush()
                event.commit()
            assert event.phase is EventWriterPhase.COMMITTED
            with writer.stream_event() as abandoned:
                abandoned.write(b"a" * 9_000)  # left without commit: aborted by the with block
            assert abandoned.phase is EventWriterPhase.ABORTED
        reader = client.segment_reader("le/b/0")
        events = [e.value for e in reader.read_events()]
        assert events == [b"first", b"0123456789" * 1000]
        reader.close()
