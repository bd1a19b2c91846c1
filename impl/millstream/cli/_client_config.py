"""The ``[client]`` table of the configuration file, as defaults of the commands' client options.

``--uri``, ``--token`` and ``--tls-ca`` (and ``node status --metrics-url``) take their value from
the command line, else their ``MILLSTREAM_*`` variable (click's ``envvar``), else -- through the
callable default made here -- the ``[client]`` table of the file ``MILLSTREAM_CONFIG`` names, else
the built-in default: the precedence ``millstream.config`` documents.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from millstream.config import CONFIG_ENVIRONMENT_VARIABLE

__all__ = ["file_default"]


def file_default(key: str, fallback: Any) -> Callable[[], Any]:
    """A click default: ``key`` of the ``[client]`` table of ``$MILLSTREAM_CONFIG``, else ``fallback``."""

    def default() -> Any:
        path = os.environ.get(CONFIG_ENVIRONMENT_VARIABLE)
        if not path:
            return fallback
        from millstream.config import read_config_file
        from millstream.errors import InvalidArgumentError

        try:
            return read_config_file(path).client.get(key, fallback)
        except InvalidArgumentError as error:
            raise click.BadParameter(str(error), param_hint=CONFIG_ENVIRONMENT_VARIABLE) from error
    return default
