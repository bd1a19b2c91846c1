"""Configuration files and MILLSTREAM_* variables (precedence: command line > environment > file >
defaults), the client's [client] table, logging flags (text, JSON lines, --quiet), `millstream node
status`, and docs/configuration.md and docs/metrics.md checked against the commands and run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import millstream.config
from millstream.cli import main
from millstream.cli._logging import JsonFormatter
from millstream.errors import InvalidArgumentError
from tests.server.test_health import Node as SimulatedNode
from tests.server.test_health import run, until

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION_DOCS = ROOT / "docs" / "configuration.md"
METRICS_DOCS = ROOT / "docs" / "metrics.md"
START_TIMEOUT_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Process:
    """`millstream ARGS` running, its "listening on" line read; SIGTERM on the way out."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.popen = subprocess.Popen([sys.executable, "-c", "from millstream.cli import main; main()", *args],
                                      cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **(env or {})})
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], START_TIMEOUT_SECONDS)
        self.line = self.popen.stdout.readline() if ready else ""
        if " listening on " not in self.line:
            raise AssertionError(f"`millstream {' '.join(args)}` did not start ({self.line!r}): {self.stop()}")
        self.uri = self.line.split(" listening on ")[1].split()[0]

    def stop(self) -> str:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        _, err = self.popen.communicate(timeout=START_TIMEOUT_SECONDS)
        return err


# --- precedence ---------------------------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `standalone`/`serve` would run the node with, instead of running it."""
    import millstream.cli.server as server_cli

    calls: list[dict[str, Any]] = []

    def capture(data_dir: Path, container_count: int | None, options: dict[str, Any]) -> None:
        calls.append({"data_dir": data_dir, "container_count": container_count, **options})
    monkeypatch.setattr(server_cli, "_serve_node", capture)
    return calls


def test_command_line_beats_environment_beats_file_beats_defaults(tmp_path: Path,
                                                                   captured: list[dict[str, Any]]) -> None:
    (tmp_path / "node.toml").write_text(
        'data_dir = "from-file"\nport = 1111\nmetrics_port = 2222\nhost = "127.0.0.2"\nlog_level = "debug"\n'
        'owned_containers = [0, 2]\ncontainer_count = 4\n')
    environment = {"MILLSTREAM_PORT": "3333", "MILLSTREAM_METRICS_PORT": "4444", "MILLSTREAM_LOG_LEVEL": "error"}
    for command in ("standalone", "serve"):
        result = CliRunner().invoke(main, [command, "--config", str(tmp_path / "node.toml"), "--port", "5555",
                                           "--log-level", "warning"], env=environment)
        assert result.exit_code == 0, result.output
    for options in captured:
        assert options["port"] == 5555 and options["log_level"] == "warning"  # the command line
        assert options["metrics_port"] == 4444  # the environment
        assert options["host"] == "127.0.0.2" and options["owned_containers"] == frozenset({0, 2})  # the file
        assert options["data_dir"] == tmp_path / "from-file"  # relative to the file
        assert options["container_count"] == 4
        assert options["log_format"] == "text" and options["quiet"] is False  # the defaults
        assert options["metrics_host"] == "127.0.0.1" and options["auth_secret_file"] is None


def test_the_file_can_come_from_the_environment_and_standalone_needs_none(tmp_path: Path,
                                                                          captured: list[dict[str, Any]]) -> None:
    (tmp_path / "node.toml").write_text('data_dir = "d"\nquiet = true\n')
    result = CliRunner().invoke(main, ["standalone"], env={"MILLSTREAM_CONFIG": str(tmp_path / "node.toml")})
    assert result.exit_code == 0, result.output
    assert captured[-1]["data_dir"] == tmp_path / "d" and captured[-1]["quiet"] is True
    result = CliRunner().invoke(main, ["standalone", "--data-dir", str(tmp_path / "e")],
                                env={"MILLSTREAM_CONTAINER_COUNT": "2", "MILLSTREAM_OWNED_CONTAINERS": "1",
                                     "MILLSTREAM_CONFIG": ""})
    assert result.exit_code == 0, result.output
    assert captured[-1]["container_count"] == 2 and captured[-1]["owned_containers"] == frozenset({1})
    result = CliRunner().invoke(main, ["serve"], env={"MILLSTREAM_CONFIG": ""})
    assert result.exit_code == 2 and "--config" in result.output


