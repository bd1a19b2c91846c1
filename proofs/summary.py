"""A deep run's summary in one Markdown file (``NIGHTLY.md``): each command of ``tox -e nightly`` -- TLC
over the deep configurations, pytest over the deep profile, the pipeline's kill campaign -- replaces
its own section and leaves the others, so the file always shows the latest run of each.

Used by ``python -m proofs.tlc check --summary FILE`` and by the pytest plugin
``proofs.pytest_summary`` (``pytest -p proofs.pytest_summary --summary FILE``).
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["write_section"]

HEADER = """# The nightly run

Written by `tox -e nightly` (each of its commands replaces its own section below); what it ran, how
many passed and how long each part took on the machine that ran it.  The default `tox` run's figures
are in the closing notes of the issues, the benchmarks' in BENCHMARKS.md.
"""


def write_section(path: Path, title: str, body: str) -> None:
    """Put ``body`` under ``## title`` in ``path``, replacing that section if it is there."""
    text = path.read_text() if path.exists() else HEADER
    section = f"## {title}\n\n{body.rstrip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")
