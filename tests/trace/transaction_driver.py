"""Seeded runs of the real controller and client with stream transactions, recording their trace.

A run is a segment store on the simulated tiers in this process, a ``Controller`` serving it (its
transaction workflows on: the worker commits and aborts in the background, as in production) on a
manual clock, and a real ``AsyncClient`` over TCP.  A seeded scheduler takes one step at a time:
clients begin transactions, write into them (``AsyncTransaction.write_event``), ping, commit and
abort them; time passes a tick at a time and ``Controller.tick`` expires lapsed leases; the stream
scales under open transactions (so commits roll); a plain ``EventStreamWriter`` writes; a Spark-like
caller commits batches with fenced multi-commits -- batches replayed with new transactions, requests
sent again as after a lost reply, two sent at once; and the controller dies at a seeded store change
(before or after the change lands: in the middle of a commit, a roll, a fenced multi-commit, a
request) and a new one starts on the same store.

What is recorded, and where (one event loop, so one order):

* every metadata record the controller makes durable, and every merge of a transaction segment (with
  the events it carried), at the store boundary (``TracingStore``), the moment the store reports it
  done -- so a change that landed just before the controller died is in the trace too;
* the fenced multi-commits' requests and decisions, by the controller's tracer (they may record
  nothing);
* the client's writes into transactions, plain writes, ticks, controller restarts, and ``Observe``
  snapshots of everything a client could see, by the scheduler.

Plain writes are made only while no commit workflow runs (the scheduler waits for the worker first):
an append racing a merge has no point in the trace that the store-side record could name without
tracing inside the segment store, and their order is StreamOrdering's subject anyway.  For the same
reason a client never writes into a transaction whose lease lapsed (the spec's client stops writing
once it asked to commit or abort; a lapsed lease is the controller's to act on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import struct
from collections.abc import Callable, Iterator
from typing import Any, Final

import attrs

from millstream.client import AsyncClient, ClientConfig, ScalingPolicy, StreamConfig
from millstream.client._transactions import AsyncTransaction
from millstream.controller import Controller, ControllerConfig, ControllerRpc, LocalSegmentStore, TxnStatus
from millstream.controller._metadata_log import METADATA_SEGMENT
from millstream.controller._segment_store import AppendCounts, SegmentState
from millstream.errors import InvalidScaleError, MillstreamError, TransactionNotOpenError
from millstream.naming import stream_segment_name
from millstream.segmentstore.read_index import ReadResult
from millstream.server import SegmentStoreServer
from millstream.testing.clock import ManualClock
from millstream.testing.tracing import TraceEvent
from millstream.wire.codec import iter_events
from tests.server.raw import Tiers
from tests.transactions.helpers import keys_in

__all__ = ["KEYS", "LEASE_TICKS", "SCOPE", "START_TIME", "STREAM", "RunShape", "transaction_run"]

SCOPE, STREAM = "tx", "st"
QUALIFIED = f"{SCOPE}/{STREAM}"
#: Routing keys, one in each quarter of the key space; the layouts are what each epoch does with them.
KEYS: Final = tuple(keys_in(low, low + 0.25, 1, "key")[0] for low in (0.0, 0.25, 0.5, 0.75))
#: Where scales may cut the key space (eighths: some segments end up owning none of the keys).
CUTS: Final = tuple(n / 8 for n in range(1, 8))
LEASE_TICKS: Final = 4
TICK_SECONDS: Final = 1.0
START_TIME: Final = 1_000_000.0
FENCE_KEY: Final = "query"
#: Waiting for the controller's worker: rounds of ``SETTLE_SLEEP_SECONDS`` (10 s in all).
SETTLE_ROUNDS: Final = 2000
SETTLE_SLEEP_SECONDS: Final = 0.005
STEP_TIMEOUT_SECONDS: Final = 30.0
#: A scale planned against an epoch a roll replaced meanwhile is planned again, this many times at most.
SCALE_ATTEMPTS_MAX: Final = 3
_LENGTH: Final = struct.Struct(">I")

log = logging.getLogger(__name__)


@attrs.frozen
class RunShape:
    """A run's bounds: scheduler steps, transactions begun, events per transaction, plain events,
    ticks, scales, controller crashes."""

    steps: int = 50
    txns: int = 6
    txn_events: int = 3
    plain_events: int = 4
    ticks: int = 8
    scales: int = 2
    crashes: int = 2


class ControllerDied(Exception):
    """The controller's process "dies" at this store change (a test fault; nothing it does afterwards
    reaches the store)."""


class Recorder:
    """The run's trace, in one order.  Events from the controller's tracer while it is dead (after a
    crash, before the restart) are dropped: a dead process's decisions reach nobody."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []
        self.controller_dead = False

    def __call__(self, action: str, /, **fields: Any) -> None:
        if action == "CrashController":
            self.controller_dead = True
        elif action == "RestartController":
            self.controller_dead = False
        self.events.append(TraceEvent(action, fields))

    @property
    def crashes(self) -> int:
        return sum(1 for event in self.events if event.action == "CrashController")

    def before_crash(self, number: int, record: Callable[[], None]) -> None:
        """Record what ``record`` records just before the ``number``-th ``CrashController`` (from 1)."""
        crash = [n for n, event in enumerate(self.events) if event.action == "CrashController"][number - 1]
        after = self.events[crash:]
        del self.events[crash:]
        record()
        self.events += after

    def controller_tracer(self, action: str, /, **fields: Any) -> None:
        if not self.controller_dead:
            self(action, **fields)


