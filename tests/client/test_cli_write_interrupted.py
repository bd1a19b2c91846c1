"""``millstream write`` interrupted (issue 20 item 5): after Ctrl-C, or once the server stayed away longer
than ``--reconnect-budget``, it says how many events are durable and where to resume -- the line and
byte offset of the first event not acknowledged -- and exits non-zero.  And ``--progress`` with one
input (a file, or standard input) reports the events made durable at each flush (issue 20 item 8)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import millstream
from millstream.cli import main
from tests.client.fake_server import FakeSegment, FakeServerThread

LINES = [b"event number %03d" % index for index in range(1, 41)]  # 16 bytes + a newline each


class Scripted(io.BytesIO):
    """Standard input whose reading acts on the server: ``actions[n]`` runs just before line ``n`` is
    read (the writer has handed every earlier line over, and flushed at its checkpoints)."""

    def __init__(self, data: bytes, actions: dict[int, object]) -> None:
        super().__init__(data)
        self.actions = actions
        self.line = 0

    def __iter__(self) -> Scripted:
        return self

    def __next__(self) -> bytes:
        self.line += 1
        action = self.actions.get(self.line)
        if callable(action):
            action()
        line = self.readline()
        if not line:
            raise StopIteration
        return line


def test_a_lost_server_is_reported_with_what_is_durable_and_where_to_resume() -> None:
    thread = FakeServerThread()
    with thread as server:
        thread.call(lambda: server.segments.setdefault("w/0", FakeSegment()))

        def hold() -> None:
            server.faults.hold_acks = True  # after the first flush: nothing more is acknowledged

        def lose() -> None:  # the server crashes: connections cut, new ones refused
            asyncio.run_coroutine_threadsafe(server.stop(), thread.loop).result(10)

        stdin = Scripted(b"".join(line + b"\n" for line in LINES), {11: hold, 15: lose})
        result = CliRunner().invoke(main, ["write", "--segment", "w/0", "--uri", server.uri, "--flush-every", "10",
                                           "--no-progress", "--reconnect-budget", "1"], input=stdin)
        payloads = server.payloads("w/0")
    assert result.exit_code == 1, result.output
    # The first flush made ten durable; the server stored some of the next ones without acknowledging
    # them (it held its acknowledgements, then crashed): those are in doubt, with the rest.
    assert payloads == LINES[:len(payloads)] and 10 <= len(payloads) < 15
    assert "ReconnectBudgetExceededError" in result.stderr
    # It wrote up to its next flush (line 20), which gave up once the outage outlasted the budget.
    assert ("the server was lost: 10 events of 20 acknowledged (durable); 10 events in doubt (may or may not be "
            "stored), the first at line 11 of stdin (byte offset 170): resume there") in result.stderr


def test_ctrl_c_makes_what_was_written_durable_and_says_where_to_resume(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        client.segments().create("c/0")
        process = subprocess.Popen(
            [sys.executable, "-c", "from millstream.cli import main; main()", "write", "--segment", "c/0",
             "--uri", node.uri, "--flush-every", "5"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert process.stdin is not None and process.stderr is not None
            for line in LINES[:12]:
                process.stdin.write(line + b"\n")
            process.stdin.flush()
            # Progress from one input (stdin): a line per flush; the second says ten are durable.
            seen = [process.stderr.readline(), process.stderr.readline()]
            assert re.search(rb"stdin, line 10: 10 events \(160 bytes\) durable", seen[1]), seen
            # Two more lines arrive and are written; the input stays open; Ctrl-C.
            reader = client.segment_reader("c/0")
            count = 0
            for _ in range(60):  # (each read waits up to 1 s for more)
                count += len(reader.read_events(wait_seconds=1.0))
                if count == 12:
                    break
            assert count == 12
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 130, err
        assert (b"interrupted: 12 events written, all acknowledged (durable); resume at line 13 of stdin "
                b"(byte offset 204)") in err
        stored = [event.value for event in client.segment_reader("c/0").read_events()]
        assert stored == LINES[:12]


def test_progress_with_one_file_and_with_stdin(tmp_path: Path) -> None:
    with FakeServerThread() as server:
        data = tmp_path / "in.txt"
        data.write_bytes(b"".join(line + b"\n" for line in LINES[:7]))
        runner = CliRunner()
        runner.invoke(main, ["segment", "create", "p/0", "--uri", server.uri])
        for source, name in ((str(data), str(data)), ("-", "stdin")):
            result = runner.invoke(main, ["write", "--segment", "p/0", "--uri", server.uri, "--flush-every", "3",
                                          source], input=b"".join(line + b"\n" for line in LINES[:7]))
            assert result.exit_code == 0, result.output
            assert result.stderr.splitlines() == [
                f"{name}, line 3: 3 events (48 bytes) durable",
                f"{name}, line 6: 6 events (96 bytes) durable",
                "wrote 7 events (112 bytes) to p/0; all durable",
            ]
        quiet = runner.invoke(main, ["write", "--segment", "p/0", "--uri", server.uri, "--flush-every", "3",
                                     "--no-progress"], input=b"a\nb\nc\nd\n")
        assert quiet.stderr.splitlines() == ["wrote 4 events (4 bytes) to p/0; all durable"]
