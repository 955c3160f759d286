"""``agentfn-asgi``: the command line (also ``python -m agentfn_asgi``).

Modules: :mod:`.common` (shared helpers, the parser class), :mod:`.dev` (developer
commands), :mod:`.listen` (stream mode), :mod:`.ops`, :mod:`.calls` and :mod:`.approvals` (operator
commands),
:mod:`.webhooks` (webhook endpoints); each adds its commands to the parser with ``register``.

Subcommands::

    demo        play a scripted session against the demo's app, print a timeline
    fake-api    serve FakeAgentsAPI on a loopback port for local development
    send        sign and POST a webhook to a URL (like a provider's "send test event")
    listen      follow sessions' event streams, forward signed deliveries to a local app
    tools       print a registry's tool definitions as JSON (for ``agent.tools``)
    status      what the store holds: deliveries, calls by state, in-doubt, oldest pending
    recover     re-read a session (or sweep everything) and finish what is owed
    calls       list calls; show one's history; settle a held or in-doubt one
    approvals   calls waiting for a person's approval; approve or deny one
    deliveries  recorded webhook deliveries
    webhooks    create, list, update, delete, rotate and test the project's webhook endpoints

Exit codes: 0 success, 1 operational failure (the message says what failed), 2 a usage or
configuration mistake (bad arguments, a ``MODULE:ATTR`` that is not a registry, a missing
key, a malformed or missing store); 130 interrupted; 141 the reader of the output went away
(``calls | head``). No user mistake prints a traceback: one line on stderr;
a mistyped option or subcommand gets the closest one suggested.
The environment is read through :mod:`agentfn_asgi.config`, as the app reads it, so every
command agrees with the app on the store, the keys and the ``AGENTFN_*`` settings.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import signal
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import AgentFnError, CLIUsageError, ConfigurationError
from . import approvals, calls, dev, listen, ops, webhooks
from .common import EXIT_FAILURE, EXIT_USAGE, Parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = Parser(
        prog="agentfn-asgi",
        description="Run function tools for OpenAI's Agents API from signed webhooks.",
        epilog=("Exit codes: 0 success, 1 operational failure, 2 usage or configuration mistake."),
    )
    parser.add_argument("--version", action="version", version=f"agentfn-asgi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    dev.register(sub)
    listen.register(sub)
    ops.register(sub)
    calls.register(sub)
    approvals.register(sub)
    webhooks.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
        if inspect.iscoroutine(code):  # an ``async def`` command
            code = asyncio.run(code)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`calls | head`): stop quietly, as other tools do. What is
        # still buffered goes nowhere, else the interpreter's own flush would complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except AgentFnError as exc:
        what = "configuration error: " if isinstance(exc, ConfigurationError) else ""
        print(f"agentfn-asgi {args.command}: {what}{exc}", file=sys.stderr)
        usage = isinstance(exc, ConfigurationError | CLIUsageError)
        return EXIT_USAGE if usage else EXIT_FAILURE
    return int(code)
