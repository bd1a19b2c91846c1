"""The reference pipeline's plain-Python side (milliseconds, no SparkSession): the sensor workload, the
expected answer computed without Spark, the verification that compares an output with it, the
pipeline's configuration and its fault hook, and the command line a run is started with."""

from __future__ import annotations

import contextlib
import json
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from millstream.errors import InvalidArgumentError
from millstream.spark.demo import checkpoint_batches, final_watermark_ms, pipeline_arguments, watermark_ms
from millstream.spark.pipeline import PipelineConfig, parse_fault, progress_record
from millstream.spark.workload import SensorWorkload, expected_output, parse_output, verify

WORKLOAD = SensorWorkload(seed=11, sensors=5, events_per_second=50, malformed_every=20)


def reading(sensor: str, ts_ms: int, temperature: str) -> bytes:
    return (f'{{"kind":"reading","sensor_id":"{sensor}","ts_ms":{ts_ms},"temperature_c":{temperature}}}').encode()


def output_row(kind: str, sensor: str, start: int, **values: object) -> bytes:
    return json.dumps({"kind": kind, "sensor_id": sensor, "window_start_ms": start, **values}).encode()


# --- the workload ----------------------------------------------------------------------------------


def test_an_event_is_a_function_of_the_seed_and_its_index() -> None:
    again = SensorWorkload(seed=11, sensors=5, events_per_second=50, malformed_every=20)
    assert [WORKLOAD.payload(i) for i in range(500)] == [again.payload(i) for i in range(500)]
    assert list(WORKLOAD.events(100, 50)) == [(again.routing_key(i), again.payload(i)) for i in range(100, 150)]
    other = SensorWorkload(seed=12, sensors=5, events_per_second=50, malformed_every=20)
    assert [WORKLOAD.payload(i) for i in range(50)] != [other.payload(i) for i in range(50)]


def test_readings_are_keyed_by_sensor_and_disordered_within_the_bound() -> None:
    nominal_previous = None
    for index in range(2_000):
        if WORKLOAD.is_malformed(index):
            continue
        event = json.loads(WORKLOAD.payload(index), parse_float=Decimal)
        assert event["kind"] == "reading"
        assert event["sensor_id"] == WORKLOAD.routing_key(index)
        nominal = WORKLOAD.nominal_ms(index)
        assert nominal - WORKLOAD.disorder_ms_max <= event["ts_ms"] <= nominal
        assert nominal_previous is None or nominal >= nominal_previous
        nominal_previous = nominal
        assert event["temperature_c"] == event["temperature_c"].quantize(Decimal("0.01"))


def test_the_workload_has_overheating_episodes_malformed_events_and_uneven_sensors() -> None:
    workload = SensorWorkload(seed=3)
    payloads = [workload.payload(i) for i in range(20_000)]
    malformed = [p for p in payloads if not p.endswith(b"}")]
    assert 5 <= len(malformed) <= 60  # about 1 in 1,000
    for payload in malformed:
        with pytest.raises(ValueError):
            json.loads(payload)
    expected = expected_output(workload, payloads)
    alerts = [key for key in expected if key[0] == "alert"]
    assert alerts, "some windows must hold overheating episodes"
    assert len(alerts) < len(expected) / 4
    counts: dict[str, int] = {}
    for index in range(20_000):
        counts[workload.routing_key(index)] = counts.get(workload.routing_key(index), 0) + 1
    assert len(counts) == workload.sensors
    assert max(counts.values()) > 2.5 * min(counts.values())  # weights 1..4


def test_markers_move_the_watermark_past_every_window_and_enter_none() -> None:
    readings = 777
    markers = WORKLOAD.end_markers(readings)
    assert [key for key, _ in markers] == [WORKLOAD.sensor_id(k) for k in range(WORKLOAD.sensors)]
    last_window_end = max(start + WORKLOAD.window_ms for (_, _, start) in
                          expected_output(WORKLOAD, [WORKLOAD.payload(i) for i in range(readings)]))
    assert final_watermark_ms(WORKLOAD, readings) >= last_window_end
    payloads = [WORKLOAD.payload(i) for i in range(readings)]
    assert expected_output(WORKLOAD, payloads + [p for _, p in markers]) == expected_output(WORKLOAD, payloads)


