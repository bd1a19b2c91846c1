"""The value objects every layer shares: stream configurations, stream cuts, segments with key
ranges, reader-group configurations, a stream transaction's status, a read's result.

Theory of operation.  The client, the controller and the server speak about the same things; each of
those things has one owner, this module, which imports nothing of theirs (only ``errors``,
``limits``, ``naming`` and the model's types), so that every layer can import it and none has to
import another layer to name a value (``tests/test_architecture.py`` holds the layers to that).  The
client re-exports these values where users import them (``millstream``, ``millstream.client``).

A *stream* ``scope/stream`` is a sequence of *epochs*; each epoch is a set of segments whose key
ranges cover [0, 1) exactly once, and routing keys hash into [0, 1).  Scaling seals some segments of
the current epoch and replaces them with new ones covering exactly the same keys; a segment's id packs
the epoch that created it with its number (``millstream.naming``).  A *stream cut* is a position in
the whole stream: one offset in each of a set of segments that together cover [0, 1) exactly once
(they may come from different epochs).

Everything here is a frozen value; the stream and reader-group values have a canonical JSON form --
the form the controller speaks (``ControllerRequest`` bodies: sorted keys, no spaces, segment ids as
ints and as string keys of stream-cut objects, key ranges as floats, times as seconds on the
controller's clock).  Values validate their arguments at construction and raise
``InvalidArgumentError``; decoding JSON that does not describe a value raises the same error.

The controller's replies travel in the same form, and each reply value has one codec here
(``ReplyCodec``; ``CONTROLLER_REPLIES`` names each method's): the server's ``ControllerRpc`` encodes
with it and the client's ``ControllerClient`` decodes with the same one, so neither end holds a copy
of the other's idea of a reply.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar
from uuid import UUID

import attrs

from millstream import limits
from millstream.errors import InvalidArgumentError, ProtocolError
from millstream.naming import (
    segment_id_parts,
    stream_segment_name,
    transaction_segment_name,
    validate_scope_or_stream_name,
)

__all__ = [
    "EVENT_SEGMENT",
    "EVENT_SEGMENT_ATTRIBUTE_ID",
    "CONTROLLER_REPLIES",
    "CommitOutcome",
    "MultiCommitResult",
    "ReadResult",
    "ReaderGroupConfig",
    "ReaderGroupInfo",
    "ReplyCodec",
    "RetentionPolicy",
    "ScalingPolicy",
    "SegmentSlice",
    "SegmentWithRange",
    "StreamConfig",
    "StreamCut",
    "StreamDescription",
    "StreamSegments",
    "SuccessorSegment",
    "TransactionInfo",
    "TransactionStatus",
    "canonical_json",
    "split_stream_name",
]

# --- JSON ------------------------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON: UTF-8, sorted keys, no spaces, no NaN or infinities.  Raises
    ``InvalidArgumentError`` for a value JSON cannot hold."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"cannot encode as JSON: {error}") from None


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} must be a JSON object, not {value!r}")
    return value


def _field(value: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return value[key]
    except KeyError:
        raise InvalidArgumentError(f"{what} lacks {key!r}") from None


def _only_keys(value: Mapping[str, Any], allowed: Iterable[str], what: str) -> None:
    unknown = set(value) - set(allowed)
    if unknown:
        raise InvalidArgumentError(f"{what} has unknown fields {sorted(unknown)}")


def _int(value: Any, what: str, *, low: int = 0, high: int = 2**63 - 1) -> int:
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgumentError(f"{what} must be an int in [{low}, {high}], not {value!r}")
    return value


def _number(value: Any, what: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise InvalidArgumentError(f"{what} must be a finite {'positive' if positive else 'non-negative'} "
                                   f"number, not {value!r}")
    return float(value)


def split_stream_name(stream: str) -> tuple[str, str]:
    """``(scope, stream)`` of ``"scope/stream"``; ``InvalidArgumentError`` unless both are valid names
    (letters, digits, '-', '_', '.'; not starting with '_')."""
    if not isinstance(stream, str) or stream.count("/") != 1:
        raise InvalidArgumentError(f"a stream is named 'scope/stream', not {stream!r}")
    scope, name = stream.split("/")
    validate_scope_or_stream_name(scope, what="scope")
    validate_scope_or_stream_name(name, what="stream")
    return scope, name


# --- Configuration ---------------------------------------------------------------------------------

_SCALING_KINDS: Final = ("fixed", "by_event_rate", "by_data_rate")
_RETENTION_KINDS: Final = ("none", "size", "time", "consumption")


@attrs.frozen
class ScalingPolicy:
    """How many segments a stream has: ``fixed(n)``, or auto-scaled by event rate or data rate.

    An auto-scaling stream starts with ``min_segments`` segments; a segment whose rate stays above
    ``target_rate`` (events/s, or KiB/s for ``by_data_rate``) splits into
    ``min(max(2, rate / target_rate), max(2, scale_factor))`` parts, and adjacent segments that stay
    below half of it merge, never below ``min_segments``.  Build it with the class methods."""

    kind: str
    target_rate: float
    scale_factor: int
    min_segments: int

    def __attrs_post_init__(self) -> None:
        if self.kind not in _SCALING_KINDS:
            raise InvalidArgumentError(f"scaling type must be one of {list(_SCALING_KINDS)}, not {self.kind!r}")
        _int(self.min_segments, "min_segments", low=1, high=limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX)
        if self.kind == "fixed":
            if self.target_rate != 0 or self.scale_factor != 0:
                raise InvalidArgumentError("a fixed scaling policy has no target rate or scale factor")
        else:
            _number(self.target_rate, "target_rate", positive=True)
            _int(self.scale_factor, "scale_factor", low=1, high=limits.CONTROLLER_SCALE_FACTOR_MAX)

    @classmethod
    def fixed(cls, segments: int) -> ScalingPolicy:
        """Always ``segments`` segments (the stream scales only when asked to)."""
        _int(segments, "segments", low=1, high=limits.CONTROLLER_SEGMENTS_PER_EPOCH_MAX)
        return cls("fixed", 0.0, 0, segments)

    @classmethod
    def by_event_rate(cls, target_events_per_second: float, scale_factor: int, min_segments: int = 1) -> ScalingPolicy:
        """Auto-scale so each segment takes about ``target_events_per_second``."""
        return cls("by_event_rate", _number(target_events_per_second, "target_events_per_second", positive=True),
                   scale_factor, min_segments)

    @classmethod
    def by_data_rate(cls, target_kib_per_second: float, scale_factor: int, min_segments: int = 1) -> ScalingPolicy:
        """Auto-scale so each segment takes about ``target_kib_per_second`` KiB/s."""
        return cls("by_data_rate", _number(target_kib_per_second, "target_kib_per_second", positive=True),
                   scale_factor, min_segments)

    @property
    def auto_scaling(self) -> bool:
        return self.kind != "fixed"

    @property
    def initial_segments(self) -> int:
        """How many segments a new stream with this policy starts with."""
        return self.min_segments

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.kind, "target_rate": self.target_rate, "scale_factor": self.scale_factor,
                "min_segments": self.min_segments}

    @classmethod
    def from_json_object(cls, value: Any) -> ScalingPolicy:
        value = _object(value, "a scaling policy")
        _only_keys(value, ("type", "target_rate", "scale_factor", "min_segments"), "a scaling policy")
        kind = _field(value, "type", "a scaling policy")
        min_segments = _field(value, "min_segments", "a scaling policy")
        if kind == "fixed":
            return cls.fixed(min_segments)
        target = _number(value.get("target_rate"), "target_rate", positive=True)
        return cls(kind, target, _field(value, "scale_factor", "a scaling policy"), min_segments)

    def __repr__(self) -> str:
        if self.kind == "fixed":
            return f"ScalingPolicy.fixed({self.min_segments})"
        return f"ScalingPolicy.{self.kind}({self.target_rate!r}, {self.scale_factor}, {self.min_segments})"


@attrs.frozen
class RetentionPolicy:
    """How much of a stream is kept: everything (``none()``), at least ``by_size(bytes)`` or
    ``by_time(seconds)`` of the newest data (older data is truncated away, at the granularity of the
    controller's recorded tail cuts), or what every subscribing reader group has not yet consumed
    (``consumption()``).  Build it with the class methods."""

    kind: str
    limit: float

    def __attrs_post_init__(self) -> None:
        if self.kind not in _RETENTION_KINDS:
            raise InvalidArgumentError(f"retention type must be one of {list(_RETENTION_KINDS)}, not {self.kind!r}")
        _number(self.limit, "limit")
        if self.kind in ("none", "consumption") and self.limit != 0:
            raise InvalidArgumentError(f"a {self.kind!r} retention policy has no limit")
        if self.kind in ("size", "time") and self.limit <= 0:
            raise InvalidArgumentError(f"a {self.kind!r} retention policy needs a positive limit")

    @classmethod
    def none(cls) -> RetentionPolicy:
        """Keep everything until the stream is truncated by hand."""
        return cls("none", 0.0)

    @classmethod
    def by_size(cls, size_bytes: int) -> RetentionPolicy:
        """Keep at least the newest ``size_bytes`` bytes."""
        return cls("size", float(_int(size_bytes, "size_bytes", low=1)))

    @classmethod
    def by_time(cls, seconds: float | datetime.timedelta) -> RetentionPolicy:
        """Keep at least the data of the last ``seconds``."""
        if isinstance(seconds, datetime.timedelta):
            seconds = seconds.total_seconds()
        return cls("time", _number(seconds, "seconds", positive=True))

    @classmethod
    def consumption(cls) -> RetentionPolicy:
        """Keep what any subscribing reader group has not consumed yet (truncate below the lowest of
        their subscriber cuts)."""
        return cls("consumption", 0.0)

    def to_json_object(self) -> dict[str, Any]:
        return {"type": self.kind, "limit": self.limit}

    @classmethod
    def from_json_object(cls, value: Any) -> RetentionPolicy:
        value = _object(value, "a retention policy")
        _only_keys(value, ("type", "limit"), "a retention policy")
        return cls(_field(value, "type", "a retention policy"),
                   _number(value.get("limit", 0.0), "limit"))

    def __repr__(self) -> str:
        if self.kind == "size":
            return f"RetentionPolicy.by_size({int(self.limit)})"
        if self.kind == "time":
            return f"RetentionPolicy.by_time({self.limit!r})"
        return f"RetentionPolicy.{self.kind}()"


@attrs.frozen(kw_only=True)
class StreamConfig:
    """A stream's configuration: its scaling policy (default one fixed segment) and its retention
    policy (default: keep everything)."""

    scaling: ScalingPolicy = attrs.field(factory=lambda: ScalingPolicy.fixed(1))
    retention: RetentionPolicy = attrs.field(factory=RetentionPolicy.none)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.scaling, ScalingPolicy):
            raise InvalidArgumentError(f"scaling must be a ScalingPolicy, not {self.scaling!r}")
        if not isinstance(self.retention, RetentionPolicy):
            raise InvalidArgumentError(f"retention must be a RetentionPolicy, not {self.retention!r}")

    def to_json_object(self) -> dict[str, Any]:
        return {"scaling": self.scaling.to_json_object(), "retention": self.retention.to_json_object()}

    @classmethod
    def from_json_object(cls, value: Any) -> StreamConfig:
        value = _object(value, "a stream config")
        _only_keys(value, ("scaling", "retention"), "a stream config")
        return cls(scaling=ScalingPolicy.from_json_object(_field(value, "scaling", "a stream config")),
                   retention=RetentionPolicy.from_json_object(_field(value, "retention", "a stream config")))


# --- Stream cuts -----------------------------------------------------------------------------------


class StreamCut:
    """A position in stream ``stream`` (``"scope/stream"``): an offset for each segment of a set that
    covers the key space [0, 1) exactly once.  Frozen and hashable; ``positions`` maps segment ids to
    offsets.  ``to_json()`` is canonical (equal cuts give equal strings), ``from_json`` its inverse.

    Build one from the controller (``StreamManager.head_cut``/``tail_cut``/``cut_at``, or a reader
    group's checkpoint); the controller checks a cut it is given (``InvalidStreamCutError``)."""

    __slots__ = ("_hash", "_positions", "_stream")

    def __init__(self, stream: str, positions: Mapping[int, int]) -> None:
        split_stream_name(stream)
        if not isinstance(positions, Mapping) or not positions:
            raise InvalidArgumentError(f"a stream cut maps segment ids to offsets, not {positions!r}")
        checked = {_int(segment, "a segment id"): _int(offset, f"the offset of segment {segment}")
                   for segment, offset in positions.items()}
        self._stream = stream
        self._positions: Mapping[int, int] = types.MappingProxyType(dict(sorted(checked.items())))
        self._hash = hash((stream, tuple(self._positions.items())))

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def positions(self) -> Mapping[int, int]:
        """Segment id -> offset (read-only)."""
        return self._positions

    @property
    def segment_ids(self) -> frozenset[int]:
        return frozenset(self._positions)

    def segment_names(self) -> dict[str, int]:
        """Qualified segment name -> offset."""
        scope, name = split_stream_name(self._stream)
        return {stream_segment_name(scope, name, segment): offset for segment, offset in self._positions.items()}

    def to_wire(self) -> dict[str, int]:
        """The controller's form: ``{"<segment id>": offset}``."""
        return {str(segment): offset for segment, offset in self._positions.items()}

    @classmethod
    def from_wire(cls, stream: str, value: Any) -> StreamCut:
        """The cut of ``stream`` in the controller's form (``{"<segment id>": offset}``)."""
        value = _object(value, "a stream cut")
        positions: dict[int, int] = {}
        for key, offset in value.items():
            if not isinstance(key, str) or not (key.isascii() and key.isdigit()) or (len(key) > 1 and key[0] == "0"):
                raise InvalidArgumentError(f"a stream cut's keys are segment ids in decimal, not {key!r}")
            positions[int(key)] = offset
        return cls(stream, positions)

    def to_json(self) -> str:
        """``{"positions":{"<segment id>":offset,...},"stream":"scope/stream"}``, canonical."""
        return canonical_json({"stream": self._stream, "positions": self.to_wire()}).decode("utf-8")

    @classmethod
    def from_json(cls, text: str | bytes) -> StreamCut:
        try:
            value = json.loads(text)
        except (ValueError, TypeError) as error:
            raise InvalidArgumentError(f"a stream cut's JSON is malformed: {error}") from None
        value = _object(value, "a stream cut")
        _only_keys(value, ("stream", "positions"), "a stream cut")
        return cls.from_wire(_field(value, "stream", "a stream cut"), _field(value, "positions", "a stream cut"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamCut):
            return NotImplemented
        return self._stream == other._stream and self._positions == other._positions

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"StreamCut({self._stream!r}, {dict(self._positions)!r})"

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, "_hash"):
            raise attrs.exceptions.FrozenInstanceError()
        object.__setattr__(self, name, value)


# --- Segments --------------------------------------------------------------------------------------


def _key(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidArgumentError(f"{what} must be a number in [0, 1], not {value!r}")
    return float(value)


@attrs.frozen
class SegmentWithRange:
    """A segment of a stream with the keys it owns, [``key_start``, ``key_end``), its qualified name
    and (when the controller said) the URI of the segment store serving it."""

    segment_id: int
    key_start: float
    key_end: float
    name: str
    uri: str = ""

    def __attrs_post_init__(self) -> None:
        _int(self.segment_id, "segment_id")
        if not _key(self.key_start, "key_start") < _key(self.key_end, "key_end"):
            raise InvalidArgumentError(f"an empty key range [{self.key_start}, {self.key_end})")

    @property
    def epoch(self) -> int:
        """The epoch that created the segment."""
        return segment_id_parts(self.segment_id)[0]

    @property
    def number(self) -> int:
        return segment_id_parts(self.segment_id)[1]

    def owns(self, key: float) -> bool:
        """Whether a routing key hashed to ``key`` belongs here (the last segment also owns 1.0)."""
        return self.key_start <= key < self.key_end or key == self.key_end == 1.0

    def to_json_object(self) -> dict[str, Any]:
        """The controller's wire form (``from_json_object``'s): ``uri`` only when known."""
        value: dict[str, Any] = {"id": self.segment_id, "key_start": self.key_start, "key_end": self.key_end,
                                 "name": self.name}
        if self.uri:
            value["uri"] = self.uri
        return value

    @classmethod
    def from_json_object(cls, value: Any) -> SegmentWithRange:
        value = _object(value, "a segment")
        return cls(_field(value, "id", "a segment"), _field(value, "key_start", "a segment"),
                   _field(value, "key_end", "a segment"), str(_field(value, "name", "a segment")),
                   str(value.get("uri", "")))


@attrs.frozen
class SuccessorSegment:
    """A segment that took over (part of) a sealed segment's keys, with *all* its predecessors: a
    reader may read it only once every predecessor has been read to its end."""

    segment: SegmentWithRange
    predecessors: frozenset[int]

    def to_json_object(self) -> dict[str, Any]:
        """The controller's wire form: the segment's, with its predecessors' ids (ascending)."""
        return {**self.segment.to_json_object(), "predecessors": sorted(self.predecessors)}

    @classmethod
    def from_json_object(cls, value: Any) -> SuccessorSegment:
        return cls(SegmentWithRange.from_json_object(value), frozenset(int(p) for p in value["predecessors"]))


@attrs.frozen
class SegmentSlice:
    """Part of a segment between two stream cuts: from ``start_offset`` to ``end_offset`` (None: no
    bound -- read until the segment ends).  ``predecessors`` are those of its predecessors that are
    in the same range of cuts (the slice may be read once they are all read)."""

    segment: SegmentWithRange
    start_offset: int
    end_offset: int | None
    predecessors: frozenset[int]

    def to_json_object(self) -> dict[str, Any]:
        """The controller's wire form: the segment's, with the offsets (no end: -1) and predecessors."""
        return {**self.segment.to_json_object(), "start_offset": self.start_offset,
                "end_offset": -1 if self.end_offset is None else self.end_offset,
                "predecessors": sorted(self.predecessors)}

    @classmethod
    def from_json_object(cls, value: Any) -> SegmentSlice:
        return cls(SegmentWithRange.from_json_object(value), int(value["start_offset"]),
                   None if value["end_offset"] < 0 else int(value["end_offset"]),
                   frozenset(int(p) for p in value["predecessors"]))


@attrs.frozen
class StreamSegments:
    """The segments of a stream's current epoch, ordered by key range."""

    epoch: int
    segments: tuple[SegmentWithRange, ...]

    def to_json_object(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "segments": [s.to_json_object() for s in self.segments]}

    @classmethod
    def from_json_object(cls, value: Any) -> StreamSegments:
        return cls(int(value["epoch"]), tuple(SegmentWithRange.from_json_object(s) for s in value["segments"]))

    def segment_for(self, key: float) -> SegmentWithRange:
        """The segment owning the point ``key`` of [0, 1]."""
        low, high = 0, len(self.segments) - 1
        while low < high:  # the segments are sorted and contiguous: find the first whose end exceeds key
            middle = (low + high) // 2
            if self.segments[middle].key_end <= key:
                low = middle + 1
            else:
                high = middle
        return self.segments[low]


@attrs.frozen
class StreamDescription:
    """What the controller knows of a stream: its configuration, whether it is sealed, its current
    epoch and that epoch's segments, and the workflow running on it (``state``: active, scaling,
    sealing, sealed, truncating, deleting)."""

    scope: str
    stream: str
    config: StreamConfig
    sealed: bool
    epoch: int
    segments: tuple[SegmentWithRange, ...]
    state: str = "active"

    @property
    def name(self) -> str:
        return f"{self.scope}/{self.stream}"

    def to_json_object(self) -> dict[str, Any]:
        """The controller's wire form, without ``scope`` and ``stream`` (the request names them)."""
        return {"config": self.config.to_json_object(), "sealed": self.sealed, "epoch": self.epoch,
                "state": self.state, "segments": [s.to_json_object() for s in self.segments]}

    @classmethod
    def from_json_object(cls, scope: str, stream: str, value: Any) -> StreamDescription:
        """(A reply without ``state`` -- an older controller's -- says sealed or active.)"""
        return cls(scope, stream, StreamConfig.from_json_object(value["config"]), bool(value["sealed"]),
                   int(value["epoch"]), tuple(SegmentWithRange.from_json_object(s) for s in value["segments"]),
                   str(value.get("state", "sealed" if value["sealed"] else "active")))


# --- Reader-group registry -------------------------------------------------------------------------

_RG_RETENTION: Final = ("none", "consumption")


class ReaderGroupConfig:
    """What the controller records for a reader group: for each stream ``"scope/stream"`` it reads,
    where reading starts (a ``StreamCut``; None: the stream's head) and ends (None: unbounded); how
    often readers checkpoint automatically; and whether the group's subscriber cuts hold back
    consumption-based retention (``retention="consumption"``).  Frozen and hashable."""

    __slots__ = ("_hash", "automatic_checkpoint_seconds", "retention", "streams")

    streams: Mapping[str, tuple[StreamCut | None, StreamCut | None]]
    automatic_checkpoint_seconds: float
    retention: str
    _hash: int

    def __init__(self, streams: Mapping[str, tuple[StreamCut | None, StreamCut | None]] | Iterable[str], *,
                 automatic_checkpoint_seconds: float = 30.0, retention: str = "none") -> None:
        if isinstance(streams, str):
            raise InvalidArgumentError("streams is a list of 'scope/stream' names or a mapping, not one str")
        pairs = dict(streams) if isinstance(streams, Mapping) else {name: (None, None) for name in streams}
        if not pairs:
            raise InvalidArgumentError("a reader group reads at least one stream")
        checked: dict[str, tuple[StreamCut | None, StreamCut | None]] = {}
        for name, bounds in pairs.items():
            split_stream_name(name)
            if not isinstance(bounds, tuple) or len(bounds) != 2:
                raise InvalidArgumentError(f"the bounds of {name!r} are (start cut or None, end cut or None)")
            for cut in bounds:
                if cut is not None and (not isinstance(cut, StreamCut) or cut.stream != name):
                    raise InvalidArgumentError(f"a bound of {name!r} must be a StreamCut of {name!r} or None, "
                                               f"not {cut!r}")
            checked[name] = bounds
        if retention not in _RG_RETENTION:
            raise InvalidArgumentError(f"retention must be one of {list(_RG_RETENTION)}, not {retention!r}")
        object.__setattr__(self, "streams", types.MappingProxyType(dict(sorted(checked.items()))))
        object.__setattr__(self, "automatic_checkpoint_seconds",
                           _number(automatic_checkpoint_seconds, "automatic_checkpoint_seconds"))
        object.__setattr__(self, "retention", retention)
        object.__setattr__(self, "_hash", hash((tuple(self.streams.items()), self.automatic_checkpoint_seconds,
                                                retention)))

    def __setattr__(self, name: str, value: object) -> None:
        raise attrs.exceptions.FrozenInstanceError()

    def start_cut(self, stream: str) -> StreamCut | None:
        return self.streams[stream][0]

    def end_cut(self, stream: str) -> StreamCut | None:
        return self.streams[stream][1]

    def to_json_object(self) -> dict[str, Any]:
        return {
            "streams": {name: {"start": None if start is None else start.to_wire(),
                               "end": None if end is None else end.to_wire()}
                        for name, (start, end) in self.streams.items()},
            "automatic_checkpoint_seconds": self.automatic_checkpoint_seconds,
            "retention": self.retention,
        }

    @classmethod
    def from_json_object(cls, value: Any) -> ReaderGroupConfig:
        value = _object(value, "a reader group config")
        _only_keys(value, ("streams", "automatic_checkpoint_seconds", "retention"), "a reader group config")
        streams: dict[str, tuple[StreamCut | None, StreamCut | None]] = {}
        for name, raw in _object(_field(value, "streams", "a reader group config"), "streams").items():
            bounds = _object(raw, f"the bounds of {name!r}")
            _only_keys(bounds, ("start", "end"), f"the bounds of {name!r}")
            start, end = bounds.get("start"), bounds.get("end")
            streams[name] = (None if start is None else StreamCut.from_wire(name, start),
                             None if end is None else StreamCut.from_wire(name, end))
        return cls(streams, automatic_checkpoint_seconds=value.get("automatic_checkpoint_seconds", 30.0),
                   retention=value.get("retention", "none"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReaderGroupConfig):
            return NotImplemented
        return (self.streams == other.streams and self.retention == other.retention
                and self.automatic_checkpoint_seconds == other.automatic_checkpoint_seconds)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (f"ReaderGroupConfig({dict(self.streams)!r}, automatic_checkpoint_seconds="
                f"{self.automatic_checkpoint_seconds!r}, retention={self.retention!r})")


@attrs.frozen
class ReaderGroupInfo:
    """A reader group as the controller records it: its configuration, the segment its readers keep
    their shared state in, and the configuration's generation (bumped by every reset)."""

    scope: str
    group: str
    config: ReaderGroupConfig
    state_segment: str
    generation: int

    def to_json_object(self) -> dict[str, Any]:
        """The controller's wire form, without ``scope`` and ``group`` (the request names them)."""
        return {"config": self.config.to_json_object(), "state_segment": self.state_segment,
                "generation": self.generation}

    @classmethod
    def from_json_object(cls, scope: str, group: str, value: Any) -> ReaderGroupInfo:
        return cls(scope, group, ReaderGroupConfig.from_json_object(value["config"]), str(value["state_segment"]),
                   int(value["generation"]))


# --- Stream transactions ---------------------------------------------------------------------------


class TransactionStatus(enum.Enum):
    """A stream transaction's status, as the controller records it (the values are the spec's
    names).  The lifecycle::

        OPEN --commit--> COMMITTING --merged--> COMMITTED
        OPEN --abort / lease lapsed / fenced--> ABORTING --segments deleted--> ABORTED
    """

    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTING = "aborting"
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        """COMMITTED or ABORTED: nothing will change any more."""
        return self in (TransactionStatus.COMMITTED, TransactionStatus.ABORTED)

    def __repr__(self) -> str:
        return f"TransactionStatus.{self.name}"


class CommitOutcome(enum.Enum):
    """The answer to ``commit_transactions``."""

    COMMITTED = "committed"
    """Every listed transaction is committing (or committed) and the fence value is recorded."""
    ALREADY_COMMITTED = "already_committed"
    """The fence key's recorded value was not lower: nothing was committed by this call; the listed
    transactions that were still open are aborted."""

    def __repr__(self) -> str:
        return f"CommitOutcome.{self.name}"


@attrs.frozen
class MultiCommitResult:
    """``commit_transactions``' outcome and the value recorded for the fence key afterwards (None
    without a fence)."""

    outcome: CommitOutcome
    recorded: int | None

    def to_json_object(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "recorded": self.recorded}

    @classmethod
    def from_json_object(cls, value: Any) -> MultiCommitResult:
        recorded = value.get("recorded")
        return cls(CommitOutcome(value["outcome"]), None if recorded is None else int(recorded))


@attrs.frozen
class TransactionInfo:
    """What the controller records of a transaction: its stream, id, status, the epoch it began in and
    that epoch's segments (their own names; ``transaction_segments`` gives the hidden ones), its lease
    and deadline (seconds on the controller's clock), its commit order (0 until it commits) and when it
    began (``opened``; 0.0 where a reply did not say).  The controller returns it; ``to_json_object``
    and ``from_json_object`` are the wire form, without ``stream`` (the request names it)."""

    stream: str
    txn_id: UUID
    status: TransactionStatus
    epoch: int
    segments: tuple[SegmentWithRange, ...]
    lease_seconds: float
    deadline: float
    order: int
    opened: float = 0.0

    @property
    def transaction_segments(self) -> tuple[SegmentWithRange, ...]:
        """The transaction's hidden segments, one per segment of its epoch (same ids and key ranges)."""
        return tuple(attrs.evolve(s, name=transaction_segment_name(s.name, self.txn_id)) for s in self.segments)

    @classmethod
    def from_json_object(cls, stream: str, value: Mapping[str, Any]) -> TransactionInfo:
        try:
            return cls(stream, UUID(hex=value["txn"]), TransactionStatus(value["status"]), int(value["epoch"]),
                       tuple(SegmentWithRange.from_json_object(s) for s in value["segments"]),
                       float(value["lease"]), float(value["deadline"]), int(value["order"]),
                       float(value.get("opened", 0.0)))
        except (KeyError, TypeError, ValueError) as error:
            raise ProtocolError(f"the controller described a transaction as {value!r}: {error}") from None

    def to_json_object(self) -> dict[str, Any]:
        return {"txn": self.txn_id.hex, "status": self.status.value, "epoch": self.epoch,
                "segments": [s.to_json_object() for s in self.segments], "lease": self.lease_seconds,
                "opened": self.opened, "deadline": self.deadline, "order": self.order}


# --- Reads and the segments that hold events -------------------------------------------------------


@attrs.frozen
class ReadResult:
    """What one read returned.  ``at_tail``: the read ended at the segment's current length.
    ``end_of_segment``: the segment is sealed and the read reached its end (no more data, ever)."""

    offset: int
    data: bytes
    at_tail: bool
    end_of_segment: bool


#: The core attribute that says a segment holds events: b"millstream.event" as a 128-bit id (its
#: version nibble is 7, so no random (version 4) writer id can be it).
EVENT_SEGMENT_ATTRIBUTE_ID: Final = int.from_bytes(b"millstream.event", "big")
#: Its value for a segment that holds events.
EVENT_SEGMENT: Final = 1


# --- The controller's replies: one codec per reply value, for both ends (issue 22 item 2) -----------

_T = TypeVar("_T")

#: A reply's or a request's JSON object.
JsonObject = Mapping[str, Any]


@attrs.frozen
class ReplyCodec(Generic[_T]):
    """How one kind of controller reply travels.  ``encode`` turns the controller's typed result into
    the reply's JSON object (the server's ``ControllerRpc``, which sends it as canonical JSON);
    ``decode(reply, request)`` turns that object back into the value (the client's
    ``ControllerClient``), given the request's JSON object: a reply does not repeat the scope, stream
    or group its request named.  ``decode`` raises ``LookupError``, ``TypeError`` or ``ValueError``
    (``InvalidArgumentError`` is one) for an object that does not describe the value -- the client
    reports those as the peer's ``ProtocolError``."""

    encode: Callable[[_T], dict[str, Any]]
    decode: Callable[[JsonObject, JsonObject], _T]


def _stream_of(request: JsonObject) -> str:
    return f"{request['scope']}/{request['stream']}"


def _one_field(name: str, convert: Callable[[Any], _T]) -> ReplyCodec[_T]:
    """A reply that is ``{name: value}``."""
    return ReplyCodec(lambda value: {name: value}, lambda reply, request: convert(reply[name]))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _strings(value: Any) -> list[str]:
    return list(value)


NO_REPLY: Final[ReplyCodec[None]] = ReplyCodec(lambda result: {}, lambda reply, request: None)
SCOPE_NAMES: Final = _one_field("scopes", _strings)
STREAM_NAMES: Final = _one_field("streams", _strings)
READER_GROUP_NAMES: Final = _one_field("groups", _strings)
EPOCH: Final = _one_field("epoch", int)
GENERATION: Final = _one_field("generation", int)
STATE_SEGMENT: Final = _one_field("state_segment", str)
SEGMENT_URI: Final = _one_field("uri", str)
LEASE_DEADLINE: Final = _one_field("deadline", float)
FENCE_VALUE: Final = _one_field("value", _optional_int)
STREAM_CUT: Final[ReplyCodec[StreamCut]] = ReplyCodec(
    lambda cut: {"cut": cut.to_wire()}, lambda reply, request: StreamCut.from_wire(_stream_of(request), reply["cut"]))
STREAM_DESCRIPTION: Final[ReplyCodec[StreamDescription]] = ReplyCodec(
    StreamDescription.to_json_object,
    lambda reply, request: StreamDescription.from_json_object(request["scope"], request["stream"], reply))
STREAM_SEGMENTS: Final[ReplyCodec[StreamSegments]] = ReplyCodec(
    StreamSegments.to_json_object, lambda reply, request: StreamSegments.from_json_object(reply))
SUCCESSORS: Final[ReplyCodec[list[SuccessorSegment]]] = ReplyCodec(
    lambda successors: {"successors": [s.to_json_object() for s in successors]},
    lambda reply, request: [SuccessorSegment.from_json_object(s) for s in reply["successors"]])
SEGMENT_SLICES: Final[ReplyCodec[list[SegmentSlice]]] = ReplyCodec(
    lambda slices: {"segments": [s.to_json_object() for s in slices]},
    lambda reply, request: [SegmentSlice.from_json_object(s) for s in reply["segments"]])
READER_GROUP_INFO: Final[ReplyCodec[ReaderGroupInfo]] = ReplyCodec(
    ReaderGroupInfo.to_json_object,
    lambda reply, request: ReaderGroupInfo.from_json_object(request["scope"], request["group"], reply))
TRANSACTION_INFO: Final[ReplyCodec[TransactionInfo]] = ReplyCodec(
    TransactionInfo.to_json_object, lambda reply, request: TransactionInfo.from_json_object(_stream_of(request), reply))
TRANSACTION_STATUS: Final[ReplyCodec[TransactionStatus]] = ReplyCodec(
    lambda status: {"status": status.value}, lambda reply, request: TransactionStatus(reply["status"]))
TRANSACTION_STATUSES: Final[ReplyCodec[dict[UUID, TransactionStatus]]] = ReplyCodec(
    lambda statuses: {"transactions": [{"txn": txn.hex, "status": status.value} for txn, status in statuses.items()]},
    lambda reply, request: {UUID(hex=t["txn"]): TransactionStatus(t["status"]) for t in reply["transactions"]})
MULTI_COMMIT_RESULT: Final[ReplyCodec[MultiCommitResult]] = ReplyCodec(
    MultiCommitResult.to_json_object, lambda reply, request: MultiCommitResult.from_json_object(reply))

#: Every controller method's reply codec: the server encodes each method's result with it, the client
#: decodes with the same one.
CONTROLLER_REPLIES: Final[Mapping[str, ReplyCodec[Any]]] = types.MappingProxyType({
    "create_scope": NO_REPLY, "delete_scope": NO_REPLY, "list_scopes": SCOPE_NAMES,
    "create_stream": NO_REPLY, "update_stream": NO_REPLY, "get_stream": STREAM_DESCRIPTION,
    "list_streams": STREAM_NAMES, "seal_stream": NO_REPLY, "delete_stream": NO_REPLY,
    "get_current_segments": STREAM_SEGMENTS, "get_successors": SUCCESSORS, "scale_stream": EPOCH,
    "get_head_cut": STREAM_CUT, "get_tail_cut": STREAM_CUT, "get_cut_at": STREAM_CUT,
    "truncate_stream": NO_REPLY, "check_stream_cut": NO_REPLY, "get_segments_between": SEGMENT_SLICES,
    "create_reader_group": STATE_SEGMENT, "get_reader_group": READER_GROUP_INFO, "update_reader_group": GENERATION,
    "delete_reader_group": NO_REPLY, "list_reader_groups": READER_GROUP_NAMES, "update_subscriber_cut": NO_REPLY,
    "get_segment_uri": SEGMENT_URI,
    "create_transaction": TRANSACTION_INFO, "ping_transaction": LEASE_DEADLINE,
    "commit_transaction": TRANSACTION_STATUS, "abort_transaction": TRANSACTION_STATUS,
    "get_transaction": TRANSACTION_INFO, "list_transactions": TRANSACTION_STATUSES,
    "commit_transactions": MULTI_COMMIT_RESULT, "get_fence": FENCE_VALUE,
})
