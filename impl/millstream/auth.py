"""Tokens that grant access to streams: issued with a shared secret, checked by the segment store.

Theory of operation.  Authentication is optional and off by default.  An operator gives the segment
store a secret (``SegmentStoreServer(..., auth_secret=...)``, ``millstream serve`` reads it from a
file); whoever holds the secret (the operator now, the controller later) issues tokens with
``issue_token`` and hands them to clients, which pass them through untouched in every request.  The
store checks each request's token with ``verify``; a token it does not accept is answered with
``AuthTokenCheckFailed`` and the request does nothing.

A token names a *resource*, a *permission* and an *expiry*:

* resource -- ``"scope/stream"`` (one stream), ``"scope/*"`` (the scope itself -- listing its
  streams and groups, creating or deleting it -- and everything in it: its streams and its reader
  groups) or ``"*"`` (everything, including listing scopes).  A segment belongs to the resource
  named by the first two ``/``-separated components of its name (``resource_of``); a name with
  fewer components is its own resource.  A reader group's resource is its state segment's,
  ``scope/_RG<group>`` (``reader_group_resource``), so ``scope/*`` covers it but a token for one
  stream does not.
* permission -- ``READ`` (reads, segment info, attribute reads) or ``READ_UPDATE`` (everything,
  reads included).
* expiry -- seconds since the Unix epoch; a token is refused from that instant on.  The current time
  is injected (``now``), so tests decide it and a token's lifetime never depends on the test
  machine's speed.

Wire format (URL-safe, no padding, so it travels in a URL, a header or a config file as is)::

    token   := "ms1." payload "." signature
    payload := base64url(JSON {"r": resource, "p": permission, "e": expires_at})
    signature := base64url(HMAC-SHA256(secret, "ms1." payload))

Reserved segments.  Whatever the token, and with authentication off too, a client may do to a
segment only what ``CLIENT_OPERATIONS`` allows for its kind (``naming.segment_kind``): anything to
its own segments; append to a stream transaction's segment (the controller creates, commits and
aborts it); append to, merge or delete a large event's transient segment; append to and truncate a
reader group's state; and only read the rest -- the system scope ``_system`` (the controller's
metadata) and names ``scope/_...``.  The server checks this first (``Authorizer.authorize``) and
answers ``ReservedSegmentError`` (``TransientSegmentError`` for a transient segment).  The node's own
writes never pass here: its controller reaches the store in process (``LocalSegmentStore``), and no
request, token or secret makes a client's request one of them.

The signature covers the version prefix and the payload bytes exactly as sent, and is compared in
constant time (``hmac.compare_digest``), so neither a forged payload nor a timing probe gets
through.  Every refusal is an ``AuthenticationError`` whose message says why (malformed, forged,
expired, not this resource, not this permission) -- the reason travels back to the client in
``AuthTokenCheckFailed``.  The secret never appears in a message.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
import ipaddress
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Final

import attrs

from millstream import limits
from millstream.errors import AuthenticationError, InvalidArgumentError, ReservedSegmentError, TransientSegmentError
from millstream.naming import SegmentKind, reader_group_state_segment_name, segment_kind

__all__ = [
    "CLIENT_OPERATIONS",
    "SECRET_LENGTH_MIN_BYTES",
    "PEER_TOKEN_LENGTH_MIN",
    "TOKEN_LENGTH_BYTES_MAX",
    "Authorizer",
    "Permission",
    "SegmentOperation",
    "TokenClaims",
    "check_client_operation",
    "exposure_warnings",
    "is_loopback_host",
    "issue_token",
    "read_secret_file",
    "reader_group_resource",
    "resource_covers",
    "resource_of",
    "verify",
]

#: A secret shorter than this is refused: HMAC-SHA256's security rests on the key's entropy, and 16
#: random bytes (128 bits) is the usual floor.
SECRET_LENGTH_MIN_BYTES: Final = 16

#: A token longer than this is refused unread (a resource name is at most two 255-character names);
#: it also keeps the work one bad request can cost the server small.
TOKEN_LENGTH_BYTES_MAX: Final = 2048

#: The shortest peer token a cluster's nodes accept (``Authorizer.trust_peer_token``): 32 hex digits
#: are 128 random bits, beyond guessing.
PEER_TOKEN_LENGTH_MIN: Final = 32

_PREFIX: Final = "ms1."


class Permission(enum.Enum):
    """What a token lets its holder do.  ``READ_UPDATE`` includes ``READ``."""

    READ = "READ"
    READ_UPDATE = "READ_UPDATE"

    def grants(self, needed: Permission) -> bool:
        return self is Permission.READ_UPDATE or needed is Permission.READ


@attrs.frozen
class TokenClaims:
    """What a valid token says."""

    resource: str
    permission: Permission
    expires_at: float


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)):
        raise InvalidArgumentError(f"the secret must be bytes, not {type(secret).__name__}")
    if len(secret) < SECRET_LENGTH_MIN_BYTES:
        raise InvalidArgumentError(f"the secret must be at least {SECRET_LENGTH_MIN_BYTES} bytes long")
    return bytes(secret)


def _check_resource(resource: str) -> str:
    if not isinstance(resource, str) or not resource:
        raise InvalidArgumentError(f"a resource is a non-empty str, not {resource!r}")
    if resource != "*" and (resource.count("/") > 1 or resource.startswith("/") or resource.endswith("/")
                            or ("*" in resource and not resource.endswith("/*"))):
        raise InvalidArgumentError(f"a resource is 'scope/stream', 'scope/*' or '*', not {resource!r}")
    return resource


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, signed: str) -> str:
    return _b64encode(hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest())


def issue_token(secret: bytes, resource: str, permission: Permission | str, expires_at: float) -> str:
    """A token granting ``permission`` on ``resource`` until ``expires_at`` (seconds since the Unix
    epoch).  Raises ``InvalidArgumentError`` for a short secret, a malformed resource, an unknown
    permission or an expiry that is not a finite number."""
    secret = _check_secret(secret)
    resource = _check_resource(resource)
    try:
        permission = Permission(permission)
    except ValueError:
        raise InvalidArgumentError(f"permission must be READ or READ_UPDATE, not {permission!r}") from None
    if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
        raise InvalidArgumentError(f"expires_at must be a finite number of seconds, not {expires_at!r}")
    claims = json.dumps({"r": resource, "p": permission.value, "e": expires_at}, separators=(",", ":"),
                        sort_keys=True)
    signed = _PREFIX + _b64encode(claims.encode())
    return f"{signed}.{_sign(secret, signed)}"


def _decode(secret: bytes, token: str) -> TokenClaims:
    """The claims of a well-formed, authentic token (expiry not checked)."""
    if not isinstance(token, str) or not token:
        raise AuthenticationError("no token was given")
    if len(token) > TOKEN_LENGTH_BYTES_MAX:
        raise AuthenticationError(f"the token is longer than {TOKEN_LENGTH_BYTES_MAX} characters")
    if not token.startswith(_PREFIX) or token.count(".") != 2:
        raise AuthenticationError("the token is malformed (not an ms1 token)")
    signed, _, signature = token.rpartition(".")
    try:
        expected = _sign(secret, signed)
    except UnicodeEncodeError:
        raise AuthenticationError("the token is malformed (not ASCII)") from None
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace")):
        raise AuthenticationError("the token's signature is not valid (forged, or issued with another secret)")
    try:
        fields = json.loads(_b64decode(signed[len(_PREFIX):]))
        claims = TokenClaims(_check_resource(fields["r"]), Permission(fields["p"]), float(fields["e"]))
    except (ValueError, KeyError, TypeError, binascii.Error, InvalidArgumentError) as error:
        # Authentic yet unreadable: issued by a newer or broken issuer.  Refuse all the same.
        raise AuthenticationError(f"the token's claims are malformed: {error}") from None
    return claims


def resource_of(segment: str) -> str:
    """The stream resource a segment belongs to: its name's first two ``/``-separated components
    (the whole name if it has fewer)."""
    parts = segment.split("/", 2)
    return segment if len(parts) < 2 else f"{parts[0]}/{parts[1]}"


def resource_covers(granted: str, resource: str) -> bool:
    """Whether a token for ``granted`` covers ``resource`` (``"*"`` covers all, ``"scope/*"`` the
    scope itself and every stream and reader group of it, anything else only itself)."""
    if granted in ("*", resource):
        return True
    if not granted.endswith("/*"):
        return False
    scope = granted[:-2]
    return resource == scope or (resource.startswith(granted[:-1]) and "/" not in resource[len(granted) - 1:])


def reader_group_resource(scope: str, group: str) -> str:
    """The resource of reader group ``scope/group``: its state segment's (``scope/_RG<group>``)."""
    return resource_of(reader_group_state_segment_name(scope, group))


