"""Fixtures of the operator page's tests: the data it shows, the app, an HTTP client.

``admin_scenario`` is the one place that decides which :class:`OperatorView` the page tests
run against. Today it is the in-memory TEST DOUBLE (``memory_view.py``); to run the same
HTTP and browser tests against the real view, make it build a store and a dispatcher with
the same situations (a held call, a call in doubt, a call whose tool name is markup, a
running call, more than one page of calls) and return them in an :class:`AdminScenario`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.integrations.starlette import ADMIN_PATH, mount_admin
from agentfn_asgi.operator import CallSummary, OperatorView

from .memory_view import MemoryOperatorView, seed

#: A fixed "now" for the double's data, so ages and screenshots do not drift.
NOW = 1_764_700_000.0
TOKEN = "op-token-4f9c2d1e7a"
OTHER_TOKEN = "op-token-rotated-88b1"


@dataclass(frozen=True, slots=True)
class AdminScenario:
    """A view with known calls in it, and the clock the page should use with it."""

    view: OperatorView
    held: CallSummary  # quarantined: waits for an operator, settleable
    in_doubt: CallSummary  # settleable
    hostile: CallSummary  # its tool name is '<img src=x onerror=alert(1)>'
    running: CallSummary  # claimed: settling it must be refused
    clock: Callable[[], float]


@pytest.fixture
async def admin_scenario() -> AdminScenario:
    """SWAP POINT: the view every page test reads (see the module docstring)."""
    view = MemoryOperatorView(store="sqlite:///var/lib/app/agentfn.sqlite3")
    seeded = seed(view, NOW)
    return AdminScenario(
        view=view,
        held=seeded.held,
        in_doubt=seeded.in_doubt,
        hostile=seeded.hostile,
        running=seeded.running,
        clock=lambda: NOW,
    )


AdminFactory = Callable[..., AdminApp]


@pytest.fixture
def make_admin(admin_scenario: AdminScenario) -> AdminFactory:
    """``make_admin(**options)`` → an AdminApp over the scenario's view (tokens=[TOKEN]
    unless ``tokens``/``authorizer`` are given)."""

    def make(**options: Any) -> AdminApp:
        if "tokens" not in options and "authorizer" not in options:
            options["tokens"] = [TOKEN]
        options.setdefault("clock", admin_scenario.clock)
        return AdminApp(admin_scenario.view, **options)

    return make


def host_app(admin: AdminApp) -> Starlette:
    """A Starlette host with the page mounted at ``/openai/admin`` by the one-line helper."""
    host = Starlette()
    mount_admin(host, admin)
    return host


@pytest.fixture
async def client(make_admin: AdminFactory) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for a host serving ``make_admin()`` at ``/openai/admin``."""
    transport = httpx.ASGITransport(app=host_app(make_admin()))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        yield http


def admin_url(route: str = "/") -> str:
    """The page's URL for ``route`` on the test host."""
    return ADMIN_PATH + route
