"""A millstream cluster -- hosts, ZooKeeper sessions, a replicated Tier-1 log, a shared Tier 2:
``spec/Cluster.tla`` in Python.

Every spec action is a function of the same name (``Assign`` -> ``assign``, ``SessionExpires`` ->
``session_expires``, ``ClientAppend`` -> ``client_append``, ...) taking a state and the action's
parameters and returning the next state; the state's fields are the spec's variables.  Guards that
are the system's behaviour raise ``NotEnabled``; the spec's bounds on the environment
(``MaxAppends``, ``MaxCrashes``, ``MaxExpiries``, ``MaxReplicaLosses``) are applied by the explorer
in ``proofs/``.

The protocol in one paragraph: the elected assigner (ZooKeeper's election and versioned write, one
atomic step here) gives a container whose host has no live session to a host that has one.  A host
whose session expired may still run -- a zombie -- and acts on its containers until a log write of
its is refused.  A live host starts an assigned container by appending an epoch record to its
Tier-1 log, conditioned on the end of the log it read (expected last sequence *and* last record:
the record's id carries the writer's epoch), once a quorum holds it; then it recovers (metadata from
the committed log, whose first record is a flush record once purged; bytes from Tier 2 up to the
storage length, from append records beyond) and serves.  Every later log write is conditioned on
the record the host wrote last, so an older owner's next write is refused and it stops.  An append
is acknowledged only once a quorum of replicas holds its record; a lost replica server takes the
uncommitted suffix with it.  A flush writes acknowledged units into the host's own chunk (named by
its epoch) and makes them visible with a conditional flush record; truncation purges the log below
a committed flush record that covers everything before it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from millstream.model.container_failover import Layout, LayoutEntry
from millstream.model.durable_log import NotEnabled
from millstream.model.frozen_map import FrozenMap

__all__ = [
    "ClusterState",
    "HostContainer",
    "HostStatus",
    "Record",
    "acknowledge",
    "assign",
    "check_invariants",
    "client_append",
    "commit_flush",
    "crash",
    "expects_last",
    "initial_state",
    "lose_replica",
    "log_write_fenced",
    "quorum_commit",
    "reconnect",
    "recovered",
    "recovered_meta",
    "restart",
    "restore_replica",
    "session_expires",
    "start",
    "truncate",
    "truncation_points",
    "write_chunk",
]


class HostStatus(enum.Enum):
    """A host as ZooKeeper and the host itself see it."""

    LIVE = "live"          # running, its session valid
    EXPIRED = "expired"    # running, its session expired: a zombie until it notices
    DOWN = "down"

    def __repr__(self) -> str:
        return f"HostStatus.{self.name}"


@attrs.frozen(cache_hash=True)
class Record:
    """A Tier-1 log record (``kind``: epoch, append or flush; unused fields are 0 / empty).  A flush
    record is also the metadata checkpoint: ``length``, ``storage`` and ``layout``."""

    kind: str
    epoch: int
    host: str
    id: int = 0
    offset: int = 0
    length: int = 0
    storage: int = 0
    layout: Layout = ()


@attrs.frozen(cache_hash=True)
class HostContainer:
    """What a host holds in memory for one container.  ``seq`` is the sequence of the record it
    wrote or read last (what its next conditional write expects); ``opened`` that of its epoch
    record; ``acked`` how many of ``units`` are acknowledged (the last may be in flight)."""

    serving: bool = False
    epoch: int = 0
    seq: int = 0
    opened: int = 0
    units: tuple[int, ...] = ()
    acked: int = 0
    storage: int = 0
    layout: Layout = ()
    written: int = 0


IDLE = HostContainer()


@attrs.frozen(cache_hash=True)
class ClusterState:
    """The spec's variables, and ``replicas`` (the constant ``Replicas``, which a guard reads)."""

    replicas: int
    hosts: FrozenMap[str, HostStatus]
    assignment: FrozenMap[str, str | None]
    log: FrozenMap[str, tuple[Record, ...]]
    base: FrozenMap[str, int]
    committed: FrozenMap[str, int]
    replicas_down: int
    chunks: FrozenMap[str, FrozenMap[int, tuple[int, ...]]]
    own: FrozenMap[str, FrozenMap[str, HostContainer]]
    history: FrozenMap[str, tuple[int, ...]]
    appends: int
    crashes: int
    expiries: int
    losses: int

    @property
    def containers(self) -> tuple[str, ...]:
        return tuple(self.log)

    @property
    def tier1_available(self) -> bool:
        """A quorum of replica servers is up: the log accepts and commits writes."""
        return self.replicas - self.replicas_down >= self.replicas // 2 + 1

    def last_seq(self, container: str) -> int:
        return self.base[container] + len(self.log[container])

    def last_epoch(self, container: str) -> int:
        records = self.log[container]
        return records[-1].epoch if records else 0

    def committed_log(self, container: str) -> tuple[Record, ...]:
        return self.log[container][:self.committed[container]]

    def uncommitted(self, container: str) -> bool:
        return self.committed[container] < len(self.log[container])

    def serving(self, host: str, container: str) -> bool:
        return self.own[host][container].serving

    def current(self, host: str, container: str) -> bool:
        """Serving, and its next conditional log write succeeds."""
        return self.serving(host, container) and expects_last(self, host, container)

    def in_flight(self, host: str, container: str) -> bool:
        me = self.own[host][container]
        return me.acked < len(me.units)

    def served(self, container: str) -> bool:
        """The liveness property's ``Served(c)``: the host the map names is current."""
        host = self.assignment[container]
        return host is not None and self.current(host, container)


