"""Large events, in lockstep with the model (``millstream.model.large_events``, ``spec/LargeEvents.tla``).

Hypothesis drives a real segment store (in this process, on the simulated tiers, its clock a manual
one) and a real ``AsyncClient`` -- its ``AsyncLargeEventWriter`` over one named segment, the parent --
through a TCP proxy this test controls, and the model through the same steps.  The proxy is what
makes the model's environment choices real: it passes every frame through except a large event's
chunk session (``SetupAppend`` and ``ConditionalBlockEnd`` of an EventWriter's writer id on a transient
segment), which it holds until a rule lets it go.  So

* ``SendChunk(w)`` is the application writing one chunk (the client sends it; the proxy holds it);
* ``AppendChunk(w, c)`` is the proxy handing the oldest held chunk of connection ``c`` to the store --
  on the writer's current connection its reply reaches the client, on an older one (a request that
  reached the store from a connection that was cut) the reply is lost;
* ``Disconnect(w, kept)`` cuts the TCP connection under the writer's session (with ``everything``,
  every connection the client has): the first ``kept`` held chunks of each writer on it still reach
  the store later, the rest are lost, and so are all replies.  The client reconnects by itself; the
  proxy holds its ``SetupAppend`` while the model says the writer is down;
* ``Reconnect(w)`` lets that ``SetupAppend`` through: the client resends every unacknowledged chunk;
* ``CreateTransient(w)`` is the write that takes the event past the inline limit, ``Commit``/``Merge``
  one ``commit()`` (the proxy then passes the writer's frames through), ``Abort`` a ``close()``;
* ``DeleteOnDisconnect(w)`` is the store's grace period running out (the manual clock moves, the
  sweep runs) for a transient segment nobody is connected to, ``Expire(w)`` its idle time running out;
* ``WriteOrdinary``/``DeliverOrdinary`` an ordinary event of the same routing key, written and flushed.

A seal of the parent (the stream scaled) is outside the model; after it the test lets only streamed
events go on, and their commits must fail (``LargeEventFailedError``, nothing merged): in the model,
the transient segment goes away (``Expire``) just before the ``Merge``.

The model abstracts the event's framing header as part 0; the implementation writes it into a second
transient segment at commit.  Part 0 is sent and acknowledged when the transient segment is created, so
the model's transient segment of ``L`` parts is the real one of ``L - 1`` chunks.

After every step the two agree on: what the parent holds, event by event (large ones byte for byte);
each transient segment's state and length; each writer's acknowledged chunks and phase (a writer whose
transient segment the store deleted may already know it failed while the model has not delivered the
reply yet -- "doomed" -- and fails at its commit); the chunks the proxy holds per connection versus the
model's requests on their way; and both sides' invariants.  At the end the history checker reads the
parent: every committed event once, in order, large ones whole; nothing of an aborted or failed one.

Bounds: three EventWriters of 2 (inline), 3 and 4 chunks; three ordinary events; three disconnects;
two grace periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
from collections.abc import Callable
from typing import Any
from uuid import UUID

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from millstream.client import AsyncClient, ClientConfig, EventWriterPhase, LargeEventConfig
from millstream.client._large_events import AsyncEventWriter
from millstream.errors import LargeEventFailedError
from millstream.model import large_events as le
from millstream.naming import is_transient_segment
from millstream.server import SegmentStoreServer, ServerConfig
from millstream.testing.clock import ManualClock
from millstream.testing.history import EventTag, History, Outcome, check
from millstream.wire.codec import Decoder, iter_events
from millstream.wire.commands import ConditionalBlockEnd, SetupAppend
from tests.server.raw import Tiers

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
PARENT = "le/m/0"
KEY = "k"
CHUNK = 256
INLINE_CHUNKS = 2
PARTS = (2, 3, 4)  # writer 1 commits inline; 2 and 3 stream through transient segments
MAX_ORDINARY = 3
MAX_DISCONNECTS = 3
MAX_GRACE_PERIODS = 2
GRACE_SECONDS = 10.0
IDLE_SECONDS = 1000.0
STEP_TIMEOUT_SECONDS = 20.0
WAIT_SECONDS = 5.0
#: How long a streamed commit runs while its chunks are still held (a commit that merged before its
#: chunks were acknowledged would return in this time).
COMMIT_RACE_SECONDS = 0.02

_FRAME_HEADER = struct.Struct(">ii")
LARGE = LargeEventConfig(inline_bytes_max=INLINE_CHUNKS * CHUNK, chunk_bytes=CHUNK, unacked_bytes_max=16 * CHUNK,
                         event_length_max=64 * CHUNK)


def chunk_of(w: int, index: int) -> bytes:
    """Chunk ``index`` (0-based) of writer ``w``'s event: the first starts with its history tag."""
    data = random.Random(f"{w}/{index}").randbytes(CHUNK)
    if index == 0:
        head = large_tag(w).payload(0, key=KEY)
        data = (head + data)[:CHUNK]
    return data


