"""Operator commands over the calls: ``calls``, ``calls show``, ``calls settle``, ``deliveries``.

They read through :class:`~agentfn_asgi.operator.Operator`, as the operator page does, so a
terminal and a browser show the same facts. Settling goes through a dispatcher built like
the app's (same ``AGENTFN_*`` settings, same store namespace): the result is saved, then
submitted once under its stable key; ``--rerun`` runs the handler with the next attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, Literal, get_args

from ..config import Config
from ..errors import CLIError, CLIUsageError
from ..operator import (
    CallDetail,
    CallFilter,
    CallSummary,
    DeliveryView,
    DisplayState,
    Operator,
    json_or_text,
    parse_duration,
)
from ..store import store_location
from ..tools import FunctionTools
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    STORE_HELP,
    ago,
    check_store_exists,
    dispatching,
    load_tools,
    progress,
    show,
    stamp,
    store_url,
    table,
    tools_spec,
)

__all__ = ["format_call", "format_calls", "register"]


@contextlib.asynccontextmanager
async def operator(
    store: str | None,
    *,
    api: Literal["none", "optional", "required"] = "none",
    tools: str | None = None,
) -> AsyncIterator[Operator]:
    """An :class:`Operator` over the configured store, and, unless ``api`` is ``none``, over
    a started dispatcher (Agents API client, the registry of ``tools``) that is drained
    after. ``optional``: without an API key, go on without it (what needs it is left out)."""
    config = Config.from_env()
    url = store_url(store)
    the_store = config.open_store(url)
    check_store_exists(the_store)
    location = store_location(the_store, url)
    try:
        if api == "none" or (api == "optional" and not config.api_key):
            await the_store.open()
            yield Operator(the_store, location=location)
            return
        async with dispatching(
            config,
            load_tools(tools) if tools else FunctionTools(),
            the_store,
            why="settling submits the result through the Agents API",
            drain_timeout=300.0,
        ) as dispatcher:
            yield Operator(the_store, dispatcher=dispatcher, location=location)
    finally:
        await the_store.close()


# -- formatting ------------------------------------------------------------------------------


def format_calls(calls: list[CallSummary], *, now: float) -> str:
    """One line per call: session, turn, call, tool, state, attempt, age, error type."""
    if not calls:
        return "no calls"
    header = ("SESSION", "TURN", "CALL", "TOOL", "STATE", "ATTEMPT", "AGE", "ERROR")
    rows = [
        (
            c.session_id,
            c.turn_id or "-",  # a turn-less action (an environment connection)
            c.call_id,
            c.tool_name,
            c.state,
            str(c.attempt),
            ago(c.created_at, now),
            _why(c),
        )
        for c in calls
    ]
    return table(header, rows)


def _why(c: CallSummary) -> str:
    """The last column of a call's line: its error type, why it is held, cancelled or left
    unanswered (with the kind of action), or the limit it waits for."""
    if c.state == "unanswered":
        return f"{c.kind}: {c.reason}" if c.reason else c.kind
    return c.error_type or c.reason or (f"limit {c.limiter}" if c.waiting_since else "")


def format_call(detail: CallDetail, *, now: float) -> str:
    """One call: its summary, then its history as a timeline (and content if asked)."""
    c = detail.summary
    lines = [
        f"call      {c.call_id}",
        f"session   {c.session_id}",
        f"turn      {c.turn_id}",
        f"tool      {c.tool_name}",
        f"state     {c.state} (attempt {c.attempt})",
        f"first     {stamp(c.created_at)} UTC ({ago(c.created_at, now)})",
    ]
    if c.kind != "function":
        lines.insert(4, f"kind      {c.kind}")
    if c.state == "unanswered":
        lines.append(
            f"waits     since {ago(c.created_at, now)}, for someone else to answer it"
            " (nobody here does: no policy or hook, or the policy leaves it)"
        )
    if c.error_type:
        lines.append(f"error     {c.error_type}")
    if c.reason:
        lines.append(f"{'held' if c.state == 'quarantined' else 'why':<9} {c.reason}")
    if c.limiter is not None:
        lines.append(f"limit     {c.limiter}")
    if c.waiting_since is not None:
        since = f"{stamp(c.waiting_since)} UTC ({ago(c.waiting_since, now)})"
        lines.append(f"waiting   since {since}, for a slot of its limit")
    if c.counted is not None:
        lines.append(f"budget    call {c.counted} counted against its session's budget")
    if detail.approval is not None:
        lines += _approval_lines(detail)
    lines.append("")
    for event in detail.history:
        who = f" by {event.owner}" if event.owner else ""
        what = f": {event.detail}" if event.detail else ""
        lines.append(f"{stamp(event.at)}  {event.kind:<13} attempt {event.attempt}{who}{what}")
    if not detail.history:
        lines.append("(no history recorded)")
    if detail.settleable:
        lines += [
            "",
            f"settle it: agentfn-asgi calls settle {c.call_id} --session {c.session_id}"
            " (--output JSON_OR_TEXT | --error TEXT | --rerun --tools MODULE:ATTR)",
        ]
    if detail.arguments is not None:
        lines += ["", f"arguments {detail.arguments}"]
    if detail.output is not None:
        lines += ["", f"output    {detail.output}"]
    return "\n".join(lines)


def _approval_lines(detail: CallDetail) -> list[str]:
    """The call's approval request: id, argument digest, asked and expiry, the decision."""
    a = detail.approval
    assert a is not None
    lines = [
        f"approval  {a.approval_id} (arguments sha256 {a.digest[:16]}...)",
        f"asked     {stamp(a.requested_at)} UTC, expires {stamp(a.expires_at)} UTC",
    ]
    if a.decision is None:
        lines.append(
            f"decide it: agentfn-asgi approvals approve {a.approval_id}"
            f" | agentfn-asgi approvals deny {a.approval_id} --reason TEXT"
        )
    else:
        at = f" at {stamp(a.decided_at)} UTC" if a.decided_at is not None else ""
        by = f" by {a.decided_by}" if a.decided_by else ""
        via = f" via {a.decided_via}" if a.decided_via else ""
        why = f": {a.reason}" if a.reason else ""
        lines.append(f"decided   {a.decision}{by}{via}{at}{why}")
    return lines


