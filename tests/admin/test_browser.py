"""The operator page in a real browser: headless Chromium over loopback.

The page is served by uvicorn (a Starlette host, mounted at /openai/admin by the one-line
helper) on the test's event loop; Selenium drives Chromium from a worker thread. Without a
browser these tests skip with the way to install one, except under ``CI=true``, where they
fail (``make test`` installs it there).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import anyio
import pytest

from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.testing import serve_app
from tests.store.conftest import require_service

from .browser import Browser, chromium, console_messages, find_browser
from .conftest import TOKEN, AdminFactory, AdminScenario, host_app
from .memory_view import HOSTILE_TOOL

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

pytestmark = pytest.mark.slow


@pytest.fixture
def browser() -> Browser:
    """The installed Chromium; skipped (failed under CI=true) when there is none."""
    found, why = find_browser()
    if found is None:
        require_service("chromium", why)
    return found


@pytest.fixture
async def site(make_admin: AdminFactory) -> AsyncIterator[str]:
    """The page's URL on a loopback uvicorn serving a Starlette host."""
    async with serve_app(host_app(make_admin())) as root:
        yield root + ADMIN_PATH


async def in_browser(
    browser: Browser, steps: Callable[[WebDriver], None], *, javascript: bool = True
) -> None:
    """Run ``steps`` with a fresh Chromium in a thread, while the server runs on this loop."""

    def run() -> None:
        with chromium(browser, javascript=javascript) as driver:
            steps(driver)

    await anyio.to_thread.run_sync(run)


def wait_until(driver: WebDriver, what: str, check: Callable[[WebDriver], bool]) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 15, poll_frequency=0.05).until(check, message=f"waiting for {what}")


def wait_title(driver: WebDriver, title: str) -> None:
    wait_until(driver, f"title {title!r}", lambda d: d.title.startswith(title))


def log_in(driver: WebDriver, site: str, path: str = "/") -> None:
    """Open ``path``, get sent to the login form, submit the token, land on ``path``."""
    from selenium.webdriver.common.by import By

    driver.get(site + path)
    wait_title(driver, "Log in")
    driver.find_element(By.NAME, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_until(driver, "leaving the login form", lambda d: not d.title.startswith("Log in"))


@pytest.mark.anyio
async def test_an_operator_logs_in_filters_opens_and_settles_a_held_call(
    browser: Browser, site: str, admin_scenario: AdminScenario
) -> None:
    """With JavaScript off: log in (form → HttpOnly, SameSite=Strict cookie), filter the
    calls, open the held call, show its content, settle it with an output through the
    confirmation step, and see it submitted."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    held = admin_scenario.held

    def steps(driver: WebDriver) -> None:
        log_in(driver, site, "/attention")
        wait_title(driver, "Needs attention")
        cookie = driver.get_cookie("agentfn_admin")
        assert cookie is not None
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert cookie["path"] == ADMIN_PATH

        driver.find_element(By.LINK_TEXT, "Calls").click()
        wait_title(driver, "Calls")
        Select(driver.find_element(By.NAME, "state")).select_by_value("quarantined")
        driver.find_element(By.NAME, "tool").send_keys("create_refund")
        driver.find_element(By.NAME, "since").send_keys("1h")
        driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
        wait_until(driver, "the filtered list", lambda d: "state=quarantined" in d.current_url)
        rows = driver.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")
        assert len(rows) == 1
        rows[0].find_element(By.LINK_TEXT, held.call_id).click()
        wait_title(driver, f"Call {held.call_id}")
        events = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "table.timeline td code")]
        assert "quarantined" in events
        assert "ord_1042" not in driver.page_source
        driver.find_element(By.LINK_TEXT, "Show content").click()
        wait_until(driver, "the content", lambda d: "ord_1042" in d.page_source)

        form = driver.find_element(By.CSS_SELECTOR, "form.settle")
        form.find_element(By.CSS_SELECTOR, 'input[value="output"]').click()
        form.find_element(By.NAME, "value").send_keys('{"refund_id": "re_manual_1"}')
        form.find_element(By.TAG_NAME, "button").click()
        wait_title(driver, f"Settle call {held.call_id}?")
        assert "Output (sent as JSON)" in driver.find_element(By.TAG_NAME, "main").text
        driver.find_element(By.CSS_SELECTOR, "form.confirm button").click()
        wait_title(driver, f"Call {held.call_id}")

        def submitted(d: WebDriver) -> bool:
            if d.find_element(By.CSS_SELECTOR, "dl.summary .state").text == "succeeded":
                return True
            time.sleep(0.2)  # the real view may submit a moment later: look again
            d.refresh()
            return False

        wait_until(driver, "the call shown succeeded (submitted)", submitted)
        assert not driver.find_elements(By.CSS_SELECTOR, "form.settle")

    await in_browser(browser, steps, javascript=False)
    detail = await admin_scenario.view.call(held.call_id, session_id=held.session_id)
    assert detail.summary.state == "submitted"


@pytest.mark.anyio
async def test_a_tool_name_made_of_markup_is_shown_as_text(
    browser: Browser, site: str, admin_scenario: AdminScenario
) -> None:
    """With JavaScript on: '<img src=x onerror=alert(1)>' as a tool name (and a script in
    the arguments) renders as text: no element is created and no dialog opens."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    hostile = admin_scenario.hostile

    def no_markup_ran(driver: WebDriver) -> None:
        assert driver.find_elements(By.TAG_NAME, "img") == []
        assert driver.find_elements(By.TAG_NAME, "script") == []
        assert driver.execute_script("return document.querySelectorAll('[onerror]').length") == 0
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018 - reading it is the check

    def steps(driver: WebDriver) -> None:
        log_in(driver, site)
        driver.get(site + "/calls?" + urllib.parse.urlencode({"tool": HOSTILE_TOOL}))
        wait_title(driver, "Calls")
        tools = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "table.calls td code")]
        assert HOSTILE_TOOL in tools
        assert driver.find_element(By.NAME, "tool").get_attribute("value") == HOSTILE_TOOL
        no_markup_ran(driver)
        query = {"id": hostile.call_id, "session": hostile.session_id, "content": "1"}
        driver.get(site + "/call?" + urllib.parse.urlencode(query))
        wait_title(driver, f"Call {hostile.call_id}")
        assert driver.find_element(By.CSS_SELECTOR, "dl.summary code").text == HOSTILE_TOOL
        contents = [p.text for p in driver.find_elements(By.CSS_SELECTOR, "pre.content")]
        assert '{"q":"<script>alert(2)</script>"}' in contents
        no_markup_ran(driver)

    await in_browser(browser, steps, javascript=True)


