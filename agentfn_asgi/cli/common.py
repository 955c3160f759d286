"""What the commands share: loading a registry, the store URL, progress on stderr, exits."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from ..config import Config
from ..errors import CLIError
from ..tools import FunctionTools

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "ago",
    "check_store_exists",
    "load_tools",
    "progress",
    "redacted",
    "secret_from",
    "store_url",
    "tools_spec",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def load_tools(spec: str) -> FunctionTools:
    """Import ``MODULE:ATTR`` and return the :class:`FunctionTools` it names.

    ``ATTR`` may also be a zero-argument callable returning the registry (a factory). The
    working directory is importable, as with ``uvicorn module:app``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"expected MODULE:ATTR (e.g. agentfn_asgi.demo.tools:tools), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIError(f"cannot import {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise CLIError(f"{module_name!r} has no attribute {attr!r}") from exc
    if not isinstance(target, FunctionTools) and callable(target):
        target = target()
    if not isinstance(target, FunctionTools):
        raise CLIError(f"{spec} is a {type(target).__name__}, not a FunctionTools registry")
    return target


def tools_spec(value: str) -> str:
    """argparse type of ``MODULE:ATTR``: a malformed spec is a usage error (exit 2)."""
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:ATTR (e.g. agentfn_asgi.demo.tools:tools), got {value!r}"
        )
    return value


def secret_from(value: str | None) -> str:
    """``--secret``, else the webhook secrets of the environment; CLIError without any."""
    secret = value or ",".join(Config.from_env().webhook_secrets)
    if not secret.strip():
        raise CLIError("no webhook secret: pass --secret or set OPENAI_WEBHOOK_SECRET")
    return secret


def progress(message: str, *, stream: TextIO | None = None) -> None:
    """A progress line on stderr (stdout is for results)."""
    print(message, file=stream or sys.stderr, flush=True)


def check_store_exists(url: str) -> None:
    """Refuse a SQLite path that does not exist (CLIError)."""
    # Opening a SQLite URL creates the file: for a read-only report, a typo in the path
    # should be an error, not a fresh empty store.
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :].partition("?")[0]
        if path and path != ":memory:" and not Path(path).exists():
            raise CLIError(f"no store at {path} (set --store or AGENTFN_STORE_URL)")


def store_url(value: str | None) -> str:
    """``--store``, else the environment's (as the app resolves it)."""
    return value or Config.from_env().store_url


def redacted(url: str) -> str:
    """``url`` with its password hidden."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user = userinfo.partition(":")[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def ago(then: float, now: float) -> str:
    """``then`` as "5 min ago"."""
    seconds = max(0.0, now - then)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"
