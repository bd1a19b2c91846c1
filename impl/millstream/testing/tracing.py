"""Recording what the write path reports, in the spec's vocabulary (see ``segmentstore.tracing``)."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["TraceEvent", "TraceRecorder"]


@attrs.frozen
class TraceEvent:
    """One recorded event: the spec action it corresponds to and its fields."""

    action: str
    fields: dict[str, Any] = attrs.field(factory=dict, hash=False)


class TraceRecorder:
    """A tracer that keeps every event, normalized to match the spec's actions:

    * ``Persist`` says "frames up to k are durable"; it may be reported by the log and again by the
      container.  The recorder emits one ``Persist`` per frame, in order, exactly once.
    * A container reports ``Recover`` on every start; the spec's ``Recover`` follows a stop only,
      so a ``Recover`` with no ``Crash`` or ``FailWrite`` before it is the spec's ``Init`` and dropped.
    """

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []
        self._persisted = 0
        self._stopped = False

    def __call__(self, action: str, /, **fields: Any) -> None:
        if action == "Persist":
            frame = fields["frame"]
            while self._persisted < frame:
                self._persisted += 1
                self.events.append(TraceEvent("Persist", {"frame": self._persisted}))
            return
        if action in ("Crash", "FailWrite"):
            if self._stopped:
                return  # one stop per incarnation: a crash after a failure changes nothing
            self._stopped = True
        elif action == "Recover":
            if not self._stopped:
                return
            self._stopped = False
        self.events.append(TraceEvent(action, dict(fields)))

    def persisted(self, sequence: int) -> None:
        """Hook for ``SimulatedLogStorage(on_persisted=...)``."""
        self("Persist", frame=sequence)

    def take(self) -> list[TraceEvent]:
        """The events recorded since the last ``take``."""
        events, self.events = self.events, []
        return events
