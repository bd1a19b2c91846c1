"""A log that a flood cannot flood: repeated messages of a kind are counted and summarized.

Theory of operation.  Some messages are caused by peers -- a connection closed for bad input, a token
refused, a connection refused because the server is full -- and a hostile or broken peer can cause
thousands a second.  ``RateLimitedLog.warning(message, *args)`` (and ``info``, ``error``, ``log``)
writes a message of a *kind* -- its format string, a literal in the code, unless ``kind=`` names one
-- at most ``burst`` times per window of ``window_seconds``; the rest of the window's messages of that
kind are only counted (formatting is skipped too), keeping the last one's arguments.  The first
message of a kind after its window ended starts a new window and, before it, writes one summary line
for the old one::

    WARNING ... 1234 more messages like 'closing connection %s: %s' in the last 60 s were not logged
    (the last: closing connection 127.0.0.1:40112: malformed input (...))

``flush()`` writes the summaries of windows that have ended even if no message of their kind came
since; the server calls it periodically and once more (``flush(force=True)``) when it stops, so a
burst is always accounted for.  Time comes from the injected clock; nothing here sleeps.  Kinds are
fixed strings in the code, so their number is small; ``kinds_max`` bounds it anyway (an unknown kind
past it shares the counts of the kind ``"other"``).
"""

from __future__ import annotations

import logging
from typing import Any

from millstream import limits
from millstream.clock import Clock

__all__ = ["RateLimitedLog"]

_OTHER = "other"


class _Window:
    __slots__ = ("last", "level", "logged", "started", "suppressed")

    def __init__(self, started: float) -> None:
        self.started = started
        self.logged = 0
        self.suppressed = 0
        self.level = logging.NOTSET
        self.last: tuple[str, tuple[Any, ...]] | None = None  # the last suppressed message, unformatted


class RateLimitedLog:
    """Writes to ``logger`` at most ``burst`` messages of each kind per ``window_seconds`` (on
    ``clock``), and one summary line per window for the ones it held back."""

    def __init__(self, logger: logging.Logger, clock: Clock, *, burst: int = limits.LOG_BURST_MAX,
                 window_seconds: float = limits.LOG_WINDOW_SECONDS, kinds_max: int = limits.LOG_KINDS_MAX) -> None:
        self.logger = logger
        self._clock = clock
        self._burst = burst
        self._window_seconds = window_seconds
        self._kinds_max = kinds_max
        self._windows: dict[str, _Window] = {}
        #: Messages not written (summarized instead), per kind, since this log was made (for tests
        #: and statistics).
        self.suppressed_total: dict[str, int] = {}

    def log(self, level: int, message: str, *args: Any, kind: str | None = None,
            exc_info: BaseException | None = None) -> bool:
        """Log ``message % args`` at ``level`` unless its kind (``kind``, else ``message`` itself) used
        up its burst in this window (then count it).  Returns whether it was written."""
        if not self.logger.isEnabledFor(level):
            return False
        if kind is None:
            kind = message
        now = self._clock.monotonic()
        window = self._windows.get(kind)
        if window is None:
            if len(self._windows) >= self._kinds_max and kind != _OTHER:
                kind = _OTHER
                window = self._windows.get(kind)
            if window is None:
                window = self._windows[kind] = _Window(now)
        elif now - window.started >= self._window_seconds:
            self._summarize(kind, window, now)
            window.started, window.logged = now, 0
        if window.logged < self._burst:
            window.logged += 1
            self.logger.log(level, message, *args, exc_info=exc_info)
            return True
        window.suppressed += 1
        window.level = max(window.level, level)
        window.last = (message, args)
        self.suppressed_total[kind] = self.suppressed_total.get(kind, 0) + 1
        return False

    def warning(self, message: str, *args: Any, kind: str | None = None) -> bool:
        return self.log(logging.WARNING, message, *args, kind=kind)

    def info(self, message: str, *args: Any, kind: str | None = None) -> bool:
        return self.log(logging.INFO, message, *args, kind=kind)

    def error(self, message: str, *args: Any, kind: str | None = None, exc_info: BaseException | None = None) -> bool:
        return self.log(logging.ERROR, message, *args, kind=kind, exc_info=exc_info)

    def flush(self, *, force: bool = False) -> None:
        """Write the summary of every window that has ended (every window, with ``force``) and held
        messages back; forget kinds that have been quiet for a whole window."""
        now = self._clock.monotonic()
        for kind, window in list(self._windows.items()):
            ended = now - window.started >= self._window_seconds
            if window.suppressed and (force or ended):
                self._summarize(kind, window, now)
                window.started, window.logged = now, 0
            elif ended:
                del self._windows[kind]

    def _summarize(self, kind: str, window: _Window, now: float) -> None:
        if not window.suppressed:
            return
        last = ""
        if window.last is not None:
            message, args = window.last
            try:
                last = message % args if args else message
            except (TypeError, ValueError):  # (a bad format string: say what it was)
                last = f"{message!r} % {args!r}"
        self.logger.log(window.level, "%d more messages like %r in the last %.0f s were not logged (the last: %s)",
                        window.suppressed, kind, now - window.started, last)
        window.suppressed, window.last, window.level = 0, None, logging.NOTSET

    def check_invariants(self) -> None:
        assert len(self._windows) <= self._kinds_max + 1
        for window in self._windows.values():
            assert 0 <= window.logged <= self._burst and window.suppressed >= 0
