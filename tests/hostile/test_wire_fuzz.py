"""A wire fuzzer against a real node (issue 19, evidence): whatever peers send, the node stays up,
bounded and intact.

Each Hypothesis example is a *batch* of sessions run at once against one ``millstream`` node in a
child process (``standalone``, or ``serve`` with authentication on): a few sessions Hypothesis draws
itself, and many more that a generator seeded by a Hypothesis-drawn seed makes from the same
ingredients (``RandomSessions``: drawing each byte through Hypothesis would make a million inputs take
hours; the seed replays a batch exactly).  A session is one connection carrying *inputs* -- each one
frame or chunk of bytes -- drawn from:

* well-formed commands with names, numbers and tokens from small sets (valid, read-only, another
  scope's, forged, expired, garbage), including controller requests with odd JSON bodies;
* writer conversations: create, set up, append with event numbers mostly in order and sometimes not
  (valid frames out of order: an append before its SetupAppend, a number that goes back);
* frames with a mutated header -- any type code, absurd lengths (negative, just over the 64 KiB
  limit before authentication, the 16 MiB frame limit and beyond, 2**31 - 1) -- and arbitrary bodies;
* valid frames cut short; raw bytes;

opened with a Hello, without one, with a bad one or with two; sent whole or dripped a few bytes per
write; ended by an abrupt close or by a half-close after which every reply is read and must decode
(the node may close a connection, never send garbage).  Some sessions are floods of connections
instead.  After every batch: the node is alive, a normal client reads back every event it wrote
before, byte for byte, and writes more, and the node's resident memory -- read from outside -- has
not grown by more than 128 MiB.  At the end the node's log holds no error (no traceback, no
"unexpected").

Default profile: at least 5,000 inputs with authentication off and 5,000 with it on.  Nightly
(``MILLSTREAM_PROFILE=nightly``): at least 1,000,000 with each.  The counts are printed and checked.
A failing batch is replayed by its Hypothesis example (the drawn sessions and the seed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millstream.auth import Permission, issue_token
from millstream.wire import (
    FRAME_BYTES_MAX,
    AppendBlock,
    AppendBlockEnd,
    AppendBlockPart,
    Command,
    ConditionalAppend,
    ConditionalBlockEnd,
    ControllerRequest,
    CreateSegment,
    CreateTransientSegment,
    DataAppended,
    Decoder,
    DeleteSegment,
    GetEventBoundaries,
    GetSegmentAttribute,
    GetSegmentInfo,
    Hello,
    KeepAlive,
    MergeSegments,
    ReadSegment,
    SealSegment,
    SegmentRead,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    WireProtocolError,
    encode,
    encode_event,
)
from tests.hostile.node import (
    HELLO,
    NIGHTLY,
    SECRET,
    Node,
    NormalClient,
    node,
    open_connection,
    raise_open_files_limit,
)

MIB = 1024 * 1024
HEADER = struct.Struct(">ii")
#: Inputs per authentication mode; the count is checked at the end.  ``MILLSTREAM_WIRE_FUZZ_INPUTS``
#: sets another count for both (a longer run by hand).
INPUTS_MIN = {mode: int(os.environ.get("MILLSTREAM_WIRE_FUZZ_INPUTS", "1000000" if NIGHTLY else "5000"))
              for mode in ("off", "on")}
#: Inputs in one batch: a few sessions Hypothesis draws, then seeded ones until there are this many.
INPUTS_PER_BATCH = 1000 if NIGHTLY else 300
DRAWN_SESSIONS = (1, 8)
SEEDED_SESSIONS_MAX = 10 * INPUTS_PER_BATCH
CONCURRENT_SESSIONS = 32
GROWTH_LIMIT_BYTES = 128 * MIB
#: Bounds on waiting: a session's replies after its half-close; a whole batch.
SESSION_TIMEOUT_SECONDS = 60.0
BATCH_TIMEOUT_SECONDS = 600.0

#: How a session ends: mostly a half-close after which the node's replies are read to its EOF (so the
#: node surely processed everything); sometimes an abrupt close, after reading the node's Hello (a
#: close with unread bytes would reset the connection, and the node could lose what it had not read).
ENDINGS = ["half-close", "half-close", "half-close", "half-close", "close"]

NOW = time.time()
TOKENS = {
    "none": "",
    "all": issue_token(SECRET, "*", Permission.READ_UPDATE, NOW + 86_400),
    "scope": issue_token(SECRET, "fuzz/*", Permission.READ_UPDATE, NOW + 86_400),
    "read-only": issue_token(SECRET, "fuzz/*", Permission.READ, NOW + 86_400),
    "other-scope": issue_token(SECRET, "elsewhere/*", Permission.READ_UPDATE, NOW + 86_400),
    "forged": issue_token(b"not-the-secret-at-all-0123", "*", Permission.READ_UPDATE, NOW + 86_400),
    "expired": issue_token(SECRET, "*", Permission.READ_UPDATE, NOW - 10),
    "garbage": "ms1.!!!.???",
}
#: The fuzzer's own names: never the normal client's segment (``hostile/...``), never ``_system/``
#: (reserved-name protection is the auth helper's part of the issue, tested there).
SEGMENTS = ["fuzz/a/0", "fuzz/b/0", "fuzz/a/0#transaction.00000000000000000000000000000001",
            "fuzz/s/0.#epoch.0", "fuzz/a/0#transient.00000001", "", "f" * 2000]
SCOPES = ["fuzz", "fuzz2", "elsewhere", "", "_fuzz", "x" * 300]
WRITERS = [uuid.UUID(int=n) for n in (1, 2, 3)]
KNOWN_TYPES = [-127, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 20, 21, 28, 29, 30, 31, 34, 35, 36, 37, 38, 39, 40,
               50, 51, 52, 53, 55, 56, 57, 58, 59, 60, 61, 89, 200, 201]
ABSURD_LENGTHS = [-1, -(2**31), 0, 1, 7, 65_535, 65_536, 65_537, 1 << 20, FRAME_BYTES_MAX, FRAME_BYTES_MAX + 1,
                  2**31 - 1]

i64 = st.integers(-(2**63), 2**63 - 1)
small = st.integers(-3, 40)
tokens = st.sampled_from(sorted(TOKENS.values()))
segments = st.sampled_from(SEGMENTS)
writers = st.sampled_from(WRITERS)
payloads = st.binary(max_size=300)
event_data = st.one_of(st.lists(payloads, max_size=4).map(lambda ps: b"".join(encode_event(p) for p in ps)),
                       st.binary(max_size=64))
json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def controller_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["fields", "json", "deep", "raw"]))
    if kind == "fields":
        body: dict[str, Any] = {"scope": draw(st.sampled_from(SCOPES)), "token": draw(tokens)}
        if draw(st.booleans()):
            body["stream"] = draw(st.sampled_from(["s", "t", "", "u" * 300]))
        if draw(st.booleans()):
            body["config"] = draw(json_values)
        if draw(st.booleans()):
            body[draw(st.sampled_from(["cut", "txn", "group", "segment", "seal", "new_ranges", "time"]))] = \
                draw(json_values)
        return json.dumps(body).encode()
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        return b"[" * depth + b"]" * draw(st.integers(0, depth))
    return draw(st.binary(max_size=200))


METHODS = ["create_scope", "delete_scope", "list_scopes", "create_stream", "get_stream", "list_streams",
           "seal_stream", "delete_stream", "get_current_segments", "scale_stream", "truncate_stream",
           "create_reader_group", "get_segment_uri", "create_transaction", "commit_transaction", "get_fence",
           "no_such_method", ""]

commands = st.one_of(
    st.builds(CreateSegment, small, segments, tokens),
    st.builds(SetupAppend, small, writers, segments, tokens),
    st.builds(AppendBlock, writers, st.one_of(small, i64), small, small, event_data),
    st.builds(ConditionalAppend, writers, small, st.integers(-2, 5000), event_data, small),
    st.builds(ConditionalBlockEnd, writers, small, st.integers(-2, 5000), event_data, small),
    st.builds(AppendBlockPart, writers, event_data),
    st.builds(AppendBlockEnd, writers, small, event_data, small, small, small),
    st.builds(ReadSegment, small, segments, small, st.integers(-5, 5000), tokens, st.integers(-5, 3)),
    st.builds(GetSegmentInfo, small, segments, tokens),
    st.builds(GetEventBoundaries, small, segments, st.one_of(small, i64), st.one_of(small, i64), tokens),
    st.builds(SealSegment, small, segments, tokens),
    st.builds(TruncateSegment, small, segments, small, tokens),
    st.builds(DeleteSegment, small, segments, tokens),
    st.builds(MergeSegments, small, segments, segments, tokens),
    st.builds(CreateTransientSegment, small, writers, segments, tokens),
    st.builds(GetSegmentAttribute, small, segments, st.integers(0, 3), tokens),
    st.builds(UpdateSegmentAttribute, small, segments, st.integers(0, 3), small, small, tokens),
    st.builds(ControllerRequest, small, st.sampled_from(METHODS), controller_bodies()),
    st.builds(Hello, st.integers(-2, 3), st.integers(-2, 3)),
    st.just(KeepAlive()),
    # Replies only the node sends: answered OperationUnsupported.
    st.builds(DataAppended, small, writers, small, small, small),
    st.builds(SegmentRead, small, segments, small, st.booleans(), st.booleans(), payloads),
)


@st.composite
def writer_conversation(draw: st.DrawFn) -> list[bytes]:
    """Mostly what a writer says, sometimes out of order: create, set up, append numbered blocks."""
    segment = draw(st.sampled_from(SEGMENTS[:2]))
    writer = draw(writers)
    token = draw(st.sampled_from([TOKENS["all"], TOKENS["scope"], TOKENS["read-only"], ""]))
    frames = []
    if draw(st.booleans()):
        frames.append(encode(CreateSegment(1, segment, token)))
    if draw(st.integers(0, 9)):  # (sometimes an append comes first)
        frames.append(encode(SetupAppend(2, writer, segment, token)))
    number = draw(st.integers(1, 50))
    for request_id in range(draw(st.integers(1, 6))):
        number += draw(st.sampled_from([1, 1, 1, 2, 0, -1]))
        events = draw(st.lists(payloads, min_size=1, max_size=3))
        frames.append(encode(AppendBlock(writer, number, len(events), 10 + request_id,
                                         b"".join(encode_event(e) for e in events))))
    return frames


@st.composite
def mutated_frame(draw: st.DrawFn) -> bytes:
    type_code = draw(st.one_of(st.sampled_from(KNOWN_TYPES), st.integers(-(2**31), 2**31 - 1)))
    body = draw(st.binary(max_size=200))
    length = draw(st.one_of(st.sampled_from(ABSURD_LENGTHS), st.just(len(body)),
                            st.integers(max(0, len(body) - 3), len(body) + 3), st.integers(-(2**31), 2**31 - 1)))
    return HEADER.pack(type_code, length) + body


@st.composite
def cut_frame(draw: st.DrawFn) -> bytes:
    frame = encode(draw(commands))
    return frame[:draw(st.integers(0, max(0, len(frame) - 1)))]


bad_inputs = st.one_of(mutated_frame(), cut_frame(), st.binary(min_size=1, max_size=300))


@attrs.frozen
class Session:
    """One connection: how it opens, its inputs, whether it drips them, how it ends (``flood``: that
    many extra connections instead, which open and close)."""

    opening: str
    inputs: tuple[bytes, ...]
    drip: int  # 0: send at once; else the bytes per write
    ending: str
    flood: int = 0

    @property
    def count(self) -> int:
        return self.flood or len(self.inputs)


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    if draw(st.integers(0, 19)) == 0:
        return Session("hello", (), 0, draw(st.sampled_from(ENDINGS)), flood=draw(st.integers(1, 40)))
    opening = draw(st.sampled_from(["hello", "hello", "hello", "none", "bad-hello", "hello-twice"]))
    # Well-formed commands first (a malformed frame ends a connection, so it goes last, if at all).
    chunks = draw(st.one_of(st.lists(commands.map(encode), max_size=8), writer_conversation()))
    if draw(st.booleans()):
        chunks.append(draw(bad_inputs))
    if not chunks:
        chunks.append(encode(KeepAlive()))
    drip = draw(st.sampled_from([0, 0, 0, 1, 3, 16]))
    return Session(opening, tuple(chunks), drip, draw(st.sampled_from(ENDINGS)))


class RandomSessions:
    """Sessions made by a seeded ``random.Random`` from the same ingredients as the strategies above
    (same names, tokens, writers, type codes, absurd lengths); cheap enough for a million inputs."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tokens = sorted(TOKENS.values())

    def number(self) -> int:
        return self.rng.choice([self.rng.randint(-3, 40), self.rng.randint(-(2**63), 2**63 - 1)])

    def blob(self, size_max: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, size_max))

    def events(self) -> bytes:
        if self.rng.random() < 0.2:
            return self.blob(64)
        return b"".join(encode_event(self.blob(300)) for _ in range(self.rng.randint(0, 4)))

    def command(self) -> Command:
        r, pick = self.rng, self.rng.choice
        seg, tok, wri, num = (lambda: pick(SEGMENTS)), (lambda: pick(self.tokens)), (lambda: pick(WRITERS)), self.number
        makers = [
            lambda: CreateSegment(num(), seg(), tok()),
            lambda: SetupAppend(num(), wri(), seg(), tok()),
            lambda: AppendBlock(wri(), num(), r.randint(-3, 40), num(), self.events()),
            lambda: ConditionalAppend(wri(), r.randint(-3, 40), r.randint(-2, 5000), self.events(), num()),
            lambda: ConditionalBlockEnd(wri(), r.randint(-3, 40), r.randint(-2, 5000), self.events(), num()),
            lambda: AppendBlockPart(wri(), self.events()),
            lambda: AppendBlockEnd(wri(), r.randint(-3, 40), self.events(), r.randint(-3, 40), num(), num()),
            lambda: ReadSegment(num(), seg(), r.randint(-3, 40), r.randint(-5, 5000), tok(), r.randint(-5, 3)),
            lambda: GetSegmentInfo(num(), seg(), tok()),
            lambda: GetEventBoundaries(num(), seg(), r.randint(-3, 40), r.choice([r.randint(-3, 40), 2**63 - 1]),
                                       tok()),
            lambda: SealSegment(num(), seg(), tok()),
            lambda: TruncateSegment(num(), seg(), r.randint(-3, 40), tok()),
            lambda: DeleteSegment(num(), seg(), tok()),
            lambda: MergeSegments(num(), seg(), seg(), tok()),
            lambda: CreateTransientSegment(num(), wri(), seg(), tok()),
            lambda: GetSegmentAttribute(num(), seg(), r.randint(0, 3), tok()),
            lambda: UpdateSegmentAttribute(num(), seg(), r.randint(0, 3), num(), num(), tok()),
            lambda: ControllerRequest(num(), pick(METHODS), self.controller_body()),
            lambda: ControllerRequest(num(), pick(METHODS[:-2]), self.controller_body()),
            lambda: Hello(r.randint(-2, 3), r.randint(-2, 3)),
            KeepAlive,
            lambda: DataAppended(num(), wri(), num(), num(), num()),
        ]
        return pick(makers)()

    def controller_body(self) -> bytes:
        r = self.rng
        kind = r.random()
        if kind < 0.6:
            body: dict[str, Any] = {"scope": r.choice(SCOPES), "token": r.choice(self.tokens)}
            fields = ["stream", "config", "cut", "txn", "group", "segment", "seal", "time"]
            for field in r.sample(fields, r.randint(0, 3)):
                body[field] = r.choice(["s", "", 1, -1, 2**70, None, [1, [2]], {"a": {"b": [None]}}, "u" * 300, 0.5])
            return json.dumps(body).encode()
        if kind < 0.8:
            depth = r.randint(1, 5000)
            return b"[" * depth + b"]" * r.randint(0, depth)
        return self.blob(200)

    def bad_frame(self) -> bytes:
        """A frame with a mutated header, a frame cut short, or raw bytes."""
        r = self.rng
        kind = r.random()
        if kind < 0.5:
            body = self.blob(200)
            type_code = r.choice(KNOWN_TYPES) if r.random() < 0.7 else r.randint(-(2**31), 2**31 - 1)
            length = r.choice([r.choice(ABSURD_LENGTHS), len(body), len(body) + r.randint(-3, 3),
                               r.randint(-(2**31), 2**31 - 1)])
            return HEADER.pack(type_code, length) + body
        if kind < 0.8:
            whole = encode(self.command())
            return whole[:r.randint(0, len(whole) - 1)]
        return self.blob(300) or b"\x00"

    def conversation(self) -> list[bytes]:
        r = self.rng
        segment, writer = r.choice(SEGMENTS[:2]), r.choice(WRITERS)
        token = r.choice([TOKENS["all"], TOKENS["scope"], TOKENS["read-only"], ""])
        frames = [encode(CreateSegment(1, segment, token))] if r.random() < 0.5 else []
        if r.random() < 0.9:
            frames.append(encode(SetupAppend(2, writer, segment, token)))
        number = r.randint(1, 50)
        for request_id in range(r.randint(1, 6)):
            number += r.choice([1, 1, 1, 2, 0, -1])
            events = [self.blob(300) for _ in range(r.randint(1, 3))]
            frames.append(encode(AppendBlock(writer, number, len(events), 10 + request_id,
                                             b"".join(encode_event(e) for e in events))))
        return frames

    def session(self) -> Session:
        r = self.rng
        if r.random() < 0.05:
            return Session("hello", (), 0, r.choice(ENDINGS), flood=r.randint(1, 40))
        opening = r.choice(["hello", "hello", "hello", "none", "bad-hello", "hello-twice"])
        chunks = self.conversation() if r.random() < 0.2 else [encode(self.command()) for _ in range(r.randint(0, 8))]
        if r.random() < 0.5 or not chunks:
            chunks.append(self.bad_frame())
        return Session(opening, tuple(chunks), r.choice([0, 0, 0, 1, 3, 16]), r.choice(ENDINGS))


