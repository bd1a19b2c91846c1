"""``millstream scope ...`` and ``millstream stream ...`` against a standalone node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import millstream
from millstream.cli import main


def invoke(uri: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--uri", uri])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_scope_and_stream_commands(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "iot", "web") == (0, "created iot\ncreated web\n", "")
        code, _, err = invoke(uri, "scope", "create", "iot")
        assert code == 1 and "ScopeExistsError: scope 'iot' exists already" in err
        assert invoke(uri, "scope", "create", "--exist-ok", "iot")[:2] == (0, "exists  iot\n")
        assert invoke(uri, "scope", "list", "--json")[1] == '["iot", "web"]\n'
        assert invoke(uri, "stream", "create", "iot/a", "--segments", "2")[:2] == (0, "created iot/a\n")
        assert invoke(uri, "stream", "create", "iot/b", "--event-rate", "500", "--min-segments", "2",
                      "--retain-bytes", "1000000")[0] == 0
        code, _, err = invoke(uri, "stream", "create", "iot/c", "--segments", "2", "--event-rate", "5")
        assert code == 2 and "choose one of" in err
        code, _, err = invoke(uri, "stream", "create", "iot/_c")
        assert code == 2 and "must be 1-255 letters" in err
        assert invoke(uri, "stream", "list", "iot")[1] == "iot/a\niot/b\n"
        code, out, _ = invoke(uri, "stream", "describe", "iot/b", "--json")
        described = json.loads(out)
        assert code == 0 and described["scaling"] == {"type": "by_event_rate", "target_rate": 500.0,
                                                       "scale_factor": 2, "min_segments": 2}
        assert described["retention"] == {"type": "size", "limit": 1000000.0} and len(described["segments"]) == 2
        code, out, _ = invoke(uri, "stream", "scale", "iot/a", "--split", "0:3")
        assert (code, out) == (0, "scaled iot/a to epoch 1: 4 segments\n")
        code, out, _ = invoke(uri, "stream", "describe", "iot/a")
        assert code == 0 and "epoch:     1" in out and "iot/a/4.#epoch.1" in out and "fixed, 2 segments" in out
        ids = [s["id"] for s in json.loads(invoke(uri, "stream", "describe", "iot/a", "--json")[1])["segments"]]
        assert invoke(uri, "stream", "scale", "iot/a", "--merge", f"{ids[0]},{ids[1]}")[0] == 0
        code, _, err = invoke(uri, "stream", "scale", "iot/a", "--seal", str(ids[2]), "--range", "0:0.1")
        assert code == 1 and "InvalidScaleError" in err
        code, _, err = invoke(uri, "stream", "scale", "iot/a", "--split", "x")
        assert code == 2 and "ID or ID:PARTS" in err
        code, out, _ = invoke(uri, "stream", "truncate", "iot/a", "--at-tail")
        assert code == 0 and out.startswith("truncated iot/a at {")
        code, _, err = invoke(uri, "stream", "truncate", "iot/a", "--cut", '{"0": 0, "1": 0}')
        assert code == 1 and "InvalidStreamCutError" in err
        code, _, err = invoke(uri, "stream", "delete", "iot/a")
        assert code == 1 and "StreamNotSealedError" in err
        assert invoke(uri, "stream", "seal", "iot/a")[:2] == (0, "sealed iot/a\n")
        assert invoke(uri, "stream", "seal", "iot/a")[0] == 0
        assert invoke(uri, "stream", "delete", "iot/a")[:2] == (0, "deleted iot/a\n")
        code, _, err = invoke(uri, "stream", "describe", "iot/a")
        assert code == 1 and "StreamNotFoundError" in err
        code, _, err = invoke(uri, "scope", "delete", "iot")
        assert code == 1 and "ScopeNotEmptyError" in err
        assert invoke(uri, "scope", "delete", "web")[:2] == (0, "deleted web\n")
        assert invoke(uri, "scope", "delete", "web", "--missing-ok")[:2] == (0, "no scope web\n")


@pytest.mark.parametrize("command", [["scope"], ["stream"], ["stream", "create"], ["stream", "scale"],
                                     ["stream", "truncate"], ["stream", "describe"]])
def test_help_explains_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "millstream" in result.output
    assert "Example" in result.output or "SCOPE/STREAM" in result.output


def test_refusals_name_their_real_reason(tmp_path: Path) -> None:
    """Issue 20.8: `stream scale --split` showed "takes ID or ID:PARTS" for any refusal, hiding the
    controller's reason; `segment truncate X -1` said "No such option"; `stream truncate --at-time -5`
    reported a truncation although nothing happened."""
    with millstream.standalone(tmp_path) as node:
        uri = node.uri
        assert invoke(uri, "scope", "create", "iot")[0] == 0
        assert invoke(uri, "stream", "create", "iot/a", "--segments", "2")[0] == 0
        code, _, err = invoke(uri, "stream", "scale", "iot/a", "--split", "77")
        assert code == 1 and "InvalidScaleError" in err and "77" in err and "ID:PARTS" not in err
        code, _, err = invoke(uri, "stream", "scale", "iot/a", "--split", "0:1")
        assert code == 1 and "InvalidArgumentError" in err and "parts" in err and "ID:PARTS" not in err
        code, _, err = invoke(uri, "stream", "scale", "iot/a", "--split", "0:x")
        assert code == 2 and "ID or ID:PARTS" in err
        code, _, err = invoke(uri, "segment", "truncate", "iot/a/0.#epoch.0", "-1")
        assert code == 2 and "-1 is not in the range x>=0" in err and "No such option" not in err
        head = json.loads(invoke(uri, "stream", "describe", "iot/a", "--json")[1])["head"]
        for bad in ("-5", "nan", "inf"):
            code, out, err = invoke(uri, "stream", "truncate", "iot/a", "--at-time", bad)
            assert code == 2 and "--at-time" in err and "truncated" not in out, bad
        # A valid time before any recorded cut: nothing happens, and the command says so.
        code, out, _ = invoke(uri, "stream", "truncate", "iot/a", "--at-time", "5")
        assert code == 0 and out.startswith("nothing truncated: no tail cut was recorded"), out
        assert json.loads(invoke(uri, "stream", "describe", "iot/a", "--json")[1])["head"] == head
