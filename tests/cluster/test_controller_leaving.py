"""A controller request in flight when the cluster's controller leaves its node (its container moved:
the node stops the controller and closes its store) is answered ContainerUnavailable -- retryable,
outcome unknown -- not ObjectClosed, which told the application its own client was closed.  The
cluster fault campaign (tests/faults/test_cluster_campaign.py) met it as a transaction's begin failing
with ObjectClosedError('the client is closed')."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from millstream.client._controller import LOCATE_CONTROLLER
from millstream.cluster._node import ClusterControllerEndpoint
from millstream.errors import ContainerUnavailableError, ObjectClosedError


class LeavingRpc:
    """A controller RPC whose store is closed under the request; ``leave`` says whether the
    controller left the node meanwhile (the endpoint's ``rpc`` cleared, as ``_leaving`` does)."""

    def __init__(self, endpoint: ClusterControllerEndpoint, *, leave: bool) -> None:
        self.endpoint = endpoint
        self.leave = leave

    async def handle(self, method: str, body: bytes) -> bytes:
        if self.leave:
            self.endpoint.rpc = None
        raise ObjectClosedError("the client is closed")


def endpoint() -> ClusterControllerEndpoint:
    node: Any = SimpleNamespace(host_id="node-1")
    return ClusterControllerEndpoint(node, None)


def test_a_request_the_controller_left_under_is_answered_container_unavailable() -> None:
    served = endpoint()
    rpc: Any = LeavingRpc(served, leave=True)
    served.rpc = rpc
    with pytest.raises(ContainerUnavailableError, match="left node-1 during create_transaction") as caught:
        asyncio.run(served.handle("create_transaction", b"{}"))
    assert isinstance(caught.value.__cause__, ObjectClosedError)


def test_an_object_closed_while_the_controller_stays_is_raised_as_it_is() -> None:
    served = endpoint()
    rpc: Any = LeavingRpc(served, leave=False)
    served.rpc = rpc
    with pytest.raises(ObjectClosedError):
        asyncio.run(served.handle("create_transaction", b"{}"))


def test_a_node_that_is_not_a_running_member_answers_where_the_controller_runs_retryably() -> None:
    """A node leaving the cluster was asked ``locate_controller`` by a client following the controller
    to its next node, and answered ObjectClosed ("the node is not a running member"): the client took it
    as final and gave up.  It is ContainerUnavailable now (retryable: ask another node)."""
    async def controller_uri() -> str:
        raise ObjectClosedError("the node is not a running member of the cluster")
    node: Any = SimpleNamespace(host_id="node-1", controller_uri=controller_uri)
    served = ClusterControllerEndpoint(node, None)
    with pytest.raises(ContainerUnavailableError, match="node-1 is not a running member") as caught:
        asyncio.run(served.handle(LOCATE_CONTROLLER, b"{}"))
    assert isinstance(caught.value.__cause__, ObjectClosedError)
