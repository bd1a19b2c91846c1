"""The LargeEvents model beyond what the agreement proof shows: the reconnect race the conditional
appends exist for, the order of a large event among ordinary ones, what expiry and abort leave,
and invariants that do fail on bad states."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from millstream.model import large_events as le
from millstream.model.durable_log import NotEnabled

SPEC = Path(__file__).resolve().parents[2] / "spec"
LARGE, SMALL = le.ItemKind.LARGE, le.ItemKind.SMALL


def _send_all(state: le.LargeEventsState, w: int) -> le.LargeEventsState:
    while state.writer(w).sent < state.items(w):
        state = le.send_chunk(state, w)
    return state


def _deliver_all(state: le.LargeEventsState, w: int, conn: int) -> le.LargeEventsState:
    while conn in state.connections_with_requests(w):
        state = le.append_chunk(state, w, conn)
    return state


def test_every_spec_action_has_a_model_transition_of_the_same_name() -> None:
    actions = json.loads((SPEC / "manifest.json").read_text())["specs"]["LargeEvents"]["actions"]
    for action in actions:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()
        assert callable(getattr(le, name, None)), f"{action} has no model transition {name}"
        assert name in le.__all__


def test_a_large_event_appears_whole_and_at_once() -> None:
    state = le.create_transient(le.initial_state((3,), 1), 1)
    state = _deliver_all(_send_all(state, 1), 1, 0)
    assert state.transient(1).data == le.framed(1, 3) and state.parent == ()
    state = le.merge(le.commit(state, 1), 1)
    assert state.parent == le.framed(1, 3)
    assert state.visible_events() == (le.Call(LARGE, 1),)
    assert state.transient(1).state is le.TransientState.MERGED
    state.check_invariants()


def test_a_stale_request_racing_the_resend_is_stored_once() -> None:
    """The connection drops with every part on its way; the old connection's requests are still
    applied after the writer reconnected and resent them: the offset check stores each once, and
    the rejections acknowledge the parts on the new connection."""
    state = _send_all(le.create_transient(le.initial_state((2,), 1), 1), 1)
    state = le.disconnect(state, 1, kept=3)
    state = le.reconnect(state, 1)
    assert state.writer(1).sent == 0, "nothing acknowledged: everything is resent"
    state = _send_all(state, 1)
    state = le.append_chunk(state, 1, 0)          # stale part 0 lands (reply lost)
    state = le.append_chunk(state, 1, 1)          # resent part 0: rejected, but acknowledges it
    assert len(state.transient(1).data) == 1 and state.writer(1).acked == 1
    state = _deliver_all(_deliver_all(state, 1, 0), 1, 1)
    assert state.transient(1).data == le.framed(1, 2) and state.all_acked(1)
    state = le.merge(le.commit(state, 1), 1)
    state.check_invariants()
    assert state.parent == le.framed(1, 2)


def test_without_the_offset_check_the_resend_duplicates_a_part() -> None:
    state = _send_all(le.create_transient(le.initial_state((1,), 0), 1), 1)
    state = le.reconnect(le.disconnect(state, 1, kept=2), 1)
    state = _send_all(state, 1)
    stale = le.append_chunk(state, 1, 0)
    segment = stale.transient(1)
    duplicated = attrs.evolve(stale, transients=(attrs.evolve(segment, data=(*segment.data, segment.data[0])),))
    with pytest.raises(AssertionError, match="TransientHoldsPrefix"):
        duplicated.check_invariants()


def test_commit_waits_for_the_ordinary_writer_so_order_follows_the_calls() -> None:
    state = le.create_transient(le.initial_state((1,), 0), 1)
    state = le.write_ordinary(state)
    state = le.commit(_deliver_all(_send_all(state, 1), 1, 0), 1)
    with pytest.raises(NotEnabled):
        le.write_ordinary(state)                  # the application is blocked in commit
    with pytest.raises(NotEnabled):
        le.merge(state, 1)                        # the ordinary event is still on its way
    state = le.merge(le.deliver_ordinary(state), 1)
    assert state.visible_events() == (le.Call(SMALL, 1), le.Call(LARGE, 1))
    state = le.deliver_ordinary(le.write_ordinary(state))
    assert state.visible_events() == (le.Call(SMALL, 1), le.Call(LARGE, 1), le.Call(SMALL, 2))
    state.check_invariants()


def test_a_small_commit_is_one_plain_append_behind_the_ordinary_events() -> None:
    state = le.commit(le.write_ordinary(le.initial_state((1,), 1)), 1)
    assert state.transient(1).state is le.TransientState.NONE
    assert state.pending == ((le.Item(SMALL, 1, 0),), le.framed(1, 1))
    with pytest.raises(NotEnabled):
        le.create_transient(state, 1)
    state = le.deliver_ordinary(le.deliver_ordinary(state))
    assert state.visible_events() == (le.Call(SMALL, 1), le.Call(LARGE, 1))
    state.check_invariants()


@pytest.mark.parametrize("removal", ["expire", "delete_on_disconnect", "abort"])
def test_a_removed_transient_segment_leaves_no_trace(removal: str) -> None:
    state = _deliver_all(_send_all(le.create_transient(le.initial_state((2,), 1), 1), 1), 1, 0)
    if removal == "expire":
        state = le.commit(state, 1)
        state = le.expire(state, 1)
    elif removal == "delete_on_disconnect":
        state = le.commit(state, 1)
        state = le.delete_on_disconnect(le.disconnect(state, 1, kept=0), 1)
        state = le.reconnect(state, 1)
    else:
        state = le.abort(state, 1)
    assert state.transient(1) == le.TransientSegment(le.TransientState.DELETED)
    if removal != "abort":
        state = le.merge(state, 1)                # the merge finds the transient segment gone
        assert state.writer(1).phase is le.WriterPhase.FAILED
    assert state.parent == ()
    state.check_invariants()


def test_a_reply_about_a_deleted_transient_segment_fails_the_event() -> None:
    state = le.send_chunk(le.create_transient(le.initial_state((1,), 0), 1), 1)
    state = le.append_chunk(le.expire(state, 1), 1, 0)
    assert state.writer(1).phase is le.WriterPhase.FAILED and state.transient(1).data == ()
    state.check_invariants()


def test_whole_events_and_subsequence_helpers() -> None:
    parts = (2,)
    small = le.Item(SMALL, 1, 0)
    assert le.whole_events((small, *le.framed(1, 2), small), parts)
    header, first, second = le.framed(1, 2)
    assert not le.whole_events((header, first, small, second), parts), "interleaved"
    assert not le.whole_events((header, first), parts), "partial"
    assert not le.whole_events((header, second, first), parts), "out of order"
    calls = (le.Call(SMALL, 1), le.Call(LARGE, 1), le.Call(SMALL, 2))
    assert le.is_subsequence((calls[0], calls[2]), calls)
    assert not le.is_subsequence((calls[2], calls[0]), calls)


def test_invariants_reject_a_partial_merge_and_a_dead_event_in_the_parent() -> None:
    state = le.send_chunk(le.create_transient(le.initial_state((1,), 0), 1), 1)
    state = le.append_chunk(state, 1, 0)
    partial = attrs.evolve(state, parent=state.transient(1).data,
                           transients=(le.TransientSegment(le.TransientState.MERGED),))
    with pytest.raises(AssertionError, match="WholeEvents"):
        partial.check_invariants()
    aborted = le.abort(state, 1)
    leaked = attrs.evolve(aborted, parent=le.framed(1, 1))
    with pytest.raises(AssertionError, match="NoTraceOfDead"):
        leaked.check_invariants()


def test_disabled_actions_raise_not_enabled() -> None:
    state = le.initial_state((2,), 1)
    with pytest.raises(NotEnabled):
        le.send_chunk(state, 1)                   # no transient segment yet
    with pytest.raises(NotEnabled):
        le.commit(state, 1)                       # a large event's data outgrew the inline limit first
    with pytest.raises(NotEnabled):
        le.reconnect(state, 1)
    with pytest.raises(NotEnabled):
        le.append_chunk(state, 1, 0)
    with pytest.raises(NotEnabled):
        le.disconnect(le.create_transient(state, 1), 1, kept=1)


def test_the_lifecycle_tables_are_exactly_what_the_state_graph_exercises() -> None:
    """Every EventWriter and transient-segment transition of the CI configurations' state graphs is
    in the model's tables, and every table entry happens in some state graph."""
    from proofs import large_events_agreement as agreement
    from proofs.explore import explore

    writer: set[tuple[le.WriterPhase, le.WriterPhase]] = set()
    transient: set[tuple[le.TransientState, le.TransientState]] = set()
    for config in (agreement.Configuration((2,), 1, 1, 1), agreement.Configuration((1, 2), 1, 1, 0)):
        graph = explore(agreement.initial_states(config), lambda s, c=config: agreement.successors(c, s),
                        keep_edges=True)
        for before, after, _ in graph.edges:
            assert isinstance(before, le.LargeEventsState) and isinstance(after, le.LargeEventsState)
            writer.update((a.phase, b.phase) for a, b in zip(before.writers, after.writers, strict=True)
                          if a.phase is not b.phase)
            transient.update((a.state, b.state) for a, b in zip(before.transients, after.transients, strict=True)
                             if a.state is not b.state)

    def pairs(table: dict[Any, dict[str, Any]]) -> set[tuple[Any, Any]]:
        return {(a, b) for a, targets in table.items() for b in targets.values()}

    assert writer == pairs(le.WRITER_TRANSITIONS)
    assert transient == pairs(le.TRANSIENT_TRANSITIONS)


