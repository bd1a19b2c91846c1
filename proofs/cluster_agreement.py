"""The Python model of ``Cluster`` set up exactly as a TLC configuration sets up the spec."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millstream.model import cluster
from proofs.tla_values import Function, Record, record

__all__ = ["CONSTANTS", "Configuration", "check", "initial_states", "project", "successors"]

#: The constants TLC prints for this module, in the order ``Configuration.from_tlc`` reads them.
CONSTANTS = "Hosts, Containers, Replicas, MaxAppends, MaxCrashes, MaxExpiries, MaxReplicaLosses"

#: The spec's ``NoHost``.
NO_HOST = "none"


@dataclass(frozen=True)
class Configuration:
    hosts: tuple[str, ...]
    containers: tuple[str, ...]
    replicas: int
    max_appends: int
    max_crashes: int
    max_expiries: int
    max_replica_losses: int

    @classmethod
    def from_tlc(cls, printed: tuple[Any, ...]) -> Configuration:
        hosts, containers, replicas, max_appends, max_crashes, max_expiries, max_replica_losses = printed
        return cls(tuple(sorted(hosts)), tuple(sorted(containers)), replicas, max_appends, max_crashes,
                   max_expiries, max_replica_losses)


def initial_states(config: Configuration) -> list[cluster.ClusterState]:
    return [cluster.initial_state(config.hosts, config.containers, config.replicas)]


def successors(config: Configuration, state: cluster.ClusterState) -> Iterator[tuple[str, cluster.ClusterState]]:
    """Every enabled instance of ``Next``, as many times as TLC generates it."""
    live = cluster.HostStatus.LIVE
    for container in config.containers:
        holder = state.assignment[container]
        if holder is None or state.hosts[holder] is not live:
            for host in config.hosts:
                if state.hosts[host] is live:
                    yield "Assign", cluster.assign(state, container, host)
    for host in config.hosts:
        status = state.hosts[host]
        if status is live and state.expiries < config.max_expiries:
            yield "SessionExpires", cluster.session_expires(state, host)
        if status is cluster.HostStatus.EXPIRED:
            yield "Reconnect", cluster.reconnect(state, host)
        if status is not cluster.HostStatus.DOWN and state.crashes < config.max_crashes:
            yield "Crash", cluster.crash(state, host)
        if status is cluster.HostStatus.DOWN:
            yield "Restart", cluster.restart(state, host)
    for container in config.containers:
        if state.tier1_available and state.uncommitted(container):
            yield "QuorumCommit", cluster.quorum_commit(state, container)
    if state.replicas_down < state.replicas and state.losses < config.max_replica_losses:
        yield "LoseReplica", cluster.lose_replica(state)
    if state.replicas_down > 0:
        yield "RestoreReplica", cluster.restore_replica(state)
    for host in config.hosts:
        for container in config.containers:
            me = state.own[host][container]
            available = state.tier1_available
            if (state.hosts[host] is live and state.assignment[container] == host and not me.serving
                    and available and not state.uncommitted(container)):
                yield "Start", cluster.start(state, host, container)
            if (state.current(host, container) and not state.in_flight(host, container) and available
                    and state.appends < config.max_appends):
                yield "ClientAppend", cluster.client_append(state, host, container)
            if me.serving and state.in_flight(host, container) and any(
                    r.kind == "append" and r.id == me.units[-1] for r in state.committed_log(container)):
                yield "Acknowledge", cluster.acknowledge(state, host, container)
            if me.serving and not cluster.expects_last(state, host, container) and available:
                yield "LogWriteFenced", cluster.log_write_fenced(state, host, container)
            if me.serving and me.storage + me.written < me.acked:
                yield "WriteChunk", cluster.write_chunk(state, host, container)
            if state.current(host, container) and me.written > 0 and available:
                yield "CommitFlush", cluster.commit_flush(state, host, container)
            if me.serving and available:
                for index in cluster.truncation_points(state, container):
                    yield "Truncate", cluster.truncate(state, host, container, index)


def check(state: cluster.ClusterState) -> None:
    cluster.check_invariants(state)


def _layout(layout: tuple[Any, ...]) -> tuple[Record, ...]:
    return tuple(record(chunk=entry.chunk, len=entry.length) for entry in layout)


def _record(r: cluster.Record) -> Record:
    return record(kind=r.kind, epoch=r.epoch, host=r.host, id=r.id, off=r.offset, length=r.length,
                  storage=r.storage, layout=_layout(r.layout))


def _function_over_ints(mapping: dict[int, Any]) -> Any:
    """TLC prints a function whose domain is 1..n as a sequence, any other as ``(k :> v @@ ...)``."""
    if sorted(mapping) == list(range(1, len(mapping) + 1)):
        return tuple(mapping[k] for k in range(1, len(mapping) + 1))
    return Function(frozenset(mapping.items()))


def _host_container(me: cluster.HostContainer) -> Record:
    return record(status="serving" if me.serving else "idle", epoch=me.epoch, seq=me.seq, opened=me.opened,
                  units=me.units, acked=me.acked, storage=me.storage, layout=_layout(me.layout),
                  written=me.written)


def project(config: Configuration, state: cluster.ClusterState) -> dict[str, Any]:
    """The spec state TLC prints for this model state."""
    return {
        "hosts": record(**{h: status.value for h, status in state.hosts.items()}),
        "assignment": record(**{c: NO_HOST if h is None else h for c, h in state.assignment.items()}),
        "log": record(**{c: tuple(_record(r) for r in records) for c, records in state.log.items()}),
        "base": record(**dict(state.base)),
        "committed": record(**dict(state.committed)),
        "replicasDown": state.replicas_down,
        "chunks": record(**{c: _function_over_ints(dict(chunks)) for c, chunks in state.chunks.items()}),
        "own": record(**{h: record(**{c: _host_container(me) for c, me in containers.items()})
                         for h, containers in state.own.items()}),
        "history": record(**dict(state.history)),
        "appends": state.appends,
        "crashes": state.crashes,
        "expiries": state.expiries,
        "losses": state.losses,
    }
