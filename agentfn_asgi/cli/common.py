"""What the commands share: loading a registry, the store URL, progress on stderr, exits."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import difflib
import importlib
import inspect
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ..client import AgentsClient
from ..config import Config
from ..errors import CLIUsageError, ConfigurationError
from ..store import SQLiteStore, Store
from ..tools import FunctionTools

if TYPE_CHECKING:
    from ..dispatch import Dispatcher

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "STORE_HELP",
    "Parser",
    "ago",
    "api_client",
    "check_store_exists",
    "describe",
    "dispatching",
    "load_tools",
    "printable",
    "progress",
    "seconds_type",
    "secret_from",
    "show",
    "stamp",
    "store_url",
    "table",
    "tools_spec",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

STORE_HELP = "store URL (default: AGENTFN_STORE_URL, else sqlite:///agentfn.sqlite3)"

_EXTRAS_OWNER = "_agentfn_extras_owner"
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse's parser with a suggestion for a mistyped option or subcommand.

    Python 3.11's argparse says "unrecognized arguments: --jsn" from the top-level parser,
    and "invalid choice: 'lst'" with the whole list: here the error comes from the
    (sub)command the option was given to, with its usage line, and names the closest
    option or choice ("did you mean --json?"), chosen with :mod:`difflib`. Subparsers made
    by ``add_subparsers`` are of this class too. Exit code 2, as argparse's.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # The innermost parser that left something over answers for it; a subcommand's
        # namespace is copied into its parent's, so the parent sees the mark.
        if extras and not hasattr(parsed, _EXTRAS_OWNER):
            setattr(parsed, _EXTRAS_OWNER, self)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        owner: Parser = getattr(parsed, _EXTRAS_OWNER, self)
        if hasattr(parsed, _EXTRAS_OWNER):
            delattr(parsed, _EXTRAS_OWNER)
        if extras:
            owner.error(f"unrecognized arguments: {' '.join(extras)}{owner._suggest(extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``message`` (with a suggestion for an invalid choice), exit 2."""
        match = _INVALID_CHOICE.search(message)
        if match and "did you mean" not in message:
            choices = re.findall(r"'([^']*)'", match.group(2))
            close = difflib.get_close_matches(match.group(1), choices, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
        super().error(message)

    def _suggest(self, extras: Sequence[str]) -> str:
        """ " (did you mean --json?)" for the first unknown option close to one of ours."""
        known = [opt for action in self._actions for opt in action.option_strings]
        for token in extras:
            if not token.startswith("-"):
                continue
            close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
        return ""


def load_tools(spec: str) -> FunctionTools:
    """Import ``MODULE:ATTR`` and return the :class:`FunctionTools` it names.

    ``ATTR`` may also name an :class:`~agentfn_asgi.AgentWebhookApp` (its registry is used,
    so ``main:webhooks`` works as well as ``main:tools``) or a function that takes no
    arguments and returns either (a factory); nothing else is called. The working directory
    is importable, as with ``uvicorn module:app``. Anything else is a
    :class:`CLIUsageError` naming what was found and what was expected.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIUsageError(
            f"expected MODULE:ATTR (e.g. agentfn_asgi.demo.tools:tools), got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIUsageError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed: one line, where it failed
        raise CLIUsageError(f"importing {module_name!r} failed: {_one_line(exc)}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            found = _registries_in(module)
            hint = f" (registries there: {', '.join(found)})" if found else ""
            raise CLIUsageError(f"{module_name!r} has no attribute {attr!r}{hint}") from None
    registry = _registry_of(target)
    if registry is not None:
        return registry
    if _is_factory(target):
        try:
            made = target()
        except Exception as exc:
            raise CLIUsageError(f"{spec}() failed: {_one_line(exc)}") from None
        registry = _registry_of(made)
        if registry is not None:
            return registry
        raise CLIUsageError(f"{spec}() returned {describe(made)}, {_EXPECTED}")
    raise CLIUsageError(f"{spec} is {describe(target)}, {_EXPECTED}")


_EXPECTED = (
    "not a FunctionTools registry: name the registry your tools are registered on "
    "(MODULE:tools), an AgentWebhookApp, or a function without arguments that returns one"
)


def _registry_of(value: object) -> FunctionTools | None:
    from ..app import AgentWebhookApp

    if isinstance(value, FunctionTools):
        return value
    if isinstance(value, AgentWebhookApp):
        return value.tools
    return None


def _registries_in(module: object) -> list[str]:
    return [name for name, value in vars(module).items() if _registry_of(value) is not None]


def _is_factory(value: object) -> bool:
    """A plain function or method callable without arguments (never a class, nor an object
    with ``__call__`` such as an ASGI app, which would run something else)."""
    if not (inspect.isfunction(value) or inspect.ismethod(value)):
        return False
    try:
        inspect.signature(value).bind()
    except TypeError:
        return False
    return True


def describe(value: object) -> str:
    """``value`` in a message, with the right article: "an int", "an AgentWebhookApp",
    "a Starlette", "the class Foo", "a function taking arguments (city)"."""
    if value is None:
        return "None"
    if inspect.ismodule(value):
        return f"the module {value.__name__}"
    if inspect.isclass(value):
        return f"the class {value.__qualname__}"
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        try:
            names = list(inspect.signature(value).parameters)
        except (TypeError, ValueError):
            names = []
        return f"a function taking arguments ({', '.join(names)})" if names else "a function"
    name = type(value).__name__
    if _is_asgi_app(value):
        name += " app"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _is_asgi_app(value: object) -> bool:
    """An object called as ``app(scope, receive, send)`` (Starlette, FastAPI, Django...)."""
    if not callable(value):
        return False
    try:
        names = list(inspect.signature(value).parameters)
    except (TypeError, ValueError):
        return False
    return names[:1] == ["scope"] and len(names) == 3


def _one_line(exc: BaseException) -> str:
    """``Type: message (file:line)``: where a user's code failed, without a traceback."""
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    # The innermost frame of the user's code (not importlib's, the standard library's or a
    # dependency's); a SyntaxError names its file and line itself.
    library = tuple(sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib"))
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(("<", *library))
    ]
    if frames and not isinstance(exc, SyntaxError):
        text += f" ({frames[-1].filename}:{frames[-1].lineno})"
    return text.rstrip(": ")


def api_client(config: Config, why: str, **options: Any) -> AgentsClient:
    """``config``'s Agents API client; without a key, a ConfigurationError that names the
    environment variable (the CLI has no ``api_key=`` to pass)."""
    if not config.api_key:
        raise ConfigurationError(
            f"no API key: set the OPENAI_API_KEY environment variable ({why}; "
            "OPENAI_BASE_URL points it at another server, e.g. agentfn-asgi fake-api)"
        )
    return config.client(**options)


@contextlib.asynccontextmanager
async def dispatching(
    config: Config,
    registry: FunctionTools,
    store: Store,
    *,
    why: str,
    drain_timeout: float,
    announce: str | None = None,
) -> AsyncIterator[Dispatcher]:
    """A started dispatcher built like the app's (same ``AGENTFN_*`` settings, worker lane,
    store namespace), drained on the way out; ``why`` it needs the Agents API is said when
    there is no key, else ``announce`` is printed on stderr before it starts."""
    from ..dispatch import Dispatcher
    from ..jobs import worker_jobs

    handoff = worker_jobs(
        registry, config.completion_secrets, public_url=config.public_url, namespace=store.namespace
    )
    client = api_client(config, why)
    if announce:
        progress(announce)
    async with client:
        dispatcher = Dispatcher(registry, client, store, settings=config.dispatch, handoff=handoff)
        try:
            await dispatcher.start(recover=False)
            yield dispatcher
            if dispatcher.inflight:
                progress(f"waiting for {dispatcher.inflight} call(s) to finish...")
        finally:
            await dispatcher.stop(drain_timeout=drain_timeout)


def tools_spec(value: str) -> str:
    """argparse type of ``MODULE:ATTR``: a malformed spec is a usage error (exit 2)."""
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:ATTR (e.g. agentfn_asgi.demo.tools:tools), got {value!r}"
        )
    return value


