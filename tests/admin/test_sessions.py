"""The operator page's sessions over HTTP: logout ends a session on the server (a copied
cookie is refused afterwards, by every replica and after a restart: the revocation is in
the app's store), and failed logins are throttled per client (429, Retry-After): per
browser that logged in before, else per address (behind trusted proxies, the forwarded one)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.admin.auth import BROWSER_COOKIE, LOGIN_FAILURES, LOGIN_WINDOW, LoginThrottle
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.operator import Operator
from agentfn_asgi.store import open_store

from ..support.backends import DURABLE, store_url_for
from .conftest import NOW, TOKEN, AdminFactory, AdminScenario, admin_url, host_app
from .test_app import BEARER, HTML, csrf_of, login, settle_form

pytestmark = pytest.mark.anyio


def connect(app: AdminApp, client: tuple[str, int] = ("127.0.0.1", 50000)) -> httpx.AsyncClient:
    """A client for a host serving ``app`` at /openai/admin, from address ``client``."""
    transport = httpx.ASGITransport(app=host_app(app), client=client)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def logged_in_cookie(app: AdminApp) -> tuple[str, str]:
    """Log in through the form: the session cookie's value and the page's CSRF token."""
    async with connect(app) as http:
        assert (await login(http)).status_code == 303
        page = await http.get(admin_url("/"))
        return http.cookies["agentfn_admin"], csrf_of(page.text)


async def log_out(app: AdminApp, cookie: str, csrf: str) -> httpx.Response:
    async with connect(app) as http:
        http.cookies.set("agentfn_admin", cookie)
        return await http.post(admin_url("/logout"), data={"csrf": csrf})


async def with_cookie(app: AdminApp, cookie: str, route: str = "/") -> httpx.Response:
    """A browser's GET of ``route`` carrying ``cookie`` (a copy of someone's session)."""
    async with connect(app) as http:
        http.cookies.set("agentfn_admin", cookie)
        return await http.get(admin_url(route), headers=HTML)


# -- logout ----------------------------------------------------------------------------------


async def test_a_copied_cookie_is_refused_after_logout(
    make_admin: AdminFactory, admin_scenario: AdminScenario
) -> None:
    """Before logout a copy of the cookie works; after it, the copy is sent to the login
    form, cannot settle (not even with the session's CSRF token), and the login form no
    longer skips itself for it. A bearer client is not affected."""
    app = make_admin()
    cookie, csrf = await logged_in_cookie(app)
    assert (await with_cookie(app, cookie)).status_code == 200
    response = await log_out(app, cookie, csrf)
    assert response.status_code == 303 and "max-age=0" in response.headers["set-cookie"].lower()

    refused = await with_cookie(app, cookie)
    assert refused.status_code == 303
    assert refused.headers["location"].startswith(admin_url("/login"))
    assert (await with_cookie(app, cookie, "/login")).status_code == 200  # the form, again
    async with connect(app) as http:
        http.cookies.set("agentfn_admin", cookie)
        form = settle_form(admin_scenario.held, csrf, mode="rerun", confirm="yes")
        settle = await http.post(admin_url("/settle"), data=form)
        assert settle.status_code == 401
        assert (await http.get(admin_url("/"), headers=BEARER)).status_code == 200
    assert admin_scenario.view.settle_calls == []  # type: ignore[attr-defined]


async def test_logout_ends_only_its_own_session(make_admin: AdminFactory) -> None:
    """Another login of the same token (another operator, another browser) goes on."""
    app = make_admin()
    mine, csrf = await logged_in_cookie(app)
    theirs, _ = await logged_in_cookie(app)
    await log_out(app, mine, csrf)
    assert (await with_cookie(app, mine)).status_code == 303
    assert (await with_cookie(app, theirs)).status_code == 200


@pytest.mark.backends
@pytest.mark.parametrize("backend", DURABLE)
async def test_logout_holds_for_every_replica_and_after_a_restart(
    backend: str, tmp_path: Path
) -> None:
    """The real view over a real store: two replicas (each its own store connection and
    page); logging out on one refuses the copied cookie on the other, and on a page
    started afterwards over the same store (a restart)."""
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url_for(backend, tmp_path))

        async def replica() -> AdminApp:
            store = open_store(url)
            await store.open()
            stack.push_async_callback(store.close)
            return AdminApp(Operator(store, location=url), tokens=[TOKEN])

        first, second = await replica(), await replica()
        cookie, csrf = await logged_in_cookie(first)
        assert (await with_cookie(second, cookie)).status_code == 200
        assert (await log_out(first, cookie, csrf)).status_code == 303
        assert (await with_cookie(second, cookie)).status_code == 303
        restarted = await replica()
        assert (await with_cookie(restarted, cookie)).status_code == 303
        other, _ = await logged_in_cookie(restarted)
        assert (await with_cookie(second, other)).status_code == 200


async def test_a_store_outage_refuses_cookies_with_a_503(
    make_admin: AdminFactory, admin_scenario: AdminScenario
) -> None:
    """Whether a cookie was logged out cannot be read without the store: 503, not a way
    in and not a 500; logging out during the outage says so and revokes nothing."""
    app = make_admin()
    cookie, csrf = await logged_in_cookie(app)
    admin_scenario.view.down = True  # type: ignore[attr-defined]
    assert (await with_cookie(app, cookie)).status_code == 503
    assert (await log_out(app, cookie, csrf)).status_code == 503
    admin_scenario.view.down = False  # type: ignore[attr-defined]
    assert (await with_cookie(app, cookie)).status_code == 200


# -- failed logins ---------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_failed_logins_are_throttled_per_client_address(make_admin: AdminFactory) -> None:
    """After 5 failures from one address the login form answers 429 with Retry-After
    (even to the right token, which is not looked at) until the first failure is 5 minutes
    old; another address logs in meanwhile; a good login clears an address's count."""
    clock = Clock()
    app = make_admin(clock=clock)
    async with connect(app, ("198.51.100.7", 40000)) as guesser:
        for _ in range(LOGIN_FAILURES):
            assert (await login(guesser, token="op-token-guessed-000")).status_code == 401
            clock.now += 10
        throttled = await login(guesser)
        assert throttled.status_code == 429
        assert throttled.headers["retry-after"] == str(int(LOGIN_WINDOW - 50))
        assert "set-cookie" not in throttled.headers
        assert "Too many failed logins" in throttled.text
        async with connect(app, ("198.51.100.8", 40000)) as neighbour:
            assert (await login(neighbour)).status_code == 303
        clock.now += LOGIN_WINDOW - 50
        assert (await login(guesser)).status_code == 303
    async with connect(app, ("203.0.113.9", 40000)) as typo:
        for _ in range(LOGIN_FAILURES - 1):
            assert (await login(typo, token="op-token-typo-00000")).status_code == 401
        assert (await login(typo)).status_code == 303
        assert (await login(typo, token="op-token-typo-00000")).status_code == 401


async def test_concurrent_guesses_cannot_slip_past_the_limit(make_admin: AdminFactory) -> None:
    """Twenty wrong logins sent at once from one address, each body arriving a moment after
    its headers: at most five are checked (401), the others get 429 (each try is counted
    before its form is read)."""
    app = make_admin(clock=Clock())
    host = host_app(app)

    async def bodies_come_later(scope: Scope, receive: Receive, send: Send) -> None:
        async def later() -> Message:
            for _ in range(5):  # let every other request run up to its own body first
                await asyncio.sleep(0)
            return await receive()

        await host(scope, later, send)

    transport = httpx.ASGITransport(app=bodies_come_later, client=("198.51.100.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as guesser:
        answers = await asyncio.gather(
            *(login(guesser, token=f"op-token-guess-{n:05d}") for n in range(20))
        )
    statuses = sorted(response.status_code for response in answers)
    assert statuses == [401] * LOGIN_FAILURES + [429] * (20 - LOGIN_FAILURES)


async def test_a_guesser_cannot_lock_out_operators_who_logged_in_before(
    make_admin: AdminFactory,
) -> None:
    """Behind a proxy that forwards no client address, everybody has the proxy's address.
    A guesser's five failures lock that address out, but not a browser that logged in
    before (its failures count on their own, by its cookie); bearer tokens and signed links
    are never throttled. A browser that never logged in, or a forged browser cookie, counts
    as the address."""
    proxy = ("10.0.0.2", 40000)
    app = make_admin(clock=Clock())
    async with connect(app, proxy) as operator:
        assert (await login(operator)).status_code == 303
        assert BROWSER_COOKIE in operator.cookies
        operator.cookies.delete("agentfn_admin")  # the session ended; the browser stays known
        async with connect(app, proxy) as guesser:
            for _ in range(LOGIN_FAILURES):
                assert (await login(guesser, token="op-token-guessed-000")).status_code == 401
            assert (await login(guesser)).status_code == 429
        assert (await login(operator)).status_code == 303
    async with connect(app, proxy) as newcomer:
        assert (await login(newcomer)).status_code == 429  # the stated limit
        newcomer.cookies.set(BROWSER_COOKIE, "forged.cookie.value", path="/openai/admin")
        assert (await login(newcomer)).status_code == 429
        assert (await newcomer.get(admin_url("/"), headers=BEARER)).status_code == 200
        link = await newcomer.post(
            admin_url("/approval"),
            content=b"t=not-a-link",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert link.status_code == 403


async def test_a_trusted_proxys_forwarded_address_is_the_client(make_admin: AdminFactory) -> None:
    """With ``trusted_proxies``, the address a trusted proxy forwards (X-Forwarded-For, from
    the right) is the client: a guesser behind it is locked out, a neighbour behind the same
    proxy is not. The header of a peer that is not a trusted proxy is not believed."""
    app = make_admin(clock=Clock(), trusted_proxies=["10.0.0.0/8"])
    via_proxy = ("10.0.0.2", 40000)

    def forwarded(address: str) -> dict[str, str]:
        return {"x-forwarded-for": address}

    async with connect(app, via_proxy) as http:
        for _ in range(LOGIN_FAILURES):
            guess = await http.post(
                admin_url("/login"),
                data={"token": "op-token-guessed-000"},
                headers=forwarded("198.51.100.7, 10.0.0.9"),
            )
            assert guess.status_code == 401
        locked = await http.post(
            admin_url("/login"), data={"token": TOKEN}, headers=forwarded("198.51.100.7")
        )
        assert locked.status_code == 429
        neighbour = await http.post(
            admin_url("/login"), data={"token": TOKEN}, headers=forwarded("198.51.100.8")
        )
        assert neighbour.status_code == 303
        for garbage in ("not-an-address", "", "198.51.100.9, ::zz, 10.0.0.3"):
            hostile = await http.post(
                admin_url("/login"), data={"token": TOKEN}, headers=forwarded(garbage)
            )
            assert hostile.status_code == 303  # the proxy's (or the last good hop's) count
    async with connect(app, ("203.0.113.5", 40000)) as spoofer:
        for n in range(LOGIN_FAILURES):
            guess = await spoofer.post(
                admin_url("/login"),
                data={"token": "op-token-guessed-000"},
                headers=forwarded(f"192.0.2.{n}"),
            )
            assert guess.status_code == 401
        assert (await login(spoofer)).status_code == 429
    with pytest.raises(ConfigurationError, match="trusted_proxies"):
        make_admin(trusted_proxies=["not-an-address"])


def test_one_ipv6_host_is_one_client() -> None:
    """Addresses of one /64 count as one client (a host can use any of them); IPv4-mapped
    IPv6 is its IPv4 address; no address at all is one client too."""

    def client(host: str | None) -> str:
        peer = None if host is None else (host, 1)
        return LoginThrottle(clock=Clock()).client_of(Request({"type": "http", "client": peer}))

    assert client("2001:db8:0:1::1") == client("2001:db8:0:1:ffff::9") == "2001:db8:0:1::/64"
    assert client("2001:db8:0:2::1") == "2001:db8:0:2::/64"
    assert client("::ffff:192.0.2.1") == client("192.0.2.1") == "192.0.2.1"
    assert client(None) == "unknown"


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    """Past ``clients`` addresses the least recently failed one is forgotten; an address
    keeps at most ``failures`` times; old failures fall out of the window."""
    clock = Clock()
    throttle = LoginThrottle(failures=3, window=60, clients=100, clock=clock)
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(throttle) == 100
    for _ in range(50):
        throttle.failed("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == 60
    clock.now += 61
    assert throttle.retry_after("192.0.2.1") == 0
