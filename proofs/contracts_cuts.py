"""Contracts that CrossHair checks on stream cuts, retention, truncation, the Spark planner and the
reader group's assignment (issue 24 item 3's remaining areas).

``crosshair check --analysis_kind PEP316 --report_all proofs.contracts_cuts`` reports each
postcondition as "Confirmed over all paths" or "Not confirmed" (bounded).  The structures are fixed
and small -- one stream whose only segment split in two, a group of up to three readers -- and the
numbers in them (offsets, lengths, budgets, limits, counts) are symbolic, so CrossHair explores every
ordering of them.  The seeded bug each one was shown to find is listed in ``proofs/test_contracts.py``.
"""

from __future__ import annotations

from millstream.client import SegmentWithRange, StreamCut
from millstream.client._reader_group_state import ReaderGroupState, ReaderInfo
from millstream.controller._cuts import cut_size, is_at_or_after, lower_bound, segments_between
from millstream.controller._epochs import EpochRecord, SegmentRecord, StreamHistory
from millstream.controller._retention import choose_truncation
from millstream.controller._state import RecordedCut
from millstream.model.frozen_map import FrozenMap
from millstream.model.segment import Request, SegmentMetadata, SegmentStatus, validate
from millstream.model.segment import apply as apply_request
from millstream.model.types import NO_OFFSET, OperationKind  # noqa: F401 (NO_OFFSET: named by a condition)
from millstream.naming import segment_id
from millstream.segmentstore.event_boundaries import index_after_truncation, nearest_known
from millstream.spark._planning import Budget, SegmentRange, SegmentView, plan_end
from millstream.values import ReaderGroupConfig, RetentionPolicy

__all__ = [
    "acquire_share", "conditional_append", "consumption_lower_bound", "merge_of_truncated_source", "nearest_boundary",
    "order_is_antisymmetric", "order_of_cuts",
    "plan_within_budget", "release_only_when_heavier", "retention_by_consumption", "retention_by_size",
    "retention_by_time", "size_grows_with_cut", "size_of_cut", "slices_between", "truncation_bounds",
    "truncation_by_status", "truncation_drops_boundaries",
]

# --- One stream: segment A = [0, 1) in epoch 0, split into B = [0, 0.5) and C = [0.5, 1) in epoch 1. ---

A, B, C = segment_id(0, 0), segment_id(1, 1), segment_id(1, 2)
HISTORY = StreamHistory([
    EpochRecord(0, 0.0, (SegmentRecord(A, 0.0, 1.0),)),
    EpochRecord(1, 1.0, (SegmentRecord(B, 0.0, 0.5), SegmentRecord(C, 0.5, 1.0))),
])


def _cut(in_a: bool, a: int, b: int, c: int) -> dict[int, int]:
    """A cut of the stream: in the first epoch (A at ``a``) or the second (B at ``b``, C at ``c``)."""
    return {A: a} if in_a else {B: b, C: c}


def _expected_order(first_in_a: bool, a1: int, b1: int, c1: int, second_in_a: bool, a2: int, b2: int,
                    c2: int) -> bool:
    if first_in_a and second_in_a:
        return a1 >= a2
    if first_in_a or second_in_a:
        return second_in_a  # the second epoch's segments were created after A
    return b1 >= b2 and c1 >= c2


def order_of_cuts(first_in_a: bool, a1: int, b1: int, c1: int, second_in_a: bool, a2: int, b2: int, c2: int) -> bool:
    """A cut is at or after another exactly when, at every key, it is in a later segment or further
    in the same one.

    pre: a1 >= 0 and b1 >= 0 and c1 >= 0 and a2 >= 0 and b2 >= 0 and c2 >= 0
    post: __return__ == _expected_order(first_in_a, a1, b1, c1, second_in_a, a2, b2, c2)
    """
    return is_at_or_after(HISTORY, _cut(first_in_a, a1, b1, c1), _cut(second_in_a, a2, b2, c2))


def order_is_antisymmetric(first_in_a: bool, a1: int, b1: int, c1: int, second_in_a: bool, a2: int, b2: int,
                           c2: int) -> bool:
    """Two cuts each at or after the other are the same cut.

    pre: a1 >= 0 and b1 >= 0 and c1 >= 0 and a2 >= 0 and b2 >= 0 and c2 >= 0
    post: __return__
    """
    first, second = _cut(first_in_a, a1, b1, c1), _cut(second_in_a, a2, b2, c2)
    return not (is_at_or_after(HISTORY, first, second) and is_at_or_after(HISTORY, second, first)) or first == second


