"""How ``millstream read`` and ``millstream group read`` print events: ``--format``, ``-0`` and
``--length-prefixed``, shared by every command that prints events.

An event is any bytes, newlines and NULs included, so one line per event is ambiguous for some
streams.  The choices, each unambiguous for the events it suits:

* ``lines`` (the default): the payload, then a newline (``-0``: a NUL).  For text without newlines
  (``-0``: without NULs) -- what ``millstream write`` writes from lines.
* ``json``: one JSON object per line (``-0``: per NUL): ``{"segment": ..., "offset": ...,
  "payload": ..., "encoding": "utf-8"}``, or ``"encoding": "base64"`` with the payload in base64
  when it is not UTF-8.  Always unambiguous.  Events carry no routing key in a segment (the key only
  picks the segment when the event is written), so the object has none.
* ``raw``: the payloads exactly as stored, with nothing between them -- unless ``--length-prefixed``
  puts each one's length (4 bytes, big-endian) before it, or ``-0`` a NUL after it.  For one event
  (a file written with ``write --whole-files``) or for programs that read length-prefixed records.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

__all__ = ["FORMATS", "EventPrinter", "output_options"]

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("lines", "json", "raw")

#: ``--length-prefixed`` writes a length as 4 bytes: an event is far below 4 GiB
#: (``limits.EVENT_LENGTH_BYTES_MAX``; a large event is at most ``limits.LARGE_EVENT_LENGTH_BYTES_MAX``,
#: 1 GiB, also below it).
_LENGTH_PREFIX_BYTES = 4


def output_options(command: F) -> F:
    """--format, -0/--null and --length-prefixed."""
    command = click.option(
        "--length-prefixed", is_flag=True,
        help="With --format raw: put each event's length (4 bytes, big-endian) before it.")(command)
    command = click.option(
        "--null", "-0", "null", is_flag=True,
        help="End each event with a NUL byte instead of a newline (for `xargs -0`, events with newlines).")(command)
    command = click.option(
        "--format", "output_format", type=click.Choice(FORMATS), default="lines", show_default=True,
        help="lines: each event then a newline; json: one JSON object per event (segment, offset, payload, "
             "its encoding: utf-8, or base64 when not UTF-8); raw: the bytes as stored (see --length-prefixed)."
    )(command)
    return command


class EventPrinter:
    """Writes events to ``out`` (a binary stream) in one of ``FORMATS``.  ``prefix`` (``lines`` only):
    what ``--show-offsets``/``--show-positions`` print before an event, given its segment and offset."""

    def __init__(self, out: IO[bytes], output_format: str, *, null: bool = False, length_prefixed: bool = False,
                 prefix: Callable[[str, int], bytes] | None = None) -> None:
        if output_format not in FORMATS:
            raise click.BadParameter(f"--format is one of {', '.join(FORMATS)}, not {output_format!r}")
        if length_prefixed and output_format != "raw":
            raise click.UsageError("--length-prefixed goes with --format raw (lines and json end each event instead)")
        if length_prefixed and null:
            raise click.UsageError("choose --length-prefixed or --null (-0): either one delimits events")
        if prefix is not None and output_format != "lines":
            raise click.UsageError("--show-offsets/--show-positions go with --format lines (json shows the "
                                   "segment and offset in each object)")
        self._out = out
        self._format = output_format
        self._length_prefixed = length_prefixed
        self._prefix = prefix
        self._end = b"\0" if null else b"\n" if output_format != "raw" else b""

    def print(self, payload: bytes, segment: str, offset: int) -> None:
        """Write one event: ``payload``, read at ``offset`` of ``segment``."""
        out = self._out
        if self._format == "json":
            out.write(json_line(payload, segment, offset).encode())
        else:
            if self._prefix is not None:
                out.write(self._prefix(segment, offset))
            if self._length_prefixed:
                out.write(len(payload).to_bytes(_LENGTH_PREFIX_BYTES, "big"))
            out.write(payload)
        out.write(self._end)


def json_line(payload: bytes, segment: str, offset: int) -> str:
    """The ``--format json`` object of one event (without its line end)."""
    try:
        text, encoding = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode("ascii"), "base64"
    return json.dumps({"segment": segment, "offset": offset, "payload": text, "encoding": encoding})
