"""The operator page's approvals over HTTP, on the real Operator of a real app (memory store,
the package's fake API): the waiting list, the arguments on the call's page (escaped), the
decision through a confirmation step, and the signed link that works once (issue 23)."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.dispatch.approvals import ApprovalView
from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.records import CallState
from agentfn_asgi.testing import Connection, FakeCall

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


async def test_a_signed_link_works_once_and_needs_no_login(page: Page) -> None:
    _, request = await waiting(page, "acc_l", "call_link")
    link = request.links["approve"]
    assert link.startswith(PUBLIC + "/approval?t=")
    path = link.removeprefix("http://testserver")
    opened = await page.http.get(path)  # no credentials: the link is the permission
    assert opened.status_code == 200 and "acc_l" in opened.text
    assert page.ran == []  # opening decides nothing
    token = urllib.parse.parse_qs(urllib.parse.urlparse(link).query)["t"][0]
    used = await post(page.http, "/approval", bearer=False, t=token, decision="approve")
    assert used.status_code == 200 and "approved" in used.text
    await submitted(page.stack, "call_link")
    twice = await post(page.http, "/approval", bearer=False, t=token, decision="approve")
    assert twice.status_code == 409 and "used up" in twice.text
    assert (await page.http.get(path)).status_code == 409
    forged = await page.http.get(ADMIN_PATH + "/approval", params={"t": token[:-2] + "xx"})
    assert forged.status_code == 403
    assert page.ran == ["call_link"]
    detail = await page.stack.app.operator().call("call_link")
    assert detail.approval is not None and detail.approval.decided_via == "link"
