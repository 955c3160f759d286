"""Developer commands: ``demo``, ``fake-api``, ``send``, ``tools``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..config import Config
from ..errors import AgentFnError, CLIError, CLIUsageError
from ..integrations.starlette import not_found_hint
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    load_tools,
    progress,
    seconds_type,
    secret_from,
    tools_spec,
)

__all__ = ["create_fake_session", "parse_call_spec", "register"]


def parse_call_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Parse ``NAME`` or ``NAME:{json arguments}`` (``fake-api --call``)."""
    name, sep, raw = spec.partition(":")
    name = name.strip()
    if not name:
        raise CLIUsageError(f"a call needs a tool name: {spec!r}")
    if not sep or not raw.strip():
        return name, {}
    try:
        arguments = json.loads(raw)
    except ValueError as exc:
        raise CLIUsageError(f"arguments of {name!r} are not JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise CLIUsageError(f"arguments of {name!r} must be a JSON object")
    return name, arguments


def _cmd_tools(args: argparse.Namespace) -> int:
    registry = load_tools(args.spec)
    definitions = registry.definitions()
    indent = None if args.compact else 2
    separators = (",", ":") if args.compact else None
    print(json.dumps(definitions, indent=indent, separators=separators, ensure_ascii=False))
    return EXIT_OK


#: Where ``agentfn-asgi fake-api`` listens by default.
_FAKE_ROOT = "http://127.0.0.1:8765"


def _fake_root(url: str | None) -> str | None:
    """The root URL of a running fake: ``url``, else ``OPENAI_BASE_URL`` without ``/v1``."""
    base_url = url or Config.from_env().base_url
    return base_url.rstrip("/").removesuffix("/v1") if base_url else None


async def create_fake_session(root: str, script: dict[str, Any], *, seconds: float) -> str:
    """POST a session script to the control API of the ``fake-api`` at ``root``; the id.

    :class:`CLIError` when nothing answers there or what answers is not the fake;
    :class:`CLIUsageError` when the fake refuses the script (its reason). ``seconds``: the
    request's timeout.
    """
    import httpx

    try:
        async with httpx.AsyncClient(timeout=seconds) as http:
            response = await http.post(f"{root}/_fake/sessions", json=script)
    except httpx.HTTPError as exc:
        raise CLIError(
            f"no fake answers at {root} ({exc or type(exc).__name__}): start it with "
            "agentfn-asgi fake-api, or name where it listens with --url (or OPENAI_BASE_URL)"
        ) from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    error = answer.get("error") if isinstance(answer, dict) else None
    if response.status_code == 400 and isinstance(error, str):
        raise CLIUsageError(error)
    created = answer.get("id") if isinstance(answer, dict) else None
    if response.status_code != 201 or not isinstance(created, str):
        raise CLIError(
            f"{root} is not agentfn-asgi fake-api: POST /_fake/sessions answered "
            f"{response.status_code} {response.reason_phrase} (pass the fake's URL with --url)"
        )
    return created


async def _session_for_send(event_type: str, seconds: float) -> str:
    """The session a ``send`` without ``--session`` names.

    An ``action_required`` delivery makes the app read the session: a made-up id is a 404
    it keeps trying for a minute, with warnings. So when ``OPENAI_BASE_URL`` points at
    ``agentfn-asgi fake-api``, a session with nothing pending is created there (the app
    reads it and finds nothing to do); anywhere else the user must name one. Other event
    types are not read by the app: a placeholder id is enough.
    """
    if event_type != "agent.session.action_required":
        return "sess_test"
    refusal = CLIUsageError(
        "which session? pass --session SESSION_ID (one of your project's, waiting on a "
        "function call): the app reads the session an action_required delivery names. "
        "With OPENAI_BASE_URL pointing at agentfn-asgi fake-api, send creates one there"
    )
    root = _fake_root(None)
    if root is None:
        raise refusal
    try:
        created = await create_fake_session(root, {"idle": True}, seconds=seconds)
    except CLIError:
        raise refusal from None
    progress(f"created session {created} in the fake at {root} (nothing pending)")
    return created


async def _fake_session(args: argparse.Namespace) -> int:
    calls = [parse_call_spec(spec) for spec in args.call]
    root = _fake_root(args.url) or _FAKE_ROOT
    script = {"calls": [{"name": name, "arguments": arguments} for name, arguments in calls]}
    session_id = await create_fake_session(root, script, seconds=args.timeout)
    progress(f"created session {session_id} with {len(calls)} call(s) in the fake at {root}")
    print(session_id)
    return EXIT_OK


async def _send(args: argparse.Namespace) -> int:
    import httpx

    from ..testing.deliveries import signed_delivery, webhook_event

    secret = secret_from(args.secret)
    if args.session_id is None:
        args.session_id = await _session_for_send(args.type, args.timeout)
    data: dict[str, Any] = {"id": args.session_id}
    if args.type == "agent.session.action_required":
        data["required_action"] = {"type": args.action_type}
    event = webhook_event(args.type, data)
    try:
        body, headers = signed_delivery(secret, event, msg_id=args.webhook_id)
    except AgentFnError as exc:
        raise CLIUsageError(f"cannot sign with this secret: {exc}") from exc
    progress(f"POST {args.url} ({args.type}, session {args.session_id})")
    try:
        async with httpx.AsyncClient(timeout=args.timeout) as http:
            response = await http.post(args.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise CLIError(f"could not deliver to {args.url}: {exc!r}") from exc
    print(f"{response.status_code} {response.reason_phrase}")
    if response.content:
        print(response.text)
    if response.status_code == 404:
        progress(not_found_hint(args.url))
    if response.is_redirect:
        progress(
            "a redirect is a failed delivery for a webhook sender: use the exact URL "
            f"(Location: {response.headers.get('location', '?')})"
        )
    return EXIT_OK if response.is_success else EXIT_FAILURE


async def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return await run_demo(time_limit=args.timeout, verbose=args.verbose)


async def _cmd_fake_api(args: argparse.Namespace) -> int:
    from ..testing.control import serve_fake_api
    from ..testing.fake_webhooks import webhook_backoff

    calls = [parse_call_spec(spec) for spec in args.call]
    try:
        return await serve_fake_api(
            host=args.host,
            port=args.port,
            webhook_urls=args.webhook_url,
            webhook_secret=args.secret or ",".join(Config.from_env().webhook_secrets) or None,
            api_key=args.api_key,
            webhook_retry_delays=webhook_backoff(args.webhook_retry_for),
            calls=calls,
            stop_on_sigterm=True,
        )
    except OSError as exc:  # the port is taken, the host is not ours: say it in one line
        raise CLIError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
            "(pick another --port, or 0 for any free one)"
        ) from None


def _add_call(parser: argparse.ArgumentParser, of: str, **options: Any) -> None:
    """``--call NAME:JSON`` of ``fake-api`` and ``fake-api session``."""
    example = """'get_customer:{"customer_id":"123"}'"""
    about = f"a call of {of}: {example} (repeatable)"
    parser.add_argument("--call", action="append", metavar="NAME:JSON", help=about, **options)


def register(sub: Any) -> None:
    """Add the developer commands to the ``agentfn-asgi`` subparsers."""
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

    from ..testing.control import DEV_WEBHOOK_RETRY_WINDOW, ONE_STEP_SHAPE, SESSION_SCRIPT_SHAPE

    fake = sub.add_parser(
        "fake-api",
        help="serve FakeAgentsAPI on a port for local development",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Serve an in-memory Agents API (GET/POST /v1/agents/sessions/...). Point your\n"
            "app's OPENAI_BASE_URL at it and name your webhook URL with --webhook-url.\n"
            "Create sessions with --call (one session whose step calls them in parallel),\n"
            "at any time with 'agentfn-asgi fake-api session --call NAME:JSON ...' from\n"
            "another terminal, or with POST /_fake/sessions (below). A webhook the app does not\n"
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
    _add_call(fake, "the first session", default=[])
    fake.add_argument(
        "--webhook-retry-for",
        type=seconds_type(zero=True),
        default=DEV_WEBHOOK_RETRY_WINDOW,
        metavar="SECONDS",
        help=(
            "keep retrying a webhook the app does not take, with exponential backoff, for "
            f"about this long (default {DEV_WEBHOOK_RETRY_WINDOW:g}; OpenAI retries for 72 h; "
            "0 = no retry)"
        ),
    )
    fake.set_defaults(handler=_cmd_fake_api)
    session = fake.add_subparsers(
        dest="fake_command", title="in another terminal, while it runs", metavar="session"
    ).add_parser(
        "session",
        help="start a session in a running fake-api; prints its id",
        description=(
            "Start a session in the agentfn-asgi fake-api running at --url: one step whose "
            "calls (--call, repeatable) are pending together; the fake sends its webhook. "
            "Prints the session id on stdout. For several steps, POST a script to "
            "/_fake/sessions (see fake-api --help)."
        ),
    )
    _add_call(session, "the session", required=True)
    session.add_argument(
        "--url",
        help=f"the fake's root URL (default: OPENAI_BASE_URL without /v1, else {_FAKE_ROOT})",
    )
    session.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    session.set_defaults(handler=_fake_session)

    send = sub.add_parser(
        "send",
        help="sign and POST a webhook to a URL",
        description=(
            "Sign a webhook with a whsec_ secret and POST it, like a test event. An "
            "action_required delivery names a session the app then reads: give it with "
            "--session, or let send create one with nothing pending when OPENAI_BASE_URL "
            "points at agentfn-asgi fake-api (elsewhere, --session is required)."
        ),
    )
    send.add_argument("url", help="e.g. http://127.0.0.1:8000/openai/webhooks")
    send.add_argument("--secret", help="whsec_ secret (default: OPENAI_WEBHOOK_SECRET)")
    send.add_argument(
        "--session",
        "--session-id",
        dest="session_id",
        metavar="SESSION_ID",
        help="data.id of the event (default: a new session in the fake, see above)",
    )
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
    send.set_defaults(handler=_send)

    tools = sub.add_parser(
        "tools",
        help="print tool definitions as JSON for agent.tools",
        description=(
            "Import MODULE:ATTR and print its definitions(). ATTR names a FunctionTools "
            "registry, an AgentWebhookApp (its registry is used) or a function without "
            "arguments that returns either; nothing else is called."
        ),
    )
    tools.add_argument(
        "spec", type=tools_spec, metavar="MODULE:ATTR", help="e.g. agentfn_asgi.demo.tools:tools"
    )
    tools.add_argument("--compact", action="store_true", help="one line of compact JSON")
    tools.set_defaults(handler=_cmd_tools)
