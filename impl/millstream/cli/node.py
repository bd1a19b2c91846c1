"""``millstream node status``: is a node ready, and which of its containers are not (and why)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click

from millstream import limits
from millstream.cli._client_config import file_default
from millstream.cli._group import main

__all__ = ["node"]


@main.group(short_help="Ask a running node how it is (through its metrics port).")
def node() -> None:
    """Ask a running node about itself, through the metrics port it serves with --metrics-port.

    \b
    Example:
      millstream standalone --data-dir ./data --metrics-port 9091 &
      millstream node status --metrics-url http://127.0.0.1:9091
    """


@node.command(short_help="Whether the node is ready; which containers recover, are fenced or throttled.")
@click.option("--metrics-url", envvar="MILLSTREAM_METRICS_URL", show_envvar=True,
              default=file_default("metrics_url", ""), show_default="the [client] metrics_url of $MILLSTREAM_CONFIG",
              help="The node's metrics endpoint: http://HOST:PORT, where it serves with --metrics-port.")
@click.option("--json", "as_json", is_flag=True, help="Print the node's answer as JSON (one object).")
def status(metrics_url: str, as_json: bool) -> None:
    """Print whether the node is ready -- its segment store runs and every container it hosts is
    running and recovered -- and each container's state: running, recovering (replaying its log),
    fenced (another process took its log over), failed or stopped, and whether its appends are
    throttled (Tier 2 lags).  Exits with status 1 when the node is not ready, so a script can wait
    on it; an endpoint that does not answer is an error (status 1) naming it.

    \b
    Examples:
      millstream standalone --data-dir ./data --metrics-port 9091 &
      millstream node status --metrics-url http://127.0.0.1:9091
      millstream node status --metrics-url http://127.0.0.1:9091 --json
    """
    if not metrics_url:
        raise click.UsageError("say where the node serves metrics: --metrics-url http://HOST:PORT (or "
                               "MILLSTREAM_METRICS_URL, or metrics_url in the [client] table of $MILLSTREAM_CONFIG)")
    answer = _fetch(metrics_url.rstrip("/") + "/status")
    if as_json:
        click.echo(json.dumps(answer))
    else:
        click.echo(f"node {metrics_url}: {'ready' if answer['ready'] else 'NOT READY'} "
                   f"(segment store {answer['server']})")
        click.echo(f"{'CONTAINER':<10} {'STATE':<11} {'THROTTLED':<10} CAUSE")
        for container in answer["containers"]:
            click.echo(f"{container['container']:<10} {container['state']:<11} "
                       f"{'yes' if container['throttled'] else 'no':<10} {container['cause']}".rstrip())
        for reason in answer["reasons"]:
            click.echo(f"not ready: {reason}", err=True)
    if not answer["ready"]:
        raise SystemExit(1)


def _fetch(url: str) -> dict[str, Any]:
    """The JSON of ``/status`` (answered 200 when ready, 503 when not)."""
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} is not an http:// URL", param_hint="--metrics-url")
    try:
        with urllib.request.urlopen(url, timeout=limits.NODE_STATUS_TIMEOUT_SECONDS) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        if error.code != 503:
            raise click.ClickException(f"{url} answered {error.code} {error.reason}") from error
        body = error.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise click.ClickException(f"cannot reach the node's metrics endpoint at {url}: {reason}") from error
    try:
        answer = json.loads(body)
    except ValueError as error:
        raise click.ClickException(f"{url} did not answer with a node's status: {error}") from error
    if not isinstance(answer, dict) or not {"ready", "server", "containers", "reasons"} <= set(answer):
        raise click.ClickException(f"{url} did not answer with a node's status")
    return answer
