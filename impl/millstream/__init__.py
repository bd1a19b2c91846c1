"""millstream: a durable, elastic, exactly-once stream store.

Applications write events to streams -- ordered per routing key, durable once acknowledged, scaling
with their load -- and read them back in reader groups, each event once, across crashes of either
side.  Where to start:

* ``connect(uri)`` returns a blocking ``Client`` (``AsyncClient`` is its asyncio core, with the same
  methods awaited).  From it: event writers (``client.event_writer(stream, serializer)``: idempotent,
  following the stream's scaling), reader groups (``client.reader_group(name, streams)``: readers,
  checkpoints, resets), stream transactions (``client.transactional_writer(stream)``), large events up
  to 1 GiB streamed without being held in memory (``client.large_event_writer(stream)``), raw byte
  streams, and administration (``client.stream_manager()``: ``StreamConfig``, ``ScalingPolicy``,
  ``RetentionPolicy``, ``StreamCut``).
* ``standalone(data_dir)`` runs a whole node -- segment store and controller -- on loopback and returns
  a ``StandaloneNode``; ``millstream standalone`` does the same from the shell.
* ``issue_token`` (``millstream.auth``) makes tokens for a server that authenticates.

Errors, by whose fault, are ``millstream.errors``; every limit, with its reason, is ``millstream.limits``.
``millstream.spark`` is the Spark source and exactly-once sink.  ``millstream.lowlevel`` holds the segment
store's building blocks (``SegmentContainer``, ``FileLog``, ``ContainerHost``, ...) for embedding or
testing the store, and ``millstream.testing`` simulated tiers, network and clock for fault tests.
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
from millstream.standalone import StandaloneNode, standalone  # (light: a node's parts load when one is built)
from millstream.values import ReadResult

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
    "Client",
    "CommitOutcome",
    "ControllerClient",
    "EventRead",
    "EventReader",
    "EventStreamReader",
    "EventWriter",
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
    "SegmentWithRange",
    "Serializer",
    "StandaloneNode",
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


#: The segment store's building blocks, top-level names until they moved to ``millstream.lowlevel``.
_MOVED_TO_LOWLEVEL = frozenset({"ChunkStorage", "ContainerHost", "DurableDataLog", "FileChunkStorage", "FileLog",
                                "SegmentContainer", "SegmentInfo", "StorageSettings"})


def __getattr__(name: str) -> object:
    """``millstream.FileLog`` and the other names that moved to ``millstream.lowlevel`` are still found
    here, with a ``DeprecationWarning`` that says where they live now."""
    if name not in _MOVED_TO_LOWLEVEL:
        raise AttributeError(f"module 'millstream' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"millstream.{name} is millstream.lowlevel.{name} now: import it from there "
                  f"(from millstream.lowlevel import {name})", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("millstream.lowlevel"), name)
