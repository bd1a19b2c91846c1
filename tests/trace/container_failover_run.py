"""Seeded runs of real ``SegmentContainer`` owners of one container, recorded as behaviours of
``spec/ContainerFailover.tla`` (checked by TLC through ``spec/TraceContainerFailover.tla``).

Owners 1..3 are slots; each holds at most one live container at a time, all on one shared
``SimulatedLogStorage`` (Tier 1: fenced by epoch) and one ``SimulatedChunkStorage`` (Tier 2), on a
manual clock and with thresholds so large that the StorageWriter never flushes on its own: the run
decides when it does.  Every append is one unit: a fixed-size record carrying the append's id.  A
seeded random step is one of

* ``start``   -- a down slot builds a container and starts it (bumping the log's epoch: fencing the
  previous owner) [Start]; recovery, the StorageWriter's reconciliation (each prefix of an earlier
  owner's unrecorded chunk write it verifies and records [Adopt]) and first pass run to rest;
* ``append``  -- the current owner appends one unit [ClientAppend]; a checkpoint the processor adds
  on its own is recorded where it commits [Checkpoint];
* ``flush``   -- a serving owner's StorageWriter flushes the segment: its chunk write [WriteChunk],
  then its flush record [CommitFlush] -- or, for an owner fenced without knowing it, the failure of
  that record's log write [LogWriteFenced];
* ``fenced``  -- a fenced owner's next append fails [LogWriteFenced];
* ``truncate``-- the current owner's StorageWriter truncates the log if a checkpoint allows [Truncate];
* ``crash``   -- a serving owner's process dies [Crash].

Steps come from the implementation's own reports (``StorageWriter.tracer``: committed operations in
log order, chunk writes, truncations), translated by ``Recorder``; the run adds ``Start``, ``Crash`` and
``LogWriteFenced``, which it causes.  After every step an ``Observe`` records what the implementation
shows: which slots serve, the current owner's segment as unit ids and its storage length in units, and
which chunks exist with which units.

The refinement mapping (written down in ``spec/TraceContainerFailover.tla`` too):

* an implementation epoch is the spec's epoch (each take-over bumps both by one);
* the chunks named for epoch ``e`` (one per epoch here; several would be concatenated in segment
  order) are the spec's ``chunks[e]``; a chunk the implementation deleted as garbage (an unreferenced
  one: a fenced owner's write) is not observed -- the spec keeps it, nobody reads it;
* a flush record a new owner commits on reconciliation naming an older epoch's chunk (bytes an earlier
  owner wrote but never recorded, verified equal to the unflushed bytes: all of them, or a prefix when
  appends were made since that write) is the spec's ``Adopt`` of that chunk, up to the recorded
  storage length;
* creating the segment, and records the spec does not have, are stuttering steps.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from typing import Any

from millstream.errors import MillstreamError
from millstream.segmentstore.container import SegmentContainer, StorageSettings
from millstream.segmentstore.layout import covered_end
from millstream.segmentstore.metadata import deserialize_checkpoint
from millstream.segmentstore.operations import (
    MetadataCheckpointOperation,
    Operation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
)
from millstream.segmentstore.storage_writer import StorageWriter
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceEvent

__all__ = ["OWNERS", "UNIT_BYTES", "FailoverRun", "record_runs"]

CONTAINER_ID = 7
SEGMENT = "s"
OWNERS = (1, 2, 3)
UNIT_BYTES = 16
CHECKPOINT_FRAME_COUNT = 4
#: Thresholds no run reaches: the StorageWriter flushes only when the run says so.
NEVER = 1 << 40
SETTINGS = StorageSettings(flush_bytes_min=NEVER, flush_bytes_max=NEVER, flush_age_seconds=1e9,
                           unflushed_bytes_max=NEVER)
#: Event-loop turns given to background work (recovery's reconciliation, a failing log's close)
#: after each step: all of it is in memory, so it settles within a few turns; ``settle`` checks it did.
SETTLE_TURNS = 50
_EPOCH = re.compile(r"\.e(\d+)\.\d+$")
_CHUNK_ORDER = re.compile(r"/(\d+)\.e(\d+)\.(\d+)$")


def unit(identifier: int) -> bytes:
    """An append's bytes: its id, fixed width (so equal prefixes are whole units)."""
    return b"%015d\n" % identifier


def unit_ids(data: bytes) -> list[int]:
    if len(data) % UNIT_BYTES:
        raise AssertionError(f"{len(data)} bytes are not whole units")
    return [int(data[i:i + UNIT_BYTES]) for i in range(0, len(data), UNIT_BYTES)]


def chunk_epoch(name: str) -> int:
    found = _EPOCH.search(name)
    assert found is not None, name
    return int(found[1])


class Owner:
    def __init__(self, container: SegmentContainer, epoch: int) -> None:
        self.container = container
        self.epoch = epoch

    @property
    def writer(self) -> StorageWriter:
        writer = self.container.storage_writer
        assert writer is not None
        return writer


