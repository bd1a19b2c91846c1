"""Every controller method with every kind of token, against a real node with auth on: refused with no
token, a forged one, an expired one and a scope token on another scope; a read-only token passes
exactly the methods that only read; a scope token covers its scope's methods but not listing scopes.

The bodies are well-formed (a malformed body is refused before the token is looked at), so a reply
other than ``AuthTokenCheckFailed`` means the token passed, whatever the method then answered.
Nothing here passes a token to a method that changes anything, so the node holds only its setup.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import millstream
from millstream.auth import Permission, issue_token
from millstream.client import ReaderGroupConfig, ScalingPolicy, StreamConfig
from millstream.controller import METHODS
from millstream.wire import AuthTokenCheckFailed, ControllerRequest
from tests.server.raw import RawClient

SECRET = b"controller-auth-test-secret-012"
VALID_UNTIL = 4_000_000_000.0  # 2096
EXPIRED_AT = 1_000_000_000.0  # 2001
READ, UPDATE = Permission.READ, Permission.READ_UPDATE
ALL = issue_token(SECRET, "*", UPDATE, VALID_UNTIL)

REFUSED: dict[str, str] = {
    "no token": "",
    "forged": issue_token(b"not-the-node-secret-at-all!", "*", UPDATE, VALID_UNTIL),
    "expired": issue_token(SECRET, "*", UPDATE, EXPIRED_AT),
    "scope token on another scope": issue_token(SECRET, "web/*", UPDATE, VALID_UNTIL),
    "token for another stream of the scope": issue_token(SECRET, "iot/other", UPDATE, VALID_UNTIL),
}
READ_ONLY: dict[str, str] = {
    "read-only": issue_token(SECRET, "*", READ, VALID_UNTIL),
    "read-only scope token": issue_token(SECRET, "iot/*", READ, VALID_UNTIL),
}

_STREAM = {"scope": "iot", "stream": "s"}
_GROUP = {"scope": "iot", "group": "g"}
_TXN = uuid.UUID(int=1).hex
_CUT = {"0": 0}
_STREAM_CONFIG = StreamConfig(scaling=ScalingPolicy.fixed(1)).to_json_object()
_GROUP_CONFIG = ReaderGroupConfig(["iot/s"]).to_json_object()

#: A well-formed body for every controller method.
BODIES: dict[str, dict[str, Any]] = {
    "create_scope": {"scope": "iot"},
    "delete_scope": {"scope": "iot"},
    "list_scopes": {},
    "create_stream": {**_STREAM, "config": _STREAM_CONFIG},
    "update_stream": {**_STREAM, "config": _STREAM_CONFIG},
    "get_stream": _STREAM,
    "list_streams": {"scope": "iot"},
    "seal_stream": _STREAM,
    "delete_stream": _STREAM,
    "get_current_segments": _STREAM,
    "get_successors": {**_STREAM, "segment_id": 0},
    "scale_stream": {**_STREAM, "seal": [0], "new_ranges": [[0.0, 0.5], [0.5, 1.0]]},
    "get_head_cut": _STREAM,
    "get_tail_cut": _STREAM,
    "get_cut_at": {**_STREAM, "time": 0.0},
    "truncate_stream": {**_STREAM, "cut": _CUT},
    "check_stream_cut": {**_STREAM, "cut": _CUT},
    "get_segments_between": {**_STREAM, "from_cut": None, "to_cut": None},
    "create_reader_group": {**_GROUP, "config": _GROUP_CONFIG},
    "get_reader_group": _GROUP,
    "update_reader_group": {**_GROUP, "config": _GROUP_CONFIG},
    "delete_reader_group": _GROUP,
    "list_reader_groups": {"scope": "iot"},
    "update_subscriber_cut": {**_GROUP, "stream": "iot/s", "cut": _CUT},
    "get_segment_uri": {"segment": "iot/s/0.#epoch.0"},
    "create_transaction": _STREAM,
    "ping_transaction": {**_STREAM, "txn": _TXN},
    "commit_transaction": {**_STREAM, "txn": _TXN},
    "abort_transaction": {**_STREAM, "txn": _TXN},
    "get_transaction": {**_STREAM, "txn": _TXN},
    "list_transactions": _STREAM,
    "commit_transactions": {**_STREAM, "txns": [_TXN]},
    "get_fence": {**_STREAM, "key": "k"},
}
#: The methods that only read (the rest change something).
QUERIES = frozenset({"list_scopes", "get_stream", "list_streams", "get_current_segments", "get_successors",
                     "get_head_cut", "get_tail_cut", "get_cut_at", "check_stream_cut", "get_segments_between",
                     "get_reader_group", "list_reader_groups", "get_segment_uri", "get_transaction",
                     "list_transactions", "get_fence"})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[millstream.StandaloneNode]:
    with millstream.standalone(tmp_path_factory.mktemp("data"), auth_secret=SECRET) as started:
        with millstream.connect(started.uri, token=ALL) as client:
            client.stream_manager().create_scope("iot")
            client.stream_manager().create_stream("iot/s", StreamConfig(scaling=ScalingPolicy.fixed(1)))
            client.reader_group("iot/g", ["iot/s"]).close()
        yield started


def test_every_method_is_in_the_table() -> None:
    assert set(BODIES) == set(METHODS), "a new controller method needs its row here"
    assert {m for m, spec in METHODS.items() if spec.permission is READ} == QUERIES


async def replies(port: int, token: str, methods: list[str]) -> dict[str, object]:
    client = await RawClient.connect(port)
    answered = {}
    for request_id, method in enumerate(methods):
        body = json.dumps({**BODIES[method], "token": token}).encode()
        answered[method] = await client.request(ControllerRequest(request_id, method, body))
    await client.close()
    return answered


def test_refused_tokens_are_refused_by_every_method_and_read_only_ones_by_every_change(
        node: millstream.StandaloneNode) -> None:
    wrong = []
    for what, token in REFUSED.items():
        for method, reply in asyncio.run(replies(node.port, token, sorted(BODIES))).items():
            if not isinstance(reply, AuthTokenCheckFailed):
                wrong.append(f"{method} with {what}: {reply!r}")
    for what, token in READ_ONLY.items():
        for method, reply in asyncio.run(replies(node.port, token, sorted(BODIES))).items():
            passes = method in QUERIES and not (what == "read-only scope token" and method == "list_scopes")
            if isinstance(reply, AuthTokenCheckFailed) == passes:
                wrong.append(f"{method} with {what}: {reply!r} ({'should pass' if passes else 'should be refused'})")
    assert not wrong, "\n".join(wrong)
    with millstream.connect(node.uri, token=ALL) as client:  # nothing changed
        manager = client.stream_manager()
        assert manager.list_scopes() == ["iot"] and manager.list_streams("iot") == ["s"]
        assert client.run(client.async_client.controller().list_reader_groups("iot")) == ["g"]


def test_a_group_needs_read_on_every_stream_it_reads(node: millstream.StandaloneNode) -> None:
    """With a scope token, a group over another scope's stream is refused before it is created."""
    scope_token = issue_token(SECRET, "iot/*", UPDATE, VALID_UNTIL)
    config = ReaderGroupConfig(["iot/s", "web/s"]).to_json_object()

    async def scenario() -> tuple[object, object]:
        client = await RawClient.connect(node.port)
        created = await client.request(ControllerRequest(1, "create_reader_group", json.dumps(
            {"scope": "iot", "group": "two", "config": config, "token": scope_token}).encode()))
        updated = await client.request(ControllerRequest(2, "update_reader_group", json.dumps(
            {"scope": "iot", "group": "g", "config": config, "token": scope_token}).encode()))
        await client.close()
        return created, updated
    created, updated = asyncio.run(scenario())
    assert isinstance(created, AuthTokenCheckFailed) and "not 'web/s'" in created.reason
    assert isinstance(updated, AuthTokenCheckFailed) and "not 'web/s'" in updated.reason
    with millstream.connect(node.uri, token=ALL) as client:
        assert client.run(client.async_client.controller().list_reader_groups("iot")) == ["g"]
