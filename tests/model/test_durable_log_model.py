"""The DurableLog model: a frame's room, and invariants that fail on bad states only one of their clauses notices
(the mutation run's survivors: ``python -m proofs.mutation``)."""

from __future__ import annotations

import attrs
import pytest

from millstream.model import durable_log as dl
from millstream.model.errors import InternalError
from millstream.model.segment import Request
from millstream.model.types import OperationKind


def test_acked_appends_readable_is_excused_only_by_a_truncation_of_the_same_segment() -> None:
    """An acknowledged append to ``a`` at offset 0, then ``b`` truncated to 1, and the container
    stops: a doctored ``a`` whose start moved past the append breaks ``AckedAppendsReadable`` -- the
    truncation of ``b`` excuses nothing in ``a``.  Kills ``op.request.segment == request.segment`` ->
    ``!=`` in the excuse."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a", "b"))
    for request in (Request(OperationKind.APPEND, "a", data=b"x"), Request(OperationKind.APPEND, "b", data=b"y"),
                    Request(OperationKind.TRUNCATE, "b", offset=1)):
        state = dl.process(dl.submit(state, request))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    assert [result.kind for result in state.results] == [dl.ResultKind.ACKED] * 3
    state.check_invariants()
    state = dl.crash(state)  # stopped: its metadata is what recovery starts from, and nothing else checks it
    state.check_invariants()
    moved = attrs.evolve(state.metadata["a"], start_offset=1)
    doctored = attrs.evolve(state, metadata=state.metadata.set("a", moved))
    with pytest.raises(InternalError, match="AckedAppendsReadable"):
        doctored.check_invariants()


def test_a_frame_has_room_while_an_entry_header_and_one_unit_fit() -> None:
    """Kills the sampled mutant moving ``has_room``'s boundary (``entry_header + 1`` -> ``+ 2``):
    10 units, headers of 3: room at 6 used (4 left), none at 7 (3 left)."""
    layout = dl.FrameLayout(10, 3)
    assert layout.has_room(6) and not layout.has_room(7)


def test_log_replays_cleanly_fails_on_a_log_that_does_not_replay() -> None:
    """A committed append whose recorded offset is not the one replay assigns breaks
    ``LogReplaysCleanly``.  Kills the mutant replaying no operation (``_replays_cleanly``'s loop)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a",))
    state = dl.process(dl.submit(state, Request(OperationKind.APPEND, "a", data=b"x")))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    state.check_invariants()
    (entry,) = state.log[0]
    moved = attrs.evolve(entry, operation=attrs.evolve(entry.operation, offset=5))
    with pytest.raises(InternalError, match="LogReplaysCleanly"):
        attrs.evolve(state, log=((moved,),)).check_invariants()


def test_acked_appends_readable_excuses_the_appends_of_a_merged_source() -> None:
    """An acknowledged append to ``a``, then ``a`` sealed and merged into ``b``: ``a``'s bytes are
    ``b``'s now, so ``a``'s own metadata no longer has to hold them -- a state without it keeps
    ``AckedAppendsReadable``.  Kills ``op.request.kind is OperationKind.MERGE`` -> ``is not`` in the
    excuse (the merge excused nothing, and the merged source's append was checked where it no longer is)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a", "b"))
    for request in (Request(OperationKind.APPEND, "a", data=b"x"), Request(OperationKind.SEAL, "a"),
                    Request(OperationKind.MERGE, "b", source="a")):
        state = dl.process(dl.submit(state, request))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    assert [result.kind for result in state.results] == [dl.ResultKind.ACKED] * 3
    state = dl.crash(state)
    state.check_invariants()
    attrs.evolve(state, metadata=state.metadata.without("a")).check_invariants()


def test_process_needs_a_running_container_and_an_operation_queued() -> None:
    """``Process`` is not enabled on a stopped container (its queue is recovery's to drop) nor with
    nothing queued.  Kills ``status is RUNNING and bool(queue)`` -> ``or`` in ``process``' guard (a
    crashed container processed its queue)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a",))
    with pytest.raises(dl.NotEnabled):
        dl.process(state)
    queued = dl.submit(state, Request(OperationKind.APPEND, "a", data=b"x"))
    with pytest.raises(dl.NotEnabled):
        dl.process(dl.crash(queued))
    assert dl.process(queued).queue == ()


def test_an_acknowledged_empty_append_has_nothing_to_be_readable() -> None:
    """An empty append is acknowledged and leaves no bytes: ``AckedAppendsReadable`` skips it.  Kills
    ``kind is not APPEND or not request.data`` -> ``and`` (the empty append was looked for in the
    segment, where it left nothing)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a",))
    for data in (b"x", b"", b"y"):
        state = dl.process(dl.submit(state, Request(OperationKind.APPEND, "a", data=data)))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    assert [result.kind for result in state.results] == [dl.ResultKind.ACKED] * 3
    state.check_invariants()


def test_type_ok_fails_on_a_commit_point_beyond_the_log() -> None:
    """``TypeOK`` bounds ``committed`` by the log's length even while the open frame has room.  Kills
    ``0 <= committed <= Len(log) and has_room(...)`` -> ``or`` (a frame that had room hid the bad
    commit point)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a",))
    state.check_invariants()
    with pytest.raises(InternalError, match="TypeOK"):
        attrs.evolve(state, committed=len(state.log) + 1).check_invariants()


def test_an_excused_append_does_not_excuse_the_appends_after_it() -> None:
    """An acknowledged append to ``a`` later merged away is excused, but an acknowledged append to ``c``
    after it is still checked: a doctored ``c`` whose start moved past it breaks
    ``AckedAppendsReadable``.  Kills the excuse's ``continue`` -> ``break`` (seed-2711 sample: the first
    excused append ended the check of every later one)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("a", "b", "c"))
    for request in (Request(OperationKind.APPEND, "a", data=b"x"), Request(OperationKind.SEAL, "a"),
                    Request(OperationKind.MERGE, "b", source="a"), Request(OperationKind.APPEND, "c", data=b"z")):
        state = dl.process(dl.submit(state, request))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    assert [result.kind for result in state.results] == [dl.ResultKind.ACKED] * 4
    state = dl.crash(state)
    state.check_invariants()
    moved = attrs.evolve(state.metadata["c"], start_offset=1)
    with pytest.raises(InternalError, match="AckedAppendsReadable"):
        attrs.evolve(state, metadata=state.metadata.set("c", moved)).check_invariants()


def test_acked_appends_readable_looks_at_each_appends_own_result() -> None:
    """An append refused (its segment does not exist) and then an acknowledged append to ``c``: the
    check of ``c``'s append reads that append's own result, so a doctored ``c`` whose start moved past
    it breaks ``AckedAppendsReadable``.  Kills ``results[operation.id - 1]`` -> ``results[operation.id -
    2]`` (seed-2711 sample: the refused operation's result excused the acknowledged one)."""
    state = dl.initial_state(dl.FrameLayout(64, 1), active_segments=("c",))
    for request in (Request(OperationKind.APPEND, "missing", data=b"x"), Request(OperationKind.APPEND, "c", data=b"z")):
        state = dl.process(dl.submit(state, request))
    state = dl.complete(dl.persist(dl.seal_frame(state)), 1)
    assert [result.kind for result in state.results] != [dl.ResultKind.ACKED] * 2
    assert state.results[1].kind is dl.ResultKind.ACKED
    state = dl.crash(state)
    state.check_invariants()
    moved = attrs.evolve(state.metadata["c"], start_offset=1)
    with pytest.raises(InternalError, match="AckedAppendsReadable"):
        attrs.evolve(state, metadata=state.metadata.set("c", moved)).check_invariants()
