"""The history checker finds each anomaly it names, and nothing in a clean history."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.errors import InvalidArgumentError
from millstream.testing.history import (
    EventTag,
    History,
    Outcome,
    TransactionOutcome,
    check,
)


def _clean_history(seed: int, writers: int = 3, per_writer: int = 30) -> tuple[History, list[bytes]]:
    """Writers write keyed events; some acked, some unknown (of which a random subset landed), some
    failed (never landed).  One complete pass reads everything that landed, interleaving writers
    arbitrarily but keeping each (writer, key) in write order."""
    rng = random.Random(seed)
    history = History()
    streams: dict[tuple[str, str], list[bytes]] = {}
    for w in range(writers):
        writer = f"w{w}"
        for sequence in range(per_writer):
            key = f"k{rng.randrange(3)}"
            tag = EventTag(writer, sequence)
            history.write_invoked(tag, key=key)
            outcome = rng.choice([Outcome.ACKED] * 6 + [Outcome.UNKNOWN, Outcome.FAILED])
            history.write_completed(tag, outcome)
            landed = outcome is Outcome.ACKED or (outcome is Outcome.UNKNOWN and rng.random() < 0.5)
            if landed:
                streams.setdefault((writer, key), []).append(tag.payload(64, key=key))
    queues = [list(q) for q in streams.values()]
    order: list[bytes] = []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        order.append(queue.pop(0))
    return history, order


@given(st.integers(0, 10_000))
def test_a_clean_history_is_clean(seed: int) -> None:
    history, order = _clean_history(seed)
    history.read_all("p1", order, complete=True)
    report = check(history)
    assert report.ok, report
    assert report.reads == len(order)


def test_tags_round_trip_and_garbage_is_not_a_tag() -> None:
    tag = EventTag("writer-17", 123456789)
    assert EventTag.parse(tag.payload(100, key="k")) == tag
    assert len(tag.payload(100)) == 100
    assert EventTag.parse(b"hello world, not a tag at all....") is None
    assert EventTag.parse(b"") is None


def _history_with(seed: int = 7) -> tuple[History, list[bytes]]:
    history, order = _clean_history(seed)
    assert len(order) > 20
    return history, order


def test_detects_a_lost_acknowledged_event() -> None:
    history, order = _history_with()
    acked = next(p for p in order if dict((t, o) for t, _, _, o in history.writes)[EventTag.parse(p)] is Outcome.ACKED)
    order.remove(acked)
    history.read_all("p1", order, complete=True)
    report = check(history)
    assert EventTag.parse(acked) in report.lost and not report.ok


def test_absence_is_not_loss_in_an_incomplete_pass() -> None:
    history, order = _history_with()
    history.read_all("p1", order[: len(order) // 2])
    assert check(history).ok


def test_detects_duplicates_within_a_pass_but_not_across_passes() -> None:
    history, order = _history_with()
    history.read_all("p1", [*order, order[3]], complete=True)
    assert check(history).duplicated == [EventTag.parse(order[3])]

    history2, order2 = _history_with()
    history2.read_all("p1", order2, complete=True)
    history2.read_all("after-reset", order2[5:])  # a reset re-reads: allowed
    assert check(history2).ok


def test_detects_phantoms_and_resurrected_failures() -> None:
    history, order = _history_with()
    failed = next(t for t, _, _, o in history.writes if o is Outcome.FAILED)
    key = next(k for t, k, _, _ in history.writes if t == failed)
    history.read_all("p1", [*order, b"garbage that nobody wrote", failed.payload(64, key=key)], complete=True)
    report = check(history)
    assert report.phantom == [b"garbage that nobody wrote"]
    assert report.resurrected == [failed]


def test_detects_reordering_within_a_writer_and_key() -> None:
    history, order = _history_with()
    tags = [EventTag.parse(p) for p in order]
    keys = {t: k for t, k, _, _ in history.writes}
    # Find two events of the same writer and key and swap them.
    i = next(i for i in range(len(tags)) for j in range(i + 1, len(tags))
             if tags[i].writer == tags[j].writer and keys[tags[i]] == keys[tags[j]])
    j = next(j for j in range(i + 1, len(tags)) if tags[i].writer == tags[j].writer and keys[tags[i]] == keys[tags[j]])
    order[i], order[j] = order[j], order[i]
    history.read_all("p1", order, complete=True)
    report = check(history)
    assert (tags[j], tags[i]) in report.reordered, report


def test_detects_a_gap_even_in_an_incomplete_pass() -> None:
    history = History()
    for sequence in range(5):
        history.write_invoked(EventTag("w", sequence), key="k")
        history.write_completed(EventTag("w", sequence), Outcome.ACKED)
    history.read_all("p1", [EventTag("w", s).payload(40, key="k") for s in (0, 1, 3, 4)])
    report = check(history)
    assert report.gaps == [EventTag("w", 2)]
    assert report.lost == []  # the pass is not complete


def test_unknown_outcomes_may_or_may_not_appear() -> None:
    history = History()
    for sequence in range(3):
        history.write_invoked(EventTag("w", sequence), key="k")
    history.write_completed(EventTag("w", 0), Outcome.ACKED)
    history.write_completed(EventTag("w", 1), Outcome.UNKNOWN)
    history.write_completed(EventTag("w", 2), Outcome.ACKED)
    history.read_all("with", [EventTag("w", s).payload(key="k") for s in (0, 1, 2)], complete=True)
    history.read_all("without", [EventTag("w", s).payload(key="k") for s in (0, 2)], complete=True)
    assert check(history).ok


def test_an_ack_is_not_undone_by_a_later_unknown() -> None:
    history = History()
    tag = EventTag("w", 0)
    history.write_invoked(tag)
    history.write_completed(tag, Outcome.ACKED)
    history.write_completed(tag, Outcome.UNKNOWN)  # e.g. the connection dropped after the ack
    history.read_all("p", [], complete=True)
    assert check(history).lost == [tag]


@pytest.mark.parametrize("outcome", [TransactionOutcome.COMMITTED, TransactionOutcome.ABORTED])
def test_transactions_all_or_nothing(outcome: TransactionOutcome) -> None:
    history = History()
    tags = [EventTag("t", s) for s in range(4)]
    for tag in tags:
        history.write_invoked(tag, key="k", transaction="txn-1")
        history.write_completed(tag, Outcome.ACKED)
    history.transaction_completed("txn-1", outcome)
    payloads = [t.payload(key="k") for t in tags]
    if outcome is TransactionOutcome.COMMITTED:
        history.read_all("all", payloads, complete=True)
        history.read_all("part", payloads[:2], complete=True)
        report = check(history)
        assert report.partial_transactions == ["txn-1"]
        assert report.lost == tags[2:]
    else:
        history.read_all("none", [], complete=True)
        history.read_all("aborted-read", payloads[:1], complete=True)
        report = check(history)
        assert report.resurrected == tags[:1]
        assert report.lost == []


def test_reading_an_open_transaction_is_a_partial_read() -> None:
    history = History()
    tag = EventTag("t", 0)
    history.write_invoked(tag, transaction="txn-open")
    history.read_all("p", [tag.payload()])
    assert check(history).partial_transactions == ["txn-open"]


def test_tags_must_be_unique() -> None:
    history = History()
    history.write_invoked(EventTag("w", 0))
    with pytest.raises(ValueError):
        history.write_invoked(EventTag("w", 0))


def test_summary_names_every_count() -> None:
    history, order = _history_with()
    history.read_all("p1", order, complete=True)
    summary = check(history).summary()
    for word in ("lost", "duplicated", "phantom", "resurrected", "reordered", "gaps", "partial", "reread"):
        assert f"0 {word}" in summary


def _keyed_writes(count: int, keys: int = 2) -> tuple[History, list[bytes]]:
    history = History()
    payloads = []
    for sequence in range(count):
        tag, key = EventTag("w", sequence), f"k{sequence % keys}"
        history.write_invoked(tag, key=key)
        history.write_completed(tag, Outcome.ACKED)
        payloads.append(tag.payload(40, key=key))
    return history, payloads


def test_forget_takes_a_crashed_readers_lost_read_out_of_the_pass() -> None:
    history, payloads = _keyed_writes(6)
    # A reader returned payloads[2] and crashed before its application processed it: the group hands
    # it out again later in the same pass.
    history.read_all("group", payloads[:3])
    history.forget("group", payloads[2])
    history.read_all("group", payloads[2:], complete=True)
    assert check(history).ok, check(history)
    # Without forget the second delivery is a duplicate.
    history2, payloads2 = _keyed_writes(6)
    history2.read_all("group", [*payloads2[:3], *payloads2[2:]], complete=True)
    assert check(history2).duplicated == [EventTag("w", 2)]
    with pytest.raises(InvalidArgumentError):
        history2.forget("group", EventTag("w", 99).payload(40))
    with pytest.raises(InvalidArgumentError):
        history2.forget("no-such-pass", payloads2[0])


def test_a_pass_resumed_from_a_checkpoint_reads_the_rest_exactly_once() -> None:
    history, payloads = _keyed_writes(8)
    history.read_all("before", payloads[:5])
    history.resume("after-reset", payloads[:3])  # the checkpoint covered the first three
    history.read_all("after-reset", payloads[3:], complete=True)
    report = check(history)
    assert report.ok, report
    assert report.lost == [] and report.reread == []


def test_a_resumed_pass_that_rereads_or_skips_is_caught() -> None:
    history, payloads = _keyed_writes(8)
    history.resume("reread", payloads[:3])
    history.read_all("reread", payloads[2:], complete=True)  # payloads[2] was processed already
    history.resume("skipped", payloads[:3])
    history.read_all("skipped", [*payloads[3:5], *payloads[6:]], complete=True)  # payloads[5] never
    report = check(history)
    assert report.reread == [EventTag("w", 2)]
    assert report.lost == [EventTag("w", 5)]
    assert not report.ok
    assert "1 reread" in report.summary()


def test_resume_is_refused_after_reads_and_for_untagged_payloads() -> None:
    history, payloads = _keyed_writes(3)
    history.read("p", payloads[0])
    with pytest.raises(InvalidArgumentError):
        history.resume("p", payloads[:1])
    with pytest.raises(InvalidArgumentError):
        history.resume("q", [b"no tag here"])
