"""The pure decisions of stream transactions (``millstream.controller._transactions``): the lifecycle
table against the model's, leases and pings, commit targets and a roll's co-located epochs, the next
workflow step, and the fenced multi-commit against both models' decisions (``model.transactions``'
``fence_outcome`` and ``model.exactly_once_sink.fenced_commit``), including every refusal leaving the
state unchanged."""

from __future__ import annotations

import copy
import math
from uuid import UUID

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream import limits
from millstream.client import TransactionStatus, ping_interval_seconds
from millstream.client._transactions import LIFECYCLE as CLIENT_LIFECYCLE
from millstream.controller import (
    RECORD_ACTIONS,
    TRANSACTION_LIFECYCLE,
    CommitStep,
    EpochRecord,
    FenceOutcome,
    SegmentRecord,
    StreamHistory,
    TransactionRecord,
    TxnStatus,
    commit_target,
    decide_fenced_commit,
    lease_deadline,
    next_transaction_step,
    ping_deadline,
    roll_epochs,
)
from millstream.controller._transactions import check_fence, check_lease, check_transaction_id, expired
from millstream.errors import (
    FenceValueError,
    InternalError,
    InvalidArgumentError,
    LeaseExpiredError,
    LeaseTooLargeError,
    StreamSealedError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.model import exactly_once_sink as sink
from millstream.model import transactions as tx
from millstream.naming import segment_id, segment_id_parts

HALVES = (SegmentRecord(segment_id(0, 0), 0.0, 0.5), SegmentRecord(segment_id(0, 1), 0.5, 1.0))
WHOLE = (SegmentRecord(segment_id(1, 2), 0.0, 1.0),)


def txn(n: int, status: TxnStatus = TxnStatus.OPEN, *, order: int = 0, segments=HALVES, number: int = 0,
        ) -> TransactionRecord:
    record = TransactionRecord(UUID(int=n).hex, 0, segments, 10.0, 100.0, 110.0, number)
    record.status = status
    record.order = order
    return record


def table(*records: TransactionRecord) -> dict[str, TransactionRecord]:
    return {r.txn_id: r for r in records}


def ident(n: int) -> str:
    return UUID(int=n).hex


# --- The lifecycle ------------------------------------------------------------------------------


def test_the_lifecycle_table_has_exactly_the_models_status_changes() -> None:
    implementation = {(source.value, target.value) for source, moves in TRANSACTION_LIFECYCLE.items()
                      for target in moves.values()} | {("none", "open")}  # (txn_created begins one)
    model = {(source.value, target.value) for source, moves in tx.LIFECYCLE.items() for target in moves.values()}
    assert implementation == model
    client = {(source.value, target.value) for source, moves in CLIENT_LIFECYCLE.items() for target in moves.values()}
    assert client | {("none", "open")} == model
    assert {s.value for s in TxnStatus} == {s.value for s in TransactionStatus}


def test_every_record_is_a_spec_action_and_every_status_changing_action_has_a_record() -> None:
    actions = {a for names in RECORD_ACTIONS.values() for a in names}
    assert {a.split("/")[0] for a in actions} <= set(tx.ACTIONS)
    status_changing = {event for moves in tx.LIFECYCLE.values() for event in moves}
    assert status_changing <= actions
    for status, moves in TRANSACTION_LIFECYCLE.items():
        for record_type in moves:
            assert record_type in RECORD_ACTIONS, (status, record_type)


def test_a_record_that_the_table_does_not_allow_is_an_internal_error() -> None:
    record = txn(1, TxnStatus.COMMITTED, order=1)
    with pytest.raises(InternalError):
        record.advance("txns_aborting")
    assert record.status is TxnStatus.COMMITTED
    record = txn(2)
    record.advance("txns_committing")
    assert record.status is TxnStatus.COMMITTING


def test_records_round_trip_through_json() -> None:
    record = txn(7, TxnStatus.COMMITTING, order=3)
    again = TransactionRecord.from_json(record.to_json())
    assert again.to_json() == record.to_json()
    again.check_invariants()


# --- Ids, leases, pings, fences ---------------------------------------------------------------------


def test_transaction_ids_are_32_lower_case_hex_digits() -> None:
    assert check_transaction_id(UUID(int=5)) == UUID(int=5).hex
    for bad in ("", "g" * 32, UUID(int=2**128 - 1).hex.upper(), str(UUID(int=5)), 5, None, UUID(int=5).hex + "0"):
        with pytest.raises(InvalidArgumentError):
            check_transaction_id(bad)


def test_leases_within_the_limits_and_nothing_else() -> None:
    assert check_lease(limits.TRANSACTION_LEASE_SECONDS_MAX) == limits.TRANSACTION_LEASE_SECONDS_MAX
    assert check_lease(limits.TRANSACTION_LEASE_MIN_SECONDS) == limits.TRANSACTION_LEASE_MIN_SECONDS
    for bad in (limits.TRANSACTION_LEASE_SECONDS_MAX + 0.001, 0, -1, math.inf, math.nan, True, "10", None):
        with pytest.raises(LeaseTooLargeError):
            check_lease(bad)


def test_fences_are_a_key_and_a_non_negative_64_bit_int() -> None:
    assert check_fence(None) is None
    assert check_fence(("q", 0)) == ("q", 0)
    assert check_fence(["q", limits.FENCE_VALUE_MAX]) == ("q", limits.FENCE_VALUE_MAX)
    for bad in (("q", 1.0), ("q", "1"), ("q", True), ("q", -1), ("q", limits.FENCE_VALUE_MAX + 1), ("", 1),
                (1, 1), ("k" * (limits.FENCE_KEY_LENGTH_MAX + 1), 1), ("q",), "q1", ("q", 1, 2)):
        with pytest.raises(FenceValueError):
            check_fence(bad)


def test_a_ping_extends_an_open_lease_up_to_the_maximum_execution_time() -> None:
    record = txn(1)  # opened 100, lease 10, deadline 110
    assert ping_deadline(record, 105.0) == 115.0
    assert ping_deadline(record, 100.0) is None, "a ping that would not move the deadline records nothing"
    with pytest.raises(LeaseExpiredError):
        ping_deadline(record, 110.0)
    cap = 100.0 + min(limits.TRANSACTION_EXECUTION_LEASES_MAX * 10.0, limits.TRANSACTION_EXECUTION_SECONDS_MAX)
    assert lease_deadline(100.0, cap - 1.0, 10.0) == cap
    record.deadline = cap
    assert ping_deadline(record, cap - 1.0) is None, "past the maximum execution time the lease is not renewed"
    for status in (TxnStatus.COMMITTING, TxnStatus.ABORTING, TxnStatus.COMMITTED, TxnStatus.ABORTED):
        with pytest.raises(TransactionNotOpenError):
            ping_deadline(txn(2, status, order=1 if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else 0),
                          105.0)


def test_expiry_takes_exactly_the_open_transactions_whose_deadline_passed() -> None:
    late, fresh, done = txn(1), txn(2), txn(3, TxnStatus.ABORTING)
    fresh.deadline = 200.0
    assert expired(table(late, fresh, done), 110.0) == [late.txn_id]
    assert expired(table(late, fresh, done), 109.9) == []


@given(st.floats(limits.TRANSACTION_LEASE_MIN_SECONDS, limits.TRANSACTION_LEASE_SECONDS_MAX))
def test_the_pinger_renews_a_lease_at_least_three_times_per_lease(lease: float) -> None:
    interval = ping_interval_seconds(lease)
    assert 0 < interval <= lease / 3
    if lease >= 9:
        assert math.isclose(interval, lease / math.sqrt(lease)), "Pravega's interval"


# --- Targets and rolls ----------------------------------------------------------------------------


def colocated_by(containers: dict[int, int] | None = None, count: int = 4):
    """A container map for tests: a fixed one for the ids given, else the number modulo ``count``."""
    def container(identifier: int) -> int:
        if containers is not None and identifier in containers:
            return containers[identifier]
        return segment_id_parts(identifier)[1] % count
    return lambda a, b: container(a) == container(b)


def test_a_transaction_merges_into_the_active_epoch_only_with_its_key_ranges_in_its_containers() -> None:
    active = EpochRecord(0, 0.0, HALVES)
    assert commit_target(HALVES, active, colocated_by()) == [s.segment_id for s in HALVES]
    assert commit_target(HALVES, EpochRecord(1, 0.0, WHOLE), colocated_by()) is None, "other key ranges: roll"
    elsewhere = EpochRecord(2, 0.0, (SegmentRecord(segment_id(2, 5), 0.0, 0.5), SegmentRecord(segment_id(2, 6), 0.5,
                                                                                               1.0)))
    assert commit_target(HALVES, elsewhere, colocated_by()) is None, "same ranges, other containers: roll"
    assert commit_target(HALVES, elsewhere, colocated_by({segment_id(2, 5): 0, segment_id(2, 6): 1})) == [
        segment_id(2, 5), segment_id(2, 6)]


def test_a_roll_makes_two_new_epochs_of_fresh_segments_each_with_the_segment_it_duplicates() -> None:
    active = EpochRecord(4, 0.0, WHOLE)
    colocated = colocated_by()
    duplicate, again, next_number = roll_epochs(HALVES, active, 3, 9.0, colocated)
    assert (duplicate.epoch, again.epoch) == (5, 6)
    assert [(s.key_start, s.key_end) for s in duplicate.segments] == [(0.0, 0.5), (0.5, 1.0)]
    assert [(s.key_start, s.key_end) for s in again.segments] == [(0.0, 1.0)]
    for original, copy_ in [*zip(HALVES, duplicate.segments, strict=True), *zip(WHOLE, again.segments, strict=True)]:
        assert colocated(original.segment_id, copy_.segment_id)
    numbers = [s.number for s in (*duplicate.segments, *again.segments)]
    assert len(set(numbers)) == len(numbers) and min(numbers) >= 3 and next_number > max(numbers)
    assert segment_id_parts(duplicate.segments[0].segment_id)[0] == 5
    # The stream's history takes both epochs: every key covered once, successors as for a scale.
    history = StreamHistory([EpochRecord(4, 0.0, WHOLE)]).with_epoch(duplicate).with_epoch(again)
    history.check_invariants()
    assert [s.segment_id for s in history.successors(WHOLE[0].segment_id)] == [s.segment_id for s in duplicate.segments]
    assert history.successors(duplicate.segments[0].segment_id) == list(again.segments)
    # A transaction begun in the old active epoch commits straight into the new one.
    assert commit_target(WHOLE, again, colocated) == [again.segments[0].segment_id]


def test_a_roll_that_finds_no_co_located_number_is_an_internal_error() -> None:
    with pytest.raises(InternalError):
        roll_epochs(HALVES, EpochRecord(4, 0.0, WHOLE), 3, 0.0, lambda a, b: False)


def test_the_workflow_finishes_a_started_commit_then_aborts_then_the_lowest_commit_order() -> None:
    first, second, going = txn(1, TxnStatus.COMMITTING, order=2), txn(2, TxnStatus.COMMITTING, order=1), \
        txn(3, TxnStatus.ABORTING)
    records = table(first, second, going, txn(4))
    assert next_transaction_step({"kind": "commit", "txn": first.txn_id}, records) == CommitStep("continue_commit",
                                                                                                first.txn_id)
    assert next_transaction_step({"kind": "scale"}, records) == CommitStep("finish_workflow")
    assert next_transaction_step(None, records) == CommitStep("finish_abort", going.txn_id)
    going.status = TxnStatus.ABORTED
    assert next_transaction_step(None, records) == CommitStep("start_commit", second.txn_id)
    second.status = TxnStatus.COMMITTED
    assert next_transaction_step(None, records) == CommitStep("start_commit", first.txn_id)
    first.status = TxnStatus.COMMITTED
    assert next_transaction_step(None, records) is None


# --- The fenced multi-commit --------------------------------------------------------------------------


def decide(records: dict[str, TransactionRecord], fences: dict[str, int], ids: list[str],
           fence: tuple[str, int] | None, *, sealed: bool = False):
    before = (copy.deepcopy({t: r.to_json() for t, r in records.items()}), dict(fences))
    try:
        return decide_fenced_commit(sealed=sealed, transactions=records, fences=fences, txn_ids=ids, fence=fence)
    finally:  # the decision only plans: it never changes the state it looks at
        assert ({t: r.to_json() for t, r in records.items()}, fences) == before


def test_a_fence_not_lower_than_the_recorded_value_commits_nothing_and_aborts_the_open_ones() -> None:
    records = table(txn(1), txn(2, TxnStatus.COMMITTED, order=1), txn(3, TxnStatus.ABORTED))
    decision = decide(records, {"q": 5}, [ident(1), ident(2), ident(3), ident(9)], ("q", 5))
    assert decision.outcome is FenceOutcome.ALREADY_COMMITTED and decision.recorded == 5
    assert decision.record == {"type": "txns_aborting", "txns": [ident(1)], "reason": "fenced"}
    retry = decide(records, {"q": 5}, [ident(2), ident(3)], ("q", 4))
    assert retry.outcome is FenceOutcome.ALREADY_COMMITTED and retry.record is None, "nothing open: no record"


def test_a_higher_fence_commits_every_listed_transaction_and_records_the_value_in_one_record() -> None:
    records = table(txn(1, number=2), txn(2, number=1), txn(3, number=3))
    decision = decide(records, {"q": 5}, [ident(3), ident(1), ident(2)], ("q", 6))
    assert decision.outcome is FenceOutcome.COMMITTED and decision.recorded == 6
    # Commit orders in the order the transactions began (the spec orders its set by identity), not
    # the list's order nor the ids'.
    assert decision.record == {"type": "txns_committing", "txns": [ident(2), ident(1), ident(3)], "fence": ["q", 6]}
    assert decide(records, {}, [ident(1)], ("new", 0)).record["fence"] == ["new", 0], "no value yet: 0 is higher"
    plain = decide(records, {}, [ident(1)], None)
    assert plain.outcome is FenceOutcome.COMMITTED and plain.record["fence"] is None and plain.recorded is None


@pytest.mark.parametrize(("ids", "error"), [
    ([], InvalidArgumentError),
    ([ident(1), ident(1)], InvalidArgumentError),
    ([ident(1), ident(9)], TransactionNotFoundError),
    ([ident(1), ident(2)], TransactionNotOpenError),
])
def test_a_refused_multi_commit_raises_and_plans_nothing(ids: list[str], error: type[Exception]) -> None:
    records = table(txn(1), txn(2, TxnStatus.ABORTING))
    with pytest.raises(error):
        decide(records, {"q": 1}, ids, ("q", 2))


def test_a_multi_commit_on_a_sealed_stream_or_beyond_the_limits_is_refused() -> None:
    records = table(txn(1))
    with pytest.raises(StreamSealedError):
        decide(records, {}, [ident(1)], ("q", 1), sealed=True)
    too_many = [ident(n) for n in range(1, limits.TRANSACTIONS_PER_COMMIT_MAX + 2)]
    with pytest.raises(InvalidArgumentError):
        decide(records, {}, too_many, None)
    full = {f"k{n}": 1 for n in range(limits.FENCE_KEYS_PER_STREAM_MAX)}
    with pytest.raises(InvalidArgumentError):
        decide(records, full, [ident(1)], ("another", 1))
    assert decide(records, full, [ident(1)], ("k0", 2)).outcome is FenceOutcome.COMMITTED, "a known key still works"


STATUSES = [TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.COMMITTED, TxnStatus.ABORTING, TxnStatus.ABORTED]


@given(st.lists(st.sampled_from(STATUSES), min_size=1, max_size=4), st.data(),
       st.one_of(st.none(), st.integers(1, 4)), st.integers(1, 5))
def test_the_decision_is_the_models(statuses: list[TxnStatus], data: st.DataObject, recorded: int | None,
                                    value: int) -> None:
    """Against ``model.transactions.fence_outcome`` (which orders the checks as the spec does) and the
    Spark sink model's ``fenced_commit``: same outcome, same transactions moved, same value recorded."""
    records = table(*(txn(n, status, order=n if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else 0)
                      for n, status in enumerate(statuses, start=1)))
    chosen = data.draw(st.lists(st.sampled_from(range(1, len(statuses) + 1)), min_size=1, unique=True))
    fences = {} if recorded is None else {"q": recorded}
    try:
        decision = decide(records, fences, [ident(n) for n in chosen], ("q", value))
        outcome = decision.outcome.value
    except TransactionNotOpenError:
        decision, outcome = None, "rejected"

    # The Transactions model: its statuses, the value read (0 = none), the request.
    model_state = tx.initial_state(tx.StreamSetup(((frozenset({"k"}),),), 1), len(statuses))
    model_state = attrs_evolve_statuses(model_state, statuses)
    entry = tx.InboxEntry(tx.FencedRequest(frozenset(chosen), "q", value), 0 if recorded is None else recorded)
    assert tx.fence_outcome(model_state, entry).value == outcome

    # The sink model: open / committed / aborted only (its "committing" is committed).
    committed, aborted = sink.TransactionStatus.COMMITTED, sink.TransactionStatus.ABORTED
    as_sink = {TxnStatus.OPEN: sink.TransactionStatus.OPEN, TxnStatus.COMMITTING: committed,
               TxnStatus.COMMITTED: committed, TxnStatus.ABORTING: aborted, TxnStatus.ABORTED: aborted}
    table_ = tuple(sink.StoreTransaction(status=as_sink[s], batch=value) for s in statuses)
    after, fence, _, sink_outcome = sink.fenced_commit(table_, 0 if recorded is None else recorded, tuple(chosen),
                                                       value)
    assert sink_outcome.value == outcome
    if decision is not None and decision.record is not None:
        moved = set(decision.record["txns"])
        changed = {ident(n) for n, (a, b) in enumerate(zip(table_, after, strict=True), start=1) if a != b}
        assert moved == changed
        assert (decision.recorded == fence) if outcome == "committed" else True
    elif outcome != "rejected":
        assert after == table_, "no record: the model changes no transaction either"


def attrs_evolve_statuses(state: tx.TransactionsState, statuses: list[TxnStatus]) -> tx.TransactionsState:
    records = tuple(attrs.evolve(record, status=tx.TxnStatus(status.value),
                                 order=n if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else 0)
                    for n, (record, status) in enumerate(zip(state.txn, statuses, strict=True), start=1))
    return attrs.evolve(state, txn=records)
