"""Stream transactions on the client: ``TransactionalEventStreamWriter`` and ``Transaction`` (both
flavours), their statuses, and the fenced multi-commit.

Theory of operation.  ``transactional_writer("scope/stream", serializer)`` makes a writer whose
``begin()`` asks the controller for a transaction (``create_transaction``): an id, a lease, and the
segments of the stream's current epoch, each with a hidden *transaction segment* on the same segment
store (``naming.transaction_segment_name``).  A ``Transaction`` writes with an ordinary idempotent
writer (``_writer.AsyncEventStreamWriter``) whose router sends each routing key to the transaction
segment of the segment that owns the key in the transaction's epoch (``StreamRouter`` over those
segments), so events are batched, numbered and re-sent exactly as in a normal stream writer -- and
stay invisible to readers.  ``flush`` waits until all of them are durable.

``commit`` flushes, stops the writer and asks the controller to commit (``commit_transaction``); it
returns once the commit is decided -- COMMITTING, with its place in the stream's commit order -- and
the controller merges the transaction into the stream in the background (``wait_for_completion``
waits for COMMITTED).  A reply lost with a broken connection, or with a cluster's controller that
left its node under the request (``ContainerUnavailableError``), is resolved by asking for the status
(and sending the commit again while it is still OPEN), so a commit is sent until it is decided, yet
a second ``commit`` is an error (``TransactionNotOpenError``).  ``abort`` discards: the writer stops
and the controller deletes the segments; aborting twice is harmless.

While a transaction the writer began or resumed is open, the writer's *pinger* (one tracked task
per writer, on the client's clock) renews its lease every ``ping_interval_seconds(lease)``; a
transaction whose pings stop -- its process died -- is aborted by the controller when the lease
lapses.  Closing the writer flushes what its open transactions hold and stops pinging; it does not
commit or abort them (a Spark executor writes, another process -- the driver -- commits by id:
``client.transaction("scope/stream", txn_id)`` resumes one).

``commit_transactions(stream, ids, fence=(key, value))`` is the controller's one atomic multi-commit:
all listed transactions commit and ``key -> value`` is recorded, unless the value recorded for
``key`` is not lower -- then nothing commits, the listed open transactions are aborted and the
answer is ``CommitOutcome.ALREADY_COMMITTED``.  Retrying it is always safe.

Writes after ``commit`` or ``abort`` (or to a transaction another process committed or aborted)
raise ``TransactionNotOpenError`` and store nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Generic, TypeVar, cast
from uuid import UUID

import attrs

from millstream import limits
from millstream.client._config import ClientConfig, RandomSource
from millstream.client._controller import ControllerClient, parse_transaction_id
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._routing import StreamRouter
from millstream.client._serializers import Serializer
from millstream.client._writer import OVER_BUDGET, AsyncEventStreamWriter
from millstream.clock import Clock
from millstream.errors import (
    ConnectionLostError,
    ContainerUnavailableError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
    RequestTimeoutError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.values import CommitOutcome, MultiCommitResult, TransactionInfo, TransactionStatus, split_stream_name

__all__ = [
    "AsyncTransaction",
    "AsyncTransactionalEventStreamWriter",
    "CommitOutcome",
    "MultiCommitResult",
    "Transaction",
    "TransactionInfo",
    "TransactionStatus",
    "TransactionalEventStreamWriter",
    "ping_interval_seconds",
    "transaction_id",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


#: What moves a transaction from each status, and where to (the controller's table, as clients see it).
LIFECYCLE: Mapping[TransactionStatus, Mapping[str, TransactionStatus]] = {
    TransactionStatus.OPEN: {"commit": TransactionStatus.COMMITTING, "abort": TransactionStatus.ABORTING,
                             "lease lapsed": TransactionStatus.ABORTING,
                             "fenced (already committed)": TransactionStatus.ABORTING},
    TransactionStatus.COMMITTING: {"merged": TransactionStatus.COMMITTED},
    TransactionStatus.ABORTING: {"segments deleted": TransactionStatus.ABORTED},
    TransactionStatus.COMMITTED: {},
    TransactionStatus.ABORTED: {},
}


def transaction_id(value: UUID | str | AsyncTransaction[Any] | Transaction[Any]) -> UUID:
    """A transaction's id from a ``UUID``, its hex or canonical string, or a transaction.  Raises
    ``InvalidArgumentError``."""
    if isinstance(value, (AsyncTransaction, Transaction)):
        return value.txn_id
    return parse_transaction_id(value)


def ping_interval_seconds(lease_seconds: float) -> float:
    """How often the pinger renews a lease: lease / max(sqrt(lease), ``TRANSACTION_PINGS_PER_LEASE_MIN``)
    -- Pravega's interval for leases of 9 s or more, at least three pings per lease below."""
    return lease_seconds / max(math.sqrt(lease_seconds), limits.TRANSACTION_PINGS_PER_LEASE_MIN)


