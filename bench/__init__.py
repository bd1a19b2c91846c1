"""millstream's benchmarks, run from a clone: ``python -m bench --suite NAME`` (``tox -e bench`` runs them all).

They are not part of the installed package (the wheel holds none of this folder); ``millstream bench``
runs this command when millstream is installed from a clone, and otherwise says how.  Their limits
are ``bench.limits``; their command line is ``bench.cli``.

Suites:

* ``write-path`` (``bench.write_path``): one segment container on a durable FileLog, against
  the disk's physical limit measured in the same run.
* ``tiering`` (``bench.tiering``): ingestion with Tier-2 flushing on versus off, and catch-up
  reads from Tier 2 against a raw sequential file read, in the same run.
* ``transactions`` (``bench.transactions``): stream transactions of 100 x 100-byte events against
  a standalone node in another process -- transactions/s, commit latency (commit call -> COMMITTED), and
  transactional versus plain writing of the same events, in the same run; its section of ``BENCHMARKS.md``.
* ``large-events`` (``bench.large_events``): one large event (1 GiB by default, ``--event-mib``)
  against the same bytes as classic 8 MiB events, written and read against a standalone node in another
  process, and each client's peak RSS above its baseline measured from outside its process, in the same
  run; its section of ``BENCHMARKS.md``.
* ``streams`` (``bench.streams``): one writer with 10,000 random routing keys against none, on
  1 and 16 segments; tail-read latency with 16 readers in a group; a stream auto-scaling under 10 KB
  events at a constant rate (segment count and write latency over time, plotted); its section of
  ``BENCHMARKS.md``.
* ``quick`` and ``peers`` (``bench.harness``): workloads from TOML files
  (``bench.workload``; bundled ones in ``workloads/``) against a ``millstream standalone``
  server and its peers -- NATS JetStream and Redis Streams at equal durability, and at their defaults
  -- started by the harness on 127.0.0.1; latency-throughput tables and plots, and ``BENCHMARKS.md``.
  ``quick`` answers issue 9's targets in a few minutes; ``peers`` is the seed's whole grid.

Importing this package is cheap; a suite's module (which imports the store) is imported when it runs.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HARNESS_SUITE_NAMES", "SUITE_NAMES"]

#: The suites the peers harness runs (their workloads: ``bench.workload.SUITES``).
HARNESS_SUITE_NAMES: Final = ("quick", "peers")

#: Every suite ``python -m bench --suite`` accepts.
SUITE_NAMES: Final = ("write-path", "tiering", "transactions", "large-events", "streams", "cluster",
                      *HARNESS_SUITE_NAMES)
