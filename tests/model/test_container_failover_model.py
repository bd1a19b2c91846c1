"""The ContainerFailover model's ``Adopt`` beyond what the agreement proof shows: a new owner adopts
a verified prefix of an older owner's unrecorded chunk write (all of it, or the part the chunk holds
when appends came after it), never more than the chunk holds, and only before its own first chunk
write; recovery then reads the adopted units from the older chunk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from millstream.model import container_failover as cf
from millstream.model.durable_log import NotEnabled

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _fenced_after_a_chunk_write() -> cf.ContainerFailoverState:
    """o1 appends units 1 and 2, writes both into its chunk (epoch 1) and crashes before its flush
    record; o2 takes over (epoch 2) and appends unit 3: units 1 and 2 are in chunk 1, unrecorded."""
    state = cf.start(cf.initial_state(["o1", "o2"]), "o1")
    state = cf.client_append(cf.client_append(state, "o1"), "o1")
    state = cf.crash(cf.write_chunk(state, "o1"), "o1")
    return cf.client_append(cf.start(state, "o2"), "o2")


def test_every_spec_action_has_a_model_transition_of_the_same_name() -> None:
    actions = json.loads((SPEC / "manifest.json").read_text())["specs"]["ContainerFailover"]["actions"]
    assert "Adopt" in actions
    for action in actions:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()
        assert callable(getattr(cf, name, None)), f"{action} has no model transition {name}"
        assert name in cf.__all__


def test_a_new_owner_adopts_a_verified_prefix_of_an_older_chunk() -> None:
    state = _fenced_after_a_chunk_write()
    assert state.chunks[1] == (1, 2) and state.own["o2"].units == (1, 2, 3)
    assert cf.adoptions(state, "o2") == [(1, 1), (1, 2)], "unit 3 is not in chunk 1: never adopted"
    adopted = cf.adopt(state, "o2", 1, 2)
    me = adopted.own["o2"]
    assert (me.storage, me.layout) == (2, (cf.LayoutEntry(1, 2),))
    assert adopted.log[-1] == cf.Record("flush", 2, storage=2, layout=(cf.LayoutEntry(1, 2),))
    assert adopted.chunks == state.chunks, "adoption writes nothing"
    assert cf.recovered(adopted) == (1, 2, 3)
    cf.check_invariants(adopted)


def test_an_adoption_continues_the_layouts_last_chunk() -> None:
    state = cf.adopt(_fenced_after_a_chunk_write(), "o2", 1, 1)
    assert cf.adoptions(state, "o2") == [(1, 1)], "the rest of chunk 1, counted from where the layout ends"
    state = cf.adopt(state, "o2", 1, 1)
    assert state.own["o2"].layout == (cf.LayoutEntry(1, 2),)
    cf.check_invariants(state)


def test_more_than_the_chunk_holds_is_never_adopted() -> None:
    state = _fenced_after_a_chunk_write()
    assert not cf.verified(state, "o2", 1, 3)
    with pytest.raises(NotEnabled):
        cf.adopt(state, "o2", 1, 3)


def test_no_adoption_after_the_owners_own_chunk_write_nor_by_a_fenced_owner() -> None:
    state = _fenced_after_a_chunk_write()
    assert cf.adoptions(cf.write_chunk(state, "o2"), "o2") == []
    fenced = cf.start(state, "o1")  # o1 (down since its crash) takes over with epoch 3: o2 is fenced
    assert cf.adoptions(fenced, "o2") == []
    assert cf.adoptions(fenced, "o1") == [(1, 1), (1, 2)]


def test_an_adoption_the_chunk_does_not_hold_breaks_no_acknowledged_append_lost() -> None:
    """What mutant ``ContainerFailover_adopt_more_than_verified`` records: the whole unflushed tail."""
    state = _fenced_after_a_chunk_write()
    layout = (cf.LayoutEntry(1, 3),)
    broken = attrs.evolve(
        state, log=(*state.log, cf.Record("flush", 2, storage=3, layout=layout)),
        own=state.own.set("o2", attrs.evolve(state.own["o2"], storage=3, layout=layout)))
    with pytest.raises(AssertionError, match="NoAcknowledgedAppendLost"):
        cf.check_invariants(broken)
