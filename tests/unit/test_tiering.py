"""Tiered storage in one container: flush to Tier 2, eviction and reads back, log truncation and
recovery from a truncated log, reconciliation after a restart, throttling, fencing of a stale owner.

Every scenario runs on the simulated log and the simulated chunk storage, and ends by recovering a
fresh container from what the tiers hold and comparing every segment's bytes with what was
acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

import pytest

from millstream.errors import (
    ContainerUnavailableError,
    DataCorruptionError,
    StreamSegmentTruncatedError,
)
from millstream.segmentstore.container import ContainerState, SegmentContainer, StorageSettings
from millstream.segmentstore.read_index import BLOCK_LENGTH_BYTES
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage

SCENARIO_TIMEOUT_SECONDS = 30.0
#: Small thresholds, so a few appends exercise every path.
SMALL = StorageSettings(cache_bytes_max=2 * BLOCK_LENGTH_BYTES, catch_up_cache_bytes_max=4 << 20,
                        flush_bytes_min=64 * 1024, flush_bytes_max=256 * 1024, flush_age_seconds=0.05,
                        unflushed_bytes_max=8 << 20)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS)
    asyncio.run(bounded())


class Tiers:
    """A log and a chunk storage that outlive the containers built on them."""

    def __init__(self, seed: int = 0) -> None:
        self.log = SimulatedLogStorage()
        self.lts = SimulatedChunkStorage(rng=random.Random(seed))

    def container(self, settings: StorageSettings = SMALL, checkpoint_frame_count: int = 4) -> SegmentContainer:
        return SegmentContainer(7, SimulatedDurableDataLog(self.log), chunk_storage=self.lts,
                                storage_settings=settings, checkpoint_frame_count=checkpoint_frame_count)


async def read_all(container: SegmentContainer, name: str) -> bytes:
    info = container.get_info(name)
    offset, parts = info.start_offset, []
    while offset < info.length:
        result = await container.read(name, offset, info.length - offset)
        assert result.data, f"an empty read at {offset} of {info.length}"
        parts.append(result.data)
        offset += len(result.data)
    return b"".join(parts)


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def test_flushed_bytes_are_evicted_read_back_from_tier_two_and_survive_log_truncation() -> None:
    async def scenario() -> None:
        tiers = Tiers()
        container = tiers.container()
        await container.start()
        await container.create_segment("s")
        written = b"".join(payload(i, 50_000) for i in range(40))
        for i in range(40):
            await container.append("s", written[i * 50_000:(i + 1) * 50_000])
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: container.get_info("s").storage_length == len(written), "everything is in Tier 2")
        await until(lambda: writer.log_truncations > 0, "the log is truncated")
        assert container.read_index.cached_bytes <= SMALL.cache_bytes_max, "flushed bytes are evicted"
        before = container.read_index.tier_two_reads
        assert await read_all(container, "s") == written
        assert container.read_index.tier_two_reads > before, "evicted bytes came back from Tier 2"
        assert tiers.log.truncated_through > 0
        await container.stop()

        recovered = tiers.container()
        await recovered.start()
        assert await read_all(recovered, "s") == written
        recovered.check_invariants()
        await recovered.stop()
    run(scenario)


def test_seal_merge_truncate_delete_keep_the_layout_and_collect_garbage() -> None:
    async def scenario() -> None:
        tiers = Tiers(1)
        container = tiers.container()
        await container.start()
        for name in ("target", "source", "doomed"):
            await container.create_segment(name)
        target, source = payload(1, 300_000), payload(2, 200_000)
        await container.append("target", target)
        await container.append("source", source)
        await container.append("doomed", payload(3, 100_000))
        await container.seal("source")
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: writer.unflushed_bytes == 0, "all flushed")
        assert await container.merge("target", "source") == len(target)
        await container.append("target", b"tail")
        await container.truncate("target", 270_000)
        await container.delete("doomed")
        await until(lambda: writer.unflushed_bytes == 0 and writer.deleted_chunks > 0, "flushed and collected")
        expected = (target + source + b"tail")[270_000:]
        assert await read_all(container, "target") == expected
        referenced = {span.chunk for segment in container._metadata.segments.values() for span in segment.spans}
        assert set(tiers.lts.chunks()) == referenced, "every chunk left is referenced"
        await container.stop()

        recovered = tiers.container()
        await recovered.start()
        assert await read_all(recovered, "target") == expected
        assert recovered.segment_names() == ["target"]
        await recovered.stop()
    run(scenario)


def test_a_restart_verifies_and_adopts_bytes_already_in_tier_two_instead_of_rewriting_them() -> None:
    async def scenario() -> None:
        tiers = Tiers(2)
        # A huge flush threshold and age: nothing is flushed by the first owner on its own.
        lazy = StorageSettings(flush_bytes_min=1 << 40, flush_age_seconds=3600.0)
        first = tiers.container(lazy)
        await first.start()
        await first.create_segment("s")
        data = payload(4, 100_000)
        await first.append("s", data)
        first_writer = first.storage_writer
        assert first_writer is not None
        # The first owner wrote a chunk but died before its flush operation reached the log.
        segment = first._metadata.get("s")
        assert segment is not None
        name = f"c7/s{segment.id}/{0:020d}.e{first._metadata.epoch}.1"
        await tiers.lts.create(name)
        await tiers.lts.write(name, 0, data[:60_000])
        first.kill()

        second = tiers.container()
        await second.start()
        writer = second.storage_writer
        assert writer is not None
        await until(lambda: writer.unflushed_bytes == 0, "flushed")
        assert writer.reconciled_bytes == 60_000, "the bytes already there were adopted"
        assert writer.flushed_bytes == 40_000, "only the rest was written"
        assert await read_all(second, "s") == data
        await second.stop()
    run(scenario)


def test_a_slow_tier_two_throttles_appends_and_nothing_is_lost() -> None:
    async def scenario() -> None:
        tiers = Tiers(3)
        settings = StorageSettings(flush_bytes_min=16 * 1024, flush_bytes_max=64 * 1024, flush_age_seconds=0.01,
                                   unflushed_bytes_max=256 * 1024, cache_bytes_max=BLOCK_LENGTH_BYTES)
        container = tiers.container(settings)
        await container.start()
        await container.create_segment("s")
        tiers.lts.faults.slowness_seconds = 0.02
        writer = container.storage_writer
        assert writer is not None
        written = []
        peak = 0
        for i in range(60):
            chunk = payload(100 + i, 20_000)
            await container.append("s", chunk)
            written.append(chunk)
            peak = max(peak, writer.unflushed_bytes)
        assert container.throttled_appends > 0, "appends waited for Tier 2"
        # Bounded: at most the limit plus one append's bytes (and what one flush round had in flight).
        assert peak <= settings.unflushed_bytes_max + 20_000
        tiers.lts.faults.slowness_seconds = 0.0
        await until(lambda: writer.unflushed_bytes == 0, "caught up")
        assert await read_all(container, "s") == b"".join(written)
        await container.stop()
    run(scenario)


def test_tier_two_failures_are_retried_and_torn_chunk_writes_are_never_referenced() -> None:
    async def scenario() -> None:
        tiers = Tiers(4)
        container = tiers.container()
        await container.start()
        await container.create_segment("s")
        tiers.lts.fail_writes(None)
        data = payload(5, 400_000)
        await container.append("s", data)
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: writer.storage_failures >= 3, "flushes failed and were retried")
        assert container.state is ContainerState.RUNNING
        assert container.get_info("s").storage_length == 0
        tiers.lts.heal()
        await until(lambda: writer.unflushed_bytes == 0, "flushed after healing")
        assert await read_all(container, "s") == data
        await container.stop()
        recovered = tiers.container()
        await recovered.start()
        assert await read_all(recovered, "s") == data
        await recovered.stop()
    run(scenario)


def test_a_new_owner_fences_the_old_one_in_both_tiers() -> None:
    async def scenario() -> None:
        tiers = Tiers(5)
        lazy = StorageSettings(flush_bytes_min=1 << 40, flush_age_seconds=3600.0)
        old = tiers.container(lazy)
        await old.start()
        await old.create_segment("s")
        acknowledged = payload(6, 90_000)
        await old.append("s", acknowledged)

        new = tiers.container()
        await new.start()
        # The old owner's next log write fails: it stops, and its appends fail retryably.
        with pytest.raises(ContainerUnavailableError):
            await old.append("s", b"lost")
        await until(lambda: old.state is ContainerState.STOPPED, "the old owner stopped")
        new_writer = new.storage_writer
        assert new_writer is not None
        await until(lambda: new_writer.unflushed_bytes == 0, "the new owner flushed")
        # The old owner's chunk writes (were it to make any) land in chunks nobody references.
        referenced = {span.chunk for segment in new._metadata.segments.values() for span in segment.spans}
        assert all(f".e{new._metadata.epoch}." in chunk for chunk in referenced)
        assert await read_all(new, "s") == acknowledged
        await new.stop()
    run(scenario)


def test_reads_below_the_start_offset_and_a_missing_chunk_are_typed_errors() -> None:
    async def scenario() -> None:
        tiers = Tiers(6)
        container = tiers.container()
        await container.start()
        await container.create_segment("s")
        await container.append("s", payload(7, 300_000))
        await container.truncate("s", 10)
        with pytest.raises(StreamSegmentTruncatedError):
            await container.read("s", 9, 10)
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: writer.unflushed_bytes == 0, "flushed")
        await container.stop()
        for name in list(tiers.lts.chunks()):
            await tiers.lts.delete(name)
        broken = tiers.container()
        await broken.start()
        await until(lambda: broken.state is ContainerState.STOPPED, "the container refused to serve")
        assert isinstance(await broken.stopped, DataCorruptionError)
    run(scenario)


def test_a_catch_up_reader_does_not_push_the_tail_out_of_memory() -> None:
    async def scenario() -> None:
        tiers = Tiers(7)
        container = tiers.container()
        await container.start()
        await container.create_segment("cold")
        await container.create_segment("hot")
        cold = b"".join(payload(200 + i, 100_000) for i in range(20))
        for i in range(20):
            await container.append("cold", cold[i * 100_000:(i + 1) * 100_000])
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: container.get_info("cold").storage_length == len(cold), "cold is in Tier 2")
        await until(lambda: container.read_index.cached_bytes <= SMALL.cache_bytes_max, "cold is evicted")
        hot = payload(300, 1000)
        await container.append("hot", hot)
        cached = container.read_index.cached_bytes
        assert await read_all(container, "cold") == cold  # the catch-up read: from Tier 2
        assert container.read_index.cached_bytes == cached, "catch-up blocks are not cached as tail data"
        before = container.read_index.tier_two_reads
        assert (await container.read("hot", 0, 1000)).data == hot
        assert container.read_index.tier_two_reads == before, "the tail is still served from memory"
        await container.stop()
    run(scenario)


def test_a_segment_written_without_pause_is_flushed_by_age_once_per_age_not_at_every_turn() -> None:
    """The age rule is per byte: after a flush that took every unflushed byte, what arrived meanwhile
    is as old as that flush, not as old as the segment's first unflushed byte.  (It once was: a segment
    written without pause was over the age for good after the first one, and was flushed again at
    every turn of the writer, a few KB at a time.)"""
    age = 0.25  # long beside a flush here (tens of ms), so that back-to-back flushes would show

    async def scenario() -> None:
        tiers = Tiers(5)
        by_age = StorageSettings(flush_bytes_min=1 << 40, flush_age_seconds=age)  # only the age flushes
        container = tiers.container(by_age)
        await container.start()
        await container.create_segment("s")
        loop = asyncio.get_running_loop()
        started, written = loop.time(), []
        while loop.time() - started < 10 * age:
            data = payload(len(written), 1_000)
            await container.append("s", data)
            written.append(data)
            await asyncio.sleep(0.002)
        elapsed = loop.time() - started
        flushes = tiers.lts.writes
        writer = container.storage_writer
        assert writer is not None
        await until(lambda: writer.unflushed_bytes == 0, "the rest flushed by age")
        assert await read_all(container, "s") == b"".join(written)
        await container.stop()
        # One flush per age at most (plus the one in progress at the end; 9 measured), against one
        # after another before the fix (15-16 here, each one a simulated write and log round trip);
        # and at least a few, or the test proves nothing.
        assert 3 <= flushes <= elapsed / age + 2, (flushes, len(written), elapsed)

    run(scenario)


class StalledChunkStorage(SimulatedChunkStorage):
    """Its first chunk write never lands until ``release``: a disk that stalls under the owner that
    dies (``stalled`` says the write began); later writes land as usual."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng=rng)
        self.stalled = False
        self.released = asyncio.Event()

    async def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        if not self.stalled:
            self.stalled = True
            await self.released.wait()
        await super().write(name, offset, data)


