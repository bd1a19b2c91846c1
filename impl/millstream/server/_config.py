"""The segment-store server's settings, and the two budgets that decide when a connection stops
reading: the ingress budget (append bytes in flight) and the receive budget (bytes of partly received
frames)."""

from __future__ import annotations

from typing import Any

import attrs

from millstream import limits
from millstream.errors import InvalidArgumentError

__all__ = ["FramePool", "IngressBudget", "ReceiveBudget", "ServerConfig"]


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"{attribute.name} must be a positive number, not {value!r}")


def _owned(value: object) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        owned = frozenset(value)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(f"owned_containers must be a set of container ids, not {value!r}") from None
    return owned  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class ServerConfig:
    """Where a ``SegmentStoreServer`` listens, what it owns, and its limits (defaults and their
    reasons are in ``millstream.limits``).  Invalid values raise ``InvalidArgumentError``.

    ``owned_containers``: the container ids this server hosts (None: all of
    ``range(container_count)``).  Segments of other containers are answered ``WrongHost``."""

    host: str = "127.0.0.1"
    port: int = 0
    container_count: int = attrs.field(default=4, validator=_positive)
    owned_containers: frozenset[int] | None = attrs.field(default=None, converter=_owned)
    in_flight_bytes_max: int = attrs.field(default=limits.SERVER_IN_FLIGHT_BYTES_MAX, validator=_positive)
    connection_in_flight_bytes_target: int = attrs.field(
        default=limits.SERVER_CONNECTION_IN_FLIGHT_BYTES_TARGET, validator=_positive)
    connection_in_flight_bytes_min: int = attrs.field(
        default=limits.SERVER_CONNECTION_IN_FLIGHT_BYTES_MIN, validator=_positive)
    append_overhead_bytes: int = attrs.field(default=limits.SERVER_APPEND_OVERHEAD_BYTES)
    connection_requests_max: int = attrs.field(default=limits.SERVER_CONNECTION_REQUESTS_MAX, validator=_positive)
    connection_read_bytes_max: int = attrs.field(default=limits.SERVER_CONNECTION_READ_BYTES_MAX, validator=_positive)
    connections_max: int = attrs.field(default=limits.SERVER_CONNECTIONS_MAX, validator=_positive)
    send_buffer_bytes_max: int = attrs.field(default=limits.SERVER_SEND_BUFFER_BYTES_MAX, validator=_positive)
    keepalive_interval_seconds: float = attrs.field(default=limits.KEEPALIVE_INTERVAL_SECONDS, validator=_positive)
    hello_timeout_seconds: float = attrs.field(default=limits.SERVER_HELLO_TIMEOUT_SECONDS, validator=_positive)
    shutdown_drain_seconds: float = attrs.field(default=limits.SERVER_SHUTDOWN_DRAIN_SECONDS, validator=_positive)
    tls_handshake_timeout_seconds: float = attrs.field(
        default=limits.SERVER_TLS_HANDSHAKE_TIMEOUT_SECONDS, validator=_positive)
    #: Hostile peers (``limits``' "Server: hostile peers" section has the reasons): the largest frame
    #: before authentication; bytes of partly received frames over all connections, and what each
    #: may hold whatever the total; deadlines for completing a started frame and for an idle
    #: connection; connections per peer address; writer sessions per connection.
    unauthenticated_frame_bytes_max: int = attrs.field(
        default=limits.SERVER_UNAUTHENTICATED_FRAME_BYTES_MAX, validator=_positive)
    receive_buffered_bytes_max: int = attrs.field(default=limits.SERVER_RECEIVE_BUFFERED_BYTES_MAX,
                                                  validator=_positive)
    connection_receive_buffered_bytes_min: int = attrs.field(
        default=limits.SERVER_CONNECTION_RECEIVE_BUFFERED_BYTES_MIN, validator=_positive)
    frame_timeout_seconds: float = attrs.field(default=limits.SERVER_FRAME_TIMEOUT_SECONDS, validator=_positive)
    #: None: ``KEEPALIVE_MISSED_MAX`` x ``keepalive_interval_seconds`` (``SERVER_IDLE_TIMEOUT_SECONDS``
    #: with the default interval); see ``idle_timeout``.
    idle_timeout_seconds: float | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    connections_per_address_max: int = attrs.field(default=limits.SERVER_CONNECTIONS_PER_ADDRESS_MAX,
                                                   validator=_positive)
    connection_writers_max: int = attrs.field(default=limits.SERVER_CONNECTION_WRITERS_MAX, validator=_positive)
    #: Transient segments (large events): deleted this long after their writer's connection closed,
    #: after this long unused, looked for this often (``_transient``).
    transient_disconnect_grace_seconds: float = attrs.field(
        default=limits.TRANSIENT_SEGMENT_DISCONNECT_GRACE_SECONDS, validator=_positive)
    transient_idle_seconds: float = attrs.field(default=limits.TRANSIENT_SEGMENT_IDLE_SECONDS, validator=_positive)
    transient_sweep_interval_seconds: float = attrs.field(
        default=limits.TRANSIENT_SEGMENT_SWEEP_INTERVAL_SECONDS, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise InvalidArgumentError(f"host must be a non-empty str, not {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port must lie in [0, 65535], not {self.port!r}")
        if not isinstance(self.container_count, int):
            raise InvalidArgumentError(f"container_count must be an int, not {self.container_count!r}")
        if self.owned_containers is not None:
            bad = [c for c in self.owned_containers
                   if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < self.container_count]
            if bad or not self.owned_containers:
                raise InvalidArgumentError(
                    f"owned_containers must be a non-empty subset of range({self.container_count}); "
                    f"{sorted(map(repr, bad)) or 'it is empty'}")
        if self.append_overhead_bytes < 0:
            raise InvalidArgumentError("append_overhead_bytes must be >= 0")
        if self.connection_in_flight_bytes_min > self.in_flight_bytes_max:
            raise InvalidArgumentError("connection_in_flight_bytes_min must not exceed in_flight_bytes_max")
        for name in ("unauthenticated_frame_bytes_max", "receive_buffered_bytes_max",
                     "connection_receive_buffered_bytes_min", "connections_per_address_max", "connection_writers_max"):
            if not isinstance(getattr(self, name), int):
                raise InvalidArgumentError(f"{name} must be an int, not {getattr(self, name)!r}")
        if self.unauthenticated_frame_bytes_max > limits.APPEND_LENGTH_BYTES_MAX:
            raise InvalidArgumentError(f"unauthenticated_frame_bytes_max must not exceed the frame limit "
                                       f"({limits.APPEND_LENGTH_BYTES_MAX})")
        if self.connection_receive_buffered_bytes_min > self.receive_buffered_bytes_max:
            raise InvalidArgumentError(
                "connection_receive_buffered_bytes_min must not exceed receive_buffered_bytes_max")

    @property
    def idle_timeout(self) -> float:
        """Seconds after which a connection with nothing in flight and no frame received is closed."""
        if self.idle_timeout_seconds is not None:
            return self.idle_timeout_seconds
        return limits.KEEPALIVE_MISSED_MAX * self.keepalive_interval_seconds

    @property
    def containers(self) -> frozenset[int]:
        """The container ids this server hosts."""
        if self.owned_containers is None:
            return frozenset(range(self.container_count))
        return self.owned_containers


class IngressBudget:
    """Append bytes in flight over a whole server, and the rule that says when one connection must
    stop reading: at or above ``total_max`` overall, or once the connection holds
    max(``connection_min``, 2 x ``connection_target`` - total) -- Pravega's shape (reference 1.10),
    so one connection alone may use twice its share, and under load every share shrinks."""

    __slots__ = ("connection_min", "connection_target", "total", "total_max")

    def __init__(self, total_max: int, connection_target: int, connection_min: int) -> None:
        self.total_max = total_max
        self.connection_target = connection_target
        self.connection_min = connection_min
        self.total = 0

    def connection_limit(self) -> int:
        return max(self.connection_min, 2 * self.connection_target - self.total)

    def must_pause(self, connection_bytes: int) -> bool:
        return self.total >= self.total_max or connection_bytes >= self.connection_limit()


class ReceiveBudget:
    """Bytes held for partly received frames over a whole server, and the rule for who may hold more.

    A connection asks (``take``) before its buffer for a large frame grows; bytes it already has (a
    small frame's start in its decoder, what arrived before authentication) are only counted
    (``charge``).  ``take`` grants ``more`` to ``holder`` (holding ``held`` already) if

    1. ``held + more`` stays within ``connection_min`` -- every connection's allowance, so small frames
       never wait for large ones; or
    2. ``holder`` is the *exempt* connection -- the one that may go past ``total_max`` until its frame
       is complete (``finish``), so that when every byte is held by frames that all need more, one of
       them still completes and the server never deadlocks; or
    3. ``total + more`` stays within ``total_max``; or
    4. nobody is exempt, and ``holder`` waits first (or nobody waits): it becomes the exempt one.

    Otherwise ``holder`` joins ``waiting`` (in order of arrival) and must stop reading; whoever gives
    bytes back (``give_back``, ``finish``) has the server offer the room to the waiting connections in
    that order.  So the total stays within ``total_max`` plus one frame plus each connection's
    allowance, and it grows only with bytes that peers really sent."""

    __slots__ = ("connection_min", "exempt", "total", "total_max", "waiting")

    def __init__(self, total_max: int, connection_min: int) -> None:
        self.total_max = total_max
        self.connection_min = connection_min
        self.total = 0
        self.exempt: object | None = None
        self.waiting: dict[object, None] = {}  # insertion-ordered

    @property
    def exhausted(self) -> bool:
        return self.total >= self.total_max

    def take(self, holder: object, held: int, more: int) -> bool:
        """Grant (and count) ``more`` bytes to ``holder``, which holds ``held``; or make it wait."""
        if (held + more <= self.connection_min or holder is self.exempt or self.total + more <= self.total_max
                or (self.exempt is None and (not self.waiting or next(iter(self.waiting)) is holder))):
            if self.exempt is None and self.total + more > self.total_max and held + more > self.connection_min:
                self.exempt = holder
            self.total += more
            self.waiting.pop(holder, None)
            return True
        self.waiting[holder] = None
        return False

    def charge(self, amount: int) -> None:
        """Count bytes a connection already holds (they arrived; there is no refusing them)."""
        self.total += amount

    def give_back(self, amount: int) -> None:
        self.total -= amount

    def finish(self, holder: object) -> None:
        """``holder`` completed its frame (or closed): it is exempt no more, and waits for nothing."""
        if self.exempt is holder:
            self.exempt = None
        self.waiting.pop(holder, None)

    def check_invariants(self) -> None:
        assert self.total >= 0, self.total
        assert self.exempt is None or self.exempt not in self.waiting


class FramePool:
    """Buffers of large frames already received, kept (at most ``total_max`` bytes of them, the most
    recently given back) for the next large frames.  ``take(size)`` hands over the smallest buffer
    at least ``size`` bytes long, or None: a frame is received into a pooled buffer only if it fits
    whole, so a pooled buffer is never resized and nothing is allocated for what a frame announces.
    A buffer's bytes past the frame it carries are left from earlier frames and never read."""

    __slots__ = ("buffers", "total", "total_max")

    def __init__(self, total_max: int) -> None:
        self.total_max = total_max
        self.total = 0
        self.buffers: list[bytearray] = []  # oldest first

    def take(self, size: int) -> bytearray | None:
        best = None
        for index, buffer in enumerate(self.buffers):
            if len(buffer) >= size and (best is None or len(buffer) < len(self.buffers[best])):
                best = index
        if best is None:
            return None
        buffer = self.buffers.pop(best)
        self.total -= len(buffer)
        return buffer

    def give(self, buffer: bytearray) -> None:
        """Keep ``buffer`` (the oldest ones go, if the pool would hold more than ``total_max``)."""
        if len(buffer) > self.total_max:
            return
        self.buffers.append(buffer)
        self.total += len(buffer)
        while self.total > self.total_max:
            self.total -= len(self.buffers.pop(0))

    def clear(self) -> None:
        self.buffers.clear()
        self.total = 0

    def check_invariants(self) -> None:
        assert self.total == sum(len(buffer) for buffer in self.buffers) <= self.total_max