def _delivery_line(d: DeliveryView, now: float) -> str:
    state = "resolved" if d.resolved else "unresolved"
    tail = f", failed {d.attempts}x: {d.last_error}" if d.attempts else ""
    return f"{d.delivery_id}  {d.session_id}  {state}  {ago(d.received_at, now)}{tail}"


# -- commands --------------------------------------------------------------------------------


async def _calls(args: argparse.Namespace) -> int:
    now = time.time()
    since = None
    if args.since:
        try:
            since = now - parse_duration(args.since)
        except ValueError as exc:
            raise CLIUsageError(f"--since: {exc}") from None
    query = CallFilter(
        state=args.state,
        session_id=args.session,
        tool_name=args.tool,
        since=since,
        limit=args.limit,
    )
    async with operator(args.store) as view:
        page = await view.calls(query)
    if args.json:
        print(json.dumps([asdict(c) for c in page.calls], indent=2, ensure_ascii=False))
    else:
        show(format_calls(list(page.calls), now=now))
        if page.next_cursor:
            progress(f"(more than {args.limit}: raise --limit or narrow the filters)")
    return EXIT_OK


async def _show(args: argparse.Namespace) -> int:
    api: Literal["none", "optional"] = "optional" if args.content else "none"
    async with operator(args.store, api=api) as view:
        found = view.call(args.call_id, session_id=args.session, content=args.content)
        detail = await _looked_up(found)
    if args.json:
        print(json.dumps(asdict(detail), indent=2, ensure_ascii=False))
    else:
        show(format_call(detail, now=time.time()))
    return EXIT_OK


