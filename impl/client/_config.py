"""The client's knobs for tests, its randomness, its reconnect backoff and the server address.

Every value in ``ClientConfig`` defaults to the limit of the same meaning in ``millstream.limits`` and
may only be made smaller (a limit is an upper bound, not a tuning knob): tests shrink timeouts and
delays so a lost acknowledgement or a dead server shows within milliseconds.

``connector`` is the one field that is not a limit: a test hands the client a simulated network
(``millstream.testing.network``) instead of TCP.

Randomness arrives as data (STYLE.md #2): writer ids and backoff jitter come from a ``RandomSource``.
Pass a seeded ``random.Random`` and a run replays exactly; the default draws from the operating
system (``os.urandom``), as ``SystemClock`` reads the real clock.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import attrs
from millstream import limits
from millstream.errors import InvalidArgumentError

__all__ = ["Backoff", "ClientConfig", "Connector", "Endpoint", "RandomSource", "SystemRandomSource", "parse_uri",
           "random_uuid"]

#: Opens a byte stream to ``host:port`` for a protocol, as ``loop.create_connection(factory, host, port)``
#: does: ``ClientConfig.connector`` (a simulated network's ``create_connection`` in tests).
Connector = Callable[[Callable[[], asyncio.BaseProtocol], str, int],
                     Awaitable[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]]


class RandomSource(Protocol):
    """Where the client's randomness comes from; ``random.Random`` is one."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...

    def getrandbits(self, k: int, /) -> int:
        """An int of ``k`` random bits."""
        ...


