"""The blocking flavour: the same core on an event-loop thread, a per-event path on the caller's
thread, several threads writing through one writer, waiting for capacity, closing."""

from __future__ import annotations

import random
import threading
import time

import pytest

import millstream
from millstream.client import Client, StringSerializer
from millstream.errors import InternalError, ObjectClosedError, StreamSegmentSealedError
from millstream.wire.commands import AppendBlock
from tests.client.fake_server import FakeServerThread, Faults
from tests.client.helpers import fast_config


def connect(uri: str, **overrides: object) -> Client:
    return millstream.connect(uri, config=fast_config(**overrides), rng=random.Random(1))


def test_write_flush_read_blocking() -> None:
    with FakeServerThread() as server, connect(server.uri) as client:
        segments = client.segments()
        segments.create("s")
        with client.event_writer(["s"], StringSerializer()) as writer:
            for i in range(5000):
                writer.write_event(f"e{i}")
            writer.flush()
            assert segments.info("s").length == sum(8 + len(f"e{i}") for i in range(5000))
        reader = client.segment_reader("s", StringSerializer())
        values = []
        while (event := reader.read_event()) is not None:
            values.append(event.value)
        assert values == [f"e{i}" for i in range(5000)]
        assert reader.at_tail and reader.offset == segments.info("s").length
        segments.seal("s")
        assert list(reader) == [] and reader.end_of_segment
        raw = client.byte_stream_reader("s")
        assert raw.read(10) == segments.read("s", 0, length=10).data
        reader.close()
        raw.close()


def test_several_threads_write_through_one_writer() -> None:
    with FakeServerThread() as server, connect(server.uri) as client:
        names = ["m/0", "m/1"]
        for name in names:
            client.segments().create(name)
        writer = client.event_writer(names, StringSerializer())
        errors: list[BaseException] = []

        def produce(thread: int) -> None:
            try:
                for i in range(3000):
                    writer.write_event(f"{thread}:{i}", routing_key=f"thread-{thread}")
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        writer.close()
        assert not errors
        last = {t: -1 for t in range(4)}
        count = 0
        for name in names:
            for raw in server.payloads(name):
                thread, number = map(int, raw.decode().split(":"))
                assert number == last[thread] + 1, "each thread's events stay in order, none lost or doubled"
                last[thread] = number
                count += 1
        assert count == 12_000


def test_a_blocking_writer_waits_for_capacity_and_resumes() -> None:
    with FakeServerThread(faults=Faults(hold_acks=True)) as server, connect(
            server.uri, writer_unacked_bytes_max=10_000, append_ack_timeout_seconds=10.0) as client:
        client.segments().create("s")
        writer = client.event_writer(["s"])
        done = threading.Event()

        def produce() -> None:
            for _ in range(200):
                writer.write_event(b"z" * 500)
            done.set()

        thread = threading.Thread(target=produce)
        thread.start()
        time.sleep(0.2)
        assert not done.is_set(), "the writer waits while acknowledgements are held"
        holding = len(server.payloads("s"))
        assert 0 < holding < 200
        for _ in range(200):
            server_thread_release(server)
            if done.wait(0.05):
                break
        thread.join(10)
        assert done.is_set()
        writer.close()
        assert len(server.payloads("s")) == 200


def server_thread_release(server: object) -> None:
    # FakeServer methods must run on its own loop; release_acks only touches transports via send().
    loop = server._server.get_loop()  # type: ignore[attr-defined]
    loop.call_soon_threadsafe(server.release_acks)  # type: ignore[attr-defined]


def test_per_event_futures_and_errors_surface_in_the_blocking_flavour() -> None:
    with FakeServerThread(faults=Faults(seal_after_blocks=1)) as server, connect(server.uri) as client:
        client.segments().create("s")
        writer = client.event_writer(["s"])
        first = writer.write_event_future(b"first")
        assert first.result(10) is None
        second = writer.write_event_future(b"second")
        with pytest.raises(StreamSegmentSealedError):
            second.result(10)
        with pytest.raises(StreamSegmentSealedError):
            writer.flush()
        assert writer.unacknowledged_events("s") == [b"second"]
        with pytest.raises(StreamSegmentSealedError):
            writer.close()
        assert server.blocks_of(AppendBlock)


def test_closing_the_client_flushes_its_writers_and_refuses_further_calls() -> None:
    with FakeServerThread() as server:
        client = connect(server.uri)
        client.segments().create("s")
        writer = client.event_writer(["s"])
        for i in range(100):
            writer.write_event(b"%d" % i)
        client.close()
        client.close()
        assert len(server.payloads("s")) == 100
        with pytest.raises(ObjectClosedError):
            client.segments().create("t")
        assert not client.loop.is_running()


def test_a_blocking_call_from_the_clients_own_loop_is_refused_instead_of_deadlocking() -> None:
    with FakeServerThread() as server, connect(server.uri) as client:
        client.segments().create("s")
        outcome: list[BaseException] = []

        def on_loop() -> None:
            try:
                client.segments().info("s")
            except BaseException as error:
                outcome.append(error)

        client.loop.call_soon_threadsafe(on_loop)
        deadline = time.monotonic() + 5
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        assert outcome and isinstance(outcome[0], InternalError)
