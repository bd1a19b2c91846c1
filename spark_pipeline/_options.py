"""The options of the ``millstream`` data source, parsed once into frozen values.

Spark hands a data source its options as strings in a case-insensitive map.  Each reader and writer
parses them here when it is built -- when the DataFrame is loaded, or when the query starts, on the
driver -- so a missing or malformed option fails the query before any task runs, with an
``OptionError`` that names the option.  The parsed values are plain frozen objects: they are pickled
to the executors with the reader or writer.

Options (names are case-insensitive; every value is a string):

==========================  ==========  ======================================================================
``controller``              both        the store's URI, ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (required)
``stream``                  both        ``scope/stream`` (required)
``token``                   both        an authentication token (``millstream.issue_token``); default none
``start``                   source      ``head`` (default: the oldest retained event), ``tail``/``latest``
                                        (events written after the query first starts), or a stream cut's
                                        JSON (``StreamCut.to_json()``, or an offset from a query's progress)
``end``                     source      ``latest`` (default: a streaming query follows the stream; a batch
                                        read reads to the tail), ``tail`` (the tail when the reader is built),
                                        or a stream cut's JSON
``maxRowsPerBatch``         source      at most this many events per micro-batch
``maxBytesPerBatch``        source      at most this many bytes of events (frames) per micro-batch
``serializer``              both        source: ``raw`` (default; ``value`` binary), ``string`` (``value`` as
                                        UTF-8 text) or ``json`` (columns from each event's JSON object, by
                                        ``schema``); sink: ``raw`` (default; the ``value`` column, binary or
                                        string, is the event) or ``json`` (the row as a JSON object)
``schema``                  source      with ``serializer=json``: the columns, as Spark DDL
                                        (``"sensor STRING, ts TIMESTAMP, reading DOUBLE"``)
``metadataColumns``         source      with ``serializer=json``: ``true`` adds ``stream``, ``segment`` and
                                        ``offset`` after the schema's columns (default ``false``)
``routingKeyField``         source      with ``raw``/``string``: the ``routing_key`` column is this field of
                                        each event's JSON object (as ``millstream write --key-field`` routed
                                        it); without it the column is null -- the store does not keep routing
                                        keys with events
``readerGroup``             source      a reader group (``scope/group``, or a name in the stream's scope)
                                        registered for the query: each batch Spark commits publishes its end
                                        as the group's subscriber cut, so consumption-based retention may
                                        truncate below it (default: none registered, nothing published)
``routingKeyColumn``        sink        the column whose string routes each event (default ``routing_key``,
                                        used when the DataFrame has it; no routing key otherwise)
``transactionLeaseSeconds`` sink        the lease of each task's store transaction (default
                                        ``limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS``)
``writer``                  sink        ``arrow`` (default: Arrow record batches, fast) or ``rows``
==========================  ==========  ======================================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import attrs
from millstream import limits
from millstream.client import StreamCut, parse_uri, split_stream_name
from millstream.errors import InvalidArgumentError
from millstream.naming import validate_scope_or_stream_name
from millstream.spark._errors import OptionError

__all__ = [
    "METADATA_COLUMNS",
    "CutOption",
    "SinkOptions",
    "SourceOptions",
    "StoreOptions",
    "ddl_column_names",
    "lowered",
    "parse_sink_options",
    "parse_source_options",
    "parse_store_options",
    "unknown_options",
]

#: The columns the source fills from where an event lies rather than from its bytes.
METADATA_COLUMNS: Final = ("stream", "segment", "offset")

_SOURCE_SERIALIZERS: Final = ("raw", "string", "json")
_SINK_SERIALIZERS: Final = ("raw", "json")
_SINK_WRITERS: Final = ("arrow", "rows")
_CUT_KEYWORDS: Final = ("head", "tail", "latest")

#: Every option either side reads (lower case), for the warning about options nothing reads.
KNOWN_OPTIONS: Final = frozenset({
    "controller", "stream", "token", "start", "end", "maxrowsperbatch", "maxbytesperbatch", "serializer",
    "schema", "metadatacolumns", "routingkeyfield", "readergroup", "routingkeycolumn",
    "transactionleaseseconds", "writer",
    # Spark passes these to sinks and sources along with the user's options.
    "path", "checkpointlocation", "queryname",
})


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    """The options with lower-case names (Spark's map is case-insensitive; a plain dict in tests is
    not).  Two spellings of one option are an error rather than a silent choice."""
    result: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in result:
            raise OptionError(key, "is given twice, in different cases")
        result[name] = value
    return result


def _required(options: Mapping[str, str], name: str, example: str) -> str:
    value = options.get(name.lower())
    if value is None or not str(value).strip():
        raise OptionError(name, f"is required (e.g. .option({name!r}, {example!r}))")
    return str(value).strip()


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(name, f"must be a positive integer, not {raw!r}") from None
    if value <= 0:
        raise OptionError(name, f"must be a positive integer, not {raw!r}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(name, f"must be true or false, not {raw!r}")
    return text == "true"


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in choices:
        raise OptionError(name, f"must be one of {', '.join(choices)}, not {raw!r}")
    return text


@attrs.frozen
class StoreOptions:
    """Where the stream is: the controller's URI, ``scope/stream`` and the token."""

    controller: str
    stream: str
    token: str = attrs.field(default="", repr=False)

    @property
    def scope(self) -> str:
        return split_stream_name(self.stream)[0]

    @property
    def stream_name(self) -> str:
        return split_stream_name(self.stream)[1]


