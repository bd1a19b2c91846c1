"""``millstream group ...``: reader groups from the shell.

Each command connects to a running node, works through the blocking ``Client.reader_group`` and
exits; ``group read`` stays, as one reader of the group, printing events as they arrive.  Errors are
printed as one line naming the error (``ReaderGroupNotFoundError: ...``) with exit status 1, as for
the other commands.  Stream cuts are written ``SCOPE/STREAM={"<segment id>": offset, ...}`` -- the
form `millstream stream describe --json` prints a stream's head and tail in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from millstream.cli._common import _client, _connection_options, _group_name, _print_group_reads
from millstream.cli._group import main
from millstream.cli._output import output_options

__all__ = ["group"]


def _cuts(values: tuple[str, ...], option: str) -> dict[str, Any]:
    """``SCOPE/STREAM={json}`` options as stream cuts."""
    from millstream.client import StreamCut, split_stream_name
    from millstream.errors import InvalidArgumentError

    cuts: dict[str, Any] = {}
    for value in values:
        stream, separator, text = value.partition("=")
        try:
            if not separator:
                raise InvalidArgumentError("write SCOPE/STREAM={\"<segment id>\": offset, ...}")
            split_stream_name(stream)
            cuts[stream] = StreamCut.from_wire(stream, json.loads(text))
        except (InvalidArgumentError, ValueError) as error:
            raise click.BadParameter(f"{value!r}: {error}", param_hint=option) from None
    return cuts


@main.group(short_help="Create, inspect, read, checkpoint, reset or delete reader groups.")
def group() -> None:
    """Work with reader groups on a running node.

    A reader group (SCOPE/GROUP) reads one or more streams together: each segment is read by one
    reader of the group at a time, so readers share the load and each event reaches the group once.
    A *checkpoint* is a consistent position of the whole group (a stream cut per stream); the group
    can be *reset* to a checkpoint or to stream cuts, and then reads on from there.

    \b
    Example, with `millstream standalone --data-dir ./data` running:
      millstream group create iot/analytics --stream iot/sensors
      millstream group read iot/analytics --reader-id r1 --follow      (in one shell, or several)
      millstream group checkpoint iot/analytics nightly                 (prints the checkpoint)
      millstream group reset iot/analytics --checkpoint nightly
      millstream group describe iot/analytics
      millstream group delete iot/analytics
    """


@group.command("create", short_help="Create a reader group over streams.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@click.option("--stream", "streams", multiple=True, required=True, metavar="SCOPE/STREAM",
              help="A stream the group reads (repeat for several).")
@click.option("--start", "starts", multiple=True, metavar='SCOPE/STREAM={"<id>": offset}',
              help="Start reading that stream at this cut (default: its head).")
@click.option("--end", "ends", multiple=True, metavar='SCOPE/STREAM={"<id>": offset}',
              help="Stop reading that stream at this cut: a bounded read (default: never stop).")
@click.option("--end-at-tail", is_flag=True, help="Bound every stream at its tail now (read what is there).")
@click.option("--auto-checkpoint-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Readers take a checkpoint this often (0: never).")
@click.option("--retain-consumption", is_flag=True,
              help="Subscribe: streams with consumption retention keep what this group has not consumed "
                   "(its last checkpoint).")
@click.option("--exist-ok", is_flag=True, help="Do not fail if the group exists (its configuration is kept).")
@_connection_options
def group_create(name: str, streams: tuple[str, ...], starts: tuple[str, ...], ends: tuple[str, ...],
                 end_at_tail: bool, auto_checkpoint_seconds: float, retain_consumption: bool, exist_ok: bool,
                 uri: str, token: str, tls_ca: Path | None) -> None:
    """Create a reader group reading the given streams (from their heads, or --start cuts).

    \b
    Examples:
      millstream group create iot/analytics --stream iot/sensors --stream iot/alarms
      millstream group create iot/replay --stream iot/sensors --end-at-tail
      millstream group create iot/from --stream iot/a --start 'iot/a={"0": 120, "1": 80}'
    """
    from millstream.client import ReaderGroupConfig
    from millstream.errors import ReaderGroupExistsError

    start_cuts, end_cuts = _cuts(starts, "--start"), _cuts(ends, "--end")
    if end_at_tail and end_cuts:
        raise click.UsageError("choose --end or --end-at-tail")
    unknown = (set(start_cuts) | set(end_cuts)) - set(streams)
    if unknown:
        raise click.UsageError(f"--start/--end name streams not given with --stream: {sorted(unknown)}")
    scope, group_name = name.split("/")
    with _client(uri, token, tls_ca) as client:
        if end_at_tail:
            end_cuts = {stream: client.stream_manager().tail_cut(stream) for stream in streams}
        config = ReaderGroupConfig({stream: (start_cuts.get(stream), end_cuts.get(stream)) for stream in streams},
                                   automatic_checkpoint_seconds=auto_checkpoint_seconds,
                                   retention="consumption" if retain_consumption else "none")
        try:
            client.run(client.async_client.controller().create_reader_group(scope, group_name, config))
        except ReaderGroupExistsError:
            if not exist_ok:
                raise
            click.echo(f"exists  {name}")
            return
        client.reader_group(name).close()  # writes the group's first state
    click.echo(f"created {name}")


def _lag(segments: Any, positions: Any, end_offsets: Any) -> dict[str, dict[str, int]]:
    """For each segment -> offset of ``positions``: the offset, where reading it ends (its length
    now, or the group's end offset in it if that is lower) and the bytes between them."""
    from millstream.errors import StreamSegmentNotExistsError

    lag = {}
    for segment, offset in positions.items():
        try:
            end = segments.info(segment).length
        except StreamSegmentNotExistsError:  # truncated away (or deleted) since: nothing left to read
            end = offset
        if segment in end_offsets:
            end = min(end, end_offsets[segment])
        lag[segment] = {"offset": offset, "end": end, "bytes_behind": max(0, end - offset)}
    return lag


def _describe(state: Any, name: str, segments: Any) -> dict[str, Any]:
    readers = {}
    for reader, info in state.readers.items():
        lag = _lag(segments, state.segments_of(reader), state.end_offsets)
        readers[reader] = {"segments": dict(state.segments_of(reader)), "lag_seconds": info.lag_seconds,
                           "segment_lag": lag, "bytes_behind": sum(s["bytes_behind"] for s in lag.values())}
    unassigned_lag = _lag(segments, state.unassigned, state.end_offsets)
    return {
        "group": name, "generation": state.generation, "config": state.config.to_json_object(),
        "readers": readers,
        "unassigned": dict(state.unassigned),
        "unassigned_lag": unassigned_lag,
        "bytes_behind": sum(r["bytes_behind"] for r in readers.values())
        + sum(s["bytes_behind"] for s in unassigned_lag.values()),
        "waiting": {t: sorted(f.waiting) for t, f in state.future.items()},
        "ended": dict(state.ended),
        "checkpoints": [{"name": c.name, "complete": c.complete, "pending": sorted(c.pending),
                         "positions": dict(c.positions)} for c in state.checkpoints],
        "finished": state.finished,
    }


def _lag_text(lag: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{segment}@{entry['offset']} ({entry['bytes_behind']} bytes behind)"
                     for segment, entry in sorted(lag.items())) or "-"


@group.command("describe", short_help="Show a reader group: readers, segments, lag, checkpoints.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@_connection_options
def group_describe(name: str, as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Show who reads what: each online reader with its segments (and the offsets recorded at its
    last checkpoint), the unassigned segments, successors waiting for predecessors, the checkpoints
    in progress and kept, and the group's configuration generation (bumped by every reset).

    Consumer lag: for each segment, the bytes between its recorded offset and its end now (or the
    group's end cut in it), per segment, per reader and for the whole group (`bytes_behind`; with
    --json also `segment_lag` and `unassigned_lag`).  A reader that is reading records its offsets
    at checkpoints (and when it releases a segment), so its lag is at most this much.  Lag is in
    bytes, not events: events are not counted without reading them.  Each reader also reports how
    far behind the tail it reads, in seconds (`lag_seconds`).

    \b
    Examples:
      millstream group describe iot/analytics
      millstream group describe iot/analytics --json
    """
    with _client(uri, token, tls_ca) as client:
        handle = client.reader_group(name)
        try:
            described = _describe(handle.state(), name, client.segments())
        finally:
            handle.close()
    if as_json:
        click.echo(json.dumps(described, sort_keys=True))
        return
    lines = [f"group:       {name} (generation {described['generation']})",
             f"streams:     {', '.join(described['config']['streams'])}",
             f"lag:         {described['bytes_behind']} bytes behind"]
    for reader, info in sorted(described["readers"].items()):
        lines.append(f"reader {reader}: {_lag_text(info['segment_lag'])}; {info['bytes_behind']} bytes behind, "
                     f"{info['lag_seconds']:g} s behind the tail")
    lines.append(f"unassigned:  {_lag_text(described['unassigned_lag'])}")
    if described["waiting"]:
        lines.append("waiting:     " + ", ".join(f"{t} (for {', '.join(p)})" for t, p in described["waiting"].items()))
    for checkpoint in described["checkpoints"]:
        status = "complete" if checkpoint["complete"] else f"waiting for {', '.join(checkpoint['pending'])}"
        lines.append(f"checkpoint {checkpoint['name']}: {status}")
    if described["finished"]:
        lines.append("finished:    every segment was read to its end")
    click.echo("\n".join(lines))


@group.command("read", short_help="Read as one reader of the group, printing events as they arrive.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@click.option("--reader-id", required=True, help="This reader's id in the group (unique among online readers).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep reading new events until the streams end or Ctrl-C (default: stop once idle).")
@click.option("--idle-seconds", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Without --follow: stop after this long without an event.")
@click.option("--max-events", type=click.IntRange(min=1), default=None, help="Stop after this many events.")
@click.option("--show-positions", is_flag=True, help="Print each event's segment and offset and a tab before it.")
@output_options
@_connection_options
def group_read(name: str, reader_id: str, follow: bool, idle_seconds: float, max_events: int | None,
               show_positions: bool, output_format: str, null: bool, length_prefixed: bool, uri: str, token: str,
               tls_ca: Path | None) -> None:
    """Join the group as READER-ID and print the events of the segments the group gives this reader,
    one per line (or as --format says), as they arrive; leave the group when done (the segments go
    back to the group at this reader's position).  Checkpoints the group takes are noted on stderr.

    \b
    Examples:
      millstream group read iot/analytics --reader-id r1 --follow
      millstream group read iot/analytics --reader-id r1 --max-events 100 --show-positions
      millstream group read iot/analytics --reader-id r1 --format json
    """
    _print_group_reads(name, reader_id, follow=follow, idle_seconds=idle_seconds, max_events=max_events,
                       show_positions=show_positions, output_format=output_format, null=null,
                       length_prefixed=length_prefixed, uri=uri, token=token, tls_ca=tls_ca)


@group.command("checkpoint", short_help="Take a checkpoint of the group and print it.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@click.argument("checkpoint_name", metavar="CHECKPOINT")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="How long to wait for every online reader to record its position.")
@_connection_options
def group_checkpoint(name: str, checkpoint_name: str, timeout: float, uri: str, token: str,
                     tls_ca: Path | None) -> None:
    """Start a checkpoint and wait until every online reader (running elsewhere, e.g. `group read`)
    has recorded its position; print the checkpoint as JSON (`group reset --checkpoint-json` takes
    it back).  A group with no online reader completes it at once."""
    with _client(uri, token, tls_ca) as client:
        handle = client.reader_group(name)
        future = handle.initiate_checkpoint(checkpoint_name, timeout=timeout)
        try:
            checkpoint = future.result(timeout + 5)
        finally:
            handle.close()
    click.echo(checkpoint.to_json())


@group.command("reset", short_help="Restart the group at a checkpoint or at stream cuts.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@click.option("--checkpoint", "checkpoint_name", default=None, metavar="NAME",
              help="A completed checkpoint the group keeps.")
@click.option("--checkpoint-json", default=None, metavar="JSON",
              help="A checkpoint as `group checkpoint` printed it.")
@click.option("--cut", "cuts", multiple=True, metavar='SCOPE/STREAM={"<id>": offset}',
              help="Restart that stream at this cut (give one for every stream of the group).")
@click.option("--head", is_flag=True, help="Restart every stream at its head (its oldest data kept).")
@_connection_options
def group_reset(name: str, checkpoint_name: str | None, checkpoint_json: str | None, cuts: tuple[str, ...],
                head: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Restart the group: its readers drop their segments and read on from the new position (every
    event after it once).  The group's configuration generation goes up by one."""
    from millstream.client import Checkpoint
    from millstream.errors import InvalidArgumentError

    if sum((checkpoint_name is not None, checkpoint_json is not None, bool(cuts), head)) != 1:
        raise click.UsageError("use exactly one of --checkpoint, --checkpoint-json, --cut and --head")
    parsed_cuts = _cuts(cuts, "--cut")
    parsed: Any = None
    if checkpoint_json is not None:
        try:
            parsed = Checkpoint.from_json(checkpoint_json)
        except InvalidArgumentError as error:
            raise click.BadParameter(str(error), param_hint="--checkpoint-json") from None
    with _client(uri, token, tls_ca) as client:
        handle = client.reader_group(name)
        try:
            if checkpoint_name is not None:
                generation = handle.reset_to_checkpoint(checkpoint_name)
            elif parsed is not None:
                generation = handle.reset_to_checkpoint(parsed)
            else:
                if head:
                    manager = client.stream_manager()
                    parsed_cuts = {stream: manager.head_cut(stream) for stream in handle.config().streams}
                generation = handle.reset_to_stream_cuts(parsed_cuts)
        finally:
            handle.close()
    click.echo(f"reset {name} (generation {generation})")


@group.command("delete", short_help="Delete a reader group and its state.")
@click.argument("name", callback=lambda ctx, param, value: _group_name(value), metavar="SCOPE/GROUP")
@_connection_options
def group_delete(name: str, uri: str, token: str, tls_ca: Path | None) -> None:
    """Delete the group: its readers fail from then on (ReaderGroupNotFoundError)."""
    scope, group_name = name.split("/")
    with _client(uri, token, tls_ca) as client:
        client.run(client.async_client.controller().delete_reader_group(scope, group_name))
    click.echo(f"deleted {name}")
