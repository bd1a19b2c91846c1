"""millstream.auth: tokens are signed, expire by an injected clock, and grant exactly what they name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from millstream.auth import (
    Authorizer,
    Permission,
    TokenClaims,
    issue_token,
    resource_covers,
    resource_of,
    verify,
)
from millstream.errors import AuthenticationError, InvalidArgumentError

SECRET = b"0123456789abcdef-secret"
OTHER_SECRET = b"fedcba9876543210-secret"


def test_a_token_verifies_and_says_what_it_grants() -> None:
    token = issue_token(SECRET, "iot/sensors", Permission.READ_UPDATE, 1000.0)
    assert token.startswith("ms1.") and all(c.isalnum() or c in "-_." for c in token), "URL-safe"
    claims = verify(SECRET, token, resource="iot/sensors", permission=Permission.READ, now=999.0)
    assert claims == TokenClaims("iot/sensors", Permission.READ_UPDATE, 1000.0)


@pytest.mark.parametrize(("granted", "resource", "covered"), [
    ("*", "a/b", True), ("a/*", "a/b", True), ("a/*", "ab/c", False), ("a/b", "a/b", True),
    ("a/b", "a/c", False), ("a/*", "a", False), ("solo", "solo", True),
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
