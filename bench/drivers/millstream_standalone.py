"""millstream: its own client (``millstream.client``) against a ``millstream standalone`` process.

Configuration.  ``millstream standalone --data-dir DATA --port P`` in a process of its own (so the
writer and the server each get a core, as a user would run them): a full node on 127.0.0.1 with a
durable FileLog (write + fdatasync before any acknowledgement, group commit) and local Tier 2.

Mapping.  Segment ``i`` of a workload is ``bench/<workload>/<i>.#epoch.0``, created if missing
(``AsyncClient.segments().create``).  One ``AsyncEventStreamWriter`` over the workload's segments
(``AsyncClient.event_writer(names)``) writes every event with the workload's routing key (``None``:
the writer spreads keyless events itself); its batching is its own, adaptive, with no knob.  Each
event is written with ``write_event_future``, and its acknowledgement is that future completing.
The writer hands every event of a block the block's one future (NATS's ``publish_async`` makes one
per message), so the driver adds one callback per distinct future, counting the events it answers
for (``BatchAcknowledgements.track``): each event's latency is still its own send time to the
completion of the future it got, with no callback per event on an object shared by thousands.  A
consumer is an ``AsyncSegmentReader`` per segment, starting at the
segment's length when opened, doing long-poll tail reads (``read_events(wait_seconds=...)``).

The client's API differs from the first plan (``write_event`` returning a future; a
``segment_info``/``create_segment`` on the client): the driver follows the API as built.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._keys import KeySpace
from bench._load import Batch, BatchAcknowledgements, StepRecorder, send_time_of
from bench._processes import STANDALONE_READY, ServerProcess, module_environment
from bench.drivers._base import Availability, Consumer, Driver, Session
from bench.limits import BENCH_CONSUMER_POLL_SECONDS, BENCH_DRIVER_CALL_TIMEOUT_SECONDS
from bench.workload import Workload

__all__ = ["MillstreamDriver", "segment_names"]


def segment_names(workload: Workload) -> list[str]:
    from millstream.naming import segment_id, stream_segment_name

    return [stream_segment_name("bench", workload.name, segment_id(0, number)) for number in range(workload.segments)]


class MillstreamDriver(Driver):
    name = "millstream"
    title = "millstream (fdatasync before ack)"
    equal_durability = True

    def availability(self) -> Availability:
        try:
            from millstream.client import AsyncClient  # noqa: F401
        except ImportError as error:
            return Availability(False, f"millstream's client is not available yet ({error})")
        from millstream.cli import main

        if "standalone" not in getattr(main, "commands", {}):
            return Availability(False, "the `millstream standalone` command is not available yet")
        import millstream

        return Availability(True, f"millstream {millstream.__version__}")  # (the report names the revision)

    def configuration(self) -> str:
        return ("millstream standalone --data-dir DATA --port PORT\n"
                "# one node: FileLog (write + fdatasync before every acknowledgement, group commit), Tier 2 in "
                "DATA; one EventStreamWriter, adaptive batching (no knobs)")

    def server(self, workdir: Path, port: int, *, profile_path: Path | None = None) -> ServerProcess:
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "bench._serve", "standalone", "--data-dir", str(data),
                   "--port", str(port)]
        if profile_path is not None:
            command[1:1] = ["-m", "cProfile", "-o", str(profile_path)]
        return ServerProcess(self.name, command, port=port, log_path=workdir / "server.log",
                             ready_pattern=STANDALONE_READY, environment=module_environment(),
                             # SIGINT ends the server through KeyboardInterrupt, so cProfile writes its file.
                             stop_signal=signal.SIGINT if profile_path is not None else signal.SIGTERM)

    async def open_session(self, port: int, workload: Workload, keys: KeySpace,
                           recorder: StepRecorder) -> Session:
        from millstream.client import AsyncClient

        client = AsyncClient(f"tcp://127.0.0.1:{port}")
        try:
            names = segment_names(workload)
            for name in names:
                await _create_if_missing(client, name)
            writer = client.event_writer(names)
        except BaseException:
            await client.close()
            raise
        return _MillstreamSession(client, writer, names, keys, recorder)


async def _create_if_missing(client: Any, name: str) -> None:
    from millstream.errors import StreamSegmentExistsError

    with contextlib.suppress(StreamSegmentExistsError):
        await asyncio.wait_for(client.segments().create(name), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)


class _MillstreamSession(Session):
    def __init__(self, client: Any, writer: Any, names: list[str], keys: KeySpace, recorder: StepRecorder) -> None:
        self._client = client
        self._writer = writer
        self._names = names
        self._keys = keys
        self._recorder = recorder
        self._consumers: list[_MillstreamConsumer] = []

    async def write(self, batch: Batch) -> None:
        write_event_future = self._writer.write_event_future
        acknowledged = BatchAcknowledgements(self._recorder, batch.sent_at, "a millstream write")
        track = acknowledged.track
        keys = self._keys.keys(batch.first_sequence, batch.count)
        for payload, key in zip(batch.payloads, keys, strict=True):
            track(await write_event_future(payload, routing_key=key))

    async def open_consumer(self, partitions: Sequence[int]) -> Consumer:
        readers = []
        for partition in partitions:
            name = self._names[partition]
            info = await asyncio.wait_for(self._client.segments().info(name), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
            readers.append(self._client.segment_reader(name, offset=info.length))
        consumer = _MillstreamConsumer(readers, self._recorder)
        self._consumers.append(consumer)
        return consumer

    async def close(self) -> None:
        for consumer in self._consumers:
            await consumer.close()
        try:
            await asyncio.wait_for(self._writer.close(), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)  # flushes first
        finally:
            await asyncio.wait_for(self._client.close(), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)


class _MillstreamConsumer(Consumer):
    def __init__(self, readers: list[Any], recorder: StepRecorder) -> None:
        self._readers = readers
        self._recorder = recorder

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            for reader in self._readers:
                group.create_task(self._tail(reader, stop))

    async def _tail(self, reader: Any, stop: asyncio.Event) -> None:
        delivered = self._recorder.delivered
        while not stop.is_set():
            events = await reader.read_events(wait_seconds=BENCH_CONSUMER_POLL_SECONDS)
            for event in events:
                delivered(send_time_of(event.value))

    async def close(self) -> None:
        for reader in self._readers:
            await reader.close()
