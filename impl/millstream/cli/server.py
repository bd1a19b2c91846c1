"""``millstream standalone`` and ``millstream serve``: run a node until SIGINT or SIGTERM.

Both take the same options, each also from a ``MILLSTREAM_*`` environment variable and from the
configuration file ``--config`` (or ``MILLSTREAM_CONFIG``) names: ``millstream.config`` reads and
checks the file, and its values become the click context's ``default_map``, so that click itself
applies the precedence -- command line, then environment, then file, then the defaults.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from millstream import limits
from millstream.cli._group import main
from millstream.cli._logging import configure_logging, logging_options
from millstream.cli._security import load_security
from millstream.config import CONFIG_ENVIRONMENT_VARIABLE, environment_variable

__all__ = ["serve", "standalone"]

log = logging.getLogger("millstream.cli")

#: ``millstream serve``'s container count for a data directory used for the first time (a cluster's
#: nodes share containers out; ``millstream standalone`` uses ``standalone.CONTAINER_COUNT_DEFAULT``).
_SERVE_CONTAINER_COUNT_DEFAULT = 4


def _run_node(node: Any, data_dir: Path, quiet: bool, json_logs: bool = False) -> None:
    """Start ``node``, print where it listens, serve until SIGINT/SIGTERM, then stop it gracefully.
    A node that stops serving on its own (a container fenced by another process, or corrupt) is
    stopped at once and the command fails (exit status 1) naming the cause.  ``quiet``: no progress
    lines on stderr (the "listening on" line on stdout stays: scripts read it); ``json_logs``: they
    are log records (stderr holds only JSON lines)."""

    def progress(message: str) -> None:
        if json_logs:
            log.info("%s", message.removeprefix("millstream: "))
        elif not quiet:
            click.echo(message, err=True)

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
            log.info("node started: serving %s, data in %s%s", node.uri, data_dir,
                     f", metrics on {node.metrics_url}" if node.metrics_url else "",
                     extra={"uri": node.uri, "data_dir": str(data_dir), "metrics_url": node.metrics_url})
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((stopping, node.failed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                await asyncio.gather(stopping, return_exceptions=True)
            if node.failed.done():
                failure = node.failed.result()
                progress("millstream: the node stopped serving (see the ERROR above); shutting down ...")
            else:
                progress("millstream: shutting down (draining acknowledged work) ...")
        finally:
            await node.stop()
            log.info("node stopped: %s, data in %s", node.uri, data_dir,
                     extra={"uri": node.uri, "data_dir": str(data_dir)})
        if failure is not None:
            raise click.ClickException(f"the node on {data_dir} stopped serving: {failure}")
        progress("millstream: stopped")

    try:
        asyncio.run(serve())
    except Exception as error:
        from millstream.errors import MillstreamError
        if isinstance(error, (MillstreamError, OSError)):
            raise click.ClickException(str(error)) from error
        raise


F = TypeVar("F", bound=Callable[..., Any])


class _ContainerList(click.ParamType):  # type: ignore[type-arg]  # (generic only in click >= 8.2)
    """Container ids: ``0,1,3`` on the command line or in the environment, ``[0, 1, 3]`` in a file."""

    name = "ids"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> frozenset[int]:
        if isinstance(value, frozenset):
            return value
        items = value if isinstance(value, list) else [item for item in str(value).split(",") if item.strip()]
        try:
            ids = frozenset(int(item) for item in items if not isinstance(item, bool))
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a list of container ids (e.g. 0,1)", param, ctx)
        if len(ids) != len(items) or any(item < 0 for item in ids):
            self.fail(f"{value!r} is not a list of distinct container ids (e.g. 0,1)", param, ctx)
        return ids


def _load_config(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """``--config``'s callback (eager: before the other options): the file's node keys become the
    context's ``default_map``, below the command line and the environment."""
    if value is None:
        return None
    from millstream.config import read_config_file
    from millstream.errors import InvalidArgumentError

    try:
        config = read_config_file(value)
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from error
    ctx.default_map = {**(ctx.default_map or {}), **config.node}
    return value


