"""Tier 2: the ChunkStorage interface -- long-term storage as named, append-only chunks.

Theory of operation.  A segment's bytes that left Tier 1 live in *chunks*: named byte sequences that
only grow at their end.  Which chunks make up a segment, and how many bytes of each count, is the
container's own metadata (recorded through the durable log, so that it is fenced with the log): a
chunk may hold more bytes than that metadata counts -- a write whose metadata update never
committed, or a fenced owner's late write -- and nobody reads them.  That is why a chunk storage
needs no fencing of its own: a new owner never writes into a chunk an older owner created, it starts
a new one (chunk names carry the owner's epoch).

The contract:

* ``create(name)`` makes an empty chunk; durable (its directory entry survives a crash) on return.
* ``write(name, offset, data)`` appends: ``offset`` must equal the chunk's current length.  On return
  the bytes are durable.  If it fails with ``StorageUnavailableError`` or ``StorageFullError`` a
  prefix of ``data`` may have landed; ``length(name)`` says how much.
* A chunk never shrinks and its bytes never change (no call cuts a chunk back, not even to undo a
  failed write): a new owner may therefore adopt bytes an older owner wrote, even while that fenced
  owner still runs.
* ``read(name, offset, length)`` returns exactly ``length`` bytes from ``offset``; a range beyond the
  chunk's length is ``BadOffsetError``.
* ``concat(target, source)`` appends ``source``'s bytes to ``target`` and deletes ``source``; durable
  on return.  (Merging segments does not use it -- a merge relinks chunk lists in metadata -- but
  compaction of many small chunks does.)
* ``delete(name)`` removes a chunk; ``list(prefix)`` names the chunks that exist with that prefix.
* ``ChunkNotFoundError`` for a missing chunk, ``ChunkExistsError`` for ``create`` of an existing one,
  ``StorageFullError`` when there is no room, ``StorageUnavailableError`` for any other failure of
  the medium.  Every call has a bounded duration (implementations time out).

Chunk names are opaque strings of up to ``limits.CHUNK_NAME_LENGTH_BYTES_MAX`` UTF-8 bytes;
implementations map them to their medium (a file system escapes them).
"""

from __future__ import annotations

import abc
import builtins

__all__ = ["ChunkStorage"]


class ChunkStorage(abc.ABC):
    """Named, append-only chunks on long-term storage.  See the module docstring for the contract."""

    @abc.abstractmethod
    async def create(self, name: str) -> None:
        """Create an empty chunk.  Raises ``ChunkExistsError``, ``StorageFullError``,
        ``StorageUnavailableError``, ``InvalidArgumentError`` (a bad name)."""

    @abc.abstractmethod
    async def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` at ``offset`` (= the current length), durably.  Raises
        ``ChunkNotFoundError``, ``BadOffsetError`` (offset is not the length; nothing written),
        ``StorageFullError`` or ``StorageUnavailableError`` (a prefix may be written)."""

    @abc.abstractmethod
    async def read(self, name: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``.  Raises ``ChunkNotFoundError``, ``BadOffsetError``
        (the range is not within the chunk), ``StorageUnavailableError``."""

    @abc.abstractmethod
    async def length(self, name: str) -> int:
        """The chunk's current length.  Raises ``ChunkNotFoundError``, ``StorageUnavailableError``."""

    @abc.abstractmethod
    async def concat(self, target: str, source: str) -> int:
        """Append all of ``source`` to ``target`` and delete ``source``; return ``target``'s new length.
        Raises ``ChunkNotFoundError`` (either missing; nothing changed), ``StorageFullError``,
        ``StorageUnavailableError`` (``target`` may have grown by a prefix of ``source``; ``source``
        is then still there)."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Remove the chunk.  Raises ``ChunkNotFoundError``, ``StorageUnavailableError``."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> builtins.list[str]:
        """Names of the existing chunks that start with ``prefix``, sorted.  Raises
        ``StorageUnavailableError``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources (threads, file handles).  Idempotent; later calls raise ``ObjectClosedError``."""
