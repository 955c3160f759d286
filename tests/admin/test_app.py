"""The operator page over HTTP (httpx over ASGI, mounted in Starlette at /openai/admin):
authentication, cookies, CSRF, headers, escaping, pages, and refusals that are never a 500."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.requests import Request

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.operator import OUTCOMES, CallSummary

from .conftest import NOW, OTHER_TOKEN, TOKEN, AdminFactory, AdminScenario, admin_url, host_app
from .memory_view import HOSTILE_TOOL, MemoryOperatorView, seed

BEARER = {"authorization": f"Bearer {TOKEN}"}
HTML = {"accept": "text/html,application/xhtml+xml"}


def connect(app: AdminApp, base_url: str = "http://testserver") -> httpx.AsyncClient:
    """A client for a Starlette host serving ``app`` at /openai/admin."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=host_app(app)), base_url=base_url)


async def login(
    http: httpx.AsyncClient, token: str = TOKEN, next_route: str = "/"
) -> httpx.Response:
    return await http.post(admin_url("/login"), data={"token": token, "next": next_route})


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]*)"', html)
    assert match is not None, "no CSRF field on the page"
    return match.group(1)


def call_url(call: CallSummary, **extra: str) -> str:
    params = {"id": call.call_id, "session": call.session_id, **extra}
    return admin_url("/call") + "?" + "&".join(f"{k}={v}" for k, v in params.items())


def settle_form(call: CallSummary, csrf: str, **fields: str) -> dict[str, str]:
    return {"csrf": csrf, "call": call.call_id, "session": call.session_id, **fields}


@pytest.fixture
async def logged_in(make_admin: AdminFactory) -> AsyncIterator[httpx.AsyncClient]:
    """A client that went through the login form (it holds the session cookie)."""
    async with connect(make_admin()) as http:
        assert (await login(http)).status_code == 303
        yield http


# -- who gets in -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_browser_without_a_session_is_sent_to_the_login_form(
    client: httpx.AsyncClient,
) -> None:
    """GET with Accept: text/html → 303 to the login form, remembering where it was going."""
    response = await client.get(admin_url("/calls?state=in_doubt"), headers=HTML)
    assert response.status_code == 303
    assert response.headers["location"] == admin_url("/login?next=%2Fcalls%3Fstate%3Din_doubt")
    form = await client.get(response.headers["location"])
    assert form.status_code == 200
    assert 'type="password" name="token"' in form.text
    assert 'name="next" value="/calls?state=in_doubt"' in form.text


@pytest.mark.anyio
async def test_api_clients_get_a_bearer_challenge(client: httpx.AsyncClient) -> None:
    """No credentials → 401 with WWW-Authenticate; a wrong token → invalid_token; the
    right one → the page."""
    missing = await client.get(admin_url("/"))
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer realm=")
    wrong = await client.get(admin_url("/"), headers={"authorization": "Bearer " + "x" * 20})
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert (await client.get(admin_url("/"), headers=BEARER)).status_code == 200
    lowercase = await client.get(admin_url("/"), headers={"authorization": f"bearer {TOKEN}"})
    assert lowercase.status_code == 200


@pytest.mark.anyio
async def test_login_sets_a_strict_httponly_expiring_cookie(client: httpx.AsyncClient) -> None:
    """The form exchanges the token for a cookie scoped to the page; over http it is not
    marked Secure (it could not be sent back)."""
    response = await login(client, next_route="/calls?state=quarantined")
    assert response.status_code == 303
    assert response.headers["location"] == admin_url("/calls?state=quarantined")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("agentfn_admin=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/openai/admin", "max-age=28800"} <= flags
    assert "secure" not in flags
    page = await client.get(admin_url("/"))
    assert page.status_code == 200 and "Log out" in page.text


@pytest.mark.anyio
async def test_the_cookie_is_secure_over_https(make_admin: AdminFactory) -> None:
    """Served over https, the session cookie carries Secure."""
    async with connect(make_admin(), base_url="https://testserver") as http:
        response = await login(http)
    assert "secure" in response.headers["set-cookie"].lower().split("; ")


