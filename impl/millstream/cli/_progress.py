"""Progress on stderr for long commands: a bar on a terminal, one line per step otherwise."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

__all__ = ["Progress"]


class Progress:
    """Progress on stderr: a bar on a terminal, one line per step otherwise (logs, CI)."""

    def __init__(self, stack: contextlib.ExitStack, label: str) -> None:
        self._stack = stack
        self._label = label
        self._terminal = sys.stderr.isatty()
        self._bar: ProgressBar[Any] | None = None

    def __call__(self, done: int, total: int, step: str) -> None:
        if not self._terminal:
            click.echo(f"[{done}/{total}] {step}", err=True)
            return
        if self._bar is None:
            self._bar = self._stack.enter_context(click.progressbar(
                length=total, label=self._label, file=sys.stderr, show_pos=True, item_show_func=lambda item: item))
        self._bar.update(done - self._bar.pos, step)
        self._bar.render_progress()  # update() skips it for 0 steps: the first step's label would not show