def initial_state(hosts: Iterable[str], containers: Iterable[str], replicas: int) -> ClusterState:
    """The spec's ``Init``: every host live, nothing assigned, empty logs and Tier 2."""
    hosts, containers = sorted(hosts), sorted(containers)
    per_container = FrozenMap((c, 0) for c in containers)
    return ClusterState(
        replicas=replicas, hosts=FrozenMap((h, HostStatus.LIVE) for h in hosts),
        assignment=FrozenMap((c, None) for c in containers), log=FrozenMap((c, ()) for c in containers),
        base=per_container, committed=per_container, replicas_down=0,
        chunks=FrozenMap((c, FrozenMap()) for c in containers),
        own=FrozenMap((h, FrozenMap((c, IDLE) for c in containers)) for h in hosts),
        history=FrozenMap((c, ()) for c in containers), appends=0, crashes=0, expiries=0, losses=0)


# --- Recovery -------------------------------------------------------------------------------------


@attrs.frozen
class Meta:
    length: int = 0
    storage: int = 0
    layout: Layout = ()


def recovered_meta(log: tuple[Record, ...]) -> Meta:
    """The metadata a recovering owner rebuilds from a committed log (the spec's ``RecoveredMeta``)."""
    records = list(log)
    meta = Meta()
    if records and records[0].kind == "flush":
        first = records.pop(0)
        meta = Meta(first.length, first.storage, first.layout)
    for record in records:
        if record.kind == "append":
            meta = attrs.evolve(meta, length=record.offset)
        elif record.kind == "flush":
            meta = attrs.evolve(meta, storage=record.storage, layout=record.layout)
    return meta


def _lts_unit(chunks: FrozenMap[int, tuple[int, ...]], layout: Layout, position: int) -> int:
    for entry in layout:
        if position <= entry.length:
            units = chunks.get(entry.chunk, ())
            return units[position - 1] if position <= len(units) else 0
        position -= entry.length
    return 0


def _log_unit(log: tuple[Record, ...], position: int) -> int:
    for record in log:
        if record.kind == "append" and record.offset == position:
            return record.id
    return 0


def recovered(state: ClusterState, container: str) -> tuple[int, ...]:
    """What a recovering owner reads as the container's segment (the spec's ``Recovered``)."""
    log = state.committed_log(container)
    meta = recovered_meta(log)
    chunks = state.chunks[container]
    return tuple(_lts_unit(chunks, meta.layout, p) if p <= meta.storage else _log_unit(log, p)
                 for p in range(1, meta.length + 1))


# --- Actions --------------------------------------------------------------------------------------


def _require(condition: bool, action: str) -> None:
    if not condition:
        raise NotEnabled(f"{action} is not enabled")


def _set_own(state: ClusterState, host: str, container: str, value: HostContainer) -> FrozenMap[
        str, FrozenMap[str, HostContainer]]:
    return state.own.set(host, state.own[host].set(container, value))


def _idle_host(state: ClusterState, host: str) -> FrozenMap[str, FrozenMap[str, HostContainer]]:
    return state.own.set(host, FrozenMap((c, IDLE) for c in state.containers))


def expects_last(state: ClusterState, host: str, container: str) -> bool:
    """The log ends with the record the host wrote or read last: same sequence, same writer's epoch
    (JetStream's expected last sequence and expected last message id)."""
    me = state.own[host][container]
    return me.seq == state.last_seq(container) and state.last_epoch(container) == me.epoch


def assign(state: ClusterState, container: str, host: str) -> ClusterState:
    """``Assign(c, h)``: the assigner gives a container whose host has no live session to a live host."""
    holder = state.assignment[container]
    _require((holder is None or state.hosts[holder] is not HostStatus.LIVE)
             and state.hosts[host] is HostStatus.LIVE, "Assign")
    return attrs.evolve(state, assignment=state.assignment.set(container, host))


