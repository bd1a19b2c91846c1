"""JetStreamLog on a real three-server JetStream cluster (replicas 3, sync_interval always).

What the conformance suite cannot show on one server: a stale owner fenced while it pipelines, acknowledged
records surviving the loss of a server and of the stream's leader, a lost quorum failing appends typed
(never acknowledging them unreplicated), and a segment container recovering from the replicated log.  Plus
the log's own end-to-end checks (a damaged record, a wrong address, a server whose max_payload is too small).

Every wait is bounded by the log's own timeouts (shortened here) or by ``SCENARIO_TIMEOUT_SECONDS``; nothing
sleeps for a duration or asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import nats
import pytest

from millstream.errors import (
    ContainerUnavailableError,
    DataCorruptionError,
    DataLogFencedError,
    InvalidArgumentError,
    ObjectClosedError,
    WriteFailedError,
)
from millstream.limits import MIB
from millstream.segmentstore.container import ContainerState, SegmentContainer
from millstream.segmentstore.durable_data_log import LogAddress
from millstream.segmentstore.jetstream_log import JetStreamLog, subject_for
from millstream.testing.nats_cluster import NatsCluster

#: A scenario that hangs must fail its test, not the CI job.  Killing servers costs leader elections
#: (a few seconds each here); this is many times that.
SCENARIO_TIMEOUT_SECONDS = 120.0

#: Shorter than the production bound so that a lost quorum fails an append within the test's budget.
ACK_TIMEOUT_SECONDS = 5.0


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_SECONDS))


def log_on(cluster: NatsCluster, container_id: int = 1, **options: Any) -> JetStreamLog:
    options.setdefault("ack_timeout_seconds", ACK_TIMEOUT_SECONDS)
    return JetStreamLog(cluster.client_urls, container_id, replicas=cluster.size, **options)


async def contents(cluster: NatsCluster, container_id: int = 1) -> list[tuple[int, bytes]]:
    """What a new owner reads back (it fences every other owner, then closes)."""
    log = log_on(cluster, container_id)
    await log.initialize()
    try:
        return [(record.address.sequence, record.data) for record in log.read()]
    finally:
        await log.close()


async def stream_leader(cluster: NatsCluster, stream: str) -> int:
    """The index of the server leading ``stream`` (waits, bounded, for one to be elected)."""
    connection = await nats.connect(cluster.client_urls)
    try:
        for _attempt in range(200):
            info = await connection.jetstream().stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return cluster.index_of(info.cluster.leader)
            await asyncio.sleep(0.05)
        raise AssertionError(f"no leader for {stream}")
    finally:
        await connection.close()


def test_a_stale_writer_is_fenced_while_it_pipelines(nats_cluster: NatsCluster) -> None:
    """A new owner takes over while the old one has many publishes in flight: the old one's refused
    writes fail with DataLogFencedError, every later append fails too, and nothing it was told failed
    is readable; everything it was told is durable is."""

    async def scenario() -> None:
        old = log_on(nats_cluster)
        await old.initialize()
        first = [old.append(f"old {i}".encode()) for i in range(200)]
        await first[9]
        new = log_on(nats_cluster)
        assert await new.initialize() > old.epoch
        recovered = [(record.address.sequence, record.data) for record in new.read()]
        late = [old.append(f"old late {i}".encode()) for i in range(20)]  # the log may already be closed
        outcomes = await asyncio.gather(*first, *late, return_exceptions=True)
        acknowledged = {address.sequence for address in outcomes if isinstance(address, LogAddress)}
        failed = [outcome for outcome in outcomes if not isinstance(outcome, LogAddress)]
        assert failed, "the old owner must be fenced"
        assert all(isinstance(outcome, DataLogFencedError) for outcome in failed), failed
        assert acknowledged == set(range(1, len(acknowledged) + 1)) and len(acknowledged) >= 10
        assert [sequence for sequence, _ in recovered] == list(range(1, len(recovered) + 1))
        assert acknowledged <= {sequence for sequence, _ in recovered}
        try:
            await new.append(b"new owner")
            written = [(len(recovered) + 1, b"new owner")]
        except WriteFailedError:
            # One of the old owner's pipelined publishes landed after the epoch record and took the new
            # owner's slot (test_a_stale_publish_after_the_fence_is_skipped pins that case down): the
            # new owner cannot continue, and its record was refused, not written.
            written = []
        await old.close()
        await new.close()
        final = await contents(nats_cluster)
        assert final == recovered + written
        assert not any(data.startswith(b"old late") for _sequence, data in final)

    run(scenario())


def test_a_stale_publish_after_the_fence_is_skipped(nats_server: NatsCluster) -> None:
    """Regression: an old owner's pipelined publish predicts its stream sequence, so one that arrives
    right after the new owner's epoch record finds the expected last sequence it names and is stored.
    The old owner never acknowledges it (its publish before was refused), the new owner's next publish
    fails with WriteFailedError -- not DataLogFencedError: no newer owner exists -- and the next owner
    skips the stale record and numbers on from the last valid one."""

    async def scenario() -> None:
        old = log_on(nats_server, 23)
        await old.initialize()  # epoch 1 at stream sequence 1
        await asyncio.gather(*(old.append(f"record {i}".encode()) for i in (1, 2, 3)))  # 2, 3, 4
        new = log_on(nats_server, 23)
        assert await new.initialize() == 2  # its epoch record at 5
        # The old owner's 4th record (expecting 4) was refused; its 5th, pipelined, expects 5: stored at 6.
        connection = await nats.connect(nats_server.client_urls)
        await connection.jetstream().publish(f"{subject_for('millstream', 23)}.data", b"stale", headers={
            "Nats-Expected-Last-Sequence": "5", "Millstream-Kind": "data", "Millstream-Epoch": "1",
            "Millstream-Sequence": "5", "Millstream-Crc32": str(zlib.crc32(b"stale"))})
        await connection.close()
        with pytest.raises(WriteFailedError, match="older owner's stale publish") as caught:
            await new.append(b"refused")
        assert not isinstance(caught.value, DataLogFencedError)
        await new.close()
        await old.close()
        next_owner = log_on(nats_server, 23)
        await next_owner.initialize()
        assert [record.data for record in next_owner.read()] == [b"record 1", b"record 2", b"record 3"]
        assert (await next_owner.append(b"four")).sequence == 4
        await next_owner.close()
        assert [data for _sequence, data in await contents(nats_server, 23)] == [
            b"record 1", b"record 2", b"record 3", b"four"]

    run(scenario())


def test_a_fenced_container_stops_and_the_new_owner_serves(nats_cluster: NatsCluster) -> None:
    """Two containers on one stream, as a zombie host and its successor: the zombie's next append fails,
    its container stops (ContainerUnavailableError), and the successor has every acknowledged byte."""

    async def scenario() -> None:
        zombie = SegmentContainer(0, log_on(nats_cluster))
        await zombie.start()
        await zombie.create_segment("s")
        await zombie.append("s", b"before ")
        successor = SegmentContainer(0, log_on(nats_cluster))
        await successor.start()
        with pytest.raises((DataLogFencedError, ContainerUnavailableError)):
            await zombie.append("s", b"zombie")
        await asyncio.wait_for(asyncio.shield(zombie.stopped), SCENARIO_TIMEOUT_SECONDS)
        assert zombie.state is ContainerState.STOPPED
        await successor.append("s", b"after")
        info = successor.get_info("s")
        assert (await successor.read("s", 0, info.length)).data == b"before after"
        await successor.stop()
        await zombie.stop()

    run(scenario())


def test_a_segment_container_recovers_from_the_replicated_log_after_every_server_restarts(
        nats_cluster: NatsCluster) -> None:
    """A container writes through a JetStreamLog (replicas 3), stops; every server is stopped and started
    again; a new container recovers the segment byte for byte from the log and carries on."""

    async def write() -> None:
        container = SegmentContainer(0, log_on(nats_cluster))
        await container.start()
        await container.create_segment("s")
        for index in range(50):
            await container.append("s", f"event {index};".encode())
        await container.stop()

    async def recover() -> None:
        container = SegmentContainer(0, log_on(nats_cluster))
        await container.start()
        expected = b"".join(f"event {index};".encode() for index in range(50))
        assert (await container.read("s", 0, container.get_info("s").length)).data == expected
        await container.append("s", b"after the restart")
        assert container.get_info("s").length == len(expected) + len(b"after the restart")
        await container.stop()

    run(write())
    for index in range(3):
        nats_cluster.stop(index)
    nats_cluster.restart(0, 1, 2)
    run(recover())


def test_acknowledged_appends_survive_killing_the_stream_leader(nats_cluster: NatsCluster) -> None:
    """Kill the server leading the stream (SIGKILL) after acknowledged appends: a new owner on the two
    survivors reads every one of them back, and appends again (two of three are a quorum)."""

    async def scenario() -> None:
        log = log_on(nats_cluster)
        await log.initialize()
        payloads = [bytes([i]) * 1000 for i in range(100)] + [bytes(MIB)]
        addresses = await asyncio.gather(*(log.append(payload) for payload in payloads))
        await log.close()
        nats_cluster.kill(await stream_leader(nats_cluster, log.stream_name))

        new = log_on(nats_cluster)
        await new.initialize()
        assert [(record.address.sequence, record.data) for record in new.read()] == [
            (address.sequence, payload) for address, payload in zip(addresses, payloads, strict=True)]
        assert (await new.append(b"on two servers")).sequence == len(payloads) + 1
        await new.close()

    run(scenario())


def test_losing_the_quorum_fails_appends_typed_and_never_acknowledges_them(nats_cluster: NatsCluster) -> None:
    """Two of three servers down: an append fails with WriteFailedError (never succeeds unreplicated) and
    the log closes.  With the servers back, a new owner reads every acknowledged record; the failed
    record either landed whole or left no trace, and its sequence is then reissued -- JetStream's
    counterpart of the conformance suite's torn tail."""

    async def scenario() -> None:
        log = log_on(nats_cluster)
        await log.initialize()
        acknowledged = await asyncio.gather(*(log.append(f"ok {i}".encode()) for i in range(20)))
        leader = await stream_leader(nats_cluster, log.stream_name)
        followers = [index for index in range(3) if index != leader]
        nats_cluster.kill(followers[0])
        nats_cluster.kill(followers[1])
        with pytest.raises(WriteFailedError):
            await log.append(b"without a quorum")
        with pytest.raises(ObjectClosedError):
            await log.truncate(acknowledged[-1])  # the log closed itself at the failure
        await log.close()

        nats_cluster.restart(*followers)
        records = await contents(nats_cluster)
        assert records[:20] == [(address.sequence, f"ok {i}".encode()) for i, address in enumerate(acknowledged)]
        assert records[20:] in ([], [(21, b"without a quorum")])
        new = log_on(nats_cluster)
        await new.initialize()
        assert (await new.append(b"next")).sequence == len(records) + 1
        await new.close()

    run(scenario())