def test_writers_of_different_sizes_keep_the_invariants() -> None:
    """Two writers, events of 3 chunks and of 1 (inline): each invariant must read each writer's own
    event size.  Kills the mutants reading the other writer's (``state.parts[w - 2]`` in
    ``TransientHoldsPrefix`` and ``CommittedEventsAppear``), which a one-writer test cannot tell apart,
    and refuses an event of no chunks (``n < 1`` -> ``n < 0`` in ``initial_state``)."""
    state = le.create_transient(le.initial_state((3, 1), 1), 1)
    state = _deliver_all(_send_all(state, 1), 1, 0)
    assert state.transient(1).data == le.framed(1, 3)
    state.check_invariants()
    state = le.commit(state, 2)
    assert le.framed(2, 1) in state.pending and le.Call(LARGE, 2) not in state.visible_events()
    state.check_invariants()
    with pytest.raises(ValueError, match="at least one chunk"):
        le.initial_state((2, 0), 1)


def test_type_ok_fails_on_a_connected_writer_acknowledged_beyond_what_it_sent() -> None:
    """``TypeOK``: a writer that is up has ``acked <= sent``.  Kills ``or not me.up`` -> ``or me.up``
    (a writer that is up was never checked)."""
    state = _send_all(le.create_transient(le.initial_state((2,), 1), 1), 1)
    le.check_invariants(state)
    me = state.writer(1)
    assert me.up and me.sent > 0
    with pytest.raises(AssertionError, match="TypeOK"):
        le.check_invariants(attrs.evolve(state, writers=(attrs.evolve(me, sent=0, acked=me.sent),)))