OPENINGS = {"hello": HELLO, "none": b"", "bad-hello": encode(Hello(99, 98)), "hello-twice": HELLO + HELLO}


@attrs.define
class Tally:
    inputs: int = 0
    sessions: int = 0
    replies: int = 0
    batches: int = 0
    peak_growth: int = 0


class Played:
    """One session on its way: its bytes are sent (``send``), then it ends (``finish``)."""

    def __init__(self, port: int, index: int, session: Session) -> None:
        self.port, self.index, self.session = port, index, session
        self.streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def send(self) -> None:
        session = self.session
        if session.flood:
            for offset in range(session.flood):
                with contextlib.suppress(OSError):
                    reader, stream = await open_connection(self.port, self.index * 64 + offset)
                    if offset % 2:
                        stream.write(HELLO)
                    self.streams.append((reader, stream))
            return
        try:
            reader, stream = await open_connection(self.port, self.index)
        except OSError:
            return  # (refused: a limit; the batch's checks say whether the node is fine)
        self.streams.append((reader, stream))
        data = OPENINGS[session.opening] + b"".join(session.inputs)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):  # (the node closed it: fine)
            if session.ending == "close":
                await reader.readexactly(len(HELLO))  # (the node's Hello: nothing unread when we close)
            if session.drip:
                for start in range(0, len(data), session.drip):
                    stream.write(data[start:start + session.drip])
                    await stream.drain()
                    await asyncio.sleep(0)  # (one write per turn: the node sees the frame in pieces)
            else:
                stream.write(data)
                await stream.drain()

    async def finish(self) -> int:
        """End the session; return how many replies it read (all of them decoded cleanly)."""
        replies = 0
        for reader, stream in self.streams:
            try:
                if self.session.ending == "half-close" and not self.session.flood:
                    stream.write_eof()
                    received = bytearray()
                    async with asyncio.timeout(SESSION_TIMEOUT_SECONDS):
                        while chunk := await reader.read(1 << 16):
                            received += chunk
                    decoder = Decoder()
                    try:
                        replies += len(decoder.feed(received))
                    except WireProtocolError as error:
                        raise AssertionError(f"the node sent bytes that are not frames: {error}") from error
                    assert not decoder.pending_bytes, "the node's last frame was cut short"
            except OSError:
                pass  # the node closed the connection (ECONNRESET, EPIPE, ENOTCONN): a refusal, fine
            finally:
                stream.close()
        return replies