class SystemRandomSource:
    """Randomness from the operating system: the default when no seeded source is given."""

    def random(self) -> float:
        return (int.from_bytes(os.urandom(7), "big") >> 3) / (1 << 53)

    def getrandbits(self, k: int, /) -> int:
        if k < 0:
            raise InvalidArgumentError(f"bits must be non-negative, not {k}")
        return int.from_bytes(os.urandom((k + 7) // 8), "big") >> (-k % 8)


def random_uuid(rng: RandomSource) -> uuid.UUID:
    """A version-4 UUID drawn from ``rng`` (a writer id)."""
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def _positive_at_most(limit: float) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= limit:
            raise InvalidArgumentError(f"{attribute.name} must be in (0, {limit}], not {value!r}")
    return check


def _callable_or_none(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise InvalidArgumentError(f"{attribute.name} must be callable or None, not {value!r}")


@attrs.frozen(kw_only=True)
class ClientConfig:
    """Timeouts, retry counts and sizes of one client.  Each defaults to its limit in ``millstream.limits``
    and must lie in (0, limit]; lower values are for tests and latency-sensitive callers."""

    connections_per_endpoint_max: int = attrs.field(
        default=limits.CLIENT_CONNECTIONS_PER_ENDPOINT_MAX,
        validator=_positive_at_most(limits.CLIENT_CONNECTIONS_PER_ENDPOINT_MAX))
    connect_timeout_seconds: float = attrs.field(
        default=limits.CLIENT_CONNECT_TIMEOUT_SECONDS,
        validator=_positive_at_most(limits.CLIENT_CONNECT_TIMEOUT_SECONDS))
    request_timeout_seconds: float = attrs.field(
        default=limits.CLIENT_REQUEST_TIMEOUT_SECONDS,
        validator=_positive_at_most(limits.CLIENT_REQUEST_TIMEOUT_SECONDS))
    append_ack_timeout_seconds: float = attrs.field(
        default=limits.CLIENT_APPEND_ACK_TIMEOUT_SECONDS,
        validator=_positive_at_most(limits.CLIENT_APPEND_ACK_TIMEOUT_SECONDS))
    keepalive_interval_seconds: float = attrs.field(
        default=limits.KEEPALIVE_INTERVAL_SECONDS,
        validator=_positive_at_most(limits.KEEPALIVE_INTERVAL_SECONDS))
    reconnect_attempts_max: int = attrs.field(
        default=limits.CLIENT_RECONNECT_ATTEMPTS_MAX,
        validator=_positive_at_most(limits.CLIENT_RECONNECT_ATTEMPTS_MAX))
    reconnect_delay_initial_seconds: float = attrs.field(
        default=limits.CLIENT_RECONNECT_DELAY_INITIAL_SECONDS,
        validator=_positive_at_most(limits.CLIENT_RECONNECT_DELAY_INITIAL_SECONDS))
    reconnect_delay_max_seconds: float = attrs.field(
        default=limits.CLIENT_RECONNECT_DELAY_MAX_SECONDS,
        validator=_positive_at_most(limits.CLIENT_RECONNECT_DELAY_MAX_SECONDS))
    writer_unacked_bytes_max: int = attrs.field(
        default=limits.CLIENT_WRITER_UNACKED_BYTES_MAX,
        validator=_positive_at_most(limits.CLIENT_WRITER_UNACKED_BYTES_MAX))
    writer_block_bytes_max: int = attrs.field(
        default=limits.CLIENT_WRITER_BLOCK_BYTES_MAX,
        validator=_positive_at_most(limits.CLIENT_WRITER_BLOCK_BYTES_MAX))
    read_length_bytes: int = attrs.field(
        default=limits.CLIENT_READ_LENGTH_BYTES,
        validator=_positive_at_most(limits.READ_LENGTH_MAX_BYTES))
    #: Injection point for tests: open connections with this instead of TCP (plain connections only;
    #: a ``tls://`` endpoint is refused).  None, the default: ``loop.create_connection``.
    connector: Connector | None = attrs.field(default=None, eq=False, repr=False, validator=_callable_or_none)

    def backoff(self, rng: RandomSource) -> Backoff:
        """The reconnect schedule these settings describe, jittered by ``rng``."""
        return Backoff(initial_seconds=self.reconnect_delay_initial_seconds,
                       maximum_seconds=self.reconnect_delay_max_seconds,
                       attempts_max=self.reconnect_attempts_max, rng=rng)


class Backoff:
    """Bounded exponential backoff with jitter: the wait before attempt ``n`` (1-based) of a run of
    failures is min(initial x multiplier**(n-1), maximum) x a factor in [0.5, 1) from ``rng``; after
    ``attempts_max`` failures in a row ``delay`` returns None (give up).  Pure: no clock, no sleeping."""

    __slots__ = ("_attempts_max", "_initial", "_maximum", "_multiplier", "_rng")

    def __init__(self, *, initial_seconds: float, maximum_seconds: float, attempts_max: int, rng: RandomSource,
                 multiplier: float = limits.CLIENT_RECONNECT_DELAY_MULTIPLIER) -> None:
        if not (0 < initial_seconds <= maximum_seconds and attempts_max >= 1 and multiplier >= 1):
            raise InvalidArgumentError(
                f"backoff needs 0 < initial <= maximum, attempts >= 1 and multiplier >= 1; got {initial_seconds}, "
                f"{maximum_seconds}, {attempts_max}, {multiplier}")
        self._initial = initial_seconds
        self._maximum = maximum_seconds
        self._attempts_max = attempts_max
        self._multiplier = multiplier
        self._rng = rng

    @property
    def attempts_max(self) -> int:
        return self._attempts_max

    def delay(self, failures: int) -> float | None:
        """Seconds to wait after ``failures`` failures in a row (>= 1), or None once they exceed the budget."""
        if failures < 1:
            raise InvalidArgumentError(f"failures count from 1, not {failures}")
        if failures > self._attempts_max:
            return None
        exponent = min(failures - 1, 64)  # beyond that the cap applies anyway; keeps the power finite
        base = min(self._initial * self._multiplier ** exponent, self._maximum)
        return base * (0.5 + 0.5 * self._rng.random())


# --- Addresses -------------------------------------------------------------------------------------

_SCHEMES: Final = {"tcp": False, "tls": True}


@attrs.frozen
class Endpoint:
    """A server's address: host, port, and whether the connection uses TLS."""

    host: str
    port: int
    tls: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'tls' if self.tls else 'tcp'}://{host}:{self.port}"


def parse_uri(uri: str) -> Endpoint:
    """``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (IPv6 hosts in brackets) -> ``Endpoint``.  Raises
    ``InvalidArgumentError`` for anything else (another scheme, no port, a path or credentials)."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(f"a server URI is a string like tcp://127.0.0.1:9090, not {type(uri).__name__}")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as error:
        raise InvalidArgumentError(f"bad server URI {uri!r}: {error}") from None
    if parts.scheme not in _SCHEMES:
        raise InvalidArgumentError(f"bad server URI {uri!r}: the scheme must be tcp:// or tls://")
    if not parts.hostname or port is None:
        raise InvalidArgumentError(f"bad server URI {uri!r}: it needs a host and a port, e.g. tcp://127.0.0.1:9090")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidArgumentError(f"bad server URI {uri!r}: only tcp://HOST:PORT or tls://HOST:PORT")
    return Endpoint(parts.hostname, port, _SCHEMES[parts.scheme])
