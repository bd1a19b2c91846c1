"""The Cluster model beyond what the agreement proof shows: the scenarios the spec exists for (a
zombie fenced by a new owner's epoch record, a lost replica taking an unacknowledged append, the
sequence a lost record leaves for another writer), and each invariant failing on a broken state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from millstream.model import cluster
from millstream.model.container_failover import LayoutEntry
from millstream.model.durable_log import NotEnabled

SPEC = Path(__file__).resolve().parents[2] / "spec"
C = "c1"


def _serving(host: str = "h1") -> cluster.ClusterState:
    """Two live hosts, three replicas; ``host`` assigned ``c1`` and serving it."""
    state = cluster.initial_state(["h1", "h2"], [C], replicas=3)
    return cluster.start(cluster.assign(state, C, host), host, C)


def _appended(state: cluster.ClusterState, host: str = "h1") -> cluster.ClusterState:
    """One append by ``host``, committed by a quorum and acknowledged."""
    return cluster.acknowledge(cluster.quorum_commit(cluster.client_append(state, host, C), C), host, C)


def _taken_over(state: cluster.ClusterState) -> cluster.ClusterState:
    """h1's session expires (it keeps running: a zombie) and h2 takes the container over."""
    return cluster.start(cluster.assign(cluster.session_expires(state, "h1"), C, "h2"), "h2", C)


def _broken(state: cluster.ClusterState, invariant: str) -> None:
    with pytest.raises(AssertionError, match=invariant):
        cluster.check_invariants(state)


def test_every_spec_action_has_a_model_transition_of_the_same_name() -> None:
    actions = json.loads((SPEC / "manifest.json").read_text())["specs"]["Cluster"]["actions"]
    for action in actions:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()
        assert callable(getattr(cluster, name, None)), f"{action} has no model transition {name}"
        assert name in cluster.__all__


def test_an_owner_serves_what_it_recovered_and_what_it_acknowledged() -> None:
    state = _appended(_appended(_serving()))
    assert state.history[C] == (1, 2) and cluster.recovered(state, C) == (1, 2)
    assert state.served(C)
    cluster.check_invariants(state)


def test_a_zombie_is_fenced_by_the_new_owners_epoch_record() -> None:
    state = _taken_over(_appended(_serving()))
    assert state.hosts["h1"] is cluster.HostStatus.EXPIRED and state.serving("h1", C), "still believes it owns"
    assert cluster.recovered(state, C) == (1,) and state.own["h2"][C].units == (1,)
    with pytest.raises(NotEnabled):
        cluster.client_append(state, "h1", C)
    state = cluster.log_write_fenced(state, "h1", C)
    assert not state.serving("h1", C) and state.served(C)
    cluster.check_invariants(state)


def test_a_zombie_may_write_its_chunk_but_never_make_it_visible() -> None:
    state = cluster.write_chunk(_appended(_serving()), "h1", C)
    state = _taken_over(state)
    assert state.chunks[C][1] == (1,), "the zombie wrote into its own chunk"
    with pytest.raises(NotEnabled):
        cluster.commit_flush(state, "h1", C)
    state = cluster.write_chunk(state, "h2", C)
    state = cluster.quorum_commit(cluster.commit_flush(state, "h2", C), C)
    assert cluster.recovered_meta(state.committed_log(C)).layout == (LayoutEntry(2, 1),)
    cluster.check_invariants(state)


def test_a_lost_replica_takes_an_unacknowledged_append_and_its_writer_stops() -> None:
    state = cluster.client_append(_serving(), "h1", C)
    state = cluster.lose_replica(state)
    assert state.log[C] == state.committed_log(C) and cluster.recovered(state, C) == ()
    with pytest.raises(NotEnabled):
        cluster.acknowledge(state, "h1", C)
    assert state.history[C] == (), "never acknowledged, so nothing acknowledged is lost"
    cluster.check_invariants(state)
    assert not cluster.log_write_fenced(state, "h1", C).serving("h1", C)


def test_a_sequence_left_by_a_lost_record_does_not_let_its_writer_through() -> None:
    """The race TLC found: h1's in-flight append is lost with a replica, h2's epoch record takes its
    sequence; h1 expects that sequence, but not that record -- its next write is refused."""
    state = cluster.write_chunk(_appended(_serving()), "h1", C)
    state = cluster.lose_replica(cluster.client_append(state, "h1", C))
    state = _taken_over(state)
    assert state.own["h1"][C].seq == state.last_seq(C), "the sequence alone would let h1 through"
    assert not cluster.expects_last(state, "h1", C)
    with pytest.raises(NotEnabled):
        cluster.commit_flush(state, "h1", C)
    cluster.check_invariants(state)


