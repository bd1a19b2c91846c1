"""The API reference has something to say about every public name (issue 25 item 6).

The reference is pdoc's rendering of the public modules' docstrings (``docs/api.py``, ``tox -e docs``,
which fails on pdoc's warnings).  pdoc itself is not needed here: this test imports each public module
(``docs.api.PUBLIC_MODULES`` and their public submodules) and checks that the module and every public
name it defines -- class or function -- has a docstring of its own, so a name added without one fails
in the ordinary test run, not only in the docs build.  Methods are not checked one by one: many
(``close``, ``flush``, protocol implementations) are explained by their class's docstring.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest


def _docs_api() -> ModuleType:
    """``docs/api.py``, loaded from its file (``docs`` is not a package: an installed distribution that
    ships a top-level ``docs`` package would otherwise shadow it)."""
    spec = importlib.util.spec_from_file_location("millstream_docs_api", Path(__file__).resolve().parents[1] / "docs"
                                                  / "api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PUBLIC_MODULES: tuple[str, ...] = _docs_api().PUBLIC_MODULES

#: Modules that import PySpark: checked where it is installed (the spark extra; `tox -e docs` has it).
_NEEDS_PYSPARK = "millstream.spark"


def public_modules() -> list[str]:
    """The reference's modules and their submodules whose names have no part starting with '_'."""
    names: list[str] = []
    for spec in PUBLIC_MODULES:
        if spec.startswith("!"):
            continue
        names.append(spec)
        if spec == "millstream" or spec.startswith(_NEEDS_PYSPARK):
            continue  # (the top level's submodules are listed themselves; spark's are found below)
        found = importlib.util.find_spec(spec)
        assert found is not None, spec
        for info in pkgutil.walk_packages(found.submodule_search_locations or [], spec + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return names


def undocumented(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__]
    missing = [] if (module.__doc__ or "").strip() else [module.__name__]
    for name in names:
        value = getattr(module, name)
        if (inspect.isclass(value) or inspect.isfunction(value)) and not (value.__doc__ or "").strip():
            missing.append(f"{module.__name__}.{name}")
    return missing


@pytest.mark.parametrize("name", public_modules())
def test_every_public_name_has_a_docstring(name: str) -> None:
    if name.startswith(_NEEDS_PYSPARK):
        pytest.importorskip("pyspark", reason="millstream.spark needs PySpark (the spark extra); tox -e docs has it")
    module = importlib.import_module(name)
    if name == _NEEDS_PYSPARK:
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            if not info.name.rsplit(".", 1)[1].startswith("_"):
                assert undocumented(importlib.import_module(info.name)) == []
    assert undocumented(module) == [], "document these (the API reference shows their docstrings)"


def test_the_reference_covers_every_module_the_package_docstring_names() -> None:
    """``help(millstream)`` points to modules (``millstream.errors``, ``millstream.lowlevel``...): the
    reference has a page for each."""
    import millstream

    named = set(re.findall(r"``(millstream\.[a-z_.]+)``", millstream.__doc__ or ""))
    assert {"millstream.errors", "millstream.limits", "millstream.spark", "millstream.lowlevel"} <= named
    assert named <= set(public_modules())
