"""``ControllerClient``: the controller's RPC, one async method per controller method, typed values back.

Theory of operation.  The controller shares the segment store's TCP connection: a call is one
``ControllerRequest(request_id, method, body)`` whose body is the method's request as canonical JSON
(``values.canonical_json``), answered by ``ControllerReply(request_id, body)`` or by an error reply
that becomes the typed error it names (``ErrorMessage`` with a code from ``wire.error_codes``;
``OperationUnsupported`` for a server without a controller or an unknown method).  With a token the
body carries it as ``"token"`` (the server checks it when it has a secret).  A reply is decoded by the
codec the server encoded it with (``values.CONTROLLER_REPLIES``); one it cannot decode is the peer's
``ProtocolError``.

Calls that change nothing, or whose repetition changes nothing more (every query, ``seal_stream``,
``truncate_stream``, ``update_subscriber_cut``, ``ping_transaction``, ``abort_transaction``, the
fenced ``commit_transactions``), are re-sent after a broken connection within the pool's per-outage
reconnect budget (``ConnectionPool.retrying``); the others (creations, deletions, scaling,
configuration updates, ``create_transaction``, ``commit_transaction``) retry only connecting: once
sent, their outcome is unknown, and ``ConnectionLostError`` says so (``Transaction.commit`` resolves
it by asking for the transaction's status).  In a cluster ``create_transaction`` is re-sent too
(``RESENT_IN_CLUSTER`` says why that is safe).

In a cluster (issue 23) the controller runs on one node and moves with its metadata container; the
client is given *seeds*, any of the cluster's nodes.  Every node answers ``locate_controller`` with
the controller node's URI, and a node without the controller answers every controller method with
``WrongHostError`` (nothing was done).  So a client given several seeds -- or one whose single server
answered ``WrongHost`` -- first asks the seeds in turn where the controller runs, and asks again
after a ``WrongHost`` reply or when the controller's node cannot be reached; any call may then be
sent again, since none was.  A call that was sent and lost its connection, or whose controller left
its node under it (``ContainerUnavailableError``), keeps the rule above (resent only if harmless, or
``create_transaction``).  The asking is bounded by the same per-outage reconnect budget.

``ControllerSegmentLocator`` is the ``SegmentLocator`` the stream layer uses: it asks the controller
where a segment is served (``get_segment_uri``), remembers the answer, and forgets it after a
``WrongHost`` reply or a lost connection (the host died, or the segment's container moved).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar
from uuid import UUID

from millstream import limits
from millstream import values as replies
from millstream.client._config import Endpoint, parse_uri
from millstream.client._pool import ConnectionPool
from millstream.client._replies import expect
from millstream.errors import (
    ConnectFailedError,
    ConnectionLostError,
    ContainerUnavailableError,
    ControllerUnreachableError,
    FenceValueError,
    InternalError,
    InvalidArgumentError,
    InvalidStreamCutError,
    LeaseTooLargeError,
    OperationUnsupportedError,
    ProtocolError,
    RequestTimeoutError,
    RetryableError,
    WrongHostError,
)
from millstream.naming import validate_scope_or_stream_name
from millstream.values import (
    CONTROLLER_REPLIES,
    MultiCommitResult,
    ReaderGroupConfig,
    ReaderGroupInfo,
    ReplyCodec,
    SegmentSlice,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamSegments,
    SuccessorSegment,
    TransactionInfo,
    TransactionStatus,
    canonical_json,
    split_stream_name,
)
from millstream.wire.commands import ControllerReply, ControllerRequest

__all__ = ["CONTROLLER_METHODS", "LOCATE_CONTROLLER", "ControllerClient", "ControllerSegmentLocator",
           "CachingSegmentLocator", "SeedLocator", "parse_transaction_id"]

T = TypeVar("T")


#: Every controller method, and whether a repeated call is harmless (so it is re-sent after a broken
#: connection).
CONTROLLER_METHODS: Final[dict[str, bool]] = {
    "create_scope": False, "delete_scope": False, "list_scopes": True,
    "create_stream": False, "update_stream": False, "get_stream": True, "list_streams": True,
    "seal_stream": True, "delete_stream": False, "get_current_segments": True, "get_successors": True,
    "scale_stream": False, "get_head_cut": True, "get_tail_cut": True, "get_cut_at": True,
    "truncate_stream": True, "get_segments_between": True, "check_stream_cut": True,
    "create_reader_group": False, "get_reader_group": True, "update_reader_group": False,
    "delete_reader_group": False, "list_reader_groups": True, "update_subscriber_cut": True,
    "get_segment_uri": True,
    "create_transaction": False, "ping_transaction": True, "commit_transaction": False,
    "abort_transaction": True, "get_transaction": True, "list_transactions": True,
    "commit_transactions": True, "get_fence": True,
}


#: Controller methods that are not harmless to repeat in general, yet are sent again in a cluster when
#: their outcome is unknown -- the controller's node died or the controller left it under the request,
#: or no reply came within the request timeout -- within the reconnect budget, as a Pravega or Kafka
#: client does.  ``create_transaction``: a transaction the lost request may have made was never
#: acknowledged, so nobody writes to it or pings it, and the controller aborts it when its lease lapses
#: (``ExpireLease``, ``controller._transaction_workflows.expire_leases``; the lease and deadline are in
#: the metadata log, so the controller's next node expires it too).  It holds a place among the
#: stream's live transactions (``limits.TRANSACTIONS_ACTIVE_PER_STREAM_MAX``) until then: at most one
#: per lost attempt.  (``commit_transaction`` is not here: committing twice is refused, so
#: ``Transaction.commit`` resolves a lost reply by asking the transaction's status;
#: ``abort_transaction`` is harmless already -- aborting an aborting transaction changes nothing.)
RESENT_IN_CLUSTER: Final = frozenset({"create_transaction"})


#: Asked of any node of a cluster: where the controller runs (``cluster._node.LOCATE_CONTROLLER``).
LOCATE_CONTROLLER: Final = "locate_controller"


def parse_transaction_id(value: UUID | str) -> UUID:
    """A transaction's id from a ``UUID`` or its hex or canonical string (``_transactions.transaction_id``
    takes a transaction too).  Raises ``InvalidArgumentError``."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise InvalidArgumentError(f"a transaction id is a UUID (or its string), not {value!r}")