def test_a_disorder_the_watermark_cannot_absorb_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="half the watermark delay"):
        SensorWorkload(disorder_ms_max=6_000, watermark_delay_seconds=10)
    with pytest.raises(InvalidArgumentError, match="sensors"):
        SensorWorkload(sensors=0)


# --- the expected answer ---------------------------------------------------------------------------


def test_expected_output_aggregates_exactly_and_alerts_at_the_threshold() -> None:
    workload = SensorWorkload(alert_threshold_c=Decimal("80.00"), alert_readings_min=3)
    base = 1_000_000_000_000
    events = [
        reading("a", base + 1, "80.00"), reading("a", base + 2, "80.00"), reading("a", base + 9_999, "80.00"),
        reading("a", base + 10_000, "79.99"),                           # the next window
        reading("b", base + 5, "80.00"), reading("b", base + 6, "95.5"), reading("b", base + 7, "20.1"),
        b'{"kind":"reading","sensor_id":"b","ts_ms":', b"\xff\xfe", b'{"kind":"end","sensor_id":"b","ts_ms":1}',
        b'{"kind":"reading","sensor_id":"b","ts_ms":"soon","temperature_c":1}',
    ]
    expected = expected_output(workload, events)
    assert expected == {
        ("aggregate", "a", base): {"window_end_ms": base + 10_000, "count": 3, "min_c": Decimal("80.00"),
                                   "max_c": Decimal("80.00"), "sum_c": Decimal("240.00"), "hot_readings": 3},
        ("alert", "a", base): {"window_end_ms": base + 10_000, "max_c": Decimal("80.00"), "hot_readings": 3},
        ("aggregate", "a", base + 10_000): {"window_end_ms": base + 20_000, "count": 1, "min_c": Decimal("79.99"),
                                            "max_c": Decimal("79.99"), "sum_c": Decimal("79.99"),
                                            "hot_readings": 0},
        ("aggregate", "b", base): {"window_end_ms": base + 10_000, "count": 3, "min_c": Decimal("20.1"),
                                   "max_c": Decimal("95.5"), "sum_c": Decimal("195.60"), "hot_readings": 2},
    }


def test_verify_counts_duplicates_missing_unexpected_and_wrong_rows() -> None:
    workload = SensorWorkload()
    base = 1_000_000_000_000
    written = [reading("a", base + 1, "21.00"), reading("a", base + 2, "22.00"), reading("b", base + 3, "23.00")]
    good_a = output_row("aggregate", "a", base, window_end_ms=base + 10_000, count=2, min_c=21.0, max_c=22.0,
                        sum_c=43.0, hot_readings=0)
    good_b = output_row("aggregate", "b", base, window_end_ms=base + 10_000, count=1, min_c=23.0, max_c=23.0,
                        sum_c=23.0, hot_readings=0)
    perfect = verify(workload, written, list(reversed(written)), [good_b, good_a])
    assert perfect.passed
    assert (perfect.expected_rows, perfect.output_rows, perfect.duplicates, perfect.missing) == (2, 2, 0, 0)

    duplicated = verify(workload, written, written, [good_a, good_b, good_a])
    assert not duplicated.passed
    assert (duplicated.duplicates, duplicated.output_rows, duplicated.distinct_rows) == (1, 3, 2)
    assert any("duplicate" in example for example in duplicated.examples)

    missing = verify(workload, written, written, [good_a])
    assert (missing.passed, missing.missing) == (False, 1)

    wrong = output_row("aggregate", "b", base, window_end_ms=base + 10_000, count=2, min_c=23.0, max_c=23.0,
                       sum_c=46.0, hot_readings=0)
    stranger = output_row("alert", "c", base, window_end_ms=base + 10_000, max_c=99.0, hot_readings=9)
    bad = verify(workload, written, written, [good_a, wrong, stranger, b"not json"])
    assert (bad.mismatched, bad.unexpected, bad.unreadable, bad.passed) == (1, 1, 1, False)

    lost_input = verify(workload, written, written[:2], [good_a, good_b])
    assert (lost_input.input_matches, lost_input.passed) == (False, False)
    assert "NOT the events written" in lost_input.table()


