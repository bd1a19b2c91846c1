"""Contracts that CrossHair checks on the wire codec's field and header checks (loop-free int code).

``crosshair check --analysis_kind PEP316 --report_all proofs.contracts_wire`` reports each
postcondition as "Confirmed over all paths" or "Not confirmed".  The seeded bug each one was shown
to find is listed in ``proofs/test_contracts.py``.
"""

from __future__ import annotations

from typing import Any, cast

from millstream.errors import (
    CommandTooLargeError,
    FrameTooLargeError,
    InvalidArgumentError,
    MalformedFrameError,
    UnknownCommandError,
)
from millstream.values import _int
from millstream.wire.codec import (
    _BOOL_BYTE,  # noqa: F401 (named by the conditions)
    _DECODERS,
    FRAME_BYTES_MAX,  # noqa: F401 (named by the conditions)
    _bool,
    _frame_length,
    _header_refusal,
)

__all__ = [
    "bool_field", "checked_int", "checked_int_accepted", "frame_length_accepted", "frame_length_limit",
    "header_rejection",
]

_KNOWN_TYPE_CODE = min(_DECODERS)


def bool_field(raw: int) -> bool | None:
    """A bool field decodes from 0 or 1 only (None: refused), and encodes back to the same byte.

    pre: -4 <= raw <= 4
    post: __return__ == (None if raw not in (0, 1) else raw == 1)
    post: __return__ is None or _BOOL_BYTE[__return__] == raw
    """
    try:
        return _bool(raw)
    except MalformedFrameError:
        return None


def frame_length_limit(length: int) -> int | None:
    """An encoded command's frame is refused (None) exactly when it exceeds the frame limit.

    pre: 0 <= length <= 2 * FRAME_BYTES_MAX
    post: __return__ == (length if length <= FRAME_BYTES_MAX else None)
    """
    try:
        return _frame_length(cast(Any, None), length)
    except CommandTooLargeError:
        return None


def header_rejection(known: bool, length: int) -> str:
    """A bad frame header gets the error it deserves: unknown type first, then a negative length
    (malformed), then too large (``_reject_header``'s core, which formats no message).

    post: __return__ == ("unknown" if not known else "malformed" if length < 0 else "too large")
    """
    refusal = _header_refusal(_KNOWN_TYPE_CODE if known else -1, length)
    return {UnknownCommandError: "unknown", MalformedFrameError: "malformed", FrameTooLargeError: "too large"}.get(
        refusal, "accepted")


def checked_int(value: int, low: int, high: int) -> int | None:
    """A configuration int is accepted unchanged exactly when it lies in [low, high] (None: refused).

    post: __return__ == (value if low <= value <= high else None)
    """
    try:
        return _int(value, "a value", low=low, high=high)
    except InvalidArgumentError:
        return None


def frame_length_accepted(length: int) -> int:
    """An encoded command up to the frame limit keeps its length (the accepting path alone, which
    CrossHair exhausts: the refusing path formats its message, which makes the length concrete).

    pre: 0 <= length <= FRAME_BYTES_MAX
    post: __return__ == length
    """
    return _frame_length(cast(Any, None), length)


def checked_int_accepted(value: int, low: int, high: int) -> int:
    """A configuration int in [low, high] is accepted unchanged (the accepting path alone).

    pre: low <= value <= high
    post: __return__ == value
    """
    return _int(value, "a value", low=low, high=high)
