"""millstream: a durable, elastic, exactly-once stream store.

What exists so far is the segment store's container layer: ``SegmentContainer`` over a Tier-1
``DurableDataLog`` (``FileLog`` on local disk) and, optionally, Tier-2 ``ChunkStorage``
(``FileChunkStorage``), kept serving across Tier-1 failures by a ``ContainerHost``; the segment-store
server (``millstream.server``) that serves containers over TCP, and ``standalone(data_dir)``, which
runs a whole node on loopback; and the client (``millstream.client``: ``connect(uri)`` returns a
blocking ``Client``, ``AsyncClient`` is its asyncio core) with its idempotent ``EventStreamWriter``
and segment readers; streams are administered through the controller (``client.stream_manager()``:
``StreamConfig``, ``ScalingPolicy``, ``RetentionPolicy``, ``StreamCut``), which runs in the node next
to the segment store (``millstream.controller``).  Reader groups (``client.reader_group(name, streams)``:
``ReaderGroup``, its ``EventStreamReader``s, checkpoints and resets) share their state through a
segment of the store.  Stream transactions (``client.transactional_writer("scope/stream")``:
``Transaction``s with leases, committed atomically in commit order and across scaling, resumed by id
with ``client.transaction(...)``; the fenced multi-commit ``client.commit_transactions``) commit
through the controller too.  Large events, up to 1 GiB, are streamed without being held in memory
(``client.large_event_writer(stream).stream_event(key)`` returns a file-like ``EventWriter``;
readers stream them through ``EventRead.stream_event()``), and ``client.byte_stream_writer`` writes
raw bytes.  Tokens for an authenticating server come from ``issue_token``
(``millstream.auth``; from the shell, ``millstream token issue``).  Streams, readers and the Spark
pipeline build on it.  Errors live in ``millstream.errors``.
"""

from millstream import auth, client, errors
from millstream.auth import Permission, issue_token
from millstream.client import (
    AsyncByteStreamWriter,
    AsyncClient,
    AsyncEventReader,
    AsyncEventStreamReader,
    AsyncEventWriter,
    AsyncLargeEventWriter,
    AsyncReaderGroup,
    AsyncStreamManager,
    BytesSerializer,
    ByteStreamWriter,
    Checkpoint,
    Client,
    CommitOutcome,
    ControllerClient,
    EventRead,
    EventReader,
    EventStreamReader,
    EventWriter,
    JsonSerializer,
    LargeEventConfig,
    LargeEventWriter,
    Position,
    ReaderConfig,
    ReaderGroup,
    ReaderGroupConfig,
    RetentionPolicy,
    ScalingPolicy,
    SegmentWithRange,
    Serializer,
    StreamConfig,
    StreamCut,
    StreamManager,
    StringSerializer,
    Transaction,
    TransactionalEventStreamWriter,
    TransactionStatus,
    connect,
)
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.container import SegmentContainer, SegmentInfo, StorageSettings
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.segmentstore.host import ContainerHost
from millstream.segmentstore.read_index import ReadResult
from millstream.standalone import StandaloneNode, standalone

__version__ = "0.1.0"

__all__ = [
    "AsyncByteStreamWriter",
    "AsyncClient",
    "AsyncEventReader",
    "AsyncEventStreamReader",
    "AsyncEventWriter",
    "AsyncLargeEventWriter",
    "AsyncReaderGroup",
    "AsyncStreamManager",
    "ByteStreamWriter",
    "BytesSerializer",
    "Checkpoint",
    "ChunkStorage",
    "Client",
    "CommitOutcome",
    "ContainerHost",
    "ControllerClient",
    "DurableDataLog",
    "EventRead",
    "EventReader",
    "EventStreamReader",
    "EventWriter",
    "FileChunkStorage",
    "FileLog",
    "JsonSerializer",
    "LargeEventConfig",
    "LargeEventWriter",
    "Permission",
    "Position",
    "ReadResult",
    "ReaderConfig",
    "ReaderGroup",
    "ReaderGroupConfig",
    "RetentionPolicy",
    "ScalingPolicy",
    "SegmentContainer",
    "SegmentInfo",
    "SegmentWithRange",
    "Serializer",
    "StandaloneNode",
    "StorageSettings",
    "StreamConfig",
    "StreamCut",
    "StreamManager",
    "StringSerializer",
    "Transaction",
    "TransactionStatus",
    "TransactionalEventStreamWriter",
    "auth",
    "client",
    "connect",
    "errors",
    "issue_token",
    "standalone",
]

from millstream.client import SequencedEventStreamWriter

__all__ += ["SequencedEventStreamWriter"]
