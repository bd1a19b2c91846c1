"""millstream.lowlevel: the segment store's building blocks, for embedding the store or testing it.

Applications start from ``millstream`` itself -- ``connect(uri)`` for a client, ``standalone(data_dir)``
for a whole node.  This module holds what a node is made of, for code that assembles one by hand
(a custom Tier 1 or Tier 2, a container in a test, a benchmark of the write path), as ``trio.lowlevel``
does for trio:

* ``SegmentContainer`` (with ``SegmentInfo`` and ``StorageSettings``): one container's segments,
  operation processor, read index and Tier-2 flushing, over a Tier-1 ``DurableDataLog``;
* ``DurableDataLog``, the Tier-1 interface, and ``FileLog``, its implementation on local disk;
* ``ChunkStorage``, the Tier-2 interface, and ``FileChunkStorage``, its implementation on a file system;
* ``ContainerHost``: keeps a container serving across Tier-1 failures (restart with backoff, fencing).

Each is also importable from its own module under ``millstream.segmentstore``; these names were
``millstream``'s own before issue 22 and are still found there, with a ``DeprecationWarning`` naming
this module.
"""

from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.container import SegmentContainer, SegmentInfo, StorageSettings
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.segmentstore.file_log import FileLog
from millstream.segmentstore.host import ContainerHost

__all__ = [
    "ChunkStorage",
    "ContainerHost",
    "DurableDataLog",
    "FileChunkStorage",
    "FileLog",
    "SegmentContainer",
    "SegmentInfo",
    "StorageSettings",
]