def test_unknown_keys_are_errors_naming_the_nearest_key(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('data_dir = "d"\nmetric_port = 9091\n')
    result = CliRunner().invoke(main, ["standalone", "--config", str(tmp_path / "bad.toml")])
    assert result.exit_code == 2 and "unknown keys ['metric_port']" in result.output
    assert "did you mean 'metrics_port'" in result.output
    (tmp_path / "client.toml").write_text('[client]\nurl = "tcp://127.0.0.1:1"\n')
    with pytest.raises(InvalidArgumentError, match="did you mean 'uri'"):
        millstream.config.read_config_file(tmp_path / "client.toml")
    result = CliRunner().invoke(main, ["scope", "list"], env={"MILLSTREAM_CONFIG": str(tmp_path / "client.toml")})
    assert result.exit_code == 2 and "did you mean 'uri'" in result.output
    (tmp_path / "broken.toml").write_text("port = \n")
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        millstream.config.read_config_file(tmp_path / "broken.toml")


def test_client_settings_take_the_environment_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[client]\nuri = "tcp://10.0.0.1:9090"\ntoken = "t"\ntls_ca = "ca.pem"\n')
    settings = millstream.config.client_settings(tmp_path / "c.toml", environ={})
    assert settings == millstream.config.ClientSettings("tcp://10.0.0.1:9090", "t", tmp_path / "ca.pem")
    settings = millstream.config.client_settings(
        environ={"MILLSTREAM_CONFIG": str(tmp_path / "c.toml"), "MILLSTREAM_URI": "tcp://10.0.0.2:1"})
    assert settings.uri == "tcp://10.0.0.2:1" and settings.token == "t"
    assert millstream.config.client_settings(environ={}) == millstream.config.ClientSettings()


# --- docs/configuration.md: checked against the options, and its examples run ----------------------------


def _table(heading: str) -> list[list[str]]:
    text = CONFIGURATION_DOCS.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Key")]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows if "---" not in row]


def _options(command: click.Command) -> dict[str, click.Option]:
    return {param.name: param for param in command.params
            if isinstance(param, click.Option) and param.name not in (None, "help")}


def test_the_configuration_page_lists_every_option_of_standalone_and_serve_and_only_those() -> None:
    rows = _table("Node keys")
    documented = {(key or "config_path"): (flag, variable) for key, flag, variable, *_ in rows}
    cluster = {flag: variable for _, flag, variable, *_ in _table("Cluster node options")}
    for name in ("standalone", "serve"):
        command = main.commands[name]
        options = _options(command)
        if name == "serve":  # (its cluster node's options are command-line and environment only)
            joining = {key: option for key, option in options.items() if set(option.opts) & set(cluster)}
            assert {flag for option in joining.values() for flag in option.opts} == set(cluster)
            assert all(option.envvar == cluster[option.opts[0]] for option in joining.values())
            options = {key: option for key, option in options.items() if key not in joining}
        assert set(options) == set(documented), name
        for key, option in options.items():
            flag, variable = documented[key]
            assert flag in option.opts and option.envvar == variable, (name, key)
        keys = {key for key in documented if key != "config_path"}
        assert keys == set(millstream.config.NODE_KEYS)


def test_the_configuration_page_lists_the_client_keys_as_the_commands_take_them() -> None:
    rows = {key: (flag, variable, default) for key, flag, variable, default, _ in _table("Client keys")}
    assert set(rows) == set(millstream.config.CLIENT_KEYS)
    connecting = _options(main.commands["scope"].commands["list"])  # type: ignore[attr-defined]
    status = _options(main.commands["node"].commands["status"])  # type: ignore[attr-defined]
    for key, (flag, variable, _) in rows.items():
        option = (status if key == "metrics_url" else connecting)[key]
        assert flag in option.opts and option.envvar == variable, key
    assert rows["uri"][2] == millstream.config.DEFAULT_URI


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)


