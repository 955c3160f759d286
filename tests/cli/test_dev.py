"""Commands that talk to a running ``fake-api``. ``agentfn-asgi send`` without
``--session``: with OPENAI_BASE_URL pointing at ``fake-api`` it creates a session with
nothing pending there (the app reads it and is done, without a warning); anywhere else it
refuses, naming ``--session``. ``agentfn-asgi fake-api session --call ...`` starts a session
there and prints its id. Over loopback: the fake with its control API, and the user's app,
each under uvicorn."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.cli import main
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.testing import FakeAgentsAPI, FakeControlApp, serve_app, serve_fake
from tests.support.ports import free_port
from tests.support.stack import API_KEY, FAST, SECRET
from tests.test_stream import counting_tools

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)


async def run_cli(*argv: str) -> int:
    return await anyio.to_thread.run_sync(main, list(argv))


async def test_send_creates_a_session_in_the_fake(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The delivery names a session created in the fake: the app accepts it, reads the
    session (200), finds nothing to run, and logs no warning."""
    tools, runs = counting_tools()
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake, serve_app(FakeControlApp(fake), lifespan="off") as root:
        base_url = root + "/v1"
        async with AgentsClient(api_key=API_KEY, base_url=base_url) as client:
            app = AgentWebhookApp(
                tools, webhook_secret=SECRET, client=client, store="memory://", settings=FAST
            )
            host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
            async with serve_app(host, lifespan="on") as app_root:
                monkeypatch.setenv("OPENAI_BASE_URL", base_url)
                monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
                with caplog.at_level(logging.INFO, logger="agentfn_asgi"):
                    assert await run_cli("send", app_root + "/openai/webhooks") == 0
                    (session_id,) = fake.sessions
                    async with asyncio.timeout(10):
                        while not any(
                            r.route == "retrieve" and r.path.endswith(session_id)
                            for r in fake.requests
                        ):
                            await asyncio.sleep(0.01)
    out, err = capsys.readouterr()
    assert out.startswith("200 OK") and '"status":"accepted"' in out
    assert f"created session {session_id} in the fake" in err
    assert fake.session(session_id)["status"] == "idle"
    assert [r.status for r in fake.requests if r.route == "retrieve"] == [200]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sum(runs.values()) == 0


async def test_send_refuses_without_a_session_elsewhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No OPENAI_BASE_URL, or one that is not ``fake-api`` (no control API there): exit 2
    and one line naming ``--session``; nothing is sent. Other event types need none."""
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
    url = "http://127.0.0.1:1/openai/webhooks"  # never reached
    assert await run_cli("send", url) == 2
    err = capsys.readouterr().err
    assert "pass --session SESSION_ID" in err and err.count("\n") == 1
    fake = FakeAgentsAPI(api_key=API_KEY)
    async with fake, serve_fake(fake) as base_url:  # the API alone, without /_fake/
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        assert await run_cli("send", url) == 2
        assert "pass --session" in capsys.readouterr().err
    assert fake.sessions == {}
    code = await run_cli("send", url, "--type", "agent.session.idle", "--timeout", "2")
    assert code == 1 and "could not deliver" in capsys.readouterr().err


async def test_fake_api_session_starts_a_session_the_app_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fake-api session --call`` (repeated: one step of parallel calls) creates the
    session in the fake at ``--url`` (else at ``OPENAI_BASE_URL``'s root) and prints only
    its id on stdout; the fake's webhook reaches the app, which answers every call. A tool
    the app does not have is the app's to answer (the fake takes any name)."""
    tools, runs = counting_tools()
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with (
        fake,
        serve_app(FakeControlApp(fake), lifespan="off") as root,
        AgentsClient(api_key=API_KEY, base_url=root + "/v1") as client,
    ):
        app = AgentWebhookApp(
            tools, webhook_secret=SECRET, client=client, store="memory://", settings=FAST
        )
        host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
        async with serve_app(host, lifespan="on") as app_root:
            fake.add_webhook_url(app_root + "/openai/webhooks")
            code = await run_cli(
                "fake-api", "session", "--url", root,
                "--call", 'lookup:{"key": "a"}', "--call", 'lookup:{"key": "b"}',
            )  # fmt: skip
            out, err = capsys.readouterr()
            assert code == 0, err
            session_id = out.strip()
            assert out == session_id + "\n" and session_id in fake.sessions
            assert f"created session {session_id} with 2 call(s)" in err
            await fake.wait_idle(session_id)
            monkeypatch.setenv("OPENAI_BASE_URL", root + "/v1")
            assert await run_cli("fake-api", "session", "--call", "no_such_tool") == 0
            other = capsys.readouterr().out.strip()
            await fake.wait_idle(other)
    assert runs == {"a": 1, "b": 1}
    by_session = {(s.session_id, s.output) for s in fake.submissions if s.success}
    assert by_session == {(session_id, "value of a"), (session_id, "value of b")}
    [unknown] = [s for s in fake.submissions if s.session_id == other]
    assert not unknown.success and "no_such_tool" in (unknown.error or "")


async def test_fake_api_session_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Arguments that are not a JSON object: exit 2 before anything is sent. Nothing
    listening at the URL, or a server there without the fake's control API: exit 1 naming
    ``fake-api`` and ``--url``. Never a traceback."""
    fake = FakeAgentsAPI(api_key=API_KEY)
    async with fake, serve_app(FakeControlApp(fake), lifespan="off") as root:
        for call in ("lookup:{key: 1}", 'lookup:["a"]', ":{}"):
            assert await run_cli("fake-api", "session", "--url", root, "--call", call) == 2
            err = capsys.readouterr().err
            assert err.startswith("agentfn-asgi fake-api: ") and err.count("\n") == 1, err
        assert fake.sessions == {}
    nothing = f"http://127.0.0.1:{free_port()}"
    assert await run_cli("fake-api", "session", "--url", nothing, "--call", "lookup") == 1
    err = capsys.readouterr().err
    assert f"no fake answers at {nothing}" in err and "agentfn-asgi fake-api" in err
    assert err.count("\n") == 1
    async with fake, serve_fake(fake) as base_url:  # the API alone, without /_fake/
        code = await run_cli("fake-api", "session", "--url", base_url, "--call", "lookup")
    err = capsys.readouterr().err
    assert code == 1 and "is not agentfn-asgi fake-api" in err and "404" in err
    assert err.count("\n") == 1
