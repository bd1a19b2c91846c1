"""The state synchronizer against ``millstream.standalone``: conflicting writers converge (a stale
writer re-reads and retries), refused updates write nothing, an append whose outcome was unknown is
applied once, compaction truncates and lagging readers recover from the full state, a long poll
wakes on another writer's update, and a corrupt segment is reported, not applied."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

import millstream
from millstream.client import AsyncClient, StateSynchronizer
from millstream.client._segments import AsyncSegments
from millstream.client._state_synchronizer import NewState
from millstream.errors import ConnectionLostError, DataCorruptionError, InvalidArgumentError
from tests.readers.helpers import run

SEGMENT = "sync/state"  # (any segment a client may create; reader groups use theirs, made by the controller)


class ListCodec:
    """A state that is a tuple of ints; an update appends one (negative ones are refused)."""

    def encode_state(self, state: tuple[int, ...]) -> Any:
        return list(state)

    def decode_state(self, value: Any) -> tuple[int, ...]:
        return tuple(value)

    def encode_update(self, update: int) -> Any:
        return update

    def decode_update(self, value: Any) -> int:
        return int(value)

    def apply(self, state: tuple[int, ...], update: int) -> tuple[int, ...]:
        if update < 0:
            raise InvalidArgumentError(f"refused: {update}")
        return (*state, update)


def synchronizer(segments: AsyncSegments, *, seed: int = 0, **options: Any) -> StateSynchronizer[Any, Any]:
    return StateSynchronizer(segments, SEGMENT, ListCodec(), rng=random.Random(seed), **options)


def initial(state: tuple[int, ...] | None) -> NewState[tuple[int, ...]] | None:
    return NewState(()) if state is None else None


def test_conflicting_writers_converge_and_refused_updates_write_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as first, AsyncClient(node.uri) as second:
            await first.segments().create(SEGMENT)
            a, b = synchronizer(first.segments(), seed=1), synchronizer(second.segments(), seed=2)
            assert await a.update(initial) and not await b.update(initial)  # b found the state a wrote
            assert await a.update(lambda s: [1])
            assert await b.update(lambda s: [2])  # b was behind: refused, re-read, planned again
            assert b.conflicts == 1 and b.state == (1, 2)
            # Both write at once, many times: every update lands once, and both agree.
            await asyncio.gather(*(x.update(lambda s, v=v: [v]) for v in range(10, 30) for x in (a, b)))
            await a.fetch_updates()
            await b.fetch_updates()
            assert a.state == b.state and sorted(a.state[2:]) == sorted([*range(10, 30), *range(10, 30)])
            length = (await first.segments().info(SEGMENT)).length
            with pytest.raises(InvalidArgumentError):
                await a.update(lambda s: [3, -1])  # one refused update refuses the record
            assert (await first.segments().info(SEGMENT)).length == length and a.offset == length
            assert not await a.update(lambda s: None) and not await a.update(lambda s: [])

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_compaction_truncates_and_a_lagging_reader_recovers(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            segments = client.segments()
            await segments.create(SEGMENT)
            writer = synchronizer(segments, compaction_bytes=300)
            lagging = synchronizer(segments)
            await writer.update(initial)
            await lagging.fetch_updates()
            for value in range(60):
                await writer.update(lambda s, v=value: [v])
            assert writer.compactions >= 2
            info = await segments.info(SEGMENT)
            assert info.start_offset > 0  # truncated before the last full state
            await lagging.fetch_updates()  # its offset lies below the start now: it restarts there
            fresh = synchronizer(segments)
            await fresh.fetch_updates()
            assert lagging.state == fresh.state == writer.state == tuple(range(60))

    with millstream.standalone(tmp_path) as node:
        run(scenario)


class LosesReplies:
    """Segments whose next conditional append lands but whose reply is lost (a broken connection)."""

    def __init__(self, inner: AsyncSegments) -> None:
        self.inner = inner
        self.lose_next = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def conditional_append(self, segment: str, events: Any, *, expected_offset: int) -> int:
        length = await self.inner.conditional_append(segment, events, expected_offset=expected_offset)
        if self.lose_next:
            self.lose_next = False
            raise ConnectionLostError("the reply was lost")
        return length


def test_an_update_whose_outcome_was_unknown_is_applied_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await client.segments().create(SEGMENT)
            flaky = LosesReplies(client.segments())
            sync = synchronizer(flaky)  # type: ignore[arg-type]
            await sync.update(initial)
            flaky.lose_next = True
            assert await sync.update(lambda s: [7])  # it finds its own record and stops
            other = synchronizer(client.segments())
            await other.fetch_updates()
            assert sync.state == other.state == (7,)

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_a_long_poll_wakes_on_another_writers_update_and_corruption_is_reported(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            segments = client.segments()
            await segments.create(SEGMENT)
            writer, watcher = synchronizer(segments), synchronizer(segments)
            await writer.update(initial)
            await watcher.fetch_updates()
            loop = asyncio.get_running_loop()
            started = loop.time()
            waiting = loop.create_task(watcher.wait_for_change(10.0))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            await writer.update(lambda s: [5])
            assert await waiting and watcher.state == (5,) and loop.time() - started < 5
            assert not await watcher.wait_for_change(0.05)  # nothing new: the poll times out
            # Bytes that are not a record (not JSON) are corruption, not state.
            await segments.conditional_append(SEGMENT, [b"not json"], expected_offset=writer.offset)
            with pytest.raises(DataCorruptionError):
                await synchronizer(segments).fetch_updates()

    with millstream.standalone(tmp_path) as node:
        run(scenario)
