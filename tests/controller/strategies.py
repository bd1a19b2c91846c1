"""Hypothesis strategies for the controller's pure code: random stream histories and cuts along them."""

from __future__ import annotations

from hypothesis import strategies as st

from millstream.controller import EpochRecord, StreamHistory, initial_epoch, next_epoch, split_range

#: Every sealed segment of a drawn history is this long (offsets in drawn cuts stay within it).
SEALED_LENGTH = 100


@st.composite
def histories(draw: st.DrawFn, max_scales: int = 8) -> StreamHistory:
    """A stream history from 1-4 initial segments and a few random splits and merges."""
    epochs = [initial_epoch(draw(st.integers(1, 4)), 0.0)]
    next_number = len(epochs[0].segments)
    for _ in range(draw(st.integers(0, max_scales))):
        current = epochs[-1]
        segments = current.segments
        if draw(st.booleans()) or len(segments) < 2:
            target = segments[draw(st.integers(0, len(segments) - 1))]
            seal = [target.segment_id]
            ranges = split_range(target.key_start, target.key_end, draw(st.integers(2, 3)))
        else:
            first = draw(st.integers(0, len(segments) - 2))
            count = draw(st.integers(2, min(3, len(segments) - first)))
            chosen = segments[first:first + count]
            seal, ranges = [s.segment_id for s in chosen], [(chosen[0].key_start, chosen[-1].key_end)]
        epoch, created = next_epoch(current, seal, ranges, next_number, float(len(epochs)))
        next_number += len(created)
        epochs.append(epoch)
    return StreamHistory(epochs)


def components(before: EpochRecord, after: EpochRecord) -> list[tuple[set[int], set[int]]]:
    """The scale from ``before`` to ``after`` as groups (sealed ids, created ids) whose keys are the same."""
    sealed = [s for s in before.segments if s.segment_id not in after.segment_ids()]
    created = [s for s in after.segments if s.segment_id not in before.segment_ids()]
    groups: list[tuple[set[int], set[int]]] = []
    for segment in sealed:
        touching = [g for g in groups if any(c in g[1] for c in
                                              (x.segment_id for x in created
                                               if x.key_start < segment.key_end and segment.key_start < x.key_end))]
        merged_sealed = {segment.segment_id}.union(*(g[0] for g in touching))
        merged_created = {x.segment_id for x in created
                          if x.key_start < segment.key_end and segment.key_start < x.key_end}.union(
            *(g[1] for g in touching))
        groups = [g for g in groups if g not in touching] + [(merged_sealed, merged_created)]
    return groups


@st.composite
def advancing_cuts(draw: st.DrawFn, history: StreamHistory, count: int = 3) -> list[dict[int, int]]:
    """``count`` cuts, each at or after the one before: start at the first epoch, then repeatedly move
    offsets forward or replace a whole scale group by its successors (as readers progress)."""
    cut = {s.segment_id: draw(st.integers(0, SEALED_LENGTH)) for s in history.epochs[0].segments}
    cuts = [dict(cut)]
    transitions = [components(a, b) for a, b in zip(history.epochs, history.epochs[1:], strict=False)]
    for _ in range(count - 1):
        for _step in range(draw(st.integers(0, 6))):
            ready = [(sealed, created) for groups in transitions for sealed, created in groups
                     if sealed <= set(cut)]
            if ready and draw(st.booleans()):
                sealed, created = ready[draw(st.integers(0, len(ready) - 1))]
                for identifier in sealed:
                    del cut[identifier]
                for identifier in created:
                    cut[identifier] = draw(st.integers(0, SEALED_LENGTH))
            else:
                identifier = draw(st.sampled_from(sorted(cut)))
                cut[identifier] = draw(st.integers(cut[identifier], SEALED_LENGTH))
        cuts.append(dict(cut))
    return cuts


def sealed_lengths(history: StreamHistory) -> dict[int, int]:
    return {s.segment_id: SEALED_LENGTH for s in history.segments() if not history.is_current(s.segment_id)}