def parse_store_options(options: Mapping[str, str]) -> StoreOptions:
    """``controller``, ``stream`` and ``token`` (both sides need them)."""
    options = lowered(options)
    controller = _required(options, "controller", "tcp://127.0.0.1:9090")
    try:
        parse_uri(controller)
    except InvalidArgumentError as error:
        raise OptionError("controller", str(error)) from None
    stream = _required(options, "stream", "scope/stream")
    try:
        split_stream_name(stream)
    except InvalidArgumentError as error:
        raise OptionError("stream", str(error)) from None
    return StoreOptions(controller, stream, str(options.get("token", "") or ""))


@attrs.frozen
class CutOption:
    """A ``start`` or ``end`` option: a keyword (``head``, ``tail``, ``latest``) or a stream cut (kept
    as its JSON text, so the options pickle as plain values)."""

    keyword: str | None = None
    cut_json: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.keyword is None) == (self.cut_json is None):
            raise InvalidArgumentError("a cut option is a keyword or a stream cut")

    @property
    def cut(self) -> StreamCut | None:
        return None if self.cut_json is None else StreamCut.from_json(self.cut_json)

    def __str__(self) -> str:
        return self.keyword if self.keyword is not None else str(self.cut_json)


def _cut_option(options: Mapping[str, str], name: str, default: str, stream: str) -> CutOption:
    raw = options.get(name.lower())
    if raw is None:
        return CutOption(keyword=default)
    text = str(raw).strip()
    if text.lower() in _CUT_KEYWORDS:
        return CutOption(keyword=text.lower())
    if not text.startswith("{"):
        raise OptionError(name, f"must be head, tail, latest or a stream cut's JSON, not {raw!r}")
    try:
        cut = StreamCut.from_json(text)
    except InvalidArgumentError as error:
        raise OptionError(name, f"is not a stream cut: {error}") from None
    if cut.stream != stream:
        raise OptionError(name, f"is a position of stream {cut.stream!r}, but option 'stream' is {stream!r}")
    return CutOption(cut_json=cut.to_json())


#: A column name in DDL: plain, or quoted with backticks (`` `a``b` `` holds a backtick).
_DDL_NAME = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s*:?\s*(\S.*)?", re.S)


