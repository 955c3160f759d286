"""``agentfn-asgi``: the command line (also ``python -m agentfn_asgi``).

Subcommands::

    demo        play a scripted session against the demo's app, print a timeline
    fake-api    serve FakeAgentsAPI on a loopback port for local development
    send        sign and POST a webhook to a URL (like a provider's "send test event")
    tools       print a registry's tool definitions as JSON (for ``agent.tools``)
    status      what the store holds: deliveries, calls by state, in-doubt, oldest pending
    recover     re-read a session (or sweep everything) and finish what is owed

Exit codes: 0 success, 1 operational failure (the message says what failed), 2 usage error.
The environment is read through :mod:`agentfn_asgi.config`, as the app reads it, so every
command agrees with the app on the store, the keys and the ``AGENTFN_*`` settings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from ._version import __version__
from .config import Config
from .errors import AgentFnError, CLIError, ConfigurationError
from .records import StoreStats
from .tools import FunctionTools

__all__ = ["build_parser", "load_tools", "main", "parse_call_spec"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


# -- helpers shared by subcommands -----------------------------------------------------------


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


def _tools_spec(value: str) -> str:
    # Checked by argparse, so a malformed spec is a usage error (exit 2).
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:ATTR (e.g. agentfn_asgi.demo.tools:tools), got {value!r}"
        )
    return value


def parse_call_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Parse ``NAME`` or ``NAME:{json arguments}`` (``fake-api --call``)."""
    name, sep, raw = spec.partition(":")
    name = name.strip()
    if not name:
        raise CLIError(f"a call needs a tool name: {spec!r}")
    if not sep or not raw.strip():
        return name, {}
    try:
        arguments = json.loads(raw)
    except ValueError as exc:
        raise CLIError(f"arguments of {name!r} are not JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise CLIError(f"arguments of {name!r} must be a JSON object")
    return name, arguments


def _secret_from(value: str | None) -> str:
    secret = value or ",".join(Config.from_env().webhook_secrets)
    if not secret.strip():
        raise CLIError("no webhook secret: pass --secret or set OPENAI_WEBHOOK_SECRET")
    return secret


def _progress(message: str, *, stream: TextIO | None = None) -> None:
    print(message, file=stream or sys.stderr, flush=True)


# -- tools -----------------------------------------------------------------------------------


def _cmd_tools(args: argparse.Namespace) -> int:
    registry = load_tools(args.spec)
    definitions = registry.definitions()
    indent = None if args.compact else 2
    separators = (",", ":") if args.compact else None
    print(json.dumps(definitions, indent=indent, separators=separators, ensure_ascii=False))
    return EXIT_OK


# -- send ------------------------------------------------------------------------------------


async def _send(args: argparse.Namespace) -> int:
    import httpx

    from .testing.deliveries import signed_delivery, webhook_event

    secret = _secret_from(args.secret)
    data: dict[str, Any] = {"id": args.session_id}
    if args.type == "agent.session.action_required":
        data["required_action"] = {"type": args.action_type}
    event = webhook_event(args.type, data)
    try:
        body, headers = signed_delivery(secret, event, msg_id=args.webhook_id)
    except AgentFnError as exc:
        raise CLIError(f"cannot sign with this secret: {exc}") from exc
    _progress(f"POST {args.url} ({args.type}, session {args.session_id})")
    try:
        async with httpx.AsyncClient(timeout=args.timeout) as http:
            response = await http.post(args.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise CLIError(f"could not deliver to {args.url}: {exc!r}") from exc
    print(f"{response.status_code} {response.reason_phrase}")
    if response.content:
        print(response.text)
    if response.is_redirect:
        _progress(
            "a redirect is a failed delivery for a webhook sender: use the exact URL "
            f"(Location: {response.headers.get('location', '?')})"
        )
    return EXIT_OK if response.is_success else EXIT_FAILURE


# -- status ----------------------------------------------------------------------------------


def _check_store_exists(url: str) -> None:
    # Opening a SQLite URL creates the file: for a read-only report, a typo in the path
    # should be an error, not a fresh empty store.
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :].partition("?")[0]
        if path and path != ":memory:" and not Path(path).exists():
            raise CLIError(f"no store at {path} (set --store or AGENTFN_STORE_URL)")


def _store_url(value: str | None) -> str:
    return value or Config.from_env().store_url


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user = userinfo.partition(":")[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _ago(then: float, now: float) -> str:
    seconds = max(0.0, now - then)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def format_stats(stats: StoreStats, *, url: str, now: float | None = None) -> str:
    """The human-readable ``status`` report."""
    now = time.time() if now is None else now
    by_state = dict(stats.calls_by_state)
    total = sum(by_state.values())
    states = ", ".join(f"{state} {count}" for state, count in sorted(by_state.items())) or "none"
    if stats.oldest_pending_at is None:
        oldest = "none"
    else:
        stamp = dt.datetime.fromtimestamp(stats.oldest_pending_at, dt.UTC)
        oldest = f"{stamp:%Y-%m-%d %H:%M:%S} UTC ({_ago(stats.oldest_pending_at, now)})"
    rows = [
        ("store", _redacted(url)),
        ("deliveries", f"{stats.deliveries} ({stats.unresolved_deliveries} unresolved)"),
        ("calls", f"{total} ({states})"),
        ("in doubt", str(stats.in_doubt)),
        ("quarantined", str(by_state.get("quarantined", 0))),
        ("oldest pending", oldest),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if stats.in_doubt or by_state.get("quarantined", 0):
        lines.append("")
        lines.append(
            "in-doubt or quarantined calls need a look: `agentfn-asgi recover --session ID "
            "--tools MODULE:ATTR` re-reads a session"
        )
    return "\n".join(lines)


async def _status(args: argparse.Namespace) -> int:
    from .store import open_store

    url = _store_url(args.store)
    _check_store_exists(url)
    store = open_store(url)
    try:
        await store.open()
        stats = await store.stats()
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"store": _redacted(url), **asdict(stats)}, indent=2))
    else:
        print(format_stats(stats, url=url))
    return EXIT_OK