def test_parse_output_reads_decimals_exactly() -> None:
    rows, unreadable = parse_output([b'{"kind":"aggregate","sensor_id":"a","window_start_ms":5,"sum_c":0.1}'])
    assert unreadable == 0
    assert rows == [(("aggregate", "a", 5), {"sum_c": Decimal("0.1")})]


# --- configuration, fault hook, command line ------------------------------------------------------


def test_pipeline_config_refuses_bad_values(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="trigger"):
        PipelineConfig(controller="tcp://127.0.0.1:1", checkpoint=tmp_path, trigger="continuous")
    with pytest.raises(InvalidArgumentError, match="output stream must not be the input"):
        PipelineConfig(controller="tcp://127.0.0.1:1", checkpoint=tmp_path, output_stream="iot/sensors")
    with pytest.raises(InvalidArgumentError, match="scope/stream"):
        PipelineConfig(controller="tcp://127.0.0.1:1", checkpoint=tmp_path, input_stream="sensors")
    with pytest.raises(InvalidArgumentError, match="max_rows_per_batch"):
        PipelineConfig(controller="tcp://127.0.0.1:1", checkpoint=tmp_path, max_rows_per_batch=0)


def test_the_fault_hook_parses_only_its_one_form() -> None:
    fault = parse_fault("kill-in-commit:after:7")
    assert (fault.when, fault.batch_id) == ("after", 7)
    assert parse_fault("kill-in-commit:before:0").when == "before"
    for bad in ("", "kill-in-commit", "kill-in-commit:during:1", "kill-in-commit:after:-1", "kill:after:1"):
        with pytest.raises(InvalidArgumentError, match="MILLSTREAM_SPARK_FAULT"):
            parse_fault(bad)


def test_the_run_command_line_describes_the_config(tmp_path: Path) -> None:
    """What the demo and the crash campaign launch is what `millstream pipeline run` parses back."""
    from millstream.cli.pipeline import pipeline_run

    config = PipelineConfig(controller="tcp://127.0.0.1:9", input_stream="a/in", output_stream="a/out",
                            checkpoint=tmp_path / "ckpt", window_seconds=2, watermark_delay_seconds=4,
                            alert_threshold_c=Decimal("75.5"), alert_readings_min=2, trigger="available-now",
                            trigger_interval_seconds=0.5, max_rows_per_batch=100, state_memory_mb=64)
    context = pipeline_run.make_context("run", pipeline_arguments(config))
    parsed = context.params
    assert PipelineConfig(
        controller=parsed["controller"], input_stream=parsed["input_stream"], output_stream=parsed["output_stream"],
        checkpoint=parsed["checkpoint"], window_seconds=parsed["window_seconds"],
        watermark_delay_seconds=parsed["watermark_delay_seconds"], alert_threshold_c=parsed["alert_threshold"],
        alert_readings_min=parsed["alert_readings"], trigger=parsed["trigger"],
        trigger_interval_seconds=parsed["interval"], max_rows_per_batch=parsed["max_rows_per_batch"],
        state_memory_mb=parsed["state_memory_mb"], shuffle_partitions=parsed["shuffle_partitions"],
        master=parsed["master"]) == config


