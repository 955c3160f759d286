"""The page's gate: configuration refusals, tokens, session cookies, rotation, CSRF."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message

from agentfn_asgi import AgentWebhookApp, Config, FunctionTools
from agentfn_asgi.admin import AdminApp
from agentfn_asgi.admin.auth import Gate
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.integrations.starlette import ADMIN_PATH

from ..support.clock import FakeClock
from .conftest import TOKEN, host_app
from .memory_view import MemoryOperatorView

A = "token-aaaaaaaaaaaaaaaa"
B = "token-bbbbbbbbbbbbbbbb"


def gate(
    tokens: list[str] | None = None, *, secret: str | None = None, clock: FakeClock | None = None
) -> Gate:
    return Gate(
        tokens=tokens if tokens is not None else [A],
        authorizer=None,
        secret=secret,
        max_age=3600,
        clock=clock or FakeClock(),
    )


def test_the_page_refuses_to_start_unconfigured() -> None:
    """No token and no authorizer: a ConfigurationError that names both fixes."""
    with pytest.raises(ConfigurationError, match="off unless configured") as info:
        AdminApp(MemoryOperatorView())
    assert "AGENTFN_ADMIN_TOKEN" in str(info.value) and "authorizer=" in str(info.value)
    with pytest.raises(ConfigurationError, match="off unless configured"):
        AdminApp(MemoryOperatorView(), tokens=[])


async def _get(admin: AdminApp) -> httpx.Response:
    transport = httpx.ASGITransport(app=host_app(admin))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        return await http.get(ADMIN_PATH + "/", headers={"authorization": f"Bearer {TOKEN}"})


async def _lifespan(admin: AdminApp) -> Message:
    """The page's answer to a server's lifespan start-up."""
    inbox: list[Message] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return inbox.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await admin({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    return sent[0]


@pytest.mark.anyio
async def test_a_page_on_an_unconfigured_app_imports_and_fails_at_start_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``AdminApp(webhooks.operator(), ...)`` at module level ran the app's checks at import
    (app.py failed to import without secrets). Built on the webhook app, the page checks
    nothing then; its start-up names the app's problem in one line, its requests get 503
    and the log says why, once."""
    webhooks = AgentWebhookApp(FunctionTools(), config=Config(admin_tokens=(TOKEN,)))
    admin = AdminApp(webhooks)  # at import: no secret, no key, nothing raised
    started = await _lifespan(admin)
    assert started["type"] == "lifespan.startup.failed"
    assert started["message"].startswith("agentfn-asgi cannot start: 2 configuration problems")
    assert "\n" not in started["message"]
    with caplog.at_level(logging.ERROR, logger="agentfn_asgi.admin"):
        for _ in range(2):
            page = await _get(admin)
            assert page.status_code == 503 and "the server log says why" in page.text
    [logged] = [r.getMessage() for r in caplog.records if "cannot start" in r.getMessage()]
    assert "no webhook secret" in logged
    assert "OPENAI_WEBHOOK_SECRET" not in page.text  # the reason is for the operator's log


@pytest.mark.anyio
async def test_a_page_on_the_app_takes_its_tokens_from_the_app_and_is_off_without() -> None:
    """The tokens default to the app's AGENTFN_ADMIN_TOKEN; without one the page answers 404
    everywhere, as if it were not mounted."""
    ready = Config(webhook_secrets=("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",), api_key="sk-1")
    on = AgentWebhookApp(
        FunctionTools(),
        store="memory://",
        config=dataclasses.replace(ready, admin_tokens=(TOKEN,)),
    )
    assert (await _lifespan(AdminApp(on)))["type"] == "lifespan.startup.complete"
    assert (await _get(AdminApp(on))).status_code == 200
    await on.shutdown()  # the overview asked its client (a pool to close)
    off = AgentWebhookApp(FunctionTools(), store="memory://", config=ready)
    assert (await _get(AdminApp(off))).status_code == 404
    short = AdminApp(off, tokens=["short"])  # built: checked at start-up
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        short.check()
    with pytest.raises(ConfigurationError, match="build the page on the webhook app"):
        AdminApp(MemoryOperatorView(), tokens=[TOKEN], public_url="https://ops.example/admin")


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["short"], "at least 16 characters"),
        ([" " + A], "without spaces"),
        (["tok\nen-aaaaaaaaaaaaaaa"], "without spaces"),
        ([A + " " + B], "without spaces"),
        ([A + "," + B], "without spaces"),
    ],
)
def test_weak_or_malformed_tokens_are_refused(tokens: list[str], message: str) -> None:
    """The page can settle calls: a short token, or two joined in one string, is refused."""
    with pytest.raises(ConfigurationError, match=message):
        AdminApp(MemoryOperatorView(), tokens=tokens)


