"""Writer identity: a writer id belongs to one writer.

Writer ids come from the client's RNG (``random_uuid(rng)``), so two clients made with the same seeded
``rng`` hand out the same ids.  The server keeps, per segment and writer id, the last event number it
stored; a second writer under the same id learns it from ``AppendSetup`` -- a number beyond anything it
ever sent -- and must fail with ``WriterIdInUseError`` instead of taking that number as the
acknowledgement of its own events (which the segment never stored)."""

from __future__ import annotations

import random
import tempfile

import millstream as ms
import pytest
from millstream.client import ScalingPolicy, StreamConfig
from millstream.errors import WriterIdInUseError


def _events(client: ms.Client, stream: str) -> list[str]:
    with client.reader_group("iot/check-" + stream.split("/")[1], [stream]) as group, group.reader("r") as reader:
        seen = []
        while (event := reader.read_next_event(1.0).event) is not None:
            seen.append(event.decode())
        return seen


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
            for i in range(3):
                writer.write_event(f"second {i}".encode())
            with pytest.raises(WriterIdInUseError, match="already holds events"):
                writer.flush()
            with pytest.raises(WriterIdInUseError):
                writer.write_event(b"second 3")
            with pytest.raises(WriterIdInUseError):
                writer.close()
        with ms.connect(node.uri) as reader:
            assert _events(reader, "iot/one") == ["first 0", "first 1", "first 2"]
