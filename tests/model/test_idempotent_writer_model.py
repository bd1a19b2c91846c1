"""The idempotent-writer model: each rule a reader or a writer relies on is a guard that refuses the
step breaking it (duplicates, reordering and gaps, phantoms, lost acknowledged events, changes after
the seal), and random walks through the enabled steps keep the invariants."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.model import idempotent_writer as iw
from millstream.model.idempotent_writer import Event, NotEnabled, WriterStatus


def written(counts: dict[str, int]) -> iw.SegmentState:
    state = iw.initial_state(counts)
    for name, count in counts.items():
        for expected in range(1, count + 1):
            state, number = iw.write_event(state, name)
            assert number == expected
    return state


def test_interleaved_writers_store_in_order_and_are_acknowledged() -> None:
    state = written({"a": 3, "b": 2})
    state = iw.observe(state, [Event("a", 1), Event("b", 1), Event("a", 2)])
    state = iw.acknowledge(state, "a", 2)
    state = iw.observe(state, [Event("a", 1), Event("b", 1), Event("a", 2), Event("b", 2), Event("a", 3)])
    state = iw.acknowledge(iw.acknowledge(state, "a", 3), "b", 2)
    state.check_invariants()
    assert state.writer("a") == iw.WriterState(written=3, stored=3, acknowledged=3)


@pytest.mark.parametrize(("events", "complaint"), [
    ([Event("a", 1), Event("a", 1)], "duplicate"),
    ([Event("a", 2)], "out of order"),
    ([Event("a", 1), Event("a", 3)], "skipped"),
    ([Event("a", 1), Event("a", 2), Event("a", 3), Event("a", 4)], "phantom"),
    ([Event("zz", 1)], "no writer"),
])
def test_a_reading_that_breaks_a_rule_is_refused(events: list[Event], complaint: str) -> None:
    with pytest.raises(NotEnabled, match=complaint):
        iw.observe(written({"a": 3}), events)


def test_the_segment_only_grows() -> None:
    state = iw.observe(written({"a": 2, "b": 1}), [Event("a", 1), Event("b", 1)])
    with pytest.raises(NotEnabled, match="changed under a reader"):
        iw.observe(state, [Event("a", 1)])  # shrank: a stored event vanished
    with pytest.raises(NotEnabled, match="changed under a reader"):
        iw.observe(state, [Event("b", 1), Event("a", 1)])  # reordered in place
    assert iw.observe(state, [Event("a", 1), Event("b", 1)]) == state  # the same reading again: no step


def test_an_acknowledgement_covers_only_stored_events_and_never_goes_back() -> None:
    state = iw.observe(written({"a": 3}), [Event("a", 1)])
    with pytest.raises(NotEnabled, match="lost"):
        iw.acknowledge(state, "a", 2)
    state = iw.acknowledge(state, "a", 1)
    with pytest.raises(NotEnabled, match="backwards"):
        iw.acknowledge(state, "a", 0)
    assert iw.acknowledge(state, "a", 1) == state


def test_nothing_is_stored_after_the_seal_and_a_refused_writer_knew_everything_stored() -> None:
    state = iw.observe(written({"a": 3, "b": 1}), [Event("a", 1), Event("a", 2)])
    with pytest.raises(NotEnabled, match="not sealed"):
        iw.refuse(state, "a")
    state = iw.seal(state)
    with pytest.raises(NotEnabled, match="after the seal"):
        iw.observe(state, [Event("a", 1), Event("a", 2), Event("a", 3)])
    with pytest.raises(NotEnabled, match="acknowledged"):
        iw.refuse(state, "a")  # it saw 0 acknowledged, but 2 are stored
    state = iw.refuse(iw.acknowledge(state, "a", 2), "a")
    state = iw.refuse(state, "b")
    assert state.writer("a").status is WriterStatus.REFUSED
    with pytest.raises(NotEnabled, match="takes no more"):
        iw.write_event(state, "a")
    state.check_invariants()


def test_a_writer_that_gave_up_may_still_see_its_in_flight_events_stored_in_order() -> None:
    state = iw.give_up(written({"a": 2}), "a")
    with pytest.raises(NotEnabled, match="takes no more"):
        iw.write_event(state, "a")
    with pytest.raises(NotEnabled, match="already"):
        iw.give_up(state, "a")
    state = iw.observe(state, [Event("a", 1), Event("a", 2)])
    state.check_invariants()


@given(st.lists(st.tuples(st.sampled_from(["write", "store", "ack", "seal", "refuse", "give_up"]),
                          st.sampled_from(["a", "b", "c"]), st.integers(0, 4)), max_size=60))
def test_random_walks_through_enabled_steps_keep_the_invariants(steps: list[tuple[str, str, int]]) -> None:
    state = iw.initial_state(["a", "b", "c"])
    for action, name, number in steps:
        try:
            if action == "write":
                state, _ = iw.write_event(state, name)
            elif action == "store":
                state = iw.store(state, name, state.writer(name).stored + 1 + number % 2)
            elif action == "ack":
                state = iw.acknowledge(state, name, state.writer(name).acknowledged + number)
            elif action == "seal":
                state = iw.seal(state)
            elif action == "refuse":
                state = iw.refuse(state, name)
            else:
                state = iw.give_up(state, name)
        except NotEnabled:
            continue
        state.check_invariants()
        assert iw.WRITER_TRANSITIONS[WriterStatus.ACTIVE] >= {s.status for s in state.writers.values()} - {
            WriterStatus.ACTIVE}


def test_the_invariants_fail_on_a_refused_writer_that_was_not_told_everything_stored() -> None:
    """A refused writer whose acknowledged count lags what was stored breaks the invariant even on a
    sealed segment.  Kills ``self.sealed and ...`` -> ``self.sealed or ...`` in ``check_invariants``."""
    state = iw.seal(iw.observe(written({"a": 2}), [Event("a", 1), Event("a", 2)]))
    state.check_invariants()
    lagging = attrs.evolve(state, writers=state.writers.set("a", attrs.evolve(
        state.writer("a"), acknowledged=1, status=WriterStatus.REFUSED)))
    with pytest.raises(AssertionError):
        lagging.check_invariants()


def test_a_gap_names_the_events_skipped() -> None:
    """The refusal of a gap says which events are missing.  Kills the mutants that misnumber the last
    one (``number - 1`` -> ``number + 1`` or ``number - 0`` in ``store``'s message)."""
    state = iw.store(written({"a": 4}), "a", 1)
    with pytest.raises(NotEnabled, match=r"events 2\.\.3 were skipped\)$"):
        iw.store(state, "a", 4)


def test_a_changed_segment_is_reported_at_its_first_difference() -> None:
    """The refusal names the first position whose event changed, what it held and what it holds now.
    Kills ``a != b`` -> ``a == b`` (the first equal position was named) and ``if first < known`` ->
    ``if not first < known`` (the event held was reported as None)."""
    state = iw.observe(written({"a": 2, "b": 1}), [Event("a", 1), Event("a", 2)])
    with pytest.raises(NotEnabled, match=r"position 1 held Event\(writer='a', number=2\), now "
                                         r"Event\(writer='b', number=1\) \(2 events seen before, 2 now\)"):
        iw.observe(state, [Event("a", 1), Event("b", 1)])


def test_invariants_fail_on_a_negative_acknowledgement() -> None:
    """``0 <= acknowledged``: a writer acknowledged below zero breaks the invariants even with nothing
    written or stored.  Kills ``0 <= state.acknowledged`` -> ``-1 <= ...`` in ``check_invariants``
    (seed-2711 sample)."""
    state = iw.initial_state(["w"])
    state.check_invariants()
    below = attrs.evolve(state, writers=state.writers.set("w", iw.WriterState(acknowledged=-1)))
    with pytest.raises(AssertionError):
        below.check_invariants()
