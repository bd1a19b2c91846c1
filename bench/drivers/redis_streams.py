"""Redis Streams: Debian's ``redis-server`` and ``redis-py`` (with hiredis when installed).

Configuration.  One server on 127.0.0.1 with its data in the step's directory, RDB snapshots off.
The equal-durability configuration is ``appendonly yes`` + ``appendfsync always``: Redis writes and
fsyncs the append-only file before it sends the replies of an event-loop iteration, so every
acknowledged XADD is on disk (one fsync covers everything read in that iteration).  The default-durability
configuration (``appendfsync everysec``, fsync once a second) is labelled as weaker in the report.

Mapping.  Partition ``p`` is stream key ``bench:<p>``; a keyed event is ``XADD bench:<p> * k <key>
v <payload>`` with ``p = crc32(key) mod partitions``, an unkeyed one has no ``k`` field and goes
round-robin.  Redis has no client-side batching of its own, so the driver does what a Redis user
would: events wait in a queue per connection and that connection's flusher sends them as a
pipeline (at most one tick's worth, ``BENCH_TICK_EVENTS_MAX`` events / ``BENCH_TICK_BYTES_MAX`` bytes)
as soon as its previous pipeline is answered -- batching that grows with the load, no knob.
Partitions are spread over up to ``CLIENT_CONNECTIONS_PER_ENDPOINT_MAX`` connections (see
``_RedisSession``).  Every event of a pipeline is acknowledged when its reply arrives.  A consumer
is ``XREAD BLOCK`` over its streams from their last id at open.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bench._keys import KeySpace
from bench._load import Batch, StepRecorder, send_time_of
from bench._processes import ServerProcess
from bench.drivers._base import Availability, Consumer, Driver, Session, find_executable, version_of
from bench.limits import (
    BENCH_CONSUMER_POLL_SECONDS,
    BENCH_DRIVER_CALL_TIMEOUT_SECONDS,
    BENCH_TICK_BYTES_MAX,
    BENCH_TICK_EVENTS_MAX,
)
from bench.workload import Workload
from millstream.limits import CLIENT_CONNECTIONS_PER_ENDPOINT_MAX

__all__ = ["RedisStreamsDriver"]

#: Entries one XREAD returns at most (the read-back baseline used 1,000 per call).
_READ_COUNT: Final = 1000


class RedisStreamsDriver(Driver):
    def __init__(self, *, fsync_always: bool = True) -> None:
        self.fsync_always = fsync_always
        self.name = "redis-streams" if fsync_always else "redis-streams-everysec"
        self.equal_durability = fsync_always
        self.title = ("Redis Streams (appendfsync always)" if fsync_always
                      else "Redis Streams (appendfsync everysec: weaker durability)")

    def availability(self) -> Availability:
        binary = find_executable("redis-server")
        if binary is None:
            return Availability(False, "redis-server is not installed (apt-get install -y redis-server)")
        version = version_of([str(binary), "--version"])
        if version is None:
            return Availability(False, f"{binary} --version failed")
        try:
            import redis  # noqa: F401
        except ImportError:
            return Availability(False, "the redis-py client is not installed (pip install 'millstream[bench]')")
        return Availability(True, f"{version} ({binary})")

    def _arguments(self, *, port: int, directory: Path) -> list[str]:
        return ["--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--save", "",
                "--appendonly", "yes", "--appendfsync", "always" if self.fsync_always else "everysec",
                "--protected-mode", "no", "--daemonize", "no"]

    def configuration(self) -> str:
        return "redis-server " + " ".join(a if a else '""' for a in self._arguments(port=0, directory=Path("DATA")))

    def server(self, workdir: Path, port: int, *, profile_path: Path | None = None) -> ServerProcess:
        binary = find_executable("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        data = workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        return ServerProcess(self.name, [str(binary), *self._arguments(port=port, directory=data)], port=port,
                             log_path=workdir / "server.log", ready_pattern="Ready to accept connections")

    async def open_session(self, port: int, workload: Workload, keys: KeySpace,
                           recorder: StepRecorder) -> Session:
        import redis.asyncio as redis_asyncio

        def connect() -> Any:
            return redis_asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS,
                                       socket_connect_timeout=BENCH_DRIVER_CALL_TIMEOUT_SECONDS)

        session = _RedisSession(connect, workload, keys, recorder)
        await session.start()
        return session


class _Pipe:
    """One connection and its flusher: queued events go out as one pipeline at a time."""

    def __init__(self, client: Any, event_bytes: int, recorder: StepRecorder) -> None:
        self.client = client
        self._recorder = recorder
        self._events_max = max(1, min(BENCH_TICK_EVENTS_MAX, BENCH_TICK_BYTES_MAX // event_bytes))
        # [sent_at, [(stream name, key, payload), ...], index of the next one to send] per batch
        self.queue: collections.deque[list[Any]] = collections.deque()
        self.queued = asyncio.Event()
        self.closing = False

    def _next_pipeline(self) -> tuple[Any, list[tuple[float, int]]]:
        """Up to one tick's worth of queued events as a pipeline, and (sent_at, count) per batch in it."""
        pipeline = self.client.pipeline(transaction=False)
        taken: list[tuple[float, int]] = []
        events = 0
        while self.queue and events < self._events_max:
            entry = self.queue[0]
            sent_at, items, start = entry
            end = min(len(items), start + self._events_max - events)
            for name, key, payload in items[start:end]:
                pipeline.xadd(name, {b"v": payload} if key is None else {b"k": key, b"v": payload})
            taken.append((sent_at, end - start))
            events += end - start
            if end == len(items):
                self.queue.popleft()
            else:
                entry[2] = end
        return pipeline, taken

    async def flush_forever(self) -> None:
        """Runs until the session closes (the harness closes it when the step ends)."""
        while True:
            if not self.queue:
                if self.closing:
                    return
                self.queued.clear()
                await self.queued.wait()
                continue
            pipeline, taken = self._next_pipeline()
            try:
                await pipeline.execute()
            except Exception as error:  # any failure of the peer ends the step, reported
                self._recorder.failed(f"Redis pipeline failed: {error!r}")
                return
            for sent_at, count in taken:
                self._recorder.acknowledged(sent_at, count)