def test_a_single_string_is_one_token_and_every_token_matches() -> None:
    """``tokens="..."`` is one token; with several, each opens a session of its own key."""
    assert gate([A]).match_token(A.encode()) is not None
    assert Gate(tokens=A, authorizer=None, secret=None, max_age=60, clock=FakeClock()).tokens == (
        A.encode(),
    )
    both = gate([A, B])
    key_a, key_b = both.match_token(A.encode()), both.match_token(B.encode())
    assert key_a is not None and key_b is not None and key_a != key_b
    assert both.match_token(b"token-cccccccccccccccc") is None
    assert both.match_token(A.encode()[:-1]) is None
    assert both.match_token(b"") is None


def test_session_cookies_round_trip_and_expire() -> None:
    """A cookie proves its session until max_age has passed on the injected clock."""
    clock = FakeClock()
    g = gate(clock=clock)
    key = g.match_token(A.encode())
    session, cookie = g.open_session(key)
    assert g.read_session(cookie) == session and session.via == "token"
    clock.now += 3599
    assert g.read_session(cookie) == session
    clock.now += 2
    assert g.read_session(cookie) is None


def test_a_revocation_lasts_as_long_as_the_cookie_is_accepted() -> None:
    """A session knows when it was issued; its revocation must be kept until at least the
    last moment its cookie is still accepted (and need not be kept past it)."""
    clock = FakeClock()
    g = gate(clock=clock)
    session, cookie = g.open_session(g.match_token(A.encode()))
    assert session.issued_at == clock.now
    last_accepted = clock.now
    while g.read_session(cookie) is not None:
        last_accepted = clock.now
        clock.now += 1
    assert last_accepted < g.expires_at(session) <= last_accepted + 2


def test_tampered_or_foreign_cookies_prove_nothing() -> None:
    """Altered, truncated, oversized or differently-keyed cookies are all None."""
    g = gate()
    _session, cookie = g.open_session(g.match_token(A.encode()))
    # Alter the signature's first character: all six of its bits are signature bits (the
    # last character's low bits are base64 padding, and changing only those decodes to
    # the same signature: the earlier version of this test failed about once in 16 runs).
    signed, _, signature = cookie.rpartition(".")
    first = "A" if signature[0] != "A" else "B"
    tampered = f"{signed}.{first}{signature[1:]}"
    for bad in [tampered, cookie[:20], cookie + "x" * 2000, "", "not.a.cookie"]:
        assert g.read_session(bad) is None
    assert gate([B]).read_session(cookie) is None


def test_rotation_adding_keeps_sessions_removing_ends_them() -> None:
    """Adding a token keeps every session; removing one ends only the sessions it opened;
    changing ``secret`` ends them all."""
    old = gate([A])
    _s, cookie_a = old.open_session(old.match_token(A.encode()))
    during = gate([A, B])
    assert during.read_session(cookie_a) is not None
    _s, cookie_b = during.open_session(during.match_token(B.encode()))
    after = gate([B])
    assert after.read_session(cookie_a) is None
    assert after.read_session(cookie_b) is not None

    signed = gate([A], secret="s" * 32)
    _s, cookie = signed.open_session(signed.match_token(A.encode()))
    assert gate([A], secret="s" * 32).read_session(cookie) is not None
    assert gate([A], secret="t" * 32).read_session(cookie) is None
    assert gate([A]).read_session(cookie) is None


