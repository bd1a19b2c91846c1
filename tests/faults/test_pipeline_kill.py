"""Crash campaign for the Spark pipeline: SIGKILL the driver at seeded points, restart it from its
checkpoint, and check that every output row is in the output stream exactly once.

The reference pipeline (``millstream pipeline run``) runs as a separate process in a session of its
own; a kill is SIGKILL to every process of that session (driver Python, JVM, Python workers).  A
writer keeps writing the sensor workload into the input stream throughout, and the input stream splits
halfway through the campaign.  Each launch of the pipeline ends in one of three kills, in a seeded
order (each kind at least once):

* ``external``: from outside, after a seeded number of micro-batches with data and a seeded fraction of
  the trigger interval -- anywhere in Spark's cycle (planning, tasks writing their transactions, the
  sink's commit, Spark's logs);
* ``commit-before`` / ``commit-after``: from inside the sink's driver-side commit, through the
  pipeline's fault hook (``MILLSTREAM_SPARK_FAULT=kill-in-commit:WHEN:BATCH``): just before, or just
  after, the store's fenced multi-commit of the first batch at or after a seeded batch id that has
  rows to commit.  "after" is the window in which a sink without the fence duplicates the batch (the
  public Pravega connector's hole): the store has committed batch b, Spark's commit log has not.

After each kill the test checks where the kill landed (Spark's offset and commit logs, the store's
fence for the query), and after the last launch -- which runs until its watermark has passed every
window, then stops gracefully -- that the output is exactly what ``expected_output`` computes from the
events written: 0 duplicates, 0 missing, 0 unexpected, 0 wrong.  A failure names the seed
(``MILLSTREAM_SEED`` replays it) and keeps the pipeline's logs in the test's directory.

Default profile: 5 kills (about 6 JVM starts: a few minutes); ``MILLSTREAM_PROFILE=nightly``: 30.

The same campaign runs on a Spark standalone cluster too (``StandaloneCluster``: a master and two
workers started from the PySpark installation, each a JVM of its own whose executor has Python
workers of its own, reaching the store over TCP): the driver killed and restarted from its
checkpoint, 0 missing, 0 duplicates.  It starts the cluster, runs, and stops it (also on failure);
it takes about ten minutes, so it runs nightly (or with ``MILLSTREAM_SPARK_CLUSTER=1``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the pipeline crash campaign needs pyspark: pip install -e '.[spark]'")
pytest.importorskip("pyarrow", reason="the pipeline crash campaign needs pyarrow: pip install -e '.[spark]'")

from millstream.client import AsyncClient, ScalingPolicy, StreamConfig
from millstream.spark import fence_key
from millstream.spark.demo import (
    DRAIN_TIMEOUT_SECONDS,
    PIPELINE_KILL_WAIT_SECONDS,
    PIPELINE_PROGRESS_TIMEOUT_SECONDS,
    PIPELINE_START_TIMEOUT_SECONDS,
    PipelineProcess,
    checkpoint_batches,
    checkpoint_query_id,
    final_watermark_ms,
    read_stream,
    watermark_ms,
)
from millstream.spark.pipeline import FAULT_ENVIRONMENT_VARIABLE, PipelineConfig
from millstream.spark.workload import SensorWorkload, verify

NIGHTLY = os.environ.get("MILLSTREAM_PROFILE") == "nightly"
KILLS = 30 if NIGHTLY else 5
SEED = int(os.environ.get("MILLSTREAM_SEED", "20261122"))
KINDS = ("external", "commit-before", "commit-after")

INPUT, OUTPUT = "faults/sensors", "faults/alerts"
# Short windows, so nearly every micro-batch has rows to commit (a kill inside the commit then
# interrupts a real multi-commit); the disorder stays within half the watermark delay.
WORKLOAD = SensorWorkload(seed=SEED % 1_000_003, sensors=12, events_per_second=150, window_seconds=2,
                          watermark_delay_seconds=4, disorder_ms_max=1_000, malformed_every=500)
TRIGGER_SECONDS = 1.0


def kill_plan(rng: random.Random, kills: int) -> list[str]:
    """``kills`` kinds, each of the three at least once (when there are three or more), shuffled."""
    plan = list(KINDS[:kills]) + [rng.choice(KINDS) for _ in range(kills - len(KINDS))]
    rng.shuffle(plan)
    return plan


async def write_workload(client: AsyncClient, stop: asyncio.Event, written: list[int]) -> None:
    """Readings at the workload's rate until ``stop``, then the watermark markers; ``written[0]``
    counts the readings."""
    writer = client.event_writer(INPUT)
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        while not stop.is_set():
            due = int((loop.time() - began) * WORKLOAD.events_per_second)
            for routing_key, payload in WORKLOAD.events(written[0], due - written[0]):
                await writer.write_event(payload, routing_key=routing_key)
            written[0] = max(written[0], due)
            await asyncio.sleep(0.05)
        await writer.flush()
        for routing_key, payload in WORKLOAD.end_markers(written[0]):
            await writer.write_event(payload, routing_key=routing_key)
        await writer.flush()
    finally:
        await writer.close()


async def campaign(workdir: Path, seed: int, kills: int, *, master: str = "local[2]") -> dict[str, Any]:
    from millstream.standalone import Node

    rng = random.Random(seed)
    plan = kill_plan(rng, kills)
    node = Node(workdir / "store", port=0)
    await node.start()
    landed: list[str] = []
    runs: list[PipelineProcess] = []
    try:
        async with AsyncClient(node.uri) as client:
            manager = client.stream_manager()
            await manager.create_scope("faults")
            await manager.create_stream(INPUT, StreamConfig(scaling=ScalingPolicy.fixed(1)))
            await manager.create_stream(OUTPUT, StreamConfig(scaling=ScalingPolicy.fixed(2)))
            config = PipelineConfig(controller=node.uri, input_stream=INPUT, output_stream=OUTPUT,
                                    checkpoint=workdir / "checkpoint", window_seconds=WORKLOAD.window_seconds,
                                    watermark_delay_seconds=WORKLOAD.watermark_delay_seconds,
                                    alert_threshold_c=WORKLOAD.alert_threshold_c,
                                    alert_readings_min=WORKLOAD.alert_readings_min,
                                    trigger_interval_seconds=TRIGGER_SECONDS, master=master)
            stop_writing = asyncio.Event()
            written = [0]
            async with asyncio.TaskGroup() as group:
                writing = group.create_task(write_workload(client, stop_writing, written))
                for number, kind in enumerate(plan, start=1):
                    if number == len(plan) // 2 + 1:
                        # Every segment splits at once (see the demo: no successor starts behind a
                        # segment already read to the tail).
                        (segment,) = (await manager.describe_stream(INPUT)).segments
                        await manager.split_segment(INPUT, segment.segment_id, 2)
                    landed.append(await kill_once(config, workdir, number, kind, rng, runs, client))
                stop_writing.set()
                await writing
                final = PipelineProcess(config, workdir / f"run-{len(plan) + 1}-final.log")
                runs.append(final)
                await final.start()
                target = final_watermark_ms(WORKLOAD, written[0])
                await final.wait_until(lambda r: any((watermark_ms(p) or 0) >= target for p in r.progress),
                                       "a watermark past every window", DRAIN_TIMEOUT_SECONDS)
                assert await final.stop() == 0, f"the last run did not stop cleanly (see {final.log_path})"
            offsets, commits = checkpoint_batches(config.checkpoint)
            query_id = checkpoint_query_id(config.checkpoint)
            assert query_id is not None
            fence = await client.get_fence(OUTPUT, fence_key(query_id))
            stored = await read_stream(client, INPUT)
            output = await read_stream(client, OUTPUT)
            segments = len((await manager.describe_stream(INPUT)).segments)
    finally:
        for run in runs:
            await run.close()
        await node.stop()
    events = [WORKLOAD.payload(i) for i in range(written[0])] + [p for _, p in WORKLOAD.end_markers(written[0])]
    return {"plan": plan, "landed": landed, "verification": verify(WORKLOAD, events, stored, output),
            "fence": fence, "offsets": offsets, "commits": commits, "segments": segments, "readings": written[0]}


async def kill_once(config: PipelineConfig, workdir: Path, number: int, kind: str, rng: random.Random,
                    runs: list[PipelineProcess], client: AsyncClient) -> str:
    """One launch of the pipeline, ended by a kill of ``kind``; returns where the kill landed."""
    environment = {}
    _, committed = checkpoint_batches(config.checkpoint)
    # What the store recorded before this launch: a kill after the store's commit and before Spark's
    # commit log leaves the store one batch ahead, and the next launch replays that batch.
    earlier_query = checkpoint_query_id(config.checkpoint)
    fence_before = None if earlier_query is None else await client.get_fence(OUTPUT, fence_key(earlier_query))
    target = None
    if kind != "external":
        target = (-1 if committed is None else committed) + rng.randint(1, 3)
        environment[FAULT_ENVIRONMENT_VARIABLE] = f"kill-in-commit:{kind.removeprefix('commit-')}:{target}"
    run = PipelineProcess(config, workdir / f"run-{number}-{kind}.log", environment=environment)
    runs.append(run)
    await run.start()
    await run.wait_until(lambda r: r.started is not None, "its start", PIPELINE_START_TIMEOUT_SECONDS)
    if kind == "external":
        batches = rng.randint(1, 3)
        await run.wait_until(lambda r: r.data_batches() >= batches, f"{batches} batches with data",
                             PIPELINE_PROGRESS_TIMEOUT_SECONDS)
        await asyncio.sleep(rng.uniform(0.0, TRIGGER_SECONDS))
        run.kill()
        status = await run.wait_exit(PIPELINE_KILL_WAIT_SECONDS)
    else:
        # The run kills itself inside the sink's commit of a batch at or after ``target``.
        status = await run.wait_exit(PIPELINE_PROGRESS_TIMEOUT_SECONDS)
    assert status == -signal.SIGKILL, f"run {number} ({kind}) ended with {status}, not SIGKILL (see {run.log_path})"
    offsets, commits = checkpoint_batches(config.checkpoint)
    query_id = checkpoint_query_id(config.checkpoint)
    fence = None if query_id is None else await client.get_fence(OUTPUT, fence_key(query_id))
    where = f"run {number} {kind}: offsets/{offsets} commits/{commits} fence {fence_before} -> {fence}"
    # Spark's commit log never runs ahead of the store, nor the store more than a batch ahead of it
    # (the fence lags on batches with no rows to commit: those call no multi-commit at all).
    if fence is not None:
        assert commits is None or fence <= commits + 1, where
    if kind != "external":
        assert target is not None and offsets is not None and offsets >= target, where
        assert commits == offsets - 1, f"{where}: the kill came inside batch {offsets}'s commit, before its log"
        if kind == "commit-after":
            assert fence == offsets, f"{where}: the store committed batch {offsets} before the kill"
        else:  # this launch did not commit batch ``offsets`` (an earlier one may have: a replay)
            replayed = fence_before is not None and fence_before >= offsets
            assert fence is None or fence < offsets or (replayed and fence == fence_before), (
                f"{where}: the store committed batch {offsets} in this launch, before the kill")
    return where


def test_driver_kills_leave_every_output_row_exactly_once(tmp_path: Path) -> None:
    result = asyncio.run(campaign(tmp_path, SEED, KILLS))
    verification = result["verification"]
    report = json.dumps({key: value for key, value in result.items() if key != "verification"}, indent=1)
    message = (f"seed {SEED} (MILLSTREAM_SEED={SEED} replays it), {KILLS} kills; logs in {tmp_path}\n"
               f"{report}\n{verification.table()}")
    assert len(result["landed"]) == KILLS, message
    assert set(result["plan"]) == set(KINDS) or len(KINDS) > KILLS, message
    assert result["segments"] == 2, message  # the input stream split during the campaign
    assert verification.duplicates == 0, message
    assert verification.missing == 0, message
    assert verification.passed, message
    assert verification.expected_rows > 100 and verification.expected_alerts > 0, message
    print(f"\npipeline crash campaign: seed {SEED}, {KILLS} kills, {result['readings']:,} readings\n"
          + "\n".join(result["landed"]) + "\n" + verification.table())


CLUSTER_KILLS = 4 if NIGHTLY else 2
#: The cluster run takes about ten minutes on a busy two-core machine (three more JVMs, each launch's
#: executors starting on the workers): beyond the default run's budget, so it runs nightly, or when
#: asked for.
CLUSTER = NIGHTLY or os.environ.get("MILLSTREAM_SPARK_CLUSTER") == "1"


@pytest.mark.skipif(not CLUSTER, reason="the standalone-cluster campaign runs nightly (MILLSTREAM_PROFILE=nightly) "
                                        "or with MILLSTREAM_SPARK_CLUSTER=1: about ten minutes")
def test_on_a_standalone_cluster_driver_kills_leave_every_output_row_exactly_once(tmp_path: Path) -> None:
    from millstream.spark.cluster import StandaloneCluster

    with StandaloneCluster(tmp_path / "cluster", workers=2, cores=1, memory_mb=1024) as cluster:
        result = asyncio.run(campaign(tmp_path, SEED, CLUSTER_KILLS, master=cluster.url))
        applications = cluster.state().get("completedapps", []) + cluster.state().get("activeapps", [])
    verification = result["verification"]
    report = json.dumps({key: value for key, value in result.items() if key != "verification"}, indent=1)
    message = (f"seed {SEED}, {CLUSTER_KILLS} kills on {cluster.url}; logs in {tmp_path}\n{report}\n"
               f"{verification.table()}")
    assert len(applications) == CLUSTER_KILLS + 1, f"every launch ran on the cluster: {applications}\n{message}"
    assert all(app.get("cores") == 2 for app in applications), f"two executors each: {applications}"
    assert result["segments"] == 2, message
    assert verification.duplicates == 0 and verification.missing == 0, message
    assert verification.passed and verification.expected_rows > 100, message
    print(f"\npipeline crash campaign on a standalone cluster ({cluster.url}, 2 workers): seed {SEED}, "
          f"{CLUSTER_KILLS} kills, {result['readings']:,} readings\n" + "\n".join(result["landed"]) + "\n"
          + verification.table())
