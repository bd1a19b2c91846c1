"""Truncation lands on event boundaries in segments that hold events (issue 20.2), and segments keep
their modification time (issue 20.8): the index of known boundaries (pure), the container's bounded
check -- refused offsets change nothing, raw segments keep byte granularity, the bytes read stay
within the budget, evicted bytes are read back from Tier 2 -- and both surviving a restart, including
from a log whose first checkpoint was written before either existed."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from millstream.errors import BadOffsetError, EventBoundaryError, StreamSegmentNotExistsError
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.segmentstore import durable_log, event_boundaries, operation_processor
from millstream.segmentstore.container import SegmentContainer, StorageSettings
from millstream.segmentstore.event_boundaries import (
    EVENT_SEGMENT_ATTRIBUTE_ID,
    EVENT_SEGMENT_ATTRIBUTES,
    index_after_append,
    index_after_merge,
    index_after_truncation,
    nearest_known,
    walk_events,
)
from millstream.segmentstore.metadata import CHECKPOINT_VERSION, checkpoint_version, serialize_checkpoint
from millstream.segmentstore.read_index import BLOCK_LENGTH_BYTES
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.wire import encode_event

SCENARIO_TIMEOUT_SECONDS = 60.0
EVENTS = EVENT_SEGMENT_ATTRIBUTES


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS)
    asyncio.run(bounded())


def events(*sizes: int) -> bytes:
    return b"".join(encode_event(bytes([n % 251]) * size) for n, size in enumerate(sizes))


class WallClock:
    """Seconds since the Unix epoch, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Tiers:
    """A log and a chunk storage that outlive the containers built on them."""

    def __init__(self) -> None:
        self.log = SimulatedLogStorage()
        self.lts = SimulatedChunkStorage(rng=random.Random(3))
        self.wall = WallClock(1_700_000_000.0)

    def container(self, *, checkpoint_frame_count: int = 1000, settings: StorageSettings | None = None,
                  tier_two: bool = False) -> SegmentContainer:
        return SegmentContainer(7, SimulatedDurableDataLog(self.log), checkpoint_frame_count=checkpoint_frame_count,
                                chunk_storage=self.lts if tier_two else None, storage_settings=settings,
                                wall_clock=self.wall)


class CountingReads:
    """Counts the bytes the container's read index hands out (what a boundary check reads)."""

    def __init__(self, container: SegmentContainer) -> None:
        self.bytes = 0
        read = container.read_index.read

        async def counted(*args: Any, **kwargs: Any) -> Any:
            result = await read(*args, **kwargs)
            self.bytes += len(result.data)
            return result
        container.read_index.read = counted  # type: ignore[method-assign]


# --- The index (pure) ------------------------------------------------------------------------------


def test_walking_event_headers_confirms_boundaries_and_refuses_the_rest() -> None:
    data = events(3, 0, 10)  # events at 0, 11, 19; the segment ends at 37
    assert walk_events(data, 0, 0, 37, "s") == 37
    assert walk_events(data, 0, 11, 19, "s") == 19
    with pytest.raises(EventBoundaryError, match="inside the header of the event at 0"):
        walk_events(data, 0, 0, 3, "s")
    with pytest.raises(EventBoundaryError, match=r"inside the event at \[19, 37\)"):
        walk_events(data, 0, 0, 30, "s")
    # A view that ends inside a header: walk on from the event that needs more bytes.
    assert walk_events(data[:14], 0, 0, 37, "s") == 11
    # A big event is hopped over without its payload: the next header is all that is needed.
    assert walk_events(data[:8], 0, 0, 37, "s") == 11
    with pytest.raises(EventBoundaryError, match="not an event header"):
        walk_events(b"\x00\x00\x00\x07" + bytes(20), 0, 0, 24, "s")