def test_truncation_purges_the_stream_and_numbering_continues(nats_server: NatsCluster) -> None:
    """Truncating everything leaves only control records in the stream; the next owner still numbers on."""

    async def scenario() -> None:
        log = log_on(nats_server, 21)
        await log.initialize()
        addresses = await asyncio.gather(*(log.append(bytes(100)) for _ in range(10)))
        await log.truncate(addresses[-1])
        connection = await nats.connect(nats_server.client_urls)
        state = (await connection.jetstream().stream_info(log.stream_name)).state
        await connection.close()
        assert state.messages == 1  # the truncation record alone: every data record was purged
        await log.close()
        new = log_on(nats_server, 21)
        await new.initialize()
        assert list(new.read()) == []
        assert (await new.append(b"eleven")).sequence == 11
        await new.close()

    run(scenario())


def test_a_damaged_record_is_corruption_naming_where(nats_server: NatsCluster) -> None:
    """A data record whose CRC header does not match its payload (published straight to the stream, as
    JetStream cannot damage one in place) makes recovery raise DataCorruptionError naming its sequences."""

    async def scenario() -> None:
        log = log_on(nats_server, 22)
        await log.initialize()
        await asyncio.gather(*(log.append(b"good") for _ in range(2)))
        await log.close()
        connection = await nats.connect(nats_server.client_urls)
        await connection.jetstream().publish(f"{subject_for('millstream', 22)}.data", b"damaged", headers={
            "Nats-Expected-Last-Sequence": "3", "Millstream-Kind": "data", "Millstream-Epoch": "1",
            "Millstream-Sequence": "3", "Millstream-Crc32": str(zlib.crc32(b"undamaged"))})
        await connection.close()
        new = log_on(nats_server, 22)
        with pytest.raises(DataCorruptionError, match="stream sequence 4: record at sequence 3 is damaged"):
            await new.initialize()
        await new.close()

    run(scenario())


def test_an_unreachable_server_fails_initialize_with_a_clear_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = JetStreamLog(["nats://127.0.0.1:9"], 1, replicas=1, request_timeout_seconds=2.0)
        with pytest.raises(WriteFailedError, match="cannot connect to"):
            await log.initialize()
        await log.close()

    run(scenario())


def test_a_server_whose_max_payload_is_too_small_is_refused_by_name(tmp_path: Path) -> None:
    """NATS's default max_payload (1 MiB, headers included) cannot carry a full DataFrame."""

    async def scenario(cluster: NatsCluster) -> None:
        log = log_on(cluster)
        with pytest.raises(InvalidArgumentError, match="set max_payload"):
            await log.initialize()
        await log.close()

    with NatsCluster(tmp_path / "nats", size=1, max_payload_bytes=MIB) as cluster:
        run(scenario(cluster))
