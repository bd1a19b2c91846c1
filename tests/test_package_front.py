"""The package's front (issue 22, item 9): ``import millstream`` holds what the README says it holds --
what an application starts from -- and the segment store's building blocks are ``millstream.lowlevel``;
``help(millstream)`` opens with what the package is and names only things that exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import millstream
from millstream import lowlevel

ROOT = Path(__file__).resolve().parent.parent
NAMES_COLUMN = len("millstream.lowlevel  ")


def documented_namespaces() -> dict[str, set[str]]:
    """The README's table of names: a module at the line's start, its names from ``NAMES_COLUMN`` on
    (group labels in between are for the reader)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"### What `import millstream` holds\n.*?```text\n(.*?)```", readme, re.S)
    assert match, "the README's section on the top-level names is missing"
    namespaces: dict[str, set[str]] = {}
    module = ""
    for line in match.group(1).splitlines():
        if not line.startswith(" "):
            module = line[:NAMES_COLUMN].strip()
        namespaces.setdefault(module, set()).update(line[NAMES_COLUMN:].split())
    return namespaces


def public_names(module: ModuleType) -> set[str]:
    """What ``dir(module)`` offers a user: public names that are not submodules (modules in its
    ``__all__`` count)."""
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and (not isinstance(value, ModuleType) or name in module.__all__)}


def test_the_top_level_namespace_is_what_the_readme_documents() -> None:
    documented = documented_namespaces()
    assert set(documented) == {"millstream", "millstream.lowlevel"}
    assert documented["millstream"] == set(millstream.__all__)
    assert documented["millstream.lowlevel"] == set(lowlevel.__all__)
    for module in (millstream, lowlevel):
        assert all(hasattr(module, name) for name in module.__all__)  # imports the names imported on first use
        assert public_names(module) == set(module.__all__), module.__name__


@pytest.mark.parametrize("name", ["SegmentContainer", "FileLog", "ContainerHost", "DurableDataLog", "ChunkStorage",
                                  "FileChunkStorage", "SegmentInfo", "StorageSettings"])
def test_the_building_blocks_left_the_top_level_with_a_clear_path(name: str) -> None:
    assert name in lowlevel.__all__ and name not in millstream.__all__ and name not in dir(millstream)
    with pytest.warns(DeprecationWarning, match=f"millstream.lowlevel import {name}"):
        moved = getattr(millstream, name)
    assert moved is getattr(lowlevel, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict[str, object] = {}
        exec(f"from millstream.lowlevel import {name}", namespace)  # the new path warns about nothing
    assert namespace[name] is moved
    with pytest.raises(AttributeError, match="no attribute 'Nonsense'"):
        _ = millstream.Nonsense  # type: ignore[attr-defined]


def test_help_opens_with_what_the_package_is_and_names_what_exists() -> None:
    doc = millstream.__doc__ or ""
    assert doc.startswith("millstream: a durable, elastic, exactly-once stream store.\n")
    names = set(re.findall(r"``([^`]+)``", doc))
    assert {"connect(uri)", "standalone(data_dir)", "millstream.lowlevel"} <= names
    for name in sorted(names):
        reference = name.split("(")[0]
        if " " in reference:  # a shell command
            assert reference.startswith("millstream "), name
        elif reference.startswith("millstream."):
            assert importlib.util.find_spec(reference) is not None, name
        elif reference.startswith("client."):
            assert hasattr(millstream.Client, reference.removeprefix("client.")), name
        else:
            assert reference in millstream.__all__ or reference in lowlevel.__all__, name


def run_fresh(program: str) -> str:
    """What a fresh interpreter prints running ``program``."""
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()


def test_importing_the_package_does_not_import_a_node() -> None:
    """A client (a Spark worker above all) imports ``millstream`` often; the node it never runs --
    segment store, server, controller, metrics -- is imported when a node is built."""
    loaded = run_fresh("import sys, millstream\n"
                       "print(' '.join(m for m in sys.modules if m.startswith(('millstream.server', "
                       "'millstream.controller', 'millstream.segmentstore', 'millstream.health', "
                       "'millstream.metrics'))))")
    assert loaded == ""


@pytest.mark.parametrize("first", ["import millstream.standalone", "from millstream.standalone import Node",
                                   "from millstream import standalone", "import millstream"])
def test_standalone_stays_the_function_whichever_import_comes_first(first: str) -> None:
    """``millstream.standalone`` is a function and the name of its submodule: importing the submodule
    must not replace the function."""
    printed = run_fresh(f"{first}\nimport millstream\nfrom millstream import standalone, StandaloneNode\n"
                        "import millstream.standalone\n"
                        "print(millstream.standalone is standalone, callable(standalone), "
                        "standalone.__module__, StandaloneNode.__name__)")
    assert printed == "True True millstream.standalone StandaloneNode"