class _Pinger:
    """Renews the leases of a writer's open transactions: one tracked task, on the client's clock."""

    def __init__(self, controller: ControllerClient, stream: str, clock: Clock) -> None:
        self._controller = controller
        self._scope, self._name = split_stream_name(stream)
        self._clock = clock
        self._due: dict[UUID, tuple[float, float]] = {}  # txn -> (interval, next ping at)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        #: Pings that failed for a reason worth retrying (evidence for tests and operators).
        self.failures = 0
        self.pings = 0

    def watch(self, txn_id: UUID, lease_seconds: float) -> None:
        interval = ping_interval_seconds(lease_seconds)
        self._due[txn_id] = (interval, self._clock.monotonic() + interval)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"millstream-pinger-{self._name}")
        elif self._wake is not None:
            self._wake.set()

    def forget(self, txn_id: UUID) -> None:
        self._due.pop(txn_id, None)

    @property
    def watching(self) -> frozenset[UUID]:
        return frozenset(self._due)

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while self._due:
            now = self._clock.monotonic()
            due = [t for t, (_, at) in self._due.items() if at <= now]
            for txn_id in due:
                await self._ping(txn_id)
            if not self._due:
                return
            delay = min(at for _, at in self._due.values()) - self._clock.monotonic()
            if delay > 0:
                wake.clear()
                sleeper = asyncio.ensure_future(self._clock.sleep(delay))
                woken = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    woken.cancel()
                    await asyncio.gather(sleeper, woken, return_exceptions=True)

    async def _ping(self, txn_id: UUID) -> None:
        entry = self._due.get(txn_id)
        if entry is None:
            return
        interval = entry[0]
        self._due[txn_id] = (interval, self._clock.monotonic() + interval)
        try:
            await self._controller.ping_transaction(self._scope, self._name, txn_id)
            self.pings += 1
        except (TransactionNotOpenError, TransactionNotFoundError):
            self._due.pop(txn_id, None)  # committed, aborted or lapsed: nothing left to keep alive
        except Exception:  # a lost connection or a busy controller: the next ping may get through
            self.failures += 1
            _log.warning("pinging transaction %s of %s/%s failed; will retry", txn_id, self._scope, self._name,
                         exc_info=True)

    async def close(self) -> None:
        self._due.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _discard(inner: AsyncEventStreamWriter[Any]) -> None:
    """Stop a transaction's writer without flushing (an abort drops what is not stored)."""
    inner._shared.fail(ObjectClosedError("the transaction was aborted"))
    for writer in inner.segment_writers().values():
        await writer.stop()