class _RedisSession(Session):
    """Partition ``p`` is written on connection ``p mod n``, ``n = min(partitions,
    CLIENT_CONNECTIONS_PER_ENDPOINT_MAX)`` -- as many connections as millstream's client may open to one
    server.  Redis reads a client's pipeline 16 KiB at a time and fsyncs once per event-loop turn, so
    more connections put more events behind each fsync; one would starve it with large events."""

    def __init__(self, connect: Any, workload: Workload, keys: KeySpace, recorder: StepRecorder) -> None:
        self._connect = connect
        self._keys = keys
        self._recorder = recorder
        self._stream_names = [f"bench:{partition}".encode() for partition in range(workload.segments)]
        count = min(workload.segments, CLIENT_CONNECTIONS_PER_ENDPOINT_MAX)
        self._pipes = [_Pipe(connect(), workload.event_bytes, recorder) for _ in range(count)]
        self._flushers: list[asyncio.Task[None]] = []
        self._consumers: list[_RedisConsumer] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for index, pipe in enumerate(self._pipes):
            await asyncio.wait_for(pipe.client.ping(), BENCH_DRIVER_CALL_TIMEOUT_SECONDS)
            self._flushers.append(loop.create_task(pipe.flush_forever(), name=f"redis-flusher-{index}"))

    async def write(self, batch: Batch) -> None:
        names = self._stream_names
        pipes = len(self._pipes)
        per_pipe: list[list[tuple[bytes, str | None, bytes]]] = [[] for _ in range(pipes)]
        keys = self._keys.keys(batch.first_sequence, batch.count)
        partitions = self._keys.partitions_of(batch.first_sequence, batch.count)
        for key, partition, payload in zip(keys, partitions, batch.payloads, strict=True):
            per_pipe[partition % pipes].append((names[partition], key, payload))
        for pipe, items in zip(self._pipes, per_pipe, strict=True):
            if items:
                pipe.queue.append([batch.sent_at, items, 0])
                pipe.queued.set()

    async def open_consumer(self, partitions: Sequence[int]) -> Consumer:
        client = self._connect()
        names = [self._stream_names[partition] for partition in partitions]
        positions: dict[bytes, bytes] = {}
        for name in names:
            last = await client.xrevrange(name, count=1)
            positions[name] = last[0][0] if last else b"0-0"
        consumer = _RedisConsumer(client, positions, self._recorder)
        self._consumers.append(consumer)
        return consumer

    async def close(self) -> None:
        for pipe in self._pipes:
            pipe.closing = True
            pipe.queued.set()
        for flusher in self._flushers:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        for consumer in self._consumers:
            await consumer.close()
        for pipe in self._pipes:
            await pipe.client.aclose()


class _RedisConsumer(Consumer):
    def __init__(self, client: Any, positions: dict[bytes, bytes], recorder: StepRecorder) -> None:
        self._client = client
        self._positions = positions
        self._recorder = recorder

    async def run(self, stop: asyncio.Event) -> None:
        block_ms = int(BENCH_CONSUMER_POLL_SECONDS * 1000)
        while not stop.is_set():
            replies = await self._client.xread(self._positions, count=_READ_COUNT, block=block_ms)
            for name, entries in replies or ():
                for _entry_id, fields in entries:
                    self._recorder.delivered(send_time_of(fields[b"v"]))
                if entries:
                    self._positions[name] = entries[-1][0]

    async def close(self) -> None:
        await self._client.aclose()
