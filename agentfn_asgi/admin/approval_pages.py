"""The operator page's approval views: the waiting list, the decision on a call's page, its
confirmation step, and the pages a signed link opens.

The arguments a person decides on are shown here on purpose (escaped, like every value of
the page): an approval is bound to them (their digest is on the request).

The page a signed link opens holds the operator page's only script (:data:`LINK_SCRIPT`,
allowed by its hash in that response's Content-Security-Policy, :data:`LINK_SCRIPT_SOURCE`):
it moves the token from the URL fragment, which no server sees, into a form and posts it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence

from ..actions import action_kind
from ..operator import ApprovalView, CallDetail
from .html import Safe, join, render
from .layout import Context, bare_frame, call_link, frame
from .widgets import hidden_inputs, table, when

__all__ = [
    "DECIDED_NOTICES",
    "LINK_SCRIPT",
    "LINK_SCRIPT_SOURCE",
    "approval_section",
    "approvals_page",
    "decide_confirm_page",
    "link_done_page",
    "link_open_page",
    "link_page",
]

#: What the call page says after a decision (the redirect carries only the word).
DECIDED_NOTICES = {
    "approved": "Approved: the call runs within a few seconds, on whichever replica claims it.",
    "denied": "Denied: the model was told, with your reason.",
    "resent": "Sent again: the app's on_approval_request got the request with a new link.",
}

#: Moves a link's token from the fragment into the form and posts it (then drops the
#: fragment from the address bar and the history). A literal: its hash is in the CSP.
LINK_SCRIPT = (
    'var c=location.hash.slice(1);if(c){history.replaceState(null,"",location.pathname);'
    'var f=document.getElementById("open");f.elements.t.value=c;f.submit();}'
)
#: The CSP source that allows :data:`LINK_SCRIPT`, and no other script.
LINK_SCRIPT_SOURCE = "'sha256-{}'".format(
    base64.b64encode(hashlib.sha256(LINK_SCRIPT.encode("ascii")).digest()).decode("ascii")
)


def approvals_page(ctx: Context, views: Sequence[ApprovalView]) -> Safe:
    """``Waiting for approval``: every waiting request, soonest expiry first."""
    if not views:
        listed = Safe('<p class="empty">No call waits for approval.</p>')
    else:
        rows = (
            render(
                "<tr><td>{call}</td><td>{kind}</td><td><code>{tool}</code></td>"
                "<td><code>{id}</code></td><td>{asked}</td><td>{expires}</td></tr>",
                call=call_link(ctx, v.call_id, v.session_id),
                kind=v.kind,
                tool=v.tool_name,
                id=v.approval_id,
                asked=when(ctx, v.requested_at),
                expires=when(ctx, v.expires_at),
            )
            for v in views
        )
        headings = ("Call", "Kind", "Tool", "Request", "Asked", "Expires")
        listed = table("calls approvals", headings, rows)
    body = render(
        '<p class="muted">These calls wait for a person: open one to see its arguments, then '
        "approve or deny it. Nothing runs until then.</p>{table}",
        table=listed,
    )
    return frame(ctx, title="Waiting for approval", body=body, refreshable=True)


def _arguments(detail: CallDetail) -> Safe:
    if detail.arguments is None:
        return Safe(
            '<p class="warning">The arguments could not be read from the session (the API '
            "is unreachable, or the session no longer waits for this call).</p>"
        )
    if action_kind(detail.summary.tool_name) != "function":
        return _request_content(detail.arguments)
    return render('<pre class="content arguments">{a}</pre>', a=detail.arguments)


def _request_content(text: str) -> Safe:
    """An approval request as a person decides on it: an MCP call's server, tool,
    arguments (or "not provided") and message; an origin and the agent's reason."""
    try:
        request = json.loads(text)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        return render('<pre class="content arguments">{a}</pre>', a=text)
    if request.get("type") == "mcp_tool_call":
        arguments = request.get("arguments")
        shown = (
            Safe("<em>not provided</em>")
            if arguments is None
            else render(
                '<pre class="content arguments">{a}</pre>',
                a=arguments if isinstance(arguments, str) else json.dumps(arguments, indent=2),
            )
        )
        return render(
            '<dl class="summary request"><dt>Kind</dt><dd>MCP tool call</dd>'
            "<dt>Server label</dt><dd><code>{label}</code></dd>"
            "<dt>Tool name</dt><dd><code>{name}</code></dd>"
            "<dt>Arguments</dt><dd>{arguments}</dd>"
            "<dt>Message</dt><dd>{message}</dd></dl>",
            label=str(request.get("server_label") or ""),
            name=str(request.get("name") or "(none given)"),
            arguments=shown,
            message=str(request.get("message") or "(none)"),
        )
    return render(
        '<dl class="summary request"><dt>Kind</dt><dd>Computer use: {what}</dd>'
        "<dt>Origin</dt><dd><code>{origin}</code></dd>"
        "<dt>Reason</dt><dd>{reason}</dd></dl>",
        what=str(request.get("type") or ""),
        origin=str(request.get("origin") or request.get("credential_origin") or ""),
        reason=str(request.get("reason") or "(none given)"),
    )


def _request_facts(ctx: Context, view: ApprovalView) -> Safe:
    return render(
        '<dl class="summary approval"><dt>Request</dt><dd><code>{id}</code></dd>'
        "<dt>Tool</dt><dd><code>{tool}</code></dd><dt>Asked</dt><dd>{asked}</dd>"
        "<dt>Expires</dt><dd>{expires}</dd>"
        "<dt>Arguments digest</dt><dd><code>{digest}</code></dd></dl>",
        id=view.approval_id,
        tool=view.tool_name,
        asked=when(ctx, view.requested_at),
        expires=when(ctx, view.expires_at),
        digest=view.digest,
    )


