"""A simulated network: in-process connections between clients and servers, with named, seeded faults.

Theory of operation
-------------------
A ``SimulatedNetwork`` stands in for TCP between the client (``ClientConfig.connector``) and a
server (``SegmentStoreServer.protocol_factory`` registered with ``listen``).  Each connection is a
``SimulatedLink``: two ``SimulatedTransport`` objects (real ``asyncio.Transport`` subclasses, so the
protocols cannot tell) joined by two *pipes*, one per ``Direction``.  A pipe is a FIFO of what the
sender put on the wire -- bytes, then perhaps its close (``EOF``) or its abort (``RESET``) -- each
with the loop time at which it may arrive.  Nothing is delivered synchronously: a write is queued
and the pipe delivers on a later turn of the event loop (``call_soon``, or ``call_at`` for a delayed
item), in order, into ``data_received`` (a ``Protocol``) or ``get_buffer``/``buffer_updated`` (a
``BufferedProtocol``, as the server's connection is).  A receiver that paused reading gets nothing
until it resumes; what it does not take stays queued and counts against the sender's write buffer,
whose high-water mark pauses the sending protocol (``pause_writing``) as a full socket buffer would.

Faults have names and act on the wire, never on the endpoints' code:

* ``delay(seconds, direction)`` -- items sent from now on arrive ``seconds`` later (order is kept:
  an item never overtakes the one before it).  A delay is TCP retransmission: late, not lost.
* ``black_hole(link, direction)`` -- everything in flight in that direction and everything sent
  later vanishes, the sender's close and abort included.  A byte stream cannot skip bytes and go
  on, so the link is dead in that direction for good: the endpoints find out only through their
  own timeouts (keep-alives, acknowledgement deadlines) -- the "lost reply" case.
* ``cut(link)`` -- the connection breaks at once (a reset from the middle of the network): both
  protocols get ``connection_lost(ConnectionResetError)`` and whatever was in flight is gone.
* ``partition(seconds)`` -- for that long nothing moves on any link (items wait, as TCP would
  retransmit them) and new connections wait for the partition to end (as SYNs are retried); the
  caller's own connect timeout may give up first.  ``heal()`` ends it early.

``heal()`` also ends every delay (for items sent from then on).  Black holes and cuts are not
healed: those connections are dead, and the endpoints must notice and reconnect.

``NetworkFaults`` (optional) injects the same faults at random, drawn once per write from a seeded
``random.Random``, so a chaos run replays from its seed.  Time is the event loop's (``loop.time()``):
under a ``VirtualTimeEventLoop`` driven by a ``ManualClock`` the network, the protocols' timers and
``asyncio.timeout`` all move only when the test advances the clock, and a run is deterministic.

Every queue is bounded: a pipe holding more than ``limits.SIMULATED_NETWORK_PIPE_BYTES_MAX`` bytes
(a receiver that never reads, a partition that never ends) cuts its link rather than grow.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from millstream.errors import InvalidArgumentError
from millstream.testing import limits
from millstream.testing.clock import ManualClock

__all__ = [
    "Direction",
    "NetworkFaults",
    "SimulatedLink",
    "SimulatedNetwork",
    "SimulatedTransport",
    "VirtualTimeEventLoop",
]

ProtocolFactory = Callable[[], asyncio.BaseProtocol]

#: An item (or a partition's end) due within this many seconds of now counts as due: asyncio fires a
#: ``call_at`` timer up to its clock resolution early, and virtual time is a sum of float steps.
#: Without it, a timer that fired a hair early would find nothing due and re-arm for the same instant.
_DUE_EPSILON_SECONDS = 1e-6


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is ``clock.monotonic()``: ``call_later``/``call_at`` timers (the
    network's delays, a writer's batch window, ``asyncio.timeout``) fire when the test advances the
    clock, not when real time passes, so a run replays exactly.

    Drive it with bounded turns (``run_until_complete`` of a coroutine that yields a fixed number of
    times): a coroutine that waits for virtual time which nobody advances would make the selector
    sleep for that long in real time."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock

    def time(self) -> float:
        return self.clock.monotonic()


class Direction(enum.Enum):
    """Which way bytes travel on a link: from the side that connected, or back to it."""

    TO_SERVER = "to_server"
    TO_CLIENT = "to_client"

    def __repr__(self) -> str:
        return f"Direction.{self.name}"


class _Kind(enum.Enum):
    DATA = "data"
    EOF = "eof"  # the sender closed: the receiver's eof_received
    RESET = "reset"  # the sender aborted: the receiver's connection_lost(ConnectionResetError)


class _Item:
    __slots__ = ("data", "kind", "ready_at")

    def __init__(self, ready_at: float, kind: _Kind, data: bytes) -> None:
        self.ready_at = ready_at
        self.kind = kind
        self.data = data


@attrs.frozen
class NetworkFaults:
    """Faults drawn at random, once per write (``rng.random()`` exactly once, plus once more for a
    delay's length), so a seed replays them.  Probabilities are per write and add up to at most 1."""

    rng: random.Random = attrs.field(eq=False)
    cut_probability: float = 0.0
    black_hole_probability: float = 0.0
    delay_probability: float = 0.0
    delay_seconds_max: float = 0.0

    def __attrs_post_init__(self) -> None:
        probabilities = (self.cut_probability, self.black_hole_probability, self.delay_probability)
        if any(not 0.0 <= p <= 1.0 for p in probabilities) or sum(probabilities) > 1.0:
            raise InvalidArgumentError(f"fault probabilities must lie in [0, 1] and add up to at most 1: "
                                       f"{probabilities}")
        if self.delay_seconds_max < 0:
            raise InvalidArgumentError(f"delay_seconds_max must be >= 0, not {self.delay_seconds_max}")

    def draw(self) -> tuple[str, float] | None:
        """The fault for one write: ("cut", 0), ("black_hole", 0), ("delay", seconds) or None."""
        draw = self.rng.random()
        if draw < self.cut_probability:
            return ("cut", 0.0)
        draw -= self.cut_probability
        if draw < self.black_hole_probability:
            return ("black_hole", 0.0)
        draw -= self.black_hole_probability
        if draw < self.delay_probability:
            return ("delay", self.rng.uniform(0.0, self.delay_seconds_max))
        return None


class _Pipe:
    """One direction of a link: what the sender put on the wire and the receiver has not taken yet."""

    def __init__(self, link: SimulatedLink, direction: Direction) -> None:
        self.link = link
        self.direction = direction
        self.items: deque[_Item] = deque()
        self.queued_bytes = 0
        self.delay_seconds = 0.0
        self.black_holed = False
        # Accounting: accepted == delivered + discarded + queued; written_into_hole is never accepted.
        self.accepted_bytes = 0  # queued for delivery
        self.delivered_bytes = 0  # taken by the receiver
        self.discarded_bytes = 0  # queued, then lost (black hole, cut, receiver gone)
        self.written_into_hole_bytes = 0  # written after the pipe went dark
        self._last_ready_at = 0.0
        self._handle: asyncio.Handle | None = None

    @property
    def sender(self) -> SimulatedTransport:
        return self.link.client if self.direction is Direction.TO_SERVER else self.link.server

    @property
    def receiver(self) -> SimulatedTransport:
        return self.link.server if self.direction is Direction.TO_SERVER else self.link.client

    def send(self, kind: _Kind, data: bytes = b"") -> None:
        network = self.link.network
        if self.black_holed or self.receiver.lost:
            self.written_into_hole_bytes += len(data)
            return
        extra_delay = 0.0
        fault = network.faults.draw() if network.faults is not None and kind is _Kind.DATA else None
        if fault is not None:
            name, seconds = fault
            if name == "cut":
                network.cut(self.link)
                return
            if name == "black_hole":
                network.black_hole(self.link, self.direction)
                self.written_into_hole_bytes += len(data)
                return
            extra_delay = seconds
        ready_at = max(network.now() + self.delay_seconds + extra_delay, self._last_ready_at)
        self._last_ready_at = ready_at
        self.items.append(_Item(ready_at, kind, data))
        self.queued_bytes += len(data)
        self.accepted_bytes += len(data)
        if self.queued_bytes > limits.SIMULATED_NETWORK_PIPE_BYTES_MAX:
            network.cut(self.link)
            return
        self.sender.check_write_buffer()
        self.schedule()

    def black_hole(self) -> None:
        self.black_holed = True
        self.clear()

    def clear(self) -> None:
        """Discard everything in flight."""
        self.discarded_bytes += self.queued_bytes
        self.items.clear()
        self.queued_bytes = 0
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.sender.check_write_buffer()

    def schedule(self) -> None:
        """Arrange for the head item to be delivered when it is due (no-op if already arranged)."""
        if self._handle is not None or not self.items:
            return
        network = self.link.network
        if network.partitioned:
            return  # the end of the partition pumps every pipe
        head = self.items[0]
        receiver = self.receiver
        if head.kind is _Kind.DATA and not receiver.is_reading() and not receiver.lost:
            return  # resume_reading pumps
        loop = network.loop
        if head.ready_at <= loop.time() + _DUE_EPSILON_SECONDS:
            self._handle = loop.call_soon(self.pump)
        else:
            self._handle = loop.call_at(head.ready_at, self.pump)

    def pump(self) -> None:
        """Deliver every item that is due, in order, as far as the receiver takes it."""
        self._handle = None
        network = self.link.network
        while self.items and not network.partitioned:
            head = self.items[0]
            if head.ready_at > network.now() + _DUE_EPSILON_SECONDS:
                break
            receiver = self.receiver
            if receiver.lost or (receiver.is_closing() and head.kind is _Kind.DATA):
                # Nobody reads any more (the receiver closed or was reset): the bytes are gone.
                self.clear()
                return
            if head.kind is _Kind.DATA:
                if not receiver.is_reading():
                    break
                # Taken off the pipe before the protocol sees it: the protocol may close or abort
                # while taking it, which clears the pipe under us.
                self.items.popleft()
                self.queued_bytes -= len(head.data)
                taken = receiver.feed(head.data)
                self.delivered_bytes += taken
                rest = len(head.data) - taken
                if rest:
                    if receiver.lost or receiver.is_closing():
                        self.discarded_bytes += rest
                        continue
                    head.data = head.data[taken:]  # it paused reading: the rest waits at the front
                    self.items.appendleft(head)
                    self.queued_bytes += rest
                    break
            elif head.kind is _Kind.EOF:
                self.items.popleft()
                receiver.eof()
            else:
                self.items.popleft()
                receiver.reset(ConnectionResetError("simulated network: the peer reset the connection"))
        self.sender.check_write_buffer()
        self.schedule()

    def check_invariants(self) -> None:
        assert self.queued_bytes == sum(len(item.data) for item in self.items), self.queued_bytes
        ready = [item.ready_at for item in self.items]
        assert ready == sorted(ready), "items must arrive in the order they were sent"
        assert not (self.black_holed and self.items), "a black hole holds nothing"
        kinds = [item.kind for item in self.items]
        assert all(kind is _Kind.DATA for kind in kinds[:-1]), "nothing follows a close or an abort"
        assert self.accepted_bytes == self.delivered_bytes + self.discarded_bytes + self.queued_bytes, (
            self.accepted_bytes, self.delivered_bytes, self.discarded_bytes, self.queued_bytes)


class SimulatedTransport(asyncio.Transport):
    """One end of a simulated connection, as its protocol sees it."""

    def __init__(self, link: SimulatedLink, outgoing: Direction, peername: tuple[str, int],
                 sockname: tuple[str, int]) -> None:
        super().__init__({"peername": peername, "sockname": sockname})
        self._link = link
        self._outgoing = outgoing
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False  # close() or abort() was called, or the connection broke
        self.lost = False  # connection_lost was delivered (or is scheduled)
        self._reading = True
        self._writing_paused = False
        self._high = limits.SIMULATED_NETWORK_WRITE_BUFFER_HIGH_BYTES
        self._low = self._high // 4

    # --- asyncio.Transport ---------------------------------------------------------------------------

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._incoming.schedule()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return  # (asyncio logs and drops writes after close; nothing could deliver them)
        chunk = self._link.network.chunk_bytes
        payload = bytes(data)
        if chunk is None or len(payload) <= chunk:
            self._outgoing_pipe.send(_Kind.DATA, payload)
            return
        for start in range(0, len(payload), chunk):
            if self._closing:
                return  # a fault cut the link half-way through
            self._outgoing_pipe.send(_Kind.DATA, payload[start:start + chunk])

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("simulated connections do not half-close")

    def close(self) -> None:
        """Close after what was written: the peer receives it, then end of stream."""
        if self._closing:
            return
        self._closing = True
        self._outgoing_pipe.send(_Kind.EOF)
        self._schedule_lost(None)

    def abort(self) -> None:
        """Close at once: the peer sees a reset (behind what is already in flight)."""
        if self.lost:
            return
        already_closed = self._closing
        self._closing = True
        if not already_closed:
            self._outgoing_pipe.send(_Kind.RESET)
        self._schedule_lost(None)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = limits.SIMULATED_NETWORK_WRITE_BUFFER_HIGH_BYTES if low is None else 4 * low
        if low is None:
            low = high // 4
        if not 0 <= low <= high:
            raise ValueError(f"high ({high}) must be >= low ({low}) must be >= 0")
        self._high, self._low = high, low
        self.check_write_buffer()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._outgoing_pipe.queued_bytes

    # --- the network's side ----------------------------------------------------------------------------

    @property
    def _outgoing_pipe(self) -> _Pipe:
        return self._link.pipes[self._outgoing]

    @property
    def _incoming(self) -> _Pipe:
        incoming = Direction.TO_CLIENT if self._outgoing is Direction.TO_SERVER else Direction.TO_SERVER
        return self._link.pipes[incoming]

    def check_write_buffer(self) -> None:
        """Pause or resume the protocol's writing as the bytes it has in flight cross the marks."""
        if self.lost or self._protocol is None:
            return
        size = self._outgoing_pipe.queued_bytes
        if not self._writing_paused and size > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()
        elif self._writing_paused and size <= self._low:
            self._writing_paused = False
            self._protocol.resume_writing()

    def feed(self, data: bytes) -> int:
        """Hand ``data`` to the protocol; return how much it took (less if it paused reading)."""
        protocol = self._protocol
        if isinstance(protocol, asyncio.BufferedProtocol):
            view = memoryview(data)
            position = 0
            while position < len(data) and self.is_reading():
                buffer = memoryview(protocol.get_buffer(len(data) - position))
                size = min(len(buffer), len(data) - position)
                if size <= 0:
                    raise RuntimeError("a BufferedProtocol offered an empty buffer")
                buffer[:size] = view[position:position + size]
                position += size
                protocol.buffer_updated(size)
            return position
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(data)
        return len(data)

    def eof(self) -> None:
        protocol = self._protocol
        assert isinstance(protocol, (asyncio.Protocol, asyncio.BufferedProtocol))
        keep_open = protocol.eof_received()
        if not keep_open:
            self.close()

    def reset(self, error: BaseException) -> None:
        """The connection broke under this end (a reset arrived, or the network cut it)."""
        self._closing = True
        self._schedule_lost(error)

    def _schedule_lost(self, error: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._incoming.clear()
        self._link.network.loop.call_soon(self._deliver_lost, error)
        self._link.side_lost()

    def _deliver_lost(self, error: BaseException | None) -> None:
        protocol = self._protocol
        if protocol is not None:
            protocol.connection_lost(error if isinstance(error, Exception) else None)


class SimulatedLink:
    """One connection: its two transports and the pipes between them."""

    def __init__(self, network: SimulatedNetwork, number: int, address: tuple[str, int]) -> None:
        self.network = network
        self.number = number
        self.address = address
        self.pipes = {direction: _Pipe(self, direction) for direction in Direction}
        client_name = ("simulated-client", number)
        self.client = SimulatedTransport(self, Direction.TO_SERVER, peername=address, sockname=client_name)
        self.server = SimulatedTransport(self, Direction.TO_CLIENT, peername=client_name, sockname=address)
        self.cut_at: float | None = None

    @property
    def is_open(self) -> bool:
        """Neither end has lost the connection yet."""
        return not (self.client.lost or self.server.lost)

    @property
    def closed(self) -> bool:
        """Both ends have lost the connection."""
        return self.client.lost and self.server.lost

    def black_holed(self, direction: Direction) -> bool:
        return self.pipes[direction].black_holed

    def side_lost(self) -> None:
        if self.closed:
            self.network.forget(self)

    def __repr__(self) -> str:
        state = "open" if self.is_open else ("closed" if self.closed else "half-closed")
        holes = [d.name for d in Direction if self.pipes[d].black_holed]
        return f"<SimulatedLink {self.number} to {self.address[0]}:{self.address[1]} {state}" + (
            f" black-holed {','.join(holes)}>" if holes else ">")

    def check_invariants(self) -> None:
        for pipe in self.pipes.values():
            pipe.check_invariants()
            if pipe.receiver.lost:
                assert not pipe.items, "nothing waits for an end that is gone"


class SimulatedNetwork:
    """Connections between in-process endpoints over simulated links (see the module docstring).

    ``chunk_bytes`` (optional) splits every write into pieces of at most that many bytes, each
    delivered on its own, so receivers meet frames cut anywhere.  ``faults`` draws faults at random."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, faults: NetworkFaults | None = None,
                 chunk_bytes: int | None = None) -> None:
        if chunk_bytes is not None and chunk_bytes < 1:
            raise InvalidArgumentError(f"chunk_bytes must be >= 1, not {chunk_bytes}")
        self.loop = loop
        self.faults = faults
        self.chunk_bytes = chunk_bytes
        self._listeners: dict[tuple[str, int], ProtocolFactory] = {}
        self._links: dict[int, SimulatedLink] = {}
        self._next_link = 1
        self._partitioned_until: float | None = None
        self._partition_handle: asyncio.TimerHandle | None = None
        self._partition_waiters: list[asyncio.Future[None]] = []
        self._delays: dict[Direction, float] = {direction: 0.0 for direction in Direction}
        #: Counters of what happened, by fault name (and "connections"), for a test's report.
        self.counts: dict[str, int] = {"connections": 0, "refused": 0, "cut": 0, "black_hole": 0, "delay": 0,
                                       "partition": 0}

    def now(self) -> float:
        return self.loop.time()

    # --- endpoints ------------------------------------------------------------------------------------

    def listen(self, host: str, port: int, protocol_factory: ProtocolFactory) -> None:
        """Accept connections to ``host:port`` with a protocol from ``protocol_factory`` each."""
        if (host, port) in self._listeners:
            raise InvalidArgumentError(f"something listens on {host}:{port} already")
        self._listeners[(host, port)] = protocol_factory

    def stop_listening(self, host: str, port: int) -> None:
        """Refuse new connections to ``host:port`` (open ones stay)."""
        self._listeners.pop((host, port), None)

    async def create_connection(self, protocol_factory: ProtocolFactory, host: str,
                                port: int) -> tuple[SimulatedTransport, asyncio.BaseProtocol]:
        """Connect to ``host:port`` as ``loop.create_connection`` does (a ``ClientConfig.connector``).

        Waits while the network is partitioned (bounded by the partition; the caller's own timeout may
        cancel the wait).  Raises ``ConnectionRefusedError`` if nothing listens there."""
        waits = 0
        while self.partitioned:
            waits += 1
            if waits > limits.SIMULATED_NETWORK_PARTITION_WAITS_MAX:
                raise ConnectionRefusedError(f"simulated network: partitioned {waits} times in a row")
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._partition_waiters.append(waiter)
            await waiter
        accept = self._listeners.get((host, port))
        if accept is None:
            self.counts["refused"] += 1
            raise ConnectionRefusedError(f"simulated network: nothing listens on {host}:{port}")
        if len(self._links) >= limits.SIMULATED_NETWORK_LINKS_MAX:
            raise ConnectionRefusedError(f"simulated network: {len(self._links)} connections are open")
        link = SimulatedLink(self, self._next_link, (host, port))
        self._next_link += 1
        self._links[link.number] = link
        self.counts["connections"] += 1
        for direction, seconds in self._delays.items():
            link.pipes[direction].delay_seconds = seconds
        client_protocol = protocol_factory()
        server_protocol = accept()
        link.client.set_protocol(client_protocol)
        link.server.set_protocol(server_protocol)
        server_protocol.connection_made(link.server)
        client_protocol.connection_made(link.client)
        return link.client, client_protocol

    def forget(self, link: SimulatedLink) -> None:
        self._links.pop(link.number, None)

    @property
    def links(self) -> list[SimulatedLink]:
        """Connections not yet closed at both ends, oldest first."""
        return list(self._links.values())

    def open_links(self, address: tuple[str, int] | None = None) -> list[SimulatedLink]:
        """Connections open at both ends (to ``address``, if given), oldest first."""
        return [link for link in self._links.values() if link.is_open and (address is None or link.address == address)]

    # --- faults ----------------------------------------------------------------------------------------

    def cut(self, link: SimulatedLink) -> None:
        """Break ``link`` now: both ends get ``ConnectionResetError``; what was in flight is gone."""
        if link.closed:
            return
        self.counts["cut"] += 1
        link.cut_at = self.now()
        for pipe in link.pipes.values():
            pipe.clear()
        for end in (link.client, link.server):
            end.reset(ConnectionResetError("simulated network: the connection was cut"))

    def black_hole(self, link: SimulatedLink, direction: Direction) -> None:
        """From now on nothing of ``link`` arrives in ``direction``: not what is in flight, not what
        is sent later, not the sender's close.  The link stays dead that way (see the module docstring)."""
        if link.pipes[direction].black_holed or link.closed:
            return
        self.counts["black_hole"] += 1
        link.pipes[direction].black_hole()

    def delay(self, seconds: float, direction: Direction | None = None) -> None:
        """Items sent from now on (on every link, in ``direction`` or both) arrive ``seconds`` late,
        until ``heal``.  Items already in flight keep their times."""
        if seconds < 0:
            raise InvalidArgumentError(f"a delay is >= 0 seconds, not {seconds}")
        self.counts["delay"] += 1
        for which in Direction if direction is None else (direction,):
            self._delays[which] = seconds
            for link in self._links.values():
                link.pipes[which].delay_seconds = seconds

    @property
    def partitioned(self) -> bool:
        return self._partitioned_until is not None and self.now() < self._partitioned_until - _DUE_EPSILON_SECONDS

    def partition(self, seconds: float) -> None:
        """Nothing moves for ``seconds`` (extending a partition in force): items wait, connects wait."""
        if seconds <= 0:
            raise InvalidArgumentError(f"a partition lasts > 0 seconds, not {seconds}")
        self.counts["partition"] += 1
        until = self.now() + seconds
        if self._partitioned_until is not None and self._partitioned_until > until:
            return
        self._partitioned_until = until
        if self._partition_handle is not None:
            self._partition_handle.cancel()
        self._partition_handle = self.loop.call_at(until, self._partition_over)

    def _partition_over(self) -> None:
        # This handle belongs to the partition in force (extending one replaces its handle), and its
        # time has come (asyncio may run it up to its clock resolution early: that counts as on time).
        self._partition_handle = None
        self._end_partition()

    def _end_partition(self) -> None:
        self._partitioned_until = None
        if self._partition_handle is not None:
            self._partition_handle.cancel()
            self._partition_handle = None
        waiters, self._partition_waiters = self._partition_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        for link in list(self._links.values()):
            for pipe in link.pipes.values():
                pipe.schedule()

    def heal(self) -> None:
        """End the partition and every delay now.  Cut and black-holed links stay dead."""
        for direction in Direction:
            self._delays[direction] = 0.0
            for link in self._links.values():
                link.pipes[direction].delay_seconds = 0.0
        self._end_partition()

    # --- introspection -----------------------------------------------------------------------------------

    @property
    def in_flight_bytes(self) -> int:
        return sum(pipe.queued_bytes for link in self._links.values() for pipe in link.pipes.values())

    def check_invariants(self) -> None:
        for number, link in self._links.items():
            assert link.number == number and not link.closed, link
            link.check_invariants()
        if not self.partitioned:
            assert not any(not waiter.done() for waiter in self._partition_waiters)