def test_the_index_stays_bounded_and_keeps_the_newest_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_boundaries, "ENTRIES_MAX", 8)
    boundaries: tuple[int, ...] = ()
    spacing = 10
    for end in range(10, 1001, 10):  # an append ending every 10 bytes
        if end >= (boundaries[-1] if boundaries else 0) + spacing:
            boundaries, spacing = index_after_append(boundaries, spacing, end)
            assert boundaries[-1] == end, "the newest is always kept"
        assert len(boundaries) <= 8 and list(boundaries) == sorted(set(boundaries))
        gaps = [b - a for a, b in zip((0, *boundaries), boundaries, strict=False)]
        assert max(gaps) <= 2 * spacing, (boundaries, spacing)  # evenly thinned: no hole opens up
    assert spacing == 160 and boundaries == tuple(range(10, 1000, 160))
    assert nearest_known(boundaries, 0, boundaries[3] + 1) == boundaries[3]
    assert nearest_known(boundaries, 5, 4) == 5
    assert index_after_truncation(boundaries, boundaries[2]) == boundaries[3:]
    merged, _ = index_after_merge((10, 20), 10, 0, 30, (4, 9), 45)
    assert merged == (10, 20, 30, 34, 39, 45)


# --- The container ---------------------------------------------------------------------------------


def test_a_segment_that_holds_events_refuses_offsets_inside_an_event_and_changes_nothing() -> None:
    """The issue's `segment truncate t/seg/0 3`: accepted, it broke the segment's head for good."""
    async def scenario() -> None:
        tiers = Tiers()
        async with tiers.container() as container:
            await container.create_segment("t/seg/0", EVENTS)
            data = events(5, 5, 5)  # events at 0, 13, 26; length 39
            await container.append("t/seg/0", data)
            for offset, reason in ((3, "inside the header of the event at 0"), (10, r"inside the event at \[0, 13\)"),
                                   (27, "inside the header of the event at 26")):
                with pytest.raises(EventBoundaryError, match=reason):
                    await container.truncate("t/seg/0", offset)
                with pytest.raises(EventBoundaryError):
                    await container.check_event_boundary("t/seg/0", offset)
                assert container.get_info("t/seg/0").start_offset == 0
            assert (await container.read("t/seg/0", 0, 100)).data == data  # still readable from its head
            with pytest.raises(BadOffsetError):
                await container.truncate("t/seg/0", 40)  # beyond the end, as before
            await container.check_event_boundary("t/seg/0", 26)
            await container.truncate("t/seg/0", 13)
            with pytest.raises(BadOffsetError, match="outside"):
                await container.check_event_boundary("t/seg/0", 0)  # below the start now
            await container.truncate("t/seg/0", 39)  # the length is a boundary
            assert container.get_info("t/seg/0").start_offset == 39
            container.check_invariants()
    run(scenario)


def test_a_segment_of_raw_bytes_keeps_byte_granularity() -> None:
    async def scenario() -> None:
        async with Tiers().container() as container:
            await container.create_segment("raw")
            await container.append("raw", events(5, 5))
            await container.check_event_boundary("raw", 3)
            await container.truncate("raw", 3)
            assert container.get_info("raw").start_offset == 3
            # A segment that stopped claiming to hold events (a byte-stream writer opened it) too.
            await container.create_segment("was-events", EVENTS)
            await container.append("was-events", events(5))
            await container.update_attributes("was-events", [AttributeUpdate(
                EVENT_SEGMENT_ATTRIBUTE_ID, AttributeUpdateType.REPLACE, NULL_ATTRIBUTE_VALUE)])
            await container.truncate("was-events", 3)
    run(scenario)


def test_a_truncation_checked_on_a_segment_deleted_and_created_again_meanwhile_is_refused() -> None:
    async def scenario() -> None:
        async with Tiers().container() as container:
            await container.create_segment("s", EVENTS)
            await container.append("s", events(5, 5))
            real = container._check_event_boundary

            async def slow(segment: Any, offset: int) -> None:
                await real(segment, offset)
                await container.delete("s")  # while the truncation was being checked
                await container.create_segment("s", EVENTS)
                await container.append("s", events(100))
            container._check_event_boundary = slow  # type: ignore[method-assign]
            with pytest.raises(StreamSegmentNotExistsError, match="deleted and created again"):
                await container.truncate("s", 13)
            assert container.get_info("s").start_offset == 0
    run(scenario)