async def run_batch(started: Node, batch: list[Session]) -> tuple[int, int]:
    """Play ``batch`` in waves of ``CONCURRENT_SESSIONS``: each wave sends everything, the node's
    memory is sampled while it holds all of it, then the wave ends.  Returns the replies read and
    the largest memory sample."""
    replies = peak = 0
    for start in range(0, len(batch), CONCURRENT_SESSIONS):
        wave = [Played(started.port, start + offset, session)
                for offset, session in enumerate(batch[start:start + CONCURRENT_SESSIONS])]
        await asyncio.gather(*(played.send() for played in wave))
        peak = max(peak, started.rss_bytes())
        replies += sum(await asyncio.gather(*(played.finish() for played in wave)))
    return replies, peak


async def janitor(started: Node) -> None:
    """Delete what the batch stored (the node's memory must reflect leaks, not the fuzzer's data)."""
    _reader, stream = await open_connection(started.port, 0)
    stream.write(HELLO + b"".join(encode(DeleteSegment(n, name, TOKENS["all"]))
                                  for n, name in enumerate(SEGMENTS[:4])))
    await stream.drain()
    with contextlib.suppress(OSError):
        stream.write_eof()
        async with asyncio.timeout(SESSION_TIMEOUT_SECONDS):
            while await _reader.read(1 << 16):
                pass
    stream.close()


