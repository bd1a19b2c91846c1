"""The ChunkStorage conformance suite: every chunk storage must pass these tests (STYLE.md #10).

Each test receives a fresh, empty storage -- a ``FileChunkStorage`` on a temporary directory, or a
``SimulatedChunkStorage`` without faults -- and checks one clause of the contract in
``millstream.segmentstore.chunk_storage``.  A Hypothesis state machine then runs random sequences of
calls against each storage and a dict of bytearrays side by side.  Tests run their coroutines with
plain ``asyncio.run``; the faults each storage can inject are tested in
``tests/unit/test_chunk_storage_faults.py``.

Decisions the suite pins down for every implementation (the contract leaves them open):

* A zero-length write at the chunk's length succeeds and changes nothing; anywhere else it is
  ``BadOffsetError``.  A zero-length read at the chunk's length returns ``b""``.
* ``concat`` of a chunk onto itself is ``InvalidArgumentError``; concatenating an empty source just
  deletes it.
* A name, offset, length, data or prefix of the wrong type is ``InvalidArgumentError``, as is a bad
  name (empty, containing NUL, not encodable as UTF-8, longer than the limit); a closed storage
  raises ``ObjectClosedError`` before it looks at the arguments.
* ``list`` sorts by code point (Python's ``str`` order); a prefix matches names, not their escaping.
* A deleted chunk's name can be created again, as a new empty chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from millstream import limits
from millstream.errors import (
    BadOffsetError,
    ChunkExistsError,
    ChunkNotFoundError,
    InvalidArgumentError,
    MillstreamError,
    ObjectClosedError,
)
from millstream.segmentstore.chunk_storage import ChunkStorage
from millstream.segmentstore.file_chunk_storage import FileChunkStorage
from millstream.testing.simulated_chunk_storage import SimulatedChunkStorage

_T = TypeVar("_T")

KINDS = ["file", "simulated"]

#: No scenario needs more than a fraction of a second; a hang must fail the test, not the CI job.
SCENARIO_TIMEOUT_SECONDS = 30.0

#: Names that stress the file storage's escaping: separators, spaces, escapes, dots, non-ASCII, a
#: 2000-byte name that needs directories, and the longest name allowed in 3-byte characters.
AWKWARD_NAMES = [
    "a/b/c",
    "a/b",
    "/leading/slash",
    "trailing/",
    "with space",
    "100%",
    "%41",
    "A",
    "plus+sign",
    ".",
    "..",
    "../escape",
    ".hidden",
    "é",
    "e\u0301",  # the same glyph as "é", decomposed: a different name
    "日本語/チャンク",
    "emoji-\U0001f600",
    "tab\tnewline\n",
    "x" * 2000,
    "€" * (limits.CHUNK_NAME_LENGTH_BYTES_MAX // 3) + "ab",  # exactly the limit: 682 * 3 + 2 bytes
]

BAD_NAMES: list[Any] = [
    "",
    "nul\0inside",
    "x" * (limits.CHUNK_NAME_LENGTH_BYTES_MAX + 1),
    "€" * (limits.CHUNK_NAME_LENGTH_BYTES_MAX // 3 + 1),  # 2049 bytes in 683 characters
    "lone surrogate \ud800",
    b"bytes",
    None,
    7,
]


def make_storage(kind: str, directory: Path) -> ChunkStorage:
    if kind == "file":
        return FileChunkStorage(directory)
    return SimulatedChunkStorage()


@pytest.fixture(params=KINDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChunkStorage]:
    chosen = make_storage(request.param, tmp_path / "chunks")
    yield chosen
    asyncio.run(chosen.close())
    if isinstance(chosen, SimulatedChunkStorage):
        chosen.check_invariants()


def run(scenario: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_SECONDS))


async def chunk_with(storage: ChunkStorage, name: str, *pieces: bytes) -> None:
    """Create ``name`` and write ``pieces`` to it, one write each."""
    await storage.create(name)
    offset = 0
    for piece in pieces:
        await storage.write(name, offset, piece)
        offset += len(piece)


async def contents(storage: ChunkStorage, name: str) -> bytes:
    return await storage.read(name, 0, await storage.length(name))


# --- create ----------------------------------------------------------------------------------------


def test_create_makes_an_empty_chunk(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await storage.create("c")
        assert await storage.length("c") == 0
        assert await storage.read("c", 0, 0) == b""
        assert await storage.list() == ["c"]

    run(scenario())


def test_create_of_an_existing_chunk_fails_and_changes_nothing(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"kept")
        with pytest.raises(ChunkExistsError):
            await storage.create("c")
        assert await contents(storage, "c") == b"kept"

    run(scenario())


# --- write and read --------------------------------------------------------------------------------


def test_writes_append_and_read_back(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"hello", b", ", bytearray(b"world"), memoryview(b"!"))
        assert await storage.length("c") == 13
        assert await contents(storage, "c") == b"hello, world!"
        assert await storage.read("c", 7, 5) == b"world"
        assert await storage.read("c", 12, 1) == b"!"

    run(scenario())


@pytest.mark.parametrize("offset", [-1, 0, 2, 4, 100])
def test_write_at_another_offset_than_the_length_fails_and_writes_nothing(storage: ChunkStorage, offset: int) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"abc")
        with pytest.raises(BadOffsetError):
            await storage.write("c", offset, b"zz")
        assert await contents(storage, "c") == b"abc"

    run(scenario())


def test_empty_write_at_the_length_changes_nothing(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"abc")
        await storage.write("c", 3, b"")
        assert await contents(storage, "c") == b"abc"
        with pytest.raises(BadOffsetError):
            await storage.write("c", 2, b"")

    run(scenario())


@pytest.mark.parametrize(
    ("offset", "length"),
    [(-1, 1), (0, -1), (0, 5), (4, 1), (5, 0), (2, 3), (-1, 0)],
)
def test_read_beyond_the_chunk_fails(storage: ChunkStorage, offset: int, length: int) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"abcd")
        with pytest.raises(BadOffsetError):
            await storage.read("c", offset, length)

    run(scenario())


def test_read_of_zero_bytes_at_the_end_is_empty(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"abcd")
        assert await storage.read("c", 4, 0) == b""
        assert await storage.read("c", 0, 4) == b"abcd"

    run(scenario())


def test_large_writes_round_trip(storage: ChunkStorage) -> None:
    """Several MiB in one write: the file storage moves it in 1 MiB pieces."""
    first = os.urandom(3 * limits.MIB + 17)
    second = os.urandom(limits.MIB)

    async def scenario() -> None:
        await chunk_with(storage, "big", first, second)
        assert await storage.length("big") == len(first) + len(second)
        assert await storage.read("big", 0, len(first)) == first
        assert await storage.read("big", len(first) - 5, 10) == first[-5:] + second[:5]
        assert await contents(storage, "big") == first + second

    run(scenario())


def test_calls_on_different_chunks_run_concurrently(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        names = [f"c{index}" for index in range(8)]
        await asyncio.gather(*(storage.create(name) for name in names))
        await asyncio.gather(*(storage.write(name, 0, name.encode() * 100) for name in names))
        read = await asyncio.gather(*(contents(storage, name) for name in names))
        assert read == [name.encode() * 100 for name in names]

    run(scenario())


# --- concat ----------------------------------------------------------------------------------------


def test_concat_appends_the_source_and_deletes_it(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "t", b"head-")
        await chunk_with(storage, "s", b"tail", b"!")
        assert await storage.concat("t", "s") == 10
        assert await contents(storage, "t") == b"head-tail!"
        assert await storage.list() == ["t"]
        with pytest.raises(ChunkNotFoundError):
            await storage.length("s")
        await storage.write("t", 10, b"+more")  # the target stays an ordinary chunk
        assert await contents(storage, "t") == b"head-tail!+more"

    run(scenario())


def test_concat_of_large_chunks(storage: ChunkStorage) -> None:
    target, source = os.urandom(limits.MIB + 3), os.urandom(2 * limits.MIB + 5)

    async def scenario() -> None:
        await chunk_with(storage, "t", target)
        await chunk_with(storage, "s", source)
        assert await storage.concat("t", "s") == len(target) + len(source)
        assert await contents(storage, "t") == target + source

    run(scenario())


def test_concat_of_empty_chunks(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await storage.create("t")
        await storage.create("s")
        assert await storage.concat("t", "s") == 0
        await chunk_with(storage, "s2", b"data")
        assert await storage.concat("t", "s2") == 4
        await storage.create("s3")
        assert await storage.concat("t", "s3") == 4
        assert await contents(storage, "t") == b"data"
        assert await storage.list() == ["t"]

    run(scenario())


@pytest.mark.parametrize("missing", ["target", "source", "both"])
def test_concat_with_a_missing_chunk_fails_and_changes_nothing(storage: ChunkStorage, missing: str) -> None:
    async def scenario() -> None:
        if missing not in {"target", "both"}:
            await chunk_with(storage, "t", b"target")
        if missing not in {"source", "both"}:
            await chunk_with(storage, "s", b"source")
        before = {name: await contents(storage, name) for name in await storage.list()}
        with pytest.raises(ChunkNotFoundError):
            await storage.concat("t", "s")
        assert {name: await contents(storage, name) for name in await storage.list()} == before

    run(scenario())


def test_concat_onto_itself_is_invalid(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"abc")
        with pytest.raises(InvalidArgumentError):
            await storage.concat("c", "c")
        assert await contents(storage, "c") == b"abc"

    run(scenario())


# --- delete ----------------------------------------------------------------------------------------


def every_call_on(storage: ChunkStorage, name: str, other: str) -> dict[str, Callable[[], Coroutine[Any, Any, Any]]]:
    """Each chunk operation, applied to ``name`` (``other`` is a second, existing chunk for concat)."""
    return {
        "write": lambda: storage.write(name, 0, b"x"),
        "read": lambda: storage.read(name, 0, 0),
        "length": lambda: storage.length(name),
        "concat-target": lambda: storage.concat(name, other),
        "concat-source": lambda: storage.concat(other, name),
        "delete": lambda: storage.delete(name),
    }


def test_a_deleted_chunk_is_gone_for_every_call(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "gone", b"bytes")
        await chunk_with(storage, "other", b"other")
        await storage.delete("gone")
        assert await storage.list() == ["other"]
        for call, make in every_call_on(storage, "gone", "other").items():
            with pytest.raises(ChunkNotFoundError):
                await make()
            assert await storage.list() == ["other"], call
        assert await contents(storage, "other") == b"other"

    run(scenario())


def test_a_never_created_chunk_is_missing_for_every_call(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "other", b"other")
        for name in ["never", "x" * 2000]:
            for make in every_call_on(storage, name, "other").values():
                with pytest.raises(ChunkNotFoundError):
                    await make()
        assert await storage.list() == ["other"]

    run(scenario())


def test_a_deleted_name_can_be_created_again_empty(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"old")
        await storage.delete("c")
        await storage.create("c")
        assert await storage.length("c") == 0
        await storage.write("c", 0, b"new")
        assert await contents(storage, "c") == b"new"

    run(scenario())


# --- names and list --------------------------------------------------------------------------------


def test_awkward_names_are_distinct_chunks(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        for name in AWKWARD_NAMES:
            await chunk_with(storage, name, name.encode())
        assert await storage.list() == sorted(AWKWARD_NAMES)
        for name in AWKWARD_NAMES:
            assert await contents(storage, name) == name.encode()
        for name in AWKWARD_NAMES[::2]:
            await storage.delete(name)
        assert await storage.list() == sorted(AWKWARD_NAMES[1::2])

    run(scenario())


def test_list_names_the_chunks_with_a_prefix_sorted(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        for name in AWKWARD_NAMES:
            await storage.create(name)
        for prefix in ["", "a", "a/", "a/b", "a/b/", "%", "%4", ".", "x", "x" * 1500, "é", "e", "€", "zzz"]:
            expected = sorted(name for name in AWKWARD_NAMES if name.startswith(prefix))
            assert await storage.list(prefix) == expected, prefix

    run(scenario())


def test_list_of_an_empty_storage_is_empty(storage: ChunkStorage) -> None:
    assert run(storage.list()) == []
    assert run(storage.list("a")) == []


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_are_invalid_for_every_call(storage: ChunkStorage, name: Any) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "good", b"data")
        with pytest.raises(InvalidArgumentError):
            await storage.create(name)
        for make in every_call_on(storage, name, "good").values():
            with pytest.raises(InvalidArgumentError):
                await make()
        assert await storage.list() == ["good"]
        assert await contents(storage, "good") == b"data"

    run(scenario())


@pytest.mark.parametrize(
    "call",
    [
        lambda storage: storage.write("c", "0", b"x"),
        lambda storage: storage.write("c", True, b"x"),
        lambda storage: storage.write("c", 0, "text"),
        lambda storage: storage.write("c", 0, 5),
        lambda storage: storage.read("c", 0.0, 1),
        lambda storage: storage.read("c", 0, None),
        lambda storage: storage.list(b"a"),
        lambda storage: storage.list("\udfff"),
    ],
    ids=["offset-str", "offset-bool", "data-str", "data-int", "read-float", "read-none", "prefix-bytes", "surrogate"],
)
def test_arguments_of_the_wrong_type_are_invalid(storage: ChunkStorage, call: Any) -> None:
    async def scenario() -> None:
        await storage.create("c")
        with pytest.raises(InvalidArgumentError):
            await call(storage)
        assert await storage.length("c") == 0

    run(scenario())


# --- close -----------------------------------------------------------------------------------------


def test_close_is_idempotent_and_final(storage: ChunkStorage) -> None:
    async def scenario() -> None:
        await chunk_with(storage, "c", b"data")
        await storage.close()
        await storage.close()
        calls = {
            "create": lambda: storage.create("new"),
            "list": storage.list,
            "bad name": lambda: storage.create(""),
            **every_call_on(storage, "c", "c2"),
        }
        for make in calls.values():
            with pytest.raises(ObjectClosedError):
                await make()

    run(scenario())


# --- A reference model -----------------------------------------------------------------------------

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE", "ci") == "nightly"
STATEFUL_SETTINGS = settings(max_examples=200 if NIGHTLY else 30, stateful_step_count=100 if NIGHTLY else 30)

#: Few names, so calls collide (exists, missing, concat pairs); two long ones share their first
#: directory in the file storage, so deleting one must leave the other.
MODEL_NAMES = ("a", "a/b", "a b", "%41", "A", ".", "é", "x" * 300, "x" * 300 + "/y")
MODEL_PREFIXES = ("", "a", "a/", "%", ".", "x", "x" * 299, "x" * 301, "é", "q")


class ChunkStorageMachine(RuleBasedStateMachine):
    """One storage against a dict of bytearrays: every call must have the model's outcome."""

    def __init__(self, kind: str, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self.storage = make_storage(kind, directory)
        self.model: dict[str, bytearray] = {}

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.storage.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def outcome(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """The call's result, or the type of the millstream error it raised."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coroutine, SCENARIO_TIMEOUT_SECONDS))
        except MillstreamError as error:
            return type(error)

    def missing(self, *names: str) -> bool:
        return any(name not in self.model for name in names)

    @rule(name=st.sampled_from(MODEL_NAMES))
    def create(self, name: str) -> None:
        expected = ChunkExistsError if name in self.model else None
        assert self.outcome(self.storage.create(name)) is expected
        self.model.setdefault(name, bytearray())

    @rule(name=st.sampled_from(MODEL_NAMES), data=st.binary(max_size=100), skew=st.sampled_from([0, 0, 0, -1, 1]))
    def write(self, name: str, data: bytes, skew: int) -> None:
        offset = len(self.model.get(name, b"")) + skew
        if self.missing(name):
            expected: Any = ChunkNotFoundError
        elif skew:
            expected = BadOffsetError
        else:
            expected = None
            self.model[name] += data
        assert self.outcome(self.storage.write(name, offset, data)) is expected

    @rule(name=st.sampled_from(MODEL_NAMES), offset=st.integers(-2, 120), length=st.integers(-2, 120))
    def read(self, name: str, offset: int, length: int) -> None:
        if self.missing(name):
            expected: Any = ChunkNotFoundError
        elif offset < 0 or length < 0 or offset + length > len(self.model[name]):
            expected = BadOffsetError
        else:
            expected = bytes(self.model[name][offset : offset + length])
        assert self.outcome(self.storage.read(name, offset, length)) == expected

    @rule(into=st.sampled_from(MODEL_NAMES), source=st.sampled_from(MODEL_NAMES))
    def concat(self, into: str, source: str) -> None:
        if into == source:
            expected: Any = InvalidArgumentError
        elif self.missing(into, source):
            expected = ChunkNotFoundError
        else:
            self.model[into] += self.model.pop(source)
            expected = len(self.model[into])
        assert self.outcome(self.storage.concat(into, source)) == expected

    @rule(name=st.sampled_from(MODEL_NAMES))
    def delete(self, name: str) -> None:
        expected = ChunkNotFoundError if self.missing(name) else None
        self.model.pop(name, None)
        assert self.outcome(self.storage.delete(name)) is expected

    @rule(prefix=st.sampled_from(MODEL_PREFIXES))
    def list(self, prefix: str) -> None:
        assert self.outcome(self.storage.list(prefix)) == sorted(name for name in self.model if name.startswith(prefix))

    @invariant()
    def same_chunks_and_lengths(self) -> None:
        assert self.outcome(self.storage.list()) == sorted(self.model)
        for name, data in self.model.items():
            assert self.outcome(self.storage.length(name)) == len(data), name
        if isinstance(self.storage, SimulatedChunkStorage):
            self.storage.check_invariants()
            assert self.storage.chunks() == {name: bytes(data) for name, data in self.model.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_storage_behaves_like_a_dict_of_bytearrays(kind: str, tmp_path: Path) -> None:
    runs = itertools.count()
    run_state_machine_as_test(
        lambda: ChunkStorageMachine(kind, tmp_path / f"run-{next(runs)}"), settings=STATEFUL_SETTINGS)
