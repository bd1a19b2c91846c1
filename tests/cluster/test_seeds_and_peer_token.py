"""The small parts of issue 23's controller placement that need no cluster: a client's seed list, and
the peer token that lets a cluster's controller do in other nodes' containers what clients may not."""

from __future__ import annotations

import asyncio
import socket
from uuid import UUID

import pytest

from millstream import limits
from millstream.auth import PEER_TOKEN_LENGTH_MIN, Authorizer, Permission, SegmentOperation, issue_token
from millstream.client import AsyncClient, ClientConfig
from millstream.client._client import parse_seeds
from millstream.client._config import Endpoint
from millstream.errors import AuthenticationError, ConnectFailedError, InvalidArgumentError, ReservedSegmentError
from millstream.naming import stream_segment_name, transaction_segment_name

SECRET = b"s" * 32
NOW = 1_000_000.0


def test_seeds_are_comma_separated_uris_in_order_without_repeats() -> None:
    assert parse_seeds("tcp://127.0.0.1:9090") == (Endpoint("127.0.0.1", 9090),)
    assert parse_seeds("tcp://a:1, tcp://b:2,tcp://a:1") == (Endpoint("a", 1), Endpoint("b", 2))
    for bad in ("", "tcp://a:1,", "tcp://a:1,b:2", "tcp://a:1,tls://b:2",
                ",".join(f"tcp://h{index}:1" for index in range(limits.CLIENT_SEEDS_MAX + 1))):
        with pytest.raises(InvalidArgumentError):
            parse_seeds(bad)
    with pytest.raises(InvalidArgumentError):
        parse_seeds(b"tcp://a:1")  # type: ignore[arg-type]  # (the check under test)


def test_a_client_given_several_seeds_looks_for_the_controller_in_a_cluster() -> None:
    single = AsyncClient("tcp://127.0.0.1:1")
    several = AsyncClient("tcp://127.0.0.1:1,tcp://127.0.0.1:2")
    # (Nothing connects until an operation needs a server.)
    assert not single.controller().in_cluster and several.controller().in_cluster
    assert several.endpoint == single.endpoint == Endpoint("127.0.0.1", 1)


def test_the_peer_token_lets_a_node_do_what_clients_may_not() -> None:
    transaction = transaction_segment_name(stream_segment_name("shop", "orders", 0), UUID(int=1))
    for secret in (None, SECRET):
        authorizer = Authorizer(secret, now=lambda: NOW)
        with pytest.raises(ReservedSegmentError):
            authorizer.authorize("", transaction, SegmentOperation.CREATE)
        peer = "p" * PEER_TOKEN_LENGTH_MIN
        authorizer.trust_peer_token(peer)
        authorizer.authorize(peer, transaction, SegmentOperation.CREATE)
        authorizer.authorize(peer, transaction, SegmentOperation.MERGE_FROM)
        with pytest.raises(ReservedSegmentError):  # any other token: the rule holds
            authorizer.authorize("p" * (PEER_TOKEN_LENGTH_MIN - 1) + "q", transaction, SegmentOperation.CREATE)
    with pytest.raises(InvalidArgumentError):
        Authorizer(None).trust_peer_token("too short")


def test_where_the_controller_runs_is_told_to_holders_of_any_authentic_token() -> None:
    authorizer = Authorizer(SECRET, now=lambda: NOW)
    authorizer.check_authentic(issue_token(SECRET, "shop/orders", Permission.READ, NOW + 60))
    for refused in ("", issue_token(b"x" * 32, "*", Permission.READ_UPDATE, NOW + 60),
                    issue_token(SECRET, "*", Permission.READ_UPDATE, NOW - 1)):
        with pytest.raises(AuthenticationError):
            authorizer.check_authentic(refused)
    Authorizer(None).check_authentic("")  # (authentication off: everyone may know)


def test_seeds_that_are_all_wrong_fail_at_once_naming_them() -> None:
    async def scenario() -> None:
        config = ClientConfig(initial_connect_budget_seconds=0.05, reconnect_delay_initial_seconds=0.01,
                              reconnect_delay_max_seconds=0.01)
        async with AsyncClient(f"tcp://127.0.0.1:{_refused_port()},tcp://127.0.0.1:{_refused_port()}",
                               config=config) as client:
            with pytest.raises(ConnectFailedError, match="no seed could be reached"):
                await client.stream_manager().list_scopes()
    asyncio.run(scenario())


def _refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed: refused until someone takes it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
