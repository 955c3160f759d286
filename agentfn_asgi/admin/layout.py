"""The frame every page shares (head, navigation, auto-refresh, log-out) and small widgets.

Links are absolute, built from the mount point (``root_path``), so the page works wherever
the host mounts it, with or without a trailing slash.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from .forms import DISPLAY_STATES
from .html import Safe, escape, join, render

__all__ = [
    "Context",
    "age",
    "bare_frame",
    "call_link",
    "frame",
    "offset",
    "outcome_badge",
    "state_badge",
    "timestamp",
]

_NAV = (
    ("/", "Overview"),
    ("/calls", "Calls"),
    ("/attention", "Needs attention"),
    ("/approvals", "Waiting for approval"),
)
_NAV_TAIL = (("/deliveries", "Deliveries"),)


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """One request as the renderers see it: where the page is mounted, what was asked."""

    root: str  # the mount point, "" at the server root
    route: str  # the page below the mount point: "/", "/calls"...
    query: Mapping[str, str] = field(default_factory=dict)
    now: float = 0.0
    csrf: str = ""  # the synchronizer token to put in forms ("" for bearer clients)
    logged_in: bool = False  # a login-form session (shows "Log out")
    who: str = ""  # who is signed in, as recorded with their decisions
    refresh_seconds: int = 10

    def url(self, route: str, params: Mapping[str, str] | None = None) -> str:
        """Absolute URL of ``route`` under the mount point, with ``params`` encoded."""
        path = self.root + route
        query = urllib.parse.urlencode(dict(params or {}))
        return f"{path}?{query}" if query else path

    @property
    def refreshing(self) -> bool:
        """Whether the operator turned auto-refresh on for this page (``?refresh=1``)."""
        return self.query.get("refresh") == "1"


def timestamp(at: float | None) -> Safe:
    """A Unix time as ``YYYY-MM-DD HH:MM:SS UTC`` (``-`` when missing or absurd)."""
    if at is None or not math.isfinite(at):
        return escape("-")
    try:
        moment = time.gmtime(at)
    except (OverflowError, OSError, ValueError):
        return escape("-")
    return render(
        '<time datetime="{iso}">{text}</time>',
        iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", moment),
        text=time.strftime("%Y-%m-%d %H:%M:%S UTC", moment),
    )


def age(seconds: float | None) -> str:
    """A duration for people: ``42s``, ``3m 20s``, ``2h 5m``, ``3d 4h``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def offset(seconds: float) -> str:
    """Time between two steps of one call: ``12 ms``, ``1.3 s``, then as :func:`age`."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{max(0.0, seconds) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return age(seconds)


#: An outcome's label on the page (its colour comes from ``outcome-<name>`` in style.css).
OUTCOME_LABELS = {
    "running": "running",
    "in_doubt": "in doubt",
    "submitting": "submitting",
    "succeeded": "succeeded",
    "failed": "failed",
    "stale": "stale",
    "held": "held",
    "awaiting_approval": "waiting for approval",
    "approved": "approved",
    "retrying": "retrying",
    "waiting": "waiting for a limit",
    "cancelled": "cancelled",
    "unanswered": "unanswered: left to someone else",
    "retired": "retired (no longer pending)",
}


def outcome_badge(outcome: str) -> Safe:
    """What became of a call as a coloured label, each outcome its own colour and word."""
    label = OUTCOME_LABELS.get(outcome)
    if label is None:
        return state_badge(outcome)
    return render('<span class="state outcome-{css}">{label}</span>', css=outcome, label=label)


def state_badge(state: str) -> Safe:
    """A state as a coloured label (unknown states get a neutral one, never a raw class)."""
    css = state if state in DISPLAY_STATES else "other"
    return render('<span class="state state-{css}">{state}</span>', css=css, state=state)


def call_link(ctx: Context, call_id: str, session_id: str, text: str | None = None) -> Safe:
    """A link to one call's page."""
    href = ctx.url("/call", {"id": call_id, "session": session_id})
    return render('<a href="{href}">{text}</a>', href=href, text=text or call_id)


def _nav(ctx: Context) -> Safe:
    items = [
        render(
            '<a href="{href}"{current}>{label}</a>',
            href=ctx.url(route),
            current=Safe(' aria-current="page"') if ctx.route == route else Safe(""),
            label=label,
        )
        for route, label in (*_NAV, *_NAV_TAIL)
    ]
    return join(items, " ")


def _tools(ctx: Context, refreshable: bool) -> Safe:
    parts: list[Safe] = []
    if refreshable:
        params = {k: v for k, v in ctx.query.items() if k != "refresh"}
        on = ctx.refreshing
        parts.append(
            render(
                '<a class="toggle{on}" href="{href}">Auto-refresh: {state}</a>',
                on=Safe(" on" if on else ""),
                href=ctx.url(ctx.route, params if on else {**params, "refresh": "1"}),
                state=f"on ({ctx.refresh_seconds} s)" if on else "off",
            )
        )
    if ctx.logged_in:
        parts.append(
            render(
                '<form method="post" action="{action}" class="inline">'
                '<input type="hidden" name="csrf" value="{csrf}">'
                '<button type="submit" class="link">Log out</button></form>',
                action=ctx.url("/logout"),
                csrf=ctx.csrf,
            )
        )
    return join(parts, " ")


def _document(ctx: Context, *, title: str, head: Safe, body: Safe) -> Safe:
    """A whole HTML document: the shared head (stylesheet, then ``head``), then ``body``."""
    return render(
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">{head}'
        "<title>{title} · agentfn-asgi</title>"
        '<link rel="stylesheet" href="{css}"></head>\n{body}</html>\n',
        head=head,
        title=title,
        css=ctx.url("/style.css"),
        body=body,
    )


def frame(ctx: Context, *, title: str, body: Safe, refreshable: bool = False) -> Safe:
    """A whole HTML document: head (stylesheet, optional refresh), navigation, ``body``."""
    refresh = (
        render('<meta http-equiv="refresh" content="{s}">', s=ctx.refresh_seconds)
        if refreshable and ctx.refreshing
        else Safe("")
    )
    inner = render(
        '<body><header><a class="brand" href="{home}">agentfn-asgi operator</a>'
        '<nav>{nav}</nav><div class="tools">{tools}</div></header>\n'
        "<main><h1>{title}</h1>\n{body}</main></body>",
        home=ctx.url("/"),
        nav=_nav(ctx),
        tools=_tools(ctx, refreshable),
        title=title,
        body=body,
    )
    return _document(ctx, title=title, head=refresh, body=inner)


def bare_frame(ctx: Context, *, title: str, body: Safe) -> Safe:
    """A document without navigation (the login page, refusals before logging in)."""
    inner = render(
        '<body class="bare"><main><h1>{title}</h1>\n{body}</main></body>', title=title, body=body
    )
    return _document(ctx, title=title, head=Safe(""), body=inner)
