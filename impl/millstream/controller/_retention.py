"""Retention: where to truncate a stream, given its policy (pure).

Theory of operation.  The controller records each stream's tail cut periodically, with its time
(``RecordedCut``).  Size- and time-based retention truncate only at recorded cuts, so what they keep
is never less than the limit and at most one recording interval more:

* by time (limit L seconds): the newest recorded cut made at or before ``now - L``;
* by size (limit L bytes): the newest recorded cut with at least L bytes between it and the tail
  (sizes from ``_cuts.cut_size``);
* by consumption: the lower bound of the subscriber cuts of every reader group that subscribes to
  the stream (``_cuts.lower_bound``) -- and nothing while a subscriber has not reported a cut yet,
  since it may still need everything.

A choice is made only if it lies strictly after the current head (truncation never goes back) and
its segments are still retained; otherwise nothing is truncated this time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from millstream.controller._cuts import cut_size, is_at_or_after, lower_bound
from millstream.controller._epochs import StreamHistory
from millstream.controller._state import RecordedCut
from millstream.values import RetentionPolicy

__all__ = ["choose_truncation"]

Cut = Mapping[int, int]


def _usable(history: StreamHistory, cut: Cut, head: Cut) -> bool:
    return (all(history.segment(identifier) is not None for identifier in cut) and dict(cut) != dict(head)
            and is_at_or_after(history, cut, head))


def choose_truncation(policy: RetentionPolicy, *, history: StreamHistory, head: Cut, tail: Cut,
                      recorded: Sequence[RecordedCut], sealed_lengths: Mapping[int, int], now: float,
                      subscriber_cuts: Sequence[Cut | None] = ()) -> dict[int, int] | None:
    """The cut to truncate the stream at under ``policy``, or None.  ``subscriber_cuts``: one entry
    per subscribing reader group (None for a group that has not reported one)."""
    if policy.kind == "none":
        return None
    if policy.kind == "consumption":
        if not subscriber_cuts or any(cut is None for cut in subscriber_cuts):
            return None
        usable = [c for c in subscriber_cuts if c is not None and all(history.segment(i) is not None for i in c)]
        if not usable:
            return None
        bound = lower_bound(history, usable, sealed_lengths)
        return bound if _usable(history, bound, head) else None
    candidates: list[RecordedCut] = []
    if policy.kind == "time":
        candidates = [c for c in recorded if c.time <= now - policy.limit]
    elif policy.kind == "size":
        tail_size = cut_size(history, tail, sealed_lengths)
        candidates = [c for c in recorded if all(history.segment(i) is not None for i in c.cut)
                      and tail_size - cut_size(history, c.cut, sealed_lengths) >= policy.limit]
    for candidate in sorted(candidates, key=lambda c: c.time, reverse=True):
        if _usable(history, candidate.cut, head):
            return dict(candidate.cut)
    return None
