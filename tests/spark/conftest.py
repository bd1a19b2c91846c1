"""Fixtures for the Spark tests: one SparkSession for the whole session, one standalone node.

A Spark JVM costs about a gigabyte and 5-60 s to start (on a busy 2-core machine), so every Spark test
of the run shares one ``local[2]`` session (``spark``) with the ``millstream`` data source registered;
tests that need a SparkSession take this fixture rather than building their own, and give each query
a fresh checkpoint directory (``tmp_path``).  Spark's Python workers must import millstream and run
this interpreter (reference/spark-exactly-once.md, pitfalls 1 and 2): ``PYSPARK_PYTHON`` is this
interpreter and ``PYTHONPATH`` starts with the repository, both set before the JVM starts.

``node`` is one ``millstream.standalone`` node for the session (tests create streams of their own
names in it, ``unique_stream`` makes one); it lives in a temporary directory.

The plain-Python tests in this folder (options, offsets, planning, the commit protocol) need no
SparkSession and run in milliseconds; they still live here because they import ``millstream.spark``,
which needs ``pyspark``.  Without ``pyspark`` (``pip install -e ".[spark]"``) the whole folder is
skipped, saying so.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import millstream
from millstream.client import ScalingPolicy, StreamConfig

pytest.importorskip("pyspark", reason="the Spark tests need pyspark: pip install -e '.[spark]' (tox -e spark)")
pytest.importorskip("pyarrow", reason="the Spark tests need pyarrow: pip install -e '.[spark]' (tox -e spark)")

REPOSITORY = Path(__file__).resolve().parents[2]

#: The session's Spark settings: small and quiet (reference/spark-exactly-once.md, "Keeping pytest fast").
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's ``local[2]`` SparkSession, with the ``millstream`` format registered
    (``millstream.spark.register``: the one call a user makes, update output mode included)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH", "")
    if str(REPOSITORY) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPOSITORY), path) if p)
    from pyspark.sql import SparkSession

    import millstream.spark

    builder = SparkSession.builder.master("local[2]").appName("millstream-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    millstream.spark.register(session)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[millstream.StandaloneNode]:
    """One standalone millstream node (segment store and controller on loopback) for the session."""
    with millstream.standalone(tmp_path_factory.mktemp("millstream-node")) as handle:
        yield handle


_names = itertools.count()


@pytest.fixture
def unique_stream(node: millstream.StandaloneNode) -> Any:
    """``make(segments=1, scaling=None, retention=None) -> "scope/stream"``: a new stream in ``node``
    with a name no other test of the session uses."""

    def make(segments: int = 1, *, scaling: ScalingPolicy | None = None,
             retention: millstream.RetentionPolicy | None = None, prefix: str = "st") -> str:
        name = f"spark/{prefix}{next(_names)}"
        config = StreamConfig(scaling=scaling or ScalingPolicy.fixed(segments),
                              retention=retention or millstream.RetentionPolicy.none())
        with millstream.connect(node.uri) as client:
            client.stream_manager().create_scope("spark", exist_ok=True)
            client.stream_manager().create_stream(name, config)
        return name

    return make
