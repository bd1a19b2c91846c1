"""Errors across the wire, both ways: the reply a failure travels as, and the error a reply reports.

Theory of operation.  Failures that have a command of their own (``NoSuchSegment``, ``SegmentIsSealed``,
``WrongHost``, ...) travel as that command: ``ERROR_REPLIES`` pairs each such error class with its
reply, says how the server builds the reply (``ErrorReply.to_reply``) and how the client turns it
back into the error (``ErrorReply.to_error``) -- one table, which the server (``reply_of_error``)
and the client (``error_of_reply``) both read.  Every other failure of a request travels as an
``ErrorMessage`` whose code names the most specific class of ``ERROR_CODES`` that the server-side
error is an instance of; the client raises that class again with the server's message, so a caller
sees the same typed error (and the same retryability) whether it embedded the store or reached it
over TCP.  Codes are part of the protocol: never reuse or renumber one; add new ones at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from millstream.errors import (
    AuthenticationError,
    BadAttributeUpdateError,
    BadOffsetError,
    CheckpointFailedError,
    CheckpointLimitError,
    ContainerUnavailableError,
    DataCorruptionError,
    EventReaderOpenError,
    EventTooLargeError,
    FenceValueError,
    InternalError,
    InvalidArgumentError,
    InvalidEventNumberError,
    InvalidScaleError,
    InvalidStreamCutError,
    LargeEventFailedError,
    LeaseExpiredError,
    LeaseTooLargeError,
    MillstreamError,
    ObjectClosedError,
    OperationUnsupportedError,
    PayloadTooLargeError,
    ProtocolError,
    ReaderExistsError,
    ReaderGroupExistsError,
    ReaderGroupNotFoundError,
    ReaderNotInGroupError,
    ReservedSegmentError,
    RetryableError,
    ScopeExistsError,
    ScopeNotEmptyError,
    ScopeNotFoundError,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    StreamExistsError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSealedError,
    StreamSegmentExistsError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentNotSealedError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
    TransactionNotFoundError,
    TransactionNotOpenError,
    TransientSegmentError,
    TruncatedDataError,
    WrongHostError,
)
from millstream.wire.commands import (
    AuthTokenCheckFailed,
    Command,
    ConditionalCheckFailed,
    ErrorMessage,
    InvalidEventNumber,
    NoSuchSegment,
    OperationUnsupported,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    WrongHost,
)

__all__ = ["ERROR_CODES", "ERROR_REPLIES", "UNKNOWN_ERROR_CODE", "ErrorReply", "error_code_of", "error_from_code",
           "error_of_reply", "reply_of_error"]

#: A failure the server could not classify (a bug, or a newer server's class); raised as ``InternalError``.
UNKNOWN_ERROR_CODE: Final = 0

#: code -> class.  Order within the table does not matter; ``error_code_of`` picks the most specific.
ERROR_CODES: Final[dict[int, type[MillstreamError]]] = {
    1: InvalidArgumentError,
    2: PayloadTooLargeError,
    3: BadOffsetError,
    4: BadAttributeUpdateError,
    5: StreamSegmentNotExistsError,
    6: StreamSegmentMergedError,
    7: StreamSegmentExistsError,
    8: StreamSegmentSealedError,
    9: StreamSegmentNotSealedError,
    10: StreamSegmentTruncatedError,
    11: ContainerUnavailableError,
    12: StorageError,
    13: StorageFullError,
    14: StorageUnavailableError,
    15: DataCorruptionError,
    16: RetryableError,
    17: ObjectClosedError,
    18: ProtocolError,
    19: InternalError,
    # The controller's errors (scopes, streams, reader groups, scaling, stream cuts).
    20: ScopeNotFoundError,
    21: StreamNotFoundError,
    22: ReaderGroupNotFoundError,
    23: ScopeExistsError,
    24: StreamExistsError,
    25: ReaderGroupExistsError,
    26: ScopeNotEmptyError,
    27: StreamNotSealedError,
    28: StreamSealedError,
    29: InvalidScaleError,
    30: InvalidStreamCutError,
    # Readers in reader groups (raised by the client; coded so they keep their class if relayed).
    31: ReaderExistsError,
    32: ReaderNotInGroupError,
    33: CheckpointLimitError,
    34: CheckpointFailedError,
    35: TruncatedDataError,
    # Stream transactions (the controller).
    36: TransactionNotFoundError,
    37: TransactionNotOpenError,
    38: LeaseExpiredError,
    39: LeaseTooLargeError,
    40: FenceValueError,
    # Large events and transient segments.
    41: TransientSegmentError,
    42: LargeEventFailedError,
    43: EventTooLargeError,
    44: EventReaderOpenError,
    # Segments only the node itself changes (the system scope, internal segments).
    45: ReservedSegmentError,
}

_CODE_OF: Final = {cls: code for code, cls in ERROR_CODES.items()}


def error_code_of(error: BaseException) -> int:
    """The code of the most specific class in ``ERROR_CODES`` that ``error`` is an instance of."""
    for cls in type(error).__mro__:
        code = _CODE_OF.get(cls)
        if code is not None:
            return code
    return UNKNOWN_ERROR_CODE


def error_from_code(code: int, message: str) -> MillstreamError:
    """The error a client raises for an ``ErrorMessage`` with ``code`` and ``message``."""
    cls = ERROR_CODES.get(code)
    if cls is None:
        return InternalError(f"server error (code {code}): {message}")
    return cls(message)


# --- Failures with a reply of their own --------------------------------------------------------------


@attrs.frozen
class ErrorReply:
    """An error class and the reply command it travels as, both ways.

    ``to_error`` builds, from a reply, the error the client raises.  ``to_reply`` builds the reply
    the server answers a failed request with -- ``(request_id, segment, text, position)``, where
    ``text`` is the error's message and ``position`` the segment's ``position`` field of its info
    (``"length"`` of a sealed segment, ``"start_offset"`` of a truncated one; 0 when unknown) -- or
    is None where only one path of the server sends that reply, with fields of its own (an append's
    writer id and event number; an operation the server does not implement)."""

    error: type[MillstreamError]
    reply: type[Command]
    to_error: Callable[[Any], MillstreamError]
    to_reply: Callable[[int, str, str, int], Command] | None = None
    position: str | None = None


#: Every failure that has a reply command of its own.  The server answers a failed request with the
#: first entry with a ``to_reply`` whose error class the failure is an instance of (so a subclass's
#: entry would go first); the client looks a reply up by its command.
ERROR_REPLIES: Final[tuple[ErrorReply, ...]] = (
    ErrorReply(StreamSegmentNotExistsError, NoSuchSegment,
               lambda reply: StreamSegmentNotExistsError(f"segment {reply.segment!r} does not exist"),
               lambda request_id, segment, text, position: NoSuchSegment(request_id, segment)),
    ErrorReply(StreamSegmentExistsError, SegmentAlreadyExists,
               lambda reply: StreamSegmentExistsError(f"segment {reply.segment!r} already exists"),
               lambda request_id, segment, text, position: SegmentAlreadyExists(request_id, segment)),
    ErrorReply(StreamSegmentSealedError, SegmentIsSealed,
               lambda reply: StreamSegmentSealedError(f"segment {reply.segment!r} is sealed at length {reply.offset}"),
               lambda request_id, segment, text, position: SegmentIsSealed(request_id, segment, position),
               position="length"),
    ErrorReply(StreamSegmentTruncatedError, SegmentIsTruncated,
               lambda reply: StreamSegmentTruncatedError(
                   f"segment {reply.segment!r} was truncated: it now starts at offset {reply.start_offset}"),
               lambda request_id, segment, text, position: SegmentIsTruncated(request_id, segment, position),
               position="start_offset"),
    ErrorReply(WrongHostError, WrongHost,
               lambda reply: WrongHostError(f"this server does not own segment {reply.segment!r} "
                                            f"(its owner: {reply.correct_host or 'unknown'})"),
               lambda request_id, segment, text, position: WrongHost(request_id, segment, "")),
    ErrorReply(AuthenticationError, AuthTokenCheckFailed,
               lambda reply: AuthenticationError(f"the server refused the token: {reply.reason}"),
               lambda request_id, segment, text, position: AuthTokenCheckFailed(request_id, text)),
    # Sent by the server's append path (``server._appends.WriterSession``), with the append's fields.
    ErrorReply(InvalidEventNumberError, InvalidEventNumber,
               lambda reply: InvalidEventNumberError(
                   f"writer {reply.writer_id} sent event number {reply.event_number}, which does not follow the "
                   "last one the server stored for it")),
    ErrorReply(BadOffsetError, ConditionalCheckFailed,
               lambda reply: BadOffsetError(f"conditional append {reply.event_number} of writer {reply.writer_id} "
                                            "found the segment at another length; nothing was appended")),
    # Sent by the server's dispatch for a command it does not serve.
    ErrorReply(OperationUnsupportedError, OperationUnsupported,
               lambda reply: OperationUnsupportedError(f"the server does not support {reply.operation}")),
)

_BY_REPLY: Final[Mapping[type[Command], ErrorReply]] = {entry.reply: entry for entry in ERROR_REPLIES}
_REQUEST_REPLIES: Final = tuple(entry for entry in ERROR_REPLIES if entry.to_reply is not None)


def reply_of_error(error: BaseException) -> ErrorReply | None:
    """The entry whose reply the server answers a request that failed with ``error`` with, or None:
    then the reply is an ``ErrorMessage`` with ``error_code_of(error)``."""
    for entry in _REQUEST_REPLIES:
        if isinstance(error, entry.error):
            return entry
    return None


def error_of_reply(reply: Command) -> MillstreamError | None:
    """The error ``reply`` reports (the client raises it), or None if it reports none."""
    entry = _BY_REPLY.get(type(reply))
    if entry is not None:
        return entry.to_error(reply)
    if isinstance(reply, ErrorMessage):
        return error_from_code(reply.error_code, reply.message)
    return None
