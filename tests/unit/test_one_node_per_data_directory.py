"""One node per data directory (issue 20.3), with real processes: a second node on a directory in use
refuses to start and names the first one's pid, while the first keeps serving; a node killed with
SIGKILL leaves nothing behind that stops the next one; and a node whose log another process takes
over anyway (fencing) says so in an ERROR naming the container and the newer epoch and stops serving
-- ``millstream standalone`` exits non-zero, ``millstream.standalone()`` reports the cause and raises
it on the next call."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

import millstream
from millstream.errors import DataDirectoryInUseError, DataLogFencedError, MillstreamError
from millstream.standalone import LOCK_FILE_NAME

#: Generous bound on every wait for another process (CI machines are loaded); nothing is timed.
WAIT_SECONDS = 60.0

_LISTENING = re.compile(r"millstream standalone listening on (tcp://127\.0\.0\.1:\d+) \(data in .+\)\n")


def _cli(*args: str, stderr: IO[str] | int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "from millstream.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


@contextmanager
def _standalone_process(data_dir: Path, log: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``millstream standalone`` on ``data_dir`` (stderr into ``log``), once it listens: (process, uri)."""
    with open(log, "w") as stderr:
        process = _cli("standalone", "--data-dir", str(data_dir), "--port", "0", stderr=stderr)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # (a node that does not start exits, which ends the line too)
        match = _LISTENING.fullmatch(line)
        assert match, (line, log.read_text())
        yield process, match[1]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT_SECONDS)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {WAIT_SECONDS} s for {what}")
        time.sleep(0.05)


def _fence_container_0(data_dir: Path) -> int:
    """Take container 0's log over from another process, as a second owner would; returns the new epoch."""
    script = (
        "import asyncio, sys\n"
        "from millstream.segmentstore.file_log import FileLog\n"
        "async def main():\n"
        "    log = FileLog(sys.argv[1])\n"
        "    print(await log.initialize())\n"
        "    await log.close()\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", script, str(data_dir / "tier1" / "container-0")],
                          capture_output=True, text=True, timeout=WAIT_SECONDS, check=True)
    return int(done.stdout)


def test_a_second_node_on_a_directory_in_use_refuses_to_start_and_names_the_first(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with _standalone_process(data_dir, tmp_path / "first.log") as (first, uri):
        assert (data_dir / LOCK_FILE_NAME).read_text() == f"{first.pid}\n"
        second = _cli("standalone", "--data-dir", str(data_dir), "--port", "0")
        out, err = second.communicate(timeout=WAIT_SECONDS)
        assert second.returncode == 1 and "listening" not in out
        assert f"in use by another millstream node (pid {first.pid}" in err, err
        # In this process too (the Python API), with a typed error.
        with pytest.raises(DataDirectoryInUseError, match=f"pid {first.pid}"):
            millstream.standalone(data_dir)
        # The first node never noticed: it still serves, and still owns its log.
        with millstream.connect(uri) as client:
            assert client.stream_manager().create_scope("still-serving")
            assert client.stream_manager().list_scopes() == ["still-serving"]
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert first.wait(WAIT_SECONDS) == 0
    # Once it stopped, the directory is free again, and holds what the first node stored.
    with millstream.standalone(data_dir) as node, millstream.connect(node.uri) as client:
        assert client.stream_manager().list_scopes() == ["still-serving"]


def test_a_node_killed_with_sigkill_leaves_the_directory_usable(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with _standalone_process(data_dir, tmp_path / "killed.log") as (process, uri):
        with millstream.connect(uri) as client:
            client.stream_manager().create_scope("before-kill")
        process.send_signal(signal.SIGKILL)
        assert process.wait(WAIT_SECONDS) == -signal.SIGKILL
    # The lock file is still there, naming the dead process; the kernel released the lock itself.
    assert (data_dir / LOCK_FILE_NAME).read_text() == f"{process.pid}\n"
    with _standalone_process(data_dir, tmp_path / "next.log") as (after, uri):
        with millstream.connect(uri) as client:
            assert client.stream_manager().list_scopes() == ["before-kill"]
        assert (data_dir / LOCK_FILE_NAME).read_text() == f"{after.pid}\n"


def test_a_fenced_standalone_process_logs_an_error_and_exits_non_zero(tmp_path: Path) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "fenced.log"
    with _standalone_process(data_dir, log) as (process, uri):
        newer = _fence_container_0(data_dir)
        # Its next write meets the fence.  (The request itself fails or is cut off: the node stops.)
        writer = _cli("scope", "create", "after-fence", "--uri", uri)
        assert process.wait(WAIT_SECONDS) == 1
        writer.kill()
        writer.wait(WAIT_SECONDS)
    text = log.read_text()
    assert re.search(rf"ERROR millstream\.segmentstore\.host: container 0 was fenced: .*another owner took the "
                     rf"log over at epoch {newer} \(this owner had epoch {newer - 1}\)", text), text
    assert f"the node on {data_dir} stopped serving" in text and "Error:" in text, text


def test_a_fenced_embedded_node_reports_it_and_raises_it_on_the_next_call(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    data_dir = tmp_path / "data"
    node = millstream.standalone(data_dir)
    with pytest.raises(DataLogFencedError, match="stopped serving") as left, node:
        assert node.failure is None
        newer = _fence_container_0(data_dir)  # another process takes the log over

        async def write() -> None:
            await node.server.container_for("sc/fenced/0").create_segment("sc/fenced/0")
        with pytest.raises(MillstreamError):  # (fenced, or the container already stopped)
            node.run(write())
        _wait_for(lambda: node.failure is not None, "the node to stop serving")
        assert isinstance(node.failure, DataLogFencedError)
        assert f"at epoch {newer}" in str(node.failure)
        with pytest.raises(DataLogFencedError, match=f"the node on {data_dir} stopped serving"):
            node.run(asyncio.sleep(0))
    assert isinstance(left.value.__cause__, DataLogFencedError)
    assert any(r.name == "millstream.segmentstore.host" and r.levelno == logging.ERROR
               and "container 0 was fenced" in r.getMessage() and f"at epoch {newer}" in r.getMessage()
               for r in caplog.records), caplog.text
    # Closed for good, and the directory is free for the next node (which owns the log now).
    with pytest.raises(DataLogFencedError):
        node.run(asyncio.sleep(0))
    with millstream.standalone(data_dir):
        pass