def verify(secret: bytes, token: str, *, resource: str, permission: Permission, now: float) -> TokenClaims:
    """Check that ``token`` was issued with ``secret``, has not expired at ``now`` (seconds since the
    Unix epoch) and grants ``permission`` on ``resource``; return its claims.  Raises
    ``AuthenticationError`` saying why not."""
    claims = _decode(_check_secret(secret), token)
    if not now < claims.expires_at:
        raise AuthenticationError(f"the token expired at {claims.expires_at:.0f} (it is now {now:.0f})")
    if not resource_covers(claims.resource, resource):
        raise AuthenticationError(f"the token is for {claims.resource!r}, not {resource!r}")
    if not claims.permission.grants(permission):
        raise AuthenticationError(f"the token grants {claims.permission.value}, not {permission.value}")
    return claims


class SegmentOperation(enum.Enum):
    """What a segment-store request does to a segment it names (a merge names two: the target is
    ``MERGE_INTO``, the source ``MERGE_FROM``).  Its ``value`` reads as "a client may not <value> it"."""

    READ = "read"  # ReadSegment, GetSegmentInfo, GetSegmentAttribute
    CREATE = "create"  # CreateSegment
    CREATE_TRANSIENT = "create a transient segment of"  # CreateTransientSegment: names the parent
    APPEND = "append to"  # SetupAppend: every append, plain or conditional, goes through one
    UPDATE_ATTRIBUTE = "update an attribute of"
    SEAL = "seal"
    TRUNCATE = "truncate"
    DELETE = "delete"
    MERGE_INTO = "merge into"
    MERGE_FROM = "merge away"

    @property
    def permission(self) -> Permission:
        """The permission a token needs for it: READ to read, READ_UPDATE for everything else."""
        return Permission.READ if self is SegmentOperation.READ else Permission.READ_UPDATE


