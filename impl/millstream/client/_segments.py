"""Segment operations over the wire: administration, attributes, reads and conditional appends.

Theory of operation.  Each operation finds the segment's server (``SegmentLocator``), takes a shared
connection (retrying the *connect* with backoff), sends one request and maps the reply: the expected
reply becomes the return value, an error reply the typed error the contract names (``_replies``).
Operations that change nothing, or whose repetition changes nothing more (info, get-attribute, read,
seal, truncate), are re-sent after a broken connection, within the same bounded backoff; the others
(create, delete, merge, attribute compare-and-set, conditional append) are not -- their outcome is
unknown after a broken connection, and ``ConnectionLostError`` says so.

Conditional appends need an append session: each segment gets a writer id of its own the first time,
set up (``SetupAppend``) once per connection; its event number grows by one per conditional append.
A failed condition (``ConditionalCheckFailed``) raises ``BadOffsetError`` and leaves the session set up.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar
from uuid import UUID

import attrs

from millstream import limits
from millstream.client._config import Backoff, RandomSource, random_uuid
from millstream.client._connection import Connection
from millstream.client._pool import ConnectionPool, SegmentLocator
from millstream.client._replies import expect
from millstream.errors import (
    ConnectionLostError,
    ContainerUnavailableError,
    InvalidArgumentError,
    PayloadTooLargeError,
    ProtocolError,
    RetryableError,
    StreamSegmentNotExistsError,
    WrongHostError,
)
from millstream.model.types import ATTRIBUTE_ID_MAX, INT64_MAX, INT64_MIN, NULL_ATTRIBUTE_VALUE
from millstream.values import ReadResult
from millstream.wire import codec
from millstream.wire.commands import (
    AppendSetup,
    Command,
    ConditionalAppend,
    CreateSegment,
    DataAppended,
    DeleteSegment,
    EventBoundaries,
    GetEventBoundaries,
    GetSegmentAttribute,
    GetSegmentInfo,
    MergeSegments,
    ReadSegment,
    SealSegment,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
)

__all__ = ["AsyncSegments", "SegmentProperties", "validate_segment_name"]

_Reply = TypeVar("_Reply", bound=Command)
_T = TypeVar("_T")

_WAIT_MS_MAX: Final = int(limits.TAIL_READ_WAIT_SECONDS_MAX * 1000)


@attrs.frozen
class SegmentProperties:
    """A segment's state as its server reports it.  ``last_modified_ms``: milliseconds since the Unix
    epoch by the server's clock."""

    name: str
    length: int
    start_offset: int
    sealed: bool
    last_modified_ms: int


def validate_segment_name(segment: str) -> str:
    """``segment`` if it is a non-empty name within ``limits.SEGMENT_NAME_LENGTH_BYTES_MAX``; else
    ``InvalidArgumentError``."""
    if not isinstance(segment, str) or not segment:
        raise InvalidArgumentError(f"a segment name is a non-empty str, not {segment!r}")
    try:
        encoded = segment.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"segment name {segment!r} is not valid Unicode text") from None
    if len(encoded) > limits.SEGMENT_NAME_LENGTH_BYTES_MAX:
        raise InvalidArgumentError(
            f"a segment name may hold {limits.SEGMENT_NAME_LENGTH_BYTES_MAX} UTF-8 bytes, not {len(encoded)}")
    return segment


def _offset(value: int, what: str = "offset") -> int:
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise InvalidArgumentError(f"{what} must be a non-negative int, not {value!r}")
    return value


def _attribute_id(value: int) -> int:
    if type(value) is not int or not 0 <= value <= ATTRIBUTE_ID_MAX:
        raise InvalidArgumentError(f"an attribute id is an int in [0, 2**128), not {value!r}")
    return value


def _attribute_value(value: int | None, what: str) -> int:
    if value is None:
        return NULL_ATTRIBUTE_VALUE
    if type(value) is not int or not INT64_MIN < value <= INT64_MAX:
        raise InvalidArgumentError(f"{what} must be None or a 64-bit int above {INT64_MIN}, not {value!r}")
    return value