def test_a_flush_is_recorded_only_after_its_chunk_write_landed() -> None:
    """The owner is replaced while its first chunk write has not landed; the new owner flushes,
    checkpoints and truncates the log; a third owner must still read every acknowledged byte.  (A
    flush recorded before its write would make the stalled chunk part of the layout: once the log
    no longer holds those bytes, they are read from an empty chunk.  Beside the retry test above, a
    second, independent test of the order.)"""
    async def scenario() -> None:
        log = SimulatedLogStorage()
        lts = StalledChunkStorage(random.Random(6))

        def owner() -> SegmentContainer:
            return SegmentContainer(7, SimulatedDurableDataLog(log), chunk_storage=lts, storage_settings=SMALL,
                                    checkpoint_frame_count=4)

        old = owner()
        await old.start()
        await old.create_segment("s")
        data = payload(7, 300_000)
        await old.append("s", data)
        await until(lambda: lts.stalled, "the old owner's first chunk write began")
        new = owner()
        await new.start()  # fences the old owner's log
        truncated = log.truncated_through
        more = payload(8, 200_000)
        for start in range(0, len(more), 20_000):  # frames enough for checkpoints and a truncation
            await new.append("s", more[start:start + 20_000])
        writer = new.storage_writer
        assert writer is not None
        await until(lambda: writer.unflushed_bytes == 0 and log.truncated_through > truncated,
                    "the new owner flushed and truncated the log")
        await new.stop()
        recovered = owner()
        await recovered.start()
        assert await read_all(recovered, "s") == data + more
        await recovered.stop()
        lts.released.set()  # the stalled write lands in a chunk nobody references
        with contextlib.suppress(Exception):
            await old.stop()
    run(scenario)