def _scope(scope: str) -> str:
    return validate_scope_or_stream_name(scope, what="scope")


def _name(name: str, what: str) -> str:
    return validate_scope_or_stream_name(name, what=what)


@contextlib.contextmanager
def _decoding(method: str) -> Iterator[None]:
    """Turn a reply that does not describe what ``method`` answers into ``ProtocolError``: the
    controller's bytes are the peer's fault (DESIGN.md §9), never the caller's ``InvalidArgumentError``
    (nor a bare ``KeyError``)."""
    try:
        yield
    except (LookupError, TypeError, ValueError) as error:
        raise ProtocolError(f"the controller's reply to {method} is malformed: {type(error).__name__}: {error}") \
            from error


def _reply_object(method: str, raw: bytes) -> dict[str, Any]:
    """A controller reply's body as the JSON object it must be; ``ProtocolError`` (the peer's fault) if
    it is not one."""
    try:
        decoded = json.loads(raw)
    except ValueError as error:
        raise ProtocolError(f"the controller answered {method} with malformed JSON: {error}") from None
    if not isinstance(decoded, dict):
        raise ProtocolError(f"the controller answered {method} with {decoded!r}, not a JSON object")
    return decoded


class ControllerClient:
    """The controller's methods over the client's connections (asyncio).  Made by
    ``AsyncClient.controller()``; ``endpoint`` is the server hosting the controller."""

    def __init__(self, *, pool: ConnectionPool, endpoint: Endpoint, token: str = "",
                 seeds: tuple[Endpoint, ...] = ()) -> None:
        self._pool = pool
        self._endpoint = endpoint
        self._token = token
        #: The cluster's nodes to ask where the controller runs (see the module docstring).
        self._seeds = seeds or (endpoint,)
        #: Whether the controller is found through the seeds (a cluster), and must be looked for now.
        self._cluster = len(self._seeds) > 1
        self._stale = self._cluster

    @property
    def endpoint(self) -> Endpoint:
        """The server the controller is asked at (in a cluster: the node last found to run it)."""
        return self._endpoint

    @property
    def in_cluster(self) -> bool:
        """Whether the controller is found through seeds: several were given, or the one given answered
        ``WrongHost`` (a cluster node without the controller)."""
        return self._cluster

    # --- The request path --------------------------------------------------------------------------

    async def call(self, method: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Call ``method`` with ``body`` (a JSON object) and return the reply's JSON object.  Raises the
        typed error the controller answered with; ``ProtocolError`` if the reply is not a JSON object."""
        if method not in CONTROLLER_METHODS:
            raise InvalidArgumentError(f"no controller method {method!r}")
        request = dict(body or {})
        if self._token:
            request["token"] = self._token
        payload = canonical_json(request)

        harmless = CONTROLLER_METHODS[method]

        async def once() -> dict[str, Any]:
            # A harmless call is retried as a whole (below); any other retries only connecting.
            connection = await (self._pool.acquire(self._endpoint) if harmless
                                else self._pool.acquire_with_retry(self._endpoint))
            reply = await connection.request(lambda rid: ControllerRequest(rid, method, payload),
                                             what=f"controller {method}")
            return _reply_object(method, expect(reply, ControllerReply).body)

        if not self._cluster:
            try:
                if not harmless:
                    return await once()
                return await self._pool.retrying(once, what=f"controller {method} at {self._endpoint}")
            except WrongHostError:  # a cluster node without the controller: nothing was done
                self._cluster = self._stale = True
        return await self._call_in_cluster(method, payload, harmless)

    async def _call_in_cluster(self, method: str, payload: bytes, harmless: bool) -> dict[str, Any]:
        """``call`` on a cluster: find the controller through the seeds, and again after it moved."""
        async def once() -> dict[str, Any]:
            if self._stale:
                await self._locate()
            try:
                connection = await self._pool.acquire(self._endpoint)
            except ConnectionLostError as error:
                self._stale = True
                raise ControllerUnreachableError(f"the controller's node {self._endpoint} is unreachable: {error}") \
                    from error
            try:
                reply = await connection.request(lambda rid: ControllerRequest(rid, method, payload),
                                                 what=f"controller {method}")
                raw = expect(reply, ControllerReply).body
            except (WrongHostError, ConnectionLostError, ContainerUnavailableError, RequestTimeoutError):
                self._stale = True  # (the controller moved, or its node died or hangs: ask the seeds next time)
                raise
            return _reply_object(method, raw)

        retry_on: tuple[type[Exception], ...] = (WrongHostError, ControllerUnreachableError)
        if harmless or method in RESENT_IN_CLUSTER:
            # (the request may have been carried out -- its node died, or the controller left it, before
            # the reply: ConnectionLost, ContainerUnavailable -- and sending it again is harmless)
            retry_on += (ConnectionLostError, ContainerUnavailableError)
        if method in RESENT_IN_CLUSTER:
            retry_on += (RequestTimeoutError,)  # (likewise when no reply came in time: a node that hangs)
        return await self._pool.retrying(once, retry_on=retry_on, what=f"controller {method} in the cluster")

    async def _locate(self) -> None:
        """Ask the seeds (and the last known controller node) in turn where the controller runs.
        Raises ``ControllerUnreachableError`` if none says -- ``ConnectFailedError`` if no server was
        ever reached and none could be (wrong addresses, within the initial connect budget each)."""
        body = canonical_json({"token": self._token} if self._token else {})
        reasons: list[str] = []
        never_reached = True  # (every seed failed as a wrong address does: ConnectFailedError)
        for seed in dict.fromkeys((*self._seeds, self._endpoint)):
            try:
                connection = await self._pool.acquire(seed)
                reply = await connection.request(lambda rid: ControllerRequest(rid, LOCATE_CONTROLLER, body),
                                                 what=f"where the controller runs, asked of {seed}")
                answer = json.loads(expect(reply, ControllerReply).body)
            except OperationUnsupportedError:  # not a cluster node: a single server, its own controller
                self._endpoint, self._stale = seed, False
                return
            except (ConnectFailedError, RetryableError) as error:
                # (RetryableError: the seed is gone or going -- ConnectionLost, WrongHost, ContainerUnavailable
                # -- or, leaving the cluster, cannot ask ZooKeeper: CoordinationUnavailable; ask the next)
                never_reached = never_reached and isinstance(error, ConnectFailedError)
                reasons.append(f"{seed}: {error}")
                continue
            except ValueError as error:
                raise ProtocolError(f"{seed} answered {LOCATE_CONTROLLER} with malformed JSON: {error}") from None
            uri = answer.get("uri") if isinstance(answer, dict) else None
            if not isinstance(uri, str):
                raise ProtocolError(f"{seed} answered {LOCATE_CONTROLLER} with {answer!r}, not {{\"uri\": str}}")
            try:
                self._endpoint = parse_uri(uri)
            except InvalidArgumentError as error:
                raise ProtocolError(f"{seed} answered {LOCATE_CONTROLLER} with a bad URI: {error}") from None
            self._stale = False
            return
        if never_reached:  # wrong addresses: said at once, as for a single server (not retried)
            raise ConnectFailedError("no seed could be reached: " + "; ".join(reasons))
        raise ControllerUnreachableError("no seed said where the cluster's controller runs: " + "; ".join(reasons))

    async def _ask(self, method: str, body: Mapping[str, Any], codec: ReplyCodec[T]) -> T:
        """Call ``method`` and decode its reply with ``codec`` -- the one the server encoded it with
        (``values.CONTROLLER_REPLIES``).  A reply that does not describe the value is ``ProtocolError``."""
        if codec is not CONTROLLER_REPLIES[method]:
            raise InternalError(f"the client decodes {method}'s reply with another codec than the server's")
        reply = await self.call(method, body)
        with _decoding(method):
            return codec.decode(reply, body)

    # --- Scopes ------------------------------------------------------------------------------------

    async def create_scope(self, scope: str) -> None:
        """Raises ``ScopeExistsError``."""
        await self.call("create_scope", {"scope": _scope(scope)})

    async def delete_scope(self, scope: str) -> None:
        """Raises ``ScopeNotFoundError``, ``ScopeNotEmptyError``."""
        await self.call("delete_scope", {"scope": _scope(scope)})

    async def list_scopes(self) -> list[str]:
        return await self._ask("list_scopes", {}, replies.SCOPE_NAMES)

    # --- Streams -----------------------------------------------------------------------------------

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Raises ``StreamExistsError``, ``ScopeNotFoundError``."""
        if not isinstance(config, StreamConfig):
            raise InvalidArgumentError(f"config must be a StreamConfig, not {config!r}")
        await self.call("create_stream", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                          "config": config.to_json_object()})

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Raises ``StreamNotFoundError``, ``StreamSealedError``."""
        if not isinstance(config, StreamConfig):
            raise InvalidArgumentError(f"config must be a StreamConfig, not {config!r}")
        await self.call("update_stream", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                          "config": config.to_json_object()})

    async def get_stream(self, scope: str, stream: str) -> StreamDescription:
        return await self._ask("get_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")},
                               replies.STREAM_DESCRIPTION)

    async def list_streams(self, scope: str) -> list[str]:
        return await self._ask("list_streams", {"scope": _scope(scope)}, replies.STREAM_NAMES)

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Idempotent.  Raises ``StreamNotFoundError``."""
        await self.call("seal_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")})

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Raises ``StreamNotSealedError``, ``StreamNotFoundError``."""
        await self.call("delete_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")})

    async def get_current_segments(self, scope: str, stream: str) -> StreamSegments:
        return await self._ask("get_current_segments", {"scope": _scope(scope), "stream": _name(stream, "stream")},
                               replies.STREAM_SEGMENTS)

    async def get_successors(self, scope: str, stream: str, segment_id: int) -> list[SuccessorSegment]:
        """The segments that took over the sealed segment's keys, each with all its predecessors;
        empty while the segment is in the current epoch (active, or sealed with the stream)."""
        return await self._ask("get_successors", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                                  "segment_id": _segment_id(segment_id)}, replies.SUCCESSORS)

    async def scale_stream(self, scope: str, stream: str, seal: Sequence[int],
                           new_ranges: Sequence[tuple[float, float]]) -> int:
        """Returns the new epoch.  Raises ``InvalidScaleError``, ``StreamSealedError``."""
        if isinstance(seal, (str, bytes)) or isinstance(new_ranges, (str, bytes)):
            raise InvalidArgumentError("seal is a list of segment ids and new_ranges a list of (low, high) pairs")
        body = {"scope": _scope(scope), "stream": _name(stream, "stream"),
                "seal": [_segment_id(s) for s in seal], "new_ranges": [_range(r) for r in new_ranges]}
        return await self._ask("scale_stream", body, replies.EPOCH)

    # --- Stream cuts -------------------------------------------------------------------------------

    async def get_head_cut(self, scope: str, stream: str) -> StreamCut:
        return await self._ask("get_head_cut", {"scope": _scope(scope), "stream": _name(stream, "stream")},
                               replies.STREAM_CUT)

    async def get_tail_cut(self, scope: str, stream: str) -> StreamCut:
        return await self._ask("get_tail_cut", {"scope": _scope(scope), "stream": _name(stream, "stream")},
                               replies.STREAM_CUT)

    async def get_cut_at(self, scope: str, stream: str, time: float) -> StreamCut:
        if isinstance(time, bool) or not isinstance(time, (int, float)):
            raise InvalidArgumentError(f"time is seconds on the controller's clock, not {time!r}")
        return await self._ask("get_cut_at", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                              "time": float(time)}, replies.STREAM_CUT)

    async def truncate_stream(self, scope: str, stream: str, cut: StreamCut) -> None:
        """Raises ``InvalidStreamCutError`` (another stream's cut, not a cut, or before the head)."""
        await self.call("truncate_stream", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                            "cut": _cut_of(scope, stream, cut)})

    async def check_stream_cut(self, scope: str, stream: str, cut: StreamCut) -> None:
        """Return if ``cut`` is a valid position of the stream (at or after its head); else raise
        ``InvalidStreamCutError`` saying why (e.g. for a reader group's checkpoint)."""
        await self.call("check_stream_cut", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                             "cut": _cut_of(scope, stream, cut)})

    async def get_segments_between(self, scope: str, stream: str, from_cut: StreamCut | None,
                                   to_cut: StreamCut | None) -> list[SegmentSlice]:
        """Every segment with data between ``from_cut`` (None: the head) and ``to_cut`` (None: no end),
        with the offsets to read between, ordered by epoch then key."""
        body = {"scope": _scope(scope), "stream": _name(stream, "stream"),
                "from_cut": None if from_cut is None else _cut_of(scope, stream, from_cut),
                "to_cut": None if to_cut is None else _cut_of(scope, stream, to_cut)}
        return await self._ask("get_segments_between", body, replies.SEGMENT_SLICES)

    # --- Reader groups -----------------------------------------------------------------------------

    async def create_reader_group(self, scope: str, group: str, config: ReaderGroupConfig) -> str:
        """Register the group (its streams must exist, its cuts be theirs); return its state segment.
        Raises ``ReaderGroupExistsError``, ``ScopeNotFoundError``, ``StreamNotFoundError``,
        ``InvalidStreamCutError``."""
        if not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        return await self._ask("create_reader_group", {"scope": _scope(scope), "group": _name(group, "group"),
                                                       "config": config.to_json_object()}, replies.STATE_SEGMENT)

    async def get_reader_group(self, scope: str, group: str) -> ReaderGroupInfo:
        """Raises ``ReaderGroupNotFoundError``."""
        return await self._ask("get_reader_group", {"scope": _scope(scope), "group": _name(group, "group")},
                               replies.READER_GROUP_INFO)

    async def update_reader_group(self, scope: str, group: str, config: ReaderGroupConfig,
                                  expected_generation: int | None = None) -> int:
        """Replace the group's configuration (a reset); return the new generation.  With
        ``expected_generation`` it happens only if the generation is still that one (else
        ``InvalidArgumentError``: someone else reset the group first)."""
        if not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        body: dict[str, Any] = {"scope": _scope(scope), "group": _name(group, "group"),
                                "config": config.to_json_object()}
        if expected_generation is not None:
            body["expected_generation"] = expected_generation
        return await self._ask("update_reader_group", body, replies.GENERATION)

    async def delete_reader_group(self, scope: str, group: str) -> None:
        """Deletes the group and its state segment.  Raises ``ReaderGroupNotFoundError``."""
        await self.call("delete_reader_group", {"scope": _scope(scope), "group": _name(group, "group")})

    async def list_reader_groups(self, scope: str) -> list[str]:
        return await self._ask("list_reader_groups", {"scope": _scope(scope)}, replies.READER_GROUP_NAMES)

    async def update_subscriber_cut(self, scope: str, group: str, stream: str, cut: StreamCut) -> None:
        """Record how far ``group`` has consumed ``stream`` (``"scope/stream"``), for consumption-based
        retention.  Raises ``ReaderGroupNotFoundError``, ``InvalidStreamCutError``."""
        stream_scope, stream_name = split_stream_name(stream)
        await self.call("update_subscriber_cut", {"scope": _scope(scope), "group": _name(group, "group"),
                                                  "stream": stream,
                                                  "cut": _cut_of(stream_scope, stream_name, cut)})

    # --- Where segments are served -----------------------------------------------------------------

    async def get_segment_uri(self, segment: str) -> str:
        if not isinstance(segment, str) or not segment:
            raise InvalidArgumentError(f"a segment name is a non-empty str, not {segment!r}")
        return await self._ask("get_segment_uri", {"segment": segment}, replies.SEGMENT_URI)

    # --- Stream transactions -----------------------------------------------------------------------

    def _txn_body(self, scope: str, stream: str, txn_id: UUID | str) -> dict[str, Any]:
        return {"scope": _scope(scope), "stream": _name(stream, "stream"), "txn": parse_transaction_id(txn_id).hex}

    async def create_transaction(self, scope: str, stream: str, lease_seconds: float | None = None,
                                 ) -> TransactionInfo:
        """Begin a transaction on the stream's current epoch.  Raises ``LeaseTooLargeError``,
        ``StreamSealedError``, ``StreamNotFoundError``."""
        body: dict[str, Any] = {"scope": _scope(scope), "stream": _name(stream, "stream")}
        if lease_seconds is not None:
            if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)):
                raise LeaseTooLargeError(f"a lease is a number of seconds, not {lease_seconds!r}")
            body["lease"] = float(lease_seconds)
        return await self._ask("create_transaction", body, replies.TRANSACTION_INFO)

    async def get_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionInfo:
        """Raises ``TransactionNotFoundError``."""
        return await self._ask("get_transaction", self._txn_body(scope, stream, txn_id), replies.TRANSACTION_INFO)

    async def ping_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> float:
        """Renew the lease; returns the deadline.  Raises ``TransactionNotOpenError``,
        ``LeaseExpiredError``, ``TransactionNotFoundError``."""
        return await self._ask("ping_transaction", self._txn_body(scope, stream, txn_id), replies.LEASE_DEADLINE)

    async def commit_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionStatus:
        """Decide the commit (COMMITTING).  Raises ``TransactionNotOpenError``, ``TransactionNotFoundError``,
        ``StreamSealedError``; ``ConnectionLostError`` leaves the outcome unknown."""
        return await self._ask("commit_transaction", self._txn_body(scope, stream, txn_id), replies.TRANSACTION_STATUS)

    async def abort_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionStatus:
        """Raises ``TransactionNotOpenError`` (committing or committed), ``TransactionNotFoundError``."""
        return await self._ask("abort_transaction", self._txn_body(scope, stream, txn_id), replies.TRANSACTION_STATUS)

    async def list_transactions(self, scope: str, stream: str) -> dict[UUID, TransactionStatus]:
        """Every transaction the stream knows (live ones and the latest finished) and its status."""
        return await self._ask("list_transactions", {"scope": _scope(scope), "stream": _name(stream, "stream")},
                               replies.TRANSACTION_STATUSES)

    async def commit_transactions(self, scope: str, stream: str, txn_ids: Sequence[UUID | str], *,
                                  fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """The atomic, fenced multi-commit (see ``AsyncClient.commit_transactions``).  Raises
        ``FenceValueError``, ``TransactionNotFoundError``, ``TransactionNotOpenError``,
        ``StreamSealedError`` -- each having changed nothing."""
        if isinstance(txn_ids, (str, bytes)) or not isinstance(txn_ids, Sequence):
            raise InvalidArgumentError(f"txn_ids is a list of transaction ids, not {txn_ids!r}")
        body: dict[str, Any] = {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                "txns": [parse_transaction_id(t).hex for t in txn_ids]}
        if fence is not None:
            if isinstance(fence, (str, bytes)) or not isinstance(fence, Sequence) or len(fence) != 2:
                raise FenceValueError(f"a fence is a (key, value) pair, not {fence!r}")
            key, value = fence
            if type(value) is not int:
                raise FenceValueError(f"a fence value is an int, not {value!r}")
            body["fence"] = [key, value]
        return await self._ask("commit_transactions", body, replies.MULTI_COMMIT_RESULT)

    async def get_fence(self, scope: str, stream: str, key: str) -> int | None:
        """The value recorded for fence ``key`` on the stream (None: none yet)."""
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"a fence key is a non-empty str, not {key!r}")
        return await self._ask("get_fence", {"scope": _scope(scope), "stream": _name(stream, "stream"), "key": key},
                               replies.FENCE_VALUE)

    def __repr__(self) -> str:
        return f"ControllerClient({str(self._endpoint)!r})"


