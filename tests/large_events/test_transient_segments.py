"""Transient segments in the segment store: created for a parent in its container, raw chunks guarded by
their offset, what they refuse, and when the store deletes them (abort, a writer gone past its grace
period, idleness, after a restart) -- over TCP with the raw test client, on files and on simulated
tiers, and the pure decisions of ``TransientSegments``."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from millstream.errors import TransientSegmentError
from millstream.naming import container_of, is_transient_segment, primary_segment_name
from millstream.server import ServerConfig
from millstream.server._transient import TRANSIENT_TRANSITIONS, TransientSegments, TransientState, check_merge
from millstream.wire import (
    AppendSetup,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    CreateSegment,
    CreateTransientSegment,
    DataAppended,
    DeleteSegment,
    ErrorMessage,
    GetSegmentInfo,
    MergeSegments,
    NoSuchSegment,
    ReadSegment,
    SealSegment,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentIsSealed,
    SegmentRead,
    SegmentsMerged,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
)
from millstream.wire.error_codes import error_code_of
from tests.server.raw import RawClient, Tiers, block, run, serving

PARENT = "le/s/0.#epoch.0"
TRANSIENT_CODE = error_code_of(TransientSegmentError())


async def create_transient(client: RawClient, request_id: int, writer: uuid.UUID, parent: str = PARENT) -> str:
    reply = await client.request(CreateTransientSegment(request_id, writer, parent, ""))
    assert isinstance(reply, SegmentCreated), reply
    return reply.segment


async def setup(client: RawClient, request_id: int, writer: uuid.UUID, segment: str) -> None:
    reply = await client.request(SetupAppend(request_id, writer, segment, ""))
    assert isinstance(reply, AppendSetup), reply


def refused_as_transient(reply: object) -> bool:
    return isinstance(reply, ErrorMessage) and reply.error_code == TRANSIENT_CODE


# --- Over TCP ---------------------------------------------------------------------------------------


def test_a_transient_segment_takes_raw_chunks_at_their_offsets_and_merges_into_its_parent(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            assert isinstance(await client.request(CreateSegment(1, PARENT, "")), SegmentCreated)
            writer = uuid.uuid4()
            name = await create_transient(client, 2, writer)
            # Named by the store, after its parent, in the parent's container.
            assert is_transient_segment(name) and primary_segment_name(name) == PARENT
            assert container_of(name, 4) == container_of(PARENT, 4)
            assert server.transients.get(name) is not None
            await setup(client, 3, writer, name)
            # Raw bytes, not events: a chunk is anything; its offset alone guards it.
            await client.send(ConditionalBlockEnd(writer, 1, 0, b"\x00\x01not-an-event", 3),
                              ConditionalBlockEnd(writer, 2, 14, b"second", 3))
            first, second = await client.receive_many(2)
            assert isinstance(first, DataAppended) and first.current_segment_write_offset == 14
            assert isinstance(second, DataAppended) and second.current_segment_write_offset == 20
            # The same chunk again (a resend): refused, nothing appended -- which is how a writer learns
            # that it is stored.
            assert await client.request(ConditionalBlockEnd(writer, 3, 0, b"\x00\x01not-an-event", 3)) == \
                ConditionalCheckFailed(3, writer, 3)
            # Merged, the parent gets its bytes at once.
            merged = await client.request(MergeSegments(4, PARENT, name, ""))
            assert merged == SegmentsMerged(4, PARENT, name, 20)
            read = await client.request(ReadSegment(5, PARENT, 0, 100, "", 0))
            assert isinstance(read, SegmentRead) and read.data == b"\x00\x01not-an-eventsecond"
            assert server.transients.get(name) is None and server.transients.merge_outcome(name) == (PARENT, 20)
            # A retried merge (its reply lost) is answered as the first one was.
            assert await client.request(MergeSegments(6, PARENT, name, "")) == SegmentsMerged(6, PARENT, name, 20)
            info = await client.request(GetSegmentInfo(7, name, ""))
            assert isinstance(info, SegmentInfo) and not info.exists
            await client.close()
    run(scenario)


def test_what_a_transient_segment_refuses_changes_nothing(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, PARENT, ""))
            await client.request(CreateSegment(2, "le/other/0.#epoch.0", ""))
            writer = uuid.uuid4()
            name = await create_transient(client, 3, writer)
            sibling = await create_transient(client, 4, writer)
            await setup(client, 5, writer, name)
            assert isinstance(await client.request(ConditionalBlockEnd(writer, 1, 0, b"abc", 5)), DataAppended)
            # No seal, truncation or attribute update by request.
            assert refused_as_transient(await client.request(SealSegment(6, name, "")))
            assert refused_as_transient(await client.request(TruncateSegment(7, name, 1, "")))
            assert refused_as_transient(await client.request(UpdateSegmentAttribute(8, name, 5, 1, -2**63, "")))
            # Not made by name, not for a hidden parent.
            assert refused_as_transient(await client.request(CreateSegment(9, f"{PARENT}#transient.abc", "")))
            assert refused_as_transient(await client.request(CreateTransientSegment(10, writer, name, "")))
            # Merged only into its parent or a sibling; takes merges only from a sibling.
            assert refused_as_transient(await client.request(MergeSegments(11, "le/other/0.#epoch.0", name, "")))
            assert refused_as_transient(await client.request(MergeSegments(12, name, PARENT, "")))
            # None of it changed anything: still 3 bytes, active, unsealed.
            info = await client.request(GetSegmentInfo(13, name, ""))
            assert isinstance(info, SegmentInfo) and info.exists and not info.sealed and info.length == 3
            parent = await client.request(GetSegmentInfo(14, PARENT, ""))
            assert isinstance(parent, SegmentInfo) and parent.length == 0
            # The sibling merge is allowed (the large-event writer's header segment takes the chunks).
            assert await client.request(MergeSegments(15, sibling, name, "")) == SegmentsMerged(15, sibling, name, 3)
            # No transient segment for a sealed or missing parent.
            await client.request(SealSegment(16, "le/other/0.#epoch.0", ""))
            assert isinstance(await client.request(CreateTransientSegment(17, writer, "le/other/0.#epoch.0", "")),
                              SegmentIsSealed)
            assert isinstance(await client.request(CreateTransientSegment(18, writer, "le/none/0.#epoch.0", "")),
                              NoSuchSegment)
            server.check_invariants()
            await client.close()
    run(scenario)


def test_a_transient_segment_takes_at_most_its_attribute_limit_of_writer_ids(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            server.transients.writer_ids_max = 3
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, PARENT, ""))
            owner = uuid.uuid4()
            name = await create_transient(client, 2, owner)
            for request_id in (3, 4):
                await setup(client, request_id, uuid.uuid4(), name)
            assert refused_as_transient(await client.request(SetupAppend(5, uuid.uuid4(), name, "")))
            await setup(client, 6, owner, name)  # a writer id it holds already is fine
            await client.close()
    run(scenario)


def test_the_store_deletes_a_transient_segment_on_abort_after_the_grace_period_and_when_idle(
        tiers: Tiers) -> None:
    config = ServerConfig(transient_disconnect_grace_seconds=0.3, transient_idle_seconds=1.0,
                          transient_sweep_interval_seconds=0.05)

    async def scenario() -> None:
        async with serving(tiers, config=config) as server:
            keeper = await RawClient.connect(server.port)
            await keeper.request(CreateSegment(1, PARENT, ""))
            writer = uuid.uuid4()
            # Abort: the writer deletes it.
            aborted = await create_transient(keeper, 2, writer)
            assert await keeper.request(DeleteSegment(3, aborted, "")) == SegmentDeleted(3, aborted)
            assert server.transients.get(aborted) is None and server.transients.deleted_by["abort"] == 1
            # A writer that went away: deleted once the grace period passed...
            gone = await RawClient.connect(server.port)
            abandoned = await create_transient(gone, 4, writer)
            # ...but one that reconnects within it carries on.
            back = await RawClient.connect(server.port)
            resumed = await create_transient(back, 5, writer)
            await back.close()
            await gone.close()
            again = await RawClient.connect(server.port)
            await setup(again, 6, writer, resumed)
            await asyncio.sleep(0.6)
            assert server.transients.get(abandoned) is None and server.transients.deleted_by["disconnect"] == 1
            assert server.transients.get(resumed) is not None
            assert isinstance(await again.request(ConditionalBlockEnd(writer, 1, 0, b"still here", 6)), DataAppended)
            # Idle: nobody uses it (connected or not) for the idle time.
            await asyncio.sleep(1.4)
            assert server.transients.get(resumed) is None and server.transients.deleted_by["idle"] == 1
            assert isinstance(await again.request(ConditionalBlockEnd(writer, 2, 10, b"more", 6)), NoSuchSegment)
            parent = await keeper.request(GetSegmentInfo(7, PARENT, ""))
            assert isinstance(parent, SegmentInfo) and parent.length == 0  # nothing of any of them merged
            await again.close()
            await keeper.close()
    run(scenario, 20)


def test_transient_segments_recovered_after_a_restart_are_adopted_and_expire() -> None:
    tiers = Tiers("simulated")
    config = ServerConfig(transient_disconnect_grace_seconds=0.2, transient_idle_seconds=60.0,
                          transient_sweep_interval_seconds=0.05)

    async def scenario() -> None:
        async with serving(tiers, config=config) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, PARENT, ""))
            name = await create_transient(client, 2, uuid.uuid4())
            await client.close()
        async with serving(tiers, config=ServerConfig(transient_disconnect_grace_seconds=0.2,
                                                      transient_sweep_interval_seconds=3600.0)) as restarted:
            # The new server never created it: the sweep finds it in the recovered container and starts
            # its grace period (nobody is connected to it).
            assert restarted.transients.get(name) is None
            assert await restarted.expire_transient_segments() == []
            assert restarted.transients.get(name) is not None
            await asyncio.sleep(0.25)
            assert await restarted.expire_transient_segments() == [name]
            assert name not in restarted.container_for(PARENT).segment_names()
    run(scenario)


def test_a_plain_event_block_to_a_transient_segment_is_scanned_and_raw_chunks_are_not(tiers: Tiers) -> None:
    async def scenario() -> None:
        async with serving(tiers) as server:
            client = await RawClient.connect(server.port)
            await client.request(CreateSegment(1, PARENT, ""))
            writer = uuid.uuid4()
            name = await create_transient(client, 2, writer)
            await setup(client, 3, writer, name)
            assert isinstance(await client.request(block(writer, 1, [b"framed"], request_id=3)), DataAppended)
            # A negative expected offset is bad input with a typed reply; the connection stays.
            reply = await client.request(ConditionalBlockEnd(writer, 2, -1, b"x", 3))
            assert isinstance(reply, ErrorMessage)
            assert isinstance(await client.request(GetSegmentInfo(4, name, "")), SegmentInfo)
            await client.close()
    run(scenario)


# --- The pure decisions ------------------------------------------------------------------------------


def test_lifecycle_table_matches_the_model() -> None:
    from millstream.model import large_events as model
    mine = {state.value: {t.value for t in targets.values()} for state, targets in TRANSIENT_TRANSITIONS.items()}
    theirs = {state.value: {t.value for t in targets.values()}
              for state, targets in model.TRANSIENT_TRANSITIONS.items()
              if state is not model.TransientState.NONE}
    assert mine == theirs


def test_grace_and_idle_decisions() -> None:
    segments = TransientSegments(idle_seconds=10.0, grace_seconds=2.0, capacity=3)
    writer = uuid.uuid4()
    first = segments.new_name(PARENT, writer)
    second = segments.new_name(PARENT, writer)
    assert first != second
    segments.created(first, PARENT, writer, "conn-a", now=0.0)
    segments.created(second, PARENT, writer, "conn-b", now=0.0)
    assert segments.due(1.9) == []
    segments.connection_closed("conn-a", now=1.0)
    assert segments.due(2.9) == []
    assert segments.due(3.0) == [(first, "disconnect")]
    segments.attach(first, "conn-c", writer, now=2.5)  # reconnected in time
    assert segments.due(3.0) == []
    segments.touch(second, now=5.0)
    assert segments.due(12.4) == []  # (the attach used it at 2.5)
    assert segments.due(12.5) == [(first, "idle")]
    assert segments.due(15.0) == [(first, "idle"), (second, "idle")]
    segments.merged(second, PARENT, 100)
    segments.deleted(first, "idle")
    assert len(segments) == 0 and segments.deleted_by["idle"] == 1
    assert segments.merge_outcome(second) == (PARENT, 100)
    segments.check_invariants()


def test_capacity_hidden_parents_and_merge_rules() -> None:
    segments = TransientSegments(capacity=1)
    writer = uuid.uuid4()
    name = segments.new_name(PARENT, writer)
    segments.created(name, PARENT, writer, "c", 0.0)
    with pytest.raises(TransientSegmentError, match="holds 1 transient segments"):
        segments.new_name(PARENT, writer)
    with pytest.raises(TransientSegmentError, match="hidden segment"):
        TransientSegments().new_name(name, writer)
    with pytest.raises(TransientSegmentError, match="hidden segment"):
        TransientSegments().new_name(f"{PARENT}#transaction.{uuid.uuid4().hex}", writer)
    sibling = f"{PARENT}#transient.beef"
    check_merge(PARENT, name)
    check_merge(sibling, name)
    for target, source in ((name, name), (name, PARENT), ("other/s/0.#epoch.0", name),
                           ("other/s/0.#epoch.0#transient.1", name)):
        with pytest.raises(TransientSegmentError):
            check_merge(target, source)
    assert TransientState.ACTIVE in TRANSIENT_TRANSITIONS
