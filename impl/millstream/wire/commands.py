"""The wire protocol's commands: what a client and a segment store say to each other, as values.

Theory of operation.  A connection opens with both sides sending ``Hello``; each then speaks the
version ``negotiate`` picks (``millstream.wire.codec``).  After that every request carries a
``request_id`` chosen by the client, and every reply echoes it, so one connection carries many
requests at once and replies may come back in any order.  A writer first sends ``SetupAppend`` for
its (writer id, segment) pair; the reply ``AppendSetup`` names the last event number the store holds
for that writer, so after a reconnect the writer drops what is already stored and re-sends the rest
in order.  Appends then travel as blocks of many events (below); each is acknowledged by
``DataAppended`` carrying the block's last event number.  Reads, segment administration and
attributes are plain request/reply pairs; the error replies (``WrongHost`` … ``OperationUnsupported``)
answer any request they apply to.

A block of events travels in one of two ways:

* **whole** -- one ``AppendBlock`` frame carries the block's bytes (``event_count`` framed events,
  see ``codec.encode_event``), the number of its last event and the request id to echo.  The client
  builds the block in memory and sends it in one frame; the store appends it as one append, so the
  events of a block are stored all together or not at all.  This is the path the client uses.
* **streamed** -- a sender that must put bytes on the wire before it knows where its block ends sends
  them in ``AppendBlockPart`` frames (bytes only, no accounting), then one ``AppendBlockEnd`` with the
  block's last bytes and its accounting.  The store holds the parts (at most
  ``limits.APPEND_LENGTH_BYTES_MAX`` per writer) and appends parts and end together as one append.
  ``size_of_whole_events`` is the length of the whole block (parts and end); every byte of a block is
  part of a whole event, so a block whose bytes do not add up to it, or that ends inside an event, is
  a protocol error and the store closes the connection.  (Pravega lets a partial event straddle two
  blocks; millstream never appends a partial event.)

Every command is a frozen, slotted value whose ``TYPE`` is its type code on the wire; the byte layout
of each is tabled at the top of ``codec``.  Fields hold plain values: ints, bools, ``str``, ``bytes``
and ``uuid.UUID`` writer ids; attribute ids are unsigned 128-bit ints (a writer's attribute id is
its UUID's ``int``).  Commands are not validated when built: ``codec.encode`` refuses a field that
does not fit its wire type, and the store checks meaning (a negative offset, an unknown segment).
For encoding, ``data`` may be any bytes-like object; decoding always yields ``bytes``.
"""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID

import attrs

__all__ = [
    "COMMAND_TYPES",
    "AppendBlock",
    "AppendBlockEnd",
    "AppendBlockPart",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "Command",
    "ConditionalAppend",
    "ConditionalBlockEnd",
    "ConditionalCheckFailed",
    "ControllerReply",
    "ControllerRequest",
    "CreateSegment",
    "CreateTransientSegment",
    "DataAppended",
    "DeleteSegment",
    "ErrorMessage",
    "EventBoundaries",
    "GetEventBoundaries",
    "GetSegmentAttribute",
    "GetSegmentInfo",
    "Hello",
    "InvalidEventNumber",
    "KeepAlive",
    "MergeSegments",
    "NoSuchSegment",
    "OperationUnsupported",
    "ReadSegment",
    "SealSegment",
    "SegmentAlreadyExists",
    "SegmentAttribute",
    "SegmentAttributeUpdated",
    "SegmentCreated",
    "SegmentDeleted",
    "SegmentInfo",
    "SegmentIsSealed",
    "SegmentIsTruncated",
    "SegmentRead",
    "SegmentSealed",
    "SegmentTruncated",
    "SegmentsMerged",
    "SetupAppend",
    "TruncateSegment",
    "UpdateSegmentAttribute",
    "WrongHost",
]


class Command:
    """Base of every wire command.  ``TYPE`` is the command's type code on the wire."""

    __slots__ = ()
    TYPE: ClassVar[int]


# --- Connection ------------------------------------------------------------------------------------


@attrs.frozen
class Hello(Command):
    """Sent first by both sides: the newest and the oldest protocol version the sender speaks."""

    TYPE: ClassVar[int] = -127
    high_version: int
    low_version: int


@attrs.frozen
class KeepAlive(Command):
    """Sent by either side on an idle connection, so the peer can tell idle from dead."""

    TYPE: ClassVar[int] = 100


# --- Appends ---------------------------------------------------------------------------------------


@attrs.frozen
class SetupAppend(Command):
    """A writer announces itself for ``segment``; answered by ``AppendSetup`` (or an error reply)."""

    TYPE: ClassVar[int] = 1
    request_id: int
    writer_id: UUID
    segment: str
    token: str


