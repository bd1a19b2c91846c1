"""More contracts that CrossHair checks: the wire codec, event framing, key ranges, leases, batching.

``crosshair check --analysis_kind PEP316 --report_all proofs.contracts_pure`` reports each
postcondition as "Confirmed over all paths" (CrossHair exhausted the paths: loop-free integer
code) or "Not confirmed" (a bounded search found no counterexample within the budget).

Each function states a property of one pure helper of the implementation; the seeded bug each one
was shown to find when it was written is listed in ``proofs/test_contracts.py``.
"""

from __future__ import annotations

from crosshair import deep_realize

from millstream.client._routing import routing_key_fraction
from millstream.controller._epochs import check_cover, key_union, overlaps, split_range
from millstream.controller._transactions import _max_execution_seconds, lease_deadline  # noqa: F401 (conditions)
from millstream.errors import (
    IncompatibleVersionError,
    InvalidArgumentError,
    MalformedFrameError,
)
from millstream.model.types import (  # INT64_*: named by the conditions in docstrings
    INT64_MAX,  # noqa: F401
    INT64_MIN,  # noqa: F401
    NULL_ATTRIBUTE_VALUE,
    AttributeUpdate,
    AttributeUpdateType,
)
from millstream.segmentstore.metadata import attribute_update_values, updated_attribute_value
from millstream.segmentstore.throttler import batching_delay_seconds
from millstream.wire.codec import (
    count_events,
    decode_offsets,
    encode_event,
    encode_offsets,
    iter_events,
    negotiate,
    negotiation_outcome,
)

__all__ = [
    "accumulate_adds", "accumulate_refuses_overflow", "accumulate_twice_sees_first",
    "batching_delay_never_grows_with_fill", "cover_of_split", "disjoint_versions_rejected",
    "empty_own_range_is_the_callers_fault", "event_framing_round_trip", "key_union_of_ranges",
    "lease_deadline_bounds", "negotiated_version", "none_sets_only_absent", "offsets_round_trip", "overlap_of_ranges",
    "overlapping_ranges_rejected", "replace_if_equals_accepts", "replace_if_equals_compares",
    "replace_if_greater_accepts", "replace_if_greater_only_raises", "replace_sets", "routing_fraction_in_key_space",
    "split_of_range", "unordered_offsets_rejected",
]


# --- Wire codec -----------------------------------------------------------------------------------


def negotiated_version(ours_high: int, ours_low: int, theirs_high: int, theirs_low: int) -> int:
    """Two overlapping version ranges agree on the newest version both speak.

    pre: ours_low <= ours_high and theirs_low <= theirs_high
    pre: max(ours_low, theirs_low) <= min(ours_high, theirs_high)
    post: ours_low <= __return__ <= ours_high
    post: theirs_low <= __return__ <= theirs_high
    post: __return__ >= min(ours_high, theirs_high)
    """
    return negotiate(ours_high, ours_low, theirs_high, theirs_low)


def disjoint_versions_rejected(ours_high: int, ours_low: int, theirs_high: int, theirs_low: int) -> bool:
    """Version ranges that share no version are refused as incompatible (``negotiate``'s core, which
    formats no message: the refusal's message would make the versions concrete).

    pre: ours_low <= ours_high and theirs_low <= theirs_high
    pre: max(ours_low, theirs_low) > min(ours_high, theirs_high)
    post: __return__
    """
    return negotiation_outcome(ours_high, ours_low, theirs_high, theirs_low) is IncompatibleVersionError


def offsets_round_trip(offsets: list[int]) -> tuple[int, ...]:
    """A list of event boundaries (non-negative, ascending) encodes and decodes to itself.

    pre: len(offsets) <= 3
    pre: all(0 <= offset < 1 << 63 for offset in offsets)
    pre: all(a < b for a, b in zip(offsets, offsets[1:]))
    post: __return__ == tuple(offsets)
    """
    return decode_offsets(encode_offsets(offsets))


def unordered_offsets_rejected(offsets: list[int]) -> bool:
    """A list of offsets that does not strictly ascend is refused when decoded.

    pre: 2 <= len(offsets) <= 3
    pre: all(0 <= offset < 1 << 63 for offset in offsets)
    pre: any(a >= b for a, b in zip(offsets, offsets[1:]))
    post: __return__
    """
    try:
        decode_offsets(encode_offsets(offsets))
    except MalformedFrameError:
        return True
    return False


