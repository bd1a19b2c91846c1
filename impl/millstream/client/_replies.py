"""Replies to errors: the typed error a client raises for each error reply of the wire contract.

Failures with a command of their own map to the classes the contract names; every other failure
arrives as ``ErrorMessage`` with a code from ``millstream.wire.error_codes`` and becomes that class
again, so a caller sees the same error (and the same retryability) over TCP as in process.  Both
mappings are the wire's tables (``ERROR_REPLIES``, ``ERROR_CODES``), which the server reads too.
"""

from __future__ import annotations

from typing import TypeVar

from millstream.errors import ProtocolError
from millstream.wire.commands import Command, ErrorMessage
from millstream.wire.error_codes import ERROR_REPLIES as _ERROR_REPLIES
from millstream.wire.error_codes import error_of_reply

__all__ = ["ERROR_REPLIES", "error_of_reply", "expect"]

#: The reply commands that report a failure.
ERROR_REPLIES: frozenset[type[Command]] = frozenset({entry.reply for entry in _ERROR_REPLIES} | {ErrorMessage})

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
