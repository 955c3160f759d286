"""``agentfn-asgi approvals``: the calls waiting for a person, and deciding one.

``approvals`` lists the waiting requests (``--json``: an array of objects with
``approval_id``, ``session_id``, ``turn_id``, ``call_id``, ``tool_name``, ``kind``
(``function``, ``mcp`` or ``computer_use``), ``server_label`` and ``name`` (MCP),
``origin`` (computer use), ``requested_at``, ``expires_at``, times in ISO 8601 UTC; with
``--content`` also ``arguments``, read from the live session: for an approval request, the
whole request). ``approvals approve ID`` and ``approvals deny ID``
take the decision through a dispatcher built like the app's (same store and namespace, same
``AGENTFN_*`` settings): exit 0 when it was taken, 1 when it was refused (decided already,
expired, unknown), 2 for a usage mistake. An approved call is run by the app's replicas,
which poll for approved calls every second; a denied one is answered at once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import getpass
import json
import time
from dataclasses import asdict
from typing import Any

from ..dispatch.approvals import ApprovalView
from ..errors import ApprovalError, CLIError
from .calls import operator
from .common import EXIT_OK, STORE_HELP, ago, show, table

__all__ = ["approval_json", "format_approvals", "register"]


def iso(at: float | None) -> str | None:
    """``at`` (Unix seconds) as ISO 8601 in UTC, or None."""
    if at is None:
        return None
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat().replace("+00:00", "Z")


def approval_json(view: ApprovalView) -> dict[str, Any]:
    """One request as the ``--json`` output gives it (times ISO 8601 UTC)."""
    data = asdict(view)
    for name in ("requested_at", "expires_at", "decided_at"):
        data[name] = iso(data[name])
    return data


def format_approvals(views: list[ApprovalView], *, now: float) -> str:
    """One line per waiting request: id, kind, tool (an MCP request's
    ``mcp:{server_label}/{name}``, a computer-use request's ``computer_use:{origin}``),
    session, call, asked, expires in."""
    if not views:
        return "no calls wait for approval"
    header = ("APPROVAL", "KIND", "TOOL", "SESSION", "CALL", "ASKED", "EXPIRES IN")
    rows = [
        (
            v.approval_id,
            v.kind,
            v.tool_name,
            v.session_id,
            v.call_id,
            ago(v.requested_at, now),
            _left(v.expires_at - now),
        )
        for v in views
    ]
    return table(header, rows)


def _left(seconds: float) -> str:
    if seconds <= 0:
        return "expired"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


async def _list(args: argparse.Namespace) -> int:
    arguments: dict[str, str | None] = {}
    async with operator(args.store, api="optional" if args.content else "none") as view:
        found = await view.approvals(limit=args.limit)
        for v in found if args.content else ():
            # Not stored (they may hold personal data): read from the live session.
            got = await view.approval(v.approval_id)
            arguments[v.approval_id] = got[1].arguments if got is not None else None
        by_kind, _ = await view.unanswered() if not args.json else ({}, None)
    if args.json:
        items = [approval_json(v) for v in found]
        for item in items if args.content else ():
            item["arguments"] = arguments[item["approval_id"]]
        print(json.dumps(items, indent=2, ensure_ascii=False))
        return EXIT_OK
    text = format_approvals(found, now=time.time())
    for approval_id, given in arguments.items():
        unread = "(unread: it needs OPENAI_API_KEY, and the session must still wait)"
        text += f"\n{approval_id}  arguments {unread if given is None else given}"
    left = by_kind.get("mcp", 0) + by_kind.get("computer_use", 0)
    if left:
        text += (
            f"\n\n{left} MCP or computer-use request{'' if left == 1 else 's'} left unanswered"
            " here (no actions= policy, or it leaves them): someone else must answer;"
            " agentfn-asgi calls --state unanswered"
        )
    show(text)
    return EXIT_OK


async def _decide(args: argparse.Namespace, *, approve: bool) -> int:
    who = args.who or _user()
    async with operator(args.store, api="required") as view:
        try:
            decided = await view.decide(
                args.approval_id,
                approve=approve,
                by=who,
                via="cli",
                reason=None if approve else args.reason,
            )
        except ApprovalError as exc:
            raise CLIError(f"refused: {exc}") from None
    verb = "approved" if approve else "denied"
    then = "the app runs it within a few seconds" if approve else "the model was told"
    show(
        f"{verb}: {decided.approval_id} ({decided.tool_name}, call {decided.call_id}) "
        f"by {who}; {then}"
    )
    return EXIT_OK


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment
        return "cli"


def register(sub: Any) -> None:
    """Add ``approvals`` (with ``approve`` and ``deny``)."""
    approvals = sub.add_parser(
        "approvals",
        help="calls waiting for a person's approval; approve or deny one",
        description=(
            "Without a subcommand: the requests waiting for a decision, soonest expiry "
            "first. Exit codes of approve/deny: 0 decided, 1 refused (decided already, "
            "expired, unknown), 2 usage mistake."
        ),
    )
    approvals.add_argument("--limit", type=int, default=200, help="at most this many")
    approvals.add_argument("--json", action="store_true", help="a JSON array of objects")
    approvals.add_argument(
        "--content",
        action="store_true",
        help="also each call's arguments, read from its live session (needs OPENAI_API_KEY)",
    )
    approvals.add_argument("--store", help=STORE_HELP)
    approvals.set_defaults(handler=_list)
    which = approvals.add_subparsers(dest="approvals_command", metavar="SUBCOMMAND")

    for name, approve, what in (
        ("approve", True, "approve a waiting call: the app runs it once, within seconds"),
        ("deny", False, "deny a waiting call: the model gets a failure"),
    ):
        decide = which.add_parser(name, help=what)
        decide.add_argument("approval_id", metavar="APPROVAL_ID")
        if not approve:
            decide.add_argument("--reason", metavar="TEXT", help="why, as the model will read it")
        decide.add_argument(
            "--as", dest="who", metavar="NAME", help="who decides (default: your user name)"
        )
        decide.add_argument("--store", help=STORE_HELP)
        decide.set_defaults(handler=functools.partial(_decide, approve=approve))
