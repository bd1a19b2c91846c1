"""Configuration files and ``MILLSTREAM_*`` environment variables, for nodes and for clients.

Theory of operation.  One TOML file can describe a node and how clients reach it::

    data_dir = "data"              # the node's options, at the top level (see NODE_KEYS)
    port = 9090
    metrics_port = 9091

    [client]                       # what clients use (see CLIENT_KEYS)
    uri = "tcp://127.0.0.1:9090"
    token = "..."

``millstream serve --config FILE`` and ``millstream standalone --config FILE`` read the top level;
every command that connects (``--uri``, ``--token``, ``--tls-ca``) and ``millstream.config.connect()``
read the ``[client]`` table of the file that ``MILLSTREAM_CONFIG`` names.  Every option has an
environment variable, ``MILLSTREAM_`` and its key in capitals (``MILLSTREAM_PORT``,
``MILLSTREAM_URI``).  What wins, from first to last: the command line, the environment, the file,
the defaults.

A file is checked before anything starts: a key that is not known is an error naming the nearest
known one (``unknown keys ['prot'] ...: did you mean 'port'?``), as the Spark options do; a path
(``data_dir``, ``*_file``, ``tls_ca``) relative to the file is taken relative to the file's folder.
Errors are ``InvalidArgumentError`` (the caller's fault: fix the file).

``docs/configuration.md`` lists every key, variable and flag with its default; a test checks it
against the commands' options.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from millstream.errors import InvalidArgumentError

if TYPE_CHECKING:
    from millstream.client import Client

__all__ = [
    "CLIENT_KEYS",
    "CONFIG_ENVIRONMENT_VARIABLE",
    "DEFAULT_URI",
    "NODE_KEYS",
    "ClientSettings",
    "ConfigFile",
    "client_settings",
    "connect",
    "environment_variable",
    "read_config_file",
]

#: The environment variable naming the configuration file clients (and nodes, without --config) read.
CONFIG_ENVIRONMENT_VARIABLE: Final = "MILLSTREAM_CONFIG"

#: Where a client connects when nothing says otherwise (``millstream standalone``'s default port).
DEFAULT_URI: Final = "tcp://127.0.0.1:9090"

#: The node's keys (the top level of the file): each is also ``--KEY-WITH-DASHES`` of ``millstream
#: serve`` and ``millstream standalone`` (but ``container_count``: ``--containers``; ``tls_cert_file``
#: and ``tls_key_file``: ``--tls-cert`` and ``--tls-key``) and ``MILLSTREAM_KEY``.
NODE_KEYS: Final = ("data_dir", "host", "port", "container_count", "owned_containers", "auth_secret_file",
                    "tls_cert_file", "tls_key_file", "metrics_host", "metrics_port", "log_level", "log_format",
                    "quiet")

#: The ``[client]`` table's keys: ``--uri``, ``--token``, ``--tls-ca`` of the commands that connect,
#: and ``--metrics-url`` of ``millstream node status``.
CLIENT_KEYS: Final = ("uri", "token", "tls_ca", "metrics_url")

#: Keys holding paths: relative ones are relative to the file's folder.
_PATH_KEYS: Final = frozenset({"data_dir", "auth_secret_file", "tls_cert_file", "tls_key_file", "tls_ca"})


def environment_variable(key: str) -> str:
    """The environment variable of ``key``: ``MILLSTREAM_`` and the key in capitals."""
    return "MILLSTREAM_" + key.upper()


@attrs.frozen
class ConfigFile:
    """A configuration file read and checked: ``node`` (its top level) and ``client`` (its
    ``[client]`` table), with paths made absolute."""

    path: Path
    node: Mapping[str, Any]
    client: Mapping[str, Any]


def _check_keys(table: Mapping[str, Any], known: tuple[str, ...], path: Path, where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if close:
            hints.append(f"did you mean {close[0]!r} for {key!r}?")
    hint = "; ".join(hints) if hints else f"the keys{where} are {', '.join(known)}"
    raise InvalidArgumentError(f"{path}: unknown keys {unknown}{where}: {hint}")


def _resolve(base: Path, key: str, value: Any, path: Path) -> Any:
    if key not in _PATH_KEYS:
        return value
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{path}: {key} must be a string path, not {value!r}")
    resolved = Path(value).expanduser()
    return resolved if resolved.is_absolute() else base / resolved


def read_config_file(path: str | os.PathLike[str]) -> ConfigFile:
    """Read and check the TOML file at ``path``.  Raises ``InvalidArgumentError`` if it cannot be
    read or parsed, or holds a key that is not known (naming the nearest known one)."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InvalidArgumentError(f"cannot read {path}: {error}") from error
    client = document.pop("client", {})
    if not isinstance(client, dict):
        raise InvalidArgumentError(f"{path}: client must be a table ([client]), not {client!r}")
    _check_keys(document, (*NODE_KEYS, "client"), path, "")
    _check_keys(client, CLIENT_KEYS, path, " of [client]")
    base = path.resolve().parent
    return ConfigFile(path, {key: _resolve(base, key, value, path) for key, value in document.items()},
                      {key: _resolve(base, key, value, path) for key, value in client.items()})


@attrs.frozen
class ClientSettings:
    """How a client reaches the store: ``uri``, ``token`` (empty: none), ``tls_ca`` (a CA file to
    trust, or None), and ``metrics_url`` of a node's metrics endpoint (empty: unknown)."""

    uri: str = DEFAULT_URI
    token: str = attrs.field(default="", repr=False)
    tls_ca: Path | None = None
    metrics_url: str = ""


def client_settings(config_path: str | os.PathLike[str] | None = None, *,
                    environ: Mapping[str, str] | None = None) -> ClientSettings:
    """The client's settings: from the environment (``MILLSTREAM_URI``, ``MILLSTREAM_TOKEN``,
    ``MILLSTREAM_TLS_CA``, ``MILLSTREAM_METRICS_URL``), else the ``[client]`` table of
    ``config_path`` (default: the file ``MILLSTREAM_CONFIG`` names, if any), else the defaults.
    Raises ``InvalidArgumentError`` for a file that cannot be used."""
    environ = os.environ if environ is None else environ
    if config_path is None:
        config_path = environ.get(CONFIG_ENVIRONMENT_VARIABLE) or None
    file_values: Mapping[str, Any] = {} if config_path is None else read_config_file(config_path).client
    values: dict[str, Any] = {}
    for key in CLIENT_KEYS:
        value = environ.get(environment_variable(key))
        if value is None or value == "":
            value = file_values.get(key)
        if value is not None:
            values[key] = value
    for key in ("uri", "token", "metrics_url"):
        if key in values and not isinstance(values[key], str):
            raise InvalidArgumentError(f"{key} must be a string, not {values[key]!r}")
    if "tls_ca" in values:
        values["tls_ca"] = Path(values["tls_ca"])
    return ClientSettings(**values)


def connect(config_path: str | os.PathLike[str] | None = None, **options: Any) -> Client:
    """``millstream.connect()`` with the URI, token and TLS trust of ``client_settings(config_path)``;
    ``options`` go to ``millstream.connect`` (``config=``, ``ssl_context=`` to override the CA's)::

        with millstream.config.connect() as client:   # MILLSTREAM_CONFIG's [client], or the env
            print(client.stream_manager().list_scopes())
    """
    import ssl

    import millstream

    settings = client_settings(config_path)
    if settings.tls_ca is not None and "ssl_context" not in options:
        options["ssl_context"] = ssl.create_default_context(cafile=str(settings.tls_ca))
    return millstream.connect(settings.uri, token=settings.token, **options)