@pytest.mark.anyio
async def test_a_wrong_token_is_refused_and_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """401, the form again with a message, no cookie, and a warning without the token."""
    response = await login(client, token="op-token-guessed-000")
    assert response.status_code == 401
    assert "That token is not valid" in response.text
    assert "set-cookie" not in response.headers
    assert "invalid token was refused" in caplog.text
    assert "op-token-guessed-000" not in caplog.text


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example", "/\\evil", "calls"])
@pytest.mark.anyio
async def test_login_never_redirects_off_the_page(client: httpx.AsyncClient, target: str) -> None:
    """``next`` is a route below the mount point or nothing (no open redirect)."""
    response = await login(client, next_route=target)
    assert response.headers["location"] == admin_url("/")


@pytest.mark.anyio
async def test_token_rotation_keeps_then_ends_sessions(admin_scenario: AdminScenario) -> None:
    """A session opened with the old token survives while both are configured and ends
    when the old one is removed; the old bearer token stops working too."""
    old = AdminApp(admin_scenario.view, tokens=[TOKEN], clock=admin_scenario.clock)
    async with connect(old) as http:
        await login(http)
        cookies = http.cookies
    both = AdminApp(admin_scenario.view, tokens=[TOKEN, OTHER_TOKEN], clock=admin_scenario.clock)
    async with connect(both) as http:
        http.cookies = cookies
        assert (await http.get(admin_url("/"), headers=HTML)).status_code == 200
    new = AdminApp(admin_scenario.view, tokens=[OTHER_TOKEN], clock=admin_scenario.clock)
    async with connect(new) as http:
        http.cookies = cookies
        assert (await http.get(admin_url("/"), headers=HTML)).status_code == 303
        assert (await http.get(admin_url("/"), headers=BEARER)).status_code == 401
        bearer = {"authorization": f"Bearer {OTHER_TOKEN}"}
        assert (await http.get(admin_url("/"), headers=bearer)).status_code == 200


@pytest.mark.anyio
async def test_logout_clears_the_cookie(logged_in: httpx.AsyncClient) -> None:
    """Log out (a CSRF-checked POST) expires the cookie and returns to the login form."""
    page = await logged_in.get(admin_url("/"))
    response = await logged_in.post(admin_url("/logout"), data={"csrf": csrf_of(page.text)})
    assert response.status_code == 303
    assert response.headers["location"] == admin_url("/login")
    assert "max-age=0" in response.headers["set-cookie"].lower()
    assert (await logged_in.get(admin_url("/"), headers=HTML)).status_code == 303


@pytest.mark.anyio
async def test_a_host_authorizer_reuses_the_hosts_login(admin_scenario: AdminScenario) -> None:
    """Allowed requests get the page and a CSRF-binding cookie; denied ones a 403; there
    is no login form; a settle POST still needs the CSRF token."""

    async def authorizer(request: Request) -> bool:
        return request.headers.get("x-user") == "ops"

    admin = AdminApp(admin_scenario.view, authorizer=authorizer, clock=admin_scenario.clock)
    async with connect(admin) as http:
        denied = await http.get(admin_url("/"), headers=HTML)
        assert denied.status_code == 403 and "Sign in to the application" in denied.text
        assert (await http.get(admin_url("/login"))).status_code == 404
        ops = {"x-user": "ops"}
        page = await http.get(call_url(admin_scenario.held), headers=ops)
        assert page.status_code == 200 and "Log out" not in page.text
        assert "agentfn_admin=" in page.headers["set-cookie"]
        form = settle_form(admin_scenario.held, "", mode="rerun")
        refused = await http.post(admin_url("/settle"), data=form, headers=ops)
        assert refused.status_code == 403
        form["csrf"] = csrf_of(page.text)
        confirm = await http.post(admin_url("/settle"), data=form, headers=ops)
        assert confirm.status_code == 200 and "Confirm: re-run" in confirm.text
        # The cookie alone grants nothing: without the host's login, it is refused.
        assert (await http.post(admin_url("/settle"), data=form)).status_code == 403


