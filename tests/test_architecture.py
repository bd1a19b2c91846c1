"""The import graph of the package: no cycles, and each layer talks only to the ones below it.

The graph is read from the source files with ``ast`` (no import runs), through the same mapping of
import name onto its source root that ``pyproject.toml`` gives setuptools (``impl/millstream/``, with
``millstream.model`` and ``millstream.spark`` linked in from ``model/`` and ``spark_pipeline/``).  An
import is every ``import`` statement -- at the top, inside a function (lazy), under
``if TYPE_CHECKING:`` (type-only) -- and every ``import_module("millstream....")`` /
``__import__("millstream....")`` call with a literal name.  Three graphs:

* modules, counting every import: no cycle at all, so each module can be read knowing only the ones
  below it (a type-only or lazy import is still a dependency; it only hides the cycle from Python);
* modules, counting only the imports that run when a module is imported (top level, outside
  ``if TYPE_CHECKING:``): a cycle there would make import order matter (implied by the first; kept
  for the message it gives);
* *parts* -- ``millstream.client``, ``millstream.controller``, ``millstream.values``... (a
  subpackage, or a top-level module) -- counting every import: a cycle there means two layers each
  need the other.

A package's ``__init__.py`` is a module like any other, and its imports count like any others.  When
it imports its own submodules to re-export their names, those arrows point down into the package:
that is the package's face, not a cycle.  It becomes one only if a module inside the package imports
the ``__init__`` back (``from millstream.client import X`` in ``millstream.client._writer``), directly
or through others -- and then the first graph shows it.  So the rule a reader checks is one line: a
module does not import the ``__init__`` of its own package when that ``__init__`` reaches it; it
imports the name from the submodule that defines it.  (Importing an enclosing package that does not
reach back stays allowed: ``millstream.cli._group`` reads ``millstream.__version__``.)
"""

from __future__ import annotations

import ast
import os
import pathlib
import tomllib
from collections.abc import Iterator, Mapping