@pytest.mark.anyio
async def test_every_page_loads_under_the_csp_and_pages_refresh_and_log_out(
    browser: Browser, site: str
) -> None:
    """Every page renders with its stylesheet and no CSP violation in the console; the
    next-page link and the auto-refresh toggle work; log out returns to the login form."""
    from selenium.webdriver.common.by import By

    def steps(driver: WebDriver) -> None:
        log_in(driver, site)
        for path in ["/", "/calls", "/attention", "/deliveries?all=1", "/nope"]:
            driver.get(site + path)
            header = driver.find_elements(By.TAG_NAME, "header") or driver.find_elements(
                By.TAG_NAME, "main"
            )
            assert header, path
        driver.get(site + "/")
        background = driver.find_element(By.TAG_NAME, "header").value_of_css_property(
            "background-color"
        )
        assert background == "rgba(29, 35, 48, 1)"  # the served stylesheet applied
        violations = [m for m in console_messages(driver) if "Content Security Policy" in m]
        assert violations == []

        driver.get(site + "/calls?limit=5")
        first = driver.find_element(By.CSS_SELECTOR, "table.calls tbody tr a[href*='/call?']").text
        driver.find_element(By.LINK_TEXT, "Next page").click()
        wait_until(driver, "the second page", lambda d: "cursor=" in d.current_url)
        second = driver.find_element(By.CSS_SELECTOR, "table.calls tbody tr a[href*='/call?']")
        assert second.text != first
        assert not driver.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
        driver.find_element(By.PARTIAL_LINK_TEXT, "Auto-refresh: off").click()
        wait_until(driver, "auto-refresh on", lambda d: "refresh=1" in d.current_url)
        assert driver.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
        assert "cursor=" in driver.current_url  # the toggle kept the page

        driver.find_element(By.CSS_SELECTOR, "header form button").click()
        wait_title(driver, "Log in")
        assert driver.get_cookie("agentfn_admin") is None
        driver.get(site + "/")
        wait_title(driver, "Log in")

    await in_browser(browser, steps)
