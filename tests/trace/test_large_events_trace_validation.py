"""Runs of the real EventWriter and segment store are behaviours of ``spec/LargeEvents.tla`` (checked
by TLC through ``spec/TraceLargeEvents.tla``), and a seeded implementation bug produces traces TLC
rejects.

The runs are the large-events stateful test's (``tests/stateful/test_large_events_vs_model.py``): a
real client through a TCP proxy that holds a large event's chunks until a step lets them go, a real
store on a manual clock, connections cut with chunks on their way, reconnects that resend, commits,
aborts, grace periods and idle expiry.  ``Recording`` keeps each step as the spec action the machine
took, and after every step an ``Observe`` of what the implementation shows: the events a reader of the
parent reads (a large one only when whole; a torn one is recorded as such), every transient segment
that exists with its length, the writers whose commit returned, and what each streaming writer knows
is acknowledged.  Derandomized Hypothesis runs: the same runs every time.

With ``RecordingWithoutLockstep``, the machine's comparison with the model after every step is skipped,
so a bug planted in the implementation is recorded -- not stopped by the machine -- and it is TLC that
must refuse the run.  (A rule's own checks may still end such a run later: its record up to there is
kept.)

Default profile: 150 runs of up to 40 rules (over a thousand recorded spec steps besides the
observations); ``MILLSTREAM_PROFILE=nightly``: 1,000 runs of up to 60 (over ten thousand).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from millstream.client import EventWriterPhase
from millstream.client._byte_stream import ChunkPipeline
from millstream.naming import is_transient_segment
from millstream.testing.history import EventTag
from millstream.testing.tracing import TraceEvent
from millstream.wire.codec import iter_events
from proofs.tlc import TlcOutcome
from tests.stateful import test_large_events_vs_model as machine
from tests.trace.tla_trace import check_trace, tla

DEEP = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
RUNS, STEPS = (1_000, 60) if DEEP else (150, 40)
EXIT_SAFETY, EXIT_DEADLOCK = 12, 11
ACTIONS = {"WriteOrdinary", "DeliverOrdinary", "CreateTransient", "SendChunk", "AppendChunk", "Disconnect",
           "Reconnect", "Commit", "Merge", "Abort", "DeleteOnDisconnect", "Expire", "Observe"}

TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
    Parts <- TraceParts
    InlineMax <- TraceInlineMax
    NumOrdinary <- TraceNumOrdinary
    MaxDisconnects <- TraceMaxDisconnects
INVARIANTS
    TypeOK
    WholeEvents
    EachEventOnce
    NoTraceOfDead
    TransientHoldsPrefix
    OrderFollowsCalls
    CommittedEventsAppear
"""


def spec_action(transition: Any) -> str:
    return "".join(part.capitalize() for part in transition.__name__.split("_"))


