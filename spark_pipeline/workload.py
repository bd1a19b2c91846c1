"""The sensor workload of the reference pipeline: what the demo writes, and what the pipeline must answer.

Theory of operation.  A fleet of temperature sensors reports readings into a stream, keyed by sensor
id (the routing key, so one sensor's readings stay in order across scaling).  Event ``i`` of a
workload is a pure function of ``(seed, i)`` -- SplitMix64 over the pair, no hidden generator state
-- so the demo, the crash campaign and their verification regenerate exactly the events that were
written from a seed and a count, in any process:

* its sensor: sensors report at different rates (sensor ``k`` is picked with weight ``1 + k mod 4``);
* its event time: the workload's own clock, ``start_ms + i * 1000 / events_per_second``, minus a
  disorder of up to ``disorder_ms_max`` (readings arrive slightly out of order, as they do over a
  radio link).  Event time never depends on the wall clock, so the answer does not either;
* its temperature (°C, two decimals, written as a JSON number and aggregated as an exact decimal):
  a baseline per sensor plus noise, except during *overheating episodes* -- a sensor's 30-second
  slot is an episode with probability 1/16, and then about half its readings are at or above the
  alert threshold;
* one event in ``malformed_every`` is garbage (a truncated JSON document), which the pipeline's parse
  drops; the workload counts them so the verification can say so.

After the readings, ``end_markers`` gives one *watermark marker* per sensor (``"kind": "end"``), far
enough ahead in event time that the pipeline's watermark passes the end of every window that holds a
reading.  The pipeline drops markers after its watermark has seen them, so every window is emitted
(append mode emits a window only once the watermark passes its end) and none is made of markers.

``expected_output`` computes, in plain Python from the events alone, what the pipeline must write:
for each (sensor, window) one ``aggregate`` row (count, min, max, exact sum, readings at or above the
threshold) and, when at least ``alert_readings_min`` readings were hot, one ``alert`` row.
``verify`` compares that with the events read back from the output stream and counts duplicates,
missing, unexpected and mismatched rows.  Late data cannot change the answer: the disorder is kept
well inside the watermark delay (``SensorWorkload`` refuses a disorder that is not), and a reading's
event time is never more than the disorder behind the newest one written before it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import attrs

from millstream.errors import InvalidArgumentError

__all__ = [
    "EXPECTED_KINDS",
    "OutputKey",
    "SensorWorkload",
    "Verification",
    "expected_output",
    "parse_output",
    "splitmix64",
    "verify",
]

_MASK64: Final = (1 << 64) - 1
#: The kinds of output row the pipeline writes.
EXPECTED_KINDS: Final = ("aggregate", "alert")
#: A sensor's slot for overheating episodes (a few windows long, so an episode spans windows).
_EPISODE_SLOT_MS: Final = 30_000
#: 1 in this many slots is an episode.
_EPISODE_ODDS: Final = 16
#: 2001-09-09T01:46:40Z: event time of the first reading (an instant far from the epoch, so window
#: arithmetic on negative numbers never arises, and fixed, so a seed gives the same answer forever).
_START_MS: Final = 1_000_000_000_000


def splitmix64(value: int) -> int:
    """SplitMix64's output for state ``value``: a well-mixed 64-bit function of a 64-bit input."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _draw(seed: int, *parts: int) -> int:
    """A 64-bit draw that depends only on the seed and ``parts`` (a counter-based generator)."""
    value = splitmix64(seed & _MASK64)
    for part in parts:
        value = splitmix64(value ^ (part & _MASK64))
    return value


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(f"{attribute.name} must be a positive int, not {value!r}")


def _non_negative_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(f"{attribute.name} must be a non-negative int, not {value!r}")


