"""The nightly summary file: each command replaces its own section; the pytest plugin counts per file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proofs.summary import HEADER, write_section

REPOSITORY = Path(__file__).resolve().parent.parent


def test_each_command_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    summary = tmp_path / "NIGHTLY.md"
    write_section(summary, "TLC, nightly profile", "first TLC run")
    write_section(summary, "pytest proofs tests", "first pytest run")
    write_section(summary, "TLC, nightly profile", "second TLC run")
    text = summary.read_text()
    assert text.startswith(HEADER)
    assert "first TLC run" not in text and text.count("## TLC, nightly profile") == 1
    assert text.index("second TLC run") < text.index("## pytest proofs tests") < text.index("first pytest run")


def test_the_pytest_plugin_counts_outcomes_per_file(tmp_path: Path) -> None:
    tests = tmp_path / "test_sample.py"
    tests.write_text("import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    assert False\n\n"
                     "@pytest.mark.skip(reason='a reason')\ndef test_c():\n    pass\n")
    summary = tmp_path / "NIGHTLY.md"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "proofs.pytest_summary", "--summary",
                          str(summary), "-p", "no:cacheprovider", str(tests)],
                         cwd=REPOSITORY, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, run.stdout + run.stderr  # test_b fails, as written
    text = summary.read_text()
    assert f"## pytest {tests}" in text and "exit status 1" in text
    row = next(line for line in text.splitlines() if line.startswith("| `") and "test_sample.py" in line)
    assert [cell.strip() for cell in row.split("|")[2:5]] == ["1", "1", "1"], row
