"""The OperationProcessor's queue bound (``queue_full``, the executor's backpressure signal), driven
directly: it holds exactly while the queue holds ``queue_length_max`` operations or
``queue_bytes_max`` bytes, whatever the order of submits, processing and stopping.  (The processor
keeps it as an attribute, updated by the actions, rather than computing it on every append.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from millstream.errors import ObjectClosedError
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import OperationProcessor
from millstream.segmentstore.operations import StreamSegmentAppendOperation, StreamSegmentMapOperation

LENGTH_MAX = 5
BYTES_MAX = 300


def _processor() -> OperationProcessor:
    processor = OperationProcessor(ContainerMetadata(0), queue_length_max=LENGTH_MAX, queue_bytes_max=BYTES_MAX)
    processor.recover(1, 1, 0, found_checkpoint=True)
    create = StreamSegmentMapOperation("s")
    create.segment_name = "s"
    processor.submit(create)
    processor.process()
    return processor


def _append(size: int) -> StreamSegmentAppendOperation:
    operation = StreamSegmentAppendOperation(-1, bytes(size))
    operation.segment_name = "s"
    return operation


@given(st.lists(st.one_of(st.integers(0, 200).map(lambda size: ("submit", size)),
                          st.just(("process", 0)), st.just(("seal", 0))), max_size=40),
       st.booleans())
def test_queue_full_holds_exactly_while_a_bound_is_reached(steps: list[tuple[str, int]], stop: bool) -> None:
    processor = _processor()
    queued: list[int] = []
    for action, size in steps:
        if action == "submit":
            processor.submit(_append(size))
            queued.append(size)
        elif action == "process" and queued:
            processor.process()
            queued.pop(0)
        elif action == "seal":
            processor.seal_frame()
        assert processor.queue_full == (len(queued) >= LENGTH_MAX or sum(queued) >= BYTES_MAX), (steps, queued)
    if stop:
        processor.stop(ObjectClosedError("shutting down"))
        assert not processor.queue_full


def test_a_queued_checkpoint_counts_against_the_length_bound() -> None:
    processor = _processor()
    for _ in range(LENGTH_MAX - 1):
        processor.submit(_append(1))
    assert not processor.queue_full
    processor.queue_checkpoint()
    assert processor.queue_full
    processor.process()
    assert not processor.queue_full
