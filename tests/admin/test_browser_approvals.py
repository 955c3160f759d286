"""Approvals on the operator page in headless Chromium (issue 23), over the real Operator of
a real app (memory store, the package's fake API), served by uvicorn on loopback: log in,
open the waiting list, approve one call and deny another through their confirmation steps,
and use a signed link once, without logging in (its page's one script posts the token of
the URL fragment; a second use is refused; without JavaScript the person pastes the link)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import anyio
import pytest

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.calls.records import CallState
from agentfn_asgi.demo import free_port
from agentfn_asgi.dispatch.approvals import ApprovalView
from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.testing import FakeCall, serve_app

from ..support.stack import FAST, running_stack
from ..test_approvals import account_tools, submitted, until_state
from .browser import Browser
from .conftest import TOKEN, host_app
from .test_browser import browser, in_browser, log_in, wait_title, wait_until

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

pytestmark = pytest.mark.slow

__all__ = ["browser"]  # the fixture, imported for these tests


@pytest.mark.anyio
async def test_an_operator_approves_one_denies_one_and_a_link_works_once(
    browser: Browser,
) -> None:
    from selenium.webdriver.common.by import By

    heard: list[ApprovalView] = []
    ran: list[str] = []

    async def on_request(view: ApprovalView) -> None:
        heard.append(view)

    port = free_port()
    site = f"http://127.0.0.1:{port}{ADMIN_PATH}"
    settings = dataclasses.replace(FAST, approval_poll_interval=0.05)
    async with running_stack(
        account_tools(ran), settings=settings, on_approval_request=on_request
    ) as stack:
        admin = AdminApp(stack.app, tokens=[TOKEN], public_url=site)
        sessions = {}
        calls = (("call_a", "acc_a"), ("call_d", "acc_d"), ("call_l", "acc_l"), ("call_p", "acc_p"))
        for call_id, account in calls:
            sessions[call_id] = stack.fake.create_session(
                [[FakeCall("close_account", {"account_id": account}, call_id=call_id)]]
            )
            await until_state(stack, sessions[call_id], call_id, CallState.AWAITING_APPROVAL)
        with anyio.fail_after(10):
            while len(heard) < 4:
                await anyio.sleep(0.02)
        link = next(v for v in heard if v.call_id == "call_l").links["approve"]
        pasted_link = next(v for v in heard if v.call_id == "call_p").links["approve"]

        def decide_on_page(driver: WebDriver, call_id: str, *, deny: str | None) -> None:
            driver.get(site + "/approvals")
            wait_title(driver, "Waiting for approval")
            driver.find_element(By.LINK_TEXT, call_id).click()
            wait_title(driver, f"Call {call_id}")
            arguments = driver.find_element(By.CSS_SELECTOR, "pre.arguments").text
            assert f"acc_{call_id[-1]}" in arguments
            if deny is None:
                driver.find_element(By.CSS_SELECTOR, "form.approve button").click()
                wait_title(driver, f"Approve call {call_id}?")
            else:
                chosen = driver.find_element(By.CSS_SELECTOR, "form.deny")
                chosen.find_element(By.NAME, "reason").send_keys(deny)
                chosen.find_element(By.TAG_NAME, "button").click()
                wait_title(driver, f"Deny call {call_id}?")
                assert deny in driver.find_element(By.TAG_NAME, "main").text
            driver.find_element(By.CSS_SELECTOR, "form.confirm button").click()
            wait_title(driver, f"Call {call_id}")
            notice = driver.find_element(By.CSS_SELECTOR, "p.notice").text
            assert notice.startswith("Approved" if deny is None else "Denied")

        def steps(driver: WebDriver) -> None:
            log_in(driver, site, "/approvals")
            wait_title(driver, "Waiting for approval")
            listed = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "table.approvals a")]
            assert sorted(listed) == ["call_a", "call_d", "call_l", "call_p"]
            decide_on_page(driver, "call_a", deny=None)
            decide_on_page(driver, "call_d", deny="the customer asked to wait")

            driver.delete_all_cookies()  # the link needs no login
            driver.get(link)  # its page's script posts the fragment's token
            wait_title(driver, "Approve call call_l?")
            assert "#" not in driver.current_url  # the token left the address bar
            assert "acc_l" in driver.find_element(By.CSS_SELECTOR, "pre.arguments").text
            driver.find_element(By.CSS_SELECTOR, "form.approve button").click()
            wait_title(driver, "Approved")
            driver.get(site + "/login")  # from /approval, the link would only move the fragment
            driver.get(link)
            wait_title(driver, "This approval link cannot be used")
            assert "used up" in driver.find_element(By.TAG_NAME, "main").text
            driver.get(site + "/approvals")
            wait_until(driver, "the login form", lambda d: d.title.startswith("Log in"))

        def paste_without_javascript(driver: WebDriver) -> None:
            driver.get(pasted_link)  # no script: the page asks for the link
            wait_title(driver, "Approval link")
            driver.find_element(By.NAME, "t").send_keys(pasted_link)
            driver.find_element(By.CSS_SELECTOR, "form.open button").click()
            wait_title(driver, "Approve call call_p?")
            chosen = driver.find_element(By.CSS_SELECTOR, "form.deny")
            chosen.find_element(By.NAME, "reason").send_keys("not today")
            chosen.find_element(By.TAG_NAME, "button").click()
            wait_title(driver, "Denied")

        async with serve_app(host_app(admin), port=port):
            await in_browser(browser, steps, javascript=True)
            await in_browser(browser, paste_without_javascript, javascript=False)
            pasted = await submitted(stack, "call_p")
            approved = await submitted(stack, "call_a")
            denied = await submitted(stack, "call_d")
            linked = await submitted(stack, "call_l")
    assert approved.success and linked.success
    assert not denied.success and "the customer asked to wait" in (denied.error or "")
    assert not pasted.success and "not today" in (pasted.error or "")
    assert sorted(ran) == ["call_a", "call_l"]


@pytest.mark.anyio
async def test_an_operator_sees_and_decides_approval_requests(browser: Browser) -> None:
    """Issue 34: an MCP request and an origin request the policy asks a person about are
    listed with their kind; the request's page shows the server label, tool name, arguments
    (or "not provided") and message, or the origin and reason; approving and denying on the
    page answers each request once."""
    from selenium.webdriver.common.by import By

    from agentfn_asgi.demo.tools import ACTIONS
    from agentfn_asgi.testing import FakeRequest

    from ..test_actions import answered, lookup_tools

    port = free_port()
    site = f"http://127.0.0.1:{port}{ADMIN_PATH}"
    settings = dataclasses.replace(FAST, approval_poll_interval=0.05)
    async with running_stack(lookup_tools(), settings=settings, actions=ACTIONS) as stack:
        admin = AdminApp(stack.app, tokens=[TOKEN], public_url=site)
        stack.fake.create_session(
            [
                [
                    FakeRequest.mcp("payments", "charge", None, request_id="req_pay"),
                    FakeRequest.origin("https://other.test", reason="to pay", request_id="req_o"),
                ]
            ]
        )
        with anyio.fail_after(10):
            while len(await stack.app.operator().approvals()) < 2:
                await anyio.sleep(0.02)

        def decide(driver: WebDriver, call_id: str, *, approve: bool, shows: list[str]) -> None:
            driver.get(site + "/approvals")
            wait_title(driver, "Waiting for approval")
            driver.find_element(By.LINK_TEXT, call_id).click()
            wait_title(driver, f"Call {call_id}")
            facts = driver.find_element(By.CSS_SELECTOR, "dl.request").text
            for text in shows:
                assert text in facts, (text, facts)
            form = "form.approve" if approve else "form.deny"
            driver.find_element(By.CSS_SELECTOR, f"{form} button").click()
            wait_title(driver, f"{'Approve' if approve else 'Deny'} call {call_id}?")
            driver.find_element(By.CSS_SELECTOR, "form.confirm button").click()
            wait_title(driver, f"Call {call_id}")

        def steps(driver: WebDriver) -> None:
            log_in(driver, site, "/approvals")
            wait_title(driver, "Waiting for approval")
            rows = driver.find_elements(By.CSS_SELECTOR, "table.approvals tbody tr")
            kinds = sorted(row.find_elements(By.TAG_NAME, "td")[1].text for row in rows)
            assert kinds == ["computer_use", "mcp"]
            decide(
                driver,
                "req_pay",
                approve=True,
                shows=["payments", "charge", "not provided", "Allow this tool call?"],
            )
            decide(driver, "req_o", approve=False, shows=["https://other.test", "to pay"])

        async with serve_app(host_app(admin), port=port):
            await in_browser(browser, steps, javascript=True)
            paid = await answered(stack, "req_pay")
            origin = await answered(stack, "req_o")
    assert paid.output == {"type": "mcp_tool_call", "decision": "approve"}
    assert origin.output == {"type": "browser_origin_access", "decision": "deny"}
    assert len(stack.fake.submissions) == 2
