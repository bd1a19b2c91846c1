"""``AsyncClient``: the asyncio entry point to a millstream server.

Theory of operation.  A client holds one ``ConnectionPool`` (connections per server), a
``SegmentLocator`` (which server holds a segment; a fixed one for a client built from one URI) and the
writers and readers it made, so that closing the client closes them: writers flush first.  Nothing
connects until the first operation needs a server.  The blocking ``Client`` runs this same object on
an event loop of its own (``_blocking``).  Later layers add their entry points here (stream manager,
reader groups, stream-aware writers) so a program needs one client.
"""

from __future__ import annotations

import ssl as _ssl
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

from millstream import limits
from millstream.client._byte_stream import AsyncByteStreamWriter, byte_stream_segment
from millstream.client._config import ClientConfig, Endpoint, RandomSource, SystemRandomSource, parse_uri
from millstream.client._controller import ControllerClient, ControllerSegmentLocator, SeedLocator
from millstream.client._large_events import AsyncLargeEventWriter, LargeEventConfig
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._reader_group import AsyncReaderGroup
from millstream.client._readers import AsyncByteStreamReader, AsyncSegmentReader
from millstream.client._routing import KeySpaceRouter, Router
from millstream.client._segments import AsyncSegments
from millstream.client._sequenced_writer import AsyncSequencedEventStreamWriter
from millstream.client._serializers import BytesSerializer, Serializer
from millstream.client._stream_writer import ControllerStreamBinding, sequenced_stream_writer, stream_event_writer
from millstream.client._streams import AsyncStreamManager, ReaderGroupConfig, split_stream_name
from millstream.client._transactions import (
    AsyncTransaction,
    AsyncTransactionalEventStreamWriter,
    MultiCommitResult,
    transaction_id,
)
from millstream.client._writer import AsyncEventStreamWriter
from millstream.clock import Clock, SystemClock
from millstream.errors import InvalidArgumentError, ObjectClosedError, TransientSegmentError
from millstream.naming import is_hidden_segment

__all__ = ["AsyncClient", "parse_seeds"]

T = TypeVar("T")


