"""Issue 25 item 4, the commands people reach for, against a standalone node: ``segment list`` (a
stream's, a scope's), ``read --stream`` (a whole stream in order per key, through a reader group of
its own that is deleted afterwards, also on Ctrl-C and on errors), ``read --format json|raw|lines``
with ``-0`` and ``--length-prefixed`` (events containing newlines come back unambiguously),
consumer lag in ``group describe``, and ``stream describe`` with segment sizes and rates."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import millstream
from millstream import limits
from millstream.cli import main
from millstream.client import AsyncEventStreamReader

#: Events no line-per-event output can carry: a newline inside, a NUL inside, bytes that are not UTF-8.
AWKWARD = [b"two\nlines", b"nul\0inside", b"\xff\xfe not utf-8", b"", b"plain"]


def invoke(uri: str, *args: str) -> tuple[int, bytes, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout_bytes, result.stderr


def groups_of(uri: str, scope: str) -> list[str]:
    with millstream.connect(uri) as client:
        return client.run(client.async_client.controller().list_reader_groups(scope))


def write(uri: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    with millstream.connect(uri) as client, client.event_writer(stream) as writer:
        for key, event in events:
            writer.write_event(event, routing_key=key)


def keyed(first: int, count: int) -> list[tuple[str, bytes]]:
    """Events ``key-K:N``: key ``key-(N % 5)``, N counting up, so each key's order can be checked."""
    return [(f"key-{n % 5}", f"key-{n % 5}:{n}".encode()) for n in range(first, first + count)]


def per_key(lines: list[bytes]) -> dict[str, list[int]]:
    order: dict[str, list[int]] = {}
    for line in lines:
        key, number = line.decode().split(":")
        order.setdefault(key, []).append(int(number))
    return order


