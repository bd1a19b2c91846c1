"""A cluster that serves TLS: the controller reaches the other nodes' containers over TLS, trusting the
authority it is given (``ClusterNode(peer_ssl_context=...)``, ``serve --zookeeper ... --tls-ca``).

Before, the controller's connections to other nodes were made without the node's trust: creating a
stream whose segments live on another node failed the certificate check, so a TLS cluster could not
create a stream unless every container sat on the controller's own node."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import trustme
from click.testing import CliRunner

from millstream.cli import main
from millstream.client import AsyncClient, ClientConfig
from millstream.cluster import ClusterNode
from millstream.naming import container_of, stream_segment_name
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.server import ServerConfig
from millstream.testing.nats_cluster import NatsCluster
from millstream.testing.zookeeper_server import ZooKeeperServer
from millstream.values import ReaderGroupConfig, ScalingPolicy, StreamConfig

from .cluster_up import ClusterUp
from .workload import EMPTY_READS_MAX
from .zookeeper_helpers import SCENARIO_SECONDS, SESSION_TIMEOUT_SECONDS, cluster_name, in_loop, wait_until

CONTAINER_COUNT = 4
HOSTS = ("a", "b")
SEGMENTS = 8


@in_loop
async def test_a_tls_cluster_creates_writes_and_reads_a_stream_spread_over_both_nodes(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    authority.configure_trust(client_context)
    cluster = cluster_name()
    storages = [FileChunkStorage(tmp_path / "tier2") for _ in HOSTS]
    nodes = [ClusterNode(zookeeper.connect_string, cluster=cluster, host_id=host,
                         open_log=lambda container_id: FileLog(tmp_path / "tier1" / f"container-{container_id}"),
                         chunk_storage=storage, config=ServerConfig(container_count=CONTAINER_COUNT),
                         session_timeout_seconds=SESSION_TIMEOUT_SECONDS, connect_timeout_seconds=30.0,
                         server_options={"ssl_context": server_context}, peer_ssl_context=client_context)
             for host, storage in zip(HOSTS, storages, strict=True)]
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        await wait_until(lambda: sorted(c for node in nodes for c in node.serving) == list(range(CONTAINER_COUNT))
                         and all(node.serving for node in nodes)
                         and sum(node.controller is not None for node in nodes) == 1,
                         "both nodes serving containers, one running the controller")
        assert all(node.uri.startswith("tls://") for node in nodes)
        controller_node = next(node for node in nodes if node.controller is not None)
        other = next(node for node in nodes if node is not controller_node)
        segments = [stream_segment_name("tls", "spread", index) for index in range(SEGMENTS)]
        # The point of the test: some of the stream's segments are the other node's to create.
        assert {container_of(name, CONTAINER_COUNT) for name in segments} & other.serving
        config = ClientConfig(connect_timeout_seconds=5.0, request_timeout_seconds=20.0, reconnect_budget_seconds=60.0)
        seeds = ",".join(node.uri for node in nodes)
        async with AsyncClient(seeds, ssl_context=client_context, config=config) as client:
            await client.stream_manager().create_scope("tls")
            await client.stream_manager().create_stream("tls/spread",
                                                        StreamConfig(scaling=ScalingPolicy.fixed(SEGMENTS)))
            writer = client.event_writer("tls/spread")
            payloads = [f"event-{index}".encode() for index in range(64)]
            for index, payload in enumerate(payloads):
                await writer.write_event(payload, routing_key=f"key-{index}")
            await writer.flush()
            await writer.close()
            read = []
            for name in segments:
                info = await client.segments().info(name)
                offset = info.start_offset
                while offset < info.length:
                    result = await client.segments().read(name, offset, length=info.length - offset)
                    read.append(result.data)
                    offset += len(result.data)
        data = b"".join(read)
        assert all(payload in data for payload in payloads)
    finally:
        for node in nodes:
            await node.stop()
        for storage in storages:
            await storage.close()


def test_serve_takes_the_peer_authority_only_for_a_tls_cluster_node(tmp_path: Path) -> None:
    """``--peer-tls-ca`` is refused, naming it, where nothing would use it: without --zookeeper (a node of
    its own reaches no other node) and without --tls-cert (the nodes serve plain TCP)."""


    authority = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(authority))
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--zookeeper", "127.0.0.1:1", "--peer-tls-ca", str(authority),
                                  "--data-dir", str(tmp_path / "node"), "--port", "0", "--quiet"])
    assert result.exit_code == 2 and "--peer-tls-ca" in result.output and "--tls-cert" in result.output, result.output
    config = tmp_path / "node.toml"
    config.write_text('data_dir = "node"\n', encoding="utf-8")
    result = runner.invoke(main, ["serve", "--config", str(config), "--peer-tls-ca", str(authority), "--quiet"])
    assert result.exit_code == 2 and "--peer-tls-ca" in result.output and "--zookeeper" in result.output, \
        result.output
    help_text = " ".join(runner.invoke(main, ["serve", "--help"]).output.split())
    assert "--peer-tls-ca" in help_text and "the other nodes' certificates" in help_text


def test_cluster_up_with_tls_serves_a_client_that_trusts_its_authority(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """``millstream cluster up --tls-cert --tls-key --peer-tls-ca``: every node serves TLS, the controller
    reaches the other node's containers trusting the authority, and a client given it writes a stream
    spread over both nodes and reads every event back through a reader group.  (``zookeeper``: only for
    its skip when ZooKeeper is not installed; ``cluster up`` starts its own.)"""
    NatsCluster(tmp_path / "probe", size=1)  # fails now, saying how to install it, if nats-server is missing
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    files = {"cert": tmp_path / "node.pem", "key": tmp_path / "node.key", "ca": tmp_path / "ca.pem"}
    certificate.cert_chain_pems[0].write_to_path(str(files["cert"]))
    certificate.private_key_pem.write_to_path(str(files["key"]))
    authority.cert_pem.write_to_path(str(files["ca"]))
    client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    authority.configure_trust(client_context)
    with ClusterUp(["cluster", "up", "--nodes", "2", "--data-dir", str(tmp_path / "cluster"),
                    "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
                    "--peer-tls-ca", str(files["ca"])], tmp_path) as up:
        up.start()
        assert len(up.nodes) == 2 and all(uri.startswith("tls://127.0.0.1:") for uri, _ in up.nodes.values()), up.text

        async def write_and_read() -> list[bytes]:
            config = ClientConfig(connect_timeout_seconds=5.0, request_timeout_seconds=20.0,
                                  reconnect_budget_seconds=60.0)
            async with AsyncClient(up.seeds, ssl_context=client_context, config=config) as client:
                await client.stream_manager().create_scope("tls")
                await client.stream_manager().create_stream(
                    "tls/up", StreamConfig(scaling=ScalingPolicy.fixed(SEGMENTS)))
                async with client.event_writer("tls/up") as writer:
                    for index in range(64):
                        await writer.write_event(f"event-{index}".encode(), routing_key=f"key-{index}")
                group = await client.reader_group("tls/all", config=ReaderGroupConfig(["tls/up"]))
                reader = await group.reader("r1")
                read: list[bytes] = []
                for _ in range(EMPTY_READS_MAX + 64):
                    event = (await reader.read_next_event(1.0)).event
                    if event is not None:
                        read.append(event)
                    if len(read) == 64:
                        break
                await group.close()
                return read

        read = asyncio.run(asyncio.wait_for(write_and_read(), SCENARIO_SECONDS))
        assert sorted(read) == sorted(f"event-{index}".encode() for index in range(64))
        assert up.stop() == 0


def test_cluster_up_refuses_half_a_tls_configuration_at_once_naming_the_option(tmp_path: Path) -> None:
    """Before it starts anything: a certificate without its key, and an authority without a certificate."""
    authority = trustme.CA()
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    up = ["cluster", "up", "--data-dir", str(tmp_path / "cluster")]
    without_key = CliRunner().invoke(main, [*up, "--tls-cert", str(ca)])
    assert without_key.exit_code == 2 and "--tls-cert/--tls-key" in without_key.output, without_key.output
    without_certificate = CliRunner().invoke(main, [*up, "--peer-tls-ca", str(ca)])
    assert without_certificate.exit_code == 2 and "--peer-tls-ca" in without_certificate.output, \
        without_certificate.output
    assert not (tmp_path / "cluster").exists()  # (nothing was started: not even its directory made)