def test_the_check_reads_from_the_nearest_known_boundary_and_within_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_boundaries, "SPACING_BYTES_MIN", 1000)
    monkeypatch.setattr(event_boundaries, "SCAN_BYTES_MAX", 3000)

    async def scenario() -> None:
        async with Tiers().container() as container:
            await container.create_segment("s", EVENTS)
            await container.create_segment("one-append", EVENTS)
            small = events(*[2] * 10)  # ten 10-byte events per append
            for _ in range(50):
                await container.append("s", small)
            await container.append("one-append", events(*[2] * 1000))  # 10,000 bytes, no index entry inside
            segment = container._metadata.get("s")
            assert segment is not None and segment.boundaries
            assert all(b % 100 == 0 for b in segment.boundaries) and len(segment.boundaries) >= 4
            counting = CountingReads(container)
            await container.truncate("s", 4_730)  # an event boundary between two index entries
            assert counting.bytes <= 1000 + 100, counting.bytes  # from the entry below, not from the start
            counting.bytes = 0
            with pytest.raises(EventBoundaryError, match=r"could not be confirmed .* within 3000 bytes"):
                await container.truncate("one-append", 9_990)
            assert counting.bytes <= 3000
            await container.truncate("one-append", 2_990)  # within the budget: confirmed
            assert container.get_info("one-append").start_offset == 2_990
            container.check_invariants()
    run(scenario)


def test_evicted_bytes_are_read_back_from_tier_two_for_the_check() -> None:
    settings = StorageSettings(cache_bytes_max=2 * BLOCK_LENGTH_BYTES, catch_up_cache_bytes_max=4 << 20,
                               flush_bytes_min=64 * 1024, flush_bytes_max=256 * 1024, flush_age_seconds=0.05,
                               unflushed_bytes_max=8 << 20)

    async def scenario() -> None:
        tiers = Tiers()
        async with tiers.container(settings=settings, tier_two=True, checkpoint_frame_count=4) as container:
            await container.create_segment("s", EVENTS)
            block = events(*[990] * 50)  # 50 events of 998 bytes
            for _ in range(40):
                await container.append("s", block)
            writer = container.storage_writer
            assert writer is not None
            deadline = asyncio.get_running_loop().time() + 30
            while container.read_index.cached_bytes > 3 * BLOCK_LENGTH_BYTES:  # flushed, then evicted
                assert asyncio.get_running_loop().time() < deadline, "never evicted"
                await asyncio.sleep(0.01)
            reads = tiers.lts.reads
            with pytest.raises(EventBoundaryError):
                await container.truncate("s", 998 * 7 + 1)
            assert tiers.lts.reads > reads, "the check read evicted bytes back from Tier 2"
            await container.truncate("s", 998 * 7)
            assert container.get_info("s").start_offset == 998 * 7
    run(scenario)


def test_boundaries_and_modification_times_survive_a_restart() -> None:
    async def scenario() -> None:
        tiers = Tiers()
        async with tiers.container(checkpoint_frame_count=2) as container:
            await container.create_segment("early", EVENTS)
            tiers.wall.now += 10
            await container.create_segment("s", EVENTS)
            for _ in range(300):
                await container.append("s", events(*[4000] * 2))  # 8,016 bytes an append
            tiers.wall.now += 10
            await container.append("early", events(1))
            written_at = {name: container.get_info(name).last_modified_ms for name in ("early", "s")}
            assert written_at == {"early": 1_700_000_020_000, "s": 1_700_000_010_000}
            tiers.wall.now += 10
            await container.create_segment("filler")
            for _ in range(8):  # (so that checkpoints -- every 2 frames -- follow the changes above)
                await container.append("filler", b"f")
            before = container._metadata.get("s")
            assert before is not None and len(before.boundaries) > 1
            boundaries, spacing = before.boundaries, before.boundary_spacing
        tiers.wall.now += 100  # the restart
        async with tiers.container(checkpoint_frame_count=2) as recovered:
            after = recovered._metadata.get("s")
            assert after is not None and (after.boundaries, after.boundary_spacing) == (boundaries, spacing)
            # A checkpoint covered these changes: their times are exact.  The filler's last appends may
            # have come after the last checkpoint: replay gives them the recovery's time (never earlier).
            assert {name: recovered.get_info(name).last_modified_ms for name in written_at} == written_at
            assert recovered.get_info("filler").last_modified_ms in (1_700_000_030_000, 1_700_000_130_000)
            counting = CountingReads(recovered)
            await recovered.truncate("s", 8_016 * 150 + 4_008)
            assert counting.bytes <= event_boundaries.SPACING_BYTES_MIN + 8_016, counting.bytes
            recovered.check_invariants()
    run(scenario)


