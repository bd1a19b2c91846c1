"""The controller's view of the segment store: a small async protocol, and its in-process implementation.

Theory of operation.  The controller needs only a few segment operations -- create, conditional
append and read (its own metadata log), info, seal, truncate, delete -- plus the append statistics
the store measures for auto-scaling and the URI where a segment is served.  ``SegmentStore`` names
exactly those; every operation the controller's workflows repeat after a restart is idempotent here
(creating a segment that exists, sealing a sealed one, truncating below the current start, deleting
a missing one all succeed and say so; merging a transaction segment that is merged already does
nothing), so a workflow step may simply be run again.

Segments that hold events.  A stream's segments and reader groups' state segments hold events, so
``LocalSegmentStore`` creates them with the attribute that says so (``event_boundaries``): their
truncations must then land on event boundaries, which ``check_event_boundary`` checks before a
workflow records one.  The controller's own log is not made of events and keeps byte granularity.

``LocalSegmentStore`` implements it over the ``SegmentStoreServer`` of the same node (in process,
same event loop): each call finds the segment's container through the server, so a container that
is restarting (``ContainerUnavailableError``) is waited for with bounded, doubling delays on the
injected clock.  A remote implementation over the client (for a controller on another node) is a
later step; so is asking another node for a segment this node does not own (``WrongHostError``
propagates).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import attrs

from millstream import limits
from millstream.clock import Clock
from millstream.errors import (
    ContainerUnavailableError,
    InternalError,
    InvalidArgumentError,
    StreamSegmentExistsError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
)
from millstream.model.types import AttributeUpdate
from millstream.naming import (
    LEGACY_READER_GROUP_STATE_PREFIX,
    container_of,
    is_hidden_segment,
    parse_stream_segment_name,
)
from millstream.retry import RetryPolicy, retry_bounded
from millstream.segmentstore.event_boundaries import EVENT_SEGMENT_ATTRIBUTES
from millstream.values import ReadResult

__all__ = ["AppendCounts", "LocalSegmentStore", "SegmentState", "SegmentStore", "store_retry_policy"]

_T = TypeVar("_T")


@attrs.frozen
class SegmentState:
    """A segment's length, start offset and whether it is sealed."""

    length: int
    start_offset: int
    sealed: bool


@attrs.frozen
class AppendCounts:
    """What was appended to one segment since the statistics were last drained."""

    bytes: int
    events: int


class SegmentStore(Protocol):
    """The segment operations the controller uses."""

    async def create_segment(self, name: str) -> bool:
        """Create an empty segment; False (and nothing changes) if it exists already."""
        ...

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        """Append ``data`` iff the segment is exactly ``expected_offset`` long (``BadOffsetError``
        otherwise); return the new length."""
        ...

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        """Up to ``max_length`` bytes from ``offset``, without waiting at the tail."""
        ...

    async def get_info(self, name: str) -> SegmentState | None:
        """The segment's state, or None if it does not exist."""
        ...

    async def seal(self, name: str) -> int:
        """Seal the segment (sealing a sealed one succeeds); return its final length.  Raises
        ``StreamSegmentNotExistsError``."""
        ...

    async def truncate(self, name: str, offset: int) -> None:
        """Drop the bytes below ``offset``; nothing happens if the segment already starts there or later.
        Raises ``EventBoundaryError`` for a segment that holds events if no event begins there."""
        ...

    async def check_event_boundary(self, name: str, offset: int) -> None:
        """Return if ``offset`` lies within the segment and, if it holds events, an event begins there;
        else raise ``BadOffsetError`` or its subclass ``EventBoundaryError``.  Changes nothing."""
        ...

    async def delete(self, name: str) -> bool:
        """Delete the segment; False if it did not exist."""
        ...

    async def merge(self, target: str, source: str) -> bool:
        """Seal ``source`` (a hidden segment of ``target``: same container) and append all of it to
        ``target`` in one operation; ``source`` is gone afterwards.  False (nothing changes) if
        ``source`` is gone already -- merged by an earlier attempt, or deleted.  Raises
        ``StreamSegmentSealedError`` if ``target`` is sealed."""
        ...

    def uri_of(self, name: str) -> str:
        """Where clients reach the segment store that serves ``name``."""
        ...

    def container_of(self, name: str) -> int:
        """The container that owns ``name`` (a merge works only within one)."""
        ...

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        """Per segment, what was appended since the last call (and reset the counts)."""
        ...


def store_retry_policy(retryable: tuple[type[Exception], ...],
                       retries_max: int = limits.CONTROLLER_STORE_RETRY_ATTEMPTS_MAX) -> RetryPolicy:
    """How a controller's store retries a segment operation after ``retryable`` errors: the delays of
    ``limits.CONTROLLER_STORE_RETRY_*``, at most ``retries_max`` times."""
    return RetryPolicy(retryable, retries_max=retries_max, delay_seconds=limits.CONTROLLER_STORE_RETRY_DELAY_SECONDS,
                       delay_seconds_max=limits.CONTROLLER_STORE_RETRY_DELAY_SECONDS_MAX)


class _StatisticsSource(Protocol):
    def drain(self) -> dict[str, tuple[int, int]]: ...


