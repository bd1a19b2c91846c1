"""Errors across the wire: the ``error_code`` of an ``ErrorMessage`` and the error class it stands for.

Theory of operation.  Failures that have a command of their own (``NoSuchSegment``, ``SegmentIsSealed``,
``WrongHost``, ...) travel as that command.  Every other failure of a request travels as an
``ErrorMessage`` whose code names the most specific class below that the server-side error is an
instance of; the client raises that class again with the server's message, so a caller sees the
same typed error (and the same retryability) whether it embedded the store or reached it over TCP.
Codes are part of the protocol: never reuse or renumber one; add new ones at the end.
"""

from __future__ import annotations

from typing import Final

from millstream.errors import (
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
    InvalidScaleError,
    InvalidStreamCutError,
    LargeEventFailedError,
    LeaseExpiredError,
    LeaseTooLargeError,
    MillstreamError,
    ObjectClosedError,
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
)

__all__ = ["ERROR_CODES", "UNKNOWN_ERROR_CODE", "error_code_of", "error_from_code"]

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
        code = _CODE_OF.get(cls)  # type: ignore[call-overload]
        if code is not None:
            return code
    return UNKNOWN_ERROR_CODE


def error_from_code(code: int, message: str) -> MillstreamError:
    """The error a client raises for an ``ErrorMessage`` with ``code`` and ``message``."""
    cls = ERROR_CODES.get(code)
    if cls is None:
        return InternalError(f"server error (code {code}): {message}")
    return cls(message)