@attrs.frozen(kw_only=True)
class SensorWorkload:
    """A seeded sensor workload and the pipeline parameters its answer depends on.

    ``events_per_second`` is the rate of the workload's own event-time clock (the demo also writes at
    about that rate in real time, so the store's auto-scaler sees it); ``window_seconds`` and
    ``watermark_delay_seconds`` are the pipeline's tumbling window and watermark delay;
    ``alert_threshold_c`` and ``alert_readings_min`` its alert rule."""

    seed: int = attrs.field(default=1, validator=_non_negative_int)
    sensors: int = attrs.field(default=16, validator=_positive_int)
    events_per_second: int = attrs.field(default=200, validator=_positive_int)
    disorder_ms_max: int = attrs.field(default=2_000, validator=_non_negative_int)
    window_seconds: int = attrs.field(default=10, validator=_positive_int)
    watermark_delay_seconds: int = attrs.field(default=10, validator=_positive_int)
    alert_threshold_c: Decimal = attrs.field(default=Decimal("80.00"))
    alert_readings_min: int = attrs.field(default=3, validator=_positive_int)
    malformed_every: int = attrs.field(default=1_000, validator=_non_negative_int)  # 0: never

    def __attrs_post_init__(self) -> None:
        if self.sensors > 10_000:
            raise InvalidArgumentError(f"at most 10,000 sensors (ids have four digits), not {self.sensors}")
        if not isinstance(self.alert_threshold_c, Decimal) or not self.alert_threshold_c.is_finite():
            raise InvalidArgumentError(f"alert_threshold_c must be a finite Decimal, not {self.alert_threshold_c!r}")
        # Half the delay is the margin for readings of other sensors that overtook this one on the
        # way (a different segment, a writer's batching); the pipeline could drop a reading only if
        # the watermark had passed it, i.e. if something newer by more than the delay was read first.
        if 2 * self.disorder_ms_max > 1000 * self.watermark_delay_seconds:
            raise InvalidArgumentError(
                f"disorder_ms_max ({self.disorder_ms_max}) must be at most half the watermark delay "
                f"({self.watermark_delay_seconds} s), or late readings would make the answer depend on timing")

    # --- events ------------------------------------------------------------------------------------

    @property
    def window_ms(self) -> int:
        return 1000 * self.window_seconds

    def sensor_id(self, number: int) -> str:
        return f"sensor-{number:04d}"

    def _sensor_of(self, index: int) -> int:
        # Weighted pick: sensor k has weight 1 + k mod 4 (some sensors report four times as often).
        cumulative = _cumulative_weights(self.sensors)
        return bisect.bisect_right(cumulative, _draw(self.seed, 1, index) % cumulative[-1])

    def nominal_ms(self, index: int) -> int:
        """Event ``index``'s place on the workload's clock (before disorder)."""
        return _START_MS + index * 1000 // self.events_per_second

    def routing_key(self, index: int) -> str:
        return self.sensor_id(self._sensor_of(index))

    def is_malformed(self, index: int) -> bool:
        return self.malformed_every > 0 and _draw(self.seed, 2, index) % self.malformed_every == 0

    def reading(self, index: int) -> dict[str, Any]:
        """Event ``index`` as a reading (what its payload says, when it is not malformed)."""
        sensor = self._sensor_of(index)
        disorder = _draw(self.seed, 3, index) % (self.disorder_ms_max + 1)
        ts_ms = self.nominal_ms(index) - disorder
        baseline = 1800 + _draw(self.seed, 4, sensor) % 800                     # 18.00 .. 25.99 °C
        noise = int(_draw(self.seed, 5, index) % 301) - 150                    # -1.50 .. +1.50 °C
        slot = (ts_ms - _START_MS) // _EPISODE_SLOT_MS
        episode = _draw(self.seed, 6, sensor, slot) % _EPISODE_ODDS == 0
        hundredths = baseline + noise
        if episode and _draw(self.seed, 7, index) % 2 == 0:
            threshold = int(self.alert_threshold_c * 100)
            hundredths = threshold + int(_draw(self.seed, 8, index) % 1500)    # threshold .. +14.99 °C
        return {"kind": "reading", "sensor_id": self.sensor_id(sensor), "ts_ms": ts_ms,
                "temperature_c": Decimal(hundredths).scaleb(-2)}

    def payload(self, index: int) -> bytes:
        """Event ``index``'s bytes, as written to the input stream."""
        reading = self.reading(index)
        # Written by hand so the temperature keeps its exact decimal digits.
        text = (f'{{"kind":"reading","sensor_id":"{reading["sensor_id"]}","ts_ms":{reading["ts_ms"]},'
                f'"temperature_c":{reading["temperature_c"]}}}')
        if self.is_malformed(index):
            return text[: len(text) // 2].encode()  # cut mid-document, as a lost radio frame
        return text.encode()

    def events(self, first: int, count: int) -> Iterator[tuple[str, bytes]]:
        """``(routing key, payload)`` of events ``first .. first + count - 1``."""
        for index in range(first, first + count):
            yield self.routing_key(index), self.payload(index)

    def end_markers(self, readings: int) -> list[tuple[str, bytes]]:
        """One watermark marker per sensor, written after ``readings`` readings: its event time is
        past the end of the last reading's window by the watermark delay, plus a second."""
        last_ms = self.nominal_ms(max(readings - 1, 0))
        window_end = last_ms - last_ms % self.window_ms + self.window_ms
        ts_ms = window_end + 1000 * self.watermark_delay_seconds + 1000
        return [(self.sensor_id(k), json.dumps({"kind": "end", "sensor_id": self.sensor_id(k), "ts_ms": ts_ms},
                                               separators=(",", ":")).encode())
                for k in range(self.sensors)]


@functools.lru_cache(maxsize=16)
def _cumulative_weights(sensors: int) -> tuple[int, ...]:
    return tuple(itertools.accumulate(1 + k % 4 for k in range(sensors)))


# --- the expected answer ---------------------------------------------------------------------------

#: An output row's identity: (kind, sensor id, window start in ms since the epoch).
OutputKey = tuple[str, str, int]


def _parse_reading(payload: bytes) -> dict[str, Any] | None:
    """The reading a payload holds, or None (malformed, or a marker) -- the rule the pipeline's parse
    implements with Spark's ``from_json``: a JSON object with a string ``sensor_id``, an integral
    ``ts_ms``, a numeric ``temperature_c`` and ``kind`` = "reading"."""
    try:
        value = json.loads(payload, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or value.get("kind") != "reading":
        return None
    sensor, ts_ms, temperature = value.get("sensor_id"), value.get("ts_ms"), value.get("temperature_c")
    if not isinstance(sensor, str) or type(ts_ms) is not int or isinstance(temperature, bool) \
            or not isinstance(temperature, (int, Decimal)):
        return None
    return {"sensor_id": sensor, "ts_ms": ts_ms, "temperature_c": Decimal(temperature)}


def expected_output(workload: SensorWorkload, payloads: Iterable[bytes]) -> dict[OutputKey, dict[str, Any]]:
    """What the pipeline must write for these input events, computed here without Spark: for every
    (sensor, window) with a reading, its ``aggregate`` row, and its ``alert`` row if it had at least
    ``alert_readings_min`` readings at or above the threshold.  Values are ints and Decimals."""
    windows: dict[tuple[str, int], dict[str, Any]] = {}
    for payload in payloads:
        reading = _parse_reading(payload)
        if reading is None:
            continue
        start = reading["ts_ms"] - reading["ts_ms"] % workload.window_ms
        temperature = reading["temperature_c"]
        window = windows.get((reading["sensor_id"], start))
        if window is None:
            windows[(reading["sensor_id"], start)] = window = {
                "count": 0, "min_c": temperature, "max_c": temperature, "sum_c": Decimal(0), "hot_readings": 0}
        window["count"] += 1
        window["min_c"] = min(window["min_c"], temperature)
        window["max_c"] = max(window["max_c"], temperature)
        window["sum_c"] += temperature
        window["hot_readings"] += temperature >= workload.alert_threshold_c
    expected: dict[OutputKey, dict[str, Any]] = {}
    for (sensor, start), window in windows.items():
        row = {"window_end_ms": start + workload.window_ms, **window}
        expected[("aggregate", sensor, start)] = row
        if window["hot_readings"] >= workload.alert_readings_min:
            expected[("alert", sensor, start)] = {"window_end_ms": start + workload.window_ms,
                                                  "max_c": window["max_c"], "hot_readings": window["hot_readings"]}
    return expected


def parse_output(payloads: Iterable[bytes]) -> tuple[list[tuple[OutputKey, dict[str, Any]]], int]:
    """The pipeline's output events as (identity, values) pairs, in the order given, and how many
    events were not output rows at all (each such event is a defect the verification reports)."""
    rows: list[tuple[OutputKey, dict[str, Any]]] = []
    unreadable = 0
    for payload in payloads:
        try:
            value = json.loads(payload, parse_float=Decimal)
            kind, sensor, start = value.pop("kind"), value.pop("sensor_id"), value.pop("window_start_ms")
        except (ValueError, UnicodeDecodeError, KeyError, AttributeError, TypeError):
            unreadable += 1
            continue
        if kind not in EXPECTED_KINDS or not isinstance(sensor, str) or type(start) is not int:
            unreadable += 1
            continue
        rows.append(((kind, sensor, start), {key: _exact(item) for key, item in value.items()}))
    return rows, unreadable


def _exact(value: Any) -> Any:
    if isinstance(value, float):  # not produced with parse_float=Decimal; kept exact if it ever is
        return Decimal(repr(value))
    if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
        return Decimal(value) if isinstance(value, Decimal) else value
    return value


def _same(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    for key, value in expected.items():
        if key not in actual:
            return False
        try:
            if Decimal(actual[key]) != Decimal(value):
                return False
        except (InvalidOperation, TypeError, ValueError):
            return False
    return True


@attrs.frozen(kw_only=True)
class Verification:
    """The pipeline's output against the expected answer.  ``passed`` when the store holds exactly the
    input events written, and every expected row is in the output once with its values, and nothing
    else is."""

    input_events: int              # events written to the input stream (readings, malformed, markers)
    input_events_read_back: int    # events the input stream holds (read back independently)
    input_matches: bool            # ... and they are the events written, each once
    malformed_events: int          # of the written events, garbage the parse must drop
    expected_rows: int
    expected_alerts: int
    output_rows: int               # events in the output stream
    distinct_rows: int
    duplicates: int                # output events beyond the first for an identity
    missing: int                   # expected identities not in the output
    unexpected: int                # identities in the output that were not expected
    mismatched: int                # identities present with other values than expected
    unreadable: int                # output events that are not output rows
    examples: tuple[str, ...] = () # a few of the defects, for the report

    @property
    def passed(self) -> bool:
        return (self.input_matches and self.duplicates == 0 and self.missing == 0 and self.unexpected == 0
                and self.mismatched == 0 and self.unreadable == 0 and self.output_rows == self.expected_rows)

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, count, note) for each line of the table."""
        return [
            ("input events written", f"{self.input_events:,}",
             f"incl. {self.malformed_events:,} malformed (the parse drops them) and the watermark markers"),
            ("input events in the store", f"{self.input_events_read_back:,}",
             "the events written, each once" if self.input_matches else "NOT the events written"),
            ("expected output rows", f"{self.expected_rows:,}",
             f"{self.expected_rows - self.expected_alerts:,} window aggregates + {self.expected_alerts:,} alerts, "
             "computed in plain Python"),
            ("output rows", f"{self.output_rows:,}", f"{self.distinct_rows:,} distinct"),
            ("duplicates", f"{self.duplicates:,}", ""),
            ("missing", f"{self.missing:,}", ""),
            ("unexpected", f"{self.unexpected:,}", ""),
            ("wrong values", f"{self.mismatched:,}", ""),
            ("unreadable output", f"{self.unreadable:,}", ""),
        ]

    def table(self, extra: Sequence[tuple[str, str, str]] = ()) -> str:
        """The verification as an aligned text table (``extra`` lines first), then the examples."""
        lines = [*extra, *self.rows()]
        width = max(len(name) for name, _, _ in lines)
        number = max(len(value) for _, value, _ in lines)
        text = [f"  {name:<{width}}  {value:>{number}}  {note}".rstrip() for name, value, note in lines]
        text.extend(f"    e.g. {example}" for example in self.examples)
        return "\n".join(text)


def verify(workload: SensorWorkload, written: Sequence[bytes], stored: Sequence[bytes],
           output_payloads: Iterable[bytes], *, examples_max: int = 5) -> Verification:
    """Compare the output stream's events with ``expected_output`` of the events ``written``, and the
    events the input stream holds (``stored``) with them."""
    expected = expected_output(workload, written)
    rows, unreadable = parse_output(output_payloads)
    seen = Counter(key for key, _ in rows)
    first: dict[OutputKey, dict[str, Any]] = {}
    for key, values in rows:
        first.setdefault(key, values)
    missing = [key for key in expected if key not in seen]
    unexpected = [key for key in seen if key not in expected]
    mismatched = [key for key, values in first.items() if key in expected and not _same(expected[key], values)]
    duplicated = [key for key, count in seen.items() if count > 1]
    examples = ([f"duplicate {key} x{seen[key]}" for key in duplicated[:examples_max]]
                + [f"missing {key}" for key in missing[:examples_max]]
                + [f"unexpected {key}" for key in unexpected[:examples_max]]
                + [f"wrong {key}: {first[key]} != {expected[key]}" for key in mismatched[:examples_max]])
    return Verification(
        input_events=len(written), input_events_read_back=len(stored),
        input_matches=Counter(written) == Counter(stored),
        malformed_events=sum(1 for payload in written if _parse_reading(payload) is None
                             and b'"kind":"end"' not in payload),
        expected_rows=len(expected), expected_alerts=sum(1 for key in expected if key[0] == "alert"),
        output_rows=len(rows) + unreadable, distinct_rows=len(seen),
        duplicates=sum(count - 1 for count in seen.values()), missing=len(missing), unexpected=len(unexpected),
        mismatched=len(mismatched), unreadable=unreadable, examples=tuple(examples[: 2 * examples_max]))
