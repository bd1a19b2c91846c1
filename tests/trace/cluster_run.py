"""Seeded runs of real ``ContainerManager``s on simulated hosts, recorded as behaviours of
``spec/Cluster.tla`` (checked by TLC through ``spec/TraceCluster.tla``).

Three hosts each run a real ``ContainerManager`` (with its ``ContainerHost``, ``SegmentContainer`` and
``StorageWriter``) for container 0, all on one shared ``SimulatedLogStorage`` (Tier 1: fenced by epoch;
every write is durable within one loop iteration) and one ``SimulatedChunkStorage`` (Tier 2), on a manual
clock, with flush thresholds so large that the StorageWriter flushes only when the run says so.  The
coordination layer is simulated, not ZooKeeper: the run is the elected assigner (it hands each map to
the managers of live hosts by ``apply``, as ``ClusterMember`` does) and ``SimulatedClaims`` keeps the
per-container claims with the same conditional rules as the claim znodes.  That makes a run a pure
function of its seed (no threads, no timeouts).  A seeded random step is one of

* ``assign``   -- the container's host has no live session: a new map gives it to a live host
  [Assign]; that host's manager claims it and starts it (opening the log fences every older owner)
  [Start];
* ``append``   -- a serving host appends one unit [ClientAppend, QuorumCommit, Acknowledge] -- or, for a
  zombie fenced without knowing it, the failure of that write [LogWriteFenced];
* ``flush``    -- a serving host's StorageWriter flushes: its chunk write [WriteChunk], then its flush
  record [CommitFlush, QuorumCommit] -- or, for a fenced zombie, that record's refusal [LogWriteFenced];
* ``truncate`` -- the current owner's StorageWriter truncates the log if a checkpoint allows [Truncate];
* ``expire``   -- ZooKeeper expires a running host's session: it keeps running, a zombie [SessionExpires];
* ``reconnect``-- the zombie learns it (``session_lost``): it stops every container [Reconnect] and
  registers anew with a fresh manager;
* ``crash``    -- a host's process dies [Crash]; ``restart`` -- it comes back [Restart].

Steps come from the implementation's own reports (``StorageWriter.tracer``: committed operations in
log order, chunk writes, truncations; the container's start); the run adds the environment's steps
(assign, expire, reconnect, crash, restart) and a zombie's refused write, which it causes.  After every
step an ``Observe`` records what the implementation shows: which hosts serve the container, and what a
reader gets from each of them (every unit, by id), and the current owner with its storage length.

The refinement mapping (written down in ``spec/TraceCluster.tla`` too):

* the simulated log's epoch is the spec's epoch (each start bumps both by one; the spec's epoch record
  is the log's fencing ``initialize()``); the log is one replica set that commits every accepted write
  at once, so each accepted write is followed by ``QuorumCommit`` (replica loss is not exercised here:
  the simulated log has no replicas -- the JetStream conformance suite covers that contract);
* checkpoint records are stuttering steps (the spec's flush record is its checkpoint); the log's
  truncation at a checkpoint is the spec's truncation at the last flush record before it (the spec's
  log is coarser); one at or before the spec log's head is a stuttering step;
* a reconciliation that records an earlier (fenced) owner's whole unrecorded chunk write is the new
  owner's ``WriteChunk`` of those units then ``CommitFlush`` (the adopted bytes are counted as the
  adopter's chunk; nothing reads the fenced one otherwise).  Adopting only a prefix of the unflushed
  tail has no counterpart in Cluster.tla (ContainerFailover.tla's ``Adopt`` models it), so such a run
  is cut there (``cut``) and counted.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any
from unittest import mock

from millstream.cluster._containers import ContainerManager
from millstream.cluster._zookeeper import Assignment
from millstream.errors import MillstreamError
from millstream.segmentstore import host as host_module
from millstream.segmentstore.container import SegmentContainer, StorageSettings
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.operations import (
    MetadataCheckpointOperation,
    Operation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
)
from millstream.testing.clock import ManualClock
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceEvent
from tests.trace.container_failover_run import UNIT_BYTES, chunk_epoch, read_all, unit, unit_ids

__all__ = ["CONTAINER", "HOSTS", "ClusterRun", "SimulatedClaims", "record_runs"]

CONTAINER_ID = 0
#: The spec's name of container 0.
CONTAINER = "c1"
HOSTS = ("h1", "h2", "h3")
SEGMENT = "s"
CHECKPOINT_FRAME_COUNT = 4
NEVER = 1 << 40
SETTINGS = StorageSettings(flush_bytes_min=NEVER, flush_bytes_max=NEVER, flush_age_seconds=1e9,
                           unflushed_bytes_max=NEVER)
#: Event-loop turns given to background work after each step (all in memory: it settles in a few).
SETTLE_TURNS = 60
#: A generous bound on a manager acting on what it was told (all in memory: it takes a few loop turns).
SETTLE_SECONDS_MAX = 30.0


class SimulatedClaims:
    """The claim znodes' rules in memory (``ContainerClaims``): a claim under an older map than the
    recorded one, or another host's under the same map, is refused."""

    def __init__(self) -> None:
        self.claims: dict[int, tuple[str, int]] = {}

    async def claim_container(self, container_id: int, host_id: str, map_version: int) -> bool:
        recorded = self.claims.get(container_id)
        if recorded is not None and (recorded[1] > map_version
                                     or (recorded[1] == map_version and recorded[0] != host_id)):
            return False
        self.claims[container_id] = (host_id, map_version)
        return True

    async def container_claim(self, container_id: int) -> tuple[str, int] | None:
        return self.claims.get(container_id)


