"""``python -m bench --suite NAME ...``: the benchmarks, from a clone (see ``bench.cli``)."""

from __future__ import annotations

import sys

from bench.cli import run

if __name__ == "__main__":
    run(sys.argv[1:], "python -m bench")
