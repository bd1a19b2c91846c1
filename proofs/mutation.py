"""Mutation testing: what fraction of plausible bugs the tests kill, per package (issue 24, item 4).

``python -m proofs.mutation run [--package P ...] [--budget-seconds S]`` mutates the model and the
implementation's core, one module at a time, runs each mutant against the fast tests mapped to that
module (``SCOPE``), and writes ``MUTATION.md`` at the repository's root; ``python -m proofs.mutation
report`` rewrites ``MUTATION.md`` from the sessions already run.  ``tox -e nightly`` runs it.

Theory of operation
-------------------
**The tool: cosmic-ray**, tried here beside mutmut 3.  cosmic-ray mutates the real file in place,
runs a shell command, and restores the file: it does not care about the src layout or the two symbolic
links (``millstream.model``, ``millstream.spark``), each module gets its own test command (the mapped
tests, with ``-x``), and each run is a resumable SQLite session.  mutmut 3 copies the sources into a
``mutants/`` tree (``os.walk`` does not follow the links, so the model and the Spark package are not
copied), rewrites every function into a trampoline, and selects tests from one whole-suite
statistics run -- hopeless on two shared cores and brittle with this layout.

**What is mutated.**  cosmic-ray's operators, narrowed by ``OPERATORS`` to one plausible slip per
site: a comparison's boundary or negation (``<`` for ``<=``, ``==`` for ``!=``, ``is`` for ``is not``),
``+`` for ``-`` and the like, ``and``/``or``, ``not`` added or dropped, ``True``/``False``, a number off
by one, a loop that runs zero times, ``break``/``continue``.  Operators whose mutants say little
(removing a decorator, inserting variables, swapping exception types) and the ~120 exotic operator
swaps (``+`` for ``<<``) are left out.  Each module's mutants are then sampled -- ``--mutants-per-module``,
or ``--mutants-per-package`` shared out among a package's modules; seeded, so a rerun samples the same
ones -- because even one module's full set takes hours here.

**The model's selections include the agreement.**  Most of the model's surviving mutants once weakened
an action's enabling condition, which only the model-vs-TLC state-graph agreement sees -- minutes per
mutant in ``proofs/test_spec_model_agreement.py``.  The spec is never mutated, so TLC's graph of each
model module's smallest CI configurations is computed once and cached (``proofs/agreement_cache.py``,
built before the first mutant), and each mutant's tests explore only the model and compare
(``proofs/test_model_agreement_cached.py``, run where the test command sets ``MILLSTREAM_MUTATION=1``).
What it cannot see: guards the agreement's ``successors`` apply themselves before calling the action
(the sink's, the cluster's, LargeEvents', ContainerFailover's, DurableLog's), and behaviour outside the
small configurations.  ``tests/model/test_guards_refuse.py`` covers the first: it calls every action
instance in every reachable state, guard or no guard, and requires each step the model takes to be one
``Next`` offers; it is in the selections of the sink, the cluster and LargeEvents (``_guards``).

**Bounds.**  Each mutant's tests run under ``--per-mutant-seconds`` (a timeout counts as detected, and
is reported apart).  The whole run stops at ``--budget-seconds``: the tool's process group is killed,
the module being mutated is restored byte for byte from the copy taken before, and the mutants not run
stay pending in their session (the next ``run`` resumes them).  The report says "partial" for every
package with pending mutants, and counts only mutants run.

**The report.**  Per package: mutants generated (by the chosen operators), sampled, run, killed,
survived, timed out, kill rate (killed plus timed out, over run) as measured, and the rate after
dispositions.  Then every surviving mutant, with its disposition from
``proofs/mutation_dispositions.toml``: killed by a named test since (confirmed by planting the mutant
and running that test), or equivalent and why, or open and why; a survivor without one is listed as
open.  A disposition names its mutant by what survives edits elsewhere in the file (a ``Site``): the
module, the operator, the mutated line's text (stripped) and the occurrence -- the mutant's index
among that operator's mutants on lines of that text, in file order -- never by line number.  A
disposition whose mutant the current source no longer has (its line was edited or removed) is
reported as stale (``## Stale dispositions``) until it is updated or removed.  The measured rate is
what the run saw; the rate after dispositions counts survivors killed since as killed and leaves
equivalent ones out.
Re-run one mutant by hand: ``cosmic-ray apply MODULE OPERATOR OCCURRENCE``, the mapped tests,
``git checkout MODULE``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SESSIONS = ROOT / "build" / "mutation"
REPORT = ROOT / "MUTATION.md"
DISPOSITIONS = ROOT / "proofs" / "mutation_dispositions.toml"

#: The packages of the report, in its order.
PACKAGES = ("model", "segmentstore", "server", "client", "controller", "readers", "spark")


@dataclass(frozen=True)
class Target:
    """One module to mutate (its real path, from the repository's root) and the fast tests that
    exercise it (pytest arguments)."""

    package: str
    module: str
    tests: tuple[str, ...]


_STATEFUL = "tests/stateful/"


def _agreement(*ids: str) -> tuple[str, ...]:
    """The cached model-vs-TLC agreement on the named configurations (``proofs/agreement_cache.py``'s
    ``AGREEMENT_FOR_MODULE``; ``proofs/test_mutation.py`` checks that the two name the same ones)."""
    return tuple(f"proofs/test_model_agreement_cached.py::test_model_agrees_with_the_cached_tlc_graph[{i}]"
                 for i in ids)



def _guards(spec: str) -> str:
    """The test that calls every one of the spec's model actions where ``Next`` does not enable it
    (``tests/model/test_guards_refuse.py``): the agreement's ``successors`` checks a guard before it calls
    the action, so only this sees a weakened guard of these modules."""
    return f"tests/model/test_guards_refuse.py::test_every_{spec}_action_refuses_where_its_guard_fails"


#: Each mutated module with the fast tests that exercise it -- no JVM, no whole suite.
SCOPE: tuple[Target, ...] = (
    Target("model", "model/transactions.py", ("tests/model/test_transactions_model.py",
                                              *_agreement("transactions-Transactions_roll"))),
    Target("model", "model/stream_ordering.py", ("tests/model/test_stream_ordering.py",
                                                 *_agreement("stream_ordering-StreamOrdering_checkpoint"))),
    Target("model", "model/idempotent_writer.py", ("tests/model/test_idempotent_writer_model.py",)),
    Target("model", "model/large_events.py", ("tests/model/test_large_events_model.py",
                                              _guards("large_events"),
                                              *_agreement("large_events-LargeEvents_reconnects",
                                                          "large_events-LargeEvents_inline"))),
    Target("model", "model/exactly_once_sink.py", ("tests/model/test_exactly_once_sink_model.py",
                                                   _guards("sink"),
                                                   *_agreement("exactly_once_sink-ExactlyOnceSink_faults",
                                                               "exactly_once_sink-ExactlyOnceSink_small"))),
    Target("model", "model/cluster.py", ("tests/model/test_cluster_model.py", _guards("cluster"),
                                         *_agreement("cluster-Cluster_small"))),
    Target("model", "model/durable_log.py", ("tests/model", _STATEFUL + "test_operation_processor_vs_model.py",
                                             *_agreement("durable_log-DurableLog_truncate",
                                                         "durable_log-DurableLog_append_seal"))),
    Target("segmentstore", "impl/millstream/segmentstore/operation_processor.py",
           ("tests/unit/test_operation_processor_queue_bound.py", "tests/unit/test_container_bad_input.py",
            "tests/unit/test_operation_processor_checkpoints.py", _STATEFUL + "test_operation_processor_vs_model.py")),
    Target("segmentstore", "impl/millstream/segmentstore/metadata_transaction.py",
           ("tests/unit/test_container_bad_input.py", "tests/unit/test_event_boundaries.py",
            "tests/unit/test_operation_processor_checkpoints.py", _STATEFUL + "test_operation_processor_vs_model.py")),
    Target("segmentstore", "impl/millstream/segmentstore/durable_log.py",
           ("tests/unit/test_recovery_corruption.py", "tests/unit/test_durable_log_executor.py")),
    Target("server", "impl/millstream/server/_appends.py",
           ("tests/server/test_appends.py", "tests/server/test_bad_input.py", "tests/server/test_writer_session.py",
            "tests/server/test_scan_events_path.py", "tests/unit/test_scan_events_survivors.py")),
    Target("client", "impl/millstream/client/_segment_writer_state.py",
           (_STATEFUL + "test_segment_writer_state_vs_model.py", "tests/unit/test_segment_writer_refusals.py")),
    Target("controller", "impl/millstream/controller/_transactions.py",
           ("tests/transactions/test_decisions.py", "tests/transactions/test_service.py",
            _STATEFUL + "test_transactions_vs_model.py", "tests/unit/test_transactions_survivors.py")),
    Target("readers", "impl/millstream/client/_reader_group_state.py", ("tests/readers/test_state.py",
                                                                            "tests/readers/test_state_vs_model.py",
                                                                            "tests/unit/test_reader_group_state_survivors.py")),
    Target("spark", "spark_pipeline/_writer.py",
           ("tests/spark/test_sink_protocol.py", "tests/spark/test_sink_vs_model.py",
            "tests/spark/test_writer_survivors.py", "tests/spark/test_spark_writer_survivors.py")),
)

#: cosmic-ray's operators kept: one plausible slip per site (see the module's docstring).
OPERATORS = re.compile(
    r"core/(ReplaceComparisonOperator_(Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is)"
    r"|ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Add|Div_Mul|FloorDiv_Mul|Mod_FloorDiv|BitOr_BitAnd|BitAnd_BitOr)"
    r"|ReplaceUnaryOperator_(USub_UAdd|Delete_Not)"
    r"|AddNot|ReplaceAndWithOr|ReplaceOrWithAnd|ReplaceTrueWithFalse|ReplaceFalseWithTrue|NumberReplacer"
    r"|ZeroIterationForLoop|ReplaceBreakWithContinue|ReplaceContinueWithBreak)$")

#: How a mutant ended (``pending``: sampled, not run yet; ``skipped``: not sampled or not a chosen operator).
OUTCOMES = ("killed", "survived", "timeout", "incompetent", "pending", "skipped")


@dataclass(frozen=True)
class Mutant:
    """One mutant and how its run ended (``OUTCOMES``)."""

    package: str
    module: str
    line: int
    operator: str
    occurrence: int
    outcome: str
    chosen: bool = True  # by ``OPERATORS`` (skipped ones the operator filter left out are not counted)
    text: str = ""  # the mutated line, stripped, as the session's source had it
    text_occurrence: int = 0  # among this operator's mutants on lines of that text, in file order

    @property
    def key(self) -> str:
        """How cosmic-ray names it (``cosmic-ray apply MODULE OPERATOR OCCURRENCE`` re-runs it)."""
        return f"{self.module}:{self.line}:{self.operator}:{self.occurrence}"

    @property
    def site(self) -> Site:
        return Site(self.module, self.operator, self.text, self.text_occurrence)


@dataclass(frozen=True, order=True)
class Site:
    """A mutant named so that edits elsewhere in its module leave the name valid: the module, the operator,
    the mutated line's text (stripped), and its index among that operator's mutants on lines of that text."""

    module: str
    operator: str
    text: str
    occurrence: int


def sites(module: str, source: str, mutations: Iterable[tuple[str, int]]) -> list[Site]:
    """The ``Site`` of each ``(operator, line)`` of ``mutations`` -- every mutant of the module, in
    cosmic-ray's order (by operator, then by position) -- in the same order."""
    lines = source.splitlines()
    seen: dict[tuple[str, str], int] = {}
    named = []
    for operator, line in mutations:
        text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        occurrence = seen.get((operator, text), 0)
        seen[operator, text] = occurrence + 1
        named.append(Site(module, operator, text, occurrence))
    return named


def current_sites(module: str, root: Path = ROOT) -> set[Site]:
    """Every mutant cosmic-ray generates for the module's current source, by the chosen operators."""
    # (cosmic-ray ships no type information: hence the ignores)
    from cosmic_ray.ast import ast_nodes, get_ast_from_path  # type: ignore[import-untyped]
    from cosmic_ray.plugins import get_operator, operator_names  # type: ignore[import-untyped]

    path = root / module
    tree = get_ast_from_path(path)
    nodes = list(ast_nodes(tree))
    mutations = []
    for name in operator_names():  # as ``cosmic-ray init`` numbers them: per operator, in the tree's order
        if OPERATORS.match(name):
            operator = get_operator(name)()
            mutations += [(name, start[0]) for node in nodes for start, _ in operator.mutation_positions(node)]
    return set(sites(module, path.read_text("utf-8"), mutations))


def stale(dispositions: dict[Site, str], modules: Iterable[str], root: Path = ROOT) -> list[Site]:
    """The dispositions of ``modules`` whose mutant the current source no longer has."""
    wanted = set(modules)
    current = {module: current_sites(module, root) for module in wanted}
    return sorted(site for site in dispositions if site.module in wanted and site not in current[site.module])


@dataclass
class PackageScore:
    package: str
    generated: int = 0
    sampled: int = 0
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    incompetent: int = 0
    pending: int = 0
    survivors: list[Mutant] = field(default_factory=list)

    @property
    def run(self) -> int:
        return self.killed + self.survived + self.timeout + self.incompetent

    @property
    def kill_rate(self) -> float | None:
        """Killed plus timed out, over the mutants run (incompetent ones -- not even importable -- count
        as killed: a test run noticed); ``None`` before any ran."""
        return None if self.run == 0 else (self.killed + self.timeout + self.incompetent) / self.run

    @property
    def partial(self) -> bool:
        return self.pending > 0


def score(mutants: Iterable[Mutant]) -> dict[str, PackageScore]:
    """The per-package counts, in ``PACKAGES`` order (a package with no mutants has an empty score)."""
    scores = {package: PackageScore(package) for package in PACKAGES}
    for mutant in mutants:
        if mutant.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {mutant.outcome!r} for {mutant.key}")
        entry = scores.setdefault(mutant.package, PackageScore(mutant.package))
        if not mutant.chosen:
            continue
        entry.generated += 1
        if mutant.outcome == "skipped":
            continue
        entry.sampled += 1
        if mutant.outcome == "survived":
            entry.survivors.append(mutant)
        setattr(entry, mutant.outcome, getattr(entry, mutant.outcome) + 1)
    return scores


def _rate(entry: PackageScore) -> str:
    rate = entry.kill_rate
    if rate is None:
        return "not run"
    text = f"{100 * rate:.1f}%"
    return f"{text} (partial: {entry.pending} not run)" if entry.partial else text


def disposition_kind(disposition: str | None) -> str:
    """``killed`` (by a test since), ``equivalent``, or ``open`` (none, or marked open)."""
    if disposition is None:
        return "open"
    for kind in ("killed", "equivalent"):
        if disposition.startswith(kind):
            return kind
    return "open"


def _after(entry: PackageScore, dispositions: dict[Site, str]) -> str:
    """The kill rate once survivors killed since count as killed and equivalent ones are left out."""
    kinds = [disposition_kind(dispositions.get(m.site)) for m in entry.survivors]
    detected = entry.run - entry.survived + kinds.count("killed")
    counted = entry.run - kinds.count("equivalent")
    if counted == 0:
        return "not run"
    return f"{100 * detected / counted:.1f}% ({kinds.count('killed')} killed since, {kinds.count('equivalent')}" \
           f" equivalent, {kinds.count('open')} open)"


def render(mutants: Sequence[Mutant], dispositions: dict[Site, str], *, date: str, commands: Sequence[str],
           tool_version: str, stale_sites: Sequence[Site] = ()) -> str:
    """``MUTATION.md``'s text: the per-package table, every survivor with its disposition, and the stale
    dispositions (``stale_sites``: their mutant is gone from the current source)."""
    scores = score(mutants)
    lines = [
        "# Mutation score",
        "",
        "Generated by `python -m proofs.mutation` (see its docstring: the tool, the operators, the sampling,"
        " and each module's tests); do not edit by hand.  Dispositions of survivors live in"
        " `proofs/mutation_dispositions.toml`.",
        "",
        f"- Date: {date}",
        "- Commands (the sessions in `build/mutation` resume where a run stopped):",
        *(f"  - `{command}`" for command in commands or ["(none run)"]),
        f"- Tool: cosmic-ray {tool_version}",
        "",
        "| package | generated | sampled | run | killed | survived | timed out | incompetent | kill rate |"
        " after dispositions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for entry in scores.values():
        lines.append(f"| {entry.package} | {entry.generated} | {entry.sampled} | {entry.run} | {entry.killed} |"
                     f" {entry.survived} | {entry.timeout} | {entry.incompetent} | {_rate(entry)} |"
                     f" {_after(entry, dispositions)} |")
    lines += ["", "Kill rate: killed, timed out and incompetent mutants over the mutants run, as measured."
              "  \"partial\": the budget ended before every sampled mutant ran; the rate counts only those that"
              " did.  After dispositions: survivors a test added since kills count as killed, equivalent ones are"
              " left out.", ""]
    survivors = [m for entry in scores.values() for m in entry.survivors]
    lines += ["## Surviving mutants", ""]
    if not survivors:
        lines += ["None."]
    else:
        lines += ["| package | mutant (`module:line:operator:occurrence`) | source line | disposition |",
                  "|---|---|---|---|"]
    for mutant in sorted(survivors, key=lambda m: (PACKAGES.index(m.package) if m.package in PACKAGES else 99,
                                                   m.module, m.line, m.operator, m.occurrence)):
        quoted = "`" + mutant.text.replace("|", "\\|").replace("`", "'") + "`" if mutant.text else ""
        disposition = dispositions.get(mutant.site, "**open**: not examined yet").replace("|", "\\|")
        lines.append(f"| {mutant.package} | `{mutant.key}` | {quoted} | {disposition} |")
    if stale_sites:
        lines += ["", "## Stale dispositions", "",
                  "Their mutant is gone from the current source (the line was edited or removed): update or remove"
                  " them in `proofs/mutation_dispositions.toml`.", "",
                  "| module | operator | source line | occurrence |", "|---|---|---|---|"]
        lines += [f"| `{site.module}` | `{site.operator}` | `{site.text.replace('|', chr(92) + '|')}` |"
                  f" {site.occurrence} |" for site in stale_sites]
    lines.append("")
    return "\n".join(lines)


# --- Running the tool -----------------------------------------------------------------------------


def session_path(target: Target) -> Path:
    return SESSIONS / target.package / (target.module.replace("/", "__") + ".sqlite")


def _config(target: Target, per_mutant_seconds: float) -> str:
    tests = " ".join(shlex.quote(t) for t in target.tests)
    # The default test profile, also under ``tox -e nightly`` (its deep profile would take hours a mutant);
    # MILLSTREAM_MUTATION=1 runs the cached agreement (``proofs/test_model_agreement_cached.py``).
    command = (f"env -u MILLSTREAM_PROFILE MILLSTREAM_MUTATION=1 {shlex.quote(sys.executable)} -m pytest -x -q"
               f" -p no:cacheprovider {tests}")
    return (f'[cosmic-ray]\nmodule-path = "{target.module}"\ntimeout = {per_mutant_seconds}\n'
            f'excluded-modules = []\ntest-command = "{command}"\n\n'
            '[cosmic-ray.distributor]\nname = "local"\n')


def _cosmic_ray(*arguments: str) -> list[str]:
    return [str(Path(sys.executable).with_name("cosmic-ray")), *arguments]


def _initialise(target: Target, config: Path, session: Path, mutants_per_module: int, seed: int) -> None:
    """A new session: every mutant cosmic-ray generates; those of other operators, and those beyond the
    seeded sample, marked skipped."""
    # (cosmic-ray ships no type information: hence the two ignores)
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import WorkerOutcome, WorkResult  # type: ignore[import-untyped]

    subprocess.run(_cosmic_ray("init", str(config), str(session)), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    # The source the session's line numbers refer to, to name its mutants' sites after later edits.
    shutil.copyfile(ROOT / target.module, session.with_suffix(".source"))
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = sorted(db.pending_work_items, key=lambda item: item.job_id)
        chosen = [i for i in items if all(OPERATORS.match(m.operator_name) for m in i.mutations)]
        chosen_ids = {item.job_id for item in chosen}
        for item in items:
            if item.job_id not in chosen_ids:
                db.set_result(item.job_id, WorkResult(output="operator not chosen",
                                                      worker_outcome=WorkerOutcome.SKIPPED))
        sample = set(random.Random(f"{seed}:{target.module}").sample(range(len(chosen)),
                                                                     min(mutants_per_module, len(chosen))))
        for index, item in enumerate(chosen):
            if index not in sample:
                db.set_result(item.job_id, WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED))


def _execute(target: Target, config: Path, session: Path, seconds: float) -> bool:
    """Run the session's pending mutants for at most ``seconds``; True if it finished.  The module is
    restored byte for byte whatever happens."""
    module = ROOT / target.module
    original = module.read_bytes()
    process = subprocess.Popen(_cosmic_ray("exec", str(config), str(session)), cwd=ROOT,
                               stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        process.wait(timeout=max(seconds, 1.0))
        return True
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the tool and the test run it started
        process.wait(timeout=60)
        return False
    finally:
        if module.read_bytes() != original:
            module.write_bytes(original)


def read_session(target: Target) -> list[Mutant]:
    """The session's mutants as ``Mutant``s (``[]`` if it was never run)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    session = session_path(target)
    if not session.exists():
        return []
    saved = session.with_suffix(".source")  # (a session from before sources were saved: the current one)
    source = (saved if saved.exists() else ROOT / target.module).read_text("utf-8")
    mutants = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        results = dict(db.results)
        items = sorted(db.work_items, key=lambda item: (item.mutations[0].operator_name, item.mutations[0].occurrence))
        named = sites(target.module, source, [(i.mutations[0].operator_name, i.mutations[0].start_pos[0])
                                              for i in items])
        for item, site in zip(items, named, strict=True):
            mutation = item.mutations[0]
            result = results.get(item.job_id)
            chosen = True
            if result is None:
                outcome = "pending"
            elif result.worker_outcome is WorkerOutcome.SKIPPED:
                outcome, chosen = "skipped", result.output != "operator not chosen"
            elif result.output == "timeout":
                outcome = "timeout"
            elif result.test_outcome is TestOutcome.SURVIVED:
                outcome = "survived"
            elif result.test_outcome is TestOutcome.INCOMPETENT:
                outcome = "incompetent"
            else:
                outcome = "killed"
            mutants.append(Mutant(target.package, target.module, mutation.start_pos[0], mutation.operator_name,
                                  mutation.occurrence, outcome, chosen, site.text, site.occurrence))
    return mutants


def load_dispositions(path: Path = DISPOSITIONS) -> dict[Site, str]:
    """The ``[[survivor]]`` tables: ``module``, ``operator``, ``line`` (the text), ``occurrence``, ``disposition``."""
    if not path.exists():
        return {}
    dispositions: dict[Site, str] = {}
    for entry in tomllib.loads(path.read_text("utf-8")).get("survivor", []):
        site = Site(str(entry["module"]), str(entry["operator"]), str(entry["line"]).strip(),
                    int(entry.get("occurrence", 0)))
        if site in dispositions:
            raise ValueError(f"{path}: two dispositions of {site}")
        dispositions[site] = str(entry["disposition"])
    return dispositions


def write_report(commands: Sequence[str]) -> str:
    mutants = [m for target in SCOPE for m in read_session(target)]
    dispositions = load_dispositions()
    stale_sites = stale(dispositions, {t.module for t in SCOPE})
    for site in stale_sites:
        print(f"stale disposition (its mutant is gone): {site}", file=sys.stderr)
    text = render(mutants, dispositions, date=datetime.date.today().isoformat(), commands=commands,
                  tool_version=metadata.version("cosmic-ray"), stale_sites=stale_sites)
    REPORT.write_text(text, "utf-8")
    return text


def forget(packages: Sequence[str]) -> None:
    """Delete the sessions of ``packages`` (and the commands run that touched them: every one without
    ``--package``, and those naming one of them), so that the next ``run`` samples the current sources
    afresh rather than resuming mutants of an older version; other packages' sessions and commands stay."""
    for package in packages:
        shutil.rmtree(SESSIONS / package, ignore_errors=True)
    history = SESSIONS / "commands.txt"
    if history.exists():
        def touched(command: str) -> bool:
            words = shlex.split(command)
            named = {words[i + 1] for i, word in enumerate(words[:-1]) if word == "--package"}
            return not named or bool(named & set(packages))

        kept = [line for line in history.read_text("utf-8").splitlines() if line and not touched(line)]
        history.write_text("".join(line + "\n" for line in kept), "utf-8")


def sample_sizes(packages: Sequence[str], mutants_per_module: int, mutants_per_package: int | None) -> dict[str, int]:
    """Each target module's sample size: ``mutants_per_module``, or ``mutants_per_package`` shared out
    among the package's modules (the first ones take the remainder)."""
    sizes = {}
    for package in packages:
        modules = [t.module for t in SCOPE if t.package == package]
        for index, module in enumerate(modules):
            if mutants_per_package is None:
                sizes[module] = mutants_per_module
            else:
                share, remainder = divmod(mutants_per_package, len(modules))
                sizes[module] = share + (index < remainder)
    return sizes


def run(packages: Sequence[str], budget_seconds: float, per_mutant_seconds: float, mutants_per_module: int,
        seed: int, mutants_per_package: int | None = None) -> bool:
    """Every target of ``packages`` in turn, within the budget; True if every sampled mutant ran."""
    sizes = sample_sizes(packages, mutants_per_module, mutants_per_package)
    deadline = time.monotonic() + budget_seconds
    complete = True
    if "model" in packages:
        # TLC's graphs for the model's agreement selections, once, before any mutant's timeout runs
        subprocess.run([sys.executable, "-m", "proofs.agreement_cache"], cwd=ROOT, check=True,
                       timeout=max(budget_seconds, 1.0))
    for target in SCOPE:
        if target.package not in packages:
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            complete = False
            print(f"budget spent: {target.module} not run", file=sys.stderr)
            continue
        session = session_path(target)
        session.parent.mkdir(parents=True, exist_ok=True)
        config = session.with_suffix(".toml")
        config.write_text(_config(target, per_mutant_seconds), "utf-8")
        if not session.exists():
            _initialise(target, config, session, sizes[target.module], seed)
        print(f"{target.module}: mutating ({remaining:.0f} s of budget left)", file=sys.stderr)
        if not _execute(target, config, session, remaining):
            complete = False
            print(f"budget spent during {target.module}: its remaining mutants stay pending", file=sys.stderr)
    return complete


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs.mutation", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True)
    run_parser = subcommands.add_parser("run", help="mutate, test, and write MUTATION.md")
    run_parser.add_argument("--package", action="append", choices=PACKAGES,
                            help="a package to mutate (repeatable; default: all)")
    run_parser.add_argument("--budget-seconds", type=float, default=3600.0,
                            help="stop cleanly after this long; what did not run stays pending (default 3600)")
    run_parser.add_argument("--per-mutant-seconds", type=float, default=180.0,
                            help="one mutant's test run at most (default 180); a timeout counts as detected")
    run_parser.add_argument("--mutants-per-module", type=int, default=40,
                            help="the seeded sample of each module's mutants (default 40)")
    run_parser.add_argument("--mutants-per-package", type=int,
                            help="instead: this many per package, shared out among its modules")
    run_parser.add_argument("--seed", type=int, default=24)
    run_parser.add_argument("--fresh", action="store_true",
                            help="forget the packages' earlier sessions first (else a run resumes them)")
    subcommands.add_parser("report", help="rewrite MUTATION.md from the sessions in build/mutation")
    arguments = parser.parse_args(argv)
    history = SESSIONS / "commands.txt"  # the runs' commands, for the report to quote
    if arguments.command == "run":
        if arguments.fresh:
            forget(arguments.package or PACKAGES)
        SESSIONS.mkdir(parents=True, exist_ok=True)
        with history.open("a", encoding="utf-8") as file:
            file.write("python -m proofs.mutation " + " ".join(sys.argv[1:] if argv is None else argv) + "\n")
        run(arguments.package or PACKAGES, arguments.budget_seconds, arguments.per_mutant_seconds,
            arguments.mutants_per_module, arguments.seed, arguments.mutants_per_package)
    commands = history.read_text("utf-8").splitlines() if history.exists() else []
    print(write_report(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main())
