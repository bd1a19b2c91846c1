"""Every client feature with the token its user would hold, against a node with auth on: a scope token
(``iot/*``) is enough for everything in its scope -- streams, writers, stream transactions and the
fenced multi-commit (the Spark sink's path), large events, byte streams, reader groups -- and a
read-only token for one stream reads it but changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import millstream
from millstream.auth import Permission, issue_token
from millstream.client import LargeEventConfig, ScalingPolicy, StreamConfig
from millstream.errors import AuthenticationError, ReaderGroupNotFoundError

SECRET = b"client-auth-test-secret-0123456"
VALID_UNTIL = 4_000_000_000.0  # 2096
ALL = issue_token(SECRET, "*", Permission.READ_UPDATE, VALID_UNTIL)
SCOPE = issue_token(SECRET, "iot/*", Permission.READ_UPDATE, VALID_UNTIL)
STREAM_READ_ONLY = issue_token(SECRET, "iot/s", Permission.READ, VALID_UNTIL)
SMALL = LargeEventConfig(inline_bytes_max=4096, chunk_bytes=1024, unacked_bytes_max=4096)
READ_ATTEMPTS_MAX = 60


@pytest.fixture
def node(tmp_path: Path) -> Iterator[millstream.StandaloneNode]:
    with millstream.standalone(tmp_path / "data", auth_secret=SECRET) as started:
        with millstream.connect(started.uri, token=ALL) as admin:
            admin.stream_manager().create_scope("iot")
        yield started


def test_a_scope_token_is_enough_for_every_client_feature(node: millstream.StandaloneNode) -> None:
    large = b"L" * 10_000
    with millstream.connect(node.uri, token=SCOPE) as client:
        manager = client.stream_manager()
        manager.create_stream("iot/s", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        manager.create_stream("iot/bytes", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        assert manager.list_streams("iot") == ["bytes", "s"]
        with client.event_writer("iot/s") as writer:
            for index in range(3):
                writer.write_event(b"e%d" % index, routing_key=f"k{index}")
            writer.flush()
        with client.transactional_writer("iot/s") as transactional:
            single = transactional.begin()
            single.write_event(b"t1", routing_key="k")
            single.commit()
            fenced = transactional.begin()
            fenced.write_event(b"t2", routing_key="k")
            fenced.flush()
        client.commit_transactions("iot/s", [fenced], fence=("query-1", 1))
        assert client.get_fence("iot/s", "query-1") == 1
        single.wait_for_completion()
        with client.large_event_writer("iot/s", config=SMALL) as large_writer:
            event = large_writer.stream_event("k")
            event.write(large)
            event.commit()
        with client.byte_stream_writer("iot/bytes") as byte_writer:
            byte_writer.write(b"raw bytes")
            byte_writer.flush()
        assert client.byte_stream_reader("iot/bytes").read(wait_seconds=5.0) == b"raw bytes"
        with client.reader_group("iot/g", ["iot/s"]) as group, group.reader("r1") as reader:
            seen: list[bytes] = []
            for _ in range(READ_ATTEMPTS_MAX):
                read = reader.read_next_event(1.0)
                if read.event is not None:
                    seen.append(read.event)
                if len(seen) == 6:
                    break
        assert sorted(seen) == sorted([b"e0", b"e1", b"e2", b"t1", b"t2", large])


def test_a_read_only_stream_token_reads_and_changes_nothing(node: millstream.StandaloneNode) -> None:
    with millstream.connect(node.uri, token=ALL) as admin:
        admin.stream_manager().create_stream("iot/s", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        with admin.event_writer("iot/s") as writer:
            writer.write_event(b"stored", routing_key="k")
        (segment,) = admin.stream_manager().tail_cut("iot/s").segment_names()
    with millstream.connect(node.uri, token=STREAM_READ_ONLY) as client:
        reader = client.segment_reader(segment)
        read = reader.read_event(wait_seconds=5.0)
        assert read is not None and read.value == b"stored"
        assert client.stream_manager().tail_cut("iot/s").segment_names() == {segment: reader.offset}
        with pytest.raises(AuthenticationError, match="grants READ, not READ_UPDATE"), \
                client.event_writer("iot/s") as writer:
            writer.write_event(b"refused", routing_key="k")
            writer.flush()
        with pytest.raises(AuthenticationError, match="not 'iot/_RGg'"):
            client.reader_group("iot/g", ["iot/s"])
        with pytest.raises(AuthenticationError):
            client.transactional_writer("iot/s").begin()
    with millstream.connect(node.uri, token=ALL) as admin:
        assert admin.segments().info(segment).length == reader.offset, "nothing was appended"
        with pytest.raises(ReaderGroupNotFoundError):
            admin.reader_group("iot/g")