def _segment_id(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(f"a segment id is a non-negative int, not {value!r}")
    return value


def _range(value: Any) -> list[float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise InvalidArgumentError(f"a key range is a (low, high) pair, not {value!r}")
    low, high = value
    for bound in (low, high):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 <= bound <= 1:
            raise InvalidArgumentError(f"key range bounds are numbers in [0, 1], not {value!r}")
    return [float(low), float(high)]


def _cut_of(scope: str, stream: str, cut: StreamCut) -> dict[str, int]:
    """The wire form of ``cut``, which must be a cut of ``scope/stream``.  (On the wire a cut is only
    segment ids and offsets, and every stream has a segment 0 of epoch 0, so this is the one place
    where a cut of another stream can be told apart.)"""
    if not isinstance(cut, StreamCut):
        raise InvalidArgumentError(f"a stream cut must be a StreamCut, not {cut!r}")
    if cut.stream != f"{scope}/{stream}":
        raise InvalidStreamCutError(f"the cut is a position of {cut.stream!r}, not of {scope}/{stream!r}")
    return cut.to_wire()


class SeedLocator:
    """Where a client built from seeds finds segments: at its one server (``FixedLocator``) -- unless the
    controller turned out to live in a cluster (``ControllerClient.in_cluster``): then where the
    controller says (``ControllerSegmentLocator``)."""

    def __init__(self, endpoint: Endpoint, controller: ControllerClient, located: ControllerSegmentLocator) -> None:
        self._endpoint = endpoint
        self._controller = controller
        self._located = located

    async def endpoint_for(self, segment: str) -> Endpoint:
        if self._controller.in_cluster:
            return await self._located.endpoint_for(segment)
        return self._endpoint

    def forget(self, segment: str) -> None:
        self._located.forget(segment)


class CachingSegmentLocator:
    """Where segments are served, as ``lookup(segment)`` (a URI) says; answers are cached (at most
    ``limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX`` of them; the cache empties when full) until ``forget``."""

    def __init__(self, lookup: Callable[[str], Awaitable[str]]) -> None:
        self._lookup = lookup
        self._cache: dict[str, Endpoint] = {}

    async def endpoint_for(self, segment: str) -> Endpoint:
        endpoint = self._cache.get(segment)
        if endpoint is None:
            endpoint = parse_uri(await self._lookup(segment))
            if len(self._cache) >= limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX:
                self._cache.clear()
            self._cache[segment] = endpoint
        return endpoint

    def forget(self, segment: str) -> None:
        self._cache.pop(segment, None)


class ControllerSegmentLocator(CachingSegmentLocator):
    """Where segments are served, as the controller says (``get_segment_uri``), cached until ``forget``."""

    def __init__(self, controller: ControllerClient) -> None:
        super().__init__(controller.get_segment_uri)
