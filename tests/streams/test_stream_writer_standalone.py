"""The stream-aware writer against ``millstream.standalone``: 10,000 keyed events written while the
stream is split and merged under the writer (``StreamManager.split_segment``/``merge_segments``),
in both flavours.  Afterwards every segment the stream ever had is read back in epoch order (the
controller's ``get_segments_between`` from the head to the tail: by epoch, then key), and the history
checker must find per (writer, key) order intact, nothing lost and nothing duplicated."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from pathlib import Path

import millstream
from millstream.client import AsyncClient, ScalingPolicy, StreamConfig
from millstream.testing.history import EventTag, History, Outcome, check
from tests.client.helpers import run

STREAM = "iot/sensors"
EVENTS = 10_000
SEED = 20240517


def keys_for(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"sensor-{rng.randrange(1_000_000)}" for _ in range(1000)]


PLAN = ("split", "split", "merge", "split", "merge", "merge")


def scale_target(step: int) -> int:
    """How many events are written before scale ``step`` (0-based) begins."""
    return (step + 1) * EVENTS // (len(PLAN) + 2)


async def scale_under_the_writer(c: AsyncClient, progress: object, done: asyncio.Event | threading.Event,
                                 scaled: threading.Semaphore | asyncio.Semaphore | None = None) -> int:
    """Split and merge while events flow; returns how many scales completed.  ``progress()`` says how
    many events were written so far (so every scale lands mid-stream); ``scaled`` is released after
    each scale (a writer on another thread may wait for it, so its next events meet the seal)."""
    manager = c.stream_manager()
    scales = 0
    plan = PLAN
    for step, kind in enumerate(plan):
        target = scale_target(step)
        while progress() < target and not done.is_set():  # type: ignore[operator]  # noqa: ASYNC110 (polls a count)
            await asyncio.sleep(0.002)
        current = (await manager.current_segments(STREAM)).segments
        if kind == "split":
            widest = max(current, key=lambda s: s.key_end - s.key_start)
            await manager.split_segment(STREAM, widest.segment_id, 2)
        else:
            pair = min(itertools.pairwise(current), key=lambda p: p[1].key_end - p[0].key_start)
            await manager.merge_segments(STREAM, [pair[0].segment_id, pair[1].segment_id])
        scales += 1
        if scaled is not None:
            scaled.release()
    return scales


async def read_back(c: AsyncClient, history: History) -> int:
    """Every segment of the stream in epoch order, as one pass; returns how many segments."""
    scope, name = STREAM.split("/")
    slices = await c.controller().get_segments_between(scope, name, None, None)
    epochs = [s.segment.epoch for s in slices]
    assert epochs == sorted(epochs), "the controller lists segments by epoch"
    payloads: list[bytes] = []
    for piece in slices:
        reader = c.segment_reader(piece.segment.name, offset=piece.start_offset)
        while True:
            events = await reader.read_events()
            if not events:
                break
            payloads.extend(event.value for event in events)
        await reader.close()
    history.read_all("epoch-order", payloads, complete=True)
    return len(slices)


def assert_clean(history: History) -> None:
    report = check(history)
    assert report.ok, report.summary()
    assert report.written == report.acked == report.reads == EVENTS, report.summary()


def test_an_async_writer_keeps_per_key_order_across_splits_and_merges(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        async def scenario() -> None:
            async with AsyncClient(node.uri, rng=random.Random(SEED)) as c:
                manager = c.stream_manager()
                await manager.create_scope("iot")
                await manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(2)))
                writer = c.event_writer(STREAM)
                history = History()
                keys = keys_for(SEED)
                futures: list[tuple[EventTag, asyncio.Future[None]]] = []
                done = asyncio.Event()
                scaled = asyncio.Semaphore(0)
                targets = {scale_target(step) for step in range(len(PLAN))}

                async def write() -> None:
                    rng = random.Random(SEED + 1)
                    for sequence in range(EVENTS):
                        if sequence in targets:  # let this scale land before writing on: the next events meet its seal
                            await asyncio.wait_for(scaled.acquire(), 60)
                        tag = EventTag("async", sequence)
                        key = rng.choice(keys)
                        history.write_invoked(tag, key=key)
                        futures.append((tag, await writer.write_event_future(tag.payload(100, key=key),
                                                                             routing_key=key)))
                    done.set()

                scales, _ = await asyncio.gather(scale_under_the_writer(c, lambda: len(futures), done, scaled), write())
                await writer.flush()
                writer.check_invariants()
                await writer.close()
                for tag, future in futures:
                    history.write_completed(tag, Outcome.ACKED if future.exception() is None else Outcome.UNKNOWN)
                assert scales == 6
                assert writer.hand_overs >= 4, writer.hand_overs  # each sealed segment the writer used
                segments = await read_back(c, history)
                assert segments == 2 + 2 + 2 + 1 + 2 + 1 + 1  # created: 2 at first, 2 per split, 1 per merge
                assert_clean(history)
        run(scenario, timeout=120)


def test_a_blocking_writer_on_another_thread_keeps_per_key_order_across_splits_and_merges(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri, rng=random.Random(SEED)) as client:
        manager = client.stream_manager()
        manager.create_scope("iot")
        manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(3)))
        writer = client.event_writer(STREAM)
        history = History()
        keys = keys_for(SEED + 2)
        written: list[EventTag] = []
        futures = []
        done = threading.Event()
        scaled = threading.Semaphore(0)
        targets = {scale_target(step) for step in range(len(PLAN))}
        failure: list[BaseException] = []

        def write() -> None:
            try:
                rng = random.Random(SEED + 3)
                for sequence in range(EVENTS):
                    if sequence in targets:  # let this scale land before writing on: the next events meet its seal
                        assert scaled.acquire(timeout=30), f"scale at event {sequence} did not finish in 30 s"
                    tag = EventTag("blocking", sequence)
                    key = rng.choice(keys)
                    history.write_invoked(tag, key=key)
                    futures.append(writer.write_event_future(tag.payload(100, key=key), routing_key=key))
                    written.append(tag)
                    if sequence % 50 == 0:
                        time.sleep(0.001)  # so that the scales land while events still flow
            except BaseException as error:  # reported by the main thread
                failure.append(error)
            finally:
                done.set()

        thread = threading.Thread(target=write, name="stream-writer-test")
        thread.start()
        scales = client.run(scale_under_the_writer(client.async_client, lambda: len(written), done, scaled))
        thread.join(60)
        assert not thread.is_alive() and not failure, failure
        writer.flush()
        client.run(_check(writer.core))
        writer.close()
        for tag, future in zip(written, futures, strict=True):
            history.write_completed(tag, Outcome.ACKED if future.exception(0) is None else Outcome.UNKNOWN)
        assert scales == 6 and writer.core.hand_overs >= 4
        client.run(read_back(client.async_client, history))
        assert_clean(history)


async def _check(writer: object) -> None:
    writer.check_invariants()  # type: ignore[attr-defined]
