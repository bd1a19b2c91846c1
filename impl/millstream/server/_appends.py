"""One writer's appends on one connection, sans I/O: which block to submit, with which event-number
comparison, and which reply to send when.

Theory of operation.  After ``SetupAppend`` a writer sends blocks without waiting.  Each block is
appended as one container append whose attribute update is ``ReplaceIfEquals(writer id, new = the
block's last event number, compare = the previous block's)``, so the event number is stored
atomically with the data and a resend after a reconnect cannot be stored twice.  The comparison is
the previous block's number even while that block is still in flight: the container validates each
operation against the uncommitted effects of those queued before it, so a pipeline of blocks chains
correctly as long as the blocks reach the container in order.

They normally do (the connection starts their append tasks in arrival order, and each task queues
its append in its first step), but not always: an append that meets ingestion throttling (Tier 2
lagging) waits *before* it is queued, and a later block may overtake it.  The overtaking block's
comparison then fails.  So a block whose comparison (or conditional offset) fails while an earlier
block of the same writer was still unfinished when it was submitted is not answered: it waits for
everything before it to finish and is submitted again, comparing with the last event number really
stored, and blocks that arrive meanwhile are held behind it.  Only a failure with nothing unfinished
before it is the writer's fault (another connection wrote for the same writer id:
``InvalidEventNumber`` and the connection closes; or a conditional append found another length:
``ConditionalCheckFailed``).  Each block is re-submitted at most once per round in which the block
before it finished, so this always ends.

Replies leave in arrival order -- the order of event numbers -- whatever order the container
finishes in: ``DataAppended`` for a stored block (``previous_event_number`` the one acknowledged
before it), ``SegmentIsSealed`` for a block that met a sealed segment and for every later block of
the writer (the writer stops sending there), ``NoSuchSegment`` likewise for a segment that was
deleted under the writer, ``ConditionalCheckFailed`` for a conditional append that found another
length.

Lifecycle of a block (a table, ``BLOCK_TRANSITIONS``): HELD -> SUBMITTED; SUBMITTED -> DONE or
RETRY; RETRY -> SUBMITTED (or DONE when the segment turned out sealed or gone).
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from uuid import UUID

from millstream.errors import InternalError
from millstream.wire import (
    EVENT_HEADER_LENGTH,
    Command,
    ConditionalCheckFailed,
    DataAppended,
    InvalidEventNumber,
    MalformedEventError,
    NoSuchSegment,
    SegmentIsSealed,
)

__all__ = ["BLOCK_TRANSITIONS", "BlockState", "Failure", "PendingBlock", "WriterSession", "scan_events"]

_EVENT_HEADER = struct.Struct(">ii")

#: From this many events on the strided check is the faster (CPython 3.11, 100 B events: the loop
#: costs ~0.22 us per event, the eight slices ~1.0-1.3 us in all, whatever the count).
_STRIDED_COUNT_MIN = 5


def scan_events(data: bytes | memoryview) -> tuple[int, int]:
    """``(event count, longest payload)`` of a block of framed events, without copying them.

    Raises ``MalformedEventError`` unless ``data`` is exactly a sequence of whole events (the same
    rule as ``codec.count_events``).  Blocks of equally long events -- what a benchmark and most
    sensor streams send -- are checked with eight strided slices in C rather than a Python loop per
    event: every header is compared with the first, which proves the same thing the loop would."""
    view = memoryview(data)
    size = len(view)
    if size == 0:
        return 0, 0
    if size < EVENT_HEADER_LENGTH:
        raise MalformedEventError(f"{size} bytes are too few for an event header")
    type_code, length = _EVENT_HEADER.unpack_from(view, 0)
    stride = EVENT_HEADER_LENGTH + length
    if type_code == 0 and length >= 0 and size == stride:
        return 1, length  # one whole event: its header is all there is to check
    if type_code == 0 and length >= 0 and size % stride == 0 and size // stride >= _STRIDED_COUNT_MIN:
        count = size // stride
        raw = view.obj if isinstance(view.obj, bytes) and len(view.obj) == size else view.tobytes()
        for i in range(EVENT_HEADER_LENGTH):  # (a for loop: a generator in all() costs ~0.4 us more)
            if raw[i::stride] != raw[i:i + 1] * count:
                break
        else:
            return count, length
    count = position = longest = 0
    unpack = _EVENT_HEADER.unpack_from
    while position < size:
        if size - position < EVENT_HEADER_LENGTH:
            raise MalformedEventError(f"{size - position} bytes at offset {position} are too few for an event header")
        type_code, length = unpack(view, position)
        if type_code != 0:
            raise MalformedEventError(f"an event at offset {position} has type {type_code}, not 0")
        end = position + EVENT_HEADER_LENGTH + length
        if length < 0 or end > size:
            raise MalformedEventError(f"an event at offset {position} announces {length} bytes; "
                                      f"{size - position - EVENT_HEADER_LENGTH} follow")
        longest = max(longest, length)
        position = end
        count += 1
    return count, longest


class BlockState(enum.Enum):
    HELD = "held"  # waits behind a block that will be re-submitted
    SUBMITTED = "submitted"  # handed to the container, outcome unknown
    RETRY = "retry"  # its comparison failed while a block before it was unfinished: submit again
    DONE = "done"  # its reply is decided


#: state -> the states it may move to.
BLOCK_TRANSITIONS: dict[BlockState, frozenset[BlockState]] = {
    BlockState.HELD: frozenset({BlockState.SUBMITTED, BlockState.DONE}),
    BlockState.SUBMITTED: frozenset({BlockState.DONE, BlockState.RETRY}),
    BlockState.RETRY: frozenset({BlockState.SUBMITTED, BlockState.DONE}),
    BlockState.DONE: frozenset(),
}


class Failure(enum.Enum):
    """How a container append failed, as far as the writer's pipeline cares."""

    COMPARISON = "comparison"  # the event-number compare-and-set failed (BadAttributeUpdateError)
    OFFSET = "offset"  # a conditional append's expected offset was not the length (BadOffsetError)
    SEALED = "sealed"  # the segment is sealed (StreamSegmentSealedError)
    GONE = "gone"  # the segment does not exist any more (StreamSegmentNotExistsError)


