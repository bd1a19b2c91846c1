"""What the client commands share: the connection options, the blocking client they connect with,
the names they check, and a group reader that prints (``read --group`` is ``group read``).

``client.py`` (segments, ``write``, ``read``), ``streams.py`` (scopes, streams) and ``groups.py``
(reader groups) each import these from here and none imports another, so a command module can be
read, or dropped, on its own.  This module adds no command (its name starts with ``_``, so the
package's ``__init__`` does not import it for one).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from millstream.cli._output import EventPrinter

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULT_URI = "tcp://127.0.0.1:9090"

#: ``group read`` without --follow waits this long for the group to give it segments before its idle
#: time starts counting anyway (a reader takes its first segments within one rebalancing time unit).
_FIRST_SEGMENTS_WAIT_SECONDS = 3.0


def _connection_options(command: F) -> F:
    """--uri, --token and --tls-ca, shared by every command here.  Each comes from the command line,
    else its MILLSTREAM_* variable, else the [client] table of $MILLSTREAM_CONFIG (``file_default``)."""
    from millstream.cli._client_config import file_default

    command = click.option(
        "--tls-ca", "tls_ca", type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=file_default("tls_ca", None), envvar="MILLSTREAM_TLS_CA", show_envvar=True,
        help="Use TLS and trust the server's certificate if this CA file (PEM) signed it.  "
             "(A tls:// URI without it trusts the system's CAs.)")(command)
    command = click.option(
        "--token", envvar="MILLSTREAM_TOKEN", default=file_default("token", ""), show_envvar=True,
        help="Access token for a server that checks tokens (issue one with `millstream token issue`).")(command)
    command = click.option(
        "--uri", envvar="MILLSTREAM_URI", default=file_default("uri", _DEFAULT_URI), show_default=_DEFAULT_URI,
        show_envvar=True,
        help="The server: tcp://HOST:PORT or tls://HOST:PORT, as `millstream standalone` prints it; for a "
             "cluster, some of its nodes' URIs separated by commas.")(command)
    return command


@contextlib.contextmanager
def _client(uri: str, token: str, tls_ca: Path | None, *, config: Any = None) -> Iterator[Any]:
    """A blocking client (``config``: a ``ClientConfig``, default the defaults); the server's errors
    become one-line messages (exit status 1)."""
    import ssl

    import millstream
    from millstream.errors import MillstreamError

    context = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca is not None else None
    try:
        with millstream.connect(uri, token=token, ssl_context=context, config=config) as client:
            yield client
    except MillstreamError as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from error


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _stream_name(value: str) -> str:
    from millstream.client import split_stream_name
    from millstream.errors import InvalidArgumentError

    try:
        split_stream_name(value)
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error)) from None
    return value


def _group_name(value: str) -> str:
    from millstream.client import split_stream_name
    from millstream.errors import InvalidArgumentError

    try:
        split_stream_name(value)
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error).replace("stream", "reader group")) from None
    return value


def _stream_segments(client: Any, stream: str) -> list[dict[str, Any]]:
    """Every segment of ``stream`` that still holds data (from its head on: sealed predecessors
    included, those wholly truncated away not), ordered by epoch then key, each with its key range,
    whether it is in the current epoch, and its length, start offset and state from its server."""
    from millstream.client import split_stream_name

    scope, name = split_stream_name(stream)
    controller = client.async_client.controller()
    slices = client.run(controller.get_segments_between(scope, name, None, None))
    current = {s.segment_id for s in client.stream_manager().current_segments(stream).segments}
    rows = []
    for piece in slices:
        segment = piece.segment
        properties = client.segments().info(segment.name)
        rows.append({"stream": stream, "id": segment.segment_id, "epoch": segment.epoch, "number": segment.number,
                     "name": segment.name, "key_start": segment.key_start, "key_end": segment.key_end,
                     "current": segment.segment_id in current, "sealed": properties.sealed,
                     "start_offset": properties.start_offset, "length": properties.length,
                     "bytes": properties.length - properties.start_offset})
    return rows


def _print_group_reads(name: str, reader_id: str, *, follow: bool, idle_seconds: float, max_events: int | None,
                       show_positions: bool, output_format: str, null: bool, length_prefixed: bool, uri: str,
                       token: str, tls_ca: Path | None) -> None:
    """``group read`` (and ``read --group``): join group ``name`` as ``reader_id``, print what it hands
    this reader, and say on stderr how many events were printed."""
    printer = EventPrinter(sys.stdout.buffer, output_format, null=null, length_prefixed=length_prefixed,
                           prefix=_position_prefix if show_positions else None)
    with _client(uri, token, tls_ca) as client:
        printed, ended = _read_as_reader(client, name, reader_id, printer, follow=follow, idle_seconds=idle_seconds,
                                        max_events=max_events)
    if printed is None:
        return
    end = " (end of the group's streams)" if ended else ""
    click.echo(f"read {_count(printed, 'event')}{end}", err=True)


def _position_prefix(segment: str, offset: int) -> bytes:
    return f"{segment}\t{offset}\t".encode()


def _read_as_reader(client: Any, name: str, reader_id: str, printer: EventPrinter, *, follow: bool,
                   idle_seconds: float, max_events: int | None) -> tuple[int | None, bool]:
    """Join group ``name`` as ``reader_id`` and print what it hands this reader, until ``max_events``,
    the end of the group's streams, Ctrl-C (exit status 130) or, without ``follow``, ``idle_seconds``
    without an event.  The reader leaves the group at its position, however this ends.  Returns how
    many events were printed and whether the streams ended (None printed: the output went away)."""
    out = sys.stdout.buffer
    printed = 0
    ended = False
    handle = client.reader_group(name)
    try:
        reader = handle.reader(reader_id)
    except BaseException:
        handle.close()
        raise
    try:
        idle = waited = 0.0
        wait = 0.25
        while max_events is None or printed < max_events:
            read = reader.read_next_event(wait)
            if read.checkpoint_name is not None:
                out.flush()
                click.echo(f"checkpoint {read.checkpoint_name}", err=True)
                continue
            if read.event is None:
                out.flush()
                if read.end_of_stream:
                    ended = True
                    break
                # Idle time counts once the group gave this reader segments (a reader takes its
                # first ones after a short random delay), or after a few seconds without any.
                waited += wait
                if reader.segments or waited >= _FIRST_SEGMENTS_WAIT_SECONDS:
                    idle += wait
                if not follow and idle >= idle_seconds:
                    break
                continue
            idle = 0.0
            printer.print(read.event, read.segment, read.offset)
            printed += 1
        out.flush()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            out.flush()
        click.echo(f"\nstopped after {_count(printed, 'event')}", err=True)
        sys.exit(130)
    except BrokenPipeError:  # whoever read our output went away (e.g. `| head`): that is fine
        with contextlib.suppress(OSError):
            os.close(sys.stdout.fileno())
        return None, ended
    finally:
        _leave_group(client, reader, handle)
    return printed, ended


def _leave_group(client: Any, reader: Any, handle: Any) -> None:
    """The reader leaves its group at its position (its segments go back to the group) and the
    handle closes -- each step bounded by ``limits.CLI_CLEANUP_TIMEOUT_SECONDS``, so that a command
    stopped with Ctrl-C ends even if a step is stuck: the group then declares the reader offline after
    its timeout, as it would for a killed process, and the user is told."""
    from millstream import limits
    from millstream.errors import RequestTimeoutError

    position = reader.position()
    steps: tuple[tuple[str, Callable[[], Any]], ...] = (("leave its group", lambda: reader.core.close(position)),
                                                         ("close its group handle", handle.core.close))
    for step, coroutine in steps:
        try:
            client.run(coroutine(), timeout=limits.CLI_CLEANUP_TIMEOUT_SECONDS)
        except RequestTimeoutError:
            click.echo(f"reader {reader.reader_id!r} could not {step} within "
                       f"{limits.CLI_CLEANUP_TIMEOUT_SECONDS:g} s; the group declares it offline after its "
                       "timeout", err=True)