class _Container(Protocol):
    async def create_segment(self, name: str, attribute_updates: tuple[AttributeUpdate, ...] = ()) -> None: ...

    async def check_event_boundary(self, name: str, offset: int) -> None: ...

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None) -> int: ...

    async def read(self, name: str, offset: int, max_length: int, *, wait_seconds: float = 0.0) -> ReadResult: ...

    def get_info(self, name: str) -> object: ...

    async def seal(self, name: str) -> int: ...

    async def truncate(self, name: str, offset: int) -> None: ...

    async def delete(self, name: str) -> None: ...

    async def merge(self, target: str, source: str) -> int: ...


class _ServerConfig(Protocol):
    @property
    def container_count(self) -> int: ...


class _Server(Protocol):
    @property
    def uri(self) -> str: ...

    @property
    def config(self) -> _ServerConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def statistics(self) -> _StatisticsSource: ...

    def container_for(self, segment: str) -> _Container: ...


class LocalSegmentStore:
    """``SegmentStore`` over the ``SegmentStoreServer`` of this node (in process)."""

    def __init__(self, server: _Server, *, clock: Clock | None = None,
                 retry_attempts_max: int = limits.CONTROLLER_STORE_RETRY_ATTEMPTS_MAX) -> None:
        self._server = server
        self._clock = clock or server.clock
        self._policy = store_retry_policy((ContainerUnavailableError,), retry_attempts_max)

    async def _with_container(self, name: str, operation: Callable[[_Container], Awaitable[_T]]) -> _T:
        """Run ``operation`` on ``name``'s container, waiting (bounded) while it restarts."""
        return await retry_bounded(lambda: operation(self._server.container_for(name)), self._policy, self._clock)

    async def create_segment(self, name: str) -> bool:
        attributes = EVENT_SEGMENT_ATTRIBUTES if _holds_events(name) else ()

        async def create(container: _Container) -> bool:
            try:
                await container.create_segment(name, attributes)
            except StreamSegmentExistsError:
                return False
            return True
        return await self._with_container(name, create)

    async def check_event_boundary(self, name: str, offset: int) -> None:
        await self._with_container(name, lambda c: c.check_event_boundary(name, offset))

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        async def append(container: _Container) -> int:
            offset = await container.append(name, data, expected_offset=expected_offset)
            return offset + len(data)
        return await self._with_container(name, append)

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        return await self._with_container(name, lambda c: c.read(name, offset, max_length))

    async def get_info(self, name: str) -> SegmentState | None:
        async def info(container: _Container) -> SegmentState | None:
            try:
                found = container.get_info(name)
            except StreamSegmentNotExistsError:
                return None
            return SegmentState(found.length, found.start_offset, found.sealed)  # type: ignore[attr-defined]
        return await self._with_container(name, info)

    async def seal(self, name: str) -> int:
        async def seal(container: _Container) -> int:
            with contextlib.suppress(StreamSegmentSealedError):
                return await container.seal(name)
            return int(container.get_info(name).length)  # type: ignore[attr-defined]
        return await self._with_container(name, seal)

    async def truncate(self, name: str, offset: int) -> None:
        async def truncate(container: _Container) -> None:
            if container.get_info(name).start_offset < offset:  # type: ignore[attr-defined]
                await container.truncate(name, offset)
        await self._with_container(name, truncate)

    async def delete(self, name: str) -> bool:
        async def delete(container: _Container) -> bool:
            try:
                await container.delete(name)
            except StreamSegmentNotExistsError:
                return False
            return True
        return await self._with_container(name, delete)

    async def merge(self, target: str, source: str) -> bool:
        if self.container_of(source) != self.container_of(target):  # else "missing" would read as "merged"
            raise InternalError(f"{source!r} and {target!r} live in different containers: they cannot be merged")

        async def merge(container: _Container) -> bool:
            container.get_info(target)  # a missing target is an error, never "merged already"
            try:
                sealed = container.get_info(source).sealed  # type: ignore[attr-defined]
            except StreamSegmentNotExistsError:  # merged (its subclass) or deleted: nothing left to merge
                return False
            if not sealed:
                with contextlib.suppress(StreamSegmentSealedError):
                    await container.seal(source)
            try:
                await container.merge(target, source)
            except StreamSegmentMergedError:  # a concurrent attempt merged it meanwhile
                return False
            return True
        return await self._with_container(target, merge)

    def uri_of(self, name: str) -> str:
        return self._server.uri

    def container_of(self, name: str) -> int:
        return container_of(name, self._server.config.container_count)

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        return {name: AppendCounts(size, events) for name, (size, events) in self._server.statistics.drain().items()}


def _holds_events(name: str) -> bool:
    """Whether the controller's segment ``name`` holds events: a stream's segment, or a reader
    group's state segment (records framed as events); not its own metadata log."""
    if name.startswith(LEGACY_READER_GROUP_STATE_PREFIX):
        return True
    if is_hidden_segment(name):
        return False  # (a transaction's segment: merged whole into its parent, never truncated)
    try:
        parse_stream_segment_name(name)
    except InvalidArgumentError:
        return False
    return True
