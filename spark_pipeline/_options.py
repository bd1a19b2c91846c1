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
``maxRowsPerBatch``         source      about this many events per micro-batch: the planner counts a small
                                        sample of each segment (64 KiB) and ends the batch at an event
                                        boundary the store knows (about one per MiB written) within the
                                        rows times the sample's mean event size -- at most this many
                                        events when later events are no smaller than the sample's (always
                                        for events of one size), fewer by up to about a MiB of events per
                                        segment; small budgets are counted exactly (``_planning``)
``maxBytesPerBatch``        source      at most this many bytes of events (frames) per micro-batch (exact)
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
``deadLetterStream``        source      ``scope/stream``: an event the serializer cannot decode (not UTF-8,
                                        not JSON, a field that does not fit the schema) is written there,
                                        with its position and the reason, and the batch goes on without it
                                        (``_dead_letters``).  Default: none -- such an event fails the batch
                                        with its position in the message
``routingKeyColumn``        sink        the column whose string routes each event (default ``routing_key``,
                                        used when the DataFrame has it; no routing key otherwise)
``transactionLeaseSeconds`` sink        the lease of each task's store transaction (default
                                        ``limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS``)
``writer``                  sink        ``arrow`` (default: Arrow record batches, fast) or ``rows``
``fenceKey``, ``fenceValue``  sink      ``df.write`` only: commit only if the value the output stream records
                                        for ``fenceKey`` is below ``fenceValue`` (an int), and record it --
                                        a job run again with the same fence writes nothing.  A streaming
                                        query fences by its query id and batch id itself
==========================  ==========  ======================================================================

