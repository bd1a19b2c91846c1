"""The millstream client: connections, segment operations, the idempotent event writer, readers.

Two flavours share one implementation: ``AsyncClient`` (asyncio) and ``Client`` (blocking; it runs
the asyncio core on an event-loop thread of its own).  ``millstream.connect(uri)`` returns a ``Client``.

    import millstream

    with millstream.connect("tcp://127.0.0.1:9090") as client:
        client.segments().create("demo/events/0")
        with client.event_writer(["demo/events/0"], millstream.StringSerializer()) as w:
            w.write_event("hello", routing_key="greetings")
        for event in client.segment_reader("demo/events/0").read_events():
            print(event.offset, event.value)

Where to read on: ``_connection`` (framing, request routing, keep-alives), ``_pool`` (connections per
server, reconnect backoff), ``_writer`` (idempotent appends, batching, resends), ``_batching`` (the
block-size rule), ``_readers`` (tail reads, event decoding), ``_blocking`` (the blocking flavour),
``_streams`` (stream configurations, stream cuts, the ``StreamManager``), ``_controller`` (the
controller's RPC, ``ControllerClient``), ``_state_synchronizer`` (state shared through a segment),
``_reader_group`` (reader groups' state and handle), ``_event_reader`` (readers in groups) and
``_large_events`` (``large_event_writer``: events up to 1 GiB streamed through transient segments,
and the reader's ``EventReader`` for events too large to hold), ``_byte_stream`` (raw bytes exactly
once: ``byte_stream_writer`` and the chunk pipeline under both), ``_stream_writer``
(``event_writer("scope/stream")``: a writer that follows the stream's epochs; the
routing is ``_routing.StreamRouter``, the hand-over to successors ``_writer``) and ``_transactions``
(``transactional_writer("scope/stream")``: stream transactions with leases, resumed by id, and the
fenced multi-commit ``commit_transactions``).
"""

from millstream.client._batching import BlockSizeTracker
from millstream.client._blocking import (
    ByteStreamReader,
    Client,
    EventStreamWriter,
    SegmentReader,
    Segments,
    connect,
)
from millstream.client._byte_stream import AsyncByteStreamWriter, ByteStreamWriter
from millstream.client._client import AsyncClient
from millstream.client._config import (
    Backoff,
    ClientConfig,
    Endpoint,
    RandomSource,
    SystemRandomSource,
    parse_uri,
)
from millstream.client._controller import CONTROLLER_METHODS, ControllerClient, ControllerSegmentLocator
from millstream.client._event_reader import (
    AsyncEventStreamReader,
    EventRead,
    EventReader,
    EventStreamReader,
    Position,
    ReaderConfig,
)
from millstream.client._in_doubt import InDoubtEvent
from millstream.client._large_events import (
    AsyncEventReader,
    AsyncEventWriter,
    AsyncLargeEventWriter,
    EventWriter,
    EventWriterPhase,
    LargeEventConfig,
    LargeEventWriter,
)
from millstream.client._pool import FixedLocator, SegmentLocator
from millstream.client._reader_group import AsyncReaderGroup, Checkpoint, ReaderGroup, ReaderGroupState
from millstream.client._readers import AsyncByteStreamReader, AsyncSegmentReader, SegmentEvent
from millstream.client._routing import KeySpaceRouter, RoutedRange, Router, StreamRouter, routing_key_fraction
from millstream.client._segments import AsyncSegments, SegmentProperties
from millstream.client._serializers import BytesSerializer, JsonSerializer, Serializer, StringSerializer
from millstream.client._state_synchronizer import StateSynchronizer
from millstream.client._streams import (
    AsyncStreamManager,
    ReaderGroupConfig,
    ReaderGroupInfo,
    RetentionPolicy,
    ScalingPolicy,
    SegmentSlice,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamManager,
    StreamSegments,
    SuccessorSegment,
    canonical_json,
    split_stream_name,
)
from millstream.client._transactions import (
    AsyncTransaction,
    AsyncTransactionalEventStreamWriter,
    CommitOutcome,
    MultiCommitResult,
    Transaction,
    TransactionalEventStreamWriter,
    TransactionInfo,
    TransactionStatus,
    ping_interval_seconds,
)
from millstream.client._writer import AsyncEventStreamWriter

__all__ = [
    "AsyncByteStreamReader",
    "AsyncByteStreamWriter",
    "AsyncClient",
    "AsyncEventReader",
    "AsyncEventStreamReader",
    "AsyncEventStreamWriter",
    "AsyncEventWriter",
    "AsyncLargeEventWriter",
    "AsyncReaderGroup",
    "AsyncSegmentReader",
    "AsyncSegments",
    "AsyncStreamManager",
    "AsyncTransaction",
    "AsyncTransactionalEventStreamWriter",
    "Backoff",
    "BlockSizeTracker",
    "ByteStreamReader",
    "ByteStreamWriter",
    "BytesSerializer",
    "CONTROLLER_METHODS",
    "Checkpoint",
    "Client",
    "CommitOutcome",
    "ClientConfig",
    "ControllerClient",
    "ControllerSegmentLocator",
    "Endpoint",
    "EventRead",
    "EventReader",
    "EventStreamReader",
    "EventStreamWriter",
    "EventWriter",
    "EventWriterPhase",
    "FixedLocator",
    "InDoubtEvent",
    "JsonSerializer",
    "KeySpaceRouter",
    "LargeEventConfig",
    "LargeEventWriter",
    "MultiCommitResult",
    "Position",
    "RandomSource",
    "ReaderConfig",
    "ReaderGroup",
    "ReaderGroupConfig",
    "ReaderGroupInfo",
    "ReaderGroupState",
    "RetentionPolicy",
    "RoutedRange",
    "Router",
    "ScalingPolicy",
    "SegmentEvent",
    "SegmentLocator",
    "SegmentProperties",
    "SegmentReader",
    "SegmentSlice",
    "SegmentWithRange",
    "Segments",
    "Serializer",
    "StateSynchronizer",
    "StreamConfig",
    "StreamCut",
    "StreamDescription",
    "StreamManager",
    "StreamRouter",
    "StreamSegments",
    "StringSerializer",
    "SuccessorSegment",
    "SystemRandomSource",
    "Transaction",
    "TransactionInfo",
    "TransactionStatus",
    "TransactionalEventStreamWriter",
    "canonical_json",
    "connect",
    "parse_uri",
    "ping_interval_seconds",
    "routing_key_fraction",
    "split_stream_name",
]

# Writers with a stable writer id (exactly once across restarts of the writer's process).
from millstream.client._sequenced_writer import (
    AsyncSequencedEventStreamWriter,
    SequencedEventStreamWriter,
)

__all__ += ["AsyncSequencedEventStreamWriter", "SequencedEventStreamWriter"]
