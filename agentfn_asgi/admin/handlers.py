"""One handler per page: read the checked request, ask the operator view, render.

Handlers run only after :class:`~agentfn_asgi.admin.app.AdminApp` has authenticated the
request (and checked the CSRF token of a POST). A refusal is raised as
:class:`~agentfn_asgi.admin.forms.FormError` (400), ``LookupError`` (404) or
``ValueError`` (400); the app turns them into pages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.responses import Response

from ..errors import ApprovalError, ConfigurationError
from ..operator import ApprovalsView, CallFilter, OperatorView
from .approval_pages import DECIDED_NOTICES, approvals_page, decide_confirm_page
from .forms import MAX_LIMIT, CallQuery, FormError, SettleRequest
from .html import Safe
from .layout import Context
from .pages import (
    SETTLED_NOTICES,
    attention_page,
    call_page,
    calls_page,
    confirm_page,
    deliveries_page,
    message_page,
    overview_page,
)

__all__ = ["GET_PAGES", "Handler", "decide", "html_page", "see_other", "settle"]

Handler = Callable[[OperatorView, Context, Mapping[str, str]], Awaitable[Response]]
# How many held and in-doubt calls the attention page lists (the rest: on the calls list).
ATTENTION_LIMIT = 100


def html_page(body: Safe, status: int = 200) -> Response:
    """An HTML response (the app adds the security headers to every response)."""
    return Response(body, status_code=status, media_type="text/html; charset=utf-8")


def see_other(url: str) -> Response:
    """A 303 redirect (after a POST, so a reload never repeats it)."""
    return Response(status_code=303, headers={"location": url})


def _refused(ctx: Context, title: str, message: str, back: str) -> Response:
    """A 409 page: the view refused what was asked; a link ``back`` to the call."""
    links = [(back, "Back to the call")]
    page = message_page(ctx, title=title, message=message, signed_in=True, links=links)
    return html_page(page, status=409)


async def overview(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /``: health, counts by state, what needs attention."""
    return html_page(overview_page(ctx, await view.overview()))


