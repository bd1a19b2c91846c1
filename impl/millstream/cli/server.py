"""``millstream standalone`` and ``millstream serve``: run a node until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from millstream.cli._group import main

__all__ = ["serve", "standalone"]

_CONFIG_KEYS = {"data_dir", "host", "port", "container_count", "owned_containers", "auth_secret_file",
                "tls_cert_file", "tls_key_file"}


def _run_node(node: Any, data_dir: Path) -> None:
    """Start ``node``, print where it listens, serve until SIGINT/SIGTERM, then stop it gracefully.
    A node that stops serving on its own (a container fenced by another process, or corrupt) is
    stopped at once and the command fails (exit status 1) naming the cause."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        await node.start()
        failure = None
        try:
            click.echo(f"millstream standalone listening on {node.uri} (data in {data_dir})")
            sys.stdout.flush()
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((stopping, node.failed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                await asyncio.gather(stopping, return_exceptions=True)
            if node.failed.done():
                failure = node.failed.result()
                click.echo("millstream: the node stopped serving (see the ERROR above); shutting down ...",
                           err=True)
            else:
                click.echo("millstream: shutting down (draining acknowledged work) ...", err=True)
        finally:
            await node.stop()
        if failure is not None:
            raise click.ClickException(f"the node on {data_dir} stopped serving: {failure}")
        click.echo("millstream: stopped", err=True)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve())
    except Exception as error:
        from millstream.errors import MillstreamError
        if isinstance(error, (MillstreamError, OSError)):
            raise click.ClickException(str(error)) from error
        raise


F = TypeVar("F", bound=Callable[..., Any])


def _security_options(command: F) -> F:
    """--auth-secret-file, --tls-cert and --tls-key, shared by standalone and serve."""
    file = click.Path(dir_okay=False, path_type=Path)
    command = click.option(
        "--tls-key", type=file, default=None,
        help="The private key of --tls-cert (PEM).")(command)
    command = click.option(
        "--tls-cert", type=file, default=None,
        help="Serve TLS with this certificate (PEM; with --tls-key): clients connect to tls://HOST:PORT and "
             "trust it with --tls-ca or MILLSTREAM_TLS_CA.")(command)
    command = click.option(
        "--auth-secret-file", type=file, default=None,
        help="Check a token on every request: the file holds the secret (at least 16 bytes) that `millstream "
             "token issue --secret-file` signs tokens with.")(command)
    return command


def _load_security(secret_file: Path | None, tls_cert: Path | None, tls_key: Path | None,
                   hint: str) -> tuple[bytes | None, Any]:
    """The node's secret (None: authentication off) and server-side ``ssl.SSLContext`` (None: no TLS)
    from the files given; a file that cannot be used is a ``click.BadParameter`` naming ``hint``."""
    import ssl

    from millstream.auth import read_secret_file
    from millstream.errors import InvalidArgumentError

    secret = None
    if secret_file is not None:
        try:
            secret = read_secret_file(secret_file)
        except InvalidArgumentError as error:
            raise click.BadParameter(str(error), param_hint=hint) from error
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("a TLS certificate and its key go together", param_hint=hint)
    ssl_context = None
    if tls_cert is not None and tls_key is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as error:
            raise click.BadParameter(f"cannot load the TLS certificate: {error}", param_hint=hint) from error
    return secret, ssl_context


@main.command(short_help="Run a whole node on this machine, listening on loopback.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where the node keeps everything (created if missing).  Starting again on the same "
                   "directory recovers every segment.")
@click.option("--port", type=click.IntRange(0, 65535), default=9090, show_default=True,
              help="TCP port to listen on (0: pick a free one; the line printed at start says which).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind.  The default keeps the node private to this machine.")
@click.option("--containers", "container_count", type=click.IntRange(1, 1024), default=None,
              help="Segment containers (fixed for a data directory once it is first used).  [default: the "
                   "data directory's count, else 1: one process gains nothing from more]")
@_security_options
def standalone(data_dir: Path, port: int, host: str, container_count: int | None, auth_secret_file: Path | None,
               tls_cert: Path | None, tls_key: Path | None) -> None:
    """Run a millstream node: the segment store with every container, on local files.

    It prints one line when it is ready,

        millstream standalone listening on tcp://127.0.0.1:PORT (data in DIR)

    and serves until you press Ctrl-C (SIGINT) or send SIGTERM; then it stops accepting, lets the
    appends it already received be acknowledged, and shuts down.  Other processes (the millstream
    commands, your programs, Spark executors) connect to the printed address.  Logs go to stderr.

    With --auth-secret-file every request needs a token (`millstream token issue`); with --tls-cert
    and --tls-key it serves TLS.  Bound beyond loopback (--host) without them, it warns at start.

    \b
    Examples:
      millstream standalone --data-dir ./data --port 9090
      millstream standalone --data-dir ./data --auth-secret-file secret --tls-cert node.pem --tls-key node.key
    """
    from millstream.standalone import Node

    secret, ssl_context = _load_security(auth_secret_file, tls_cert, tls_key,
                                         "--auth-secret-file/--tls-cert/--tls-key")
    _run_node(Node(data_dir, host=host, port=port, container_count=container_count, auth_secret=secret,
                   ssl_context=ssl_context), data_dir)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise click.BadParameter(f"cannot read {path}: {error}", param_hint="--config") from error
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise click.BadParameter(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(_CONFIG_KEYS)})",
                                 param_hint="--config")
    if "data_dir" not in config:
        raise click.BadParameter(f"{path}: data_dir is required", param_hint="--config")
    return config


