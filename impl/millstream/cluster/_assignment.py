"""The container -> host map: a pure function of the live hosts, the container count and the old map.

Theory of operation.  The elected host (``millstream.cluster._zookeeper``) calls ``assign`` whenever
membership changes and writes what it returns.  Three properties, each tested with Hypothesis
(``tests/cluster/test_assignment.py``):

* **Balanced.** Every container ``0 .. container_count - 1`` has exactly one host, and two hosts' counts
  differ by at most one: ``base = container_count // len(hosts)`` each, and ``container_count % len(hosts)``
  of them one more.
* **Minimal movement.** A container stays on its host if that host is live and keeping it does not
  break the balance.  Which hosts get the one extra is chosen to keep the most: the hosts that hold
  the most containers now (ties by host id).  Each host keeps its lowest-numbered containers up to
  its quota; what is left over (containers of hosts that left, and a host's surplus) goes, lowest
  container first, to the hosts with room, in host id order.  So the number of containers that move
  is the least any balanced map reachable from the old one allows: no container moves for balance
  unless its host holds more than its quota.
* **Deterministic.** The result depends on the set of hosts (not the order given), the count and the
  old map only: two hosts that compute it from the same inputs write the same map, and a leader
  that is elected anew recomputes what its predecessor wrote.

With no live hosts the map is empty (nothing can be served; the containers are assigned again when a
host joins).  Movement is all a host sees: ``millstream.cluster._containers`` stops what left it and
starts what came, after fencing the previous owner's log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from millstream.errors import InvalidArgumentError

__all__ = ["assign", "check_assignment", "moved"]


def _quotas(hosts: list[str], container_count: int, held: Mapping[str, int]) -> dict[str, int]:
    """Each host's share: ``base`` or ``base + 1``, the extras to the hosts that hold the most now."""
    base, extra = divmod(container_count, len(hosts))
    by_holding = sorted(hosts, key=lambda host: (-held.get(host, 0), host))
    return {host: base + (1 if rank < extra else 0) for rank, host in enumerate(by_holding)}


def assign(hosts: Iterable[str], container_count: int, current: Mapping[int, str] | None = None) -> dict[int, str]:
    """The new container -> host map for ``hosts`` (the live ones), given the ``current`` map.

    Raises ``InvalidArgumentError`` for a negative count, an empty host id, or a current map naming a
    container outside ``range(container_count)``.

    pre: 0 <= container_count <= 6
    pre: all(isinstance(host, str) and host for host in hosts)
    pre: current is None or all(0 <= container < container_count for container in current)
    post: check_assignment(__return__, set(hosts), container_count) is None
    """
    if container_count < 0:
        raise InvalidArgumentError(f"container_count must be >= 0, not {container_count}")
    live = sorted(set(hosts))
    if any(not isinstance(host, str) or not host for host in live):
        raise InvalidArgumentError(f"host ids must be non-empty strings: {live!r}")
    current = dict(current or {})
    strays = sorted(container for container in current if not 0 <= container < container_count)
    if strays:
        raise InvalidArgumentError(f"the current map names containers outside 0..{container_count - 1}: {strays}")
    if not live:
        return {}
    live_set = set(live)
    holdings: dict[str, list[int]] = {host: [] for host in live}
    for container in sorted(current):
        host = current[container]
        if host in live_set:
            holdings[host].append(container)
    quotas = _quotas(live, container_count, {host: len(held) for host, held in holdings.items()})
    result: dict[int, str] = {}
    for host in live:
        for container in holdings[host][:quotas[host]]:
            result[container] = host
    room = [(host, quotas[host] - min(len(holdings[host]), quotas[host])) for host in live]
    orphans = (container for container in range(container_count) if container not in result)
    for host, free in room:
        for _ in range(free):
            result[next(orphans)] = host
    return dict(sorted(result.items()))


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> set[int]:
    """The containers whose host differs between two maps (assigned in ``after`` and not to the same
    host in ``before``)."""
    return {container for container, host in after.items() if before.get(container) != host}


def check_assignment(assignment: Mapping[int, str], hosts: set[str], container_count: int) -> str | None:
    """Why ``assignment`` is not a balanced map of ``range(container_count)`` onto ``hosts``, or None."""
    if not hosts:
        return None if not assignment else f"containers assigned with no live host: {dict(assignment)}"
    if set(assignment) != set(range(container_count)):
        return f"assigned containers {sorted(assignment)} are not 0..{container_count - 1}"
    strangers = set(assignment.values()) - hosts
    if strangers:
        return f"containers assigned to hosts that are not live: {sorted(strangers)}"
    counts = [sum(1 for host in assignment.values() if host == live) for live in sorted(hosts)]
    if max(counts) - min(counts) > 1:
        return f"unbalanced: {dict(zip(sorted(hosts), counts, strict=True))}"
    return None
