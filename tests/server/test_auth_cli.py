"""Authentication from the shell (issue 19, finding 4): every `millstream` command against a node with
auth on, with every kind of token; `millstream token issue`; `standalone` and `serve` with
--auth-secret-file, --tls-cert and --tls-key; the warning beyond loopback.

Each command is first run with the tokens that must be refused -- none, forged, expired, a scope
token on another scope, a read-only one where it changes something, a scope token where it needs
``*`` -- and each refusal must change nothing: the command then succeeds with the right token (a
`group create` that had created the group before refusing would now fail with
ReaderGroupExistsError).  Tokens expire at fixed instants far from now, so nothing depends on the
clock.
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import millstream
from millstream.auth import Permission, issue_token, verify
from millstream.cli import main
from millstream.cli import token as token_command
from millstream.errors import AuthenticationError, ReaderGroupNotFoundError

SECRET = b"cli-auth-test-secret-0123456789"
VALID_UNTIL = 4_000_000_000.0  # 2096
EXPIRED_AT = 1_000_000_000.0  # 2001
READ, UPDATE = Permission.READ, Permission.READ_UPDATE

ALL = issue_token(SECRET, "*", UPDATE, VALID_UNTIL)
SCOPE = issue_token(SECRET, "iot/*", UPDATE, VALID_UNTIL)
SCOPE_READ_ONLY = issue_token(SECRET, "iot/*", READ, VALID_UNTIL)
ALL_READ_ONLY = issue_token(SECRET, "*", READ, VALID_UNTIL)
#: Tokens no command accepts.
REFUSED: dict[str, str] = {
    "no token": "",
    "forged": issue_token(b"not-the-node-secret-at-all!", "*", UPDATE, VALID_UNTIL),
    "expired": issue_token(SECRET, "*", UPDATE, EXPIRED_AT),
    "scope token on another scope": issue_token(SECRET, "web/*", UPDATE, VALID_UNTIL),
}

#: (arguments, what it needs, standard input): "read" and "update" on scope iot -- a scope token
#: suffices -- or "everything" (``*``).  In the order they run.
COMMANDS: list[tuple[list[str], str, str | None]] = [
    (["scope", "create", "iot"], "update", None),
    (["scope", "list"], "everything", None),
    (["stream", "create", "iot/s", "--segments", "2"], "update", None),
    (["stream", "list", "iot"], "read", None),
    (["stream", "describe", "iot/s"], "read", None),
    (["write", "--stream", "iot/s", "--routing-key", "k"], "update", "a\nb\n"),
    (["segment", "list", "iot/s"], "read", None),
    (["segment", "list", "iot", "--json"], "read", None),
    (["stream", "describe", "iot/s", "--rate-seconds", "0.1"], "read", None),
    # (A reader group of its own: its state is the scope's, so it needs a read-write scope token.)
    (["read", "--stream", "iot/s", "--format", "json"], "update", None),
    (["segment", "create", "iot/raw/0"], "update", None),
    (["write", "--segment", "iot/raw/0"], "update", "x\n"),
    (["segment", "info", "iot/raw/0"], "read", None),
    (["read", "--segment", "iot/raw/0"], "read", None),
    (["segment", "truncate", "iot/raw/0", "0"], "update", None),
    (["segment", "seal", "iot/raw/0"], "update", None),
    (["segment", "delete", "iot/raw/0"], "update", None),
    (["group", "create", "iot/g", "--stream", "iot/s", "--auto-checkpoint-seconds", "0"], "update", None),
    (["group", "describe", "iot/g"], "read", None),
    (["group", "read", "iot/g", "--reader-id", "r1", "--idle-seconds", "0.5", "--max-events", "2"], "update", None),
    (["read", "--group", "iot/g", "--reader-id", "r2", "--max-events", "1"], "update", None),
    (["group", "checkpoint", "iot/g", "c1"], "update", None),
    (["group", "reset", "iot/g", "--head"], "update", None),
    (["group", "delete", "iot/g"], "update", None),
    (["stream", "scale", "iot/s", "--split", "0"], "update", None),
    (["stream", "truncate", "iot/s", "--at-tail"], "update", None),
    (["stream", "seal", "iot/s"], "update", None),
    (["stream", "delete", "iot/s"], "update", None),
    (["scope", "delete", "iot"], "update", None),
]


def invoke(uri: str, args: list[str], token: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri, "--token", token], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def node(tmp_path: Path) -> Iterator[millstream.StandaloneNode]:
    with millstream.standalone(tmp_path / "data", auth_secret=SECRET) as started:
        yield started


def test_every_command_with_every_token(node: millstream.StandaloneNode) -> None:
    wrong: list[str] = []
    for args, needs, stdin in COMMANDS:
        refused = dict(REFUSED)
        if needs != "read":
            refused["read-only scope token"] = SCOPE_READ_ONLY
        if needs == "everything":
            refused["scope token"] = SCOPE
        for what, token in refused.items():
            code, _, err = invoke(node.uri, args, token, stdin)
            if code != 1 or "Error: AuthenticationError: the server refused the token" not in err:
                wrong.append(f"{' '.join(args)} with {what}: exit {code}, {err.strip()!r}")
        allowed = {"everything": {"all": ALL, "read-only all": ALL_READ_ONLY},
                   "read": {"read-only scope token": SCOPE_READ_ONLY, "scope token": SCOPE},
                   "update": {"scope token": SCOPE}}[needs]
        for what, token in allowed.items():
            code, _, err = invoke(node.uri, args, token, stdin)
            if code != 0:
                wrong.append(f"{' '.join(args)} with {what}: exit {code}, {err.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_a_group_over_a_stream_the_token_cannot_read_is_refused_before_it_is_created(
        node: millstream.StandaloneNode) -> None:
    for args in (["scope", "create", "iot", "web"], ["stream", "create", "web/s"]):
        assert invoke(node.uri, args, ALL)[0] == 0
    code, _, err = invoke(node.uri, ["group", "create", "iot/g", "--stream", "web/s"], SCOPE)
    assert code == 1 and "AuthenticationError" in err and "not 'web/s'" in err, err
    with millstream.connect(node.uri, token=ALL) as client, pytest.raises(ReaderGroupNotFoundError):
        client.reader_group("iot/g")
    # A token for one stream cannot make groups (their state is the scope's), even over that stream.
    stream_token = issue_token(SECRET, "web/s", UPDATE, VALID_UNTIL)
    code, _, err = invoke(node.uri, ["group", "create", "web/g", "--stream", "web/s"], stream_token)
    assert code == 1 and "not 'web/_RGg'" in err, err
    with millstream.connect(node.uri, token=ALL) as client, pytest.raises(ReaderGroupNotFoundError):
        client.reader_group("web/g")


def test_token_issue_prints_a_token_that_grants_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    now = 1_700_000_000.0
    monkeypatch.setattr(token_command, "wall_clock", lambda: now)
    runner = CliRunner()
    cases = [(["--scope", "iot", "--read-write", "--ttl", "12h"], "iot/*", UPDATE, 12 * 3600),
             (["--scope", "iot", "--stream", "s", "--read", "--ttl", "90"], "iot/s", READ, 90),
             (["--scope", "*", "--read", "--ttl", "7d"], "*", READ, 7 * 86400),
             (["--scope", "iot", "--read", "--ttl", "1.5m"], "iot/*", READ, 90)]
    for args, resource, permission, ttl in cases:
        result = runner.invoke(main, ["token", "issue", *args, "--secret-file", str(secret)])
        assert result.exit_code == 0, result.stderr
        printed = result.stdout.strip()
        assert "\n" not in printed and f"a token for {resource} ({permission.value}) valid until" in result.stderr
        claims = verify(SECRET, printed, resource=resource, permission=permission, now=now + ttl - 1)
        assert claims.expires_at == now + ttl
        with pytest.raises(AuthenticationError, match="expired"):
            verify(SECRET, printed, resource=resource, permission=permission, now=now + ttl)
    # The secret comes from the environment too.
    result = runner.invoke(main, ["token", "issue", "--scope", "iot", "--read", "--ttl", "1h"],
                           env={"MILLSTREAM_AUTH_SECRET_FILE": str(secret)})
    assert result.exit_code == 0 and result.stdout.startswith("ms1.")
    short = tmp_path / "short"
    short.write_bytes(b"too short\n")
    for args, message in [
            (["--scope", "iot", "--ttl", "1h"], "give --read or --read-write"),
            (["--scope", "iot", "--read", "--ttl", "367d"], "at most 366 days"),
            (["--scope", "iot", "--read", "--ttl", "0"], "more than 0"),
            (["--scope", "iot", "--read", "--ttl", "soon"], "not a duration"),
            (["--scope", "_system", "--read", "--ttl", "1h"], "not starting with '_'"),
            (["--scope", "*", "--stream", "s", "--read", "--ttl", "1h"], "not of '*'"),
            (["--scope", "iot", "--stream", "a/b", "--read", "--ttl", "1h"], "stream 'a/b'")]:
        result = runner.invoke(main, ["token", "issue", *args, "--secret-file", str(secret)])
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    result = runner.invoke(main, ["token", "issue", "--scope", "iot", "--read", "--ttl", "1h", "--secret-file",
                                  str(short)])
    assert result.exit_code == 2 and "at least 16 bytes" in result.stderr


# --- standalone and serve, as processes ------------------------------------------------------------------

START_TIMEOUT_SECONDS = 60.0


class Process:
    """`millstream ARGS` running, its "listening on" line read; SIGTERM on the way out."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.popen = subprocess.Popen([sys.executable, "-c", "from millstream.cli import main; main()", *args], cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.popen.stdout is not None
        # Its first line on stdout says where it listens (its logs go to stderr).
        ready, _, _ = select.select([self.popen.stdout], [], [], START_TIMEOUT_SECONDS)
        line = self.popen.stdout.readline() if ready else ""
        if " listening on " not in line:
            raise AssertionError(f"`millstream {' '.join(args)}` did not start ({line!r}): {self.stop()}")
        self.uri = line.split(" listening on ")[1].split()[0]

    def stop(self) -> str:
        """Stop it (SIGTERM: a graceful shutdown) and return what it logged."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        _, err = self.popen.communicate(timeout=START_TIMEOUT_SECONDS)
        return err


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A server certificate for 127.0.0.1 and its key, and the authority that signed it."""
    trustme = pytest.importorskip("trustme", reason="trustme (the test extra) makes the certificates")
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    paths = tmp_path / "node.pem", tmp_path / "node.key", tmp_path / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(paths[0]))
    issued.private_key_pem.write_to_path(str(paths[1]))
    authority.cert_pem.write_to_path(str(paths[2]))
    return paths


