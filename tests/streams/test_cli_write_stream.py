"""``millstream write --stream`` against a standalone node: lines routed by one key or by a JSON field,
into a stream that was scaled before and between writes, read back in epoch order."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import millstream
from millstream.cli import main
from millstream.client import routing_key_fraction


def invoke(uri: str, *args: str, input: bytes | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def events_by_segment(client: millstream.Client, stream: str) -> dict[str, list[bytes]]:
    scope, name = stream.split("/")
    slices = client.run(client.async_client.controller().get_segments_between(scope, name, None, None))
    found: dict[str, list[bytes]] = {}
    for piece in slices:
        reader = client.segment_reader(piece.segment.name)
        found[piece.segment.name] = [event.value for event in reader.read_events()]
        reader.close()
    return found


def test_write_to_a_stream_by_routing_key_and_by_key_field(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        uri = node.uri
        assert invoke(uri, "scope", "create", "iot")[0] == 0
        assert invoke(uri, "stream", "create", "iot/sensors", "--segments", "4")[0] == 0

        # One key for every line: all of them land in the one segment owning the key, in order.
        code, _, err = invoke(uri, "write", "--stream", "iot/sensors", "--routing-key", "sensor-17",
                              input=b"a\nb\nc\n")
        assert code == 0 and "wrote 3 events (3 bytes) to stream iot/sensors; all durable" in err, err
        owner = next(s for s in client.stream_manager().current_segments("iot/sensors").segments
                     if s.owns(routing_key_fraction("sensor-17")))
        assert events_by_segment(client, "iot/sensors")[owner.name] == [b"a", b"b", b"c"]

        # Scale, then route each line by its JSON "id": same id -> same segment, in order.
        client.stream_manager().split_segment("iot/sensors", owner.segment_id, 2)
        lines = [json.dumps({"id": i % 5, "n": i}).encode() for i in range(40)]
        jsonl = tmp_path / "readings.jsonl"
        jsonl.write_bytes(b"\n".join(lines) + b"\n")
        code, _, err = invoke(uri, "write", "--stream", "iot/sensors", "--key-field", "id", str(jsonl))
        assert code == 0 and "wrote 40 events" in err, err
        stored = events_by_segment(client, "iot/sensors")
        for key in range(5):
            mine = [line for line in lines if json.loads(line)["id"] == key]
            holders = [name for name, events in stored.items() if any(e in mine for e in events)]
            assert len(holders) == 1, (key, holders)
            assert [e for e in stored[holders[0]] if e in mine] == mine
            segment = next(s for s in client.stream_manager().current_segments("iot/sensors").segments
                           if s.name == holders[0])
            assert segment.owns(routing_key_fraction(str(key))), "a number's key is its JSON text"


def test_write_to_a_stream_refuses_bad_arguments_and_bad_lines(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        uri = node.uri
        invoke(uri, "scope", "create", "iot")
        invoke(uri, "stream", "create", "iot/s")
        code, _, err = invoke(uri, "write", "--stream", "iot/s", "--segment", "x/0", input=b"a\n")
        assert code == 2 and "not both" in err
        code, _, err = invoke(uri, "write", input=b"a\n")
        assert code == 2 and "--stream SCOPE/STREAM or --segment" in err
        code, _, err = invoke(uri, "write", "--stream", "iot/s", "--routing-key", "k", "--key-field", "id",
                              input=b"a\n")
        assert code == 2 and "choose one" in err
        code, _, err = invoke(uri, "write", "--stream", "no-scope", input=b"a\n")
        assert code == 2 and "scope/stream" in err
        code, _, err = invoke(uri, "write", "--stream", "iot/missing", input=b"a\n")
        assert code == 1 and "StreamNotFoundError" in err
        code, _, err = invoke(uri, "write", "--stream", "iot/s", "--key-field", "id",
                              input=b'{"id": "a"}\n{"id": "b"}\nnot json\n{"id": "c"}\n')
        assert code == 1 and "line 3 of stdin is not JSON" in err and "the 2 events before it were written" in err
        (stored,) = events_by_segment(client, "iot/s").values()
        assert stored == [b'{"id": "a"}', b'{"id": "b"}'], "what came before the bad line is durable"
        code, _, err = invoke(uri, "write", "--stream", "iot/s", "--key-field", "id", input=b'{"id": null}\n')
        assert code == 1 and "not a string or number" in err
        invoke(uri, "stream", "seal", "iot/s")
        code, _, err = invoke(uri, "write", "--stream", "iot/s", input=b"late\n")
        assert code == 1 and "StreamSealedError" in err