@pytest.fixture(params=["off", "on"], scope="module")
def fuzz_node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Node, NormalClient, str]]:
    raise_open_files_limit(4096)
    auth = request.param
    with node(tmp_path_factory.mktemp(f"fuzz-auth-{auth}"), auth=auth == "on") as started:
        normal = NormalClient(started.uri, started.token, "hostile/normal/0")
        asyncio.run(normal.write(50, large=1))
        asyncio.run(normal.read_back())
        yield started, normal, auth


def node_errors(started: Node, read: list[int]) -> list[str]:
    """Lines of the node's log since the last call (``read[0]`` is where that ended) that report an
    error: an unexpected exception, a traceback.  Bad input is logged at INFO or WARNING."""
    with started.stderr_path.open("rb") as log:
        log.seek(read[0])
        text = log.read()
    read[0] += len(text)
    return [line for line in text.decode(errors="replace").splitlines()
            if " ERROR " in line or " CRITICAL " in line or "Traceback" in line or "unexpected" in line]


# (A batch's repr is large; Hypothesis warns when it builds one to report a failure.)
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_the_node_survives_whatever_peers_send(fuzz_node: tuple[Node, NormalClient, str]) -> None:
    started, normal, auth = fuzz_node
    baseline = started.rss_bytes()
    log_read = [0]  # how much of the node's log was checked already
    tally = Tally()
    goal = INPUTS_MIN[auth]
    began = time.monotonic()

    # As many examples as batches are needed: Hypothesis would otherwise go on generating (and
    # discarding) examples up to its profile's count once the goal is reached.
    @settings(max_examples=-(-goal // INPUTS_PER_BATCH), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(drawn=st.lists(sessions(), min_size=DRAWN_SESSIONS[0], max_size=DRAWN_SESSIONS[1]),
           seed=st.integers(0, 2**32 - 1))
    def batches(drawn: list[Session], seed: int) -> None:
        if tally.inputs >= goal:
            return  # (Hypothesis may go on generating; the goal is reached)
        # (Hypothesis often keeps a seed while it varies the drawn sessions: mix them, so every example
        # makes a batch of its own -- and the same example, replayed, the same batch.)
        seeded = RandomSessions(zlib.crc32(repr(drawn).encode(), seed))
        batch = list(drawn)
        while sum(session.count for session in batch) < INPUTS_PER_BATCH and len(batch) < SEEDED_SESSIONS_MAX:
            batch.append(seeded.session())

        async def scenario() -> int:
            replies, peak = await run_batch(started, batch)
            tally.replies += replies
            await janitor(started)
            assert started.alive(), started.stderr_tail()
            await normal.read_back()
            await normal.write(5)
            await normal.read_back()
            return peak

        peak = asyncio.run(asyncio.wait_for(scenario(), BATCH_TIMEOUT_SECONDS))
        growth = max(peak, started.rss_bytes()) - baseline
        tally.peak_growth = max(tally.peak_growth, growth)
        assert growth < GROWTH_LIMIT_BYTES, f"the node grew by {growth / MIB:.1f} MiB"
        errors = node_errors(started, log_read)
        assert errors == [], errors[:10]
        tally.inputs += sum(session.count for session in batch)
        tally.sessions += len(batch)
        tally.batches += 1

    batches()
    log_bytes = started.stderr_path.stat().st_size
    print(f"\nwire fuzz, authentication {auth}: {tally.inputs} inputs in {tally.sessions} sessions "
          f"({tally.batches} batches, {time.monotonic() - began:.0f} s); {tally.replies} replies decoded; "
          f"node RSS {baseline / MIB:.1f} MiB at the start, peak growth {tally.peak_growth / MIB:.1f} MiB; "
          f"the normal client wrote and read back {len(normal.written)} events; node log {log_bytes} bytes")
    assert tally.inputs >= goal, f"only {tally.inputs} inputs in {tally.batches} batches (the goal is {goal})"