def size_of_cut(in_a: bool, a: int, b: int, c: int, a_length: int, a_length_known: bool) -> int:
    """The stream's size up to a cut: its offsets, plus the length of the sealed segment before it
    (a length not recorded yet counts as 0).

    pre: 0 <= a and 0 <= b and 0 <= c and 0 <= a_length
    post: __return__ == (a if in_a else (a_length if a_length_known else 0) + b + c)
    """
    return cut_size(HISTORY, _cut(in_a, a, b, c), {A: a_length} if a_length_known else {})


def consumption_lower_bound(first_in_a: bool, a1: int, b1: int, c1: int, second_in_a: bool, a2: int, b2: int,
                            c2: int, a_length: int) -> dict[int, int]:
    """The lower bound of two cuts (where consumption-based retention truncates) is a cut of the
    stream at or before each of them, and equal to them when they are equal.

    pre: 0 <= a1 <= a_length and 0 <= a2 <= a_length and b1 >= 0 and c1 >= 0 and b2 >= 0 and c2 >= 0
    post: set(__return__) in ({A}, {B, C})
    post: is_at_or_after(HISTORY, _cut(first_in_a, a1, b1, c1), __return__)
    post: is_at_or_after(HISTORY, _cut(second_in_a, a2, b2, c2), __return__)
    post: _cut(first_in_a, a1, b1, c1) != _cut(second_in_a, a2, b2, c2) or __return__ == _cut(first_in_a, a1, b1, c1)
    """
    cuts = [_cut(first_in_a, a1, b1, c1), _cut(second_in_a, a2, b2, c2)]
    return lower_bound(HISTORY, cuts, {A: a_length})


def size_grows_with_cut(first_in_a: bool, a1: int, b1: int, c1: int, second_in_a: bool, a2: int, b2: int, c2: int,
                        a_length: int) -> bool:
    """A cut at or after another never has a smaller size (what size-based retention subtracts).

    pre: 0 <= a1 <= a_length and 0 <= a2 <= a_length and b1 >= 0 and c1 >= 0 and b2 >= 0 and c2 >= 0
    post: __return__
    """
    first, second = _cut(first_in_a, a1, b1, c1), _cut(second_in_a, a2, b2, c2)
    lengths = {A: a_length}
    return not is_at_or_after(HISTORY, first, second) or cut_size(HISTORY, first, lengths) >= cut_size(
        HISTORY, second, lengths)


def slices_between(a: int, b: int, c: int, a_length: int) -> list[tuple[int, int, int]]:
    """The bytes between a cut in the first epoch and one in the second: A from its offset to its
    length, then B and C from 0 to their offsets, in creation order.

    pre: 0 <= a <= a_length and 0 <= b and 0 <= c
    post: __return__ == [(A, a, a_length), (B, 0, b), (C, 0, c)]
    """
    slices = segments_between(HISTORY, {A: a}, {B: b, C: c}, {A: a_length})
    return [(piece.segment.segment_id, piece.start_offset, piece.end_offset) for piece in slices]


# --- Retention arithmetic ---------------------------------------------------------------------------


def _expected_by_size(limit: int, head: tuple[int, int], tail_size: int, *recorded: tuple[int, int]
                      ) -> dict[int, int] | None:
    """The newest of ``recorded`` (oldest first) that keeps ``limit`` bytes and is not the head."""
    for b, c in reversed(recorded):
        if tail_size - b - c >= limit and (b, c) != head:
            return {B: b, C: c}
    return None


def retention_by_size(limit: int, head_b: int, head_c: int, tail_b: int, tail_c: int, old_b: int, old_c: int,
                      new_b: int, new_c: int) -> dict[int, int] | None:
    """Size-based retention truncates at a recorded cut that keeps at least ``limit`` bytes, strictly
    after the head, the newest such cut; else nothing.

    pre: 0 < limit <= 10**6
    pre: 0 <= head_b <= old_b <= new_b <= tail_b and 0 <= head_c <= old_c <= new_c <= tail_c
    post: __return__ is None or tail_b + tail_c - sum(__return__.values()) >= limit
    post: __return__ is None or __return__ != {B: head_b, C: head_c}
    post: __return__ == _expected_by_size(limit, (head_b, head_c), tail_b + tail_c, (old_b, old_c), (new_b, new_c))
    """
    recorded = [RecordedCut(1, {B: old_b, C: old_c}), RecordedCut(2, {B: new_b, C: new_c})]
    return choose_truncation(RetentionPolicy("size", limit), history=HISTORY, head={B: head_b, C: head_c},
                             tail={B: tail_b, C: tail_c}, recorded=recorded, sealed_lengths={}, now=3)


