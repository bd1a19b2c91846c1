"""Recorded runs of scale + read scenarios for trace validation: the stateful test's machine
(``tests.stateful.test_streams_vs_model.StreamsMachine``) driven by a seeded random choice of its
rules instead of Hypothesis, every step the implementation took kept in order.

A run is a sequence of environment choices -- writes, flushes, scales by hand and by the
auto-scaler, readers joining, reading, leaving and crashing, time passing, checkpoints, resets --
chosen with the machine's own preconditions and weights that favour writing and reading, then the
machine's final drain (every reader reads until the group has read everything) and its history
check.  The machine replays each step on the model as it goes; that only steers the choices (what
may be chosen next).  When the model disagrees with the implementation (a seeded bug) the run stops
there and keeps what was recorded up to and including the step the model refused: TLC, the oracle
of the trace test, must then refuse it on its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from tests.stateful.test_streams_vs_model import (
    EVENTS_PER_WRITER,
    GRID,
    INITIAL_SEGMENTS,
    MAX_CHECKPOINTS,
    MAX_CRASHES,
    MAX_RESETS,
    MAX_SCALES,
    READERS,
    WRITERS,
    StreamsMachine,
)

__all__ = ["GRID", "INITIAL_SPLITS", "READERS", "WRITERS", "RecordedRun", "recorded_run"]

INITIAL_SPLITS = tuple(GRID * i // INITIAL_SEGMENTS for i in range(1, INITIAL_SEGMENTS))


class _Choices:
    """Stands in for Hypothesis's ``data`` in the machine's rules: draws from ``sampled_from`` with a
    seeded RNG (the rules draw nothing else)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        elements: Sequence[Any] = strategy.elements
        return self.rng.choice(list(elements))


class _Recording(StreamsMachine):
    def __init__(self) -> None:
        self.recorded: list[dict[str, Any]] = []
        super().__init__()

    def take(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.recorded.extend(steps)  # (before the replay: a step the model refuses is kept)
        return super().take(steps)

    def teardown(self) -> None:
        self.run.close()


@attrs.frozen
class RecordedRun:
    steps: list[dict[str, Any]]
    #: Why the machine stopped early (the model or a check disagreed with the implementation), or None.
    diverged: str | None


_Rule = tuple[int, Callable[[], bool], Callable[[], Any]]


def _rules(m: _Recording, rng: random.Random, data: _Choices) -> list[_Rule]:
    model = lambda: m.model  # noqa: E731
    return [
        (6, lambda: any(model().written[w] < EVENTS_PER_WRITER for w in WRITERS),
         lambda: m.write_event(data, rng.randrange(GRID))),  # type: ignore[arg-type]
        (2, lambda: True, lambda: m.flush(rng.choice(WRITERS))),
        (2, lambda: model().scales < MAX_SCALES, lambda: m.create_successors(data)),  # type: ignore[arg-type]
        (1, lambda: model().scales < MAX_SCALES and bool(m.hot_candidates() or m.cold_candidates()),
         lambda: m.auto_scale(data, rng.random() < 0.5)),  # type: ignore[arg-type]
        (2, lambda: len(model().online) < len(READERS), lambda: m.add_reader(data)),  # type: ignore[arg-type]
        (8, lambda: bool(model().online), lambda: m.read_next_event(data)),  # type: ignore[arg-type]
        (1, lambda: True, lambda: m.advance_time(rng.randint(1, 3))),
        (1, lambda: bool(model().online) and m.crashes < MAX_CRASHES,
         lambda: m.reader_offline(data, rng.choice(["leave", "crash", "timeout"]))),  # type: ignore[arg-type]
        (2, lambda: not model().checkpoint_in_progress and len(model().checkpoints) < MAX_CHECKPOINTS,
         m.create_checkpoint),
        (1, lambda: not model().checkpoint_in_progress and model().resets < MAX_RESETS
         and any(c.complete for c in model().checkpoints), lambda: m.reset(data)),  # type: ignore[arg-type]
    ]


def recorded_run(seed: int, choices: int = 30) -> RecordedRun:
    """One run of ``choices`` environment choices (seeded), then the drain; see the module docstring."""
    rng = random.Random(seed)
    data = _Choices(rng)
    machine = _Recording()
    try:
        rules = _rules(machine, rng, data)
        for _ in range(choices):
            enabled = [(weight, act) for weight, ready, act in rules if ready()]
            act = rng.choices([a for _, a in enabled], weights=[w for w, _ in enabled])[0]
            act()
            machine.clients_observe_what_the_model_says()
        machine.drain_and_check()
        return RecordedRun(machine.recorded, None)
    except AssertionError as error:
        return RecordedRun(machine.recorded, str(error)[:2000])
    finally:
        machine.teardown()