# -- CSRF and settling -------------------------------------------------------------------


@pytest.mark.anyio
async def test_settle_refuses_a_missing_or_foreign_csrf_token(
    make_admin: AdminFactory, admin_scenario: AdminScenario
) -> None:
    """A cookie-authenticated POST needs its own session's token: none, or another
    session's, is a 403 and settles nothing."""
    held = admin_scenario.held
    async with connect(make_admin()) as mine, connect(make_admin()) as theirs:
        await login(mine)
        await login(theirs)
        their_csrf = csrf_of((await theirs.get(call_url(held))).text)
        for csrf in ["", their_csrf, "forged"]:
            form = settle_form(held, csrf, mode="output", value="ok", confirm="yes")
            response = await mine.post(admin_url("/settle"), data=form)
            assert response.status_code == 403
            assert "CSRF" in response.text
        detail = await admin_scenario.view.call(held.call_id, session_id=held.session_id)
        assert detail.summary.state == "quarantined"


@pytest.mark.anyio
async def test_settling_is_confirmed_then_submitted(
    logged_in: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """The first POST only shows what will happen; the confirmation settles, redirects to
    the call, and the call is then shown submitted."""
    held = admin_scenario.held
    page = await logged_in.get(call_url(held))
    assert "Settle this call" in page.text
    form = settle_form(held, csrf_of(page.text), mode="output", value='{"refund_id": "re_9"}')
    confirm = await logged_in.post(admin_url("/settle"), data=form)
    assert confirm.status_code == 200
    assert "Output (sent as JSON)" in confirm.text and "This cannot be undone" in confirm.text
    still = await admin_scenario.view.call(held.call_id, session_id=held.session_id)
    assert still.summary.state == "quarantined"
    done = await logged_in.post(admin_url("/settle"), data={**form, "confirm": "yes"})
    assert done.status_code == 303
    assert done.headers["location"] == call_url(held, settled="submitted")
    after = await logged_in.get(done.headers["location"])
    assert "Settled: the result was saved and submitted" in after.text
    assert 'outcome-succeeded">succeeded' in after.text
    assert "Settle this call" not in after.text


@pytest.mark.anyio
async def test_bearer_clients_settle_without_a_csrf_token(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """A browser never adds Authorization on its own, so a bearer POST needs no CSRF."""
    form = settle_form(
        admin_scenario.in_doubt, "", mode="error", value="refund failed", confirm="yes"
    )
    response = await client.post(admin_url("/settle"), data=form, headers=BEARER)
    assert response.status_code == 303
    assert "settled=submitted" in response.headers["location"]


@pytest.mark.anyio
async def test_settling_a_running_call_is_refused(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """A claimed (running) call cannot be settled: 409 with the reason, nothing changes."""
    running = admin_scenario.running
    form = settle_form(running, "", mode="output", value="x", confirm="yes")
    response = await client.post(admin_url("/settle"), data=form, headers=BEARER)
    assert response.status_code == 409
    assert "only held, quarantined and in-doubt calls" in response.text
    page = await client.get(call_url(running), headers=BEARER)
    assert "Settle this call" not in page.text


@pytest.mark.anyio
@pytest.mark.parametrize("depth", [201, 100_000])
@pytest.mark.parametrize("confirm", ["", "yes"])
async def test_output_nested_too_deeply_is_a_400_with_the_form_again(
    logged_in: httpx.AsyncClient, admin_scenario: AdminScenario, depth: int, confirm: str
) -> None:
    """JSON nested deeper than the limit (or than the parser's stack) is refused before the
    confirmation step and at it: 400, the call's settle form again with the typed value and
    the reason; nothing is settled."""
    held = admin_scenario.held
    csrf = csrf_of((await logged_in.get(call_url(held))).text)
    deep = "[" * depth + "]" * depth
    form = settle_form(held, csrf, mode="output", value=deep, confirm=confirm)
    response = await logged_in.post(admin_url("/settle"), data=form)
    assert response.status_code == 400
    assert "the output is JSON nested more than 200 levels deep" in response.text
    assert "Settle this call" in response.text and f">{deep}</textarea>" in response.text
    still = await admin_scenario.view.call(held.call_id, session_id=held.session_id)
    assert still.summary.state == "quarantined"


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"mode": "output"}, 400),  # no call
        ({"call": "call_refund_91", "session": "sess_8d1f", "mode": "delete"}, 400),
        ({"call": "nope", "session": "sess_8d1f", "mode": "rerun"}, 404),
    ],
)
@pytest.mark.anyio
async def test_bad_settle_forms_are_4xx(
    client: httpx.AsyncClient, fields: dict[str, str], status: int
) -> None:
    """An incomplete form, an unknown mode or an unknown call: a 4xx page, never a 500."""
    response = await client.post(admin_url("/settle"), data=fields, headers=BEARER)
    assert response.status_code == status


