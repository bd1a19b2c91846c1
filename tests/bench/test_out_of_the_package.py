"""The benchmarks live in the clone's top-level ``bench/`` folder, not in the shipped package (issue 22,
item 7): the wheel's package list holds none of them, the store's limits hold none of theirs (nor the
simulated network's, which live in ``millstream.testing``), nothing shipped imports them, and
``millstream bench`` is a thin entry point -- ``python -m bench`` from a clone, else a message saying how.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import bench
from bench import limits as bench_limits
from bench._processes import CLONE_ROOT, module_environment
from millstream import limits
from millstream.cli import main
from millstream.testing import limits as testing_limits

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_wheel_holds_no_benchmarks() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not [name for name in setuptools["packages"] if "bench" in name], setuptools["packages"]
    assert not [name for name in setuptools.get("package-data", {}) if "bench" in name]
    assert not (ROOT / "impl" / "millstream" / "bench").exists(), "the benchmarks moved to bench/ at the clone's root"
    assert importlib.util.find_spec("millstream.bench") is None
    assert Path(bench.__file__).resolve() == ROOT / "bench" / "__init__.py"


def test_the_stores_limits_are_the_stores_own() -> None:
    strays = [name for name in vars(limits) if name.startswith(("BENCH_", "SIMULATED_"))]
    assert strays == [], f"millstream.limits holds limits of the benchmarks or the simulation: {strays}"
    assert bench_limits.BENCH_DRIVER_CALL_TIMEOUT_SECONDS > 0 and bench_limits.BENCH_STEP_BYTES_MAX > 0
    assert testing_limits.SIMULATED_NETWORK_PIPE_BYTES_MAX > testing_limits.SIMULATED_NETWORK_WRITE_BUFFER_HIGH_BYTES


@pytest.mark.parametrize("folder", ["impl", "model", "spark_pipeline"])
def test_nothing_shipped_imports_the_benchmarks(folder: str) -> None:
    importers = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            importers += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name == "bench" or name.startswith("bench.")]
    assert importers == [], "the installed package cannot import the clone's benchmarks"


def test_millstream_bench_runs_python_m_bench_from_a_clone() -> None:
    from millstream.cli.bench import find_clone

    assert find_clone() == ROOT  # (the tests run from an editable install of this clone)
    help_text = CliRunner().invoke(main, ["bench", "--help"]).output
    assert help_text.startswith("Usage: millstream bench [OPTIONS]") and "--suite" in help_text
    result = CliRunner().invoke(main, ["bench", "--suite", "nonsense"])
    assert result.exit_code == 2 and "nonsense" in result.output
    ran = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert ran.returncode == 0 and ran.stdout.startswith("Usage: python -m bench [OPTIONS]"), ran.stderr


def test_millstream_bench_outside_a_clone_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from millstream.cli import bench as thin

    assert thin.find_clone((tmp_path,)) is None
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__main__.py").write_text("")
    assert thin.find_clone((tmp_path,)) is None, "a bench/ folder alone is not a millstream clone"
    monkeypatch.setattr(thin, "find_clone", lambda: None)
    for arguments in (["bench", "--suite", "quick"], ["bench", "--help"]):
        result = CliRunner().invoke(main, arguments)
        assert result.exit_code == 1, result.output
        assert "not part of the installed millstream package" in result.output
        assert "python -m bench --suite quick" in result.output


def test_a_child_finds_the_benchmarks_from_any_working_directory(tmp_path: Path) -> None:
    assert CLONE_ROOT == ROOT
    environment = module_environment()
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    ran = subprocess.run([sys.executable, "-c", "import bench; print(bench.__file__)"], cwd=tmp_path,
                         env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    assert Path(ran.stdout.strip()).resolve() == ROOT / "bench" / "__init__.py"


def test_millstream_pipeline_bench_runs_the_clones_bench_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark", reason="the Spark pipeline's bench needs the spark extra (tox's spark env)")
    from millstream.cli import bench as thin

    loaded = thin.load_benchmarks("bench.pipeline")  # (imports pyspark's Python side only: no JVM)
    assert Path(loaded.__file__).resolve() == ROOT / "bench" / "pipeline.py"
    assert importlib.util.find_spec("millstream.spark.bench") is None, "the Spark bench left the package too"
    monkeypatch.setattr(thin, "find_clone", lambda: None)
    result = CliRunner().invoke(main, ["pipeline", "bench", "--rows", "1000"])
    assert result.exit_code == 1 and "not part of the installed millstream package" in result.output, result.output
