"""Reserved segments (issue 19, finding 3): no client creates, writes, truncates, seals, merges or
deletes the node's own segments or a stream's internal ones -- whatever its token, with
authentication on or off -- and what clients legitimately do to internal segments (a transaction's
writer appends; a reader group's synchronizer appends and truncates) still needs the right token.

Every wire command that names a segment is tried on every reserved name with every kind of token (none,
read-only, a scope token on another scope, forged, expired, and the all-powerful ``*`` one) against a
real node (``millstream.standalone``); then the node still works and restarts cleanly.  Tokens expire
at fixed instants far from now (2001, 2096), so no result depends on the clock or the machine's speed;
``test_expiry_follows_the_injected_clock`` moves an injected clock across a token's expiry.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import millstream
from millstream import limits
from millstream.auth import Permission, issue_token
from millstream.cli import main
from millstream.client import ScalingPolicy, StreamConfig
from millstream.controller import METADATA_SEGMENT
from millstream.errors import ReservedSegmentError, TransientSegmentError
from millstream.model.types import NULL_ATTRIBUTE_VALUE
from millstream.wire import (
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
    CreateSegment,
    CreateTransientSegment,
    DeleteSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetSegmentInfo,
    MergeSegments,
    ReadSegment,
    SealSegment,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, run, serving

SECRET = b"reserved-names-test-secret-0123"
VALID_UNTIL = 4_000_000_000.0  # 2096
EXPIRED_AT = 1_000_000_000.0  # 2001
READ, UPDATE = Permission.READ, Permission.READ_UPDATE

ADMIN = issue_token(SECRET, "*", UPDATE, VALID_UNTIL)
#: Every kind of token a request may carry, and what it is.
TOKENS: dict[str, str] = {
    "no token": "",
    "read-only": issue_token(SECRET, "*", READ, VALID_UNTIL),
    "scope token on another scope": issue_token(SECRET, "other/*", UPDATE, VALID_UNTIL),
    "forged": issue_token(b"not-the-node-secret-at-all!", "*", UPDATE, VALID_UNTIL),
    "expired": issue_token(SECRET, "*", UPDATE, EXPIRED_AT),
    "all-powerful": ADMIN,
}
SCOPE_TOKEN = issue_token(SECRET, "iot/*", UPDATE, VALID_UNTIL)

USER_SOURCE, USER_TARGET = "iot/raw/source", "iot/raw/target"

#: Each wire command that names a segment, as (segment, token, request id) -> command.
COMMANDS: dict[str, Callable[[str, str, int], Command]] = {
    "create": lambda s, t, r: CreateSegment(r, s, t),
    "append": lambda s, t, r: SetupAppend(r, uuid.uuid4(), s, t),
    "seal": lambda s, t, r: SealSegment(r, s, t),
    "truncate": lambda s, t, r: TruncateSegment(r, s, 0, t),
    "delete": lambda s, t, r: DeleteSegment(r, s, t),
    "merge into": lambda s, t, r: MergeSegments(r, s, USER_SOURCE, t),
    "merge away": lambda s, t, r: MergeSegments(r, USER_TARGET, s, t),
    "update attribute": lambda s, t, r: UpdateSegmentAttribute(r, s, 5, 1, NULL_ATTRIBUTE_VALUE, t),
    "create transient": lambda s, t, r: CreateTransientSegment(r, uuid.uuid4(), s, t),
    "read": lambda s, t, r: ReadSegment(r, s, 0, 100, t, 0),
    "info": lambda s, t, r: GetSegmentInfo(r, s, t),
    "attribute": lambda s, t, r: GetSegmentAttribute(r, s, 5, t),
}
CHANGES = frozenset(COMMANDS) - {"read", "info", "attribute"}
RESERVED_CODE = error_code_of(ReservedSegmentError())
TRANSIENT_CODE = error_code_of(TransientSegmentError())


class Setup:
    """What the node holds before the tables run: a scope, a stream, a reader group, an open stream
    transaction and two raw segments, made with the all-powerful token (or none, auth off)."""

    def __init__(self, node: millstream.StandaloneNode, token: str) -> None:
        with millstream.connect(node.uri, token=token) as client:
            client.stream_manager().create_scope("iot")
            client.stream_manager().create_stream("iot/s", StreamConfig(scaling=ScalingPolicy.fixed(1)))
            with client.event_writer("iot/s", millstream.StringSerializer()) as writer:
                writer.write_event("before", routing_key="k")
            client.reader_group("iot/g", ["iot/s"]).close()
            info = client.run(client.async_client.controller().get_reader_group("iot", "g"))
            self.group_state = info.state_segment
            # (The longest lease: the transaction stays open however slowly the tables run.)
            transaction = client.run(client.async_client.controller().create_transaction(
                "iot", "s", limits.TRANSACTION_LEASE_SECONDS_MAX))
            (self.transaction,) = (s.name for s in transaction.transaction_segments)
            for name in (USER_SOURCE, USER_TARGET):
                client.segments().create(name)
            self.lengths = {name: client.segments().info(name).length
                            for name in (METADATA_SEGMENT, self.group_state, self.transaction)}

    def reserved(self) -> dict[str, frozenset[str]]:
        """Each reserved or internal name and the commands that change it which a client may still send."""
        return {
            METADATA_SEGMENT: frozenset(),  # the controller's metadata: only the node writes it
            "_system/anything": frozenset(),  # the whole system scope
            "_private": frozenset(),  # any scope starting with '_'
            "iot/_internal": frozenset(),  # any name 'scope/_...' but a group's state
            f"{METADATA_SEGMENT}#transient.00": frozenset(),  # hidden segments of reserved ones
            self.group_state: frozenset({"append", "truncate"}),  # its synchronizers; the controller makes it
            self.transaction: frozenset({"append"}),  # its writers; the controller commits or aborts it
        }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[millstream.StandaloneNode, Setup]]:
    with millstream.standalone(tmp_path_factory.mktemp("secured"), auth_secret=SECRET) as node:
        yield node, Setup(node, ADMIN)


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[millstream.StandaloneNode, Setup]]:
    with millstream.standalone(tmp_path_factory.mktemp("open")) as node:
        yield node, Setup(node, "")


def refused_as_reserved(reply: Command) -> bool:
    return isinstance(reply, ErrorMessage) and reply.error_code == RESERVED_CODE


async def table(port: int, setup: Setup, tokens: dict[str, str], source_changers: set[str]) -> list[str]:
    """Every command that changes a segment, on every reserved name, with every token: each one a
    client may not send must be refused as reserved.  Returns what went wrong, one line per case.
    ``source_changers``: the tokens that may change the (user's) source of a merge."""
    client = await RawClient.connect(port)
    wrong: list[str] = []
    request_id = 0
    try:
        for name, allowed in setup.reserved().items():
            for operation in sorted(CHANGES - allowed):
                for what, token in tokens.items():
                    request_id += 1
                    reply = await client.request(COMMANDS[operation](name, token, request_id))
                    # A merge checks its source (a user's segment) first: a token that cannot
                    # change that one is refused for it before the target is looked at.
                    token_first = operation == "merge into" and what not in source_changers \
                        and isinstance(reply, AuthTokenCheckFailed)
                    if not (refused_as_reserved(reply) or token_first):
                        wrong.append(f"{operation} {name!r} with {what}: {reply!r}")
    finally:
        await client.close()
    return wrong


def check_untouched(node: millstream.StandaloneNode, setup: Setup, token: str) -> None:
    """The reserved segments hold what they held, the ones that did not exist still do not, and the
    controller still works (it reads and writes its metadata)."""
    with millstream.connect(node.uri, token=token) as client:
        segments = client.segments()
        for name, length in setup.lengths.items():
            assert segments.info(name).length == length, name
        for name in ("_system/anything", "_private", "iot/_internal", f"{METADATA_SEGMENT}#transient.00"):
            with pytest.raises(millstream.errors.StreamSegmentNotExistsError):
                segments.info(name)
        manager = client.stream_manager()
        scope = f"after-{uuid.uuid4().hex[:8]}"
        manager.create_scope(scope)
        assert scope in manager.list_scopes()


def test_reserved_segments_refuse_every_change_with_every_token(secured: tuple[millstream.StandaloneNode,
                                                                                  Setup]) -> None:
    node, setup = secured
    wrong = asyncio.run(table(node.port, setup, TOKENS, {"all-powerful"}))
    assert not wrong, "\n".join(wrong)
    check_untouched(node, setup, ADMIN)


def test_reserved_segments_refuse_every_change_with_auth_off(open_node: tuple[millstream.StandaloneNode,
                                                                              Setup]) -> None:
    node, setup = open_node
    tokens = {"no token (auth off)": "", "a token (ignored)": ADMIN}
    wrong = asyncio.run(table(node.port, setup, tokens, set(tokens)))
    assert not wrong, "\n".join(wrong)
    check_untouched(node, setup, "")


def test_what_clients_do_to_internal_segments_needs_the_right_token(secured: tuple[millstream.StandaloneNode,
                                                                                    Setup]) -> None:
    """A transaction's writer appends to its segment; a group's synchronizer appends to and truncates
    its state; anyone reads them -- each with a token that grants it, and only so."""
    node, setup = secured
    cases = [("append", setup.transaction), ("append", setup.group_state), ("truncate", setup.group_state),
             ("read", setup.transaction), ("info", setup.group_state), ("attribute", METADATA_SEGMENT),
             ("read", METADATA_SEGMENT)]
    read_only = {"read", "info", "attribute"}
    success = {"append": AppendSetup, "truncate": SegmentTruncated, "read": SegmentRead, "info": SegmentInfo,
               "attribute": SegmentAttribute}

    async def scenario() -> list[str]:
        client = await RawClient.connect(node.port)
        wrong = []
        for request_id, (operation, name) in enumerate(cases):
            for what, token in [*TOKENS.items(), ("scope token", SCOPE_TOKEN)]:
                reply = await client.request(COMMANDS[operation](name, token, request_id))
                covers = what == "all-powerful" or (what == "read-only" and operation in read_only) \
                    or (what == "scope token" and name.startswith("iot/"))
                expected = success[operation] if covers else AuthTokenCheckFailed
                if not isinstance(reply, expected):
                    wrong.append(f"{operation} {name!r} with {what}: {reply!r}, not {expected.__name__}")
        await client.close()
        return wrong
    wrong = asyncio.run(scenario())
    assert not wrong, "\n".join(wrong)


def test_every_segment_command_on_a_users_segment_with_every_token(
        secured: tuple[millstream.StandaloneNode, Setup]) -> None:
    """Every command on a user's segment: refused with no token, a forged or expired one or one for
    another scope; reads allowed to a read-only token, changes refused to it; everything allowed to a
    token for the scope and to the all-powerful one."""
    node, _ = secured
    success: dict[str, type[Command]] = {
        "create": SegmentCreated, "append": AppendSetup, "seal": SegmentSealed, "truncate": SegmentTruncated,
        "delete": SegmentDeleted, "merge into": SegmentsMerged, "merge away": SegmentsMerged,
        "update attribute": SegmentAttributeUpdated, "create transient": SegmentCreated, "read": SegmentRead,
        "info": SegmentInfo, "attribute": SegmentAttribute}
    assert set(success) == set(COMMANDS)
    tokens = {**TOKENS, "scope token": SCOPE_TOKEN}

    async def scenario() -> list[str]:
        client = await RawClient.connect(node.port)
        wrong = []
        request_id = 0
        for operation, make in COMMANDS.items():
            for what, token in tokens.items():
                request_id += 1
                name = f"iot/user/{request_id}"
                merge_source = f"iot/user/{request_id}-source"
                if operation != "create":
                    assert isinstance(await client.request(CreateSegment(0, name, ADMIN)), SegmentCreated)
                command = make(name, token, request_id)
                if operation == "merge into":  # a source of its own: the shared one merges once
                    await client.request(CreateSegment(0, merge_source, ADMIN))
                    command = MergeSegments(request_id, name, merge_source, token)
                if operation == "merge away":
                    command = MergeSegments(request_id, USER_TARGET, name, token)
                reply = await client.request(command)
                allowed = what in ("all-powerful", "scope token") or (what == "read-only"
                                                                       and operation not in CHANGES)
                expected = success[operation] if allowed else AuthTokenCheckFailed
                if not isinstance(reply, expected):
                    wrong.append(f"{operation} with {what}: {reply!r}, not {expected.__name__}")
        await client.close()
        return wrong
    wrong = asyncio.run(scenario())
    assert not wrong, "\n".join(wrong)


def test_expiry_follows_the_injected_clock(tmp_path: Path) -> None:
    """A token is accepted until its expiry on the server's (injected) wall clock and refused from
    then on; a reserved segment is refused either way."""
    now = 1_700_000_000.0
    clock = [now]
    token = issue_token(SECRET, "*", UPDATE, now + 60)

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), auth_secret=SECRET, wall_clock=lambda: clock[0]) as server:
            client = await RawClient.connect(server.port)
            assert isinstance(await client.request(CreateSegment(1, "sc/st/0", token)), SegmentCreated)
            assert refused_as_reserved(await client.request(CreateSegment(2, "_system/x", token)))
            clock[0] = now + 60
            reply = await client.request(CreateSegment(3, "sc/st/1", token))
            assert isinstance(reply, AuthTokenCheckFailed) and "expired" in reply.reason
            assert refused_as_reserved(await client.request(CreateSegment(4, "_system/x", token)))
            await client.close()
    run(scenario)


