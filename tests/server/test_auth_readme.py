"""The README's "Security" section, executed: its shell blocks run as written (on a free port instead of
9090), against the node its first block starts, and its Python calls do what it says."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

import millstream

README = Path(__file__).resolve().parents[2] / "README.md"
START_TIMEOUT_SECONDS = 60.0
COMMANDS_TIMEOUT_SECONDS = 120.0


def security_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("\n## Security\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_security_section_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the README makes its certificate with openssl, which is not installed here")
    setup, commands = security_blocks()
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for variable in ("MILLSTREAM_URI", "MILLSTREAM_TOKEN", "MILLSTREAM_TLS_CA", "MILLSTREAM_AUTH_SECRET_FILE"):
        environment.pop(variable, None)
    lines = setup.replace("\\\n", " ").strip().splitlines()
    (start,) = [line for line in lines if line.startswith("millstream standalone ")]
    prepare = "\n".join(line for line in lines if line != start)
    subprocess.run(["bash", "-e", "-c", prepare], cwd=tmp_path, env=environment, check=True,
                   timeout=COMMANDS_TIMEOUT_SECONDS, capture_output=True)
    # (It listens on the default port, 9090, which the commands name: here one the kernel picks, which the
    # node prints and the commands then name instead; a port probed free beforehand can be taken meanwhile.)
    node = subprocess.Popen(["bash", "-c", f"exec {start} --port 0"], cwd=tmp_path, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None
        ready, _, _ = select.select([node.stdout], [], [], START_TIMEOUT_SECONDS)  # (it prints once it listens)
        first = node.stdout.readline() if ready else ""
        assert first.startswith("millstream standalone listening on tls://127.0.0.1:"), first
        port = first.split("tls://127.0.0.1:", 1)[1].split()[0]
        commands = commands.replace("9090", port)
        done = subprocess.run(["bash", "-e", "-c", commands], check=False, cwd=tmp_path, env=environment, text=True,
                              capture_output=True, timeout=COMMANDS_TIMEOUT_SECONDS)
        assert done.returncode == 0, done.stderr
        assert '{"id": 17, "t": 20.5}\n' in done.stdout, "the group's reader read the event"
        assert "stream:    iot/sensors" in done.stdout and "refused, as it should be" in done.stdout
        assert "AuthenticationError: the server refused the token: the token grants READ, not READ_UPDATE" \
            in done.stderr
        # The Python calls the section names.
        secret = (tmp_path / "secret").read_bytes().strip()
        token = millstream.issue_token(secret, "iot/*", "READ_UPDATE", 4_000_000_000.0)
        context = ssl.create_default_context(cafile=str(tmp_path / "node.pem"))
        with millstream.connect(f"tls://127.0.0.1:{port}", token=token, ssl_context=context) as client:
            assert client.stream_manager().list_streams("iot") == ["sensors"]
    finally:
        node.send_signal(signal.SIGTERM)
        _, log = node.communicate(timeout=START_TIMEOUT_SECONDS)
    assert node.returncode == 0, log
