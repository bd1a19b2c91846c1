"""A pytest plugin that writes the run's outcome per test file to a summary file (``proofs.summary``).

    pytest -p proofs.pytest_summary --summary NIGHTLY.md proofs tests

The section is titled by the command line's paths and says, per file, how many tests passed, failed
and were skipped and how long they took (setup, call and teardown), with the totals, the Hypothesis
profile (``MILLSTREAM_PROFILE``) and when the run ended.
"""

from __future__ import annotations

import collections
import datetime
import os
import time
from pathlib import Path

import pytest

from proofs.summary import write_section

__all__ = ["Summary"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--summary", metavar="FILE", default=None,
                     help="write this run's outcome per test file into FILE (a Markdown section of its own)")


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--summary")
    if target is not None:
        config.pluginmanager.register(Summary(Path(target), [str(arg) for arg in config.args]), "millstream-summary")


class Summary:
    """Counts outcomes and seconds per test file; writes them when the session ends."""

    def __init__(self, target: Path, args: list[str]) -> None:
        self.target = target
        self.args = args
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.seconds[path] += report.duration
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.counts[path][report.outcome] += 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        rows = ["| test file | passed | failed | skipped | seconds |", "|---|---:|---:|---:|---:|"]
        totals: collections.Counter[str] = collections.Counter()
        for path in sorted(self.counts):
            count = self.counts[path]
            totals.update(count)
            rows.append(f"| `{path}` | {count['passed']} | {count['failed']} | {count['skipped']} | "
                        f"{self.seconds[path]:,.0f} |")
        rows.append(f"| **all** | {totals['passed']} | {totals['failed']} | {totals['skipped']} | "
                    f"{time.monotonic() - self.started:,.0f} |")
        ended = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        body = (f"Ended {ended}, exit status {int(exitstatus)}, Hypothesis profile "
                f"`{os.environ.get('MILLSTREAM_PROFILE', 'ci')}`.\n\n" + "\n".join(rows))
        write_section(self.target, "pytest " + " ".join(self.args), body)