# -- recover ---------------------------------------------------------------------------------


async def _recover(args: argparse.Namespace) -> int:
    from .dispatch import Dispatcher
    from .jobs import worker_jobs
    from .store import open_store

    registry = load_tools(args.tools)
    config = Config.from_env()
    url = args.store or config.store_url
    _check_store_exists(url)
    store = open_store(url)
    # No webhook app is needed to recover (nothing is received), hence no webhook secret:
    # the dispatcher alone reads sessions, runs what is owed and submits saved results,
    # with the same AGENTFN_* settings and worker lane as the app.
    handoff = worker_jobs(registry, config.completion_secrets, public_url=config.public_url)
    async with config.client() as client:
        dispatcher = Dispatcher(registry, client, store, settings=config.dispatch, handoff=handoff)
        try:
            await dispatcher.start(recover=False)
            if args.session:
                _progress(f"reading session {args.session} and finishing what is owed...")
            else:
                _progress("running one recovery sweep over the whole store...")
            await dispatcher.recover(args.session)
            if dispatcher.inflight:
                _progress(f"waiting for {dispatcher.inflight} call(s) to finish...")
        finally:
            await dispatcher.stop(drain_timeout=args.drain_timeout)
            calls = await store.calls_for_session(args.session) if args.session else []
            await store.close()
    for record in calls:
        key, state = record.key, record.state.value
        print(f"{key.call_id}  {record.tool_name}  {state}  attempt {record.attempt}")
    if args.session and not calls:
        print(f"no calls recorded for session {args.session}")
    print("recovery done")
    return EXIT_OK


# -- demo and fake-api -----------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return asyncio.run(run_demo(time_limit=args.timeout, verbose=args.verbose))


def _cmd_fake_api(args: argparse.Namespace) -> int:
    from .testing.control import serve_fake_api
    from .testing.fake_webhooks import webhook_backoff

    calls = [parse_call_spec(spec) for spec in args.call]
    return asyncio.run(
        serve_fake_api(
            host=args.host,
            port=args.port,
            webhook_urls=args.webhook_url,
            webhook_secret=args.secret or ",".join(Config.from_env().webhook_secrets) or None,
            api_key=args.api_key,
            webhook_retry_delays=webhook_backoff(args.webhook_retry_for),
            calls=calls,
            stop_on_sigterm=True,
        )
    )


