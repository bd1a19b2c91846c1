"""The TLC runner itself: a run that outlives its time limit is stopped and reported as such (a
typed outcome, not an exception that would end the whole check before the other configurations)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from proofs.tlc import EXIT_TIMED_OUT, SPEC_DIR, load_manifest, run_tlc


def test_a_run_past_its_time_limit_is_stopped_and_reported() -> None:
    spec = load_manifest()["specs"]["DurableLog"]
    cfg = next(config["cfg"] for config in spec["configs"] if config["profile"] == "ci")
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        for path in SPEC_DIR.iterdir():
            if path.suffix in (".tla", ".cfg"):
                shutil.copy(path, workdir / path.name)
        # A limit shorter than the JVM's start: TLC cannot have finished.
        outcome = run_tlc(workdir, spec["model_module"], cfg, timeout_seconds=0.05)
    assert outcome.returncode == EXIT_TIMED_OUT
    assert (outcome.distinct, outcome.generated, outcome.depth, outcome.violated) == (None, None, None, None)
    assert "TLC did not finish within 0.05 s" in outcome.output

