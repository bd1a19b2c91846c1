"""WriterSession (sans I/O): chained comparisons, ordered replies, and re-submission after an
overtaking; scan_events agrees with the codec's count_events."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.server import scan_events
from millstream.server._appends import BlockState, Failure, PendingBlock, WriterSession
from millstream.wire import (
    ConditionalCheckFailed,
    DataAppended,
    InvalidEventNumber,
    MalformedEventError,
    SegmentIsSealed,
    count_events,
    encode_event,
)

WRITER = uuid.UUID(int=7)


def new_block(number: int, data: bytes = b"x", expected_offset: int | None = None) -> PendingBlock:
    return PendingBlock(number * 10, number, data, expected_offset, len(data))


def test_a_pipeline_chains_comparisons_and_answers_in_order_whatever_order_it_finishes_in() -> None:
    session = WriterSession(WRITER, "s", NULL_ATTRIBUTE_VALUE)
    blocks = [new_block(n) for n in (1, 2, 3)]
    assert all(session.accept(b) for b in blocks)
    assert [b.comparison for b in blocks] == [NULL_ATTRIBUTE_VALUE, 1, 2]
    session.succeeded(blocks[2], 2)
    assert session.drain() == ([], [])  # the third may not be answered before the first two
    session.succeeded(blocks[0], 0)
    answered, _ = session.drain()
    assert [b.reply for b in answered] == [DataAppended(10, WRITER, 1, NULL_ATTRIBUTE_VALUE, 1)]
    session.succeeded(blocks[1], 1)
    answered, _ = session.drain()
    assert [b.reply for b in answered] == [DataAppended(20, WRITER, 2, 1, 2), DataAppended(30, WRITER, 3, 2, 3)]
    assert session.idle
    session.check_invariants()


def test_an_overtaken_block_is_submitted_again_and_blocks_arriving_meanwhile_wait_behind_it() -> None:
    session = WriterSession(WRITER, "s", 0)
    first, second = new_block(1), new_block(2)
    session.accept(first)
    session.accept(second)
    # The second reached the container first: its comparison (1) failed, though nothing is wrong.
    session.failed(second, Failure.COMPARISON)
    assert second.state is BlockState.RETRY
    third = new_block(3)
    assert not session.accept(third), "a block arriving behind a retry is held"
    session.check_invariants()
    session.succeeded(first, 0)
    answered, to_submit = session.drain()
    assert [b.reply for b in answered] == [DataAppended(10, WRITER, 1, 0, 1)]
    assert to_submit == [second, third]
    assert (second.comparison, third.comparison) == (1, 2)
    assert not second.after_unfinished and third.after_unfinished
    session.succeeded(second, 1)
    session.succeeded(third, 2)
    answered, to_submit = session.drain()
    assert [b.reply.event_number for b in answered] == [2, 3] and to_submit == []  # type: ignore[union-attr]
    session.check_invariants()


def test_a_comparison_failure_with_nothing_before_it_is_another_writer() -> None:
    session = WriterSession(WRITER, "s", 5)
    block = new_block(6)
    session.accept(block)
    session.failed(block, Failure.COMPARISON)
    answered, _ = session.drain()
    assert [b.reply for b in answered] == [InvalidEventNumber(60, WRITER, 6)]


def test_a_failed_conditional_append_does_not_break_the_chain_of_later_blocks() -> None:
    session = WriterSession(WRITER, "s", 0)
    conditional = new_block(1, expected_offset=99)
    session.accept(conditional)
    session.failed(conditional, Failure.OFFSET)
    answered, _ = session.drain()
    assert [b.reply for b in answered] == [ConditionalCheckFailed(10, WRITER, 1)]
    later = new_block(2)
    session.accept(later)
    assert later.comparison == 0, "the failed conditional append stored nothing"
    assert not later.after_unfinished


def test_after_a_seal_every_later_block_is_answered_sealed() -> None:
    session = WriterSession(WRITER, "s", 0)
    first, second = new_block(1), new_block(2)
    session.accept(first)
    session.accept(second)
    session.failed(first, Failure.SEALED, 42)
    session.failed(second, Failure.COMPARISON)  # (it compared with the first, which was refused)
    answered, to_submit = session.drain()
    assert to_submit == []
    assert [b.reply for b in answered] == [SegmentIsSealed(10, "s", 42), SegmentIsSealed(20, "s", 42)]
    third = new_block(3)
    assert not session.accept(third)
    assert [b.reply for b in session.drain()[0]] == [SegmentIsSealed(30, "s", 42)]
    session.check_invariants()


payloads = st.lists(st.binary(max_size=40), max_size=30)


@given(payloads)
def test_scan_events_counts_like_the_codec(events: list[bytes]) -> None:
    data = b"".join(encode_event(p) for p in events)
    assert scan_events(data) == (count_events(data), max((len(p) for p in events), default=0))


@given(st.integers(0, 50), st.integers(1, 80), st.data())
def test_scan_events_rejects_what_the_codec_rejects(size: int, count: int, data: st.DataObject) -> None:
    # Equal events (the strided fast path), then one byte of the whole changed or cut.
    block = bytearray(encode_event(b"p" * size) * count)
    if data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(block) - 1))
        block[index] ^= data.draw(st.integers(1, 255))
    else:
        del block[data.draw(st.integers(0, len(block) - 1)):]
    try:
        expected = count_events(bytes(block))
    except MalformedEventError:
        with pytest.raises(MalformedEventError):
            scan_events(bytes(block))
    else:
        assert scan_events(bytes(block))[0] == expected


@given(st.integers(1, 12), st.data())
def test_any_overtaking_still_stores_every_block_once_in_order(count: int, data: st.DataObject) -> None:
    """A container that applies compare-and-sets in the order appends reach it, and appends that reach
    it in any order (as throttled ones may): every block is stored exactly once, in order, and every
    reply is a DataAppended, in order."""
    session = WriterSession(WRITER, "s", NULL_ATTRIBUTE_VALUE)
    stored_number, stored = NULL_ATTRIBUTE_VALUE, []
    in_transit: list[PendingBlock] = []  # submitted, not yet reached the container
    replies = []
    blocks = [new_block(n, bytes([n])) for n in range(1, count + 1)]
    arrivals = list(blocks)
    while arrivals or in_transit:
        if arrivals and (not in_transit or data.draw(st.booleans(), label="arrive")):
            block = arrivals.pop(0)
            if session.accept(block):
                in_transit.append(block)
        else:
            block = in_transit.pop(data.draw(st.integers(0, len(in_transit) - 1), label="reaches the container"))
            if block.comparison == stored_number:
                stored_number = block.last_event_number
                stored.append(block.last_event_number)
                session.succeeded(block, len(stored) - 1)
            else:
                session.failed(block, Failure.COMPARISON)
            answered, to_submit = session.drain()
            replies += [b.reply for b in answered]
            in_transit += to_submit
        session.check_invariants()
    assert stored == list(range(1, count + 1))
    assert all(isinstance(r, DataAppended) for r in replies), replies
    assert [r.event_number for r in replies] == list(range(1, count + 1))  # type: ignore[union-attr]
    assert session.idle
