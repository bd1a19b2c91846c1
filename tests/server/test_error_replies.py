"""One two-way table between errors and replies (``wire.error_codes``), read by the server to
answer a failed request and by the client to raise what a reply reports: every error the server
answers with arrives at the client as the same class, and every failure reply the client knows is
one the table pairs with an error."""

from __future__ import annotations

import logging
import types
import uuid

import attrs
import pytest

from millstream import errors
from millstream.client._replies import ERROR_REPLIES as CLIENT_ERROR_REPLIES
from millstream.client._replies import error_of_reply as client_error_of_reply
from millstream.server._connection import Connection
from millstream.wire.commands import ErrorMessage
from millstream.wire.error_codes import (
    ERROR_CODES,
    ERROR_REPLIES,
    error_code_of,
    error_from_code,
    error_of_reply,
    reply_of_error,
)

_SEGMENT = "scope/stream/0.#epoch.0"


class _Container:
    """What ``_error_reply`` asks of a container: a segment's info."""

    def get_info(self, segment: str) -> object:
        return types.SimpleNamespace(length=70, start_offset=30)


def _server_reply(error: BaseException) -> object:
    """The reply the server's connection answers a request that failed with ``error`` with."""
    connection = types.SimpleNamespace(
        _safe_container=lambda segment, container: container, peer="test",
        _server=types.SimpleNamespace(log=logging.getLogger("test")))
    return Connection._error_reply(connection, 5, _SEGMENT, error, _Container())  # type: ignore[arg-type]


def test_the_client_knows_every_failure_reply_of_the_table() -> None:
    assert {entry.reply for entry in ERROR_REPLIES} | {ErrorMessage} == CLIENT_ERROR_REPLIES
    assert client_error_of_reply is error_of_reply


@pytest.mark.parametrize("entry", [e for e in ERROR_REPLIES if e.to_reply is not None],
                         ids=lambda e: e.error.__name__)
def test_a_failure_with_a_reply_of_its_own_arrives_as_its_class(entry: object) -> None:
    error = entry.error("refused")  # type: ignore[attr-defined]
    assert reply_of_error(error) is entry
    reply = _server_reply(error)
    assert type(reply) is entry.reply  # type: ignore[attr-defined]
    assert reply.request_id == 5  # type: ignore[attr-defined]
    back = error_of_reply(reply)  # type: ignore[arg-type]
    assert type(back) is entry.error  # type: ignore[attr-defined]
    if entry.position is not None:  # type: ignore[attr-defined]
        assert str({"length": 70, "start_offset": 30}[entry.position]) in str(back)  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", ERROR_REPLIES, ids=lambda e: e.reply.__name__)
def test_every_failure_reply_becomes_the_error_the_table_names(entry: object) -> None:
    fields = {"request_id": 5, "segment": _SEGMENT, "offset": 70, "start_offset": 30, "correct_host": "",
              "writer_id": uuid.UUID(int=3), "event_number": 9, "reason": "expired",
              "operation": "Nothing"}
    reply_type = entry.reply  # type: ignore[attr-defined]
    reply = reply_type(**{f.name: fields[f.name] for f in attrs.fields(reply_type)})
    assert type(error_of_reply(reply)) is entry.error  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_other_failure_arrives_by_its_code_as_its_class(code: int) -> None:
    cls = ERROR_CODES[code]
    error = cls("refused")
    if reply_of_error(error) is not None:
        return  # (travels as its own reply: the test above)
    reply = _server_reply(error)
    assert reply == ErrorMessage(5, _SEGMENT, code, "refused")
    assert type(error_of_reply(reply)) is cls  # type: ignore[arg-type]
    assert type(error_from_code(error_code_of(error), "refused")) is cls


def test_a_subclass_travels_as_its_nearest_coded_class() -> None:
    reply = _server_reply(errors.EventBoundaryError("not on a boundary"))
    assert reply == ErrorMessage(5, _SEGMENT, error_code_of(errors.BadOffsetError()), "not on a boundary")
    assert type(error_of_reply(_server_reply(errors.StreamSegmentMergedError("merged")))) \
        is errors.StreamSegmentNotExistsError