class TracingStore:
    """The controller's ``SegmentStore``, passing every call to ``inner`` and recording each metadata
    record and each merge as it lands.  Once ``arm``ed, its ``n``-th change from then on kills the
    controller: the change is not sent (or, with ``landed``, it lands first), and every later call
    raises ``ControllerDied``."""

    def __init__(self, inner: LocalSegmentStore, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder
        self.crashed = False
        self._countdown = 0
        self._landed = False

    def arm(self, n: int, *, landed: bool) -> None:
        self._countdown, self._landed = n, landed

    def _alive(self) -> None:
        if self.crashed:
            raise ControllerDied("the controller is dead")

    def _die(self, what: str) -> ControllerDied:
        self.crashed = True
        self.recorder("CrashController", at=what, landed=self._landed)
        return ControllerDied(f"died at {what}")

    async def _change(self, what: str, call: Callable[[], Any], landed: Callable[[Any], None]) -> Any:
        self._alive()
        if self._countdown:
            self._countdown -= 1
            if self._countdown == 0:
                if self._landed:
                    landed(await call())
                raise self._die(what)
        # Sent while the controller is alive, a change lands even if the controller dies before it
        # returns (another of its calls was the fatal one, or stopping it cancelled this one): then it
        # took effect between the two, so it is recorded just before that crash.
        crashes = self.recorder.crashes
        change = asyncio.ensure_future(call())

        def late(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.recorder.before_crash(crashes + 1, lambda: landed(done.result()))

        try:
            result = await asyncio.shield(change)
        except asyncio.CancelledError:
            change.add_done_callback(late)
            raise
        if self.recorder.crashes > crashes:
            late(change)
        else:
            landed(result)
        return result

    async def create_segment(self, name: str) -> bool:
        return await self._change(f"create {name}", lambda: self.inner.create_segment(name), _nothing)

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        def landed(_: Any) -> None:
            if name == METADATA_SEGMENT:
                (length,) = _LENGTH.unpack_from(data)
                record = json.loads(data[_LENGTH.size:_LENGTH.size + length])
                self.recorder("Record", record=record)
        return await self._change(f"append {name}", lambda: self.inner.append(
            name, data, expected_offset=expected_offset), landed)

    async def merge(self, target: str, source: str) -> bool:
        self._alive()
        content = await read_events(self.inner, source)

        def landed(merged: Any) -> None:
            if merged:
                self.recorder("Merged", target=target, source=source, content=content)
        return await self._change(f"merge {source}", lambda: self.inner.merge(target, source), landed)

    async def seal(self, name: str) -> int:
        return await self._change(f"seal {name}", lambda: self.inner.seal(name), _nothing)

    async def truncate(self, name: str, offset: int) -> None:
        await self._change(f"truncate {name}", lambda: self.inner.truncate(name, offset), _nothing)

    async def delete(self, name: str) -> bool:
        return await self._change(f"delete {name}", lambda: self.inner.delete(name), _nothing)

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        self._alive()
        return await self.inner.read(name, offset, max_length)

    async def get_info(self, name: str) -> SegmentState | None:
        self._alive()
        return await self.inner.get_info(name)

    def uri_of(self, name: str) -> str:
        return self.inner.uri_of(name)

    def container_of(self, name: str) -> int:
        return self.inner.container_of(name)

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        return self.inner.drain_append_counts()


def _nothing(_: Any) -> None:
    pass


async def read_events(store: LocalSegmentStore, name: str) -> list[str]:
    """The payloads of the events in segment ``name`` (none if it does not exist)."""
    info = await store.get_info(name)
    if info is None:
        return []
    data = b""
    while len(data) < info.length:
        result = await store.read(name, len(data), info.length - len(data))
        data += bytes(result.data)
    return [payload.decode() for payload in iter_events(data)]


@attrs.define
class _Txn:
    """What the scheduler knows of one transaction it began."""

    handle: AsyncTransaction[bytes]
    written: int = 0
    open: bool = True  # as far as the scheduler knows: it may write into it, commit or abort it
    deadline: float = 0.0

    @property
    def hex(self) -> str:
        return self.handle.txn_id.hex


class _Run:
    """One seeded run (see the module docstring)."""

    def __init__(self, seed: int, shape: RunShape) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.shape = shape
        self.recorder = Recorder()
        self.clock = ManualClock(START_TIME)  # the controller's: leases and deadlines
        self.tiers = Tiers("simulated")
        self.server = SegmentStoreServer(self.tiers.open_log, chunk_storage=self.tiers.open_chunk_storage())
        self.incarnation = 0
        self.txns: dict[str, _Txn] = {}
        self.plain_written = 0
        self.ticks = 0
        self.scales = 0
        self.crashes = 0
        self.batches = 0  # fence values used so far
        self.layouts_seen: set[tuple[tuple[float, float], ...]] = set()
        self.store: TracingStore
        self.controller: Controller
        #: The request the current step sent, to send again if the controller died under it.
        self.in_flight: Callable[[], Any] | None = None

    # --- The controller's life -----------------------------------------------------------------------

    async def start_controller(self) -> None:
        self.incarnation += 1
        self.store = TracingStore(LocalSegmentStore(self.server), self.recorder)
        self.controller = Controller(self.store, clock=self.clock, now=self.clock.monotonic,
                                     config=ControllerConfig(periodic=False),
                                     rng=random.Random(self.seed * 1000 + self.incarnation),
                                     tracer=self.recorder.controller_tracer)
        await self.controller.start()
        self.server.attach_controller(ControllerRpc(self.controller))

    async def restart_if_dead(self) -> None:
        if not self.store.crashed:
            return
        await self.controller.stop()  # its tasks end; what it recorded stays in the store
        self.recorder("RestartController")
        await self.start_controller()

    async def settle(self) -> bool:
        """Wait until the controller's worker has finished every commit and abort (False: it died)."""
        for _ in range(SETTLE_ROUNDS):
            if self.store.crashed:
                return False
            stream = self.controller.state.streams[(SCOPE, STREAM)]
            busy = stream.pending is not None or any(
                r.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING) for r in stream.transactions.values())
            if not busy and all(w.done() for w in self.controller._transaction_workers.values()):
                return True
            await asyncio.sleep(SETTLE_SLEEP_SECONDS)
        raise AssertionError(f"seed {self.seed}: the controller's transaction workflows did not finish "
                             f"({self.controller.failed_transaction_runs} failed runs)")

    # --- Observation -----------------------------------------------------------------------------------

    async def observe(self) -> None:
        """Record what a client could see now (after ``settle``): every segment of every epoch, which
        are sealed, every transaction's status and the recorded fence values."""
        stream = self.controller.state.streams[(SCOPE, STREAM)]
        store = self.store.inner
        epochs = []
        for epoch in stream.history.epochs:
            segments, sealed = [], []
            for segment in epoch.segments:
                name = stream_segment_name(SCOPE, STREAM, segment.segment_id)
                info = await store.get_info(name)
                assert info is not None, name
                segments.append(await read_events(store, name))
                sealed.append(info.sealed)
            epochs.append({"epoch": epoch.epoch, "segments": segments, "sealed": sealed})
        statuses = {txn_id: record.status.value for txn_id, record in stream.transactions.items()}
        self.recorder("Observe", epochs=epochs, current=stream.current.epoch, statuses=statuses,
                      fences=dict(stream.fences))

    # --- Steps -----------------------------------------------------------------------------------------

    def writable(self) -> list[_Txn]:
        now = self.clock.monotonic()
        return [t for t in self.txns.values() if t.open and now < t.deadline and t.written < self.shape.txn_events]

    def open_txns(self) -> list[_Txn]:
        return [t for t in self.txns.values() if t.open]

    async def begin(self) -> None:
        handle = await self.writer.begin()
        self.txns[handle.txn_id.hex] = _Txn(handle, deadline=handle.info.deadline)

    async def write(self) -> None:
        txn = self.rng.choice(self.writable())
        key = self.rng.choice(KEYS)
        number = txn.written + 1
        await txn.handle.write_event(f"{txn.hex}|{key}|{number}".encode(), routing_key=key)
        txn.written = number
        self.recorder("WriteEvent", txn=txn.hex, key=key, number=number)
        if self.rng.random() < 0.3:
            await txn.handle.flush()

    def pingable(self) -> list[_Txn]:
        """Open transactions whose lease a ping would move (the others' pings record nothing)."""
        due = self.clock.monotonic() + LEASE_TICKS * TICK_SECONDS
        return [t for t in self.open_txns() if t.deadline < due]

    async def ping(self) -> None:
        txn = self.rng.choice(self.pingable())
        try:
            txn.deadline = await txn.handle.ping()
        except MillstreamError as error:  # lapsed, or committed/aborted elsewhere: nothing changes
            log.debug("ping of %s: %r", txn.hex, error)

    async def tick(self) -> None:
        self.clock.advance(TICK_SECONDS)
        self.ticks += 1
        self.recorder("Tick")
        await self.controller.tick()  # expires lapsed leases (the worker then deletes their segments)

    async def commit(self) -> None:
        txn = self.rng.choice(self.open_txns())
        txn.open = False  # whatever the answer: the client's commit stops its writer first

        async def send() -> None:
            # Refused if its lease lapsed and the controller aborted it first, or if a lost reply's
            # commit had landed.
            with contextlib.suppress(TransactionNotOpenError):
                await txn.handle.commit()
        self.in_flight = send
        await send()

    async def commit_several(self) -> None:
        """Clients commit two or three transactions at once: the worker finds several committing and
        must merge them in the order their commits were decided."""
        chosen = self.rng.sample(self.open_txns(), k=min(len(self.open_txns()), self.rng.randint(2, 3)))
        for txn in chosen:
            txn.open = False

        async def send() -> None:
            for outcome in await asyncio.gather(*(t.handle.commit() for t in chosen), return_exceptions=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, TransactionNotOpenError):
                    raise outcome
        self.in_flight = send
        await send()

    async def abort(self) -> None:
        txn = self.rng.choice(self.open_txns())
        txn.open = False
        self.in_flight = txn.handle.abort
        await txn.handle.abort()

    async def scale(self) -> None:
        """Replace every segment of the current epoch (as the spec's ``Scale`` does) by a new layout:
        one segment split at a cut, or two neighbours merged -- never a layout the stream had before
        (the implementation's "same layout" needs the same containers too; ``_transactions``).  A
        commit's roll may change the current epoch between reading it and the request: the controller
        refuses (``InvalidScaleError``, recording nothing) and the scale is planned again."""
        for _ in range(SCALE_ATTEMPTS_MAX):
            current = self.controller.state.streams[(SCOPE, STREAM)].current
            ranges = [(s.key_start, s.key_end) for s in current.segments]
            for _ in range(20):
                layout = _scaled(self.rng, ranges)
                if layout not in self.layouts_seen:
                    break
            else:
                return
            self.layouts_seen.add(layout)  # (before the request: a crash may leave it to land later)
            try:
                await self.client.stream_manager().scale_stream(
                    QUALIFIED, [s.segment_id for s in current.segments], list(layout))
            except InvalidScaleError:
                if self.store.crashed:
                    raise
                continue
            self.scales += 1
            return

    async def write_plain(self) -> None:
        if not await self.settle():
            return
        key = self.rng.choice(KEYS)
        number = self.plain_written + 1
        await self.plain.write_event(f"plain|{key}|{number}".encode(), routing_key=key)
        await self.plain.flush()
        self.plain_written = number
        self.recorder("WritePlainEvent", key=key, number=number)

    async def fenced_commit(self) -> None:
        """A Spark driver commits a batch: the tasks' open transactions (flushed), fenced by the batch
        number -- sometimes a batch already committed (a replay), sometimes the same request twice (a
        retry after a lost reply), sometimes a replay racing the original."""
        candidates = self.open_txns()
        # Listed in any order: the spec's request is a set, given consecutive commit orders by the
        # transactions' identities (numbered as they begin), and so does the controller.
        chosen = self.rng.sample(candidates, k=min(len(candidates), self.rng.randint(2, 3)))
        for txn in chosen:
            await txn.handle.flush()
            txn.open = False
        replay = self.batches > 0 and self.rng.random() < 0.5
        value = self.rng.randint(1, self.batches) if replay else self.batches + 1
        self.batches = max(self.batches, value)

        async def send(txns: list[_Txn]) -> None:
            # Rejected, changing nothing, if a listed transaction is not open (a retry, a lapsed lease).
            with contextlib.suppress(TransactionNotOpenError):
                await self.client.commit_transactions(QUALIFIED, [t.handle for t in txns], fence=(FENCE_KEY, value))

        if len(chosen) >= 2 and self.rng.random() < 0.3:
            async def race() -> None:  # two drivers racing on one batch
                await asyncio.gather(send(chosen[:1]), send(chosen[1:]))
            self.in_flight = race
            await race()
        else:
            self.in_flight = lambda: send(chosen)
            await send(chosen)
            if self.rng.random() < 0.5:
                await send(chosen)

    async def arm_crash(self) -> None:
        self.store.arm(self.rng.randint(1, 8), landed=self.rng.random() < 0.5)
        self.crashes += 1

    def steps(self) -> Iterator[Callable[[], Any]]:
        """The seeded choice of the next step, among those allowed now."""
        shape = self.shape
        while True:
            choices: list[tuple[Callable[[], Any], int]] = []
            if len(self.txns) < shape.txns:
                choices.append((self.begin, 2))
            if self.writable():
                choices.append((self.write, 10))
            if self.pingable():
                choices.append((self.ping, 3))
            if self.open_txns():
                choices += [(self.commit, 2), (self.commit_several, 1), (self.abort, 1), (self.fenced_commit, 2)]
            if self.ticks < shape.ticks:
                choices.append((self.tick, 2))
            if self.scales < shape.scales:
                choices.append((self.scale, 1))
            if self.plain_written < shape.plain_events:
                choices.append((self.write_plain, 2))
            if self.crashes < shape.crashes:
                choices.append((self.arm_crash, 1))
            choices.append((self.settle_and_observe, 1))
            yield self.rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]

    async def settle_and_observe(self) -> None:
        if self.recorder.events[-1].action != "Observe" and await self.settle():
            await self.observe()

    # --- The run ---------------------------------------------------------------------------------------

    async def run(self) -> list[TraceEvent]:
        await self.server.start()
        try:
            await self.start_controller()
            segments = self.rng.randint(1, 2)
            await self.controller.create_scope(SCOPE)
            await self.controller.create_stream(SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(segments)))
            current = self.controller.state.streams[(SCOPE, STREAM)].current
            self.layouts_seen.add(tuple((s.key_start, s.key_end) for s in current.segments))
            self.client = AsyncClient(self.server.uri, config=ClientConfig(), clock=ManualClock(),
                                      rng=random.Random(self.seed))
            self.writer = self.client.transactional_writer(QUALIFIED, lease_seconds=LEASE_TICKS * TICK_SECONDS)
            self.plain = self.client.event_writer(QUALIFIED)
            try:
                chooser = self.steps()
                for _ in range(self.shape.steps):
                    await self.step(next(chooser))
                # The end: a controller that is alive, every decided commit and abort finished, a last look.
                self.store.arm(0, landed=False)
                await self.restart_if_dead()
                for _ in range(self.shape.crashes + 1):
                    if await self.settle():
                        break
                    await self.restart_if_dead()
                await self.observe()
            finally:
                await self.client.close()
        finally:
            await self.controller.stop()
            await self.server.stop()
        return self.recorder.events

    async def step(self, step: Callable[[], Any]) -> None:
        self.in_flight = None
        try:
            await asyncio.wait_for(step(), STEP_TIMEOUT_SECONDS)
        except (MillstreamError, ControllerDied) as error:
            if not self.store.crashed:
                raise AssertionError(f"seed {self.seed}: {step.__name__} failed without a crash") from error
        retry, self.in_flight = self.in_flight, None
        if not self.store.crashed:
            return
        await self.restart_if_dead()
        if retry is not None:
            # The controller died under the request: its outcome is unknown here, so it is sent again,
            # as a caller does after a lost reply (a commit or an abort that landed refuses or changes
            # nothing; a fenced multi-commit that landed answers "already committed").
            await asyncio.wait_for(retry(), STEP_TIMEOUT_SECONDS)


def _scaled(rng: random.Random, ranges: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The key ranges after splitting one of ``ranges`` at a cut inside it, or merging two neighbours."""
    splittable = [r for r in ranges if any(r[0] < c < r[1] for c in CUTS)]
    if splittable and (len(ranges) == 1 or rng.random() < 0.6):
        low, high = rng.choice(splittable)
        cut = rng.choice([c for c in CUTS if low < c < high])
        return tuple(sorted([r for r in ranges if r != (low, high)] + [(low, cut), (cut, high)]))
    index = rng.randrange(len(ranges) - 1)
    merged = (ranges[index][0], ranges[index + 1][1])
    return tuple(sorted([r for n, r in enumerate(ranges) if n not in (index, index + 1)] + [merged]))


def transaction_run(seed: int, shape: RunShape | None = None) -> list[TraceEvent]:
    """One seeded run; returns its trace (``TraceEvent``s, see the module docstring)."""
    return asyncio.run(_Run(seed, shape or RunShape()).run())