def ddl_column_names(ddl: str) -> list[str]:
    """The top-level column names of a Spark DDL schema (``"a INT, b STRUCT<x: INT, y: STRING>"``
    -> ``["a", "b"]``).  A light parse -- commas inside ``<>``, ``()`` and quotes do not split
    columns -- enough to name a malformed schema and to find its columns; Spark parses the types.
    Raises ``InvalidArgumentError`` when a column lacks a name or a type."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise InvalidArgumentError("the schema is empty")
    pieces: list[str] = []
    depth = 0
    quote: str | None = None
    current: list[str] = []
    for char in ddl:
        if quote is not None:
            if char == quote:
                quote = None
        elif char in "`'\"":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
            if depth < 0:
                raise InvalidArgumentError(f"unbalanced {char!r} in the schema")
        elif char == "," and depth == 0:
            pieces.append("".join(current))
            current = []
            continue
        current.append(char)
    if quote is not None or depth != 0:
        raise InvalidArgumentError("the schema ends inside a quote or a <...>/(...) group")
    pieces.append("".join(current))
    names = []
    for piece in pieces:
        match = _DDL_NAME.fullmatch(piece)
        if match is None or not match.group(2):
            raise InvalidArgumentError(f"{piece.strip()!r} is not 'name TYPE'")
        name = match.group(1)
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        names.append(name)
    duplicates = sorted({n for n in names if [m.lower() for m in names].count(n.lower()) > 1})
    if duplicates:
        raise InvalidArgumentError(f"the schema names {duplicates} more than once")
    return names


@attrs.frozen
class SourceOptions:
    """What the source reads, from where to where, in what shape, and in batches of what size."""

    store: StoreOptions
    start: CutOption
    end: CutOption
    max_rows_per_batch: int | None
    max_bytes_per_batch: int | None
    serializer: str
    schema_ddl: str | None
    metadata_columns: bool
    routing_key_field: str | None
    reader_group: tuple[str, str] | None   # (scope, group)

    def ddl(self) -> str:
        """The source's schema as Spark DDL (what ``DataSource.schema()`` returns)."""
        metadata = "stream STRING, segment BIGINT, offset BIGINT"
        if self.serializer == "json":
            assert self.schema_ddl is not None
            return f"{self.schema_ddl}, {metadata}" if self.metadata_columns else self.schema_ddl
        value = "BINARY" if self.serializer == "raw" else "STRING"
        return f"value {value}, {metadata}, routing_key STRING"


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """The source's options; raises ``OptionError`` naming the first bad one."""
    store = parse_store_options(options)
    options = lowered(options)
    start = _cut_option(options, "start", "head", store.stream)
    end = _cut_option(options, "end", "latest", store.stream)
    if start.keyword == "latest":
        start = CutOption(keyword="tail")
    if end.keyword == "head":
        raise OptionError("end", "head would read nothing; use latest, tail or a stream cut")
    max_rows = _positive_int(options, "maxRowsPerBatch")
    max_bytes = _positive_int(options, "maxBytesPerBatch")
    serializer = _choice(options, "serializer", _SOURCE_SERIALIZERS, "raw")
    schema = options.get("schema")
    metadata = _boolean(options, "metadataColumns", False)
    routing_key_field = options.get("routingkeyfield")
    if serializer == "json":
        if schema is None or not str(schema).strip():
            raise OptionError("schema", "is required with serializer=json: the columns as Spark DDL, e.g. "
                                        "'sensor STRING, ts TIMESTAMP, reading DOUBLE'")
        try:
            names = ddl_column_names(str(schema))
        except InvalidArgumentError as error:
            raise OptionError("schema", f"is not a Spark DDL schema: {error}") from None
        clashes = [n for n in names if n.lower() in METADATA_COLUMNS] if metadata else []
        if clashes:
            raise OptionError("schema", f"names {clashes}, which metadataColumns=true adds itself")
        if routing_key_field is not None:
            raise OptionError("routingKeyField", "applies to serializer=raw or string (with json, the field is "
                                                 "a column of the schema already)")
        schema = str(schema).strip()
    else:
        if schema is not None:
            raise OptionError("schema", f"applies only to serializer=json (serializer is {serializer})")
        if "metadatacolumns" in options:
            raise OptionError("metadataColumns", "applies only to serializer=json (raw and string always have "
                                                 "the metadata columns)")
        if routing_key_field is not None and not str(routing_key_field).strip():
            raise OptionError("routingKeyField", "must name a field of the events' JSON objects")
    group = options.get("readergroup")
    reader_group = None
    if group is not None:
        text = str(group).strip()
        scope, _, name = text.rpartition("/")
        try:
            reader_group = (validate_scope_or_stream_name(scope or store.scope, what="scope"),
                            validate_scope_or_stream_name(name, what="reader group"))
        except InvalidArgumentError as error:
            raise OptionError("readerGroup", str(error)) from None
    return SourceOptions(store, start, end, max_rows, max_bytes, serializer, schema, metadata,
                         None if routing_key_field is None else str(routing_key_field).strip(), reader_group)


@attrs.frozen
class SinkOptions:
    """Where the sink writes and how a row becomes an event."""

    store: StoreOptions
    serializer: str
    routing_key_column: str
    routing_key_column_required: bool
    transaction_lease_seconds: float
    writer: str


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The sink's options; raises ``OptionError`` naming the first bad one."""
    store = parse_store_options(options)
    options = lowered(options)
    serializer = _choice(options, "serializer", _SINK_SERIALIZERS, "raw")
    for source_only in ("start", "end", "maxRowsPerBatch", "maxBytesPerBatch", "schema", "metadataColumns",
                        "routingKeyField", "readerGroup"):
        if source_only.lower() in options:
            raise OptionError(source_only, "is an option of the source (spark.readStream), not of the sink")
    column = options.get("routingkeycolumn")
    lease_raw = options.get("transactionleaseseconds")
    lease = limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS
    if lease_raw is not None:
        try:
            lease = float(str(lease_raw).strip())
        except ValueError:
            raise OptionError("transactionLeaseSeconds", f"must be a number of seconds, not {lease_raw!r}") from None
        if not limits.TRANSACTION_LEASE_MIN_SECONDS <= lease <= limits.TRANSACTION_LEASE_MAX_SECONDS:
            raise OptionError("transactionLeaseSeconds",
                              f"must lie in [{limits.TRANSACTION_LEASE_MIN_SECONDS}, "
                              f"{limits.TRANSACTION_LEASE_MAX_SECONDS}] (the controller's bounds), not {lease_raw!r}")
    writer = _choice(options, "writer", _SINK_WRITERS, "arrow")
    return SinkOptions(store, serializer, "routing_key" if column is None else str(column).strip(), column is not None,
                       lease, writer)


def unknown_options(options: Mapping[str, str]) -> list[str]:
    """Options nothing here reads (a misspelling, most likely), for a warning."""
    return sorted(k for k in options if str(k).lower() not in KNOWN_OPTIONS)