def large_tag(w: int) -> EventTag:
    """Writer ``w``'s event, as the history checker knows it: a sequence of its own (large events take
    their place in the order at commit, not when opened; that order is checked against the model)."""
    return EventTag(f"large-{w}", 1)


def event_of(w: int) -> bytes:
    return b"".join(chunk_of(w, i) for i in range(PARTS[w - 1]))


def ordinary_payload(n: int) -> bytes:
    return EventTag("ordinary", n).payload(0, key=KEY)


def note(value: str) -> None:
    """Count ``value`` in Hypothesis's statistics (``--hypothesis-show-statistics``); nothing in a
    scripted run."""
    with contextlib.suppress(InvalidArgument):
        event(value)


# --- The proxy -------------------------------------------------------------------------------------


class _Link:
    """One client connection through the proxy, and its connection to the store."""

    def __init__(self, number: int, client: asyncio.StreamWriter, store: asyncio.StreamWriter) -> None:
        self.number = number
        self.client = client
        self.store = store
        self.client_open = True
        self.store_open = True
        self.sessions: dict[int, int] = {}  # request id of a held writer's chunk session -> w
        self.held: dict[int, list[tuple[int, bytes]]] = {}  # w -> [(request id, frame)] not passed yet
        self.replies: dict[int, int] = {}  # request id -> replies the store sent for it


class ChunkProxy:
    """A TCP proxy between the client and the store that holds the chunk sessions of registered
    EventWriters (by writer id) until told to pass them (see the module docstring)."""

    def __init__(self, store_port: int) -> None:
        self.store_port = store_port
        self.links: dict[int, _Link] = {}
        self.writers: dict[UUID, int] = {}  # an EventWriter's writer id -> w
        #: w -> its event's transient segment (the first it set up appends to; the header's, at commit,
        #: passes untouched: the model's chunks are the first one's)
        self.segments: dict[int, str] = {}
        self.up: dict[int, bool] = {}  # w -> pass its SetupAppend (else hold it until ``reconnect``)
        self.passing: set[int] = set()  # w whose frames pass without holding (committing)
        self.current: dict[int, int] = {}  # w -> the link its session was last set up on
        self.setups: dict[int, tuple[int, bytes]] = {}  # w -> (link, SetupAppend frame) held
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._numbers = iter(range(1, 1_000_000))

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            self._close_client(link)
            self._close_store(link)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        store_reader, store_writer = await asyncio.open_connection("127.0.0.1", self.store_port)
        link = _Link(next(self._numbers), client_writer, store_writer)
        self.links[link.number] = link
        self._spawn(self._upstream(link, client_reader))
        self._spawn(self._downstream(link, store_reader))

    async def _upstream(self, link: _Link, reader: asyncio.StreamReader) -> None:
        decoder = Decoder()
        try:
            while link.client_open:
                header = await reader.readexactly(_FRAME_HEADER.size)
                kind, length = _FRAME_HEADER.unpack(header)
                frame = header + await reader.readexactly(length)
                if not link.client_open:
                    return  # cut: what had not reached the proxy is lost
                self._route(link, kind, frame, decoder)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._client_gone(link)

    def _route(self, link: _Link, kind: int, frame: bytes, decoder: Decoder) -> None:
        if kind == SetupAppend.TYPE:
            (command,) = decoder.feed(frame)
            assert isinstance(command, SetupAppend)
            w = self.writers.get(command.writer_id)
            if w is not None and is_transient_segment(command.segment) \
                    and self.segments.setdefault(w, command.segment) == command.segment:
                link.sessions[command.request_id] = w
                if w in self.passing or self.up.get(w, True):
                    self.current[w] = link.number
                    self._pass(link, frame)
                else:
                    self.setups[w] = (link.number, frame)
                return
        elif kind == ConditionalBlockEnd.TYPE:
            (command,) = decoder.feed(frame)
            assert isinstance(command, ConditionalBlockEnd)
            w = link.sessions.get(command.request_id)
            if w is not None and w not in self.passing:
                link.held.setdefault(w, []).append((command.request_id, frame))
                return
        else:
            decoder.feed(frame)  # (keeps the decoder's view of the stream whole)
        self._pass(link, frame)

    def _pass(self, link: _Link, frame: bytes) -> None:
        if link.store_open:
            link.store.write(frame)

    async def _downstream(self, link: _Link, reader: asyncio.StreamReader) -> None:
        decoder = Decoder()
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for command in decoder.feed(data):
                    request_id = getattr(command, "request_id", None)
                    if request_id is not None:
                        link.replies[request_id] = link.replies.get(request_id, 0) + 1
                if link.client_open:
                    link.client.write(data)
        except ConnectionError:
            pass
        finally:
            link.store_open = False
            self._close_client(link)

    def _client_gone(self, link: _Link) -> None:
        link.client_open = False
        for w, (number, _) in list(self.setups.items()):
            if number == link.number:
                del self.setups[w]
        if not any(link.held.values()):
            self._close_store(link)

    def _close_client(self, link: _Link) -> None:
        link.client_open = False
        link.client.transport.abort()

    def _close_store(self, link: _Link) -> None:
        if link.store_open:
            link.store_open = False
            link.store.close()

    # --- What the rules do -------------------------------------------------------------------------

    def held(self, w: int, link: int) -> int:
        return len(self.links[link].held.get(w, []))

    def cut(self, link_number: int, kept: dict[int, int]) -> None:
        """Cut the connection: its client side at once; of each writer's held chunks the first
        ``kept[w]`` still reach the store (``deliver``), the rest are lost."""
        link = self.links[link_number]
        for w, frames in link.held.items():
            del frames[kept.get(w, 0):]
        self._close_client(link)
        self._client_gone(link)

    async def deliver(self, w: int, link_number: int) -> None:
        """Pass the oldest held chunk of ``w`` on ``link``; wait for the store's reply to it."""
        link = self.links[link_number]
        request_id, frame = link.held[w].pop(0)
        before = link.replies.get(request_id, 0)
        self._pass(link, frame)
        await wait_until(lambda: link.replies.get(request_id, 0) > before or not link.store_open,
                         f"the store's reply to a chunk of writer {w}")
        if not link.client_open and not any(link.held.values()):
            self._close_store(link)

    def release_setup(self, w: int) -> None:
        number, frame = self.setups.pop(w)
        self.up[w] = True
        self.current[w] = number
        self._pass(self.links[number], frame)

    def pass_through(self, w: int) -> None:
        """From now on ``w``'s frames pass; its chunks held on its current connection go now, in order."""
        self.passing.add(w)
        link = self.links.get(self.current.get(w, -1))
        if link is not None and link.client_open:
            for _, frame in link.held.pop(w, []):
                self._pass(link, frame)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"waited {WAIT_SECONDS} s for {what}")
        await asyncio.sleep(0.001)