def event_framing_round_trip(payloads: list[bytes]) -> tuple[list[bytes], list[bytes], int, int]:
    """Events framed one after another come back whole, in order, counted exactly, 8 header bytes each.

    pre: len(payloads) <= 3
    pre: all(len(p) <= 8 for p in payloads)
    post: __return__[1] == __return__[0]
    post: __return__[2] == len(__return__[0])
    post: __return__[3] == sum(len(p) for p in __return__[0]) + 8 * len(__return__[0])
    """
    payloads = deep_realize(payloads)
    block = b"".join(encode_event(payload) for payload in payloads)
    return payloads, list(iter_events(block)), count_events(block), len(block)


def routing_fraction_in_key_space(routing_key: str) -> float:
    """Every routing key hashes into the key space [0, 1).

    pre: len(routing_key) <= 4
    post: 0.0 <= __return__ < 1.0
    """
    return routing_key_fraction(routing_key)


# --- Key ranges -------------------------------------------------------------------------------------


def overlap_of_ranges(a_start: int, a_end: int, b_start: int, b_end: int) -> bool:
    """Two non-empty key ranges overlap exactly when some key lies in both; the relation is symmetric.

    pre: a_start < a_end and b_start < b_end
    post: __return__ == (max(a_start, b_start) < min(a_end, b_end))
    post: __return__ == overlaps((b_start, b_end), (a_start, a_end))
    """
    return overlaps((a_start, a_end), (b_start, b_end))


