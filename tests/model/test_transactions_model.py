"""The Transactions model beyond what the agreement proof shows: the lifecycle table against the
spec, the stories the spec exists for (a transaction rolled across a scale, a Spark driver that
replays a batch, a controller that dies in the middle of a commit, a lease that lapses), guards that
refuse bad requests, and invariants that do fail on bad states."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from millstream.model import transactions as tx
from millstream.model.durable_log import NotEnabled

SPEC = Path(__file__).resolve().parents[2] / "spec"
OPEN, COMMITTING, COMMITTED = tx.TxnStatus.OPEN, tx.TxnStatus.COMMITTING, tx.TxnStatus.COMMITTED
ABORTING, ABORTED = tx.TxnStatus.ABORTING, tx.TxnStatus.ABORTED

ONE_SEGMENT = (frozenset({"k1", "k2"}),)
SPLIT = (frozenset({"k1"}), frozenset({"k2"}))


def _state(*layouts: tuple[frozenset[str], ...], txns: int = 2, lease: int = 2,
           fence_keys: tuple[str, ...] = ()) -> tx.TransactionsState:
    return tx.initial_state(tx.StreamSetup(layouts, lease), txns, fence_keys)


def _sources(events: tuple[tx.Event, ...]) -> list[tuple[int, int]]:
    return [(event.source, event.number) for event in events]


def test_every_spec_action_has_a_model_transition_of_the_same_name() -> None:
    spec = json.loads((SPEC / "manifest.json").read_text())["specs"]["Transactions"]
    assert tuple(spec["actions"]) == tx.ACTIONS
    text = (SPEC / "Transactions.tla").read_text()
    for action in tx.ACTIONS:
        assert re.search(rf"^{action}(\(.*\))? ==", text, re.MULTILINE), f"the spec defines no {action}"
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()
        assert callable(getattr(tx, name, None)) and name in tx.__all__, f"{action} has no model transition {name}"


def test_the_lifecycle_table_is_the_specs() -> None:
    """The model's table allows exactly the status changes of the spec's ``Lifecycle``, each
    triggered by a spec action (the fenced decision qualified by its outcome)."""
    text = (SPEC / "Transactions.tla").read_text()
    definition = re.search(r"^Lifecycle == \{(.*?)\}\n", text, re.MULTILINE | re.DOTALL)
    assert definition
    spec_pairs = set(re.findall(r'<<"(\w+)", "(\w+)">>', definition.group(1)))
    model_pairs = {(source.value, target.value)
                   for source, events in tx.LIFECYCLE.items() for target in events.values()}
    assert model_pairs == spec_pairs
    for events in tx.LIFECYCLE.values():
        for event in events:
            action, _, outcome = event.partition("/")
            assert action in tx.ACTIONS
            assert outcome in ("", *(o.value for o in tx.FenceOutcome))
    assert set(tx.LIFECYCLE) == set(tx.TxnStatus)


def test_a_transaction_rolled_across_a_scale_lands_between_the_writes_before_and_after() -> None:
    """Opened on one segment; the stream splits; the commit rolls the transaction into a duplicate
    of its epoch, placed after the epoch the plain writer wrote to before the commit finished and
    before the epoch it writes to afterwards."""
    state = tx.begin(_state(ONE_SEGMENT, SPLIT), 1)
    state = tx.write_event(tx.write_event(state, 1, "k1"), 1, "k2")
    state = tx.write_plain_event(state, "k1")
    state = tx.scale(state)
    state = tx.write_plain_event(state, "k1")                      # epoch 2, before the commit
    state = tx.start_commit(tx.commit(state, 1), 1)
    assert state.workflow == tx.Workflow(1, 3), "rolls into a new duplicate of epoch 1"
    state = tx.merge_txn_segment(state, 1)
    state = tx.write_plain_event(state, "k1")                      # during the roll: still epoch 2
    assert _sources(state.readable("k1")) == [(0, 1), (0, 2), (0, 3)], "the duplicate is not readable yet"
    state = tx.finish_commit(state)
    state = tx.write_plain_event(state, "k1")                      # after the commit: epoch 4
    assert state.status(1) is COMMITTED
    assert [(e.layout, e.sealed) for e in state.epochs] == [(1, True), (2, True), (1, True), (2, False)]
    assert _sources(state.readable("k1")) == [(0, 1), (0, 2), (0, 3), (1, 1), (0, 4)]
    assert _sources(state.stream_of("k2")) == [(1, 2)]
    state.check_invariants()


def test_a_transaction_of_the_active_layout_merges_in_place() -> None:
    state = tx.begin(_state(ONE_SEGMENT), 1)
    state = tx.write_plain_event(tx.write_event(state, 1, "k1"), "k1")
    state = tx.settle(tx.commit(state, 1))
    assert len(state.epochs) == 1 and _sources(state.readable("k1")) == [(0, 1), (1, 1)]


def test_commits_land_in_commit_order_not_in_begin_order() -> None:
    state = _state(ONE_SEGMENT)
    state = tx.write_event(tx.begin(state, 1), 1, "k1")
    state = tx.write_event(tx.begin(state, 2), 2, "k1")
    state = tx.commit(tx.commit(state, 2), 1)
    with pytest.raises(NotEnabled):
        tx.start_commit(state, 1)                                   # 2 asked first: it goes first
    state = tx.settle(state)
    assert _sources(state.stream_of("k1")) == [(2, 1), (1, 1)]
    state.check_invariants()


def test_a_spark_driver_replaying_a_batch_commits_it_once() -> None:
    """Batch 1 is committed by transaction 1 with the fence (q, 1); the driver dies before Spark's
    commit log records it and replays batch 1 with transaction 2: 'already committed', and
    transaction 2 is aborted.  Batch 2 then commits with (q, 2)."""
    state = _state(ONE_SEGMENT, txns=3, fence_keys=("q",))
    for t in (1, 2):
        state = tx.write_event(tx.begin(state, t), t, "k1")
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1}), "q", 1))
    state = tx.decide_fenced_commit(state, 1)
    assert tx.recorded_value(state, "q") == 1 and state.status(1) is COMMITTING
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({2}), "q", 1))
    state = tx.decide_fenced_commit(state, 1)
    assert state.fence_log[-1].outcome is tx.FenceOutcome.ALREADY_COMMITTED
    assert state.status(2) is ABORTING
    state = tx.write_event(tx.begin(state, 3), 3, "k1")
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({3}), "q", 2))
    state = tx.settle(tx.decide_fenced_commit(state, 1))
    assert [state.status(t) for t in (1, 2, 3)] == [COMMITTED, ABORTED, COMMITTED]
    assert _sources(state.stream_of("k1")) == [(1, 1), (3, 1)]
    assert tx.recorded_value(state, "q") == 2
    state.check_invariants()


def test_a_stale_fence_read_must_be_read_again() -> None:
    """Two requests for one batch read 'nothing recorded'; the first decision changes the value,
    so the second's conditional write cannot apply until it has read the value again -- and then
    it answers 'already committed'.  Without that condition both would commit (the mutant
    ``Transactions_fence_check_not_atomic``)."""
    state = _state(ONE_SEGMENT, fence_keys=("q",))
    state = tx.begin(tx.begin(state, 1), 2)
    for t in (1, 2):
        state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({t}), "q", 1))
    assert [entry.seen for entry in state.inbox] == [0, 0]
    with pytest.raises(NotEnabled):
        tx.read_fence(state, 2)                                     # nothing changed: nothing to read
    state = tx.decide_fenced_commit(state, 1)
    with pytest.raises(NotEnabled):
        tx.decide_fenced_commit(state, 1)
    state = tx.decide_fenced_commit(tx.read_fence(state, 1), 1)
    assert [d.outcome for d in state.fence_log] == [tx.FenceOutcome.COMMITTED, tx.FenceOutcome.ALREADY_COMMITTED]
    assert (state.status(1), state.status(2)) == (COMMITTING, ABORTING)
    # What the non-atomic controller would have done: commit the replay too.
    broken = attrs.evolve(
        state, txn=(state.transaction(1), attrs.evolve(state.transaction(2), status=COMMITTING, order=2)),
        fence_log=(state.fence_log[0], attrs.evolve(state.fence_log[1], outcome=tx.FenceOutcome.COMMITTED)))
    with pytest.raises(AssertionError, match="AlreadyRecordedCommitsNothing"):
        broken.check_invariants()


def test_a_fenced_request_listing_a_transaction_that_is_not_open_changes_nothing() -> None:
    state = tx.begin(_state(ONE_SEGMENT, fence_keys=("q",)), 1)
    state = tx.abort(state, 1)
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1, 2}), "q", 1))
    decided = tx.decide_fenced_commit(state, 1)
    assert decided.fence_log[-1].outcome is tx.FenceOutcome.REJECTED
    assert decided.txn == state.txn and tx.recorded_value(decided, "q") == 0


def test_a_controller_that_dies_mid_commit_resumes_from_what_it_recorded() -> None:
    state = tx.begin(_state(SPLIT, fence_keys=("q",)), 1)
    state = tx.write_event(tx.write_event(state, 1, "k1"), 1, "k2")
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1}), "q", 1))
    state = tx.merge_txn_segment(tx.start_commit(tx.commit(state, 1), 1), 1)
    state = tx.crash_controller(state)
    assert state.inbox == (), "the unanswered request is lost; its caller retries"
    for step in (tx.finish_commit, lambda s: tx.merge_txn_segment(s, 2), lambda s: tx.begin(s, 2)):
        with pytest.raises(NotEnabled):
            step(state)
    assert _sources(state.stream_of("k1")) == [(1, 1)] and state.stream_of("k2") == ()
    state = tx.settle(tx.restart_controller(state))
    assert state.status(1) is COMMITTED and _sources(state.stream_of("k2")) == [(1, 2)]
    state.check_invariants()


def test_a_lease_that_is_not_renewed_lapses() -> None:
    state = tx.begin(_state(ONE_SEGMENT, lease=2), 1)
    assert state.transaction(1).deadline == 2
    with pytest.raises(NotEnabled):
        tx.ping(state, 1)                                           # would not move the deadline
    state = tx.ping(tx.tick(state), 1)
    assert state.transaction(1).deadline == 3
    state = tx.tick(tx.tick(state))
    with pytest.raises(NotEnabled):
        tx.ping(state, 1)                                           # lapsed: too late to renew
    state = tx.settle(tx.expire_lease(state, 1))
    assert state.status(1) is ABORTED
    with pytest.raises(NotEnabled):
        tx.expire_lease(state, 1)


def test_bad_requests_are_not_enabled() -> None:
    state = tx.begin(_state(ONE_SEGMENT), 1)
    committed = tx.settle(tx.commit(state, 1))
    for bad in (lambda: tx.commit(committed, 1), lambda: tx.write_event(committed, 1, "k1"),
                lambda: tx.abort(committed, 1), lambda: tx.commit(state, 3), lambda: tx.begin(state, 1),
                lambda: tx.write_event(state, 1, "k9"), lambda: tx.scale(state), lambda: tx.finish_commit(state)):
        with pytest.raises(NotEnabled):
            bad()
    with pytest.raises(ValueError):
        tx.FencedRequest(frozenset({1}), "q", 0)
    with pytest.raises(ValueError):
        tx.StreamSetup((ONE_SEGMENT, (frozenset({"k1"}),)), 1)     # the second layout loses k2


def test_invariants_fail_on_bad_states() -> None:
    state = tx.begin(_state(SPLIT), 1)
    state = tx.write_event(tx.write_event(state, 1, "k1"), 1, "k2")
    state = tx.merge_txn_segment(tx.start_commit(tx.commit(state, 1), 1), 1)
    state.check_invariants()
    record = state.transaction(1)
    aborted = attrs.evolve(state, txn=(attrs.evolve(record, status=ABORTING), *state.txn[1:]))
    with pytest.raises(AssertionError, match="NoAbortedRead"):
        aborted.check_invariants()
    early = attrs.evolve(state, txn=(attrs.evolve(record, status=COMMITTED), *state.txn[1:]))
    with pytest.raises(AssertionError, match="NoPartialTransactionRead"):
        early.check_invariants()
    stray = tx.Event(tx.PLAIN_WRITER, "k1", 1)
    misplaced = attrs.evolve(state, plain=1, epochs=(attrs.evolve(state.epochs[0], segments=(
        state.epochs[0].segments[0], (stray,))),))
    with pytest.raises(AssertionError, match="EventsInTheirKeySegment"):
        misplaced.check_invariants()
    second = tx.settle(tx.commit(tx.write_event(tx.begin(tx.settle(state), 2), 2, "k1"), 2))
    second.check_invariants()
    swapped = attrs.evolve(second, txn=(attrs.evolve(second.transaction(1), order=2),
                                        attrs.evolve(second.transaction(2), order=1)))
    with pytest.raises(AssertionError, match="CommitOrderPerKey"):
        swapped.check_invariants()


def test_not_both_committed_and_aborted_fails_on_a_transaction_with_a_stray_order_or_merge() -> None:
    """The invariant's per-transaction half: an open transaction with a commit order, an aborted one
    with a merged segment (no events, so no other invariant notices).  Kills the mutant that runs that
    loop over no transactions (``model/transactions.py``'s ``for me in state.txn`` -> ``for me in []``)."""
    state = tx.begin(_state(SPLIT), 1)
    state.check_invariants()
    record = state.transaction(1)
    ordered = attrs.evolve(state, txn=(attrs.evolve(record, order=1), *state.txn[1:]))
    with pytest.raises(AssertionError, match="NotBothCommittedAndAborted"):
        ordered.check_invariants()
    merged = attrs.evolve(state, txn=(attrs.evolve(record, status=ABORTED, merged=frozenset({1})), *state.txn[1:]))
    with pytest.raises(AssertionError, match="NotBothCommittedAndAborted"):
        merged.check_invariants()


def test_a_fenced_decision_needs_a_running_controller_and_a_request_that_exists() -> None:
    """``DecideFencedCommit(i)`` for i outside 1..Len(inbox), or with the controller down, is not
    enabled.  Kills ``1 <= index`` -> ``0 <= index`` (index 0 decided the last request) and ``state.up
    and ...`` -> ``state.up or ...`` in ``decide_fenced_commit``'s guard."""
    state = tx.begin(_state(ONE_SEGMENT, fence_keys=("q",)), 1)
    state = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1}), "q", 1))
    for index in (0, 2):
        with pytest.raises(NotEnabled):
            tx.decide_fenced_commit(state, index)
    with pytest.raises(NotEnabled):
        tx.decide_fenced_commit(tx.crash_controller(state), 1)
    assert tx.decide_fenced_commit(state, 1).fence_log[-1].outcome is tx.FenceOutcome.COMMITTED