_Op = SegmentOperation

#: What a client may do to each kind of segment (``naming.segment_kind``), with any token.  The node
#: itself is not a client: its controller works on the store in process and is never checked here.
CLIENT_OPERATIONS: Final[Mapping[SegmentKind, frozenset[SegmentOperation]]] = {
    SegmentKind.USER: frozenset(SegmentOperation),
    # The transaction's writers append to it; the controller creates it, commits it (a merge it
    # orders with the stream's other transactions) and aborts it (a delete).
    SegmentKind.TRANSACTION: frozenset({_Op.READ, _Op.APPEND}),
    # The large-event writer made it by CreateTransientSegment (naming the parent); it appends,
    # merges it into the parent or a sibling (the header segment) and deletes it to abort.
    SegmentKind.TRANSIENT: frozenset({_Op.READ, _Op.APPEND, _Op.MERGE_INTO, _Op.MERGE_FROM, _Op.DELETE}),
    # The group's state synchronizers append (conditionally) and truncate below a full state; the
    # controller creates and deletes it with the group.
    SegmentKind.READER_GROUP_STATE: frozenset({_Op.READ, _Op.APPEND, _Op.TRUNCATE}),
    # The controller's metadata and whatever else the node keeps: readable (with a token that
    # covers it), never changed by a client.
    SegmentKind.RESERVED: frozenset({_Op.READ}),
}

_WHO_WRITES: Final[Mapping[SegmentKind, str]] = {
    SegmentKind.USER: "",
    SegmentKind.TRANSACTION: "its transaction's writers append to it; the controller commits or aborts it",
    SegmentKind.TRANSIENT: "its large-event writer appends to it, merges it or deletes it",
    SegmentKind.READER_GROUP_STATE: "the group's readers append to it and truncate it; the controller creates "
                                    "and deletes it with the group",
    SegmentKind.RESERVED: "scopes starting with '_' and names 'scope/_...' are millstream's own",
}

#: Error messages quote at most this many characters of a name (a name may be long and hostile).
_NAME_QUOTED_MAX: Final = 200


@functools.lru_cache(maxsize=65_536)  # (asked on every request, and a reader asks about one segment often)
def _limited_to(segment: str) -> frozenset[SegmentOperation] | None:
    """What a client may do to ``segment``: None for a user's segment (everything), else the
    operations its kind allows."""
    kind = segment_kind(segment)
    return None if kind is SegmentKind.USER else CLIENT_OPERATIONS[kind]


def check_client_operation(segment: str, operation: SegmentOperation) -> None:
    """Return if a client may ``operation`` ``segment`` at all (``CLIENT_OPERATIONS``); else raise
    ``ReservedSegmentError`` (``TransientSegmentError`` for a transient segment) saying who may.
    Tokens do not enter into it: the same answer holds with authentication on or off."""
    allowed = _limited_to(segment)
    if allowed is None or operation in allowed:
        return
    kind = segment_kind(segment)
    quoted = repr(segment[:_NAME_QUOTED_MAX]) + ("..." if len(segment) > _NAME_QUOTED_MAX else "")
    message = f"{quoted} is {kind.value}: a client may not {operation.value} it ({_WHO_WRITES[kind]})"
    raise (TransientSegmentError if kind is SegmentKind.TRANSIENT else ReservedSegmentError)(message)