def _older_choice(old_time: int, deadline: int) -> dict[int, int] | None:
    return {B: 1, C: 1} if old_time <= deadline else None


def retention_by_time(limit: int, now: int, old_time: int, new_time: int) -> dict[int, int] | None:
    """Time-based retention truncates at the newest recorded cut made at least ``limit`` seconds ago.

    pre: 0 < limit <= 10**6 and 0 <= old_time < new_time <= now <= 10**6
    post: __return__ == ({B: 2, C: 2} if new_time <= now - limit else _older_choice(old_time, now - limit))
    """
    recorded = [RecordedCut(old_time, {B: 1, C: 1}), RecordedCut(new_time, {B: 2, C: 2})]
    return choose_truncation(RetentionPolicy("time", limit), history=HISTORY, head={B: 0, C: 0},
                             tail={B: 3, C: 3}, recorded=recorded, sealed_lengths={}, now=now)


def retention_by_consumption(reported: bool, b1: int, c1: int, b2: int, c2: int, head_b: int,
                             head_c: int) -> dict[int, int] | None:
    """Consumption-based retention waits for every subscriber's cut, then truncates at most to the
    lowest of them, and only forward from the head.

    pre: 0 <= head_b <= b1 and 0 <= head_c <= c1 and 0 <= head_b <= b2 and 0 <= head_c <= c2
    post: reported or __return__ is None
    post: __return__ is None or (__return__[B] == min(b1, b2) and __return__[C] == min(c1, c2))
    post: __return__ is not None or not reported or (min(b1, b2), min(c1, c2)) == (head_b, head_c)
    """
    subscribers: list[dict[int, int] | None] = [{B: b1, C: c1}, {B: b2, C: c2} if reported else None]
    return choose_truncation(RetentionPolicy.consumption(), history=HISTORY, head={B: head_b, C: head_c},
                             tail={B: max(b1, b2), C: max(c1, c2)}, recorded=[], sealed_lengths={}, now=0,
                             subscriber_cuts=subscribers)


# --- Truncation bounds ------------------------------------------------------------------------------


def truncation_bounds(start: int, length: int, offset: int) -> int | None:
    """A segment is truncated only within [its start, its length] (None: refused); then it starts there.

    pre: 0 <= start <= length
    post: __return__ == (offset if start <= offset <= length else None)
    """
    segment = SegmentMetadata(SegmentStatus.ACTIVE, length=length, start_offset=start)
    metadata = FrozenMap({"s": segment})
    request = Request(OperationKind.TRUNCATE, "s", offset=offset)
    if validate(metadata, request) is not None:
        return None
    return apply_request(metadata, request, 1)["s"].start_offset


def nearest_boundary(first: int, second: int, start: int, offset: int) -> int:
    """Reading from ``offset`` starts at the highest known event boundary at or below it, never
    below the segment's start.

    pre: 0 < first < second and 0 <= start < first and start <= offset
    post: start <= __return__ <= offset
    post: __return__ == max([start] + [b for b in (first, second) if b <= offset])
    """
    return nearest_known((first, second), start, offset)


def conditional_append(length: int, expected: int) -> bool:
    """A conditional append is accepted exactly when it expects the segment's length (or is plain).

    pre: 0 <= length and NO_OFFSET <= expected
    post: __return__ == (expected in (NO_OFFSET, length))
    """
    metadata = FrozenMap({"s": SegmentMetadata(SegmentStatus.ACTIVE, length=length)})
    return validate(metadata, Request(OperationKind.APPEND, "s", data=b"x", offset=expected)) is None


def truncation_by_status(sealed: bool, start: int, length: int, offset: int) -> int | None:
    """A sealed segment is truncated within the same bounds as an active one.

    pre: 0 <= start <= length
    post: __return__ == (offset if start <= offset <= length else None)
    """
    status = SegmentStatus.SEALED if sealed else SegmentStatus.ACTIVE
    metadata = FrozenMap({"s": SegmentMetadata(status, length=length, start_offset=start)})
    request = Request(OperationKind.TRUNCATE, "s", offset=offset)
    if validate(metadata, request) is not None:
        return None
    return apply_request(metadata, request, 1)["s"].start_offset