def test_modification_times_after_a_crash_are_never_earlier_than_the_truth() -> None:
    async def scenario() -> None:
        tiers = Tiers()
        container = tiers.container(checkpoint_frame_count=1000)  # one checkpoint: at the start
        await container.start()
        await container.create_segment("s")
        tiers.wall.now += 50
        await container.append("s", b"x")
        assert container.get_info("s").last_modified_ms == 1_700_000_050_000
        container.kill()
        tiers.wall.now += 50
        async with tiers.container() as recovered:
            assert recovered.get_info("s").last_modified_ms == 1_700_000_100_000  # replayed: the recovery's time
            tiers.wall.now += 1
            await recovered.seal("s")
            assert recovered.get_info("s").last_modified_ms == 1_700_000_101_000
    run(scenario)


def test_a_log_whose_first_checkpoint_predates_boundaries_recovers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Version-1 checkpoints (no boundaries, no times) are read, and later version-2 ones are compared
    with what replay rebuilds only as far as version 1 went."""
    loaded: list[int] = []

    def spy(payload: bytes) -> int:
        version = checkpoint_version(payload)
        loaded.append(version)
        return version
    monkeypatch.setattr(durable_log, "checkpoint_version", spy)

    async def scenario() -> None:
        tiers = Tiers()
        with monkeypatch.context() as old_code:
            old_code.setattr(operation_processor, "serialize_checkpoint",
                             functools.partial(serialize_checkpoint, version=1))
            async with tiers.container(checkpoint_frame_count=2) as old:
                await old.create_segment("s", EVENTS)
                for _ in range(200):
                    await old.append("s", events(*[4000] * 2))
        async with tiers.container(checkpoint_frame_count=2) as upgraded:  # writes version-2 checkpoints
            assert set(loaded) == {1}, loaded
            for _ in range(200):
                await upgraded.append("s", events(*[4000] * 2))
            assert upgraded.get_info("s").length == 400 * 8_016
        loaded.clear()
        async with tiers.container(checkpoint_frame_count=2) as again:
            assert loaded[0] == 1 and 2 in loaded, loaded  # a version-1 start, version-2 checkpoints compared
            assert again.get_info("s").length == 400 * 8_016
            await again.truncate("s", 8_016 * 300)
            with pytest.raises(EventBoundaryError):
                await again.truncate("s", 8_016 * 300 + 5)
        assert CHECKPOINT_VERSION == 2 and checkpoint_version(serialize_checkpoint(1, [], version=1)) == 1
    run(scenario)


def test_long_events_are_hopped_over_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_boundaries, "SPACING_BYTES_MIN", 1 << 40)  # no known boundary but the start

    async def scenario() -> None:
        async with Tiers().container() as container:
            await container.create_segment("s", EVENTS)
            for _ in range(10):
                await container.append("s", events(300_000))
            counting = CountingReads(container)
            await container.truncate("s", 9 * 300_008)
            # One small read per long event (its header and the start of its payload), not 2.7 MB.
            assert counting.bytes <= 9 * event_boundaries.SCAN_READ_BYTES_MIN, counting.bytes
            assert container.get_info("s").start_offset == 9 * 300_008
    run(scenario)
