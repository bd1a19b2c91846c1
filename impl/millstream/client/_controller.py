"""``ControllerClient``: the controller's RPC, one async method per controller method, typed values back.

Theory of operation.  The controller shares the segment store's TCP connection: a call is one
``ControllerRequest(request_id, method, body)`` whose body is the method's request as canonical JSON
(``_streams.canonical_json``), answered by ``ControllerReply(request_id, body)`` or by an error reply
that becomes the typed error it names (``ErrorMessage`` with a code from ``wire.error_codes``;
``OperationUnsupported`` for a server without a controller or an unknown method).  With a token the
body carries it as ``"token"`` (the server checks it when it has a secret).

Calls that change nothing, or whose repetition changes nothing more (every query, ``seal_stream``,
``truncate_stream``, ``update_subscriber_cut``, ``ping_transaction``, ``abort_transaction``, the
fenced ``commit_transactions``), are re-sent after a broken connection within the pool's per-outage
reconnect budget (``ConnectionPool.retrying``); the others (creations, deletions, scaling,
configuration updates, ``create_transaction``, ``commit_transaction``) retry only connecting: once
sent, their outcome is unknown, and ``ConnectionLostError`` says so (``Transaction.commit`` resolves
it by asking for the transaction's status).

``ControllerSegmentLocator`` is the ``SegmentLocator`` the stream layer uses: it asks the controller
where a segment is served (``get_segment_uri``), remembers the answer, and forgets it after a
``WrongHost`` reply.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final
from uuid import UUID

from millstream import limits
from millstream.client._config import Endpoint, parse_uri
from millstream.client._pool import ConnectionPool
from millstream.client._replies import expect
from millstream.client._streams import (
    ReaderGroupConfig,
    ReaderGroupInfo,
    SegmentSlice,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamSegments,
    SuccessorSegment,
    canonical_json,
    split_stream_name,
)
from millstream.client._transactions import (
    CommitOutcome,
    MultiCommitResult,
    TransactionInfo,
    TransactionStatus,
    transaction_id,
)
from millstream.errors import (
    FenceValueError,
    InvalidArgumentError,
    InvalidStreamCutError,
    LeaseTooLargeError,
    ProtocolError,
)
from millstream.naming import validate_scope_or_stream_name
from millstream.wire.commands import ControllerReply, ControllerRequest

__all__ = ["CONTROLLER_METHODS", "ControllerClient", "ControllerSegmentLocator"]


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


def _scope(scope: str) -> str:
    return validate_scope_or_stream_name(scope, what="scope")


def _name(name: str, what: str) -> str:
    return validate_scope_or_stream_name(name, what=what)


def _segment(value: Any) -> SegmentWithRange:
    return SegmentWithRange.from_json_object(value)


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


class ControllerClient:
    """The controller's methods over the client's connections (asyncio).  Made by
    ``AsyncClient.controller()``; ``endpoint`` is the server hosting the controller."""

    def __init__(self, *, pool: ConnectionPool, endpoint: Endpoint, token: str = "") -> None:
        self._pool = pool
        self._endpoint = endpoint
        self._token = token

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

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
            raw = expect(reply, ControllerReply).body
            try:
                decoded = json.loads(raw)
            except ValueError as error:
                raise ProtocolError(f"the controller answered {method} with malformed JSON: {error}") from None
            if not isinstance(decoded, dict):
                raise ProtocolError(f"the controller answered {method} with {decoded!r}, not a JSON object")
            return decoded

        if not harmless:
            return await once()
        return await self._pool.retrying(once, what=f"controller {method} at {self._endpoint}")

    # --- Scopes ------------------------------------------------------------------------------------

    async def create_scope(self, scope: str) -> None:
        """Raises ``ScopeExistsError``."""
        await self.call("create_scope", {"scope": _scope(scope)})

    async def delete_scope(self, scope: str) -> None:
        """Raises ``ScopeNotFoundError``, ``ScopeNotEmptyError``."""
        await self.call("delete_scope", {"scope": _scope(scope)})

    async def list_scopes(self) -> list[str]:
        reply = await self.call("list_scopes")
        with _decoding("list_scopes"):
            return list(reply["scopes"])

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
        reply = await self.call("get_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")})
        with _decoding("get_stream"):
            return StreamDescription(scope, stream, StreamConfig.from_json_object(reply["config"]),
                                     bool(reply["sealed"]), int(reply["epoch"]),
                                     tuple(_segment(s) for s in reply["segments"]),
                                     str(reply.get("state", "sealed" if reply["sealed"] else "active")))

    async def list_streams(self, scope: str) -> list[str]:
        reply = await self.call("list_streams", {"scope": _scope(scope)})
        with _decoding("list_streams"):
            return list(reply["streams"])

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Idempotent.  Raises ``StreamNotFoundError``."""
        await self.call("seal_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")})

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Raises ``StreamNotSealedError``, ``StreamNotFoundError``."""
        await self.call("delete_stream", {"scope": _scope(scope), "stream": _name(stream, "stream")})

    async def get_current_segments(self, scope: str, stream: str) -> StreamSegments:
        reply = await self.call("get_current_segments", {"scope": _scope(scope), "stream": _name(stream, "stream")})
        with _decoding("get_current_segments"):
            return StreamSegments(int(reply["epoch"]), tuple(_segment(s) for s in reply["segments"]))

    async def get_successors(self, scope: str, stream: str, segment_id: int) -> list[SuccessorSegment]:
        """The segments that took over the sealed segment's keys, each with all its predecessors;
        empty while the segment is in the current epoch (active, or sealed with the stream)."""
        reply = await self.call("get_successors", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                                   "segment_id": _segment_id(segment_id)})
        with _decoding("get_successors"):
            return [SuccessorSegment(_segment(s), frozenset(int(p) for p in s["predecessors"]))
                    for s in reply["successors"]]

    async def scale_stream(self, scope: str, stream: str, seal: Sequence[int],
                           new_ranges: Sequence[tuple[float, float]]) -> int:
        """Returns the new epoch.  Raises ``InvalidScaleError``, ``StreamSealedError``."""
        if isinstance(seal, (str, bytes)) or isinstance(new_ranges, (str, bytes)):
            raise InvalidArgumentError("seal is a list of segment ids and new_ranges a list of (low, high) pairs")
        body = {"scope": _scope(scope), "stream": _name(stream, "stream"),
                "seal": [_segment_id(s) for s in seal], "new_ranges": [_range(r) for r in new_ranges]}
        reply = await self.call("scale_stream", body)
        with _decoding("scale_stream"):
            return int(reply["epoch"])

    # --- Stream cuts -------------------------------------------------------------------------------

    async def get_head_cut(self, scope: str, stream: str) -> StreamCut:
        reply = await self.call("get_head_cut", {"scope": _scope(scope), "stream": _name(stream, "stream")})
        with _decoding("get_head_cut"):
            return StreamCut.from_wire(f"{scope}/{stream}", reply["cut"])

    async def get_tail_cut(self, scope: str, stream: str) -> StreamCut:
        reply = await self.call("get_tail_cut", {"scope": _scope(scope), "stream": _name(stream, "stream")})
        with _decoding("get_tail_cut"):
            return StreamCut.from_wire(f"{scope}/{stream}", reply["cut"])

    async def get_cut_at(self, scope: str, stream: str, time: float) -> StreamCut:
        if isinstance(time, bool) or not isinstance(time, (int, float)):
            raise InvalidArgumentError(f"time is seconds on the controller's clock, not {time!r}")
        reply = await self.call("get_cut_at", {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                               "time": float(time)})
        with _decoding("get_cut_at"):
            return StreamCut.from_wire(f"{scope}/{stream}", reply["cut"])

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
        reply = await self.call("get_segments_between", body)
        with _decoding("get_segments_between"):
            return [SegmentSlice(_segment(s), int(s["start_offset"]),
                                 None if s["end_offset"] < 0 else int(s["end_offset"]),
                                 frozenset(int(p) for p in s["predecessors"])) for s in reply["segments"]]

    # --- Reader groups -----------------------------------------------------------------------------

    async def create_reader_group(self, scope: str, group: str, config: ReaderGroupConfig) -> str:
        """Register the group (its streams must exist, its cuts be theirs); return its state segment.
        Raises ``ReaderGroupExistsError``, ``ScopeNotFoundError``, ``StreamNotFoundError``,
        ``InvalidStreamCutError``."""
        if not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        reply = await self.call("create_reader_group", {"scope": _scope(scope), "group": _name(group, "group"),
                                                        "config": config.to_json_object()})
        with _decoding("create_reader_group"):
            return str(reply["state_segment"])

    async def get_reader_group(self, scope: str, group: str) -> ReaderGroupInfo:
        """Raises ``ReaderGroupNotFoundError``."""
        reply = await self.call("get_reader_group", {"scope": _scope(scope), "group": _name(group, "group")})
        with _decoding("get_reader_group"):
            return ReaderGroupInfo(scope, group, ReaderGroupConfig.from_json_object(reply["config"]),
                                   str(reply["state_segment"]), int(reply["generation"]))

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
        reply = await self.call("update_reader_group", body)
        with _decoding("update_reader_group"):
            return int(reply["generation"])

    async def delete_reader_group(self, scope: str, group: str) -> None:
        """Deletes the group and its state segment.  Raises ``ReaderGroupNotFoundError``."""
        await self.call("delete_reader_group", {"scope": _scope(scope), "group": _name(group, "group")})

    async def list_reader_groups(self, scope: str) -> list[str]:
        reply = await self.call("list_reader_groups", {"scope": _scope(scope)})
        with _decoding("list_reader_groups"):
            return list(reply["groups"])

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
        reply = await self.call("get_segment_uri", {"segment": segment})
        with _decoding("get_segment_uri"):
            return str(reply["uri"])

    # --- Stream transactions -----------------------------------------------------------------------

    def _txn_body(self, scope: str, stream: str, txn_id: UUID | str) -> dict[str, Any]:
        return {"scope": _scope(scope), "stream": _name(stream, "stream"), "txn": transaction_id(txn_id).hex}

    async def create_transaction(self, scope: str, stream: str, lease_seconds: float | None = None,
                                 ) -> TransactionInfo:
        """Begin a transaction on the stream's current epoch.  Raises ``LeaseTooLargeError``,
        ``StreamSealedError``, ``StreamNotFoundError``."""
        body: dict[str, Any] = {"scope": _scope(scope), "stream": _name(stream, "stream")}
        if lease_seconds is not None:
            if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)):
                raise LeaseTooLargeError(f"a lease is a number of seconds, not {lease_seconds!r}")
            body["lease"] = float(lease_seconds)
        reply = await self.call("create_transaction", body)
        with _decoding("create_transaction"):
            return TransactionInfo.from_json_object(f"{scope}/{stream}", reply)

    async def get_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionInfo:
        """Raises ``TransactionNotFoundError``."""
        reply = await self.call("get_transaction", self._txn_body(scope, stream, txn_id))
        with _decoding("get_transaction"):
            return TransactionInfo.from_json_object(f"{scope}/{stream}", reply)

    async def ping_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> float:
        """Renew the lease; returns the deadline.  Raises ``TransactionNotOpenError``,
        ``LeaseExpiredError``, ``TransactionNotFoundError``."""
        reply = await self.call("ping_transaction", self._txn_body(scope, stream, txn_id))
        with _decoding("ping_transaction"):
            return float(reply["deadline"])

    async def commit_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionStatus:
        """Decide the commit (COMMITTING).  Raises ``TransactionNotOpenError``, ``TransactionNotFoundError``,
        ``StreamSealedError``; ``ConnectionLostError`` leaves the outcome unknown."""
        reply = await self.call("commit_transaction", self._txn_body(scope, stream, txn_id))
        with _decoding("commit_transaction"):
            return TransactionStatus(reply["status"])

    async def abort_transaction(self, scope: str, stream: str, txn_id: UUID | str) -> TransactionStatus:
        """Raises ``TransactionNotOpenError`` (committing or committed), ``TransactionNotFoundError``."""
        reply = await self.call("abort_transaction", self._txn_body(scope, stream, txn_id))
        with _decoding("abort_transaction"):
            return TransactionStatus(reply["status"])

    async def list_transactions(self, scope: str, stream: str) -> dict[UUID, TransactionStatus]:
        """Every transaction the stream knows (live ones and the latest finished) and its status."""
        reply = await self.call("list_transactions", {"scope": _scope(scope), "stream": _name(stream, "stream")})
        with _decoding("list_transactions"):
            return {UUID(hex=t["txn"]): TransactionStatus(t["status"]) for t in reply["transactions"]}

    async def commit_transactions(self, scope: str, stream: str, txn_ids: Sequence[UUID | str], *,
                                  fence: tuple[str, int] | None = None) -> MultiCommitResult:
        """The atomic, fenced multi-commit (see ``AsyncClient.commit_transactions``).  Raises
        ``FenceValueError``, ``TransactionNotFoundError``, ``TransactionNotOpenError``,
        ``StreamSealedError`` -- each having changed nothing."""
        if isinstance(txn_ids, (str, bytes)) or not isinstance(txn_ids, Sequence):
            raise InvalidArgumentError(f"txn_ids is a list of transaction ids, not {txn_ids!r}")
        body: dict[str, Any] = {"scope": _scope(scope), "stream": _name(stream, "stream"),
                                "txns": [transaction_id(t).hex for t in txn_ids]}
        if fence is not None:
            if isinstance(fence, (str, bytes)) or not isinstance(fence, Sequence) or len(fence) != 2:
                raise FenceValueError(f"a fence is a (key, value) pair, not {fence!r}")
            key, value = fence
            if type(value) is not int:
                raise FenceValueError(f"a fence value is an int, not {value!r}")
            body["fence"] = [key, value]
        reply = await self.call("commit_transactions", body)
        with _decoding("commit_transactions"):
            recorded = reply.get("recorded")
            return MultiCommitResult(CommitOutcome(reply["outcome"]), None if recorded is None else int(recorded))

    async def get_fence(self, scope: str, stream: str, key: str) -> int | None:
        """The value recorded for fence ``key`` on the stream (None: none yet)."""
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"a fence key is a non-empty str, not {key!r}")
        reply = await self.call("get_fence", {"scope": _scope(scope), "stream": _name(stream, "stream"), "key": key})
        with _decoding("get_fence"):
            value = reply["value"]
            return None if value is None else int(value)

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


class ControllerSegmentLocator:
    """Where segments are served, as the controller says; answers are cached (at most
    ``limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX`` of them; the cache empties when full) until
    ``forget``."""

    def __init__(self, controller: ControllerClient) -> None:
        self._controller = controller
        self._cache: dict[str, Endpoint] = {}

    async def endpoint_for(self, segment: str) -> Endpoint:
        endpoint = self._cache.get(segment)
        if endpoint is None:
            endpoint = parse_uri(await self._controller.get_segment_uri(segment))
            if len(self._cache) >= limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX:
                self._cache.clear()
            self._cache[segment] = endpoint
        return endpoint

    def forget(self, segment: str) -> None:
        self._cache.pop(segment, None)
