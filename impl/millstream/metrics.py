"""A node's metrics, in the Prometheus exposition format.

Theory of operation.  Each node has its own ``NodeMetrics``: a ``prometheus_client.CollectorRegistry``
(never the process-wide default: tests, and embedding programs, run several nodes in one process)
holding one ``NodeCollector``.  Almost nothing is counted for metrics' sake: at scrape time the
collector reads the counters the store keeps anyway -- the server's connections and refusals, the
per-segment append statistics (counted once per block for auto-scaling), each container's Tier-2
writer (unflushed bytes, flushed bytes, the oldest unflushed byte's age), its throttled appends and
its cache -- so the write path pays nothing per event.  Only four things are measured here, each
once per *Tier-1 record*, *append block* or *controller request*, never per event:

* ``MeteredDataLog`` wraps a container's ``DurableDataLog``: the size of every record (DataFrame)
  written and the time from handing it over until it is durable (the write and its fdatasync, and the
  wait behind the records before it -- what an append's acknowledgement waits for);
* ``MeteredControllerEndpoint`` wraps the controller endpoint the server hands ``ControllerRequest``s
  to: requests by method and outcome, and the transactions created, committed and aborted;
* the server (``SegmentStoreServer.enable_metrics``) reads the clock when an append block arrives and
  when it is acknowledged, and hands the difference to ``NodeMetrics.observe_append``;
* ``Histogram``, a bucket array with a sum, cheaper than ``prometheus_client.Histogram`` (no lock:
  everything runs on the node's event loop, and scrapes are served there too).

Cardinality is bounded whatever peers do.  Container labels are bounded by the container count,
methods by the controller's fixed method table, outcomes by a fixed set.  Segment names are chosen
by clients, so per-segment series are exported for at most ``limits.METRICS_SEGMENT_SERIES_MAX``
segments -- those with the most bytes appended -- and the per-segment totals behind them are kept
for at most ``limits.METRICS_SEGMENTS_TRACKED_MAX`` segments (a segment that no longer exists is
forgotten at the next scrape); the per-container totals always count everything.

Counters that a container keeps (throttled appends, bytes flushed) start again from zero when the
container restarts after a failure; Prometheus's ``rate()`` treats that as a counter reset.

``docs/metrics.md`` lists every metric; ``tests/server/test_metrics.py`` checks the page and the
registry agree.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from millstream import limits
from millstream.clock import Clock, SystemClock
from millstream.errors import MillstreamError
from millstream.naming import container_of
from millstream.segmentstore.durable_data_log import DurableDataLog, LogAddress, LogRecord, OnDone, WriteSettings

if TYPE_CHECKING:
    from millstream.server import ControllerEndpoint, SegmentStoreServer

__all__ = [
    "CONTENT_TYPE",
    "FRAME_SIZE_BUCKETS_BYTES",
    "LATENCY_BUCKETS_SECONDS",
    "Histogram",
    "MeteredControllerEndpoint",
    "MeteredDataLog",
    "NodeCollector",
    "NodeMetrics",
    "SegmentTotals",
]

#: The exposition format's media type (what ``/metrics`` answers with).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: Tier-1 write latency buckets: from a fast NVMe fdatasync (~100 us) to a stuck disk (seconds).
LATENCY_BUCKETS_SECONDS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: DataFrame size buckets: one small append (~100 B) up to a full frame (``DATA_FRAME_SIZE_BYTES_MAX``).
FRAME_SIZE_BUCKETS_BYTES: Final[tuple[float, ...]] = tuple(float(4 ** exponent) for exponent in range(3, 11))

#: The outcomes of a controller request: answered, refused for the caller's fault (a typed
#: ``MillstreamError``), or failed otherwise.
_OUTCOMES: Final = ("ok", "error", "failure")

#: Controller methods whose success is a transaction outcome (label value of
#: ``millstream_transactions_total``).
_TRANSACTION_OUTCOMES: Final = {"create_transaction": "created", "commit_transaction": "committed",
                                "commit_transactions": "committed", "abort_transaction": "aborted"}


class Histogram:
    """Observations in fixed buckets, with their count and sum (exported as a Prometheus histogram)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last, as ``HistogramMetricFamily`` takes them."""
        result, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            result.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return result


class MeteredDataLog(DurableDataLog):
    """``log`` with each record's size and time to durability measured (``frame_sizes``, ``write_seconds``)."""

    def __init__(self, log: DurableDataLog, frame_sizes: Histogram, write_seconds: Histogram, clock: Clock) -> None:
        self._log = log
        self._frame_sizes = frame_sizes
        self._write_seconds = write_seconds
        # The system clock's reading without the method call around it (a call per DataFrame saved).
        self._monotonic: Callable[[], float] = time.monotonic if type(clock) is SystemClock else clock.monotonic

    @property
    def write_settings(self) -> WriteSettings:
        return self._log.write_settings

    @property
    def epoch(self) -> int:
        return self._log.epoch

    @property
    def wrapped(self) -> DurableDataLog:
        """The log measured (tests reach through to its fault hooks)."""
        return self._log

    async def initialize(self) -> int:
        return await self._log.initialize()

    def read(self) -> Iterator[LogRecord]:
        return self._log.read()

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        # (Once per DataFrame, on the write path: the two observations are inlined.)
        sizes = self._frame_sizes
        size = len(data)
        sizes.counts[bisect.bisect_left(sizes.bounds, size)] += 1
        sizes.sum += size
        monotonic = self._monotonic
        started = monotonic()

        def done(future: asyncio.Future[LogAddress]) -> None:
            if not future.cancelled() and future.exception() is None:
                seconds = self._write_seconds
                elapsed = monotonic() - started
                seconds.counts[bisect.bisect_left(seconds.bounds, elapsed)] += 1
                seconds.sum += elapsed
            if on_done is not None:
                on_done(future)
        return self._log.append(data, done)

    async def truncate(self, upto: LogAddress) -> None:
        await self._log.truncate(upto)

    async def close(self) -> None:
        await self._log.close()

    def __getattr__(self, name: str) -> object:
        # Anything else a particular log offers (FileLog's directory, a simulated log's fault hooks).
        return getattr(self._log, name)