# --- The machine -----------------------------------------------------------------------------------


class LargeEventsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(1_000.0)  # the store's: grace periods and idle expiry
        self.model = le.initial_state(PARTS, INLINE_CHUNKS)
        tiers = Tiers("simulated")
        self.server = SegmentStoreServer(
            tiers.open_log, chunk_storage=tiers.open_chunk_storage(), clock=self.clock,
            config=ServerConfig(container_count=1, keepalive_interval_seconds=1e6, hello_timeout_seconds=1e6,
                                transient_disconnect_grace_seconds=GRACE_SECONDS, transient_idle_seconds=IDLE_SECONDS,
                                transient_sweep_interval_seconds=1e9))
        self.run(self.server.start())
        self.run(self.server.container_for(PARENT).create_segment(PARENT))
        self.proxy = ChunkProxy(int(self.server.uri.rsplit(":", 1)[1]))
        self.run(self.proxy.start())
        config = ClientConfig(connect_timeout_seconds=2.0, request_timeout_seconds=10.0,
                              reconnect_attempts_max=12, reconnect_delay_initial_seconds=0.001,
                              reconnect_delay_max_seconds=0.01)
        self.client, self.writer = self.run(self.connect(config))
        self.events: dict[int, AsyncEventWriter] = {}
        self.written = [0] * len(PARTS)  # chunks the application wrote into each EventWriter
        self.transient_names: dict[int, str] = {}
        self.links: dict[int, list[int]] = {}  # w -> the proxy link of each of its model connections
        self.sealed = False
        self.grace_periods = 0
        self.outcomes: dict[EventTag, Outcome | None] = {}  # what the history checker is told, in call order

    async def connect(self, config: ClientConfig) -> tuple[AsyncClient, Any]:
        client = AsyncClient(f"tcp://127.0.0.1:{self.proxy.port}", config=config, rng=random.Random(8))
        return client, client.large_event_writer([PARENT], config=LARGE)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_TIMEOUT_SECONDS))

    def teardown(self) -> None:
        try:
            self.run(self.writer.close())
            self.run(self.client.close())
            self.run(self.proxy.close())
            self.run(self.server.stop())
        finally:
            self.loop.close()

    def step(self, transition: Any, *args: Any) -> None:
        self.model = transition(self.model, *args)

    def check_history(self, payloads: list[bytes]) -> None:
        """The history checker on everything written so far and the parent as a reader reads it: each
        committed event once and in order, nothing of an aborted or failed one (an EventWriter still
        open may or may not appear later, so it is told nothing yet)."""
        history = History()
        for tag, outcome in self.outcomes.items():
            history.write_invoked(tag, key=KEY)
            if outcome is not None:
                history.write_completed(tag, outcome)
        history.read_all("parent", [payload[:64] for payload in payloads], complete=True)
        report = check(history)
        assert report.ok, report.summary()

    # --- Helpers ---------------------------------------------------------------------------------------

    def phase(self, w: int) -> le.WriterPhase:
        return self.model.writer(w).phase

    def impl_failed(self, w: int) -> bool:
        event = self.events.get(w)
        if event is None:
            return False
        pipeline = event.pipeline
        return event.phase is EventWriterPhase.FAILED or (pipeline is not None and pipeline.error is not None)

    def streamed(self) -> list[int]:
        """Writers with a transient segment, live, and (in the implementation) not failed."""
        return [w for w in self.model.writer_ids if self.model.live(w) and w in self.transient_names
                and not self.impl_failed(w)]

    def link_of(self, w: int, conn: int) -> int:
        return self.links[w][conn]

    def send_written(self, w: int) -> None:
        """The client sends every written chunk not yet sent on the current connection (part k + 1 is
        chunk k)."""
        while self.model.writer(w).sent < self.written[w - 1] + 1:
            self.step(le.send_chunk, w)

    async def settle(self) -> None:
        """Wait until the client's requests reached the proxy: each healthy streaming writer that is up
        has as many chunks held on its connection as the model has on their way there, and each one
        that is down has its ``SetupAppend`` held."""
        for w in self.streamed():
            me = self.model.writer(w)
            if w in self.proxy.passing:
                continue
            if me.up:
                link = self.link_of(w, me.conn)
                await wait_until(lambda w=w, link=link: self.impl_failed(w) or
                                 self.proxy.held(w, link) == self.model.current_requests(w),
                                 f"writer {w}'s chunks at the proxy")
            else:
                await wait_until(lambda w=w: self.impl_failed(w) or w in self.proxy.setups,
                                 f"writer {w}'s reconnect at the proxy")

    # --- Rules: the application -------------------------------------------------------------------------

    @precondition(lambda self: not self.sealed and not self.model.blocked
                  and self.model.ordinary_issued < MAX_ORDINARY)
    @rule()
    def write_ordinary(self) -> None:
        n = self.model.ordinary_issued + 1
        tag = EventTag("ordinary", n)
        self.outcomes[tag] = None

        async def write() -> None:
            await self.writer.write_event(ordinary_payload(n), routing_key=KEY)
            await self.writer.flush()
            await self.settle()
        self.run(write())
        self.outcomes[tag] = Outcome.ACKED
        self.step(le.write_ordinary)
        self.step(le.deliver_ordinary)

    def writable(self) -> list[int]:
        found = []
        for w in self.model.writer_ids:
            if self.phase(w) is not le.WriterPhase.OPEN or self.impl_failed(w):
                continue
            if self.written[w - 1] >= PARTS[w - 1]:
                continue
            creates = w not in self.transient_names and self.written[w - 1] + 1 > INLINE_CHUNKS
            if creates and (self.sealed or not self.model.writer(w).up):
                continue
            found.append(w)
        return found

    @precondition(lambda self: self.writable())
    @rule(data=st.data())
    def send_chunk(self, data: st.DataObject) -> None:
        """The application writes chunks, one ``write`` each: ``SendChunk`` (after ``CreateTransient``
        when one takes the event past the inline limit; nothing while the event is inline or its
        writer is down)."""
        w = data.draw(st.sampled_from(self.writable()), label="w")
        self.do_send_chunks(w, data.draw(st.integers(1, PARTS[w - 1] - self.written[w - 1]), label="chunks"))

    def do_send_chunks(self, w: int, count: int) -> None:
        async def write() -> None:
            for _ in range(count):
                if w not in self.writable():
                    break
                await self.write_chunk(w)
        self.run(write())

    async def write_chunk(self, w: int) -> None:
        event = self.events.get(w)
        if event is None:
            event = self.events[w] = self.writer.stream_event(KEY)
            self.proxy.writers[event.writer_id] = w
        index = self.written[w - 1]
        await event.write(chunk_of(w, index))
        self.written[w - 1] += 1
        if w not in self.transient_names and self.written[w - 1] > INLINE_CHUNKS:
            assert event.transient_segment is not None, "the event outgrew the inline limit without streaming"
            self.transient_names[w] = event.transient_segment
            self.step(le.create_transient, w)
            self.step(le.send_chunk, w)  # part 0, the header: acknowledged at once (the docstring)
            self.step(le.append_chunk, w, 0)
            await wait_until(lambda: w in self.proxy.current, f"writer {w}'s session set up")
            self.links[w] = [self.proxy.current[w]]
        if w in self.transient_names and self.model.writer(w).up:
            self.send_written(w)
        await self.settle()

    def deliverable(self) -> list[tuple[int, int]]:
        found = []
        for w in self.model.writer_ids:
            for conn in sorted(self.model.connections_with_requests(w)):
                link = self.links.get(w, [])[conn] if conn < len(self.links.get(w, [])) else None
                if link is not None and self.proxy.held(w, link) > 0:
                    found.append((w, conn))
        return found

    @precondition(lambda self: self.deliverable())
    @rule(data=st.data())
    def append_chunk(self, data: st.DataObject) -> None:
        """The store handles the oldest chunk held on one of a writer's connections."""
        w, conn = data.draw(st.sampled_from(self.deliverable()), label="w, conn")
        self.do_append_chunk(w, conn)

    def do_append_chunk(self, w: int, conn: int) -> None:
        me = self.model.writer(w)
        reaches_writer = conn == me.conn and me.up and self.model.live(w)
        event = self.events[w]
        pipeline = event.pipeline
        assert pipeline is not None
        acked_before = pipeline.acknowledged_offset

        async def deliver() -> None:
            await self.proxy.deliver(w, self.link_of(w, conn))
            if reaches_writer:
                await wait_until(lambda: pipeline.acknowledged_offset > acked_before or pipeline.error is not None,
                                 f"writer {w} taking in the reply")
        refused_before = pipeline.refused_resends
        self.run(deliver())
        note("a chunk reached the store" + ("" if reaches_writer else " from a cut connection"))
        if pipeline.refused_resends > refused_before:
            note("a resend refused: it was stored (acknowledged)")
        self.step(le.append_chunk, w, conn)
        self.run(self.settle())

    def connected(self) -> list[int]:
        return [w for w in self.streamed() if self.model.writer(w).up and w not in self.proxy.passing]

    @precondition(lambda self: self.model.disconnects < MAX_DISCONNECTS and self.connected())
    @rule(data=st.data(), everything=st.booleans())
    def disconnect(self, data: st.DataObject, everything: bool) -> None:
        """``Disconnect``: a writer's connection is cut (or every connection of the client), taking the
        other writers' sessions on it down too; of each one's chunks on their way, the first ``kept``
        still reach the store."""
        w = data.draw(st.sampled_from(self.connected()), label="w")
        self.do_disconnect(w, everything, lambda v, most: data.draw(st.integers(0, most), label=f"kept by writer {v}"))

    def do_disconnect(self, w: int, everything: bool, kept_by: Callable[[int, int], int]) -> None:
        cut = set(self.proxy.links) if everything else {self.link_of(w, self.model.writer(w).conn)}
        cut = {number for number in cut if self.proxy.links[number].client_open}
        kept: dict[int, dict[int, int]] = {number: {} for number in cut}
        for v in self.connected():
            link = self.link_of(v, self.model.writer(v).conn)
            if link in cut:
                k = kept_by(v, self.model.current_requests(v))
                kept[link][v] = k
                self.step(le.disconnect, v, k)
                self.proxy.up[v] = False

        async def cut_them() -> None:
            for number in sorted(cut):
                self.proxy.cut(number, kept[number])
            await self.settle()
        self.run(cut_them())
        note(f"{'every connection' if everything else 'a connection'} cut")

    def down(self) -> list[int]:
        return [w for w in self.streamed() if not self.model.writer(w).up]

    @precondition(lambda self: self.down())
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        """``Reconnect``: the client's new ``SetupAppend`` gets through; it resends what is unacknowledged."""
        w = data.draw(st.sampled_from(self.down()), label="w")
        self.run(self.reconnect_writer(w))

    async def reconnect_writer(self, w: int) -> None:
        pipeline = self.events[w].pipeline
        assert pipeline is not None
        self.proxy.release_setup(w)
        self.step(le.reconnect, w)
        self.links[w].append(self.proxy.current[w])
        await wait_until(lambda: pipeline.connected or pipeline.error is not None, f"writer {w} set up again")
        self.send_written(w)
        await self.settle()

    def committable(self) -> list[int]:
        found = []
        for w in self.model.writer_ids:
            if self.phase(w) is not le.WriterPhase.OPEN:
                continue
            if self.model.inline(w):
                if not self.sealed:
                    found.append(w)
            elif w in self.transient_names:
                found.append(w)  # (streamed: once it streams; the application writes the rest first)
        return found

    @precondition(lambda self: self.committable() and not self.model.blocked)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        """The application writes the rest of its event and commits: ``Commit``, every chunk delivered
        (``AppendChunk``), ``Merge`` -- or, inline, one plain append (``DeliverOrdinary``)."""
        w = data.draw(st.sampled_from(self.committable()), label="w")
        self.run(self.commit_writer(w))

    async def commit_writer(self, w: int) -> None:
        """The application writes the rest of the event and calls ``commit``.  A streamed event's commit
        starts while its chunks may still be held at the proxy (or its writer is down): it must not
        return before every chunk is acknowledged -- it is given ``COMMIT_RACE_SECONDS`` to do so
        wrongly -- and only then are the chunks let through (a reconnect first if the writer is down)."""
        failure: LargeEventFailedError | None = None
        try:
            while self.written[w - 1] < PARTS[w - 1]:
                await self.write_chunk(w)
        except LargeEventFailedError as error:
            failure = error
        if self.model.inline(w):
            await self.events[w].commit()
            self.step(le.commit, w)
            self.step(le.deliver_ordinary)
        else:
            failure = await self.commit_streamed(w, failure)
        committed = self.phase(w) is le.WriterPhase.COMMITTED
        self.outcomes[large_tag(w)] = None  # (placed by its commit: ordered among the calls by it)
        assert (failure is None) == committed, (w, self.phase(w), failure)
        note(f"a {'n inline' if self.model.inline(w) else ' streamed'} commit "
             f"{'succeeded' if committed else 'failed'}{' (sealed)' if self.sealed else ''}")
        self.outcomes[large_tag(w)] = Outcome.ACKED if committed else Outcome.FAILED
        await self.settle()

    async def commit_streamed(self, w: int, failure: LargeEventFailedError | None) -> LargeEventFailedError | None:
        self.step(le.commit, w)
        committing = None
        if failure is None:
            committing = asyncio.get_running_loop().create_task(self.events[w].commit())
            await asyncio.sleep(COMMIT_RACE_SECONDS)
            if committing.done() and committing.exception() is None:
                assert self.model.all_acked(w), (
                    f"writer {w}'s commit returned while the store had acknowledged {self.model.writer(w).acked - 1} "
                    f"of its {PARTS[w - 1]} chunks")
        if not self.model.writer(w).up:
            if self.impl_failed(w):
                self.step(le.reconnect, w)  # (the model's writer learns of the failure on its next reply)
            else:
                await self.reconnect_writer(w)
        self.proxy.pass_through(w)
        if committing is not None:
            try:
                await committing
            except LargeEventFailedError as error:
                failure = error
        if self.model.writer(w).up:
            self.send_written(w)
        while self.phase(w) is le.WriterPhase.COMMITTING and self.model.current_requests(w):
            self.step(le.append_chunk, w, self.model.writer(w).conn)
        if self.sealed and self.model.transient(w).state is le.TransientState.ACTIVE:
            self.step(le.expire, w)  # the parent is sealed: the event's transient segments go
        if self.phase(w) is le.WriterPhase.COMMITTING:
            self.step(le.merge, w)
        return failure

    def abortable(self) -> list[int]:
        return [w for w in self.model.writer_ids if self.phase(w) is le.WriterPhase.OPEN and w in self.events]

    @precondition(lambda self: self.abortable() and not self.model.blocked)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """``Abort``: ``close`` without ``commit`` deletes the transient segment."""
        w = data.draw(st.sampled_from(self.abortable()), label="w")
        event = self.events[w]

        async def close() -> None:
            await event.close()
            await self.settle()
        self.run(close())
        assert event.phase in (EventWriterPhase.ABORTED, EventWriterPhase.FAILED), event
        self.step(le.abort, w)
        self.outcomes[large_tag(w)] = None
        self.outcomes[large_tag(w)] = Outcome.FAILED

    # --- Rules: the segment store -------------------------------------------------------------------------

    def detached(self) -> list[int]:
        """Streaming writers whose transient segment nobody is connected to (in the store's records)."""
        found = []
        for w, name in self.transient_names.items():
            record = self.server.transients.get(name)
            if record is not None and record.detached_at is not None:
                found.append(w)
        return found

    @precondition(lambda self: self.grace_periods < MAX_GRACE_PERIODS and self.detached())
    @rule()
    def delete_on_disconnect(self) -> None:
        """``DeleteOnDisconnect``: the grace period of transient segments nobody is connected to runs out."""
        detached = self.detached()
        for w in detached:
            assert not self.model.writer(w).up, f"the store lost track of writer {w}'s connection"
        self.grace_periods += 1
        self.clock.advance(GRACE_SECONDS + 1)
        deleted = self.run(self.server.expire_transient_segments())
        assert sorted(deleted) == sorted(self.transient_names[w] for w in detached), deleted
        for w in detached:
            self.step(le.delete_on_disconnect, w)
        note("transient segments deleted after the grace period")

    @precondition(lambda self: any(self.model.transient(w).state is le.TransientState.ACTIVE
                                   for w in self.model.writer_ids))
    @rule()
    def expire(self) -> None:
        """``Expire``: every transient segment's idle time runs out; the sweep deletes them."""
        active = [w for w in self.model.writer_ids if self.model.transient(w).state is le.TransientState.ACTIVE]
        self.clock.advance(IDLE_SECONDS + 1)
        deleted = self.run(self.server.expire_transient_segments())
        assert sorted(deleted) == sorted(self.transient_names[w] for w in active), deleted
        for w in active:
            self.step(le.expire, w)
        note("transient segments expired")

    @precondition(lambda self: not self.sealed)
    @rule()
    def seal_parent(self) -> None:
        """The parent is sealed (its stream scaled): outside the model; streamed events must fail."""
        self.run(self.server.container_for(PARENT).seal(PARENT))
        self.sealed = True

    @rule()
    def read_parent(self) -> None:
        """A reader of the parent (through the client, as an application reads) sees whole events only,
        the ones the model says are visible, in its order."""
        async def read() -> bytes:
            length = (await self.client.segments().info(PARENT)).length
            reader = self.client.byte_stream_reader(PARENT)
            data = bytearray()
            try:
                while len(data) < length:
                    data += await reader.read(length - len(data))
            finally:
                await reader.close()
            return bytes(data)
        payloads = list(iter_events(self.run(read())))
        assert [self.call_of(payload) for payload in payloads] == list(self.model.visible_events())

    def call_of(self, payload: bytes) -> le.Call:
        tag = EventTag.parse(payload)
        assert tag is not None, payload[:40]
        if tag.writer == "ordinary":
            assert payload == ordinary_payload(tag.sequence)
            return le.Call(le.ItemKind.SMALL, tag.sequence)
        w = int(tag.writer.removeprefix("large-"))
        assert payload == event_of(w), f"large event {w} is not whole"
        return le.Call(le.ItemKind.LARGE, w)

    # --- What the two agree on -------------------------------------------------------------------------

    def parent_bytes(self) -> bytes:
        container = self.server.container_for(PARENT)
        length = container.get_info(PARENT).length
        result = self.run(container.read(PARENT, 0, length))
        assert len(result.data) == length
        return bytes(result.data)

    @invariant()
    def implementation_matches_the_model(self) -> None:
        self.model.check_invariants()
        self.server.check_invariants()
        self.server.transients.check_invariants()
        # The parent, event by event; large ones byte for byte.
        payloads = list(iter_events(self.parent_bytes()))
        seen = [self.call_of(payload) for payload in payloads]
        assert tuple(seen) == self.model.visible_events(), (seen, self.model.visible_events())
        self.check_history(payloads)
        # Transient segments: the model's active ones exist, with its chunks; nothing else is left.
        container = self.server.container_for(PARENT)
        existing = {name for name in container.segment_names() if is_transient_segment(name)}
        active = set()
        for w in self.model.writer_ids:
            segment = self.model.transient(w)
            if segment.state is le.TransientState.ACTIVE:
                name = self.transient_names[w]
                active.add(name)
                assert container.get_info(name).length == (len(segment.data) - 1) * CHUNK, (w, segment)
        assert existing == active, (existing, active)
        # Each writer: its phase and what it knows is acknowledged.
        for w in self.model.writer_ids:
            me = self.model.writer(w)
            event = self.events.get(w)
            if event is None:
                assert me.phase is le.WriterPhase.OPEN
                continue
            if me.phase is le.WriterPhase.COMMITTED:
                assert event.phase is EventWriterPhase.COMMITTED, (w, event)
            elif me.phase is le.WriterPhase.FAILED:
                assert self.impl_failed(w), (w, event)
            elif me.phase is le.WriterPhase.ABORTED:
                assert event.phase in (EventWriterPhase.ABORTED, EventWriterPhase.FAILED), (w, event)
            elif self.impl_failed(w):  # doomed: its transient segment is gone, the reply not delivered yet
                assert self.model.transient(w).state is le.TransientState.DELETED, (w, event, me)
            else:
                assert event.phase is EventWriterPhase.OPEN, (w, event)
                pipeline = event.pipeline
                if pipeline is not None and me.up:
                    assert pipeline.acknowledged_offset == (me.acked - 1) * CHUNK, (w, me, pipeline.acknowledged_offset)
        # The chunks on their way: held at the proxy exactly where the model has them.
        for w in self.streamed():
            if w in self.proxy.passing:
                continue
            for conn, link in enumerate(self.links[w]):
                on_conn = sum(1 for request in self.model.requests(w) if request.conn == conn)
                assert self.proxy.held(w, link) == on_conn, (w, conn, self.proxy.held(w, link), on_conn)


