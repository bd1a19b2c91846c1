"""A stream, its writers, the controller and a reader group, run in process and observed in the
vocabulary of ``spec/StreamOrdering.tla``.

``StreamRun`` is one node -- a ``SegmentStoreServer`` on the simulated tiers with a ``Controller``
attached, on its own event loop -- with real clients over TCP: stream-aware ``AsyncEventStreamWriter``s
and an ``AsyncReaderGroup`` with its ``AsyncEventStreamReader``s.  Its methods are the environment's
choices (write, flush, scale by hand, let the auto-scaler act, readers join, read, leave and crash,
checkpoint, reset, time passing); each returns the steps of the spec that the implementation took
while it ran, as records ``{"a": <spec action>, ...}`` with the values the implementation reported.
The stateful test replays those steps on the model (``stream_replay``) and the trace test hands them
to TLC (``stream_tla``): one translation, two oracles.

Where the steps come from -- nothing here is a hook in the implementation; every step is read off
what the implementation wrote durably or returned to the application:

* the controller's epochs (its metadata: ``scale_started`` ... ``scale_completed``, all done by the
  time ``scale_stream`` or ``tick`` returns) give ``CreateSuccessors``, ``RecordEpoch``,
  ``SealPredecessors``, ``ActivateEpoch``;
* the stream's segments, read back after every step, give ``AppendEvent`` (each event carries its
  writer, number and routing key in its payload) -- and with it ``AckEvent``, and ``SegmentSealed``
  when a writer's event turns up in a successor while the model still routes it to a sealed segment;
* the reader group's state segment, read by a synchronizer of our own whose codec records each
  update it applies, gives the group's steps in the order they were committed: ``AddReader``,
  ``AcquireSegment``, ``ReleaseSegment``, ``SegmentCompleted``, ``CreateCheckpoint``,
  ``CheckpointReader``, ``ReaderOffline`` (``RemoveReader``), ``Reset`` (``ReaderGroupStateInit``);
  heartbeats (``UpdateDistanceToTail``) are stutters;
* what ``read_next_event`` returns gives ``ReadNextEvent`` (segment and offset of the event) and
  ``SurfaceCheckpoint``.

Order.  Within one call of the environment the steps are emitted in an order that is a linearization
of what happened: the driver's ``WriteEvent``s first (they precede their stores); then each new
epoch's steps, with the events the predecessors stored placed before ``SealPredecessors`` (they were
stored before the seal, or the store would have refused them); then the other stores; then the
group's updates, each ``read_next_event`` call's updates before the event it returned (a call writes
its updates before it returns).  The spec seals a scale's predecessors in one step; the controller
seals them one by one, and a writer may meet the first seal before the second -- the order above
places the writer's steps after the whole seal, which is equivalent because they touch other
segments.  Before a reader is called, the driver lets it take in the group's latest state (its long
poll on the state segment has answered): the stale reads of buffered events that a reader may
return before it notices a change (safe, since such a read commutes with the change) are not
exercised.

Offsets.  The spec counts events; the implementation, bytes.  Offsets are translated through each
segment's event boundaries (every recorded offset is one).  Segment ids are dense in creation order
(the controller numbers segments so: model id = segment number + 1) and keys are named by the cell
of ``grid`` equal cells their hash falls in.

Time.  The controller and the readers each have a ``ManualClock``; nothing happens on them unless a
step moves them.  Auto-scaling reads the segment store's append counts through ``RateStore``, which
reports the rates the test sets (the decisions -- moving averages, hot and cold signals, the plan,
the scale -- are the controller's own).
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, TypeVar

from millstream.client import (
    AsyncClient,
    AsyncEventStreamReader,
    ClientConfig,
    Position,
    ReaderConfig,
    ReaderGroupConfig,
    ScalingPolicy,
    StreamConfig,
    routing_key_fraction,
)
from millstream.client._reader_group import (
    AcquireSegment,
    AddReader,
    AsyncReaderGroup,
    CheckpointReader,
    CreateCheckpoint,
    ReaderGroupState,
    ReaderGroupStateCodec,
    ReaderGroupStateInit,
    ReaderGroupUpdate,
    ReleaseSegment,
    RemoveReader,
    SegmentCompleted,
    UpdateDistanceToTail,
)
from millstream.client._state_synchronizer import StateSynchronizer
from millstream.client._writer import AsyncEventStreamWriter
from millstream.controller import Controller, ControllerConfig, ControllerRpc, LocalSegmentStore
from millstream.controller._segment_store import AppendCounts
from millstream.naming import parse_stream_segment_name, segment_id_parts, stream_segment_name
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag
from tests.server.raw import Tiers

__all__ = ["GROUP", "SCOPE", "STREAM", "Step", "StreamRun", "keys_for_cells"]

SCOPE, STREAM, GROUP = "sc", "st", "g"
START_TIME = 1_000_000.0
STEP_TIMEOUT_SECONDS = 30.0
#: How long (real time) a read waits for an event the implementation must deliver, and how long the
#: driver waits for a reader to take in the group's latest state.
DELIVERY_WAIT_SECONDS = 10.0
#: The auto-scaler's target; the rates the test sets are multiples of it.
TARGET_EVENTS_PER_SECOND = 100.0
NORMAL_RATE = 0.75 * TARGET_EVENTS_PER_SECOND  # neither hot nor cold: below the target, above half of it
HOT_RATE = 10 * TARGET_EVENTS_PER_SECOND
#: Time the auto-scale step lets pass: past every averaging window (20 min), the cooldown and the mute.
AUTO_SCALE_WAIT_SECONDS = 1800.0
#: Readers heartbeat every second and, when a timeout is configured, declare a reader silent for
#: three seconds offline; rebalancing runs on a one-second unit.
HEARTBEAT_SECONDS = 1.0
OFFLINE_TIMEOUT_SECONDS = 3.0
PAYLOAD_BYTES = 48

_HEADER = struct.Struct(">ii")

Step = dict[str, Any]
T = TypeVar("T")


def keys_for_cells(grid: int) -> list[str]:
    """One routing key per cell of ``grid`` equal cells of [0, 1): key ``c`` hashes into cell ``c``."""
    found: dict[int, str] = {}
    for n in range(1_000_000):
        key = f"k{n}"
        cell = int(routing_key_fraction(key) * grid)
        found.setdefault(cell, key)
        if len(found) == grid:
            return [found[c] for c in range(grid)]
    raise AssertionError(f"no key for some cell of {grid}")


class RateStore(LocalSegmentStore):
    """The node's store as the controller sees it, except that the append counts it reports are the
    rates the test set (events/s per segment, ``NORMAL_RATE`` unless said otherwise) times the time
    since the last report, on the controller's clock."""

    def __init__(self, server: SegmentStoreServer, clock: ManualClock) -> None:
        super().__init__(server)
        self.manual_clock = clock
        self.rates: dict[str, float] = {}
        self.segments: list[str] = []
        self._last = clock.monotonic()

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        super().drain_append_counts()  # (the real counts are dropped: a test's few events say nothing)
        now = self.manual_clock.monotonic()
        elapsed, self._last = now - self._last, now
        return {name: AppendCounts(0, int(self.rates.get(name, NORMAL_RATE) * elapsed)) for name in self.segments}