def _relative(base: Path, value: Any, key: str) -> Path:
    if not isinstance(value, str):
        raise click.BadParameter(f"{key} must be a string path, not {value!r}", param_hint="--config")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


@main.command(short_help="Run a node as a configuration file describes it.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              required=True, help="A TOML file (see below).")
@_security_options
def serve(config_path: Path, auth_secret_file: Path | None, tls_cert: Path | None, tls_key: Path | None) -> None:
    """Run a millstream node as described by a TOML file, until SIGINT or SIGTERM.

    \b
    Keys (relative paths are relative to the file's directory):
      data_dir = "data"                  required; as for `millstream standalone --data-dir`
      host = "127.0.0.1"                 address to bind
      port = 9090                        0 picks a free port
      container_count = 4                fixed for a data directory once it is used
      owned_containers = [0, 1]          containers this node hosts (default: all); the others
                                         are answered WrongHost
      auth_secret_file = "secret"        turn on token authentication; the file holds the
                                         secret (at least 16 bytes; issue tokens with
                                         `millstream token issue --secret-file`)
      tls_cert_file = "cert.pem"         turn on TLS (both files, PEM)
      tls_key_file = "key.pem"

    --auth-secret-file, --tls-cert and --tls-key do the same as those keys and take precedence
    over them.  It prints the same "listening on" line as `millstream standalone`, warns as it does
    when bound beyond loopback without authentication or TLS, and shuts down gracefully.
    """
    from millstream.standalone import Node

    config = _read_config(config_path)
    base = config_path.resolve().parent
    data_dir = _relative(base, config["data_dir"], "data_dir")

    def path(flag: Path | None, key: str) -> Path | None:
        if flag is not None:
            return flag
        return _relative(base, config[key], key) if key in config else None
    cert_from_flags = tls_cert is not None or tls_key is not None
    secret, ssl_context = _load_security(
        path(auth_secret_file, "auth_secret_file"),
        tls_cert if cert_from_flags else path(None, "tls_cert_file"),
        tls_key if cert_from_flags else path(None, "tls_key_file"),
        "--auth-secret-file/--tls-cert/--tls-key" if auth_secret_file is not None or cert_from_flags else "--config")
    from millstream.errors import InvalidArgumentError
    try:
        node = Node(data_dir, host=config.get("host", "127.0.0.1"), port=config.get("port", 9090),
                    container_count=config.get("container_count", 4),
                    owned_containers=config.get("owned_containers"), auth_secret=secret, ssl_context=ssl_context)
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), param_hint="--config") from error
    _run_node(node, data_dir)