LargeEventsMachine.TestCase.settings = settings(
    max_examples=500 if NIGHTLY else 60, stateful_step_count=60 if NIGHTLY else 40, deadline=None)
test_large_events_vs_model = LargeEventsMachine.TestCase


def scripted(steps: Callable[[LargeEventsMachine], None]) -> LargeEventsMachine:
    """Run ``steps`` on a fresh machine (each followed by the comparison), then tear it down."""
    machine = LargeEventsMachine()
    try:
        machine.implementation_matches_the_model()
        steps(machine)
    finally:
        machine.teardown()
    return machine


def test_a_resend_of_a_chunk_a_cut_connection_stored_is_refused_and_counts_as_acknowledged() -> None:
    """The resend path the random runs reach rarely: chunks on their way when the connection is cut;
    one still reaches the store from the dead connection, before or after the reconnect's resends; each
    resend of a stored chunk is refused and acknowledges it; the event appears once, whole."""
    def steps(m: LargeEventsMachine) -> None:
        check = m.implementation_matches_the_model
        m.do_send_chunks(3, 3)  # creates writer 3's transient segment: chunks 1..3 held on connection 0
        check()
        m.do_append_chunk(3, 0)  # chunk 1 stored and acknowledged
        check()
        m.do_disconnect(3, False, lambda v, most: most)  # chunks 2 and 3 still on their way from connection 0
        check()
        m.do_append_chunk(3, 0)  # chunk 2 reaches the store from the dead connection; its reply is lost
        check()
        m.run(m.reconnect_writer(3))  # chunks 2 and 3 resent on connection 1
        check()
        pipeline = m.events[3].pipeline
        assert pipeline is not None and m.proxy.held(3, m.link_of(3, 1)) == 2
        m.do_append_chunk(3, 1)  # the resent chunk 2: refused (stored), acknowledged
        check()
        assert pipeline.refused_resends == 1 and m.model.writer(3).acked == 3
        m.do_append_chunk(3, 0)  # chunk 3 from the dead connection, after the resends went out: stored
        check()
        m.do_append_chunk(3, 1)  # the resent chunk 3: refused too
        check()
        assert pipeline.refused_resends == 2
        m.write_ordinary()
        check()
        m.run(m.commit_writer(3))
        check()
        assert m.model.visible_events() == (le.Call(le.ItemKind.SMALL, 1), le.Call(le.ItemKind.LARGE, 3))
    scripted(steps)


def test_a_writer_that_stays_away_past_the_grace_period_loses_its_transient_segment_and_its_event() -> None:
    def steps(m: LargeEventsMachine) -> None:
        check = m.implementation_matches_the_model
        m.do_send_chunks(2, 3)
        m.do_send_chunks(3, 3)
        check()
        m.do_disconnect(2, True, lambda v, most: 0)  # every connection: both writers down, nothing kept
        check()
        assert sorted(m.detached()) == [2, 3]
        m.run(m.reconnect_writer(3))  # writer 3 comes back in time and resends
        check()
        m.delete_on_disconnect()  # writer 2's transient segment goes, writer 3's stays
        check()
        assert m.model.transient(2).state is le.TransientState.DELETED
        assert m.model.transient(3).state is le.TransientState.ACTIVE
        m.run(m.reconnect_writer(2))  # too late: its setup is refused
        check()
        m.run(m.commit_writer(2))
        check()
        m.run(m.commit_writer(3))
        check()
        assert m.model.writer(2).phase is le.WriterPhase.FAILED
        assert m.model.visible_events() == (le.Call(le.ItemKind.LARGE, 3),)
    scripted(steps)
