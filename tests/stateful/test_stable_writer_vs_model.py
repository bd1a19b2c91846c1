"""A writer with a stable writer id across crashes, restarts and scaling, in lockstep with the model
(``millstream.model.stable_writer``, the executable mirror of ``spec/StableWriter.tla``).

Hypothesis drives a real node -- a segment store on the simulated tiers with the controller attached,
reached over TCP -- and one application that reads a source and writes it through
``event_writer(stream, writer_id="w1")``, each event with its source offset as the sequence.  Every
rule is an environment choice named after the model transition it starts:

* ``write_event`` -- the next source offset (a new key, or after a restart the key the source holds
  there), through the writer's per-event path on the test's thread, as the blocking writer does;
  what the writer returns (written, or dropped as a duplicate) must be what the model says;
* ``flush`` -- wait until everything written is durable;
* ``create_successors`` -- a split of a segment at any cell boundary, or a merge of two adjacent
  ones (the controller's four steps in one call);
* ``writer_crash`` -- the process dies: its connections are cut without a goodbye and its session
  loops stop; whatever requests it had put on the wire may still land (``ZombieAppend``), and the test
  waits until they have (or never will); the stream may scale meanwhile; then ``writer_restart``: a
  new process with the same stable id (a new client) replays the source from an offset at or before
  everything it had not seen flushed, and its floors must be the model's.

After each rule the implementation's steps are read off what it did -- the segments' new events
(each payload carries writer, sequence and key), whether its router still routes to a segment -- and
replayed on the model: each new event must be an ``AppendEvent`` (live process) or a ``ZombieAppend``
(dead one) the model allows, with ``AckEvent`` and ``SegmentSealed`` taken when the implementation
has acknowledged or handed over.  Then segments, epochs and seals must agree and the model's
invariants (exactly once, nothing acknowledged lost, per-key order) hold over the implementation's
data.  At the end the application restarts if it must, replays its whole source and flushes: every
offset is stored exactly once.

Bounds: eight cells starting in two segments, 16 source offsets, five scales, four crashes.  Default
profile: 20 examples x 30 steps; nightly: 300 x 60.  (Requests of a dead process that land after its
successor started are left to the spec: here they land before the restart.)

Seeded by hand once: with the floors read from the current segments only (not the key's chain), the
first restart after a scale had floors below the model's.  Removing the hold is not seen here (the
race needs two predecessors' hand-overs in the wrong order, which this node rarely produces):
``tests/writers/test_stable_writer.py`` builds that race on purpose and fails without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.client import AsyncClient, ClientConfig, ScalingPolicy, StreamConfig
from millstream.client._routing import StreamRouter, routing_key_fraction
from millstream.client._sequenced_writer import DUPLICATE, AsyncSequencedEventStreamWriter, SequencedWriterCore
from millstream.controller import Controller, ControllerConfig, ControllerRpc, LocalSegmentStore
from millstream.errors import ConnectionLostError, MillstreamError, ProtocolError
from millstream.model import stable_writer as sw
from millstream.model.types import AttributeUpdate, AttributeUpdateType
from millstream.naming import segment_id_parts, stream_segment_name
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag
from tests.server.raw import Tiers
from tests.trace.stream_run import keys_for_cells

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"

SCOPE, STREAM = "sc", "st"
WRITER = "w1"
GRID = 8
EVENTS = 16
MAX_SCALES = 5
MAX_CRASHES = 4
PAYLOAD_BYTES = 40
STEP_TIMEOUT_SECONDS = 30.0
#: Rounds of replay without progress before the test says the implementation did what the model cannot.
REPLAY_ROUNDS_MAX = 64
#: An attribute no writer uses: the barrier that waits for everything queued before it in a container.
BARRIER_ATTRIBUTE = 7
#: Loop turns a rule lets pass after its action, so that requests travel (any outcome is valid).
TURNS = 20

_HEADER = struct.Struct(">ii")
T = TypeVar("T")


@attrs.define
class _Segment:
    name: str
    model_id: int
    end: int = 0
    events: list[sw.StoredEvent] = attrs.field(factory=list)


class Node:
    """A segment store and a controller on one event loop, and what its stream's segments hold."""

    def __init__(self, seed: int) -> None:
        self.keys = keys_for_cells(GRID)
        self.cell_of_key = {key: cell for cell, key in enumerate(self.keys)}
        self.loop = asyncio.new_event_loop()
        self.tiers = Tiers("simulated")
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.run(self.server.start())
        clock = ManualClock(1_000_000.0)
        self.controller = Controller(LocalSegmentStore(self.server), clock=clock, now=clock.monotonic,
                                     config=ControllerConfig(periodic=False), rng=random.Random(seed))
        self.run(self.controller.start())
        self.server.attach_controller(ControllerRpc(self.controller))
        self.run(self.controller.create_scope(SCOPE))
        self.run(self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(2))))
        self.segments: dict[int, _Segment] = {}
        self.epochs_seen = 0
        self.observe_epochs()

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS))  # type: ignore[arg-type]

    def turns(self, count: int = TURNS) -> None:
        async def spin() -> None:
            for _ in range(count):
                await asyncio.sleep(0)
        self.run(spin())

    def close(self) -> None:
        try:
            self.run(self.controller.stop())
            self.run(self.server.stop())
        finally:
            self.loop.close()

    @staticmethod
    def model_id(segment_id: int) -> int:
        return segment_id_parts(segment_id)[1] + 1

    @property
    def history(self) -> Any:
        return self.controller.state.streams[(SCOPE, STREAM)].history

    def observe_epochs(self) -> list[frozenset[int]]:
        """New epochs' segment sets (model ids); their segments become known."""
        epochs = []
        for epoch in self.history.epochs[self.epochs_seen:]:
            for record in epoch.segments:
                model_id = self.model_id(record.segment_id)
                if model_id not in self.segments:
                    self.segments[model_id] = _Segment(stream_segment_name(SCOPE, STREAM, record.segment_id), model_id)
            epochs.append(frozenset(self.model_id(r.segment_id) for r in epoch.segments))
            self.epochs_seen += 1
        return epochs

    def epochs(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(self.model_id(r.segment_id) for r in e.segments) for e in self.history.epochs)

    def scale(self, predecessors: frozenset[int], ranges: tuple[tuple[int, int], ...],
              writes: Sequence[Callable[[], tuple[int, tuple[int, ...]]]] = ()) -> list[tuple[int, tuple[int, ...]]]:
        """Scale; ``writes`` (per-event calls of a live writer) run first, in the same event-loop turn as the
        scale's start, so that their requests race the seal.  Returns what they returned."""
        ids = [s.segment_id for s in self.history.epochs[-1].segments if self.model_id(s.segment_id) in predecessors]

        async def scale() -> list[tuple[int, tuple[int, ...]]]:
            results = [write() for write in writes]
            await self.controller.scale_stream(SCOPE, STREAM, ids, [(lo / GRID, hi / GRID) for lo, hi in ranges])
            return results
        return self.run(scale())

    def sealed(self, model_id: int) -> bool:
        name = self.segments[model_id].name
        return bool(self.server.container_for(name).get_info(name).sealed)

    def new_events(self) -> dict[int, list[sw.StoredEvent]]:
        """Every segment's events stored since the last call, in order (model ids)."""
        return {model_id: found for model_id, segment in sorted(self.segments.items())
                if (found := self.run(self._read(segment)))}

    async def _read(self, segment: _Segment) -> list[sw.StoredEvent]:
        container = self.server.container_for(segment.name)
        length = container.get_info(segment.name).length
        if length == segment.end:
            return []
        data = bytes((await container.read(segment.name, segment.end, length - segment.end)).data)
        assert len(data) == length - segment.end
        found = []
        position = 0
        while position < len(data):
            kind, size = _HEADER.unpack_from(data, position)
            assert kind == 0
            payload = data[position + _HEADER.size:position + _HEADER.size + size]
            tag = EventTag.parse(payload)
            assert tag is not None, f"{segment.name} holds a payload no writer wrote: {payload!r}"
            key = payload.split(b"|", 1)[1].rstrip(b".").decode()
            found.append(sw.StoredEvent(tag.writer, tag.sequence, self.cell_of_key[key]))
            position += _HEADER.size + size
        segment.events.extend(found)
        segment.end = length
        return found

    async def quiesce(self) -> None:
        """Wait until a dead process's connections are gone on the server side, then for everything
        they queued in the containers (an attribute update on every current segment, queued behind)."""
        deadline = self.loop.time() + STEP_TIMEOUT_SECONDS / 2
        while self.server.connections and self.loop.time() < deadline:  # noqa: ASYNC110 (a condition, bounded)
            await asyncio.sleep(0.001)
        assert not self.server.connections, "the dead process's connections did not close on the server"
        for record in self.history.epochs[-1].segments:
            name = stream_segment_name(SCOPE, STREAM, record.segment_id)
            await self.server.container_for(name).update_attributes(
                name, [AttributeUpdate(BARRIER_ATTRIBUTE, AttributeUpdateType.REPLACE, 0)])