# -- headers and escaping ----------------------------------------------------------------


@pytest.mark.anyio
async def test_every_response_carries_the_security_headers(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """Pages, redirects, refusals, the stylesheet: CSP, no framing, no referrer, no-store."""
    responses = [
        await client.get(admin_url("/"), headers=BEARER),
        await client.get(admin_url("/login")),
        await client.get(admin_url("/style.css")),
        await client.get(admin_url("/nope"), headers=BEARER),
        await client.get(admin_url("/"), headers=HTML),
        await client.get(admin_url("/")),
        await client.put(admin_url("/calls"), headers=BEARER),
        await login(client),
    ]
    for response in responses:
        headers = response.headers
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "style-src 'self'" in csp and "form-action 'self'" in csp
        assert "unsafe-inline" not in csp and "script-src" not in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"
        assert headers["cache-control"] == "no-store"
        assert headers["x-content-type-options"] == "nosniff"


@pytest.mark.anyio
async def test_pages_have_no_script_and_no_inline_style(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """Every page works under the CSP: no <script>, no style attribute or element."""
    held = admin_scenario.held
    urls = [
        "/",
        "/calls",
        "/attention",
        "/deliveries?all=1",
        f"/call?id={held.call_id}&session={held.session_id}&content=1",
    ]
    for url in urls:
        html = (await client.get(admin_url(url), headers=BEARER)).text
        assert "<script" not in html.lower(), url
        assert " style=" not in html.lower() and "<style" not in html.lower(), url
    css = await client.get(admin_url("/style.css"))
    assert css.headers["content-type"].startswith("text/css")


@pytest.mark.anyio
async def test_hostile_values_are_shown_as_text(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """A tool name, arguments and output made of markup are escaped on every page."""
    hostile = admin_scenario.hostile
    for url in [
        admin_url("/calls"),
        admin_url(f"/calls?tool={HOSTILE_TOOL}"),
        call_url(hostile, content="1"),
    ]:
        html = (await client.get(url, headers=BEARER)).text
        assert "&lt;img src=x onerror=alert(1)&gt;" in html, url
        assert "<img" not in html and "<script>" not in html, url
    refused = await client.get(admin_url("/calls?since=<b>x</b>"), headers=BEARER)
    assert refused.status_code == 400
    assert "<b>" not in refused.text and "&lt;b&gt;x&lt;/b&gt;" in refused.text


# -- the pages ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_page_answers_at_the_exact_mount_path(client: httpx.AsyncClient) -> None:
    """``/openai/admin`` and ``/openai/admin/`` both serve the overview, no redirect, and
    links are built from the mount point."""
    for path in [ADMIN_PATH, ADMIN_PATH + "/"]:
        response = await client.get(path, headers=BEARER)
        assert response.status_code == 200
        assert 'href="/openai/admin/calls"' in response.text
        assert 'href="/openai/admin/style.css"' in response.text


@pytest.mark.anyio
async def test_overview_shows_health_counts_and_what_needs_attention(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """Store health, each outcome with its count linking to its calls' list, and the held
    and in-doubt calls by id."""
    html = (await client.get(admin_url("/"), headers=BEARER)).text
    assert "Healthy" in html
    for outcome in ["running", "in doubt", "submitting", "succeeded", "failed", "stale", "held"]:
        assert f">{outcome}</span>" in html
    for outcome in OUTCOMES:
        assert f'href="/openai/admin/calls?outcome={outcome}"' in html
    assert admin_scenario.held.call_id in html and admin_scenario.in_doubt.call_id in html
    assert admin_scenario.hostile.call_id not in html.split("Needs attention")[1]


@pytest.mark.anyio
async def test_calls_filter_like_the_cli_and_paginate(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """state, session, tool, since and limit narrow the list; newest first; the next page
    continues where the first stopped."""

    async def ids(query: str) -> list[str]:
        html = (await client.get(admin_url("/calls") + query, headers=BEARER)).text
        return re.findall(r'/call\?id=([^&"]+)', html)

    assert await ids("?state=quarantined") == [admin_scenario.held.call_id]
    assert set(await ids("?session=sess_3b77")) == {"call_refund_17", "call_cust_2"}
    refunds = await ids("?tool=create_refund&since=10m")
    assert refunds == ["call_refund_17", "call_refund_91"]  # newest first
    first = (await client.get(admin_url("/calls?limit=5"), headers=BEARER)).text
    assert len(re.findall(r"/call\?id=", first)) == 5
    next_link = re.search(r'<a href="([^"]+)" rel="next">', first)
    assert next_link is not None
    second = (await client.get(next_link.group(1).replace("&amp;", "&"), headers=BEARER)).text
    page_one = re.findall(r'/call\?id=([^&"]+)', first)
    page_two = re.findall(r'/call\?id=([^&"]+)', second)
    assert len(page_two) == 5 and not set(page_one) & set(page_two)
    assert "First page" in second


@pytest.mark.anyio
async def test_refused_filters_keep_the_form_and_say_why(client: httpx.AsyncClient) -> None:
    """A bad filter is a 400 that re-shows the form with the typed values and the reason."""
    response = await client.get(admin_url("/calls?since=yesterday&tool=t1"), headers=BEARER)
    assert response.status_code == 400
    assert "&#x27;since&#x27; must be" in response.text
    assert 'name="tool" value="t1"' in response.text
    bad_cursor = await client.get(admin_url("/calls?cursor=zz"), headers=BEARER)
    assert bad_cursor.status_code == 400


@pytest.mark.anyio
async def test_content_is_hidden_unless_asked_for(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """Arguments and output appear only with ?content=1; the timeline always."""
    held = admin_scenario.held
    hidden = (await client.get(call_url(held), headers=BEARER)).text
    assert "ord_1042" not in hidden and "Show content" in hidden
    assert "claim_expired" in hidden and "reconciled" in hidden
    shown = (await client.get(call_url(held, content="1"), headers=BEARER)).text
    assert "ord_1042" in shown and "Hide content" in shown


@pytest.mark.anyio
async def test_unknown_and_ambiguous_calls_are_4xx() -> None:
    """An unknown id is a 404; an id without a session that two sessions share, a 400
    asking for the session; no id at all, a 400."""
    view = MemoryOperatorView()
    for session in ["s1", "s2"]:
        view.add_call(
            session_id=session, call_id="c1", tool_name="t", state="submitted", created_at=NOW
        )
    async with connect(AdminApp(view, tokens=[TOKEN])) as http:
        unknown = await http.get(admin_url("/call?id=zzz"), headers=BEARER)
        assert unknown.status_code == 404 and "no call" in unknown.text
        shared = await http.get(admin_url("/call?id=c1"), headers=BEARER)
        assert shared.status_code == 400 and "give the session" in shared.text
        assert (
            await http.get(admin_url("/call?id=c1&session=s2"), headers=BEARER)
        ).status_code == 200
        assert (await http.get(admin_url("/call"), headers=BEARER)).status_code == 400


@pytest.mark.anyio
async def test_attention_lists_held_and_in_doubt_calls_with_settle_forms(
    client: httpx.AsyncClient, admin_scenario: AdminScenario
) -> None:
    """Both kinds, each with a settle form for its own call and session."""
    html = (await client.get(admin_url("/attention"), headers=BEARER)).text
    for call in [admin_scenario.held, admin_scenario.in_doubt]:
        assert f'name="call" value="{call.call_id}"' in html
        assert f'name="session" value="{call.session_id}"' in html
    assert admin_scenario.running.call_id not in html


@pytest.mark.anyio
async def test_deliveries_show_unresolved_unless_all_is_asked(client: httpx.AsyncClient) -> None:
    """Unresolved deliveries by default (with the sweep's error), all with ?all=1."""
    unresolved = (await client.get(admin_url("/deliveries"), headers=BEARER)).text
    assert "msg_2Yb0cQ" in unresolved and "APIConnectionError" in unresolved
    assert "msg_0000" not in unresolved
    everything = (await client.get(admin_url("/deliveries?all=1"), headers=BEARER)).text
    assert "msg_0000" in everything
    bad = await client.get(admin_url("/deliveries?limit=-1"), headers=BEARER)
    assert bad.status_code == 400


@pytest.mark.anyio
async def test_auto_refresh_is_off_until_turned_on(client: httpx.AsyncClient) -> None:
    """A meta refresh only with ?refresh=1; the toggle keeps the other filters."""
    off = (await client.get(admin_url("/calls?state=stale"), headers=BEARER)).text
    assert 'http-equiv="refresh"' not in off
    assert 'href="/openai/admin/calls?state=stale&amp;refresh=1"' in off
    on = (await client.get(admin_url("/calls?state=stale&refresh=1"), headers=BEARER)).text
    assert '<meta http-equiv="refresh" content="10">' in on


@pytest.mark.anyio
async def test_a_store_outage_is_a_503_page() -> None:
    """The view raising StoreUnavailableError gives 503 with the error type, not a 500."""
    view = MemoryOperatorView()
    seed(view, NOW)
    view.down = True
    async with connect(AdminApp(view, tokens=[TOKEN])) as http:
        for route in ["/", "/calls", "/attention", "/deliveries"]:
            response = await http.get(admin_url(route), headers=BEARER)
            assert response.status_code == 503, route
            assert "StoreUnavailableError" in response.text


@pytest.mark.anyio
async def test_methods_bodies_and_routes_are_checked(client: httpx.AsyncClient) -> None:
    """405 with Allow, 404, 415 for a non-form body, 413 for an oversized one."""
    put = await client.put(admin_url("/calls"), headers=BEARER)
    assert put.status_code == 405 and put.headers["allow"] == "GET, HEAD"
    get_settle = await client.get(admin_url("/settle"), headers=BEARER)
    assert get_settle.status_code == 405 and get_settle.headers["allow"] == "POST"
    post_style = await client.post(admin_url("/style.css"), headers=BEARER)
    assert post_style.status_code == 405 and post_style.headers["allow"] == "GET, HEAD"
    assert (await client.get(admin_url("/calls/"), headers=BEARER)).status_code == 404
    assert (await client.get(admin_url("/etc/passwd"), headers=BEARER)).status_code == 404
    assert (await client.head(admin_url("/"), headers=BEARER)).status_code == 200
    json_body = await client.post(admin_url("/settle"), json={"a": 1}, headers=BEARER)
    assert json_body.status_code == 415
    big = await client.post(
        admin_url("/login"),
        content=b"token=" + b"a" * 20_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert big.status_code == 413
