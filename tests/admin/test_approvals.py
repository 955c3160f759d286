"""The operator page's approvals over HTTP, on the real Operator of a real app (memory store,
the package's fake API): the waiting list, the arguments on the call's page (escaped), the
decision through a confirmation step, and the signed link that works once (issue 23)."""

from __future__ import annotations

import dataclasses
import html as htmllib
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.admin.approval_links import ApprovalLinks
from agentfn_asgi.admin.approval_pages import LINK_SCRIPT, LINK_SCRIPT_SOURCE
from agentfn_asgi.calls.records import CallState
from agentfn_asgi.demo import free_port
from agentfn_asgi.dispatch.approvals import ApprovalView
from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.testing import Connection, FakeCall, serve_app

from ..support.clock import FakeClock
from ..support.stack import FAST, running_stack
from ..test_approvals import account_tools, submitted, until_state
from .conftest import TOKEN, host_app

pytestmark = pytest.mark.anyio

BEARER = {"authorization": f"Bearer {TOKEN}"}
PUBLIC = "http://testserver" + ADMIN_PATH
HOSTILE = "<script>alert(1)</script>"


@dataclasses.dataclass
class Page:
    stack: Connection
    http: httpx.AsyncClient
    heard: list[ApprovalView]
    ran: list[str]


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    heard: list[ApprovalView] = []
    ran: list[str] = []

    async def on_request(view: ApprovalView) -> None:
        heard.append(view)

    settings = dataclasses.replace(FAST, approval_poll_interval=0.05)
    async with running_stack(
        account_tools(ran), settings=settings, on_approval_request=on_request
    ) as stack:
        admin = AdminApp(stack.app, tokens=[TOKEN], public_url=PUBLIC)
        transport = httpx.ASGITransport(app=host_app(admin))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield Page(stack, http, heard, ran)


async def waiting(page: Page, account_id: str, call_id: str) -> tuple[str, ApprovalView]:
    sid = page.stack.fake.create_session(
        [[FakeCall("close_account", {"account_id": account_id}, call_id=call_id)]]
    )
    await until_state(page.stack, sid, call_id, CallState.AWAITING_APPROVAL)
    with anyio.fail_after(10):
        while not [v for v in page.heard if v.call_id == call_id]:
            await anyio.sleep(0.02)
    return sid, next(v for v in page.heard if v.call_id == call_id)


async def post(
    http: httpx.AsyncClient, route: str, *, bearer: bool = True, **fields: str
) -> httpx.Response:
    headers = {"content-type": "application/x-www-form-urlencoded"}
    if bearer:
        headers.update(BEARER)
    return await http.post(
        ADMIN_PATH + route, content=urllib.parse.urlencode(fields), headers=headers
    )


async def test_the_list_the_arguments_and_a_confirmed_approval(page: Page) -> None:
    sid, request = await waiting(page, HOSTILE, "call_page")
    listed = await page.http.get(ADMIN_PATH + "/approvals", headers=BEARER)
    assert listed.status_code == 200 and "Waiting for approval" in listed.text
    assert request.approval_id in listed.text and "call_page" in listed.text

    call = await page.http.get(
        ADMIN_PATH + "/call", params={"id": "call_page", "session": sid}, headers=BEARER
    )
    assert call.status_code == 200
    assert HOSTILE not in call.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in call.text
    assert 'class="approve"' in call.text and 'class="deny"' in call.text

    confirm = await post(page.http, "/decide", approval=request.approval_id, decision="approve")
    assert confirm.status_code == 200 and "Confirm: approve" in confirm.text
    assert page.ran == []
    done = await post(
        page.http, "/decide", approval=request.approval_id, decision="approve", confirm="yes"
    )
    assert done.status_code == 303 and "decided=approved" in done.headers["location"]
    await submitted(page.stack, "call_page")
    again = await post(
        page.http, "/decide", approval=request.approval_id, decision="deny", confirm="yes"
    )
    assert again.status_code == 409 and "already decided" in again.text
    assert page.ran == ["call_page"]


