"""``proofs.mutation``'s report, from fabricated tool results (fast: no mutant runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proofs.mutation import OPERATORS, SCOPE, Mutant, disposition_kind, load_dispositions, render, score

MODULE = "model/transactions.py"


def mutants(package: str, module: str, **outcomes: int) -> list[Mutant]:
    made = []
    line = 1
    for outcome, count in outcomes.items():
        for _ in range(count):
            made.append(Mutant(package, module, line, "core/NumberReplacer", 0, outcome))
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

    text = render(results, {f"{MODULE}:19:core/NumberReplacer:0": "killed by test_x since"},
                  date="2026-11-27", commands=["python -m proofs.mutation run --package model"],
                  tool_version="8.7.0", sources={MODULE: "\n".join(f"line {n} | a" for n in range(1, 30))})
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
    text = render(results, {f"{MODULE}:4:core/NumberReplacer:0": "equivalent: the value is never read"},
                  date="d", commands=[], tool_version="v")
    assert "| 75.0% | 100.0% (0 killed since, 1 equivalent, 0 open) |" in text
    assert disposition_kind("**open**: trace-only") == "open" and disposition_kind(None) == "open"


def test_no_survivors_and_unknown_outcomes() -> None:
    text = render(mutants("model", MODULE, killed=2), {}, date="d", commands=[], tool_version="v")
    assert text.endswith("## Surviving mutants\n\nNone.\n")
    with pytest.raises(ValueError, match="unknown outcome"):
        score([Mutant("model", MODULE, 1, "core/AddNot", 0, "lost")])


def test_dispositions_file_and_scope(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text('[survivors]\n"model/x.py:3:core/AddNot:0" = "equivalent: ..."\n', "utf-8")
    assert load_dispositions(path) == {"model/x.py:3:core/AddNot:0": "equivalent: ..."}
    assert load_dispositions(tmp_path / "missing.toml") == {}
    root = Path(__file__).resolve().parent.parent
    for target in SCOPE:
        assert (root / target.module).is_file(), target
        for tests in target.tests:
            assert (root / tests).exists(), (target, tests)
    assert OPERATORS.match("core/ReplaceComparisonOperator_Lt_LtE")
    assert not OPERATORS.match("core/ReplaceBinaryOperator_Add_LShift")
    assert not OPERATORS.match("core/RemoveDecorator")


def test_fresh_forgets_only_the_named_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proofs import mutation

    monkeypatch.setattr(mutation, "SESSIONS", tmp_path)
    for package in ("model", "spark"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "x.sqlite").write_text("")
    (tmp_path / "commands.txt").write_text("python -m proofs.mutation run\n")
    mutation.forget(["model"])
    assert not (tmp_path / "model").exists() and (tmp_path / "spark" / "x.sqlite").exists()
    assert not (tmp_path / "commands.txt").exists()