class FailoverRun:
    """One seeded run (see the module docstring); ``trace`` is its record."""

    def __init__(self, seed: int, steps: int) -> None:
        self.rng = random.Random(seed)
        self.steps = steps
        self.clock = ManualClock()
        self.log = SimulatedLogStorage()
        self.lts = SimulatedChunkStorage(clock=self.clock, rng=random.Random(seed))
        self.owners: dict[int, Owner | None] = dict.fromkeys(OWNERS)
        self.dead: list[SegmentContainer] = []
        self.trace: list[TraceEvent] = []
        self.next_id = 1
        #: The spec's log: the sequence number of each record it has (append, flush, checkpoint).
        self.records: list[int] = []
        #: Adoptions recorded: (units adopted, whether they were the whole unflushed tail).
        self.adoptions: list[tuple[int, bool]] = []
        self.segment_id: int | None = None
        #: Whether a start's recovery refused what the tiers hold (the run ended there).
        self.refused = False

    def emit(self, action: str, **fields: Any) -> None:
        self.trace.append(TraceEvent(action, fields))

    # --- the implementation's reports ----------------------------------------------------------------

    def tracer_for(self, slot: int, epoch: int) -> Callable[..., None]:
        def tracer(action: str, /, **fields: Any) -> None:
            if action == "Committed":
                self.committed(slot, epoch, fields["operation"])
            elif action == "WriteChunk":
                self.emit("WriteChunk", o=slot, units=unit_ids(bytes(fields["data"])))
            elif action == "Truncate":
                at = self.records.index(fields["checkpoint"].sequence_number)
                self.records = self.records[at:]
                self.emit("Truncate", o=slot, remaining=len(self.records))
            else:
                raise AssertionError(f"unknown report {action}")
        return tracer

    def committed(self, slot: int, epoch: int, operation: Operation) -> None:
        if type(operation) is StreamSegmentAppendOperation:
            self.records.append(operation.sequence_number)
            ids = unit_ids(bytes(operation.data))
            assert len(ids) == 1, ids
            self.emit("ClientAppend", o=slot, id=ids[0], off=operation.offset // UNIT_BYTES + 1)
        elif isinstance(operation, StorageFlushOperation):
            self.records.append(operation.sequence_number)
            storage = (operation.offset + operation.length) // UNIT_BYTES
            adopted = chunk_epoch(operation.chunk)
            if adopted != epoch:  # reconciliation recorded an older owner's unrecorded write
                owner = self.owners[slot]
                assert owner is not None
                whole = operation.offset + operation.length == owner.container.get_info(SEGMENT).length
                self.adoptions.append((operation.length // UNIT_BYTES, whole))
                self.emit("Adopt", o=slot, chunk=adopted, storage=storage)
            else:
                self.emit("CommitFlush", o=slot, storage=storage)
        elif isinstance(operation, MetadataCheckpointOperation):
            self.records.append(operation.sequence_number)
            described = deserialize_checkpoint(operation.payload, CONTAINER_ID)
            segment = described.get(SEGMENT)
            length = storage = 0
            if segment is not None:
                length = segment.length // UNIT_BYTES
                storage = covered_end(segment.spans, segment.start_offset) // UNIT_BYTES
            self.emit("Checkpoint", o=slot, length=length, storage=storage)

    # --- what the run does -----------------------------------------------------------------------------

    def current(self) -> int | None:
        for slot, owner in self.owners.items():
            if owner is not None and owner.epoch == self.log.epoch:
                return slot
        return None

    def serving(self) -> list[int]:
        return [slot for slot, owner in self.owners.items() if owner is not None]

    def fenced(self) -> list[int]:
        return [slot for slot, owner in self.owners.items() if owner is not None and owner.epoch < self.log.epoch]

    async def settle(self) -> None:
        """Let background work run to rest: every serving owner's StorageWriter parked (asleep on the
        manual clock, which only the run could move) and none stopped."""
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)
        for owner in self.owners.values():
            if owner is not None:
                task = owner.writer.stopped
                assert task is not None and not task.done(), "a serving owner's StorageWriter stopped"
        assert self.clock.sleeping == len(self.serving()), "background work did not come to rest"

    async def start(self, slot: int) -> bool:
        container = SegmentContainer(CONTAINER_ID, SimulatedDurableDataLog(self.log), clock=self.clock,
                                     chunk_storage=self.lts, storage_settings=SETTINGS,
                                     checkpoint_frame_count=CHECKPOINT_FRAME_COUNT)
        epoch = self.log.epoch + 1
        writer = container.storage_writer
        assert writer is not None
        writer.tracer = self.tracer_for(slot, epoch)
        try:
            await container.start()
        except MillstreamError:
            self.dead.append(container)
            self.refused = True
            return False  # recovery refused what the tiers hold: the spec's Start cannot follow either
        self.emit("Start", o=slot, epoch=epoch)
        self.owners[slot] = Owner(container, epoch)
        if self.segment_id is None:
            await container.create_segment(SEGMENT)
        self.segment_id = container._metadata.ids_by_name[SEGMENT]
        return True

    def down(self, slot: int) -> None:
        owner = self.owners[slot]
        assert owner is not None
        owner.container.kill()  # (a failed container's StorageWriter runs until its host stops it)
        self.dead.append(owner.container)
        self.owners[slot] = None

    async def append(self, slot: int) -> None:
        owner = self.owners[slot]
        assert owner is not None
        try:
            await owner.container.append(SEGMENT, unit(self.next_id))
        except MillstreamError:
            assert owner.epoch < self.log.epoch, "the current owner's append failed"
            self.emit("LogWriteFenced", o=slot)
            self.down(slot)
            return
        assert owner.epoch == self.log.epoch, "a fenced owner's append succeeded"
        self.next_id += 1

    async def flush(self, slot: int) -> None:
        owner = self.owners[slot]
        assert owner is not None and self.segment_id is not None
        try:
            await owner.writer._flush(self.segment_id)
        except MillstreamError:
            assert owner.epoch < self.log.epoch, "the current owner's flush failed"
            self.emit("LogWriteFenced", o=slot)
            self.down(slot)

    def unflushed(self, slot: int) -> bool:
        owner = self.owners[slot]
        assert owner is not None
        info = owner.container.get_info(SEGMENT)
        return info.storage_length < info.length

    async def step(self) -> None:
        current = self.current()
        down = [slot for slot in OWNERS if self.owners[slot] is None]
        choices: list[tuple[int, str, int]] = []
        if down:
            choices.append((2 if current is not None else 20, "start", self.rng.choice(down)))
        if current is not None:
            choices.append((12, "append", current))
            choices.append((2, "truncate", current))
            if self.unflushed(current):
                choices.append((4, "flush", current))
        for slot in self.fenced():
            choices.append((2, "fenced", slot))
            if self.unflushed(slot):
                choices.append((2, "flush", slot))
        for slot in self.serving():
            choices.append((1, "crash", slot))
        _, action, slot = self.rng.choices(choices, weights=[weight for weight, _, _ in choices])[0]
        if action == "start":
            if not await self.start(slot):
                raise _Refused
        elif action in ("append", "fenced"):
            await self.append(slot)
        elif action == "flush":
            await self.flush(slot)
        elif action == "truncate":
            owner = self.owners[slot]
            assert owner is not None
            await owner.writer._truncate_log_if_possible()
        else:
            owner = self.owners[slot]
            assert owner is not None
            owner.container.kill()
            self.emit("Crash", o=slot)
            self.down(slot)
        await self.settle()
        await self.observe()

    async def observe(self) -> None:
        by_epoch: dict[int, list[tuple[int, int, list[int]]]] = {}
        for name, data in self.lts.chunks().items():
            found = _CHUNK_ORDER.search(name)
            assert found is not None, name
            by_epoch.setdefault(int(found[2]), []).append((int(found[1]), int(found[3]), unit_ids(data)))
        chunks = {(epoch, tuple(u for _, _, ids in sorted(parts) for u in ids)) for epoch, parts in by_epoch.items()}
        fields: dict[str, Any] = {"serving": set(self.serving()), "chunks": chunks, "o": 0, "units": [], "storage": 0}
        current = self.current()
        owner = None if current is None else self.owners[current]
        if owner is not None:
            fields.update(o=current, units=unit_ids(await read_all(owner.container)),
                          storage=owner.container.get_info(SEGMENT).storage_length // UNIT_BYTES)
        self.emit("Observe", **fields)

    async def run(self) -> None:
        try:
            for _ in range(self.steps):
                await self.step()
        except _Refused:
            pass
        finally:
            for owner in self.owners.values():
                if owner is not None:
                    owner.container.kill()
            for container in self.dead:
                container.kill()


class _Refused(Exception):
    """A start's recovery refused what the tiers hold: the run ends there."""


async def read_all(container: SegmentContainer) -> bytes:
    info = container.get_info(SEGMENT)
    offset, parts = info.start_offset, []
    while offset < info.length:
        result = await container.read(SEGMENT, offset, info.length - offset)
        assert result.data, f"an empty read at {offset} of {info.length}"
        parts.append(bytes(result.data))
        offset += len(result.data)
    return b"".join(parts)


def record_runs(seeds: range, steps: int) -> list[FailoverRun]:
    """Runs ``seeds``, ``steps`` random steps each, done (``trace`` holds each one's record)."""
    runs = []
    for seed in seeds:
        run = FailoverRun(seed, steps)
        asyncio.run(run.run())
        runs.append(run)
    return runs