@attrs.frozen
class AppendSetup(Command):
    """The writer may append.  ``last_event_number`` is the last one stored for it
    (``model.types.NULL_ATTRIBUTE_VALUE`` if none): the writer drops events up to it and re-sends the rest."""

    TYPE: ClassVar[int] = 2
    request_id: int
    segment: str
    writer_id: UUID
    last_event_number: int


@attrs.frozen
class AppendBlock(Command):
    """A whole block: ``data`` holds ``event_count`` framed events, the last numbered
    ``last_event_number``; appended all together, acknowledged by one ``DataAppended``.
    ``request_id`` is echoed in that acknowledgement (the client uses its ``SetupAppend``'s)."""

    TYPE: ClassVar[int] = 3
    writer_id: UUID
    last_event_number: int
    event_count: int
    request_id: int
    data: bytes


@attrs.frozen
class AppendBlockEnd(Command):
    """Closes a streamed block: ``data`` is its last bytes, after the writer's ``AppendBlockPart``
    frames since its previous block; ``size_of_whole_events`` is the whole block's length (parts and
    ``data``), ``event_count`` and ``last_event_number`` its accounting, as in ``AppendBlock``."""

    TYPE: ClassVar[int] = 4
    writer_id: UUID
    size_of_whole_events: int
    data: bytes
    event_count: int
    last_event_number: int
    request_id: int


@attrs.frozen
class ConditionalAppend(Command):
    """Append ``data`` (framed events numbered up to ``event_number``) only if the segment's length
    is ``expected_offset``; answered by ``DataAppended`` or ``ConditionalCheckFailed``."""

    TYPE: ClassVar[int] = 5
    writer_id: UUID
    event_number: int
    expected_offset: int
    data: bytes
    request_id: int


@attrs.frozen
class ConditionalBlockEnd(Command):
    """Append ``data`` -- raw bytes, not framed events: a large event's chunk, or a byte stream's bytes --
    only if the segment's length is ``expected_offset``; answered by ``DataAppended`` or
    ``ConditionalCheckFailed``.  ``event_number`` orders the writer's requests on this connection (it
    must increase, as for every append) but is not stored: the offset alone guards the append, so a
    resend after a reconnect is refused exactly when the bytes are there already."""

    TYPE: ClassVar[int] = 89
    writer_id: UUID
    event_number: int
    expected_offset: int
    data: bytes
    request_id: int


@attrs.frozen
class AppendBlockPart(Command):
    """Some bytes of a streamed block, held by the store until the writer's ``AppendBlockEnd``."""

    TYPE: ClassVar[int] = 6
    writer_id: UUID
    data: bytes


@attrs.frozen
class DataAppended(Command):
    """Events up to ``event_number`` of the writer are durable.  ``previous_event_number`` is the one
    acknowledged before (so a writer notices a lost acknowledgement); ``current_segment_write_offset``
    the segment's length after the append."""

    TYPE: ClassVar[int] = 7
    request_id: int
    writer_id: UUID
    event_number: int
    previous_event_number: int
    current_segment_write_offset: int


@attrs.frozen
class ConditionalCheckFailed(Command):
    """A ``ConditionalAppend`` found another length: nothing was appended; the connection stays open."""

    TYPE: ClassVar[int] = 8
    request_id: int
    writer_id: UUID
    event_number: int


# --- Reads -----------------------------------------------------------------------------------------


@attrs.frozen
class ReadSegment(Command):
    """Read up to ``suggested_length`` bytes from ``offset``.  At the tail the store waits up to
    ``wait_ms`` for data (0: answer at once) before answering with an empty ``SegmentRead``."""

    TYPE: ClassVar[int] = 9
    request_id: int
    segment: str
    offset: int
    suggested_length: int
    token: str
    wait_ms: int


@attrs.frozen
class SegmentRead(Command):
    """Bytes of ``segment`` from ``offset``.  ``at_tail``: they reach the segment's current end;
    ``end_of_segment``: the segment is sealed and nothing follows them."""

    TYPE: ClassVar[int] = 10
    request_id: int
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes


@attrs.frozen
class GetEventBoundaries(Command):
    """Ask for the event boundaries the store knows in ``[start_offset, end_offset]`` of a segment
    that holds events (its start offset and length, and its sparse index of append ends: see
    ``millstream.segmentstore.event_boundaries``), without reading its bytes; answered by
    ``EventBoundaries``."""

    TYPE: ClassVar[int] = 64
    request_id: int
    segment: str
    start_offset: int
    end_offset: int
    token: str


