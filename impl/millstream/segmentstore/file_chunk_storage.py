"""FileChunkStorage: Tier-2 chunks as files in one directory tree (local disk, or a shared NFS mount).

Theory of operation
-------------------
Every chunk is one regular file; its bytes are the chunk's bytes, from offset 0, with no header.  The
file's size *is* the chunk's length, so there is no metadata to keep in step with the data.

* Blocking I/O runs on a bounded ``ThreadPoolExecutor`` (``threads``, default
  ``limits.CHUNK_STORAGE_THREADS_MAX``); the event loop only hands calls over and waits for them.  Each
  call is bounded by ``asyncio.wait_for(..., call_timeout_seconds)``: on timeout it fails with
  ``StorageUnavailableError``.  A call still queued is cancelled then; one already in a system call
  cannot be interrupted and finishes in its thread later (see the warts below).
* ``create`` opens the file with ``O_CREAT | O_EXCL`` (that is what detects ``ChunkExistsError``,
  atomically), fsyncs it and then its directory, so that the entry survives a crash.
* ``write`` opens the file, compares ``offset`` with ``fstat``'s size (``BadOffsetError`` when they
  differ, nothing written), writes the data with ``pwrite`` in pieces of at most
  ``WRITE_PIECE_LENGTH_BYTES`` and calls ``fdatasync``.  ``ENOSPC``/``EDQUOT`` from either raises
  ``StorageFullError``, any other ``OSError`` ``StorageUnavailableError``; both leave whatever prefix
  landed (``length`` says how much).  A chunk never shrinks: a byte once in it never changes, which
  is what lets a new owner adopt bytes an older owner -- perhaps still running, fenced -- wrote.
* ``concat`` opens both files first (either missing: ``ChunkNotFoundError``, nothing changed), copies
  the source to the end of the target in pieces of ``WRITE_PIECE_LENGTH_BYTES``, calls ``fdatasync``
  on the target, then unlinks the source and fsyncs its directory.  A failure while copying leaves
  the source in place and the target grown by a prefix of it, as for ``write``.
* ``delete`` unlinks and fsyncs the directory.  ``read`` and ``length`` use ``pread`` and ``stat``.
* Every call opens what it needs and closes it before returning: no file handle outlives a call, so
  ``close`` has nothing to release but the threads, and a thread abandoned by a timeout never holds a
  descriptor that ``close`` could pull from under it.  One ``open`` per call costs microseconds next
  to the ``fdatasync`` a write pays anyway.

On-disk layout
--------------
Everything lives under ``root`` (created if missing).  A chunk name is an opaque string of up to
``limits.CHUNK_NAME_LENGTH_BYTES_MAX`` UTF-8 bytes; it becomes a relative path by a reversible
escaping (``chunk_path``/``chunk_name``):

1. Take the name's UTF-8 bytes.  Bytes ``A-Z a-z 0-9 _ - .`` stand for themselves; every other byte
   is written ``%XX`` (two upper-case hex digits).  So ``"seg/a b"`` is stored as ``seg%2Fa%20b``:
   readable for the usual names, flat (a ``/`` never makes a directory), and independent of the file
   system's Unicode normalization (everything on disk is ASCII).
2. The escaped text is cut, greedily and never inside a ``%XX``, into *pieces* of at most
   ``PATH_COMPONENT_LENGTH_MAX`` characters (the usual ``NAME_MAX`` is 255 bytes; an escaped name can
   be three times the 2048-byte name limit).  A ``.`` that would begin a piece is escaped ``%2E``, so
   no piece is ``.`` or ``..`` and no file or directory we make is hidden.
3. Every piece but the last names a directory and gets the suffix ``+`` (which escaping never
   produces, so a directory and a file can never have the same name); the last piece names the file.
   A short name is thus one file directly in ``root``; a long one a file a few directories down::

       root/seg%2Fa%20b                                    the chunk "seg/a b"
       root/<240 chars>+/<240 chars>+/<the rest>           a chunk whose escaped name is ~600 chars

Long paths are walked one directory at a time with ``dir_fd`` (the whole relative path can exceed
``PATH_MAX``).  ``delete`` and ``concat`` remove directories their chunk leaves empty; a lock keeps
that from racing a ``create`` below the same directory.  ``list`` walks the tree and reports only
entries that are the exact (canonical) escaping of a name, so stray files are never mistaken for
chunks; it returns names sorted by code point (Python's ``str`` order).

Fault hooks
-----------
``faults`` (a ``FileChunkFaults``) lets a test or the crash campaign make the medium fail: its
callables run in the I/O thread with the chunk's name, ``before_write`` just before each ``pwrite``
of a write or concat and ``before_sync`` just before each ``fsync``/``fdatasync`` of a chunk file (not
of directories, and not the sync that takes back a full write).  A hook that raises ``OSError``
behaves exactly like the system call failing with it (``EIO``: ``StorageUnavailableError``;
``ENOSPC``: ``StorageFullError``); a hook that blocks makes the call time out.

Warts
-----
* A call that timed out may still complete in its thread: the bytes of a timed-out ``write`` can
  land after the caller re-read the chunk's length.  Python cannot interrupt a blocked system call.
  The caller's retry then meets ``BadOffsetError`` and re-reads the length again.
* ``close`` does not wait for calls in flight (they may be stuck in a hung mount); their threads exit
  when the system calls return.
* After ``fdatasync`` fails with ``EIO`` the kernel may have dropped the dirty pages it failed to
  write; the file still reports their length, but a crash can lose them.  That is the
  ``StorageUnavailableError`` the contract warns of: the data is of unknown durability.
* The escaping assumes a case-sensitive file system (``Ab`` and ``ab`` are different chunks).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import errno
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import attrs

from millstream import limits
from millstream.errors import (
    BadOffsetError,
    ChunkExistsError,
    ChunkNotFoundError,
    InvalidArgumentError,
    ObjectClosedError,
    StorageFullError,
    StorageUnavailableError,
)
from millstream.segmentstore.chunk_storage import ChunkStorage

__all__ = [
    "DIRECTORY_SUFFIX",
    "PATH_COMPONENT_LENGTH_MAX",
    "WRITE_PIECE_LENGTH_BYTES",
    "FileChunkFaults",
    "FileChunkStorage",
    "check_chunk_data",
    "check_chunk_name",
    "check_chunk_prefix",
    "check_chunk_range",
    "chunk_name",
    "chunk_path",
]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Longest piece of an escaped name in one path component; 255 (the usual NAME_MAX) with room to spare.
PATH_COMPONENT_LENGTH_MAX: Final = 240

#: Marks a path component as a directory holding the rest of a long name.  Escaping never produces it.
DIRECTORY_SUFFIX: Final = "+"

#: One ``pwrite`` or ``pread`` moves at most this much: a concat streams through a buffer this size,
#: and a fault hook sees a multi-MiB write as several system calls, as a torn write would cut it.
WRITE_PIECE_LENGTH_BYTES: Final = 1 * limits.MIB

_SAFE_BYTES: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_DOT: Final = ord(".")
_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


# --- Names -----------------------------------------------------------------------------------------


def check_chunk_name(name: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``name`` is a valid chunk name: a non-empty ``str`` without
    NUL whose UTF-8 encoding has at most ``limits.CHUNK_NAME_LENGTH_BYTES_MAX`` bytes."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"a chunk name is a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgumentError("a chunk name may not be empty")
    if "\0" in name:
        raise InvalidArgumentError(f"a chunk name may not contain NUL: {name!r}")
    try:
        encoded = name.encode()
    except UnicodeEncodeError as error:
        raise InvalidArgumentError(f"a chunk name must be encodable as UTF-8: {name!r}") from error
    if len(encoded) > limits.CHUNK_NAME_LENGTH_BYTES_MAX:
        raise InvalidArgumentError(
            f"a chunk name has at most {limits.CHUNK_NAME_LENGTH_BYTES_MAX} UTF-8 bytes, not {len(encoded)}")


def check_chunk_data(offset: object, data: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``offset`` is an ``int`` and ``data`` is bytes-like."""
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise InvalidArgumentError(f"an offset is an int, not {type(offset).__name__}")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"chunk data is bytes, bytearray or memoryview, not {type(data).__name__}")


