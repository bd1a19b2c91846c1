"""Workloads for the peers harness: small TOML files in the spirit of the OpenMessaging Benchmark.

A workload says *what* load to offer and for how long; the harness (``bench.harness``)
offers it to every system named, one offered rate at a time, and records what each achieved.  The
files bundled with the benchmarks live in ``bench/workloads/*.toml``; ``--workload FILE``
runs any other.  A file looks like this (every key but ``name`` has the default shown)::

    name = "100B-keys-16seg"            # letters, digits, '-', '_' and '.'
    description = ""                    # one line for the report
    event_bytes = 100                   # payload bytes per event (at least 16: the send time rides in it)
    segments = 1                        # segments / partitions / streams the events spread over: 1..64
    routing_keys = "random"             # "random": a key per event, uniform over routing_key_count keys;
    routing_key_count = 10000           #   "none": no key (millstream picks a segment; peers round-robin)
    consumers = 0                       # tail readers (0: no end-to-end latency); at most `segments`
    rates = ["max", "50%"]              # offered events/s: a number, "max" (as fast as the system takes
                                        #   them) or "N%" of this system's "max" in this workload
    duration_seconds = 5.0              # measured window per offered rate ...
    warmup_seconds = 1.0                # ... after an unmeasured warm-up at the same rate
    systems = ["millstream", "nats-jetstream", "redis-streams"]   # which drivers (see drivers/)
    seed = 1                            # decides the routing-key sequence

    [targets]                           # optional: what the report checks (issue 9's targets)
    events_per_second_vs_best_peer_min = 3.0     # millstream "max" events/s / the best durable peer's
    write_p95_ms_at_half_max_max = 10.0          # millstream p95 write latency at "50%"
    megabytes_per_second_vs_raw_loop_min = 0.5   # millstream "max" MB/s / raw 1 MiB group-commit loop
    end_to_end_p95_ms_max = 10.0                 # millstream end-to-end p95 ...
    end_to_end_rate = 10000                      # ... at this offered rate (one of `rates`)

Relative rates ("50%") are resolved per system once its "max" step has run, so "p95 at half the
maximum rate" is measured at *each system's own* half.  A workload with a relative rate must also
list "max", and "max" runs first whatever its position in the list.

Parsing is pure (``parse_workload`` takes the TOML text); bad input raises ``InvalidArgumentError``
naming the file and the key, and nothing is run.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import attrs

from bench.limits import (
    BENCH_DURATION_SECONDS_MAX,
    BENCH_EVENT_BYTES_MAX,
    BENCH_OFFERED_RATE_MAX,
    BENCH_RATES_PER_WORKLOAD_MAX,
    BENCH_ROUTING_KEYS_MAX,
    BENCH_SEGMENTS_MAX,
)
from millstream.errors import InvalidArgumentError

__all__ = [
    "SUITES",
    "SYSTEM_NAMES",
    "Rate",
    "Targets",
    "Workload",
    "bundled_workload",
    "load_workload",
    "parse_workload",
    "suite_workloads",
]

#: Every system the harness has a driver for (``bench.drivers``), in report order.
SYSTEM_NAMES: Final = ("millstream", "nats-jetstream", "redis-streams", "nats-jetstream-default",
                       "redis-streams-everysec")

#: The systems a workload names when it names none: millstream and the peers at equal durability.
DEFAULT_SYSTEMS: Final = ("millstream", "nats-jetstream", "redis-streams")

#: The suites ``python -m bench --suite`` runs through this harness, as bundled workload names.
#: ``quick`` answers issue 9's three targets in a few minutes; ``peers`` is the seed's grid (100 B and
#: 10 KB, 1 and 16 segments, keys and none) with the default-durability peers shown as well.
SUITES: Final[Mapping[str, tuple[str, ...]]] = {
    "quick": ("quick-100B-keys-16seg", "quick-10KB-16seg", "quick-end-to-end-100B"),
    "peers": ("peers-100B-keys-1seg", "peers-100B-keys-16seg", "peers-100B-nokeys-16seg",
              "peers-10KB-1seg", "peers-10KB-16seg", "peers-end-to-end-100B-16seg"),
}

#: The payload carries the writer's send time (8 bytes) for end-to-end latency, and a tail of at least
#: 8 bytes that makes it one of the pool's distinct payloads (``_load.PayloadPool``).
EVENT_BYTES_MIN: Final = 16

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
_PERCENT: Final = re.compile(r"(\d{1,3}(?:\.\d+)?)%")
_KEYS: Final = frozenset({"name", "description", "event_bytes", "segments", "routing_keys", "routing_key_count",
                          "consumers", "rates", "duration_seconds", "warmup_seconds", "systems", "seed", "targets"})
_TARGET_KEYS: Final = frozenset({"events_per_second_vs_best_peer_min", "write_p95_ms_at_half_max_max",
                                 "megabytes_per_second_vs_raw_loop_min", "end_to_end_p95_ms_max",
                                 "end_to_end_rate"})


@attrs.frozen
class Rate:
    """An offered rate: ``events_per_second`` (absolute), or ``max`` (unpaced), or ``percent_of_max``."""

    events_per_second: float | None = None
    percent_of_max: float | None = None

    @property
    def is_max(self) -> bool:
        return self.events_per_second is None and self.percent_of_max is None

    @property
    def label(self) -> str:
        if self.events_per_second is not None:
            return f"{self.events_per_second:,.0f}/s"
        if self.percent_of_max is not None:
            return f"{self.percent_of_max:g}% of max"
        return "max"

    def resolve(self, max_events_per_second: float | None) -> float | None:
        """Events/s to offer (None: unpaced).  A relative rate needs the system's measured max."""
        if self.events_per_second is not None:
            return self.events_per_second
        if self.percent_of_max is None:
            return None
        if not max_events_per_second:
            raise InvalidArgumentError(f"rate {self.label} needs a measured maximum first")
        return max(1.0, max_events_per_second * self.percent_of_max / 100.0)


