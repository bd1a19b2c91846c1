"""The node's security settings from the files the command line names: shared by ``serve``/``standalone``
and ``cluster up``, which checks them once before it starts any node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

__all__ = ["load_security"]


def load_security(secret_file: Path | None, tls_cert: Path | None, tls_key: Path | None,
                  hint: str) -> tuple[bytes | None, Any]:
    """The node's secret (None: authentication off) and server-side ``ssl.SSLContext`` (None: no TLS)
    from the files given; a file that cannot be used is a ``click.BadParameter`` naming ``hint``."""
    import ssl

    from millstream.auth import read_secret_file
    from millstream.errors import InvalidArgumentError

    secret = None
    if secret_file is not None:
        try:
            secret = read_secret_file(secret_file)
        except InvalidArgumentError as error:
            raise click.BadParameter(str(error), param_hint=hint) from error
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("a TLS certificate and its key go together", param_hint=hint)
    ssl_context = None
    if tls_cert is not None and tls_key is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as error:
            raise click.BadParameter(f"cannot load the TLS certificate: {error}", param_hint=hint) from error
    return secret, ssl_context
