"""Contracts that CrossHair checks (``crosshair check --analysis_kind PEP316 proofs.contracts``).

Each function states, as pre- and postconditions, a property of a pure helper of the
implementation.  CrossHair searches symbolically for inputs that satisfy the preconditions and break
a postcondition.  Loop-free code is *confirmed over all paths*; code with loops or C helpers
(``zlib``, ``struct``) gets a bounded search -- "no counterexample found within the budget".

The batching delay's own contracts live in its docstring (``millstream.segmentstore.throttler``).
"""

from __future__ import annotations

from crosshair import deep_realize

from millstream.errors import BadAttributeUpdateError
from millstream.model.frozen_map import FrozenMap
from millstream.model.segment import apply_attribute_updates
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.segmentstore.data_frame import DataFrameBuilder, DataFrameReader, SealedFrame
from millstream.segmentstore.durable_data_log import LogAddress, LogRecord
from millstream.segmentstore.metadata import attribute_update_values

__all__ = ["attribute_rules_agree", "frame_round_trip"]


def frame_round_trip(records: list[bytes], frame_bytes_max: int) -> list[bytes]:
    """Records packed into frames and read back come out whole, in order.

    pre: 24 <= frame_bytes_max <= 96
    pre: len(records) <= 4
    pre: all(0 < len(r) <= 200 for r in records)
    post: __return__ == records
    """
    # The builder writes headers into its buffer with struct.pack_into, which needs a concrete buffer:
    # the record bytes are made concrete here, their lengths and the frame size stay symbolic.
    records = [deep_realize(record) for record in records]
    frames: list[SealedFrame] = []
    builder = DataFrameBuilder(frame_bytes_max, frames.append)
    for sequence_number, record in enumerate(records, start=1):
        if builder.append(sequence_number, record):
            builder.flush()
    builder.flush()
    log = [LogRecord(LogAddress(i + 1), bytes(frame.data)) for i, frame in enumerate(frames)]
    assert all(len(frame.data) <= frame_bytes_max for frame in frames)
    return [bytes(record.data) for record in DataFrameReader(log)]


def attribute_rules_agree(kinds: list[int], values: list[int], comparisons: list[int], start: int) -> bool:
    """The implementation's attribute update rules equal the model's, on one attribute.

    pre: len(kinds) == len(values) == len(comparisons) <= 3
    pre: all(0 <= k <= 4 for k in kinds)
    pre: all(-4 <= v <= 4 for v in values + comparisons + [start])
    post: __return__
    """
    updates = [AttributeUpdate(7, AttributeUpdateType(k), v, c)
               for k, v, c in zip(kinds, values, comparisons, strict=True)]
    current = FrozenMap({7: start}) if start != NULL_ATTRIBUTE_VALUE else FrozenMap()
    try:
        expected = apply_attribute_updates(current, updates).get(7, NULL_ATTRIBUTE_VALUE)
    except BadAttributeUpdateError:
        expected = None
    try:
        changes = attribute_update_values(lambda key: current.get(key, NULL_ATTRIBUTE_VALUE), updates)
        actual = changes.get(7, current.get(7, NULL_ATTRIBUTE_VALUE))
    except BadAttributeUpdateError:
        actual = None
    return expected == actual
