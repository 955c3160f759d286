"""``agentfn-asgi``: the command line (also ``python -m agentfn_asgi``).

Subcommands::

    demo        play a scripted session against the Starlette example, print a timeline
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
import contextlib
import datetime as dt
import importlib
import json
import os
import signal
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

__all__ = [
    "FakeControlApp",
    "build_parser",
    "load_tools",
    "main",
    "parse_call_spec",
    "serve_fake_api",
]

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
        raise CLIError(f"expected MODULE:ATTR (e.g. examples.shared_tools:tools), got {spec!r}")
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
            f"expected MODULE:ATTR (e.g. examples.shared_tools:tools), got {value!r}"
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


# -- fake-api: the fake served for local development -------------------------------------------


class FakeControlApp:
    """The fake plus a small control API under ``/_fake/`` for local development.

    - ``POST /_fake/sessions`` with ``{"steps": [[{"name", "arguments", "call_id"?}, ...]]}``
      (or ``{"calls": [...]}`` for one step) creates a session; answers ``{"id": ...}``.
    - ``GET /_fake/submissions`` lists the results the fake accepted.

    Everything else goes to the fake (``/v1/agents/sessions/...``).
    """

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/_fake/"):
            from starlette.requests import Request
            from starlette.responses import JSONResponse

            request = Request(scope, receive)
            response = await self._control(request, JSONResponse)
            await response(scope, receive, send)
            return
        await self.fake(scope, receive, send)

    async def _control(self, request: Any, response_class: Any) -> Any:
        from .testing import FakeCall

        path, method = request.url.path, request.method
        if path == "/_fake/submissions" and method == "GET":
            return response_class(
                [
                    {
                        "session_id": s.session_id,
                        "call_id": s.call_id,
                        "success": s.success,
                        "output": s.output,
                        "error": s.error,
                    }
                    for s in self.fake.submissions
                ]
            )
        if path == "/_fake/sessions" and method == "POST":
            try:
                payload = json.loads(await request.body())
                raw_steps = payload["steps"] if "steps" in payload else [payload["calls"]]
                steps = [
                    [
                        FakeCall(c["name"], dict(c.get("arguments", {})), call_id=c.get("call_id"))
                        for c in step
                    ]
                    for step in raw_steps
                ]
                session_id = self.fake.create_session(steps)
            except (ValueError, KeyError, TypeError) as exc:
                return response_class({"error": f"bad session script: {exc!r}"}, status_code=400)
            return response_class({"id": session_id}, status_code=201)
        return response_class({"error": "not found"}, status_code=404)


async def serve_fake_api(
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    webhook_urls: Sequence[str] = (),
    webhook_secret: str | None = None,
    api_key: str = "sk-test",
    calls: Sequence[tuple[str, dict[str, Any]]] = (),
    out: TextIO | None = None,
    ready: asyncio.Event | None = None,
    stop_on_sigterm: bool = False,
) -> int:
    """Serve :class:`FakeControlApp` until cancelled (Ctrl-C), logging what happens.

    With ``stop_on_sigterm`` (the CLI) a SIGTERM stops the server cleanly too.
    """
    from .testing import FakeAgentsAPI, FakeCall, serve_app

    stop = asyncio.Event()
    if stop_on_sigterm:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    stream = out or sys.stdout
    fake = FakeAgentsAPI(
        api_key=api_key, webhook_secret=webhook_secret, webhook_url=list(webhook_urls)
    )
    async with fake, serve_app(FakeControlApp(fake), host=host, port=port, lifespan="off") as root:
        base_url = root + "/v1"
        print(f"FakeAgentsAPI listening on {base_url}", file=stream)
        print(f"  OPENAI_BASE_URL={base_url}", file=stream)
        print(f"  OPENAI_API_KEY={api_key}", file=stream)
        print(f"  OPENAI_WEBHOOK_SECRET={fake.webhook_secret}", file=stream)
        targets = ", ".join(webhook_urls) or "nowhere (pass --webhook-url)"
        print(f"  webhooks go to {targets}", file=stream)
        print(
            f"  create sessions: curl -X POST {root}/_fake/sessions -H 'content-type: "
            """application/json' -d '{"calls":[{"name":"get_customer","arguments":"""
            """{"customer_id":"123"}}]}'""",
            file=stream,
            flush=True,
        )
        if calls:
            session_id = fake.create_session([[FakeCall(name, args) for name, args in calls]])
            print(
                f"session {session_id} created with {len(calls)} call(s)", file=stream, flush=True
            )
        if ready is not None:
            ready.set()
        await _log_until(stop, fake, stream)
    print("stopped", file=stream, flush=True)
    return 0


async def _log_until(stop: asyncio.Event, fake: Any, out: TextIO) -> None:
    seen_deliveries = seen_submissions = 0
    while not stop.is_set():
        for attempt in fake.deliveries[seen_deliveries:]:
            seen_deliveries += 1
            answer = attempt.status if attempt.status is not None else attempt.error
            print(f"webhook {attempt.event_type} -> {attempt.url}: {answer}", file=out, flush=True)
        for s in fake.submissions[seen_submissions:]:
            seen_submissions += 1
            text = s.output if s.success else f"error: {s.error or ''}"
            shown = text if isinstance(text, str) else json.dumps(text)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            print(f"result  {s.session_id}/{s.call_id}: {shown}", file=out, flush=True)
        await asyncio.sleep(0.05)


# -- demo and fake-api -----------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return asyncio.run(run_demo(time_limit=args.timeout, verbose=args.verbose))


def _cmd_fake_api(args: argparse.Namespace) -> int:
    calls = [parse_call_spec(spec) for spec in args.call]
    return asyncio.run(
        serve_fake_api(
            host=args.host,
            port=args.port,
            webhook_urls=args.webhook_url,
            webhook_secret=args.secret or ",".join(Config.from_env().webhook_secrets) or None,
            api_key=args.api_key,
            calls=calls,
            stop_on_sigterm=True,
        )
    )


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
            "Start FakeAgentsAPI and the Starlette example on free loopback ports (SQLite "
            "store in a temporary folder), play a session that calls get_customer, "
            "create_refund, two parallel slow_echo, an unknown tool and a failing refund, "
            "then a second step; print a timeline and a summary. Leaves nothing running."
        ),
    )
    demo.add_argument("--timeout", type=float, default=30.0, help="give up after this many seconds")
    demo.add_argument("-v", "--verbose", action="store_true", help="also show the example's logs")
    demo.set_defaults(handler=_cmd_demo)

    fake = sub.add_parser(
        "fake-api",
        help="serve FakeAgentsAPI on a port for local development",
        description=(
            "Serve an in-memory Agents API (GET/POST /v1/agents/sessions/...). Point your app's "
            "OPENAI_BASE_URL at it and name your webhook URL with --webhook-url. Create "
            "sessions with --call (one session whose step calls them in parallel), or at any "
            'time with POST /_fake/sessions {"steps": [[{"name": ..., "arguments": {...}}]]}.'
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
        "spec", type=_tools_spec, metavar="MODULE:ATTR", help="e.g. examples.shared_tools:tools"
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
