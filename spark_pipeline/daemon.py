"""Spark's Python worker daemon with the millstream data source imported before it forks.

Spark starts the executors' Python task workers by forking one daemon process per executor
(``pyspark.daemon``); the driver's planning and commit runners are started apart from it (they
import the data source on their first call, once per query run).  A task worker imports what its
task unpickles: for the millstream source or sink, ``millstream.spark`` with the client, pyarrow and
numpy -- about a second of a cold start per worker (seconds on a loaded machine), paid again
whenever Spark starts a fresh worker.  Run as the daemon
(``spark.python.daemon.module=millstream.spark.daemon``, which ``millstream.spark.pipeline.spark_conf``
sets), this module imports all of it once, then serves as ``pyspark.daemon`` does: every worker it
forks starts with the data source loaded.  Nothing here starts a thread or opens a connection
before the fork (each process opens its own client on first use: ``_store``).
"""

from __future__ import annotations

import millstream.spark  # noqa: F401  (the data source: client, pyarrow, numpy, the readers and writers)
from pyspark.daemon import manager

__all__ = ["manager"]

if __name__ == "__main__":
    manager()
