"""A node's metrics: scraped over HTTP and parsed, moving when events are written and read, one
registry per node, bounded label cardinality, and docs/metrics.md agreeing with the registry."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import millstream as ms
from millstream import limits
from millstream.client import ScalingPolicy, StreamConfig
from millstream.metrics import Histogram, NodeMetrics, SegmentTotals
from millstream.server._stats import ReadPositions, SegmentStatistics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
HTTP_TIMEOUT_SECONDS = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(node: ms.StandaloneNode) -> Samples:
    status, text = fetch(node.metrics_url + "/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and set(labels.items()) <= set(sample_labels))


def write_and_read(client: ms.Client, stream: str, count: int) -> None:
    with client.event_writer(stream, ms.StringSerializer()) as writer:
        for i in range(count):
            writer.write_event(f"reading {i}", routing_key=f"sensor-{i % 7}")
        writer.flush()


def test_a_scrape_parses_and_the_values_move_when_events_are_written_and_read(tmp_path: Path) -> None:
    with ms.standalone(tmp_path, metrics_port=0) as node, ms.connect(node.uri) as client:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", node.metrics_url)
        streams = client.stream_manager()
        streams.create_scope("iot")
        streams.create_stream("iot/sensors", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        before = scrape(node)
        write_and_read(client, "iot/sensors", 200)
        with client.reader_group("iot/dashboard", ["iot/sensors"]) as group, group.reader("r1") as reader:
            read = 0
            while read < 50 and reader.read_next_event(5.0).event is not None:
                read += 1
            after = scrape(node)
        assert total(after, "millstream_container_appended_events_total") - \
            total(before, "millstream_container_appended_events_total") >= 200
        assert total(after, "millstream_container_appended_bytes_total", container="0") > \
            total(before, "millstream_container_appended_bytes_total", container="0")
        assert total(after, "millstream_segment_appended_events_total", segment="iot/sensors/0.#epoch.0") + \
            total(after, "millstream_segment_appended_events_total", segment="iot/sensors/1.#epoch.0") == 200
        for histogram in ("millstream_append_acknowledgement_seconds", "millstream_tier1_write_seconds",
                          "millstream_tier1_frame_size_bytes"):
            assert total(after, histogram + "_count") > total(before, histogram + "_count"), histogram
            assert total(after, histogram + "_bucket", le="+Inf") == total(after, histogram + "_count")
        assert total(after, "millstream_connections") >= 1
        assert total(after, "millstream_container_running", container="0") == 1
        assert total(after, "millstream_container_segments", container="0") >= 2
        assert total(after, "millstream_reader_positions", container="0") >= 1
        assert total(after, "millstream_cache_bytes", container="0") > 0
        assert total(after, "millstream_controller_requests_total", method="create_stream", outcome="ok") == 1
        assert total(after, "millstream_controller_requests_total", method="create_reader_group", outcome="ok") == 1
        # A transaction, and a controller request the controller refuses (the caller's fault).
        txn = client.transactional_writer("iot/sensors", ms.StringSerializer()).begin()
        txn.write_event("calibrated", routing_key="sensor-1")
        txn.commit()
        with pytest.raises(ms.errors.MillstreamError):
            streams.create_stream("nowhere/sensors", StreamConfig())
        final = scrape(node)
        assert total(final, "millstream_transactions_total", outcome="created") == 1
        assert total(final, "millstream_transactions_total", outcome="committed") == 1
        assert total(final, "millstream_controller_requests_total", method="create_stream", outcome="error") == 1


def test_a_node_without_metrics_port_serves_none_and_each_node_has_its_own_registry(tmp_path: Path) -> None:
    with ms.standalone(tmp_path / "plain") as plain:
        assert plain.metrics_url == "" and plain.node.metrics is None
    with ms.standalone(tmp_path / "a", metrics_port=0) as a, ms.standalone(tmp_path / "b", metrics_port=0) as b, \
            ms.connect(a.uri) as client:
        assert a.metrics_url != b.metrics_url
        client.stream_manager().create_scope("only-on-a")
        assert total(scrape(a), "millstream_controller_requests_total", method="create_scope") == 1
        assert total(scrape(b), "millstream_controller_requests_total", method="create_scope") == 0


def test_the_endpoint_answers_plain_http_and_refuses_what_it_does_not_serve(tmp_path: Path) -> None:
    with ms.standalone(tmp_path, metrics_port=0) as node:
        assert fetch(node.metrics_url + "/healthz") == (200, "ok\n")
        assert fetch(node.metrics_url + "/readyz") == (200, "ready\n")
        status, text = fetch(node.metrics_url + "/nothing-here")
        assert status == 404 and "/metrics" in text
        request = urllib.request.Request(node.metrics_url + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS)
        assert refused.value.code == 405
        huge = urllib.request.Request(node.metrics_url + "/metrics",
                                      headers={"X-Padding": "p" * limits.METRICS_REQUEST_HEAD_BYTES_MAX})
        with pytest.raises(urllib.error.HTTPError) as too_large:
            urllib.request.urlopen(huge, timeout=HTTP_TIMEOUT_SECONDS)
        assert too_large.value.code == 431
        assert fetch(node.metrics_url + "/healthz") == (200, "ok\n")  # and it still serves


def test_per_segment_series_are_bounded_whatever_clients_create(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "METRICS_SEGMENT_SERIES_MAX", 3)
    with ms.standalone(tmp_path, metrics_port=0) as node, ms.connect(node.uri) as client:
        streams = client.stream_manager()
        streams.create_scope("many")
        streams.create_stream("many/s", StreamConfig(scaling=ScalingPolicy.fixed(6)))
        write_and_read(client, "many/s", 120)
        samples = scrape(node)
        segments = {dict(labels)["segment"] for name, labels in samples
                    if name == "millstream_segment_appended_bytes_total"}
        assert len(segments) == 3
        assert total(samples, "millstream_container_appended_events_total") >= 120  # the containers count all


def test_segment_totals_are_bounded_and_forget_segments_that_are_gone() -> None:
    totals = SegmentTotals(container_count=2, segments_max=2)
    totals.add({"a/b/0": (10, 1, 1), "a/b/1": (20, 2, 1), "a/b/2": (30, 3, 1)})
    assert len(totals.segments) == 2 and totals.untracked_segments == 1
    assert sum(counts[0] for counts in totals.containers.values()) == 60
    assert [name for name, _ in totals.top(1)] == ["a/b/1"]
    totals.forget_except(lambda name: name != "a/b/1")
    assert list(totals.segments) == ["a/b/0"]
    totals.check_invariants()


def test_statistics_totals_do_not_disturb_the_controllers_drain_and_stay_bounded() -> None:
    statistics = SegmentStatistics(segments_max=2)
    statistics.record("s0", 5, 1)  # before the metrics: not in their totals
    statistics.enable_totals()
    for segment in ("s0", "s1", "s2"):
        statistics.record(segment, 10, 2)
    assert statistics.drain() == {"s0": (15, 3), "s1": (10, 2)}
    assert statistics.drain_totals() == {"s0": (10, 2, 1), "s1": (10, 2, 1)}
    assert statistics.drain_totals() == {}
    statistics.check_invariants()


def test_read_positions_are_bounded_and_forgotten_with_their_connection() -> None:
    positions = ReadPositions(positions_max=2)
    first, second = object(), object()
    positions.record(first, "s0", 10)
    positions.record(first, "s1", 20)
    positions.record(second, "s0", 5)
    assert sorted(positions.items()) == [("s0", 10), ("s1", 20)] and positions.untracked == 1
    positions.record(first, "s0", 30)  # an update takes no room
    positions.forget(first)
    positions.record(second, "s0", 5)
    assert positions.items() == [("s0", 5)]
    positions.check_invariants()


def test_histogram_buckets_are_cumulative_and_end_with_inf() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [("1.0", 2.0), ("2.0", 3.0), ("+Inf", 4.0)]
    assert histogram.count == 4 and histogram.sum == 6.0


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/metrics.md's table: name -> (type, labels)."""
    rows = re.findall(r"^\| `(millstream_[a-z0-9_]+)` \| (\w+) \|([^|]*)\|", DOCS.read_text(), re.MULTILINE)
    assert rows, "docs/metrics.md lists no metric"
    return {name: (kind, tuple(sorted(re.findall(r"`(\w+)`", labels)))) for name, kind, labels in rows}


