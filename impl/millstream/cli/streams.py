"""``millstream scope ...`` and ``millstream stream ...``: scopes and streams from the shell.

Each command connects to a running node (``millstream standalone`` prints its address), asks its
controller through the blocking ``StreamManager`` and exits.  Errors are printed as one line naming
the error (``StreamNotFoundError: ...``) with exit status 1, as for the segment commands.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from millstream import limits
from millstream.cli._common import _client, _connection_options, _stream_name, _stream_segments
from millstream.cli._group import main

__all__ = ["scope", "stream"]


# --- millstream scope ------------------------------------------------------------------------------


@main.group(short_help="Create, list or delete scopes (the namespaces streams live in).")
def scope() -> None:
    """Work with scopes on a running node.

    A scope is a namespace: every stream is named SCOPE/STREAM, and a scope must exist before
    streams are created in it.  Names are letters, digits, '-', '_' and '.' (not starting with '_').

    \b
    Example, with `millstream standalone --data-dir ./data` running:
      millstream scope create iot
      millstream scope list
      millstream scope delete iot        (only once it holds no streams)
    """


@scope.command("create", short_help="Create scopes.")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--exist-ok", is_flag=True, help="Do not fail if a scope exists already.")
@_connection_options
def scope_create(names: tuple[str, ...], exist_ok: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Create each named scope."""
    with _client(uri, token, tls_ca) as client:
        manager = client.stream_manager()
        for name in names:
            created = manager.create_scope(name, exist_ok=exist_ok)
            click.echo(f"{'created' if created else 'exists '} {name}")


