"""``millstream token issue``: access tokens for a node that checks them (``--auth-secret-file``).

Whoever holds the node's secret issues tokens (``millstream.auth.issue_token``); clients pass one
with ``--token`` or ``MILLSTREAM_TOKEN``.  A token is printed alone on stdout, so that
``export MILLSTREAM_TOKEN=$(millstream token issue ...)`` works; what it grants goes to stderr.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable
from pathlib import Path

import click

from millstream.cli._group import main

__all__ = ["parse_duration", "token"]

#: The wall clock tokens' lifetimes start from (seconds since the Unix epoch); tests replace it.
wall_clock: Callable[[], float] = time.time

_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>[smhd]?)")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit (s, m, h, d): ``90``, ``90s``, ``30m``,
    ``12h``, ``7d``.  Raises ``ValueError`` for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration (a number with s, m, h or d: 90s, 30m, 12h, 7d)")
    return float(match["number"]) * _UNIT_SECONDS[match["unit"]]


@main.group(short_help="Issue access tokens for a node that checks them.")
def token() -> None:
    """Access tokens for a node started with --auth-secret-file.

    Such a node refuses every request whose token it did not sign with its secret, that expired, or
    that does not grant the request's permission on its resource.  Whoever holds the secret issues
    tokens; clients pass one with --token or MILLSTREAM_TOKEN.

    \b
    Example:
      millstream token issue --scope iot --read-write --ttl 12h --secret-file secret
    """


def _ttl(context: click.Context, parameter: click.Parameter, value: str) -> float:
    from millstream import limits

    try:
        seconds = parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if not 0 < seconds <= limits.TOKEN_TTL_SECONDS_MAX:
        raise click.BadParameter(f"must be more than 0 and at most {limits.TOKEN_TTL_SECONDS_MAX / 86400:g} days "
                                 "(a token cannot be revoked on its own: issue a new one instead)")
    return seconds


@token.command("issue", short_help="Print a token for a scope or a stream.")
@click.option("--scope", required=True, metavar="SCOPE",
              help="The scope the token is for: the scope itself (listing and deleting it), its streams and "
                   "its reader groups.  '*': everything, including listing and creating scopes.")
@click.option("--stream", default=None, metavar="STREAM",
              help="Only this stream of the scope (reader groups need a token for their whole scope).")
@click.option("--read", "permission", flag_value="READ",
              help="Read only: read events and segments, describe and list.")
@click.option("--read-write", "permission", flag_value="READ_UPDATE",
              help="Everything: also create, write, scale, seal, truncate, delete, and use reader groups.")
@click.option("--ttl", required=True, metavar="DURATION", callback=_ttl,
              help="How long the token is valid: 90s, 30m, 12h, 7d (a number alone: seconds); at most 366d.")
@click.option("--secret-file", "--auth-secret-file", "secret_file", envvar="MILLSTREAM_AUTH_SECRET_FILE",
              show_envvar=True, required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The node's secret: the file given to `millstream standalone --auth-secret-file`.")
def issue(scope: str, stream: str | None, permission: str | None, ttl: float, secret_file: Path) -> None:
    """Print a token granting --read or --read-write on a scope (or one stream of it) for --ttl.

    The token alone goes to stdout; what it grants and until when, to stderr.

    \b
    Examples:
      millstream token issue --scope iot --read-write --ttl 12h --secret-file secret
      millstream token issue --scope iot --stream sensors --read --ttl 30m --secret-file secret
      export MILLSTREAM_TOKEN=$(millstream token issue --scope '*' --read-write --ttl 1h --secret-file secret)
    """
    from millstream.auth import issue_token, read_secret_file
    from millstream.errors import InvalidArgumentError
    from millstream.naming import validate_scope_or_stream_name

    if permission is None:
        raise click.UsageError("give --read or --read-write")
    try:
        if scope == "*":
            if stream is not None:
                raise click.UsageError("--stream names a stream of one scope, not of '*'")
            resource = "*"
        else:
            validate_scope_or_stream_name(scope, what="scope")
            if stream is not None:
                validate_scope_or_stream_name(stream, what="stream")
            resource = f"{scope}/{stream}" if stream is not None else f"{scope}/*"
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), param_hint="--scope/--stream") from None
    try:
        secret = read_secret_file(secret_file)
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), param_hint="--secret-file") from None
    expires_at = wall_clock() + ttl
    click.echo(issue_token(secret, resource, permission, expires_at))
    until = datetime.datetime.fromtimestamp(expires_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    click.echo(f"a token for {resource} ({permission}) valid until {until}", err=True)
