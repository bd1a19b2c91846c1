"""``InDoubtEvent``: an event a writer was given and has not seen acknowledged.

When a writer gives up (its server stayed away longer than the per-outage reconnect budget), the
``ReconnectBudgetExceededError`` it raises carries every such event, across all its segments, in the
order they were written -- ``in_doubt`` -- and ``AsyncEventStreamWriter.in_doubt_events()`` lists them
at any time.  Each may or may not be stored: it was sent (perhaps more than once) without an
acknowledgement, or not sent yet.  An application that must not lose them writes them again (a
duplicate is possible only for those that were stored); one that must not duplicate them either
checks what its readers see from ``sequence`` on -- or writes through a writer with a stable id
(``event_writer(stream, serializer, writer_id=...)``), whose in-doubt events also carry the
application's own sequence (``application_sequence``): a new writer with the same id, given them
again with those sequences, drops whichever the stream holds and writes the rest once.
"""

from __future__ import annotations

import attrs

__all__ = ["InDoubtEvent"]


@attrs.frozen(slots=True)
class InDoubtEvent:
    """An event whose outcome a writer does not know.  ``sequence``: its place among every event
    written through that writer (1 for the first ``write_event``; a writer with a stable id counts the
    duplicates it dropped too), so the set says where an input stops being known durable; ``segment``:
    where it was routed last; ``routing_key`` as given; ``payload``: its serialized bytes (what a retry
    would write); ``application_sequence``: the ``sequence`` the application gave ``write_event`` -- a
    writer with a stable id only, None for any other."""

    sequence: int
    segment: str
    routing_key: str | None
    payload: bytes
    application_sequence: int | None = None
