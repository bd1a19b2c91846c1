"""Every model action refuses where the spec does not enable it: its guard is checked on its own.

The model-vs-TLC agreement (``proofs/test_spec_model_agreement.py`` and its cached twin) compares the
model's state graph with TLC's, but the agreement modules of ExactlyOnceSink, Cluster,
ContainerFailover, DurableLog and LargeEvents call an action only where their ``successors`` has
already checked its guard -- so a weakened guard (``and`` -> ``or``, ``<`` -> ``<=``, a dropped
conjunct) in the model is never observed there.  These tests call every action instance in every
reachable state of a small configuration, guard or no guard, and require that whatever the action
does not refuse (``NotEnabled``) is a step ``Next`` offers in that state, with the same label and
successor.  ``Next`` is taken with the exploration's own bounds lifted (faults, crashes, appends,
...), since those bounds are the explorer's, not the actions' guards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Iterator
from functools import partial
from typing import Any

import pytest

from millstream.model import cluster
from millstream.model import container_failover as cf
from millstream.model import durable_log as dl
from millstream.model import exactly_once_sink as eos
from millstream.model import large_events as le
from millstream.model.durable_log import NotEnabled
from proofs import (
    cluster_agreement,
    container_failover_agreement,
    durable_log_agreement,
    exactly_once_sink_agreement,
    large_events_agreement,
)
from proofs.explore import explore
from proofs.tla_values import record

#: A bound no exploration here reaches: ``Next``'s view of what is enabled, without the explorer's limits.
_UNBOUNDED = 1_000

Instance = tuple[str, Callable[[], Any]]


def _assert_refused_where_not_enabled(states: Iterable[Hashable], instances: Callable[[Any], Iterator[Instance]],
                                      enabled: Callable[[Any], Iterable[tuple[str, Any]]]) -> int:
    """Call every action instance in every state; each must raise ``NotEnabled`` or take a step ``enabled``
    offers.  Returns how many instances were refused (so a caller can see the check was exercised)."""
    refused = 0
    for state in states:
        offered = set(enabled(state))
        for label, call in instances(state):
            try:
                after = call()
            except NotEnabled:
                refused += 1
                continue
            assert (label, after) in offered, f"{label} is taken where Next does not enable it, in {state!r}"
    return refused


# --- ExactlyOnceSink ------------------------------------------------------------------------------


def _sink_instances(state: eos.ExactlyOnceSinkState) -> Iterator[Instance]:
    yield "DriverStart", partial(eos.driver_start, state)
    for end in range(0, state.num_events + 2):
        yield "PlanBatch", partial(eos.plan_batch, state, end)
    for partition in state.partition_ids:
        for label, action in (("TaskBegin", eos.task_begin), ("TaskWrite", eos.task_write),
                              ("TaskReport", eos.task_report), ("TaskCrash", eos.task_crash),
                              ("TaskRetry", eos.task_retry)):
            yield label, partial(action, state, partition)
    yield "AbortBatch", partial(eos.abort_batch, state)
    yield "CommitBatch", partial(eos.commit_batch, state)
    yield "WriteCommitLog", partial(eos.write_commit_log, state)
    yield "DriverCrash", partial(eos.driver_crash, state)
    for txn in range(0, len(state.transactions) + 2):
        yield "ExpireTransaction", partial(eos.expire_transaction, state, txn)


def _sink_check(config: exactly_once_sink_agreement.Configuration) -> int:
    graph = explore(exactly_once_sink_agreement.initial_states(config),
                    lambda s: exactly_once_sink_agreement.successors(config, s), keep_edges=True)
    unbounded = dataclasses.replace(config, max_faults=_UNBOUNDED)
    return _assert_refused_where_not_enabled(
        graph.states, _sink_instances, lambda s: exactly_once_sink_agreement.successors(unbounded, s))


def test_every_sink_action_refuses_where_its_guard_fails() -> None:
    """Every driver, task and lease action of the sink: a batch planned while one runs or beyond the
    events, a task stepped out of its phase or while the driver is not running, a commit with a task not
    done, an abort without a failed job, a commit log written before the store commit, an expiry of a
    closed or unknown transaction -- each is refused in every reachable state of both small CI
    configurations, and nothing the guards let through is a step the spec does not offer."""
    refused = sum(_sink_check(exactly_once_sink_agreement.Configuration(*constants))
                  for constants in ((2, 2, 1), (2, 1, 2)))
    assert refused > 0


# --- Cluster --------------------------------------------------------------------------------------


def _cluster_instances(state: cluster.ClusterState) -> Iterator[Instance]:
    hosts = sorted(state.hosts)
    containers = sorted(state.containers)
    for container in containers:
        for host in hosts:
            yield "Assign", partial(cluster.assign, state, container, host)
    for host in hosts:
        for label, action in (("SessionExpires", cluster.session_expires), ("Reconnect", cluster.reconnect),
                              ("Crash", cluster.crash), ("Restart", cluster.restart)):
            yield label, partial(action, state, host)
    for container in containers:
        yield "QuorumCommit", partial(cluster.quorum_commit, state, container)
    yield "LoseReplica", partial(cluster.lose_replica, state)
    yield "RestoreReplica", partial(cluster.restore_replica, state)
    for host in hosts:
        for container in containers:
            for label, owner_action in (("Start", cluster.start), ("ClientAppend", cluster.client_append),
                                  ("Acknowledge", cluster.acknowledge), ("LogWriteFenced", cluster.log_write_fenced),
                                  ("WriteChunk", cluster.write_chunk), ("CommitFlush", cluster.commit_flush)):
                yield label, partial(owner_action, state, host, container)
            for index in range(0, len(state.log[container]) + 2):
                yield "Truncate", partial(cluster.truncate, state, host, container, index)


def test_every_cluster_action_refuses_where_its_guard_fails() -> None:
    """Every assigner, session, replica and owner action of the cluster: an assignment away from a live
    holder or to a host without a live session, a start by a host not assigned or already serving or
    while a record is uncommitted, an append or a flush by a host not current, an acknowledgement before
    its record is committed, a fenced write while the host's record is still last, a chunk write with
    nothing acknowledged beyond Tier 2, a truncation at a point that is not a covering flush -- each is
    refused in every reachable state of a small configuration (two hosts, one container, one append,
    crash, expiry and replica loss), and nothing the guards let through is a step the spec does not offer."""
    config = cluster_agreement.Configuration(("h1", "h2"), ("c1",), 3, 1, 1, 1, 1)
    graph = explore(cluster_agreement.initial_states(config), lambda s: cluster_agreement.successors(config, s),
                    keep_edges=True)
    unbounded = dataclasses.replace(config, max_appends=_UNBOUNDED, max_crashes=_UNBOUNDED,
                                    max_expiries=_UNBOUNDED, max_replica_losses=_UNBOUNDED)
    refused = _assert_refused_where_not_enabled(graph.states, _cluster_instances,
                                                lambda s: cluster_agreement.successors(unbounded, s))
    assert refused > 0


# --- ContainerFailover ----------------------------------------------------------------------------


def _failover_instances(state: cf.ContainerFailoverState) -> Iterator[Instance]:
    for owner in sorted(state.own):
        for label, action in (("Start", cf.start), ("ClientAppend", cf.client_append),
                              ("LogWriteFenced", cf.log_write_fenced), ("WriteChunk", cf.write_chunk),
                              ("CommitFlush", cf.commit_flush), ("Checkpoint", cf.checkpoint), ("Crash", cf.crash)):
            yield label, partial(action, state, owner)
        for chunk in range(0, state.log_epoch + 2):
            for count in range(0, len(state.history) + 2):
                yield "Adopt", partial(cf.adopt, state, owner, chunk, count)
        for index in range(0, len(state.log) + 2):
            yield "Truncate", partial(cf.truncate, state, owner, index)


def test_every_failover_action_refuses_where_its_guard_fails() -> None:
    """Every owner action of ContainerFailover: a start by an owner not down, an append, flush or
    checkpoint by an owner not current, a fenced write by an owner of the log's epoch, a chunk write with
    every unit already in Tier 2, an adoption of a chunk prefix not verified, a truncation at a point that
    keeps unflushed units -- each is refused in every reachable state of the small CI configuration, and
    nothing the guards let through is a step the spec does not offer."""
    config = container_failover_agreement.Configuration(("o1", "o2"), 2, 2, 1, 1)
    graph = explore(container_failover_agreement.initial_states(config),
                    lambda s: container_failover_agreement.successors(config, s), keep_edges=True)
    unbounded = dataclasses.replace(config, max_appends=_UNBOUNDED, max_epoch=_UNBOUNDED,
                                    max_crashes=_UNBOUNDED, max_checkpoints=_UNBOUNDED)
    refused = _assert_refused_where_not_enabled(graph.states, _failover_instances,
                                                lambda s: container_failover_agreement.successors(unbounded, s))
    assert refused > 0


# --- LargeEvents ----------------------------------------------------------------------------------


def _large_events_instances(state: le.LargeEventsState, connections: int) -> Iterator[Instance]:
    yield "WriteOrdinary", partial(le.write_ordinary, state)
    yield "DeliverOrdinary", partial(le.deliver_ordinary, state)
    for w in state.writer_ids:
        for label, action in (("CreateTransient", le.create_transient), ("SendChunk", le.send_chunk),
                              ("Reconnect", le.reconnect), ("Commit", le.commit), ("Merge", le.merge),
                              ("Abort", le.abort), ("Abandon", le.abandon),
                              ("DeleteOnDisconnect", le.delete_on_disconnect), ("Expire", le.expire)):
            yield label, partial(action, state, w)
        for conn in range(0, connections + 1):
            yield "AppendChunk", partial(le.append_chunk, state, w, conn)
        for kept in range(-1, state.current_requests(w) + 2):
            yield "Disconnect", partial(le.disconnect, state, w, kept)


def test_every_large_events_action_refuses_where_its_guard_fails() -> None:
    """Every writer and store action of LargeEvents: a transient segment created for an inline event, a
    second time, or while disconnected; a chunk sent with nothing left to send or on a dead connection; a
    chunk appended from a connection with no request; a disconnect keeping more requests than are on
    their way; a commit while blocked or before the transient segment exists; a merge before every part
    is acknowledged and flushed; an abort of a writer no longer open; an expiry of a segment not active --
    each is refused in every reachable state of both small CI configurations, and nothing the guards let
    through is a step the spec does not offer."""
    refused = 0
    for config in (large_events_agreement.Configuration((2,), 1, 1, 1),
                   large_events_agreement.Configuration((1, 2), 1, 1, 0)):
        graph = explore(large_events_agreement.initial_states(config),
                        partial(large_events_agreement.successors, config), keep_edges=True)
        # the explorer's bounds, lifted by one: no explored state has more writes or disconnects than that
        unbounded = dataclasses.replace(config, num_ordinary=config.num_ordinary + 1,
                                        max_disconnects=config.max_disconnects + 1)
        refused += _assert_refused_where_not_enabled(
            graph.states, partial(_large_events_instances, connections=config.max_disconnects + 1),
            partial(large_events_agreement.successors, unbounded))
    assert refused > 0


# --- DurableLog -----------------------------------------------------------------------------------


def _durable_log_instances(state: dl.ContainerState,
                           config: durable_log_agreement.Configuration) -> Iterator[Instance]:
    for spec_request in config.requests:
        request = durable_log_agreement._request(spec_request, state.submitted + 1)
        yield "Submit", partial(dl.submit, state, request)
    for label, action in (("Process", dl.process), ("SealFrame", dl.seal_frame), ("Persist", dl.persist),
                          ("FailWrite", dl.fail_write), ("Crash", dl.crash), ("Recover", dl.recover)):
        yield label, partial(action, state)
    for frame_number in range(0, len(config.frame_numbers) + 2):
        yield "Complete", partial(dl.complete, state, frame_number)


def test_every_durable_log_action_refuses_where_its_guard_fails() -> None:
    """Every container action of DurableLog: a request submitted to, or processed, sealed, persisted or
    completed by, a container that is not running; a process with an empty queue, a seal of an empty
    frame, a persist with nothing pending, a completion notice for a frame not written; a failed write
    with nothing unacknowledged; a recovery of a running container -- each is refused in every reachable
    state of the append-and-seal CI configuration, and nothing the guards let through is a step the spec
    does not offer."""
    requests = sorted((record(kind="append", seg="a", src=durable_log_agreement.NO_SEGMENT, len=1, off=-1, size=1),
                       record(kind="append", seg="a", src=durable_log_agreement.NO_SEGMENT, len=1, off=0, size=1),
                       record(kind="seal", seg="a", src=durable_log_agreement.NO_SEGMENT, len=0, off=-1, size=1)),
                      key=repr)
    config = durable_log_agreement.Configuration(frozenset({"a"}), frozenset({"a"}), tuple(requests), 3, 2, 0, 1)
    graph = explore(durable_log_agreement.initial_states(config),
                    lambda s: durable_log_agreement.successors(config, s), keep_edges=True)
    unbounded = dataclasses.replace(config, max_ops=config.max_ops + 1, max_failures=_UNBOUNDED)
    refused = _assert_refused_where_not_enabled(graph.states, lambda s: _durable_log_instances(s, config),
                                                lambda s: durable_log_agreement.successors(unbounded, s))
    assert refused > 0


def test_a_replica_is_lost_only_while_one_is_up() -> None:
    """``LoseReplica`` needs a replica up: with every replica down it is refused.  No small configuration
    loses every replica (Cluster_small loses one of three), so the exploring test above cannot see
    ``replicas_down < replicas`` weakened to ``<=``."""
    state = cluster.lose_replica(cluster.initial_state(("h1",), ("c1",), 1))
    assert state.replicas_down == state.replicas == 1
    with pytest.raises(NotEnabled):
        cluster.lose_replica(state)
    assert cluster.lose_replica(cluster.restore_replica(state)).replicas_down == 1
