"""The root ``millstream`` click group.  Subcommands live in the sibling modules of this package."""

from __future__ import annotations

import click

import millstream

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(millstream.__version__, "-V", "--version", prog_name="millstream")
def main() -> None:
    """millstream: a durable, elastic, exactly-once stream store.

    Run `millstream COMMAND --help` for what each command does and its options.
    """