class ClusterRun:
    """One seeded run (see the module docstring); ``trace`` is its record."""

    def __init__(self, seed: int, steps: int) -> None:
        self.rng = random.Random(seed)
        self.steps = steps
        self.clock = ManualClock()
        self.log = SimulatedLogStorage()
        self.lts = SimulatedChunkStorage(clock=self.clock, rng=random.Random(seed))
        self.claims = SimulatedClaims()
        #: host -> "live", "expired" (a zombie) or "down", as the spec's ``hosts``.
        self.status: dict[str, str] = dict.fromkeys(HOSTS, "live")
        self.managers: dict[str, ContainerManager | None] = dict.fromkeys(HOSTS)
        self.retired: list[ContainerManager] = []
        self.assigned: str | None = None
        self.map_version = -1
        #: The log instance each host opened last, so a container built on it knows its host.
        self._host_of_log: dict[int, str] = {}
        #: host -> the epoch its running container opened the log at.
        self.epochs: dict[str, int] = {}
        self.trace: list[TraceEvent] = []
        self.next_id = 1
        #: The spec's log: for each of its records, ("epoch" | "append" | "flush", impl sequence).
        self.records: list[tuple[str, int]] = []
        self.created = False
        #: The last chunk write reported (host, units), until its flush record commits or is refused.
        self.pending_chunk: tuple[str, list[int]] | None = None
        #: Whether (and why) the run was cut short.
        self.cut: str | None = None
        self.cut_at = 0
        self.adoptions = 0
        self.truncations_stuttered = 0

    def emit(self, action: str, **fields: Any) -> None:
        self.trace.append(TraceEvent(action, fields))

    # --- the implementation's reports ----------------------------------------------------------------

    def container_built(self, container: SegmentContainer, data_log: DurableDataLog) -> None:
        host = self._host_of_log[id(data_log)]
        writer = container.storage_writer
        assert writer is not None
        writer.tracer = self.tracer_for(host)

    def started(self, container: SegmentContainer, data_log: DurableDataLog) -> None:
        host = self._host_of_log[id(data_log)]
        self.epochs[host] = data_log.epoch
        self.records.append(("epoch", self.log.last_sequence))
        self.emit("Start", h=host, epoch=data_log.epoch)

    def tracer_for(self, host: str) -> Callable[..., None]:
        def tracer(action: str, /, **fields: Any) -> None:
            if action == "Committed":
                self.committed(host, fields["operation"])
            elif action == "WriteChunk":
                self.pending_chunk = (host, unit_ids(bytes(fields["data"])))
            elif action == "Truncate":
                self.truncated(host, fields["checkpoint"].sequence_number)
            else:
                raise AssertionError(f"unknown report {action}")
        return tracer

    def committed(self, host: str, operation: Operation) -> None:
        if type(operation) is StreamSegmentAppendOperation:
            ids = unit_ids(bytes(operation.data))
            assert len(ids) == 1, ids
            self.records.append(("append", operation.sequence_number))
            self.emit("ClientAppend", h=host, id=ids[0], off=operation.offset // UNIT_BYTES + 1)
            self.emit("QuorumCommit")
        elif isinstance(operation, StorageFlushOperation):
            storage = (operation.offset + operation.length) // UNIT_BYTES
            if chunk_epoch(operation.chunk) != self.epochs[host]:  # an earlier owner's unrecorded write
                manager = self.managers[host]
                assert manager is not None
                length = manager.container(CONTAINER_ID).get_info(SEGMENT).length
                if operation.offset + operation.length != length:
                    self.cut_short("adopted a prefix of the unflushed tail")
                    return
                self.adoptions += 1
                data = self.lts.chunks()[operation.chunk]
                self.emit("WriteChunk", h=host, units=unit_ids(data)[-(operation.length // UNIT_BYTES):])
            else:
                chunk = self.pending_chunk
                assert chunk is not None and chunk[0] == host, "a flush record without its chunk write"
                self.pending_chunk = None
                self.emit("WriteChunk", h=host, units=chunk[1])
            self.records.append(("flush", operation.sequence_number))
            self.emit("CommitFlush", h=host, storage=storage)
            self.emit("QuorumCommit")
        elif isinstance(operation, MetadataCheckpointOperation):
            pass  # (the spec's flush record is its checkpoint)

    def cut_short(self, why: str) -> None:
        """End the recorded trace here (see the module docstring); the run stops after this step."""
        if self.cut is None:
            self.cut = why
            self.cut_at = len(self.trace)

    def truncated(self, host: str, checkpoint_sequence: int) -> None:
        flushes = [index for index, (kind, sequence) in enumerate(self.records)
                   if kind == "flush" and sequence < checkpoint_sequence]
        if not flushes or flushes[-1] == 0:
            self.truncations_stuttered += 1
            return
        self.records = self.records[flushes[-1]:]
        self.emit("Truncate", h=host, remaining=len(self.records))

    # --- the simulated hosts ----------------------------------------------------------------------

    def open_log_for(self, host: str) -> Callable[[int], DurableDataLog]:
        def open_log(container_id: int) -> DurableDataLog:
            data_log = SimulatedDurableDataLog(self.log)
            self._host_of_log[id(data_log)] = host
            return data_log
        return open_log

    async def boot(self, host: str) -> None:
        manager = ContainerManager(host, self.open_log_for(host), chunk_storage=self.lts, claims=self.claims,
                                   host_options={"clock": self.clock, "storage_settings": SETTINGS,
                                                 "checkpoint_frame_count": CHECKPOINT_FRAME_COUNT})
        await manager.start()
        self.managers[host] = manager
        if self.map_version >= 0:
            manager.apply(self.assignment())

    def assignment(self) -> Assignment:
        assert self.assigned is not None
        return Assignment({CONTAINER_ID: self.assigned}, self.map_version, 1)

    def serving(self) -> list[str]:
        """Hosts whose container runs (a fenced zombie that does not know it yet included)."""
        found = []
        for host, manager in self.managers.items():
            container_host = None if manager is None else manager.hosts.get(CONTAINER_ID)
            if container_host is not None and container_host.status[0] == "running":
                found.append(host)
        return found

    def current(self) -> str | None:
        for host in self.serving():
            if self.epochs.get(host) == self.log.epoch:
                return host
        return None

    def container(self, host: str) -> SegmentContainer:
        manager = self.managers[host]
        assert manager is not None
        return manager.container(CONTAINER_ID)

    async def settle(self) -> None:
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)
        for manager in self.managers.values():
            if manager is not None:  # (bounded: a manager that never settles fails the run, not hangs it)
                await asyncio.wait_for(manager.settled(), SETTLE_SECONDS_MAX)
        current = self.current()
        if not self.created and current is not None:  # (the first owner creates the segment)
            await self.container(current).create_segment(SEGMENT)
            self.created = True

    async def assign(self, host: str, *, deliver: bool = True) -> None:
        """The assigner writes a map giving the container to ``host``; unless ``deliver`` is False
        (slow fencing: the new owner has not read it yet, so the old owner, a zombie, goes on
        writing), the live hosts read it at once."""
        self.assigned = host
        self.map_version += 1
        self.emit("Assign", h=host)
        if deliver:
            await self.deliver()

    async def deliver(self) -> None:
        """The live hosts read the newest map (and act on it)."""
        for other, manager in self.managers.items():
            if manager is not None and self.status[other] == "live":
                manager.apply(self.assignment())
        await self.settle()

    async def append(self, host: str) -> None:
        container = self.container(host)
        try:
            await container.append(SEGMENT, unit(self.next_id))
        except MillstreamError:
            assert self.epochs[host] < self.log.epoch, "the current owner's append failed"
            self.emit("LogWriteFenced", h=host)
            return
        assert self.epochs[host] == self.log.epoch, "a fenced owner's append succeeded"
        self.next_id += 1
        self.emit("Acknowledge", h=host)

    async def flush(self, host: str) -> None:
        writer = self.container(host).storage_writer
        assert writer is not None
        segment_id = self.container(host)._metadata.ids_by_name[SEGMENT]
        try:
            await writer._flush(segment_id)
        except MillstreamError:
            assert self.epochs[host] < self.log.epoch, "the current owner's flush failed"
            chunk = self.pending_chunk
            if chunk is not None:
                self.pending_chunk = None
                self.emit("WriteChunk", h=host, units=chunk[1])
            self.emit("LogWriteFenced", h=host)

    def unflushed(self, host: str) -> bool:
        info = self.container(host).get_info(SEGMENT)
        return info.storage_length < info.length

    async def retire(self, host: str) -> None:
        manager = self.managers[host]
        assert manager is not None
        self.managers[host] = None
        self.retired.append(manager)
        await manager.stop()
        self.epochs.pop(host, None)

    async def truncate(self, host: str) -> None:
        writer = self.container(host).storage_writer
        assert writer is not None
        await writer._truncate_log_if_possible()

    async def expire(self, host: str) -> None:
        self.status[host] = "expired"
        self.emit("SessionExpires", h=host)

    async def reconnect(self, host: str) -> None:
        manager = self.managers[host]
        assert manager is not None
        manager.session_lost(MillstreamError("the session expired"))
        await self.settle()
        self.status[host] = "live"
        self.emit("Reconnect", h=host)
        await self.observe()  # (what the old manager does once told: it must serve nothing)
        await self.retire(host)
        await self.boot(host)

    async def crash(self, host: str) -> None:
        manager = self.managers[host]
        assert manager is not None
        for container_host in manager.hosts.values():
            if container_host.status[0] == "running":
                container_host.container.kill()  # (the process dies: nothing more is written)
        self.status[host] = "down"
        self.emit("Crash", h=host)
        await self.retire(host)

    async def restart(self, host: str) -> None:
        self.status[host] = "live"
        self.emit("Restart", h=host)
        await self.boot(host)

    async def step(self) -> None:
        live = [host for host in HOSTS if self.status[host] == "live"]
        serving = self.serving() if self.created else []
        current = self.current()
        choices: list[tuple[int, str, str]] = []
        if (self.assigned is None or self.status[self.assigned] != "live") and live:
            choices.append((20, "assign", self.rng.choice(live)))
        for host in serving:
            choices.append((12 if host == current else 3, "append", host))
            if self.unflushed(host):
                choices.append((4 if host == current else 2, "flush", host))
        if current is not None:
            choices.append((2, "truncate", current))
        for host in HOSTS:
            if self.status[host] == "live":
                choices.append((1, "expire", host))
            if self.status[host] == "expired":
                choices.append((2, "reconnect", host))
            if self.status[host] != "down":
                choices.append((1, "crash", host))
            else:
                choices.append((3, "restart", host))
        _, action, host = self.rng.choices(choices, weights=[weight for weight, _, _ in choices])[0]
        await getattr(self, action)(host)
        await self.settle()
        await self.observe()

    async def observe(self) -> None:
        reads = set()
        serving = self.serving() if self.created else []
        for host in serving:
            reads.add((host, tuple(unit_ids(await read_all(self.container(host))))))
        current = self.current() if self.created else None
        storage = 0
        if current is not None:
            storage = self.container(current).get_info(SEGMENT).storage_length // UNIT_BYTES
        self.emit("Observe", serving=set(serving), reads=reads, current=current or "none", storage=storage)

    def hook(self) -> mock._patch[Any]:
        """The run's hook (see ``container_built``): the hosts build their containers through it."""
        recorder = self

        class Recorded(SegmentContainer):
            def __init__(self, container_id: int, data_log: DurableDataLog, **options: Any) -> None:
                super().__init__(container_id, data_log, **options)
                self._recorded_log = data_log
                recorder.container_built(self, data_log)

            async def start(self) -> None:
                await super().start()
                recorder.started(self, self._recorded_log)

        return mock.patch.object(host_module, "SegmentContainer", Recorded)

    async def boot_all(self) -> None:
        for host in HOSTS:
            await self.boot(host)

    async def stop_all(self) -> None:
        for manager in [*self.managers.values(), *self.retired]:
            if manager is not None:
                await manager.stop()

    async def run(self) -> None:
        with self.hook():
            try:
                await self.boot_all()
                for _ in range(self.steps):
                    await self.step()
                    if self.cut is not None:
                        del self.trace[self.cut_at:]
                        break
            finally:
                await self.stop_all()


def record_runs(seeds: range, steps: int) -> list[ClusterRun]:
    """Runs ``seeds``, ``steps`` random steps each, done (``trace`` holds each one's record)."""
    runs = []
    for seed in seeds:
        run = ClusterRun(seed, steps)
        asyncio.run(run.run())
        runs.append(run)
    return runs
