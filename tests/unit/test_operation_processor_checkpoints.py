"""When the OperationProcessor queues its own metadata checkpoints, driven directly: one at a time.
A queued checkpoint is remembered until a completion notice commits it, so the notices of frames
written before it was processed do not let a second one be queued behind it.  (A mutation run found
that nothing pinned this: forgetting the queued checkpoint at any notice queued checkpoints twice as
often, lost nothing, and no test noticed.)"""

from __future__ import annotations

from millstream.errors import BadOffsetError
from millstream.segmentstore.durable_data_log import LogAddress
from millstream.segmentstore.metadata import ContainerMetadata
from millstream.segmentstore.operation_processor import Acknowledge, OperationProcessor, Reject, Trace, WriteFrame
from millstream.segmentstore.operations import (
    MetadataCheckpointOperation,
    StorageFlushOperation,
    StreamSegmentAppendOperation,
    StreamSegmentMapOperation,
    StreamSegmentTruncateOperation,
)


def _processor() -> OperationProcessor:
    """A recovered processor that queues a checkpoint after every committed frame."""
    processor = OperationProcessor(ContainerMetadata(0), checkpoint_frame_count=1)
    processor.recover(1, 1, 0, found_checkpoint=True)
    create = StreamSegmentMapOperation("s")
    create.segment_name = "s"
    processor.submit(create)
    processor.process()
    return processor


def _write_one_append(processor: OperationProcessor) -> int:
    """Submit, process and seal one append; the number of the frame it went out in."""
    append = StreamSegmentAppendOperation(-1, b"x")
    append.segment_name = "s"
    processor.submit(append)
    processor.process()
    (frame,) = [i for i in processor.seal_frame() if isinstance(i, WriteFrame)]
    return frame.frame_number


def _queued_checkpoints(processor: OperationProcessor) -> int:
    return sum(isinstance(operation, MetadataCheckpointOperation) for operation in processor.queue)


def test_notices_of_frames_before_a_queued_checkpoint_do_not_queue_another() -> None:
    processor = _processor()
    first, second, third = (_write_one_append(processor) for _ in range(3))
    processor.complete(first, LogAddress(first))
    assert _queued_checkpoints(processor) == 1  # one committed frame: a checkpoint is due
    processor.complete(second, LogAddress(second))  # (the checkpoint is still queued, unprocessed)
    processor.complete(third, LogAddress(third))
    assert _queued_checkpoints(processor) == 1


def test_the_next_checkpoint_is_queued_once_the_last_one_committed() -> None:
    processor = _processor()
    first = _write_one_append(processor)
    processor.complete(first, LogAddress(first))
    assert _queued_checkpoints(processor) == 1
    processor.process()  # the checkpoint gets its sequence number and goes into a frame
    (frame,) = [i for i in processor.seal_frame() if isinstance(i, WriteFrame)]
    later = _write_one_append(processor)
    assert _queued_checkpoints(processor) == 0
    processor.complete(frame.frame_number, LogAddress(frame.frame_number))  # commits the checkpoint
    processor.complete(later, LogAddress(later))  # a frame after it: the next one is due
    assert _queued_checkpoints(processor) == 1


def test_a_checkpoint_sealed_before_the_notice_of_the_frame_before_it_gets_that_frames_address() -> None:
    """Frames 1 to 3 written, 1's notice arrives (a checkpoint is due), the checkpoint goes out in frame
    4 before the notices of 2 and 3: its truncation address is the one frame 3's notice brings -- the
    log may be cut before the checkpoint's frame, never after it.  Kills ``_awaiting_address[number -
    1]`` -> ``[number + 1]`` in ``_on_frame_sealed`` (the address was awaited from frame 5, whose cut
    would drop the checkpoint itself)."""
    processor = _processor()
    first, second, third = (_write_one_append(processor) for _ in range(3))
    processor.complete(first, LogAddress(first))
    (checkpoint,) = [op for op in processor.queue if isinstance(op, MetadataCheckpointOperation)]
    processor.process()
    (frame,) = [i for i in processor.seal_frame() if isinstance(i, WriteFrame)]
    assert frame.frame_number == third + 1 and checkpoint.truncation_address is None
    processor.complete(second, LogAddress(second))
    assert checkpoint.truncation_address is None
    processor.complete(third, LogAddress(third))
    assert checkpoint.truncation_address == LogAddress(third)


