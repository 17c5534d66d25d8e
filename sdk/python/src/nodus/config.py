"""Where the client connects, found the way the ``nodus`` CLI finds it: explicit arguments
win, then ``NODUS_SERVER`` / ``NODUS_TOKEN`` / ``NODUS_PROJECT``, then the current context of
the CLI's config file (``$NODUS_CONFIG``, else ``$XDG_CONFIG_HOME/nodus/config.yaml``, else
``~/.config/nodus/config.yaml``), which ``nodus login`` writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional

import yaml

from .errors import ConfigError

__all__ = ["Connection", "resolve", "config_path", "DEFAULT_PROJECT", "LOCAL_SERVER"]

#: The project used when neither an argument, the environment nor the context names one.
DEFAULT_PROJECT = "default"
#: The server used when neither an argument, the environment nor the context names one.
LOCAL_SERVER = "http://127.0.0.1:7070"


@dataclass(frozen=True)
class Connection:
    """A server, the token for it and a project. The token is left out of ``repr``."""

    server: str
    token: str = field(repr=False)
    project: str


def _env(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def config_path(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The path of the CLI's config file, as the CLI computes it."""
    environ = os.environ if environ is None else environ
    explicit = _env(environ, "NODUS_CONFIG")
    if explicit:
        return Path(explicit)
    xdg = _env(environ, "XDG_CONFIG_HOME")
    home = _env(environ, "HOME")
    base = Path(xdg) if xdg else (Path(home) / ".config" if home else Path("."))
    return base / "nodus" / "config.yaml"


def _load(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ConfigError(f"cannot read the nodus config {path}: {error.strerror}") from None
    if not text.strip():
        return {}
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not a nodus config: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path} is not a nodus config: it is not a mapping")
    return document


def _contexts(document: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    contexts = document.get("contexts") or []
    return [c for c in contexts if isinstance(c, dict)] if isinstance(contexts, list) else []


def _same_server(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def resolve(
    server: Optional[str] = None,
    token: Optional[str] = None,
    project: Optional[str] = None,
    *,
    environ: Optional[Mapping[str, str]] = None,
) -> Connection:
    """The connection to use: each of ``server``, ``token`` and ``project`` from the argument
    when given, else from ``NODUS_SERVER`` / ``NODUS_TOKEN`` / ``NODUS_PROJECT``, else from the
    CLI's current context. A saved token is only used for the server it was saved for.

    Raises :class:`~nodus.ConfigError` when no token is found.
    """
    environ = os.environ if environ is None else environ
    path = config_path(environ)
    document: Mapping[str, Any] = {}
    if server is None or token is None or project is None:
        document = _load(path)
    contexts = _contexts(document)
    current_name = document.get("currentContext")
    current = next((c for c in contexts if c.get("name") == current_name), None)

    chosen_server = server or _env(environ, "NODUS_SERVER")
    if chosen_server is None and current is not None and isinstance(current.get("server"), str):
        chosen_server = current["server"]
    chosen_server = (chosen_server or LOCAL_SERVER).rstrip("/")

    chosen_token = token or _env(environ, "NODUS_TOKEN")
    if chosen_token is None:
        for context in ([current] if current else []) + contexts:
            saved = context.get("token")
            if isinstance(saved, str) and _same_server(
                str(context.get("server", "")), chosen_server
            ):
                chosen_token = saved
                break
    if chosen_token is None:
        raise ConfigError(
            f"no token for {chosen_server}: pass token=…, set NODUS_TOKEN, or run "
            f"`nodus login --server {chosen_server}` (config file: {path})"
        )

    chosen_project = project or _env(environ, "NODUS_PROJECT")
    if chosen_project is None and current is not None and isinstance(current.get("project"), str):
        chosen_project = current["project"]
    return Connection(chosen_server, chosen_token, chosen_project or DEFAULT_PROJECT)
