"""``millstream bench``: a thin entry point to the benchmarks, which live in a clone, not in the package.

The suites (the write path, tiering, the peers harness beside NATS JetStream and Redis Streams,
transactions, streams, large events, and the Spark pipeline's bench behind ``millstream pipeline
bench``) are the repository's top-level ``bench/`` folder, run from a
clone as ``python -m bench --suite NAME ...`` (``tox -e bench`` runs them all); the installed
package ships none of them.  From an editable install of a clone -- or with a clone as the working
directory -- this command runs them with the arguments it was given, ``--help`` included; anywhere
else it says how to get them, and exits with status 1.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import click

from millstream.cli._group import main

__all__ = ["HOW_TO_RUN", "bench", "find_clone", "load_benchmarks"]

#: What ``millstream bench`` says where there is no clone to run the benchmarks from.
HOW_TO_RUN = (
    "the benchmarks are not part of the installed millstream package: they run from a clone of its "
    "repository (the bench/ folder), e.g.\n"
    "  cd CLONE && pip install -e '.[bench]' && python -m bench --suite quick\n"
    "or `tox -e bench` there for every suite (then `millstream bench ...` runs them too).")


def find_clone(candidates: tuple[Path, ...] | None = None) -> Path | None:
    """The root of a millstream clone holding the benchmarks, or None: the folder above the imported
    package's source root (an editable install of a clone), else the working directory, if it has
    ``bench/`` and ``impl/millstream/`` as a clone does."""
    if candidates is None:
        import millstream

        candidates = (Path(millstream.__file__).resolve().parents[2], Path.cwd())
    for root in candidates:
        if (root / "bench" / "__main__.py").is_file() and (root / "impl" / "millstream" / "__init__.py").is_file():
            return root
    return None


def load_benchmarks(module: str = "bench.cli") -> ModuleType:
    """A module of the clone's benchmarks (by default ``bench.cli``, their command line; the Spark
    pipeline's is ``bench.pipeline``), imported from the clone ``find_clone`` finds;
    ``click.ClickException`` saying how to get them if there is none."""
    root = find_clone()
    if root is None:
        raise click.ClickException(HOW_TO_RUN)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    loaded = importlib.import_module(module)  # (by name: the package never imports the benchmarks)
    if not Path(loaded.__file__ or "").resolve().is_relative_to(root / "bench"):
        raise click.ClickException(f"`{module}` imports from {loaded.__file__}, not from the clone at {root}; "
                                   f"run `python -m bench` in {root}")
    return loaded


@main.command(short_help="Benchmarks (from a clone): the write path, tiering, millstream beside its peers.",
              context_settings={"ignore_unknown_options": True}, add_help_option=False)
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
def bench(arguments: tuple[str, ...]) -> None:
    """Run the benchmark suites of a millstream clone: `millstream bench ARGS` is `python -m bench ARGS`
    there (`millstream bench --help` lists the suites and options).  Outside a clone it says how."""
    load_benchmarks().run(arguments, "millstream bench")