class MeteredControllerEndpoint:
    """``endpoint`` (what the server hands ``ControllerRequest``s to) with its requests counted by
    method and outcome into ``requests`` and its transaction outcomes into ``transactions``."""

    def __init__(self, endpoint: ControllerEndpoint, requests: dict[tuple[str, str], int],
                 transactions: dict[str, int]) -> None:
        self._endpoint = endpoint
        self._requests = requests
        self._transactions = transactions

    def knows(self, method: str) -> bool:
        return self._endpoint.knows(method)

    async def handle(self, method: str, body: bytes) -> bytes:
        # ``knows`` was asked first (the server does): ``method`` is one of the controller's fixed set.
        try:
            reply = await self._endpoint.handle(method, body)
        except MillstreamError:
            self._count(method, "error")
            raise
        except Exception:
            self._count(method, "failure")
            raise
        self._count(method, "ok")
        outcome = _TRANSACTION_OUTCOMES.get(method)
        if outcome is not None:
            self._transactions[outcome] = self._transactions.get(outcome, 0) + 1
        return reply

    def _count(self, method: str, outcome: str) -> None:
        key = (method, outcome)
        self._requests[key] = self._requests.get(key, 0) + 1


class SegmentTotals:
    """Bytes, events and blocks appended since the node started, per container (all of them) and per
    segment (at most ``segments_max`` segments: beyond, a segment counts only in its container)."""

    def __init__(self, container_count: int, segments_max: int = limits.METRICS_SEGMENTS_TRACKED_MAX) -> None:
        self._container_count = container_count
        self._segments_max = segments_max
        #: segment -> [bytes, events, blocks]
        self.segments: dict[str, list[int]] = {}
        #: container -> [bytes, events, blocks]
        self.containers: dict[int, list[int]] = {}
        #: Segments not tracked for lack of room (evidence for tests and operators).
        self.untracked_segments = 0

    def add(self, counts: dict[str, tuple[int, int, int]]) -> None:
        """Fold in ``counts`` (segment -> (bytes, events, blocks)) drained from the server."""
        for segment, (size, events, blocks) in counts.items():
            container = self.containers.setdefault(container_of(segment, self._container_count), [0, 0, 0])
            container[0] += size
            container[1] += events
            container[2] += blocks
            totals = self.segments.get(segment)
            if totals is None:
                if len(self.segments) >= self._segments_max:
                    self.untracked_segments += 1
                    continue
                totals = self.segments[segment] = [0, 0, 0]
            totals[0] += size
            totals[1] += events
            totals[2] += blocks

    def forget_except(self, existing: Callable[[str], bool]) -> None:
        """Forget the segments for which ``existing(name)`` is False (deleted or merged)."""
        for segment in [segment for segment in self.segments if not existing(segment)]:
            del self.segments[segment]

    def top(self, count: int) -> list[tuple[str, list[int]]]:
        """The ``count`` segments with the most bytes appended, most first."""
        return sorted(self.segments.items(), key=lambda item: (-item[1][0], item[0]))[:count]

    def check_invariants(self) -> None:
        assert len(self.segments) <= self._segments_max
        assert all(len(counts) == 3 and min(counts) >= 0 for counts in self.segments.values())