class AsyncTransaction(Generic[T]):
    """One stream transaction (asyncio).  Made by ``AsyncTransactionalEventStreamWriter.begin`` or
    resumed by id (``transaction``).  ``write_event``, ``flush``, ``commit``, ``abort``,
    ``check_status``, ``ping``, ``wait_for_completion``."""

    def __init__(self, writer: AsyncTransactionalEventStreamWriter[T], info: TransactionInfo) -> None:
        self._writer = writer
        self._info = info
        self._stream = info.stream
        self._scope, self._name = split_stream_name(info.stream)
        self._controller = writer.controller
        #: What this client knows: OPEN until it commits or aborts (or learns that someone else did).
        self._status = info.status
        self._inner: AsyncEventStreamWriter[T] | None = None
        if info.status is TransactionStatus.OPEN:
            self._inner = writer._make_inner_writer(info)

    @property
    def txn_id(self) -> UUID:
        return self._info.txn_id

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def info(self) -> TransactionInfo:
        """The controller's record as this object last saw it (``check_status`` refreshes the status)."""
        return self._info

    @property
    def inner_writer(self) -> AsyncEventStreamWriter[T] | None:
        """The idempotent writer of the transaction segments (None once committed or aborted here)."""
        return self._inner

    def _require_open(self) -> AsyncEventStreamWriter[T]:
        inner = self._inner
        if self._status is not TransactionStatus.OPEN:
            raise TransactionNotOpenError(f"transaction {self.txn_id} is {self._status.value}: it takes no more "
                                          "events")
        if inner is None:
            raise TransactionNotOpenError(f"transaction {self.txn_id} is being committed: it takes no more events")
        return inner

    async def _translate(self, error: BaseException) -> BaseException:
        """A transaction segment sealed or gone under the writer means the transaction is not open any
        more (committed or aborted elsewhere, or its lease lapsed): say so with its status."""
        if isinstance(error, (StreamSegmentSealedError, StreamSegmentNotExistsError)):
            try:
                status = await self.check_status()
            except MillstreamError:
                return error
            if status is not TransactionStatus.OPEN:
                return TransactionNotOpenError(f"transaction {self.txn_id} is {status.value}: its events were not "
                                               "all stored")
        return error

    async def write_event(self, event: T, *, routing_key: str | None = None) -> None:
        """Write ``event`` into the transaction, routed by ``routing_key`` as the stream writer routes it
        (in the transaction's epoch).  Buffered: errors surface here later or on ``flush``.  Raises
        ``TransactionNotOpenError`` once it was committed or aborted."""
        inner = self._require_open()
        try:
            await inner.write_event(event, routing_key=routing_key)
        except (StreamSegmentSealedError, StreamSegmentNotExistsError) as error:
            raise await self._translate(error) from None

    async def flush(self) -> None:
        """Wait until every event written so far is durable (still invisible to readers)."""
        inner = self._require_open()
        try:
            await inner.flush()
        except (StreamSegmentSealedError, StreamSegmentNotExistsError) as error:
            raise await self._translate(error) from None

    async def commit(self) -> TransactionStatus:
        """Flush, then commit: returns once the commit is decided (COMMITTING, or COMMITTED already);
        every event becomes visible atomically, in commit order, soon after (``wait_for_completion``).
        Raises ``TransactionNotOpenError`` if it was committed or aborted (here or elsewhere: a second
        commit is an error), ``StreamSealedError`` if the stream was sealed meanwhile.  After an error
        that leaves it open (the controller could not be reached), ``commit`` may be called again."""
        if self._status is not TransactionStatus.OPEN:
            raise TransactionNotOpenError(f"transaction {self.txn_id} is {self._status.value}: it cannot be "
                                          "committed again")
        inner = self._inner
        if inner is not None:
            try:
                await inner.flush()
            except (StreamSegmentSealedError, StreamSegmentNotExistsError) as error:
                raise await self._translate(error) from None
            await inner.close()
            self._inner = None  # every event is stored: no more writes, whatever the controller answers
        status = await self._commit_resolving_lost_replies()
        self._closed_here(status)
        return status

    async def _commit_resolving_lost_replies(self) -> TransactionStatus:
        for _ in range(limits.TRANSACTION_COMMIT_ATTEMPTS_MAX):
            try:
                return await self._controller.commit_transaction(self._scope, self._name, self.txn_id)
            except (ConnectionLostError, RequestTimeoutError, ContainerUnavailableError):
                # (outcome unknown: the reply was lost, or the cluster's controller left its node under the
                # request; committing again would be refused if it was decided, so ask)
                info = await self._controller.get_transaction(self._scope, self._name, self.txn_id)
                if info.status in (TransactionStatus.COMMITTING, TransactionStatus.COMMITTED):
                    return info.status  # the lost request was decided
                if info.status is not TransactionStatus.OPEN:
                    self._closed_here(info.status)
                    raise TransactionNotOpenError(f"transaction {self.txn_id} is {info.status.value}") from None
            except TransactionNotOpenError:
                self._closed_here(await self.check_status())
                raise
        raise ConnectionLostError(f"the commit of transaction {self.txn_id} could not reach the controller "
                                  f"{limits.TRANSACTION_COMMIT_ATTEMPTS_MAX} times; it is still open")

    async def abort(self) -> TransactionStatus:
        """Discard the transaction: its writer stops (unflushed events are dropped) and the controller
        deletes its segments.  Aborting an aborted transaction is harmless.  Raises
        ``TransactionNotOpenError`` if it is committing or committed."""
        if self._status in (TransactionStatus.COMMITTING, TransactionStatus.COMMITTED):
            raise TransactionNotOpenError(f"transaction {self.txn_id} is {self._status.value}: it cannot be aborted")
        inner, self._inner = self._inner, None
        if inner is not None:
            await _discard(inner)
        try:
            status = await self._controller.abort_transaction(self._scope, self._name, self.txn_id)
        except TransactionNotOpenError:
            self._closed_here(await self.check_status())
            raise
        self._closed_here(status)
        return status

    def _closed_here(self, status: TransactionStatus) -> None:
        self._status = status
        self._info = attrs.evolve(self._info, status=status)
        if status is not TransactionStatus.OPEN:
            self._writer._pinger.forget(self.txn_id)

    async def check_status(self) -> TransactionStatus:
        """The controller's status of the transaction now."""
        info = await self._controller.get_transaction(self._scope, self._name, self.txn_id)
        self._info = info
        if info.status is not TransactionStatus.OPEN and self._status is TransactionStatus.OPEN:
            self._status = info.status
            self._writer._pinger.forget(self.txn_id)
        return info.status

    async def ping(self) -> float:
        """Renew the lease now (the writer's pinger does it on its own); returns the new deadline on the
        controller's clock.  Raises ``LeaseExpiredError`` once the lease lapsed."""
        return await self._controller.ping_transaction(self._scope, self._name, self.txn_id)

    async def wait_for_completion(self, timeout_seconds: float = limits.TRANSACTION_COMPLETION_WAIT_SECONDS,
                                  ) -> TransactionStatus:
        """Wait until the transaction is COMMITTED or ABORTED (asking with a short delay for
        ``limits.TRANSACTION_STATUS_POLL_STEADY_SECONDS``, then a doubling, bounded one); returns that
        status.  Raises ``RequestTimeoutError`` after ``timeout_seconds``."""
        clock = self._writer.clock
        began = clock.monotonic()
        deadline = began + timeout_seconds
        delay = limits.TRANSACTION_STATUS_POLL_INITIAL_SECONDS
        while True:
            status = await self.check_status()
            if status.finished:
                return status
            if clock.monotonic() >= deadline:
                raise RequestTimeoutError(f"transaction {self.txn_id} is still {status.value} after "
                                          f"{timeout_seconds} s")
            await clock.sleep(min(delay, max(0.0, deadline - clock.monotonic())))
            if clock.monotonic() - began >= limits.TRANSACTION_STATUS_POLL_STEADY_SECONDS:
                delay = min(delay * 2, limits.TRANSACTION_STATUS_POLL_SECONDS_MAX)

    async def _close(self) -> None:
        """The writer closes: flush what is open (the transaction stays open for whoever commits it)."""
        inner = self._inner
        if inner is not None and self._status is TransactionStatus.OPEN:
            self._inner = None
            await inner.close()

    def __repr__(self) -> str:
        return f"AsyncTransaction({self._stream!r}, {self.txn_id}, {self._status.value})"