def test_segment_list_shows_a_stream_s_segments_and_a_scope_s(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        assert invoke(uri, "stream", "create", "s/b")[0] == 0
        write(uri, "s/a", keyed(0, 20))
        assert invoke(uri, "stream", "scale", "s/a", "--split", "0")[0] == 0
        code, out, err = invoke(uri, "segment", "list", "s/a", "--json")
        assert code == 0, err
        rows = json.loads(out)
        # The sealed segment of epoch 0 still holds data, so it is listed beside the current ones.
        assert [(r["epoch"], r["number"], r["sealed"], r["current"]) for r in rows] == [
            (0, 0, True, False), (0, 1, False, True), (1, 2, False, True), (1, 3, False, True)]
        assert [(r["key_start"], r["key_end"]) for r in rows] == [(0.0, 0.5), (0.5, 1.0), (0.0, 0.25), (0.25, 0.5)]
        with millstream.connect(uri) as client:
            for row in rows:
                properties = client.segments().info(row["name"])
                assert (row["length"], row["start_offset"]) == (properties.length, properties.start_offset)
        assert sum(r["length"] for r in rows) > 0 and all(r["stream"] == "s/a" for r in rows)

        code, out, _ = invoke(uri, "segment", "list", "s", "--json")
        assert code == 0 and [r["stream"] for r in json.loads(out)] == ["s/a"] * 4 + ["s/b"]
        code, out, _ = invoke(uri, "segment", "list", "s/a")
        table = out.decode().splitlines()
        assert code == 0 and table[0].split()[:3] == ["SEGMENT", "ID", "EPOCH"] and len(table) == 5
        assert "sealed" in table[1] and "s/a/0.#epoch.0" in table[1]

        code, _, err = invoke(uri, "segment", "list", "s/missing")
        assert code == 1 and "StreamNotFoundError" in err
        code, _, err = invoke(uri, "segment", "list", "nope")
        assert code == 1 and "ScopeNotFoundError" in err
        code, _, err = invoke(uri, "segment", "list", "_bad")
        assert code == 2 and "must be 1-255 letters" in err


def test_read_stream_reads_every_key_in_order_across_a_scale_and_leaves_no_group(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        write(uri, "s/a", keyed(0, 40))
        assert invoke(uri, "stream", "scale", "s/a", "--split", "0")[0] == 0
        write(uri, "s/a", keyed(40, 40))

        code, out, err = invoke(uri, "read", "--stream", "s/a")
        assert code == 0, err
        order = per_key(out.splitlines())
        assert order == {f"key-{k}": list(range(k, 80, 5)) for k in range(5)}
        assert "read 80 events from s/a" in err
        assert groups_of(uri, "s") == []

        code, out, _ = invoke(uri, "read", "--stream", "s/a", "--max-events", "7")
        assert code == 0 and len(out.splitlines()) == 7
        code, out, err = invoke(uri, "read", "--stream", "s/a", "--from", "tail")
        assert (code, out) == (0, b"") and "read 0 events" in err
        # From a cut: the tail before the last 10 events were written, so exactly those come back.
        tail = json.loads(invoke(uri, "stream", "describe", "s/a", "--json")[1])["tail"]
        write(uri, "s/a", keyed(80, 10))
        code, out, _ = invoke(uri, "read", "--stream", "s/a", "--from", json.dumps(tail))
        assert code == 0 and sorted(out.splitlines()) == sorted(event for _, event in keyed(80, 10))

        # --follow ends when the stream is sealed and read to its end.
        assert invoke(uri, "stream", "seal", "s/a")[0] == 0
        code, out, err = invoke(uri, "read", "--stream", "s/a", "--follow", "--show-offsets")
        assert code == 0 and len(out.splitlines()) == 90 and "the stream is sealed" in err
        assert all(line.split(b"\t")[0].startswith(b"s/a/") and line.split(b"\t")[1].isdigit()
                   for line in out.splitlines())

        # Bad input: typed errors, and still no group left behind.
        code, _, err = invoke(uri, "read", "--stream", "s/a", "--from", '{"77": 0}')
        assert code == 1 and "InvalidStreamCutError" in err
        code, _, err = invoke(uri, "read", "--stream", "s/a", "--from", "yesterday")
        assert code == 2 and "--from" in err
        code, _, err = invoke(uri, "read", "--stream", "s/missing")
        assert code == 1 and "StreamNotFoundError" in err
        code, _, err = invoke(uri, "read", "--stream", "s/a", "--segment", "s/a/0")
        assert code == 2 and "exactly one of --stream, --segment and --group" in err
        code, _, err = invoke(uri, "read", "--segment", "s/a/0.#epoch.0", "--from", "head")
        assert code == 2 and "--from is for --stream" in err
        code, _, err = invoke(uri, "read", "--stream", "s/a", "--offset", "3")
        assert code == 2 and "--offset is for --segment" in err
        assert groups_of(uri, "s") == []


def test_read_stream_deletes_its_group_after_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while reading (here: right after the first event) stops the command -- click says
    "Aborted!" -- and the group it made is gone."""
    import millstream.cli.client as client_command

    seen: list[list[str]] = []
    original = client_command._read_as_reader

    def interrupted(client: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(client.run(client.async_client.controller().list_reader_groups("s")))
        kwargs["max_events"] = 1
        original(client, name, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(client_command, "_read_as_reader", interrupted)
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a")[0] == 0
        write(uri, "s/a", keyed(0, 5))
        result = CliRunner().invoke(main, ["read", "--stream", "s/a", "--follow", "--uri", uri])
        assert result.exit_code == 1 and "Aborted" in result.stderr and result.stdout_bytes == b"key-0:0\n"
        assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith("cli-read-")
        assert groups_of(uri, "s") == []


def test_read_stream_stopped_by_sigint_exits_130_and_deletes_its_group(tmp_path: Path) -> None:
    """The real Ctrl-C, in a process of its own: it has printed what it read, it stops with 130 and
    says how many events it printed, and its group is gone."""
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        write(uri, "s/a", keyed(0, 3))
        process = subprocess.Popen(
            [sys.executable, "-c", "from millstream.cli import main; main()", "read", "--stream", "s/a", "--follow",
             "--uri", uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            lines: queue.Queue[bytes] = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line) for line in iter(process.stdout.readline, b"")],
                             daemon=True).start()
            printed = sorted(lines.get(timeout=120) for _ in range(3))  # (waits for them: a bound, not a pace)
            assert printed == sorted(event + b"\n" for _, event in keyed(0, 3))
            assert len(groups_of(uri, "s")) == 1
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=120)
        finally:
            process.kill()
        assert process.returncode == 130 and b"stopped after 3 events" in err, err
        assert groups_of(uri, "s") == []


def test_a_stuck_clean_up_does_not_keep_a_read_from_ending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of ``read --stream``'s clean-up is bounded: a reader whose leave never finishes
    (as the one CI run where a Ctrl-C'd ``read --stream --follow`` never exited suggests) is reported,
    and the command still deletes its group and ends.  Before the bound, this read never returned."""
    async def never_leaves(self: Any, position: Any = None) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(limits, "CLI_CLEANUP_TIMEOUT_SECONDS", 0.5)
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        write(uri, "s/a", keyed(0, 3))
        monkeypatch.setattr(AsyncEventStreamReader, "close", never_leaves)
        result: list[tuple[int, bytes, str]] = []
        command = ("read", "--stream", "s/a", "--max-events", "3")
        reading = threading.Thread(target=lambda: result.append(invoke(uri, *command)), daemon=True)
        reading.start()
        reading.join(120)  # (a bound on a stuck command, not a pace: it ends as soon as the read does)
        assert result, "read --stream did not end with its reader's leave stuck"
        code, out, err = result[0]
        assert code == 0, err
        assert sorted(out.splitlines()) == sorted(event for _, event in keyed(0, 3))
        assert "could not leave its group within 0.5 s" in err, err
        assert groups_of(uri, "s") == []


def test_read_formats_make_awkward_events_unambiguous(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        with millstream.connect(uri) as client:
            client.segments().create("d/e/0")
            with client.event_writer(["d/e/0"]) as writer:
                for event in AWKWARD:
                    writer.write_event(event)
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a")[0] == 0
        write(uri, "s/a", [("k", event) for event in AWKWARD])

        for source in (["--segment", "d/e/0"], ["--stream", "s/a"]):
            code, out, err = invoke(uri, "read", *source, "--format", "json")
            assert code == 0, err
            objects = [json.loads(line) for line in out.splitlines()]
            decoded = [o["payload"].encode() if o["encoding"] == "utf-8" else base64.b64decode(o["payload"])
                       for o in objects]
            assert decoded == AWKWARD
            assert [o["encoding"] for o in objects] == ["utf-8", "utf-8", "base64", "utf-8", "utf-8"]
            assert all(o["segment"].startswith(source[1]) for o in objects)
            assert [o["offset"] for o in objects] == sorted({o["offset"] for o in objects})

            code, out, _ = invoke(uri, "read", *source, "--format", "raw", "--length-prefixed")
            events, rest = [], out
            while rest:
                length = int.from_bytes(rest[:4], "big")
                events.append(rest[4:4 + length])
                rest = rest[4 + length:]
            assert code == 0 and events == AWKWARD

        # -0: NUL-terminated; unambiguous for every event without a NUL (the one with a NUL is not).
        code, out, _ = invoke(uri, "read", "--segment", "d/e/0", "-0")
        assert code == 0 and out == b"".join(event + b"\0" for event in AWKWARD)
        code, out, _ = invoke(uri, "read", "--segment", "d/e/0", "--format", "raw")
        assert code == 0 and out == b"".join(AWKWARD)
        code, out, _ = invoke(uri, "read", "--segment", "d/e/0", "--null", "--format", "json", "--max-events", "1")
        assert code == 0 and out.endswith(b"\0") and json.loads(out[:-1])["payload"] == "two\nlines"
        # The default stays one event per line, as before.
        code, out, _ = invoke(uri, "read", "--segment", "d/e/0", "--max-events", "1", "--show-offsets")
        assert code == 0 and out == b"0\ttwo\nlines\n"

        code, _, err = invoke(uri, "read", "--segment", "d/e/0", "--length-prefixed")
        assert code == 2 and "--length-prefixed goes with --format raw" in err
        code, _, err = invoke(uri, "read", "--segment", "d/e/0", "--format", "raw", "--length-prefixed", "-0")
        assert code == 2 and "choose --length-prefixed or --null" in err
        code, _, err = invoke(uri, "read", "--segment", "d/e/0", "--format", "json", "--show-offsets")
        assert code == 2 and "--show-offsets" in err
        code, _, err = invoke(uri, "read", "--segment", "d/e/0", "--format", "yaml")
        assert code == 2 and "'yaml' is not one of" in err


def test_group_describe_shows_consumer_lag_per_reader_and_segment(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        write(uri, "s/a", keyed(0, 30))
        assert invoke(uri, "group", "create", "s/g", "--stream", "s/a", "--auto-checkpoint-seconds", "0")[0] == 0
        lengths = {r["name"]: r["length"] for r in json.loads(invoke(uri, "segment", "list", "s/a", "--json")[1])}

        code, out, err = invoke(uri, "group", "describe", "s/g", "--json")
        assert code == 0, err
        described = json.loads(out)
        assert described["bytes_behind"] == sum(lengths.values())
        assert described["unassigned_lag"] == {name: {"offset": 0, "end": length, "bytes_behind": length}
                                               for name, length in lengths.items()}
        code, _, _ = invoke(uri, "group", "read", "s/g", "--reader-id", "r", "--idle-seconds", "0.5")
        assert code == 0
        # Read to the end: nothing behind; then 5 more events are 5 events' bytes behind.
        assert json.loads(invoke(uri, "group", "describe", "s/g", "--json")[1])["bytes_behind"] == 0
        write(uri, "s/a", keyed(30, 5))
        after = {r["name"]: r["length"] for r in json.loads(invoke(uri, "segment", "list", "s/a", "--json")[1])}
        described = json.loads(invoke(uri, "group", "describe", "s/g", "--json")[1])
        assert described["bytes_behind"] == sum(after.values()) - sum(lengths.values()) > 0
        assert {s: e["bytes_behind"] for s, e in described["unassigned_lag"].items()} == \
            {name: after[name] - lengths[name] for name in after}

        # An online reader's lag is its segments' (it joined and holds them, at their recorded offsets).
        with millstream.connect(uri) as client:
            handle = client.reader_group("s/g")
            reader = handle.reader("online")
            try:
                for _ in range(100):  # take the segments: each call returns once there is an event or it waited
                    if reader.segments and len(reader.segments) == 2:
                        break
                    reader.read_next_event(0.1)
                held = dict(handle.state().segments_of("online"))
                code, out, _ = invoke(uri, "group", "describe", "s/g", "--json")
                described = json.loads(out)
                mine = described["readers"]["online"]
                assert set(mine["segment_lag"]) == set(held)
                assert mine["bytes_behind"] == sum(after[s] - held[s] for s in held)
                assert described["bytes_behind"] == mine["bytes_behind"] + sum(
                    e["bytes_behind"] for e in described["unassigned_lag"].values())
                code, text, _ = invoke(uri, "group", "describe", "s/g")
                assert code == 0 and b"reader online:" in text and b"bytes behind" in text
            finally:
                reader.close()
                handle.close()


def test_stream_describe_shows_segment_sizes_and_measured_rates(tmp_path: Path) -> None:
    from millstream.cli.streams import _sample_rates

    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "s")[0] == 0
        assert invoke(uri, "stream", "create", "s/a", "--segments", "2")[0] == 0
        write(uri, "s/a", keyed(0, 20))
        code, out, err = invoke(uri, "stream", "describe", "s/a", "--json")
        assert code == 0, err
        described = json.loads(out)
        with millstream.connect(uri) as client:
            lengths = {s["name"]: client.segments().info(s["name"]).length for s in described["segments"]}
        assert {s["name"]: s["length"] for s in described["segments"]} == lengths
        assert described["stored_bytes"] == sum(lengths.values()) > 0 and described["rates"] is None
        code, out, _ = invoke(uri, "stream", "describe", "s/a")
        assert code == 0 and b"rates:     not measured" in out and b"bytes stored" in out
        code, out, _ = invoke(uri, "stream", "describe", "s/a", "--rate-seconds", "0.1", "--json")
        rates = json.loads(out)["rates"]
        assert code == 0 and rates["events_per_second"] == 0 and rates["bytes_per_second"] == 0

        # The sample itself, with its clock and sleep injected: 10 events written "during" 2 seconds.
        now = [100.0]

        def sleep(seconds: float) -> None:
            write(uri, "s/a", keyed(20, 10))
            now[0] += 2.0

        with millstream.connect(uri) as client:
            names = [s["name"] for s in described["segments"]]
            before = {name: client.segments().info(name).length for name in names}
            measured = _sample_rates(client, names, 2.0, clock=lambda: now[0], sleep=sleep)
            grown = {name: client.segments().info(name).length - before[name] for name in names}
        assert measured["seconds"] == 2.0 and measured["events_per_second"] == 5.0
        assert measured["bytes_per_second"] == sum(grown.values()) / 2.0
        assert measured["segments"] == {name: grown[name] / 2.0 for name in names}


@pytest.mark.parametrize("command", [["segment", "list"], ["read"], ["group", "describe"], ["stream", "describe"],
                                     ["group", "read"]])
def test_the_new_commands_explain_themselves_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Example" in result.output and "millstream " + " ".join(command) in result.output
