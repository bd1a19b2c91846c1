"""Replies to errors: the typed error a client raises for each error reply of the wire contract.

Failures with a command of their own map to the classes the contract names; every other failure
arrives as ``ErrorMessage`` with a code from ``millstream.wire.error_codes`` and becomes that class
again, so a caller sees the same error (and the same retryability) over TCP as in process.
"""

from __future__ import annotations

from typing import TypeVar

from millstream.errors import (
    AuthenticationError,
    BadOffsetError,
    InvalidEventNumberError,
    MillstreamError,
    OperationUnsupportedError,
    ProtocolError,
    StreamSegmentExistsError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    StreamSegmentTruncatedError,
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
from millstream.wire.error_codes import error_from_code

__all__ = ["ERROR_REPLIES", "error_of_reply", "expect"]

#: The reply commands that report a failure.
ERROR_REPLIES: frozenset[type[Command]] = frozenset({
    NoSuchSegment, SegmentIsSealed, SegmentAlreadyExists, SegmentIsTruncated, WrongHost, InvalidEventNumber,
    ConditionalCheckFailed, AuthTokenCheckFailed, OperationUnsupported, ErrorMessage})


def error_of_reply(reply: Command) -> MillstreamError | None:
    """The error ``reply`` reports, or None if it reports none."""
    if type(reply) not in ERROR_REPLIES:
        return None
    if isinstance(reply, NoSuchSegment):
        return StreamSegmentNotExistsError(f"segment {reply.segment!r} does not exist")
    if isinstance(reply, SegmentIsSealed):
        return StreamSegmentSealedError(f"segment {reply.segment!r} is sealed at length {reply.offset}")
    if isinstance(reply, SegmentAlreadyExists):
        return StreamSegmentExistsError(f"segment {reply.segment!r} already exists")
    if isinstance(reply, SegmentIsTruncated):
        return StreamSegmentTruncatedError(
            f"segment {reply.segment!r} was truncated: it now starts at offset {reply.start_offset}")
    if isinstance(reply, WrongHost):
        return WrongHostError(f"this server does not own segment {reply.segment!r} "
                              f"(its owner: {reply.correct_host or 'unknown'})")
    if isinstance(reply, InvalidEventNumber):
        return InvalidEventNumberError(
            f"writer {reply.writer_id} sent event number {reply.event_number}, which does not follow the last "
            "one the server stored for it")
    if isinstance(reply, ConditionalCheckFailed):
        return BadOffsetError(f"conditional append {reply.event_number} of writer {reply.writer_id} found the "
                              "segment at another length; nothing was appended")
    if isinstance(reply, AuthTokenCheckFailed):
        return AuthenticationError(f"the server refused the token: {reply.reason}")
    if isinstance(reply, OperationUnsupported):
        return OperationUnsupportedError(f"the server does not support {reply.operation}")
    assert isinstance(reply, ErrorMessage), reply
    return error_from_code(reply.error_code, reply.message)


_Reply = TypeVar("_Reply", bound=Command)


def expect(reply: Command, kind: type[_Reply]) -> _Reply:
    """``reply`` if it is a ``kind``; the error it reports if it is an error reply; else ``ProtocolError``
    (the server answered a request with a reply that does not belong to it)."""
    if isinstance(reply, kind):
        return reply
    error = error_of_reply(reply)
    if error is not None:
        raise error
    raise ProtocolError(f"expected {kind.__name__}, the server answered {type(reply).__name__}")