class PendingBlock:
    """One block from its arrival until its reply is sent.  ``charge`` is what it counts against the
    in-flight limits (the connection releases it when the block is answered or dropped)."""

    __slots__ = ("after_unfinished", "arrived", "charge", "comparison", "data", "expected_offset",
                 "last_event_number", "raw", "reply", "request_id", "state")

    def __init__(self, request_id: int, last_event_number: int, data: bytes | memoryview,
                 expected_offset: int | None, charge: int, *, raw: bool = False) -> None:
        self.request_id = request_id
        #: Raw bytes (``ConditionalBlockEnd``): appended with no event-number compare-and-set; the
        #: expected offset alone guards them.
        self.raw = raw
        self.last_event_number = last_event_number
        self.data = data
        self.expected_offset = expected_offset
        self.charge = charge
        self.comparison = 0
        self.after_unfinished = False  # a block before it was unfinished when it was submitted
        self.state = BlockState.HELD
        self.reply: Command | None = None
        #: When it arrived, by the server's clock, if the node measures acknowledgement latency (else -1).
        self.arrived = -1.0

    def move(self, state: BlockState) -> None:
        if state not in BLOCK_TRANSITIONS[self.state]:
            raise InternalError(f"block {self.last_event_number}: no transition {self.state} -> {state}")
        self.state = state

    def __repr__(self) -> str:
        return (f"PendingBlock(request_id={self.request_id}, last_event_number={self.last_event_number}, "
                f"state={self.state.value}, comparison={self.comparison})")