async def test_an_expiry_to_come_reads_in_so_long_on_every_page(page: Page) -> None:
    """The default expiry is a day ahead: "in 23h 59m", never "0s ago" (which it read on the
    list, the call and the confirmation pages while the CLI said it right)."""
    sid, request = await waiting(page, "acc_t", "call_time")
    pages = [
        await page.http.get(ADMIN_PATH + "/approvals", headers=BEARER),
        await page.http.get(
            ADMIN_PATH + "/call", params={"id": "call_time", "session": sid}, headers=BEARER
        ),
        await post(page.http, "/decide", approval=request.approval_id, decision="approve"),
    ]
    for shown in pages:
        assert shown.status_code == 200
        assert "<span>in 23h 59m</span>" in shown.text
        assert re.search(r"<span>\ds ago</span>", shown.text)  # asked just now


async def test_the_page_records_who_decided(page: Page) -> None:
    """A decision on the page was recorded as by "operator page". Now it names the person:
    the name given once at the login form, or the name the host's authorizer returns."""
    _, first = await waiting(page, "acc_n1", "call_n1")
    login = {"token": TOKEN, "name": "Alice Example", "next": "/"}
    assert (await page.http.post(ADMIN_PATH + "/login", data=login)).status_code == 303
    listed = await page.http.get(ADMIN_PATH + "/approvals")
    csrf = re.search(r'name="csrf" value="([^"]*)"', listed.text)
    assert csrf is not None
    decided = await post(
        page.http,
        "/decide",
        bearer=False,
        csrf=csrf.group(1),
        approval=first.approval_id,
        decision="approve",
        confirm="yes",
    )
    assert decided.status_code == 303

    host = AdminApp(page.stack.app, authorizer=lambda request: "bob@example.com")
    sid, second = await waiting(page, "acc_n2", "call_n2")
    transport = httpx.ASGITransport(app=host_app(host))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        shown = await http.get(ADMIN_PATH + "/call", params={"id": "call_n2", "session": sid})
        csrf = re.search(r'name="csrf" value="([^"]*)"', shown.text)
        assert csrf is not None
        fields = {"csrf": csrf.group(1), "approval": second.approval_id, "decision": "deny"}
        denied = await http.post(ADMIN_PATH + "/decide", data={**fields, "confirm": "yes"})
        assert denied.status_code == 303
    view = page.stack.app.operator()
    for call_id, who in (("call_n1", "Alice Example"), ("call_n2", "bob@example.com")):
        approval = (await view.call(call_id)).approval
        assert approval is not None and approval.decided_by == who


async def test_a_denial_from_the_page_reaches_the_model(page: Page) -> None:
    _, request = await waiting(page, "acc_d", "call_deny")
    done = await post(
        page.http,
        "/decide",
        approval=request.approval_id,
        decision="deny",
        reason="not during the audit",
        confirm="yes",
    )
    assert done.status_code == 303
    submission = await submitted(page.stack, "call_deny")
    assert not submission.success and "not during the audit" in (submission.error or "")
    assert page.ran == []


async def open_link(http: httpx.AsyncClient, link: str) -> httpx.Response:
    """What a browser does with a link: GET it (the fragment stays in the browser), then the
    page's script posts the fragment's token."""
    opened = await http.get(link)
    assert opened.status_code == 200 and 'id="open"' in opened.text
    fragment = urllib.parse.urlsplit(link).fragment
    return await http.post(
        opened.url.copy_with(fragment=None),
        content=urllib.parse.urlencode({"t": fragment}),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )


