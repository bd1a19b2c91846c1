"""Bad input to a running container: each fails with its own typed error, and nothing else happens.

For every case in the tables below, against a container on the simulated log with segments in
every state: the call raises exactly the expected class from ``millstream.errors``; arguments that
are malformed are refused before anything is queued (no ``Submit`` in the trace), requests that are
invalid in the state they meet are refused by the OperationProcessor (``Process`` reports the same
error) and nothing reaches the log; the container keeps running (a valid append afterwards lands
where it should); and every segment's acknowledged bytes, length, start offset, seal and attributes
are unchanged -- in memory and after recovery from the log.

The lifecycle cases are generated from the model's table (``millstream.model.segment.REFUSALS``),
so the container and the model agree on which error each (segment state, operation) pair raises.
"""

from __future__ import annotations

import array
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from millstream import limits
from millstream.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerUnavailableError,
    InvalidArgumentError,
    MillstreamError,
    PayloadTooLargeError,
    StreamSegmentMergedError,
    StreamSegmentNotExistsError,
    StreamSegmentNotSealedError,
    StreamSegmentTruncatedError,
)
from millstream.model.segment import REFUSALS, Role
from millstream.model.types import (
    ATTRIBUTE_ID_MAX,
    INT64_MAX,
    INT64_MIN,
    AttributeUpdate,
    AttributeUpdateType,
    SegmentStatus,
)
from millstream.segmentstore.container import ContainerState, SegmentContainer
from millstream.testing.simulated_log import SimulatedDurableDataLog, SimulatedLogStorage
from millstream.testing.tracing import TraceRecorder

SCENARIO_TIMEOUT_SECONDS = 10.0
CALL_TIMEOUT_SECONDS = 5.0
ATTRIBUTE = 7

#: A segment in each state the lifecycle table names (None: never created).
NAME_BY_STATUS: dict[SegmentStatus | None, str] = {
    None: "missing",
    SegmentStatus.ACTIVE: "active",
    SegmentStatus.SEALED: "sealed",
    SegmentStatus.MERGED: "merged",
    SegmentStatus.DELETED: "deleted",
}
#: Segments that exist after the set-up, and what they hold.
LIVE = ("active", "sealed", "target", "truncated", "truncated-sealed", "spare-sealed")


def replace(attribute_id: Any = ATTRIBUTE, value: Any = 1, comparison: Any = INT64_MIN,
            kind: Any = AttributeUpdateType.REPLACE) -> AttributeUpdate:
    return AttributeUpdate(attribute_id, kind, value, comparison)


async def set_up(container: SegmentContainer) -> None:
    """One segment in every state, with data and an attribute where it can hold them."""
    await container.create_segment("active", [replace(value=10)])
    await container.append("active", b"hello ")
    await container.append("active", b"world", [replace(value=11)])
    for name in ("sealed", "merged", "deleted", "target", "truncated", "truncated-sealed", "spare-sealed"):
        await container.create_segment(name)
        await container.append(name, f"<{name} data>".encode())
    await container.seal("sealed")
    await container.seal("merged")
    await container.merge("target", "merged")
    await container.delete("deleted")
    await container.truncate("truncated", 4)
    await container.truncate("truncated-sealed", 3)
    await container.seal("truncated-sealed")
    await container.seal("spare-sealed")


@attrs.frozen
class Observed:
    """Everything a client can see of the container's segments."""

    infos: dict[str, Any]  # name -> SegmentInfo, or the error class get_info raised
    contents: dict[str, bytes]  # live name -> its readable bytes

    @classmethod
    async def of(cls, container: SegmentContainer) -> Observed:
        infos: dict[str, Any] = {}
        contents: dict[str, bytes] = {}
        for name in (*LIVE, "missing", "merged", "deleted"):
            try:
                info = container.get_info(name)
            except MillstreamError as error:
                infos[name] = type(error)
                continue
            infos[name] = info
            result = await container.read(name, info.start_offset, info.length)
            contents[name] = result.data
        return cls(infos, contents)


@attrs.frozen
class Case:
    """A bad call: ``call(container)`` returns an awaitable or raises; it must raise ``error``.
    ``stage``: "argument" (refused before queueing), "state" (refused by the OperationProcessor),
    or "read" (a read: nothing is queued either way)."""

    id: str
    call: Callable[[SegmentContainer], Awaitable[Any] | Any]
    error: type[MillstreamError]
    stage: str


# --- The lifecycle table: (segment state, operation) pairs the model rejects ------------------------

