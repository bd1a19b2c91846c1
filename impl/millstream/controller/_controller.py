"""``Controller``: scopes, streams, epochs, scaling, stream cuts, retention and the reader-group registry.

Theory of operation.  The controller keeps its whole metadata in memory as a ``ControllerState`` and
durably as records in its ``MetadataLog`` (a system segment of the store it controls).  Every change
goes through ``_commit(plan)``: under one lock, ``plan`` looks at the state and either raises the
caller's typed error (nothing changes) or returns a record; the record is appended with a
conditional append and applied only once durable.  Queries read the state (and the store, for the
lengths of active segments) without the lock.

Changes that involve segments are *workflows* with several steps, each recorded once done, so a
controller that restarts resumes them (``_finish_pending``); every step is idempotent on the store:

* create stream: create epoch 0's segments, then record ``stream_created`` (empty segments left by a
  crash before the record are reused by the next creation of that name);
* scale: record ``scale_started`` (the whole new epoch, ids included) -> create the successors ->
  record ``epoch_created`` (writers now see the new epoch) -> seal the predecessors -> record their
  lengths (``segments_sealed``) -> record ``scale_completed``;
* seal: ``seal_started`` -> seal every current segment -> ``stream_sealed`` (with the lengths);
* truncate: ``truncation_started`` (the cut) -> delete the segments wholly before the cut and
  truncate the cut's segments -> ``truncation_completed`` (forgets epochs now wholly deleted);
* delete (sealed streams only): ``delete_started`` -> delete every segment -> ``stream_deleted``;
* commit a stream transaction: ``commit_started`` -> merge its segments -> (after a roll:
  ``roll_epochs_created``) -> ``commit_completed`` (``_transaction_workflows``, which also holds the
  transactions' requests, the lease expiry and the fenced multi-commit).

At most one workflow runs per stream: each takes the stream's lock (waiting at most
``limits.CONTROLLER_STREAM_LOCK_WAIT_SECONDS``) and first finishes any workflow a previous instance
left behind.  Auto-scaling and retention use the same paths.

Periodic work (``tick``, every ``config.tick_seconds`` on the injected clock, or called by tests):
drain the store's per-segment append counts into moving averages and auto-scale streams whose
policy says so (``_autoscale``); every ``config.tail_cut_interval_seconds``, record each changed
stream's tail cut with its time and apply retention policies (``_retention``); expire the leases of
stream transactions; retry workflows left pending.  Times recorded in the metadata are ``now()`` --
seconds since the Unix epoch by default, injected for tests -- never going backwards.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time as _time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from millstream import limits
from millstream.clock import Clock, SystemClock
from millstream.controller._autoscale import SegmentRates, fold_sample, plan_auto_scale, scale_signal
from millstream.controller._config import ControllerConfig
from millstream.controller._cuts import (
    is_at_or_after,
    segments_before,
    segments_between,
    validate_cut,
)
from millstream.controller._epochs import EpochRecord, next_epoch
from millstream.controller._metadata_log import (
    LoggedRecord,
    MetadataConflictError,
    MetadataLog,
    encode_record,
)
from millstream.controller._retention import choose_truncation
from millstream.controller._segment_store import SegmentStore
from millstream.controller._state import ControllerState, StreamRecord, StreamState, initial_stream_epoch
from millstream.controller._transaction_workflows import TransactionWorkflows
from millstream.errors import (
    BadOffsetError,
    InternalError,
    InvalidArgumentError,
    InvalidStreamCutError,
    ObjectClosedError,
    ReaderGroupExistsError,
    ReaderGroupNotFoundError,
    RequestTimeoutError,
    RetryableError,
    ScopeExistsError,
    ScopeNotEmptyError,
    ScopeNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSealedError,
    StreamSegmentNotExistsError,
)
from millstream.naming import (
    LEGACY_READER_GROUP_STATE_PREFIX,
    reader_group_state_segment_name,
    stream_segment_name,
    validate_scope_or_stream_name,
)
from millstream.randomness import RandomSource, SystemRandomSource
from millstream.segmentstore.tracing import Tracer
from millstream.tasks import cancel_and_wait
from millstream.values import (
    ReaderGroupConfig,
    ReaderGroupInfo,
    SegmentSlice,
    SegmentWithRange,
    StreamConfig,
    StreamCut,
    StreamDescription,
    StreamSegments,
    SuccessorSegment,
)

__all__ = ["READER_GROUP_STATE_PREFIX", "Controller", "reader_group_state_segment"]

log = logging.getLogger("millstream.controller")

#: Reader groups created before their state moved into their scope keep it under this prefix (each
#: group's record names its state segment, so those keep working).
READER_GROUP_STATE_PREFIX = LEGACY_READER_GROUP_STATE_PREFIX


def reader_group_state_segment(scope: str, group: str) -> str:
    """A new reader group's state segment: ``<scope>/_RG<group>``, in its scope, so that a token for
    the scope covers it (``naming.reader_group_state_segment_name``)."""
    return reader_group_state_segment_name(scope, group)


_Key = tuple[str, str]


def _cut_json(cut: Mapping[int, int]) -> dict[str, int]:
    return {str(identifier): offset for identifier, offset in sorted(cut.items())}


def _cut_of(value: Mapping[str, Any]) -> dict[int, int]:
    return {int(identifier): offset for identifier, offset in value.items()}


class Controller(TransactionWorkflows):
    """The controller of the segments ``store`` holds.  ``clock`` times its periodic work; ``now``
    gives the times it records (seconds since the Unix epoch by default); ``rng`` draws transaction
    ids; ``tracer`` (tests) hears the fenced multi-commits' requests and decisions
    (``_transaction_workflows``).  ``start``, then call its methods on the same event loop; ``stop``
    ends the periodic work."""

    def __init__(self, store: SegmentStore, *, clock: Clock | None = None, now: Callable[[], float] | None = None,
                 config: ControllerConfig | None = None, rng: RandomSource | None = None,
                 tracer: Tracer | None = None) -> None:
        self._store = store
        self._clock: Clock = clock or SystemClock()
        self._now = now if now is not None else _time.time
        self.config = config or ControllerConfig()
        self._log = MetadataLog(store, self.config.metadata_segment)
        self._state = ControllerState()
        self._append_lock = asyncio.Lock()
        self._stream_locks: dict[_Key, asyncio.Lock] = {}
        self._rates: dict[_Key, dict[int, SegmentRates]] = {}
        self._muted_until: dict[_Key, float] = {}
        self._last_tick: float | None = None
        self._next_tail_cut: float | None = None
        self._periodic: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._rng: RandomSource = rng or SystemRandomSource()
        self._tracer = tracer
        self._traced_requests = 0
        #: The worker running each stream's transaction workflows, and the streams that may have work.
        self._transaction_workers: dict[_Key, asyncio.Task[None]] = {}
        self._transaction_work: set[_Key] = set()
        #: Runs of transaction workflows that failed (retried on the next tick): evidence for tests.
        self.failed_transaction_runs = 0
        #: Evidence for tests and operators: scales started by auto-scaling, truncations by retention,
        #: ticks that failed.
        self.auto_scales = 0
        self.retention_truncations = 0
        self.failed_ticks = 0

    # --- Lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Replay the metadata log, resume interrupted workflows, start the periodic work."""
        if self._started:
            raise InternalError("a controller starts once")
        self._started = True
        for item in await self._log.open():
            self._apply_logged(item)
        self._state.check_invariants()
        log.info("controller: %d scopes, %d streams, %d reader groups replayed from %s", len(self._state.scopes),
                 len(self._state.streams), len(self._state.groups), self._log.segment)
        await self.resume_pending()
        self._kick_all()
        if self.config.periodic:
            self._periodic = asyncio.get_running_loop().create_task(self._run_periodic(), name="controller-tick")

    async def stop(self) -> None:
        """Stop the periodic work (a workflow it was running stays recorded and resumes next start)."""
        self._closed = True
        task, self._periodic = self._periodic, None
        if task is not None:
            await cancel_and_wait(task)
        await self._stop_transaction_workers()

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def state(self) -> ControllerState:
        """The metadata (read-only by convention: tests and diagnostics)."""
        return self._state

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise ObjectClosedError("the controller is not running")

    def _time(self) -> float:
        return max(float(self._now()), self._state.time_floor)

    # --- The metadata log --------------------------------------------------------------------------

    def _apply_logged(self, item: LoggedRecord) -> None:
        if item.snapshot is not None:
            self._state = ControllerState.from_snapshot(item.snapshot)
        elif item.record is not None:
            self._state.apply(item.record)

    async def _commit(self, plan: Callable[[ControllerState], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Plan a record against the state (``plan`` raises the caller's error, or returns None for
        "nothing to do"), append it durably, apply it.  Returns the record applied."""
        self._check_open()
        async with self._append_lock:
            for _ in range(limits.CONTROLLER_COMMIT_ATTEMPTS_MAX):
                record = plan(self._state)
                if record is None:
                    return None
                record = {**record, "time": self._time()}
                data = encode_record(record)
                expected = self._log.length
                try:
                    await self._log.append(data)
                except MetadataConflictError:
                    mine = False
                    for item in await self._log.catch_up():
                        self._apply_logged(item)
                        mine = mine or (item.offset == expected and item.raw == data)
                    if mine:
                        return record
                    continue
                self._state.apply(record)
                await self._maybe_snapshot()
                return record
        raise RetryableError("the controller's metadata log kept changing under it; try again")

    async def _maybe_snapshot(self) -> None:
        if self._state.records_since_snapshot < self.config.snapshot_records \
                and self._log.bytes_since_snapshot < self.config.snapshot_bytes:
            return
        try:
            await self._log.write_snapshot(self._state.to_snapshot())
        except MetadataConflictError:
            for item in await self._log.catch_up():
                self._apply_logged(item)
            return
        except Exception:
            # A snapshot only shortens replay: the change it follows is durable and applied, so its
            # caller succeeded.  A partly written snapshot is skipped on replay; the next change retries.
            log.exception("controller: writing a metadata snapshot failed; will retry")
            return
        self._state.records_since_snapshot = 0

    # --- Helpers -----------------------------------------------------------------------------------

    def _stream(self, scope: str, stream: str) -> StreamRecord:
        found = self._state.streams.get((scope, stream))
        if found is None:
            if scope not in self._state.scopes:
                raise ScopeNotFoundError(f"scope {scope!r} does not exist")
            raise StreamNotFoundError(f"stream {scope}/{stream} does not exist")
        return found

    def _lock(self, key: _Key) -> asyncio.Lock:
        lock = self._stream_locks.get(key)
        if lock is None:
            lock = self._stream_locks[key] = asyncio.Lock()
        return lock

    async def _acquire_stream_lock(self, key: _Key) -> asyncio.Lock:
        """Take the stream's lock (the caller releases it), waiting at most ``stream_lock_wait_seconds``:
        then ``RequestTimeoutError`` (another change holds it; the caller may try again)."""
        lock = self._lock(key)
        try:
            async with asyncio.timeout(self.config.stream_lock_wait_seconds):
                await lock.acquire()
        except TimeoutError:
            raise RequestTimeoutError(f"stream {key[0]}/{key[1]} is busy with another change; try again") from None
        return lock

    async def _locked(self, key: _Key, work: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``work`` holding the stream's lock, after finishing any workflow left pending."""
        lock = await self._acquire_stream_lock(key)
        try:
            if key in self._state.streams and self._state.streams[key].pending is not None:
                await self._finish_pending(key)
            return await work()
        finally:
            lock.release()

    def _name(self, stream: StreamRecord, identifier: int) -> str:
        return stream_segment_name(stream.scope, stream.name, identifier)

    async def _active_lengths(self, stream: StreamRecord, identifiers: Iterable[int]) -> dict[int, int]:
        """The current lengths of these segments (sealed ones from the metadata, others from the store)."""
        lengths: dict[int, int] = {}
        for identifier in identifiers:
            known = stream.sealed_lengths.get(identifier)
            if known is None:
                info = await self._store.get_info(self._name(stream, identifier))
                known = 0 if info is None else info.length
            lengths[identifier] = known
        return lengths

    def _segment(self, stream: StreamRecord, segment: Any, *, uri: bool = False) -> SegmentWithRange:
        name = self._name(stream, segment.segment_id)
        return SegmentWithRange(segment.segment_id, segment.key_start, segment.key_end, name,
                                self._store.uri_of(name) if uri else "")

    # --- Scopes ------------------------------------------------------------------------------------

    async def create_scope(self, scope: str) -> None:
        validate_scope_or_stream_name(scope, what="scope")

        def plan(state: ControllerState) -> dict[str, Any]:
            if scope in state.scopes:
                raise ScopeExistsError(f"scope {scope!r} exists already")
            if len(state.scopes) >= limits.CONTROLLER_SCOPES_MAX:
                raise InvalidArgumentError(f"there are {limits.CONTROLLER_SCOPES_MAX} scopes already (the limit)")
            return {"type": "scope_created", "scope": scope}
        await self._commit(plan)

    async def delete_scope(self, scope: str) -> None:
        validate_scope_or_stream_name(scope, what="scope")

        def plan(state: ControllerState) -> dict[str, Any]:
            if scope not in state.scopes:
                raise ScopeNotFoundError(f"scope {scope!r} does not exist")
            streams, groups = state.streams_of(scope), state.groups_of(scope)
            if streams or groups:
                raise ScopeNotEmptyError(f"scope {scope!r} still has {len(streams)} streams and {len(groups)} "
                                         "reader groups")
            return {"type": "scope_deleted", "scope": scope}
        await self._commit(plan)

    async def list_scopes(self) -> list[str]:
        self._check_open()
        return sorted(self._state.scopes)

    # --- Streams -----------------------------------------------------------------------------------

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        validate_scope_or_stream_name(scope, what="scope")
        validate_scope_or_stream_name(stream, what="stream")
        if not isinstance(config, StreamConfig):
            raise InvalidArgumentError(f"config must be a StreamConfig, not {config!r}")

        def check(state: ControllerState) -> None:
            if scope not in state.scopes:
                raise ScopeNotFoundError(f"scope {scope!r} does not exist")
            if (scope, stream) in state.streams:
                raise StreamExistsError(f"stream {scope}/{stream} exists already")
            if len(state.streams) >= limits.CONTROLLER_STREAMS_MAX:
                raise InvalidArgumentError(f"there are {limits.CONTROLLER_STREAMS_MAX} streams already (the limit)")

        self._check_open()
        check(self._state)
        epoch = initial_stream_epoch(config, self._time())
        key = (scope, stream)
        try:
            async with self._lock(key):
                for segment in epoch.segments:  # first the segments: a stream recorded has all its segments
                    await self._store.create_segment(stream_segment_name(scope, stream, segment.segment_id))

                def plan(state: ControllerState) -> dict[str, Any]:
                    check(state)
                    return {"type": "stream_created", "scope": scope, "stream": stream,
                            "config": config.to_json_object(), "epoch": epoch.to_json()}
                await self._commit(plan)
        finally:
            if key not in self._state.streams:
                self._stream_locks.pop(key, None)

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        if not isinstance(config, StreamConfig):
            raise InvalidArgumentError(f"config must be a StreamConfig, not {config!r}")
        key = (scope, self._stream(scope, stream).name)

        async def work() -> None:
            def plan(state: ControllerState) -> dict[str, Any]:
                record = self._stream(scope, stream)
                if record.sealed:
                    raise StreamSealedError(f"stream {scope}/{stream} is sealed")
                return {"type": "stream_updated", "scope": scope, "stream": stream,
                        "config": config.to_json_object()}
            await self._commit(plan)
        await self._locked(key, work)
        self._rates.pop(key, None)  # the policy's target may differ: measure afresh

    async def get_stream(self, scope: str, stream: str) -> StreamDescription:
        self._check_open()
        record = self._stream(scope, stream)
        return StreamDescription(scope, stream, record.config, record.sealed, record.current.epoch,
                                 tuple(self._segment(record, s) for s in record.current.segments),
                                 record.describe_state())

    async def list_streams(self, scope: str) -> list[str]:
        self._check_open()
        if scope not in self._state.scopes:
            raise ScopeNotFoundError(f"scope {scope!r} does not exist")
        return [s.name for s in self._state.streams_of(scope)]

    async def get_current_segments(self, scope: str, stream: str) -> StreamSegments:
        self._check_open()
        record = self._stream(scope, stream)
        return StreamSegments(record.current.epoch,
                              tuple(self._segment(record, s, uri=True) for s in record.current.segments))

    async def get_successors(self, scope: str, stream: str, segment_id: int) -> list[SuccessorSegment]:
        self._check_open()
        record = self._stream(scope, stream)
        history = record.history
        if history.segment(segment_id) is None:
            raise InvalidArgumentError(f"segment {segment_id} is not a segment of {scope}/{stream} "
                                       "(or it was truncated away)")
        return [SuccessorSegment(self._segment(record, successor),
                                 frozenset(p.segment_id for p in history.predecessors(successor.segment_id)))
                for successor in history.successors(segment_id)]

    async def seal_stream(self, scope: str, stream: str) -> None:
        key = (scope, self._stream(scope, stream).name)

        async def work() -> None:
            def plan(state: ControllerState) -> dict[str, Any] | None:
                record = self._stream(scope, stream)
                if record.sealed:
                    return None  # sealing twice is not an error
                return {"type": "seal_started", "scope": scope, "stream": stream}
            # Its transactions first: committing ones commit, open ones are aborted.
            if await self._seal_with_transactions(key, plan) is not None:
                await self._finish_pending(key)
        await self._locked(key, work)

    async def delete_stream(self, scope: str, stream: str) -> None:
        key = (scope, self._stream(scope, stream).name)

        async def work() -> None:
            def plan(state: ControllerState) -> dict[str, Any]:
                record = self._stream(scope, stream)
                if not record.sealed:
                    raise StreamNotSealedError(f"stream {scope}/{stream} must be sealed before it is deleted")
                return {"type": "delete_started", "scope": scope, "stream": stream}
            await self._commit(plan)
            await self._finish_pending(key)
        await self._locked(key, work)
        self._stream_locks.pop(key, None)
        self._rates.pop(key, None)
        self._muted_until.pop(key, None)

    async def scale_stream(self, scope: str, stream: str, seal: Sequence[int],
                           new_ranges: Sequence[tuple[float, float]], *, manual: bool = True) -> int:
        """Seal ``seal`` and replace them by segments owning ``new_ranges``; returns the new epoch."""
        key = (scope, self._stream(scope, stream).name)
        result: dict[str, int] = {}

        async def work() -> None:
            def plan(state: ControllerState) -> dict[str, Any]:
                record = self._stream(scope, stream)
                if record.sealed:
                    raise StreamSealedError(f"stream {scope}/{stream} is sealed; it cannot scale")
                if len(record.history.epochs) >= limits.CONTROLLER_EPOCHS_PER_STREAM_MAX:
                    raise InvalidArgumentError(f"stream {scope}/{stream} keeps "
                                               f"{limits.CONTROLLER_EPOCHS_PER_STREAM_MAX} epochs already; "
                                               "truncate it before scaling again")
                epoch, created = next_epoch(record.current, list(seal), list(new_ranges), record.next_number,
                                            self._time())
                return {"type": "scale_started", "scope": scope, "stream": stream, "seal": sorted(seal),
                        "epoch": epoch.to_json(), "next_number": record.next_number + len(created),
                        "manual": manual}
            record = await self._commit(plan)
            assert record is not None
            await self._finish_pending(key)
            result["epoch"] = record["epoch"]["epoch"]
        await self._locked(key, work)
        return result["epoch"]

    # --- Workflows ---------------------------------------------------------------------------------

    async def _finish_pending(self, key: _Key) -> None:
        """Run the stream's pending workflow to its end (the caller holds the stream's lock)."""
        stream = self._state.streams.get(key)
        if stream is None or stream.pending is None:
            return
        kind = stream.pending["kind"]
        if kind == "scale":
            await self._finish_scale(key)
        elif kind == "seal":
            await self._finish_seal(key)
        elif kind == "truncate":
            await self._finish_truncation(key)
        elif kind == "delete":
            await self._finish_delete(key)
        elif kind == "commit":
            await self._finish_commit_locked(key)
        else:
            raise InternalError(f"unknown workflow {kind!r} pending on {key}")

    def _step(self, key: _Key, expected: StreamState, record: dict[str, Any]) -> Callable[
            [ControllerState], dict[str, Any]]:
        def plan(state: ControllerState) -> dict[str, Any]:
            stream = state.streams.get(key)
            if stream is None or stream.state is not expected:
                raise InternalError(f"stream {key}: a {record['type']} step found it "
                                    f"{'gone' if stream is None else stream.state.value}")
            return {"scope": key[0], "stream": key[1], **record}
        return plan

    async def _finish_scale(self, key: _Key) -> None:
        stream = self._state.streams[key]
        assert stream.pending is not None
        pending = stream.pending
        epoch = EpochRecord.from_json(pending["epoch"])
        if not pending["epoch_created"]:
            for segment in epoch.segments:
                if segment.creation_epoch == epoch.epoch:
                    await self._store.create_segment(self._name(stream, segment.segment_id))
            await self._commit(self._step(key, StreamState.SCALING, {"type": "epoch_created", "epoch": epoch.epoch}))
        if not pending["sealed"]:
            lengths = {}
            for identifier in pending["seal"]:
                lengths[identifier] = await self._seal_segment(stream, identifier)
            await self._commit(self._step(key, StreamState.SCALING, {"type": "segments_sealed",
                                                                     "lengths": _cut_json(lengths)}))
        await self._commit(self._step(key, StreamState.SCALING, {"type": "scale_completed", "epoch": epoch.epoch}))
        log.info("stream %s/%s scaled to epoch %d (sealed %s)", key[0], key[1], epoch.epoch, pending["seal"])

    async def _seal_segment(self, stream: StreamRecord, identifier: int) -> int:
        try:
            return await self._store.seal(self._name(stream, identifier))
        except StreamSegmentNotExistsError:
            # Deleted behind the controller's back: record it as empty rather than stall the stream.
            log.warning("segment %s vanished before it was sealed; recording it as empty",
                        self._name(stream, identifier))
            return 0

    async def _finish_seal(self, key: _Key) -> None:
        stream = self._state.streams[key]
        lengths = {s.segment_id: await self._seal_segment(stream, s.segment_id) for s in stream.current.segments}
        await self._commit(self._step(key, StreamState.SEALING, {"type": "stream_sealed",
                                                                 "lengths": _cut_json(lengths)}))

    async def _finish_truncation(self, key: _Key) -> None:
        stream = self._state.streams[key]
        assert stream.pending is not None
        cut = _cut_of(stream.pending["cut"])
        history = stream.history
        before = segments_before(history, cut)
        for segment in before:
            await self._store.delete(self._name(stream, segment.segment_id))
        for identifier, offset in cut.items():
            try:
                await self._store.truncate(self._name(stream, identifier), offset)
            except StreamSegmentNotExistsError:
                log.warning("segment %s vanished before it was truncated", self._name(stream, identifier))
        gone = {s.segment_id for s in before}
        keep_from = history.current.epoch
        for epoch in history.epochs:
            if any(s.segment_id not in gone for s in epoch.segments):
                keep_from = epoch.epoch
                break
        await self._commit(self._step(key, StreamState.TRUNCATING, {"type": "truncation_completed",
                                                                    "cut": _cut_json(cut),
                                                                    "keep_from_epoch": keep_from}))

    async def _finish_delete(self, key: _Key) -> None:
        stream = self._state.streams[key]
        for segment in stream.history.segments():
            await self._store.delete(self._name(stream, segment.segment_id))
        await self._commit(self._step(key, StreamState.DELETING, {"type": "stream_deleted"}))

    async def resume_pending(self) -> int:
        """Finish every workflow left pending whose stream is not busy; return how many finished.
        Failures are logged and left pending (the next tick tries again)."""
        finished = 0
        for key, stream in list(self._state.streams.items()):
            if stream.pending is None or self._lock(key).locked() or (
                    stream.pending["kind"] == "commit" and not self.config.transaction_workflows):
                continue
            try:
                await self._locked(key, _nothing)
                finished += 1
            except Exception:
                log.exception("controller: resuming the %s of %s/%s failed; will retry",
                              stream.pending.get("kind") if stream.pending else "workflow", key[0], key[1])
        return finished

    # --- Stream cuts -------------------------------------------------------------------------------

    async def _validated_cut(self, stream: StreamRecord, cut: Mapping[int, int], *, after_head: bool,
                             boundaries: bool = True) -> None:
        """Raise ``InvalidStreamCutError`` unless ``cut`` is a position of ``stream`` (``validate_cut``),
        at or after its head if ``after_head``, and -- with ``boundaries`` -- every offset is where an
        event begins in its segment (the store checks, within a bounded read: ``event_boundaries``)."""
        history = stream.history
        current = {i for i in cut if history.segment(i) is not None and i not in stream.sealed_lengths}
        lengths = dict(stream.sealed_lengths)
        lengths.update(await self._active_lengths(stream, current))
        validate_cut(history, cut, lengths=lengths)
        if after_head and not is_at_or_after(history, cut, stream.head):
            raise InvalidStreamCutError(f"the cut lies before the head of {stream.qualified_name} (it was "
                                        "truncated there)")
        if boundaries:
            head = stream.head
            for identifier, offset in sorted(cut.items()):
                if offset == 0 or head.get(identifier) == offset or lengths.get(identifier) == offset:
                    continue  # a segment's start or end, or where the stream was truncated: boundaries
                try:
                    await self._store.check_event_boundary(self._name(stream, identifier), offset)
                except StreamSegmentNotExistsError:
                    continue  # (deleted by a truncation meanwhile: the head check refuses such a cut)
                except BadOffsetError as error:
                    raise InvalidStreamCutError(f"the cut's offset {offset} in segment {identifier} of "
                                                f"{stream.qualified_name} is not an event boundary: {error}") from error

    async def get_head_cut(self, scope: str, stream: str) -> StreamCut:
        self._check_open()
        return StreamCut(f"{scope}/{stream}", self._stream(scope, stream).head)

    async def get_tail_cut(self, scope: str, stream: str) -> StreamCut:
        self._check_open()
        record = self._stream(scope, stream)
        if record.state is StreamState.SCALING and record.pending is not None and record.pending["epoch_created"] \
                and not record.pending["sealed"]:
            # The new epoch exists but its predecessors may still take appends: they are the tail.
            epoch = record.history.epoch(record.current.epoch - 1)
            assert epoch is not None
        elif record.state is StreamState.COMMITTING and record.pending is not None \
                and record.pending["epochs_created"]:
            # A roll recorded its two epochs; the active one before them may still take appends.
            epoch = record.history.epoch(record.current.epoch - 2)
            assert epoch is not None
        else:
            epoch = record.current
        lengths = await self._active_lengths(record, [s.segment_id for s in epoch.segments])
        return StreamCut(f"{scope}/{stream}", lengths)

    async def get_cut_at(self, scope: str, stream: str, time: float) -> StreamCut:
        """The newest recorded tail cut made at or before ``time`` (seconds since the Unix epoch), else
        the head.  Raises ``InvalidArgumentError`` unless ``time`` is a finite number >= 0."""
        self._check_open()
        if isinstance(time, bool) or not isinstance(time, (int, float)) or not 0 <= time < math.inf:
            raise InvalidArgumentError(f"a time is a finite number of seconds since the Unix epoch, not {time!r}")
        record = self._stream(scope, stream)
        chosen = record.head
        for recorded in reversed(record.recorded_cuts):
            if recorded.time <= time and all(record.history.segment(i) is not None for i in recorded.cut) \
                    and is_at_or_after(record.history, recorded.cut, record.head):
                chosen = recorded.cut
                break
        return StreamCut(f"{scope}/{stream}", chosen)

    async def check_stream_cut(self, scope: str, stream: str, cut: Mapping[int, int]) -> None:
        self._check_open()
        await self._validated_cut(self._stream(scope, stream), cut, after_head=True)

    async def truncate_stream(self, scope: str, stream: str, cut: Mapping[int, int], *,
                              manual: bool = True) -> None:
        key = (scope, self._stream(scope, stream).name)

        async def work() -> None:
            record = self._stream(scope, stream)
            await self._validated_cut(record, cut, after_head=True)
            if dict(cut) == record.head:
                return  # already there

            def plan(state: ControllerState) -> dict[str, Any]:
                current = self._stream(scope, stream)
                if not is_at_or_after(current.history, cut, current.head):
                    raise InvalidStreamCutError(f"the cut lies before the head of {scope}/{stream}")
                return {"type": "truncation_started", "scope": scope, "stream": stream, "cut": _cut_json(cut),
                        "manual": manual}
            await self._commit(plan)
            await self._finish_pending(key)
        await self._locked(key, work)

    async def get_segments_between(self, scope: str, stream: str, from_cut: Mapping[int, int] | None,
                                   to_cut: Mapping[int, int] | None) -> list[SegmentSlice]:
        self._check_open()
        record = self._stream(scope, stream)
        start = record.head if from_cut is None else dict(from_cut)
        # (Not checked for event boundaries: readers and the Spark source ask for slices between the
        # same cuts again and again; the cuts were checked where they came in, and a reader given a
        # cut that splits an event fails there with MalformedEventError, never silently.)
        if from_cut is not None:
            await self._validated_cut(record, from_cut, after_head=True, boundaries=False)
        if to_cut is not None:
            await self._validated_cut(record, to_cut, after_head=True, boundaries=False)
        slices = segments_between(record.history, start, to_cut, record.sealed_lengths)
        return [SegmentSlice(self._segment(record, s.segment), s.start_offset,
                             None if s.end_offset < 0 else s.end_offset, frozenset(s.predecessors)) for s in slices]

    # --- Reader groups -----------------------------------------------------------------------------

    def _group(self, scope: str, group: str) -> Any:
        found = self._state.groups.get((scope, group))
        if found is None:
            if scope not in self._state.scopes:
                raise ScopeNotFoundError(f"scope {scope!r} does not exist")
            raise ReaderGroupNotFoundError(f"reader group {scope}/{group} does not exist")
        return found

    async def _check_group_config(self, config: ReaderGroupConfig) -> None:
        if not isinstance(config, ReaderGroupConfig):
            raise InvalidArgumentError(f"config must be a ReaderGroupConfig, not {config!r}")
        for name, (start, end) in config.streams.items():
            scope, stream = name.split("/")
            record = self._stream(scope, stream)
            if start is not None:
                await self._validated_cut(record, start.positions, after_head=True)
            if end is not None:
                await self._validated_cut(record, end.positions, after_head=False)
                if start is not None and not is_at_or_after(record.history, end.positions, start.positions):
                    raise InvalidStreamCutError(f"the end cut of {name} lies before its start cut")

    async def create_reader_group(self, scope: str, group: str, config: ReaderGroupConfig) -> str:
        validate_scope_or_stream_name(scope, what="scope")
        validate_scope_or_stream_name(group, what="reader group")
        self._check_open()

        def check(state: ControllerState) -> None:
            if scope not in state.scopes:
                raise ScopeNotFoundError(f"scope {scope!r} does not exist")
            if (scope, group) in state.groups:
                raise ReaderGroupExistsError(f"reader group {scope}/{group} exists already")
            if len(state.groups) >= limits.CONTROLLER_READER_GROUPS_MAX:
                raise InvalidArgumentError(f"there are {limits.CONTROLLER_READER_GROUPS_MAX} reader groups already")

        check(self._state)
        await self._check_group_config(config)
        state_segment = reader_group_state_segment(scope, group)
        await self._store.create_segment(state_segment)

        def plan(state: ControllerState) -> dict[str, Any]:
            check(state)
            return {"type": "reader_group_created", "scope": scope, "group": group,
                    "config": config.to_json_object(), "state_segment": state_segment}
        await self._commit(plan)
        return state_segment

    async def get_reader_group(self, scope: str, group: str) -> ReaderGroupInfo:
        self._check_open()
        found = self._group(scope, group)
        return ReaderGroupInfo(scope, group, found.config, found.state_segment, found.generation)

    async def list_reader_groups(self, scope: str) -> list[str]:
        self._check_open()
        if scope not in self._state.scopes:
            raise ScopeNotFoundError(f"scope {scope!r} does not exist")
        return [g.name for g in self._state.groups_of(scope)]

    async def update_reader_group(self, scope: str, group: str, config: ReaderGroupConfig,
                                  expected_generation: int | None = None) -> int:
        self._check_open()
        self._group(scope, group)
        await self._check_group_config(config)

        def plan(state: ControllerState) -> dict[str, Any]:
            found = self._group(scope, group)
            if expected_generation is not None and found.generation != expected_generation:
                raise InvalidArgumentError(f"reader group {scope}/{group} is at generation {found.generation}, "
                                           f"not {expected_generation}")
            return {"type": "reader_group_updated", "scope": scope, "group": group,
                    "config": config.to_json_object(), "generation": found.generation + 1}
        record = await self._commit(plan)
        assert record is not None
        return int(record["generation"])

    async def delete_reader_group(self, scope: str, group: str) -> None:
        self._check_open()
        found = self._group(scope, group)
        await self._store.delete(found.state_segment)  # first the state: a group recorded has its segment

        def plan(state: ControllerState) -> dict[str, Any]:
            self._group(scope, group)
            return {"type": "reader_group_deleted", "scope": scope, "group": group}
        await self._commit(plan)

    async def update_subscriber_cut(self, scope: str, group: str, stream: str,
                                    cut: Mapping[int, int]) -> None:
        self._check_open()
        found = self._group(scope, group)
        if stream not in found.config.streams:
            raise InvalidStreamCutError(f"reader group {scope}/{group} does not read {stream!r}")
        stream_scope, stream_name = stream.split("/")
        # (Readers publish their checkpoints' positions here, every few seconds: not scanned for event
        # boundaries each time -- retention checks the cut it truncates at, in truncate_stream.)
        await self._validated_cut(self._stream(stream_scope, stream_name), cut, after_head=False, boundaries=False)

        def plan(state: ControllerState) -> dict[str, Any]:
            self._group(scope, group)
            return {"type": "subscriber_cut_updated", "scope": scope, "group": group, "stream": stream,
                    "cut": _cut_json(cut)}
        await self._commit(plan)

    # --- Where segments are served -----------------------------------------------------------------

    async def get_segment_uri(self, segment: str) -> str:
        self._check_open()
        return self._store.uri_of(segment)

    # --- Periodic work -----------------------------------------------------------------------------

    async def _run_periodic(self) -> None:
        while True:
            await self._clock.sleep(self.config.tick_seconds)
            try:
                await self.tick()
            except Exception:  # one failed tick must not end auto-scaling and retention for good
                self.failed_ticks += 1
                log.exception("controller: a periodic tick failed")

    async def tick(self) -> None:
        """One round of periodic work: fold the store's append counts into the rates, auto-scale,
        (every tail-cut interval) record tail cuts and apply retention, resume pending workflows."""
        self._check_open()
        now = self._time()
        self._observe_rates(now)
        for key in list(self._rates):
            await self._auto_scale(key, now)
        if self._next_tail_cut is None:
            self._next_tail_cut = now + self.config.tail_cut_interval_seconds
        elif now >= self._next_tail_cut:
            self._next_tail_cut = now + self.config.tail_cut_interval_seconds
            for key in list(self._state.streams):
                await self._record_tail_cut(key)
                await self._apply_retention(key, now)
        if self.config.transaction_workflows:
            await self.expire_leases()
        await self.resume_pending()
        self._kick_all()
        self._last_tick = now

    def _observe_rates(self, now: float) -> None:
        counts = self._store.drain_append_counts()
        for key, stream in self._state.streams.items():
            if not stream.config.scaling.auto_scaling or stream.sealed:
                self._rates.pop(key, None)
                continue
            previous = self._rates.get(key, {})
            rates: dict[int, SegmentRates] = {}
            for segment in stream.current.segments:
                measured = previous.get(segment.segment_id)
                if measured is None:
                    rates[segment.segment_id] = SegmentRates.start(now)
                    continue
                appended = counts.get(self._name(stream, segment.segment_id))
                size, events = (appended.bytes, appended.events) if appended is not None else (0, 0)
                rates[segment.segment_id] = fold_sample(measured, size, events, now)
            self._rates[key] = rates
        for key in [k for k in self._rates if k not in self._state.streams]:
            del self._rates[key]

    async def _auto_scale(self, key: _Key, now: float) -> None:
        stream = self._state.streams.get(key)
        rates = self._rates.get(key)
        if stream is None or rates is None or stream.sealed or stream.state is not StreamState.IDLE \
                or self._lock(key).locked() or now < self._muted_until.get(key, 0.0):
            return
        policy = stream.config.scaling
        signals = {identifier: scale_signal(measured, policy, now,
                                            cooldown_seconds=self.config.auto_scale_cooldown_seconds)
                   for identifier, measured in rates.items()}
        plan = plan_auto_scale(stream.current.segments, signals, policy)
        if plan is None:
            return
        self._muted_until[key] = now + self.config.auto_scale_mute_seconds
        log.info("auto-scaling %s/%s: %d splits, %d merges", key[0], key[1], plan.splits, plan.merges)
        try:
            await self.scale_stream(key[0], key[1], plan.seal, plan.new_ranges, manual=False)
        except Exception:
            log.exception("auto-scaling %s/%s failed", key[0], key[1])
            return
        self.auto_scales += 1

    async def _record_tail_cut(self, key: _Key) -> None:
        stream = self._state.streams.get(key)
        if stream is None or stream.state is not StreamState.IDLE or self._lock(key).locked():
            return
        tail = dict((await self.get_tail_cut(*key)).positions)
        if stream.recorded_cuts and stream.recorded_cuts[-1].cut == tail:
            return  # nothing changed since the last recording

        def plan(state: ControllerState) -> dict[str, Any] | None:
            current = state.streams.get(key)
            if current is None or current.state is not StreamState.IDLE:
                return None
            return {"type": "tail_cut_recorded", "scope": key[0], "stream": key[1], "cut": _cut_json(tail)}
        await self._commit(plan)

    async def _apply_retention(self, key: _Key, now: float) -> None:
        stream = self._state.streams.get(key)
        if stream is None or stream.state is not StreamState.IDLE or self._lock(key).locked() \
                or stream.config.retention.kind == "none":
            return
        subscribers = [g.subscriber_cuts.get(stream.qualified_name) for g in self._state.subscribers_of(
            stream.qualified_name)]
        tail = dict((await self.get_tail_cut(*key)).positions)
        chosen = choose_truncation(stream.config.retention, history=stream.history, head=stream.head, tail=tail,
                                   recorded=stream.recorded_cuts, sealed_lengths=stream.sealed_lengths, now=now,
                                   subscriber_cuts=subscribers)
        if chosen is None:
            return
        log.info("retention (%s) truncates %s/%s", stream.config.retention.kind, key[0], key[1])
        try:
            await self.truncate_stream(key[0], key[1], chosen, manual=False)
        except Exception:
            log.exception("retention of %s/%s failed", key[0], key[1])
            return
        self.retention_truncations += 1

    def check_invariants(self) -> None:
        self._state.check_invariants()
        for key, rates in self._rates.items():
            stream = self._state.streams.get(key)
            assert stream is not None and set(rates) <= {s.segment_id for s in stream.history.segments()}, key


async def _nothing() -> None:
    return None