def test_the_configuration_page_examples_run(tmp_path: Path) -> None:
    (toml,) = _blocks(CONFIGURATION_DOCS, "toml")
    port, metrics_port = free_port(), free_port()
    # The example as written, on ports free on this machine.
    text = toml.replace("9090", str(port)).replace("9091", str(metrics_port))
    (tmp_path / "node.toml").write_text(text)
    node = Process(["serve", "--config", "node.toml"], tmp_path)
    try:
        assert node.uri == f"tcp://127.0.0.1:{port}"
        environment = {"MILLSTREAM_CONFIG": str(tmp_path / "node.toml")}
        runner = CliRunner()
        assert runner.invoke(main, ["scope", "create", "iot"], env=environment).exit_code == 0
        result = runner.invoke(main, ["scope", "list"], env=environment)
        assert result.exit_code == 0 and result.stdout == "iot\n", result.output
        result = runner.invoke(main, ["node", "status"], env=environment)
        assert result.exit_code == 0 and "ready" in result.stdout, result.output
        # The environment wins over the file: a URI nobody listens on fails, naming it.
        result = runner.invoke(main, ["scope", "list"], env={**environment,
                                                             "MILLSTREAM_URI": f"tcp://127.0.0.1:{free_port()}"})
        assert result.exit_code == 1
        (python,) = _blocks(CONFIGURATION_DOCS, "python")
        script = tmp_path / "example.py"
        script.write_text(python)
        done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True,
                              timeout=120, env={**os.environ, **environment})
        assert done.returncode == 0 and "iot" in done.stdout, done.stderr
    finally:
        log = node.stop()
    assert node.popen.returncode == 0
    records = [json.loads(line) for line in log.splitlines()]  # log_format = "json": every line is an object
    assert any(record["message"].startswith("node started") and record["uri"] == node.uri for record in records)
    # With MILLSTREAM_PORT set, the same file listens elsewhere.
    other = free_port()
    node = Process(["serve", "--config", "node.toml"], tmp_path,
                   env={"MILLSTREAM_PORT": str(other), "MILLSTREAM_METRICS_PORT": "0"})
    try:
        assert node.uri == f"tcp://127.0.0.1:{other}"
    finally:
        node.stop()


# --- logging ---------------------------------------------------------------------------------------------


def test_json_lines_carry_time_level_logger_message_and_the_events_fields() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("millstream.test", logging.WARNING, __file__, 1, "refusing %s", ("x",), None)
    record.peer = "127.0.0.1:5"
    entry = json.loads(formatter.format(record))
    assert entry["level"] == "warning" and entry["logger"] == "millstream.test"
    assert entry["message"] == "refusing x" and entry["peer"] == "127.0.0.1:5"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["time"])
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(formatter.format(record))["exception"]


def test_quiet_logs_only_warnings_and_keeps_the_listening_line(tmp_path: Path) -> None:
    node = Process(["standalone", "--data-dir", "data", "--port", "0", "--quiet"], tmp_path)
    log = node.stop()
    assert node.line.startswith("millstream standalone listening on tcp://127.0.0.1:")
    assert node.popen.returncode == 0 and log == "", log
    node = Process(["standalone", "--data-dir", "data", "--port", "0", "--log-level", "debug"], tmp_path)
    log = node.stop()
    assert "INFO millstream.cli: node started: serving " in log and "millstream: stopped" in log, log
    assert "container 0 recovered and serving" in log


# --- millstream node status, and docs/metrics.md's example ----------------------------------------------------


