"""Writer identity: a writer id belongs to one writer.

Writer ids come from the client's RNG (``random_uuid(rng)``), so two clients made with the same seeded
``rng`` hand out the same ids.  The server keeps, per segment and writer id, the last event number it
stored; a second writer under the same id learns it from ``AppendSetup`` -- a number beyond anything it
ever sent -- and must fail with ``WriterIdInUseError`` instead of taking that number as the
acknowledgement of its own events (which the segment never stored)."""

from __future__ import annotations

import random
import tempfile

import pytest

import millstream as ms
from millstream.client import ScalingPolicy, StreamConfig
from millstream.errors import WriterIdInUseError
from tests.writers.test_stable_writer import read_all


def test_a_second_client_with_the_same_rng_fails_instead_of_being_acknowledged() -> None:
    with tempfile.TemporaryDirectory() as data, ms.standalone(data) as node:
        with ms.connect(node.uri) as admin:
            admin.stream_manager().create_scope("iot")
            admin.stream_manager().create_stream("iot/one", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        with ms.connect(node.uri, rng=random.Random(1)) as first, first.event_writer("iot/one") as writer:
            for i in range(3):
                writer.write_event(f"first {i}".encode())
            writer.flush()
        with ms.connect(node.uri, rng=random.Random(1)) as second:
            writer = second.event_writer("iot/one")
            # The server's answer to the writer's setup may arrive while it still writes: any of these
            # calls may be the first to raise, and the flush must at the latest.
            with pytest.raises(WriterIdInUseError, match="already holds events"):
                for i in range(3):
                    writer.write_event(f"second {i}".encode())
                writer.flush()
            with pytest.raises(WriterIdInUseError):
                writer.write_event(b"second 3")
            with pytest.raises(WriterIdInUseError):
                writer.close()
        # Read straight from the segments, up to their lengths: a reader group's read with a timeout
        # would end early on a loaded machine (it waits for an assignment) and fail for no reason.
        assert read_all(node.uri, "iot/one") == ["first 0", "first 1", "first 2"]