MAX: Final = Rate()


@attrs.frozen
class Targets:
    """What the report checks for millstream in this workload (None: not checked here)."""

    events_per_second_vs_best_peer_min: float | None = None
    write_p95_ms_at_half_max_max: float | None = None
    megabytes_per_second_vs_raw_loop_min: float | None = None
    end_to_end_p95_ms_max: float | None = None
    end_to_end_rate: float | None = None


@attrs.frozen
class Workload:
    name: str
    description: str
    event_bytes: int
    segments: int
    routing_keys: bool  # False: "none"
    routing_key_count: int
    consumers: int
    rates: tuple[Rate, ...]  # in run order: "max" first if present
    duration_seconds: float
    warmup_seconds: float
    systems: tuple[str, ...]
    seed: int
    targets: Targets = Targets()
    source: str = "<text>"  # the file it came from, for messages

    @property
    def routing_label(self) -> str:
        return f"random over {self.routing_key_count:,} keys" if self.routing_keys else "none"

    def with_timing(self, *, duration_seconds: float | None, warmup_seconds: float | None) -> Workload:
        """The same workload with its window and warm-up overridden (the CLI's --duration/--warmup)."""
        return attrs.evolve(
            self,
            duration_seconds=self.duration_seconds if duration_seconds is None else duration_seconds,
            warmup_seconds=self.warmup_seconds if warmup_seconds is None else warmup_seconds)


def parse_workload(text: str, source: str = "<text>") -> Workload:
    """A workload from TOML text.  Raises ``InvalidArgumentError`` naming ``source`` and the bad key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidArgumentError(f"{source}: not valid TOML: {error}") from error
    return _workload_from(document, source)


def load_workload(path: Path) -> Workload:
    """A workload from a TOML file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidArgumentError(f"{path}: cannot read the workload: {error}") from error
    return parse_workload(text, str(path))


def bundled_workload(name: str) -> Workload:
    """One of the workloads bundled with the benchmarks (``bench/workloads/NAME.toml``)."""
    resource = resources.files("bench").joinpath("workloads", f"{name}.toml")
    if not _NAME.fullmatch(name) or not resource.is_file():
        raise InvalidArgumentError(f"no bundled workload named {name!r}")
    return parse_workload(resource.read_text(encoding="utf-8"), f"workloads/{name}.toml")


def suite_workloads(suite: str) -> tuple[Workload, ...]:
    """The bundled workloads of a harness suite, in run order."""
    if suite not in SUITES:
        raise InvalidArgumentError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return tuple(bundled_workload(name) for name in SUITES[suite])


# --- validation ------------------------------------------------------------------------------------


def _workload_from(document: Mapping[str, Any], source: str) -> Workload:
    unknown = sorted(set(document) - _KEYS)
    if unknown:
        raise InvalidArgumentError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    if "name" not in document:
        raise InvalidArgumentError(f"{source}: missing key 'name'")
    name = _typed(document, "name", str, source)
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"{source}: name {name!r} must be 1-100 letters, digits, '-', '_' or '.'")
    segments = _integer(document, "segments", 1, source, low=1, high=BENCH_SEGMENTS_MAX)
    routing = _typed(document, "routing_keys", str, source, default="random")
    if routing not in {"random", "none"}:
        raise InvalidArgumentError(f"{source}: routing_keys must be \"random\" or \"none\", not {routing!r}")
    consumers = _integer(document, "consumers", 0, source, low=0, high=segments)
    duration = _number(document, "duration_seconds", 5.0, source, low=0.01, high=BENCH_DURATION_SECONDS_MAX)
    warmup = _number(document, "warmup_seconds", 1.0, source, low=0.0, high=BENCH_DURATION_SECONDS_MAX)
    rates = _rates(document.get("rates", ["max", "50%"]), source)
    systems = _systems(document.get("systems", list(DEFAULT_SYSTEMS)), source)
    targets = _targets(document.get("targets", {}), rates, source)
    return Workload(
        name=name,
        description=_typed(document, "description", str, source, default=""),
        event_bytes=_integer(document, "event_bytes", 100, source, low=EVENT_BYTES_MIN, high=BENCH_EVENT_BYTES_MAX),
        segments=segments,
        routing_keys=routing == "random",
        routing_key_count=_integer(document, "routing_key_count", 10_000, source, low=1, high=BENCH_ROUTING_KEYS_MAX),
        consumers=consumers,
        rates=rates,
        duration_seconds=duration,
        warmup_seconds=warmup,
        systems=systems,
        seed=_integer(document, "seed", 1, source, low=0, high=2**63 - 1),
        targets=targets,
        source=source,
    )