@scope.command("list", short_help="List the scopes.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
@_connection_options
def scope_list(as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Print every scope, one per line."""
    with _client(uri, token, tls_ca) as client:
        scopes = client.stream_manager().list_scopes()
    click.echo(json.dumps(scopes) if as_json else "\n".join(scopes))


@scope.command("delete", short_help="Delete an empty scope.")
@click.argument("name")
@click.option("--missing-ok", is_flag=True, help="Do not fail if the scope does not exist.")
@_connection_options
def scope_delete(name: str, missing_ok: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Delete a scope.  It must hold no streams and no reader groups (ScopeNotEmptyError)."""
    with _client(uri, token, tls_ca) as client:
        deleted = client.stream_manager().delete_scope(name, missing_ok=missing_ok)
    click.echo(f"deleted {name}" if deleted else f"no scope {name}")


# --- millstream stream -----------------------------------------------------------------------------


@main.group(short_help="Create, describe, scale, seal, truncate or delete streams.")
def stream() -> None:
    """Work with streams on a running node.

    A stream (SCOPE/STREAM) is a set of segments that together own the key space [0, 1): each event's
    routing key hashes to a point there, and the segment owning that point takes it, so events with
    one key stay in order.  Scaling splits or merges segments (by hand, or automatically with an
    event-rate or data-rate policy); every scale starts a new *epoch*.  A *stream cut* is a position
    in the whole stream (an offset in each of a set of segments covering [0, 1)).

    \b
    Example, with `millstream standalone --data-dir ./data` running:
      millstream scope create iot
      millstream stream create iot/sensors --segments 2
      millstream stream describe iot/sensors
      millstream stream scale iot/sensors --split 0          (split segment 0 in two)
      millstream stream truncate iot/sensors --at-tail       (drop everything written so far)
      millstream stream seal iot/sensors
      millstream stream delete iot/sensors
    """


@stream.command("create", short_help="Create a stream (fixed or auto-scaling, with a retention policy).")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@click.option("--segments", type=click.IntRange(1, 1024), default=None,
              help="A fixed number of segments (the default, with 1).")
@click.option("--event-rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="EVENTS/S",
              help="Auto-scale: split segments that take more than this many events per second, merge "
                   "neighbours that take less than half of it.")
@click.option("--data-rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="KIB/S",
              help="Auto-scale by data rate instead (KiB per second per segment).")
@click.option("--scale-factor", type=click.IntRange(1, 64), default=2, show_default=True,
              help="With auto-scaling: at most this many parts per split.")
@click.option("--min-segments", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="With auto-scaling: start with, and never merge below, this many segments.")
@click.option("--retain-bytes", type=click.IntRange(min=1), default=None, metavar="BYTES",
              help="Retention: keep at least the newest BYTES bytes; truncate older data.")
@click.option("--retain-seconds", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Retention: keep at least the data of the last SECONDS; truncate older data.")
@click.option("--retain-consumption", is_flag=True,
              help="Retention: keep only what subscribing reader groups have not consumed yet.")
@click.option("--exist-ok", is_flag=True, help="Do not fail if the stream exists (its configuration is kept).")
@_connection_options
def stream_create(name: str, segments: int | None, event_rate: float | None, data_rate: float | None,
                  scale_factor: int, min_segments: int, retain_bytes: int | None, retain_seconds: float | None,
                  retain_consumption: bool, exist_ok: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Create a stream.  Without options it has one fixed segment and keeps everything.

    \b
    Examples:
      millstream stream create iot/sensors --segments 4
      millstream stream create iot/clicks --event-rate 1000 --scale-factor 2 --min-segments 2
      millstream stream create iot/logs --retain-seconds 86400
    """
    from millstream.client import RetentionPolicy, ScalingPolicy, StreamConfig

    if sum(option is not None for option in (segments, event_rate, data_rate)) > 1:
        raise click.UsageError("choose one of --segments, --event-rate and --data-rate")
    if sum((retain_bytes is not None, retain_seconds is not None, retain_consumption)) > 1:
        raise click.UsageError("choose one of --retain-bytes, --retain-seconds and --retain-consumption")
    if event_rate is not None:
        scaling = ScalingPolicy.by_event_rate(event_rate, scale_factor, min_segments)
    elif data_rate is not None:
        scaling = ScalingPolicy.by_data_rate(data_rate, scale_factor, min_segments)
    else:
        scaling = ScalingPolicy.fixed(segments or 1)
    if retain_bytes is not None:
        retention = RetentionPolicy.by_size(retain_bytes)
    elif retain_seconds is not None:
        retention = RetentionPolicy.by_time(retain_seconds)
    elif retain_consumption:
        retention = RetentionPolicy.consumption()
    else:
        retention = RetentionPolicy.none()
    with _client(uri, token, tls_ca) as client:
        created = client.stream_manager().create_stream(name, StreamConfig(scaling=scaling, retention=retention),
                                                        exist_ok=exist_ok)
    click.echo(f"{'created' if created else 'exists '} {name}")


@stream.command("list", short_help="List the streams of a scope.")
@click.argument("scope_name", metavar="SCOPE")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
@_connection_options
def stream_list(scope_name: str, as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Print the streams of SCOPE, one per line (as SCOPE/STREAM)."""
    with _client(uri, token, tls_ca) as client:
        names = [f"{scope_name}/{name}" for name in client.stream_manager().list_streams(scope_name)]
    click.echo(json.dumps(names) if as_json else "\n".join(names))


def _describe(description: Any, head: Any, tail: Any, sizes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    config = description.config
    empty = {"length": 0, "start_offset": 0, "bytes": 0, "sealed": False}
    segments = []
    for s in description.segments:
        size = sizes.get(s.segment_id, empty)
        segments.append({"id": s.segment_id, "epoch": s.epoch, "number": s.number, "key_start": s.key_start,
                         "key_end": s.key_end, "name": s.name, "length": size["length"],
                         "start_offset": size["start_offset"], "bytes": size["bytes"], "sealed": size["sealed"]})
    return {
        "stream": description.name, "state": description.state, "sealed": description.sealed,
        "epoch": description.epoch, "scaling": config.scaling.to_json_object(),
        "retention": config.retention.to_json_object(),
        "segments": segments,
        "stored_bytes": sum(size["bytes"] for size in sizes.values()),
        "head": {str(k): v for k, v in head.positions.items()},
        "tail": {str(k): v for k, v in tail.positions.items()},
    }


def _sample_rates(client: Any, segments: list[str], seconds: float, *,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The bytes and events appended to ``segments`` per second, measured over ``seconds``: their
    lengths before and after (``clock``, ``sleep``: injectable), and the events in between counted by
    reading them -- unless more than ``limits.CLI_RATE_SAMPLE_READ_BYTES_MAX`` bytes came, when
    events/s is None (unknown) rather than read a busy stream's whole traffic."""
    from millstream import limits

    info = client.segments().info
    before = {name: info(name).length for name in segments}
    started = clock()
    sleep(seconds)
    after = {name: info(name).length for name in segments}
    elapsed = clock() - started
    if not elapsed > 0:
        elapsed = seconds
    appended = {name: after[name] - before[name] for name in segments}
    events: int | None = None
    if sum(appended.values()) <= limits.CLI_RATE_SAMPLE_READ_BYTES_MAX:
        events = 0
        for name in segments:
            if appended[name] == 0:
                continue
            # A length is always where an event ends (an append is whole events), so reading from
            # ``before`` to ``after`` counts whole events.
            with contextlib.closing(client.segment_reader(name, offset=before[name])) as reader:
                while reader.offset < after[name]:
                    if reader.read_event() is None:
                        break
                    events += 1
    return {"seconds": elapsed, "bytes_per_second": sum(appended.values()) / elapsed,
            "events_per_second": None if events is None else events / elapsed,
            "segments": {name: appended[name] / elapsed for name in segments}}


@stream.command("describe", short_help="Show a stream's configuration, state, segments, sizes, cuts and rates.")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@click.option("--rate-seconds", type=click.FloatRange(min=0, max=limits.CLI_RATE_SAMPLE_SECONDS_MAX),
              default=0.0, show_default=True, metavar="SECONDS",
              help="Measure the stream's write rates (events/s, bytes/s, per segment) over this many seconds "
                   "before printing (0: do not measure).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@_connection_options
def stream_describe(name: str, rate_seconds: float, as_json: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Show a stream: its scaling and retention policies, whether it is sealed (or which change is
    running on it), its current epoch and that epoch's segments with their key ranges and sizes
    (length: bytes ever appended; bytes: what is still stored, after truncation), the bytes stored in
    all its segments (older epochs' too), and its head and tail cuts (segment id -> offset).  Segment
    ids pack the epoch that made the segment with its number; `stream scale` takes them.

    Rates, with --rate-seconds: the command watches the current segments for that long and shows
    the events and bytes appended per second (events are counted by reading them, up to 64 MiB;
    beyond, events/s is shown as unknown).  The controller's own moving averages (which drive
    auto-scaling) are not exposed: what is shown is this sample.

    \b
    Examples:
      millstream stream describe iot/sensors
      millstream stream describe iot/sensors --rate-seconds 5 --json
    """
    with _client(uri, token, tls_ca) as client:
        manager = client.stream_manager()
        description = manager.describe_stream(name)
        sizes = {row["id"]: row for row in _stream_segments(client, name)}
        fields = _describe(description, manager.head_cut(name), manager.tail_cut(name), sizes)
        fields["rates"] = None if rate_seconds == 0 else \
            _sample_rates(client, [s.name for s in description.segments], rate_seconds)
    if as_json:
        click.echo(json.dumps(fields, sort_keys=True))
        return
    scaling = description.config.scaling
    policy = f"fixed, {scaling.min_segments} segments" if scaling.kind == "fixed" else (
        f"{scaling.kind} target {scaling.target_rate:g}{' KiB/s' if scaling.kind == 'by_data_rate' else ' events/s'}"
        f", scale factor {scaling.scale_factor}, min {scaling.min_segments} segments")
    retention = description.config.retention
    kept = {"none": "everything", "size": f"at least {int(retention.limit)} bytes",
            "time": f"at least {retention.limit:g} s", "consumption": "until consumed by subscribers"}[retention.kind]
    click.echo(f"{'stream:':<11}{name}")
    click.echo(f"{'state:':<11}{description.state}")
    click.echo(f"{'scaling:':<11}{policy}")
    click.echo(f"{'retention:':<11}{kept}")
    click.echo(f"{'epoch:':<11}{description.epoch}")
    click.echo(f"{'stored:':<11}{fields['stored_bytes']} bytes")
    click.echo("segments:")
    for segment in fields["segments"]:
        click.echo(f"  {segment['id']:>20}  [{segment['key_start']:.6f}, {segment['key_end']:.6f})  {segment['name']}"
                   f"  length {segment['length']}, {segment['bytes']} bytes stored")
    click.echo(f"{'head:':<11}{json.dumps(fields['head'])}")
    click.echo(f"{'tail:':<11}{json.dumps(fields['tail'])}")
    rates = fields["rates"]
    if rates is None:
        click.echo(f"{'rates:':<11}not measured (--rate-seconds SECONDS measures them)")
    else:
        events = "unknown" if rates["events_per_second"] is None else f"{rates['events_per_second']:.1f}"
        click.echo(f"{'rates:':<11}{events} events/s, {rates['bytes_per_second']:.1f} bytes/s "
                   f"(measured over {rates['seconds']:.1f} s)")


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a time (seconds since the Unix epoch)")
    return value


def _range(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"a key range is LOW:HIGH (e.g. 0:0.5), not {text!r}") from None
    return low, high


@stream.command("scale", short_help="Split or merge segments (a new epoch).")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@click.option("--split", "split", default=None, metavar="ID[:PARTS]",
              help="Split segment ID into PARTS (default 2) equal key ranges.")
@click.option("--merge", "merge", default=None, metavar="ID,ID[,...]",
              help="Merge these adjacent segments into one.")
@click.option("--seal", "seal", multiple=True, type=int, metavar="ID",
              help="Seal this segment (repeat; with --range: the general form).")
@click.option("--range", "ranges", multiple=True, metavar="LOW:HIGH",
              help="A key range for a new segment (repeat); together they must cover exactly the sealed "
                   "segments' keys.")
@_connection_options
def stream_scale(name: str, split: str | None, merge: str | None, seal: tuple[int, ...], ranges: tuple[str, ...],
                 uri: str, token: str, tls_ca: Path | None) -> None:
    """Scale a stream by hand: seal some segments of its current epoch and replace them with new ones
    owning exactly the same keys.  Writers move to the new segments; readers read the new ones only
    after finishing the old ones, so each key's order holds.  Segment ids come from `stream describe`.

    \b
    Examples:
      millstream stream scale iot/sensors --split 0            (segment 0 into two halves)
      millstream stream scale iot/sensors --split 1:4          (segment 1 into four)
      millstream stream scale iot/sensors --merge 4294967296,4294967297
      millstream stream scale iot/sensors --seal 0 --range 0:0.1 --range 0.1:0.5
    """
    forms = (split is not None) + (merge is not None) + bool(seal or ranges)
    if forms != 1:
        raise click.UsageError("use exactly one of --split, --merge, or --seal with --range")
    with _client(uri, token, tls_ca) as client:
        manager = client.stream_manager()
        if split is not None:
            identifier, _, parts = split.partition(":")
            try:
                segment_id, part_count = int(identifier), int(parts) if parts else 2
            except ValueError:
                raise click.BadParameter(f"--split takes ID or ID:PARTS, not {split!r}") from None
            # (Only the parsing above is the option's fault: the controller's refusal -- an unknown
            # segment, too many parts -- is a ValueError too, and must reach the user as itself.)
            epoch = manager.split_segment(name, segment_id, part_count)
        elif merge is not None:
            try:
                identifiers = [int(part) for part in merge.split(",")]
            except ValueError:
                raise click.BadParameter(f"--merge takes ID,ID[,...], not {merge!r}") from None
            epoch = manager.merge_segments(name, identifiers)
        else:
            if not seal or not ranges:
                raise click.UsageError("--seal and --range go together")
            epoch = manager.scale_stream(name, list(seal), [_range(r) for r in ranges])
        segments = manager.current_segments(name).segments
    click.echo(f"scaled {name} to epoch {epoch}: {len(segments)} segments")


@stream.command("seal", short_help="Seal a stream: no more writes.")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@_connection_options
def stream_seal(name: str, uri: str, token: str, tls_ca: Path | None) -> None:
    """Seal every segment of the stream: writers get an error, readers see its end.  Sealing a sealed
    stream succeeds.  A stream must be sealed before it can be deleted."""
    with _client(uri, token, tls_ca) as client:
        client.stream_manager().seal_stream(name)
    click.echo(f"sealed {name}")


@stream.command("truncate", short_help="Drop a stream's data before a stream cut.")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@click.option("--at-tail", is_flag=True, help="Truncate at the current tail: drop everything written so far.")
@click.option("--at-time", type=click.FloatRange(min=0), callback=lambda ctx, param, value: _finite(value),
              default=None, metavar="SECONDS",
              help="Truncate at the newest tail cut the controller recorded at or before this time "
                   "(seconds since the Unix epoch).  If it recorded none that late, nothing is truncated.")
@click.option("--cut", "cut_json", default=None, metavar="JSON",
              help='Truncate at this cut: {"<segment id>": offset, ...} (as `stream describe --json` prints).')
@_connection_options
def stream_truncate(name: str, at_tail: bool, at_time: float | None, cut_json: str | None, uri: str, token: str,
                    tls_ca: Path | None) -> None:
    """Truncate a stream: delete the segments wholly before the cut and cut the others at their
    offsets.  Readers can no longer read what lies before it.  The cut must not lie before the
    stream's current head, and each of its offsets must be where an event begins in its segment (a
    cut from `stream describe`, a reader's position or a checkpoint is); otherwise nothing changes.

    \b
    Examples:
      millstream stream truncate iot/sensors --at-tail
      millstream stream truncate iot/sensors --at-time 1700000000
      millstream stream truncate iot/sensors --cut '{"0": 120, "1": 80}'
    """
    from millstream.client import StreamCut

    if (at_tail + (at_time is not None) + (cut_json is not None)) != 1:
        raise click.UsageError("use exactly one of --at-tail, --at-time and --cut")
    with _client(uri, token, tls_ca) as client:
        manager = client.stream_manager()
        if at_tail:
            cut = manager.tail_cut(name)
        elif at_time is not None:
            cut = manager.cut_at(name, at_time)
        else:
            try:
                cut = StreamCut.from_wire(name, json.loads(cut_json or ""))
            except ValueError as error:
                raise click.BadParameter(f"--cut: {error}") from None
        head = manager.head_cut(name)
        if cut.to_wire() == head.to_wire():
            # Truncating at the head changes nothing (the controller accepts it as a no-op): say so
            # rather than claim a truncation -- e.g. --at-time before the first recorded cut.
            reason = "no tail cut was recorded at or before that time" if at_time is not None else \
                "the cut is the stream's head"
            click.echo(f"nothing truncated: {reason}; {name} still begins at {json.dumps(head.to_wire())}")
            return
        manager.truncate_stream(name, cut)
    click.echo(f"truncated {name} at {json.dumps(cut.to_wire())}")


@stream.command("delete", short_help="Delete a sealed stream and all its data.")
@click.argument("name", callback=lambda ctx, param, value: _stream_name(value), metavar="SCOPE/STREAM")
@click.option("--missing-ok", is_flag=True, help="Do not fail if the stream does not exist.")
@_connection_options
def stream_delete(name: str, missing_ok: bool, uri: str, token: str, tls_ca: Path | None) -> None:
    """Delete a stream and everything in it.  Seal it first (`millstream stream seal`)."""
    with _client(uri, token, tls_ca) as client:
        deleted = client.stream_manager().delete_stream(name, missing_ok=missing_ok)
    click.echo(f"deleted {name}" if deleted else f"no stream {name}")
