"""The pages, rendered from the operator view's values (pure: values in, escaped HTML out).

Every value that came from the store or the API (ids, tool names, reasons, errors, content)
goes through :func:`~agentfn_asgi.admin.html.render`; the templates are literals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..operator import OUTCOMES, CallDetail, CallPage, DeliveryView, Overview
from .approval_pages import approval_section
from .forms import DISPLAY_STATES, MAX_LIMIT, CallQuery, SettleRequest
from .html import Safe, join, render
from .layout import (
    Context,
    age,
    bare_frame,
    call_link,
    frame,
    offset,
    outcome_badge,
    timestamp,
)
from .widgets import (
    call_summary,
    calls_table,
    deliveries_table,
    hidden_inputs,
    or_dash,
    session_link,
    settle_form,
    table,
    when,
)

__all__ = [
    "SETTLED_NOTICES",
    "attention_page",
    "call_page",
    "calls_page",
    "confirm_page",
    "deliveries_page",
    "login_page",
    "message_page",
    "overview_page",
]

#: What the call page says after a settle (the redirect carries only the key).
SETTLED_NOTICES = {
    "submitted": "Settled: the result was saved and submitted to the Agents API.",
    "saved": "Settled: the result was saved; the dispatcher submits it next.",
    "running": "Re-run started with the next attempt; reload to follow it.",
}
# Content is shown as it is stored, up to this many characters (a page, not a download).
_CONTENT_LIMIT = 65_536


# -- overview ----------------------------------------------------------------------------


def _unanswered_note(ctx: Context, overview: Overview) -> str:
    """Under the count of unanswered actions: their kinds and the oldest one's age, and that
    someone else must answer them (nobody here does)."""
    if not overview.unanswered:
        return "Every pending action is answered here."
    kinds = overview.unanswered_summary(lambda at: f"the oldest waits for {age(ctx.now - at)}")
    return f"{kinds}. Someone else must answer them: nothing here does."


def overview_page(ctx: Context, overview: Overview) -> Safe:
    """Health, counts by state, and what needs an operator."""
    counts = dict.fromkeys(OUTCOMES, 0) | dict(overview.outcomes)
    count_rows = join(
        render(
            '<tr><td>{badge}</td><td class="num"><a href="{href}">{n}</a></td></tr>',
            badge=outcome_badge(outcome),
            href=ctx.url("/calls", {"outcome": outcome}),
            n=n,
        )
        for outcome, n in counts.items()
    )
    oldest = (
        age(ctx.now - overview.oldest_pending_at)
        if overview.oldest_pending_at is not None
        else "none"
    )
    body = render(
        '<section class="cards">'
        '<div class="card {health_css}"><h2>Store</h2><p class="big">{health}</p>'
        '<p class="muted"><code>{store}</code></p></div>'
        '<div class="card"><h2>Deliveries</h2><p class="big">{deliveries}</p>'
        '<p><a href="{unresolved_href}">{unresolved} unresolved</a></p></div>'
        '<div class="card"><h2>Results</h2><p class="big">{successes} succeeded</p>'
        "<p>{failures} failed</p></div>"
        '<div class="card"><h2>Oldest pending call</h2><p class="big">{oldest}</p></div>'
        '<div class="card {unanswered_css}"><h2>Unanswered actions</h2>'
        '<p class="big"><a href="{unanswered_href}">{unanswered}</a></p>'
        "<p>{unanswered_note}</p></div>"
        "</section>"
        '<section><h2>Calls by outcome <span class="count">{n_calls}</span></h2>'
        '<table class="counts"><tbody>{counts}</tbody></table></section>'
        '<section><h2>Needs attention <span class="count">{n_attention}</span></h2>{attention}'
        "</section>"
        "<section><h2>Deliveries the sweep keeps failing on</h2>{failing}</section>"
        "{paused}",
        health_css="ok" if overview.healthy else "bad",
        health="Healthy" if overview.healthy else "Unhealthy",
        store=overview.store,
        deliveries=overview.deliveries,
        unresolved_href=ctx.url("/deliveries"),
        unresolved=overview.unresolved_deliveries,
        successes=overview.successes,
        failures=overview.failures,
        oldest=oldest,
        unanswered_css="warn" if overview.unanswered else "",
        unanswered_href=ctx.url("/calls", {"outcome": "unanswered"}),
        unanswered=overview.unanswered,
        unanswered_note=_unanswered_note(ctx, overview),
        counts=count_rows,
        n_calls=sum(counts.values()),
        n_attention=len(overview.needs_attention),
        attention=calls_table(ctx, overview.needs_attention, empty="Nothing needs an operator."),
        failing=deliveries_table(ctx, overview.failing_deliveries, empty="None."),
        paused=_paused_sessions(ctx, overview),
    )
    return frame(ctx, title="Overview", body=body, refreshable=True)


def _paused_sessions(ctx: Context, overview: Overview) -> Safe:
    """Sessions paused on their spending limit (``budget_reached``), with what they spent;
    nothing when the page cannot know (no API key)."""
    paused = overview.paused_on_budget
    if paused is None:
        return Safe("")
    rows = (
        render(
            '<tr><td>{session}</td><td class="num">{consumed}</td><td class="num">{limit}</td>'
            "</tr>",
            session=session_link(ctx, p.session_id),
            consumed=or_dash(None if p.consumed is None else str(p.consumed)),
            limit=or_dash(None if p.limit is None else str(p.limit)),
        )
        for p in paused
    )
    headings = ("Session", "Consumed (¢)", "Limit (¢)")
    listed = table("", headings, rows) if paused else Safe("<p>None.</p>")
    return render(
        '<section><h2>Sessions paused on their spending limit <span class="count">{n}</span>'
        "</h2>{table}</section>",
        n=len(paused),
        table=listed,
    )


# -- calls -------------------------------------------------------------------------------


def _options(fields: Mapping[str, str], name: str, values: Iterable[str]) -> Safe:
    return join(
        render(
            '<option value="{v}"{selected}>{v}</option>',
            v=value,
            selected=Safe(" selected") if fields.get(name) == value else Safe(""),
        )
        for value in values
    )


def _filter_form(ctx: Context, fields: Mapping[str, str]) -> Safe:
    keep_refresh = (
        Safe('<input type="hidden" name="refresh" value="1">') if ctx.refreshing else Safe("")
    )
    return render(
        '<form method="get" action="{action}" class="filters">'
        '<label>State <select name="state"><option value="">any</option>{states}</select></label>'
        '<label>Outcome <select name="outcome"><option value="">any</option>{outcomes}</select>'
        "</label>"
        '<label>Session <input name="session" value="{session}"></label>'
        '<label>Tool <input name="tool" value="{tool}"></label>'
        '<label>Since <input name="since" value="{since}" placeholder="15m, 2h, 3d" size="7">'
        "</label>"
        '<label>Limit <input name="limit" type="number" min="1" max="{max}" value="{limit}">'
        "</label>{keep_refresh}"
        '<button type="submit">Filter</button> <a href="{action}">Clear</a></form>',
        action=ctx.url("/calls"),
        states=_options(fields, "state", DISPLAY_STATES),
        outcomes=_options(fields, "outcome", OUTCOMES),
        session=fields.get("session", ""),
        tool=fields.get("tool", ""),
        since=fields.get("since", ""),
        max=MAX_LIMIT,
        limit=fields.get("limit", ""),
        keep_refresh=keep_refresh,
    )


def calls_page(
    ctx: Context,
    fields: Mapping[str, str],
    *,
    query: CallQuery | None = None,
    page: CallPage | None = None,
    error: str | None = None,
) -> Safe:
    """The filter form, then a page of calls newest first (or why the filters were refused)."""
    parts = [_filter_form(ctx, fields)]
    if error is not None:
        parts.append(render('<p class="error" role="alert">{error}</p>', error=error))
    if query is not None and page is not None:
        parts.append(calls_table(ctx, page.calls, empty="No call matches these filters."))
        links: list[Safe] = []
        extra = {"refresh": "1"} if ctx.refreshing else {}
        if query.cursor is not None:
            href = ctx.url("/calls", {**query.params(), **extra})
            links.append(render('<a href="{href}">First page</a>', href=href))
        if page.next_cursor is not None:
            href = ctx.url("/calls", {**query.params(cursor=page.next_cursor), **extra})
            links.append(render('<a href="{href}" rel="next">Next page</a>', href=href))
        parts.append(render('<p class="pager">{links}</p>', links=join(links, " · ")))
    return frame(ctx, title="Calls", body=join(parts), refreshable=True)


# -- one call ----------------------------------------------------------------------------


def _content(ctx: Context, detail: CallDetail, shown: bool) -> Safe:
    params = {"id": detail.summary.call_id, "session": detail.summary.session_id}
    if not shown:
        return render(
            '<p class="muted">Arguments and output are hidden: they may hold personal data. '
            '<a href="{href}">Show content</a></p>',
            href=ctx.url("/call", {**params, "content": "1"}),
        )

    def block(label: str, text: str | None) -> Safe:
        if text is None:
            return render('<h3>{label}</h3><p class="muted">none stored</p>', label=label)
        cut = text[:_CONTENT_LIMIT]
        note = (
            f"(first {_CONTENT_LIMIT:,} of {len(text):,} characters)"
            if len(text) > len(cut)
            else ""
        )
        return render(
            '<h3>{label} <small>{note}</small></h3><pre class="content">{text}</pre>',
            label=label,
            note=note,
            text=cut,
        )

    return render(
        '{arguments}{output}<p><a href="{href}">Hide content</a></p>',
        arguments=block("Arguments", detail.arguments),
        output=block("Output", detail.output),
        href=ctx.url("/call", params),
    )


def call_page(
    ctx: Context,
    detail: CallDetail,
    *,
    content: bool,
    notice: str | None,
    refused: SettleRequest | None = None,
    error: str | None = None,
) -> Safe:
    """One call: its summary, its history as a timeline, content on request, settling; a
    ``refused`` settle request is shown again in the form, with the ``error`` saying why."""
    call = detail.summary
    first = detail.history[0].at if detail.history else call.created_at
    steps = (
        render(
            '<tr><td>{at}</td><td class="num">+{offset}</td><td><code>{kind}</code></td>'
            '<td class="num">{attempt}</td><td>{owner}</td><td>{detail}</td></tr>',
            at=timestamp(event.at),
            offset=offset(event.at - first),
            kind=event.kind,
            attempt=event.attempt,
            owner=or_dash(event.owner),
            detail=or_dash(event.detail),
        )
        for event in detail.history
    )
    headings = ("At", "After", "Event", "Attempt", "Owner", "Detail")
    timeline = (
        table("timeline", headings, steps)
        if detail.history
        else Safe('<p class="empty">No history recorded.</p>')
    )
    refill = {} if refused is None else {"mode": refused.mode, "value": refused.value}
    settle = (
        render(
            '<section id="settle"><h2>Settle this call</h2>{error}{form}</section>',
            error=render('<p class="error" role="alert">{e}</p>', e=error) if error else "",
            form=settle_form(ctx, call, **refill),
        )
        if detail.settleable
        else Safe("")
    )
    body = render(
        "{notice}{summary}{approval}<section><h2>Timeline</h2>{timeline}</section>"
        "<section><h2>Content</h2>{content}</section>{settle}",
        notice=render('<p class="notice" role="status">{n}</p>', n=notice) if notice else "",
        summary=call_summary(ctx, call),
        approval=approval_section(ctx, detail),
        timeline=timeline,
        content=_content(ctx, detail, content),
        settle=settle,
    )
    return frame(ctx, title=f"Call {call.call_id}", body=body, refreshable=True)


# -- needs attention ---------------------------------------------------------------------


def _attention_cards(ctx: Context, page: CallPage, state: str, empty: str) -> Safe:
    cards = [
        render(
            '<article class="card call"><p>{badge} <code>{tool}</code> · call {link} · '
            "session {session} · attempt {attempt} · first seen {ago}</p>"
            '<p class="reason">{reason}</p>{form}</article>',
            badge=outcome_badge(call.outcome or call.state),
            tool=call.tool_name,
            link=call_link(ctx, call.call_id, call.session_id),
            session=session_link(ctx, call.session_id),
            attempt=call.attempt,
            ago=when(ctx, call.created_at),
            reason=or_dash(call.reason or call.error_type),
            form=settle_form(ctx, call),
        )
        for call in page.calls
    ]
    if not cards:
        return render('<p class="empty">{empty}</p>', empty=empty)
    more = (
        render(
            '<p class="pager"><a href="{href}">More on the calls list</a></p>',
            href=ctx.url("/calls", {"state": state}),
        )
        if page.next_cursor is not None
        else Safe("")
    )
    return render("{cards}{more}", cards=join(cards), more=more)


def attention_page(ctx: Context, held: CallPage, in_doubt: CallPage) -> Safe:
    """Held (quarantined) and in-doubt calls, each with a settle form."""
    body = render(
        '<p class="muted">These calls wait for you: settle each with the output it should '
        "have had, an error the model will see, or a re-run. Each choice is confirmed on the "
        "next page.</p>"
        '<section><h2>Held for an operator <span class="count">{n_held}</span></h2>{held}</section>'
        '<section><h2>In doubt <span class="count">{n_doubt}</span></h2>{doubt}</section>',
        n_held=len(held.calls),
        held=_attention_cards(ctx, held, "quarantined", "No call is held."),
        n_doubt=len(in_doubt.calls),
        doubt=_attention_cards(ctx, in_doubt, "in_doubt", "No call is in doubt."),
    )
    return frame(ctx, title="Needs attention", body=body, refreshable=True)


# -- deliveries --------------------------------------------------------------------------


def deliveries_page(ctx: Context, deliveries: Sequence[DeliveryView], *, everything: bool) -> Safe:
    """Recorded deliveries: unresolved only (default) or all."""
    toggle = (
        render('Showing all. <a href="{href}">Unresolved only</a>', href=ctx.url("/deliveries"))
        if everything
        else render(
            'Showing unresolved only. <a href="{href}">Show all</a>',
            href=ctx.url("/deliveries", {"all": "1"}),
        )
    )
    body = render(
        '<p class="muted">{toggle}</p>{table}',
        toggle=toggle,
        table=deliveries_table(
            ctx,
            deliveries,
            empty="No delivery recorded." if everything else "Every delivery is resolved.",
        ),
    )
    return frame(ctx, title="Deliveries", body=body, refreshable=True)


# -- settling ----------------------------------------------------------------------------

_CONSEQUENCES = {
    "output": "The output is saved as this call's result and submitted to the Agents API "
    "once, under the call's stable key.",
    "error": "The text is saved as a failed result the model will see, and submitted once.",
    "rerun": "The handler runs again with the next attempt, and its result is saved and "
    "submitted as usual. Choose this only if the last attempt had no effect.",
}
_LABELS = {"output": "save this output", "error": "fail with this error", "rerun": "re-run"}


def confirm_page(ctx: Context, detail: CallDetail, request: SettleRequest) -> Safe:
    """The confirmation step: what will happen, to which call, with which value."""
    hidden = hidden_inputs(
        ("csrf", ctx.csrf),
        ("call", request.call_id),
        ("session", request.session_id),
        ("mode", request.mode),
        ("value", request.value),
        ("confirm", "yes"),
    )
    value = (
        render(
            '<h2>{what}</h2><pre class="content">{v}</pre>',
            what=_value_label(request),
            v=request.value,
        )
        if request.mode != "rerun"
        else Safe("")
    )
    body = render(
        '<p class="warning">{consequence} This cannot be undone.</p>{summary}{value}'
        '<form method="post" action="{action}" class="confirm">{hidden}'
        '<button type="submit" class="danger">Confirm: {label}</button> '
        '<a href="{cancel}">Cancel</a></form>',
        consequence=_CONSEQUENCES[request.mode],
        summary=call_summary(ctx, detail.summary),
        value=value,
        action=ctx.url("/settle"),
        hidden=hidden,
        label=_LABELS[request.mode],
        cancel=ctx.url("/call", {"id": request.call_id, "session": request.session_id}),
    )
    return frame(ctx, title=f"Settle call {request.call_id}?", body=body)


def _value_label(request: SettleRequest) -> str:
    if request.mode == "error":
        return "Error text the model will see"
    return "Output (sent as JSON)" if request.output_is_json else "Output (sent as text)"


# -- login and messages ------------------------------------------------------------------


def login_page(ctx: Context, *, next_route: str, failed: bool, hours: float) -> Safe:
    """The login form: exchanges a token for a session cookie."""
    body = render(
        "{error}"
        '<form method="post" action="{action}" class="login">'
        '<input type="hidden" name="next" value="{next}">'
        '<label>Operator token <input type="password" name="token" '
        'autocomplete="current-password" required autofocus></label>'
        '<label>Your name <input type="text" name="name" autocomplete="name" '
        'maxlength="64"></label>'
        '<button type="submit">Log in</button></form>'
        '<p class="muted">One of the tokens the app was given (<code>AGENTFN_ADMIN_TOKEN</code>). '
        "Your name is recorded with the approvals you decide. "
        "The session lasts {hours} hours.</p>",
        error=Safe('<p class="error" role="alert">That token is not valid.</p>') if failed else "",
        action=ctx.url("/login"),
        next=next_route,
        hours=f"{hours:g}",
    )
    return bare_frame(ctx, title="Log in", body=body)


def message_page(
    ctx: Context,
    *,
    title: str,
    message: str,
    signed_in: bool,
    links: Iterable[tuple[str, str]] = (),
) -> Safe:
    """A refusal or an error: what happened and where to go next."""
    extra = join(
        render('<a href="{href}">{text}</a>', href=href, text=text) for href, text in links
    )
    body = render(
        '<p class="error" role="alert">{message}</p><p>{extra}</p>', message=message, extra=extra
    )
    if signed_in:
        return frame(ctx, title=title, body=body)
    return bare_frame(ctx, title=title, body=body)
