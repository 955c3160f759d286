"""The operator page as a pure ASGI app: routing (exact paths), authentication, CSRF,
headers, refusals.

Every response carries a strict Content-Security-Policy (no script at all, styles only from
the served stylesheet), ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and
``Cache-Control: no-store``. Untrusted input (paths, queries, forms, cookies, headers) is
answered with 4xx; a failing store with 503; only a bug of ours or of the view is a 500.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._asgi import exact_router
from ..app import AgentWebhookApp
from ..errors import ApprovalError, ConfigurationError, StoreError
from ..operator import ApprovalsView, ApprovalView, OperatorView
from .approval_links import LINK_MAX_AGE, ApprovalLinks
from .approval_pages import LINK_SCRIPT_SOURCE, link_done_page, link_open_page, link_page
from .auth import (
    BROWSER_COOKIE,
    BROWSER_MAX_AGE,
    SESSION_COOKIE,
    Authorizer,
    Gate,
    LoginThrottle,
    Session,
)
from .forms import FormError, parse_pairs
from .handlers import GET_PAGES, decide, html_page, see_other, settle
from .html import Safe
from .layout import Context
from .pages import login_page, message_page

__all__ = ["AdminApp"]

logger = logging.getLogger("agentfn_asgi.admin")

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
# The page a signed link opens runs one script, allowed by its hash (approval_pages.py).
_LINK_PAGE_CSP = SECURITY_HEADERS["content-security-policy"] + f"; script-src {LINK_SCRIPT_SOURCE}"
_STYLESHEET = importlib.resources.files("agentfn_asgi.admin").joinpath("style.css").read_bytes()
# A settle form carries at most one result (the API's own limit is 4 MiB); a login, a token.
_FORM_LIMIT = 8 * 1024 * 1024
_LOGIN_LIMIT = 16 * 1024

#: Answers one route: ``(request, ctx, method)``, HEAD taken as GET, the query parsed.
_Route = Callable[[Request, Context, str], Awaitable[Response]]


@dataclasses.dataclass(frozen=True, slots=True)
class _Access:
    session: Session | None  # the verified cookie (binds CSRF tokens), if any
    bearer: bool  # authenticated by the Authorization header: no CSRF token needed
    who: str  # recorded with a decision: a name, else how they got in
    new_cookie: str | None = None  # a CSRF-binding cookie to set (host logins)


@dataclasses.dataclass(frozen=True, slots=True)
class _Page:
    """What the page serves with, once its configuration is known."""

    view: OperatorView
    gate: Gate
    links: ApprovalLinks


class AdminApp:
    """The operator page: mount it where you like (``Mount``, or the integrations' helpers).

    ``source`` is the webhook app (:class:`~agentfn_asgi.AgentWebhookApp`), whose store and
    dispatcher the page reads and settles through, or any
    :class:`~agentfn_asgi.operator.OperatorView`. Built on the webhook app, the page checks
    nothing when it is built (a module that builds it at import time always imports): it
    resolves its view and its configuration at start-up (its lifespan when the host forwards
    one, else its first request), as the webhook app does. A mistake there fails the
    lifespan with one line, or answers 503 and logs why.

    It is **off unless configured**: give ``tokens`` (one string or several, for rotation; at
    least 16 characters each; built on the webhook app, the default is
    ``AGENTFN_ADMIN_TOKEN``) and/or an ``authorizer`` (``callable(request) -> bool | str``,
    sync or async: ``True`` or the person's name, recorded with their decisions) that reuses
    the host's login; a token login asks for the name once. With neither, a page built on
    the webhook app answers 404 everywhere, as if it were not mounted; on a view, it raises
    :class:`~agentfn_asgi.errors.ConfigurationError`.

    ``secret`` signs the session cookies together with the token that logged in (default:
    the token alone); changing it logs everybody out. Several processes serving the page
    with only an ``authorizer`` need the same ``secret`` (it signs the CSRF cookie).
    ``session_max_age`` is in seconds; ``refresh_seconds`` is the auto-refresh period.

    Logging out revokes the session through the view (the app's store), so a copy of its
    cookie is refused by every replica, also after a restart; failed logins are throttled
    per client (429 with ``Retry-After``): per browser that logged in before, else per
    address, where ``trusted_proxies`` (addresses or networks) are the proxies whose
    ``X-Forwarded-For`` is believed. See :mod:`agentfn_asgi.admin.auth`.

    ``public_url`` is where this page is reachable (``https://ops.example.com/openai/admin``):
    with it, each new approval request of the webhook app carries a signed link
    (``links["approve"]``) to ``on_approval_request``. Opening the
    link needs no login (it decides that one request, once); its token is in the URL
    fragment, so no server or proxy logs it. It expires after ``link_max_age`` seconds (one
    hour), or with its request if sooner; the call's page sends a new one. It is signed
    with ``secret`` (else the first token), so every process serving the page must share it.
    With only an ``authorizer`` and no ``secret`` the key is made per process: a WARNING at
    start says that another replica, or this one after a restart, will refuse the links.
    """

    def __init__(
        self,
        source: AgentWebhookApp | OperatorView,
        *,
        tokens: str | Iterable[str] | None = None,
        authorizer: Authorizer | None = None,
        secret: str | bytes | None = None,
        session_max_age: float = 8 * 3600,
        refresh_seconds: int = 10,
        clock: Callable[[], float] = time.time,
        public_url: str | None = None,
        link_max_age: float = LINK_MAX_AGE,
        trusted_proxies: str | Iterable[str] = (),
    ) -> None:
        self.source = source
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self.throttle = LoginThrottle(clock=clock, trusted_proxies=trusted_proxies)
        self._gate = functools.partial(
            Gate, authorizer=authorizer, secret=secret, max_age=session_max_age, clock=clock
        )
        self._tokens = tokens
        self._secret = secret
        self._public_url = public_url or ""
        self._link_max_age = link_max_age
        self._page: _Page | None = None
        self._off = False
        self._failure_logged = False
        if isinstance(source, AgentWebhookApp):
            if public_url:
                source.link_approvals(self.approval_links)
        elif public_url:
            raise ConfigurationError(
                "public_url= makes links for the webhook app's approval requests: build the"
                " page on the webhook app, AdminApp(webhooks, ...)"
            )
        else:
            self.check()  # nothing to wait for: a view and arguments are code, not settings
        # /login is routed whatever the tokens (known at start-up): without tokens it is 404.
        routes: list[tuple[str, _Route, str]] = [("/style.css", _stylesheet, "GET, HEAD")]
        routes.append(("/approval", self._signed_link, "GET, HEAD, POST"))
        routes.append(("/login", self._login, "GET, HEAD, POST"))
        routes += [(path, self._signed_in, "GET, HEAD") for path in GET_PAGES]
        routes += [(path, self._signed_in, "POST") for path in ("/settle", "/logout", "/decide")]
        served = [(path, self._serve(route), allow) for path, route, allow in routes]
        self._router = exact_router(served, self._serve(self._not_found), self._not_allowed)

    def check(self) -> None:
        """Resolve the view and the configuration now instead of at start-up.

        Raises :class:`~agentfn_asgi.errors.ConfigurationError` naming the problem (the
        webhook app's configuration, a short token, a bad authorizer...)."""
        self._resolve()

    def _resolve(self) -> _Page | None:
        """The page's parts (None when it is off), made on first use."""
        if self._page is not None or self._off:
            return self._page
        tokens = self._tokens
        source = self.source
        if isinstance(source, AgentWebhookApp):
            if tokens is None and self._gate.keywords["authorizer"] is None:
                tokens = source.config.admin_tokens
                if not tokens:
                    self._off = True
                    logger.info(
                        "operator page: off (set AGENTFN_ADMIN_TOKEN, or pass tokens= or"
                        " authorizer=), answering 404"
                    )
                    return None
            view: OperatorView = source.operator()
        else:
            view = source
        gate = self._gate(tokens=tokens)
        if self._public_url and self._secret is None and not gate.tokens:
            # Warned, not refused: one process works until it restarts, and the requests
            # stay decidable on the page; but every link this process made dies with it.
            logger.warning(
                "operator page: approval links are signed with a key made for this process "
                "(authorizer= without secret= or tokens=): another replica, or this one after "
                "a restart, refuses them. Give every process the same secret=."
            )
        links = ApprovalLinks(
            gate.link_key, base_url=self._public_url, clock=self.clock, max_age=self._link_max_age
        )
        self._page = _Page(view=view, gate=gate, links=links)
        return self._page

    @property
    def view(self) -> OperatorView:
        """What the page shows and settles through."""
        return self._parts().view

    @property
    def gate(self) -> Gate:
        """Who may use the page."""
        return self._parts().gate

    @property
    def links(self) -> ApprovalLinks:
        """Makes and reads the signed approval links (see ``public_url``)."""
        return self._parts().links

    def _parts(self) -> _Page:
        page = self._resolve()
        if page is None:
            raise ConfigurationError("the operator page is off: it has no token or authorizer")
        return page

    def approval_links(self, request: ApprovalView) -> dict[str, str]:
        """The links of one approval request: ``approve`` (signed, decides it once) and
        ``call`` (the call's page, behind the login); none while the page cannot start."""
        try:
            links = self.links
        except ConfigurationError:
            return {}  # the page's own requests log why
        base = links.base_url
        call = f"{base}/call?" + urllib.parse.urlencode(
            {"id": request.call_id, "session": request.session_id}
        )
        signed = links.url(request.approval_id, request.digest, request.expires_at)
        return {"approve": signed, "call": call}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        await self._router(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # Served where the host forwards lifespan: resolve now, so a mistake stops the start.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self._resolve()
                except ConfigurationError as exc:
                    text = f"agentfn-asgi cannot start: {exc}"
                    await send({"type": "lifespan.startup.failed", "message": text})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- dispatch --------------------------------------------------------------------------

    def _serve(self, route: _Route) -> ASGIApp:
        """One route as ASGI: its context and query first (400 for a bad query), then its
        answer; a failing store is a 503 page, a bug a 500 page, and every answer carries
        the security headers."""

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            root, path = _split_path(scope)
            ctx = Context(root=root, route=path, refresh_seconds=self.refresh_seconds)
            try:
                response = await self._respond(Request(scope, receive), ctx, route)
            except ClientDisconnect:
                return
            except StoreError as exc:
                # Checking a session's revocation needs the store: without it, nobody gets in.
                response = self._store_failed(ctx, exc)
            except Exception:
                # A bug (ours or the view's), never the input: log it, show nothing of it.
                logger.exception("operator page: unexpected error")
                response = self._message(
                    ctx, 500, "Internal error", "Something went wrong; the server log has details."
                )
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)  # a page may tighten its CSP
            await response(scope, receive, send)

        return serve

    async def _respond(self, request: Request, ctx: Context, route: _Route) -> Response:
        method = "GET" if request.scope["method"] == "HEAD" else request.scope["method"]
        try:
            query = parse_pairs(request.scope.get("query_string", b"").decode("latin-1"))
        except FormError as exc:
            return self._message(ctx, exc.status, "Bad request", exc.message)
        ctx = dataclasses.replace(ctx, now=self.clock(), query=query)
        if route is _stylesheet:
            return await route(request, ctx, method)
        try:
            if self._resolve() is None:
                return await self._not_found(request, ctx, method)
        except ConfigurationError as exc:
            # It cannot start (no lifespan said so first): the reason is for the log only.
            if not self._failure_logged:
                self._failure_logged = True
                logger.error("agentfn-asgi cannot start, the operator page answers 503: %s", exc)
            message = "The page cannot start; the server log says why."
            return self._message(ctx, 503, "Not configured", message)
        return await route(request, ctx, method)

    async def _not_found(self, request: Request, ctx: Context, method: str) -> Response:
        return self._message(ctx, 404, "Not found", "There is no such page here.")

    async def _not_allowed(self, scope: Scope, receive: Receive, send: Send, allow: str) -> None:
        async def refuse(request: Request, ctx: Context, method: str) -> Response:
            response = self._message(ctx, 405, "Method not allowed", f"{method} is not used here.")
            response.headers["allow"] = allow
            return response

        await self._serve(refuse)(scope, receive, send)

    async def _signed_in(self, request: Request, ctx: Context, method: str) -> Response:
        """The pages and forms behind the login."""
        access = await self._access(request)
        if access is None:
            return self._refuse(request, ctx, method)
        session = access.session
        ctx = dataclasses.replace(
            ctx,
            csrf=self.gate.csrf_token(session) if session is not None else "",
            logged_in=session is not None and session.via == "token",
            who=access.who,
        )
        response = await self._handle(request, ctx, method, ctx.route, access)
        if access.new_cookie is not None:
            self._set_cookie(response, request, ctx, access.new_cookie)
        return response

    async def _handle(
        self, request: Request, ctx: Context, method: str, route: str, access: _Access
    ) -> Response:
        try:
            if method == "GET":
                return await GET_PAGES[route](self.view, ctx, ctx.query)
            fields = await _read_form(request, _FORM_LIMIT)
            if not access.bearer and not self.gate.check_csrf(access.session, fields.get("csrf")):
                return self._message(
                    ctx,
                    403,
                    "Form refused",
                    "This form has expired or did not come from this page (CSRF check). "
                    "Reload the page and try again.",
                    signed_in=True,
                )
            if route == "/logout":
                if access.session is not None:
                    # Ended on the server: a copy of the cookie is refused from now on.
                    expires_at = self.gate.expires_at(access.session)
                    await self.view.revoke_login(access.session.sid, expires_at=expires_at)
                response = see_other(ctx.url("/login" if self.gate.tokens else "/"))
                response.delete_cookie(SESSION_COOKIE, path=ctx.root or "/")
                return response
            if route == "/decide":
                return await decide(self.view, ctx, fields)
            return await settle(self.view, ctx, fields)
        except FormError as exc:
            return self._message(ctx, exc.status, "Bad request", exc.message, signed_in=True)
        except LookupError as exc:
            return self._message(ctx, 404, "Not found", _text(exc, "no such call"), signed_in=True)
        except StoreError as exc:
            return self._store_failed(ctx, exc, signed_in=True)
        except ValueError as exc:
            return self._message(ctx, 400, "Bad request", _text(exc, "refused"), signed_in=True)

    # -- signed approval links ---------------------------------------------------------------

    async def _signed_link(self, request: Request, ctx: Context, method: str) -> Response:
        """``GET /approval``: the form that posts the token of the link's fragment (never
        sent here); ``POST /approval`` with ``t``: the request and a form; with ``decision``
        too: the decision. No login: the signed token is the permission, for its one
        request, and it is never in a part of a URL that a server or a proxy logs."""
        if method == "GET":
            if "t" in ctx.query:  # a token in the query was logged on its way here
                return self._link_refused(
                    ctx,
                    403,
                    "this link carries its code in the address, which servers and proxies "
                    "log: it is not accepted. Ask for the link to be sent again.",
                )
            response = html_page(link_open_page(ctx))
            response.headers["content-security-policy"] = _LINK_PAGE_CSP
            return response
        try:
            fields = await _read_form(request, _LOGIN_LIMIT)
        except FormError as exc:
            return self._message(ctx, exc.status, "Bad request", exc.message)
        try:
            link = self.links.read(fields.get("t", ""))
        except ValueError as exc:
            return self._link_refused(ctx, 403, str(exc))
        view = self.view
        if not isinstance(view, ApprovalsView):
            return self._link_refused(ctx, 404, "this page's view holds no approval requests")
        found = await view.approval(link.approval_id)
        if found is None or found[0].digest != link.digest:
            return self._link_refused(ctx, 404, "this link names no request of this app")
        approval, detail = found
        if approval.decision is not None or approval.state != "awaiting_approval":
            decided = approval.decision or approval.state
            return self._link_refused(
                ctx, 409, f"this request was already decided ({decided}): the link is used up"
            )
        choice = fields.get("decision")
        if choice is None:
            return html_page(link_page(ctx, approval, detail, token=fields["t"]))
        if choice not in ("approve", "deny"):
            return self._message(ctx, 400, "Bad request", "choose approve or deny")
        reason = fields.get("reason", "").strip() or None
        try:
            decided_view = await view.decide(
                link.approval_id,
                approve=choice == "approve",
                by="signed link",
                via="link",
                reason=None if choice == "approve" else reason,
                digest=link.digest,
            )
        except ApprovalError as exc:
            return self._link_refused(ctx, 409, str(exc))
        title = "Approved" if decided_view.decision == "approved" else "Denied"
        return html_page(
            link_done_page(
                ctx,
                title=title,
                message=f"Call {decided_view.call_id} ({decided_view.tool_name}): "
                f"{decided_view.decision}. This link is now used up.",
            )
        )

    def _link_refused(self, ctx: Context, status: int, message: str) -> Response:
        body = link_done_page(ctx, title="This approval link cannot be used", message=message)
        return html_page(body, status=status)

    # -- authentication --------------------------------------------------------------------

    async def _session(self, request: Request) -> Session | None:
        """The session the request's cookie proves, unless it was logged out."""
        session = self.gate.read_session(request.cookies.get(SESSION_COOKIE))
        if session is not None and await self.view.login_revoked(session.sid):
            return None
        return session

    async def _access(self, request: Request) -> _Access | None:
        session = await self._session(request)
        if session is not None and session.via == "token":
            who = session.name or "a token login (no name given)"
            return _Access(session=session, bearer=False, who=who)
        presented = self.gate.bearer(request)
        if presented is not None and self.gate.match_token(presented) is not None:
            return _Access(session=None, bearer=True, who="an API client (bearer token)")
        name = await self.gate.host_allows(request)
        if name is not None:
            who = name or "a host login (the authorizer gave no name)"
            if session is not None:
                return _Access(session=session, bearer=False, who=who)
            session, cookie = self.gate.open_session()
            return _Access(session=session, bearer=False, who=who, new_cookie=cookie)
        return None

    def _refuse(self, request: Request, ctx: Context, method: str) -> Response:
        if self.gate.bearer(request) is not None and self.gate.tokens:
            response = self._message(ctx, 401, "Not authorized", "The bearer token is not valid.")
            response.headers["www-authenticate"] = 'Bearer error="invalid_token"'
            return response
        if not self.gate.tokens:
            return self._message(
                ctx, 403, "Not authorized", "Sign in to the application first, then come back."
            )
        if method == "GET" and "text/html" in request.headers.get("accept", ""):
            # The raw query (parse_pairs has accepted it): Request.url would decode it again.
            query = request.scope.get("query_string", b"").decode("latin-1")
            next_route = ctx.route + (f"?{query}" if query else "")
            return see_other(ctx.url("/login", {"next": next_route}))
        response = self._message(
            ctx, 401, "Not authorized", "Log in, or send Authorization: Bearer <token>."
        )
        response.headers["www-authenticate"] = 'Bearer realm="agentfn-asgi operator page"'
        return response

    async def _login(self, request: Request, ctx: Context, method: str) -> Response:
        if not self.gate.tokens:  # without tokens the host logs people in: no login here
            return await self._not_found(request, ctx, method)
        next_route = _safe_next(ctx.query.get("next"))
        if method == "GET":
            session = await self._session(request)
            if session is not None and session.via == "token":
                return see_other(ctx.root + next_route)
            return html_page(self._login_form(ctx, next_route, failed=False))
        # A browser that logged in before counts on its own: a guesser sharing its address
        # (one proxy for everybody) cannot lock it out.
        client = self.gate.known_browser(request.cookies.get(BROWSER_COOKIE))
        client = client or self.throttle.client_of(request)
        wait = self.throttle.retry_after(client)
        if wait:  # the token is not even looked at
            return self._too_many(ctx, wait)
        # Counted as failed before the form is read (an await): concurrent tries cannot slip
        # past the limit together. A good token clears the count.
        wait = self.throttle.failed(client)
        try:
            fields = await _read_form(request, _LOGIN_LIMIT)
        except FormError as exc:
            return self._message(ctx, exc.status, "Bad request", exc.message)
        next_route = _safe_next(fields.get("next"))
        key = self.gate.match_token(fields.get("token", "").encode("utf-8"))
        if key is None:
            logger.warning("operator page: a login with an invalid token was refused")
            if wait:
                logger.warning(
                    "operator page: %d failed logins from %s: its logins are refused for %d s",
                    self.throttle.failures,
                    client,
                    wait,
                )
            return html_page(self._login_form(ctx, next_route, failed=True), status=401)
        self.throttle.succeeded(client)
        _session, cookie = self.gate.open_session(key, name=fields.get("name", ""))
        response = see_other(ctx.root + next_route)
        self._set_cookie(response, request, ctx, cookie)
        browser = self.gate.browser_cookie(key)
        self._set_cookie(response, request, ctx, browser, BROWSER_COOKIE, BROWSER_MAX_AGE)
        return response

    def _too_many(self, ctx: Context, wait: int) -> Response:
        response = self._message(
            ctx,
            429,
            "Too many failed logins",
            f"Too many failed logins from here: try again in {wait} seconds.",
        )
        response.headers["retry-after"] = str(wait)
        return response

    def _login_form(self, ctx: Context, next_route: str, *, failed: bool) -> Safe:
        return login_page(ctx, next_route=next_route, failed=failed, hours=self.gate.max_age / 3600)

    def _set_cookie(
        self,
        response: Response,
        request: Request,
        ctx: Context,
        value: str,
        name: str = SESSION_COOKIE,
        max_age: float | None = None,
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=int(self.gate.max_age if max_age is None else max_age),
            path=ctx.root or "/",
            secure=request.scope.get("scheme") == "https",
            httponly=True,
            samesite="strict",
        )

    def _store_failed(self, ctx: Context, exc: StoreError, *, signed_in: bool = False) -> Response:
        logger.warning("operator page: the store failed: %s", type(exc).__name__)
        message = f"The store cannot answer right now ({type(exc).__name__}). Try again shortly."
        return self._message(ctx, 503, "Store unavailable", message, signed_in=signed_in)

    def _message(
        self, ctx: Context, status: int, title: str, message: str, *, signed_in: bool = False
    ) -> Response:
        links = [(ctx.url("/"), "Overview")] if signed_in else []
        body = message_page(ctx, title=title, message=message, signed_in=signed_in, links=links)
        return html_page(body, status=status)


async def _stylesheet(request: Request, ctx: Context, method: str) -> Response:
    return Response(_STYLESHEET, media_type="text/css; charset=utf-8")


def _split_path(scope: Scope) -> tuple[str, str]:
    """(mount point for links, route below it): ``Mount`` and the exact-path helpers move the
    matched prefix into ``root_path``; the route is what remains (``/`` when nothing)."""
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return root.rstrip("/"), path or "/"


def _safe_next(candidate: str | None) -> str:
    """A route below the mount point to return to after logging in (never another site)."""
    if (
        not candidate
        or not candidate.startswith("/")
        or candidate.startswith("//")
        or "\\" in candidate
        or not candidate.isascii()  # it goes into a Location header as it is
        or not candidate.isprintable()
        or len(candidate) > 2048
    ):
        return "/"
    return candidate


def _text(exc: Exception, fallback: str) -> str:
    # LookupError's str() quotes a lone argument (KeyError); show the plain message instead.
    if exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return fallback


async def _read_form(request: Request, limit: int) -> Mapping[str, str]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError("send the form as application/x-www-form-urlencoded", status=415)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise FormError(f"the form is larger than {limit} bytes", status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise FormError(f"the form is larger than {limit} bytes", status=413)
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise FormError("the form is not UTF-8") from None
    return parse_pairs(text)