def test_node_status_says_ready_and_the_metrics_page_example_runs(tmp_path: Path) -> None:
    metrics_port = free_port()
    node = Process(["standalone", "--data-dir", "./data", "--port", "0", "--metrics-port", str(metrics_port)],
                   tmp_path)
    try:
        url = f"http://127.0.0.1:{metrics_port}"
        commands = [line for block in _blocks(METRICS_DOCS, "sh") for line in block.splitlines()]
        assert commands[0] == "millstream standalone --data-dir ./data --metrics-port 9091"
        for example in commands[1:]:
            command = example.replace("9091", str(metrics_port))
            if command.startswith("curl -s "):
                with urllib.request.urlopen(command.removeprefix("curl -s "), timeout=30) as response:
                    assert response.status == 200
            else:
                arguments = command.split()[1:]
                result = CliRunner().invoke(main, arguments)
                assert result.exit_code == 0, result.output
                assert result.stdout.startswith(f"node {url}: ready (segment store running)\n")
                assert re.search(r"^0 +running +no$", result.stdout, re.MULTILINE), result.stdout
        result = CliRunner().invoke(main, ["node", "status", "--metrics-url", url, "--json"])
        assert result.exit_code == 0 and json.loads(result.stdout)["ready"] is True
    finally:
        node.stop()
    result = CliRunner().invoke(main, ["node", "status", "--metrics-url", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 1 and "cannot reach the node's metrics endpoint" in result.output
    result = CliRunner().invoke(main, ["node", "status"], env={"MILLSTREAM_CONFIG": "", "MILLSTREAM_METRICS_URL": ""})
    assert result.exit_code == 2 and "--metrics-url" in result.output


def test_node_status_names_a_fenced_container_and_exits_1() -> None:
    async def scenario() -> None:
        from millstream.errors import ContainerUnavailableError
        from millstream.segmentstore.container import SegmentContainer
        from millstream.testing.clock import ManualClock
        from millstream.testing.simulated_log import SimulatedDurableDataLog

        async with SimulatedNode(ManualClock()) as node:
            container = node.server.container_host(0).container
            await container.create_segment("s")
            usurper = SegmentContainer(0, SimulatedDurableDataLog(node.storage))
            await usurper.start()
            with contextlib.suppress(ContainerUnavailableError):
                await container.append("s", b"x")
            await until(lambda: node.state() == "fenced", "the container is fenced")
            url = f"http://127.0.0.1:{node.endpoint.port}"
            result = await asyncio.get_running_loop().run_in_executor(
                None, lambda: CliRunner().invoke(main, ["node", "status", "--metrics-url", url]))
            assert result.exit_code == 1
            assert result.stdout.startswith(f"node {url}: NOT READY (segment store running)\n")
            assert re.search(r"^0 +fenced +no +\S", result.stdout, re.MULTILINE), result.stdout
            assert "not ready: container 0 is fenced: " in result.stderr
            await usurper.stop()
    run(scenario)


# --- docstring examples ------------------------------------------------------------------------------------


def _docstring_example(function: Any) -> str:
    """The indented block after the ``::`` of ``function``'s docstring, dedented."""
    import textwrap

    doc = function.__doc__
    assert doc is not None and "::\n" in doc
    block = doc.split("::\n", 1)[1].strip("\n")
    return textwrap.dedent(block.split('"""')[0])


def test_the_docstring_examples_of_standalone_and_config_connect_run(tmp_path: Path) -> None:
    import millstream

    example = _docstring_example(millstream.standalone).replace('"./data"', repr(str(tmp_path / "data")))
    script = tmp_path / "standalone_example.py"
    script.write_text("import millstream\n" + example)
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics\n", done.stdout), done.stderr
    with millstream.standalone(tmp_path / "node") as node:
        (tmp_path / "client.toml").write_text(f'[client]\nuri = "{node.uri}"\n')
        with millstream.connect(node.uri) as client:
            client.stream_manager().create_scope("docs")
        script = tmp_path / "connect_example.py"
        script.write_text("import millstream.config\n" + _docstring_example(millstream.config.connect))
        done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "MILLSTREAM_CONFIG": str(tmp_path / "client.toml")})
        assert done.returncode == 0 and "docs" in done.stdout, done.stderr
