"""Options of the ``millstream`` data source (plain Python, milliseconds): every option parsed, every bad
one refused with an ``OptionError`` that names it, and the schema each serializer gives."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from millstream import limits
from millstream.client import StreamCut
from millstream.errors import InvalidArgumentError
from millstream.spark import MillstreamDataSource, OptionError, parse_sink_options, parse_source_options
from millstream.spark._options import ddl_column_names

BASE = {"controller": "tcp://127.0.0.1:9090", "stream": "sc/st"}


def source(**options: str) -> dict[str, str]:
    return {**BASE, **options}


def refused(parse, options: dict[str, str], option: str, fragment: str) -> OptionError:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError) as caught:
        parse(options)
    assert caught.value.option.lower() == option.lower(), caught.value
    assert f"option {caught.value.option!r}" in str(caught.value)
    assert fragment in str(caught.value), str(caught.value)
    return caught.value


def test_the_defaults() -> None:
    parsed = parse_source_options(BASE)
    assert parsed.store.controller == "tcp://127.0.0.1:9090" and parsed.store.stream == "sc/st"
    assert (parsed.store.scope, parsed.store.stream_name, parsed.store.token) == ("sc", "st", "")
    assert (str(parsed.start), str(parsed.end)) == ("head", "latest")
    assert (parsed.max_rows_per_batch, parsed.max_bytes_per_batch, parsed.serializer) == (None, None, "raw")
    assert parsed.reader_group is None
    sink = parse_sink_options(BASE)
    assert (sink.serializer, sink.routing_key_column, sink.writer) == ("raw", "routing_key", "arrow")
    assert sink.transaction_lease_seconds == limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS


def test_names_are_case_insensitive_and_values_trimmed() -> None:
    parsed = parse_source_options({"CONTROLLER": " tcp://h:1 ", "Stream": "a/b", "MAXROWSPERBATCH": " 7 ",
                                   "maxBytesPerBatch": "100", "SERIALIZER": "String", "Start": "LATEST",
                                   "readerGroup": "g"})
    assert (parsed.store.controller, parsed.max_rows_per_batch, parsed.max_bytes_per_batch) == ("tcp://h:1", 7, 100)
    assert parsed.serializer == "string" and str(parsed.start) == "tail", "latest as a start is the tail"
    assert parsed.reader_group == ("a", "g"), "a bare group name lives in the stream's scope"
    assert parse_source_options(source(readerGroup="other/g")).reader_group == ("other", "g")
    refused(parse_source_options, {**BASE, "Stream": "x/y"}, "Stream", "given twice")


@pytest.mark.parametrize(("options", "option", "fragment"), [
    ({"stream": "sc/st"}, "controller", "is required"),
    ({"controller": "tcp://h:1"}, "stream", "is required"),
    ({"controller": " ", "stream": "sc/st"}, "controller", "is required"),
    ({"controller": "http://h:1", "stream": "sc/st"}, "controller", "tcp://"),
    ({"controller": "tcp://h", "stream": "sc/st"}, "controller", "port"),
    ({"controller": "tcp://h:1", "stream": "st"}, "stream", "scope/stream"),
    ({"controller": "tcp://h:1", "stream": "sc/_hidden"}, "stream", "not starting with '_'"),
    (source(maxRowsPerBatch="ten"), "maxRowsPerBatch", "positive integer"),
    (source(maxRowsPerBatch="0"), "maxRowsPerBatch", "positive integer"),
    (source(maxBytesPerBatch="-5"), "maxBytesPerBatch", "positive integer"),
    (source(start="earliest"), "start", "head, tail, latest"),
    (source(start="{not json"), "start", "not a stream cut"),
    (source(start='{"stream": "sc/st", "positions": {"x": 1}}'), "start", "segment ids in decimal"),
    (source(end="head"), "end", "read nothing"),
    (source(serializer="avro"), "serializer", "raw, string, json"),
    (source(serializer="json"), "schema", "is required with serializer=json"),
    (source(serializer="json", schema="a INT, b"), "schema", "not 'name TYPE'"),
    (source(serializer="json", schema="a STRUCT<x: INT"), "schema", "ends inside"),
    (source(serializer="json", schema="a INT, A STRING"), "schema", "more than once"),
    (source(serializer="json", schema="offset BIGINT", metadataColumns="true"), "schema", "metadataColumns"),
    (source(serializer="json", schema="a INT", metadataColumns="maybe"), "metadataColumns", "true or false"),
    (source(serializer="json", schema="a INT", routingKeyField="a"), "routingKeyField", "applies to"),
    (source(schema="a INT"), "schema", "applies only to serializer=json"),
    (source(metadataColumns="true"), "metadataColumns", "applies only"),
    (source(routingKeyField=" "), "routingKeyField", "must name"),
    (source(readerGroup="sc/"), "readerGroup", "reader group"),
    (source(readerGroup="_x"), "readerGroup", "not starting with '_'"),
])
def test_a_bad_source_option_is_named(options: dict[str, str], option: str, fragment: str) -> None:
    refused(parse_source_options, options, option, fragment)


def test_a_start_or_end_cut_of_another_stream_is_refused() -> None:
    other = StreamCut("sc/other", {0: 10})
    refused(parse_source_options, source(start=other.to_json()), "start", "position of stream 'sc/other'")
    refused(parse_source_options, source(end=other.to_json()), "end", "but option 'stream' is 'sc/st'")
    mine = StreamCut("sc/st", {0: 10, 4294967296: 3})
    assert parse_source_options(source(start=mine.to_json())).start.cut == mine


@pytest.mark.parametrize(("options", "option", "fragment"), [
    (source(serializer="string"), "serializer", "raw, json"),
    (source(writer="pandas"), "writer", "arrow, rows"),
    (source(transactionLeaseSeconds="soon"), "transactionLeaseSeconds", "number of seconds"),
    (source(transactionLeaseSeconds="0.5"), "transactionLeaseSeconds", "controller's bounds"),
    (source(transactionLeaseSeconds="601"), "transactionLeaseSeconds", "controller's bounds"),
    (source(maxRowsPerBatch="5"), "maxRowsPerBatch", "an option of the source"),
    (source(start="head"), "start", "an option of the source"),
])
def test_a_bad_sink_option_is_named(options: dict[str, str], option: str, fragment: str) -> None:
    refused(parse_sink_options, options, option, fragment)


def test_sink_options() -> None:
    parsed = parse_sink_options(source(serializer="JSON", routingKeyColumn="sensor", transactionLeaseSeconds="30",
                                       writer="rows"))
    assert (parsed.serializer, parsed.routing_key_column, parsed.routing_key_column_required) == ("json", "sensor",
                                                                                                  True)
    assert (parsed.transaction_lease_seconds, parsed.writer) == (30.0, "rows")


def test_each_serializer_gives_its_schema() -> None:
    def ddl(**options: str) -> str:
        return MillstreamDataSource(source(**options)).schema()

    assert ddl() == "value BINARY, stream STRING, segment BIGINT, offset BIGINT, routing_key STRING"
    assert ddl(serializer="string").startswith("value STRING, ")
    assert ddl(serializer="json", schema="sensor STRING, reading DOUBLE") == "sensor STRING, reading DOUBLE"
    assert ddl(serializer="json", schema="sensor STRING", metadataColumns="true") == \
        "sensor STRING, stream STRING, segment BIGINT, offset BIGINT"
    with pytest.raises(OptionError, match="option 'stream'"):
        MillstreamDataSource({"controller": "tcp://h:1"}).schema()
    with pytest.raises(OptionError, match="append-only"):
        MillstreamDataSource(source()).writer(None, True)  # type: ignore[arg-type]


def test_ddl_column_names() -> None:
    assert ddl_column_names("a INT, b STRUCT<x: INT, y: ARRAY<STRING>>, c DECIMAL(10, 2), `d,e` STRING") == \
        ["a", "b", "c", "d,e"]
    assert ddl_column_names("x STRING COMMENT 'a, b', `we``ird` INT NOT NULL") == ["x", "we`ird"]
    for bad in ("", "  ", "a", "a INT,", "a INT)", ", b INT"):
        with pytest.raises(InvalidArgumentError):
            ddl_column_names(bad)


def test_an_option_error_survives_pickling_as_spark_ships_it() -> None:
    error = OptionError("maxRowsPerBatch", "must be a positive integer, not 'x'")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.option, str(copy)) == (OptionError, error.option, str(error))


@pytest.mark.parametrize(("parse", "name", "nearest"), [
    (parse_source_options, "maxRowPerBatch", "maxRowsPerBatch"),
    (parse_source_options, "serialiser", "serializer"),
    (parse_source_options, "controler", "controller"),
    (parse_source_options, "MAXBYTESPERBATCHES", "maxBytesPerBatch"),
    (parse_source_options, "deadLetter", "deadLetterStream"),
    (parse_sink_options, "routingKeyCol", "routingKeyColumn"),
    (parse_sink_options, "transactionLease", "transactionLeaseSeconds"),
])
def test_a_misspelt_option_is_an_error_naming_the_nearest_one(parse, name: str, nearest: str) -> None:  # type: ignore[no-untyped-def]
    """Ignored, a typo would silently leave the option at its default (a warning in a log nobody reads)."""
    refused(parse, source(**{name: "1"}), name, f"is not an option of the millstream "
                                                f"{'source' if parse is parse_source_options else 'sink'}; "
                                                f"did you mean {nearest!r}?")


def test_an_option_nothing_resembles_lists_the_options() -> None:
    refused(parse_source_options, source(zzz="1"), "zzz", "its options: controller, stream")
    refused(parse_source_options, source(writer="rows"), "writer", "is an option of the sink")
    with pytest.raises(OptionError, match="did you mean 'maxRowsPerBatch'"):
        MillstreamDataSource(source(maxRowPerBatch="5")).schema()
    # What Spark passes along is allowed.
    parse_source_options(source(path="x", checkpointLocation="/tmp/c", queryName="q"))
    parse_sink_options(source(path="x", checkpointLocation="/tmp/c", queryName="q"))


def test_dead_letter_and_fence_options() -> None:
    assert parse_source_options(source(deadLetterStream=" sc/bad ")).dead_letter_stream == "sc/bad"
    assert parse_source_options(source()).dead_letter_stream is None
    refused(parse_source_options, source(deadLetterStream="bad"), "deadLetterStream", "scope/stream")
    refused(parse_source_options, source(deadLetterStream="sc/st"), "deadLetterStream", "must not be the stream")
    assert parse_sink_options(source(fenceKey="job", fenceValue="7")).fence == ("job", 7)
    assert parse_sink_options(source()).fence is None
    refused(parse_sink_options, source(fenceKey="job"), "fenceValue", "is required with option 'fenceKey'")
    refused(parse_sink_options, source(fenceValue="1"), "fenceKey", "is required with option 'fenceValue'")
    refused(parse_sink_options, source(fenceKey="job", fenceValue="x"), "fenceValue", "must be an integer")
    refused(parse_sink_options, source(fenceKey="job", fenceValue="-1"), "fenceValue", "must lie in")
    refused(parse_sink_options, source(fenceKey="k" * 300, fenceValue="1"), "fenceKey", "at most")
    with pytest.raises(OptionError, match=r"option 'fenceKey': applies to df\.write"):
        MillstreamDataSource(source(fenceKey="job", fenceValue="1")).streamWriter(None, False)  # type: ignore[arg-type]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_wrong_controller_address_fails_fast_naming_it() -> None:
    """Before anything waits on the store (the client would retry for its whole reconnect budget,
    minutes), a query checks the address with one bounded TCP connect."""
    from millstream.spark._store import check_reachable

    address = f"tcp://127.0.0.1:{closed_port()}"
    with pytest.raises(OptionError, match=rf"option 'controller': cannot reach the store at {address} "):
        check_reachable(address)
    for side in ("streamReader", "reader"):
        with pytest.raises(OptionError, match=f"cannot reach the store at {address}"):
            getattr(MillstreamDataSource({"controller": address, "stream": "sc/st"}), side)(None)
    with pytest.raises(OptionError, match=f"cannot reach the store at {address}"):
        MillstreamDataSource({"controller": address, "stream": "sc/st"}).streamWriter(None, False)  # type: ignore[arg-type]
    # An address that does not answer at all is cut at the configured timeout, whatever the network does.
    asked: list[tuple[tuple[str, int], float]] = []

    def silent(address_: tuple[str, int], timeout: float) -> Any:
        asked.append((address_, timeout))
        raise TimeoutError("timed out")

    with pytest.raises(OptionError, match=r"tcp://10\.255\.255\.1:9090 \(no answer within 5 s\)"):
        check_reachable("tcp://10.255.255.1:9090", connect=silent)
    assert asked == [(("10.255.255.1", 9090), limits.SPARK_CONTROLLER_CONNECT_TIMEOUT_SECONDS)]