class AsyncTransactionalEventStreamWriter(Generic[T]):
    """Begins and resumes transactions on one stream (asyncio).  Made by
    ``AsyncClient.transactional_writer("scope/stream", serializer)``; ``lease_seconds`` is each
    transaction's lease (default ``limits.TRANSACTION_LEASE_DEFAULT_SECONDS``)."""

    def __init__(self, stream: str, serializer: Serializer[T], *, controller: ControllerClient,
                 pool: ConnectionPool, locator: SegmentLocator, token: str, config: ClientConfig, rng: RandomSource,
                 clock: Clock, lease_seconds: float | None = None) -> None:
        self._scope, self._name = split_stream_name(stream)
        self._stream = stream
        if lease_seconds is not None and (isinstance(lease_seconds, bool)
                                          or not isinstance(lease_seconds, (int, float))):
            raise InvalidArgumentError(f"lease_seconds is a number, not {lease_seconds!r}")
        self._lease = lease_seconds
        self._serializer = serializer
        self.controller = controller
        self._pool = pool
        self._locator = locator
        self._token = token
        self._config = config
        self._rng = rng
        self.clock = clock
        self._pinger = _Pinger(controller, stream, clock)
        self._transactions: weakref.WeakValueDictionary[UUID, AsyncTransaction[T]] = weakref.WeakValueDictionary()
        self._closed = False

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def pinger(self) -> _Pinger:
        """The lease renewals (for tests and diagnostics: ``watching``, ``pings``, ``failures``)."""
        return self._pinger

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("the transactional writer is closed")

    def _make_inner_writer(self, info: TransactionInfo) -> AsyncEventStreamWriter[T]:
        return AsyncEventStreamWriter(pool=self._pool, locator=self._locator,
                                      router=StreamRouter(info.transaction_segments), serializer=self._serializer,
                                      token=self._token, config=self._config, rng=self._rng)

    async def begin(self) -> AsyncTransaction[T]:
        """Open a transaction on the stream's current epoch.  Raises ``LeaseTooLargeError``,
        ``StreamSealedError``, ``StreamNotFoundError``."""
        self._check_open()
        info = await self.controller.create_transaction(self._scope, self._name, self._lease)
        return self._adopt(info)

    async def transaction(self, txn_id: UUID | str) -> AsyncTransaction[T]:
        """Resume transaction ``txn_id`` of this stream (begun by any process): write more, commit or
        abort it.  Raises ``TransactionNotFoundError``."""
        self._check_open()
        identifier = transaction_id(txn_id)
        existing = self._transactions.get(identifier)
        if existing is not None:
            return existing
        info = await self.controller.get_transaction(self._scope, self._name, identifier)
        return self._adopt(info)

    def _adopt(self, info: TransactionInfo) -> AsyncTransaction[T]:
        txn: AsyncTransaction[T] = AsyncTransaction(self, info)
        self._transactions[info.txn_id] = txn
        if info.status is TransactionStatus.OPEN:
            self._pinger.watch(info.txn_id, info.lease_seconds)
        return txn

    async def commit_transactions(self, txns: Iterable[UUID | str | AsyncTransaction[Any]], *,
                                  fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """``AsyncClient.commit_transactions`` on this writer's stream."""
        ids = [transaction_id(t) for t in txns]
        result = await self.controller.commit_transactions(self._scope, self._name, ids, fence=fence)
        for identifier in ids:  # what this writer holds learns the outcome
            found = self._transactions.get(identifier)
            if found is not None and found._status is TransactionStatus.OPEN:
                await found.check_status()
        return result

    async def close(self) -> None:
        """Flush the open transactions' events and stop pinging (they stay open: commit them, or their
        leases lapse)."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for txn in list(self._transactions.values()):
            try:
                await txn._close()
            except Exception as error:  # every transaction is closed before anything is raised
                errors.append(error)
        await self._pinger.close()
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncTransactionalEventStreamWriter[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncTransactionalEventStreamWriter({self._stream!r})"


# --- The blocking flavour ----------------------------------------------------------------------------

_Run = Callable[[Coroutine[Any, Any, Any]], Any]


class Transaction(Generic[T]):
    """A stream transaction, blocking (see ``AsyncTransaction``).  ``write_event`` runs the writer's
    per-event path on the caller's thread, as ``EventStreamWriter`` does."""

    def __init__(self, core: AsyncTransaction[T], run: _Run) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncTransaction[T]:
        return self._core

    @property
    def txn_id(self) -> UUID:
        return self._core.txn_id

    @property
    def stream(self) -> str:
        return self._core.stream

    @property
    def info(self) -> TransactionInfo:
        return self._core.info

    def write_event(self, event: T, *, routing_key: str | None = None) -> None:
        inner = self._core._require_open()
        try:
            if inner._add(event, routing_key, None) & OVER_BUDGET:
                self._run(inner._shared.wait_for_capacity())
        except (StreamSegmentSealedError, StreamSegmentNotExistsError) as error:
            raise cast(BaseException, self._run(self._core._translate(error))) from None

    def flush(self) -> None:
        self._run(self._core.flush())

    def commit(self) -> TransactionStatus:
        return cast(TransactionStatus, self._run(self._core.commit()))

    def abort(self) -> TransactionStatus:
        return cast(TransactionStatus, self._run(self._core.abort()))

    def check_status(self) -> TransactionStatus:
        return cast(TransactionStatus, self._run(self._core.check_status()))

    def ping(self) -> float:
        return cast(float, self._run(self._core.ping()))

    def wait_for_completion(self, timeout_seconds: float = limits.TRANSACTION_COMPLETION_WAIT_SECONDS,
                            ) -> TransactionStatus:
        return cast(TransactionStatus, self._run(self._core.wait_for_completion(timeout_seconds)))

    def __repr__(self) -> str:
        return repr(self._core).replace("AsyncTransaction", "Transaction", 1)


class TransactionalEventStreamWriter(Generic[T]):
    """Begins and resumes transactions on one stream, blocking (see
    ``AsyncTransactionalEventStreamWriter``)."""

    def __init__(self, core: AsyncTransactionalEventStreamWriter[T], run: _Run) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncTransactionalEventStreamWriter[T]:
        return self._core

    @property
    def stream(self) -> str:
        return self._core.stream

    def begin(self) -> Transaction[T]:
        return Transaction(self._run(self._core.begin()), self._run)

    def transaction(self, txn_id: UUID | str) -> Transaction[T]:
        return Transaction(self._run(self._core.transaction(txn_id)), self._run)

    def commit_transactions(self, txns: Iterable[UUID | str | AsyncTransaction[Any] | Transaction[Any]], *,
                            fence: tuple[str, int] | None = None) -> MultiCommitResult:
        ids = [transaction_id(t) for t in txns]
        return cast(MultiCommitResult, self._run(self._core.commit_transactions(ids, fence=fence)))

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> TransactionalEventStreamWriter[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TransactionalEventStreamWriter({self.stream!r})"
