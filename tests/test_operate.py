"""The operator's loop end to end, on SQLite, Redis and PostgreSQL: a call forced in doubt
(its replica died holding it) is found by ``calls``, explained by ``calls show``, and
settled from the terminal (``calls settle``) and from the operator page in Chromium; each
session then continues and finishes.

Real parts only: the example tools, the app and the page on one Starlette host under
uvicorn, the fake Agents API over loopback, the store named by a URL as an operator would
give it, the CLI's own ``main``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp, DispatchSettings
from agentfn_asgi.admin import AdminApp
from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.cli import main
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.demo.tools import tools as example_tools
from agentfn_asgi.integrations.starlette import ADMIN_PATH, mount_admin, webhook_routes
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_app, serve_fake

from .admin.browser import Browser
from .admin.conftest import TOKEN
from .admin.memory_view import HOSTILE_TOOL
from .admin.test_browser import browser, in_browser, log_in, wait_title, wait_until
from .support.backends import DURABLE, store_url_for

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

__all__ = ["browser"]  # the fixture, re-used from the page's tests

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#: The app never sweeps by itself here: the in-doubt calls wait for the operator.
SETTINGS = DispatchSettings(lease_seconds=5.0, recovery_interval=3600.0)


async def run_cli(*argv: str) -> int:
    return await anyio.to_thread.run_sync(main, list(argv))


def refund_then_lookup(order: str) -> list[list[FakeCall]]:
    """A turn whose first step is a refund and whose second step needs the app."""
    return [
        [FakeCall("create_refund", {"order_id": order, "amount_cents": 500}, call_id=f"r_{order}")],
        [FakeCall("get_customer", {"customer_id": "123"}, call_id=f"c_{order}")],
    ]


async def die_holding(url: str, fake: FakeAgentsAPI, session_id: str) -> CallKey:
    """A replica claimed the session's pending call ten minutes ago and died."""
    (action,) = fake.required_actions(session_id)
    key = CallKey(session_id, action["turn_id"], action["call_id"])
    dead = open_store(url, clock=lambda: time.time() - 600)
    await dead.open()
    try:
        await dead.record_delivery(f"wh_{session_id}", session_id)
        await dead.claim_call(
            key, tool_name=action["name"], owner="dead-replica:1", lease_seconds=5
        )
    finally:
        await dead.close()
    return key


@contextlib.asynccontextmanager
async def running_service(url: str, fake: FakeAgentsAPI, base_url: str) -> AsyncIterator[str]:
    """The app and its operator page on one host under uvicorn; yields the host's root
    once the app's start-up recovery pass is over."""
    client = AgentsClient(api_key="sk-test", base_url=base_url)
    webhooks = AgentWebhookApp(
        example_tools, webhook_secret=SECRET, client=client, store=url, settings=SETTINGS
    )
    host = Starlette(routes=webhook_routes(webhooks), lifespan=webhooks.lifespan)
    mount_admin(host, AdminApp(webhooks, tokens=[TOKEN]))
    async with serve_app(host) as root:
        await webhooks.dispatcher.sweep()  # passes do not overlap: the start-up one is over
        fake.add_webhook_url(root + "/openai/webhooks")
        yield root