def _decision_forms(ctx: Context, view: ApprovalView, *, action: str, hidden: Safe) -> Safe:
    return render(
        '<form method="post" action="{action}" class="approve">{hidden}'
        '<input type="hidden" name="decision" value="approve">'
        '<button type="submit">Approve…</button></form>'
        '<form method="post" action="{action}" class="deny">{hidden}'
        '<input type="hidden" name="decision" value="deny">'
        '<label class="value">Reason (the model reads it)'
        '<textarea name="reason" rows="2"></textarea></label>'
        '<button type="submit" class="danger">Deny…</button></form>',
        action=action,
        hidden=hidden,
    )


def approval_section(ctx: Context, detail: CallDetail) -> Safe:
    """On a call's page: its request, and while it waits the arguments with Approve and
    Deny (each leads to a confirmation step)."""
    view = detail.approval
    if view is None:
        return Safe("")
    if view.decision is not None:
        by = f" by {view.decided_by}" if view.decided_by else ""
        via = f" ({view.decided_via})" if view.decided_via else ""
        return render(
            "<section><h2>Approval</h2>{facts}<p>Decided: <strong>{decision}</strong>{by}{via}"
            "{why}</p></section>",
            facts=_request_facts(ctx, view),
            decision=view.decision,
            by=by,
            via=via,
            why=render(": {r}", r=view.reason) if view.reason else "",
        )
    if view.state != "awaiting_approval":
        return render(
            "<section><h2>Approval</h2>{facts}<p>No longer waiting: the call is {state}.</p>"
            "</section>",
            facts=_request_facts(ctx, view),
            state=view.state,
        )
    hidden = hidden_inputs(
        ("csrf", ctx.csrf),
        ("approval", view.approval_id),
        ("call", view.call_id),
        ("session", view.session_id),
    )
    return render(
        "<section><h2>Waiting for approval</h2>{facts}<h3>Arguments you are deciding on</h3>"
        "{arguments}{forms}"
        '<form method="post" action="{action}" class="resend">{hidden}'
        '<input type="hidden" name="decision" value="resend">'
        '<button type="submit">Send the approval link again</button> '
        '<span class="muted">(a new link to on_approval_request: links expire sooner than the '
        "request)</span></form></section>",
        facts=_request_facts(ctx, view),
        arguments=_arguments(detail),
        forms=_decision_forms(ctx, view, action=ctx.url("/decide"), hidden=hidden),
        action=ctx.url("/decide"),
        hidden=hidden,
    )


def decide_confirm_page(
    ctx: Context, view: ApprovalView, detail: CallDetail, *, approve: bool, reason: str
) -> Safe:
    """The confirmation step of a decision taken on the page."""
    hidden = hidden_inputs(
        ("csrf", ctx.csrf),
        ("approval", view.approval_id),
        ("call", view.call_id),
        ("session", view.session_id),
        ("decision", "approve" if approve else "deny"),
        ("reason", reason),
        ("confirm", "yes"),
    )
    consequence = (
        "The call will run, once, within a few seconds."
        if approve
        else "The call will fail; the model reads your reason."
    )
    body = render(
        '<p class="warning">{consequence} This cannot be undone.</p>{facts}'
        "<h2>Arguments</h2>{arguments}{why}"
        '<form method="post" action="{action}" class="confirm">{hidden}'
        '<button type="submit" class="danger">Confirm: {label}</button> '
        '<a href="{cancel}">Cancel</a></form>',
        consequence=consequence,
        facts=_request_facts(ctx, view),
        arguments=_arguments(detail),
        why=render('<h2>Reason</h2><pre class="content">{r}</pre>', r=reason)
        if not approve
        else "",
        action=ctx.url("/decide"),
        hidden=hidden,
        label="approve" if approve else "deny",
        cancel=ctx.url("/call", {"id": view.call_id, "session": view.session_id}),
    )
    verb = "Approve" if approve else "Deny"
    return frame(ctx, title=f"{verb} call {view.call_id}?", body=body)


def link_open_page(ctx: Context) -> Safe:
    """``GET /approval``: the form that posts the link's token (filled from the fragment by
    :data:`LINK_SCRIPT`; without scripts, the person pastes the link)."""
    body = render(
        '<p class="muted">Opening the approval link you were sent…</p>'
        '<form method="post" action="{action}" id="open" class="open">'
        '<label class="value">If nothing happens, paste the whole link you were sent'
        '<input type="text" name="t" autocomplete="off" required></label>'
        '<button type="submit">Open</button></form>',
        action=ctx.url("/approval"),
    )
    script = Safe(f"<script>{LINK_SCRIPT}</script>")
    return bare_frame(ctx, title="Approval link", body=join([body, script]))


def link_page(ctx: Context, view: ApprovalView, detail: CallDetail, *, token: str) -> Safe:
    """What a signed link opens (posted): the request and its arguments, and the POST that
    decides (the token again in the form's body, never in a URL)."""
    hidden = hidden_inputs(("t", token))
    body = render(
        '<p class="muted">You were sent this link to decide one call. Nothing has happened '
        "yet: approving or denying takes effect when you press a button below, once.</p>"
        "{facts}<h2>Arguments</h2>{arguments}{forms}",
        facts=_request_facts(ctx, view),
        arguments=_arguments(detail),
        forms=_decision_forms(ctx, view, action=ctx.url("/approval"), hidden=hidden),
    )
    return bare_frame(ctx, title=f"Approve call {view.call_id}?", body=body)


def link_done_page(ctx: Context, *, title: str, message: str) -> Safe:
    """The answer of a signed link's POST (or its refusal)."""
    return bare_frame(ctx, title=title, body=render('<p role="status">{m}</p>', m=message))