class WriterProcess:
    """One process of the application's writer: its own client, the stable id ``w1``."""

    def __init__(self, node: Node, seed: int) -> None:
        self.node = node
        self.client = AsyncClient(node.server.uri, config=ClientConfig(), rng=random.Random(seed))

        async def make() -> AsyncSequencedEventStreamWriter[bytes]:
            writer = self.client.event_writer(f"{SCOPE}/{STREAM}", writer_id=WRITER)
            await writer.ready()
            return writer
        self.writer = node.run(make())
        self.core: SequencedWriterCore[bytes] = self.writer.core

    def write(self, cell: int, sequence: int, *, then_die: bool | None = None) -> tuple[int, tuple[int, ...]]:
        """The per-event path (as the blocking writer runs it): its flags, and where the writer routed
        each cell at that moment (``routes``) -- a hand-over that finished before it came first.  With
        ``then_die`` (see ``crash``), the process dies right after, before the event loop turns: the
        event's request, if it was sent, is still on its way."""
        async def write() -> tuple[int, tuple[int, ...]]:
            result = self.write_now(cell, sequence)
            if then_die is not None:
                self._die(reset=then_die)
            return result
        return self.node.run(write())

    def write_now(self, cell: int, sequence: int) -> tuple[int, tuple[int, ...]]:
        """(On the loop.)  ``write`` without running the loop."""
        key = self.node.keys[cell]
        routes = self.routes()
        flags = self.core.add_sequenced(EventTag(WRITER, sequence).payload(PAYLOAD_BYTES, key=key), key, sequence)
        return flags, routes

    def routes(self) -> tuple[int, ...]:
        """The segment (model id) the writer routes each cell to, cell by cell.  (By cell, not as the set
        of segments it routes to: a segment handed over for some cells may be routed to again for others,
        when a later hand-over of another predecessor reaches it through a merge.)"""
        router = self.core.router
        assert isinstance(router, StreamRouter)
        return tuple(self.node.model_id(router.segment_for_fraction(routing_key_fraction(key)).segment_id)
                     for key in self.node.keys)

    def floor(self, cell: int) -> int:
        return self.writer.deduplication_floor(self.node.keys[cell])

    def crash(self, *, reset: bool) -> None:
        """The process dies: session loops stopped, nothing flushed, connections cut -- ``reset``: aborted
        (what the kernel had not sent is gone), else closed as the kernel closes a killed process's
        sockets (what it had queued still leaves, then the close) -- so requests may land afterwards."""
        async def die() -> None:
            self._die(reset=reset)
        self.node.run(die())

    def _die(self, *, reset: bool) -> None:
        """(On the loop.)  All at once, without yielding to the loop (the server shares it): the process
        does nothing after this moment -- what it had sent is the server's to take or not."""
        for writer in list(self.core._writers.values()):
            with self.core.shared.lock:
                writer._closing = True
            if writer._task is not None:
                writer._task.cancel()
        for connection in self.client._pool.connections():
            connection.close(ProtocolError("the writer's process was killed") if reset
                             else ConnectionLostError("the writer's process was killed"))

    def bury(self) -> None:
        """Release what the dead process's objects still hold (its client)."""
        async def release() -> None:
            for writer in list(self.core._writers.values()):
                await writer.stop()
            with contextlib.suppress(MillstreamError):  # (its writer cannot flush: it is dead)
                await self.client.close()
        self.node.run(release())

    def close(self) -> None:
        self.node.run(self.client.close())


class StableWriterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.node = Node(seed=5)
        self.model = sw.initial_state([WRITER], GRID, initial_splits=(GRID // 2,))
        self.process: WriterProcess | None = WriterProcess(self.node, seed=100)
        self.incarnation = 0
        self.pending: dict[int, deque[sw.StoredEvent]] = {}
        #: The source offset up to which the application saw everything durable (flushed or dropped).
        self.durable = 0
        self.healthy = True

    def teardown(self) -> None:
        try:
            if self.healthy:
                self.finish()
        finally:
            if self.process is not None:
                with contextlib.suppress(MillstreamError):
                    self.process.close()
            self.node.close()

    # --- Replaying what the implementation did on the model ------------------------------------------

    def take(self, transition: Any, *args: Any) -> None:
        try:
            self.model = transition(self.model, *args)
        except sw.NotEnabled as error:
            raise AssertionError(f"{transition.__name__}{args} is not a step the model allows: {error}") from None

    def catch_up(self, *, only: frozenset[int] | None = None) -> None:
        """Replay the events the segments gained (only in ``only``, if given), with the acknowledgements
        and hand-overs the implementation took, until every one is explained."""
        for model_id, events in self.node.new_events().items():
            self.pending.setdefault(model_id, deque()).extend(events)
        for _ in range(REPLAY_ROUNDS_MAX):
            progress = self._hand_overs() | self._acknowledgements()
            for model_id, queue in self.pending.items():
                if only is not None and model_id not in only:
                    continue
                while queue and self._explain(model_id, queue[0]):
                    queue.popleft()
                    progress = True
            if not any(q for s, q in self.pending.items() if only is None or s in only):
                self._acknowledgements()
                return
            if not progress:
                break
        left = {s: list(q) for s, q in self.pending.items() if q and (only is None or s in only)}
        raise AssertionError(f"the implementation stored events the model cannot explain: {left}; "
                             f"model in flight {self.model.inflight[WRITER]}, zombie {self.model.zombie[WRITER]}")

    def _explain(self, model_id: int, stored: sw.StoredEvent) -> bool:
        """One observed event as a ZombieAppend (a dead process's) or an AppendEvent (the live one's)."""
        before = len(self.model.data[model_id - 1])
        for crash in sorted({z.crash for z in self.model.zombie[WRITER]
                             if z.segment == model_id and z.number == stored.number}):
            try:
                after = sw.zombie_append(self.model, WRITER, model_id, crash)
            except sw.NotEnabled:
                continue
            if after.data[model_id - 1][before:] == (stored,):
                self.model = after
                event("a dead process's request landed")
                return True
        if WRITER in self.model.alive:
            try:
                after = sw.append_event(self.model, WRITER, model_id)
            except sw.NotEnabled:
                return False
            if after.data[model_id - 1][before:] == (stored,):
                self.model = after
                return True
        return False

    def _acknowledgements(self) -> bool:
        progress = False
        if WRITER in self.model.alive:
            for segment in sorted(self.model.routed(WRITER)):
                try:
                    self.model = sw.ack_event(self.model, WRITER, segment)
                    progress = True
                except sw.NotEnabled:
                    pass
        return progress

    def _hand_overs(self, routes: tuple[int, ...] | None = None) -> bool:
        """``SegmentSealed`` for every sealed segment the model routes a cell to that the implementation
        routes elsewhere (now, or in ``routes``: where it routed each cell at some moment).  Cell by cell:
        the writer hands a segment over when it learns of the seal, and may route other cells to it
        again later (a predecessor's hand-over that reaches it through a merge), as the spec allows."""
        progress = False
        process = self.process
        if process is None or WRITER not in self.model.alive:
            return False
        if routes is None:
            routes = process.routes()
        for segment in sorted(self.model.routed(WRITER)):
            table = self.model.table[WRITER]
            if segment in self.model.sealed and any(
                    target == segment and routes[cell] != segment for cell, target in enumerate(table)):
                try:
                    self.model = sw.segment_sealed(self.model, WRITER, segment)
                    event("the writer handed a sealed segment's events over")
                    progress = True
                except sw.NotEnabled:
                    pass
        return progress

    # --- The application ---------------------------------------------------------------------------

    def next_cell(self, data: st.DataObject) -> int:
        number = self.model.written[WRITER] + 1
        source = self.model.source[WRITER]
        if number <= len(source):
            return source[number - 1]
        return data.draw(st.integers(0, GRID - 1), label="cell")

    @precondition(lambda self: WRITER in self.model.alive and self.model.written[WRITER] < EVENTS)
    @rule(data=st.data(), turns=st.integers(0, 12) | st.just(TURNS))
    def write_event(self, data: st.DataObject, turns: int) -> None:
        """``turns``: how long the event loop runs afterwards -- from not at all (the event waits in the
        writer) to long enough for it to be stored; a crash soon after leaves requests on the wire."""
        self.healthy = False
        self.write(self.next_cell(data), turns)

    def write(self, cell: int, turns: int = TURNS, *, then_die: bool | None = None) -> None:
        assert self.process is not None
        self.catch_up()
        number = self.model.written[WRITER] + 1
        self.written(cell, *self.process.write(cell, number, then_die=then_die))
        if then_die is not None:
            return  # (the caller takes WriterCrash next)
        self.node.turns(turns)
        self.catch_up()

    def written(self, cell: int, flags: int, routes: tuple[int, ...]) -> None:
        """The model's ``WriteEvent`` for what the writer did with the next offset (after the hand-overs
        it had finished by then)."""
        number = self.model.written[WRITER] + 1
        self._hand_overs(routes)
        duplicate = sw.is_duplicate(self.model, WRITER, cell)
        assert bool(flags & DUPLICATE) == duplicate, (
            f"event {number} (cell {cell}): the writer says {'duplicate' if flags & DUPLICATE else 'written'}, "
            f"the model {'duplicate' if duplicate else 'written'} (floor {self.model.floor[WRITER][cell]})")
        self.take(sw.write_event, WRITER, cell)
        if duplicate:
            event("a replayed event was dropped as a duplicate")
        if duplicate and self.durable == number - 1:
            self.durable = number

    @precondition(lambda self: WRITER in self.model.alive)
    @rule()
    def flush(self) -> None:
        self.healthy = False
        assert self.process is not None
        self.node.run(self.process.writer.flush())
        self.catch_up()
        assert not self.model.inflight[WRITER], f"flushed, but the model has {self.model.inflight[WRITER]} in flight"
        self.durable = self.model.written[WRITER]

    @precondition(lambda self: self.model.scales < MAX_SCALES)
    @rule(data=st.data(), racing=st.integers(0, 3))
    def create_successors(self, data: st.DataObject, racing: int) -> None:
        """A split or a merge; ``racing`` events are written in the same event-loop turn as the scale
        starts, so that their requests race the seal (and the hand-over of several predecessors races)."""
        self.healthy = False
        self.scale(data, racing)

    def scale(self, data: st.DataObject, racing: int = 0) -> None:
        predecessors, ranges = data.draw(st.sampled_from(list(sw.scale_requests(self.model))), label="scale")
        self.catch_up()
        process = self.process
        cells: list[int] = []
        if process is not None:
            source = self.model.source[WRITER]
            for number in range(self.model.written[WRITER] + 1, min(self.model.written[WRITER] + racing, EVENTS) + 1):
                cells.append(source[number - 1] if number <= len(source)
                             else data.draw(st.integers(0, GRID - 1), label="cell"))
        first = self.model.written[WRITER] + 1
        writes = [lambda cell=cell, number=number: process.write_now(cell, number)  # type: ignore[union-attr]
                  for number, cell in enumerate(cells, start=first)]
        results = self.node.scale(predecessors, ranges, writes)
        for cell, (flags, routes) in zip(cells, results, strict=True):
            self.written(cell, flags, routes)
        epochs = self.node.observe_epochs()
        self.take(sw.create_successors, predecessors, ranges)
        self.take(sw.record_epoch)
        assert epochs == [self.model.current], (epochs, self.model.current)
        # What the predecessors (and older segments) stored came before their seal.
        self.catch_up(only=frozenset(range(1, len(self.model.segments) + 1)) - self.model.scaling.successors)
        self.take(sw.seal_predecessors)
        self.take(sw.activate_epoch)
        self.node.turns()
        self.catch_up()

    @precondition(lambda self: WRITER in self.model.alive and self.model.crashes < MAX_CRASHES)
    @rule(data=st.data(), reset=st.booleans(), writing=st.booleans(), scale_meanwhile=st.booleans())
    def writer_crash(self, data: st.DataObject, reset: bool, writing: bool, scale_meanwhile: bool) -> None:
        """The process dies (``writing``: right after writing an event, its request perhaps on its way);
        while it is dead the stream may scale; then the application restarts it (``writer_restart``)
        from an offset at or before everything it had not seen durable."""
        self.healthy = False
        if writing and self.model.written[WRITER] < EVENTS:
            self.write(self.next_cell(data), then_die=reset)
            self.crash(reset=reset, dead_already=True)
        else:
            self.crash(reset=reset)
        if scale_meanwhile and self.model.scales < MAX_SCALES:
            self.scale(data)
        self.restart(data.draw(st.integers(0, self.durable), label="resume after"))

    def crash(self, *, reset: bool, dead_already: bool = False) -> None:
        assert self.process is not None
        if not dead_already:
            self.catch_up()
            self.process.crash(reset=reset)
        dead, self.process = self.process, None
        self.take(sw.writer_crash, WRITER)
        self.node.run(self.node.quiesce())
        self.catch_up()  # what its requests stored after it died
        dead.bury()

    def restart(self, resume: int) -> None:
        self.incarnation += 1
        self.process = WriterProcess(self.node, seed=100 + self.incarnation)
        self.catch_up()
        self.take(sw.writer_restart, WRITER, resume)
        floors = [self.process.floor(cell) for cell in range(GRID)]
        assert tuple(floors) == self.model.floor[WRITER], (floors, self.model.floor[WRITER])
        if len(set(floors)) > 1:
            event("restarted with floors that differ by key")
        self.durable = resume

    # --- What the two agree on ---------------------------------------------------------------------

    @invariant()
    def implementation_agrees_with_the_model(self) -> None:
        model, node = self.model, self.node
        model.check_invariants()
        assert node.epochs() == model.epochs, (node.epochs(), model.epochs)
        for model_id in range(1, len(model.segments) + 1):
            stored = tuple(node.segments[model_id].events)
            assert stored == model.data[model_id - 1], (model_id, stored, model.data[model_id - 1])
            assert node.sealed(model_id) == (model_id in model.sealed), model_id
        if self.process is not None:
            self.process.core.check_invariants()
        self.healthy = True

    def finish(self) -> None:
        """Restart if dead, replay the whole source, flush: every offset stored exactly once."""
        if self.process is None:
            self.restart(0)
        else:
            self.catch_up()
        assert self.process is not None
        total = len(self.model.source[WRITER])
        while self.model.written[WRITER] < total:
            self.write(self.model.source[WRITER][self.model.written[WRITER]])  # (a replay: the source's key)
        self.flush()
        stored = [(e.writer, e.number) for events in self.model.data for e in events]
        assert sorted(stored) == [(WRITER, n) for n in range(1, total + 1)], stored
        self.implementation_agrees_with_the_model()


StableWriterMachine.TestCase.settings = settings(
    max_examples=300 if NIGHTLY else 20, stateful_step_count=60 if NIGHTLY else 30, deadline=None)
test_stable_writer_vs_model = StableWriterMachine.TestCase