def test_bad_command_lines_are_refused_before_spark_starts(tmp_path: Path) -> None:
    from millstream.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["pipeline", "run", "--controller", "tcp://127.0.0.1:9", "--checkpoint",
                                  str(tmp_path), "--input", "same/s", "--output", "same/s"])
    assert result.exit_code == 2 and "must not be the input" in result.output
    result = runner.invoke(main, ["pipeline", "run", "--controller", "tcp://127.0.0.1:9", "--checkpoint",
                                  str(tmp_path), "--alert-threshold", "hot"])
    assert result.exit_code == 2 and "not a number" in result.output
    result = runner.invoke(main, ["demo", "--rate", "10", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "never splits" in result.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    result = runner.invoke(main, ["demo", "--data-dir", str(tmp_path / "full")])
    assert result.exit_code == 1 and "not empty" in result.output


def test_progress_records_and_checkpoint_logs(tmp_path: Path) -> None:
    record = progress_record({"batchId": 4, "numInputRows": 10, "sink": {"numOutputRows": 3},
                              "durationMs": {"triggerExecution": 812, "addBatch": 400},
                              "eventTime": {"watermark": "2001-09-09T01:47:11.000Z"}})
    assert (record["batch_id"], record["input_rows"], record["output_rows"], record["trigger_ms"]) == (4, 10, 3, 812)
    assert watermark_ms(record) == 1_000_000_031_000
    assert watermark_ms({"watermark": None}) is None
    assert checkpoint_batches(tmp_path) == (None, None)
    for name in ("offsets/0", "offsets/1", "offsets/2", "commits/0", "commits/1", "offsets/.2.crc"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("v1")
    assert checkpoint_batches(tmp_path) == (2, 1)


def test_kill_session_kills_processes_that_left_the_drivers_process_group(tmp_path: Path) -> None:
    """PySpark's worker daemon puts itself in a process group of its own; a kill of the run must
    still reach it (and a commit running in one of its workers)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from millstream.spark.pipeline import kill_session, session_members

    pid_file = tmp_path / "child.pid"
    script = ("import os, sys, time\n"
              "child = os.fork()\n"
              "if child == 0:\n"
              "    os.setpgid(0, 0)  # as pyspark.daemon does\n"
              f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
              "    time.sleep(600)\n"
              "    os._exit(0)\n"
              "time.sleep(600)\n")
    driver = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert os.getpgid(child) != driver.pid, "the child left the driver's process group"
        assert set(session_members(driver.pid)) == {driver.pid, child}
        kill_session(driver.pid)
        assert driver.wait(30) == -signal.SIGKILL
        while session_members(driver.pid):  # the orphan is reaped by init once killed
            assert time.monotonic() < deadline + 30, f"left alive: {session_members(driver.pid)}"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)


def test_the_demo_and_the_run_take_a_spark_master(tmp_path: Path) -> None:
    """`millstream demo --spark-master spark://...` runs its pipeline on that master, and `pipeline run`
    takes the same option (the old --master still spelled so)."""
    from millstream.cli.pipeline import demo, pipeline_run
    from millstream.spark.demo import DemoConfig
    from millstream.spark.pipeline import spark_conf

    context = demo.make_context("demo", ["--spark-master", "spark://127.0.0.1:7077", "--kills", "0"])
    assert context.params["spark_master"] == "spark://127.0.0.1:7077"
    assert DemoConfig(spark_master="spark://127.0.0.1:7077").spark_master == "spark://127.0.0.1:7077"
    for option in ("--spark-master", "--master"):
        run = pipeline_run.make_context("run", ["--controller", "tcp://127.0.0.1:9", "--checkpoint", str(tmp_path),
                                                option, "spark://h:7077"])
        assert run.params["master"] == "spark://h:7077"
    cluster = spark_conf(PipelineConfig(controller="tcp://127.0.0.1:9", checkpoint=tmp_path, master="spark://h:7077"))
    assert (cluster["spark.master"], cluster["spark.executor.cores"]) == ("spark://h:7077", "1")
    assert "spark.executor.cores" not in spark_conf(PipelineConfig(controller="tcp://127.0.0.1:9", checkpoint=tmp_path))