def invoke(uri: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_writing_the_controllers_metadata_from_the_shell_is_refused_and_the_node_restarts(tmp_path: Path) -> None:
    """The issue's reproduction: `echo x | millstream write --segment _system/_controller/metadata`
    was accepted; the next `scope create` failed with DataCorruptionError and the node would not
    start again.  Now the write is refused with a typed error, and nothing of it remains."""
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "iot")[0] == 0
        length = int(invoke(uri, "segment", "info", METADATA_SEGMENT, "--json")[1].split('"length": ')[1].split(",")[0])
        code, _, err = invoke(uri, "write", "--segment", METADATA_SEGMENT, stdin="x\n")
        assert code == 1, err
        assert err.startswith("Error: ReservedSegmentError: '_system/_controller/metadata' is a segment reserved") \
            and "Traceback" not in err, err
        for command in (["segment", "create", "_system/other"], ["segment", "seal", METADATA_SEGMENT],
                        ["segment", "truncate", METADATA_SEGMENT, "0"], ["segment", "delete", METADATA_SEGMENT]):
            code, _, err = invoke(uri, *command)
            assert code == 1 and err.startswith("Error: ReservedSegmentError: "), (command, err)
        assert invoke(uri, "scope", "create", "web") == (0, "created web\n", "")
        after = int(invoke(uri, "segment", "info", METADATA_SEGMENT, "--json")[1].split('"length": ')[1].split(",")[0])
        assert after > length
    with millstream.standalone(tmp_path) as node:  # the node starts again on the same directory
        assert invoke(node.uri, "scope", "list")[1] == "iot\nweb\n"
