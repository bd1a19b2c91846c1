"""Helpers for the reader-group tests against ``millstream.standalone``: a writer that routes routing
keys by the controller's key ranges of the current epoch (until the stream-aware writer lands), tagged
payloads for the history checker, and readers drained by tasks of their own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import attrs

from millstream.client import AsyncClient, AsyncEventStreamReader, ReaderConfig, routing_key_fraction
from millstream.client._streams import StreamSegments
from millstream.testing.history import EventTag, History, Outcome

#: Readers in tests rebalance on a short time unit and heartbeat often, so tests take seconds.
FAST = ReaderConfig(time_unit_seconds=0.02, heartbeat_seconds=0.05, offline_timeout_seconds=0.0,
                    tail_wait_seconds=2.0)
SCENARIO_TIMEOUT_SECONDS = 45.0


def run(scenario: Callable[[], Awaitable[None]], seconds: float = SCENARIO_TIMEOUT_SECONDS) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), seconds)
    asyncio.run(bounded())


class EpochRouter:
    """Routes a routing key to the segment of ``segments`` (one epoch) whose key range holds it."""

    def __init__(self, segments: StreamSegments) -> None:
        self._segments = segments

    def segment_for(self, routing_key: str | None) -> str:
        assert routing_key is not None
        return self._segments.segment_for(routing_key_fraction(routing_key)).name


class TaggedWriter:
    """Writes tagged events (writer ``name``, sequence numbers from 1) with routing keys into the
    current epoch of a stream, recording each in ``history``; flushes before returning."""

    def __init__(self, client: AsyncClient, stream: str, history: History, name: str = "w") -> None:
        self.client = client
        self.stream = stream
        self.history = history
        self.name = name
        self.sequence = 0
        self.keys: dict[int, str] = {}

    async def write(self, count: int, keys: Sequence[str]) -> list[EventTag]:
        segments = await self.client.stream_manager().current_segments(self.stream)
        writer = self.client.event_writer(EpochRouter(segments))
        tags = []
        for index in range(count):
            self.sequence += 1
            key = keys[index % len(keys)]
            tag = EventTag(self.name, self.sequence)
            self.history.write_invoked(tag, key=key)
            self.keys[self.sequence] = key
            await writer.write_event(tag.payload(64, key=key), routing_key=key)
            tags.append(tag)
        await writer.flush()
        await writer.close()
        self.history.writes_completed(tags, Outcome.ACKED)
        return tags


@attrs.define
class Drain:
    """A reader read by a task of its own until ``stop`` is set: every event (in the order the group
    returned them, shared with the other drains in ``log``), every checkpoint it surfaced."""

    reader: AsyncEventStreamReader[bytes]
    log: list[tuple[str, bytes]]
    stop: asyncio.Event
    checkpoints: list[str] = attrs.field(factory=list)
    events: list[bytes] = attrs.field(factory=list)
    before_checkpoint: dict[str, list[bytes]] = attrs.field(factory=dict)
    ended: bool = False
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None

    def start(self) -> Drain:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        try:
            while not self.stop.is_set():
                read = await self.reader.read_next_event(0.05)
                if read.checkpoint_name is not None:
                    self.checkpoints.append(read.checkpoint_name)
                    self.before_checkpoint[read.checkpoint_name] = list(self.events)
                elif read.event is not None:
                    self.events.append(read.event)
                    self.log.append((self.reader.reader_id, read.event))
                elif read.end_of_stream:
                    self.ended = True
                    await asyncio.sleep(0.01)  # (nothing more will come)
        except Exception as error:  # reported by the test through ``error``
            self.error = error

    async def join(self) -> None:
        assert self.task is not None
        await self.task
        if self.error is not None:
            raise self.error


async def wait_until(condition: Callable[[], bool], seconds: float = 20.0, what: str = "") -> None:
    """Poll ``condition`` (every 10 ms) until it holds; fail after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.01)


def tags_of(payloads: Sequence[bytes]) -> list[EventTag]:
    tags = [EventTag.parse(p) for p in payloads]
    assert all(t is not None for t in tags)
    return tags  # type: ignore[return-value]


def record(history: History, pass_name: str, payloads: Sequence[bytes], *, complete: bool = False) -> None:
    history.read_all(pass_name, payloads, complete=complete)