async def _settle(args: argparse.Namespace) -> int:
    if args.rerun and not args.tools:
        raise CLIUsageError("--rerun runs the handler: name its registry with --tools MODULE:ATTR")
    output: Any = None
    if args.output is not None:
        try:
            output = json_or_text(args.output)[1]
        except ValueError as exc:  # JSON nested too deeply to send
            raise CLIUsageError(f"--output: {exc}") from None
    async with operator(args.store, api="required", tools=args.tools) as view:
        outcome = await _looked_up(
            view.settle(
                args.call_id,
                session_id=args.session,
                output=output,
                error=args.error,
                rerun=args.rerun,
            )
        )
        show(f"{outcome.status}: {outcome.message}")
    return EXIT_FAILURE if outcome.status == "refused" else EXIT_OK


async def _deliveries(args: argparse.Namespace) -> int:
    async with operator(args.store) as view:
        found = await view.deliveries(unresolved=args.unresolved, limit=args.limit)
    if args.json:
        print(json.dumps([asdict(d) for d in found], indent=2))
    elif not found:
        print("no deliveries")
    else:
        now = time.time()
        show("\n".join(_delivery_line(d, now) for d in found))
    return EXIT_OK


async def _looked_up(work: Any) -> Any:
    """Await ``work``; an unknown or ambiguous call id is the user's to fix (exit 1)."""
    try:
        return await work
    except (LookupError, ValueError) as exc:
        raise CLIError(str(exc).strip("'\"")) from None


def register(sub: Any) -> None:
    """Add ``calls`` (with ``show`` and ``settle``) and ``deliveries``."""
    calls = sub.add_parser(
        "calls",
        help="list calls; show one's history; settle a held or in-doubt one",
        description=(
            "Without a subcommand: the calls in the store, newest first, one line each "
            "(session, turn, call, tool, state, attempt, age, error type)."
        ),
    )
    calls.add_argument("--state", choices=get_args(DisplayState), help="only calls in this state")
    calls.add_argument("--session", help="only this session's calls")
    calls.add_argument("--tool", help="only this tool's calls")
    calls.add_argument("--since", metavar="DURATION", help="first seen within, e.g. 15m, 2h, 3d")
    calls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    calls.add_argument("--json", action="store_true", help="a JSON array of objects")
    calls.add_argument("--store", help=STORE_HELP)
    calls.set_defaults(handler=_calls)
    which = calls.add_subparsers(dest="calls_command", metavar="SUBCOMMAND")

    show = which.add_parser("show", help="one call's history as a timeline")
    show.add_argument("call_id", metavar="CALL_ID")
    show.add_argument("--session", help="the session, when several have this call id")
    show.add_argument(
        "--content",
        action="store_true",
        help="also the saved output and, while pending, the arguments (may be personal data)",
    )
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--store", help=STORE_HELP)
    show.set_defaults(handler=_show)

    settle = which.add_parser(
        "settle",
        help="answer or re-run a held, quarantined or in-doubt call",
        description=(
            "Only for calls held for an operator (quarantined) or in doubt (lease expired, "
            "no result): the result is saved, then submitted once under its stable key; "
            "--rerun runs the handler again with the next attempt. Running, saved, "
            "submitted and stale calls are refused. Uses OPENAI_API_KEY."
        ),
    )
    settle.add_argument("call_id", metavar="CALL_ID")
    settle.add_argument("--session", help="the session, when several have this call id")
    how = settle.add_mutually_exclusive_group(required=True)
    how.add_argument("--output", metavar="JSON_OR_TEXT", help="the result the model gets")
    how.add_argument("--error", metavar="TEXT", help="a failure the model reads as written")
    how.add_argument("--rerun", action="store_true", help="run the handler again")
    settle.add_argument(
        "--tools", type=tools_spec, metavar="MODULE:ATTR", help="the registry (needed by --rerun)"
    )
    settle.add_argument("--store", help=STORE_HELP)
    settle.set_defaults(handler=_settle)

    deliveries = sub.add_parser(
        "deliveries",
        help="recorded webhook deliveries, newest first",
        description="Recorded deliveries; the sweep's failed attempts and last error on each.",
    )
    deliveries.add_argument("--unresolved", action="store_true", help="only unresolved ones")
    deliveries.add_argument("--limit", type=int, default=50, help="at most this many")
    deliveries.add_argument("--json", action="store_true", help="machine-readable output")
    deliveries.add_argument("--store", help=STORE_HELP)
    deliveries.set_defaults(handler=_deliveries)
