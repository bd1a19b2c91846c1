"""Connections per server, where each segment lives, and reconnecting with bounded backoff.

Theory of operation.  A ``ConnectionPool`` keeps up to ``connections_per_endpoint_max`` open
connections per server.  A writer session asks for a connection of its own while the limit allows
(``for_session=True``) and otherwise shares the least-loaded one; one-shot requests and readers share
the least-loaded one.  Callers asking at the same time share one connection attempt, so a burst of
requests to a server that is down makes one attempt, not a hundred.

Retries are for a server that was reachable and went away.  Until the pool has reached *any* server,
``acquire`` keeps trying (the attempt others share) for the initial connect budget only -- a server
may still be starting -- and then raises ``ConnectFailedError`` naming the address: a wrong address
or port fails in seconds, not after minutes of backoff.  A TLS failure (``TlsHandshakeError``) is
never retried.  Once a server was reached, ``acquire`` makes one attempt, and the callers' retry
loops (``retrying``, a writer's session loop) wait out an *outage* within the per-outage reconnect
budget (``ClientConfig.reconnect_budget_seconds``, ``_config.Outage``), then raise
``ReconnectBudgetExceededError``.  ``acquire_with_retry`` retries only *connecting*: nothing was sent
yet, so a retry cannot duplicate anything.  Whether a request that was sent may be retried is its
caller's decision (reads may; a writer re-sends through its event numbers).  Retry loops do not nest:
a call that already gave up is not retried by another loop around it.

A ``SegmentLocator`` says which server holds a segment.  The client built from one URI uses
``FixedLocator``; the stream layer supplies one that asks the controller, and is told to ``forget``
a segment after a ``WrongHost`` reply so that its next answer is fresh.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from millstream.client._config import ClientConfig, Endpoint, RandomSource
from millstream.client._connection import Connection
from millstream.clock import Clock
from millstream.errors import ConnectFailedError, ConnectionLostError, ObjectClosedError, ReconnectBudgetExceededError

__all__ = ["ConnectionPool", "FixedLocator", "SegmentLocator"]

_log = logging.getLogger(__name__)

_Result = TypeVar("_Result")


class SegmentLocator(Protocol):
    """Which server holds a segment (the controller's answer, once the stream layer supplies it)."""

    async def endpoint_for(self, segment: str) -> Endpoint:
        ...

    def forget(self, segment: str) -> None:
        """A server answered ``WrongHost`` for ``segment``, or a writer's connection to it was lost: do
        not trust the cached answer any more."""
        ...


class FixedLocator:
    """Every segment lives on one server."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def endpoint_for(self, segment: str) -> Endpoint:
        return self.endpoint

    def forget(self, segment: str) -> None:
        """Nothing is cached: the one server is the only answer."""


class _EndpointConnections:
    """The open connections to one server and the attempt (if any) to open another."""

    __slots__ = ("connections", "opening")

    def __init__(self) -> None:
        self.connections: list[Connection] = []
        self.opening: asyncio.Task[Connection] | None = None


class ConnectionPool:
    """Connections to every server a client talks to.  Runs on the client's event loop."""

    def __init__(self, *, clock: Clock, config: ClientConfig, rng: RandomSource,
                 ssl_context: _ssl.SSLContext | None = None) -> None:
        self._clock = clock
        self._config = config
        self._rng = rng
        self._ssl_context = ssl_context
        self._endpoints: dict[Endpoint, _EndpointConnections] = {}
        self._closed = False
        #: Whether any connection of this pool got as far as the server's Hello: until then a failure
        #: to connect is a wrong address (or a server still starting), not an outage.
        self.reached = False

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def config(self) -> ClientConfig:
        return self._config

    @property
    def rng(self) -> RandomSource:
        return self._rng

    def connections(self) -> list[Connection]:
        """Every open connection (for tests and diagnostics)."""
        return [c for entry in self._endpoints.values() for c in entry.connections if c.is_open]

    async def acquire(self, endpoint: Endpoint, *, for_session: bool = False) -> Connection:
        """An open connection to ``endpoint``: one connection attempt -- or, until the pool has reached
        any server, attempts for the initial connect budget.  Raises ``ConnectionLostError`` if the
        attempt fails, ``ConnectFailedError`` if no server was ever reached and the budget is spent,
        ``TlsHandshakeError`` at once if TLS fails, ``ObjectClosedError`` once the pool is closed."""
        if self._closed:
            raise ObjectClosedError("the client is closed")
        entry = self._endpoints.get(endpoint)
        if entry is None:
            entry = self._endpoints[endpoint] = _EndpointConnections()
        entry.connections = [c for c in entry.connections if c.is_open]
        if entry.connections:
            best = min(entry.connections, key=lambda c: c.load)
            room = len(entry.connections) + (entry.opening is not None) < self._config.connections_per_endpoint_max
            if not for_session or best.load == 0 or not room:
                return best
        task = entry.opening
        if task is None:
            opening = self._open(endpoint) if self.reached else self._open_first(endpoint)
            task = entry.opening = asyncio.get_running_loop().create_task(
                opening, name=f"millstream-connect-{endpoint}")
            task.add_done_callback(lambda done: self._opened(entry, done))
        # Shielded: a caller that gives up must not cancel an attempt others share.
        return await asyncio.shield(task)

    async def _open(self, endpoint: Endpoint) -> Connection:
        connection = await Connection.open(endpoint, clock=self._clock, config=self._config,
                                           ssl_context=self._ssl_context)
        self.reached = True
        return connection

    async def _open_first(self, endpoint: Endpoint) -> Connection:
        """Attempts to reach ``endpoint`` while no server was ever reached, within the initial connect
        budget; then ``ConnectFailedError``, naming the address and the last reason."""
        outage = self._config.outage(self._rng, self._clock, initial_connect=True)
        while True:
            try:
                return await self._open(endpoint)
            except ConnectionLostError as error:
                if self.reached:
                    raise  # another connection got through meanwhile: from now on, this is an outage
                delay = outage.failed()
                if delay is None:
                    raise ConnectFailedError(
                        f"{error}; gave up: no server was reached after {outage.describe()} (the initial connect "
                        f"budget, ClientConfig.initial_connect_budget_seconds, is {outage.budget_seconds:g} s): check "
                        "the address and that the server runs") from error
                _log.info("connecting to %s failed (%s); attempt %d in %.3f s", endpoint, error, outage.failures + 1,
                          delay)
                await self._clock.sleep(delay)

    def _opened(self, entry: _EndpointConnections, task: asyncio.Task[Connection]) -> None:
        if entry.opening is task:
            entry.opening = None
        if task.cancelled() or task.exception() is not None:
            return
        connection = task.result()
        if self._closed:
            connection.close(ObjectClosedError("the client is closed"))
        entry.connections.append(connection)

    async def acquire_with_retry(self, endpoint: Endpoint, *, for_session: bool = False) -> Connection:
        """``acquire``, retried with bounded, jittered exponential backoff while attempts fail with
        ``ConnectionLostError``; the last failure is raised once the attempts are used up."""
        return await self.retrying(lambda: self.acquire(endpoint, for_session=for_session),
                                   what=f"connecting to {endpoint}")

    async def retrying(self, attempt: Callable[[], Awaitable[_Result]], *,
                       retry_on: tuple[type[Exception], ...] = (ConnectionLostError,),
                       what: str | None = None) -> _Result:
        """Await ``attempt()``, and again after a failure in ``retry_on``, with the configured capped,
        jittered exponential backoff on the pool's clock, for one outage: once the failures have lasted
        the reconnect budget (``ClientConfig.reconnect_budget_seconds``; and ``reconnect_attempts_max``
        attempts, if set), ``ReconnectBudgetExceededError`` is raised (from the last failure).  A
        ``ReconnectBudgetExceededError`` from ``attempt`` itself (a loop inside it gave up) is not
        retried.  ``what``: logged (INFO) with each failure that is retried."""
        outage = self._config.outage(self._rng, self._clock)
        while True:
            try:
                return await attempt()
            except ReconnectBudgetExceededError:
                raise
            except retry_on as error:
                delay = outage.failed()
                if delay is None:
                    raise ReconnectBudgetExceededError(
                        f"{what or 'a request'}: gave up after {outage.describe()} (the reconnect budget, "
                        f"ClientConfig.reconnect_budget_seconds, is {outage.budget_seconds:g} s per outage); "
                        f"last error: {error}") from error
                if what is not None:
                    _log.info("%s failed (%s); attempt %d in %.3f s", what, error, outage.failures + 1, delay)
                await self._clock.sleep(delay)

    async def close(self) -> None:
        """Close every connection and stop every attempt; wait until they are all done."""
        self._closed = True
        entries = list(self._endpoints.values())
        attempts = [entry.opening for entry in entries if entry.opening is not None]
        for task in attempts:
            task.cancel()
        if attempts:
            await asyncio.gather(*attempts, return_exceptions=True)
        connections = [c for entry in entries for c in entry.connections]
        for connection in connections:
            connection.close(ObjectClosedError("the client is closed"))
        for connection in connections:
            await connection.wait_closed()
        self._endpoints.clear()