def _option(key: str, *declarations: str, **attributes: Any) -> Callable[[F], F]:
    """A node option whose parameter is the configuration key ``key`` and whose variable is
    ``MILLSTREAM_<KEY>``."""
    return click.option(*declarations, key, envvar=environment_variable(key), show_envvar=True, **attributes)


def _node_options(command: F) -> F:
    """Every option of ``standalone`` and ``serve`` (but --data-dir), in the order --help lists them."""
    file = click.Path(dir_okay=False, path_type=Path)
    for decorate in reversed((
        _option("host", "--host", default="127.0.0.1", show_default=True,
                help="Address to bind.  The default keeps the node private to this machine."),
        _option("port", "--port", type=click.IntRange(0, 65535), default=9090, show_default=True,
                help="TCP port to listen on (0: pick a free one; the line printed at start says which)."),
        _option("owned_containers", "--owned-containers", type=_ContainerList(), default=None,
                help="The containers this node hosts, e.g. 0,1 (default: all); requests for the others are "
                     "answered WrongHost, and a node that hosts only some hosts no controller."),
        _option("auth_secret_file", "--auth-secret-file", type=file, default=None,
                help="Check a token on every request: the file holds the secret (at least 16 bytes) that "
                     "`millstream token issue --secret-file` signs tokens with."),
        _option("tls_cert_file", "--tls-cert", type=file, default=None,
                help="Serve TLS with this certificate (PEM; with --tls-key): clients connect to "
                     "tls://HOST:PORT and trust it with --tls-ca or MILLSTREAM_TLS_CA."),
        _option("tls_key_file", "--tls-key", type=file, default=None, help="The private key of --tls-cert (PEM)."),
        _option("metrics_port", "--metrics-port", type=click.IntRange(0, 65535), default=None,
                help="Serve Prometheus metrics and health checks over HTTP on this port (/metrics, /healthz, "
                     "/readyz, /status; 0: a free one, logged at start).  [default: off]"),
        _option("metrics_host", "--metrics-host", default="127.0.0.1", show_default=True,
                help="Address the metrics port binds."),
        logging_options,
    )):
        command = decorate(command)
    return command


def _config_option(required: bool) -> Callable[[F], F]:
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
        required=required, is_eager=True, expose_value=True, callback=_load_config,
        envvar=CONFIG_ENVIRONMENT_VARIABLE, show_envvar=True,
        help="A TOML file of these options (keys as in docs/configuration.md: data_dir, port, "
             "metrics_port, ...; relative paths relative to the file).  The command line and the "
             "environment take precedence over it.")


@main.command(short_help="Run a whole node on this machine, listening on loopback.")
@_config_option(required=False)
@_option("data_dir", "--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
         help="Where the node keeps everything (created if missing).  Starting again on the same "
              "directory recovers every segment.")
@_option("container_count", "--containers", type=click.IntRange(1, 1024), default=None,
         help="Segment containers (fixed for a data directory once it is first used).  [default: the "
              "data directory's count, else 1: one process gains nothing from more]")
@_node_options
def standalone(config_path: Path | None, data_dir: Path, container_count: int | None, **options: Any) -> None:
    """Run a millstream node: the segment store with every container, on local files.

    It prints one line when it is ready,

        millstream standalone listening on tcp://127.0.0.1:PORT (data in DIR)

    and serves until you press Ctrl-C (SIGINT) or send SIGTERM; then it stops accepting, lets the
    appends it already received be acknowledged, and shuts down.  Other processes (the millstream
    commands, your programs, Spark executors) connect to the printed address.  Logs go to stderr.

    With --auth-secret-file every request needs a token (`millstream token issue`); with --tls-cert
    and --tls-key it serves TLS.  Bound beyond loopback (--host) without them, it warns at start.
    With --metrics-port it serves Prometheus metrics and health checks (`millstream node status`).

    Every option can also come from a MILLSTREAM_* variable or a --config file; the command line
    wins over the environment, which wins over the file.

    \b
    Examples:
      millstream standalone --data-dir ./data --port 9090
      millstream standalone --data-dir ./data --metrics-port 9091 --log-format json
      millstream standalone --data-dir ./data --auth-secret-file secret --tls-cert node.pem --tls-key node.key
      MILLSTREAM_PORT=9190 millstream standalone --config node.toml
    """
    _serve_node(data_dir, container_count, options)


