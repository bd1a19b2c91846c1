"""millstream.auth: tokens are signed, expire by an injected clock, and grant exactly what they name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.auth import (
    CLIENT_OPERATIONS,
    Authorizer,
    Permission,
    SegmentOperation,
    TokenClaims,
    check_client_operation,
    exposure_warnings,
    is_loopback_host,
    issue_token,
    read_secret_file,
    resource_covers,
    resource_of,
    verify,
)
from millstream.errors import AuthenticationError, InvalidArgumentError, ReservedSegmentError, TransientSegmentError
from millstream.naming import SegmentKind, segment_kind

SECRET = b"0123456789abcdef-secret"
OTHER_SECRET = b"fedcba9876543210-secret"


def test_a_token_verifies_and_says_what_it_grants() -> None:
    token = issue_token(SECRET, "iot/sensors", Permission.READ_UPDATE, 1000.0)
    assert token.startswith("ms1.") and all(c.isalnum() or c in "-_." for c in token), "URL-safe"
    claims = verify(SECRET, token, resource="iot/sensors", permission=Permission.READ, now=999.0)
    assert claims == TokenClaims("iot/sensors", Permission.READ_UPDATE, 1000.0)


@pytest.mark.parametrize(("granted", "resource", "covered"), [
    ("*", "a/b", True), ("a/*", "a/b", True), ("a/*", "ab/c", False), ("a/b", "a/b", True),
    ("a/b", "a/c", False), ("solo", "solo", True),
    # A scope token covers the scope itself (listing its streams and groups) and its reader groups'
    # state (``a/_RG<group>``); a stream's token covers neither.
    ("a/*", "a", True), ("a/*", "ab", False), ("a/b", "a", False), ("a/*", "a/_RGg", True),
    ("a/b", "a/_RGg", False), ("*", "_system/_controller", True), ("a/*", "_system/_controller", False),
])
def test_resources(granted: str, resource: str, covered: bool) -> None:
    assert resource_covers(granted, resource) is covered


def test_the_resource_of_a_segment_is_its_stream() -> None:
    assert resource_of("iot/sensors/3.#epoch.0") == "iot/sensors"
    assert resource_of("iot/sensors/3.#epoch.0#transaction.00ff") == "iot/sensors"
    assert resource_of("iot/sensors") == "iot/sensors"
    assert resource_of("plain") == "plain"


@pytest.mark.parametrize(("token_args", "resource", "permission", "now", "reason"), [
    (("a/b", "READ", 100.0), "a/b", Permission.READ_UPDATE, 0.0, "grants READ"),
    (("a/b", "READ_UPDATE", 100.0), "a/c", Permission.READ, 0.0, "not 'a/c'"),
    (("a/b", "READ_UPDATE", 100.0), "a/b", Permission.READ, 100.0, "expired"),
    (("a/*", "READ", 100.0), "b/c", Permission.READ, 0.0, "not 'b/c'"),
])
def test_refusals_say_why(token_args: tuple[str, str, float], resource: str, permission: Permission,
                          now: float, reason: str) -> None:
    token = issue_token(SECRET, *token_args)
    with pytest.raises(AuthenticationError, match=reason):
        verify(SECRET, token, resource=resource, permission=permission, now=now)


def test_forged_and_malformed_tokens_are_refused() -> None:
    token = issue_token(SECRET, "a/b", Permission.READ, 100.0)
    with pytest.raises(AuthenticationError, match="signature"):
        verify(OTHER_SECRET, token, resource="a/b", permission=Permission.READ, now=0.0)
    # Widen the claims, keep the signature: refused.
    prefix, _payload, signature = token.split(".")
    forged_payload = issue_token(SECRET, "*", Permission.READ_UPDATE, 1e12).split(".")[1]
    with pytest.raises(AuthenticationError, match="signature"):
        verify(SECRET, f"{prefix}.{forged_payload}.{signature}", resource="a/b", permission=Permission.READ, now=0.0)
    for bad in ("", "garbage", "ms1.x", "ms1.a.b.c", "ms1." + "é" * 10 + ".x", "x" * 5000):
        with pytest.raises(AuthenticationError):
            verify(SECRET, bad, resource="a/b", permission=Permission.READ, now=0.0)


@given(st.text(max_size=300))
def test_arbitrary_strings_never_raise_anything_but_authentication_error(text: str) -> None:
    with pytest.raises(AuthenticationError):
        verify(SECRET, text, resource="a/b", permission=Permission.READ, now=0.0)


def test_bad_arguments_are_refused_when_issuing() -> None:
    with pytest.raises(InvalidArgumentError):
        issue_token(b"short", "a/b", Permission.READ, 1.0)
    for resource in ("", "a/b/c", "/a", "a*", "*/b"):
        with pytest.raises(InvalidArgumentError):
            issue_token(SECRET, resource, Permission.READ, 1.0)
    with pytest.raises(InvalidArgumentError):
        issue_token(SECRET, "a/b", "WRITE", 1.0)
    with pytest.raises(InvalidArgumentError):
        issue_token(SECRET, "a/b", Permission.READ, float("inf"))


def test_the_authorizer_uses_its_injected_clock_and_is_open_without_a_secret() -> None:
    now = [50.0]
    authorizer = Authorizer(SECRET, now=lambda: now[0])
    token = issue_token(SECRET, "a/*", Permission.READ_UPDATE, 100.0)
    authorizer.check(token, "a/b/0.#epoch.0", Permission.READ_UPDATE)
    now[0] = 100.0
    with pytest.raises(AuthenticationError, match="expired"):
        authorizer.check(token, "a/b/0.#epoch.0", Permission.READ_UPDATE)
    Authorizer(None).check("", "anything", Permission.READ_UPDATE)  # authentication off: no error
    assert not Authorizer(None).enabled and authorizer.enabled


# --- Reserved segments: what a client may do to each kind, whatever its token --------------------------

TRANSACTION = "a/b/0.#epoch.0#transaction.00112233445566778899aabbccddeeff"
TRANSIENT = "a/b/0.#epoch.0#transient.beef"


@pytest.mark.parametrize(("name", "kind"), [
    ("a/b/0.#epoch.0", SegmentKind.USER), ("demo/events/0", SegmentKind.USER), ("solo", SegmentKind.USER),
    (TRANSACTION, SegmentKind.TRANSACTION), (TRANSIENT, SegmentKind.TRANSIENT),
    ("a/_RGgroup", SegmentKind.READER_GROUP_STATE), ("_system/_readergroups/a.group", SegmentKind.READER_GROUP_STATE),
    ("_system/_controller/metadata", SegmentKind.RESERVED), ("_system", SegmentKind.RESERVED),
    ("_other/x", SegmentKind.RESERVED), ("a/_x", SegmentKind.RESERVED), ("a/_RGgroup/more", SegmentKind.RESERVED),
    ("/_system/x", SegmentKind.RESERVED), ("_system/_readergroups/a.g/x", SegmentKind.RESERVED),
    ("a/_RGg#transient.1", SegmentKind.RESERVED), ("_system/_controller/metadata#transaction.1", SegmentKind.RESERVED),
    ("a/b#transaction.1#transient.2", SegmentKind.RESERVED),
])
def test_segment_kinds(name: str, kind: SegmentKind) -> None:
    assert segment_kind(name) is kind


def test_what_a_client_may_do_to_each_kind() -> None:
    op = SegmentOperation
    assert {
        SegmentKind.USER: frozenset(op),
        SegmentKind.TRANSACTION: {op.READ, op.APPEND},
        SegmentKind.TRANSIENT: {op.READ, op.APPEND, op.MERGE_INTO, op.MERGE_FROM, op.DELETE},
        SegmentKind.READER_GROUP_STATE: {op.READ, op.APPEND, op.TRUNCATE},
        SegmentKind.RESERVED: {op.READ},
    } == CLIENT_OPERATIONS
    assert [o for o in op if o.permission is Permission.READ] == [op.READ]
    check_client_operation("_system/_controller/metadata", op.READ)
    with pytest.raises(ReservedSegmentError, match=r"'_system/_controller/metadata' is a segment reserved .* "
                                                   r"may not append to it"):
        check_client_operation("_system/_controller/metadata", op.APPEND)
    with pytest.raises(ReservedSegmentError, match="the controller commits or aborts it"):
        check_client_operation(TRANSACTION, op.MERGE_FROM)
    with pytest.raises(TransientSegmentError, match="may not seal it"):
        check_client_operation(TRANSIENT, op.SEAL)
    with pytest.raises(ReservedSegmentError) as refused:
        check_client_operation("_" + "x" * 100_000, op.CREATE)
    assert len(str(refused.value)) < 400, "a long name is quoted by a prefix only"


def test_the_authorizer_refuses_reserved_segments_whatever_the_token_and_with_authentication_off() -> None:
    admin = issue_token(SECRET, "*", Permission.READ_UPDATE, 100.0)
    for authorizer, token in ((Authorizer(SECRET, now=lambda: 50.0), admin), (Authorizer(None), "")):
        authorizer.authorize(token, "a/_RGg", SegmentOperation.TRUNCATE)
        with pytest.raises(ReservedSegmentError):
            authorizer.authorize(token, "_system/_controller/metadata", SegmentOperation.DELETE)
    with pytest.raises(AuthenticationError):  # (a token that does not cover a segment still fails)
        Authorizer(SECRET, now=lambda: 50.0).authorize("", "a/_RGg", SegmentOperation.READ)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("", False), ("::", False), ("10.0.0.5", False), ("example.com", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_exposure_warnings_name_what_is_off_beyond_loopback() -> None:
    assert exposure_warnings("127.0.0.1", auth=False, tls=False) == []
    assert exposure_warnings("0.0.0.0", auth=True, tls=True) == []
    auth_off, tls_off = exposure_warnings("0.0.0.0", auth=False, tls=False)
    assert "authentication OFF" in auth_off and "--auth-secret-file" in auth_off
    assert "without TLS" in tls_off and "--tls-cert" in tls_off
    assert len(exposure_warnings("", auth=True, tls=False)) == 1


def test_secret_files(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    assert read_secret_file(path) == SECRET, "the final newline is not part of the secret"
    path.write_bytes(b"short\n")
    with pytest.raises(InvalidArgumentError, match="at least 16 bytes"):
        read_secret_file(path)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        read_secret_file(tmp_path / "missing")
