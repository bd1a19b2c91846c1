"""Issue 20.2 end to end, against a standalone node: truncation in the middle of an event is refused
-- `millstream segment truncate t/seg/0 3`, `millstream stream truncate --cut '{"0":5,"1":0}'`, a
reader group's start cut -- with a typed error and a clean one-line message, and the segment and every
reader still read from the head; truncation on a boundary still works; byte streams keep byte
granularity; and segment info reports when the segment was last modified."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import millstream
from millstream.cli import main
from millstream.client import ReaderGroupConfig, ScalingPolicy, StreamConfig, StreamCut
from millstream.errors import BadOffsetError, InvalidStreamCutError


def invoke(uri: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_segment_truncate_inside_an_event_is_refused_and_the_segment_stays_readable(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "segment", "create", "t/seg/0")[0] == 0
        assert invoke(uri, "write", "--segment", "t/seg/0", "--no-progress", stdin="first\nsecond\nthird\n")[0] == 0
        code, _, err = invoke(uri, "segment", "truncate", "t/seg/0", "3")
        assert code == 1, err
        assert err.strip().splitlines()[-1] == (
            "Error: BadOffsetError: offset 3 of 't/seg/0' is not an event boundary: it lies inside the header of "
            "the event at 0"), err
        code, out, _ = invoke(uri, "read", "--segment", "t/seg/0")
        assert (code, out) == (0, "first\nsecond\nthird\n"), "the refused truncation changed nothing"
        code, out, _ = invoke(uri, "read", "--segment", "t/seg/0", "--show-offsets")
        second = int(out.splitlines()[1].split()[0])  # the offset where "second" begins
        assert second == 8 + len("first")
        assert invoke(uri, "segment", "truncate", "t/seg/0", str(second)) == (0, f"truncated t/seg/0 at {second}\n",
                                                                               "")
        assert invoke(uri, "read", "--segment", "t/seg/0")[1] == "second\nthird\n"


def test_segment_info_says_when_the_segment_last_changed(tmp_path: Path) -> None:
    """Issue 20.8: last_modified_ms was always 0.  (Bracketed by the node's clock -- the system's --
    read before and after each change: no duration is assumed.)"""
    with millstream.standalone(tmp_path) as node:
        uri = node.uri

        def last_modified() -> int:
            return int(json.loads(invoke(uri, "segment", "info", "t/seg/0", "--json")[1])["last_modified_ms"])
        before = int(time.time() * 1000)
        assert invoke(uri, "segment", "create", "t/seg/0")[0] == 0
        created = last_modified()
        assert before <= created <= int(time.time() * 1000)
        before = int(time.time() * 1000)
        assert invoke(uri, "write", "--segment", "t/seg/0", "--no-progress", stdin="one\n")[0] == 0
        written = last_modified()
        assert before <= written <= int(time.time() * 1000) and written >= created
        assert last_modified() == written, "reading changes nothing"
    with millstream.standalone(tmp_path) as node:  # and it survives a restart (never earlier than the truth)
        uri = node.uri
        assert last_modified() >= written


def test_stream_cuts_inside_an_event_are_refused_and_readers_still_read_everything(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope("t")
        manager.create_stream("t/s", StreamConfig(scaling=ScalingPolicy.fixed(2)))
        with client.event_writer("t/s", millstream.StringSerializer()) as writer:
            for n in range(20):
                writer.write_event(f"event {n}", routing_key=f"key {n}")
            writer.flush()
        ids = [s.segment_id for s in manager.current_segments("t/s").segments]
        assert ids == [0, 1]
        code, _, err = invoke(node.uri, "stream", "truncate", "t/s", "--cut", '{"0": 5, "1": 0}')
        assert code == 1 and err.startswith("Error: InvalidStreamCutError: the cut's offset 5 in segment 0 of t/s "
                                             "is not an event boundary"), err
        assert manager.head_cut("t/s").to_wire() == {"0": 0, "1": 0}, "nothing was truncated"
        with pytest.raises(InvalidStreamCutError, match="not an event boundary"):
            client.reader_group("t/from-the-middle", config=ReaderGroupConfig({"t/s": (StreamCut("t/s", {0: 5, 1: 0}),
                                                                                      None)}))
        # Readers read every event from the head, none of them broken.
        tail = manager.tail_cut("t/s")
        group = client.reader_group("t/all", config=ReaderGroupConfig({"t/s": (None, tail)}))
        seen = []
        with group.reader("r", millstream.StringSerializer()) as reader:
            for _ in range(100):
                read = reader.read_next_event(timeout=30.0)
                if read.end_of_stream:
                    break
                if read.event is not None:
                    seen.append(read.event)
        assert sorted(seen) == sorted(f"event {n}" for n in range(20))
        # A cut on an event boundary (the end of segment 0's first event) works.
        segment0 = manager.current_segments("t/s").segments[0].name
        head = client.segments().read(segment0, 0).data
        assert head[:4] == b"\x00\x00\x00\x00"  # an event header: type 0, then the length
        boundary = 8 + int.from_bytes(head[4:8], "big")
        assert invoke(node.uri, "stream", "truncate", "t/s", "--cut", json.dumps({"0": boundary, "1": 0}))[0] == 0
        assert manager.head_cut("t/s").to_wire() == {"0": boundary, "1": 0}


def test_byte_streams_keep_byte_granularity(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        manager = client.stream_manager()
        manager.create_scope("t")
        manager.create_stream("t/bytes", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        with client.byte_stream_writer("t/bytes") as writer:
            writer.write(b"raw bytes, no framing")
            writer.flush()
            writer.truncate_data_before(3)
        with client.byte_stream_reader("t/bytes", offset=3) as reader:
            assert reader.read(100) == b" bytes, no framing"
        # A byte stream in a segment named directly: the same.
        client.segments().create("t/raw/0")
        with client.byte_stream_writer("t/raw/0") as writer:
            writer.write(b"0123456789")
            writer.flush()
            writer.truncate_data_before(7)
        assert client.segments().info("t/raw/0").start_offset == 7
        # An event segment refuses the same through the segment API (a typed error, over the wire).
        client.segments().create("t/events/0")
        with client.event_writer(["t/events/0"]) as writer:
            writer.write_event(b"0123456789")
            writer.flush()
        with pytest.raises(BadOffsetError, match="is not an event boundary"):
            client.segments().truncate("t/events/0", 7)
