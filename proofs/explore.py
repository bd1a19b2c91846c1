"""Exhaustive breadth-first exploration of a pure model, counting exactly as TLC counts.

TLC reports *generated* states (every successor computed, duplicates included, plus the initial
states), *distinct* states and the *depth* of the search (initial states are at depth 1).  The
explorer reports the same three numbers and, when asked, every edge with its action label, so a
model's state graph can be compared with the one TLC dumps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Exploration", "explore"]

S = TypeVar("S", bound=Hashable)


@dataclass
class Exploration:
    generated: int = 0
    distinct: int = 0
    depth: int = 0
    edges: list[tuple[Hashable, Hashable, str]] = field(default_factory=list)
    states: set[Hashable] = field(default_factory=set)


def explore(
    initial: Iterable[S],
    successors: Callable[[S], Iterable[tuple[str, S]]],
    *,
    check: Callable[[S], None] = lambda state: None,
    keep_edges: bool = False,
    state_limit: int = 5_000_000,
) -> Exploration:
    """Breadth-first search from ``initial``; ``check`` runs on every distinct state (raise to fail).

    Stops with RuntimeError after ``state_limit`` distinct states: an exploration that does not
    end is a wrong configuration, not something to wait for.
    """
    result = Exploration()
    seen: set[S] = set()
    frontier: deque[tuple[S, int]] = deque()
    for state in initial:
        result.generated += 1
        if state not in seen:
            seen.add(state)
            frontier.append((state, 1))
    while frontier:
        state, depth = frontier.popleft()
        result.depth = max(result.depth, depth)
        check(state)
        for label, successor in successors(state):
            result.generated += 1
            if keep_edges:
                result.edges.append((state, successor, label))
            if successor not in seen:
                if len(seen) >= state_limit:
                    raise RuntimeError(f"more than {state_limit} distinct states; is the configuration bounded?")
                seen.add(successor)
                frontier.append((successor, depth + 1))
    result.distinct = len(seen)
    result.states = set(seen) if keep_edges else set()
    return result