def check_secured(uri: str, ca: Path) -> None:
    """Over TLS (trusting ``ca``), a request without a token is refused and one with a token works."""
    runner = CliRunner()
    result = runner.invoke(main, ["scope", "create", "iot", "--uri", uri, "--tls-ca", str(ca)])
    assert result.exit_code == 1 and "AuthenticationError" in result.stderr, result.stderr
    result = runner.invoke(main, ["scope", "create", "iot", "--uri", uri], env={"MILLSTREAM_TOKEN": ALL,
                                                                                 "MILLSTREAM_TLS_CA": str(ca)})
    assert result.exit_code == 0, result.stderr


def test_standalone_with_auth_and_tls_from_the_command_line(tmp_path: Path,
                                                           certificate: tuple[Path, Path, Path]) -> None:
    cert, key, ca = certificate
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    node = Process(["standalone", "--data-dir", "data", "--port", "0", "--auth-secret-file", "secret",
                    "--tls-cert", str(cert), "--tls-key", str(key)], tmp_path)
    try:
        assert node.uri.startswith("tls://127.0.0.1:")
        check_secured(node.uri, ca)
    finally:
        log = node.stop()
    assert node.popen.returncode == 0 and "WARNING" not in log, log


def test_serve_takes_the_flags_and_its_file_the_same_way(tmp_path: Path, certificate: tuple[Path, Path, Path]) -> None:
    cert, key, ca = certificate
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    (tmp_path / "node.toml").write_text(f'data_dir = "data"\nport = 0\ncontainer_count = 1\n'
                                        f'auth_secret_file = "secret"\ntls_cert_file = "{cert}"\n'
                                        f'tls_key_file = "{key}"\n')
    node = Process(["serve", "--config", "node.toml"], tmp_path)
    try:
        check_secured(node.uri, ca)
    finally:
        node.stop()
    # The flags do the same, and take precedence over the file: here a secret of their own.
    (tmp_path / "other").write_bytes(b"another-secret-of-enough-bytes\n")
    node = Process(["serve", "--config", "node.toml", "--auth-secret-file", "other"], tmp_path)
    try:
        runner = CliRunner()
        environment = {"MILLSTREAM_TOKEN": ALL, "MILLSTREAM_TLS_CA": str(ca)}
        result = runner.invoke(main, ["scope", "list", "--uri", node.uri], env=environment)
        assert result.exit_code == 1 and "forged, or issued with another secret" in result.stderr, result.stderr
        other = issue_token(b"another-secret-of-enough-bytes", "*", READ, VALID_UNTIL)
        result = runner.invoke(main, ["scope", "list", "--uri", node.uri], env={**environment,
                                                                                "MILLSTREAM_TOKEN": other})
        assert result.exit_code == 0 and result.stdout == "iot\n", result.stderr
    finally:
        node.stop()