def session_expires(state: ClusterState, host: str) -> ClusterState:
    """``SessionExpires(h)``: ZooKeeper expires the session of a host that still runs."""
    _require(state.hosts[host] is HostStatus.LIVE, "SessionExpires")
    return attrs.evolve(state, hosts=state.hosts.set(host, HostStatus.EXPIRED), expiries=state.expiries + 1)


def reconnect(state: ClusterState, host: str) -> ClusterState:
    """``Reconnect(h)``: the zombie learns its session expired, stops every container, registers anew."""
    _require(state.hosts[host] is HostStatus.EXPIRED, "Reconnect")
    return attrs.evolve(state, hosts=state.hosts.set(host, HostStatus.LIVE), own=_idle_host(state, host))


def crash(state: ClusterState, host: str) -> ClusterState:
    """``Crash(h)``: the host's process dies, its memory with it; its session expires."""
    _require(state.hosts[host] is not HostStatus.DOWN, "Crash")
    return attrs.evolve(state, hosts=state.hosts.set(host, HostStatus.DOWN), own=_idle_host(state, host),
                        crashes=state.crashes + 1)


def restart(state: ClusterState, host: str) -> ClusterState:
    """``Restart(h)``: a crashed host comes back with a new session."""
    _require(state.hosts[host] is HostStatus.DOWN, "Restart")
    return attrs.evolve(state, hosts=state.hosts.set(host, HostStatus.LIVE))


def quorum_commit(state: ClusterState, container: str) -> ClusterState:
    """``QuorumCommit(c)``: a quorum of replicas holds every accepted record."""
    _require(state.tier1_available and state.uncommitted(container), "QuorumCommit")
    return attrs.evolve(state, committed=state.committed.set(container, len(state.log[container])))


def lose_replica(state: ClusterState) -> ClusterState:
    """``LoseReplica``: a replica server is lost, and with it every log's uncommitted suffix."""
    _require(state.replicas_down < state.replicas, "LoseReplica")
    return attrs.evolve(state, replicas_down=state.replicas_down + 1, losses=state.losses + 1,
                        log=FrozenMap((c, state.committed_log(c)) for c in state.containers))


def restore_replica(state: ClusterState) -> ClusterState:
    """``RestoreReplica``: a replica server comes back with its store."""
    _require(state.replicas_down > 0, "RestoreReplica")
    return attrs.evolve(state, replicas_down=state.replicas_down - 1)


def start(state: ClusterState, host: str, container: str) -> ClusterState:
    """``Start(h, c)``: append an epoch record conditioned on the end of the committed log, wait for a
    quorum to hold it (fencing older owners), recover, serve."""
    _require(state.hosts[host] is HostStatus.LIVE and state.assignment[container] == host
             and not state.serving(host, container) and state.tier1_available
             and not state.uncommitted(container), "Start")
    epoch = state.last_epoch(container) + 1
    log = state.committed_log(container)
    meta = recovered_meta(log)
    units = recovered(state, container)
    sequence = state.last_seq(container) + 1
    fresh = HostContainer(True, epoch, sequence, sequence, units, len(units), meta.storage, meta.layout, 0)
    return attrs.evolve(
        state, log=state.log.set(container, (*log, Record("epoch", epoch, host))),
        committed=state.committed.set(container, len(log) + 1), own=_set_own(state, host, container, fresh))


def client_append(state: ClusterState, host: str, container: str) -> ClusterState:
    """``ClientAppend(h, c)``: a conditional append of one record, not yet acknowledged."""
    _require(state.current(host, container) and not state.in_flight(host, container)
             and state.tier1_available, "ClientAppend")
    me = state.own[host][container]
    unit = state.appends + 1
    record = Record("append", me.epoch, host, id=unit, offset=len(me.units) + 1)
    return attrs.evolve(
        state, log=state.log.set(container, (*state.log[container], record)), appends=unit,
        own=_set_own(state, host, container, attrs.evolve(me, units=(*me.units, unit), seq=me.seq + 1)))


def acknowledge(state: ClusterState, host: str, container: str) -> ClusterState:
    """``Acknowledge(h, c)``: the in-flight append is acknowledged once a quorum holds its record."""
    _require(state.serving(host, container) and state.in_flight(host, container), "Acknowledge")
    me = state.own[host][container]
    unit = me.units[-1]
    _require(any(r.kind == "append" and r.id == unit for r in state.committed_log(container)), "Acknowledge")
    return attrs.evolve(
        state, own=_set_own(state, host, container, attrs.evolve(me, acked=len(me.units))),
        history=state.history.set(container, (*state.history[container], unit)))


