"""``proofs.mutation``'s report, from fabricated tool results (fast: no mutant runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proofs.agreement_cache import AGREEMENT_FOR_MODULE
from proofs.mutation import (
    OPERATORS,
    SCOPE,
    Mutant,
    Site,
    current_sites,
    disposition_kind,
    load_dispositions,
    render,
    score,
    sites,
    stale,
)

MODULE = "model/transactions.py"


def mutants(package: str, module: str, **outcomes: int) -> list[Mutant]:
    made = []
    line = 1
    for outcome, count in outcomes.items():
        for _ in range(count):
            made.append(Mutant(package, module, line, "core/NumberReplacer", 0, outcome, text=f"line {line} | a"))
            line += 1
    return made


def test_a_complete_package_and_a_partial_one() -> None:
    results = [*mutants("model", MODULE, killed=17, timeout=1, survived=2, skipped=5),
               Mutant("model", MODULE, 99, "core/RemoveDecorator", 0, "skipped", chosen=False),
               *mutants("server", "impl/millstream/server/_appends.py", killed=3, pending=4)]
    scores = score(results)
    model, server = scores["model"], scores["server"]
    assert (model.generated, model.sampled, model.run, model.killed, model.survived, model.timeout) == (
        25, 20, 20, 17, 2, 1)
    assert model.kill_rate == pytest.approx(0.9) and not model.partial
    assert (server.run, server.pending, server.kill_rate, server.partial) == (3, 4, 1.0, True)
    assert scores["spark"].kill_rate is None

    text = render(results, {Site(MODULE, "core/NumberReplacer", "line 19 | a", 0): "killed by test_x since"},
                  date="2026-11-27", commands=["python -m proofs.mutation run --package model"],
                  tool_version="8.7.0")
    table, survivors = text.split("## Surviving mutants")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["model"] == ("| model | 25 | 20 | 20 | 17 | 2 | 1 | 0 | 90.0% |"
                             " 95.0% (1 killed since, 0 equivalent, 1 open) |")
    assert rows["server"] == ("| server | 7 | 7 | 3 | 3 | 0 | 0 | 0 | 100.0% (partial: 4 not run) |"
                              " 100.0% (0 killed since, 0 equivalent, 0 open) |")
    assert rows["spark"].endswith("| not run | not run |")
    assert "`python -m proofs.mutation run --package model`" in text and "cosmic-ray 8.7.0" in text
    # Every survivor is listed, quoted, with its disposition or as open.
    survivor_rows = [line for line in survivors.splitlines() if "core/NumberReplacer" in line]
    assert len(survivor_rows) == 2
    assert survivor_rows[0] == (f"| model | `{MODULE}:19:core/NumberReplacer:0` | `line 19 \\| a` |"
                                " killed by test_x since |")
    assert survivor_rows[1].endswith("| **open**: not examined yet |")


def test_an_equivalent_survivor_leaves_the_rate_after_dispositions() -> None:
    results = mutants("model", MODULE, killed=3, survived=1)
    equivalent = {Site(MODULE, "core/NumberReplacer", "line 4 | a", 0): "equivalent: the value is never read"}
    text = render(results, equivalent, date="d", commands=[], tool_version="v")
    assert "| 75.0% | 100.0% (0 killed since, 1 equivalent, 0 open) |" in text
    assert disposition_kind("**open**: trace-only") == "open" and disposition_kind(None) == "open"


def test_no_survivors_and_unknown_outcomes() -> None:
    text = render(mutants("model", MODULE, killed=2), {}, date="d", commands=[], tool_version="v")
    assert text.endswith("## Surviving mutants\n\nNone.\n")
    with pytest.raises(ValueError, match="unknown outcome"):
        score([Mutant("model", MODULE, 1, "core/AddNot", 0, "lost")])


def test_dispositions_file_and_scope(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text('[[survivor]]\nmodule = "model/x.py"\noperator = "core/AddNot"\nline = "  if a:  "\n'
                    'occurrence = 1\ndisposition = "equivalent: ..."\n', "utf-8")
    assert load_dispositions(path) == {Site("model/x.py", "core/AddNot", "if a:", 1): "equivalent: ..."}
    assert load_dispositions(tmp_path / "missing.toml") == {}
    path.write_text(path.read_text("utf-8") * 2, "utf-8")
    with pytest.raises(ValueError, match="two dispositions"):
        load_dispositions(path)
    root = Path(__file__).resolve().parent.parent
    for target in SCOPE:
        assert (root / target.module).is_file(), target
        for tests in target.tests:
            assert (root / tests.partition("::")[0]).exists(), (target, tests)
        # The model's selections run the cached agreement on exactly the configurations named for the module.
        named = {t.partition("[")[2].rstrip("]") for t in target.tests if "test_model_agreement_cached" in t}
        assert named == {f"{Path(target.module).stem}-{Path(cfg).stem}"
                         for _, cfg in AGREEMENT_FOR_MODULE.get(target.module, ())}, target
    assert OPERATORS.match("core/ReplaceComparisonOperator_Lt_LtE")
    assert not OPERATORS.match("core/ReplaceBinaryOperator_Add_LShift")
    assert not OPERATORS.match("core/RemoveDecorator")


def test_fresh_forgets_only_the_named_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proofs import mutation

    monkeypatch.setattr(mutation, "SESSIONS", tmp_path)
    for package in ("model", "spark"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "x.sqlite").write_text("")
    (tmp_path / "commands.txt").write_text("python -m proofs.mutation run\n"
                                           "python -m proofs.mutation run --package model --seed 3\n"
                                           "python -m proofs.mutation run --package spark --seed 3\n")
    mutation.forget(["model"])
    assert not (tmp_path / "model").exists() and (tmp_path / "spark" / "x.sqlite").exists()
    # The commands that sampled the forgotten package go; the other package's stay, for its report.
    assert (tmp_path / "commands.txt").read_text() == "python -m proofs.mutation run --package spark --seed 3\n"


def test_sites_are_named_by_the_line_text_and_the_occurrence_on_lines_of_that_text() -> None:
    source = "x = 1\ny = [1, 1]\nx = 1\n"
    number = "core/NumberReplacer"
    named = sites("m.py", source, [(number, 1), (number, 2), (number, 2), (number, 3), ("core/AddNot", 3)])
    assert named == [Site("m.py", number, "x = 1", 0), Site("m.py", number, "y = [1, 1]", 0),
                     Site("m.py", number, "y = [1, 1]", 1), Site("m.py", number, "x = 1", 1),
                     Site("m.py", "core/AddNot", "x = 1", 0)]


def test_a_disposition_survives_edits_elsewhere_and_is_stale_once_its_line_changes(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f(a, b):\n    if a < b:\n        return a\n    return b\n", "utf-8")
    kept = Site("m.py", "core/ReplaceComparisonOperator_Lt_LtE", "if a < b:", 0)
    gone = Site("m.py", "core/ReplaceComparisonOperator_Lt_LtE", "if a < c:", 0)
    assert kept in current_sites("m.py", tmp_path)
    dispositions = {kept: "equivalent: ...", gone: "killed since by test_g (confirmed)"}
    assert stale(dispositions, ["m.py"], tmp_path) == [gone]
    # Lines added above move the mutant's line number, not its site.
    module.write_text("import os\n\n\n" + module.read_text("utf-8"), "utf-8")
    assert stale(dispositions, ["m.py"], tmp_path) == [gone]
    # Editing the mutated line makes its disposition stale; only the modules named are checked.
    module.write_text(module.read_text("utf-8").replace("a < b", "a < b + 1"), "utf-8")
    assert stale(dispositions, ["m.py"], tmp_path) == [kept, gone]
    (tmp_path / "other.py").write_text("x = 1\n", "utf-8")
    assert stale(dispositions, ["other.py"], tmp_path) == []
    text = render([], dispositions, date="d", commands=[], tool_version="v", stale_sites=[kept])
    assert "## Stale dispositions" in text
    assert "| `m.py` | `core/ReplaceComparisonOperator_Lt_LtE` | `if a < b:` | 0 |" in text


def test_every_disposition_names_a_mutant_of_the_current_sources() -> None:
    modules = {target.module for target in SCOPE}
    dispositions = load_dispositions()
    assert {site.module for site in dispositions} <= modules
    assert stale(dispositions, modules) == []


def test_a_package_sample_is_shared_out_among_its_modules() -> None:
    from proofs.mutation import sample_sizes

    sizes = sample_sizes(["segmentstore", "server"], 40, 20)
    segmentstore = [t.module for t in SCOPE if t.package == "segmentstore"]
    assert len(segmentstore) == 3 and [sizes[m] for m in segmentstore] == [7, 7, 6]
    assert sizes["impl/millstream/server/_appends.py"] == 20
    assert set(sample_sizes(["model"], 23, None).values()) == {23}
