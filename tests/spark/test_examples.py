"""The examples users copy, executed as written (the session's ``local[2]`` SparkSession): the README's
Spark snippet -- ``groupBy("sensor").count()`` in update mode -- and the one in ``millstream.spark``'s
docstring, each against a store holding a few readings, until their counts are in the output
stream; and the README's plain-Python example."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

import millstream
import millstream.spark
from tests.spark.conftest import REPOSITORY
from tests.spark.test_end_to_end import read_output

READINGS = [{"sensor": f"s{n % 3}", "ts": f"2024-05-06T07:08:{n:02d}Z", "reading": n / 2} for n in range(9)]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def readme_block(containing: str) -> str:
    (block,) = [b for b in python_blocks((REPOSITORY / "README.md").read_text()) if containing in b]
    return block


def docstring_example(module: Any) -> str:
    """The indented example after the first ``::`` of a docstring, dedented."""
    text = module.__doc__.split("::\n", 1)[1]
    lines = []
    for line in text.splitlines()[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines).strip() + "\n"


def prepare(node: Any, scope: str) -> None:
    with millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope(scope, exist_ok=True)
        for stream in ("sensors", "readings", "counts"):
            manager.create_stream(f"{scope}/{stream}", millstream.StreamConfig(
                scaling=millstream.ScalingPolicy.fixed(2)))
        for stream in ("sensors", "readings"):
            with client.event_writer(f"{scope}/{stream}", millstream.JsonSerializer()) as writer:
                for reading in READINGS:
                    writer.write_event(reading, routing_key=reading["sensor"])


def run_example(spark: Any, code: str, namespace: dict[str, Any], node: Any, output: str) -> None:
    """Execute ``code``, wait until its query has written every sensor's count of ``output``, stop it."""
    before = {q.id for q in spark.streams.active}
    exec(compile(code, "<example>", "exec"), namespace)
    (query,) = [q for q in spark.streams.active if q.id not in before]
    try:
        deadline = time.monotonic() + 600
        while True:
            final = {row["sensor"]: row["count"] for row in read_output(node, output)}
            if final == {"s0": 3, "s1": 3, "s2": 3}:
                break
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"the example's query wrote {final}"
            query.awaitTermination(1)
    finally:
        query.stop()


def test_the_readmes_spark_example_runs_as_written(spark: Any, node: Any, tmp_path: Path) -> None:
    code = readme_block("millstream.spark.register(spark)")
    assert 'outputMode("update")' in code and '"/tmp/ckpt"' in code
    prepare(node, "iot")
    run_example(spark, code.replace('"/tmp/ckpt"', repr(str(tmp_path / "ckpt"))),
                {"spark": spark, "node_uri": node.uri}, node, "iot/counts")


def test_the_spark_modules_docstring_example_runs_as_written(spark: Any, node: Any, tmp_path: Path) -> None:
    code = docstring_example(millstream.spark)
    assert "register(spark)" in code
    prepare(node, "sensors")
    code = code.replace('"tcp://127.0.0.1:9090"', repr(node.uri)).replace('"/tmp/ckpt"', repr(str(tmp_path / "c")))
    run_example(spark, code, {"spark": spark}, node, "sensors/counts")


def test_the_readmes_python_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    code = readme_block("client.reader_group(")  # "Using it" (the restart example has no reader group)
    exec(compile(code, "<README>", "exec"), {})
    assert "read 101 events" in capsys.readouterr().out