@pytest.mark.parametrize("backend", DURABLE)
async def test_a_call_in_doubt_is_found_explained_and_settled(
    backend: str,
    tmp_path: Path,
    browser: Browser,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two sessions, each stuck on a refund its dead replica held: the CLI lists both as in
    doubt and explains one; one is settled with ``calls settle --error``, the other on the
    page (filtered to the calls in doubt) with an output; both results are submitted once,
    each session goes on to its next step (answered by the app) and ends idle; the app
    logs each finished call. A third session calls a tool named with markup: the page
    shows the name as text."""
    monkeypatch.setenv("EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    fake = FakeAgentsAPI(webhook_secret=SECRET)
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        with caplog.at_level(logging.INFO, logger="agentfn_asgi"):
            async with running_service(url, fake, base_url) as root:
                # Another replica took both refunds, then died (its webhooks never came here).
                fake.remove_webhook_url(root + "/openai/webhooks")
                by_cli = fake.create_session(refund_then_lookup("o1"))
                by_page = fake.create_session(refund_then_lookup("o2"))
                cli_key = await die_holding(url, fake, by_cli)
                page_key = await die_holding(url, fake, by_page)
                fake.add_webhook_url(root + "/openai/webhooks")
                # Found.
                assert await run_cli("calls", "--state", "in_doubt", "--json", "--store", url) == 0
                found = {c["call_id"] for c in json.loads(capsys.readouterr().out)}
                assert found == {cli_key.call_id, page_key.call_id}
                # Explained.
                assert await run_cli("calls", "show", cli_key.call_id, "--store", url) == 0
                shown = capsys.readouterr().out
                assert "in_doubt" in shown and "dead-replica:1" in shown
                assert f"calls settle {cli_key.call_id} --session {by_cli}" in shown
                # Settled from the terminal.
                code = await run_cli(
                    "calls", "settle", cli_key.call_id, "--error", "refund done by hand",
                    "--store", url,
                )  # fmt: skip
                assert code == 0, capsys.readouterr()
                assert capsys.readouterr().out.startswith("submitted:")
                # A session calls a tool whose name is markup: the app answers it (no such
                # handler) and the page must show the name as text.
                hostile = fake.create_session(
                    [[FakeCall(HOSTILE_TOOL, {"q": "<script>alert(2)</script>"}, call_id="x_1")]]
                )
                await fake.wait_idle(hostile, timeout=20)
                # Settled on the page.
                await in_browser(browser, lambda d: settle_on_page(d, root, page_key))
                await fake.wait_idle(by_cli, timeout=20)
                await fake.wait_idle(by_page, timeout=20)

    answers = {(s.session_id, s.call_id): s for s in fake.submissions}
    assert len(answers) == len(fake.submissions) == 5
    assert not answers[(hostile, "x_1")].success
    refused = answers[(by_cli, cli_key.call_id)]
    assert not refused.success and refused.error == "refund done by hand"
    manual = answers[(by_page, page_key.call_id)]
    assert manual.success and json.loads(manual.output) == {"refund_id": "re_manual"}
    assert answers[(by_cli, "c_o1")].success and answers[(by_page, "c_o2")].success
    assert not (tmp_path / "ledger.jsonl").exists()  # nobody ran a refund twice: nor once
    finished = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("call finished")
    ]
    assert any("c_o1" in line for line in finished) and any("c_o2" in line for line in finished)


def settle_on_page(driver: WebDriver, root: str, key: CallKey) -> None:
    """Log in; see the markup tool name as text; filter the calls to those in doubt, open
    the call, settle it with an output through the confirmation step, see it submitted."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    site = root + ADMIN_PATH
    log_in(driver, site, "/calls")
    wait_title(driver, "Calls")
    tools = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "table.calls td code")]
    assert HOSTILE_TOOL in tools
    assert driver.find_elements(By.TAG_NAME, "img") == []
    assert driver.execute_script("return document.querySelectorAll('[onerror]').length") == 0
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is the check

    Select(driver.find_element(By.NAME, "state")).select_by_value("in_doubt")
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait_until(driver, "the filtered list", lambda d: "state=in_doubt" in d.current_url)
    listed = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")]
    assert len(listed) == 1 and key.call_id in listed[0]
    driver.find_element(By.LINK_TEXT, key.call_id).click()
    wait_title(driver, f"Call {key.call_id}")
    form = driver.find_element(By.CSS_SELECTOR, "form.settle")
    form.find_element(By.CSS_SELECTOR, 'input[value="output"]').click()
    form.find_element(By.NAME, "value").send_keys('{"refund_id": "re_manual"}')
    form.find_element(By.TAG_NAME, "button").click()
    wait_title(driver, f"Settle call {key.call_id}?")
    driver.find_element(By.CSS_SELECTOR, "form.confirm button").click()
    wait_title(driver, f"Call {key.call_id}")
    wait_until(
        driver,
        "the call shown succeeded (submitted)",
        lambda d: d.find_element(By.CSS_SELECTOR, "dl.summary .state").text == "succeeded",
    )