def _non_negative(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {value}")
    return seconds


# -- parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="agentfn-asgi",
        description="Run function tools for OpenAI's Agents API from signed webhooks.",
        epilog="Exit codes: 0 success, 1 operational failure, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"agentfn-asgi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="play a scripted session end to end and print a timeline",
        description=(
            "Start FakeAgentsAPI in this process and the demo's Starlette app "
            "(agentfn_asgi.demo.app) under uvicorn, on free loopback ports (SQLite store in a "
            "temporary folder; runs from any folder), play a session that calls get_customer, "
            "create_refund, two parallel slow_echo, an unknown tool and a failing refund, "
            "then a second step; print a timeline and a summary. Leaves nothing running."
        ),
    )
    demo.add_argument("--timeout", type=float, default=30.0, help="give up after this many seconds")
    demo.add_argument("-v", "--verbose", action="store_true", help="also show the app's logs")
    demo.set_defaults(handler=_cmd_demo)

    from .testing.control import DEV_WEBHOOK_RETRY_WINDOW, ONE_STEP_SHAPE, SESSION_SCRIPT_SHAPE

    fake = sub.add_parser(
        "fake-api",
        help="serve FakeAgentsAPI on a port for local development",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Serve an in-memory Agents API (GET/POST /v1/agents/sessions/...). Point your\n"
            "app's OPENAI_BASE_URL at it and name your webhook URL with --webhook-url.\n"
            "Create sessions with --call (one session whose step calls them in parallel),\n"
            "or at any time with POST /_fake/sessions (below). A webhook the app does not\n"
            "take is retried with backoff (--webhook-retry-for); giving up is printed."
        ),
        epilog=(
            "control API (same host and port):\n"
            "  POST /_fake/sessions               create a session from a script:\n"
            f"      {SESSION_SCRIPT_SHAPE}\n"
            f"      or {ONE_STEP_SHAPE} for a single step\n"
            "      each step is a batch of parallel calls; the next step's calls come once\n"
            '      all have results; "arguments" defaults to {}, "call_id" is optional\n'
            "  POST /_fake/sessions/ID/redeliver  send its action_required webhook again\n"
            "  GET  /_fake/submissions            the results the fake accepted\n"
            "\n"
            "example:\n"
            "  curl -X POST http://127.0.0.1:8765/_fake/sessions -H 'content-type: "
            "application/json' \\\n"
            """      -d '{"calls": [{"name": "get_customer", "arguments": """
            """{"customer_id": "123"}}]}'"""
        ),
    )
    fake.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    fake.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any)")
    fake.add_argument(
        "--webhook-url",
        action="append",
        default=[],
        metavar="URL",
        help="where to send signed webhooks (repeatable)",
    )
    fake.add_argument(
        "--secret",
        "--webhook-secret",
        dest="secret",
        help="whsec_ signing secret (default: OPENAI_WEBHOOK_SECRET, else a random one)",
    )
    fake.add_argument(
        "--api-key", default="sk-test", help="bearer token to accept (default sk-test)"
    )
    fake.add_argument(
        "--call",
        action="append",
        default=[],
        metavar="NAME:JSON",
        help="""a call of the first session: 'get_customer:{"customer_id":"123"}' (repeatable)""",
    )
    fake.add_argument(
        "--webhook-retry-for",
        type=_non_negative,
        default=DEV_WEBHOOK_RETRY_WINDOW,
        metavar="SECONDS",
        help=(
            "keep retrying a webhook the app does not take, with exponential backoff, for "
            f"about this long (default {DEV_WEBHOOK_RETRY_WINDOW:g}; OpenAI retries for 72 h; "
            "0 = no retry)"
        ),
    )
    fake.set_defaults(handler=_cmd_fake_api)

    send = sub.add_parser(
        "send",
        help="sign and POST a webhook to a URL",
        description="Sign a webhook with a whsec_ secret and POST it, like a test event.",
    )
    send.add_argument("url", help="e.g. http://127.0.0.1:8000/openai/webhooks")
    send.add_argument("--secret", help="whsec_ secret (default: OPENAI_WEBHOOK_SECRET)")
    send.add_argument("--session-id", default="sess_test", help="data.id of the event")
    send.add_argument(
        "--type",
        default="agent.session.action_required",
        help="event type (default agent.session.action_required)",
    )
    send.add_argument(
        "--action-type",
        default="function_call",
        help="data.required_action.type (default function_call)",
    )
    send.add_argument("--webhook-id", help="the webhook-id header (default: a fresh wh_ id)")
    send.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    send.set_defaults(handler=lambda args: asyncio.run(_send(args)))

    tools = sub.add_parser(
        "tools",
        help="print tool definitions as JSON for agent.tools",
        description="Import MODULE:ATTR (a FunctionTools registry) and print its definitions().",
    )
    tools.add_argument(
        "spec", type=_tools_spec, metavar="MODULE:ATTR", help="e.g. agentfn_asgi.demo.tools:tools"
    )
    tools.add_argument("--compact", action="store_true", help="one line of compact JSON")
    tools.set_defaults(handler=_cmd_tools)

    status = sub.add_parser(
        "status",
        help="what the store holds, for operators",
        description="Deliveries, calls by state, in-doubt and quarantined calls, oldest pending.",
    )
    status.add_argument(
        "--store", help="store URL (default: AGENTFN_STORE_URL, else sqlite:///agentfn.sqlite3)"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=lambda args: asyncio.run(_status(args)))

    recover = sub.add_parser(
        "recover",
        help="re-read a session and finish what is owed",
        description=(
            "Re-read a session (or, without --session, sweep the whole store): resubmit saved "
            "results, run calls that are owed, apply the in-doubt policy. Uses OPENAI_API_KEY "
            "and OPENAI_BASE_URL."
        ),
    )
    recover.add_argument("--session", help="session id (default: one full recovery sweep)")
    recover.add_argument(
        "--tools",
        required=True,
        type=_tools_spec,
        metavar="MODULE:ATTR",
        help="the registry to run calls with",
    )
    recover.add_argument(
        "--store", help="store URL (default: AGENTFN_STORE_URL, else sqlite:///agentfn.sqlite3)"
    )
    recover.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to let calls finish (default 60)"
    )
    recover.set_defaults(handler=lambda args: asyncio.run(_recover(args)))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ConfigurationError as exc:
        print(f"agentfn-asgi {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except AgentFnError as exc:
        print(f"agentfn-asgi {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return code
