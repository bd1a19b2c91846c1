"""Every lifecycle is a table of one shape, h11's: ``state -> {event: the state that follows}``.

The segment lifecycle (``model.segment.LIFECYCLE``, its refusals beside it), transactions (the model's,
the controller's, the client's), containers (``SegmentContainer``), and large events (the writer and
its transient segment, in the model, the client and the server).  Each table has a row for every
state (a final state: an empty row), and every transition leads to a state of the same kind.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import pytest

from millstream.client._large_events import EVENT_WRITER_TRANSITIONS, EventWriterPhase
from millstream.client._transactions import LIFECYCLE as CLIENT_TRANSACTION_LIFECYCLE
from millstream.client._transactions import TransactionStatus
from millstream.controller._transactions import TRANSACTION_LIFECYCLE, TxnStatus
from millstream.model import large_events, segment, transactions
from millstream.model.types import SegmentStatus
from millstream.segmentstore.container import LIFECYCLE as CONTAINER_LIFECYCLE
from millstream.segmentstore.container import ContainerState
from millstream.server._transient import TRANSIENT_TRANSITIONS, TransientState

TABLES: dict[str, tuple[Mapping[Any, Any], set[Any]]] = {
    "segment (model)": (segment.LIFECYCLE, {None, *SegmentStatus}),
    "transaction (model)": (transactions.LIFECYCLE, set(transactions.TxnStatus)),
    "transaction (controller)": (TRANSACTION_LIFECYCLE, set(TxnStatus)),
    "transaction (client)": (CLIENT_TRANSACTION_LIFECYCLE, set(TransactionStatus)),
    "container": (CONTAINER_LIFECYCLE, set(ContainerState)),
    "large-event writer (model)": (large_events.WRITER_TRANSITIONS, set(large_events.WriterPhase)),
    "transient segment (model)": (large_events.TRANSIENT_TRANSITIONS, set(large_events.TransientState)),
    "large-event writer (client)": (EVENT_WRITER_TRANSITIONS, set(EventWriterPhase)),
    "transient segment (server)": (TRANSIENT_TRANSITIONS, set(TransientState)),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_lifecycle_is_a_table_of_states_to_events_to_states(name: str) -> None:
    table, states = TABLES[name]
    assert set(table) == states, f"{name}: a row for every state, and only for states"
    for state, row in table.items():
        assert isinstance(row, Mapping), f"{name}: the row of {state} is not a dict of events"
        for event, following in row.items():
            assert isinstance(event, (str, enum.Enum)), f"{name}: {state}: event {event!r}"
            assert following in states, f"{name}: {state} --{event}--> {following!r}, not a state"


def test_every_segment_role_is_either_allowed_or_refused() -> None:
    for status in (None, *SegmentStatus):
        allowed, refused = set(segment.LIFECYCLE[status]), set(segment.REFUSALS[status])
        assert allowed | refused == set(segment.Role) and not allowed & refused, status


def pairs(table: Mapping[Any, Mapping[Any, Any]]) -> set[tuple[str, str]]:
    return {(state.value, following.value) for state, row in table.items() for following in row.values()}


def test_the_client_large_event_writer_moves_as_the_model_minus_abandoned() -> None:
    model = {pair for pair in pairs(large_events.WRITER_TRANSITIONS) if "abandoned" not in pair}
    assert pairs(EVENT_WRITER_TRANSITIONS) == model