def test_invariants_fail_on_unmerged_reads_and_repeated_plain_writes() -> None:
    """Bad states only one clause notices: a committed transaction whose events are in the stream but
    whose segments are not recorded as merged (``NoPartialTransactionRead``'s per-segment loop), and a
    plain write read twice (``CommitBetweenPlainWrites``' strict order of plain writes).  Kills the
    mutants emptying that loop and turning ``first.number < second.number`` into ``<=``."""
    state = tx.begin(_state(SPLIT), 1)
    state = tx.write_event(tx.write_event(state, 1, "k1"), 1, "k2")
    state = tx.settle(tx.commit(state, 1))
    state.check_invariants()
    record = state.transaction(1)
    assert record.status is COMMITTED
    unmerged = attrs.evolve(state, txn=(attrs.evolve(record, merged=frozenset()), *state.txn[1:]))
    with pytest.raises(AssertionError, match="NoPartialTransactionRead"):
        unmerged.check_invariants()
    plain = tx.write_plain_event(_state(ONE_SEGMENT), "k1")
    plain.check_invariants()
    (event,) = plain.epochs[0].segments[0]
    twice = attrs.evolve(plain, epochs=(attrs.evolve(plain.epochs[0], segments=((event, event),)),))
    with pytest.raises(AssertionError, match="CommitBetweenPlainWrites"):
        twice.check_invariants()


