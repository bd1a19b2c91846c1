"""Helpers for the transaction tests: a store that crashes the controller at its n-th change, events
written straight into transaction segments and stream segments, and every key's events read back the
way a reader meets them (epoch by epoch, the segment owning the key)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from millstream.client import routing_key_fraction
from millstream.controller import Controller, LocalSegmentStore
from millstream.controller._segment_store import AppendCounts, SegmentState
from millstream.naming import stream_segment_name, transaction_segment_name
from millstream.segmentstore.read_index import ReadResult
from millstream.values import TransactionInfo
from millstream.wire import encode_event
from millstream.wire.codec import iter_events
from tests.controller.helpers import Crash, Harness

SCOPE, STREAM = "sc", "st"
#: Operations that change the store (what a crash can interrupt).
CHANGES = ("create_segment", "append", "seal", "merge", "delete", "truncate")


class CrashingStore:
    """A ``SegmentStore`` passing every call to ``inner`` and recording the changes it makes; once
    ``arm``ed, its ``n``-th change from then on raises ``Crash`` -- before reaching the store, or, with
    ``landed=True``, after it did (the controller dies before it learns the outcome)."""

    def __init__(self, inner: LocalSegmentStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self._countdown = 0
        self._landed = False

    def arm(self, n: int, *, landed: bool = False) -> None:
        self.calls, self._countdown, self._landed = [], n, landed

    def disarm(self) -> None:
        self._countdown = 0

    async def _change(self, operation: str, name: str, call: Any) -> Any:
        self.calls.append((operation, name))
        if self._countdown:
            self._countdown -= 1
            if self._countdown == 0:
                if self._landed:
                    await call()
                raise Crash(f"{operation} {name} (#{len(self.calls)}, {'landed' if self._landed else 'not sent'})")
        return await call()

    async def create_segment(self, name: str) -> bool:
        return await self._change("create_segment", name, lambda: self.inner.create_segment(name))

    async def append(self, name: str, data: bytes, *, expected_offset: int) -> int:
        return await self._change("append", name,
                                  lambda: self.inner.append(name, data, expected_offset=expected_offset))

    async def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        return await self.inner.read(name, offset, max_length)

    async def get_info(self, name: str) -> SegmentState | None:
        return await self.inner.get_info(name)

    async def seal(self, name: str) -> int:
        return await self._change("seal", name, lambda: self.inner.seal(name))

    async def truncate(self, name: str, offset: int) -> None:
        await self._change("truncate", name, lambda: self.inner.truncate(name, offset))

    async def check_event_boundary(self, name: str, offset: int) -> None:
        await self.inner.check_event_boundary(name, offset)  # (reads only: not a change a crash interrupts)

    async def delete(self, name: str) -> bool:
        return await self._change("delete", name, lambda: self.inner.delete(name))

    async def merge(self, target: str, source: str) -> bool:
        return await self._change("merge", source, lambda: self.inner.merge(target, source))

    def uri_of(self, name: str) -> str:
        return self.inner.uri_of(name)

    def container_of(self, name: str) -> int:
        return self.inner.container_of(name)

    def drain_append_counts(self) -> dict[str, AppendCounts]:
        return self.inner.drain_append_counts()


@attrs.frozen(order=True)
class Ev:
    """An event's identity in these tests: its source (a transaction's label, or ``plain``), key and
    number among its source's events.  Its payload is ``source|key|number``."""

    source: str
    key: str
    number: int

    def payload(self) -> bytes:
        return f"{self.source}|{self.key}|{self.number}".encode()

    @classmethod
    def parse(cls, payload: bytes) -> Ev:
        source, key, number = payload.decode().split("|")
        return cls(source, key, int(number))


def owner(segments: Sequence[Any], key: str) -> Any:
    """The segment (of one epoch: records or dicts with key ranges) that owns ``key``."""
    point = routing_key_fraction(key)
    for segment in segments:
        start, end = (segment["key_start"], segment["key_end"]) if isinstance(segment, dict) else (
            segment.key_start, segment.key_end)
        if start <= point < end:
            return segment
    raise AssertionError(f"no segment owns {key!r}")


def keys_in(low: float, high: float, count: int = 1, prefix: str = "key") -> list[str]:
    """``count`` routing keys that hash into [low, high)."""
    found = []
    for n in range(100_000):
        key = f"{prefix}-{n}"
        if low <= routing_key_fraction(key) < high:
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} keys in [{low}, {high})")


async def write_txn(test: Harness, info: TransactionInfo, events: Sequence[Ev]) -> None:
    """Append ``events`` to the transaction ``info`` (``create_transaction``'s answer) by key."""
    for event in events:
        parent = owner(info.segments, event.key).name
        name = transaction_segment_name(parent, info.txn_id)
        await test.container(name).append(name, encode_event(event.payload()))


async def write_plain(test: Harness, controller: Controller, events: Sequence[Ev]) -> None:
    """Append ``events`` to the stream's current epoch, each to the segment owning its key."""
    stream = controller.state.streams[(SCOPE, STREAM)]
    for event in events:
        segment = owner(stream.current.segments, event.key)
        name = stream_segment_name(SCOPE, STREAM, segment.segment_id)
        await test.container(name).append(name, encode_event(event.payload()))


async def read_segment(test: Harness, name: str) -> list[Ev]:
    info = test.segment(name)
    data = b""
    while len(data) < info.length:
        result = await test.container(name).read(name, len(data), info.length - len(data))
        data += bytes(result.data)
    return [Ev.parse(p) for p in iter_events(data)]


async def read_key(test: Harness, controller: Controller, key: str, *, epochs: int | None = None) -> list[Ev]:
    """What a reader of ``key`` reads: for every epoch (up to the current one), the events of ``key``
    in the segment that owns it."""
    stream = controller.state.streams[(SCOPE, STREAM)]
    events: list[Ev] = []
    for epoch in stream.history.epochs[:epochs]:
        segment = owner(epoch.segments, key)
        events += [e for e in await read_segment(test, stream_segment_name(SCOPE, STREAM, segment.segment_id))
                   if e.key == key]
    return events


def transaction_segments(info: TransactionInfo) -> list[str]:
    return [s.name for s in info.transaction_segments]


def exists(test: Harness, name: str) -> bool:
    from millstream.errors import StreamSegmentNotExistsError

    try:
        test.segment(name)
    except StreamSegmentNotExistsError:
        return False
    return True