def test_bad_security_files_are_refused_before_anything_starts(tmp_path: Path,
                                                               certificate: tuple[Path, Path, Path]) -> None:
    cert, key, _ = certificate
    (tmp_path / "short").write_bytes(b"short\n")
    runner = CliRunner()
    for args, message in [
            (["--auth-secret-file", str(tmp_path / "missing")], "cannot read the secret file"),
            (["--auth-secret-file", str(tmp_path / "short")], "at least 16 bytes"),
            (["--tls-cert", str(cert)], "go together"),
            (["--tls-cert", str(key), "--tls-key", str(key)], "cannot load the TLS certificate")]:
        result = runner.invoke(main, ["standalone", "--data-dir", str(tmp_path / "data"), "--port", "0", *args])
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
        assert not (tmp_path / "data").exists(), "nothing was started"


def test_a_node_beyond_loopback_without_auth_or_tls_warns_at_start(tmp_path: Path) -> None:
    node = Process(["standalone", "--data-dir", "data", "--host", "0.0.0.0", "--port", "0"], tmp_path)
    log = node.stop()
    assert "WARNING" in log and "with authentication OFF" in log and "without TLS" in log, log
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    node = Process(["standalone", "--data-dir", "data", "--host", "0.0.0.0", "--port", "0",
                    "--auth-secret-file", "secret"], tmp_path)
    log = node.stop()
    assert "authentication OFF" not in log and "without TLS" in log, log