def log_write_fenced(state: ClusterState, host: str, container: str) -> ClusterState:
    """``LogWriteFenced(h, c)``: a conditional log write of a host whose record is no longer the log's
    last is refused: it stops the container."""
    _require(state.serving(host, container) and not expects_last(state, host, container)
             and state.tier1_available, "LogWriteFenced")
    return attrs.evolve(state, own=_set_own(state, host, container, IDLE))


def target_chunk(state: ClusterState, host: str, container: str) -> int:
    """The chunk a host writes into: the one its own epoch names (never another epoch's)."""
    return state.own[host][container].epoch


def write_chunk(state: ClusterState, host: str, container: str) -> ClusterState:
    """``WriteChunk(h, c)``: write every acknowledged unit beyond Tier 2 into the host's own chunk."""
    me = state.own[host][container]
    _require(me.serving and me.storage + me.written < me.acked, "WriteChunk")
    chunk = target_chunk(state, host, container)
    chunks = state.chunks[container]
    new = me.units[me.storage + me.written:me.acked]
    return attrs.evolve(
        state, chunks=state.chunks.set(container, chunks.set(chunk, chunks.get(chunk, ()) + new)),
        own=_set_own(state, host, container, attrs.evolve(me, written=me.acked - me.storage)))


def _flushed_layout(state: ClusterState, host: str, container: str) -> Layout:
    me = state.own[host][container]
    chunk = target_chunk(state, host, container)
    if me.layout and me.layout[-1].chunk == chunk:
        return (*me.layout[:-1], LayoutEntry(chunk, me.layout[-1].length + me.written))
    return (*me.layout, LayoutEntry(chunk, me.written))


def commit_flush(state: ClusterState, host: str, container: str) -> ClusterState:
    """``CommitFlush(h, c)``: make the written units visible with a conditional flush record."""
    me = state.own[host][container]
    _require(state.current(host, container) and me.written > 0 and state.tier1_available, "CommitFlush")
    layout = _flushed_layout(state, host, container)
    storage = me.storage + me.written
    record = Record("flush", me.epoch, host, length=len(me.units), storage=storage, layout=layout)
    return attrs.evolve(
        state, log=state.log.set(container, (*state.log[container], record)),
        own=_set_own(state, host, container,
                     attrs.evolve(me, layout=layout, storage=storage, written=0, seq=me.seq + 1)))


def truncation_points(state: ClusterState, container: str) -> list[int]:
    """Indexes (1-based, > 1) of committed flush records that cover every unit before them."""
    log = state.log[container]
    return [i for i in range(2, state.committed[container] + 1)
            if log[i - 1].kind == "flush" and log[i - 1].length <= log[i - 1].storage]


def truncate(state: ClusterState, host: str, container: str, index: int) -> ClusterState:
    """``Truncate(h, c)``: purge the log below the flush record at ``index`` (1-based).  A purge is
    not conditional: any host that believes it serves may do it."""
    _require(state.serving(host, container) and state.tier1_available
             and index in truncation_points(state, container), "Truncate")
    return attrs.evolve(
        state, log=state.log.set(container, state.log[container][index - 1:]),
        base=state.base.set(container, state.base[container] + index - 1),
        committed=state.committed.set(container, state.committed[container] - (index - 1)))


# --- Invariants (the spec's, in Python) -----------------------------------------------------------


def check_invariants(state: ClusterState) -> None:
    """Raise AssertionError naming the first spec invariant this state breaks."""
    for container in state.containers:
        log = state.log[container]
        for i, first in enumerate(log):
            for second in log[i:]:
                assert first.epoch <= second.epoch, "OneWriterPerEpoch"
            assert all(first.host == other.host for other in log if other.epoch == first.epoch), (
                "OneWriterPerEpoch")
    for host, containers in state.own.items():
        for container, me in containers.items():
            if me.serving:
                assert all(record.host == host or record.epoch > me.epoch
                           for sequence, record in enumerate(state.log[container], state.base[container] + 1)
                           if sequence > me.opened), "FencedBeforeServing"
    for container in state.containers:
        units = recovered(state, container)
        assert set(state.history[container]) <= set(units), "NoAcknowledgedAppendLost"
        assert all(units) and list(units) == sorted(set(units)), "NoAcknowledgedAppendLost"
    for containers in state.own.values():
        for container, me in containers.items():
            if me.serving:
                assert me.units[:me.acked] == recovered(state, container)[:me.acked] and me.acked <= len(
                    recovered(state, container)), "ReadersSeeOnlyDurable"
    for container in state.containers:
        meta = recovered_meta(state.committed_log(container))
        assert sum(entry.length for entry in meta.layout) == meta.storage, "LayoutCoversStorage"
