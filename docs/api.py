"""Build the API reference (HTML) from the docstrings with pdoc; any pdoc warning fails the build.

    python docs/api.py build/api        (what `tox -e docs` runs; needs the `docs` and `spark` extras)

The reference covers the public modules, ``PUBLIC_MODULES``: what ``import millstream`` offers an
application and the modules its docstring points to.  Private modules (``_x.py``) and the ``millstream``
command's implementation (``millstream.cli``: its documentation is ``millstream --help``) are left
out.  ``tests/test_api_docstrings.py`` checks, without pdoc, that every public name of these modules
has a docstring; this build checks that pdoc can render them all without a warning (an annotation
it cannot resolve, a broken cross-reference).
"""

from __future__ import annotations

import sys
import typing
import warnings
from pathlib import Path

#: The modules of the reference, in the order of its index.
PUBLIC_MODULES = (
    "millstream",
    "!millstream\\.",  # (pdoc's syntax: drop the submodules ``millstream`` pulled in; those wanted follow)
    "millstream.client",
    "millstream.values",
    "millstream.errors",
    "millstream.limits",
    "millstream.auth",
    "millstream.standalone",
    "millstream.lowlevel",
    "millstream.testing",
    "millstream.model",
    "millstream.spark",
)


def _resolve_named_tuple_annotations() -> None:
    """A generic ``NamedTuple`` (``EventRead[T]``, ``SegmentEvent[T]``) gets a ``__new__`` that
    ``collections`` compiles in a namespace of its own, without the module's names, so pdoc cannot
    evaluate its string annotations (``from __future__ import annotations``) there and warns.  Give
    it the annotations ``typing.get_type_hints`` resolves in the class's module instead -- what a
    type checker sees."""
    from millstream import client

    for name in client.__all__:
        value = getattr(client, name)
        if isinstance(value, type) and issubclass(value, tuple) and hasattr(value, "_fields"):
            hints = typing.get_type_hints(value)
            value.__new__.__annotations__ = {field: hints[field] for field in value._fields if field in hints}


def build(output: Path) -> None:
    import pdoc
    import pdoc.render

    _resolve_named_tuple_annotations()
    pdoc.render.configure(docformat="restructuredtext", show_source=False,
                          footer_text="millstream: a durable, elastic, exactly-once stream store")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pdoc reports what it cannot render as warnings: fail on them
        pdoc.pdoc(*PUBLIC_MODULES, output_directory=output)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/api.py OUTPUT_DIRECTORY")
    build(Path(sys.argv[1]))
    print(f"API reference written to {sys.argv[1]}/index.html")  # noqa: T201
