"""Tier 1: the DurableDataLog interface every write-ahead log implementation honours.

Theory of operation.  A segment container owns exactly one durable data log.  Before writing it
calls ``initialize()``, which takes exclusive ownership: it bumps the log's epoch and *fences* every
older owner, whose next write then fails with ``DataLogFencedError``.  ``read()`` returns what the
log holds (for recovery), ``append()`` adds records, ``truncate()`` discards a prefix.

The ordering contract (what the OperationProcessor relies on):

* ``append(data)`` returns at once with a future; many appends may be in flight.
* Records become durable in the order they were appended.  When the future of record *n* completes
  successfully, records *1..n* are all durable.  The futures themselves are completed in order by
  the implementations here, but callers must not rely on that: a notice may arrive late.
* A write failure is final.  The failing record's future and the futures of every record appended
  after it fail (``WriteFailedError`` -- outcome unknown -- or ``DataLogFencedError``), and the log
  closes itself.  Recovery by a new owner is the only way forward.
* ``read()`` yields only complete, intact records, in order.  A record torn by a crash at the tail is
  not returned; a damaged record followed by intact ones is corruption (``DataCorruptionError``).

Addresses.  Every record gets a ``LogAddress``; ``sequence`` numbers the records of the log from 1,
strictly increasing over the log's whole life, including across owners and truncations.  After a
crash, records that never became durable leave no trace, so their sequence numbers are reissued.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable, Iterator

import attrs

__all__ = ["DurableDataLog", "LogAddress", "LogRecord", "OnDone", "WriteSettings", "notify_done"]

#: Called with an append's future once it is done; see ``DurableDataLog.append``.
OnDone = Callable[["asyncio.Future[LogAddress]"], None]


@attrs.frozen(order=True)
class LogAddress:
    """Where a record lies.  Ordered by ``sequence``; ``locator`` is implementation-specific
    (for FileLog: the ledger number and the byte offset of the record in it)."""

    sequence: int
    locator: tuple[int, ...] = attrs.field(default=(), order=False, eq=False)


@attrs.frozen
class LogRecord:
    """One record read back from the log."""

    address: LogAddress
    data: bytes


@attrs.frozen
class WriteSettings:
    """What a log accepts: records up to ``max_write_length_bytes``."""

    max_write_length_bytes: int


class DurableDataLog(abc.ABC):
    """One container's write-ahead log.  See the module docstring for the contract."""

    @property
    @abc.abstractmethod
    def write_settings(self) -> WriteSettings:
        """The largest record this log accepts."""

    @property
    @abc.abstractmethod
    def epoch(self) -> int:
        """The ownership epoch taken by ``initialize()`` (0 before)."""

    @abc.abstractmethod
    async def initialize(self) -> int:
        """Take exclusive ownership and fence every older owner; return the new epoch.

        Raises ``DataCorruptionError`` if the log's own metadata cannot be read.  Must be called
        once, before any other method but ``close``.
        """

    @abc.abstractmethod
    def read(self) -> Iterator[LogRecord]:
        """Yield every complete, intact record from the truncation point on, in order.

        Call after ``initialize()`` and before the first ``append()``.  A torn record at the very
        end (a crash mid-write) is silently dropped -- it was never acknowledged.  A damaged record
        anywhere else raises ``DataCorruptionError`` naming where.
        """

    @abc.abstractmethod
    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        """Queue one record; the future completes with its address once it is durable.

        ``on_done(future)``, if given, is called exactly once, right after the log completes the
        future (with a result or an error) and in the same loop callback -- a loop turn sooner than a
        done-callback would run, which is one turn less of latency on every acknowledgement.  An
        exception it raises goes to the loop's exception handler; the log carries on.

        Raises ``PayloadTooLargeError`` at once if ``data`` exceeds ``write_settings``, and
        ``ObjectClosedError`` if the log is closed or has failed.  ``data`` must not be modified
        until the future is done.
        """

    @abc.abstractmethod
    async def truncate(self, upto: LogAddress) -> None:
        """Allow every record up to and including ``upto`` to be discarded.  ``read()`` never again
        returns them.  Idempotent; truncating below an earlier truncation point does nothing."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting appends, fail those still pending with ``ObjectClosedError`` unless they
        already completed, and release resources.  Idempotent."""


def notify_done(on_done: OnDone | None, future: asyncio.Future[LogAddress]) -> None:
    """Call ``on_done(future)`` for a log implementation; an exception goes to the loop's handler."""
    if on_done is None:
        return
    try:
        on_done(future)
    except Exception as error:
        with contextlib.suppress(RuntimeError):  # no running loop: nobody to report to
            asyncio.get_running_loop().call_exception_handler(
                {"message": "DurableDataLog on_done callback failed", "exception": error, "future": future})