class WriterSession:
    """The append pipeline of writer ``writer_id`` on ``segment``, set up with ``last_stored``.

    The connection calls ``accept`` for each block (which says whether to submit it now), reports
    each container outcome with ``succeeded``/``failed``, and after each outcome calls ``drain`` for
    the replies to send and the blocks to (re-)submit, in order."""

    __slots__ = ("_gone", "_holding", "_sealed_offset", "last_acknowledged", "last_received", "pending",
                 "segment", "unfinished", "writer_id")

    def __init__(self, writer_id: UUID, segment: str, last_stored: int) -> None:
        self.writer_id = writer_id
        self.segment = segment
        self.last_received = last_stored  # the newest event number accepted (they must increase)
        self.last_acknowledged = last_stored  # the newest one answered as stored
        self.pending: deque[PendingBlock] = deque()
        self.unfinished = 0  # pending blocks not DONE
        self._holding = False  # a block waits to be submitted again: later arrivals wait behind it
        self._sealed_offset: int | None = None
        self._gone = False

    @property
    def idle(self) -> bool:
        return not self.pending

    def accept(self, block: PendingBlock) -> bool:
        """Take ``block`` into the pipeline; True if it is to be submitted now (with
        ``block.comparison`` set).  The caller has checked that its event number exceeds
        ``last_received`` (else the writer broke the protocol)."""
        if block.last_event_number <= self.last_received:
            raise InternalError("accept() of a block whose event number does not increase")
        self.last_received = block.last_event_number
        self.pending.append(block)
        if self._sealed_offset is not None or self._gone:
            self._refuse(block)
            return False
        self.unfinished += 1
        if self._holding:
            return False
        block.comparison = self._chain_before(block)
        block.after_unfinished = self.unfinished > 1
        block.move(BlockState.SUBMITTED)
        return True

    def _chain_before(self, block: PendingBlock) -> int:
        """The event number stored (or about to be) just before ``block``: that of the newest pending
        block ahead of it that has not failed, else the last acknowledged one."""
        pending = self.pending
        for index in range(len(pending) - 1, -1, -1):
            other = pending[index]
            if other is not block and (other.state is not BlockState.DONE or type(other.reply) is DataAppended):
                return other.last_event_number
        return self.last_acknowledged

    def _refuse(self, block: PendingBlock) -> None:
        """Answer ``block`` without submitting it: the segment is sealed, or gone."""
        if self._sealed_offset is not None:
            block.reply = SegmentIsSealed(block.request_id, self.segment, self._sealed_offset)
        else:
            block.reply = NoSuchSegment(block.request_id, self.segment)
        block.move(BlockState.DONE)

    def succeeded(self, block: PendingBlock, offset: int) -> None:
        """The container stored ``block`` at ``offset``."""
        block.reply = DataAppended(block.request_id, self.writer_id, block.last_event_number, 0,
                                   offset + len(block.data))
        block.move(BlockState.DONE)
        self.unfinished -= 1

    def failed(self, block: PendingBlock, failure: Failure, sealed_length: int = 0) -> None:
        """The container refused ``block``.  ``sealed_length``: the final length, for SEALED."""
        if failure in (Failure.COMPARISON, Failure.OFFSET) and block.after_unfinished:
            block.move(BlockState.RETRY)
            self._holding = True
            return
        self.unfinished -= 1
        if failure is Failure.COMPARISON:
            block.reply = InvalidEventNumber(block.request_id, self.writer_id, block.last_event_number)
        elif failure is Failure.OFFSET:
            block.reply = ConditionalCheckFailed(block.request_id, self.writer_id, block.last_event_number)
        elif failure is Failure.SEALED:
            self._sealed_offset = sealed_length
            block.reply = SegmentIsSealed(block.request_id, self.segment, sealed_length)
        else:
            self._gone = True
            block.reply = NoSuchSegment(block.request_id, self.segment)
        block.move(BlockState.DONE)

    def drain(self) -> tuple[list[PendingBlock], list[PendingBlock]]:
        """``(answered, to_submit)``: the blocks at the front whose replies may go out now (in order;
        each has ``reply`` set, a ``DataAppended`` with its ``previous_event_number`` filled in), and
        the blocks to submit again (in order, each with ``comparison`` set)."""
        answered: list[PendingBlock] = []
        to_submit: list[PendingBlock] = []
        pending = self.pending
        while True:
            while pending and pending[0].state is BlockState.DONE:
                block = pending.popleft()
                reply = block.reply
                if type(reply) is DataAppended:
                    block.reply = DataAppended(reply.request_id, reply.writer_id, reply.event_number,
                                               self.last_acknowledged, reply.current_segment_write_offset)
                    self.last_acknowledged = block.last_event_number
                answered.append(block)
            if not (pending and pending[0].state is BlockState.RETRY):
                return answered, to_submit
            # Everything before it has finished, so its failure may have been an overtaking: submit
            # it again, comparing with what is really stored, and release the blocks held behind it
            # (and those that failed behind it), each chained to the one before.
            self._holding = False
            comparison = self.last_acknowledged
            for block in pending:
                if block.state is BlockState.SUBMITTED:
                    comparison = block.last_event_number
                elif block.state is not BlockState.DONE:
                    if self._sealed_offset is not None or self._gone:
                        self.unfinished -= 1
                        self._refuse(block)
                        continue
                    block.comparison = comparison
                    block.after_unfinished = block is not pending[0]
                    block.move(BlockState.SUBMITTED)
                    to_submit.append(block)
                    comparison = block.last_event_number
            if to_submit:
                return answered, to_submit

    def check_invariants(self) -> None:
        assert self.unfinished == sum(1 for b in self.pending if b.state is not BlockState.DONE), self.pending
        numbers = [b.last_event_number for b in self.pending]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), numbers
        assert self.last_acknowledged <= self.last_received
        held = any(b.state is BlockState.HELD for b in self.pending)
        assert not held or self._holding, "a block is held, yet nothing will release it"
        if self.pending:
            assert self.pending[0].state is not BlockState.DONE, "answerable blocks were not drained"
            assert self.pending[-1].last_event_number == self.last_received
