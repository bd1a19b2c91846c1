"""The model's state graph equals TLC's on each model module's small configurations, against TLC's graph
cached once per spec text (``proofs.agreement_cache``): the agreement cheap enough to run on every
mutant of a mutation session (``proofs.mutation``'s selections name these tests by module).

``proofs/test_spec_model_agreement.py`` compares the very same configurations (and more) on every
run, so the cached comparisons run only where the mutation selections ask for them
(``MILLSTREAM_MUTATION=1``); the cache itself is tested on every run, on the smallest configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proofs import agreement_cache
from proofs.agreement_cache import AGREEMENT_FOR_MODULE, agree, cached_graph
from proofs.tlc import load_manifest

CASES = [(module, spec, cfg) for module, pairs in AGREEMENT_FOR_MODULE.items() for spec, cfg in pairs]


@pytest.mark.skipif(os.environ.get("MILLSTREAM_MUTATION") != "1",
                    reason="proofs/test_spec_model_agreement.py compares these configurations on every run; this "
                           "cached form is for the mutation selections (proofs.mutation sets MILLSTREAM_MUTATION=1)")
@pytest.mark.parametrize(("module", "spec", "cfg"), CASES, ids=[f"{Path(m).stem}-{Path(c).stem}" for m, _, c in CASES])
def test_model_agrees_with_the_cached_tlc_graph(module: str, spec: str, cfg: str) -> None:
    graph = cached_graph(spec, cfg)
    manifest = {c["cfg"]: c for c in load_manifest()["specs"][spec]["configs"]}[cfg]
    assert manifest["profile"] == "ci", "only CI configurations are small enough for every mutant"
    assert (graph.generated, graph.distinct, graph.depth) == (
        manifest["generated"], manifest["distinct"], manifest["depth"]), "manifest is stale"
    agree(graph)


def test_the_graph_is_computed_once_and_a_wrong_model_disagrees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call runs TLC and caches the graph; the second reads the cache (TLC is not run); the
    model agrees with it, and a model with one edge fewer does not."""
    monkeypatch.setenv("MILLSTREAM_AGREEMENT_CACHE", str(tmp_path))
    spec, cfg = "ExactlyOnceSink", "ExactlyOnceSink_faults.cfg"
    graph = cached_graph(spec, cfg)
    assert [p.suffix for p in tmp_path.iterdir()] == [".pickle"]

    def no_tlc(*arguments: object, **keywords: object) -> None:
        raise AssertionError("TLC ran although the graph was cached")

    monkeypatch.setattr(agreement_cache, "run_tlc_for_agreement", no_tlc)
    assert cached_graph(spec, cfg) == graph
    agree(graph)
    module = agreement_cache.AGREEMENTS[spec]
    successors = module.successors

    def fewer(config: object, state: object) -> object:
        return [step for step in successors(config, state) if step[0] != "DriverCrash"]

    monkeypatch.setattr(module, "successors", fewer)
    with pytest.raises(AssertionError):
        agree(graph)