async def test_a_signed_link_works_once_and_needs_no_login(page: Page) -> None:
    """The token is in the fragment, posted by the page; opening decides nothing, the
    decision is a second POST, once; a forged or pasted-and-damaged token is refused."""
    _, request = await waiting(page, "acc_l", "call_link")
    link = request.links["approve"]
    assert link.startswith(PUBLIC + "/approval#") and "?" not in link
    opened = await open_link(page.http, link)  # no credentials: the link is the permission
    assert opened.status_code == 200 and "acc_l" in opened.text
    assert page.ran == []  # opening decides nothing
    pasted = await post(page.http, "/approval", bearer=False, t=f" {link} ")  # no script
    assert pasted.status_code == 200 and "acc_l" in pasted.text
    token = urllib.parse.urlsplit(link).fragment
    used = await post(page.http, "/approval", bearer=False, t=token, decision="approve")
    assert used.status_code == 200 and "approved" in used.text
    await submitted(page.stack, "call_link")
    twice = await post(page.http, "/approval", bearer=False, t=token, decision="approve")
    assert twice.status_code == 409 and "used up" in twice.text
    assert (await post(page.http, "/approval", bearer=False, t=link)).status_code == 409
    forged = await post(page.http, "/approval", bearer=False, t=token[:-2] + "xx")
    assert forged.status_code == 403
    assert page.ran == ["call_link"]
    detail = await page.stack.app.operator().call("call_link")
    assert detail.approval is not None and detail.approval.decided_via == "link"


def _forms(html: str) -> list[tuple[str, dict[str, str]]]:
    """Every POST form of a page: its action and hidden fields (what a replayer submits)."""
    found = []
    for action, inner in re.findall(
        r'<form method="post" action="([^"]*)"[^>]*>(.*?)</form>', html, re.S
    ):
        hidden = re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', inner)
        found.append((htmllib.unescape(action), {n: htmllib.unescape(v) for n, v in hidden}))
    return found


async def test_a_logged_link_replayed_by_someone_else_decides_nothing() -> None:
    """Served by uvicorn with its access log on: a person opens a signed link (not deciding
    yet). Someone who reads the access log replays every logged request, without cookies,
    and submits every form the answers hold, approving: nothing is decided, the handler does
    not run, and the person's own decision still works afterwards."""
    ran: list[str] = []
    heard: list[ApprovalView] = []

    async def on_request(view: ApprovalView) -> None:
        heard.append(view)

    logged: list[tuple[str, str]] = []

    class AccessLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            _client, method, path, *_ = record.args  # type: ignore[misc]
            logged.append((str(method), str(path)))

    port = free_port()
    settings = dataclasses.replace(FAST, approval_poll_interval=0.05)
    async with running_stack(
        account_tools(ran), settings=settings, on_approval_request=on_request
    ) as stack:
        admin = AdminApp(
            stack.app, tokens=[TOKEN], public_url=f"http://127.0.0.1:{port}{ADMIN_PATH}"
        )
        async with serve_app(host_app(admin), port=port, access_log=True) as root:
            access = logging.getLogger("uvicorn.access")
            handler = AccessLog()
            access.addHandler(handler)
            try:
                sid = stack.fake.create_session(
                    [[FakeCall("close_account", {"account_id": "acc_r"}, call_id="call_r")]]
                )
                await until_state(stack, sid, "call_r", CallState.AWAITING_APPROVAL)
                with anyio.fail_after(10):
                    while not heard:
                        await anyio.sleep(0.02)
                link = heard[0].links["approve"]
                async with httpx.AsyncClient() as person:
                    assert (await open_link(person, link)).status_code == 200
                assert logged, "uvicorn's access log recorded nothing"
                async with httpx.AsyncClient(base_url=root) as reader:
                    for method, path in list(logged):
                        replayed = await reader.request(
                            method,
                            path,
                            content=b"",
                            headers={"content-type": "application/x-www-form-urlencoded"},
                        )
                        for action, hidden in _forms(replayed.text):
                            body = {**hidden, "decision": "approve", "confirm": "yes"}
                            await reader.post(
                                action,
                                content=urllib.parse.urlencode(body),
                                headers={"content-type": "application/x-www-form-urlencoded"},
                            )
            finally:
                access.removeHandler(handler)
            await anyio.sleep(0.3)  # an approval would start its call within the poll
            detail = await stack.app.operator().call("call_r")
            assert detail.approval is not None and detail.approval.decision is None
            assert detail.summary.state == "awaiting_approval" and ran == []
            assert not any("#" in path or "t=" in path for _, path in logged)

            async with httpx.AsyncClient() as person:
                token = urllib.parse.urlsplit(link).fragment
                used = await person.post(
                    f"{root}{ADMIN_PATH}/approval",
                    content=urllib.parse.urlencode({"t": token, "decision": "approve"}),
                    headers={"content-type": "application/x-www-form-urlencoded"},
                )
            assert used.status_code == 200
            await submitted(stack, "call_r")
            assert ran == ["call_r"]