def test_a_truncation_at_the_start_offset_or_the_length_is_accepted_and_one_beyond_is_not() -> None:
    """The truncation offset may be anything in ``[start_offset, length]``: at the current start (a
    truncation that moves nothing, as a retried request is) and at the length are accepted.  Kills
    ``start_offset <= offset`` -> ``<`` in the metadata transaction's check (a truncation at the start
    was refused as a bad offset)."""
    processor = _processor()
    _write_one_append(processor)
    for offset, accepted in ((0, True), (0, True), (1, True), (2, False), (0, False)):
        truncate = StreamSegmentTruncateOperation(-1, offset)
        truncate.segment_name = "s"
        processor.submit(truncate)
        outcome = processor.process()
        rejected = [i for i in outcome if isinstance(i, Reject)]
        assert not rejected if accepted else isinstance(rejected[0].error, BadOffsetError), (offset, outcome)


def _late_notice_instructions(tracing: bool) -> list[object]:
    """Two frames written; the second's notice commits both; what the first's (late) notice returns."""
    processor = OperationProcessor(ContainerMetadata(0), tracing=tracing)
    processor.recover(1, 1, 0, found_checkpoint=True)
    create = StreamSegmentMapOperation("s")
    create.segment_name = "s"
    processor.submit(create)
    processor.process()
    first, second = _write_one_append(processor), _write_one_append(processor)
    committed = processor.complete(second, LogAddress(second))
    assert any(isinstance(i, Acknowledge) for i in committed)  # (both frames' operations are acknowledged)
    return list(processor.complete(first, LogAddress(first)))


def test_a_late_completion_notice_is_traced_only_when_tracing() -> None:
    """A notice of a frame a later notice committed already acknowledges nothing.  With tracing it is
    still the spec's ``Complete`` step (acking nothing), so the trace has a record per notice; without,
    the processor emits no ``Trace`` instruction at all (``Trace`` is produced only when tracing).
    Kills ``if self._tracing:`` -> ``if not self._tracing:`` on the late-notice branch of ``complete``."""
    assert _late_notice_instructions(tracing=False) == []
    assert _late_notice_instructions(tracing=True) == [Trace("Complete", {"frame": 1, "acked": []})]


def _bytes_processor(checkpoint_frame_bytes: int) -> OperationProcessor:
    """A recovered processor that queues a checkpoint only by bytes committed (never by frame count)."""
    processor = OperationProcessor(ContainerMetadata(0), checkpoint_frame_count=1_000,
                                   checkpoint_frame_bytes=checkpoint_frame_bytes)
    processor.recover(1, 1, 0, found_checkpoint=True)
    create = StreamSegmentMapOperation("s")
    create.segment_name = "s"
    processor.submit(create)
    processor.process()
    return processor


def test_a_checkpoint_is_due_once_exactly_its_bytes_were_committed() -> None:
    """``checkpoint_frame_bytes`` is reached, not only passed, by a frame of exactly that many bytes: its
    notice queues a checkpoint; with one byte more to go it does not.  Kills ``_bytes_since_checkpoint >=
    _checkpoint_frame_bytes`` -> ``>`` (seed-2711 sample: a checkpoint came one frame late)."""
    probe = _bytes_processor(1 << 40)
    append = StreamSegmentAppendOperation(-1, b"x")
    append.segment_name = "s"
    probe.submit(append)
    probe.process()
    (written,) = [i for i in probe.seal_frame() if isinstance(i, WriteFrame)]
    length = len(written.data)
    for threshold, queued in ((length, 1), (length + 1, 0)):
        processor = _bytes_processor(threshold)
        frame = _write_one_append(processor)
        processor.complete(frame, LogAddress(frame))
        assert _queued_checkpoints(processor) == queued, (threshold, length)


def test_a_tier_2_flush_of_no_bytes_is_refused_and_one_of_a_byte_is_not() -> None:
    """A flush record covers at least one byte: ``length`` 0 (a layout entry that names nothing) is
    refused as a bad offset, as a negative one is; ``length`` 1 of a segment of one byte is recorded.
    Kills ``operation.length <= 0`` -> ``<= -1`` in the metadata transaction's check (seed-2711 sample:
    an empty flush was recorded)."""
    processor = _processor()
    _write_one_append(processor)
    segment = processor.peek("s")
    assert segment is not None
    segment_id = segment.id
    for length, accepted in ((0, False), (-1, False), (1, True)):
        flush = StorageFlushOperation(segment_id, 0, length, "chunk-1", 0)
        processor.submit(flush)
        outcome = processor.process()
        rejected = [i for i in outcome if isinstance(i, Reject)]
        assert not rejected if accepted else isinstance(rejected[0].error, BadOffsetError), (length, outcome)