def seconds_type(*, zero: bool) -> Callable[[str], float]:
    """argparse type of a duration in seconds: 0 or more with ``zero``, else more than 0."""

    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
        if zero and seconds < 0:
            raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {value}")
        if not zero and not seconds > 0:
            raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {value}")
        return seconds

    return parse


def secret_from(value: str | None) -> str:
    """``--secret``, else the webhook secrets of the environment; ConfigurationError without."""
    secret = value or ",".join(Config.from_env().webhook_secrets)
    if not secret.strip():
        raise ConfigurationError("no webhook secret: pass --secret or set OPENAI_WEBHOOK_SECRET")
    return secret


# Characters a terminal acts on rather than shows (escape sequences, carriage return,
# backspace, bell, C1 controls, bidirectional overrides), as text: \n and \t are kept.
_CONTROLS = {
    code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code not in (9, 10)
}
_BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS.update({code: f"\\u{code:04x}" for code in _BIDI})


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``): what tools and people wrote
    (output, errors, reasons, arguments) cannot drive the operator's terminal."""
    return text.translate(_CONTROLS)


def show(text: str) -> None:
    """Print a command's human-readable answer, control characters escaped."""
    print(printable(text))


def progress(message: str, *, stream: TextIO | None = None) -> None:
    """A progress line on stderr (stdout is for results)."""
    print(message, file=stream or sys.stderr, flush=True)


def check_store_exists(store: Store) -> None:
    """Refuse a SQLite file that does not exist (ConfigurationError, exit 2)."""
    # Opening a SQLite URL creates the file: for an operator's command, a typo in the path
    # (or a relative path run from another folder) should be an error, not an empty store.
    if isinstance(store, SQLiteStore) and not Path(store.path).exists():
        raise ConfigurationError(
            f"no store at {store.path} (nothing was created): pass --store or set "
            "AGENTFN_STORE_URL to the app's store; sqlite:///x.db is relative to the working "
            f"directory ({os.getcwd()}), sqlite:////x.db is absolute"
        )


def store_url(value: str | None) -> str:
    """``--store``, else the environment's (as the app resolves it)."""
    return value or Config.from_env().store_url


def stamp(at: float) -> str:
    """``at`` (Unix seconds) as ``2024-05-01 12:00:00``, in UTC."""
    return f"{dt.datetime.fromtimestamp(at, dt.UTC):%Y-%m-%d %H:%M:%S}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``header`` and ``rows`` as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


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
