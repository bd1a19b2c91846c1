"""``millstream segment ...``, ``millstream write`` and ``millstream read``: the client from the shell.

Each command connects to a running server (``millstream standalone`` prints its address), does its job
with the blocking ``millstream.Client`` and exits.  Errors from the server are printed as one line
naming the error (``StreamSegmentNotExistsError: ...``) with exit status 1.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import click

from millstream import limits
from millstream.cli._common import (
    _client,
    _connection_options,
    _count,
    _group_name,
    _position_prefix,
    _print_group_reads,
    _read_as_reader,
    _stream_name,
    _stream_segments,
)
from millstream.cli._group import main
from millstream.cli._output import EventPrinter, output_options
from millstream.cli._progress import Progress

__all__ = ["read", "segment", "write"]

_FLUSH_EVENTS_MAX = limits.CLI_WRITE_FLUSH_EVENTS
_RECONNECT_BUDGET_DEFAULT = limits.CLIENT_RECONNECT_BUDGET_SECONDS


class _BudgetType(click.ParamType):  # type: ignore[type-arg]  # (generic only in click >= 8.2)
    """A positive number of seconds, or ``forever`` (also ``inf``, ``none``): no limit."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            number = float(value)
        elif str(value).strip().lower() in ("forever", "inf", "none"):
            return math.inf
        else:
            try:
                number = float(value)
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds or 'forever'", param, ctx)
        if not number > 0:
            self.fail(f"{value!r} must be positive (or 'forever')", param, ctx)
        return number


# --- millstream segment ----------------------------------------------------------------------------


@main.group(short_help="Create, inspect, seal, truncate or delete segments on a server.")
def segment() -> None:
    """Work with segments by name on a running server.

    A segment is an append-only sequence of bytes with a name, such as `demo/events/0`.  Writers
    append events to segments (`millstream write`); readers read them back from an offset
    (`millstream read`).

    \b
    Example, with `millstream standalone --data-dir ./data` running:
      millstream segment create demo/events/0
      echo hello | millstream write --segment demo/events/0
      millstream read --segment demo/events/0
      millstream segment info demo/events/0
    """


@segment.command(short_help="Create empty segments.")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--exist-ok", is_flag=True, help="Do not fail if a segment exists already.")
@_connection_options
def create(names: tuple[str, ...], exist_ok: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Create each named segment (empty, open for appends)."""
    from millstream.errors import StreamSegmentExistsError

    with _client(uri, token, tls_ca) as client:
        for name in names:
            try:
                client.segments().create(name)
                click.echo(f"created {name}")
            except StreamSegmentExistsError:
                if not exist_ok:
                    raise
                click.echo(f"exists  {name}")


@segment.command(short_help="Show a segment's length, start offset and state.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@_connection_options
def info(name: str, as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Show a segment's length (bytes ever appended), start offset (below it, bytes were truncated
    away) and whether it is sealed."""
    with _client(uri, token, tls_ca) as client:
        properties = client.segments().info(name)
    fields = {"name": properties.name, "length": properties.length, "start_offset": properties.start_offset,
              "sealed": properties.sealed, "last_modified_ms": properties.last_modified_ms}
    if as_json:
        click.echo(json.dumps(fields))
        return
    for key, value in fields.items():
        click.echo(f"{key + ':':<18}{str(value).lower() if isinstance(value, bool) else value}")


@segment.command("list", short_help="List the segments of a stream, or of every stream of a scope.")
@click.argument("target", metavar="SCOPE[/STREAM]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list of objects instead of a table.")
@_connection_options
def segment_list(target: str, as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """List the segments of SCOPE/STREAM (or of every stream of SCOPE) that still hold data: the
    current epoch's and the sealed ones of earlier epochs that were not truncated away.  For each:
    its id (which packs the epoch that made it with its number), its key range, whether it is
    sealed, its start offset (below it, bytes were truncated away), its length (bytes ever appended)
    and the bytes it holds (length - start offset).

    \b
    Examples:
      millstream segment list iot/sensors
      millstream segment list iot --json
    """
    from millstream.client import split_stream_name
    from millstream.errors import InvalidArgumentError
    from millstream.naming import validate_scope_or_stream_name

    try:
        if "/" in target:
            split_stream_name(target)
        else:
            validate_scope_or_stream_name(target, what="scope")
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), param_hint="SCOPE[/STREAM]") from None
    with _client(uri, token, tls_ca) as client:
        streams = [target] if "/" in target else \
            [f"{target}/{name}" for name in client.stream_manager().list_streams(target)]
        rows = [row for stream in streams for row in _stream_segments(client, stream)]
    if as_json:
        click.echo(json.dumps(rows, sort_keys=True))
        return
    click.echo(f"{'SEGMENT':<28} {'ID':>14} {'EPOCH':>5}  {'KEYS':<19} {'STATE':<7} {'START':>12} {'LENGTH':>12}")
    for row in rows:
        state = "sealed" if row["sealed"] else "open"
        keys = f"[{row['key_start']:.4f}, {row['key_end']:.4f})"
        click.echo(f"{row['name']:<28} {row['id']:>14} {row['epoch']:>5}  {keys:<19} {state:<7} "
                   f"{row['start_offset']:>12} {row['length']:>12}")


