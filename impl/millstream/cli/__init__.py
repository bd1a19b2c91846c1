"""The ``millstream`` command.

One click group (``_group.main``); each public module of this package adds its subcommands to it with
``@main.command()`` or ``@main.group()`` when imported.  Every module is imported here, in name order,
so adding a command means adding a module -- no central list to edit.  A subcommand imports what it
needs when it runs, so ``millstream --help`` stays fast however many there are.
"""

from __future__ import annotations

import importlib
import pkgutil

from millstream.cli._group import main

__all__ = ["main"]

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
