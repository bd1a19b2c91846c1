"""The blocking flavour: ``Client`` and its writers and readers, on the asyncio core.

Theory of operation.  A ``Client`` starts one event-loop thread and builds an ``AsyncClient`` on it;
every blocking method hands a coroutine to that loop and waits for its result, so both flavours share
one implementation.  A hand-off costs tens of microseconds, far too much per event, so the two hot
paths avoid it: ``EventStreamWriter.write_event`` runs the writer's per-event path on the caller's
thread (serialize, route, frame into the open block under the writer's lock; a closed block goes to
the loop through a FIFO), and crosses to the loop only to wait when too much is unacknowledged;
``SegmentReader`` fetches events in batches and hands them out one by one from a local queue.

Every wait is bounded by the core's own timeouts (request, acknowledgement and reconnect limits), so a
blocking call returns or raises even if the server vanishes.  Ctrl-C in a blocking call cancels the
coroutine it was waiting for.  A blocking method called on the client's own loop thread (from a
callback) would deadlock and raises ``InternalError`` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl as _ssl
import threading
from collections import deque
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast, overload

from millstream import limits
from millstream.client._byte_stream import AsyncByteStreamWriter, ByteStreamWriter
from millstream.client._client import AsyncClient
from millstream.client._config import ClientConfig, Endpoint, RandomSource, parse_uri
from millstream.client._framing import ColumnBatch, bytes_batch
from millstream.client._in_doubt import InDoubtEvent
from millstream.client._large_events import AsyncLargeEventWriter, LargeEventConfig, LargeEventWriter
from millstream.client._pool import SegmentLocator
from millstream.client._reader_group import ReaderGroup
from millstream.client._readers import AsyncByteStreamReader, AsyncSegmentReader, SegmentEvent
from millstream.client._routing import Router
from millstream.client._segments import AsyncSegments, SegmentProperties
from millstream.client._sequenced_writer import AsyncSequencedEventStreamWriter, SequencedEventStreamWriter
from millstream.client._serializers import BytesSerializer, Serializer
from millstream.client._streams import ReaderGroupConfig, StreamManager
from millstream.client._transactions import (
    AsyncTransactionalEventStreamWriter,
    MultiCommitResult,
    Transaction,
    TransactionalEventStreamWriter,
)
from millstream.client._writer import OVER_BUDGET, AsyncEventStreamWriter, Tracking, _columns, _no_sequences
from millstream.clock import Clock
from millstream.errors import InternalError, InvalidArgumentError, ObjectClosedError, RequestTimeoutError
from millstream.values import ReadResult

__all__ = ["ByteStreamReader", "Client", "EventStreamWriter", "SegmentReader", "Segments", "connect"]

T = TypeVar("T")
R = TypeVar("R")


class _LoopThread:
    """An event loop running in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._started.wait(limits.CLIENT_CLOSE_TIMEOUT_SECONDS):
            raise InternalError("the client's event-loop thread did not start")

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def run(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        """Run ``coroutine`` on the loop and wait for its result."""
        if threading.get_ident() == self._thread.ident:
            coroutine.close()
            raise InternalError("a blocking client call on the client's own event-loop thread would deadlock")
        if not self._thread.is_alive():
            coroutine.close()
            raise ObjectClosedError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeoutError(f"the client's event loop did not answer within {timeout} s") from None
        except BaseException:
            future.cancel()  # Ctrl-C (or another interruption) while waiting: stop the work too
            raise

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(limits.CLIENT_CLOSE_TIMEOUT_SECONDS)


class Segments:
    """Blocking operations on segments by name (see ``AsyncSegments`` for each one's errors)."""

    def __init__(self, core: AsyncSegments, runner: _LoopThread) -> None:
        self._core = core
        self._run = runner.run

    def create(self, segment: str) -> None:
        self._run(self._core.create(segment))

    def info(self, segment: str) -> SegmentProperties:
        return self._run(self._core.info(segment))

    def exists(self, segment: str) -> bool:
        return self._run(self._core.exists(segment))

    def seal(self, segment: str) -> None:
        self._run(self._core.seal(segment))

    def truncate(self, segment: str, offset: int) -> None:
        self._run(self._core.truncate(segment, offset))

    def delete(self, segment: str) -> None:
        self._run(self._core.delete(segment))

    def merge(self, target: str, source: str) -> int:
        return self._run(self._core.merge(target, source))

    def get_attribute(self, segment: str, attribute_id: int) -> int | None:
        return self._run(self._core.get_attribute(segment, attribute_id))

    def update_attribute(self, segment: str, attribute_id: int, new_value: int | None, *,
                         expected_value: int | None) -> bool:
        return self._run(self._core.update_attribute(segment, attribute_id, new_value, expected_value=expected_value))

    def read(self, segment: str, offset: int, *, length: int | None = None, wait_seconds: float = 0.0) -> ReadResult:
        return self._run(self._core.read(segment, offset, length=length, wait_seconds=wait_seconds))

    def event_boundaries(self, segment: str, start_offset: int, end_offset: int) -> tuple[int, ...]:
        return self._run(self._core.event_boundaries(segment, start_offset, end_offset))

    def conditional_append(self, segment: str, events: Sequence[bytes], *, expected_offset: int) -> int:
        return self._run(self._core.conditional_append(segment, events, expected_offset=expected_offset))


class EventStreamWriter(Generic[T]):
    """The blocking idempotent writer (see ``AsyncEventStreamWriter``).  Thread-safe: several threads
    may write through one writer."""

    def __init__(self, core: AsyncEventStreamWriter[T], runner: _LoopThread) -> None:
        self._core = core
        self._add = core._add
        self._shared = core._shared
        self._runner = runner

    def write_event(self, event: T, *, routing_key: str | None = None, sequence: None = None) -> None:
        """Buffer ``event``; returns at once unless too much is unacknowledged (then waits).  A
        ``sequence`` needs a stable writer id (``InvalidSequenceError`` here)."""
        if sequence is not None:
            raise _no_sequences()
        if self._add(event, routing_key, None) & OVER_BUDGET:
            self._runner.run(self._shared.wait_for_capacity())

    def write_events(self, events: Sequence[T], *, routing_keys: Sequence[str | None] | None = None) -> None:
        """Write a batch: ``write_event`` for each of ``events`` in order, ``routing_keys[i]`` the key of
        ``events[i]`` (or ``routing_keys=None``: no keys), with the same guarantees, on the caller's
        thread under one lock step per batch instead of one per event.  Validation errors are raised
        before any of the batch is written (see ``AsyncEventStreamWriter.write_events``)."""
        core = self._core
        payloads, keys = core._prepare_batch(events, routing_keys)
        columns = bytes_batch(payloads, keys)
        if columns is not None:  # framed in columns (_framing)
            self._write_column_batch(columns)
            return
        for start, end in core._batch_slices(payloads):
            if core._add_batch(payloads[start:end], keys[start:end]) & OVER_BUDGET:
                self._runner.run(self._shared.wait_for_capacity())

    def write_columns(self, values: object, routing_keys: object = None) -> None:
        """Write a batch held in columns: ``values`` a pyarrow ``BinaryArray``/``LargeBinaryArray`` of
        events *already serialized* (or a ``(buffer, offsets)`` pair), ``routing_keys`` an Arrow string
        array, a sequence or None (see ``AsyncEventStreamWriter.write_columns`` for what is refused)."""
        core = self._core
        columns = _columns(core, values, routing_keys)
        if isinstance(columns, ColumnBatch):  # framed in columns (_framing)
            self._write_column_batch(columns)
            return
        payloads, keys = columns
        self.write_events(cast(Sequence[T], payloads), routing_keys=keys)  # (a bytes writer: checked by _columns)

    def _write_column_batch(self, columns: ColumnBatch) -> None:
        """Add a checked columnar batch a slice at a time, waiting for capacity between slices."""
        core = self._core
        for start, end in core._column_slices(columns):
            if core._add_columns(columns.slice(start, end)) & OVER_BUDGET:
                self._runner.run(self._shared.wait_for_capacity())

    def write_event_future(self, event: T, *, routing_key: str | None = None) -> concurrent.futures.Future[None]:
        """``write_event``, and a future that completes when the event is durable (shared by the events of
        one block, as in ``AsyncEventStreamWriter.write_event_future``)."""
        tracking = Tracking(concurrent.futures.Future)
        if self._add(event, routing_key, tracking) & OVER_BUDGET:
            self._runner.run(self._shared.wait_for_capacity())
        return tracking.future  # type: ignore[return-value]

    def flush(self) -> None:
        """Wait until every event written so far is durable.  Raises the writer's error, if any."""
        self._runner.run(self._core.flush())

    def close(self, *, flush: bool = True) -> None:
        """Flush, then stop (``flush=False``: stop at once; see ``AsyncEventStreamWriter.close``)."""
        self._runner.run(self._core.close(flush=flush))

    def unacknowledged_events(self, segment: str) -> list[bytes]:
        async def collect() -> list[bytes]:
            return self._core.unacknowledged_events(segment)
        return self._runner.run(collect())

    def in_doubt_events(self) -> tuple[InDoubtEvent, ...]:
        """Every event written and not acknowledged, in the order written (see
        ``AsyncEventStreamWriter.in_doubt_events``)."""
        async def collect() -> tuple[InDoubtEvent, ...]:
            return self._core.in_doubt_events()
        return self._runner.run(collect())

    @property
    def events_written(self) -> int:
        """How many events were written through this writer."""
        return self._core.events_written

    @property
    def core(self) -> AsyncEventStreamWriter[T]:
        return self._core

    def __enter__(self) -> EventStreamWriter[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ByteStreamReader:
    """The blocking byte reader (see ``AsyncByteStreamReader``)."""

    def __init__(self, core: AsyncByteStreamReader, runner: _LoopThread) -> None:
        self._core = core
        self._run = runner.run

    @property
    def offset(self) -> int:
        return self._core.offset

    @property
    def end_of_segment(self) -> bool:
        return self._core.end_of_segment

    @property
    def at_tail(self) -> bool:
        return self._core.at_tail

    def seek(self, offset: int) -> None:
        self._core.seek(offset)

    def read(self, max_bytes: int | None = None, *, wait_seconds: float = 0.0) -> bytes:
        return self._run(self._core.read(max_bytes, wait_seconds=wait_seconds))

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> ByteStreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SegmentReader(Generic[T]):
    """The blocking event reader (see ``AsyncSegmentReader``): events come from the loop in batches.
    ``for event in reader`` follows the segment until it is sealed and read to its end."""

    def __init__(self, core: AsyncSegmentReader[T], runner: _LoopThread) -> None:
        self._core = core
        self._run = runner.run
        self._pending: deque[SegmentEvent[T]] = deque()

    @property
    def offset(self) -> int:
        """Where the next event starts."""
        return self._pending[0].offset if self._pending else self._core.offset

    @property
    def end_of_segment(self) -> bool:
        return not self._pending and self._core.end_of_segment

    @property
    def pending_events(self) -> int:
        """Events fetched and not yet returned (``read_event`` returns them without waiting)."""
        return len(self._pending)

    @property
    def at_tail(self) -> bool:
        return not self._pending and self._core.at_tail

    def read_event(self, *, wait_seconds: float = 0.0) -> SegmentEvent[T] | None:
        """The next event, or None at the tail after waiting up to ``wait_seconds``."""
        if not self._pending:
            self._pending.extend(self._run(self._core.read_events(wait_seconds=wait_seconds)))
            if not self._pending:
                return None
        return self._pending.popleft()

    def read_events(self, *, wait_seconds: float = 0.0) -> list[SegmentEvent[T]]:
        """The next events (empty at the tail after waiting up to ``wait_seconds``)."""
        if self._pending:
            events = list(self._pending)
            self._pending.clear()
            return events
        return self._run(self._core.read_events(wait_seconds=wait_seconds))

    def seek(self, offset: int) -> None:
        self._pending.clear()
        self._core.seek(offset)

    def close(self) -> None:
        self._pending.clear()
        self._run(self._core.close())

    def __iter__(self) -> Iterator[SegmentEvent[T]]:
        while True:
            event = self.read_event(wait_seconds=limits.TAIL_READ_WAIT_SECONDS_MAX)
            if event is not None:
                yield event
            elif self.end_of_segment:
                return

    def __enter__(self) -> SegmentReader[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Client:
    """A blocking connection to a millstream server: ``AsyncClient``'s methods, blocking.  Runs the
    asyncio core on an event-loop thread of its own.  ``with millstream.connect(uri) as client:``."""

    def __init__(self, uri: str, *, token: str = "", ssl_context: _ssl.SSLContext | None = None,
                 config: ClientConfig | None = None, clock: Clock | None = None, rng: RandomSource | None = None,
                 locator: SegmentLocator | None = None) -> None:
        endpoint = parse_uri(uri)  # a bad URI fails before a thread starts

        async def build() -> AsyncClient:
            return AsyncClient(uri, token=token, ssl_context=ssl_context, config=config, clock=clock, rng=rng,
                               locator=locator)

        self._runner = _LoopThread(f"millstream-client-{endpoint}")
        try:
            self._core = self._runner.run(build())
        except BaseException:
            self._runner.stop()
            raise
        self._segments = Segments(self._core.segments(), self._runner)

    @property
    def endpoint(self) -> Endpoint:
        return self._core.endpoint

    @property
    def async_client(self) -> AsyncClient:
        """The asyncio core (its methods run on ``loop``)."""
        return self._core

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop (running in its own thread)."""
        return self._runner.loop

    def run(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        """Run a coroutine of the async core on the client's loop and wait for its result; with
        ``timeout``, at most that many seconds: then the coroutine is cancelled and
        ``RequestTimeoutError`` raised."""
        return self._runner.run(coroutine, timeout)

    def segments(self) -> Segments:
        """Blocking operations on segments by name."""
        if self._core.closed:
            raise ObjectClosedError("the client is closed")
        return self._segments

    def stream_manager(self) -> StreamManager:
        """Blocking administration of scopes and streams (see ``AsyncClient.stream_manager``)."""
        if self._core.closed:
            raise ObjectClosedError("the client is closed")
        return StreamManager(self._core.stream_manager(), self._runner.run)

    def reader_group(self, group: str, streams: Iterable[str] | Mapping[str, Any] | None = None, *,
                     config: ReaderGroupConfig | None = None) -> ReaderGroup:
        """A blocking reader group, created if ``streams`` or ``config`` is given (see
        ``AsyncClient.reader_group``); ``group.reader(id)`` makes blocking readers."""
        if self._core.closed:
            raise ObjectClosedError("the client is closed")
        core = self._runner.run(self._core.reader_group(group, streams, config=config))
        return ReaderGroup(core, self._runner.run, self._runner.loop)

    @overload
    def event_writer(self, target: Sequence[str] | Router, /) -> EventStreamWriter[bytes]: ...

    @overload
    def event_writer(self, target: Sequence[str] | Router, serializer: Serializer[T], /) -> EventStreamWriter[T]: ...

    @overload
    def event_writer(self, target: str, /, *, writer_id: str) -> SequencedEventStreamWriter[bytes]: ...

    @overload
    def event_writer(self, target: str, serializer: Serializer[T], /, *, writer_id: str,
                     ) -> SequencedEventStreamWriter[T]: ...

    def event_writer(self, target: Sequence[str] | Router, serializer: Serializer[Any] | None = None, /, *,
                     writer_id: str | None = None) -> EventStreamWriter[Any] | SequencedEventStreamWriter[Any]:
        """A blocking idempotent writer (see ``AsyncClient.event_writer``).  A stream writer learns the
        stream's segments here (``StreamNotFoundError``, ``StreamSealedError``); one with a stable
        ``writer_id`` also what the stream already holds from it."""
        if writer_id is not None:
            if not isinstance(target, str):
                raise InvalidArgumentError(f"a stable writer id needs a stream (\"scope/stream\") to write to, "
                                           f"not {target!r}")
            stream, stable_id = target, writer_id

            async def build_sequenced() -> AsyncSequencedEventStreamWriter[Any]:
                sequenced: AsyncSequencedEventStreamWriter[Any] = self._core.event_writer(
                    stream, serializer or BytesSerializer(), writer_id=stable_id)
                await sequenced.ready()
                return sequenced
            return SequencedEventStreamWriter(self._runner.run(build_sequenced()).core, self._runner)

        async def build() -> AsyncEventStreamWriter[Any]:
            writer = self._core.event_writer(target, serializer or BytesSerializer())
            await writer.ready()  # the blocking per-event path cannot wait for it
            return writer
        return EventStreamWriter(self._runner.run(build()), self._runner)

    @overload
    def transactional_writer(self, stream: str, /, *, lease_seconds: float | None = ...,
                             ) -> TransactionalEventStreamWriter[bytes]: ...

    @overload
    def transactional_writer(self, stream: str, serializer: Serializer[T], /, *, lease_seconds: float | None = ...,
                             ) -> TransactionalEventStreamWriter[T]: ...

    def transactional_writer(self, stream: str, serializer: Serializer[Any] | None = None, /, *,
                             lease_seconds: float | None = None) -> TransactionalEventStreamWriter[Any]:
        """A blocking writer of stream transactions (see ``AsyncClient.transactional_writer``)."""
        async def build() -> AsyncTransactionalEventStreamWriter[Any]:
            return self._core.transactional_writer(stream, serializer or BytesSerializer(),
                                                   lease_seconds=lease_seconds)
        return TransactionalEventStreamWriter(self._runner.run(build()), self._runner.run)

    def transaction(self, stream: str, txn_id: Any, serializer: Serializer[Any] | None = None) -> Transaction[Any]:
        """Resume a transaction by id, blocking (see ``AsyncClient.transaction``)."""
        return Transaction(self._runner.run(self._core.transaction(stream, txn_id, serializer)), self._runner.run)

    def commit_transactions(self, stream: str, txns: Iterable[Any], *,
                            fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """The atomic, fenced multi-commit, blocking (see ``AsyncClient.commit_transactions``)."""
        ids = [t.txn_id if isinstance(t, Transaction) else t for t in txns]
        return self._runner.run(self._core.commit_transactions(stream, ids, fence=fence))

    def get_fence(self, stream: str, key: str) -> int | None:
        """The value recorded for a fence key (see ``AsyncClient.get_fence``)."""
        return self._runner.run(self._core.get_fence(stream, key))

    def byte_stream_reader(self, segment: str, *, offset: int = 0) -> ByteStreamReader:
        """A blocking reader of ``segment``'s raw bytes from ``offset`` on -- or of a byte stream's, for
        ``"scope/stream"`` (a stream with one segment)."""
        async def build() -> AsyncByteStreamReader:
            if segment.count("/") == 1:
                return await self._core.open_byte_stream_reader(segment, offset=offset)
            return self._core.byte_stream_reader(segment, offset=offset)
        return ByteStreamReader(self._runner.run(build()), self._runner)

    def byte_stream_writer(self, target: str) -> ByteStreamWriter:
        """A blocking writer of raw bytes at the end of byte stream ``target`` (see
        ``AsyncClient.byte_stream_writer``)."""
        async def build() -> AsyncByteStreamWriter:
            return await self._core.byte_stream_writer(target)
        return ByteStreamWriter(self._runner.run(build()), self._runner.run)

    def large_event_writer(self, target: str | Sequence[str] | Router, serializer: Serializer[Any] | None = None, /,
                           *, config: LargeEventConfig | None = None) -> LargeEventWriter[Any]:
        """A blocking writer of large events and ordinary ones (see ``AsyncClient.large_event_writer``)."""
        async def build() -> AsyncLargeEventWriter[Any]:
            return self._core.large_event_writer(target, serializer, config=config)
        return LargeEventWriter(self._runner.run(build()), self._runner.run)

    @overload
    def segment_reader(self, segment: str, *, offset: int = ...) -> SegmentReader[bytes]: ...

    @overload
    def segment_reader(self, segment: str, serializer: Serializer[T], *, offset: int = ...) -> SegmentReader[T]: ...

    def segment_reader(self, segment: str, serializer: Serializer[Any] | None = None, *,
                       offset: int = 0) -> SegmentReader[Any]:
        """A blocking reader of the events of ``segment`` from ``offset`` on."""
        async def build() -> AsyncSegmentReader[Any]:
            return self._core.segment_reader(segment, serializer, offset=offset)  # type: ignore[arg-type]
        return SegmentReader(self._runner.run(build()), self._runner)

    def close(self) -> None:
        """Close every writer (flushing it), reader and connection, then stop the loop thread.  Raises
        the first writer's error after everything is closed, if a flush failed."""
        if not self._runner.thread.is_alive():
            return
        try:
            self._runner.run(self._core.close(), timeout=None)
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({str(self._core.endpoint)!r})"


def connect(uri: str, *, token: str = "", ssl_context: _ssl.SSLContext | None = None,
            config: ClientConfig | None = None, clock: Clock | None = None, rng: RandomSource | None = None,
            locator: SegmentLocator | None = None) -> Client:
    """A blocking ``Client`` for the server at ``uri`` (``tcp://HOST:PORT`` or ``tls://HOST:PORT``).
    Nothing connects until the first operation needs the server."""
    return Client(uri, token=token, ssl_context=ssl_context, config=config, clock=clock, rng=rng, locator=locator)
