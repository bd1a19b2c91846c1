"""``millstream.spark`` builds on the client's public API only (issue 22): no ``controller()`` (the
low-level ``ControllerClient``), no hand-made locators or segment clients.  What the data source
needs -- the segments between two cuts, checking a cut, a reader group's subscriber cut, a writer
of framed bytes into a transaction's segment -- are public client methods
(``StreamManager.segments_between``/``check_cut``, ``Client.reader_group``,
``AsyncClient.segment_byte_writer``), tested in ``tests/client/test_stream_ranges.py``.

Read from the source with ``ast`` (nothing is imported), so it needs no Spark."""

from __future__ import annotations

import ast
import pathlib

import millstream.spark

#: Client internals the data source must not reach for.
_INTERNAL_NAMES = frozenset({"ControllerClient", "ControllerSegmentLocator", "AsyncSegments", "FixedLocator",
                             "SystemRandomSource", "ConnectionPool"})
#: Attributes that lead into them (``core.pool``); ``controller`` is one when called
#: (``client.async_client.controller()``) or taken from a call or a core
#: (``client.stream_manager().controller``, ``manager.core.controller``) -- not an option's value.
_INTERNAL_ATTRIBUTES = frozenset({"pool"})


def _sources() -> list[pathlib.Path]:
    root = pathlib.Path(millstream.spark.__file__).parent
    return sorted(root.glob("*.py"))


def _uses(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("millstream.client"):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in _INTERNAL_NAMES]
        elif isinstance(node, ast.Name) and node.id in _INTERNAL_NAMES:
            found.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _INTERNAL_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "controller":
            found.append(f"line {node.lineno}: .controller()")
        elif isinstance(node, ast.Attribute) and node.attr == "controller" and (
                isinstance(node.value, ast.Call) or (isinstance(node.value, ast.Attribute)
                                                     and node.value.attr in {"core", "async_client"})):
            found.append(f"line {node.lineno}: .controller")
    return found


def test_the_checker_finds_what_it_must(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from millstream.client import ControllerSegmentLocator, StreamCut\n"
                      "controller = client.async_client.controller()\n"
                      "locator = ControllerSegmentLocator(core.pool)\n"
                      "other = client.stream_manager().controller\n"
                      "fine = options.controller\n")
    assert sorted(_uses(sample)) == ["line 1: imports ControllerSegmentLocator", "line 2: .controller",
                                     "line 2: .controller()",
                                     "line 3: .pool", "line 3: uses ControllerSegmentLocator",
                                     "line 4: .controller"]


def test_the_spark_data_source_uses_only_the_public_client_api() -> None:
    sources = _sources()
    assert any(p.name == "_store.py" for p in sources), "the data source's modules must be found"
    offending = {p.name: uses for p in sources if (uses := _uses(p))}
    assert offending == {}, f"millstream.spark reaches into the client's internals: {offending}"