def _typed(document: Mapping[str, Any], key: str, kind: type, source: str, default: Any = None) -> Any:
    value = document.get(key, default)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise InvalidArgumentError(f"{source}: {key} must be a {kind.__name__}, not {value!r}")
    return value


def _integer(document: Mapping[str, Any], key: str, default: int, source: str, *, low: int, high: int) -> int:
    value = _typed(document, key, int, source, default=default)
    if not low <= value <= high:
        raise InvalidArgumentError(f"{source}: {key} = {value} must be between {low:,} and {high:,}")
    return int(value)


def _number(document: Mapping[str, Any], key: str, default: float, source: str, *, low: float,
            high: float) -> float:
    value = document.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{source}: {key} must be a number, not {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{source}: {key} = {value} must be between {low:g} and {high:g}")
    return float(value)


def _rates(values: Any, source: str) -> tuple[Rate, ...]:
    if not isinstance(values, list) or not values:
        raise InvalidArgumentError(f"{source}: rates must be a non-empty list, not {values!r}")
    if len(values) > BENCH_RATES_PER_WORKLOAD_MAX:
        raise InvalidArgumentError(f"{source}: at most {BENCH_RATES_PER_WORKLOAD_MAX} rates, not {len(values)}")
    rates: list[Rate] = []
    for value in values:
        rates.append(_rate(value, source))
    if len(set(rates)) != len(rates):
        raise InvalidArgumentError(f"{source}: rates repeat: {values!r}")
    if any(rate.percent_of_max is not None for rate in rates) and MAX not in rates:
        raise InvalidArgumentError(f"{source}: a relative rate (\"N%\") needs \"max\" in rates too")
    # "max" first: the relative rates are fractions of it.
    return tuple(sorted(rates, key=lambda rate: not rate.is_max))


def _rate(value: Any, source: str) -> Rate:
    if isinstance(value, str):
        if value == "max":
            return MAX
        match = _PERCENT.fullmatch(value)
        if match and 0 < float(match.group(1)) <= 100:
            return Rate(percent_of_max=float(match.group(1)))
    elif isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= BENCH_OFFERED_RATE_MAX:
        return Rate(events_per_second=float(value))
    raise InvalidArgumentError(
        f"{source}: rate {value!r} must be \"max\", \"N%\" (0 < N <= 100) or events/s in (0, "
        f"{BENCH_OFFERED_RATE_MAX:,}]")


def _systems(values: Any, source: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not values or not all(isinstance(value, str) for value in values):
        raise InvalidArgumentError(f"{source}: systems must be a non-empty list of names, not {values!r}")
    unknown = [value for value in values if value not in SYSTEM_NAMES]
    if unknown:
        raise InvalidArgumentError(
            f"{source}: unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEM_NAMES)}")
    if len(set(values)) != len(values):
        raise InvalidArgumentError(f"{source}: systems repeat: {values!r}")
    return tuple(name for name in SYSTEM_NAMES if name in values)


def _targets(table: Any, rates: Sequence[Rate], source: str) -> Targets:
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"{source}: [targets] must be a table, not {table!r}")
    unknown = sorted(set(table) - _TARGET_KEYS)
    if unknown:
        raise InvalidArgumentError(f"{source}: unknown target(s) {', '.join(unknown)}; known: "
                                   f"{', '.join(sorted(_TARGET_KEYS))}")
    values = {key: _number(table, key, 0.0, f"{source} [targets]", low=1e-9, high=1e12) for key in table}
    targets = Targets(**values)
    if (targets.end_to_end_p95_ms_max is None) != (targets.end_to_end_rate is None):
        raise InvalidArgumentError(f"{source}: end_to_end_p95_ms_max and end_to_end_rate go together")
    if targets.end_to_end_rate is not None and Rate(events_per_second=targets.end_to_end_rate) not in rates:
        raise InvalidArgumentError(f"{source}: end_to_end_rate {targets.end_to_end_rate:g} is not one of the rates")
    if targets.write_p95_ms_at_half_max_max is not None and Rate(percent_of_max=50.0) not in rates:
        raise InvalidArgumentError(f"{source}: write_p95_ms_at_half_max_max needs \"50%\" in rates")
    return targets
