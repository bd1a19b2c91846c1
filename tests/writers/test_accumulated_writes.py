"""The per-event loop's accumulator (``AsyncEventStreamWriter._accumulate``, issue 26 item 1):
``write_event`` checks an event and appends it; the batch path routes, frames and numbers the
accumulated events together.  What must hold: a few Python calls per event (counted by cProfile, not
timed), every validation error still raised at ``write_event`` with nothing written, order per key
across single events, batches and futures on several threads, an event written alone reaching the
server without a ``flush``, and events still accumulated when the writer fails kept in doubt."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import random
import threading
import time

import pytest

import millstream
from millstream.client._framing import _modules
from millstream.errors import (
    ConnectionLostError,
    InvalidArgumentError,
    ObjectClosedError,
    PayloadTooLargeError,
)
from millstream.limits import EVENT_LENGTH_BYTES_MAX
from tests.client.fake_server import FakeServer, FakeServerThread
from tests.client.helpers import client, fast_config, run, until
from tests.writers.test_batch_writes import SEGMENTS, assert_in_order_per_key_and_once, keyed, make_segments

#: What the per-event loop may cost on the caller's thread, in Python calls per event (cProfile
#: counts C calls too).  Before the accumulator: ~14 (blocking) and ~16 (asyncio).
BLOCKING_CALLS_PER_EVENT_MAX = 8.0  # (measured with it: 6.0)
ASYNCIO_CALLS_PER_EVENT_MAX = 9.0  # (measured with it: 6.6)
EVENTS = 20_000


def _calls_per_event(profiler: cProfile.Profile, events: int) -> float:
    return float(pstats.Stats(profiler).total_calls) / events  # type: ignore[attr-defined]  # (untyped in typeshed)


def _wait_for(condition: object, what: str, seconds: float = 30.0) -> None:
    """(A blocking test's thread.)  Poll ``condition`` until true, or fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]  # (a callable)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


def test_the_blocking_per_event_loop_costs_a_few_python_calls_per_event() -> None:
    _modules()  # NumPy and pyarrow imported first: a one-time import is no per-event cost
    rows = [keyed(i, keys=1000) for i in range(EVENTS)]
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        for name in SEGMENTS:
            blocking.segments().create(name)
        with blocking.event_writer(SEGMENTS) as writer:
            profiler = cProfile.Profile()
            profiler.enable()
            for key, event in rows:  # the README's loop
                writer.write_event(event, routing_key=key)
            profiler.disable()
            writer.flush()
            assert writer.events_written == EVENTS
        calls = _calls_per_event(profiler, EVENTS)
        assert calls <= BLOCKING_CALLS_PER_EVENT_MAX, f"{calls:.1f} Python calls per event"
        assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, EVENTS)


def test_the_asyncio_per_event_loop_costs_a_few_python_calls_per_event() -> None:
    _modules()
    rows = [keyed(i, keys=1000) for i in range(EVENTS)]

    measured: list[float] = []

    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                profiler = cProfile.Profile()
                profiler.enable()
                for key, event in rows:
                    await writer.write_event(event, routing_key=key)
                profiler.disable()
                await writer.flush()
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, EVENTS)
            measured.append(_calls_per_event(profiler, EVENTS))
    run(scenario)
    (calls,) = measured
    assert calls <= ASYNCIO_CALLS_PER_EVENT_MAX, f"{calls:.1f} Python calls per event"


def test_write_event_still_refuses_bad_events_at_once_and_writes_nothing_of_them() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                await writer.write_event(b"k0:0", routing_key="k0")
                with pytest.raises(InvalidArgumentError, match=r"routing key is a str.*, not int"):
                    await writer.write_event(b"bad key", routing_key=7)  # type: ignore[arg-type]  # (the point)
                with pytest.raises(InvalidArgumentError, match=r"routing key is a str.*, not list"):
                    await writer.write_event(b"bad key", routing_key=["k"])  # type: ignore[arg-type]  # (the point)
                with pytest.raises(PayloadTooLargeError, match="exceeds the limit"):
                    await writer.write_event(b"x" * (EVENT_LENGTH_BYTES_MAX + 1), routing_key="k0")
                await writer.write_event(b"k0:1", routing_key="k0")
                assert writer.events_written == 2
            stored = {name: server.payloads(name) for name in SEGMENTS}
            assert_in_order_per_key_and_once(stored, 2)
    run(scenario)