class Authorizer:
    """The server's side: checks a request's token for a segment, or lets everything through when no
    secret is configured.  ``now`` is the wall clock (seconds since the Unix epoch), injected."""

    def __init__(self, secret: bytes | None, *, now: Callable[[], float] = time.time) -> None:
        self._secret = None if secret is None else _check_secret(secret)
        self._now = now
        #: The cluster's peer token (``trust_peer_token``): None outside a cluster.
        self._peer_token: bytes | None = None

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def check(self, token: str, segment: str, permission: Permission) -> None:
        """Return if ``token`` grants ``permission`` on ``segment``'s stream (always, when disabled);
        else raise ``AuthenticationError``."""
        if self._secret is None:
            return
        verify(self._secret, token, resource=resource_of(segment), permission=permission, now=self._now())

    def check_authentic(self, token: str) -> None:
        """Return if ``token`` was issued with the secret and has not expired, whatever it grants
        (always, when disabled); else raise ``AuthenticationError``.  For answers any client may have
        but a stranger may not: where a cluster's controller runs."""
        if self._secret is None:
            return
        claims = _decode(self._secret, token)
        verify(self._secret, token, resource=claims.resource, permission=claims.permission, now=self._now())

    def trust_peer_token(self, token: str) -> None:
        """Let a request carrying ``token`` -- the secret a cluster's nodes share through ZooKeeper
        (``cluster._node``) -- do anything a node may: its controller creates, merges and deletes the
        segments clients may not (transaction segments, reader groups' state, ...) in other nodes'
        containers.  At least 32 characters (``InvalidArgumentError``)."""
        if not isinstance(token, str) or len(token) < PEER_TOKEN_LENGTH_MIN:
            raise InvalidArgumentError(f"a peer token is a str of at least {PEER_TOKEN_LENGTH_MIN} characters")
        self._peer_token = token.encode()

    def authorize(self, token: str, segment: str, operation: SegmentOperation) -> None:
        """Return if a client holding ``token`` may ``operation`` ``segment``: the segment's kind
        allows it (``check_client_operation``, whatever the token, also when disabled) and the token
        grants the operation's permission (``check``) -- or the token is the cluster's peer token
        (``trust_peer_token``).  Raises ``ReservedSegmentError`` / ``TransientSegmentError``, then
        ``AuthenticationError``."""
        if self._peer_token is not None and hmac.compare_digest(token.encode("utf-8", "replace"), self._peer_token):
            return
        check_client_operation(segment, operation)
        if self._secret is not None:
            self.check(token, segment, operation.permission)


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The secret in file ``path`` (surrounding whitespace, such as a final newline, removed).
    Raises ``InvalidArgumentError`` if it cannot be read or is shorter than
    ``SECRET_LENGTH_MIN_BYTES``."""
    try:
        with open(path, "rb") as file:
            secret = file.read(limits.SECRET_FILE_BYTES_MAX + 1).strip()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read the secret file: {error}") from None
    if len(secret) > limits.SECRET_FILE_BYTES_MAX:
        raise InvalidArgumentError(f"the secret file {os.fspath(path)!r} is over {limits.SECRET_FILE_BYTES_MAX} "
                                   "bytes: is it the right file?")
    if len(secret) < SECRET_LENGTH_MIN_BYTES:
        raise InvalidArgumentError(f"the secret in {os.fspath(path)!r} must be at least {SECRET_LENGTH_MIN_BYTES} "
                                   f"bytes long (it has {len(secret)})")
    return secret


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` keeps a server private to this machine (a loopback address or
    ``localhost``; an empty host or ``0.0.0.0`` binds every interface; other names are not resolved
    and count as public)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warnings(host: str, *, auth: bool, tls: bool) -> list[str]:
    """What an operator should hear about a node bound to ``host`` with authentication and TLS on
    or off: nothing on loopback; else a warning for each of auth off (anyone who reaches the port
    can read, write and delete everything) and TLS off (tokens and data cross the network in clear)."""
    if is_loopback_host(host):
        return []
    where = host or "every interface"
    warnings = []
    if not auth:
        warnings.append(f"listening on {where} (not loopback) with authentication OFF: anyone who can reach the "
                        "port can read, write and delete every stream; give --auth-secret-file (Python: auth_secret=; "
                        "see `millstream token issue --help`)")
    if not tls:
        warnings.append(f"listening on {where} (not loopback) without TLS: tokens and data cross the network in "
                        "clear; give --tls-cert and --tls-key (Python: ssl_context=)")
    return warnings
