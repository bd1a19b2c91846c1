"""ClusterSegmentStore: the controller's ``SegmentStore`` on a cluster node (issue 23; DESIGN §10).

Theory of operation.  A cluster controller creates, seals, truncates, merges and deletes segments in
every container, wherever the map puts it.  ``ClusterSegmentStore`` tries each operation on the node's
own server first (``LocalSegmentStore``: same process, same loop, no copy); a container this node
does not serve answers ``WrongHostError`` there, and the operation goes over the wire instead, to the
host the cluster's map gives the segment's container (``ClusterMap.segment_uri``: the ZooKeeper map
and the owner's registered address), with the client library's ``AsyncSegments``.

Containers move.  A ``WrongHost`` reply, a lost connection or a container that is restarting or
assigned to nobody yet makes the store forget where the segment lived, wait (bounded, doubling delays
on the injected clock, ``limits.CONTROLLER_STORE_RETRY_*``) and try again -- locally first, since
the container may have moved *here*.  Every operation keeps the protocol's idempotent meaning, so a
repetition after an outcome that is unknown (a connection lost after the request left) is safe: a
segment created by the lost attempt makes the next ``create_segment`` answer False, a merge done by
it makes the next ``merge`` answer False, and so on.

What stays local.  The controller's own metadata log takes raw conditional appends and byte-granular
truncation, which the wire's segment requests do not offer (a segment clients create over the wire
holds events).  It needs neither: the controller runs on the node that owns the container of its
metadata segment (``ClusterNode``) and stops before that container leaves, so the log is always
local.  ``append`` on a segment served elsewhere is an ``InternalError`` that says so.  Segments
created over the wire are marked as holding events, transaction segments included (locally they are
not); they are never truncated, so nothing observable differs.

Append statistics (auto-scaling).  Each node's server counts the appends its containers take.  The
store drains this node's counts in process and collects every other node's over the wire
(``collect_append_counts``: a ``drain_append_counts`` request carrying the peer token, answered by
every node's ``ClusterControllerEndpoint``); ``drain_append_counts`` hands the controller both.  The
node calls ``collect_append_counts`` every controller tick, so a remote segment's counts reach the
controller at most a tick late.  A node that cannot be reached gives nothing that tick: its counts
wait on it for the next collection, or die with it (its segments' rates then dip for one sample).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, TypeVar

from millstream import limits
from millstream.client._config import ClientConfig, RandomSource, SystemRandomSource, parse_uri
from millstream.client._controller import CachingSegmentLocator
from millstream.client._pool import ConnectionPool
from millstream.client._replies import expect
from millstream.client._segments import AsyncSegments
from millstream.clock import Clock
from millstream.controller._segment_store import AppendCounts, LocalSegmentStore, SegmentState, store_retry_policy
from millstream.errors import (
    BadOffsetError,
    ConnectionLostError,
    ContainerUnavailableError,
    EventBoundaryError,
    InternalError,
    InvalidArgumentError,
    MillstreamError,
    ProtocolError,
    ReconnectBudgetExceededError,
    StreamSegmentExistsError,
    StreamSegmentNotExistsError,
    WrongHostError,
)
from millstream.naming import container_of
from millstream.retry import retry_bounded
from millstream.segmentstore import event_boundaries
from millstream.server import SegmentStoreServer
from millstream.values import ReadResult, canonical_json
from millstream.wire.commands import ControllerReply, ControllerRequest

__all__ = ["DRAIN_APPEND_COUNTS", "ClusterMap", "ClusterSegmentStore"]

log = logging.getLogger("millstream.cluster")

_T = TypeVar("_T")

#: The ``ControllerRequest`` method every node of a cluster answers, for the peer token only (body
#: ``{"token": ...}``), with ``{"counts": [[segment, bytes, events], ...], "more": bool}``: the appends
#: its containers took since the last such request (``ClusterControllerEndpoint``).
DRAIN_APPEND_COUNTS: Final = "drain_append_counts"

#: What makes the store ask the map again and retry: the segment is not (or no longer) where it was
#: looked for, or its host cannot be reached.
_MOVED = (WrongHostError, ConnectionLostError, ContainerUnavailableError, ReconnectBudgetExceededError)


class ClusterMap(Protocol):
    """Where segments are served in the cluster (``ClusterNode``)."""

    async def segment_uri(self, segment: str) -> str:
        """``tcp://host:port`` of the host the map gives ``segment``'s container; raises
        ``ContainerUnavailableError`` while it is assigned to nobody or moving."""
        ...

    def peer_uris(self) -> list[str]:
        """``tcp://host:port`` of every other host the map names whose address is known."""
        ...

    def known_segment_uri(self, segment: str) -> str:
        """The same from what the node knows already, without asking ZooKeeper; raises
        ``ContainerUnavailableError`` if it does not know it yet."""
        ...