@attrs.frozen
class EventBoundaries(Command):
    """Offsets of ``segment`` where an event begins (or the segment ends), ascending, each an i64 in
    ``offsets`` (``codec.encode_offsets`` / ``codec.decode_offsets``): the lowest ones in the range
    asked for, at most ``limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX`` of them."""

    TYPE: ClassVar[int] = 65
    request_id: int
    segment: str
    offsets: bytes


# --- Segment administration ------------------------------------------------------------------------


@attrs.frozen
class GetSegmentInfo(Command):
    """Ask for a segment's state; answered by ``SegmentInfo``."""

    TYPE: ClassVar[int] = 11
    request_id: int
    segment: str
    token: str


@attrs.frozen
class SegmentInfo(Command):
    """A segment's state as the store knows it (``exists`` False: the other fields mean nothing).
    ``last_modified`` is in milliseconds since the Unix epoch, by the store's clock."""

    TYPE: ClassVar[int] = 12
    request_id: int
    segment: str
    exists: bool
    sealed: bool
    deleted: bool
    start_offset: int
    length: int
    last_modified: int


@attrs.frozen
class CreateSegment(Command):
    """Create an empty segment; answered by ``SegmentCreated`` or ``SegmentAlreadyExists``."""

    TYPE: ClassVar[int] = 20
    request_id: int
    segment: str
    token: str


@attrs.frozen
class CreateTransientSegment(Command):
    """Create a transient segment for ``parent`` (a large event's staging segment, in the parent's
    container, named by the store: ``<parent>#transient.<hex>``) on behalf of ``writer_id``; answered by
    ``SegmentCreated`` naming it.  It takes appends, reads and a merge into its parent (or a sibling
    transient segment), never a seal, truncation or attribute update, and the store deletes it if its
    writer's connection stays down past a grace period or nobody uses it for the idle time."""

    TYPE: ClassVar[int] = 40
    request_id: int
    writer_id: UUID
    parent: str
    token: str


@attrs.frozen
class SegmentCreated(Command):
    """The segment was created (for ``CreateTransientSegment``: ``segment`` is the name the store chose)."""

    TYPE: ClassVar[int] = 21
    request_id: int
    segment: str


@attrs.frozen
class SealSegment(Command):
    """Seal a segment (no more appends); answered by ``SegmentSealed``."""

    TYPE: ClassVar[int] = 28
    request_id: int
    segment: str
    token: str


@attrs.frozen
class SegmentSealed(Command):
    """The segment is sealed (also the answer when it already was)."""

    TYPE: ClassVar[int] = 29
    request_id: int
    segment: str


@attrs.frozen
class DeleteSegment(Command):
    """Delete a segment; answered by ``SegmentDeleted``."""

    TYPE: ClassVar[int] = 30
    request_id: int
    segment: str
    token: str


@attrs.frozen
class SegmentDeleted(Command):
    """The segment was deleted."""

    TYPE: ClassVar[int] = 31
    request_id: int
    segment: str


@attrs.frozen
class GetSegmentAttribute(Command):
    """Read one attribute; answered by ``SegmentAttribute``."""

    TYPE: ClassVar[int] = 34
    request_id: int
    segment: str
    attribute_id: int
    token: str


@attrs.frozen
class SegmentAttribute(Command):
    """An attribute's value (``model.types.NULL_ATTRIBUTE_VALUE`` if absent)."""

    TYPE: ClassVar[int] = 35
    request_id: int
    value: int


@attrs.frozen
class UpdateSegmentAttribute(Command):
    """Compare-and-set one attribute: set ``new_value`` if the current value is ``expected_value``;
    answered by ``SegmentAttributeUpdated``."""

    TYPE: ClassVar[int] = 36
    request_id: int
    segment: str
    attribute_id: int
    new_value: int
    expected_value: int
    token: str


@attrs.frozen
class SegmentAttributeUpdated(Command):
    """Whether an ``UpdateSegmentAttribute`` took effect (False: the comparison failed)."""

    TYPE: ClassVar[int] = 37
    request_id: int
    success: bool


@attrs.frozen
class TruncateSegment(Command):
    """Drop a segment's bytes below ``offset``; answered by ``SegmentTruncated``."""

    TYPE: ClassVar[int] = 38
    request_id: int
    segment: str
    offset: int
    token: str


@attrs.frozen
class SegmentTruncated(Command):
    """The segment now starts at the requested offset."""

    TYPE: ClassVar[int] = 39
    request_id: int
    segment: str


# --- Error replies ---------------------------------------------------------------------------------