def test_a_key_with_no_recorded_value_reads_zero() -> None:
    """``recorded_value`` is 0 for a key nothing was recorded for (the spec's initial ``recorded``, and
    what a fenced request records as the value it read).  Kills the default ``0`` -> ``-1``."""
    state = tx.begin(_state(ONE_SEGMENT, fence_keys=("q",)), 1)
    assert tx.recorded_value(state, "q") == tx.recorded_value(state, "unfenced") == 0
    requested = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1}), "q", 1))
    assert requested.inbox[-1].seen == 0


def test_each_keys_recorded_value_is_the_largest_its_own_commits_recorded() -> None:
    """``AlreadyRecordedCommitsNothing`` compares a key's recorded value with its own committed
    decisions only: neither another key's larger commit nor a larger refused request of the same key
    counts.  Kills ``d.request.key == key and d.outcome is COMMITTED`` -> ``or`` in
    ``check_invariants`` (seed-2711 sample), which failed this reachable state."""
    state = _state(ONE_SEGMENT, txns=3, fence_keys=("p", "q"))
    for t in (1, 2):
        state = tx.write_event(tx.begin(state, t), t, "k1")
    state = tx.decide_fenced_commit(tx.request_fenced_commit(state, tx.FencedRequest(frozenset({1}), "p", 5)), 1)
    state = tx.decide_fenced_commit(tx.request_fenced_commit(state, tx.FencedRequest(frozenset({2}), "q", 1)), 1)
    refused = tx.request_fenced_commit(state, tx.FencedRequest(frozenset({3}), "q", 9))   # 3 never began
    state = tx.decide_fenced_commit(refused, 1)
    assert [d.outcome for d in state.fence_log] == [tx.FenceOutcome.COMMITTED, tx.FenceOutcome.COMMITTED,
                                                    tx.FenceOutcome.REJECTED]
    assert (tx.recorded_value(state, "p"), tx.recorded_value(state, "q")) == (5, 1)
    state.check_invariants()
    state = tx.settle(state)
    state.check_invariants()
