"""Tracing: the write path reports its steps in the vocabulary of ``spec/DurableLog.tla``.

The ``OperationProcessor`` (built with ``tracing=True``) returns each step it takes as a ``Trace``
instruction; ``DurableLog`` passes it to its tracer.  A tracer is any callable
``tracer(action, **fields)``.  The actions and their fields:

==============  =========================================================================
``Submit``      ``kind``, ``segment``, ``source``, ``length``, ``offset`` -- an operation
                entered the processing queue (``offset``: expected or truncation offset)
``Process``     ``error`` (the error class name, or None), ``sequence_number``,
                ``offset`` (assigned), ``size`` (serialized record bytes) -- the head of the
                queue was validated and serialized (frames it filled were sealed with it)
``SealFrame``   ``frame`` -- a partly filled frame was sealed and handed to Tier 1
``Persist``     ``frame`` -- Tier 1 made the frame durable (learnt from its completion)
``Complete``    ``frame``, ``acked`` -- the frame's completion notice arrived; ``acked`` lists
                the sequence numbers of the operations it acknowledged (none if late)
``FailWrite``   ``frame`` -- a Tier-1 write failed; the container stops
``Recover``     ``frames`` -- recovery replayed the log (``frames`` records read)
==============  =========================================================================

The ``StorageWriter``'s ``tracer`` attribute (None unless a test sets it) reports the steps of
``spec/ContainerFailover.tla`` it takes, once it runs (not what recovery replays):

==============  =========================================================================
``Committed``   ``operation`` -- an operation committed (one call per operation, in log order)
``WriteChunk``  ``segment_id``, ``chunk``, ``offset`` (segment offset), ``data`` -- a flush's
                bytes landed in Tier 2 (its record is not committed yet)
``Truncate``    ``checkpoint`` -- the log was truncated below this checkpoint
==============  =========================================================================

Tests record traces to drive the model in lockstep and to check the implementation against the
spec with TLC (``tests/trace``).  In production the tracer is None and costs one comparison.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Tracer"]


class Tracer(Protocol):
    def __call__(self, action: str, /, **fields: object) -> None: ...