CALL_BY_ROLE: dict[Role, Callable[[str], Callable[[SegmentContainer], Awaitable[Any]]]] = {
    Role.CREATE: lambda name: lambda c: c.create_segment(name),
    Role.APPEND: lambda name: lambda c: c.append(name, b"data"),
    Role.SEAL: lambda name: lambda c: c.seal(name),
    Role.TRUNCATE: lambda name: lambda c: c.truncate(name, 0),
    Role.DELETE: lambda name: lambda c: c.delete(name),
    Role.UPDATE_ATTRIBUTES: lambda name: lambda c: c.update_attributes(name, [replace(value=99)]),
    # A valid source, so that the target alone decides.
    Role.MERGE_TARGET: lambda name: lambda c: c.merge(name, "spare-sealed"),
    # A valid target, so that the source alone decides.
    Role.MERGE_SOURCE: lambda name: lambda c: c.merge("active", name),
}

LIFECYCLE_CASES = [
    Case(f"{role.value}-on-{NAME_BY_STATUS[status]}", CALL_BY_ROLE[role](NAME_BY_STATUS[status]), outcome, "state")
    for status, refusals in REFUSALS.items() for role, outcome in refusals.items()
]

# --- Offsets, attributes, sizes and argument types ----------------------------------------------------

TOO_MANY_UPDATES = [replace(attribute_id=i) for i in range(limits.ATTRIBUTE_UPDATES_PER_OPERATION_MAX + 1)]

