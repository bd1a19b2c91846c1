"""The client's knobs for tests, its randomness, its reconnect backoff and budgets, and the server address.

Every timeout, delay and size in ``ClientConfig`` defaults to the limit of the same meaning in
``millstream.limits`` and may only be made smaller (a limit is an upper bound, not a tuning knob):
tests shrink timeouts and delays so a lost acknowledgement or a dead server shows within
milliseconds.  The two *budgets* are the application's choice, larger included:

* ``initial_connect_budget_seconds`` -- how long a client that has never reached any server keeps
  trying to (a server still starting); after it, ``ConnectFailedError`` names the address.  A TLS
  failure is never retried (``TlsHandshakeError``).
* ``reconnect_budget_seconds`` -- how long one *outage* of a server that was reached may last before
  a call (a request, a writer, a reader) gives up with ``ReconnectBudgetExceededError``.  It is per
  outage: it starts at the first failure after a success and is whole again once a connection does
  useful work, so many short outages never add up.  ``None`` or ``math.inf``: never give up.

An ``Outage`` applies them: the jittered, capped ``Backoff`` between attempts, the budget on the
injected clock.

``connector`` is the one field that is not a limit: a test hands the client a simulated network
(``millstream.testing.network``) instead of TCP.

Randomness arrives as data (STYLE.md #2): writer ids and backoff jitter come from a ``RandomSource``.
Pass a seeded ``random.Random`` and a run replays exactly; the default draws from the operating
system (``os.urandom``), as ``SystemClock`` reads the real clock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlsplit

import attrs

from millstream import limits
from millstream.clock import Clock
from millstream.errors import InvalidArgumentError
from millstream.randomness import RandomSource, SystemRandomSource, random_uuid

__all__ = ["Backoff", "ClientConfig", "Connector", "Endpoint", "Outage", "RandomSource", "SystemRandomSource",
           "parse_uri", "random_uuid"]

#: Opens a byte stream to ``host:port`` for a protocol, as ``loop.create_connection(factory, host, port)``
#: does: ``ClientConfig.connector`` (a simulated network's ``create_connection`` in tests).
Connector = Callable[[Callable[[], asyncio.BaseProtocol], str, int],
                     Awaitable[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]]


def _positive_at_most(limit: float) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= limit:
            raise InvalidArgumentError(f"{attribute.name} must be in (0, {limit}], not {value!r}")
    return check


def _budget_seconds(value: Any) -> Any:
    """A budget: None means forever (``math.inf``); anything else is checked by ``_positive_budget``."""
    return math.inf if value is None else value


def _positive_budget(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or not value > 0:
        raise InvalidArgumentError(f"{attribute.name} must be a positive number of seconds, or None (or math.inf) "
                                   f"for no limit, not {value!r}")


def _attempts_or_none(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidArgumentError(f"{attribute.name} must be a positive int, or None (the time budget alone "
                                   f"decides), not {value!r}")


def _callable_or_none(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise InvalidArgumentError(f"{attribute.name} must be callable or None, not {value!r}")


@attrs.frozen(kw_only=True)
class ClientConfig:
    """Timeouts, budgets and sizes of one client.  Each timeout, delay and size defaults to its limit in
    ``millstream.limits`` and must lie in (0, limit]; lower values are for tests and latency-sensitive
    callers.  The budgets (see the module docstring) may be any positive number of seconds, or None
    for no limit: ``initial_connect_budget_seconds`` (never reached a server: keep trying this long,
    then ``ConnectFailedError``) and ``reconnect_budget_seconds`` (per outage of a server that was
    reached: then ``ReconnectBudgetExceededError``, whose ``in_doubt`` names a writer's unacknowledged
    events).  ``reconnect_attempts_max`` additionally caps the attempts of one outage (None: the time
    budget alone decides; tests set a count)."""

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
    initial_connect_budget_seconds: float = attrs.field(
        default=limits.CLIENT_INITIAL_CONNECT_BUDGET_SECONDS, converter=_budget_seconds,
        validator=_positive_budget)
    reconnect_budget_seconds: float = attrs.field(
        default=limits.CLIENT_RECONNECT_BUDGET_SECONDS, converter=_budget_seconds, validator=_positive_budget)
    reconnect_attempts_max: int | None = attrs.field(default=None, validator=_attempts_or_none)
    reconnect_delay_initial_seconds: float = attrs.field(
        default=limits.CLIENT_RECONNECT_DELAY_INITIAL_SECONDS,
        validator=_positive_at_most(limits.CLIENT_RECONNECT_DELAY_INITIAL_SECONDS))
    reconnect_delay_max_seconds: float = attrs.field(
        default=limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX,
        validator=_positive_at_most(limits.CLIENT_RECONNECT_DELAY_SECONDS_MAX))
    writer_unacked_bytes_max: int = attrs.field(
        default=limits.CLIENT_WRITER_UNACKED_BYTES_MAX,
        validator=_positive_at_most(limits.CLIENT_WRITER_UNACKED_BYTES_MAX))
    writer_block_bytes_max: int = attrs.field(
        default=limits.CLIENT_WRITER_BLOCK_BYTES_MAX,
        validator=_positive_at_most(limits.CLIENT_WRITER_BLOCK_BYTES_MAX))
    read_length_bytes: int = attrs.field(
        default=limits.CLIENT_READ_LENGTH_BYTES,
        validator=_positive_at_most(limits.READ_LENGTH_BYTES_MAX))
    #: Injection point for tests: open connections with this instead of TCP (plain connections only;
    #: a ``tls://`` endpoint is refused).  None, the default: ``loop.create_connection``.
    connector: Connector | None = attrs.field(default=None, eq=False, repr=False, validator=_callable_or_none)

    def backoff(self, rng: RandomSource, *, initial_connect: bool = False) -> Backoff:
        """The reconnect schedule these settings describe, jittered by ``rng``, within the reconnect
        budget (or, with ``initial_connect``, the initial connect budget)."""
        return Backoff(initial_seconds=self.reconnect_delay_initial_seconds,
                       maximum_seconds=self.reconnect_delay_max_seconds,
                       attempts_max=self.reconnect_attempts_max, rng=rng,
                       budget_seconds=self.initial_connect_budget_seconds if initial_connect
                       else self.reconnect_budget_seconds)

    def outage(self, rng: RandomSource, clock: Clock, *, initial_connect: bool = False) -> Outage:
        """A fresh ``Outage`` on ``clock`` with this schedule and budget (see ``backoff``)."""
        return Outage(self.backoff(rng, initial_connect=initial_connect), clock)


class Backoff:
    """Bounded exponential backoff with jitter, within a budget: the wait before attempt ``n`` (1-based)
    of a run of failures is min(initial x multiplier**(n-1), maximum) x a factor in [0.5, 1) from
    ``rng``, cut to what is left of ``budget_seconds``; ``delay`` returns None (give up) once the run
    has lasted the budget, or after ``attempts_max`` failures if that is set.  With neither (no count,
    an infinite budget) it never gives up -- every wait is still capped by ``maximum``.  Pure: the
    caller says how long the run has lasted (``Outage`` measures it); no clock, no sleeping."""

    __slots__ = ("_attempts_max", "_budget", "_initial", "_maximum", "_multiplier", "_rng")

    def __init__(self, *, initial_seconds: float, maximum_seconds: float, attempts_max: int | None,
                 rng: RandomSource, multiplier: float = limits.CLIENT_RECONNECT_DELAY_MULTIPLIER,
                 budget_seconds: float = math.inf) -> None:
        if not (0 < initial_seconds <= maximum_seconds and (attempts_max is None or attempts_max >= 1)
                and multiplier >= 1 and budget_seconds > 0):
            raise InvalidArgumentError(
                f"backoff needs 0 < initial <= maximum, attempts >= 1 (or None), multiplier >= 1 and a positive "
                f"budget; got {initial_seconds}, {maximum_seconds}, {attempts_max}, {multiplier}, {budget_seconds}")
        self._initial = initial_seconds
        self._maximum = maximum_seconds
        self._attempts_max = attempts_max
        self._multiplier = multiplier
        self._rng = rng
        self._budget = budget_seconds

    @property
    def attempts_max(self) -> int | None:
        return self._attempts_max

    @property
    def budget_seconds(self) -> float:
        """How long a run of failures may last (``math.inf``: forever)."""
        return self._budget

    def delay(self, failures: int, elapsed_seconds: float = 0.0) -> float | None:
        """Seconds to wait after ``failures`` failures in a row (>= 1) that have lasted ``elapsed_seconds``
        so far, or None: give up (the budget is spent, or the attempts are).  The wait never runs past
        the budget: the last attempt is made when it ends."""
        if failures < 1:
            raise InvalidArgumentError(f"failures count from 1, not {failures}")
        if (self._attempts_max is not None and failures > self._attempts_max) or elapsed_seconds >= self._budget:
            return None
        exponent = min(failures - 1, 64)  # beyond that the cap applies anyway; keeps the power finite
        base = min(self._initial * self._multiplier ** exponent, self._maximum)
        return min(base * (0.5 + 0.5 * self._rng.random()), self._budget - elapsed_seconds)


class Outage:
    """One outage as a retry loop sees it: ``failed()`` after each failed attempt returns the wait
    before the next (``Backoff``), or None once the outage has lasted the budget -- measured on the
    injected clock from its first failure; ``ended()`` after a success (a connection that did useful
    work) makes the next failure start a new outage with the whole budget.  Not thread-safe; one per
    retry loop."""

    __slots__ = ("_backoff", "_clock", "_started", "failures")

    def __init__(self, backoff: Backoff, clock: Clock) -> None:
        self._backoff = backoff
        self._clock = clock
        self._started: float | None = None
        #: Failures in this outage so far.
        self.failures = 0

    @property
    def budget_seconds(self) -> float:
        return self._backoff.budget_seconds

    @property
    def seconds(self) -> float:
        """How long this outage has lasted (0 if none is going on)."""
        return 0.0 if self._started is None else self._clock.monotonic() - self._started

    def failed(self) -> float | None:
        """Count a failed attempt; return the wait before the next one, or None: give up."""
        now = self._clock.monotonic()
        if self._started is None:
            self._started = now
        self.failures += 1
        return self._backoff.delay(self.failures, now - self._started)

    def ended(self) -> None:
        """An attempt succeeded: the outage (if any) is over."""
        self._started = None
        self.failures = 0

    def describe(self) -> str:
        """``"N attempts in S s"``, for messages."""
        return f"{self.failures} attempt{'s' if self.failures != 1 else ''} in {self.seconds:.1f} s"


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