A name that is none of these is an error that names the nearest one (``options 'maxRowPerBatch' is
not an option of the millstream source; did you mean 'maxRowsPerBatch'?``): a misspelt option would
otherwise be ignored in silence and its default used.  The options Spark itself passes along
(``path``, ``checkpointLocation``, ``queryName``) are allowed and not read.
"""

from __future__ import annotations

import difflib
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
    "check_option_names",
    "ddl_column_names",
    "lowered",
    "parse_sink_options",
    "parse_source_options",
    "parse_store_options",
]

#: The columns the source fills from where an event lies rather than from its bytes.
METADATA_COLUMNS: Final = ("stream", "segment", "offset")

_SOURCE_SERIALIZERS: Final = ("raw", "string", "json")
_SINK_SERIALIZERS: Final = ("raw", "json")
_SINK_WRITERS: Final = ("arrow", "rows")
_CUT_KEYWORDS: Final = ("head", "tail", "latest")

#: The options of the source and of the sink, as the documentation spells them.
SOURCE_OPTIONS: Final = ("controller", "stream", "token", "start", "end", "maxRowsPerBatch", "maxBytesPerBatch",
                         "serializer", "schema", "metadataColumns", "routingKeyField", "readerGroup",
                         "deadLetterStream")
SINK_OPTIONS: Final = ("controller", "stream", "token", "serializer", "routingKeyColumn", "transactionLeaseSeconds",
                       "writer", "fenceKey", "fenceValue")
#: Options Spark passes to sources and sinks along with the user's own (allowed, never read).
SPARK_OPTIONS: Final = ("path", "checkpointLocation", "queryName")
#: Every option either side reads (lower case).
KNOWN_OPTIONS: Final = frozenset(name.lower() for name in (*SOURCE_OPTIONS, *SINK_OPTIONS, *SPARK_OPTIONS))


def check_option_names(options: Mapping[str, str], side: str) -> None:
    """Raise ``OptionError`` for the first option (in sorted order) that ``side`` (``source`` or
    ``sink``) does not read, naming the nearest one it does -- or saying that it belongs to the
    other side."""
    own = SOURCE_OPTIONS if side == "source" else SINK_OPTIONS
    other = SINK_OPTIONS if side == "source" else SOURCE_OPTIONS
    allowed = {name.lower() for name in (*own, *SPARK_OPTIONS)}
    for name in sorted(str(key) for key in options):
        lower = name.lower()
        if lower in allowed:
            continue
        if lower in {o.lower() for o in other}:
            where = "spark.readStream / spark.read" if side == "sink" else "writeStream / df.write"
            raise OptionError(name, f"is an option of the {'source' if side == 'sink' else 'sink'} ({where}), "
                                    f"not of the {side}")
        spelled = {o.lower(): o for o in own}
        close = difflib.get_close_matches(lower, list(spelled), n=1, cutoff=0.6)
        hint = f"; did you mean {spelled[close[0]]!r}?" if close else f" (its options: {', '.join(own)})"
        raise OptionError(name, f"is not an option of the millstream {side}{hint}")


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
    dead_letter_stream: str | None = None

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
    check_option_names(options, "source")
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
    dead_letters = options.get("deadletterstream")
    if dead_letters is not None:
        dead_letters = str(dead_letters).strip()
        try:
            split_stream_name(dead_letters)
        except InvalidArgumentError as error:
            raise OptionError("deadLetterStream", str(error)) from None
        if dead_letters == store.stream:
            raise OptionError("deadLetterStream", "must not be the stream the query reads")
    return SourceOptions(store, start, end, max_rows, max_bytes, serializer, schema, metadata,
                         None if routing_key_field is None else str(routing_key_field).strip(), reader_group,
                         dead_letters)


@attrs.frozen
class SinkOptions:
    """Where the sink writes and how a row becomes an event."""

    store: StoreOptions
    serializer: str
    routing_key_column: str
    routing_key_column_required: bool
    transaction_lease_seconds: float
    writer: str
    fence: tuple[str, int] | None = None  # (fenceKey, fenceValue): df.write only


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The sink's options; raises ``OptionError`` naming the first bad one."""
    check_option_names(options, "sink")
    store = parse_store_options(options)
    options = lowered(options)
    serializer = _choice(options, "serializer", _SINK_SERIALIZERS, "raw")
    column = options.get("routingkeycolumn")
    lease_raw = options.get("transactionleaseseconds")
    lease = limits.SPARK_SINK_TRANSACTION_LEASE_SECONDS
    if lease_raw is not None:
        try:
            lease = float(str(lease_raw).strip())
        except ValueError:
            raise OptionError("transactionLeaseSeconds", f"must be a number of seconds, not {lease_raw!r}") from None
        if not limits.TRANSACTION_LEASE_MIN_SECONDS <= lease <= limits.TRANSACTION_LEASE_SECONDS_MAX:
            raise OptionError("transactionLeaseSeconds",
                              f"must lie in [{limits.TRANSACTION_LEASE_MIN_SECONDS}, "
                              f"{limits.TRANSACTION_LEASE_SECONDS_MAX}] (the controller's bounds), not {lease_raw!r}")
    writer = _choice(options, "writer", _SINK_WRITERS, "arrow")
    fence = None
    if ("fencekey" in options) != ("fencevalue" in options):
        missing, given = ("fenceValue", "fenceKey") if "fencekey" in options else ("fenceKey", "fenceValue")
        raise OptionError(missing, f"is required with option {given!r}")
    if "fencekey" in options:
        key = str(options["fencekey"]).strip()
        if not key or len(key) > limits.FENCE_KEY_LENGTH_MAX:
            raise OptionError("fenceKey", f"must be a non-empty name of at most {limits.FENCE_KEY_LENGTH_MAX} "
                                          "characters")
        try:
            value = int(str(options["fencevalue"]).strip())
        except ValueError:
            raise OptionError("fenceValue", f"must be an integer, not {options['fencevalue']!r}") from None
        if not 0 <= value <= limits.FENCE_VALUE_MAX:
            raise OptionError("fenceValue", f"must lie in [0, 2**63), not {value}")
        fence = (key, value)
    return SinkOptions(store, serializer, "routing_key" if column is None else str(column).strip(), column is not None,
                       lease, writer, fence)
