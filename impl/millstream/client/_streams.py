"""Streams from the client's side: the ``StreamManager`` that administers scopes and streams
through the controller.

Theory of operation.  The values a stream is described by -- configurations, stream cuts, segments
with key ranges, reader-group configurations -- are the neutral ``millstream.values`` (the
controller and the server use the same ones); they are re-exported here, where the client's modules
and users have always imported them.  The ``AsyncStreamManager`` / ``StreamManager`` pair turns a
user's calls into controller calls (``ControllerClient``, ``_controller``): it validates arguments
(``InvalidArgumentError``) before anything is sent.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from millstream import limits
from millstream.errors import (
    InvalidArgumentError,
    ScopeExistsError,
    ScopeNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
)
from millstream.values import (
    ReaderGroupConfig,
    ReaderGroupInfo,
    RetentionPolicy,
    ScalingPolicy,
    SegmentSlice,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamSegments,
    SuccessorSegment,
    _int,
    canonical_json,
    split_stream_name,
)

if TYPE_CHECKING:
    from millstream.client._controller import ControllerClient

__all__ = [
    "AsyncStreamManager",
    "ReaderGroupConfig",
    "ReaderGroupInfo",
    "RetentionPolicy",
    "ScalingPolicy",
    "SegmentSlice",
    "SegmentWithRange",
    "StreamConfig",
    "StreamCut",
    "StreamDescription",
    "StreamManager",
    "StreamSegments",
    "SuccessorSegment",
    "canonical_json",
    "split_stream_name",
]

R = TypeVar("R")

# --- The stream manager ----------------------------------------------------------------------------


class AsyncStreamManager:
    """Administration of scopes and streams (asyncio).  Made by ``AsyncClient.stream_manager()``.

    Streams are named ``"scope/stream"``.  Errors: ``ScopeNotFoundError``, ``StreamNotFoundError``,
    ``ScopeExistsError``/``StreamExistsError`` (unless ``exist_ok``), ``StreamSealedError``,
    ``StreamNotSealedError``, ``InvalidScaleError``, ``InvalidStreamCutError``,
    ``InvalidArgumentError`` for malformed arguments; ``ConnectionLostError`` when a change's outcome
    is unknown (reads and idempotent changes are retried)."""

    def __init__(self, controller: ControllerClient) -> None:
        self._controller = controller

    @property
    def controller(self) -> ControllerClient:
        """The low-level controller client this manager calls."""
        return self._controller

    async def create_scope(self, scope: str, *, exist_ok: bool = False) -> bool:
        """Create ``scope``; True if it was created, False if it existed (with ``exist_ok``)."""
        try:
            await self._controller.create_scope(scope)
        except ScopeExistsError:
            if not exist_ok:
                raise
            return False
        return True

    async def delete_scope(self, scope: str, *, missing_ok: bool = False) -> bool:
        """Delete an empty scope; True if it was deleted, False if it did not exist (``missing_ok``)."""
        try:
            await self._controller.delete_scope(scope)
        except ScopeNotFoundError:
            if not missing_ok:
                raise
            return False
        return True

    async def list_scopes(self) -> list[str]:
        return await self._controller.list_scopes()

    async def create_stream(self, stream: str, config: StreamConfig | None = None, *, exist_ok: bool = False) -> bool:
        """Create ``"scope/stream"`` with ``config`` (default: one fixed segment, keep everything);
        True if created, False if it existed (with ``exist_ok``; its configuration is left as it is)."""
        scope, name = split_stream_name(stream)
        try:
            await self._controller.create_stream(scope, name, config or StreamConfig())
        except StreamExistsError:
            if not exist_ok:
                raise
            return False
        return True

    async def update_stream(self, stream: str, config: StreamConfig) -> None:
        """Replace the stream's configuration (its current segments stay; auto-scaling follows the new
        policy from now on)."""
        await self._controller.update_stream(*split_stream_name(stream), config)

    async def describe_stream(self, stream: str) -> StreamDescription:
        return await self._controller.get_stream(*split_stream_name(stream))

    async def list_streams(self, scope: str) -> list[str]:
        """The names of the streams of ``scope`` (without the scope)."""
        return await self._controller.list_streams(scope)

    async def current_segments(self, stream: str) -> StreamSegments:
        return await self._controller.get_current_segments(*split_stream_name(stream))

    async def seal_stream(self, stream: str) -> None:
        """Seal the stream: every segment is sealed, no more writes.  Sealing a sealed stream succeeds."""
        await self._controller.seal_stream(*split_stream_name(stream))

    async def delete_stream(self, stream: str, *, missing_ok: bool = False) -> bool:
        """Delete a sealed stream and all its data; True if deleted, False if it did not exist
        (``missing_ok``).  Raises ``StreamNotSealedError`` for a stream that is not sealed."""
        try:
            await self._controller.delete_stream(*split_stream_name(stream))
        except StreamNotFoundError:
            if not missing_ok:
                raise
            return False
        return True

    async def scale_stream(self, stream: str, seal: Sequence[int],
                           new_ranges: Sequence[tuple[float, float]]) -> int:
        """Seal the segments ``seal`` (ids in the current epoch) and replace them with new segments
        owning ``new_ranges``, whose union must be exactly the union of the sealed ones' ranges;
        return the new epoch."""
        return await self._controller.scale_stream(*split_stream_name(stream), seal, new_ranges)

    async def split_segment(self, stream: str, segment_id: int, parts: int = 2) -> int:
        """Split one segment of the current epoch into ``parts`` equal key ranges; return the new epoch."""
        _int(parts, "parts", low=2, high=limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX)
        current = await self.current_segments(stream)
        segment = next((s for s in current.segments if s.segment_id == segment_id), None)
        if segment is None:
            return await self.scale_stream(stream, [segment_id], [(0.0, 1.0)])  # the controller says why not
        width = segment.key_end - segment.key_start
        bounds = [segment.key_start + width * index / parts for index in range(parts)] + [segment.key_end]
        return await self.scale_stream(stream, [segment_id], list(itertools.pairwise(bounds)))

    async def merge_segments(self, stream: str, segment_ids: Sequence[int]) -> int:
        """Merge adjacent segments of the current epoch into one; return the new epoch."""
        current = await self.current_segments(stream)
        chosen = [s for s in current.segments if s.segment_id in set(segment_ids)]
        if len(chosen) != len(set(segment_ids)) or len(chosen) < 2:
            low, high = 0.0, 1.0  # (the controller names the unknown ids)
        else:
            low, high = chosen[0].key_start, chosen[-1].key_end
        return await self.scale_stream(stream, list(segment_ids), [(low, high)])

    async def truncate_stream(self, stream: str, cut: StreamCut) -> None:
        """Drop everything before ``cut`` (a cut of this stream at or after its head, each offset
        where an event begins: else ``InvalidStreamCutError``, and nothing changes)."""
        if not isinstance(cut, StreamCut):
            raise InvalidArgumentError(f"cut must be a StreamCut, not {cut!r}")
        await self._controller.truncate_stream(*split_stream_name(stream), cut)

    async def head_cut(self, stream: str) -> StreamCut:
        """Where the stream now begins (after any truncation)."""
        return await self._controller.get_head_cut(*split_stream_name(stream))

    async def tail_cut(self, stream: str) -> StreamCut:
        """Where the stream now ends."""
        return await self._controller.get_tail_cut(*split_stream_name(stream))

    async def cut_at(self, stream: str, time: float) -> StreamCut:
        """The newest tail cut the controller recorded at or before ``time`` (seconds on the
        controller's clock, the Unix epoch by default), or the head if none."""
        return await self._controller.get_cut_at(*split_stream_name(stream), time)

    # --- Ranges of a stream (what a bounded reader -- a batch job, a Spark micro-batch -- reads) ----

    async def segments_between(self, stream: str, start: StreamCut | None = None,
                               end: StreamCut | None = None) -> list[SegmentSlice]:
        """Every segment with events between cut ``start`` (None: the head) and cut ``end`` (None: no
        end), ordered by epoch then key: for each, the offsets to read between (``end_offset`` None:
        the segment is still open and ``end`` does not bound it) and its predecessors in the same
        range (read those first to keep each routing key's order).  Raises ``InvalidStreamCutError``
        (a cut of another stream, one before the head, or ``end`` before ``start``)."""
        for name, cut in (("start", start), ("end", end)):
            if cut is not None and not isinstance(cut, StreamCut):
                raise InvalidArgumentError(f"{name} must be a StreamCut or None, not {cut!r}")
        return await self._controller.get_segments_between(*split_stream_name(stream), start, end)

    async def check_cut(self, stream: str, cut: StreamCut) -> None:
        """Return if ``cut`` is a position of ``stream`` now (a cut of it, at or after its head, each
        offset where an event begins); else raise ``InvalidStreamCutError`` saying why."""
        if not isinstance(cut, StreamCut):
            raise InvalidArgumentError(f"cut must be a StreamCut, not {cut!r}")
        await self._controller.check_stream_cut(*split_stream_name(stream), cut)


class StreamManager:
    """Blocking administration of scopes and streams (see ``AsyncStreamManager`` for each method's
    errors).  Made by ``Client.stream_manager()``."""

    def __init__(self, core: AsyncStreamManager, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._core = core
        self._run = run

    @property
    def core(self) -> AsyncStreamManager:
        return self._core

    def create_scope(self, scope: str, *, exist_ok: bool = False) -> bool:
        return bool(self._run(self._core.create_scope(scope, exist_ok=exist_ok)))

    def delete_scope(self, scope: str, *, missing_ok: bool = False) -> bool:
        return bool(self._run(self._core.delete_scope(scope, missing_ok=missing_ok)))

    def list_scopes(self) -> list[str]:
        result: list[str] = self._run(self._core.list_scopes())
        return result

    def create_stream(self, stream: str, config: StreamConfig | None = None, *, exist_ok: bool = False) -> bool:
        return bool(self._run(self._core.create_stream(stream, config, exist_ok=exist_ok)))

    def update_stream(self, stream: str, config: StreamConfig) -> None:
        self._run(self._core.update_stream(stream, config))

    def describe_stream(self, stream: str) -> StreamDescription:
        result: StreamDescription = self._run(self._core.describe_stream(stream))
        return result

    def list_streams(self, scope: str) -> list[str]:
        result: list[str] = self._run(self._core.list_streams(scope))
        return result

    def current_segments(self, stream: str) -> StreamSegments:
        result: StreamSegments = self._run(self._core.current_segments(stream))
        return result

    def seal_stream(self, stream: str) -> None:
        self._run(self._core.seal_stream(stream))

    def delete_stream(self, stream: str, *, missing_ok: bool = False) -> bool:
        return bool(self._run(self._core.delete_stream(stream, missing_ok=missing_ok)))

    def scale_stream(self, stream: str, seal: Sequence[int], new_ranges: Sequence[tuple[float, float]]) -> int:
        result: int = self._run(self._core.scale_stream(stream, seal, new_ranges))
        return result

    def split_segment(self, stream: str, segment_id: int, parts: int = 2) -> int:
        result: int = self._run(self._core.split_segment(stream, segment_id, parts))
        return result

    def merge_segments(self, stream: str, segment_ids: Sequence[int]) -> int:
        result: int = self._run(self._core.merge_segments(stream, segment_ids))
        return result

    def truncate_stream(self, stream: str, cut: StreamCut) -> None:
        self._run(self._core.truncate_stream(stream, cut))

    def head_cut(self, stream: str) -> StreamCut:
        result: StreamCut = self._run(self._core.head_cut(stream))
        return result

    def tail_cut(self, stream: str) -> StreamCut:
        result: StreamCut = self._run(self._core.tail_cut(stream))
        return result

    def cut_at(self, stream: str, time: float) -> StreamCut:
        result: StreamCut = self._run(self._core.cut_at(stream, time))
        return result

    def segments_between(self, stream: str, start: StreamCut | None = None,
                         end: StreamCut | None = None) -> list[SegmentSlice]:
        result: list[SegmentSlice] = self._run(self._core.segments_between(stream, start, end))
        return result

    def check_cut(self, stream: str, cut: StreamCut) -> None:
        self._run(self._core.check_cut(stream, cut))
