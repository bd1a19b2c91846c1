"""How many of the contracts CrossHair confirms over all paths, at the budgets ``proofs/test_contracts.py`` uses.

``python -m proofs.crosshair_count`` runs ``crosshair check --analysis_kind PEP316 --report_all`` on
every target of the contracts test (``MILLSTREAM_PROFILE=nightly`` for the deep budgets) and prints,
per target and in total, the postconditions "Confirmed over all paths" against all of them, the
others being bounded ("Not confirmed": no counterexample within the budget).  A counterexample or an
error makes it exit 1.  ``--target NAME`` (repeatable) runs only those targets.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass

__all__ = ["Count", "count_report", "main", "run_target"]

_VERDICT = re.compile(
    r"^(?P<where>\S+:\d+): info: (?P<verdict>Confirmed over all paths|Not confirmed|Unable to meet precondition)\.",
    re.MULTILINE)
_PROBLEM = re.compile(r"^\S+:\d+: error: ", re.MULTILINE)


@dataclass(frozen=True)
class Count:
    target: str
    confirmed: int
    total: int
    problems: tuple[str, ...]
    seconds: float


def count_report(target: str, output: str, seconds: float = 0.0) -> Count:
    """The verdicts in one ``crosshair check --report_all`` output."""
    verdicts = [match.group("verdict") for match in _VERDICT.finditer(output)]
    problems = tuple(line for line in output.splitlines() if _PROBLEM.match(line))
    confirmed = sum(verdict == "Confirmed over all paths" for verdict in verdicts)
    return Count(target, confirmed, len(verdicts) + len(problems), problems, seconds)


def run_target(target: str, options: list[str]) -> Count:
    command = [sys.executable, "-m", "crosshair", "check", "--analysis_kind", "PEP316", "--report_all",
               *options, target]
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    return count_report(target, completed.stdout + completed.stderr, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    from proofs.test_contracts import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="only this target (repeatable)")
    arguments = parser.parse_args(argv)
    confirmed = total = 0
    failed = False
    for target in arguments.target or sorted(TARGETS):
        count = run_target(target, TARGETS[target])
        confirmed += count.confirmed
        total += count.total
        print(f"{target}: {count.confirmed}/{count.total} confirmed over all paths ({count.seconds:.0f} s)")
        for problem in count.problems:
            print(f"  {problem}")
        failed = failed or bool(count.problems)
    print(f"total: {confirmed}/{total} confirmed over all paths")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