@segment.command(short_help="Seal a segment: no more appends.")
@click.argument("name")
@_connection_options
def seal(name: str, uri: str, token: str, tls_ca: Path | None) -> None:
    """Seal a segment.  Readers then see its end; writers get StreamSegmentSealedError.  Sealing a
    sealed segment succeeds."""
    with _client(uri, token, tls_ca) as client:
        client.segments().seal(name)
    click.echo(f"sealed {name}")


# (ignore_unknown_options: so that "-1" reaches OFFSET and is refused as a negative offset, rather
# than taken for an option that does not exist.)
@segment.command(short_help="Drop a segment's bytes below an offset.",
                 context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("offset", type=click.IntRange(min=0))
@_connection_options
def truncate(name: str, offset: int, uri: str, token: str, tls_ca: Path | None) -> None:
    """Truncate a segment: its bytes below OFFSET are dropped and it starts at OFFSET.  In a segment
    of events (any segment but a byte stream's) OFFSET must be where an event begins --
    `millstream read --show-offsets` prints them -- or the segment's length; an offset inside an
    event is refused (BadOffsetError) and nothing changes."""
    with _client(uri, token, tls_ca) as client:
        client.segments().truncate(name, offset)
    click.echo(f"truncated {name} at {offset}")


@segment.command(short_help="Delete a segment and its data.")
@click.argument("name")
@_connection_options
def delete(name: str, uri: str, token: str, tls_ca: Path | None) -> None:
    """Delete a segment and everything in it."""
    with _client(uri, token, tls_ca) as client:
        client.segments().delete(name)
    click.echo(f"deleted {name}")


# --- millstream write ------------------------------------------------------------------------------


def _lines(stream: IO[bytes]) -> Iterator[tuple[bytes, int]]:
    """Each line without its line end, and how many bytes it took (line end included)."""
    for line in stream:
        if line.endswith(b"\r\n"):
            yield line[:-2], len(line)
        elif line.endswith(b"\n"):
            yield line[:-1], len(line)
        else:
            yield line, len(line)


class _Resume:
    """Where ``write``'s input stands: the input position of every event written since the last
    flush (bounded by ``--flush-every``), so that after an interruption it can say how much is
    durable and where to resume -- the first event not acknowledged, as a line and byte offset."""

    def __init__(self, sources: list[str], whole_files: bool) -> None:
        self.sources = sources
        self.whole_files = whole_files
        self.flushed = 0  # events durable through the last flush
        self.since_flush: list[tuple[int, int, int]] = []  # (source index, line, byte offset), one per event
        self.next: tuple[int, int, int] = (0, 1, 0)  # the input position after the last event read

    def written(self, source: int, line: int, offset: int, length: int) -> None:
        self.since_flush.append((source, line, offset))
        self.next = (source, line + 1, offset + length)

    def flushed_all(self) -> None:
        self.flushed += len(self.since_flush)
        self.since_flush.clear()

    def where(self, position: tuple[int, int, int]) -> str:
        source, line, offset = position
        name = self.sources[source] if source < len(self.sources) else self.sources[-1]
        if self.whole_files:
            return f"file {name}"
        return f"line {line} of {name} (byte offset {offset})"

    def report(self, written: int, in_doubt: tuple[Any, ...], why: str) -> str:
        """What is durable and where to resume, for stderr."""
        acknowledged = written - len(in_doubt)
        if not in_doubt:
            return (f"{why}: {_count(written, 'event')} written, all acknowledged (durable); resume at "
                    f"{self.where(self.next)}")
        first = min(event.sequence for event in in_doubt)
        index = first - self.flushed - 1
        position = self.since_flush[index] if 0 <= index < len(self.since_flush) else self.next
        return (f"{why}: {_count(acknowledged, 'event')} of {written} acknowledged (durable); "
                f"{_count(len(in_doubt), 'event')} in doubt (may or may not be stored), the first at "
                f"{self.where(position)}: resume there (every event before it is durable)")


class _Interrupts:
    """Ctrl-C for ``write``: the first one, while an event is being handed to the writer, only asks to
    stop after it (the writer's per-event path is never cut in the middle); anywhere else -- reading
    the input, waiting for a flush -- and the second one at once, it raises ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.presses = 0
        self.writing = False
        self._previous: Any = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.presses += 1
        if self.writing and self.presses == 1:
            return  # ``after_write`` raises it once the event is in
        raise KeyboardInterrupt

    def after_write(self) -> None:
        self.writing = False
        if self.presses:
            raise KeyboardInterrupt


def _key_of_field(field: str) -> Callable[[bytes, str], str]:
    """The routing key of an event that is a JSON object: the value of its ``field`` (a string as it
    is, a number or boolean as its JSON text).  Anything else is bad input, named by ``where``."""
    def key_of(event: bytes, where: str) -> str:
        try:
            value = json.loads(event)
        except ValueError as error:
            raise click.ClickException(f"{where} is not JSON, so --key-field {field} finds no key in it: {error}") \
                from None
        if not isinstance(value, dict) or field not in value:
            raise click.ClickException(f"{where} is not a JSON object with a field {field!r} (--key-field)")
        key = value[field]
        if isinstance(key, str):
            return key
        if isinstance(key, (int, float, bool)):
            return json.dumps(key)
        raise click.ClickException(f"{where}: field {field!r} is {json.dumps(key)[:40]}, not a string or number "
                                   "(--key-field)")
    return key_of


@main.command(short_help="Append events to a stream or to segments: lines from stdin, or files.")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
                metavar="[FILE...]")
@click.option("--stream", default=None, metavar="SCOPE/STREAM",
              help="Stream to write to (it must exist: `millstream stream create`).  Routing keys pick its "
                   "segments, and the writer follows the stream as it scales.")
@click.option("--segment", "segments", multiple=True, metavar="NAME",
              help="Segment to write to, instead of a stream (repeat it to spread events over several: events "
                   "with the same routing key always go to the same one).")
@click.option("--routing-key", default=None, metavar="KEY",
              help="Routing key for every event (default: none; events are spread evenly).")
@click.option("--key-field", default=None, metavar="FIELD",
              help="Each event is a JSON object; its FIELD (a string or number) is its routing key.")
@click.option("--whole-files", is_flag=True,
              help="Each FILE is one event (default: each line is one event, without its newline).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show progress on stderr: each file as it starts, and the events made durable at each flush.")
@click.option("--flush-every", type=click.IntRange(1, _FLUSH_EVENTS_MAX), default=_FLUSH_EVENTS_MAX,
              show_default=True, metavar="EVENTS",
              help="Wait until everything written is durable after this many events (and report progress).")
@click.option("--reconnect-budget", "reconnect_budget", type=_BudgetType(), default=None, metavar="SECONDS",
              help="How long one outage of the server may last before the command gives up (a number of "
                   "seconds, or 'forever').  [default: the client's, "
                   f"{_RECONNECT_BUDGET_DEFAULT:g}]")
@_connection_options
def write(files: tuple[Path, ...], stream: str | None, segments: tuple[str, ...], routing_key: str | None,
          key_field: str | None, whole_files: bool, progress: bool, flush_every: int, reconnect_budget: float | None,
          uri: str, token: str, tls_ca: Path | None) -> None:
    """Append events to a stream (or to segments) and wait until they are durable.

    With no FILE (or FILE `-`), each line of standard input is one event.  With FILEs, each line of
    each file is one event, or each whole file with --whole-files.  The stream, or the segments, must
    exist.  Events with the same routing key (--routing-key for all of them, or --key-field to take
    each one's from its JSON) keep their order, also while the stream scales.  The command returns
    once every event is acknowledged: written to disk on the server.  Each event is written exactly
    once, even if the connection breaks or a segment is sealed by a scale.

    If it is interrupted (Ctrl-C: it first waits for what it wrote to become durable; Ctrl-C again
    stops at once) or the server stays away longer than --reconnect-budget, it says on stderr how
    many events are durable and where to resume -- the line (and byte offset) of the first event not
    acknowledged -- and exits non-zero (130 after Ctrl-C, 1 otherwise).

    \b
    Examples:
      printf 'a\\nb\\nc\\n' | millstream write --stream iot/sensors --routing-key sensor-17
      millstream write --stream iot/sensors --key-field id readings.jsonl
      printf 'a\\nb\\nc\\n' | millstream write --segment demo/events/0
      millstream write --segment demo/logs/0 app.log
      millstream write --segment demo/images/0 --whole-files *.png
    """
    if (stream is None) == (not segments):
        raise click.UsageError("give --stream SCOPE/STREAM or --segment NAME (one or more), not both")
    if routing_key is not None and key_field is not None:
        raise click.UsageError("--routing-key gives every event the same key; --key-field takes each one's from "
                               "its JSON: choose one")
    if stream is not None:
        _stream_name(stream)
    if whole_files and (not files or any(str(f) == "-" for f in files)):
        raise click.UsageError("--whole-files needs FILE arguments (standard input is read as lines)")
    from millstream.client import ClientConfig
    from millstream.errors import MillstreamError, ReconnectBudgetExceededError

    key_of = _key_of_field(key_field) if key_field is not None else None
    sources = list(files) or [Path("-")]
    names = ["stdin" if str(source) == "-" else str(source) for source in sources]
    resume = _Resume(names, whole_files)
    config = None if reconnect_budget is None else ClientConfig(reconnect_budget_seconds=reconnect_budget)
    count = size = 0
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(_client(uri, token, tls_ca, config=config))
        report = Progress(stack, "write") if progress and (len(sources) > 1 or whole_files) else None
        writer = client.event_writer(stream if stream is not None else list(segments))

        def flush(done: str) -> None:
            writer.flush()
            resume.flushed_all()
            if progress and report is None:  # one input: report the events made durable
                click.echo(f"{done}: {_count(count, 'event')} ({_count(size, 'byte')}) durable", err=True)

        def stopped(why: str, in_doubt: tuple[Any, ...] | None, exit_code: int) -> None:
            if in_doubt is None:
                in_doubt = writer.in_doubt_events()
            click.echo(resume.report(writer.events_written, in_doubt, why), err=True)
            with contextlib.suppress(MillstreamError):
                writer.close(flush=False)
            raise click.exceptions.Exit(exit_code)

        interrupts = stack.enter_context(_Interrupts())
        try:
            for index, source in enumerate(sources):
                if report is not None:
                    report(index, len(sources), names[index])
                if whole_files:
                    data = source.read_bytes()
                    events: Iterator[tuple[bytes, int]] = iter([(data, len(data))])
                elif str(source) == "-":
                    events = _lines(sys.stdin.buffer)
                else:
                    events = _lines(stack.enter_context(source.open("rb")))
                name = names[index]
                offset = 0
                for number, (event, length) in enumerate(events, 1):
                    key = routing_key
                    if key_of is not None:
                        try:
                            key = key_of(event, name if whole_files else f"line {number} of {name}")
                        except click.ClickException as error:  # what was written before it stays written
                            writer.close()
                            raise click.ClickException(f"{error.message}; the {_count(count, 'event')} before it "
                                                       "were written") from None
                    interrupts.writing = True
                    writer.write_event(event, routing_key=key)
                    resume.written(index, number, offset, length)
                    interrupts.after_write()
                    offset += length
                    count += 1
                    size += len(event)
                    if len(resume.since_flush) >= flush_every:
                        flush(f"{name}, line {number}")
            if report is not None:
                report(len(sources), len(sources), "flushing")
            writer.flush()
            resume.flushed_all()
            writer.close()
        except KeyboardInterrupt:
            try:  # stop reading, and let what was written become durable (Ctrl-C again: stop waiting)
                writer.flush()
                resume.flushed_all()
            except (KeyboardInterrupt, MillstreamError):
                pass
            stopped("interrupted", None, 130)
        except ReconnectBudgetExceededError as error:
            click.echo(f"Error: {type(error).__name__}: {error}", err=True)
            stopped("the server was lost", error.in_doubt, 1)
    where = f"stream {stream}" if stream is not None else segments[0] if len(segments) == 1 else \
        f"{len(segments)} segments"
    click.echo(f"wrote {_count(count, 'event')} ({_count(size, 'byte')}) to {where}; all durable", err=True)


# --- millstream read -------------------------------------------------------------------------------


def _start_cut(manager: Any, stream: str, start: str) -> Any:
    """``--from``: ``head``, ``tail`` or a stream cut as JSON (``{"<segment id>": offset, ...}``)."""
    from millstream.client import StreamCut
    from millstream.errors import InvalidArgumentError

    if start == "head":
        return manager.head_cut(stream)
    if start == "tail":
        return manager.tail_cut(stream)
    try:
        return StreamCut.from_wire(stream, json.loads(start))
    except (InvalidArgumentError, ValueError) as error:
        raise click.BadParameter(f"head, tail or a stream cut such as '{{\"0\": 120}}', not {start!r}: {error}",
                                 param_hint="--from") from None


def _read_stream(client: Any, stream: str, start: str, follow: bool, max_events: int | None,
                 printer: Any) -> tuple[int | None, bool]:
    """``read --stream``: read the stream through a reader group of its own, with one reader, and
    delete the group afterwards however the read ends (Ctrl-C, an error, a closed pipe).

    Why a group rather than plain segment readers over a stream cut: the group is what orders each
    key's events across scaling -- a successor is read only once all its predecessors are -- and what
    finds the successors as the stream scales while we follow it; reading the segments by hand would
    redo that.  The group's name (``SCOPE/cli-read-<random>``) says what it is, should the process be
    killed before it can delete it (`millstream group delete` removes it then).  Without --follow the
    group ends at the stream's tail when the command starts, so the read stops exactly there."""
    from millstream.client import ReaderGroupConfig
    from millstream.errors import MillstreamError

    manager = client.stream_manager()
    start_cut = _start_cut(manager, stream, start)
    end_cut = None if follow else manager.tail_cut(stream)
    scope = stream.partition("/")[0]
    group_name = f"cli-read-{uuid.uuid4().hex[:12]}"
    config = ReaderGroupConfig({stream: (start_cut, end_cut)}, automatic_checkpoint_seconds=0)
    controller = client.async_client.controller()
    client.run(controller.create_reader_group(scope, group_name, config))
    try:
        return _read_as_reader(client, f"{scope}/{group_name}", "cli", printer, follow=True, idle_seconds=math.inf,
                               max_events=max_events)
    finally:
        try:
            client.run(controller.delete_reader_group(scope, group_name), timeout=limits.CLI_CLEANUP_TIMEOUT_SECONDS)
        except MillstreamError as error:  # (RequestTimeoutError too: a stopped command must end)
            click.echo(f"could not delete the reader group {scope}/{group_name} this read used "
                       f"({type(error).__name__}: {error}); `millstream group delete {scope}/{group_name}` "
                       "removes it", err=True)


@main.command(short_help="Print the events of a stream, a segment or a group's reader; optionally follow.")
@click.option("--stream", default=None, metavar="SCOPE/STREAM",
              help="Stream to read: every segment, each routing key's events in order, across scaling (through a "
                   "reader group of its own that is deleted afterwards: with tokens, a read-write token for the "
                   "scope).")
@click.option("--from", "start", default=None, metavar="head|tail|CUT",
              help='With --stream: start at the head (its oldest data kept), at the tail (only what is written '
                   'from now on), or at a stream cut {"<segment id>": offset, ...} as `stream describe --json` '
                   'prints them.  [default: head]')
@click.option("--segment", "name", default=None, metavar="NAME", help="Segment to read.")
@click.option("--group", default=None, metavar="SCOPE/GROUP",
              help="Read as one reader of this reader group (as `millstream group read`).")
@click.option("--reader-id", default=None, help="With --group: this reader's id in the group.  [default: a new one]")
@click.option("--offset", type=click.IntRange(min=0), default=None,
              help="With --segment: where to start, the offset of an event (see --show-offsets).  [default: the "
                   "segment's first byte that was not truncated away]")
@click.option("--follow", "-f", is_flag=True,
              help="Keep reading new events as they arrive, until the segment is sealed (the stream sealed) or "
                   "Ctrl-C.")
@click.option("--max-events", type=click.IntRange(min=1), default=None, help="Stop after this many events.")
@click.option("--show-offsets", is_flag=True,
              help="Print each event's offset and a tab before it (--stream, --group: its segment, a tab, its "
                   "offset and a tab).")
@output_options
@_connection_options
def read(stream: str | None, start: str | None, name: str | None, group: str | None, reader_id: str | None,
         offset: int | None, follow: bool, max_events: int | None, show_offsets: bool, output_format: str, null: bool,
         length_prefixed: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Print the events of a stream (--stream), of one segment (--segment) or those a reader group
    hands one reader (--group), one per line -- or as --format says: `json` (one object per event,
    with its segment and offset; the payload in base64 when it is not UTF-8), `raw` with
    --length-prefixed, or -0 (NUL after each event) when events may contain newlines.

    A stream is read in order per routing key, across scaling (its events with one key come in the
    order they were written; keys interleave).  Without --follow it stops at the stream's tail (the
    segment's end; a group reader once idle for a second).  With --follow it waits for new events
    (long polling: no busy loop) until the stream or segment is sealed and read to its end, or until
    Ctrl-C; for a segment it then prints, on stderr, the offset to resume from.

    \b
    Examples:
      millstream read --stream iot/sensors
      millstream read --stream iot/sensors --from tail --follow --format json
      millstream read --stream iot/sensors --from '{"0": 120}' --max-events 10
      millstream read --segment demo/events/0 --follow --show-offsets
      millstream read --segment demo/events/0 --offset 120 --max-events 10 -0
      millstream read --segment demo/images/0 --format raw --length-prefixed > images.bin
      millstream read --group iot/analytics --reader-id r1 --follow
    """
    from millstream import limits

    if (stream is not None) + (name is not None) + (group is not None) != 1:
        raise click.UsageError("give exactly one of --stream, --segment and --group")
    if start is not None and stream is None:
        raise click.UsageError("--from is for --stream (--segment starts at --offset)")
    if offset is not None and name is None:
        raise click.UsageError("--offset is for --segment; a group reader starts at the group's position, a stream "
                               "reader at --from")
    if reader_id is not None and group is None:
        raise click.UsageError("--reader-id is for --group")
    if group is not None:
        _print_group_reads(_group_name(group), reader_id or f"cli-{uuid.uuid4().hex[:12]}", follow=follow,
                           idle_seconds=1.0, max_events=max_events, show_positions=show_offsets,
                           output_format=output_format, null=null, length_prefixed=length_prefixed,
                           uri=uri, token=token, tls_ca=tls_ca)
        return
    if stream is not None:
        _stream_name(stream)
        printer = EventPrinter(sys.stdout.buffer, output_format, null=null, length_prefixed=length_prefixed,
                               prefix=_position_prefix if show_offsets else None)
        with _client(uri, token, tls_ca) as client:
            printed, ended = _read_stream(client, stream, start or "head", follow, max_events, printer)
        if printed is not None:
            end = " (the stream is sealed: this is its end)" if ended and follow else ""
            click.echo(f"read {_count(printed, 'event')} from {stream}{end}", err=True)
        return
    assert name is not None
    out = sys.stdout.buffer
    printer = EventPrinter(out, output_format, null=null, length_prefixed=length_prefixed,
                           prefix=(lambda _, event_offset: b"%d\t" % event_offset) if show_offsets else None)
    printed = 0
    wait_seconds = limits.TAIL_READ_WAIT_SECONDS_MAX if follow else 0.0
    with _client(uri, token, tls_ca) as client:
        if offset is None:
            offset = client.segments().info(name).start_offset
        reader = client.segment_reader(name, offset=offset)
        try:
            while max_events is None or printed < max_events:
                if not reader.pending_events:
                    out.flush()  # the next read may wait: show what we have
                event = reader.read_event(wait_seconds=wait_seconds)
                if event is None:
                    if reader.end_of_segment or not follow:
                        break
                    continue
                printer.print(event.value, name, event.offset)
                printed += 1
            out.flush()
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                out.flush()
            click.echo(f"\nstopped after {_count(printed, 'event')}; resume with --offset {reader.offset}", err=True)
            sys.exit(130)
        except BrokenPipeError:  # whoever read our output went away (e.g. `| head`): that is fine
            with contextlib.suppress(OSError):
                os.close(sys.stdout.fileno())
            return
        end = " (the segment is sealed: this is its end)" if reader.end_of_segment else ""
        click.echo(f"read {_count(printed, 'event')}; next offset {reader.offset}{end}", err=True)
