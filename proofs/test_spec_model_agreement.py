"""The Python model *is* the spec, within each configuration's bounds.

For every configuration of a spec in ``spec/manifest.json`` (the CI ones of at most
``AGREEMENT_CI_STATES_MAX`` states by default, all of them with ``MILLSTREAM_PROFILE=nightly``), TLC
explores the spec and dumps its state graph, the model is explored exhaustively with the same
constants, and the two must have the same generated states, distinct states and depth (which must
also equal the manifest's), the very same set of states, and the same multiset of labelled edges.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import pytest

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

PROFILE = os.environ.get("MILLSTREAM_PROFILE", "ci")
#: Each spec's agreement module: Configuration, CONSTANTS, initial_states, successors, project, check.
AGREEMENTS = {"DurableLog": durable_log_agreement, "ContainerFailover": container_failover_agreement,
              "ExactlyOnceSink": exactly_once_sink_agreement, "LargeEvents": large_events_agreement,
              "StreamOrdering": stream_ordering_agreement, "Transactions": transactions_agreement,
              "StableWriter": stable_writer_agreement, "Cluster": cluster_agreement}
MANIFEST = load_manifest()["specs"]
#: The default run compares the model with TLC on every CI configuration up to this many distinct
#: states; bigger ones (ContainerFailover_three: 201,490, a few minutes of Python exploring) are compared
#: nightly.  The tlc env still checks every CI configuration's invariants and counts with TLC.
AGREEMENT_CI_STATES_MAX = 60_000
CASES = [(name, config) for name, spec in MANIFEST.items() for config in spec["configs"]
         if PROFILE == "nightly" or (config["profile"] == "ci" and config["distinct"] <= AGREEMENT_CI_STATES_MAX)]
# The dot dump of a big configuration is hundreds of MB; above this only counts are compared.
EDGE_COMPARISON_STATES_MAX = 60_000

def _frozen(state: Mapping[str, Any]) -> Hashable:
    return tuple(sorted(state.items()))


def _run_tlc_with_dump(spec: str, cfg: str, workdir: Path, dump: bool) -> tuple[Any, Any]:
    agreement = AGREEMENTS[spec]
    for path in SPEC_DIR.iterdir():
        if path.suffix in (".tla", ".cfg"):
            shutil.copy(path, workdir / path.name)
    (workdir / "Agreement.tla").write_text(
        f"---- MODULE Agreement ----\nEXTENDS {MANIFEST[spec]['model_module']}, TLC\n"
        f'ASSUME PrintT(<<"agreement-constants", <<{agreement.CONSTANTS}>>>>)\n====\n')
    # Liveness does not change the state graph; leave it out to keep the run and the dump small.
    cfg_text = re.sub(r"^PROPERTIES\s*\n(?:[ \t]+\S.*\n?)*", "", (SPEC_DIR / cfg).read_text(), flags=re.MULTILINE)
    (workdir / "agreement.cfg").write_text(cfg_text)
    outcome = run_tlc(workdir, "Agreement", "agreement.cfg", dump_dot=workdir / "graph.dot" if dump else None,
                      timeout_seconds=TLC_TIMEOUT_SECONDS[PROFILE])
    assert outcome.returncode == 0, outcome.output[-3000:]
    printed = re.search(r'<<\s*"agreement-constants",(.*?)>>\s*\n(?:Starting|Computing|Running)', outcome.output, re.S)
    assert printed, outcome.output[:3000]
    return outcome, agreement.Configuration.from_tlc(parse_value(printed.group(1)))


@pytest.mark.parametrize(("spec", "config"), CASES, ids=[c["cfg"] for _, c in CASES])
def test_model_state_graph_equals_tlc(spec: str, config: dict[str, Any]) -> None:
    agreement = AGREEMENTS[spec]
    compare_edges = config["distinct"] <= EDGE_COMPARISON_STATES_MAX
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        outcome, constants = _run_tlc_with_dump(spec, config["cfg"], workdir, dump=compare_edges)
        graph = parse_dot(workdir / "graph.dot") if compare_edges else None

    python = explore(
        agreement.initial_states(constants),
        lambda state: agreement.successors(constants, state),
        check=agreement.check,
        keep_edges=compare_edges,
    )
    tlc_counts = (outcome.generated, outcome.distinct, outcome.depth)
    assert (python.generated, python.distinct, python.depth) == tlc_counts
    assert tlc_counts == (config["generated"], config["distinct"], config["depth"]), "manifest is stale"
    if graph is None:
        return

    by_fingerprint = {fp: _frozen(state) for fp, state in graph.states.items()}
    projected: dict[Hashable, Hashable] = {}
    for state in python.states:
        projected[state] = _frozen(agreement.project(constants, state))
    assert len(set(projected.values())) == len(projected), "two model states project onto one spec state"
    assert set(projected.values()) == set(by_fingerprint.values())
    assert {by_fingerprint[fp] for fp in graph.initial} == {
        projected[s] for s in agreement.initial_states(constants)}
    tlc_edges = Counter((by_fingerprint[a], by_fingerprint[b], label) for a, b, label in graph.edges)
    python_edges = Counter((projected[a], projected[b], label) for a, b, label in python.edges)
    assert sum(tlc_edges.values()) == outcome.generated - len(graph.initial)
    assert python_edges == tlc_edges
