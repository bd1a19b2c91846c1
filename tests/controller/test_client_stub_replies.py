"""The client's controller stub (``ControllerClient``) and a controller that answers garbage.

A reply that does not describe what the method answers is the controller's fault -- the peer's
(DESIGN.md §9) -- so it raises ``ProtocolError`` (a ``PeerError``), never the caller's
``InvalidArgumentError`` or a bare ``KeyError``/``ValueError`` from decoding."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import pytest

from millstream.client import StreamCut
from millstream.client._controller import ControllerClient
from millstream.errors import CallerError, PeerError, ProtocolError


class _Canned(ControllerClient):
    """A stub whose every call gets ``reply`` back, as if the controller had sent it."""

    def __init__(self, reply: dict[str, Any]) -> None:  # (no pool: nothing is sent)
        self._reply = reply

    async def call(self, method: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self._reply


_TXN = UUID(int=1)
_CUT = StreamCut("s/t", {0: 0})

#: method -> how a test calls it.
_CALLS = {
    "list_scopes": lambda c: c.list_scopes(),
    "get_stream": lambda c: c.get_stream("s", "t"),
    "list_streams": lambda c: c.list_streams("s"),
    "get_current_segments": lambda c: c.get_current_segments("s", "t"),
    "get_successors": lambda c: c.get_successors("s", "t", 0),
    "scale_stream": lambda c: c.scale_stream("s", "t", [0], [(0.0, 1.0)]),
    "get_head_cut": lambda c: c.get_head_cut("s", "t"),
    "get_tail_cut": lambda c: c.get_tail_cut("s", "t"),
    "get_cut_at": lambda c: c.get_cut_at("s", "t", 1.0),
    "get_segments_between": lambda c: c.get_segments_between("s", "t", None, _CUT),
    "get_reader_group": lambda c: c.get_reader_group("s", "g"),
    "create_reader_group": lambda c: c.create_reader_group("s", "g", _group_config()),
    "update_reader_group": lambda c: c.update_reader_group("s", "g", _group_config()),
    "list_reader_groups": lambda c: c.list_reader_groups("s"),
    "get_segment_uri": lambda c: c.get_segment_uri("s/t/0.#epoch.0"),
    "create_transaction": lambda c: c.create_transaction("s", "t"),
    "get_transaction": lambda c: c.get_transaction("s", "t", _TXN),
    "ping_transaction": lambda c: c.ping_transaction("s", "t", _TXN),
    "commit_transaction": lambda c: c.commit_transaction("s", "t", _TXN),
    "abort_transaction": lambda c: c.abort_transaction("s", "t", _TXN),
    "list_transactions": lambda c: c.list_transactions("s", "t"),
    "commit_transactions": lambda c: c.commit_transactions("s", "t", [_TXN]),
    "get_fence": lambda c: c.get_fence("s", "t", "key"),
}


def _group_config() -> Any:
    from millstream.client import ReaderGroupConfig
    return ReaderGroupConfig(["s/t"])


#: Replies that are JSON objects but not what any method answers: a missing field, a field of the
#: wrong type, a value no decoder accepts.
_GARBAGE: list[dict[str, Any]] = [
    {},
    {"config": "x", "sealed": "x", "epoch": "x", "segments": "x", "cut": {"x": 1}, "scopes": 7, "streams": 7,
     "groups": 7, "successors": [{"id": -1}], "state_segment": 1, "generation": "x", "uri": 1, "status": "x",
     "deadline": "x", "transactions": [{"txn": "not hex"}], "outcome": "x", "value": "x", "epoch_x": 0},
]


@pytest.mark.parametrize("garbage", range(len(_GARBAGE)))
@pytest.mark.parametrize("method", sorted(_CALLS))
def test_a_reply_that_describes_nothing_is_the_peers_fault(method: str, garbage: int) -> None:
    client = _Canned(_GARBAGE[garbage])
    try:
        asyncio.run(_CALLS[method](client))
    except ProtocolError as error:
        assert isinstance(error, PeerError) and not isinstance(error, CallerError)
    except Exception as error:
        pytest.fail(f"{method} raised {type(error).__name__}: {error} for a malformed reply")
    # (Some garbage decodes: str(1) is a uri, list("x")... -- a leaked error is what this test is for.)


def test_a_well_formed_reply_still_decodes() -> None:
    client = _Canned({"cut": {"0": 5}, "status": "committing", "value": None})
    assert asyncio.run(client.get_head_cut("s", "t")) == StreamCut("s/t", {0: 5})
    assert asyncio.run(client.get_fence("s", "t", "key")) is None
    assert asyncio.run(client.commit_transaction("s", "t", _TXN)).value == "committing"
