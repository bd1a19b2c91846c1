"""The model-vs-TLC agreement against a TLC state graph computed once: cheap enough for every mutant.

``proofs/test_spec_model_agreement.py`` runs TLC and the model side by side on every CI configuration:
minutes per run, far too slow for each of a mutation session's mutants.  But the spec is never
mutated, so TLC's side of the comparison is the same for every mutant of a session.  This module
computes it once per spec text: TLC dumps the state graph of one small configuration, which is
reduced to what the comparison needs (the constants TLC printed, the counts, the set of states, the
initial states and the multiset of labelled edges, each state as a sorted tuple of its variables)
and pickled under ``build/mutation/graphs``, keyed by a digest of every spec and configuration file
and of the agreement module's ``CONSTANTS`` line.  Each test run then only explores the model
(seconds) and compares it with the cached graph, with the same checks as the full agreement.

``AGREEMENT_FOR_MODULE`` names the configurations each model module's mutants are compared on: the
smallest CI configurations that exercise its actions (``tests/model/test_agreement_cached.py`` runs
them).  ``python -m proofs.agreement_cache`` builds every cached graph ahead of a mutation session
(``proofs.mutation run`` does it before mutating the model), so no mutant's timeout pays for TLC.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from proofs import (
    cluster_agreement,
    container_failover_agreement,
    durable_log_agreement,
    exactly_once_sink_agreement,
    large_events_agreement,
    stable_writer_agreement,
    stream_ordering_agreement,
    transactions_agreement,
)
from proofs.explore import explore
from proofs.tla_values import parse_dot, parse_value
from proofs.tlc import SPEC_DIR, TLC_TIMEOUT_SECONDS, load_manifest, run_tlc

__all__ = ["AGREEMENTS", "AGREEMENT_FOR_MODULE", "CachedGraph", "agree", "cached_graph", "graph_directory",
           "run_tlc_for_agreement"]

#: Each spec's agreement module: Configuration, CONSTANTS, initial_states, successors, project, check.
AGREEMENTS: dict[str, ModuleType] = {
    "DurableLog": durable_log_agreement, "ContainerFailover": container_failover_agreement,
    "ExactlyOnceSink": exactly_once_sink_agreement, "LargeEvents": large_events_agreement,
    "StreamOrdering": stream_ordering_agreement, "Transactions": transactions_agreement,
    "StableWriter": stable_writer_agreement, "Cluster": cluster_agreement}

#: Per mutated model module, the (spec, configuration) pairs its mutants are compared on: the smallest
#: CI configurations, of a few thousand states (Cluster's smallest has 21,124), 0.3 to 6 s of exploring
#: each (Cluster_small: about 25 s) on a loaded machine.  Bigger ones (Transactions_lease, 14 s) cost
#: more per surviving mutant than a mutation budget affords.  ``idempotent_writer`` has no spec of its
#: own (its guards are tested directly).
AGREEMENT_FOR_MODULE: dict[str, tuple[tuple[str, str], ...]] = {
    "model/transactions.py": (("Transactions", "Transactions_roll.cfg"),),
    "model/stream_ordering.py": (("StreamOrdering", "StreamOrdering_checkpoint.cfg"),),
    "model/large_events.py": (("LargeEvents", "LargeEvents_reconnects.cfg"), ("LargeEvents", "LargeEvents_inline.cfg")),
    "model/exactly_once_sink.py": (("ExactlyOnceSink", "ExactlyOnceSink_faults.cfg"),
                                   ("ExactlyOnceSink", "ExactlyOnceSink_small.cfg")),
    "model/cluster.py": (("Cluster", "Cluster_small.cfg"),),
    "model/durable_log.py": (("DurableLog", "DurableLog_truncate.cfg"), ("DurableLog", "DurableLog_append_seal.cfg")),
}


def graph_directory() -> Path:
    """Where the cached graphs live (``MILLSTREAM_AGREEMENT_CACHE`` overrides it, for tests)."""
    override = os.environ.get("MILLSTREAM_AGREEMENT_CACHE")
    return Path(override) if override else SPEC_DIR.parent / "build" / "mutation" / "graphs"


def _frozen(state: Mapping[str, Any]) -> Hashable:
    return tuple(sorted(state.items()))


@dataclass(frozen=True)
class CachedGraph:
    """TLC's side of one configuration's agreement, reduced to what the comparison reads."""

    spec: str
    cfg: str
    constants: Any  # the constants as TLC printed them (``parse_value``), for ``Configuration.from_tlc``
    generated: int
    distinct: int
    depth: int
    states: frozenset[Hashable]
    initial: frozenset[Hashable]
    edges: Counter[tuple[Hashable, Hashable, str]]


def run_tlc_for_agreement(spec: str, cfg: str, workdir: Path, dump: bool) -> tuple[Any, Any]:
    """TLC on ``cfg`` without its liveness properties (they do not change the state graph), dumping the
    graph to ``workdir/graph.dot`` if ``dump``; the outcome and the constants as TLC printed them."""
    manifest = load_manifest()["specs"]
    agreement = AGREEMENTS[spec]
    for path in SPEC_DIR.iterdir():
        if path.suffix in (".tla", ".cfg"):
            shutil.copy(path, workdir / path.name)
    (workdir / "Agreement.tla").write_text(
        f"---- MODULE Agreement ----\nEXTENDS {manifest[spec]['model_module']}, TLC\n"
        f'ASSUME PrintT(<<"agreement-constants", <<{agreement.CONSTANTS}>>>>)\n====\n')
    cfg_text = re.sub(r"^PROPERTIES\s*\n(?:[ \t]+\S.*\n?)*", "", (SPEC_DIR / cfg).read_text(), flags=re.MULTILINE)
    (workdir / "agreement.cfg").write_text(cfg_text)
    profile = os.environ.get("MILLSTREAM_PROFILE", "ci")
    outcome = run_tlc(workdir, "Agreement", "agreement.cfg", dump_dot=workdir / "graph.dot" if dump else None,
                      timeout_seconds=TLC_TIMEOUT_SECONDS.get(profile, TLC_TIMEOUT_SECONDS["ci"]))
    assert outcome.returncode == 0, outcome.output[-3000:]
    printed = re.search(r'<<\s*"agreement-constants",(.*?)>>\s*\n(?:Starting|Computing|Running)', outcome.output, re.S)
    assert printed, outcome.output[:3000]
    return outcome, parse_value(printed.group(1))


def _digest(spec: str, cfg: str) -> str:
    digest = hashlib.sha256(f"{spec}\0{cfg}\0{AGREEMENTS[spec].CONSTANTS}\0".encode())
    for path in sorted(SPEC_DIR.iterdir()):
        if path.suffix in (".tla", ".cfg"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cached_graph(spec: str, cfg: str) -> CachedGraph:
    """TLC's graph of ``cfg``, from the cache if the spec files are unchanged since it was computed,
    else computed now (TLC, seconds to a minute) and cached."""
    path = graph_directory() / f"{Path(cfg).stem}-{_digest(spec, cfg)}.pickle"
    if path.exists():
        graph = CachedGraph(**pickle.loads(path.read_bytes()))
        assert (graph.spec, graph.cfg) == (spec, cfg), path
        return graph
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        outcome, constants = run_tlc_for_agreement(spec, cfg, workdir, dump=True)
        dot = parse_dot(workdir / "graph.dot")
    by_fingerprint = {fp: _frozen(state) for fp, state in dot.states.items()}
    graph = CachedGraph(
        spec, cfg, constants, outcome.generated, outcome.distinct, outcome.depth,
        frozenset(by_fingerprint.values()), frozenset(by_fingerprint[fp] for fp in dot.initial),
        Counter((by_fingerprint[a], by_fingerprint[b], label) for a, b, label in dot.edges))
    assert sum(graph.edges.values()) == graph.generated - len(dot.initial), "the dump lost edges"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary_path = path.with_suffix(".partial")
    # (its fields, not the class: the pickle must load whether this module ran as ``__main__`` or not)
    temporary_path.write_bytes(pickle.dumps(vars(graph), protocol=pickle.HIGHEST_PROTOCOL))
    temporary_path.replace(path)  # atomically: a run killed mid-write leaves no truncated cache
    return graph


def agree(graph: CachedGraph) -> None:
    """Explore the model with the graph's constants and assert that its state graph is TLC's: the same
    counts, the same states (one model state per spec state), the same initial states, the same
    multiset of labelled edges, and the model's invariants (``check``) on every state."""
    agreement = AGREEMENTS[graph.spec]
    constants = agreement.Configuration.from_tlc(graph.constants)
    python = explore(agreement.initial_states(constants), lambda state: agreement.successors(constants, state),
                     check=agreement.check, keep_edges=True, state_limit=10 * graph.distinct + 1000)
    assert (python.generated, python.distinct, python.depth) == (graph.generated, graph.distinct, graph.depth)
    projected = {state: _frozen(agreement.project(constants, state)) for state in python.states}
    assert len(set(projected.values())) == len(projected), "two model states project onto one spec state"
    assert set(projected.values()) == graph.states
    assert {projected[s] for s in agreement.initial_states(constants)} == graph.initial
    assert Counter((projected[a], projected[b], label) for a, b, label in python.edges) == graph.edges


def main() -> int:
    """Build every cached graph of ``AGREEMENT_FOR_MODULE`` (each is reused while the specs are unchanged)."""
    for pairs in AGREEMENT_FOR_MODULE.values():
        for spec, cfg in pairs:
            graph = cached_graph(spec, cfg)
            print(f"{cfg}: {graph.distinct} distinct states, {graph.generated} generated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
