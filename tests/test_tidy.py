"""Machines enforce the rules (STYLE.md #14).  Each failure names the replacement."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "model"
IMPL = ROOT / "impl" / "millstream"  # (rglob does not follow its links to model/ and spark_pipeline/)
SPARK = ROOT / "spark_pipeline"
BENCH = ROOT / "bench"


def python_files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("path", python_files(MODEL), ids=lambda p: str(p.relative_to(ROOT)))
def test_model_imports_only_the_model(path: Path) -> None:
    for module in imported_modules(path):
        if module.startswith("millstream"):
            assert module.startswith("millstream.model"), (
                f"{path.name} imports {module}: the model must not depend on the implementation")
        assert module.split(".")[0] not in {"asyncio", "socket", "random", "time", "datetime", "os", "threading"}, (
            f"{path.name} imports {module}: the model is pure -- no I/O, clock, randomness or threads")


@pytest.mark.parametrize("path", python_files(IMPL), ids=lambda p: str(p.relative_to(ROOT)))
def test_impl_imports_only_model_vocabulary(path: Path) -> None:
    for module in imported_modules(path):
        if module.startswith("millstream.model"):
            assert module in {"millstream.model.types", "millstream.model.errors"}, (
                f"{path.name} imports {module}: impl may use only millstream.model.types and .errors "
                "(the model's transitions must stay independent for differential tests)")
        if path.parent.name != "cli":
            # The CLI is the one place that may start the Spark pipeline (`millstream demo`, `pipeline`),
            # and it imports it only inside those commands; the store itself never depends on Spark.
            assert not module.startswith("millstream.spark"), f"{path.name} imports the Spark pipeline"


@pytest.mark.parametrize("path", python_files(SPARK), ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_uses_the_public_api(path: Path) -> None:
    for module in imported_modules(path):
        assert not module.startswith("millstream.model"), f"{path.name} imports the model"


BANNED = [
    (re.compile(r"^\s*except\s*:", re.M),
     "a bare `except:`; catch the error you expect (or BaseException and re-raise)"),
    (re.compile(r"\btime\.time\("), "time.time(); take a Clock (millstream.clock) so tests can drive time"),
    (re.compile(r"\bdatetime\.now\("), "datetime.now(); take a Clock so tests can drive time"),
    (re.compile(r"^\s*asyncio\.(create_task|ensure_future)\(", re.M),
     "a fire-and-forget task; keep the task (a TaskGroup or a tracked attribute) and await or cancel it"),
    (re.compile(r"^\s*(?:import random|from random import)", re.M),
     "the random module in production code; take a seeded random.Random from the caller"),
]


@pytest.mark.parametrize("path", python_files(MODEL, IMPL, SPARK, BENCH), ids=lambda p: str(p.relative_to(ROOT)))
def test_banned_patterns(path: Path) -> None:
    text = path.read_text()
    for pattern, replacement in BANNED:
        if path.parts[-2] == "testing" and "random" in pattern.pattern:
            continue  # the simulation layer takes seeds and builds its own Random
        assert not pattern.search(text), f"{path.relative_to(ROOT)} uses {replacement}"


def test_no_python_O_assumptions() -> None:
    """Invariants are asserts in places; running with -O would silently drop them."""
    assert __debug__, "never run millstream's tests with python -O"


def test_every_package_of_the_source_tree_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages a wheel holds (an editable install finds more): a package
    added under impl/millstream must be listed, or an installed millstream lacks it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {"millstream"} | {f"millstream.{init.parent.name}" for init in IMPL.glob("*/__init__.py")}
    assert on_disk == listed, (f"on disk, not listed: {sorted(on_disk - listed)}; "
                               f"listed, not on disk: {sorted(listed - on_disk)}")