def test_an_event_written_alone_reaches_the_server_without_a_flush() -> None:
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        blocking.segments().create("s")
        with blocking.event_writer(["s"]) as writer:
            writer.write_event(b"alone")
            _wait_for(lambda: server.payloads("s") == [b"alone"], "the lone event was stored")
            writer.write_event(b"and another")
            _wait_for(lambda: server.payloads("s") == [b"alone", b"and another"], "the second was stored")


def test_single_events_batches_and_futures_on_several_threads_keep_order_per_key() -> None:
    threads_count, per_thread = 4, 3000
    with FakeServerThread() as server, millstream.connect(server.uri, config=fast_config(),
                                                          rng=random.Random(1)) as blocking:
        for name in SEGMENTS:
            blocking.segments().create(name)
        with blocking.event_writer(SEGMENTS) as writer:
            failures: list[BaseException] = []

            def produce(thread: int) -> None:
                try:
                    numbers = range(thread * per_thread, (thread + 1) * per_thread)
                    batch: list[tuple[str, bytes]] = []
                    for i in numbers:
                        key, event = f"t{thread}-{i % 7}", f"t{thread}-{i % 7}:{i}".encode()
                        if i % 500 < 100:  # runs of single events, a batch, and a future now and then
                            writer.write_event(event, routing_key=key)
                        elif i % 500 < 499:
                            batch.append((key, event))
                        else:
                            batch.append((key, event))
                            writer.write_events([e for _, e in batch], routing_keys=[k for k, _ in batch])
                            batch.clear()
                        if i % 997 == 0:
                            writer.write_event_future(f"{key}:{i}x".encode(), routing_key=key)
                    assert not batch
                except BaseException as error:
                    failures.append(error)

            workers = [threading.Thread(target=produce, args=(thread,)) for thread in range(threads_count)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(120)
            assert not failures, failures
            writer.flush()
            writer.core.check_invariants()
    stored = {name: [raw for raw in server.payloads(name) if not raw.endswith(b"x")] for name in SEGMENTS}
    assert_in_order_per_key_and_once(stored, threads_count * per_thread)
    futures = [raw for name in SEGMENTS for raw in server.payloads(name) if raw.endswith(b"x")]
    assert len(futures) == len([i for i in range(threads_count * per_thread) if i % 997 == 0])


def test_events_accumulated_when_the_writer_fails_stay_in_doubt_and_the_next_call_raises() -> None:
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            writer = c.event_writer(SEGMENTS)
            await writer.write_event(b"first", routing_key="a")
            await writer.flush()
            for i in range(5):  # no turn of the loop in between: they stay accumulated
                await writer.write_event(b"held-%d" % i, routing_key=f"k{i}")
            assert writer._accumulated, "the events are accumulated (the premise of this test)"
            failure = ConnectionLostError("the writer failed for good")
            writer._shared.fail(failure)
            in_doubt = writer.in_doubt_events()
            assert [(event.sequence, event.payload, event.routing_key) for event in in_doubt] == [
                (2 + i, b"held-%d" % i, f"k{i}") for i in range(5)]
            assert all(event.segment in SEGMENTS for event in in_doubt)
            assert writer.events_written == 6
            with pytest.raises(ConnectionLostError, match="failed for good"):
                await writer.write_event(b"later", routing_key="a")
            with pytest.raises(ConnectionLostError, match="failed for good"):
                await writer.flush()
            assert [event.payload for event in writer.in_doubt_events()] == [b"held-%d" % i for i in range(5)]
            with pytest.raises(ConnectionLostError):
                await writer.close()
            with pytest.raises((ConnectionLostError, ObjectClosedError)):
                await writer.write_event(b"after close")
            assert sum(len(server.payloads(name)) for name in SEGMENTS) == 1
            await until(lambda: True, "nothing")  # (a loop turn: the scheduled drain finds the writer failed)
            assert len(writer._accumulated) == 5
    run(scenario)


def test_an_accumulated_drain_on_the_loop_thread_waits_for_a_drain_on_the_callers() -> None:
    """Two drains never interleave: the loop's scheduled one waits for the caller's (which holds
    the drain lock while it adds), so the sequence stays in the order written."""
    async def scenario() -> None:
        async with FakeServer() as server, client(server.uri) as c:
            await make_segments(c, SEGMENTS)
            async with c.event_writer(SEGMENTS) as writer:
                rows = [keyed(i) for i in range(2000)]
                for key, event in rows:
                    await writer.write_event(event, routing_key=key)
                    if len(writer._accumulated) % 97 == 0:
                        await asyncio.sleep(0)  # the loop's drain runs now and then
                await writer.flush()
                writer.check_invariants()
            assert_in_order_per_key_and_once({name: server.payloads(name) for name in SEGMENTS}, 2000)
    run(scenario)
