"""Contracts that CrossHair checks on streams' pure helpers: the writer's event headers, blocks,
a new stream's key ranges, stream names and cuts, Spark offsets, the transaction pinger.

``crosshair check --analysis_kind PEP316 --report_all proofs.contracts_streams`` reports each
postcondition as "Confirmed over all paths" or "Not confirmed" (bounded: no counterexample within
the budget).  The seeded bug each one was shown to find is listed in ``proofs/test_contracts.py``.
"""

from __future__ import annotations

from crosshair import deep_realize

from millstream.client._routing import KeySpaceRouter
from millstream.client._segment_writer_state import _event_header
from millstream.client._transactions import ping_interval_seconds
from millstream.controller._epochs import check_cover, initial_epoch, split_range
from millstream.errors import MalformedEventError
from millstream.spark._offsets import cut_of, offset_json, offset_of
from millstream.values import StreamCut
from millstream.wire.codec import count_events, encode_event

__all__ = [
    "cover_with_a_gap", "first_epoch", "header_of_writer_event", "ping_interval", "spark_offset_round_trip",
    "static_router_owner", "truncated_block_rejected",
]


def header_of_writer_event(length: int) -> bytes:
    """The writer's event header is the codec's: 8 bytes, type 0, the payload's length.

    pre: 0 <= length <= 64
    post: len(__return__) == 8
    post: __return__ == encode_event(bytes(length))[:8]
    """
    return _event_header(length)


def truncated_block_rejected(payloads: list[bytes], cut: int) -> bool:
    """A block whose last event is cut short (by ``cut`` bytes) is refused whole, not read in part.

    pre: 1 <= len(payloads) <= 2
    pre: all(len(p) <= 6 for p in payloads)
    pre: 0 < cut < len(payloads[-1]) + 8
    post: __return__
    """
    block = b"".join(encode_event(payload) for payload in deep_realize(payloads))
    try:
        count_events(block[:len(block) - cut])
    except MalformedEventError:
        return True
    return False


def first_epoch(segment_count: int) -> int:
    """A new stream's first epoch: ``segment_count`` segments covering the key space exactly once.

    pre: 1 <= segment_count <= 4
    post: __return__ == segment_count
    """
    epoch = initial_epoch(segment_count, 0.0)
    assert check_cover((s.key_start, s.key_end) for s in epoch.segments)
    return len(epoch.segments)


def cover_with_a_gap(parts: int, missing: int) -> bool:
    """Ranges that leave a gap (one piece of a split removed) are not a cover.

    pre: 2 <= parts <= 4
    pre: 0 <= missing < parts
    post: not __return__
    """
    pieces = split_range(0.0, 1.0, parts)
    return check_cover(pieces[:missing] + pieces[missing + 1:])


def spark_offset_round_trip(positions: dict[int, int]) -> tuple[str, dict[int, int]]:
    """A stream cut written as a Spark offset (JSON) reads back as the same cut (its stream and
    positions, returned as plain values for CrossHair to report).

    pre: 1 <= len(positions) <= 3
    pre: all(0 <= k < 2**40 and 0 <= v < 2**40 for k, v in positions.items())
    post: __return__ == ("scope/stream", positions)
    """
    cut = StreamCut("scope/stream", deep_realize(positions))
    read = cut_of(offset_json(offset_of(cut)), "scope/stream")
    return read.stream, dict(read.positions)


def ping_interval(lease_seconds: int) -> float:
    """The pinger renews a lease at least three times per lease, and never busy-loops.

    pre: 1 <= lease_seconds <= 3600
    post: 0 < __return__
    post: 3 * __return__ <= lease_seconds
    """
    return ping_interval_seconds(lease_seconds)


def static_router_owner(count: int, numerator: int, denominator: int) -> int:
    """With ``count`` segments in equal slices, the point numerator/denominator goes to the segment
    whose slice [i/count, (i+1)/count) holds it.

    pre: 1 <= count <= 4
    pre: 0 <= numerator < denominator <= 16
    post: __return__ * denominator <= numerator * count < (__return__ + 1) * denominator
    """
    names = [f"scope/stream/{index}" for index in range(count)]
    return names.index(KeySpaceRouter(names).segment_for_fraction(numerator / denominator))