class ClusterSegmentStore:
    """``SegmentStore`` over the whole cluster, for the controller running on ``server``'s node."""

    def __init__(self, server: SegmentStoreServer, cluster_map: ClusterMap, *, clock: Clock | None = None,
                 token: str = "", config: ClientConfig | None = None, rng: RandomSource | None = None,
                 retry_attempts_max: int = limits.CONTROLLER_STORE_RETRY_ATTEMPTS_MAX,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._server = server
        self._map = cluster_map
        self._clock = clock or server.clock
        self._local = LocalSegmentStore(server, clock=self._clock, retry_attempts_max=retry_attempts_max)
        self._policy = store_retry_policy(_MOVED, retry_attempts_max)
        self._locator = CachingSegmentLocator(cluster_map.segment_uri)  # (one answer per segment until forgotten)
        # A short outage budget: a host that went away is looked up again in the map (``_anywhere``)
        # instead of being retried for a client's whole budget.
        self._pool = ConnectionPool(
            clock=self._clock, rng=rng or SystemRandomSource(),
            config=config or ClientConfig(reconnect_budget_seconds=limits.CLUSTER_STORE_RECONNECT_BUDGET_SECONDS),
            ssl_context=ssl_context)  # (trusted for other nodes' ``tls://`` addresses)
        self._pool.reached = True  # (the hosts exist: a failed connect is a host that left, not a wrong address)
        self._segments = AsyncSegments(pool=self._pool, locator=self._locator, token=token,
                                       rng=rng or SystemRandomSource())
        self._token = token
        #: Other nodes' counts collected since the controller last drained (bounded as a server's are).
        self._remote_counts: dict[str, list[int]] = {}

    async def close(self) -> None:
        """Close the connections to other hosts."""
        await self._pool.close()

    async def _anywhere(self, name: str, local: Callable[[], Awaitable[_T]],
                        remote: Callable[[AsyncSegments], Awaitable[_T]]) -> _T:
        """``local()`` if this node serves ``name``'s container, else ``remote(segments)`` on its host;
        after a move or a lost host, again (bounded, doubling delays on the clock)."""
        async def attempt() -> _T:
            try:
                return await local()
            except WrongHostError:
                return await remote(self._segments)
        return await retry_bounded(attempt, self._policy, self._clock,
                                   on_failure=lambda error, failures, delay: self._locator.forget(name))

    async def create_segment(self, name: str) -> bool:
        async def remote(segments: AsyncSegments) -> bool:
            try:
                await segments.create(name)
            except StreamSegmentExistsError:
                return False
            return True
        return await self._anywhere(name, lambda: self._local.create_segment(name), remote)

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        async def remote(segments: AsyncSegments) -> int:
            raise InternalError(f"{name!r} is served by another host: the cluster controller appends raw bytes only "
                                "to its own log, whose container its node owns")
        return await self._anywhere(name, lambda: self._local.append(name, data, expected_offset=expected_offset),
                                    remote)

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        length = min(max_length, limits.READ_LENGTH_BYTES_MAX)
        return await self._anywhere(name, lambda: self._local.read(name, offset, max_length),
                                    lambda segments: segments.read(name, offset, length=length))

    async def get_info(self, name: str) -> SegmentState | None:
        async def remote(segments: AsyncSegments) -> SegmentState | None:
            try:
                found = await segments.info(name)
            except StreamSegmentNotExistsError:
                return None
            return SegmentState(found.length, found.start_offset, found.sealed)
        return await self._anywhere(name, lambda: self._local.get_info(name), remote)

    async def seal(self, name: str) -> int:
        async def remote(segments: AsyncSegments) -> int:
            await segments.seal(name)  # (sealing a sealed segment succeeds)
            return (await segments.info(name)).length
        return await self._anywhere(name, lambda: self._local.seal(name), remote)

    async def truncate(self, name: str, offset: int) -> None:
        async def remote(segments: AsyncSegments) -> None:
            if (await segments.info(name)).start_offset < offset:
                await segments.truncate(name, offset)
        await self._anywhere(name, lambda: self._local.truncate(name, offset), remote)

    async def check_event_boundary(self, name: str, offset: int) -> None:
        await self._anywhere(name, lambda: self._local.check_event_boundary(name, offset),
                             lambda segments: _check_event_boundary(segments, name, offset))

    async def delete(self, name: str) -> bool:
        async def remote(segments: AsyncSegments) -> bool:
            try:
                await segments.delete(name)
            except StreamSegmentNotExistsError:
                return False
            return True
        return await self._anywhere(name, lambda: self._local.delete(name), remote)

    async def merge(self, target: str, source: str) -> bool:
        if self.container_of(source) != self.container_of(target):  # else "missing" would read as "merged"
            raise InternalError(f"{source!r} and {target!r} live in different containers: they cannot be merged")

        async def remote(segments: AsyncSegments) -> bool:
            await segments.info(target)  # a missing target is an error, never "merged already"
            try:
                await segments.info(source)
            except StreamSegmentNotExistsError:  # merged (its subclass) or deleted: nothing left to merge
                return False
            await segments.seal(source)
            try:
                await segments.merge(target, source)
            except StreamSegmentNotExistsError:  # a concurrent (or the lost) attempt merged it meanwhile
                return False
            return True
        return await self._anywhere(target, lambda: self._local.merge(target, source), remote)

    def uri_of(self, name: str) -> str:
        return self._map.known_segment_uri(name)

    def container_of(self, name: str) -> int:
        return container_of(name, self._server.config.container_count)

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        """This node's counts since the last call, and what ``collect_append_counts`` brought from the others."""
        counts = self._local.drain_append_counts()
        remote, self._remote_counts = self._remote_counts, {}
        for name, (size, events) in remote.items():
            mine = counts.get(name)
            counts[name] = AppendCounts(size, events) if mine is None else \
                AppendCounts(mine.bytes + size, mine.events + events)
        return counts

    async def collect_append_counts(self) -> None:
        """Drain every other node's append counts (``DRAIN_APPEND_COUNTS``) into the next
        ``drain_append_counts``.  A node that fails to answer is logged and skipped."""
        body = canonical_json({"token": self._token})
        for uri in self._map.peer_uris():
            try:
                connection = await self._pool.acquire(parse_uri(uri))
                reply = await connection.request(lambda rid: ControllerRequest(rid, DRAIN_APPEND_COUNTS, body),
                                                 what=f"append counts of {uri}")
                entries = _counts_of(expect(reply, ControllerReply).body, uri)
            except MillstreamError as error:
                log.info("the controller could not collect %s's append counts: %s", uri, error)
                continue
            for name, size, events in entries:
                counts = self._remote_counts.get(name)
                if counts is None:
                    if len(self._remote_counts) >= limits.STATISTICS_SEGMENTS_MAX:
                        continue
                    self._remote_counts[name] = [size, events]
                else:
                    counts[0] += size
                    counts[1] += events


def _counts_of(body: bytes, uri: str) -> list[tuple[str, int, int]]:
    """The ``[[segment, bytes, events], ...]`` of a ``DRAIN_APPEND_COUNTS`` reply; ``ProtocolError`` if
    it is anything else."""
    try:
        entries = json.loads(body)["counts"]
        if not isinstance(entries, list):
            raise TypeError("counts is not a list")
        parsed = []
        for name, size, events in entries:
            if not isinstance(name, str) or type(size) is not int or type(events) is not int \
                    or size < 0 or events < 0:
                raise TypeError(f"not [segment, bytes, events]: {name!r}, {size!r}, {events!r}")
            parsed.append((name, size, events))
    except (ValueError, LookupError, TypeError) as error:
        raise ProtocolError(f"{uri} answered {DRAIN_APPEND_COUNTS} with a malformed reply: {error}") from None
    return parsed


async def _check_event_boundary(segments: AsyncSegments, name: str, offset: int) -> None:
    """``SegmentStore.check_event_boundary`` over the wire: from the nearest boundary the server knows
    (``event_boundaries``), hop event headers up to ``offset`` through reads, within the same budget
    the container's own check has (``event_boundaries.SCAN_BYTES_MAX``)."""
    info = await segments.info(name)
    if not info.start_offset <= offset <= info.length:
        raise BadOffsetError(f"offset {offset} is outside [{info.start_offset}, {info.length}] of {name!r}")
    if offset in (info.start_offset, info.length):
        return
    try:
        known = await segments.event_boundaries(name, info.start_offset, offset)
    except InvalidArgumentError:
        return  # the segment does not hold events (a byte stream's): every offset in range is a boundary
    position = max((boundary for boundary in known if boundary <= offset), default=info.start_offset)
    base, buffer, read = position, b"", 0
    while position < offset:
        buffer, base = buffer[position - base:] if position <= base + len(buffer) else b"", position
        want = min(offset - base - len(buffer), limits.READ_LENGTH_BYTES_MAX, event_boundaries.SCAN_BYTES_MAX - read)
        if want <= 0:
            raise EventBoundaryError(
                f"offset {offset} of {name!r} could not be confirmed as an event boundary within "
                f"{event_boundaries.SCAN_BYTES_MAX} bytes of reading from the nearest known one: truncate at an "
                "offset a reader, a stream cut or the segment's length gave")
        result = await segments.read(name, base + len(buffer), length=want)
        if not result.data:
            raise InternalError(f"a read of {name!r} at {base + len(buffer)}, below its length, was empty")
        read += len(result.data)
        buffer += result.data
        position = event_boundaries.walk_events(buffer, base, position, offset, name)
