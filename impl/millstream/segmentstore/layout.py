"""A segment's layout in long-term storage: which chunk holds which of its bytes.

Theory of operation.  A segment's bytes that reached Tier 2 are described by *spans*: "segment bytes
``[offset, offset + length)`` are bytes ``[chunk_offset, chunk_offset + length)`` of chunk
``chunk``".  A segment's spans are a tuple sorted by offset, never overlapping.  They need not be
contiguous: a merge relinks the source's spans into the target at once (no bytes are copied), while
the target's own tail below the merge point may still be waiting for its flush -- a *gap* the
StorageWriter fills later.  Bytes that no span covers are still in memory (the cache never evicts
them), so every byte of a segment is always readable from one tier or the other.

The layout is container metadata and changes only through operations in the durable log (a flush
adds a span, a merge relinks, a truncation drops spans wholly below the new start, a delete drops
them all), so it is fenced with the log and recovered by replay like every other piece of metadata.
Spans are immutable and tuples are shared between metadata versions.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import attrs

__all__ = ["ChunkSpan", "Spans", "add_span", "chunk_names", "covered_end", "drop_below", "find_span", "first_gap",
           "is_covered", "overlaps", "shifted", "uncovered_bytes"]

Spans = tuple["ChunkSpan", ...]


@attrs.frozen(slots=True)
class ChunkSpan:
    """Segment bytes ``[offset, end)`` live in ``chunk`` from byte ``chunk_offset``."""

    offset: int
    length: int
    chunk: str
    chunk_offset: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def _starts(spans: Spans) -> list[int]:
    return [span.offset for span in spans]


def find_span(spans: Spans, offset: int) -> ChunkSpan | None:
    """The span holding segment byte ``offset``, or None."""
    index = bisect.bisect_right(_starts(spans), offset) - 1
    if index >= 0 and spans[index].offset <= offset < spans[index].end:
        return spans[index]
    return None


def overlaps(spans: Spans, offset: int, end: int) -> bool:
    """Whether any span holds a byte of ``[offset, end)``."""
    return any(span.offset < end and offset < span.end for span in spans)


def add_span(spans: Spans, new: ChunkSpan) -> Spans:
    """``spans`` with ``new`` added (the caller checked it overlaps nothing); a span that continues its
    left neighbour in the same chunk is joined to it, so a chunk grown by many flushes stays one span."""
    index = bisect.bisect_right(_starts(spans), new.offset)
    if index > 0:
        left = spans[index - 1]
        if left.chunk == new.chunk and left.end == new.offset and left.chunk_offset + left.length == new.chunk_offset:
            joined = ChunkSpan(left.offset, left.length + new.length, left.chunk, left.chunk_offset)
            return (*spans[:index - 1], joined, *spans[index:])
    return (*spans[:index], new, *spans[index:])


def drop_below(spans: Spans, offset: int) -> Spans:
    """The spans that still hold a byte at or above ``offset`` (a truncation)."""
    return tuple(span for span in spans if span.end > offset)


def shifted(spans: Spans, delta: int) -> Spans:
    """``spans`` moved ``delta`` bytes up (a merge relinks the source's spans into the target)."""
    return tuple(ChunkSpan(span.offset + delta, span.length, span.chunk, span.chunk_offset) for span in spans)


def covered_end(spans: Spans, offset: int) -> int:
    """The end of the run of bytes from ``offset`` that spans cover without a gap (``offset`` if none)."""
    for span in spans:
        if span.end <= offset:
            continue
        if span.offset > offset:
            break
        offset = span.end
    return offset


def is_covered(spans: Spans, offset: int, end: int) -> bool:
    """Whether spans cover every byte of ``[offset, end)``."""
    return covered_end(spans, offset) >= end


def first_gap(spans: Spans, offset: int, end: int) -> tuple[int, int] | None:
    """The first run of bytes in ``[offset, end)`` no span covers, as ``(start, stop)``, or None."""
    start = covered_end(spans, offset)
    if start >= end:
        return None
    stop = end
    for span in spans:
        if span.offset >= start:
            stop = min(stop, span.offset)
            break
    return start, stop


def uncovered_bytes(spans: Spans, offset: int, end: int) -> int:
    """How many bytes of ``[offset, end)`` no span covers."""
    covered = sum(max(0, min(span.end, end) - max(span.offset, offset)) for span in spans)
    return max(0, end - offset) - covered


def chunk_names(spans: Spans) -> Iterator[str]:
    return (span.chunk for span in spans)
