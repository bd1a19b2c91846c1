"""A Spark Python worker's start (issue 21, item 6): every fresh worker that runs a task of the
source or the sink imports ``millstream.spark``, so that import must not bring the store's node --
its segment store, server and controller -- which a client never runs (they were 0.8 s of the
0.9 s the import cost per worker)."""

from __future__ import annotations

import json
import subprocess
import sys

#: The packages of a node, which a client's import must leave alone.  (``millstream.standalone`` itself
#: is light: it imports these when a node is built.)
NODE_PACKAGES = ("millstream.server", "millstream.controller", "millstream.segmentstore", "millstream.health",
                 "millstream.metrics")


def modules_after(statement: str) -> list[str]:
    """The millstream modules a fresh interpreter holds after running ``statement``."""
    program = (f"import json, sys\n{statement}\n"
               "print(json.dumps(sorted(m for m in sys.modules if m.startswith('millstream'))))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(result.stdout.splitlines()[-1]))


def test_importing_the_spark_package_leaves_the_node_out() -> None:
    loaded = modules_after("import millstream.spark")
    assert "millstream.spark._reader" in loaded and "millstream.client" in loaded  # what it does need
    heavy = [m for m in loaded if m.startswith(NODE_PACKAGES)]
    assert heavy == [], heavy


def test_a_node_is_still_one_call_away_after_the_light_import() -> None:
    loaded = modules_after("import tempfile, millstream.spark, millstream\n"
                           "assert callable(millstream.standalone) and millstream.StandaloneNode.__name__ == "
                           "'StandaloneNode'\n"
                           "from millstream.standalone import Node\n"
                           "Node(tempfile.mkdtemp())  # (built, not started)")
    assert "millstream.server" in loaded and "millstream.metrics" not in loaded  # (no metrics_port: none)