class _RecordingCodec(ReaderGroupStateCodec):
    """The reader group's codec, noting every update it applies (in the order the segment holds them)."""

    def __init__(self) -> None:
        self.applied: list[tuple[ReaderGroupState, ReaderGroupUpdate]] = []

    def apply(self, state: ReaderGroupState, update: ReaderGroupUpdate) -> ReaderGroupState:
        self.applied.append((state, update))
        return super().apply(state, update)


class _Segment:
    """What the observer knows of one segment: its model id, its cells, its events' byte bounds."""

    def __init__(self, name: str, model_id: int, cells: tuple[int, int]) -> None:
        self.name = name
        self.model_id = model_id
        self.cells = cells
        self.starts: list[int] = []  # byte offset where each event starts
        self.end = 0  # where the next event starts
        self.events: list[tuple[str, int, int]] = []  # (writer, number, key cell) of each stored event

    def count_at(self, offset: int) -> int:
        """The number of events before byte ``offset`` (an event boundary)."""
        if offset == self.end:
            return len(self.starts)
        try:
            return self.starts.index(offset)
        except ValueError:
            raise AssertionError(f"{offset} is not an event boundary of {self.name} ({self.starts})") from None


class StreamRun:
    """One node, its clients and the observer (see the module docstring).  ``close()`` stops it."""

    def __init__(self, *, grid: int, initial_segments: int, writers: Iterable[str], seed: int,
                 offline_timeout: bool = False) -> None:
        self.grid = grid
        self.keys = keys_for_cells(grid)
        self.cell_of_key = {key: cell for cell, key in enumerate(self.keys)}
        self.loop = asyncio.new_event_loop()
        self.tiers = Tiers("simulated")
        self.controller_clock = ManualClock(START_TIME)
        self.reader_clock = ManualClock()
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.run(self.server.start())
        self.store = RateStore(self.server, self.controller_clock)
        self.controller = Controller(
            self.store, clock=self.controller_clock, now=self.controller_clock.monotonic,
            config=ControllerConfig(periodic=False, auto_scale_cooldown_seconds=60.0,
                                    auto_scale_mute_seconds=600.0),
            rng=random.Random(seed))
        self.run(self.controller.start())
        self.server.attach_controller(ControllerRpc(self.controller))
        # The client's connections keep real time (keep-alives, request deadlines); the readers' timers
        # (rebalancing, heartbeats, offline detection) run on ``reader_clock``.
        self.client = AsyncClient(self.server.uri, config=ClientConfig(), rng=random.Random(seed + 1))
        policy = ScalingPolicy.by_event_rate(TARGET_EVENTS_PER_SECOND, 2, min_segments=initial_segments)
        self.run(self.controller.create_scope(SCOPE))
        self.run(self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=policy)))
        self.reader_config = ReaderConfig(
            time_unit_seconds=1.0, heartbeat_seconds=HEARTBEAT_SECONDS, tail_wait_seconds=5.0,
            offline_timeout_seconds=OFFLINE_TIMEOUT_SECONDS if offline_timeout else 0.0)
        self.writers: dict[str, AsyncEventStreamWriter[bytes]] = {w: self.run(self._writer()) for w in sorted(writers)}
        self.written: dict[str, int] = {w: 0 for w in self.writers}
        self.readers: dict[str, AsyncEventStreamReader[bytes]] = {}
        self.group: AsyncReaderGroup = self.run(AsyncReaderGroup.open(
            segments=self.client.segments(), controller=self.client.controller(), clock=self.reader_clock,
            rng=random.Random(seed + 3), read_length_bytes=self.client.config.read_length_bytes,
            group=f"{SCOPE}/{GROUP}",
            config=ReaderGroupConfig([f"{SCOPE}/{STREAM}"], automatic_checkpoint_seconds=0)))
        self.checkpoints: dict[int, Any] = {}  # checkpoint number -> the future initiate_checkpoint returned
        # The observer.
        self.segments: dict[str, _Segment] = {}
        self.by_id: dict[int, _Segment] = {}
        self.epochs_seen = 0
        self.codec = _RecordingCodec()
        self.sync: StateSynchronizer[ReaderGroupState, ReaderGroupUpdate] = StateSynchronizer(
            self.client.segments(), self.group.state_segment, self.codec, rng=random.Random(seed + 2))
        self.generation = 0
        #: The model's view of each writer, to place ``SegmentSealed``: its routing table by cell and
        #: its unacknowledged events (number -> (key cell, model segment id)); kept by ``stream_replay``
        #: semantics but here only to decide *when* a writer must have learnt a seal.
        self.table: dict[str, list[int]] = {}
        self.inflight: dict[str, dict[int, tuple[int, int]]] = {w: {} for w in self.writers}
        self.stored_by: dict[tuple[str, int], int] = {}  # (writer, model segment) -> largest number stored
        self.sealed: set[int] = set()
        self.successors: dict[int, list[int]] = {}
        self.pending: list[Step] = []
        self._observe_epochs([])
        for w in self.writers:
            self.table[w] = [self._initial_owner(cell) for cell in range(grid)]
        self.pending = []
        self.run(self._observe_group(self.pending))
        self.initial_steps = self.pending
        self.pending = []

    # --- Running ---------------------------------------------------------------------------------

    async def _writer(self) -> AsyncEventStreamWriter[bytes]:
        return self.client.event_writer(f"{SCOPE}/{STREAM}")  # (made on the loop it will run on)

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS))  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            for future in self.checkpoints.values():
                future.cancel()
            for reader in list(self.readers.values()):
                self.run(reader._abandon())
            self.run(self.group.close())
            self.run(self.client.close())
            self.run(self.controller.stop())
            self.run(self.server.stop())
        finally:
            self.loop.close()

    # --- The environment's choices -----------------------------------------------------------------

    def write_event(self, writer: str, cell: int) -> list[Step]:
        """``writer`` writes an event with the routing key of ``cell`` (not flushed: it travels while
        the next steps run)."""
        self.written[writer] += 1
        number = self.written[writer]
        key = self.keys[cell]
        payload = EventTag(writer, number).payload(PAYLOAD_BYTES, key=key)
        self.run(self.writers[writer].write_event(payload, routing_key=key))
        route = self.table[writer][cell]
        self.inflight[writer][number] = (cell, route)
        return self._finish([{"a": "WriteEvent", "w": writer, "k": cell}])

    def flush(self, writer: str) -> list[Step]:
        """``writer`` waits until every event it wrote is stored."""
        self.run(self.writers[writer].flush())
        return self._finish([])

    def scale(self, predecessors: Iterable[int], ranges: Iterable[tuple[int, int]]) -> list[Step]:
        """A manual scale: seal the segments ``predecessors`` (model ids) and replace them by segments
        owning the cell ranges ``ranges``."""
        record = self.controller.state.streams[(SCOPE, STREAM)]
        ids = [s.segment_id for s in record.current.segments if self.model_id(s.segment_id) in set(predecessors)]
        self.run(self.controller.scale_stream(SCOPE, STREAM, ids, [(lo / self.grid, hi / self.grid)
                                                                   for lo, hi in ranges]))
        return self._finish([])

    def auto_scale(self, hot: Iterable[int] = (), cold: Iterable[int] = ()) -> tuple[list[Step], bool]:
        """Let the auto-scaler act: the segments ``hot`` (model ids) receive ten times the target rate,
        ``cold`` ones nothing, the others three quarters of it, for ``AUTO_SCALE_WAIT_SECONDS``; the
        controller ticks before and after.  Returns the steps and whether it scaled."""
        names = {s.model_id: s.name for s in self.segments.values()}
        record = self.controller.state.streams[(SCOPE, STREAM)]
        self.store.segments = [stream_segment_name(SCOPE, STREAM, s.segment_id) for s in record.current.segments]
        self.store.rates = {}
        before = self.controller.auto_scales
        self.run(self.controller.tick())  # (new segments start being measured)
        self.store.rates = {**{names[s]: HOT_RATE for s in hot}, **{names[s]: 0.0 for s in cold}}
        self.controller_clock.advance(AUTO_SCALE_WAIT_SECONDS)
        self.run(self.controller.tick())
        self.store.rates = {}
        return self._finish([]), self.controller.auto_scales > before

    def add_reader(self, reader: str) -> list[Step]:
        """``reader`` joins the group (new, or back after a crash), holding nothing."""
        self.readers[reader] = self.run(self.group.reader(reader, config=self.reader_config))
        return self._finish([])

    def read(self, reader: str, *, expect_event: bool = False, calls: int = 3) -> list[Step]:
        """``read_next_event(0)`` on ``reader`` until it returns an event or a checkpoint, at most
        ``calls`` times (letting the loop run between calls); with ``expect_event``, keep calling (for
        at most ``DELIVERY_WAIT_SECONDS``) until it returns one."""
        steps: list[Step] = []
        self.run(self._settle_reader(reader))
        deadline = self.loop.time() + DELIVERY_WAIT_SECONDS
        attempt = 0
        while True:
            attempt += 1
            read = self.run(self.readers[reader].read_next_event(0.0))
            self.run(self._observe_stores(steps, []))
            self.run(self._observe_group(steps))
            if read.checkpoint_name is not None:
                steps.append({"a": "SurfaceCheckpoint", "r": reader, "i": _number(read.checkpoint_name)})
                break
            if read.event is not None:
                steps.append(self._read_step(reader, read))
                break
            if attempt >= calls and not (expect_event and self.loop.time() < deadline):
                break
            self.run(asyncio.sleep(0.002))
        return self._finish(steps)

    def advance(self, seconds: float) -> list[Step]:
        """Time passes on the readers' clock, a heartbeat at a time: readers heartbeat, declare silent
        ones offline (if configured), and their rebalancing timers come due."""
        steps: list[Step] = []
        remaining = seconds
        while remaining > 0:
            step = min(HEARTBEAT_SECONDS, remaining)
            remaining -= step
            self.reader_clock.advance(step)
            self.run(self._settle_heartbeats())
            self.run(self._observe_group(steps))
        self._forget_removed()
        return self._finish(steps)

    def create_checkpoint(self, number: int) -> list[Step]:
        """The application starts checkpoint ``c<number>``."""
        self.checkpoints[number] = self.run(self.group.initiate_checkpoint(f"c{number}", timeout=3600.0))
        return self._finish([])

    def reset(self, number: int) -> list[Step]:
        """The application resets the group to completed checkpoint ``c<number>``."""
        self.run(self.group.reset_to_checkpoint(f"c{number}"))
        return self._finish([])

    def crash(self, reader: str, *, by_timeout: bool = False) -> list[Step]:
        """``reader``'s process dies; the application declares it offline (or, ``by_timeout``, the
        other readers do once it has been silent for their timeout)."""
        self.run(self.readers.pop(reader)._abandon())
        if by_timeout:
            # A reader that never saw the crashed one's heartbeat change starts counting at its first
            # heartbeat after the crash, and "silent" means strictly longer than the timeout: two
            # heartbeats beyond it cover both.
            return self.advance(OFFLINE_TIMEOUT_SECONDS + 2 * HEARTBEAT_SECONDS)
        self.run(self.group.reader_offline(reader))
        return self._finish([])

    def leave(self, reader: str) -> list[Step]:
        """``reader`` leaves the group at the position its application last persisted (the offsets
        recorded for it: where it acquired each segment, or its last checkpoint)."""
        state = self.run(self.group.state())
        recorded = Position(dict(state.segments_of(reader)))
        self.run(self.readers.pop(reader).close(recorded))
        return self._finish([])

    # --- What the implementation says --------------------------------------------------------------

    def group_state(self) -> ReaderGroupState:
        state = self.run(self.group.state())
        return state

    def segment_of(self, model_id: int) -> _Segment:
        return self.by_id[model_id]

    def count_at(self, name: str, offset: int) -> int:
        return self.segments[name].count_at(offset)

    def counts(self, offsets: Mapping[str, int]) -> dict[int, int]:
        """Segment name -> byte offset, as model id -> events before it."""
        return {self.segments[name].model_id: self.segments[name].count_at(o) for name, o in offsets.items()}

    def is_sealed(self, model_id: int) -> bool:
        name = self.by_id[model_id].name
        return bool(self.server.container_for(name).get_info(name).sealed)

    def positions(self, reader: str) -> dict[int, int]:
        """Where ``reader`` is, in the model's terms."""
        return self.counts(self.readers[reader].position().segments)

    def _finish(self, steps: list[Step]) -> list[Step]:
        """Observe whatever happened, append it to ``steps`` in the canonical order, return them."""
        self.run(self._observe_stores(steps, []))
        self.run(self._observe_group(steps))
        self._forget_removed()
        return steps

    def _forget_removed(self) -> None:
        state = self.sync.state
        if state is None:
            return
        for reader in [r for r in self.readers if r not in state.readers]:
            self.run(self.readers.pop(reader)._abandon())

    # --- The observer ------------------------------------------------------------------------------

    @staticmethod
    def model_id(segment_id: int) -> int:
        """The model's id of the segment with the controller's ``segment_id``."""
        return segment_id_parts(segment_id)[1] + 1

    def _initial_owner(self, cell: int) -> int:
        return next(s.model_id for s in self.segments.values() if s.cells[0] <= cell < s.cells[1])

    def _cells(self, start: float, end: float) -> tuple[int, int]:
        lo, hi = start * self.grid, end * self.grid
        assert lo == int(lo) and hi == int(hi), f"[{start}, {end}) is not a range of whole cells of {self.grid}"
        return int(lo), int(hi)

    def _observe_epochs(self, steps: list[Step]) -> list[tuple[set[int], list[int]]]:
        """New epochs: their segments become known; returns (predecessors, successors) of each scale."""
        history = self.controller.state.streams[(SCOPE, STREAM)].history
        scales = []
        for epoch in history.epochs[self.epochs_seen:]:
            ids = []
            for record in epoch.segments:
                name = stream_segment_name(SCOPE, STREAM, record.segment_id)
                if name not in self.segments:
                    segment = _Segment(name, self.model_id(record.segment_id),
                                       self._cells(record.key_start, record.key_end))
                    assert segment.model_id == len(self.segments) + 1, "segments are numbered densely"
                    self.segments[name] = segment
                    self.by_id[segment.model_id] = segment
                ids.append(self.segments[name].model_id)
            if self.epochs_seen > 0:
                previous = {self.segments[stream_segment_name(SCOPE, STREAM, s.segment_id)].model_id
                            for s in history.epochs[self.epochs_seen - 1].segments}
                predecessors = previous - set(ids)
                successors = sorted(set(ids) - previous, key=lambda s: self.by_id[s].cells)
                scales.append((predecessors, successors))
            self.epochs_seen += 1
        return scales

    async def _observe_stores(self, steps: list[Step], _unused: list[Step]) -> None:
        scales = self._observe_epochs(steps)
        new: dict[int, list[tuple[str, int, int]]] = {}
        for segment in self.segments.values():
            new[segment.model_id] = await self._read_new_events(segment)
        done: set[int] = set()
        for predecessors, successors in scales:
            steps.append({"a": "CreateSuccessors", "preds": set(predecessors),
                          "ranges": [list(self.by_id[s].cells) for s in successors]})
            steps.append({"a": "RecordEpoch"})
            for p in sorted(predecessors):
                self._stores(steps, p, new[p])
                done.add(p)
            steps.append({"a": "SealPredecessors"})
            steps.append({"a": "ActivateEpoch"})
            for p in predecessors:
                self.sealed.add(p)
                self.successors[p] = successors
        for model_id in sorted(new):
            if model_id not in done:
                self._stores(steps, model_id, new[model_id])

    async def _read_new_events(self, segment: _Segment) -> list[tuple[str, int, int]]:
        container = self.server.container_for(segment.name)
        length = container.get_info(segment.name).length
        if length == segment.end:
            return []
        result = await container.read(segment.name, segment.end, length - segment.end)
        data = bytes(result.data)
        assert len(data) == length - segment.end, "a stream segment's read came back short"
        found = []
        position = 0
        while position < len(data):
            kind, size = _HEADER.unpack_from(data, position)
            assert kind == 0, f"{segment.name} holds something that is not an event at {segment.end + position}"
            payload = data[position + _HEADER.size:position + _HEADER.size + size]
            tag = EventTag.parse(payload)
            assert tag is not None, f"{segment.name} holds a payload that no writer wrote: {payload!r}"
            key = payload.split(b"|", 1)[1].rstrip(b".").decode()
            segment.starts.append(segment.end + position)
            position += _HEADER.size + size
            event = (tag.writer, tag.sequence, self.cell_of_key[key])
            segment.events.append(event)
            found.append(event)
        segment.end = length
        return found

    def _stores(self, steps: list[Step], model_id: int, events: list[tuple[str, int, int]]) -> None:
        for writer, number, cell in events:
            for _ in range(64):  # follow the writer through the seals it met, one at a time
                route = self.inflight[writer].get(number, (cell, model_id))[1]
                if route == model_id or route not in self.sealed:
                    break
                self._segment_sealed(steps, writer, route)
            else:
                raise AssertionError(f"writer {writer}'s event {number} never reached segment {model_id}")
            steps.append({"a": "AppendEvent", "w": writer, "s": model_id, "n": number, "k": cell})
            self.stored_by[(writer, model_id)] = max(self.stored_by.get((writer, model_id), 0), number)
            steps.append({"a": "AckEvent", "w": writer, "s": model_id})
            last = self.stored_by[(writer, model_id)]
            self.inflight[writer] = {n: e for n, e in self.inflight[writer].items() if e[1] != model_id or n > last}

    def _segment_sealed(self, steps: list[Step], writer: str, sealed: int) -> None:
        """The writer learnt that ``sealed`` is sealed: what it stored there is done, the rest and the
        cells go to the successors (the spec's ``SegmentSealed``)."""
        steps.append({"a": "SegmentSealed", "w": writer, "s": sealed})
        successors = self.successors[sealed]

        def owner(cell: int) -> int:
            return next(t for t in successors if self.by_id[t].cells[0] <= cell < self.by_id[t].cells[1])
        self.table[writer] = [owner(c) if t == sealed else t for c, t in enumerate(self.table[writer])]
        last = self.stored_by.get((writer, sealed), 0)
        self.inflight[writer] = {n: ((c, owner(c)) if s == sealed else (c, s))
                                 for n, (c, s) in self.inflight[writer].items() if s != sealed or n > last}

    async def _observe_group(self, steps: list[Step]) -> None:
        await self.sync.fetch_updates()
        applied, self.codec.applied = self.codec.applied, []
        for before, update in applied:
            step = self._group_step(before, update)
            if step is not None:
                steps.append(step)

    def _group_step(self, before: ReaderGroupState, update: ReaderGroupUpdate) -> Step | None:
        if isinstance(update, UpdateDistanceToTail):
            return None
        if isinstance(update, AddReader):
            return {"a": "AddReader", "r": update.reader}
        if isinstance(update, AcquireSegment):
            segment = self.segments[update.segment]
            return {"a": "AcquireSegment", "r": update.reader, "s": segment.model_id,
                    "o": segment.count_at(before.unassigned[update.segment])}
        if isinstance(update, ReleaseSegment):
            segment = self.segments[update.segment]
            return {"a": "ReleaseSegment", "r": update.reader, "s": segment.model_id,
                    "o": segment.count_at(update.offset)}
        if isinstance(update, SegmentCompleted):
            segment = self.segments[update.segment]
            return {"a": "SegmentCompleted", "r": update.reader, "s": segment.model_id,
                    "end": segment.count_at(update.end_offset),
                    "succs": {self.segments[t].model_id: {self.segments[p].model_id for p in preds}
                              for t, preds in update.successors.items()}}
        if isinstance(update, CreateCheckpoint):
            return {"a": "CreateCheckpoint", "i": _number(update.name),
                    "cut": self.counts({**before.ended, **before.completed, **before.unassigned}),
                    "pending": set(before.readers)}
        if isinstance(update, CheckpointReader):
            return {"a": "CheckpointReader", "r": update.reader, "i": _number(update.name),
                    "positions": self.counts(update.positions)}
        if isinstance(update, RemoveReader):
            returned = dict(before.segments_of(update.reader))
            if update.positions is not None:
                returned.update(update.positions)
            return {"a": "ReaderOffline", "r": update.reader, "positions": self.counts(returned)}
        if isinstance(update, ReaderGroupStateInit):
            self.generation = update.generation
            cut = self.counts(update.start)
            number = next((_number(c.name) for c in before.checkpoints
                           if c.complete and self.counts(c.positions) == cut), 0)
            return {"a": "Reset", "i": number, "cut": cut}
        raise AssertionError(f"an update the observer does not know: {update!r}")

    def _read_step(self, reader: str, read: Any) -> Step:
        segment = self.segments[read.segment]
        index = segment.count_at(read.offset)
        tag = EventTag.parse(read.event)
        assert tag is not None
        writer, number, cell = segment.events[index]
        assert (tag.writer, tag.sequence) == (writer, number), "the event read is not the one stored there"
        return {"a": "ReadNextEvent", "r": reader, "s": segment.model_id, "o": index + 1, "w": writer, "n": number,
                "k": cell, "payload": bytes(read.event)}

    # --- Letting the loop catch up -----------------------------------------------------------------

    async def _settle_reader(self, reader: str) -> None:
        """Let ``reader`` take in the group's latest state before it is called, as its long poll on
        the state segment would have by then (its copy is what a reader decides by)."""
        await self.readers[reader].synchronizer.fetch_updates()

    async def _settle_heartbeats(self) -> None:
        """Wait until every live reader's heartbeat task has done its round and sleeps again."""
        deadline = self.loop.time() + DELIVERY_WAIT_SECONDS
        await asyncio.sleep(0)
        while self.reader_clock.sleeping < len(self.readers):  # (only heartbeat loops sleep on it)
            if self.loop.time() > deadline:
                raise AssertionError("the readers' heartbeats did not settle")
            await asyncio.sleep(0.001)


def _number(checkpoint_name: str) -> int:
    assert checkpoint_name.startswith("c"), checkpoint_name
    return int(checkpoint_name[1:])


def stream_segment(model_id: int) -> str:
    """(For messages.)"""
    return f"segment {model_id}"


_ = parse_stream_segment_name  # (kept for callers that name segments)