class AsyncClient:
    """A connection to a millstream server for asyncio programs.

    ``async with AsyncClient("tcp://127.0.0.1:9090") as client:`` -- ``uri`` is ``tcp://HOST:PORT`` or
    ``tls://HOST:PORT``, or for a cluster several nodes' URIs separated by commas (seeds:
    ``"tcp://10.0.0.1:9090,tcp://10.0.0.2:9090"``; any of them leads to the controller, and segments
    are found where the controller says); ``token`` is passed with every request (empty: none);
    ``ssl_context`` makes the connection TLS (the default context verifies the server if the URI says
    ``tls://``).  ``config``, ``clock`` and ``rng`` are for tests (see ``ClientConfig``); ``locator`` is
    for the stream layer."""

    def __init__(self, uri: str, *, token: str = "", ssl_context: _ssl.SSLContext | None = None,
                 config: ClientConfig | None = None, clock: Clock | None = None, rng: RandomSource | None = None,
                 locator: SegmentLocator | None = None) -> None:
        seeds = parse_seeds(uri)
        self._endpoint = seeds[0]
        if not isinstance(token, str):
            raise InvalidArgumentError(f"token is a str (empty for none), not {type(token).__name__}")
        if ssl_context is not None and not isinstance(ssl_context, _ssl.SSLContext):
            raise InvalidArgumentError(f"ssl_context is an ssl.SSLContext, not {type(ssl_context).__name__}")
        if config is not None and not isinstance(config, ClientConfig):
            raise InvalidArgumentError(f"config is a ClientConfig, not {type(config).__name__}")
        self._token = token
        self._config = config or ClientConfig()
        self._clock = clock or SystemClock()
        self._rng = rng or SystemRandomSource()
        self._pool = ConnectionPool(clock=self._clock, config=self._config, rng=self._rng, ssl_context=ssl_context)
        # The controller shares the segment store's connection (the server it is pointed at hosts both;
        # in a cluster, the node the seeds say runs it).
        self._controller = ControllerClient(pool=self._pool, endpoint=self._endpoint, token=token, seeds=seeds)
        self._stream_manager = AsyncStreamManager(self._controller)
        # Where a stream's segments are served, as the controller says (cached; shared by writers).
        self._controller_locator = ControllerSegmentLocator(self._controller)
        # One server holds every segment; in a cluster the controller says which holds one.
        self._locator = locator or SeedLocator(self._endpoint, self._controller, self._controller_locator)
        self._segments = AsyncSegments(pool=self._pool, locator=self._locator, token=token, rng=self._rng)
        self._writers: weakref.WeakSet[AsyncEventStreamWriter[Any]] = weakref.WeakSet()
        self._readers: weakref.WeakSet[AsyncSegmentReader[Any] | AsyncByteStreamReader] = weakref.WeakSet()
        self._reader_groups: weakref.WeakSet[AsyncReaderGroup] = weakref.WeakSet()
        self._transactional_writers: weakref.WeakSet[AsyncTransactionalEventStreamWriter[Any]] = weakref.WeakSet()
        self._large_writers: weakref.WeakSet[AsyncLargeEventWriter[Any]] = weakref.WeakSet()
        self._byte_writers: weakref.WeakSet[AsyncByteStreamWriter] = weakref.WeakSet()
        self._closed = False

    @property
    def endpoint(self) -> Endpoint:
        """The server this client was pointed at."""
        return self._endpoint

    @property
    def config(self) -> ClientConfig:
        return self._config

    @property
    def pool(self) -> ConnectionPool:
        """The client's connections (for diagnostics and tests)."""
        return self._pool

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("the client is closed")

    def segments(self) -> AsyncSegments:
        """Operations on segments by name: create, info, seal, truncate, delete, merge, attributes,
        reads and conditional appends."""
        self._check_open()
        return self._segments

    def controller(self) -> ControllerClient:
        """The controller's methods, one by one (streams, epochs, successors, stream cuts, reader-group
        registry): what the stream-aware writer and reader groups build on."""
        self._check_open()
        return self._controller

    def stream_manager(self) -> AsyncStreamManager:
        """Administration of scopes and streams: create, describe, scale, seal, truncate, delete."""
        self._check_open()
        return self._stream_manager

    @overload
    def event_writer(self, target: Sequence[str] | Router, /) -> AsyncEventStreamWriter[bytes]: ...

    @overload
    def event_writer(self, target: Sequence[str] | Router, serializer: Serializer[T], /) -> AsyncEventStreamWriter[T]:
        ...

    @overload
    def event_writer(self, target: str, /, *, writer_id: str) -> AsyncSequencedEventStreamWriter[bytes]: ...

    @overload
    def event_writer(self, target: str, serializer: Serializer[T], /, *, writer_id: str,
                     ) -> AsyncSequencedEventStreamWriter[T]: ...

    def event_writer(self, target: Sequence[str] | Router, serializer: Serializer[Any] | None = None, /, *,
                     writer_id: str | None = None,
                     ) -> AsyncEventStreamWriter[Any] | AsyncSequencedEventStreamWriter[Any]:
        """An idempotent writer.  ``target``: a stream, ``"scope/stream"`` (routing keys pick segments of
        its current epoch by their position in [0, 1), and the writer follows the stream as it scales;
        it asks the controller for the segments on its first call, see ``_stream_writer``), a list of
        segment names (routing keys split the key space evenly among them) or a ``Router`` that picks
        each event's segment.  ``serializer`` turns events into bytes (default: events are bytes).
        Call it on the client's event loop.

        With ``writer_id`` (a stable name, e.g. ``"ingest-7"``; streams only): a writer that resumes
        exactly once after its process restarts -- each event carries the application's increasing
        sequence, and events the stream already holds are dropped (``_sequenced_writer``)."""
        self._check_open()
        if writer_id is not None:
            if not isinstance(target, str):
                raise InvalidArgumentError("a stable writer id needs a stream (\"scope/stream\") to write to, "
                                           f"not {target!r}")
            core = sequenced_stream_writer(target, serializer or BytesSerializer(), writer_id=writer_id,
                                           pool=self._pool, controller=self._controller, token=self._token,
                                           config=self._config, rng=self._rng)
            self._writers.add(core)
            return AsyncSequencedEventStreamWriter(core)
        if isinstance(target, str):
            stream_writer: AsyncEventStreamWriter[Any] = stream_event_writer(
                target, serializer or BytesSerializer(), pool=self._pool, controller=self._controller,
                token=self._token, config=self._config, rng=self._rng)
            self._writers.add(stream_writer)
            return stream_writer
        router = _router_of(target)
        writer: AsyncEventStreamWriter[Any] = AsyncEventStreamWriter(
            pool=self._pool, locator=self._locator, router=router, serializer=serializer or BytesSerializer(),
            token=self._token, config=self._config, rng=self._rng)
        self._writers.add(writer)
        return writer

    @overload
    def transactional_writer(self, stream: str, /, *, lease_seconds: float | None = ...,
                             ) -> AsyncTransactionalEventStreamWriter[bytes]: ...

    @overload
    def transactional_writer(self, stream: str, serializer: Serializer[T], /, *, lease_seconds: float | None = ...,
                             ) -> AsyncTransactionalEventStreamWriter[T]: ...

    def transactional_writer(self, stream: str, serializer: Serializer[Any] | None = None, /, *,
                             lease_seconds: float | None = None) -> AsyncTransactionalEventStreamWriter[Any]:
        """A writer of stream transactions on ``stream`` (``"scope/stream"``): ``begin()`` opens one
        (with a lease of ``lease_seconds``, default ``limits.TRANSACTION_LEASE_DEFAULT_SECONDS``, renewed
        while it is open), ``transaction(id)`` resumes one (see ``_transactions``)."""
        self._check_open()
        split_stream_name(stream)
        writer: AsyncTransactionalEventStreamWriter[Any] = AsyncTransactionalEventStreamWriter(
            stream, serializer or BytesSerializer(), controller=self._controller, pool=self._pool,
            locator=ControllerSegmentLocator(self._controller), token=self._token, config=self._config,
            rng=self._rng, clock=self._clock, lease_seconds=lease_seconds)
        self._transactional_writers.add(writer)
        return writer

    async def transaction(self, stream: str, txn_id: Any, serializer: Serializer[Any] | None = None,
                          ) -> AsyncTransaction[Any]:
        """Resume transaction ``txn_id`` (a UUID or its string) of ``stream``, begun by any process --
        e.g. a Spark driver committing what its executors wrote.  Raises ``TransactionNotFoundError``."""
        return await self.transactional_writer(stream, serializer or BytesSerializer()).transaction(txn_id)

    async def commit_transactions(self, stream: str, txns: Iterable[Any], *,
                                  fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """Commit the transactions ``txns`` (ids or transactions) of ``stream`` in one atomic step and,
        with ``fence=(key, value)``, record ``key -> value`` -- only if the value recorded for ``key`` is
        lower (or none is); otherwise commit nothing, abort the listed open transactions and answer
        ``CommitOutcome.ALREADY_COMMITTED``.  Safe to retry.  Raises ``FenceValueError``,
        ``TransactionNotFoundError``, ``TransactionNotOpenError`` (nothing changed)."""
        self._check_open()
        scope, name = split_stream_name(stream)
        return await self._controller.commit_transactions(scope, name, [transaction_id(t) for t in txns],
                                                          fence=fence)

    async def get_fence(self, stream: str, key: str) -> int | None:
        """The value a fenced ``commit_transactions`` recorded for ``key`` on ``stream`` (None: none)."""
        self._check_open()
        scope, name = split_stream_name(stream)
        return await self._controller.get_fence(scope, name, key)

    def large_event_writer(self, target: str | Sequence[str] | Router, serializer: Serializer[Any] | None = None, /,
                           *, config: LargeEventConfig | None = None) -> AsyncLargeEventWriter[Any]:
        """A writer of large events (up to 1 GiB, streamed: ``stream_event(routing_key)`` returns a
        file-like ``EventWriter``) and of ordinary ones (``write_event``, through ``serializer``), in one
        order per routing key.  ``target`` as for ``event_writer``; ``config`` shrinks its sizes (tests).
        See ``_large_events``.  Call it on the client's event loop."""
        self._check_open()
        if isinstance(target, str):
            split_stream_name(target)
            locator: SegmentLocator = ControllerSegmentLocator(self._controller)
            segments = AsyncSegments(pool=self._pool, locator=locator, token=self._token, rng=self._rng)
            ordinary = self.event_writer(target)
            writer: AsyncLargeEventWriter[Any] = AsyncLargeEventWriter(
                ordinary=ordinary, serializer=serializer or BytesSerializer(),
                binding=ControllerStreamBinding(target, controller=self._controller, segments=segments),
                router=None, pool=self._pool, locator=locator, segments=segments, token=self._token,
                config=self._config, rng=self._rng, large_config=config)
        else:
            if isinstance(target, Sequence):
                hidden = [name for name in target if isinstance(name, str) and is_hidden_segment(name)]
                if hidden:
                    raise TransientSegmentError(f"a large event's target must be a stream segment, not hidden "
                                                f"segment {hidden[0]!r}")
            router = _router_of(target)
            writer = AsyncLargeEventWriter(
                ordinary=self.event_writer(router), serializer=serializer or BytesSerializer(), binding=None,
                router=router, pool=self._pool, locator=self._locator, segments=self._segments, token=self._token,
                config=self._config, rng=self._rng, large_config=config)
        self._large_writers.add(writer)
        return writer

    async def byte_stream_writer(self, target: str, *, chunk_bytes: int | None = None,
                                 unacked_bytes_max: int | None = None) -> AsyncByteStreamWriter:
        """A writer of raw bytes (no event framing) at the end of byte stream ``target``: a stream with one
        segment (``"scope/stream"``) or a segment name.  ``chunk_bytes``/``unacked_bytes_max`` shrink its
        sizes (tests).  See ``_byte_stream``."""
        self._check_open()
        options = {name: value for name, value in (("chunk_bytes", chunk_bytes),
                                                   ("unacked_bytes_max", unacked_bytes_max)) if value is not None}
        writer = await AsyncByteStreamWriter.open(target, controller=self._controller, pool=self._pool,
                                                  locator=self._locator, token=self._token, config=self._config,
                                                  rng=self._rng, **options)
        self._byte_writers.add(writer)
        return writer

    def segment_byte_writer(self, segment: str, *, base_offset: int) -> AsyncByteStreamWriter:
        """A writer of bytes the caller frames itself at the end of ``segment`` (found where the
        controller says), which holds ``base_offset`` bytes now -- e.g. a stream transaction's
        segment (a ``name`` in ``AsyncTransaction.info.transaction_segments``), created empty, that one
        task fills with whole event frames (``millstream.spark``'s sink).  The caller must be the
        segment's only writer: a byte appended meanwhile by anyone else fails the writer with
        ``BadOffsetError``.  Unlike ``byte_stream_writer`` the segment keeps holding events: write
        whole frames only."""
        self._check_open()
        if not isinstance(segment, str) or not segment:
            raise InvalidArgumentError(f"segment is a segment's name (a non-empty str), not {segment!r}")
        if not isinstance(base_offset, int) or isinstance(base_offset, bool) or base_offset < 0:
            raise InvalidArgumentError(f"base_offset is a segment length (an int >= 0), not {base_offset!r}")
        segments = AsyncSegments(pool=self._pool, locator=self._controller_locator, token=self._token, rng=self._rng)
        writer = AsyncByteStreamWriter(segment, pool=self._pool, locator=self._controller_locator, segments=segments,
                                       token=self._token, config=self._config, rng=self._rng, base_offset=base_offset)
        self._byte_writers.add(writer)
        return writer

    async def open_byte_stream_reader(self, target: str, *, offset: int = 0) -> AsyncByteStreamReader:
        """``byte_stream_reader`` of byte stream ``target``: a stream with one segment (``"scope/stream"``)
        or a segment name."""
        self._check_open()
        return self.byte_stream_reader(await byte_stream_segment(self._controller, target), offset=offset)

    def byte_stream_reader(self, segment: str, *, offset: int = 0) -> AsyncByteStreamReader:
        """A reader of ``segment``'s raw bytes from ``offset`` on."""
        self._check_open()
        reader = AsyncByteStreamReader(self._segments, segment, offset=offset)
        self._readers.add(reader)
        return reader

    @overload
    def segment_reader(self, segment: str, *, offset: int = ...) -> AsyncSegmentReader[bytes]: ...

    @overload
    def segment_reader(self, segment: str, serializer: Serializer[T], *, offset: int = ...) -> AsyncSegmentReader[T]:
        ...

    def segment_reader(self, segment: str, serializer: Serializer[Any] | None = None, *,
                       offset: int = 0) -> AsyncSegmentReader[Any]:
        """A reader of the events of ``segment`` from ``offset`` on (which must be where an event starts)."""
        self._check_open()
        reader: AsyncSegmentReader[Any] = AsyncSegmentReader(self._segments, segment,
                                                             serializer or BytesSerializer(), offset=offset)
        self._readers.add(reader)
        return reader

    async def reader_group(self, group: str, streams: Iterable[str] | Mapping[str, Any] | None = None, *,
                           config: ReaderGroupConfig | None = None) -> AsyncReaderGroup:
        """Reader group ``group`` (``"scope/group"``, or a bare name in the first stream's scope): created
        first if ``streams`` (``"scope/stream"`` names) or a ``ReaderGroupConfig`` is given and it does
        not exist yet, else opened (``ReaderGroupNotFoundError`` if missing).  Its ``reader(...)``
        makes readers (``_reader_group``, ``_event_reader``)."""
        self._check_open()
        opened = await AsyncReaderGroup.open(
            segments=self._segments, controller=self._controller, clock=self._clock, rng=self._rng,
            read_length_bytes=self._config.read_length_bytes, group=group, streams=streams, config=config)
        self._reader_groups.add(opened)
        return opened

    async def close(self) -> None:
        """Close every writer (flushing it), every reader and every connection.  Raises the first
        writer's error (after everything is closed), if a flush failed."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for transactional in list(self._transactional_writers):
            try:
                await transactional.close()
            except Exception as error:  # collected, as for the writers below
                errors.append(error)
        for large in list(self._large_writers):  # (aborts their open events, then closes their ordinary writers)
            try:
                await large.close()
            except Exception as error:  # collected, as for the writers below
                errors.append(error)
        for byte_writer in list(self._byte_writers):
            try:
                await byte_writer.close()
            except Exception as error:  # collected, as for the writers below
                errors.append(error)
        for writer in list(self._writers):
            try:
                await writer.close()
            except Exception as error:  # collected: every writer must be closed before anything is raised
                errors.append(error)
        for group in list(self._reader_groups):
            await group.close()  # its readers leave the group
        for reader in list(self._readers):
            await reader.close()
        await self._pool.close()
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({str(self._endpoint)!r})"


def parse_seeds(uri: str) -> tuple[Endpoint, ...]:
    """``"tcp://HOST:PORT"`` or several such URIs separated by commas (a cluster's seeds) -> their
    endpoints, in order, without repeats.  Raises ``InvalidArgumentError`` for a bad URI, an empty
    list or more than ``limits.CLIENT_SEEDS_MAX`` seeds."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(f"a server URI is a string like tcp://127.0.0.1:9090, not {type(uri).__name__}")
    parts = [part.strip() for part in uri.split(",")]
    if len(parts) > limits.CLIENT_SEEDS_MAX:
        raise InvalidArgumentError(f"at most {limits.CLIENT_SEEDS_MAX} seed URIs, not {len(parts)}")
    seeds = tuple(dict.fromkeys(parse_uri(part) for part in parts))
    if len({seed.tls for seed in seeds}) > 1:
        raise InvalidArgumentError(f"the seeds {uri!r} mix tcp:// and tls://: a cluster's nodes use one or the other")
    return seeds


def _router_of(target: Sequence[str] | Router) -> Router:
    if isinstance(target, Sequence):
        return KeySpaceRouter(target)
    if not callable(getattr(target, "segment_for", None)):
        raise InvalidArgumentError(f"event_writer takes a list of segment names or a Router, not {target!r}")
    return target