def test_no_write_or_acknowledgement_without_a_quorum_of_replicas() -> None:
    state = cluster.client_append(_serving(), "h1", C)
    state = cluster.quorum_commit(state, C)
    state = cluster.lose_replica(cluster.lose_replica(state))
    assert not state.tier1_available
    with pytest.raises(NotEnabled):
        cluster.client_append(cluster.acknowledge(state, "h1", C), "h1", C)
    pending = cluster.client_append(cluster.acknowledge(cluster.restore_replica(state), "h1", C), "h1", C)
    assert pending.uncommitted(C)
    with pytest.raises(NotEnabled):
        cluster.quorum_commit(attrs.evolve(pending, replicas_down=2), C)
    assert cluster.acknowledge(cluster.quorum_commit(pending, C), "h1", C).history[C] == (1, 2)


def test_truncation_keeps_what_recovery_needs() -> None:
    state = _appended(_appended(_serving()))
    state = cluster.quorum_commit(cluster.commit_flush(cluster.write_chunk(state, "h1", C), "h1", C), C)
    assert cluster.truncation_points(state, C) == [4]
    state = cluster.truncate(state, "h1", C, 4)
    assert state.base[C] == 3 and state.log[C][0].kind == "flush"
    assert cluster.recovered(state, C) == (1, 2)
    state = _appended(state)
    assert cluster.recovered(state, C) == (1, 2, 3)
    cluster.check_invariants(state)


def test_a_crashed_host_comes_back_and_serves_again() -> None:
    state = cluster.crash(_appended(_serving()), "h1")
    with pytest.raises(NotEnabled):
        cluster.start(state, "h1", C)
    state = cluster.start(cluster.restart(state, "h1"), "h1", C)
    assert state.own["h1"][C].epoch == 2 and state.own["h1"][C].units == (1,) and state.served(C)


# --- Each invariant catches a broken state --------------------------------------------------------


def _with_log(state: cluster.ClusterState, *records: cluster.Record) -> cluster.ClusterState:
    log = (*state.log[C], *records)
    return attrs.evolve(state, log=state.log.set(C, log), committed=state.committed.set(C, len(log)))


def test_one_writer_per_epoch_catches_two_hosts_in_one_epoch_and_an_older_epoch_after_a_newer() -> None:
    state = _serving()
    _broken(_with_log(state, cluster.Record("append", 1, "h2", id=1, offset=1)), "OneWriterPerEpoch")
    newer = _taken_over(state)
    _broken(_with_log(newer, cluster.Record("flush", 1, "h1")), "OneWriterPerEpoch")


def test_fenced_before_serving_catches_an_older_owner_write_after_the_new_owner_started() -> None:
    """What an owner that skipped the epoch record allows: it serves from sequence 1 in h1's epoch,
    and h1 -- which expects the same record -- still appends.  The log alone looks fine."""
    state = _serving()
    unfenced = cluster.HostContainer(serving=True, epoch=1, seq=1, opened=1)
    state = attrs.evolve(state, own=state.own.set("h2", state.own["h2"].set(C, unfenced)))
    cluster.check_invariants(state)
    _broken(cluster.client_append(state, "h1", C), "FencedBeforeServing")


def test_no_acknowledged_append_lost_catches_a_lost_and_a_duplicated_unit() -> None:
    state = _appended(_serving())
    _broken(attrs.evolve(state, log=state.log.set(C, state.log[C][:1]), committed=state.committed.set(C, 1)),
            "NoAcknowledgedAppendLost")
    _broken(_with_log(state, cluster.Record("append", 1, "h1", id=1, offset=2)), "NoAcknowledgedAppendLost")


def test_readers_see_only_durable_catches_a_read_of_an_unacknowledged_unit() -> None:
    state = cluster.client_append(_serving(), "h1", C)
    me = state.own["h1"][C]
    _broken(attrs.evolve(state, own=state.own.set("h1", state.own["h1"].set(C, attrs.evolve(me, acked=1)))),
            "ReadersSeeOnlyDurable")


