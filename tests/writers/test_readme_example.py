"""The README's examples of a writer with a stable id and of batches and columns run as written and print what
they say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_stable_writer_example_runs_and_prints_what_it_says() -> None:
    text = README.read_text()
    section = text.split("### Exactly once across restarts of the writer's process", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.group(1), str(README), "exec"), {"__name__": "readme"})
    assert printed.getvalue().split() == ["100", "0"]


def test_the_readme_batch_and_columns_example_runs_and_prints_what_it_says() -> None:
    text = README.read_text()
    section = text.split("### Many events at once: batches and columns", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.group(1), str(README), "exec"), {"__name__": "readme"})
    assert printed.getvalue().split() == ["2000"]
