"""Arbitrary command sequences and garbage never crash the server, never log an unexpected error,
never break its invariants, and never disturb another connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.wire import (
    AppendBlock,
    AppendBlockEnd,
    AppendBlockPart,
    ConditionalAppend,
    CreateSegment,
    DeleteSegment,
    GetSegmentAttribute,
    GetSegmentInfo,
    KeepAlive,
    MergeSegments,
    ReadSegment,
    SealSegment,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    encode,
    encode_event,
)
from tests.server.raw import ConnectionClosed, RawClient, Tiers, run, serving
from tests.server.test_bad_input import Bystander

#: Each example starts a server: a few dozen by default, many more in the nightly profile.
EXAMPLES = 1000 if os.environ.get("MILLSTREAM_PROFILE") == "nightly" else 40

SEGMENTS = ["sc/a", "sc/b", "sc/a#transaction.00000000000000000000000000000001", ""]
WRITERS = [uuid.UUID(int=1), uuid.UUID(int=2)]
i64 = st.integers(-(2**63), 2**63 - 1)
small = st.integers(-3, 40)
segments = st.sampled_from(SEGMENTS)
writers = st.sampled_from(WRITERS)
event_data = st.one_of(
    st.lists(st.binary(max_size=30), max_size=4).map(lambda ps: b"".join(encode_event(p) for p in ps)),
    st.binary(max_size=40))

commands = st.one_of(
    st.builds(CreateSegment, small, segments, st.just("")),
    st.builds(SetupAppend, small, writers, segments, st.just("")),
    st.builds(AppendBlock, writers, st.one_of(small, i64), small, small, event_data),
    st.builds(ConditionalAppend, writers, small, small, event_data, small),
    st.builds(AppendBlockPart, writers, event_data),
    st.builds(AppendBlockEnd, writers, small, event_data, small, small, small),
    st.builds(ReadSegment, small, segments, small, st.integers(-5, 100), st.just(""), st.integers(-5, 30)),
    st.builds(GetSegmentInfo, small, segments, st.just("")),
    st.builds(SealSegment, small, segments, st.just("")),
    st.builds(TruncateSegment, small, segments, small, st.just("")),
    st.builds(DeleteSegment, small, segments, st.just("")),
    st.builds(MergeSegments, small, segments, segments, st.just("")),
    st.builds(GetSegmentAttribute, small, segments, st.integers(0, 3), st.just("")),
    st.builds(UpdateSegmentAttribute, small, segments, st.integers(0, 3), small, small, st.just("")),
    st.just(KeepAlive()),
)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(max_examples=EXAMPLES)
@given(st.lists(commands, max_size=25), st.binary(max_size=30))
def test_arbitrary_commands_and_garbage_leave_the_server_healthy(sequence: list[object], garbage: bytes) -> None:
    errors = _Errors()
    logger = logging.getLogger("millstream")
    logger.addHandler(errors)

    async def scenario() -> None:
        async with serving(Tiers("simulated", Path("/nonexistent"))) as server:
            bystander = await Bystander.start(server.port)
            client = await RawClient.connect(server.port)
            with contextlib.suppress(ConnectionError):
                await client.send_bytes(b"".join(encode(c) for c in sequence) + garbage)  # type: ignore[arg-type]
            with contextlib.suppress(ConnectionClosed, ConnectionError, TimeoutError):
                while True:
                    await client.receive(seconds=0.15)
            server.check_invariants()
            await bystander.still_works()
            await client.close()
            await bystander.client.close()
            await asyncio.sleep(0)
    try:
        run(scenario, 20.0)
    finally:
        logger.removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]
