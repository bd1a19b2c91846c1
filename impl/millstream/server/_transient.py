"""Transient segments, sans I/O: which exist, who uses them, and when the server deletes one.

Theory of operation.  A large event is staged in a *transient segment* (PDP-43/43A): a hidden
segment ``<parent>#transient.<hex>`` in its parent's container, created by ``CreateTransientSegment``
and, once the whole event is in it, merged into the parent (``MergeSegments``) so that readers see
the event appear at once.  In the container it is an ordinary segment whose name marks it; what
makes it *transient* lives here, in the server: ``TransientSegments`` records each one the server
created or found, the connections using it, and when it was last used, and decides when it must go.

A transient segment is deleted

* by its writer (``DeleteSegment``: ``EventWriter.close`` before ``commit``, an abort);
* when every connection that used it (created it, or set up appends to it) has closed and none set
  up appends to it again within the *grace period* -- the writer went away.  The grace period is
  longer than a client keeps trying to reconnect, so a writer that lost its connection reconnects,
  sets up again (which re-attaches it) and resends what was not acknowledged; deleting on the close
  itself would make that resend fail every time;
* by the *idle sweep*, when nobody appended to it, set up appends to it or merged into it for the
  idle time, connected or not -- an application that stopped streaming its event.

The server runs the sweep (``SegmentStoreServer.expire_transient_segments``) on its injected clock;
``due(now)`` names what to delete and why.  Segments the server did not create in this run (it
restarted, and the container recovered them from its log) are *adopted* when a sweep finds them in a
container, with a fresh idle period and the grace period already running (nobody is connected to
them): a writer that reconnects in time carries on, an abandoned one's bytes disappear.

Merges are remembered (a bounded number of them, oldest forgotten first): a ``MergeSegments`` retried
after its reply was lost finds its source merged already, and is answered as the first one was.

Lifecycle (a table, ``TRANSIENT_TRANSITIONS``): ACTIVE -> MERGED or DELETED, once.  The operations a
transient segment refuses (seal, truncate, attribute updates, being created by name, merges other
than into its parent or a sibling) are checked by ``check_merge`` and by the connection's handlers.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable
from uuid import UUID

from millstream import limits
from millstream.errors import InternalError, TransientSegmentError
from millstream.naming import (
    TRANSIENT_DELIMITER,
    is_hidden_segment,
    is_transient_segment,
    primary_segment_name,
    transient_segment_name,
)

__all__ = ["TRANSIENT_TRANSITIONS", "TransientRecord", "TransientSegments", "TransientState", "check_merge"]


class TransientState(enum.Enum):
    ACTIVE = "active"
    MERGED = "merged"
    DELETED = "deleted"


#: state -> {event: the state that follows} (the model's ``TRANSIENT_TRANSITIONS`` from ACTIVE on).
TRANSIENT_TRANSITIONS: dict[TransientState, dict[str, TransientState]] = {
    TransientState.ACTIVE: {"merge": TransientState.MERGED, "delete": TransientState.DELETED},
    TransientState.MERGED: {},
    TransientState.DELETED: {},
}


class TransientRecord:
    """One transient segment the server tracks.  ``users``: the connections using it now;
    ``detached_at``: when the last of them closed (None while one is attached)."""

    __slots__ = ("detached_at", "last_used", "name", "parent", "state", "users", "writer_ids")

    def __init__(self, name: str, parent: str, now: float) -> None:
        self.name = name
        self.parent = parent
        self.state = TransientState.ACTIVE
        self.writer_ids: set[UUID] = set()
        self.users: set[Hashable] = set()
        self.last_used = now
        self.detached_at: float | None = now

    def move(self, state: TransientState) -> None:
        if state not in TRANSIENT_TRANSITIONS[self.state].values():
            raise InternalError(f"transient segment {self.name!r}: no transition {self.state} -> {state}")
        self.state = state

    def __repr__(self) -> str:
        return (f"TransientRecord({self.name!r}, state={self.state.value}, users={len(self.users)}, "
                f"last_used={self.last_used}, detached_at={self.detached_at})")


def check_merge(target: str, source: str) -> None:
    """Raise ``TransientSegmentError`` unless a merge of ``source`` into ``target`` respects transient
    segments: one merges only into its parent or into a sibling transient segment (the large-event
    writer's header segment), and a transient segment takes merges only from a sibling."""
    if is_transient_segment(target):
        if not is_transient_segment(source) or primary_segment_name(source) != primary_segment_name(target) \
                or source == target:
            raise TransientSegmentError(
                f"transient segment {target!r} takes merges only from a sibling transient segment of the same "
                f"parent, not from {source!r}")
    elif is_transient_segment(source) and primary_segment_name(source) != target:
        raise TransientSegmentError(
            f"transient segment {source!r} merges only into its parent {primary_segment_name(source)!r} "
            f"(or a sibling transient segment), not into {target!r}")


class TransientSegments:
    """The transient segments of one server (see the module docstring).  Times are the server
    clock's ``monotonic()``; the caller passes them in."""

    def __init__(self, *, idle_seconds: float = limits.TRANSIENT_SEGMENT_IDLE_SECONDS,
                 grace_seconds: float = limits.TRANSIENT_SEGMENT_DISCONNECT_GRACE_SECONDS,
                 capacity: int = limits.TRANSIENT_SEGMENTS_PER_SERVER_MAX,
                 merges_remembered: int = limits.TRANSIENT_SEGMENT_MERGES_REMEMBERED_MAX,
                 writer_ids_max: int = limits.TRANSIENT_SEGMENT_ATTRIBUTES_MAX) -> None:
        self.idle_seconds = idle_seconds
        self.grace_seconds = grace_seconds
        self.capacity = capacity
        self.writer_ids_max = writer_ids_max
        self._active: dict[str, TransientRecord] = {}
        self._merges: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._merges_max = merges_remembered
        self._counter = 0
        #: What the server created, and deleted by cause (evidence for tests and the log).
        self.created_total = 0
        self.deleted_by: dict[str, int] = {"abort": 0, "disconnect": 0, "idle": 0}

    # --- queries ---------------------------------------------------------------------------------

    def get(self, name: str) -> TransientRecord | None:
        """The active record of ``name``, or None."""
        return self._active.get(name)

    def __len__(self) -> int:
        return len(self._active)

    def names(self) -> list[str]:
        return sorted(self._active)

    def merge_outcome(self, name: str) -> tuple[str, int] | None:
        """``(target, target length after the merge)`` if ``name`` was merged (and is remembered)."""
        return self._merges.get(name)

    # --- creation ----------------------------------------------------------------------------------

    def new_name(self, parent: str, writer_id: UUID) -> str:
        """A fresh name for a transient segment of ``parent`` (the caller creates it; a name that exists
        already -- a leftover of an earlier run -- is skipped by asking again).  Raises
        ``TransientSegmentError`` for a hidden parent or when the server tracks ``capacity`` of them."""
        if is_hidden_segment(parent):
            raise TransientSegmentError(f"a transient segment belongs to a stream segment, not to hidden segment "
                                        f"{parent!r}")
        if len(self._active) >= self.capacity:
            raise TransientSegmentError(f"the server holds {self.capacity} transient segments already; retry once "
                                        "some are merged, aborted or expired")
        self._counter += 1
        return transient_segment_name(parent, f"{writer_id.hex}{self._counter:08x}")

    def created(self, name: str, parent: str, writer_id: UUID, user: Hashable, now: float) -> TransientRecord:
        """``name`` was created for ``writer_id`` by ``user`` (a connection), which is attached to it."""
        if name in self._active:
            raise InternalError(f"transient segment {name!r} created twice")
        record = self._active[name] = TransientRecord(name, parent, now)
        self.created_total += 1
        self.attach(name, user, writer_id, now)
        return record

    def adopt(self, name: str, now: float) -> bool:
        """Track ``name``, found in a container without a record (recovered after a restart): a fresh
        idle period, and the grace period running from now.  Returns whether it was new."""
        if name in self._active or TRANSIENT_DELIMITER not in name:
            return False
        self._active[name] = TransientRecord(name, primary_segment_name(name), now)
        return True

    # --- use ---------------------------------------------------------------------------------------

    def attach(self, name: str, user: Hashable, writer_id: UUID, now: float) -> None:
        """``user`` set up appends to ``name`` as ``writer_id`` (or created it).  Raises
        ``TransientSegmentError`` when that would be one writer id more than ``writer_ids_max``."""
        record = self._active.get(name)
        if record is None:
            record = self._active[name] = TransientRecord(name, primary_segment_name(name), now)
        if writer_id not in record.writer_ids:
            if len(record.writer_ids) >= self.writer_ids_max:
                raise TransientSegmentError(f"transient segment {name!r} has {self.writer_ids_max} writer ids "
                                            "already (its attribute limit)")
            record.writer_ids.add(writer_id)
        record.users.add(user)
        record.detached_at = None
        record.last_used = now

    def touch(self, name: str, now: float) -> None:
        """``name`` was used (an append, a merge into it): its idle period starts again."""
        record = self._active.get(name)
        if record is not None:
            record.last_used = now

    def connection_closed(self, user: Hashable, now: float) -> None:
        """``user`` closed: segments nobody uses any more start their grace period."""
        for record in self._active.values():
            if user in record.users:
                record.users.discard(user)
                if not record.users:
                    record.detached_at = now

    # --- endings -----------------------------------------------------------------------------------

    def merged(self, name: str, target: str, target_length: int) -> None:
        record = self._active.pop(name, None)
        if record is not None:
            record.move(TransientState.MERGED)
        self._merges[name] = (target, target_length)
        self._merges.move_to_end(name)
        while len(self._merges) > self._merges_max:
            self._merges.popitem(last=False)

    def deleted(self, name: str, cause: str = "abort") -> None:
        """``name`` is gone (deleted, or found missing).  ``cause`` counts it in ``deleted_by``."""
        record = self._active.pop(name, None)
        if record is not None:
            record.move(TransientState.DELETED)
            self.deleted_by[cause] = self.deleted_by.get(cause, 0) + 1

    def due(self, now: float) -> list[tuple[str, str]]:
        """``(name, cause)`` of every transient segment to delete now: past its grace period with nobody
        attached ("disconnect"), or idle for ``idle_seconds`` ("idle")."""
        found = []
        for name, record in self._active.items():
            if record.detached_at is not None and now - record.detached_at >= self.grace_seconds:
                found.append((name, "disconnect"))
            elif now - record.last_used >= self.idle_seconds:
                found.append((name, "idle"))
        return found

    def check_invariants(self) -> None:
        for name, record in self._active.items():
            assert record.name == name and record.state is TransientState.ACTIVE, record
            assert is_transient_segment(name) and primary_segment_name(name) == record.parent, record
            assert (record.detached_at is None) == bool(record.users), record
            assert len(record.writer_ids) <= self.writer_ids_max, record
            assert name not in self._merges, record
        assert len(self._merges) <= self._merges_max