async def test_a_token_in_the_query_is_refused(page: Page) -> None:
    """A link of the old shape (``/approval?t=``) was logged on its way: refused, nothing
    decided."""
    _, request = await waiting(page, "acc_q", "call_q")
    token = urllib.parse.urlsplit(request.links["approve"]).fragment
    refused = await page.http.get(ADMIN_PATH + "/approval", params={"t": token})
    assert refused.status_code == 403 and 'class="approve"' not in refused.text
    assert page.ran == []


async def test_the_link_page_runs_only_its_own_script(page: Page) -> None:
    """The one script of the operator page, on the page a link opens, allowed by its hash;
    no other page's CSP allows a script."""
    opened = await page.http.get(ADMIN_PATH + "/approval")
    csp = opened.headers["content-security-policy"]
    assert f"script-src {LINK_SCRIPT_SOURCE}" in csp and "unsafe-inline" not in csp
    assert opened.text.count("<script") == 1 and f"<script>{LINK_SCRIPT}</script>" in opened.text
    other = await page.http.get(ADMIN_PATH + "/approvals", headers=BEARER)
    assert "script-src" not in other.headers["content-security-policy"]


async def test_links_expire_sooner_than_the_request_and_are_sent_again(page: Page) -> None:
    """A link lasts ``link_max_age`` (or until its request expires, if sooner); the call's
    page sends the request to ``on_approval_request`` again, with a new link that works."""
    clock = FakeClock()
    links = ApprovalLinks(b"k" * 32, base_url=PUBLIC, clock=clock, max_age=600)
    token = urllib.parse.urlsplit(links.url("apr_1", "d", expires_at=clock() + 86400)).fragment
    assert links.read(token).expires_at == clock() + 600
    clock.advance(601)
    with pytest.raises(ValueError, match="expired"):
        links.read(token)
    soon = links.token("apr_1", "d", expires_at=clock() + 5)
    assert links.read(soon).expires_at == clock() + 5  # the request's expiry comes first

    sid, request = await waiting(page, "acc_s", "call_s")
    call = await page.http.get(
        ADMIN_PATH + "/call", params={"id": "call_s", "session": sid}, headers=BEARER
    )
    assert 'value="resend"' in call.text
    resent = await post(page.http, "/decide", approval=request.approval_id, decision="resend")
    assert resent.status_code == 303 and "decided=resent" in resent.headers["location"]
    with anyio.fail_after(10):
        while len([v for v in page.heard if v.call_id == "call_s"]) < 2:
            await anyio.sleep(0.02)
    again = [v for v in page.heard if v.call_id == "call_s"][-1]
    assert again.approval_id == request.approval_id and page.ran == []
    opened = await open_link(page.http, again.links["approve"])
    assert opened.status_code == 200 and "acc_s" in opened.text

    token = urllib.parse.urlsplit(again.links["approve"]).fragment
    await post(page.http, "/approval", bearer=False, t=token, decision="deny", reason="no")
    await submitted(page.stack, "call_s")
    refused = await post(page.http, "/decide", approval=request.approval_id, decision="resend")
    assert refused.status_code == 409 and "already decided" in refused.text
