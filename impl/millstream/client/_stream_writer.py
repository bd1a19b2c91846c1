"""The stream-aware writer's dialogue with the controller: a stream's segments, a sealed segment's
successors, and what a sealed segment stores for a writer.

Theory of operation.  ``AsyncClient.event_writer("scope/stream", serializer)`` builds an
``AsyncEventStreamWriter`` (``_writer``) bound to the stream by a ``ControllerStreamBinding``.  The
writer itself does the routing and the hand-over; the binding answers its three questions:

* ``current_segments`` -- the segments of the stream's current epoch, from ``get_stream`` (which also
  says whether the stream is sealed: such a stream takes no writer, ``StreamSealedError``);
* ``stored_event_number`` -- the writer-id attribute of a sealed segment, read from the segment store
  that serves it once the seal is visible there (the store keeps it with the data, so it then says
  exactly which of the writer's events the segment holds; ``AsyncSegments.stored_event_number_once_sealed``);
* ``history`` and ``stored_sequence`` (a writer with a stable id, ``_sequenced_writer``): every segment
  from the stream's head (``get_segments_between``), and a segment's writer-id attribute as it is now;
* ``successors`` -- ``get_successors``.  The controller records a scale's new epoch before it seals
  the predecessors, so a segment sealed by a scale always has successors by the time a writer meets
  its seal.  None means the stream was sealed as a whole (``get_stream`` confirms it:
  ``StreamSealedError``) or the segment was sealed behind the controller's back
  (``StreamSegmentSealedError``: nothing the writer can do about it).

Segments are found where the controller says they are served (``ControllerSegmentLocator``), so a
successor on another segment store is reached on a connection of its own.  Queries are retried by
``ControllerClient`` after a broken connection, within the pool's bounded backoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar
from uuid import UUID

from millstream.client._config import ClientConfig, RandomSource
from millstream.client._controller import ControllerClient, ControllerSegmentLocator
from millstream.client._pool import ConnectionPool
from millstream.client._segments import AsyncSegments
from millstream.client._sequenced_writer import SequencedWriterCore
from millstream.client._serializers import Serializer
from millstream.client._streams import SegmentWithRange, split_stream_name
from millstream.client._writer import AsyncEventStreamWriter
from millstream.errors import StreamSealedError, StreamSegmentSealedError

__all__ = ["ControllerStreamBinding", "sequenced_stream_writer", "stream_event_writer"]

T = TypeVar("T")

#: ``StreamDescription.state`` values of a stream that takes no more writes.
_SEALED_STATES = frozenset({"sealing", "sealed"})


class ControllerStreamBinding:
    """A stream writer's ``StreamBinding``: answers from the controller and the segment store."""

    def __init__(self, stream: str, *, controller: ControllerClient, segments: AsyncSegments) -> None:
        self._scope, self._name = split_stream_name(stream)
        self._stream = stream
        self._controller = controller
        self._segments = segments

    @property
    def stream(self) -> str:
        return self._stream

    async def current_segments(self) -> Sequence[SegmentWithRange]:
        description = await self._controller.get_stream(self._scope, self._name)
        if description.sealed or description.state in _SEALED_STATES:
            raise StreamSealedError(f"stream {self._stream} is sealed: it takes no more events")
        return description.segments

    async def stored_event_number(self, segment: str, writer_id: UUID) -> int:
        return await self._segments.stored_event_number_once_sealed(segment, writer_id)

    async def history(self) -> Sequence[SegmentWithRange]:
        """Every segment from the stream's head, of every epoch (a writer with a stable id's floors)."""
        slices = await self._controller.get_segments_between(self._scope, self._name, None, None)
        return [s.segment for s in slices]

    async def stored_sequence(self, segment: str, writer_id: UUID) -> int:
        stored = await self._segments.get_attribute(segment, writer_id.int)
        return 0 if stored is None else stored

    async def successors(self, sealed: SegmentWithRange) -> Sequence[SegmentWithRange]:
        found = await self._controller.get_successors(self._scope, self._name, sealed.segment_id)
        if found:
            return [successor.segment for successor in found]
        description = await self._controller.get_stream(self._scope, self._name)
        if description.sealed or description.state in _SEALED_STATES:
            raise StreamSealedError(f"stream {self._stream} was sealed: it takes no more events (segment "
                                    f"{sealed.name!r} was sealed with it)")
        raise StreamSegmentSealedError(f"segment {sealed.name!r} of stream {self._stream} was sealed, but not by a "
                                       "scale of the stream: it has no successors to write to")

    def __repr__(self) -> str:
        return f"ControllerStreamBinding({self._stream!r})"


def stream_event_writer(stream: str, serializer: Serializer[T], *, pool: ConnectionPool, controller: ControllerClient,
                        token: str, config: ClientConfig, rng: RandomSource) -> AsyncEventStreamWriter[T]:
    """A writer of ``stream`` (``"scope/stream"``; ``InvalidArgumentError`` for a malformed name).  It
    asks the controller for the stream's segments on its first call (``ready``)."""
    split_stream_name(stream)
    locator = ControllerSegmentLocator(controller)
    segments = AsyncSegments(pool=pool, locator=locator, token=token, rng=rng)
    binding = ControllerStreamBinding(stream, controller=controller, segments=segments)
    return AsyncEventStreamWriter(pool=pool, locator=locator, router=None, serializer=serializer, token=token,
                                  config=config, rng=rng, stream=binding)


def sequenced_stream_writer(stream: str, serializer: Serializer[T], *, writer_id: str, pool: ConnectionPool,
                            controller: ControllerClient, token: str, config: ClientConfig,
                            rng: RandomSource) -> SequencedWriterCore[T]:
    """A writer of ``stream`` with the stable writer id ``writer_id`` (``_sequenced_writer``);
    ``InvalidArgumentError`` for a malformed stream name or writer id.  It learns the stream and its
    floors on ``ready``."""
    split_stream_name(stream)
    locator = ControllerSegmentLocator(controller)
    segments = AsyncSegments(pool=pool, locator=locator, token=token, rng=rng)
    binding = ControllerStreamBinding(stream, controller=controller, segments=segments)
    return SequencedWriterCore(pool=pool, locator=locator, serializer=serializer, token=token, config=config, rng=rng,
                               stream=binding, writer_id=writer_id)