def test_a_host_cookie_never_grants_a_token_session() -> None:
    """The CSRF-only cookie given after a host login stays 'host', whatever it claims."""
    g = Gate(tokens=[A], authorizer=lambda r: True, secret=None, max_age=60, clock=FakeClock())
    session, cookie = g.open_session()
    assert session.via == "host"
    assert g.read_session(cookie) == session


def test_csrf_tokens_are_bound_to_their_session() -> None:
    """A session's token checks; another session's token, or none, does not."""
    g = gate()
    first, _ = g.open_session(g.match_token(A.encode()))
    second, _ = g.open_session(g.match_token(A.encode()))
    assert g.check_csrf(first, g.csrf_token(first))
    assert not g.check_csrf(first, g.csrf_token(second))
    assert not g.check_csrf(first, "")
    assert not g.check_csrf(None, g.csrf_token(first))
    assert not g.check_csrf(first, "é" * 43)


@pytest.mark.anyio
async def test_authorizer_only_true_or_a_name_allows_and_exceptions_deny(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sync or async; True allows anonymously, a name allows as that person (recorded with
    their decisions, printable and bounded); other truthy values, an empty or unprintable
    name and a raising authorizer deny (the last logs)."""
    request = Request({"type": "http", "headers": [], "method": "GET", "path": "/"})

    async def async_yes(r: Request) -> bool:
        return True

    def broken(r: Request) -> bool:
        raise RuntimeError("session store down")

    verdicts = {}
    for name, authorizer in {
        "sync": lambda r: True,
        "async": async_yes,
        "name": lambda r: " alice\x1b[2J  smith ",
        "long": lambda r: "x" * 100,
        "blank": lambda r: "\x1b\n",
        "truthy": lambda r: 1,
        "false": lambda r: False,
        "broken": broken,
    }.items():
        g = Gate(tokens=None, authorizer=authorizer, secret=None, max_age=60, clock=FakeClock())  # type: ignore[arg-type]
        verdicts[name] = await g.host_allows(request)
    assert verdicts == {
        "sync": "",
        "async": "",
        "name": "alice[2J smith",
        "long": "x" * 64,
        "blank": None,
        "truthy": None,
        "false": None,
        "broken": None,
    }
    assert "authorizer raised" in caplog.text


def test_links_that_only_this_process_can_read_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``authorizer=`` and ``public_url=`` without ``secret=`` (or a token): the link key is
    random per process, so another replica (or a restart) refuses the links; a WARNING says
    so at start. With ``secret=`` (or a token) every process reads every link, silently."""
    url = "https://ops.example.com/openai/admin"
    ready = Config(webhook_secrets=("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",), api_key="sk-1")

    def replica(**options: Any) -> AdminApp:
        app = AgentWebhookApp(FunctionTools(), store="memory://", config=ready)
        page = AdminApp(app, authorizer=lambda request: True, **options)
        page.check()  # what its start-up does
        return page

    caplog.set_level("WARNING", logger="agentfn_asgi.admin")
    one, other = replica(public_url=url), replica(public_url=url)
    token = one.links.token("apr_1", "digest", expires_at=4e9)
    with pytest.raises(ValueError, match="not valid"):
        other.links.read(token)  # the situation warned about
    warned = [r for r in caplog.records if "signed with a key made for this process" in r.message]
    assert len(warned) == 2 and all(r.levelname == "WARNING" for r in warned)
    assert "secret=" in warned[0].message

    caplog.clear()
    shared = {"public_url": url, "secret": "s" * 32}
    one, other = replica(**shared), replica(**shared)
    assert other.links.read(one.links.token("apr_1", "digest", expires_at=4e9)).approval_id
    with_token = AgentWebhookApp(FunctionTools(), store="memory://", config=ready)
    AdminApp(with_token, tokens=[A], public_url=url).check()
    replica()  # no public URL: no links to warn about
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
