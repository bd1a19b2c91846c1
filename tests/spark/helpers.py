"""Helpers for the ``millstream.spark`` tests: keyed events with per-key sequence numbers, a stand-in for
Spark's micro-batch loop that drives a stream reader in plain Python (what the planner process and the
tasks would call, in Spark's order), and the checks every source test makes."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

import millstream
from millstream.client import StreamCut
from millstream.spark import MillstreamStreamReader, cut_of, parse_source_options
from millstream.spark._offsets import offset_json

KEYS = [f"sensor-{n}" for n in range(16)]


class KeyedWriter:
    """Writes JSON events ``{"key": k, "seq": n}`` (``n`` counts from 1 per key) routed by ``k``."""

    def __init__(self, uri: str, stream: str) -> None:
        self.uri = uri
        self.stream = stream
        self.sequence: dict[str, int] = {}

    def write(self, count: int, keys: Sequence[str] = KEYS) -> None:
        with millstream.connect(self.uri) as client, client.event_writer(self.stream, millstream.JsonSerializer()) as w:
            for index in range(count):
                key = keys[index % len(keys)]
                self.sequence[key] = self.sequence.get(key, 0) + 1
                w.write_event({"key": key, "seq": self.sequence[key]}, routing_key=key)

    @property
    def total(self) -> int:
        return sum(self.sequence.values())


@attrs.define
class Batch:
    """One micro-batch as the stand-in ran it: its offsets and each partition's rows."""

    start: dict[str, Any]
    end: dict[str, Any]
    partitions: list[list[dict[str, Any]]]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [row for rows in self.partitions for row in rows]


def reader_for(uri: str, stream: str, spark_schema: StructType, /, **options: str) -> MillstreamStreamReader:
    parsed = parse_source_options({"controller": uri, "stream": stream, **options})
    reader = MillstreamStreamReader(parsed, spark_schema)
    # Spark pickles the reader for its tasks: prove every test's reader survives that.
    return pickle.loads(pickle.dumps(reader))


def read_partition(reader: MillstreamStreamReader, partition: Any) -> list[dict[str, Any]]:
    """What a task returns for ``partition``, read by a copy of the reader as a task gets it."""
    task_copy = pickle.loads(pickle.dumps(reader))
    return [row for batch in task_copy.read(partition) for row in batch.to_pylist()]


def run_batches(reader: MillstreamStreamReader, limit: ReadLimit, *, start: dict[str, Any] | None = None,
                between: Callable[[int], None] | None = None, rounds_min: int = 0,
                rounds_max: int = 500) -> list[Batch]:
    """Spark's loop: ``latestOffset``; if it moved, ``partitions``, ``read`` of each partition, and
    ``commit`` of the batch before (Spark lags it one batch).  ``between(n)`` runs before round ``n``
    plans (writes, scaling); the loop ends at the first round from ``rounds_min`` on with no new data."""
    current = reader.initialOffset() if start is None else start
    done: list[Batch] = []
    for number in range(rounds_max):
        if between is not None:
            between(number)
        end = reader.latestOffset(json.loads(offset_json(current)), limit)
        if offset_json(end) == offset_json(current):
            if number >= rounds_min:
                return done
            continue
        partitions = reader.partitions(current, end)
        done.append(Batch(current, end, [read_partition(reader, p) for p in partitions]))
        if len(done) > 1:
            reader.commit(done[-2].end)
        current = end
    raise AssertionError(f"the reader still had data after {rounds_max} rounds")


def check_per_key_order_and_exactly_once(batches: Sequence[Batch], expected: dict[str, int]) -> None:
    """Each key's events arrive in order (batch by batch; within a batch from one partition, in
    order) and every written event exactly once."""
    seen: dict[str, list[int]] = {}
    for number, batch in enumerate(batches):
        owners: dict[str, int] = {}
        for index, rows in enumerate(batch.partitions):
            for row in rows:
                event = json.loads(row["value"]) if "value" in row else row
                key = event["key"]
                assert owners.setdefault(key, index) == index, f"batch {number}: key {key} in two partitions"
                seen.setdefault(key, []).append(event["seq"])
    assert set(seen) == {k for k, n in expected.items() if n}
    for key, sequence in seen.items():
        assert sequence == list(range(1, expected[key] + 1)), f"{key}: {sequence}"


def cut(offset: dict[str, Any], stream: str) -> StreamCut:
    return cut_of(offset, stream)