class _ConditionalSession:
    """The append session one segment's conditional appends use."""

    __slots__ = ("connection", "event_number", "lock", "writer_id")

    def __init__(self, writer_id: UUID) -> None:
        self.writer_id = writer_id
        self.event_number = 0
        self.connection: Connection | None = None
        self.lock = asyncio.Lock()


class AsyncSegments:
    """Operations on segments by name.  Made by ``AsyncClient.segments()``."""

    def __init__(self, *, pool: ConnectionPool, locator: SegmentLocator, token: str, rng: RandomSource) -> None:
        self._pool = pool
        self._locator = locator
        self._token = token
        self._rng = rng
        self._conditional: dict[str, _ConditionalSession] = {}

    # --- The request path --------------------------------------------------------------------------

    async def _connection(self, segment: str) -> Connection:
        return await self._pool.acquire_with_retry(await self._locator.endpoint_for(segment))

    async def _call(self, segment: str, build: Callable[[int], Command], kind: type[_Reply], *,
                    what: str, wait_seconds: float = 0.0, idempotent: bool = False) -> _Reply:
        """Send ``build(request_id)`` for ``segment``; return the ``kind`` reply or raise its error."""
        async def once() -> _Reply:
            # An idempotent request is retried as a whole (below); any other retries only connecting.
            endpoint = await self._locator.endpoint_for(segment)
            try:
                connection = await (self._pool.acquire(endpoint) if idempotent
                                    else self._pool.acquire_with_retry(endpoint))
                reply = await connection.request(build, what=what, wait_seconds=wait_seconds)
            except ConnectionLostError:
                # Its host died or its container moved (in a cluster): ask again where it lives.
                self._locator.forget(segment)
                raise
            try:
                return expect(reply, kind)
            except WrongHostError:
                self._locator.forget(segment)
                raise
        if not idempotent:
            return await once()
        return await self._pool.retrying(once, what=what)

    # --- Administration ----------------------------------------------------------------------------

    async def create(self, segment: str) -> None:
        """Create an empty segment.  Raises ``StreamSegmentExistsError`` if it exists."""
        validate_segment_name(segment)
        await self._call(segment, lambda rid: CreateSegment(rid, segment, self._token), SegmentCreated,
                         what=f"create {segment!r}")

    async def info(self, segment: str) -> SegmentProperties:
        """The segment's length, start offset and whether it is sealed.  Raises
        ``StreamSegmentNotExistsError`` if it does not exist."""
        reply = await self._info(segment)
        if not reply.exists or reply.deleted:
            raise StreamSegmentNotExistsError(f"segment {segment!r} does not exist")
        return SegmentProperties(segment, reply.length, reply.start_offset, reply.sealed, reply.last_modified)

    async def exists(self, segment: str) -> bool:
        """Whether the segment exists (and was not deleted)."""
        reply = await self._info(segment)
        return reply.exists and not reply.deleted

    async def _info(self, segment: str) -> SegmentInfo:
        validate_segment_name(segment)
        return await self._call(segment, lambda rid: GetSegmentInfo(rid, segment, self._token), SegmentInfo,
                                what=f"info of {segment!r}", idempotent=True)

    async def seal(self, segment: str) -> None:
        """Seal the segment: it takes no more appends.  Sealing a sealed segment succeeds.  Raises
        ``StreamSegmentNotExistsError``."""
        validate_segment_name(segment)
        await self._call(segment, lambda rid: SealSegment(rid, segment, self._token), SegmentSealed,
                         what=f"seal {segment!r}", idempotent=True)

    async def truncate(self, segment: str, offset: int) -> None:
        """Drop the segment's bytes below ``offset``.  Raises ``BadOffsetError`` if ``offset`` lies
        outside [start offset, length] or -- in a segment of events (any but a byte stream's) -- if no
        event begins there, ``StreamSegmentNotExistsError``."""
        validate_segment_name(segment)
        _offset(offset)
        await self._call(segment, lambda rid: TruncateSegment(rid, segment, offset, self._token), SegmentTruncated,
                         what=f"truncate {segment!r} at {offset}", idempotent=True)

    async def delete(self, segment: str) -> None:
        """Delete the segment.  Raises ``StreamSegmentNotExistsError``."""
        validate_segment_name(segment)
        await self._call(segment, lambda rid: DeleteSegment(rid, segment, self._token), SegmentDeleted,
                         what=f"delete {segment!r}")

    async def merge(self, target: str, source: str) -> int:
        """Seal ``source`` (if it is not sealed yet), append it to ``target`` and remove it; return
        ``target``'s new length."""
        validate_segment_name(target)
        validate_segment_name(source)
        reply = await self._call(target, lambda rid: MergeSegments(rid, target, source, self._token), SegmentsMerged,
                                 what=f"merge {source!r} into {target!r}")
        return reply.new_target_length

    # --- Attributes --------------------------------------------------------------------------------

    async def get_attribute(self, segment: str, attribute_id: int) -> int | None:
        """The attribute's value, or None if the segment does not hold it."""
        validate_segment_name(segment)
        _attribute_id(attribute_id)
        reply = await self._call(segment, lambda rid: GetSegmentAttribute(rid, segment, attribute_id, self._token),
                                 SegmentAttribute, what=f"attribute of {segment!r}", idempotent=True)
        return None if reply.value == NULL_ATTRIBUTE_VALUE else reply.value

    async def stored_event_number_once_sealed(self, segment: str, writer_id: UUID) -> int:
        """What sealed ``segment`` stores for ``writer_id``: its writer-id attribute (0: nothing), read
        once the seal is visible.  An append is refused as sealed as soon as the seal is queued in the
        segment's container, possibly while an append queued before it (sent on the writer's previous
        connection) is still on its way to Tier 1; the attribute is final only once the seal has
        committed, since nothing commits after it -- usually a Tier-1 write away, so the first polls
        come quickly.  Polls (and asks again after a retryable error, such as a container restarting)
        with a bounded backoff (``CLIENT_SEAL_VISIBLE_POLL*`` in limits); raises ``ContainerUnavailableError``
        (retryable: the outcome of the writer's unacknowledged events is unknown) if that runs out --
        the seal may never become visible if its container lost it in a crash."""
        config = self._pool.config
        backoff = Backoff(initial_seconds=min(limits.CLIENT_SEAL_VISIBLE_POLL_INITIAL_SECONDS,
                                              config.reconnect_delay_max_seconds),
                          maximum_seconds=config.reconnect_delay_max_seconds,
                          attempts_max=limits.CLIENT_SEAL_VISIBLE_POLLS_MAX, rng=self._rng)
        for attempt in itertools.count(1):
            try:
                if (await self.info(segment)).sealed:
                    stored = await self.get_attribute(segment, writer_id.int)
                    return 0 if stored is None else stored
                reason = "its seal is not visible yet"
            except RetryableError as error:  # e.g. the container is restarting: ask again
                reason = str(error)
            delay = backoff.delay(attempt)
            if delay is None:
                raise ContainerUnavailableError(
                    f"segment {segment!r} refused an append as sealed, but what it stores for writer {writer_id} "
                    f"could not be read after {attempt} attempts: {reason}")
            await self._pool.clock.sleep(delay)
        raise AssertionError("unreachable")  # itertools.count does not end

    async def update_attribute(self, segment: str, attribute_id: int, new_value: int | None, *,
                               expected_value: int | None) -> bool:
        """Compare-and-set: set the attribute to ``new_value`` (None: remove it) if it now holds
        ``expected_value`` (None: absent).  Returns whether it did."""
        validate_segment_name(segment)
        _attribute_id(attribute_id)
        new = _attribute_value(new_value, "new_value")
        expected = _attribute_value(expected_value, "expected_value")
        reply = await self._call(
            segment, lambda rid: UpdateSegmentAttribute(rid, segment, attribute_id, new, expected, self._token),
            SegmentAttributeUpdated, what=f"update an attribute of {segment!r}")
        return reply.success

    # --- Reads -------------------------------------------------------------------------------------

    async def read(self, segment: str, offset: int, *, length: int | None = None,
                   wait_seconds: float = 0.0) -> ReadResult:
        """Up to ``length`` bytes (default: the config's read size; the server caps it at
        ``limits.READ_LENGTH_BYTES_MAX``) from ``offset``.  At the tail of an unsealed segment the server
        waits up to ``wait_seconds`` (at most ``limits.TAIL_READ_WAIT_SECONDS_MAX``) for data before
        answering, maybe with no data.  Raises ``StreamSegmentTruncatedError`` below the start offset,
        ``BadOffsetError`` beyond the length, ``StreamSegmentNotExistsError``."""
        validate_segment_name(segment)
        _offset(offset)
        length = self._pool.config.read_length_bytes if length is None else length
        if type(length) is not int or not 0 < length <= limits.READ_LENGTH_BYTES_MAX:
            raise InvalidArgumentError(f"length must be in (0, {limits.READ_LENGTH_BYTES_MAX}], not {length!r}")
        if not isinstance(wait_seconds, (int, float)) or not wait_seconds >= 0:
            raise InvalidArgumentError(f"wait_seconds must be >= 0, not {wait_seconds!r}")
        wait_ms = min(int(wait_seconds * 1000), _WAIT_MS_MAX)
        reply = await self._call(
            segment, lambda rid: ReadSegment(rid, segment, offset, length, self._token, wait_ms), SegmentRead,
            what=f"read {segment!r} at {offset}", wait_seconds=wait_ms / 1000, idempotent=True)
        if reply.offset != offset:
            raise ProtocolError(f"asked to read {segment!r} at {offset}, the server answered from {reply.offset}")
        return ReadResult(reply.offset, reply.data, reply.at_tail, reply.end_of_segment)

    async def read_following_moves(self, segment: str, offset: int, *, length: int | None = None,
                                   wait_seconds: float = 0.0) -> ReadResult:
        """``read``, retried while the segment's container moves or recovers: after ``WrongHostError``
        or ``ContainerUnavailableError`` (a cluster node stopping it, or a new owner still recovering
        it) the client asks again where the segment lives and reads there, with the reconnect backoff,
        within one reconnect budget (``ReconnectBudgetExceededError`` after it, from the last error).
        Readers use it: a reader group must follow containers that move.  Raises what ``read`` raises
        otherwise."""
        return await self.following_moves(
            segment, lambda: self.read(segment, offset, length=length, wait_seconds=wait_seconds),
            what=f"read {segment!r} at {offset}")

    async def following_moves(self, segment: str, attempt: Callable[[], Awaitable[_T]], *, what: str,
                              retry_on: tuple[type[Exception], ...] = (WrongHostError, ContainerUnavailableError),
                              ) -> _T:
        """Await ``attempt()`` (an operation on ``segment``), again after a failure in ``retry_on``
        (``WrongHostError`` or ``ContainerUnavailableError`` by default: its container moved or is
        recovering; retry only what is safe to repeat), asking each time anew where the segment lives,
        with the reconnect backoff, within one reconnect budget (``ReconnectBudgetExceededError`` after
        it, from the last error)."""
        async def once() -> _T:
            try:
                return await attempt()
            except (WrongHostError, ContainerUnavailableError):
                self._locator.forget(segment)
                raise
        return await self._pool.retrying(once, retry_on=retry_on, what=what)

    async def event_boundaries(self, segment: str, start_offset: int, end_offset: int) -> tuple[int, ...]:
        """Offsets in ``[start_offset, end_offset]`` of ``segment`` (a segment of events: a stream's, or
        one an event writer writes) where the server knows an event begins or the segment ends,
        ascending, without reading the bytes: the segment's start offset and length if they lie in the
        range, and the entries of its sparse index, about one per
        ``limits.EVENT_BOUNDARY_INDEX_SPACING_BYTES`` of appends (more bytes apart in long segments).
        Not every boundary: a whole event may lie between two of them.  At most
        ``limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX``, the lowest (ask again from the last for more).
        Raises ``InvalidArgumentError`` if ``start_offset > end_offset`` (or either is not a
        non-negative int) or the segment does not hold events, ``StreamSegmentNotExistsError``."""
        validate_segment_name(segment)
        _offset(start_offset, "start_offset")
        _offset(end_offset, "end_offset")
        if start_offset > end_offset:
            raise InvalidArgumentError(f"start_offset {start_offset} lies beyond end_offset {end_offset}")
        reply = await self._call(
            segment, lambda rid: GetEventBoundaries(rid, segment, start_offset, end_offset, self._token),
            EventBoundaries, what=f"event boundaries of {segment!r}", idempotent=True)
        try:
            offsets = codec.decode_offsets(reply.offsets)
        except codec.MalformedFrameError as error:
            raise ProtocolError(f"the event boundaries of {segment!r}: {error}") from None
        if len(offsets) > limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX or any(
                not start_offset <= offset <= end_offset for offset in offsets):
            raise ProtocolError(f"asked for at most {limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX} event boundaries of "
                                f"{segment!r} in [{start_offset}, {end_offset}], the server answered {len(offsets)} "
                                "from outside it")
        return offsets

    # --- Conditional appends -----------------------------------------------------------------------

    async def conditional_append(self, segment: str, events: Sequence[bytes], *, expected_offset: int) -> int:
        """Append ``events`` (each framed as an event) if and only if the segment is exactly
        ``expected_offset`` bytes long; return its new length.  Raises ``BadOffsetError`` if its length
        differs (nothing appended), ``StreamSegmentSealedError``, ``StreamSegmentNotExistsError``,
        ``ConnectionLostError`` or ``ContainerUnavailableError`` if the outcome is unknown, ``WrongHostError``
        if its container moved (nothing appended; the next call asks where it lives now)."""
        validate_segment_name(segment)
        _offset(expected_offset, "expected_offset")
        if isinstance(events, (bytes, bytearray, memoryview)) or not events:
            raise InvalidArgumentError("events is a non-empty sequence of bytes payloads")
        for payload in events:
            if len(payload) > limits.EVENT_LENGTH_BYTES_MAX:
                raise PayloadTooLargeError(f"an event of {len(payload)} bytes exceeds "
                                           f"{limits.EVENT_LENGTH_BYTES_MAX} bytes")
        data = b"".join(codec.encode_event(payload) for payload in events)
        session = self._conditional.get(segment)
        if session is None:
            session = self._conditional[segment] = _ConditionalSession(random_uuid(self._rng))
        async with session.lock:
            connection = await self._connection(segment)
            try:
                if session.connection is not connection or not connection.is_open:
                    session.connection = None
                    setup = await connection.request(
                        lambda rid: SetupAppend(rid, session.writer_id, segment, self._token),
                        what=f"set up conditional appends to {segment!r}")
                    stored = expect(setup, AppendSetup).last_event_number
                    if stored != NULL_ATTRIBUTE_VALUE:
                        session.event_number = max(session.event_number, stored)
                    session.connection = connection
                session.event_number += 1
                number = session.event_number
                reply = await connection.request(
                    lambda rid: ConditionalAppend(session.writer_id, number, expected_offset, data, rid),
                    what=f"conditional append to {segment!r}")
                return expect(reply, DataAppended).current_segment_write_offset
            except (WrongHostError, ContainerUnavailableError):
                # Its container moved (or is recovering): ask again where it lives, set up again there.
                self._locator.forget(segment)
                session.connection = None
                raise
