"""Names of segments, and which container owns a segment.

Theory of operation.  A stream's segments are named ``<scope>/<stream>/<number>.#epoch.<epoch>``; the
segment *id* packs the epoch that created it with its number, ``(epoch << 32) | number``, so a
successor made by scaling is a different segment even when it reuses a number (rolling transactions
do).  Hidden segments hang off a parent: a stream transaction's is ``<parent>#transaction.<32 hex>``,
a large event's transient segment is ``<parent>#transient.<hex>``.  A hidden segment always lives in
its parent's container, because merging it into the parent is a container-local operation; so the
owner of any segment is a consistent hash of its *primary* (parent) name onto the container count.
The hash is stable across processes and Python versions (``blake2b``, never the built-in ``hash``),
because a client, a controller and every segment store must agree on it.

System segments (the controller's metadata) live in the reserved scope ``_system``, which users
cannot create; a reader group's state lives in its own scope, as ``<scope>/_RG<group>``, a name no
stream can take.  ``segment_kind`` tells these apart from users' segments by name alone, so the
server can refuse a client what only the node itself may do (``millstream.auth``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
import reprlib
from typing import Final
from uuid import UUID

from millstream import limits
from millstream.errors import InvalidArgumentError

__all__ = [
    "LEGACY_READER_GROUP_STATE_PREFIX",
    "READER_GROUP_STATE_PREFIX",
    "SYSTEM_SCOPE",
    "SegmentKind",
    "TRANSACTION_DELIMITER",
    "TRANSIENT_DELIMITER",
    "container_of",
    "is_hidden_segment",
    "is_transaction_segment",
    "is_transient_segment",
    "jump_consistent_hash",
    "primary_segment_name",
    "quote",
    "reader_group_state_segment_name",
    "segment_id",
    "segment_id_parts",
    "segment_kind",
    "stream_segment_name",
    "parse_stream_segment_name",
    "transaction_segment_name",
    "transient_segment_name",
    "validate_scope_or_stream_name",
    "validate_segment_name",
]

#: The scope that holds millstream's own segments; users may not create it or streams in it.
SYSTEM_SCOPE: Final = "_system"

TRANSACTION_DELIMITER: Final = "#transaction."
TRANSIENT_DELIMITER: Final = "#transient."
_EPOCH_DELIMITER: Final = ".#epoch."

#: Scope and stream names: letters, digits, '-', '_' and '.', 1..255 characters, not starting with
#: '_' (reserved for the system) -- the same rule Pravega applies, so names travel between the two.
_USER_NAME: Final = re.compile(r"[A-Za-z0-9.\-][A-Za-z0-9_.\-]{0,254}")
_STREAM_SEGMENT: Final = re.compile(r"(?P<scope>[^/]+)/(?P<stream>[^/]+)/(?P<number>\d+)\.#epoch\.(?P<epoch>\d+)")
_NUMBER_MAX: Final = 2**32 - 1
#: The longest scope or stream name (``_USER_NAME``'s bound; a system name adds its '_').
_USER_NAME_LENGTH_MAX: Final = 255


class _Quote(reprlib.Repr):
    """``repr`` cut short: long strings and containers show their start, nesting stops a few levels
    down (so quoting a value a peer sent costs little and never recurses deeply)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = limits.ERROR_QUOTE_CHARACTERS_MAX
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 8

    def repr_str(self, value: str, level: int) -> str:
        limit = self.maxstring
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"

    def repr_int(self, value: int, level: int) -> str:
        if value.bit_length() > 4 * self.maxlong:  # (a huge int's repr is slow, and limited by Python)
            return f"<an int of {value.bit_length()} bits>"
        return super().repr_int(value, level)


_QUOTE: Final = _Quote()


def quote(value: object) -> str:
    """``value`` as an error message quotes it: its ``repr``, or for a long string (or a big or deep
    container) a prefix of it that says how long the whole is (``limits.ERROR_QUOTE_CHARACTERS_MAX``)."""
    return _QUOTE.repr(value)


def validate_scope_or_stream_name(name: str, *, what: str = "name", system: bool = False) -> str:
    """Return ``name`` if it is a valid scope or stream name; else raise ``InvalidArgumentError``
    (whose message quotes at most a prefix of it).  ``system=True`` also admits names starting with
    '_' (millstream's own)."""
    if not isinstance(name, str) or len(name) > _USER_NAME_LENGTH_MAX + system or not (
            _USER_NAME.fullmatch(name) or (system and name.startswith("_") and _USER_NAME.fullmatch(name[1:]))):
        raise InvalidArgumentError(
            f"{what} {quote(name)} must be 1-255 letters, digits, '-', '_' or '.', not starting with '_'")
    return name