OTHER_CASES = [
    # Truncation outside [start offset, length]; merges the model's table does not cover.
    Case("truncate-beyond-length", lambda c: c.truncate("active", 12), BadOffsetError, "state"),
    Case("truncate-below-start", lambda c: c.truncate("truncated", 3), BadOffsetError, "state"),
    Case("truncate-sealed-beyond-length", lambda c: c.truncate("sealed", 100), BadOffsetError, "state"),
    Case("truncate-negative", lambda c: c.truncate("active", -1), InvalidArgumentError, "argument"),
    Case("truncate-not-int", lambda c: c.truncate("active", 1.0), InvalidArgumentError, "argument"),
    Case("merge-unsealed-source", lambda c: c.merge("target", "active"), StreamSegmentNotSealedError, "state"),
    Case("merge-truncated-source", lambda c: c.merge("active", "truncated-sealed"), StreamSegmentTruncatedError,
         "state"),
    Case("merge-into-itself", lambda c: c.merge("active", "active"), StreamSegmentNotSealedError, "state"),
    # Conditional appends and attribute conditions: the data must not land.
    Case("append-at-wrong-offset", lambda c: c.append("active", b"x", expected_offset=10), BadOffsetError, "state"),
    Case("append-beyond-length", lambda c: c.append("active", b"x", expected_offset=12), BadOffsetError, "state"),
    Case("append-negative-offset", lambda c: c.append("active", b"x", expected_offset=-1), InvalidArgumentError,
         "argument"),
    Case("append-bool-offset", lambda c: c.append("active", b"x", expected_offset=True), InvalidArgumentError,
         "argument"),
    Case("append-attributes-not-a-sequence", lambda c: c.append("active", b"x", 0), InvalidArgumentError,
         "argument"),
    Case("append-compare-and-set-fails",
         lambda c: c.append("active", b"must not land", [replace(value=12, comparison=10,
                                                                 kind=AttributeUpdateType.REPLACE_IF_EQUALS)]),
         BadAttributeUpdateError, "state"),
    Case("append-second-update-fails",  # all or nothing: the first update must not land either
         lambda c: c.append("active", b"x", [replace(attribute_id=8, value=5),
                                             replace(value=1, kind=AttributeUpdateType.NONE)]),
         BadAttributeUpdateError, "state"),
    Case("update-compare-and-set-fails",
         lambda c: c.update_attributes("active", [replace(value=12, comparison=0,
                                                          kind=AttributeUpdateType.REPLACE_IF_EQUALS)]),
         BadAttributeUpdateError, "state"),
    Case("update-not-greater",
         lambda c: c.update_attributes("active", [replace(value=11, kind=AttributeUpdateType.REPLACE_IF_GREATER)]),
         BadAttributeUpdateError, "state"),
    Case("update-accumulate-overflows",
         lambda c: c.update_attributes("active", [replace(value=INT64_MAX, kind=AttributeUpdateType.ACCUMULATE)]),
         BadAttributeUpdateError, "state"),
    Case("create-with-conflicting-updates",
         lambda c: c.create_segment("fresh", [replace(value=1), replace(value=2, kind=AttributeUpdateType.NONE)]),
         BadAttributeUpdateError, "state"),
    # Attribute updates out of range, of the wrong type, or too many.
    Case("attribute-id-negative", lambda c: c.update_attributes("active", [replace(attribute_id=-1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-id-too-large",
         lambda c: c.update_attributes("active", [replace(attribute_id=ATTRIBUTE_ID_MAX + 1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-id-float", lambda c: c.update_attributes("active", [replace(attribute_id=1.5)]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-too-large", lambda c: c.update_attributes("active", [replace(value=INT64_MAX + 1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-too-small", lambda c: c.update_attributes("active", [replace(value=INT64_MIN - 1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-comparison-too-large",
         lambda c: c.update_attributes("active", [replace(comparison=INT64_MAX + 1,
                                                          kind=AttributeUpdateType.REPLACE_IF_EQUALS)]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-float", lambda c: c.update_attributes("active", [replace(value=1.5)]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-str", lambda c: c.update_attributes("active", [replace(value="1")]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-float-on-append", lambda c: c.append("active", b"x", [replace(value=2.5)]),
         InvalidArgumentError, "argument"),
    Case("attribute-value-float-on-create", lambda c: c.create_segment("fresh", [replace(value=2.5)]),
         InvalidArgumentError, "argument"),
    Case("attribute-update-type-int", lambda c: c.update_attributes("active", [replace(kind=1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-update-not-an-update", lambda c: c.update_attributes("active", [(ATTRIBUTE, 1)]),
         InvalidArgumentError, "argument"),
    Case("attribute-updates-not-a-sequence", lambda c: c.update_attributes("active", 5),
         InvalidArgumentError, "argument"),
    Case("too-many-updates", lambda c: c.update_attributes("active", TOO_MANY_UPDATES), PayloadTooLargeError,
         "argument"),
    Case("too-many-updates-on-append", lambda c: c.append("active", b"x", TOO_MANY_UPDATES), PayloadTooLargeError,
         "argument"),
    Case("too-many-updates-on-create", lambda c: c.create_segment("fresh", TOO_MANY_UPDATES), PayloadTooLargeError,
         "argument"),
    # Payloads and names.
    Case("append-too-large", lambda c: c.append("active", bytes(limits.APPEND_LENGTH_BYTES_MAX + 1)),
         PayloadTooLargeError, "argument"),
    Case("append-too-large-to-sealed", lambda c: c.append("sealed", bytes(limits.APPEND_LENGTH_BYTES_MAX + 1)),
         PayloadTooLargeError, "argument"),
    Case("append-str", lambda c: c.append("active", "text"), InvalidArgumentError, "argument"),
    Case("append-int", lambda c: c.append("active", 5), InvalidArgumentError, "argument"),
    Case("append-list", lambda c: c.append("active", [1, 2]), InvalidArgumentError, "argument"),
    Case("name-empty", lambda c: c.create_segment(""), InvalidArgumentError, "argument"),
    Case("name-too-long", lambda c: c.create_segment("n" * (limits.SEGMENT_NAME_LENGTH_BYTES_MAX + 1)),
         InvalidArgumentError, "argument"),
    Case("name-too-long-in-utf8", lambda c: c.create_segment("é" * (limits.SEGMENT_NAME_LENGTH_BYTES_MAX // 2 + 1)),
         InvalidArgumentError, "argument"),
    Case("name-not-str", lambda c: c.create_segment(5), InvalidArgumentError, "argument"),
    Case("name-bytes", lambda c: c.append(b"active", b"x"), InvalidArgumentError, "argument"),
    Case("name-none", lambda c: c.seal(None), InvalidArgumentError, "argument"),
    Case("name-lone-surrogate", lambda c: c.create_segment("\ud800"), InvalidArgumentError, "argument"),
    Case("merge-source-name-empty", lambda c: c.merge("active", ""), InvalidArgumentError, "argument"),
    # Reads.
    Case("read-below-start", lambda c: c.read("truncated", 3, 10), StreamSegmentTruncatedError, "read"),
    Case("read-beyond-length", lambda c: c.read("active", 12, 10), BadOffsetError, "read"),
    Case("read-missing", lambda c: c.read("missing", 0, 10), StreamSegmentNotExistsError, "read"),
    Case("read-deleted", lambda c: c.read("deleted", 0, 10), StreamSegmentNotExistsError, "read"),
    Case("read-merged", lambda c: c.read("merged", 0, 10), StreamSegmentMergedError, "read"),
    Case("read-negative-length", lambda c: c.read("active", 0, -1), InvalidArgumentError, "read"),
    Case("read-negative-offset", lambda c: c.read("active", -1, 10), InvalidArgumentError, "read"),
    Case("read-wait-too-long", lambda c: c.read("active", 0, 1, wait_seconds=limits.TAIL_READ_WAIT_SECONDS_MAX + 1),
         InvalidArgumentError, "read"),
    Case("read-offset-str", lambda c: c.read("active", "0", 10), InvalidArgumentError, "read"),
    Case("read-length-float", lambda c: c.read("active", 0, 1.5), InvalidArgumentError, "read"),
    Case("read-name-int", lambda c: c.read(5, 0, 1), InvalidArgumentError, "read"),
    Case("info-missing", lambda c: c.get_info("missing"), StreamSegmentNotExistsError, "read"),
    Case("info-deleted", lambda c: c.get_info("deleted"), StreamSegmentNotExistsError, "read"),
    Case("info-merged", lambda c: c.get_info("merged"), StreamSegmentMergedError, "read"),
    Case("info-name-empty", lambda c: c.get_info(""), InvalidArgumentError, "read"),
]

CASES = LIFECYCLE_CASES + OTHER_CASES


def test_the_tables_cover_what_the_issue_names() -> None:
    ids = {case.id for case in CASES}
    assert len(ids) == len(CASES), "case ids must be unique"
    for role in Role:  # every operation on a missing, deleted and merged segment
        for name in ("missing", "deleted", "merged"):
            assert f"{role.value}-on-{name}" in ids or role is Role.CREATE, (role, name)
    assert {"append-on-sealed", "merge_source-on-active", "truncate-beyond-length", "truncate-below-start",
            "append-too-large", "append-compare-and-set-fails", "append-at-wrong-offset", "read-below-start",
            "read-beyond-length", "too-many-updates"} <= ids


async def call(case: Case, container: SegmentContainer) -> Any:
    result = case.call(container)
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        try:
            return await asyncio.wait_for(result, CALL_TIMEOUT_SECONDS)
        except TimeoutError:
            # (from None: the chain through asyncio's internals is long, and formatting it has
            # crashed pytest on CPython 3.11.7.)
            raise AssertionError(f"{case.id}: no answer in {CALL_TIMEOUT_SECONDS} s; state "
                                 f"{container.state.value}") from None
    return result


async def running_container(storage: SimulatedLogStorage, recorder: TraceRecorder | None = None) -> SegmentContainer:
    container = SegmentContainer(0, SimulatedDurableDataLog(storage), tracer=recorder)
    await container.start()
    return container


async def check_still_serving(container: SegmentContainer) -> None:
    """A valid append after the bad call lands at the end, and reads back."""
    assert container.state is ContainerState.RUNNING
    length = container.get_info("active").length
    assert await container.append("active", b"!", expected_offset=length) == length
    assert (await container.read("active", length, 10)).data == b"!"
    container.check_invariants()


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_fails_with_its_own_error_and_changes_nothing(case: Case) -> None:
    async def scenario() -> None:
        storage = SimulatedLogStorage()
        recorder = TraceRecorder()
        container = await running_container(storage, recorder)
        await set_up(container)
        before = await Observed.of(container)
        records_before = storage.records
        recorder.take()

        with pytest.raises(MillstreamError) as raised:
            await call(case, container)
        assert type(raised.value) is case.error, f"{case.id}: {raised.value!r}"

        events = recorder.take()
        submitted = [event for event in events if event.action == "Submit"]
        processed = [event for event in events if event.action == "Process"]
        if case.stage == "state":  # the processor refused it: queued, rejected, never framed
            assert len(submitted) == 1 and len(processed) == 1, events
            assert processed[0].fields["error"] == case.error.__name__
        else:  # refused before anything was queued (or a read: never queued)
            assert not submitted and not processed, events
        assert storage.records == records_before, "a refused call reached the log"
        assert await Observed.of(container) == before, "a refused call changed what clients see"
        await check_still_serving(container)
        await container.stop()

        recovered = await running_container(storage)
        after = await Observed.of(recovered)
        assert after.infos["active"].length == before.infos["active"].length + 1  # just the "!"
        assert attrs.evolve(after, infos={**after.infos, "active": before.infos["active"]},
                            contents={**after.contents, "active": before.contents["active"]}) == before
        await recovered.stop()

    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS))


def test_every_bad_input_in_a_row_leaves_one_container_serving_and_recoverable() -> None:
    """All the cases above against one container, one after another: none changes anything, and the
    log replays to exactly what was acknowledged."""

    async def scenario() -> None:
        storage = SimulatedLogStorage()
        container = await running_container(storage)
        await set_up(container)
        before = await Observed.of(container)
        for case in CASES:
            with pytest.raises(MillstreamError) as raised:
                await call(case, container)
            assert type(raised.value) is case.error, f"{case.id}: {raised.value!r}"
            assert container.state is ContainerState.RUNNING, case.id
        assert await Observed.of(container) == before
        await container.stop()
        recovered = await running_container(storage)
        assert await Observed.of(recovered) == before
        await check_still_serving(recovered)
        await recovered.stop()

    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS))


@pytest.mark.parametrize("data", [
    pytest.param(memoryview(array.array("I", [1, 2, 3])), id="memoryview-of-uint32"),
    pytest.param(memoryview(b"a-b-c-d")[::2], id="memoryview-not-contiguous"),
    pytest.param(memoryview(bytes(range(6))).cast("B", (2, 3)), id="memoryview-2d"),
    pytest.param(bytearray(b"abc"), id="bytearray"),
])
def test_bytes_like_data_is_appended_as_its_bytes(data: bytes | bytearray | memoryview) -> None:
    """Not bad input, but where bad input used to hide: a memoryview whose items are not bytes has a
    ``len`` that is not its byte count.  The container appends exactly its bytes -- and the log still
    replays (it used to write a record whose length field disagreed with its data)."""
    expected = memoryview(data).tobytes()

    async def scenario() -> None:
        storage = SimulatedLogStorage()
        container = await running_container(storage)
        await container.create_segment("s")
        assert await container.append("s", data) == 0
        assert await container.append("s", b"|") == len(expected)
        assert (await container.read("s", 0, 100)).data == expected + b"|"
        await container.stop()
        recovered = await running_container(storage)
        assert (await recovered.read("s", 0, 100)).data == expected + b"|"
        await recovered.stop()

    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS))


MUTATIONS: list[tuple[str, Callable[[SegmentContainer], Awaitable[Any]]]] = [
    ("create", lambda c: c.create_segment("fresh")),
    ("append", lambda c: c.append("active", b"x")),
    ("conditional-append", lambda c: c.append("active", b"x", expected_offset=11)),
    ("seal", lambda c: c.seal("active")),
    ("truncate", lambda c: c.truncate("active", 1)),
    ("merge", lambda c: c.merge("target", "spare-sealed")),
    ("delete", lambda c: c.delete("active")),
    ("update-attributes", lambda c: c.update_attributes("active", [replace(value=5)])),
    # Bad input too: the container's state is what the caller learns first.
    ("append-to-missing", lambda c: c.append("missing", b"x")),
    ("seal-sealed", lambda c: c.seal("sealed")),
]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_operations_after_stop_are_unavailable(how: str) -> None:
    async def scenario() -> None:
        storage = SimulatedLogStorage()
        container = await running_container(storage)
        await set_up(container)
        before = await Observed.of(container)
        records_before = storage.records
        if how == "stop":
            await container.stop()
        else:
            container.kill()
        assert container.state is ContainerState.STOPPED
        for name, mutation in MUTATIONS:
            with pytest.raises(ContainerUnavailableError):
                await asyncio.wait_for(mutation(container), CALL_TIMEOUT_SECONDS)
            assert container.state is ContainerState.STOPPED, name
        assert storage.records == records_before
        # Memory may be stale after a stop: reads say "unavailable", never "does not exist".
        with pytest.raises(ContainerUnavailableError):
            container.get_info("active")
        with pytest.raises(ContainerUnavailableError):
            await container.read("active", 0, 10)
        if how == "kill":
            await container.stop()  # releases the log; must not raise after a kill
        recovered = await running_container(storage)
        assert await Observed.of(recovered) == before
        await recovered.stop()

    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS))


def test_a_large_but_allowed_append_still_fits() -> None:
    """The boundary of append-too-large: exactly APPEND_LENGTH_BYTES_MAX is accepted (it spans frames)."""

    async def scenario() -> None:
        storage = SimulatedLogStorage()
        container = await running_container(storage)
        await container.create_segment("big")
        data = bytes(range(256)) * (limits.APPEND_LENGTH_BYTES_MAX // 256) + bytes(limits.APPEND_LENGTH_BYTES_MAX % 256)
        assert len(data) == limits.APPEND_LENGTH_BYTES_MAX
        assert await container.append("big", data) == 0
        assert container.get_info("big").length == len(data)
        assert (await container.read("big", len(data) - 5, 10)).data == data[-5:]
        await container.stop()

    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_SECONDS))