def _registered(metrics: NodeMetrics) -> dict[str, tuple[str, tuple[str, ...]]]:
    """What the registry exposes: name (as scraped: counters with ``_total``) -> (type, labels)."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {label for sample in family.samples for label in sample.labels if label != "le"}
        found[name] = (family.type, tuple(sorted(labels)))
    return found


def test_docs_metrics_page_and_the_registry_agree_both_ways(tmp_path: Path) -> None:
    with ms.standalone(tmp_path, metrics_port=0) as node, ms.connect(node.uri) as client:
        # Activity enough that every family has a sample, so that its labels can be compared.
        streams = client.stream_manager()
        streams.create_scope("docs")
        streams.create_stream("docs/s", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        write_and_read(client, "docs/s", 10)
        metrics = node.node.metrics
        assert metrics is not None
        registered = node.run(_collect(lambda: _registered(metrics)))
    documented = _documented()
    assert sorted(set(registered) - set(documented)) == [], "metrics missing from docs/metrics.md"
    assert sorted(set(documented) - set(registered)) == [], "docs/metrics.md lists metrics that do not exist"
    for name, (kind, labels) in documented.items():
        assert registered[name][0] == kind, name
        if registered[name][1]:  # (a family without samples shows no labels to compare)
            assert registered[name][1] == labels, name


Families = dict[str, tuple[str, tuple[str, ...]]]


async def _collect(read: Callable[[], Families]) -> Families:
    return read()  # on the node's loop, as a scrape is


def test_metrics_beyond_loopback_warn_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="millstream.standalone"), \
            ms.standalone(tmp_path / "a", metrics_port=0, metrics_host="0.0.0.0"):
        pass
    assert any("metrics and health on http://0.0.0.0:" in record.getMessage() for record in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="millstream.standalone"), ms.standalone(tmp_path / "b", metrics_port=0):
        pass
    assert not [record for record in caplog.records if "metrics" in record.getMessage()]
    with pytest.raises(ms.errors.InvalidArgumentError, match="metrics_port"):
        ms.standalone(tmp_path / "c", metrics_port=70000)