def validate_segment_name(name: object, *, what: str = "segment name") -> str:
    """Return ``name`` if it is a segment name a request may carry: a non-empty str of at most
    ``limits.SEGMENT_NAME_LENGTH_BYTES_MAX`` UTF-8 bytes.  Else raise ``InvalidArgumentError`` (its
    message quotes at most a prefix).  Cheap: the length is checked before anything else."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a {what} must be a non-empty str, not {quote(name)}")
    limit = limits.SEGMENT_NAME_LENGTH_BYTES_MAX
    if len(name) > limit // 4:  # (fewer characters than that cannot make too many bytes)
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate (only a Python caller can make one)
            raise InvalidArgumentError(f"{what} {quote(name)} is not valid Unicode") from None
        if size > limit:
            raise InvalidArgumentError(f"a {what} may hold {limit} UTF-8 bytes, not {size}: {quote(name)}")
    return name


def segment_id(epoch: int, number: int) -> int:
    """The id of segment ``number`` created in ``epoch``."""
    if not (0 <= epoch <= _NUMBER_MAX and 0 <= number <= _NUMBER_MAX):
        raise InvalidArgumentError(f"epoch {epoch} and number {number} must each fit in 32 bits")
    return (epoch << 32) | number


def segment_id_parts(identifier: int) -> tuple[int, int]:
    """``(epoch, number)`` of a segment id."""
    return identifier >> 32, identifier & _NUMBER_MAX


def stream_segment_name(scope: str, stream: str, identifier: int) -> str:
    """The qualified name of segment ``identifier`` of ``scope/stream``."""
    epoch, number = segment_id_parts(identifier)
    return f"{scope}/{stream}/{number}{_EPOCH_DELIMITER}{epoch}"


def parse_stream_segment_name(name: str) -> tuple[str, str, int]:
    """``(scope, stream, segment id)`` of a qualified stream segment name (not a hidden one)."""
    match = _STREAM_SEGMENT.fullmatch(name)
    if match is None:
        raise InvalidArgumentError(f"{name!r} is not a stream segment name (<scope>/<stream>/<n>.#epoch.<e>)")
    return match["scope"], match["stream"], segment_id(int(match["epoch"]), int(match["number"]))


def transaction_segment_name(parent: str, transaction_id: UUID) -> str:
    """The hidden segment that holds stream transaction ``transaction_id``'s events for ``parent``."""
    return f"{parent}{TRANSACTION_DELIMITER}{transaction_id.hex}"


def transient_segment_name(parent: str, suffix: str) -> str:
    """A transient segment for a large event bound for ``parent``; ``suffix`` makes it unique."""
    return f"{parent}{TRANSIENT_DELIMITER}{suffix}"


def is_transaction_segment(name: str) -> bool:
    return TRANSACTION_DELIMITER in name


def is_transient_segment(name: str) -> bool:
    return TRANSIENT_DELIMITER in name


def is_hidden_segment(name: str) -> bool:
    return TRANSACTION_DELIMITER in name or TRANSIENT_DELIMITER in name


def primary_segment_name(name: str) -> str:
    """The segment a hidden segment belongs to (``name`` itself for a primary segment)."""
    for delimiter in (TRANSACTION_DELIMITER, TRANSIENT_DELIMITER):
        cut = name.find(delimiter)
        if cut >= 0:
            return name[:cut]
    return name


def jump_consistent_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: ``key`` (64-bit) onto ``range(buckets)``; growing
    ``buckets`` by one moves only ``1/buckets`` of the keys."""
    if buckets < 1:
        raise InvalidArgumentError(f"buckets must be positive, not {buckets}")
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * 2862933555777941757 + 1) & 0xFFFF_FFFF_FFFF_FFFF
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


@functools.lru_cache(maxsize=65_536)
def container_of(name: str, container_count: int) -> int:
    """The container that owns segment ``name`` (its primary segment's, for a hidden one)."""
    digest = hashlib.blake2b(primary_segment_name(name).encode(), digest_size=8,
                             person=b"millstream-sc").digest()
    return jump_consistent_hash(int.from_bytes(digest, "big"), container_count)


# --- Reserved names: what belongs to the node, not to its clients ----------------------------------

#: A reader group's state segment is ``<scope>/_RG<group>`` (Pravega's name for a group's state
#: stream): inside its scope, so a token for the scope (``scope/*``) covers it, and in the names a
#: stream cannot take (stream names do not start with '_'), so it never collides with one.
READER_GROUP_STATE_PREFIX: Final = "_RG"

#: Where reader groups created before the state moved into the scope keep it; the controller's
#: metadata records each group's state segment, so such a group keeps working (with a ``*`` token).
LEGACY_READER_GROUP_STATE_PREFIX: Final = f"{SYSTEM_SCOPE}/_readergroups/"


class SegmentKind(enum.Enum):
    """Whose a segment is, by its name alone (``segment_kind``); ``millstream.auth.CLIENT_OPERATIONS``
    says what a client may do to each kind."""

    USER = "a user's segment"
    TRANSACTION = "a stream transaction's segment"
    TRANSIENT = "a large event's transient segment"
    READER_GROUP_STATE = "a reader group's state segment"
    RESERVED = "a segment reserved for the node itself"


def reader_group_state_segment_name(scope: str, group: str) -> str:
    """The segment that holds reader group ``scope/group``'s shared state."""
    return f"{scope}/{READER_GROUP_STATE_PREFIX}{group}"


def segment_kind(name: str) -> SegmentKind:
    """The kind of segment ``name`` is.  Reserved: every name in a scope starting with '_' (the
    system scope ``_system`` holds the controller's metadata; users cannot create such scopes),
    every name ``scope/_...`` (what stream names cannot be) other than a reader group's state, and a
    name that holds both hidden-segment delimiters (millstream makes none).  A hidden segment of a
    reserved primary is reserved too."""
    transaction = TRANSACTION_DELIMITER in name
    transient = TRANSIENT_DELIMITER in name
    if transaction and transient:
        return SegmentKind.RESERVED
    primary = primary_segment_name(name)
    scope, _, rest = primary.partition("/")
    if scope.startswith("_"):
        if not (transaction or transient) and primary.startswith(LEGACY_READER_GROUP_STATE_PREFIX) \
                and "/" not in primary[len(LEGACY_READER_GROUP_STATE_PREFIX):]:
            return SegmentKind.READER_GROUP_STATE
        return SegmentKind.RESERVED
    if rest.startswith("_"):
        if not (transaction or transient) and rest.startswith(READER_GROUP_STATE_PREFIX) and "/" not in rest:
            return SegmentKind.READER_GROUP_STATE
        return SegmentKind.RESERVED
    if transaction:
        return SegmentKind.TRANSACTION
    if transient:
        return SegmentKind.TRANSIENT
    return SegmentKind.USER