def check_chunk_range(offset: object, length: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``offset`` and ``length`` are ints (their values are the
    chunk's business: ``BadOffsetError``)."""
    for value in (offset, length):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError(f"an offset or length is an int, not {type(value).__name__}")


def check_chunk_prefix(prefix: object) -> bytes:
    """Raise ``InvalidArgumentError`` unless ``prefix`` is a ``str`` encodable as UTF-8; return the encoding."""
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"a prefix is a str, not {type(prefix).__name__}")
    try:
        return prefix.encode()
    except UnicodeEncodeError as error:
        raise InvalidArgumentError(f"a prefix must be encodable as UTF-8: {prefix!r}") from error


def _token(byte: int, *, first: bool) -> str:
    if byte in _SAFE_BYTES and not (first and byte == _DOT):
        return chr(byte)
    return f"%{byte:02X}"


def chunk_path(name: str) -> tuple[str, ...]:
    """The path components, relative to the root, of the file holding chunk ``name`` (see the module
    docstring): directories ending in ``DIRECTORY_SUFFIX``, then the file."""
    pieces: list[str] = []
    piece: list[str] = []
    piece_length = 0
    for byte in name.encode():
        token = _token(byte, first=not piece)
        if piece_length + len(token) > PATH_COMPONENT_LENGTH_MAX:
            pieces.append("".join(piece))
            piece, piece_length = [], 0
            token = _token(byte, first=True)
        piece.append(token)
        piece_length += len(token)
    pieces.append("".join(piece))
    return (*(piece + DIRECTORY_SUFFIX for piece in pieces[:-1]), pieces[-1])


def chunk_name(path: tuple[str, ...]) -> str | None:
    """The chunk name whose ``chunk_path`` is ``path``, or None if ``path`` is no chunk's (a stray file,
    a non-canonical escaping)."""
    if not path or not all(component.endswith(DIRECTORY_SUFFIX) for component in path[:-1]):
        return None
    escaped = "".join(component.removesuffix(DIRECTORY_SUFFIX) for component in path[:-1]) + path[-1]
    try:
        name = urllib.parse.unquote_to_bytes(escaped).decode()
    except UnicodeDecodeError:
        return None
    if not name or "\0" in name or chunk_path(name) != path:
        return None
    return name


# --- Faults ----------------------------------------------------------------------------------------


@attrs.define
class FileChunkFaults:
    """Fault hooks, called in the I/O thread with the chunk's name (see "Fault hooks" above).  Raise
    ``OSError`` from a hook to fail the system call that follows; block in it to make the call time out."""

    before_write: Callable[[str], None] | None = None
    """Before each ``pwrite`` of a ``write`` or ``concat`` (a write moves at most
    ``WRITE_PIECE_LENGTH_BYTES`` per call, so a 3 MiB write calls it three times)."""

    before_sync: Callable[[str], None] | None = None
    """Before each ``fsync``/``fdatasync`` of a chunk file (``create``, ``write``, ``concat``)."""


# --- The storage -----------------------------------------------------------------------------------


class FileChunkStorage(ChunkStorage):
    """Chunks as files under ``root``.  See the module docstring for the layout and the guarantees."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        threads: int = limits.CHUNK_STORAGE_THREADS_MAX,
        call_timeout_seconds: float = limits.CHUNK_STORAGE_CALL_TIMEOUT_SECONDS,
        faults: FileChunkFaults | None = None,
    ) -> None:
        if not 1 <= threads <= limits.CHUNK_STORAGE_THREADS_MAX:
            raise InvalidArgumentError(f"threads must lie in [1, {limits.CHUNK_STORAGE_THREADS_MAX}], not {threads}")
        if not 0 < call_timeout_seconds <= limits.CHUNK_STORAGE_CALL_TIMEOUT_SECONDS:
            raise InvalidArgumentError(
                f"call_timeout_seconds must lie in (0, {limits.CHUNK_STORAGE_CALL_TIMEOUT_SECONDS}], "
                f"not {call_timeout_seconds}")
        self.root = os.fspath(root)
        self.faults = faults if faults is not None else FileChunkFaults()
        self._call_timeout_seconds = call_timeout_seconds
        os.makedirs(self.root, exist_ok=True)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="chunk-io")
        # Held while a create walks (and makes) the directories of a long name and creates its file, and
        # while a delete removes directories it emptied: neither may see the other half done.
        self._tree_lock = threading.Lock()
        self._closed = False

    # --- The interface -------------------------------------------------------------------------------

    async def create(self, name: str) -> None:
        self._check_open()
        check_chunk_name(name)
        await self._call(f"create {name!r}", self._create, name)

    async def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        check_chunk_name(name)
        check_chunk_data(offset, data)
        # A copy: a timed-out write may still be running in its thread when the caller reuses its buffer.
        await self._call(f"write {name!r} at {offset}", self._write, name, offset, bytes(data))

    async def read(self, name: str, offset: int, length: int) -> bytes:
        self._check_open()
        check_chunk_name(name)
        check_chunk_range(offset, length)
        return await self._call(f"read {name!r} [{offset}, +{length})", self._read, name, offset, length)

    async def length(self, name: str) -> int:
        self._check_open()
        check_chunk_name(name)
        return await self._call(f"length of {name!r}", self._length, name)

    async def concat(self, target: str, source: str) -> int:
        self._check_open()
        check_chunk_name(target)
        check_chunk_name(source)
        if target == source:
            raise InvalidArgumentError(f"cannot concat chunk {target!r} onto itself")
        return await self._call(f"concat {source!r} onto {target!r}", self._concat, target, source)

    async def delete(self, name: str) -> None:
        self._check_open()
        check_chunk_name(name)
        await self._call(f"delete {name!r}", self._delete, name)

    async def list(self, prefix: str = "") -> builtins.list[str]:
        self._check_open()
        wanted = check_chunk_prefix(prefix)
        return await self._call(f"list {prefix!r}", self._list, wanted)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Not waiting: a call stuck in a hung mount must not hang close (see the warts above).
        self._executor.shutdown(wait=False)

    # --- Plumbing (on the event loop) ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("the chunk storage is closed")

    async def _call(self, what: str, function: Callable[..., _T], *args: object) -> _T:
        """Run ``function(*args)`` on an I/O thread, bounded by the call timeout.  Typed errors pass
        through; any other ``OSError`` is ``StorageUnavailableError``."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        try:
            return await asyncio.wait_for(future, self._call_timeout_seconds)
        except TimeoutError as error:  # before OSError: TimeoutError is one
            raise StorageUnavailableError(f"{what}: no answer within {self._call_timeout_seconds} s") from error
        except OSError as error:
            raise StorageUnavailableError(f"{what}: {error}") from error

    # --- Plumbing (on an I/O thread) -----------------------------------------------------------------

    @contextlib.contextmanager
    def _tree_locked(self, needed: bool) -> Iterator[None]:
        if not needed:
            yield
            return
        if not self._tree_lock.acquire(timeout=self._call_timeout_seconds):
            raise StorageUnavailableError(f"directory lock not acquired within {self._call_timeout_seconds} s")
        try:
            yield
        finally:
            self._tree_lock.release()

    @contextlib.contextmanager
    def _directories(self, name: str, path: tuple[str, ...], *, create: bool = False) -> Iterator[builtins.list[int]]:
        """Open the root and each directory on ``path`` (making missing ones if ``create``); yield their
        descriptors, root first, so the last is the directory holding the file.  Closes them all."""
        descriptors = [os.open(self.root, _DIRECTORY_FLAGS)]
        try:
            for component in path[:-1]:
                if create:
                    try:
                        os.mkdir(component, 0o755, dir_fd=descriptors[-1])
                    except FileExistsError:
                        pass
                    except OSError as error:
                        if error.errno in _NO_ROOM:  # no chunk made yet: empty directories are not one
                            raise StorageFullError(f"create {name!r}: no room on the medium ({error})") from error
                        raise
                    else:
                        os.fsync(descriptors[-1])  # the new directory's entry, durable
                try:
                    descriptors.append(os.open(component, _DIRECTORY_FLAGS, dir_fd=descriptors[-1]))
                except FileNotFoundError as error:
                    raise ChunkNotFoundError(f"no chunk {name!r}") from error
            yield descriptors
        finally:
            for descriptor in reversed(descriptors):
                os.close(descriptor)

    @staticmethod
    def _open_file(name: str, path: tuple[str, ...], directory: int, flags: int) -> int:
        try:
            return os.open(path[-1], flags | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError as error:
            raise ChunkNotFoundError(f"no chunk {name!r}") from error

    def _sync(self, name: str, descriptor: int, *, data_only: bool = True) -> None:
        if self.faults.before_sync is not None:
            self.faults.before_sync(name)
        if data_only:
            os.fdatasync(descriptor)
        else:
            os.fsync(descriptor)

    def _write_all(self, name: str, descriptor: int, offset: int, data: bytes) -> None:
        view = memoryview(data)
        done = 0
        while done < len(view):
            if self.faults.before_write is not None:
                self.faults.before_write(name)
            written = os.pwrite(descriptor, view[done : done + WRITE_PIECE_LENGTH_BYTES], offset + done)
            if written <= 0:  # cannot happen for a regular file; never loop without progress
                raise StorageUnavailableError(f"write {name!r}: pwrite made no progress at {offset + done}")
            done += written

    @staticmethod
    def _no_room(name: str, descriptor: int, length: int, cause: OSError) -> StorageFullError:
        """After ENOSPC: the error to raise.  The file is *not* cut back to ``length``: chunks never
        shrink (see the module docstring); the prefix that landed stays, and ``length`` reports it."""
        del descriptor
        return StorageFullError(f"{name!r}: no room on the medium ({cause}); a prefix beyond {length} may have landed")

    def _prune(self, path: tuple[str, ...], descriptors: builtins.list[int]) -> None:
        """Remove the directories on ``path`` that are now empty, deepest first.  Housekeeping only:
        a failure is logged, not raised (the chunk itself is gone), and not synced (an empty directory
        that reappears after a crash holds no chunk)."""
        if len(descriptors) == 1:
            return
        with self._tree_locked(True):
            for depth in range(len(descriptors) - 1, 0, -1):
                try:
                    os.rmdir(path[depth - 1], dir_fd=descriptors[depth - 1])
                except OSError as error:
                    if error.errno not in {errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT}:
                        _log.warning("could not remove empty chunk directory %r: %s", path[depth - 1], error)
                    return

    def _create(self, name: str) -> None:
        path = chunk_path(name)
        with self._tree_locked(len(path) > 1), self._directories(name, path, create=True) as descriptors:
            try:
                descriptor = os.open(
                    path[-1], os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=descriptors[-1])
            except FileExistsError as error:
                raise ChunkExistsError(f"chunk {name!r} exists") from error
            except OSError as error:
                if error.errno in _NO_ROOM:
                    raise StorageFullError(f"create {name!r}: no room on the medium ({error})") from error
                raise
            try:
                self._sync(name, descriptor, data_only=False)
            finally:
                os.close(descriptor)
            os.fsync(descriptors[-1])

    def _write(self, name: str, offset: int, data: bytes) -> None:
        path = chunk_path(name)
        with self._directories(name, path) as descriptors:
            descriptor = self._open_file(name, path, descriptors[-1], os.O_WRONLY)
        try:
            length = os.fstat(descriptor).st_size
            if offset != length:
                raise BadOffsetError(f"write {name!r} at {offset}: the chunk's length is {length}")
            if not data:
                return
            try:
                self._write_all(name, descriptor, offset, data)
                self._sync(name, descriptor)
            except OSError as error:
                if error.errno in _NO_ROOM:
                    raise self._no_room(name, descriptor, length, error) from error
                raise
        finally:
            os.close(descriptor)

    def _read(self, name: str, offset: int, length: int) -> bytes:
        path = chunk_path(name)
        with self._directories(name, path) as descriptors:
            descriptor = self._open_file(name, path, descriptors[-1], os.O_RDONLY)
        try:
            size = os.fstat(descriptor).st_size
            if offset < 0 or length < 0 or offset + length > size:
                raise BadOffsetError(f"read {name!r} [{offset}, +{length}): the chunk's length is {size}")
            pieces: list[bytes] = []
            done = 0
            while done < length:
                piece = os.pread(descriptor, min(length - done, WRITE_PIECE_LENGTH_BYTES), offset + done)
                if not piece:
                    raise StorageUnavailableError(f"read {name!r}: the file ended at {offset + done}")
                pieces.append(piece)
                done += len(piece)
            return b"".join(pieces)
        finally:
            os.close(descriptor)

    def _length(self, name: str) -> int:
        path = chunk_path(name)
        with self._directories(name, path) as descriptors:
            try:
                return os.stat(path[-1], dir_fd=descriptors[-1], follow_symlinks=False).st_size
            except FileNotFoundError as error:
                raise ChunkNotFoundError(f"no chunk {name!r}") from error

    def _concat(self, target: str, source: str) -> int:
        target_path, source_path = chunk_path(target), chunk_path(source)
        with self._directories(target, target_path) as descriptors:
            target_descriptor = self._open_file(target, target_path, descriptors[-1], os.O_WRONLY)
        try:
            with self._directories(source, source_path) as source_descriptors:
                source_descriptor = self._open_file(source, source_path, source_descriptors[-1], os.O_RDONLY)
                try:
                    target_length = os.fstat(target_descriptor).st_size
                    source_length = os.fstat(source_descriptor).st_size
                    self._copy(target, target_descriptor, target_length, source_descriptor, source_length)
                finally:
                    os.close(source_descriptor)
                # Deleted meanwhile by someone else?  The end state is the same.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(source_path[-1], dir_fd=source_descriptors[-1])
                os.fsync(source_descriptors[-1])
                self._prune(source_path, source_descriptors)
        finally:
            os.close(target_descriptor)
        return target_length + source_length

    def _copy(self, target: str, target_descriptor: int, target_length: int, source: int, source_length: int) -> None:
        try:
            done = 0
            while done < source_length:
                piece = os.pread(source, min(source_length - done, WRITE_PIECE_LENGTH_BYTES), done)
                if not piece:
                    raise StorageUnavailableError(f"concat onto {target!r}: the source ended at {done}")
                self._write_all(target, target_descriptor, target_length + done, piece)
                done += len(piece)
            if source_length:
                self._sync(target, target_descriptor)
        except OSError as error:
            if error.errno in _NO_ROOM:
                raise self._no_room(target, target_descriptor, target_length, error) from error
            raise

    def _delete(self, name: str) -> None:
        path = chunk_path(name)
        with self._directories(name, path) as descriptors:
            try:
                os.unlink(path[-1], dir_fd=descriptors[-1])
            except FileNotFoundError as error:
                raise ChunkNotFoundError(f"no chunk {name!r}") from error
            os.fsync(descriptors[-1])
            self._prune(path, descriptors)

    def _list(self, wanted: bytes) -> builtins.list[str]:
        found: list[str] = []
        root = os.open(self.root, _DIRECTORY_FLAGS)
        try:
            self._collect(root, (), b"", wanted, found)
        finally:
            os.close(root)
        return sorted(found)

    def _collect(
        self, directory: int, above: tuple[str, ...], above_bytes: bytes, wanted: bytes, found: builtins.list[str]
    ) -> None:
        """Add the chunks below ``directory`` (reached through ``above``) whose names start with ``wanted``."""
        for entry in os.listdir(directory):
            if not entry.endswith(DIRECTORY_SUFFIX):
                name = chunk_name((*above, entry))
                if name is not None and name.encode().startswith(wanted):
                    found.append(name)
                continue
            # Pieces never split a %XX, so a directory's path decodes to a prefix of its chunks' names.
            so_far = above_bytes + urllib.parse.unquote_to_bytes(entry.removesuffix(DIRECTORY_SUFFIX))
            common = min(len(so_far), len(wanted))
            if so_far[:common] != wanted[:common]:
                continue
            try:
                below = os.open(entry, _DIRECTORY_FLAGS, dir_fd=directory)
            except FileNotFoundError:
                continue  # removed by a concurrent delete
            try:
                self._collect(below, (*above, entry), so_far, wanted, found)
            finally:
                os.close(below)
