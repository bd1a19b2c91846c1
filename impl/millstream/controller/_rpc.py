"""The controller's wire face: ``ControllerRequest`` bodies in, ``ControllerReply`` bodies out.

Theory of operation.  The server hands each ``ControllerRequest`` to ``ControllerRpc.handle(method,
body)``.  The body must be a JSON object with exactly the method's fields (plus an optional
``"token"``); each field is checked and converted here -- names, segment ids, key ranges, stream
cuts (``{"<segment id>": offset}``), configurations -- so the controller's methods receive only
well-formed arguments, and anything malformed is an ``InvalidArgumentError`` naming the field, before
anything is looked at or changed.  The reply is the controller method's typed result encoded as
the JSON object the client stub decodes, by the codec both ends share (``values.CONTROLLER_REPLIES``;
``None`` is ``{}``), in canonical JSON (``tests/controller/test_wire_replies.py`` pins every reply
kind's bytes).
With authentication on, the token must grant the method's permission (READ for queries, READ_UPDATE
for changes) on its resource: the scope for scope methods (``scope/*`` covers it), ``scope/stream``
for stream methods, the group's state segment's ``scope/_RG<group>`` for reader groups (so ``scope/*``
covers them, a token for one stream does not), ``*`` for listing scopes, the segment's resource for
``get_segment_uri``; stream transactions and fences are the stream's (READ_UPDATE to begin, ping,
commit or abort them).  Creating or reconfiguring a reader group also needs READ on every stream it
is to read, checked with the rest before anything changes: a token that could not read them would
leave a group its readers cannot use.  Unknown methods are not handed here: ``knows`` says no and the
server answers ``OperationUnsupported``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from millstream import limits
from millstream.auth import Authorizer, Permission, reader_group_resource
from millstream.controller._controller import Controller
from millstream.controller._transactions import check_fence, check_lease, check_transaction_id
from millstream.errors import FenceValueError, InvalidArgumentError, PayloadTooLargeError
from millstream.naming import quote, validate_scope_or_stream_name, validate_segment_name
from millstream.values import CONTROLLER_REPLIES, ReaderGroupConfig, StreamConfig, canonical_json

__all__ = ["METHODS", "ControllerRpc", "check_json_depth"]

_Args = dict[str, Any]
_Parse = Callable[[Any, str], Any]


def _name(what: str) -> _Parse:
    def parse(value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{field} must be a string, not {quote(value)}")
        return validate_scope_or_stream_name(value, what=what)
    return parse


def _qualified_stream(value: Any, field: str) -> str:
    if not isinstance(value, str) or value.count("/") != 1:
        raise InvalidArgumentError(f"{field} must be 'scope/stream', not {quote(value)}")
    scope, stream = value.split("/")
    validate_scope_or_stream_name(scope, what="scope")
    validate_scope_or_stream_name(stream, what="stream")
    return value


#: Decimal digits of the largest segment id (2**64 - 1).
_SEGMENT_ID_DIGITS_MAX: Final = 20


def _segment_id(value: Any, field: str) -> int:
    if type(value) is not int or not 0 <= value < 2**64:
        raise InvalidArgumentError(f"{field} must be a segment id (a non-negative int), not {quote(value)}")
    return value


def _segment_ids(value: Any, field: str) -> list[int]:
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{field} must be a list of segment ids, not {quote(value)}")
    return [_segment_id(v, field) for v in value]


def _key(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidArgumentError(f"{field}: key range bounds are numbers in [0, 1], not {quote(value)}")
    return float(value)


def _ranges(value: Any, field: str) -> list[tuple[float, float]]:
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{field} must be a list of [key_start, key_end] pairs, not {quote(value)}")
    ranges = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidArgumentError(f"{field}: a key range is [key_start, key_end], not {quote(pair)}")
        ranges.append((_key(pair[0], field), _key(pair[1], field)))
    return ranges


def _cut(value: Any, field: str) -> dict[int, int]:
    if not isinstance(value, dict) or not value:
        raise InvalidArgumentError(f"{field} must be a stream cut ({{\"<segment id>\": offset}}), not {quote(value)}")
    cut: dict[int, int] = {}
    for key, offset in value.items():
        if len(key) > _SEGMENT_ID_DIGITS_MAX or not (key.isascii() and key.isdigit()) \
                or (len(key) > 1 and key[0] == "0"):
            raise InvalidArgumentError(f"{field}: a stream cut's keys are segment ids in decimal, not {quote(key)}")
        if type(offset) is not int or offset < 0:
            raise InvalidArgumentError(f"{field}: the offset of segment {key} must be a non-negative int, "
                                       f"not {quote(offset)}")
        cut[_segment_id(int(key), field)] = offset
    return cut


def _optional_cut(value: Any, field: str) -> dict[int, int] | None:
    return None if value is None else _cut(value, field)


def _time(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"{field} must be a time in seconds, not {quote(value)}")
    return float(value)


def _optional_generation(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(f"{field} must be a non-negative int, not {quote(value)}")
    return value


def _stream_config(value: Any, field: str) -> StreamConfig:
    return StreamConfig.from_json_object(value)


def _group_config(value: Any, field: str) -> ReaderGroupConfig:
    return ReaderGroupConfig.from_json_object(value)


def _segment_name(value: Any, field: str) -> str:
    return validate_segment_name(value, what=f"{field} (a segment name)")


def _transaction_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) != _TRANSACTION_ID_LENGTH:  # (quoted short before it is checked)
        raise InvalidArgumentError(f"{field} must be a transaction id (32 lower-case hex digits), not {quote(value)}")
    return check_transaction_id(value, field)


def _transaction_ids(value: Any, field: str) -> list[str]:
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{field} must be a list of transaction ids, not {quote(value)}")
    return [_transaction_id(v, field) for v in value]


def _optional_lease(value: Any, field: str) -> float | None:
    return None if value is None else check_lease(value)


def _optional_fence(value: Any, field: str) -> tuple[str, int] | None:
    if value is not None and (not isinstance(value, list) or len(value) != 2):
        raise FenceValueError(f"{field} must be [key, value] or null, not {quote(value)}")
    if value is not None:
        _fence_key(value[0], field, FenceValueError)
    return check_fence(value)


def _fence_key(value: Any, field: str, error: type[InvalidArgumentError] = InvalidArgumentError) -> str:
    if not isinstance(value, str) or not value or len(value) > limits.FENCE_KEY_LENGTH_MAX:
        raise error(f"{field}: a fence key is a non-empty string of at most {limits.FENCE_KEY_LENGTH_MAX} "
                    f"characters, not {quote(value)}")
    return value


#: A transaction id's length (``UUID.hex``).
_TRANSACTION_ID_LENGTH: Final = 32

_SCOPE, _STREAM, _GROUP = _name("scope"), _name("stream"), _name("reader group")


@attrs.frozen
class _Method:
    required: Mapping[str, _Parse]
    optional: Mapping[str, _Parse]
    permission: Permission
    resource: Callable[[_Args], str]
    call: Callable[[Controller, _Args], Awaitable[Any]]
    #: Further resources the method reads (READ is checked on each): a reader group's streams.
    reads: Callable[[_Args], Iterable[str]] = lambda args: ()


def _scope_resource(args: _Args) -> str:
    return str(args["scope"])


def _stream_resource(args: _Args) -> str:
    return f"{args['scope']}/{args['stream']}"


def _group_resource(args: _Args) -> str:
    return reader_group_resource(args["scope"], args["group"])


def _group_streams(args: _Args) -> Iterable[str]:
    config: ReaderGroupConfig = args["config"]
    return config.streams.keys()


_READ, _UPDATE = Permission.READ, Permission.READ_UPDATE
_STREAM_FIELDS: Final = {"scope": _SCOPE, "stream": _STREAM}
_GROUP_FIELDS: Final = {"scope": _SCOPE, "group": _GROUP}

#: Every controller method: its fields, permission, resource and the controller call.
METHODS: Final[dict[str, _Method]] = {
    "create_scope": _Method({"scope": _SCOPE}, {}, _UPDATE, _scope_resource,
                            lambda c, a: c.create_scope(a["scope"])),
    "delete_scope": _Method({"scope": _SCOPE}, {}, _UPDATE, _scope_resource,
                            lambda c, a: c.delete_scope(a["scope"])),
    "list_scopes": _Method({}, {}, _READ, lambda a: "*", lambda c, a: c.list_scopes()),
    "create_stream": _Method({**_STREAM_FIELDS, "config": _stream_config}, {}, _UPDATE, _stream_resource,
                             lambda c, a: c.create_stream(a["scope"], a["stream"], a["config"])),
    "update_stream": _Method({**_STREAM_FIELDS, "config": _stream_config}, {}, _UPDATE, _stream_resource,
                             lambda c, a: c.update_stream(a["scope"], a["stream"], a["config"])),
    "get_stream": _Method(_STREAM_FIELDS, {}, _READ, _stream_resource,
                          lambda c, a: c.get_stream(a["scope"], a["stream"])),
    "list_streams": _Method({"scope": _SCOPE}, {}, _READ, _scope_resource, lambda c, a: c.list_streams(a["scope"])),
    "seal_stream": _Method(_STREAM_FIELDS, {}, _UPDATE, _stream_resource,
                           lambda c, a: c.seal_stream(a["scope"], a["stream"])),
    "delete_stream": _Method(_STREAM_FIELDS, {}, _UPDATE, _stream_resource,
                             lambda c, a: c.delete_stream(a["scope"], a["stream"])),
    "get_current_segments": _Method(_STREAM_FIELDS, {}, _READ, _stream_resource,
                                    lambda c, a: c.get_current_segments(a["scope"], a["stream"])),
    "get_successors": _Method({**_STREAM_FIELDS, "segment_id": _segment_id}, {}, _READ, _stream_resource,
                              lambda c, a: c.get_successors(a["scope"], a["stream"], a["segment_id"])),
    "scale_stream": _Method({**_STREAM_FIELDS, "seal": _segment_ids, "new_ranges": _ranges}, {}, _UPDATE,
                            _stream_resource,
                            lambda c, a: c.scale_stream(a["scope"], a["stream"], a["seal"], a["new_ranges"])),
    "get_head_cut": _Method(_STREAM_FIELDS, {}, _READ, _stream_resource,
                            lambda c, a: c.get_head_cut(a["scope"], a["stream"])),
    "get_tail_cut": _Method(_STREAM_FIELDS, {}, _READ, _stream_resource,
                            lambda c, a: c.get_tail_cut(a["scope"], a["stream"])),
    "get_cut_at": _Method({**_STREAM_FIELDS, "time": _time}, {}, _READ, _stream_resource,
                          lambda c, a: c.get_cut_at(a["scope"], a["stream"], a["time"])),
    "truncate_stream": _Method({**_STREAM_FIELDS, "cut": _cut}, {}, _UPDATE, _stream_resource,
                               lambda c, a: c.truncate_stream(a["scope"], a["stream"], a["cut"])),
    "check_stream_cut": _Method({**_STREAM_FIELDS, "cut": _cut}, {}, _READ, _stream_resource,
                                lambda c, a: c.check_stream_cut(a["scope"], a["stream"], a["cut"])),
    "get_segments_between": _Method(
        {**_STREAM_FIELDS, "from_cut": _optional_cut, "to_cut": _optional_cut}, {}, _READ, _stream_resource,
        lambda c, a: c.get_segments_between(a["scope"], a["stream"], a["from_cut"], a["to_cut"])),
    "create_reader_group": _Method({**_GROUP_FIELDS, "config": _group_config}, {}, _UPDATE, _group_resource,
                                   lambda c, a: c.create_reader_group(a["scope"], a["group"], a["config"]),
                                   reads=_group_streams),
    "get_reader_group": _Method(_GROUP_FIELDS, {}, _READ, _group_resource,
                                lambda c, a: c.get_reader_group(a["scope"], a["group"])),
    "update_reader_group": _Method(
        {**_GROUP_FIELDS, "config": _group_config}, {"expected_generation": _optional_generation}, _UPDATE,
        _group_resource,
        lambda c, a: c.update_reader_group(a["scope"], a["group"], a["config"], a.get("expected_generation")),
        reads=_group_streams),
    "delete_reader_group": _Method(_GROUP_FIELDS, {}, _UPDATE, _group_resource,
                                   lambda c, a: c.delete_reader_group(a["scope"], a["group"])),
    "list_reader_groups": _Method({"scope": _SCOPE}, {}, _READ, _scope_resource,
                                  lambda c, a: c.list_reader_groups(a["scope"])),
    "update_subscriber_cut": _Method(
        {**_GROUP_FIELDS, "stream": _qualified_stream, "cut": _cut}, {}, _UPDATE, _group_resource,
        lambda c, a: c.update_subscriber_cut(a["scope"], a["group"], a["stream"], a["cut"])),
    "get_segment_uri": _Method({"segment": _segment_name}, {}, _READ, lambda a: str(a["segment"]),
                               lambda c, a: c.get_segment_uri(a["segment"])),
    # Stream transactions and the fenced multi-commit.
    "create_transaction": _Method(_STREAM_FIELDS, {"lease": _optional_lease}, _UPDATE, _stream_resource,
                                  lambda c, a: c.create_transaction(a["scope"], a["stream"], a.get("lease"))),
    "ping_transaction": _Method({**_STREAM_FIELDS, "txn": _transaction_id}, {}, _UPDATE, _stream_resource,
                                lambda c, a: c.ping_transaction(a["scope"], a["stream"], a["txn"])),
    "commit_transaction": _Method({**_STREAM_FIELDS, "txn": _transaction_id}, {}, _UPDATE, _stream_resource,
                                  lambda c, a: c.commit_transaction(a["scope"], a["stream"], a["txn"])),
    "abort_transaction": _Method({**_STREAM_FIELDS, "txn": _transaction_id}, {}, _UPDATE, _stream_resource,
                                 lambda c, a: c.abort_transaction(a["scope"], a["stream"], a["txn"])),
    "get_transaction": _Method({**_STREAM_FIELDS, "txn": _transaction_id}, {}, _READ, _stream_resource,
                               lambda c, a: c.get_transaction(a["scope"], a["stream"], a["txn"])),
    "list_transactions": _Method(_STREAM_FIELDS, {}, _READ, _stream_resource,
                                 lambda c, a: c.list_transactions(a["scope"], a["stream"])),
    "commit_transactions": _Method(
        {**_STREAM_FIELDS, "txns": _transaction_ids}, {"fence": _optional_fence}, _UPDATE, _stream_resource,
        lambda c, a: c.commit_transactions(a["scope"], a["stream"], a["txns"], a.get("fence"))),
    "get_fence": _Method({**_STREAM_FIELDS, "key": _fence_key}, {}, _READ, _stream_resource,
                         lambda c, a: c.get_fence(a["scope"], a["stream"], a["key"])),
}


#: What nesting depends on: a JSON string (skipped whole, escapes included) or a bracket.
_JSON_NESTING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_OPENING: Final = frozenset(b"[{")


def check_json_depth(body: bytes, depth_max: int = limits.CONTROLLER_REQUEST_JSON_DEPTH_MAX) -> None:
    """Raise ``InvalidArgumentError`` if arrays and objects in ``body`` nest deeper than ``depth_max``,
    before anything parses it (a parser recursing through thousands of levels would exhaust the
    stack).  Brackets inside strings do not count.  Fast for the usual body: one with no more brackets
    than the limit cannot nest deeper, so it is not scanned."""
    if body.count(b"[") + body.count(b"{") <= depth_max:
        return
    depth = 0
    for match in _JSON_NESTING.finditer(body):
        first = match[0][0]
        if first in _OPENING:
            depth += 1
            if depth > depth_max:
                raise InvalidArgumentError(f"the request body nests arrays and objects deeper than {depth_max} levels")
        elif first != 0x22:  # a closing bracket (a string starts with '"')
            depth -= 1


def parse_request(method: str, body: bytes) -> tuple[_Args, str]:
    """The checked arguments of a ``method`` request and its token.  Raises ``InvalidArgumentError``
    for a body that is not a JSON object of exactly the method's fields, or that is larger than
    ``limits.CONTROLLER_REQUEST_BODY_BYTES_MAX`` or nests deeper than
    ``limits.CONTROLLER_REQUEST_JSON_DEPTH_MAX`` (both checked before it is parsed)."""
    spec = METHODS[method]
    if len(body) > limits.CONTROLLER_REQUEST_BODY_BYTES_MAX:
        raise PayloadTooLargeError(f"{method}: a request body of {len(body)} bytes exceeds "
                                   f"{limits.CONTROLLER_REQUEST_BODY_BYTES_MAX}")
    check_json_depth(body)
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:  # (RecursionError: cannot, see above)
        raise InvalidArgumentError(f"{method}: the request body is not JSON: {quote(str(error))}") from None
    if not isinstance(request, dict):
        raise InvalidArgumentError(f"{method}: the request body must be a JSON object, not {type(request).__name__}")
    token = request.pop("token", "")
    if not isinstance(token, str):
        raise InvalidArgumentError(f"{method}: token must be a string")
    unknown = set(request) - set(spec.required) - set(spec.optional)
    if unknown:
        raise InvalidArgumentError(f"{method}: unknown fields {quote(sorted(unknown))}")
    missing = set(spec.required) - set(request)
    if missing:
        raise InvalidArgumentError(f"{method}: missing fields {sorted(missing)}")
    args = {field: parse(request[field], field) for field, parse in spec.required.items()}
    args.update({field: parse(request[field], field) for field, parse in spec.optional.items() if field in request})
    return args, token


class ControllerRpc:
    """Serves ``controller`` to the server's connections (``SegmentStoreServer.attach_controller``)."""

    def __init__(self, controller: Controller, authorizer: Authorizer | None = None) -> None:
        self.controller = controller
        self._authorizer = authorizer

    def knows(self, method: str) -> bool:
        return method in METHODS

    async def handle(self, method: str, body: bytes) -> bytes:
        spec = METHODS.get(method)
        if spec is None:
            raise InvalidArgumentError(f"no controller method {quote(method)}")
        args, token = parse_request(method, body)
        if self._authorizer is not None:
            self._authorizer.check(token, spec.resource(args), spec.permission)
            for stream in spec.reads(args):
                self._authorizer.check(token, stream, _READ)
        return canonical_json(CONTROLLER_REPLIES[method].encode(await spec.call(self.controller, args)))
