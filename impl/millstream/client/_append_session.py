"""An append session's plumbing, shared by the event writer's ``SegmentWriter`` and the byte stream's
``ChunkPipeline``.

Theory of operation.  A writer id appends to one segment through *sessions*: take a pooled connection
(``for_session=True``), attach to it so that replies echoing the session's request id come here, send
``SetupAppend`` and wait for ``AppendSetup`` (which says what the segment stores for this writer id),
then send and be acknowledged until the session ends.  A session ends when a reply says so (an error
reply, or a protocol error: ``_end_session``) or when its connection is lost
(``on_connection_lost``); either way the session loop (``_run``) wakes with the reason.  A retryable
reason starts a new session after the configured backoff, within the per-outage reconnect budget
(``_config.Outage``): an outage starts at the first failure after a *useful* session -- one that got
something acknowledged, or was set up with nothing left to re-send -- so a writer that keeps
getting through never gives up however many short outages it meets, and one that does not gives
up once a single outage has lasted the budget (``_gave_up``).  Anything else ends the loop
(``_ended_for_good``: by default the writer fails).  A bug inside the loop fails the writer loudly
rather than leaving its callers waiting.

What differs between the two users stays with them: what a reply means (``_REPLY_HANDLERS``, a map
from reply type to a method), what counts as progress, which reasons are retryable, what the oldest
unacknowledged send was, and how they fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from uuid import UUID

from millstream.client._config import ClientConfig
from millstream.client._connection import Connection
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._replies import error_of_reply
from millstream.errors import MillstreamError, ProtocolError, RetryableError
from millstream.wire.commands import Command, SetupAppend

__all__ = ["AppendSession"]

_log = logging.getLogger(__name__)


class AppendSession:
    """The session protocol of ``_connection.Session`` and the reconnecting session loop, for one
    writer id on one segment (see the module docstring).  Runs on the event loop."""

    #: Reply type -> the method that handles it (replies of other types are errors or protocol errors).
    _REPLY_HANDLERS: ClassVar[Mapping[type[Command], Callable[[Any, Any], None]]] = {}
    #: What a session of this kind is called in a protocol error ("an append session").
    _SESSION_KIND: ClassVar[str] = "an append session"
    #: Reasons a session may end with after which a new session is tried.
    _RETRYABLE: ClassVar[tuple[type[BaseException], ...]] = (RetryableError,)

    def __init__(self, segment: str, *, pool: ConnectionPool, locator: SegmentLocator, token: str,
                 writer_id: UUID, config: ClientConfig) -> None:
        self.segment = segment
        self._pool = pool
        self._locator = locator
        self._token = token
        self._writer_id = writer_id
        self._config = config
        self._clock = pool.clock
        self._sent = 0  # how many of the unacknowledged sends (a prefix) went out on the current session
        self._connection: Connection | None = None
        self._request_id = 0
        self._ready = False  # AppendSetup received on the current session
        self._setup_sent_at = 0.0
        self._session_end: asyncio.Future[BaseException] | None = None
        self._useful = False  # the current session was set up with nothing to re-send (see ``_run``)
        #: Sessions started after the first (evidence for tests).
        self.reconnects = 0

    # --- What each kind of session says for itself ------------------------------------------------------

    @property
    def _label(self) -> str:
        """How log lines name this session."""
        return f"writer {self._writer_id} on {self.segment}"

    def _oldest_sent_at(self) -> float:
        """Clock time the oldest send of the current session (``_sent > 0``) went out."""
        raise NotImplementedError

    def _may_continue(self) -> bool:
        """Whether the session loop goes on (not closing, not failed)."""
        raise NotImplementedError

    def _progress(self) -> int:
        """A number that grows with every acknowledgement (how far the segment is known to store)."""
        raise NotImplementedError

    def _fail(self, error: BaseException) -> None:
        """A failure retrying cannot fix."""
        raise NotImplementedError

    def _gave_up(self, reason: BaseException, attempts: int) -> BaseException:
        """The error of giving up after ``attempts`` reconnects in one outage that lasted the reconnect
        budget; the last ended by ``reason``."""
        raise NotImplementedError

    async def _ended_for_good(self, reason: BaseException) -> None:
        """A session ended with a reason no new session can fix."""
        self._fail(reason)

    # --- Session protocol (see _connection.Session) ----------------------------------------------------

    @property
    def request_id(self) -> int:
        return self._request_id

    @property
    def writer_id(self) -> UUID:
        return self._writer_id

    def reply_deadline(self) -> float | None:
        timeout = self._config.append_ack_timeout_seconds
        if not self._ready:
            return self._setup_sent_at + timeout if self._connection is not None else None
        if self._sent:
            return self._oldest_sent_at() + timeout
        return None

    def on_reply(self, reply: Command) -> None:
        handler = self._REPLY_HANDLERS.get(type(reply))
        try:
            if handler is not None:
                was_ready = self._ready
                handler(self, reply)
                if self._ready and not was_ready and self._sent == 0:
                    self._useful = True  # set up, and nothing to re-send: this outage is over
            else:
                error = error_of_reply(reply)
                if error is None:
                    raise ProtocolError(f"the server answered {self._SESSION_KIND} with {type(reply).__name__}")
                self._end_session(error)
        except ProtocolError as error:
            _log.warning("%s: %s", self._label, error)
            connection = self._connection
            self._end_session(error)
            if connection is not None:
                connection.close(error)

    def on_connection_lost(self, error: BaseException) -> None:
        self._ready = False
        end = self._session_end
        if end is not None and not end.done():
            end.set_result(error)

    # --- Sessions --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        """Sessions, one after another, until one ends for good, the writer gives up or closes."""
        outage = self._config.outage(self._pool.rng, self._clock)
        try:
            while self._may_continue():
                progress_before = self._progress()
                self._useful = False
                end: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
                self._session_end = end
                try:
                    endpoint = await self._locator.endpoint_for(self.segment)
                    connection = await self._pool.acquire(endpoint, for_session=True)
                    self._begin_session(connection)
                    reason = await end
                except self._RETRYABLE as error:
                    reason = error
                except MillstreamError as error:
                    self._fail(error)
                    return
                finally:
                    self._leave_session()
                if not self._may_continue():
                    return
                if not isinstance(reason, self._RETRYABLE):
                    await self._ended_for_good(reason)
                    return
                # Where the segment lives may have changed whatever ended the session -- WrongHost, or a
                # lost connection (its host died, or its container moved in a cluster): ask again.  (One
                # controller request per reconnect at most, and reconnects back off.)
                self._locator.forget(self.segment)
                if self._progress() > progress_before or self._useful:
                    outage.ended()  # that session did useful work: a failure now starts a new outage
                delay = outage.failed()
                if delay is None:
                    self._fail(self._gave_up(reason, outage.failures - 1))
                    return
                _log.info("%s: session ended (%s); reconnecting in %.3f s", self._label, reason, delay)
                self.reconnects += 1
                await self._clock.sleep(delay)
        except Exception as error:  # a bug: fail loudly rather than leave flush waiting forever
            _log.exception("%s: the session loop failed", self._label)
            self._fail(error)

    def _begin_session(self, connection: Connection) -> None:
        self._connection = connection
        self._request_id = connection.take_request_id()
        self._ready = False
        self._sent = 0
        connection.attach(self)
        self._setup_sent_at = self._clock.monotonic()
        connection.send(SetupAppend(self._request_id, self._writer_id, self.segment, self._token))

    def _leave_session(self) -> None:
        connection = self._connection
        if connection is not None:
            connection.detach(self)
        self._connection = None
        self._ready = False
        self._sent = 0
        self._session_end = None

    def _end_session(self, reason: BaseException) -> None:
        """A reply ended the session (an error reply, or a protocol error): stop routing replies here."""
        self._ready = False
        connection = self._connection
        if connection is not None:
            connection.detach(self)
        end = self._session_end
        if end is not None and not end.done():
            end.set_result(reason)