async def calls(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /calls``: the filtered list; refused filters re-show the form with why."""
    try:
        query = CallQuery.parse(fields)
        page = await view.calls(query.to_filter(ctx.now))
    except ValueError as exc:  # FormError, or the view refusing a cursor
        message = exc.message if isinstance(exc, FormError) else str(exc)
        return html_page(calls_page(ctx, fields, error=message), status=400)
    return html_page(calls_page(ctx, fields, query=query, page=page))


def _call_params(fields: Mapping[str, str]) -> tuple[str, str | None]:
    call_id = fields.get("id", "").strip()
    if not call_id:
        raise FormError("which call? the link needs ?id=CALL_ID (and &session=SESSION_ID)")
    return call_id, fields.get("session", "").strip() or None


async def call(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /call?id=&session=[&content=1]``: one call's timeline; content on request."""
    call_id, session_id = _call_params(fields)
    content = fields.get("content") == "1"
    detail = await view.call(call_id, session_id=session_id, content=content)
    if not content and detail.approval is not None and detail.approval.decision is None:
        # A person deciding sees the arguments they decide on (read from the live session).
        detail = await view.call(call_id, session_id=session_id, content=True)
    notice = SETTLED_NOTICES.get(fields.get("settled", "")) or DECIDED_NOTICES.get(
        fields.get("decided", "")
    )
    return html_page(call_page(ctx, detail, content=content, notice=notice))


async def attention(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /attention``: held (quarantined) and in-doubt calls, each with a settle form."""
    held = await view.calls(CallFilter(state="quarantined", limit=ATTENTION_LIMIT))
    in_doubt = await view.calls(CallFilter(state="in_doubt", limit=ATTENTION_LIMIT))
    return html_page(attention_page(ctx, held, in_doubt))


async def deliveries(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /deliveries[?all=1][&limit=N]``: unresolved deliveries, or all of them."""
    everything = fields.get("all") == "1"
    raw_limit = fields.get("limit", "50")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise FormError(f"'limit' must be a whole number from 1 to {MAX_LIMIT}")
    listed = await view.deliveries(unresolved=not everything, limit=int(raw_limit))
    return html_page(deliveries_page(ctx, listed, everything=everything))


async def settle(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``POST /settle``: first the confirmation page, then (``confirm=yes``) the settle."""
    request = SettleRequest.parse(fields)
    detail = await view.call(request.call_id, session_id=request.session_id)
    back = ctx.url("/call", {"id": request.call_id, "session": request.session_id})
    if not detail.settleable:
        return _refused(
            ctx,
            "Cannot settle this call",
            f"Call {request.call_id} is {detail.summary.state}: only held, "
            "quarantined and in-doubt calls can be settled.",
            back,
        )
    try:
        output = request.output() if request.mode == "output" else None
    except FormError as exc:  # JSON too deep to send: the form again, with why
        page = call_page(
            ctx, detail, content=False, notice=None, refused=request, error=exc.message
        )
        return html_page(page, status=400)
    if not request.confirmed:
        return html_page(confirm_page(ctx, detail, request))
    outcome = await view.settle(
        request.call_id,
        session_id=request.session_id,
        output=output,
        error=request.value if request.mode == "error" else None,
        rerun=request.mode == "rerun",
    )
    if outcome.status == "refused":
        return _refused(ctx, "Settling was refused", outcome.message, back)
    return see_other(
        ctx.url(
            "/call",
            {"id": request.call_id, "session": request.session_id, "settled": outcome.status},
        )
    )


async def approvals(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``GET /approvals``: the calls waiting for a person."""
    waiting = await view.approvals() if isinstance(view, ApprovalsView) else []
    return html_page(approvals_page(ctx, waiting))


#: Who decided, as the history and the log name a decision taken on the page.
PAGE_DECIDER = "operator page"


async def decide(view: OperatorView, ctx: Context, fields: Mapping[str, str]) -> Response:
    """``POST /decide``: first the confirmation page, then (``confirm=yes``) the decision;
    ``decision=resend`` sends the request (with a new link) to ``on_approval_request``."""
    approval_id = fields.get("approval", "").strip()
    decision = fields.get("decision", "")
    if not approval_id or decision not in ("approve", "deny", "resend"):
        raise FormError("the decision form needs the request and approve or deny")
    if not isinstance(view, ApprovalsView):
        raise LookupError("this page's view holds no approval requests")
    found = await view.approval(approval_id)
    if found is None:
        raise LookupError(f"no approval request {approval_id}")
    request, detail = found
    approve, reason = decision == "approve", fields.get("reason", "").strip()
    back = ctx.url("/call", {"id": request.call_id, "session": request.session_id})
    if decision != "resend" and fields.get("confirm") != "yes":
        return html_page(decide_confirm_page(ctx, request, detail, approve=approve, reason=reason))
    try:
        if decision == "resend":  # harmless, so no confirmation step
            await view.notify_again(approval_id)
            params = {"id": request.call_id, "session": request.session_id}
            return see_other(ctx.url("/call", {**params, "decided": "resent"}))
        decided = await view.decide(
            approval_id,
            approve=approve,
            by=ctx.who or PAGE_DECIDER,
            via="page",
            reason=None if approve else (reason or None),
            digest=request.digest,
        )
    except (ApprovalError, ConfigurationError) as exc:
        return _refused(ctx, "The decision was refused", str(exc), back)
    params = {"id": decided.call_id, "session": decided.session_id}
    return see_other(ctx.url("/call", {**params, "decided": decided.decision or ""}))


#: The GET pages, by route below the mount point.
GET_PAGES: dict[str, Handler] = {
    "/": overview,
    "/calls": calls,
    "/call": call,
    "/attention": attention,
    "/approvals": approvals,
    "/deliveries": deliveries,
}