import attrs
import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Parts that leave the package (issue 22 item 7 moves the benchmarks to a top-level ``bench/``;
#: until then ``millstream.bench`` and ``millstream.cli`` import each other for ``millstream bench``).
_LEAVING: frozenset[str] = frozenset({"millstream.bench"})

#: part -> the parts it must never import, whatever the route (lazy and type-only imports too).
_FORBIDDEN: Mapping[str, frozenset[str]] = {
    # The controller decides; it speaks to segment stores through its own stub, never through the client.
    "millstream.controller": frozenset({"millstream.client", "millstream.server"}),
    # The client speaks the wire protocol to servers and controllers: it links neither in.
    "millstream.client": frozenset({"millstream.segmentstore", "millstream.controller", "millstream.server"}),
    # The server hosts segment stores; the controller and the client are other processes' business.
    "millstream.server": frozenset({"millstream.client", "millstream.controller"}),
    "millstream.segmentstore": frozenset({"millstream.client", "millstream.controller", "millstream.server",
                                          "millstream.wire"}),
    "millstream.wire": frozenset({"millstream.client", "millstream.controller", "millstream.server",
                                  "millstream.segmentstore"}),
}

#: The neutral modules every layer imports: they import only these (and the model).
_NEUTRAL: Mapping[str, frozenset[str]] = {
    "millstream.values": frozenset({"millstream.errors", "millstream.limits", "millstream.naming"}),
    "millstream.randomness": frozenset({"millstream.errors"}),
    "millstream.errors": frozenset(),
}


@attrs.frozen
class Import:
    source: str  # the importing module
    target: str  # the imported module (the longest known module the imported name lies in)
    line: int
    eager: bool  # runs when ``source`` is imported


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the package, by import name: the files under its source root, following the
    links that put the model and the Spark package in place."""
    config = tomllib.loads((_ROOT / "pyproject.toml").read_text())
    root = _ROOT / config["tool"]["setuptools"]["package-dir"][""]
    modules: dict[str, pathlib.Path] = {}
    for folder, _, files in os.walk(root / "millstream", followlinks=True):
        for file in sorted(f for f in files if f.endswith(".py")):
            parts = list((pathlib.Path(folder) / file).relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = pathlib.Path(folder) / file
    return modules


def _statements(body: list[ast.stmt], eager: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement of ``body`` with whether it runs at import time (nested blocks included)."""
    for statement in body:
        yield statement, eager
        if isinstance(statement, ast.If):
            type_only = "TYPE_CHECKING" in ast.unparse(statement.test)
            yield from _statements(statement.body, eager and not type_only)
            yield from _statements(statement.orelse, eager)
        elif isinstance(statement, (ast.Try, ast.With)):
            for block in (statement.body, *(getattr(statement, name, []) for name in ("orelse", "finalbody"))):
                yield from _statements(block, eager)
            for handler in getattr(statement, "handlers", []):
                yield from _statements(handler.body, eager)
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _statements(statement.body, eager and isinstance(statement, ast.ClassDef))


def _named_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """The module name and line of each call ``import_module("...")``, ``importlib.import_module("...")``
    or ``__import__("...")`` with a literal name (a name built at run time cannot be followed: the CLI's
    ``__init__`` loads its own command modules so, and ``millstream bench`` the benchmarks)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in ("import_module", "__import__"):
                yield node.args[0].value, node.lineno


def _imports(modules: Mapping[str, pathlib.Path]) -> list[Import]:
    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    found: list[Import] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for statement, eager in _statements(tree.body, True):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:
                    anchor = package.split(".")[: len(package.split(".")) - (statement.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from package import module`` imports the module; ``from module import name`` the module.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in statement.names]
            else:
                continue
            for target in targets:
                if target == "millstream" or target.startswith("millstream."):
                    found.append(Import(module, known(target), statement.lineno, eager))
        for target, line in _named_imports(tree):
            if target == "millstream" or target.startswith("millstream."):
                found.append(Import(module, known(target), line, False))  # (counted as lazy: it runs when called)
    return found


def _module_edges(imports: list[Import], *, eager_only: bool) -> dict[str, set[str]]:
    """``source -> targets`` over ``imports`` (only those that run at import time, with ``eager_only``)."""
    edges: dict[str, set[str]] = {}
    for found in imports:
        if (found.eager or not eager_only) and found.source != found.target:
            edges.setdefault(found.source, set()).add(found.target)
    return edges


def part(module: str) -> str:
    """``millstream.client._writer`` -> ``millstream.client``; ``millstream.values`` stays itself."""
    return ".".join(module.split(".")[:2])


def _cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(edges.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return _imports(_modules())


def _show(found: list[Import]) -> str:
    return "\n".join(f"  {i.source}:{i.line} imports {i.target}" for i in found)


def test_the_graph_reader_finds_what_it_must(imports: list[Import]) -> None:
    """The reader is not blind: known imports of each kind are in its graph."""
    seen = {(i.source, i.target, i.eager) for i in imports}
    assert ("millstream.client._streams", "millstream.values", True) in seen
    assert ("millstream.client._streams", "millstream.client._controller", False) in seen  # TYPE_CHECKING
    assert ("millstream.model.durable_log", "millstream.model.errors", True) in seen  # (through the link to model/)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_import_each_other_without_cycles(imports: list[Import]) -> None:
    assert _cycles(_module_edges(imports, eager_only=True)) == []


def _cycle_report(imports: list[Import], cycles: list[list[str]]) -> str:
    """Each cycle with the imports that tie it (file and line), for the failure message."""
    lines = []
    for cycle in cycles:
        members = set(cycle)
        lines.append("cycle: " + ", ".join(cycle))
        lines.append(_show(sorted({i for i in imports if i.source in members and i.target in members
                                   and i.source != i.target}, key=lambda i: (i.source, i.line, i.target))))
    return "\n".join(lines)


def test_modules_import_each_other_without_cycles_counting_every_import(imports: list[Import]) -> None:
    """No cycle among modules, lazy and type-only imports counted (issue 22: "the import graph has no
    cycles").  Break one the way the design reads: helpers into a small private module of the
    package, values into ``millstream.values`` or a module low in the package, and where a lower
    module needs a few members of a higher object, a ``Protocol`` of just those in the lower module.
    (On b5a0a99 this failed with the issue's five circles: cli, client's stubs, the reader and its
    group, the controller, the server's connection parts.)"""
    cycles = _cycles(_module_edges(imports, eager_only=False))
    assert cycles == [], f"modules that import each other (every import counted):\n{_cycle_report(imports, cycles)}"


def _synthetic(folder: pathlib.Path, files: Mapping[str, str]) -> list[Import]:
    """The imports of a small package written under ``folder``: ``{"millstream.p.__init__": source,
    "millstream.p.a": source}`` (a package's module named by its ``__init__``)."""
    modules: dict[str, pathlib.Path] = {}
    for name, source in files.items():
        path = folder.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        modules[name.removesuffix(".__init__")] = path
    return _imports(modules)


def test_the_every_import_check_finds_a_type_only_cycle(tmp_path: pathlib.Path) -> None:
    """The reader and the graph see through ``if TYPE_CHECKING:``, functions and ``import_module``: a
    cycle closed by a type-only import is found by the every-import graph and not by the eager one;
    so is one closed by a lazy ``import_module``."""
    typed = _synthetic(tmp_path / "typed", {
        "millstream.__init__": "",
        "millstream.a": "from millstream.b import B\n",
        "millstream.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from millstream.a import A\n",
    })
    assert _cycles(_module_edges(typed, eager_only=True)) == []
    assert _cycles(_module_edges(typed, eager_only=False)) == [["millstream.a", "millstream.b"]]
    lazy = _synthetic(tmp_path / "lazy", {
        "millstream.__init__": "",
        "millstream.a": "from millstream import b\n",
        "millstream.b": "def f():\n    import importlib\n    return importlib.import_module('millstream.a')\n",
    })
    assert _cycles(_module_edges(lazy, eager_only=False)) == [["millstream.a", "millstream.b"]]


def test_a_package_face_is_no_cycle_until_a_submodule_imports_it(tmp_path: pathlib.Path) -> None:
    """The ``__init__`` rule of the module docstring, on a small package: an ``__init__`` that
    re-exports its submodule's name is no cycle; the submodule importing that ``__init__`` makes one."""
    face = "from millstream.p._a import A\n"
    alone = _synthetic(tmp_path / "alone", {"millstream.__init__": "", "millstream.p.__init__": face,
                                            "millstream.p._a": "A = 1\n"})
    assert ("millstream.p", "millstream.p._a", True) in {(i.source, i.target, i.eager) for i in alone}
    assert _cycles(_module_edges(alone, eager_only=False)) == []
    back = _synthetic(tmp_path / "back", {"millstream.__init__": "", "millstream.p.__init__": face,
                                          "millstream.p._a": "A = 1\ndef f():\n    from millstream.p import B\n",
                                          "millstream.p._b": "B = 2\n"})
    assert _cycles(_module_edges(back, eager_only=False)) == [["millstream.p", "millstream.p._a"]]


def test_parts_import_each_other_without_cycles(imports: list[Import]) -> None:
    edges: dict[str, set[str]] = {}
    for found in imports:
        source, target = part(found.source), part(found.target)
        if source != target and not {source, target} & _LEAVING:
            edges.setdefault(source, set()).add(target)
    assert _cycles(edges) == []


@pytest.mark.parametrize("layer", sorted(_FORBIDDEN))
def test_a_layer_imports_only_the_layers_below_it(imports: list[Import], layer: str) -> None:
    wrong = [i for i in imports if part(i.source) == layer and part(i.target) in _FORBIDDEN[layer]]
    assert not wrong, f"{layer} may not import {sorted(_FORBIDDEN[layer])}; move the shared value to " \
                      f"millstream.values:\n{_show(wrong)}"


@pytest.mark.parametrize("module", sorted(_NEUTRAL))
def test_the_neutral_modules_import_no_layer(imports: list[Import], module: str) -> None:
    wrong = [i for i in imports if i.source == module and i.target != module
             and i.target not in _NEUTRAL[module] and not i.target.startswith("millstream.model")]
    assert not wrong, f"{module} is imported by every layer, so it imports none:\n{_show(wrong)}"


def test_each_shared_value_has_one_owner() -> None:
    """Each shared value is one class, wherever users and layers import it from."""
    import millstream
    import millstream.client as client
    from millstream import values
    from millstream.client import _config, _transactions
    from millstream.controller import _transactions as controller_transactions
    from millstream.segmentstore import event_boundaries, read_index

    for name in ("StreamConfig", "StreamCut", "ScalingPolicy", "RetentionPolicy", "ReaderGroupConfig"):
        assert getattr(millstream, name) is getattr(client, name) is getattr(values, name)
    assert client.TransactionStatus is _transactions.TransactionStatus is values.TransactionStatus
    assert controller_transactions.TxnStatus is values.TransactionStatus
    assert read_index.ReadResult is values.ReadResult
    assert event_boundaries.EVENT_SEGMENT_ATTRIBUTE_ID == values.EVENT_SEGMENT_ATTRIBUTE_ID
    from millstream import randomness
    assert _config.RandomSource is randomness.RandomSource
    assert _config.random_uuid is randomness.random_uuid


def test_the_package_is_one_tree_under_its_source_root() -> None:
    """The model and the Spark package are in the package through links to their design-card folders,
    so a static tool given ``impl/`` sees every module: the graph read here holds all three."""
    for name, folder in (("model", "model"), ("spark", "spark_pipeline")):
        link = _ROOT / "impl" / "millstream" / name
        assert link.is_symlink() and link.resolve() == _ROOT / folder, f"{link} must link to {folder}/"
    parts = {name.split(".")[1] for name in _modules() if name.count(".")}
    assert {"model", "spark", "client", "segmentstore"} <= parts, sorted(parts)
