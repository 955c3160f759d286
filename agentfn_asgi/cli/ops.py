"""Operator commands: ``status``, ``recover``."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ..config import Config
from ..operator import Overview
from ..store import store_location
from .calls import operator
from .common import (
    EXIT_OK,
    STORE_HELP,
    ago,
    check_store_exists,
    dispatching,
    load_tools,
    progress,
    show,
    stamp,
    tools_spec,
)

__all__ = ["format_overview", "register"]


def format_overview(overview: Overview, *, now: float | None = None) -> str:
    """The human-readable ``status`` report: counts, then the calls that need a person and
    the deliveries the sweep keeps failing on, by id, with the command that deals with each."""
    now = time.time() if now is None else now
    counts = {state: n for state, n in overview.calls_by_state.items() if n}
    states = ", ".join(f"{state} {n}" for state, n in counts.items()) or "none"
    oldest = "none"
    if overview.oldest_pending_at is not None:
        at = overview.oldest_pending_at
        oldest = f"{stamp(at)} UTC ({ago(at, now)})"
    unanswered = "0"
    if overview.unanswered:
        kinds = overview.unanswered_summary(lambda at: f"oldest {ago(at, now)}")
        unanswered = f"{overview.unanswered} ({kinds})"
    rows = [
        ("store", f"{overview.store}" + ("" if overview.healthy else " (UNAVAILABLE)")),
        ("deliveries", f"{overview.deliveries} ({overview.unresolved_deliveries} unresolved)"),
        ("calls", f"{sum(counts.values())} ({states})"),
        ("results", f"{overview.successes} succeeded, {overview.failures} failed (submitted)"),
        ("in doubt", str(overview.calls_by_state.get("in_doubt", 0))),
        ("quarantined", str(overview.calls_by_state.get("quarantined", 0))),
        ("approvals", f"{overview.approvals_waiting} waiting (agentfn-asgi approvals)"),
        ("retrying", str(overview.calls_by_state.get("retry_scheduled", 0))),
        ("waiting", _waiting(overview)),
        ("paused", _paused(overview)),
        ("unanswered", unanswered),
        ("oldest pending", oldest),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if overview.needs_attention:
        lines += ["", "needs a person (agentfn-asgi calls show CALL_ID --session SESSION):"]
        for call in overview.needs_attention:
            why = f": {call.reason}" if call.reason else ""
            lines.append(
                f"  {call.state:<11} {call.session_id}  {call.call_id}  {call.tool_name}"
                f"  attempt {call.attempt}{why}"
            )
    if overview.unanswered:
        lines += [
            "",
            "pending actions nobody here answers: someone else must answer them, or give the"
            " app a policy or hook (agentfn-asgi calls --state unanswered)",
        ]
    if overview.paused_on_budget:
        lines += ["", "paused on their spending limit (budget_reached; USD cents):"]
        for paused in overview.paused_on_budget:
            lines.append(
                f"  {paused.session_id}  consumed {_cents(paused.consumed)}"
                f" of {_cents(paused.limit)}"
            )
    if overview.failing_deliveries:
        lines += ["", "the recovery sweep keeps failing on (agentfn-asgi deliveries --unresolved):"]
        for delivery in overview.failing_deliveries:
            lines.append(
                f"  {delivery.delivery_id}  session {delivery.session_id}  failed "
                f"{delivery.attempts}x: {delivery.last_error}"
            )
    return "\n".join(lines)


def _paused(overview: Overview) -> str:
    """How many sessions are paused on their spending limit, when that is known."""
    if overview.paused_on_budget is None:
        return "unknown: sessions paused on their spending limit (needs OPENAI_API_KEY)"
    return f"{len(overview.paused_on_budget)} sessions on their spending limit"


def _cents(value: int | None) -> str:
    return "?" if value is None else str(value)


def _waiting(overview: Overview) -> str:
    """Calls waiting for their tool's limit, per tool when there are any."""
    if not overview.calls_waiting:
        return "0"
    tools = ", ".join(f"{name} {n}" for name, n in overview.waiting_by_tool.items())
    return f"{overview.calls_waiting} for a tool's limit ({tools})"


async def _status(args: argparse.Namespace) -> int:
    # With an API key, the overview also reads which sessions are paused on their budget.
    async with operator(args.store, api="optional") as view:
        overview = await view.overview()
    if args.json:
        print(json.dumps(asdict(overview), indent=2))
    else:
        show(format_overview(overview))
    return EXIT_OK


async def _recover(args: argparse.Namespace) -> int:
    registry = load_tools(args.tools)
    config = Config.from_env()
    url = args.store or config.store_url
    store = config.open_store(url)
    check_store_exists(store)
    # No webhook app is needed to recover (nothing is received), hence no webhook secret:
    # the dispatcher alone reads sessions, runs what is owed and submits saved results,
    # with the same AGENTFN_* settings and worker lane as the app.
    try:
        async with dispatching(
            config,
            registry,
            store,
            why="recover reads the sessions through the Agents API",
            drain_timeout=args.drain_timeout,
            announce=f"store {store_location(store, url)}",
        ) as dispatcher:
            if args.session:
                progress(f"reading session {args.session} and finishing what is owed...")
            else:
                progress("running one recovery sweep over the whole store...")
            await dispatcher.recover(args.session)
        calls = await store.calls_for_session(args.session) if args.session else []
    finally:
        await store.close()
    for record in calls:
        key, state = record.key, record.state.value
        show(f"{key.call_id}  {record.tool_name}  {state}  attempt {record.attempt}")
    if args.session and not calls:
        print(f"no calls recorded for session {args.session}")
    print("recovery done")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add the operator commands to the ``agentfn-asgi`` subparsers."""
    status = sub.add_parser(
        "status",
        help="what the store holds, for operators",
        description=(
            "Deliveries, calls by state, successes and failures, the in-doubt and quarantined "
            "calls by id, the deliveries the recovery sweep keeps failing on, oldest pending."
        ),
    )
    status.add_argument("--store", help=STORE_HELP)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_status)

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
        type=tools_spec,
        metavar="MODULE:ATTR",
        help="the registry to run calls with",
    )
    recover.add_argument("--store", help=STORE_HELP)
    recover.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to let calls finish (default 60)"
    )
    recover.set_defaults(handler=_recover)