@attrs.frozen
class WrongHost(Command):
    """This store does not own the segment's container; ``correct_host`` is its owner if known ("")."""

    TYPE: ClassVar[int] = 50
    request_id: int
    segment: str
    correct_host: str


@attrs.frozen
class SegmentIsSealed(Command):
    """The segment is sealed; ``offset`` is its final length."""

    TYPE: ClassVar[int] = 51
    request_id: int
    segment: str
    offset: int


@attrs.frozen
class SegmentAlreadyExists(Command):
    """A segment of that name exists already."""

    TYPE: ClassVar[int] = 52
    request_id: int
    segment: str


@attrs.frozen
class NoSuchSegment(Command):
    """The segment was never created, or was deleted or merged away."""

    TYPE: ClassVar[int] = 53
    request_id: int
    segment: str


@attrs.frozen
class InvalidEventNumber(Command):
    """The writer's event number went backwards, or another connection wrote for the same writer id;
    the store closes the connection and the writer starts again with ``SetupAppend``."""

    TYPE: ClassVar[int] = 55
    request_id: int
    writer_id: UUID
    event_number: int


@attrs.frozen
class SegmentIsTruncated(Command):
    """The requested offset was truncated away; the segment now starts at ``start_offset``."""

    TYPE: ClassVar[int] = 56
    request_id: int
    segment: str
    start_offset: int


@attrs.frozen
class OperationUnsupported(Command):
    """The store does not implement ``operation`` (the request's command name)."""

    TYPE: ClassVar[int] = 57
    request_id: int
    operation: str


# --- Merges and the remaining replies --------------------------------------------------------------


@attrs.frozen
class MergeSegments(Command):
    """Append the sealed ``source`` to the end of ``target`` and remove it; answered by ``SegmentsMerged``."""

    TYPE: ClassVar[int] = 58
    request_id: int
    target: str
    source: str
    token: str


@attrs.frozen
class SegmentsMerged(Command):
    """``source`` was merged into ``target``, which is now ``new_target_length`` bytes long."""

    TYPE: ClassVar[int] = 59
    request_id: int
    target: str
    source: str
    new_target_length: int


@attrs.frozen
class AuthTokenCheckFailed(Command):
    """The request's token was missing, expired or does not grant the operation."""

    TYPE: ClassVar[int] = 60
    request_id: int
    reason: str


@attrs.frozen
class ErrorMessage(Command):
    """Any other failure of a request about ``segment`` ("" if none): a code for programs, a message for people."""

    TYPE: ClassVar[int] = 61
    request_id: int
    segment: str
    error_code: int
    message: str


# --- The controller ----------------------------------------------------------------------------------


@attrs.frozen
class ControllerRequest(Command):
    """A call to the controller that shares the connection (scopes, streams, scaling, stream cuts,
    reader groups): ``method`` names it, ``body`` is its request as canonical JSON (UTF-8, sorted
    keys, no spaces; see ``millstream.controller``).  Answered by ``ControllerReply``; a failure by
    ``ErrorMessage`` with the error's code, an unknown method (or a server without a controller) by
    ``OperationUnsupported``."""

    TYPE: ClassVar[int] = 200
    request_id: int
    method: str
    body: bytes


@attrs.frozen
class ControllerReply(Command):
    """The controller's answer to a ``ControllerRequest``: its reply as canonical JSON."""

    TYPE: ClassVar[int] = 201
    request_id: int
    body: bytes


#: Every command class by its type code.  Type codes follow Pravega's where it has the command, and
#: are never reused.
COMMAND_TYPES: dict[int, type[Command]] = {
    cls.TYPE: cls for cls in (
        Hello, KeepAlive, SetupAppend, AppendSetup, AppendBlock, AppendBlockEnd, ConditionalAppend, AppendBlockPart,
        DataAppended, ConditionalCheckFailed, ReadSegment, SegmentRead, GetSegmentInfo, SegmentInfo, CreateSegment,
        SegmentCreated, SealSegment, SegmentSealed, DeleteSegment, SegmentDeleted, GetSegmentAttribute,
        SegmentAttribute, UpdateSegmentAttribute, SegmentAttributeUpdated, TruncateSegment, SegmentTruncated,
        WrongHost, SegmentIsSealed, SegmentAlreadyExists, NoSuchSegment, InvalidEventNumber, SegmentIsTruncated,
        OperationUnsupported, MergeSegments, SegmentsMerged, AuthTokenCheckFailed, ErrorMessage,
        ControllerRequest, ControllerReply, CreateTransientSegment, ConditionalBlockEnd, GetEventBoundaries,
        EventBoundaries,
    )
}
