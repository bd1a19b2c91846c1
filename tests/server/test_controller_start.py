"""A node opens its port before its controller has started (the controller keeps its state in the node's
own containers, which recover first).  A ``ControllerRequest`` that comes in that window waits for the
controller instead of being told the node has none (``OperationUnsupported``, a permanent error: a
benchmark and a script that started a node and at once created a scope both met it on loaded machines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from millstream import limits
from millstream.errors import ContainerUnavailableError
from millstream.wire import ControllerReply, ControllerRequest, ErrorMessage, OperationUnsupported
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, run, serving
from tests.server.test_flow import until


class _Controller:
    """A controller endpoint that answers ``echo`` with ``{}``."""

    def knows(self, method: str) -> bool:
        return method == "echo"

    async def handle(self, method: str, body: bytes) -> bytes:
        return b"{}"


def _waiting(server) -> bool:  # type: ignore[no-untyped-def]
    return any(connection.requests_in_flight for connection in server.connections)


def test_a_request_before_an_expected_controller_has_started_is_served_once_it_has(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            server.expect_controller()
            client = await RawClient.connect(server.port)
            await client.send(ControllerRequest(1, "echo", b"{}"))
            await until(lambda: _waiting(server), "the request waits for the controller")
            server.attach_controller(_Controller())
            assert await client.receive() == ControllerReply(1, b"{}")
            await client.close()
    run(scenario)


def test_a_request_waiting_for_a_controller_that_never_comes_is_refused_when_the_node_gives_up(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            server.expect_controller()
            client = await RawClient.connect(server.port)
            await client.send(ControllerRequest(1, "echo", b"{}"))
            await until(lambda: _waiting(server), "the request waits for the controller")
            server.attach_controller(None)  # (the node stopped before its controller started)
            reply = await client.receive()
            assert isinstance(reply, OperationUnsupported) and reply.request_id == 1, reply
            await client.close()
    run(scenario)


def test_a_controller_slower_than_the_bound_is_a_retryable_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "CONTROLLER_START_WAIT_SECONDS", 0.05)

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            server.expect_controller()
            client = await RawClient.connect(server.port)
            await client.send(ControllerRequest(1, "echo", b"{}"))
            reply = await client.receive()
            assert isinstance(reply, ErrorMessage) and reply.request_id == 1, reply
            assert reply.error_code == error_code_of(ContainerUnavailableError("")), reply
            await client.close()
    run(scenario)


def test_a_node_without_a_controller_expected_refuses_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path)) as server:
            client = await RawClient.connect(server.port)
            await client.send(ControllerRequest(1, "echo", b"{}"))
            reply = await client.receive()
            assert isinstance(reply, OperationUnsupported) and reply.request_id == 1, reply
            await client.close()
    run(scenario)
