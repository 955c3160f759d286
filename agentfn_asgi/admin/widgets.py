"""Pieces several pages share: call and delivery tables, a call's summary, the settle form.

Like the pages, they take the view's values and return escaped HTML (see :mod:`.html`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..operator import CallSummary, DeliveryView
from .html import Safe, join, render
from .layout import Context, age, call_link, outcome_badge, timestamp

__all__ = [
    "call_summary",
    "calls_table",
    "deliveries_table",
    "hidden_inputs",
    "or_dash",
    "session_link",
    "settle_form",
    "table",
    "when",
]


def when(ctx: Context, at: float) -> Safe:
    """How long ago (or, for a time to come such as an expiry, how soon), then the exact
    time."""
    ahead = at - ctx.now
    relative = f"in {age(ahead)}" if ahead >= 1 else f"{age(-ahead)} ago"
    return render(
        "<span>{relative}</span> <small>{at}</small>", relative=relative, at=timestamp(at)
    )


def hidden_inputs(*pairs: tuple[str, str]) -> Safe:
    """A form's hidden fields, one per ``(name, value)``."""
    return join(
        render('<input type="hidden" name="{n}" value="{v}">', n=name, v=value)
        for name, value in pairs
    )


def session_link(ctx: Context, session_id: str) -> Safe:
    """A session id linking to its calls."""
    href = ctx.url("/calls", {"session": session_id})
    return render('<a href="{href}">{text}</a>', href=href, text=session_id)


def or_dash(value: object) -> object:
    """``-`` for a missing value (None or empty), the value otherwise."""
    return "-" if value is None or value == "" else value


def table(css: str, headings: Sequence[str], rows: Iterable[Safe]) -> Safe:
    """A table of ``rows`` under a row of ``headings`` (``css``: its class, if any)."""
    return render(
        "<table{css}><thead><tr>{headings}</tr></thead><tbody>{rows}</tbody></table>",
        css=render(' class="{css}"', css=css) if css else "",
        headings=join(render("<th>{h}</th>", h=heading) for heading in headings),
        rows=join(rows),
    )


def calls_table(ctx: Context, calls: Sequence[CallSummary], *, empty: str) -> Safe:
    """Calls as table rows, each linking to its page (``empty`` when there are none)."""
    if not calls:
        return render('<p class="empty">{empty}</p>', empty=empty)
    rows = [
        render(
            "<tr><td>{created}</td><td>{session}</td><td><code>{turn}</code></td>"
            "<td>{call}</td><td><code>{tool}</code></td><td>{state}</td>"
            '<td class="num">{attempt}</td><td class="error">{error}</td></tr>',
            created=when(ctx, call.created_at),
            session=session_link(ctx, call.session_id),
            turn=call.turn_id,
            call=call_link(ctx, call.call_id, call.session_id),
            tool=call.tool_name,
            state=outcome_badge(call.outcome or call.state),
            attempt=call.attempt,
            error=or_dash(call.error_type or call.reason),
        )
        for call in calls
    ]
    headings = ("First seen", "Session", "Turn", "Call", "Tool", "Outcome", "Attempt")
    return table("calls", (*headings, "Error / reason"), rows)


def deliveries_table(ctx: Context, deliveries: Sequence[DeliveryView], *, empty: str) -> Safe:
    """Deliveries as table rows, with the sweep's attempts and last error."""
    if not deliveries:
        return render('<p class="empty">{empty}</p>', empty=empty)
    rows = [
        render(
            "<tr><td>{received}</td><td><code>{delivery}</code></td><td>{session}</td>"
            '<td>{resolved}</td><td class="num">{attempts}</td><td>{next}</td>'
            "<td>{error}</td></tr>",
            received=when(ctx, d.received_at),
            delivery=d.delivery_id,
            session=session_link(ctx, d.session_id),
            resolved="yes" if d.resolved else "no",
            attempts=d.attempts,
            next=timestamp(d.next_attempt_at),
            error=or_dash(d.last_error),
        )
        for d in deliveries
    ]
    headings = ("Received", "Delivery", "Session", "Resolved", "Attempts", "Next attempt")
    return table("deliveries", (*headings, "Last error"), rows)


def settle_form(ctx: Context, call: CallSummary, *, mode: str = "output", value: str = "") -> Safe:
    """The first step of settling ``call``: choose output, error or re-run (then confirm);
    ``mode`` and ``value`` refill it when it is shown again after a refusal."""
    checked = {m: Safe(" checked") if m == mode else "" for m in ("output", "error", "rerun")}
    return render(
        '<form method="post" action="{action}" class="settle">'
        '<input type="hidden" name="csrf" value="{csrf}">'
        '<input type="hidden" name="call" value="{call}">'
        '<input type="hidden" name="session" value="{session}">'
        "<fieldset><legend>Settle</legend>"
        '<label><input type="radio" name="mode" value="output"{output}> Save this output</label>'
        '<label><input type="radio" name="mode" value="error"{error}> Fail it with this error '
        "text</label>"
        '<label><input type="radio" name="mode" value="rerun"{rerun}> Re-run the handler</label>'
        '<label class="value">Output (JSON or text) or error text'
        '<textarea name="value" rows="3">{value}</textarea></label>'
        '<button type="submit">Review…</button></fieldset></form>',
        action=ctx.url("/settle"),
        csrf=ctx.csrf,
        call=call.call_id,
        session=call.session_id,
        value=value,
        **checked,
    )


def _limit_rows(ctx: Context, call: CallSummary) -> Safe:
    """Flow control: the limiter the call holds or waits for, and since when it waits; the
    call's place in its session's budget of its tool, once counted."""
    budget = (
        render("<dt>Budget</dt><dd>call {n} of the session's</dd>", n=call.counted)
        if call.counted is not None
        else Safe("")
    )
    if call.limiter is None:
        return budget
    waiting = (
        render("<dt>Waiting since</dt><dd>{since}</dd>", since=when(ctx, call.waiting_since))
        if call.waiting_since is not None
        else ""
    )
    return render(
        "<dt>Limit</dt><dd><code>{limit}</code></dd>{waiting}{budget}",
        limit=call.limiter,
        waiting=waiting,
        budget=budget,
    )


def call_summary(ctx: Context, call: CallSummary) -> Safe:
    """One call's facts as a definition list (no content)."""
    return render(
        '<dl class="summary"><dt>Tool</dt><dd><code>{tool}</code></dd>'
        "<dt>Outcome</dt><dd>{state}</dd><dt>Reason</dt><dd>{reason}</dd>"
        "<dt>Error type</dt><dd>{error}</dd>{limit}"
        "<dt>Session</dt><dd>{session}</dd><dt>Turn</dt><dd><code>{turn}</code></dd>"
        "<dt>Call</dt><dd><code>{call}</code></dd><dt>Attempt</dt><dd>{attempt}</dd>"
        "<dt>First seen</dt><dd>{created}</dd><dt>Last change</dt><dd>{updated}</dd></dl>",
        tool=call.tool_name,
        state=outcome_badge(call.outcome or call.state),
        reason=or_dash(call.reason),
        error=or_dash(call.error_type),
        limit=_limit_rows(ctx, call),
        session=session_link(ctx, call.session_id),
        turn=call.turn_id,
        call=call.call_id,
        attempt=call.attempt,
        created=when(ctx, call.created_at),
        updated=when(ctx, call.updated_at),
    )
