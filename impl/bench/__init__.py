"""Benchmarks that ship with millstream, run by ``millstream bench --suite NAME``.

Suites:

* ``write-path`` (``millstream.bench.write_path``): one segment container on a durable FileLog, against
  the disk's physical limit measured in the same run.
* ``tiering`` (``millstream.bench.tiering``): ingestion with Tier-2 flushing on versus off, and catch-up
  reads from Tier 2 against a raw sequential file read, in the same run.

Importing this package is cheap; a suite's module (which imports the store) is imported when it runs.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SUITE_NAMES"]

#: Every suite ``millstream bench --suite`` accepts.
SUITE_NAMES: Final = ("write-path", "tiering")
