"""``--log-level``, ``--log-format text|json`` and ``--quiet``: how the long-running commands log.

Every long-running command (``standalone``, ``serve``, ``pipeline run``, ``demo``) takes the three
options (``logging_options``; ``report_logging_options`` for the commands whose output is a report:
warnings only by default) and calls ``configure_logging`` before it starts.  Logs go to stderr,
one line per event: as text (``TIME LEVEL LOGGER: MESSAGE``), or as JSON lines -- one object per
line with ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` and the event's fields (what
the code passed as ``extra=``; e.g. ``uri`` and ``data_dir`` when a node starts), and
``exception`` with the traceback of an error.  ``--quiet`` is for scripts: only warnings and errors,
and no progress lines; what a command prints on stdout for scripts to read (the "listening on"
line) stays.  Messages a peer can provoke are rate-limited where they are logged
(``millstream.rate_limited_log``), so a flood becomes a summary per minute in either format.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "configure_logging", "logging_options", "make_logging_options",
           "report_logging_options"]

F = TypeVar("F", bound=Callable[..., Any])

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")

#: The attributes every ``LogRecord`` has: whatever else it carries came from ``extra=``.
_STANDARD_ATTRIBUTES: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's extra fields, and the
    exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_") and key not in entry:
                entry[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


#: The handler ``configure_logging`` installed last (replaced by the next call; others' are left alone).
_installed: list[logging.Handler] = []


def configure_logging(level: str = "info", log_format: str = "text", quiet: bool = False) -> None:
    """Send the root logger's records of ``level`` and above (``warning`` with ``quiet``) to stderr in
    ``log_format`` (replacing the handler an earlier call installed; handlers others installed stay)."""
    root = logging.getLogger()
    while _installed:
        root.removeHandler(_installed.pop())
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    _installed.append(handler)
    effective = "warning" if quiet and LOG_LEVELS.index(level) < LOG_LEVELS.index("warning") else level
    root.setLevel(effective.upper())


def make_logging_options(level_default: str) -> Callable[[F], F]:
    """A decorator adding --log-level (default ``level_default``), --log-format and --quiet (each
    with its MILLSTREAM_* variable)."""

    def decorate(command: F) -> F:
        command = click.option(
            "--quiet", "-q", is_flag=True, default=False, envvar="MILLSTREAM_QUIET", show_envvar=True,
            help="For scripts: log only warnings and errors, and print no progress lines (what goes to "
                 "stdout for scripts to read stays).")(command)
        command = click.option(
            "--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
            envvar="MILLSTREAM_LOG_FORMAT", show_envvar=True,
            help="Logs on stderr as text lines, or as JSON lines (one object per line: time, level, logger, "
                 "message and the event's fields).")(command)
        command = click.option(
            "--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default=level_default,
            show_default=True, envvar="MILLSTREAM_LOG_LEVEL", show_envvar=True,
            help="The least severe log records written.")(command)
        return command
    return decorate


#: The options of a node (``standalone``, ``serve``): it says what it does at INFO.
logging_options = make_logging_options("info")

#: The options of a command whose output is its report (``pipeline run``, ``demo``): only warnings
#: and errors by default, as before these options existed.
report_logging_options = make_logging_options("warning")
