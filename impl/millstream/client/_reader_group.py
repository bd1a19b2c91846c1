"""The reader group handle: ``AsyncReaderGroup`` (asyncio) and ``ReaderGroup`` (blocking), made by
``client.reader_group``.  They create readers, take checkpoints, reset the group and declare readers
offline.

Theory of operation.  The group's state is ``_reader_group_state.ReaderGroupState``, a pure state
machine whose updates are values (its docstring says what the state holds and what each update
means).  It lives in the group's state segment and is shared through a ``StateSynchronizer``: the
handle keeps its own copy, reads the latest state before each method, and changes it only by
writing updates with a conditional append against the state they were planned on (``_update``).
Everything here is I/O around that: the controller (the group's configuration and generation, the
streams' segments), the segment store (offsets, the state segment) and the event loop (checkpoint
waiters, the blocking flavour's hand-off to the loop thread).  The state's names are re-exported
here, where they were imported from before the split.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

from millstream import limits
from millstream.client._config import RandomSource
from millstream.client._controller import ControllerClient
from millstream.client._event_reader import AsyncEventStreamReader, EventStreamReader, Position, ReaderConfig
from millstream.client._reader_group_state import (  # (the state's names, where they were before the split)
    _TRANSITIONS,  # noqa: F401  (tests plant a bug in the state's updates through this module)
    SILENT_SUFFIX,
    AcquireSegment,
    AddReader,
    Checkpoint,
    CheckpointReader,
    CheckpointState,
    CreateCheckpoint,
    FutureSegment,
    ReaderGroupState,
    ReaderGroupStateCodec,
    ReaderGroupStateInit,
    ReaderGroupUpdate,
    ReaderInfo,
    ReleaseSegment,
    RemoveReader,
    SegmentCompleted,
    UpdateDistanceToTail,
    _frozen,  # noqa: F401  (as _TRANSITIONS)
    stream_of,
    validate_name,
)
from millstream.client._segments import AsyncSegments
from millstream.client._serializers import BytesSerializer, Serializer
from millstream.client._state_synchronizer import NewState, StateSynchronizer
from millstream.clock import Clock
from millstream.errors import (
    CheckpointFailedError,
    InvalidArgumentError,
    InvalidStreamCutError,
    MillstreamError,
    ObjectClosedError,
    ReaderGroupExistsError,
    ReaderGroupNotFoundError,
    StreamSegmentNotExistsError,
)
from millstream.naming import validate_scope_or_stream_name
from millstream.values import ReaderGroupConfig, ReaderGroupInfo, StreamCut, split_stream_name

_T = TypeVar("_T")

__all__ = [
    "SILENT_SUFFIX",
    "AcquireSegment",
    "AddReader",
    "AsyncReaderGroup",
    "Checkpoint",
    "CheckpointReader",
    "CheckpointState",
    "CreateCheckpoint",
    "FutureSegment",
    "ReaderGroup",
    "ReaderGroupState",
    "ReaderGroupStateCodec",
    "ReaderGroupStateInit",
    "ReaderGroupUpdate",
    "ReaderInfo",
    "ReleaseSegment",
    "RemoveReader",
    "SegmentCompleted",
    "UpdateDistanceToTail",
    "stream_of",
    "validate_name",
]

log = logging.getLogger("millstream.client.reader_group")


def _seconds(value: Any, what: str) -> float:
    """``value`` as a finite positive number of seconds (a checkpoint's timeout), else ``InvalidArgumentError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{what} must be a finite positive number of seconds, not {value!r}")
    return float(value)


# --- The group handle ------------------------------------------------------------------------------


def _group_name(group: str, streams: Iterable[str]) -> tuple[str, str]:
    """``(scope, group)`` of ``"scope/group"``, or of a bare ``"group"`` in the first stream's scope."""
    if not isinstance(group, str):
        raise InvalidArgumentError(f"a reader group is named 'scope/group' (or 'group'), not {group!r}")
    if "/" in group:
        scope, name = split_stream_name(group)
        return scope, name
    first = next(iter(streams), None)
    if first is None:
        raise InvalidArgumentError(f"reader group {group!r}: name it 'scope/group' (no stream gives its scope)")
    scope, _ = split_stream_name(first)
    validate_scope_or_stream_name(group, what="reader group")
    return scope, group


class AsyncReaderGroup:
    """A reader group (asyncio): made by ``AsyncClient.reader_group``.  Creates readers, takes
    checkpoints, resets the group, declares readers offline.  Each method reads the group's latest
    state first (the handle keeps its own copy through the state synchronizer)."""

    def __init__(self, *, segments: AsyncSegments, controller: ControllerClient, clock: Clock, rng: RandomSource,
                 read_length_bytes: int, scope: str, name: str, state_segment: str) -> None:
        self._segments = segments
        self._controller = controller
        self._clock = clock
        self._rng = rng
        self._read_length_bytes = read_length_bytes
        self.scope = scope
        self.name = name
        self.state_segment = state_segment
        self._sync: StateSynchronizer[ReaderGroupState, ReaderGroupUpdate] = StateSynchronizer(
            segments, state_segment, ReaderGroupStateCodec(), rng=rng)
        self._readers: set[AsyncEventStreamReader[Any]] = set()
        self._waiters: set[asyncio.Task[Checkpoint]] = set()
        self._closed = False

    @classmethod
    async def open(cls, *, segments: AsyncSegments, controller: ControllerClient, clock: Clock, rng: RandomSource,
                   read_length_bytes: int, group: str, streams: Iterable[str] | Mapping[str, Any] | None = None,
                   config: ReaderGroupConfig | None = None) -> AsyncReaderGroup:
        """Open reader group ``group``, creating it first if ``streams`` or ``config`` is given (an
        existing group is opened as it is).  Raises ``ReaderGroupNotFoundError`` (opening only),
        ``StreamNotFoundError``, ``InvalidStreamCutError``, ``InvalidArgumentError``."""
        if streams is not None and config is not None:
            raise InvalidArgumentError("give a reader group's streams or its config, not both")
        if streams is not None:
            config = ReaderGroupConfig(streams)
        if config is not None and not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        scope, name = _group_name(group, config.streams if config is not None else ())
        if config is not None:
            with contextlib.suppress(ReaderGroupExistsError):  # an existing group is opened as it is
                await controller.create_reader_group(scope, name, config)
        info = await controller.get_reader_group(scope, name)
        opened = cls(segments=segments, controller=controller, clock=clock, rng=rng,
                     read_length_bytes=read_length_bytes, scope=scope, name=name, state_segment=info.state_segment)
        await opened._initialize(info)
        return opened

    @property
    def qualified_name(self) -> str:
        return f"{self.scope}/{self.name}"

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectClosedError(f"reader group {self.qualified_name} handle is closed")

    async def _initialize(self, info: ReaderGroupInfo) -> None:
        """Make the state segment hold the controller's generation: write the first state of a new
        group, or finish a reset that stopped between the controller and the state segment."""
        try:
            await self._sync.fetch_updates()
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self.qualified_name} was deleted") from None
        state = self._sync.state
        if state is not None and state.generation >= info.generation:
            return
        start, ends = await self._offsets_of(info.config)

        def initialize(current: ReaderGroupState | None,
                       ) -> Sequence[ReaderGroupUpdate] | NewState[ReaderGroupState] | None:
            if current is None:
                return NewState(ReaderGroupState.initial(info.config, info.generation, start, ends))
            if current.generation < info.generation:
                return [ReaderGroupStateInit(info.config, info.generation, start, ends)]
            return None
        await self._update(initialize)

    async def _offsets_of(self, config: ReaderGroupConfig) -> tuple[dict[str, int], dict[str, int]]:
        """Where each stream's reading starts (its start cut, or its head now) and where bounded reads end."""
        start: dict[str, int] = {}
        ends: dict[str, int] = {}
        for stream, (start_cut, end_cut) in config.streams.items():
            scope, name = split_stream_name(stream)
            cut = start_cut if start_cut is not None else await self._controller.get_head_cut(scope, name)
            start.update(cut.segment_names())
            if end_cut is not None:
                ends.update(end_cut.segment_names())
        return start, ends

    async def _fetch(self) -> ReaderGroupState:
        try:
            await self._sync.fetch_updates()
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self.qualified_name} was deleted") from None
        state = self._sync.state
        if state is None:
            raise ReaderGroupNotFoundError(f"reader group {self.qualified_name} holds no state yet")
        return state

    async def _update(self, plan: Callable[[ReaderGroupState | None],
                                           Sequence[ReaderGroupUpdate] | NewState[ReaderGroupState] | None]) -> bool:
        try:
            return await self._sync.update(plan)
        except StreamSegmentNotExistsError:
            raise ReaderGroupNotFoundError(f"reader group {self.qualified_name} was deleted") from None

    # --- Queries -----------------------------------------------------------------------------------

    async def state(self) -> ReaderGroupState:
        """The group's latest state (who reads what, checkpoints, configuration)."""
        self._check_open()
        return await self._fetch()

    async def config(self) -> ReaderGroupConfig:
        return (await self.state()).config

    async def online_readers(self) -> list[str]:
        return sorted((await self.state()).readers)

    async def checkpoint(self, name: str) -> Checkpoint | None:
        """A completed checkpoint the group still keeps, by name (None if unknown or in progress)."""
        return (await self.state()).checkpoint_value(validate_name(name, "checkpoint name"))

    # --- Readers -----------------------------------------------------------------------------------

    @overload
    async def reader(self, reader_id: str, *, config: ReaderConfig | None = ...) -> AsyncEventStreamReader[bytes]:
        ...

    @overload
    async def reader(self, reader_id: str, serializer: Serializer[_T], *,
                     config: ReaderConfig | None = ...) -> AsyncEventStreamReader[_T]:
        ...

    async def reader(self, reader_id: str, serializer: Serializer[Any] | None = None, *,
                     config: ReaderConfig | None = None) -> AsyncEventStreamReader[Any]:
        """A new reader ``reader_id`` in this group, reading events as ``serializer`` decodes them
        (default: bytes) -- an ``AsyncEventStreamReader[T]`` for a ``Serializer[T]``; ``config``: its
        ``ReaderConfig``.  Raises ``ReaderExistsError`` if that id is online (nothing changed),
        ``ReaderGroupNotFoundError`` if the group was deleted."""
        self._check_open()
        validate_name(reader_id, "reader id")
        if config is not None and not isinstance(config, ReaderConfig):
            raise InvalidArgumentError(f"config must be a ReaderConfig, not {config!r}")
        reader: AsyncEventStreamReader[Any] = AsyncEventStreamReader(
            self, reader_id, serializer or BytesSerializer(), config or ReaderConfig())
        await reader._join()
        self._readers.add(reader)
        return reader

    def _forget(self, reader: AsyncEventStreamReader[Any]) -> None:
        self._readers.discard(reader)

    async def reader_offline(self, reader_id: str, position: Position | None = None) -> bool:
        """Declare ``reader_id`` offline (a reader that crashed): its segments return to the group at
        ``position`` (a ``Position`` the application stored) where it names them, else at their
        last checkpointed offsets (segments of the position the reader no longer holds are ignored).
        Returns False if the reader was not online."""
        self._check_open()
        validate_name(reader_id, "reader id")
        if position is not None and not isinstance(position, Position):
            raise InvalidArgumentError(f"position must be a Position or None, not {position!r}")
        positions = None if position is None else position.segments

        def remove(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or reader_id not in current.readers:
                return None
            if positions is None:
                return [RemoveReader(reader_id)]
            mine = current.segments_of(reader_id)
            return [RemoveReader(reader_id, {s: o for s, o in positions.items() if s in mine})]
        before = await self._fetch()
        removed = await self._update(remove)
        if removed:
            await self._publish_completed(before, self._sync.state)
        return removed

    # --- Checkpoints -------------------------------------------------------------------------------

    # (``timeout`` bounds the returned future's wait, on the injected clock, not this call.)
    async def initiate_checkpoint(self, name: str, *,
                                  timeout: float = limits.READER_GROUP_CHECKPOINT_WAIT_SECONDS,  # noqa: ASYNC109
                                  silent: bool = False) -> asyncio.Future[Checkpoint]:
        """Start checkpoint ``name`` and return a future of it, which completes once every online
        reader has recorded its position (each does on the ``read_next_event`` call after the one
        that returned the checkpoint).  Returns once the checkpoint is recorded in the group.  Raises
        ``CheckpointLimitError`` (too many in progress) or ``InvalidArgumentError`` (a name in use);
        the future raises ``CheckpointFailedError`` if the group is reset first or ``timeout``
        passes.  ``silent``: readers record it without returning it to the application."""
        self._check_open()
        validate_name(name, "checkpoint name")
        wait = _seconds(timeout, "timeout")
        full = name + SILENT_SUFFIX if silent and not name.endswith(SILENT_SUFFIX) else name
        validate_name(full, "checkpoint name")
        before = await self._fetch()
        await self._update(lambda current: [CreateCheckpoint(full)])
        await self._publish_completed(before, self._sync.state)  # complete at once if no reader is online
        deadline = self._clock.monotonic() + wait
        waiter = asyncio.get_running_loop().create_task(self._await_checkpoint(full, deadline),
                                                        name=f"millstream-checkpoint-{full}")
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)
        return waiter

    async def _await_checkpoint(self, name: str, deadline: float) -> Checkpoint:
        for _ in range(1 << 20):  # every round waits for a change of the state, or the deadline
            state = self._sync.state
            found = None if state is None else state.checkpoint(name)
            if found is None:
                raise CheckpointFailedError(f"checkpoint {name!r} of {self.qualified_name} was abandoned (the "
                                            "group was reset)")
            if found.complete:
                return Checkpoint.from_positions(name, found.positions)
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise CheckpointFailedError(
                    f"checkpoint {name!r} of {self.qualified_name}: readers {sorted(found.pending)} did not record "
                    "their positions in time (are they calling read_next_event?)")
            try:
                await self._sync.wait_for_change(min(remaining, limits.READER_TAIL_WAIT_SECONDS))
            except StreamSegmentNotExistsError:
                raise CheckpointFailedError(f"reader group {self.qualified_name} was deleted") from None
        raise CheckpointFailedError(f"checkpoint {name!r}: the wait went round too often")  # pragma: no cover

    async def generate_stream_cuts(self, *,
                                   timeout: float = limits.READER_GROUP_CHECKPOINT_WAIT_SECONDS,  # noqa: ASYNC109
                                   ) -> Mapping[str, StreamCut]:
        """The group's position as a stream cut per stream, taken by a silent checkpoint (readers
        record it without returning it)."""
        name = f"cuts-{self._rng.getrandbits(64):016x}"
        return (await (await self.initiate_checkpoint(name, timeout=timeout, silent=True))).cuts

    async def _publish_completed(self, before: ReaderGroupState | None, after: ReaderGroupState | None) -> None:
        """If the group subscribes for consumption-based retention and a (non-silent) checkpoint just
        completed, tell the controller how far the group has consumed each stream.  A failure is
        logged: retention only keeps more data until the next checkpoint."""
        if after is None or after.config.retention != "consumption":
            return
        done_before = {c.name for c in before.checkpoints if c.complete} if before is not None else set()
        fresh = [c for c in after.checkpoints if c.complete and not c.silent and c.name not in done_before]
        if not fresh:
            return
        checkpoint = Checkpoint.from_positions(fresh[-1].name, fresh[-1].positions)
        try:
            await self.update_retention_stream_cut(checkpoint.cuts)
        except MillstreamError as error:
            log.warning("reader group %s: publishing checkpoint %s for retention failed: %s", self.qualified_name,
                        checkpoint.name, error)

    async def update_retention_stream_cut(self, cuts: Mapping[str, StreamCut]) -> None:
        """Tell the controller the group has consumed each stream up to its cut (consumption-based
        retention truncates below the lowest cut of all subscribing groups)."""
        self._check_open()
        for stream, cut in self._checked_cuts(cuts, all_streams=False).items():
            await self._controller.update_subscriber_cut(self.scope, self.name, stream, cut)

    # --- Resets ------------------------------------------------------------------------------------

    def _checked_cuts(self, cuts: Mapping[str, StreamCut], *, all_streams: bool) -> dict[str, StreamCut]:
        state = self._sync.state
        streams = set(state.config.streams) if state is not None else set()
        if not isinstance(cuts, Mapping):
            raise InvalidArgumentError(f"cuts maps 'scope/stream' names to StreamCuts, not {cuts!r}")
        for stream, cut in cuts.items():
            if not isinstance(cut, StreamCut):
                raise InvalidArgumentError(f"the cut of {stream!r} must be a StreamCut, not {cut!r}")
            if cut.stream != stream:
                raise InvalidStreamCutError(f"the cut given for {stream!r} is a position of {cut.stream!r}")
            if stream not in streams:
                raise InvalidStreamCutError(f"reader group {self.qualified_name} does not read {stream!r}")
        if all_streams and set(cuts) != streams:
            raise InvalidArgumentError(f"give a cut for every stream of the group: {sorted(streams)}, not "
                                       f"{sorted(cuts)}")
        return dict(cuts)

    async def reset(self, config: ReaderGroupConfig) -> int:
        """Restart the group under ``config`` (its start cuts, or the streams' heads now): the
        controller bumps the generation, the state segment is re-initialised, and readers drop their
        segments and start over when they next look.  Returns the new generation.  Bad cuts raise
        ``InvalidStreamCutError`` with nothing changed."""
        self._check_open()
        if not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        state = await self._fetch()
        info = await self._controller.get_reader_group(self.scope, self.name)
        if info.generation != state.generation:
            await self._initialize(info)  # finish an interrupted reset first
        for stream, (start, end) in config.streams.items():
            scope, name = split_stream_name(stream)
            for cut in (start, end):
                if cut is not None:
                    await self._controller.check_stream_cut(scope, name, cut)
        start_offsets, ends = await self._offsets_of(config)
        generation = await self._controller.update_reader_group(self.scope, self.name, config,
                                                                expected_generation=info.generation)

        def reinitialize(current: ReaderGroupState | None) -> list[ReaderGroupUpdate] | None:
            if current is None or current.generation >= generation:
                return None
            return [ReaderGroupStateInit(config, generation, start_offsets, ends)]
        await self._update(reinitialize)
        log.info("reader group %s reset to generation %d", self.qualified_name, generation)
        return generation

    async def reset_to_stream_cuts(self, cuts: Mapping[str, StreamCut]) -> int:
        """Restart every stream of the group at its cut in ``cuts`` (end cuts stay as configured)."""
        state = await self._fetch()
        checked = self._checked_cuts(cuts, all_streams=True)
        bounds = {stream: (checked[stream], end) for stream, (_, end) in state.config.streams.items()}
        config = ReaderGroupConfig(bounds,
                                   automatic_checkpoint_seconds=state.config.automatic_checkpoint_seconds,
                                   retention=state.config.retention)
        return await self.reset(config)

    async def reset_to_checkpoint(self, checkpoint: Checkpoint | str) -> int:
        """Restart the group at a completed checkpoint (a ``Checkpoint``, or the name of one the group
        keeps): every event after it is read again, exactly once."""
        if isinstance(checkpoint, str):
            found = (await self.state()).checkpoint_value(checkpoint)
            if found is None:
                raise InvalidArgumentError(f"reader group {self.qualified_name} keeps no completed checkpoint "
                                           f"{checkpoint!r}")
            checkpoint = found
        if not isinstance(checkpoint, Checkpoint):
            raise InvalidArgumentError(f"checkpoint must be a Checkpoint or a name, not {checkpoint!r}")
        return await self.reset_to_stream_cuts(checkpoint.cuts)

    # --- Life cycle --------------------------------------------------------------------------------

    async def delete(self) -> None:
        """Delete the group and its state (its readers then fail with ``ReaderGroupNotFoundError``)."""
        self._check_open()
        await self._controller.delete_reader_group(self.scope, self.name)
        await self.close()

    async def close(self) -> None:
        """Close every reader made by this handle (they leave the group) and stop checkpoint waits."""
        if self._closed:
            return
        self._closed = True
        for reader in list(self._readers):
            await reader.close()
        waiters = list(self._waiters)
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncReaderGroup:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncReaderGroup({self.qualified_name!r})"


