"""Regenerate the operator page's screenshots: ``make screenshots`` (docs/screenshots/*.png).

Serves the page over loopback with the test double's seeded data and a fixed clock (so the
pictures only change when the page does) and photographs each page in headless Chromium.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import anyio
import anyio.to_thread

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.integrations.starlette import ADMIN_PATH
from agentfn_asgi.operator import CallSummary
from agentfn_asgi.testing import serve_app

from .browser import chromium, find_browser
from .conftest import NOW, TOKEN, host_app
from .memory_view import MemoryOperatorView, seed

WIDTH = 1280


def _shoot(site: str, out: Path, held: CallSummary) -> list[Path]:
    from selenium.webdriver.common.by import By

    browser, why = find_browser()
    if browser is None:
        raise SystemExit(f"no browser for screenshots: {why}")
    saved: list[Path] = []
    with chromium(browser, size=(WIDTH, 800)) as driver:

        def snap(name: str) -> None:
            # The whole page, not just the window (Chrome DevTools' full-page capture).
            size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": WIDTH, "height": size["height"], "scale": 1}
            shot = driver.execute_cdp_cmd(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip},
            )
            path = out / f"{name}.png"
            path.write_bytes(base64.b64decode(shot["data"]))
            saved.append(path)

        driver.get(site + "/")
        snap("login")
        driver.find_element(By.NAME, "token").send_keys(TOKEN)
        driver.find_element(By.CSS_SELECTOR, "form.login button").click()
        for name, route in [
            ("overview", "/"),
            ("calls", "/calls?limit=15"),
            ("attention", "/attention"),
            ("deliveries", "/deliveries"),
            ("call", f"/call?id={held.call_id}&session={held.session_id}"),
        ]:
            driver.get(site + route)
            snap(name)
        form = driver.find_element(By.CSS_SELECTOR, "form.settle")
        form.find_element(By.NAME, "value").send_keys('{"refund_id": "re_manual_1"}')
        form.find_element(By.TAG_NAME, "button").click()
        snap("confirm")
    return saved


async def _main(out: Path) -> None:
    view = MemoryOperatorView(store="sqlite:///var/lib/app/agentfn.sqlite3")
    held = seed(view, NOW).held
    admin = AdminApp(view, tokens=[TOKEN], clock=lambda: NOW)
    async with serve_app(host_app(admin)) as root:
        saved = await anyio.to_thread.run_sync(_shoot, root + ADMIN_PATH, out, held)
    for path in saved:
        print(path)


def main(argv: list[str]) -> None:
    """``python -m tests.admin.screenshots [OUT_DIR]`` (default docs/screenshots)."""
    out = Path(argv[0] if argv else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    anyio.run(_main, out)


if __name__ == "__main__":
    main(sys.argv[1:])