class Recording(machine.LargeEventsMachine):
    """The stateful test's machine, keeping its run as trace events (see the module docstring)."""

    runs: ClassVar[list[list[TraceEvent]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[TraceEvent] = []

    def step(self, transition: Any, *args: Any) -> None:
        super().step(transition, *args)
        self.trace.append(TraceEvent(spec_action(transition), {"args": list(args)}))

    def teardown(self) -> None:
        Recording.runs.append(self.trace)
        super().teardown()

    def read_call(self, payload: bytes) -> tuple[str, int]:
        """An event of the parent as the spec names it; a large one that is not whole is "torn"."""
        tag = EventTag.parse(payload)
        if tag is None:
            return ("unknown", 0)
        if tag.writer == "ordinary":
            return ("small", tag.sequence)
        w = int(tag.writer.removeprefix("large-"))
        return ("large" if payload == machine.event_of(w) else "torn", w)

    @invariant()
    def observe(self) -> None:
        events = [self.read_call(payload) for payload in iter_events(self.parent_bytes())]
        container = self.server.container_for(machine.PARENT)
        writer_of = {name: w for w, name in self.transient_names.items()}
        active = {(writer_of.get(name, 0), container.get_info(name).length // machine.CHUNK + 1)
                  for name in container.segment_names() if is_transient_segment(name)}
        committed = {w for w, writer in self.events.items() if writer.phase is EventWriterPhase.COMMITTED}
        acked = set()
        for w, writer in self.events.items():
            pipeline = writer.pipeline
            if (writer.phase is EventWriterPhase.OPEN and not self.impl_failed(w) and pipeline is not None
                    and self.model.writer(w).up):
                acked.add((w, pipeline.acknowledged_offset // machine.CHUNK + 1))
        self.trace.append(TraceEvent("Observe", {"events": events, "active": active, "committed": committed,
                                                 "acked": acked}))


class RecordingWithoutLockstep(Recording):
    """``Recording`` with the machine's comparison with the model after every step (the stateful
    test's invariant) off: only ``observe`` runs, so what the implementation did reaches the record
    however wrong it is.  (A subclass rather than a flag on ``Recording``: derandomized Hypothesis
    derives its seed from the machine's definition, and the accepted runs must stay the same.)"""

    @invariant()
    def implementation_matches_the_model(self) -> None:
        pass


def recorded_runs(*, lockstep: bool = True) -> list[list[TraceEvent]]:
    """The runs' records.  With ``lockstep`` off (a planted bug), the first run the machine's own rule
    checks stop ends the recording (no shrinking): the records so far are returned, that one's too."""
    Recording.runs = []
    chosen = settings(max_examples=RUNS, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    if lockstep:
        run_state_machine_as_test(Recording, settings=chosen)
    else:
        with contextlib.suppress(Exception):
            run_state_machine_as_test(RecordingWithoutLockstep, settings=settings(chosen, phases=(Phase.generate,)))
    return [run for run in Recording.runs if run]


def trace_module(runs: Sequence[Sequence[TraceEvent]]) -> str:
    records = [[{"a": event.action, **event.fields} for event in events] for events in runs]
    # The machine bounds real connection cuts; one that cuts every connection is a Disconnect per writer.
    disconnects = max((sum(1 for event in events if event.action == "Disconnect") for events in runs), default=0)
    return f"""---- MODULE TraceData ----
EXTENDS Integers, Sequences
TraceParts == {tla(list(machine.PARTS))}
TraceInlineMax == {machine.INLINE_CHUNKS}
TraceNumOrdinary == {machine.MAX_ORDINARY}
TraceMaxDisconnects == {disconnects}
Traces == {tla(records)}
====
"""


def check(runs: Sequence[Sequence[TraceEvent]], workdir: Path) -> TlcOutcome:
    return check_trace(workdir, "TraceLargeEvents", trace_module(runs), TRACE_CFG)


def test_large_event_runs_are_accepted(tmp_path: Path) -> None:
    runs = recorded_runs()
    steps = sum(1 for run in runs for event in run if event.action != "Observe")
    assert steps >= (10_000 if DEEP else 1_000), f"only {steps} recorded steps besides the observations"
    assert {event.action for run in runs for event in run} >= ACTIONS
    outcome = check(runs, tmp_path)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert outcome.distinct is not None and outcome.distinct >= max(len(run) for run in runs)


def test_an_observation_the_spec_cannot_reach_is_rejected(tmp_path: Path) -> None:
    """The check is not blind: a real run in which the store showed a committed large event twice (what
    a merge applied twice would leave) -- one ``Observe`` doctored -- is refused at that observation.  (A
    bug planted in the implementation itself: ``test_a_chunk_acknowledged_when_sent_is_rejected``.)"""
    runs = recorded_runs()
    for number, run in enumerate(runs):
        for index, event in enumerate(run):
            large = [e for e in event.fields.get("events", []) if e[0] == "large"]
            if event.action == "Observe" and large:
                run[index] = TraceEvent("Observe", {**event.fields, "events": [*event.fields["events"], large[0]]})
                outcome = check([run], tmp_path)
                assert outcome.returncode in (EXIT_DEADLOCK, EXIT_SAFETY), outcome.output[-4000:]
                assert "run = 1" in outcome.output and f"cursor = {index + 1}" in outcome.output, number
                return
    raise AssertionError("no run committed a large event")


def test_a_chunk_acknowledged_when_sent_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the implementation, recorded with the lockstep comparison off: the chunk
    pipeline counts a chunk acknowledged as soon as it is sent, not when the store's reply comes (so
    ``flush`` and a commit stop waiting for chunks still on their way: the merged event can miss them,
    ``LargeEvents_merge_before_acked``'s outcome).  The first observation in which a writer knows more
    parts acknowledged than its transient segment holds is where TLC refuses the run."""
    send = ChunkPipeline._send

    def acknowledged_when_sent(self: ChunkPipeline, chunk: Any) -> None:
        send(self, chunk)
        self._acked_offset = max(self._acked_offset, chunk.offset + len(chunk.data))
    monkeypatch.setattr(ChunkPipeline, "_send", acknowledged_when_sent)
    for run in recorded_runs(lockstep=False):
        wrong = next((index for index, event in enumerate(run) if event.action == "Observe"
                      and any(held < acked for w, acked in event.fields["acked"]
                              for v, held in event.fields["active"] if v == w)), None)
        if wrong is None:
            continue
        outcome = check([run], tmp_path)
        assert outcome.returncode in (EXIT_DEADLOCK, EXIT_SAFETY), outcome.output[-4000:]
        assert "run = 1" in outcome.output, outcome.output[-4000:]
        assert f"cursor = {wrong + 1}" in outcome.output, (wrong, outcome.output[-4000:])
        return
    raise AssertionError("no run acknowledged a chunk the store did not hold")