def _cluster_options(command: F) -> F:
    """``serve``'s options for a cluster node (``--zookeeper`` and what goes with it)."""
    directory = click.Path(file_okay=False, path_type=Path)
    for decorate in reversed((
        click.option("--zookeeper", envvar="MILLSTREAM_ZOOKEEPER", show_envvar=True, default=None,
                     help="Run a cluster node: join the cluster on this ZooKeeper ensemble (HOST:PORT[,...]) and "
                          "serve the containers its map gives this node (docs/cluster.md).  Without it, serve "
                          "runs a node of its own as before."),
        click.option("--cluster", "cluster_name", envvar="MILLSTREAM_CLUSTER", show_envvar=True, default="millstream",
                     show_default=True, help="With --zookeeper: the cluster's name."),
        click.option("--host-id", envvar="MILLSTREAM_HOST_ID", show_envvar=True, default=None,
                     help="With --zookeeper: this node's name in the cluster, unique and kept across restarts.  "
                          "[default: HOSTNAME-<data dir name>]"),
        click.option("--tier1", envvar="MILLSTREAM_TIER1", show_envvar=True, default=None,
                     help="With --zookeeper: the replicated Tier-1, jetstream://HOST:PORT[,...] (list every "
                          "NATS server; replicas: 3, or fewer servers if fewer are listed).  [default: FileLogs "
                          "under DATA_DIR/tier1, which every node must then share]"),
        click.option("--tier2-dir", envvar="MILLSTREAM_TIER2_DIR", show_envvar=True, type=directory, default=None,
                     help="With --zookeeper: the Tier-2 directory every node mounts (NFS semantics; "
                          "docs/cluster.md).  [default: DATA_DIR/tier2]"),
        click.option("--advertised-host", envvar="MILLSTREAM_ADVERTISED_HOST", show_envvar=True, default=None,
                     help="With --zookeeper: the address other nodes and clients reach this one at.  "
                          "[default: --host]"),
        click.option("--connect-timeout", "connect_timeout_seconds", type=click.FloatRange(min=0.1),
                     envvar="MILLSTREAM_CONNECT_TIMEOUT", show_envvar=True,
                     default=limits.ZOOKEEPER_CONNECT_TIMEOUT_SECONDS, show_default=True,
                     help="With --zookeeper: seconds to wait for ZooKeeper (and for JetStream, with --tier1) "
                          "before failing to start, naming the address."),
        click.option("--peer-tls-ca", "peer_tls_ca", envvar="MILLSTREAM_PEER_TLS_CA", show_envvar=True,
                     type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="With --zookeeper and --tls-cert: the authority (PEM) that signed the other nodes' "
                          "certificates, which this node trusts when it reaches them (its controller creates and "
                          "merges segments on every node).  [default: the system's trust store]"),
    )):
        command = decorate(command)
    return command


@main.command(short_help="Run a node as a configuration file describes it, or a cluster node.")
@_config_option(required=False)
@_option("data_dir", "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
         help="Where the node keeps everything (usually the file's data_dir).  [required]")
@_option("container_count", "--containers", type=click.IntRange(1, 1024), default=None,
         help=f"Segment containers (fixed for a data directory once it is used).  [default: the data "
              f"directory's count, else {_SERVE_CONTAINER_COUNT_DEFAULT}]")