def key_union_of_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of disjoint ranges: sorted, maximal (no two touch), and covering the same keys.

    pre: len(ranges) <= 3
    pre: all(start < end for start, end in ranges)
    pre: not any(overlaps(a, b) for i, a in enumerate(ranges) for b in ranges[i + 1:])
    post: all(a[1] < b[0] for a, b in zip(__return__, __return__[1:]))
    post: sum(end - start for start, end in __return__) == sum(end - start for start, end in ranges)
    post: all(any(s <= start and end <= e for s, e in __return__) for start, end in ranges)
    """
    return [(int(start), int(end)) for start, end in key_union(ranges)]


def split_of_range(key_start: int, key_end: int, parts: int) -> list[tuple[float, float]]:
    """A split of [start, end) into parts: that many pieces, from start to end, neighbours sharing bounds.

    pre: 0 <= key_start < key_end <= 8
    pre: 1 <= parts <= 3
    post: len(__return__) == parts
    post: __return__[0][0] == key_start and __return__[-1][1] == key_end
    post: all(a[1] == b[0] for a, b in zip(__return__, __return__[1:]))
    """
    return split_range(key_start, key_end, parts)


def cover_of_split(parts: int) -> bool:
    """The key space split into equal parts (a new stream's first epoch) is covered exactly once.

    pre: 1 <= parts <= 4
    post: __return__
    """
    return check_cover(split_range(0.0, 1.0, parts))


# --- Leases and batching ----------------------------------------------------------------------------


def lease_deadline_bounds(opened: int, now: int, lease: int) -> float:
    """A renewed lease lapses at most one lease from now and never past the execution limit.

    pre: 0 <= opened <= now <= 10**6 and 0 < lease <= 10**6
    post: __return__ <= now + lease
    post: __return__ <= opened + _max_execution_seconds(lease)
    post: now + lease > opened + _max_execution_seconds(lease) or __return__ == now + lease
    """
    return lease_deadline(opened, now, lease)


def batching_delay_never_grows_with_fill(writes_in_flight: int, latency_milliseconds: int, fill_percent: int,
                                         more_percent: int, cap_milliseconds: int) -> bool:
    """Fuller blocks never wait longer: the batching delay does not grow with the fill ratio.

    pre: 0 <= fill_percent <= more_percent <= 100
    pre: cap_milliseconds >= 0
    post: __return__
    """
    latency, cap = latency_milliseconds / 1000, cap_milliseconds / 1000
    return (batching_delay_seconds(writes_in_flight, latency, more_percent / 100, cap)
            <= batching_delay_seconds(writes_in_flight, latency, fill_percent / 100, cap))


# --- Attribute updates ------------------------------------------------------------------------------


def _one_update(current: int | None, update_type: AttributeUpdateType, value: int, comparison: int) -> int | None:
    """The attribute's value after one update (``current`` None: absent), or None if it is refused:
    ``attribute_update_values``' core, which formats no refusal message (a message would make the
    values concrete; ``attribute_update_values`` itself is checked by the accepting contracts below and
    by ``proofs.contracts.attribute_rules_agree``)."""
    read = NULL_ATTRIBUTE_VALUE if current is None else current
    return updated_attribute_value(read, AttributeUpdate(7, update_type, value, comparison))


def replace_if_greater_only_raises(current: int | None, value: int) -> int | None:
    """REPLACE_IF_GREATER sets a value strictly above the current one (absent: the minimum), else is refused.

    pre: current is None or -8 <= current <= 8
    pre: -8 <= value <= 8
    post: __return__ == (value if current is None or value > current else None)
    """
    return _one_update(current, AttributeUpdateType.REPLACE_IF_GREATER, value, 0)


def replace_if_equals_compares(current: int | None, value: int, comparison: int) -> int | None:
    """REPLACE_IF_EQUALS sets the value only when the current one equals the comparison value.

    pre: current is None or -8 <= current <= 8
    pre: -8 <= value <= 8 and -8 <= comparison <= 8
    post: __return__ == (value if current == comparison else None)
    """
    return _one_update(current, AttributeUpdateType.REPLACE_IF_EQUALS, value, comparison)


def none_sets_only_absent(current: int | None, value: int) -> int | None:
    """NONE sets the value of an absent attribute and is refused for a present one.

    pre: current is None or -8 <= current <= 8
    pre: -8 <= value <= 8
    post: __return__ == (value if current is None else None)
    """
    return _one_update(current, AttributeUpdateType.NONE, value, 0)


def accumulate_adds(current: int | None, value: int) -> int | None:
    """ACCUMULATE adds the update's value to the attribute (absent counts as 0).

    pre: current is None or -8 <= current <= 8
    pre: -8 <= value <= 8
    post: __return__ == (current or 0) + value
    """
    return _one_update(current, AttributeUpdateType.ACCUMULATE, value, 0)


def accumulate_refuses_overflow(current: int, value: int) -> int | None:
    """ACCUMULATE is refused, not wrapped, when the sum leaves the signed 64-bit range.

    pre: INT64_MIN < current <= INT64_MAX
    pre: 0 < value <= INT64_MAX
    post: __return__ is None or __return__ <= INT64_MAX
    post: __return__ is None or __return__ == current + value
    """
    return _one_update(current, AttributeUpdateType.ACCUMULATE, value, 0)


# The accepting paths alone: no refusal formats a message there, so CrossHair can exhaust them.


def replace_sets(current: int, value: int) -> int:
    """REPLACE sets the value whatever the attribute holds.

    pre: -8 <= current <= 8 and -8 <= value <= 8
    post: __return__ == value
    """
    return attribute_update_values(lambda _key: current, [AttributeUpdate(7, AttributeUpdateType.REPLACE, value, 0)])[7]


def replace_if_greater_accepts(current: int, value: int) -> int:
    """REPLACE_IF_GREATER with a value above the current one sets it.

    pre: -8 <= current < value <= 8
    post: __return__ == value
    """
    update = AttributeUpdate(7, AttributeUpdateType.REPLACE_IF_GREATER, value, 0)
    return attribute_update_values(lambda _key: current, [update])[7]


def replace_if_equals_accepts(current: int, value: int) -> int:
    """REPLACE_IF_EQUALS whose comparison value is the current one sets the new value.

    pre: -8 <= current <= 8 and -8 <= value <= 8
    post: __return__ == value
    """
    update = AttributeUpdate(7, AttributeUpdateType.REPLACE_IF_EQUALS, value, current)
    return attribute_update_values(lambda _key: current, [update])[7]


def accumulate_twice_sees_first(current: int, first: int, second: int) -> int:
    """Updates apply in order, each seeing those before it: two ACCUMULATEs add both values.

    pre: -8 <= current <= 8 and -8 <= first <= 8 and -8 <= second <= 8
    post: __return__ == current + first + second
    """
    updates = [AttributeUpdate(7, AttributeUpdateType.ACCUMULATE, first, 0),
               AttributeUpdate(7, AttributeUpdateType.ACCUMULATE, second, 0)]
    return attribute_update_values(lambda _key: current, updates)[7]


def empty_own_range_is_the_callers_fault(ours_high: int, ours_low: int, theirs_high: int, theirs_low: int) -> str:
    """An empty range of our own is the caller's bug (InvalidArgumentError), never blamed on the peer
    (``negotiate``'s core).

    pre: ours_low > ours_high
    post: __return__ == "InvalidArgumentError"
    """
    outcome = negotiation_outcome(ours_high, ours_low, theirs_high, theirs_low)
    return outcome.__name__ if isinstance(outcome, type) else "accepted"


def overlapping_ranges_rejected(a_start: int, a_end: int, b_start: int, b_end: int) -> bool:
    """The union of two overlapping key ranges is refused (a scale may never give a key two owners).

    pre: a_start < a_end and b_start < b_end
    pre: max(a_start, b_start) < min(a_end, b_end)
    post: __return__
    """
    try:
        key_union([(a_start, a_end), (b_start, b_end)])
    except InvalidArgumentError:
        return True
    return False
