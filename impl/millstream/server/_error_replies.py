"""Error replies of a server connection: the reply a failed request gets (``ErrorReplies``, a mixin
of ``_connection.Connection``), and the bounded text every error reply carries.

Theory of operation.  A failure that has a reply command of its own (``NoSuchSegment``,
``SegmentIsSealed``, ``WrongHost``, ...) is answered with it, every other with an ``ErrorMessage``
carrying the error's code: both from ``wire.error_codes``, the one two-way table the client reads
back (``client._replies``).  A failure that is not a ``MillstreamError`` is a bug: it is logged (once
per request) and answered with the unknown code.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from millstream import limits
from millstream.errors import (
    MillstreamError,
    PayloadTooLargeError,
)
from millstream.naming import quote
from millstream.server._connection_state import ConnectionState
from millstream.wire import (
    Command,
    ErrorMessage,
)
from millstream.wire.error_codes import error_code_of, reply_of_error

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer

__all__ = ["ErrorReplies"]

class ErrorReplies(ConnectionState):
    """The reply a failed request gets: the ``Connection``'s methods for it (a mixin over its state)."""

    def _error_reply(self, request_id: int, segment: str, error: BaseException,
                     container: SegmentContainer | None = None) -> Command:
        """The reply a failed request gets: its own command where the protocol has one, else an
        ``ErrorMessage`` with the error's code.  Unexpected errors are logged (once)."""
        entry = reply_of_error(error)
        if entry is not None and entry.to_reply is not None:
            position = 0
            if entry.position is not None:
                found = self._safe_container(segment, container)
                if found is not None:
                    with contextlib.suppress(MillstreamError):
                        position = getattr(found.get_info(segment), entry.position)
            return entry.to_reply(request_id, segment, _text(error), position)
        if not isinstance(error, MillstreamError):
            self._server.log.error("connection %s: request %d on %s failed unexpectedly", self.peer,
                                   request_id, quote(segment), exc_info=error)
        return ErrorMessage(request_id, segment, error_code_of(error), _text(error))

    def _safe_container(self, segment: str, container: SegmentContainer | None) -> SegmentContainer | None:
        if container is not None:
            return container
        try:
            return self._server.container_for(segment)
        except MillstreamError:
            return None



def _length_or_zero(container: SegmentContainer | None, segment: str) -> int:
    if container is None:
        return 0
    try:
        return container.get_info(segment).length
    except MillstreamError:
        return 0


_PAYLOAD_TOO_LARGE = PayloadTooLargeError()


def _text(error: BaseException | str, limit: int = limits.SERVER_ERROR_TEXT_BYTES_MAX) -> str:
    """The text an error reply carries: the error's message (its class name if it has none), cut to
    ``limit`` UTF-8 bytes so that the reply always fits its string field, whatever it quotes."""
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    if len(text) <= limit // 4:  # (fewer characters cannot make too many bytes)
        return text
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return text
    cut = encoded[:limit - 40].decode("utf-8", "ignore")
    return f"{cut}... (cut from {len(encoded)} bytes)"