def test_layout_covers_storage_catches_a_flush_record_whose_layout_is_short() -> None:
    state = cluster.write_chunk(_appended(_serving()), "h1", C)
    bad = cluster.Record("flush", 1, "h1", length=1, storage=1, layout=(LayoutEntry(1, 2),))
    _broken(_with_log(state, bad), "LayoutCoversStorage")


def test_guards_on_replicas_flushes_and_truncation() -> None:
    """A replica lost once can be restored (and none can be restored when none is down); a flush with
    nothing written, and a truncation at an index that is not a truncation point or by a host that does
    not serve, are not enabled; an unassigned container is not served.  Kills the sampled mutants
    ``replicas_down > 1`` in ``restore_replica``, ``written >= 0`` in ``commit_flush``, ``or`` for
    ``and`` in ``truncate``'s guard, and ``host is not None or ...`` in ``served``."""
    state = _appended(_serving())
    assert cluster.restore_replica(cluster.lose_replica(state)).replicas_down == 0
    with pytest.raises(NotEnabled):
        cluster.restore_replica(state)
    with pytest.raises(NotEnabled):
        cluster.commit_flush(state, "h1", C)                 # nothing written to a chunk yet
    state = _appended(state)
    state = cluster.quorum_commit(cluster.commit_flush(cluster.write_chunk(state, "h1", C), "h1", C), C)
    assert cluster.truncation_points(state, C) == [4]
    for index in (1, 2, 3, 5):
        with pytest.raises(NotEnabled):
            cluster.truncate(state, "h1", C, index)
    with pytest.raises(NotEnabled):
        cluster.truncate(state, "h2", C, 4)                  # h2 does not serve c1
    assert not cluster.initial_state(["h1"], [C], replicas=3).served(C)


def test_a_second_flush_into_a_new_owners_chunk_extends_that_chunk() -> None:
    """h1 flushes two units into its chunk; h2 takes over and flushes one unit, then another, into its
    own: the layout's last entry grows to 2 while the first stays 2 long.  Kills the mutant extending
    the last entry by the first entry's length (``me.layout[-0]`` in ``_flushed_layout``)."""
    state = _appended(_appended(_serving()))
    state = cluster.quorum_commit(cluster.commit_flush(cluster.write_chunk(state, "h1", C), "h1", C), C)
    state = _taken_over(state)
    for _ in range(2):
        state = _appended(state, "h2")
        state = cluster.quorum_commit(cluster.commit_flush(cluster.write_chunk(state, "h2", C), "h2", C), C)
    layout = state.own["h2"][C].layout
    assert [entry.length for entry in layout] == [2, 2], layout
    cluster.check_invariants(state)


def test_readers_see_only_durable_catches_a_served_unit_that_differs_from_the_log() -> None:
    """The owner acknowledged as many units as were recovered, but not the same ones.  Kills ``and``
    -> ``or`` between the two halves of ``ReadersSeeOnlyDurable``."""
    state = _appended(_appended(_serving()))
    me = state.own["h1"][C]
    _broken(attrs.evolve(state, own=state.own.set("h1", state.own["h1"].set(C, attrs.evolve(me, units=(2, 1))))),
            "ReadersSeeOnlyDurable")


def test_an_append_is_acknowledged_only_once_its_own_record_is_committed() -> None:
    """With one append committed and acknowledged, a second one in flight is not acknowledged before a
    quorum holds its record.  Kills ``r.kind == "append" and r.id == unit`` -> ``or`` in
    ``acknowledge``'s guard (the first append's committed record acknowledged the second)."""
    state = cluster.client_append(_appended(_serving()), "h1", C)
    with pytest.raises(NotEnabled):
        cluster.acknowledge(state, "h1", C)
    state = cluster.acknowledge(cluster.quorum_commit(state, C), "h1", C)
    assert state.history[C] == (1, 2)


def test_a_chunk_write_needs_acknowledged_units_not_yet_written() -> None:
    """A serving host with nothing acknowledged beyond Tier 2, or whose acknowledged units are all
    written, has no chunk write.  Kills ``me.serving and ... < me.acked`` -> ``or`` in ``write_chunk``'s
    guard (an empty chunk write)."""
    state = _serving()
    with pytest.raises(NotEnabled):
        cluster.write_chunk(state, "h1", C)
    state = cluster.write_chunk(_appended(state), "h1", C)
    with pytest.raises(NotEnabled):
        cluster.write_chunk(state, "h1", C)