class ReaderGroup:
    """The blocking reader group (see ``AsyncReaderGroup`` for each method).  Made by
    ``Client.reader_group``."""

    def __init__(self, core: AsyncReaderGroup, run: Callable[[Coroutine[Any, Any, Any]], Any],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._core = core
        self._run = run
        self._loop = loop

    @property
    def core(self) -> AsyncReaderGroup:
        return self._core

    @property
    def scope(self) -> str:
        return self._core.scope

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def qualified_name(self) -> str:
        return self._core.qualified_name

    def state(self) -> ReaderGroupState:
        result: ReaderGroupState = self._run(self._core.state())
        return result

    def config(self) -> ReaderGroupConfig:
        result: ReaderGroupConfig = self._run(self._core.config())
        return result

    def online_readers(self) -> list[str]:
        result: list[str] = self._run(self._core.online_readers())
        return result

    def checkpoint(self, name: str) -> Checkpoint | None:
        result: Checkpoint | None = self._run(self._core.checkpoint(name))
        return result

    @overload
    def reader(self, reader_id: str, *, config: ReaderConfig | None = ...) -> EventStreamReader[bytes]:
        ...

    @overload
    def reader(self, reader_id: str, serializer: Serializer[_T], *,
               config: ReaderConfig | None = ...) -> EventStreamReader[_T]:
        ...

    def reader(self, reader_id: str, serializer: Serializer[Any] | None = None, *,
               config: ReaderConfig | None = None) -> EventStreamReader[Any]:
        """A blocking reader: an ``EventStreamReader[T]`` for a ``Serializer[T]`` (default bytes; see
        ``AsyncReaderGroup.reader``)."""
        core: AsyncEventStreamReader[Any] = self._run(
            self._core.reader(reader_id, serializer or BytesSerializer(), config=config))
        return EventStreamReader(core, self._run)

    def reader_offline(self, reader_id: str, position: Position | None = None) -> bool:
        return bool(self._run(self._core.reader_offline(reader_id, position)))

    def initiate_checkpoint(self, name: str, *, timeout: float = limits.READER_GROUP_CHECKPOINT_WAIT_SECONDS,
                            silent: bool = False) -> concurrent.futures.Future[Checkpoint]:
        """Start checkpoint ``name``; the returned future completes once every online reader (in other
        threads or processes) has recorded its position."""
        waiter: asyncio.Future[Checkpoint] = self._run(self._core.initiate_checkpoint(name, timeout=timeout,
                                                                                      silent=silent))

        async def result() -> Checkpoint:
            return await waiter
        return asyncio.run_coroutine_threadsafe(result(), self._loop)

    def generate_stream_cuts(self, *, timeout: float = limits.READER_GROUP_CHECKPOINT_WAIT_SECONDS,
                             ) -> Mapping[str, StreamCut]:
        result: Mapping[str, StreamCut] = self._run(self._core.generate_stream_cuts(timeout=timeout))
        return result

    def update_retention_stream_cut(self, cuts: Mapping[str, StreamCut]) -> None:
        self._run(self._core.update_retention_stream_cut(cuts))

    def reset(self, config: ReaderGroupConfig) -> int:
        return int(self._run(self._core.reset(config)))

    def reset_to_stream_cuts(self, cuts: Mapping[str, StreamCut]) -> int:
        return int(self._run(self._core.reset_to_stream_cuts(cuts)))

    def reset_to_checkpoint(self, checkpoint: Checkpoint | str) -> int:
        return int(self._run(self._core.reset_to_checkpoint(checkpoint)))

    def delete(self) -> None:
        self._run(self._core.delete())

    def close(self) -> None:
        self._run(self._core.close())

    def __enter__(self) -> ReaderGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReaderGroup({self.qualified_name!r})"
