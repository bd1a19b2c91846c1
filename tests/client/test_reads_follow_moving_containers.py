"""Reads follow a container that moves (issue 23's cluster fault campaign found a reader group failing):
``AsyncSegments.read_following_moves``, which event readers use, retries a read answered
``WrongHost`` or ``ContainerUnavailable`` (a cluster node stopping the container, its new owner still
recovering it) within the reconnect budget, instead of raising into the application."""

from __future__ import annotations

import random

import attrs
import pytest

from millstream.errors import ContainerUnavailableError, ReconnectBudgetExceededError
from millstream.wire.commands import Command, ErrorMessage, ReadSegment, WrongHost
from millstream.wire.error_codes import error_code_of
from tests.client.fake_server import FakeServer, Faults
from tests.client.helpers import client, run


def moving(replies: list[Command]) -> Faults:
    """Answer the first reads with ``replies`` (in order), then serve them."""
    def answer(command: Command) -> Command | None:
        if isinstance(command, ReadSegment) and replies:
            return attrs.evolve(replies.pop(0), request_id=command.request_id)
        return None
    return Faults(error_reply=answer)


def test_a_read_answered_wrong_host_then_container_unavailable_is_retried_until_served() -> None:
    replies: list[Command] = [WrongHost(0, "s", ""), ErrorMessage(0, "s", error_code_of(ContainerUnavailableError()),
                                                                  "container 3 stopped"),
                              WrongHost(0, "s", "")]

    async def scenario() -> None:
        async with FakeServer(faults=moving(replies)) as server, client(server.uri) as c:
            await c.segments().create("s")
            await c.segments().conditional_append("s", [b"one"], expected_offset=0)
            result = await c.segments().read_following_moves("s", 0)
            assert replies == [], "every scripted answer was given"
            assert result.offset == 0 and result.data.endswith(b"one")
    run(scenario)


def test_a_container_that_never_comes_back_ends_in_the_reconnect_budget() -> None:
    unavailable = ErrorMessage(0, "s", error_code_of(ContainerUnavailableError()), "container 0 stopped")

    async def scenario() -> None:
        async with FakeServer(faults=moving([unavailable] * 1000)) as server, client(server.uri) as c:
            await c.segments().create("s")
            with pytest.raises(ReconnectBudgetExceededError) as caught:
                await c.segments().read_following_moves("s", 0)
            assert isinstance(caught.value.__cause__, ContainerUnavailableError)
    run(scenario)


def test_a_plain_read_still_raises_the_typed_error_at_once() -> None:
    async def scenario() -> None:
        replies: list[Command] = [ErrorMessage(0, "s", error_code_of(ContainerUnavailableError()), "stopped")]
        async with FakeServer(faults=moving(replies)) as server, client(server.uri) as c:
            await c.segments().create("s")
            with pytest.raises(ContainerUnavailableError):
                await c.segments().read("s", 0)
    run(scenario)


def test_a_state_synchronizer_waits_out_its_container_moving() -> None:
    """A reader group's state segment on a container that moves: its reads, its set-up for conditional
    appends and a conditional append are answered WrongHost or ContainerUnavailable (unknown outcome:
    the synchronizer reads on and finds its record absent), and the update still lands, once."""
    from millstream.client._state_synchronizer import NewState, StateSynchronizer
    from millstream.wire.commands import ConditionalAppend, SetupAppend
    from tests.readers.test_synchronizer import ListCodec

    unavailable = ErrorMessage(0, "g", error_code_of(ContainerUnavailableError()), "container 0 stopped")
    script: dict[type[Command], list[Command]] = {
        ReadSegment: [unavailable, WrongHost(0, "g", "")],
        SetupAppend: [WrongHost(0, "g", "")],
        ConditionalAppend: [unavailable],
    }

    def answer(command: Command) -> Command | None:
        replies = script.get(type(command))
        if replies:
            return attrs.evolve(replies.pop(0), request_id=command.request_id)
        return None

    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await c.segments().create("g")
            server.faults.error_reply = answer
            synchronizer: StateSynchronizer[tuple[int, ...], int] = StateSynchronizer(
                c.segments(), "g", ListCodec(), rng=random.Random(1))
            assert await synchronizer.update(lambda state: NewState(()) if state is None else None)
            assert await synchronizer.update(lambda state: [7])
            assert all(not replies for replies in script.values()), script
            await synchronizer.fetch_updates()
            assert synchronizer.state == (7,)
    run(scenario)