@_node_options
@_cluster_options
def serve(config_path: Path | None, data_dir: Path | None, container_count: int | None, zookeeper: str | None,
          cluster_name: str, host_id: str | None, tier1: str | None, tier2_dir: Path | None,
          advertised_host: str | None, connect_timeout_seconds: float, peer_tls_ca: Path | None,
          **options: Any) -> None:
    """Run a millstream node as described by a TOML file, until SIGINT or SIGTERM; with
    --zookeeper, a node of a cluster.

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
      metrics_port = 9091                serve metrics and health checks (default: off)
      metrics_host = "127.0.0.1"
      log_level = "info"                 debug, info, warning, error
      log_format = "text"                text or json
      quiet = false
      [client]                           what clients read (MILLSTREAM_CONFIG=FILE):
      uri = "tcp://127.0.0.1:9090"       uri, token, tls_ca, metrics_url

    Every key is also an option below and a MILLSTREAM_<KEY> variable; the command line wins
    over the environment, which wins over the file (docs/configuration.md).  It prints the same
    "listening on" line as `millstream standalone`, warns as it does when bound beyond loopback
    without authentication or TLS, and shuts down gracefully.

    \b
    With --zookeeper it runs a cluster node instead (--config is then optional): it joins the
    cluster, serves the containers ZooKeeper's map gives it (others are answered WrongHost),
    and prints
        millstream node ID of cluster NAME listening on tcp://HOST:PORT (...)
    Every node of a cluster gives the same --containers (default 4).  No controller runs on a
    cluster node yet, so --owned-containers and --metrics-port do not apply.  A wrong ZooKeeper
    or NATS address fails within --connect-timeout, naming it.
      millstream serve --zookeeper 127.0.0.1:2181 --tier1 jetstream://127.0.0.1:4222 \\
          --tier2-dir /mnt/shared/tier2 --data-dir ./node --port 0
    """
    if zookeeper is None and config_path is None:
        raise click.UsageError("Missing option '--config' (serve runs what a file describes, unless --zookeeper "
                               "makes it a cluster node).")
    if data_dir is None:
        raise click.UsageError("Missing option '--data-dir' (or data_dir in the --config file).")
    if zookeeper is not None:
        _serve_cluster_node(data_dir, container_count, options, zookeeper=zookeeper, cluster_name=cluster_name,
                            host_id=host_id, tier1=tier1, tier2_dir=tier2_dir, advertised_host=advertised_host,
                            connect_timeout_seconds=connect_timeout_seconds, peer_tls_ca=peer_tls_ca)
        return
    if peer_tls_ca is not None:
        raise click.BadParameter("only a cluster node (--zookeeper) reaches other nodes", param_hint="--peer-tls-ca")
    from millstream.standalone import recorded_container_count

    if container_count is None:
        container_count = recorded_container_count(data_dir) or _SERVE_CONTAINER_COUNT_DEFAULT
    _serve_node(data_dir, container_count, options)


def _serve_cluster_node(data_dir: Path, container_count: int | None, options: dict[str, Any], **cluster: Any) -> None:
    """Check the options, configure logging and run a cluster node (``cli.cluster.run_cluster_node``)."""
    from millstream.cli.cluster import run_cluster_node

    for name, flag in (("owned_containers", "--owned-containers"), ("metrics_port", "--metrics-port")):
        if options[name] is not None:
            raise click.BadParameter("a cluster node takes no such option: the map decides its containers, and "
                                     "it serves no metrics yet", param_hint=flag)
    secret, ssl_context = load_security(options["auth_secret_file"], options["tls_cert_file"],
                                         options["tls_key_file"], "--auth-secret-file/--tls-cert/--tls-key")
    if cluster["peer_tls_ca"] is not None and ssl_context is None:
        raise click.BadParameter("the nodes serve TLS only with --tls-cert and --tls-key", param_hint="--peer-tls-ca")
    configure_logging(options["log_level"], options["log_format"], options["quiet"])
    run_cluster_node(data_dir=data_dir, container_count=container_count or _SERVE_CONTAINER_COUNT_DEFAULT,
                     host=options["host"], port=options["port"], auth_secret=secret, ssl_context=ssl_context,
                     quiet=options["quiet"], **cluster)


def _serve_node(data_dir: Path, container_count: int | None, options: dict[str, Any]) -> None:
    """Check the options, configure logging, build the node and run it."""
    from millstream.errors import InvalidArgumentError
    from millstream.standalone import Node

    secret, ssl_context = load_security(options["auth_secret_file"], options["tls_cert_file"],
                                         options["tls_key_file"], "--auth-secret-file/--tls-cert/--tls-key")
    try:
        node = Node(data_dir, host=options["host"], port=options["port"], container_count=container_count,
                    owned_containers=options["owned_containers"], auth_secret=secret, ssl_context=ssl_context,
                    metrics_port=options["metrics_port"], metrics_host=options["metrics_host"])
    except InvalidArgumentError as error:
        raise click.BadParameter(str(error)) from error
    configure_logging(options["log_level"], options["log_format"], options["quiet"])
    _run_node(node, data_dir, options["quiet"], options["log_format"] == "json")
