"""``millstream group ...`` against a standalone node: create, read (events as they arrive, leaving at
its position), checkpoint, reset (to a kept checkpoint, to a printed one, to the heads), bounded
groups that end, describe, delete, and bad input with its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import millstream
from millstream.cli import main


def invoke(uri: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def write(uri: str, first: int, count: int) -> set[str]:
    with millstream.connect(uri) as client, client.event_writer("s/a", millstream.StringSerializer()) as writer:
        for index in range(first, first + count):
            writer.write_event(f"event-{index}", routing_key=f"key-{index % 7}")
    return {f"event-{index}" for index in range(first, first + count)}


def read(uri: str, *extra: str) -> tuple[list[str], str]:
    code, out, err = invoke(uri, "group", "read", "s/g", "--reader-id", "cli", "--idle-seconds", "0.5", *extra)
    assert code == 0, err
    return out.splitlines(), err


def test_group_commands(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        assert invoke(uri, "stream", "create", "s/b")[0] == 0
        first = write(uri, 0, 30)
        assert invoke(uri, "group", "create", "s/g", "--stream", "s/a", "--auto-checkpoint-seconds", "0") \
            == (0, "created s/g\n", "")
        code, _, err = invoke(uri, "group", "create", "s/g", "--stream", "s/a")
        assert code == 1 and "ReaderGroupExistsError" in err
        assert invoke(uri, "group", "create", "s/g", "--stream", "s/a", "--exist-ok")[:2] == (0, "exists  s/g\n")

        lines, err = read(uri)
        assert set(lines) == first and len(lines) == 30 and "read 30 events" in err
        # The reader left at its position: the group resumes after what it printed.
        code, out, _ = invoke(uri, "group", "describe", "s/g", "--json")
        described = json.loads(out)
        assert code == 0 and described["readers"] == {} and described["generation"] == 0
        code, printed, _ = invoke(uri, "group", "checkpoint", "s/g", "after-30")
        checkpoint = json.loads(printed)
        tail = json.loads(invoke(uri, "stream", "describe", "s/a", "--json")[1])["tail"]
        assert code == 0 and checkpoint == {"name": "after-30", "cuts": {"s/a": tail}}
        second = write(uri, 30, 10)
        lines, _ = read(uri, "--show-positions")
        assert {line.split("\t")[2] for line in lines} == second
        assert all(line.split("\t")[0].startswith("s/a/") and line.split("\t")[1].isdigit() for line in lines)

        assert invoke(uri, "group", "reset", "s/g", "--checkpoint", "after-30")[:2] == (0, "reset s/g (generation 1)\n")
        assert set(read(uri, "--max-events", "10")[0]) == second
        assert invoke(uri, "group", "reset", "s/g", "--checkpoint-json", printed.strip())[0] == 0
        assert set(read(uri)[0]) == second
        assert invoke(uri, "group", "reset", "s/g", "--head")[:2] == (0, "reset s/g (generation 3)\n")
        assert set(read(uri)[0]) == first | second
        code, out, _ = invoke(uri, "group", "describe", "s/g")
        assert code == 0 and "generation 3" in out and "checkpoint after-30: complete" in out

        # A bounded group ends; bad input is refused with typed errors and usage errors.
        assert invoke(uri, "group", "create", "s/bounded", "--stream", "s/a", "--end-at-tail")[0] == 0
        code, out, err = invoke(uri, "group", "read", "s/bounded", "--reader-id", "r", "--follow")
        assert code == 0 and len(out.splitlines()) == 40 and "end of the group's streams" in err
        code, _, err = invoke(uri, "group", "read", "s/missing", "--reader-id", "r")
        assert code == 1 and "ReaderGroupNotFoundError" in err
        code, _, err = invoke(uri, "group", "reset", "s/g", "--cut", 's/b={"0": 0}')
        assert code == 1 and "InvalidStreamCutError" in err
        code, _, err = invoke(uri, "group", "reset", "s/g", "--checkpoint", "nope", "--head")
        assert code == 2 and "exactly one of" in err
        code, _, err = invoke(uri, "group", "create", "s/h", "--stream", "s/a", "--start", "s/a=[1]")
        assert code == 2 and "--start" in err
        code, _, err = invoke(uri, "group", "create", "s/h", "--stream", "s/a", "--end", 's/b={"0": 0}')
        assert code == 2 and "not given with --stream" in err
        assert invoke(uri, "group", "delete", "s/g")[:2] == (0, "deleted s/g\n")
        code, _, err = invoke(uri, "group", "describe", "s/g")
        assert code == 1 and "ReaderGroupNotFoundError" in err


def test_read_with_group_is_a_group_reader(tmp_path: Path) -> None:
    """``millstream read --group`` (issue 5's spelling) reads as ``group read`` does; misuse is a
    usage error naming the options."""
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        written = write(uri, 0, 25)
        assert invoke(uri, "group", "create", "s/g", "--stream", "s/a", "--end-at-tail")[0] == 0
        code, out, err = invoke(uri, "read", "--group", "s/g", "--reader-id", "r1", "--follow")
        assert code == 0, err
        assert sorted(out.splitlines()) == sorted(written) and "end of the group's streams" in err
        code, out, err = invoke(uri, "read", "--group", "s/g", "--reader-id", "r1", "--follow")
        assert (code, out) == (0, "") and "read 0 events" in err  # everything was consumed once

        code, _, err = invoke(uri, "read", "--group", "s/g", "--segment", "s/a/0")
        assert code == 2 and "exactly one of --stream, --segment and --group" in err
        code, _, err = invoke(uri, "read")
        assert code == 2 and "exactly one of --stream, --segment and --group" in err
        code, _, err = invoke(uri, "read", "--group", "s/g", "--offset", "3")
        assert code == 2 and "--offset is for --segment" in err
        code, _, err = invoke(uri, "read", "--segment", "s/a/0", "--reader-id", "r")
        assert code == 2 and "--reader-id is for --group" in err
        code, _, err = invoke(uri, "read", "--group", "s/missing", "--reader-id", "r")
        assert code == 1 and "ReaderGroupNotFoundError" in err