def merge_of_truncated_source(start: int, length: int) -> bool:
    """A sealed source segment is merged only if it was never truncated (its bytes from 0 are whole).

    pre: 0 <= start <= length
    post: __return__ == (start == 0)
    """
    metadata = FrozenMap({"t": SegmentMetadata(SegmentStatus.ACTIVE),
                          "s": SegmentMetadata(SegmentStatus.SEALED, length=length, start_offset=start)})
    return validate(metadata, Request(OperationKind.MERGE, "t", source="s")) is None


def truncation_drops_boundaries(first: int, second: int, third: int, start: int) -> tuple[int, ...]:
    """After a truncation the event-boundary index keeps exactly the known boundaries above the new start.

    pre: 0 < first < second < third
    pre: 0 <= start
    post: __return__ == tuple(b for b in (first, second, third) if b > start)
    """
    return index_after_truncation((first, second, third), start)


# --- The Spark planner ------------------------------------------------------------------------------


def plan_within_budget(b_start: int, b_end: int, c_start: int, c_end: int, event_bytes: int,
                       max_bytes: int) -> tuple[int, int]:
    """A batch over two segments (events of ``event_bytes`` each) ends at event boundaries, never
    before its start nor past what is available, holds at most ``max_bytes`` unless one event alone is
    larger, and takes something whenever something is available.

    pre: 1 <= event_bytes <= 2
    pre: 0 <= b_start <= b_end <= 8 and 0 <= c_start <= c_end <= 8
    pre: b_start % event_bytes == 0 and b_end % event_bytes == 0
    pre: c_start % event_bytes == 0 and c_end % event_bytes == 0
    pre: 1 <= max_bytes <= 8
    post: b_start <= __return__[0] <= b_end and c_start <= __return__[1] <= c_end
    post: __return__[0] % event_bytes == 0 and __return__[1] % event_bytes == 0
    post: (__return__[0] - b_start) + (__return__[1] - c_start) <= max(max_bytes, event_bytes)
    post: (b_start, c_start) == (b_end, c_end) or __return__ != (b_start, c_start)
    """
    def measure(span: SegmentRange, rows: int | None, size: int | None) -> tuple[int, int]:
        events = span.length_bytes // event_bytes
        if rows is not None:
            events = min(events, rows)
        if size is not None:
            events = min(events, size // event_bytes)
        return span.start_offset + events * event_bytes, events

    views = {B: SegmentView(SegmentWithRange(B, 0.0, 0.5, "s/t/1"), b_start, b_end, None, frozenset()),
             C: SegmentView(SegmentWithRange(C, 0.5, 1.0, "s/t/2"), c_start, c_end, None, frozenset())}
    start = StreamCut("s/t", {B: b_start, C: c_start})
    end = plan_end(start, views, Budget(max_bytes=max_bytes), measure)
    return end.positions[B], end.positions[C]


# --- The reader group's assignment and rebalancing ------------------------------------------------


def _group(held: list[int], unassigned: int) -> ReaderGroupState:
    """A group of ``len(held)`` online readers ``r0``, ``r1``... holding that many segments each (no
    lag reported), and ``unassigned`` segments nobody holds."""
    config = ReaderGroupConfig(["s/t"])
    readers = {f"r{i}": ReaderInfo(0, 0.0) for i in range(len(held))}
    names = iter(f"s/t/{n}" for n in range(sum(held) + unassigned))
    assigned = {f"r{i}": {next(names): 0 for _ in range(count)} for i, count in enumerate(held)}
    free = {name: 0 for name in names}
    return ReaderGroupState(config, 0, readers, assigned, free, {}, {}, {}, {}, (), 0)


def acquire_share(held: list[int], unassigned: int) -> int:
    """A reader (the first) takes at least one unassigned segment when any is left, never more than
    there are, and no more than its part of them or what brings it up to the even share.

    pre: 1 <= len(held) <= 3 and all(0 <= h <= 3 for h in held)
    pre: 0 <= unassigned <= 4
    post: 0 <= __return__ <= unassigned
    post: unassigned == 0 or __return__ >= 1
    post: __return__ <= max(1, unassigned // len(held), -(-(sum(held) + unassigned) // len(held)) - held[0])
    """
    return _group(held, unassigned).segments_to_acquire("r0")


def release_only_when_heavier(held: list[int], unassigned: int) -> bool:
    """A reader (the first) releases a segment only when it holds more than one and more than the
    least loaded reader by more than max(1, unassigned segments); so the least loaded never does.

    pre: 1 <= len(held) <= 3 and all(0 <= h <= 4 for h in held)
    pre: 0 <= unassigned <= 2
    post: __return__ == (held[0] > 1 and held[0] > min(held) + max(1, unassigned))
    """
    return _group(held, unassigned).should_release("r0")
