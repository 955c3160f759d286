"""Headless Chromium for the operator page's browser tests and screenshots.

Uses Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them when it runs
as root or with passwordless sudo) through Selenium (the ``dev`` extra). Nothing is
downloaded at run time: Selenium is pointed at the installed driver, so its own driver
manager never runs.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

# The flags that work on these machines (no sandbox as root, no GPU, nothing phoning home).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
INSTALL_HINT = (
    "run `make test` as root (it installs Debian's chromium and chromium-driver) or "
    "`apt-get install chromium chromium-driver`"
)


@dataclass(frozen=True, slots=True)
class Browser:
    """Where the browser and its driver are installed."""

    chromium: str
    chromedriver: str


def find_browser() -> tuple[Browser | None, str]:
    """The installed Chromium and driver, or None and why not."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, "selenium is not installed: pip install -e '.[dev]'"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing = " and ".join(
            name for name, path in [("chromium", chromium), ("chromedriver", driver)] if not path
        )
        return None, f"{missing} not found on PATH: {INSTALL_HINT}"
    return Browser(chromium=chromium, chromedriver=driver), ""


@contextlib.contextmanager
def chromium(
    browser: Browser, *, javascript: bool = True, size: tuple[int, int] = (1280, 900)
) -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile (deleted afterwards); ``javascript=False``
    turns scripts off, as a browser with JavaScript disabled would."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="agentfn-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = browser.chromium
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        options.add_argument(f"--window-size={size[0]},{size[1]}")
        # Console messages (CSP violations among them) for driver.get_log("browser").
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        if not javascript:
            options.add_experimental_option(
                "prefs", {"profile.managed_default_content_settings.javascript": 2}
            )
        driver = webdriver.Chrome(service=Service(browser.chromedriver), options=options)
        try:
            driver.set_page_load_timeout(30)
            yield driver
        finally:
            driver.quit()


def console_messages(driver: WebDriver) -> list[str]:
    """What the page logged to the console since the last call (CSP violations included)."""
    entries = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [str(entry["message"]) for entry in entries]
