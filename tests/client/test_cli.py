"""``millstream segment ...``, ``millstream write`` and ``millstream read`` against the fake server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import millstream
from millstream.cli import main
from tests.client.fake_server import FakeServer, FakeServerThread


def invoke(server: FakeServer, *args: str, input: bytes | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", server.uri], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_segment_commands() -> None:
    with FakeServerThread() as server:
        assert invoke(server, "segment", "create", "d/0", "d/1") == (0, "created d/0\ncreated d/1\n", "")
        code, _, err = invoke(server, "segment", "create", "d/0")
        assert code == 1 and "StreamSegmentExistsError" in err
        assert invoke(server, "segment", "create", "--exist-ok", "d/0")[0] == 0
        code, out, _ = invoke(server, "segment", "info", "d/0", "--json")
        assert code == 0 and json.loads(out) == {"name": "d/0", "length": 0, "start_offset": 0, "sealed": False,
                                                 "last_modified_ms": 1_700_000_000_000}
        invoke(server, "write", "--segment", "d/0", input=b"abc\n")
        assert invoke(server, "segment", "truncate", "d/0", "11")[0] == 0
        assert invoke(server, "segment", "seal", "d/0")[0] == 0
        code, out, _ = invoke(server, "segment", "info", "d/0")
        assert code == 0 and "sealed:           true" in out and "start_offset:     11" in out
        assert invoke(server, "segment", "delete", "d/0")[0] == 0
        code, _, err = invoke(server, "segment", "info", "d/0")
        assert code == 1 and "StreamSegmentNotExistsError: segment 'd/0' does not exist" in err
        code, _, err = invoke(server, "segment", "truncate", "d/1", "5")
        assert code == 1 and "BadOffsetError" in err


def test_write_lines_then_read_them_back() -> None:
    with FakeServerThread() as server:
        invoke(server, "segment", "create", "w/0")
        code, _, err = invoke(server, "write", "--segment", "w/0", input=b"one\r\ntwo\n\nfour")
        assert code == 0 and "wrote 4 events (10 bytes) to w/0; all durable" in err
        assert server.payloads("w/0") == [b"one", b"two", b"", b"four"]
        code, out, err = invoke(server, "read", "--segment", "w/0")
        assert (code, out) == (0, "one\ntwo\n\nfour\n") and "read 4 events; next offset 42" in err
        code, out, _ = invoke(server, "read", "--segment", "w/0", "--show-offsets", "--offset", "11",
                              "--max-events", "2")
        assert out == "11\ttwo\n22\t\n"
        code, _, err = invoke(server, "read", "--segment", "w/0", "--offset", "3")
        assert code == 1 and "MalformedEventError" in err
        invoke(server, "segment", "truncate", "w/0", "22")
        code, out, _ = invoke(server, "read", "--segment", "w/0")
        assert (code, out) == (0, "\nfour\n"), "by default reading starts where the segment now starts"


def test_write_files_and_whole_files_over_several_segments(tmp_path: Path) -> None:
    with FakeServerThread() as server:
        invoke(server, "segment", "create", "f/0", "f/1")
        first, second = tmp_path / "a.txt", tmp_path / "b.bin"
        first.write_bytes(b"x\ny\n")
        second.write_bytes(b"\x00\x01binary\n\xff")
        code, _, err = invoke(server, "write", "--segment", "f/0", "--segment", "f/1", "--routing-key", "k",
                              "--no-progress", str(first), str(first))
        assert code == 0 and "wrote 4 events" in err
        assert sorted(server.payloads("f/0") + server.payloads("f/1")) == [b"x", b"x", b"y", b"y"]
        assert not server.payloads("f/0") or not server.payloads("f/1"), "one routing key: one segment"
        code, _, err = invoke(server, "write", "--segment", "f/0", "--whole-files", str(second))
        assert code == 0 and server.payloads("f/0")[-1] == second.read_bytes()
        code, _, err = invoke(server, "write", "--segment", "f/0", "--whole-files")
        assert code == 2 and "--whole-files needs FILE" in err


def test_read_follow_prints_events_as_they_arrive_until_the_segment_is_sealed() -> None:
    with FakeServerThread() as server:
        with millstream.connect(server.uri) as client:
            client.segments().create("live/0")
            process = subprocess.Popen(
                [sys.executable, "-c", "from millstream.cli import main; main()", "read", "--segment", "live/0",
                 "--follow", "--uri", server.uri],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                with client.event_writer(["live/0"]) as writer:
                    for i in range(3):
                        writer.write_event(b"tick %d" % i)
                        writer.flush()
                        time.sleep(0.2)
                client.segments().seal("live/0")
                out, err = process.communicate(timeout=20)
            finally:
                process.kill()
        assert out == b"tick 0\ntick 1\ntick 2\n"
        assert b"read 3 events; next offset 42 (the segment is sealed: this is its end)" in err


def test_unreachable_server_and_bad_uri_are_one_line_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["segment", "info", "x", "--uri", "http://nope"])
    assert result.exit_code == 1 and "InvalidArgumentError: bad server URI" in result.stderr


@pytest.mark.parametrize("command", [["segment"], ["segment", "create"], ["write"], ["read"]])
def test_help_shows_examples(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output or "Create each named segment" in result.output
