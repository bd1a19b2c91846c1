"""The model's state graph equals TLC's on each model module's small configurations, against TLC's graph
cached once per spec text (``proofs.agreement_cache``): the agreement cheap enough to run on every
mutant of a mutation session (``proofs.mutation``'s selections name these tests by module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proofs.agreement_cache import AGREEMENT_FOR_MODULE, agree, cached_graph
from proofs.tlc import load_manifest

CASES = [(module, spec, cfg) for module, pairs in AGREEMENT_FOR_MODULE.items() for spec, cfg in pairs]


@pytest.mark.parametrize(("module", "spec", "cfg"), CASES, ids=[f"{Path(m).stem}-{Path(c).stem}" for m, _, c in CASES])
def test_model_agrees_with_the_cached_tlc_graph(module: str, spec: str, cfg: str) -> None:
    graph = cached_graph(spec, cfg)
    manifest = {c["cfg"]: c for c in load_manifest()["specs"][spec]["configs"]}[cfg]
    assert manifest["profile"] == "ci", "only CI configurations are small enough for every mutant"
    assert (graph.generated, graph.distinct, graph.depth) == (
        manifest["generated"], manifest["distinct"], manifest["depth"]), "manifest is stale"
    agree(graph)
