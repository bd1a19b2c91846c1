"""A small segment store that speaks the wire contract, in memory, with faults on demand.

It follows the client/server contract (see the client brief and ``millstream.wire.commands``) closely
enough that the client's behaviour against it means something -- in particular appends are stored
with the writer's event number as a segment attribute, by compare-and-set against the previous
block's number on the same connection (starting from ``AppendSetup``'s value), exactly what makes a
resend after a reconnect idempotent.  Everything is synchronous within the event loop, so
acknowledgements come back in order unless a fault reorders them.

Faults (``Faults``), each named after what a real network or server can do:

* ``drop_reply(reply)``     -- the reply is not sent (a lost acknowledgement, a lost answer);
* ``cut(block)``            -- for an ``AppendBlock``: ``"before"`` closes the connection without
  storing the block, ``"after"`` stores it and closes before acknowledging it;
* ``reorder_acks``          -- acknowledgements are held and released in reverse order, two by two;
* ``hold_acks``             -- acknowledgements are held until ``release_acks()`` (a slow server);
* ``invalid_event_number(block)`` -- answer ``InvalidEventNumber`` and close, storing nothing;
* ``seal_after_blocks``     -- the segment is sealed once that many blocks were stored in it;
* ``error_reply(command)``  -- answer a request with this reply instead (e.g. ``WrongHost``);
* ``silent``                -- answer nothing at all (not even keep-alives).

``history`` records every stored block as ``(segment, writer_id, first_event_number,
last_event_number, payloads)`` so tests can check for loss, duplication and order.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

from millstream.errors import BadOffsetError, StreamSegmentNotSealedError
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.wire import codec
from millstream.wire.commands import (
    AppendBlock,
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
    ConditionalAppend,
    ConditionalCheckFailed,
    CreateSegment,
    DataAppended,
    DeleteSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    MergeSegments,
    NoSuchSegment,
    ReadSegment,
    SealSegment,
    SegmentAlreadyExists,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
)
from millstream.wire.error_codes import error_code_of


@dataclass
class FakeSegment:
    data: bytearray = field(default_factory=bytearray)
    start: int = 0
    sealed: bool = False
    attributes: dict[int, int] = field(default_factory=dict)
    blocks: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.start + len(self.data)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


@dataclass
class Faults:
    drop_reply: Callable[[Command], bool] | None = None
    cut: Callable[[AppendBlock], str | None] | None = None
    reorder_acks: bool = False
    hold_acks: bool = False
    invalid_event_number: Callable[[AppendBlock], bool] | None = None
    seal_after_blocks: int | None = None
    error_reply: Callable[[Command], Command | None] | None = None
    silent: bool = False


@dataclass
class WriterState:
    segment: str
    request_id: int
    compare: int  # the stored value the next block's compare-and-set expects
    last: int  # the last event number this connection received for the writer
    sealed: bool = False


class _Connection(asyncio.Protocol):
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.decoder = codec.Decoder()
        self.transport: asyncio.Transport | None = None
        self.writers: dict[UUID, WriterState] = {}
        self.held: list[DataAppended] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.append(self)
        self.server.connection_count += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for task in self.tasks:
            task.cancel()

    def cut(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def send(self, reply: Command) -> None:
        faults = self.server.faults
        if self.closed or faults.silent:
            return
        if faults.drop_reply is not None and faults.drop_reply(reply):
            self.server.dropped.append(reply)
            return
        if faults.hold_acks and type(reply) is DataAppended:
            self.held.append(reply)
            return
        if faults.reorder_acks and type(reply) is DataAppended:
            self.held.append(reply)
            if len(self.held) == 2:
                self._release()
            else:
                asyncio.get_running_loop().call_later(0.005, self._release)
            return
        assert self.transport is not None
        self.transport.write(codec.encode(reply))

    def _release(self) -> None:
        held, self.held = self.held, []
        for reply in reversed(held):
            if not self.closed and self.transport is not None:
                self.transport.write(codec.encode(reply))

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.decoder.feed(data)
        except codec.WireProtocolError:
            self.cut()
            return
        for command in commands:
            if self.closed:
                return
            self.server.received.append(command)
            self.handle(command)

    # --- Requests ----------------------------------------------------------------------------------

    def handle(self, command: Command) -> None:
        server = self.server
        kind = type(command)
        if kind is Hello:
            if not server.faults.silent:
                self.send(Hello(codec.WIRE_VERSION, codec.OLDEST_COMPATIBLE_VERSION))
            return
        if kind is KeepAlive:
            return
        if server.faults.error_reply is not None:
            replacement = server.faults.error_reply(command)
            if replacement is not None:
                self.send(replacement)
                return
        token = getattr(command, "token", None)
        if server.token is not None and token is not None and token != server.token:
            self.send(AuthTokenCheckFailed(command.request_id, "bad token"))  # type: ignore[attr-defined]
            return
        handler = getattr(self, f"on_{kind.__name__}", None)
        if handler is None:
            self.cut()
            return
        handler(command)

    def segment(self, request_id: int, name: str) -> FakeSegment | None:
        segment = self.server.segments.get(name)
        if segment is None:
            self.send(NoSuchSegment(request_id, name))
        return segment

    def on_CreateSegment(self, c: CreateSegment) -> None:
        if c.segment in self.server.segments:
            self.send(SegmentAlreadyExists(c.request_id, c.segment))
            return
        self.server.segments[c.segment] = FakeSegment()
        self.send(SegmentCreated(c.request_id, c.segment))

    def on_GetSegmentInfo(self, c: GetSegmentInfo) -> None:
        s = self.server.segments.get(c.segment)
        if s is None:
            self.send(SegmentInfo(c.request_id, c.segment, False, False, False, 0, 0, 0))
        else:
            self.send(SegmentInfo(c.request_id, c.segment, True, s.sealed, False, s.start, s.length, 1_700_000_000_000))

    def on_SealSegment(self, c: SealSegment) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is not None:
            s.sealed = True
            s.wake()
            self.send(SegmentSealed(c.request_id, c.segment))

    def on_DeleteSegment(self, c: DeleteSegment) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is not None:
            del self.server.segments[c.segment]
            s.wake()
            self.send(SegmentDeleted(c.request_id, c.segment))

    def on_TruncateSegment(self, c: TruncateSegment) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is None:
            return
        if not s.start <= c.offset <= s.length:
            self.send(ErrorMessage(c.request_id, c.segment, error_code_of(BadOffsetError()), "bad truncation offset"))
            return
        del s.data[:c.offset - s.start]
        s.start = c.offset
        self.send(SegmentTruncated(c.request_id, c.segment))

    def on_MergeSegments(self, c: MergeSegments) -> None:
        target = self.segment(c.request_id, c.target)
        source = self.segment(c.request_id, c.source) if target is not None else None
        if target is None or source is None:
            return
        if source.start != 0:
            self.send(ErrorMessage(c.request_id, c.source, error_code_of(StreamSegmentNotSealedError()), "truncated"))
            return
        source.sealed = True
        target.data += source.data
        del self.server.segments[c.source]
        target.wake()
        self.send(SegmentsMerged(c.request_id, c.target, c.source, target.length))

    def on_GetSegmentAttribute(self, c: GetSegmentAttribute) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is not None:
            self.send(SegmentAttribute(c.request_id, s.attributes.get(c.attribute_id, NULL_ATTRIBUTE_VALUE)))

    def on_UpdateSegmentAttribute(self, c: UpdateSegmentAttribute) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is None:
            return
        current = s.attributes.get(c.attribute_id, NULL_ATTRIBUTE_VALUE)
        success = current == c.expected_value
        if success:
            if c.new_value == NULL_ATTRIBUTE_VALUE:
                s.attributes.pop(c.attribute_id, None)
            else:
                s.attributes[c.attribute_id] = c.new_value
        self.send(SegmentAttributeUpdated(c.request_id, success))

    def on_ReadSegment(self, c: ReadSegment) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is None:
            return
        if c.offset < s.start:
            self.send(SegmentIsTruncated(c.request_id, c.segment, s.start))
            return
        if c.offset > s.length:
            self.send(ErrorMessage(c.request_id, c.segment, error_code_of(BadOffsetError()), "beyond the end"))
            return
        if c.offset == s.length and not s.sealed and c.wait_ms > 0:
            task = asyncio.get_running_loop().create_task(self._tail_read(c, s))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        self._answer_read(c, s)

    async def _tail_read(self, c: ReadSegment, s: FakeSegment) -> None:
        waiter = asyncio.get_running_loop().create_future()
        s.waiters.append(waiter)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, c.wait_ms / 1000)
        current = self.server.segments.get(c.segment)
        if current is None:
            self.send(NoSuchSegment(c.request_id, c.segment))
        else:
            self._answer_read(c, current)

    def _answer_read(self, c: ReadSegment, s: FakeSegment) -> None:
        begin = c.offset - s.start
        data = bytes(s.data[begin:begin + min(c.suggested_length, 2 * 1024 * 1024)])
        end = c.offset + len(data)
        self.send(SegmentRead(c.request_id, c.segment, c.offset, end == s.length, s.sealed and end == s.length, data))

    # --- Appends -----------------------------------------------------------------------------------

    def on_SetupAppend(self, c: SetupAppend) -> None:
        s = self.segment(c.request_id, c.segment)
        if s is None:
            return
        stored = s.attributes.get(c.writer_id.int, NULL_ATTRIBUTE_VALUE)
        self.writers[c.writer_id] = WriterState(c.segment, c.request_id, stored, stored)
        self.server.setups.append((c.writer_id, stored))
        self.send(AppendSetup(c.request_id, c.segment, c.writer_id, stored))

    def on_AppendBlock(self, c: AppendBlock) -> None:
        server = self.server
        state = self.writers.get(c.writer_id)
        if state is None:
            self.cut()
            return
        s = server.segments.get(state.segment)
        if state.sealed and s is not None:
            self.send(SegmentIsSealed(c.request_id, state.segment, s.length))  # every later block, too
            return
        if s is None:
            self.send(NoSuchSegment(c.request_id, state.segment))
            return
        if server.faults.cut is not None:
            decision = server.faults.cut(c)
            if decision == "before":
                self.cut()
                return
        else:
            decision = None
        if c.last_event_number <= state.last or codec.count_events(c.data) != c.event_count or (
                server.faults.invalid_event_number is not None and server.faults.invalid_event_number(c)):
            self.send(InvalidEventNumber(c.request_id, c.writer_id, c.last_event_number))
            self.cut()
            return
        state.last = c.last_event_number
        if s.sealed:
            state.sealed = True
            self.send(SegmentIsSealed(c.request_id, state.segment, s.length))
            return
        stored = s.attributes.get(c.writer_id.int, NULL_ATTRIBUTE_VALUE)
        if stored != state.compare:
            self.send(InvalidEventNumber(c.request_id, c.writer_id, c.last_event_number))
            self.cut()
            return
        previous = stored
        s.data += c.data
        s.attributes[c.writer_id.int] = c.last_event_number
        state.compare = c.last_event_number
        s.blocks += 1
        server.history.append((state.segment, c.writer_id, c.last_event_number - c.event_count + 1,
                               c.last_event_number, list(codec.iter_events(c.data))))
        s.wake()
        if server.faults.seal_after_blocks is not None and s.blocks >= server.faults.seal_after_blocks:
            s.sealed = True
        if decision == "after":
            self.cut()
            return
        self.send(DataAppended(c.request_id, c.writer_id, c.last_event_number, previous, s.length))

    def on_ConditionalAppend(self, c: ConditionalAppend) -> None:
        state = self.writers.get(c.writer_id)
        if state is None:
            self.cut()
            return
        s = self.segment(c.request_id, state.segment)
        if s is None:
            return
        if s.sealed:
            self.send(SegmentIsSealed(c.request_id, state.segment, s.length))
            return
        if s.length != c.expected_offset:
            self.send(ConditionalCheckFailed(c.request_id, c.writer_id, c.event_number))
            return
        stored = s.attributes.get(c.writer_id.int, NULL_ATTRIBUTE_VALUE)
        if c.event_number <= stored:
            self.send(InvalidEventNumber(c.request_id, c.writer_id, c.event_number))
            self.cut()
            return
        s.data += c.data
        s.attributes[c.writer_id.int] = c.event_number
        s.wake()
        self.send(DataAppended(c.request_id, c.writer_id, c.event_number, stored, s.length))


class FakeServer:
    """An in-memory segment store on a loopback port.  ``async with FakeServer() as server:``."""

    def __init__(self, *, faults: Faults | None = None, token: str | None = None) -> None:
        self.faults = faults or Faults()
        self.token = token
        self.segments: dict[str, FakeSegment] = {}
        self.connections: list[_Connection] = []
        self.connection_count = 0
        self.received: list[Command] = []
        self.dropped: list[Command] = []
        self.setups: list[tuple[UUID, int]] = []
        self.history: list[tuple[str, UUID, int, int, list[bytes]]] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), "127.0.0.1", port or self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every connection (a crashed server)."""
        if self._server is not None:
            self._server.close()
            for connection in self.connections:
                connection.cut()
            await self._server.wait_closed()
            self._server = None

    def release_acks(self) -> None:
        """Send every held acknowledgement, in order (and stop holding them)."""
        self.faults.hold_acks = False
        for connection in self.connections:
            held, connection.held = connection.held, []
            for reply in held:
                connection.send(reply)

    def cut_all(self) -> None:
        for connection in self.connections:
            connection.cut()

    def blocks_of(self, command_type: type[Command]) -> list[Command]:
        return [c for c in self.received if type(c) is command_type]

    def payloads(self, segment: str) -> list[bytes]:
        s = self.segments[segment]
        assert s.start == 0
        return list(codec.iter_events(bytes(s.data)))

    async def __aenter__(self) -> FakeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class FakeServerThread:
    """A ``FakeServer`` on an event loop of its own thread (for tests of the blocking client)."""

    def __init__(self, **options: object) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FakeServer(**options)  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self.server

    def call(self, function: Callable[[], object]) -> object:
        async def run() -> object:
            return function()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