class _ServerView(Protocol):
    def __call__(self) -> SegmentStoreServer | None: ...


class NodeMetrics:
    """The metrics of one node: ``registry`` (its own ``CollectorRegistry``) and what its collector
    reads.  ``server()`` returns the node's ``SegmentStoreServer`` (None before it exists);
    ``clock`` times Tier-1 writes and the age of unflushed bytes."""

    def __init__(self, server: _ServerView, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._server = server
        self.frame_sizes: dict[int, Histogram] = {}
        self.write_seconds: dict[int, Histogram] = {}
        self.append_seconds: dict[int, Histogram] = {}
        self.controller_requests: dict[tuple[str, str], int] = {}
        self.transactions: dict[str, int] = {}
        self.totals: SegmentTotals | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(self))

    def meter_log(self, container_id: int, log: DurableDataLog) -> MeteredDataLog:
        """``log`` (container ``container_id``'s Tier 1), measured."""
        sizes = self.frame_sizes.setdefault(container_id, Histogram(FRAME_SIZE_BUCKETS_BYTES))
        seconds = self.write_seconds.setdefault(container_id, Histogram(LATENCY_BUCKETS_SECONDS))
        return MeteredDataLog(log, sizes, seconds, self.clock)

    def observe_append(self, container_id: int, seconds: float) -> None:
        """One append block of container ``container_id`` was acknowledged ``seconds`` after it arrived."""
        histogram = self.append_seconds.get(container_id)
        if histogram is None:  # (container ids are the node's few: bounded)
            histogram = self.append_seconds[container_id] = Histogram(LATENCY_BUCKETS_SECONDS)
        histogram.observe(seconds)

    def meter_controller(self, endpoint: ControllerEndpoint) -> MeteredControllerEndpoint:
        return MeteredControllerEndpoint(endpoint, self.controller_requests, self.transactions)

    @property
    def server(self) -> SegmentStoreServer | None:
        return self._server()

    def exposition(self) -> bytes:
        """Every metric, in the text exposition format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)


class NodeCollector(Collector):
    """Reads the node's state at scrape time (on the node's event loop)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        server = metrics.server
        yield from self._tier_one(metrics)
        yield from self._controller(metrics)
        if server is None:
            return
        yield from self._connections(server)
        if metrics.totals is None:
            metrics.totals = SegmentTotals(server.config.container_count)
        metrics.totals.add(server.statistics.drain_totals())
        yield from self._containers(server, metrics)
        yield from self._appends(server, metrics.totals)

    @staticmethod
    def _tier_one(metrics: NodeMetrics) -> Iterator[Metric]:
        sizes = HistogramMetricFamily(
            "millstream_tier1_frame_size_bytes", "Size of each DataFrame (Tier-1 record) written.",
            labels=["container"])
        for container_id, histogram in sorted(metrics.frame_sizes.items()):
            sizes.add_metric([str(container_id)], histogram.buckets(), histogram.sum)
        yield sizes
        latency = HistogramMetricFamily(
            "millstream_tier1_write_seconds",
            "Time from handing a DataFrame to Tier 1 until it is durable (write and fdatasync): what an "
            "append's acknowledgement waits for.", labels=["container"])
        for container_id, histogram in sorted(metrics.write_seconds.items()):
            latency.add_metric([str(container_id)], histogram.buckets(), histogram.sum)
        yield latency
        acknowledgements = HistogramMetricFamily(
            "millstream_append_acknowledgement_seconds",
            "Time from an append block's arrival at the server until it is stored and acknowledged.",
            labels=["container"])
        for container_id, histogram in sorted(metrics.append_seconds.items()):
            acknowledgements.add_metric([str(container_id)], histogram.buckets(), histogram.sum)
        yield acknowledgements

    @staticmethod
    def _controller(metrics: NodeMetrics) -> Iterator[Metric]:
        requests = CounterMetricFamily("millstream_controller_requests",
                                       "Controller requests served, by method and outcome.",
                                       labels=["method", "outcome"])
        for (method, outcome), count in sorted(metrics.controller_requests.items()):
            requests.add_metric([method, outcome], count)
        yield requests
        transactions = CounterMetricFamily("millstream_transactions",
                                           "Stream transactions created, committed and aborted by request.",
                                           labels=["outcome"])
        for outcome in ("created", "committed", "aborted"):
            transactions.add_metric([outcome], metrics.transactions.get(outcome, 0))
        yield transactions

    @staticmethod
    def _connections(server: SegmentStoreServer) -> Iterator[Metric]:
        yield GaugeMetricFamily("millstream_connections", "Client connections open.", value=len(server.connections))
        refused = CounterMetricFamily("millstream_connections_refused", "Connections refused, by reason.",
                                      labels=["reason"])
        for reason in ("connections_max", "per_address_max", "shutting_down"):
            refused.add_metric([reason], server.refused_connections.get(reason, 0))
        yield refused
        yield GaugeMetricFamily("millstream_ingress_in_flight_bytes",
                                "Bytes of appends received and not yet acknowledged, over every connection.",
                                value=server.in_flight_bytes)

    @staticmethod
    def _containers(server: SegmentStoreServer, metrics: NodeMetrics) -> Iterator[Metric]:
        labels = ["container"]
        running = GaugeMetricFamily("millstream_container_running",
                                    "1 while the container serves, 0 while it recovers, restarts or stopped.",
                                    labels=labels)
        restarts = CounterMetricFamily("millstream_container_restarts",
                                       "Times the container was recovered after a Tier-1 failure.", labels=labels)
        segments = GaugeMetricFamily("millstream_container_segments", "Segments that exist (active or sealed).",
                                     labels=labels)
        cache = GaugeMetricFamily("millstream_cache_bytes", "Bytes of segment data held in the read cache.",
                                  labels=labels)
        cache_max = GaugeMetricFamily("millstream_cache_max_bytes", "The read cache's budget.", labels=labels)
        tier_two_reads = CounterMetricFamily("millstream_cache_misses",
                                             "Reads the cache could not serve, fetched from Tier 2.", labels=labels)
        unflushed = GaugeMetricFamily("millstream_tier2_unflushed_bytes",
                                      "Acknowledged bytes not yet flushed to Tier 2 (the flush lag in bytes).",
                                      labels=labels)
        unflushed_max = GaugeMetricFamily("millstream_tier2_unflushed_max_bytes",
                                          "Unflushed bytes beyond which appends are throttled.", labels=labels)
        lag = GaugeMetricFamily("millstream_tier2_flush_lag_seconds",
                                "Age of the oldest acknowledged byte not yet flushed to Tier 2 (0: none).",
                                labels=labels)
        flushed = CounterMetricFamily("millstream_tier2_flushed_bytes", "Bytes flushed to Tier 2.", labels=labels)
        throttled = CounterMetricFamily("millstream_throttled_appends",
                                        "Appends that waited because Tier 2 lagged (ingestion throttling).",
                                        labels=labels)
        throttling = GaugeMetricFamily("millstream_throttling",
                                       "1 while appends are throttled because Tier 2 lags, else 0.", labels=labels)
        now = metrics.clock.monotonic()
        existing: set[str] = set()
        for container_id in sorted(server.config.containers):
            label = [str(container_id)]
            try:
                host = server.container_host(container_id)
            except MillstreamError:
                running.add_metric(label, 0)
                continue
            restarts.add_metric(label, host.restarts)
            try:
                container = host.container
            except MillstreamError:
                running.add_metric(label, 0)
                continue
            running.add_metric(label, 1)
            names = container.segment_names()
            existing.update(names)
            segments.add_metric(label, len(names))
            cache.add_metric(label, container.read_index.cached_bytes)
            cache_max.add_metric(label, container.read_index.cache_bytes_max)
            tier_two_reads.add_metric(label, container.read_index.tier_two_reads)
            throttled.add_metric(label, container.throttled_appends)
            writer = container.storage_writer
            if writer is not None:
                unflushed.add_metric(label, writer.unflushed_bytes)
                unflushed_max.add_metric(label, writer.unflushed_bytes_max)
                since = writer.oldest_unflushed_since
                lag.add_metric(label, 0.0 if since is None else max(0.0, now - since))
                flushed.add_metric(label, writer.flushed_bytes)
                throttling.add_metric(label, 1 if writer.unflushed_bytes > writer.unflushed_bytes_max else 0)
        yield from (running, restarts, segments, cache, cache_max, tier_two_reads, unflushed, unflushed_max, lag,
                    flushed, throttled, throttling)
        if metrics.totals is not None and all(_serving(server, c) for c in server.config.containers):
            # (only when every container could say what exists: a restarting one's segments are not gone)
            metrics.totals.forget_except(existing.__contains__)
        readers = GaugeMetricFamily(
            "millstream_reader_lag_bytes",
            "Per container, the largest distance from a reader's last read to its segment's end.",
            labels=labels)
        tracked = GaugeMetricFamily("millstream_reader_positions",
                                    "Readers' positions tracked (one per connection and segment read).",
                                    labels=labels)
        for container_id, (largest, count) in sorted(server.reader_lag().items()):
            readers.add_metric([str(container_id)], largest)
            tracked.add_metric([str(container_id)], count)
        yield readers
        yield tracked

    @staticmethod
    def _appends(server: SegmentStoreServer, totals: SegmentTotals) -> Iterator[Metric]:
        container_families = (
            CounterMetricFamily("millstream_container_appended_bytes", "Bytes of appends accepted.",
                                labels=["container"]),
            CounterMetricFamily("millstream_container_appended_events", "Events appended (accepted).",
                                labels=["container"]),
            CounterMetricFamily("millstream_container_append_blocks",
                                "Append blocks accepted (one wire AppendBlock or conditional append each).",
                                labels=["container"]))
        for container_id in sorted(server.config.containers):
            counts = totals.containers.get(container_id, [0, 0, 0])
            for family, value in zip(container_families, counts, strict=True):
                family.add_metric([str(container_id)], value)
        yield from container_families
        segment_families = (
            CounterMetricFamily("millstream_segment_appended_bytes",
                                f"Bytes of appends accepted, for the {limits.METRICS_SEGMENT_SERIES_MAX} "
                                "segments with the most.", labels=["segment"]),
            CounterMetricFamily("millstream_segment_appended_events",
                                f"Events appended, for the same {limits.METRICS_SEGMENT_SERIES_MAX} segments.",
                                labels=["segment"]))
        for segment, counts in totals.top(limits.METRICS_SEGMENT_SERIES_MAX):
            segment_families[0].add_metric([segment], counts[0])
            segment_families[1].add_metric([segment], counts[1])
        yield from segment_families


def _serving(server: SegmentStoreServer, container_id: int) -> bool:
    try:
        server.container_host(container_id).container  # noqa: B018 (raises while it is not serving)
    except MillstreamError:
        return False
    return True
