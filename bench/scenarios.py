"""The write-path suite's scenarios: ways of driving one container.  Kept apart from the code that
runs them so that the command line can list them without importing the store."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final

import attrs

__all__ = ["SCENARIOS", "Mode", "Scenario", "scenarios_named", "size_label"]


class Mode(enum.Enum):
    LONE = "lone"  # one appender awaiting each append
    CONCURRENT = "concurrent"  # several appenders, each awaiting each append
    PIPELINED = "pipelined"  # one appender keeping a window of appends in flight
    BLOCK = "block"  # one writer keeping a window of blocks in flight, each block many events in one append


@attrs.frozen
class Scenario:
    """One way of driving the container: ``appenders`` appenders of ``record_bytes`` appends, each
    keeping ``window`` appends in flight (1: awaiting each).

    In ``Mode.BLOCK`` a record is an *event* and one append carries ``events_per_append`` of them,
    framed as the wire protocol frames events inside an ``AppendBlock`` and with the attribute update
    the server gives every block (the writer's event number, compare-and-set): what the client path
    asks of a container.  Every other mode appends one record per append."""

    mode: Mode
    record_bytes: int = attrs.field(validator=attrs.validators.ge(1))
    appenders: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    window: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    events_per_append: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:
        if (self.mode is Mode.BLOCK) != (self.events_per_append > 1):
            raise ValueError("a block scenario carries several events per append, and only a block scenario does")

    @property
    def name(self) -> str:
        return f"{self.mode.value}-{size_label(self.record_bytes)}"

    @property
    def driver(self) -> str:
        """How the scenario drives the container, in words (for the report)."""
        if self.mode is Mode.BLOCK:
            return f"{self.appenders} x window {self.window} blocks of {self.events_per_append:,} events"
        if self.window > 1:
            return f"{self.appenders} x window {self.window}"
        return f"{self.appenders} awaiting"

    @property
    def per_event(self) -> bool:
        """Whether the scenario is judged per event (blocks) rather than per append."""
        return self.mode is Mode.BLOCK


def size_label(record_bytes: int) -> str:
    """100 -> "100B", 10_000 -> "10KB" (decimal, as the issue says 10,000-byte appends)."""
    if record_bytes >= 1000 and record_bytes % 1000 == 0:
        return f"{record_bytes // 1000}KB"
    return f"{record_bytes}B"


#: The issue's scenarios: 100 B and 10,000 B appends, (a) one appender awaiting each append, (b) 16
#: appenders each awaiting each append, (c) one appender keeping a window in flight -- 1,000 small
#: appends (about 100 KB, a tenth of a DataFrame) or 64 large ones (640 KB).  Then what the client
#: path really sends: (d) the same 1,000 small events travelling as one append (an ``AppendBlock``
#: of about 108 KB), four such blocks in flight.
SCENARIOS: Final = (
    Scenario(Mode.LONE, 100),
    Scenario(Mode.CONCURRENT, 100, appenders=16),
    Scenario(Mode.PIPELINED, 100, window=1000),
    Scenario(Mode.LONE, 10_000),
    Scenario(Mode.CONCURRENT, 10_000, appenders=16),
    Scenario(Mode.PIPELINED, 10_000, window=64),
    Scenario(Mode.BLOCK, 100, window=4, events_per_append=1000),
)


def scenarios_named(names: Sequence[str]) -> tuple[Scenario, ...]:
    """The default scenarios with these names, in the default order.  Raises ``ValueError`` naming the
    known ones if a name is unknown."""
    known = {scenario.name: scenario for scenario in SCENARIOS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(scenario for scenario in SCENARIOS if scenario.name in names)
