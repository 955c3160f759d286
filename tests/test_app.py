"""``AgentWebhookApp`` itself: the answers of its small endpoints and what it says at start-up
(deliveries and calls are covered by the dispatch, reliability and integration tests)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentfn_asgi import AgentsClient, AgentWebhookApp, FunctionTools

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
async def client() -> AsyncIterator[AgentsClient]:
    # Nothing here reaches the API: a recovery sweep of an empty store reads no session.
    async with AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1") as client:
        yield client


@pytest.mark.parametrize(
    ("method", "status"),
    [
        ("GET", 200),
        ("HEAD", 200),
        ("POST", 405),
        ("PUT", 405),
        ("DELETE", 405),
        ("PATCH", 405),
        ("OPTIONS", 405),
    ],
)
async def test_healthz_answers_get_and_head_only(
    client: AgentsClient, method: str, status: int
) -> None:
    """Regression (issue 18): ``/healthz`` answered any method. GET has the JSON body, HEAD
    the same headers without it; anything else is 405 with ``Allow: GET, HEAD``."""
    webhooks = AgentWebhookApp(
        FunctionTools(), webhook_secret=SECRET, client=client, store="memory://"
    )
    transport = httpx.ASGITransport(app=webhooks)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        answer = await http.request(method, "/healthz")
    assert answer.status_code == status
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"
    elif method == "HEAD":
        assert answer.content == b""
        assert int(answer.headers["content-length"]) > 0
    else:
        assert answer.json()["status"] == "ok"


async def test_start_up_logs_the_resolved_store_location_once(
    client: AgentsClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store is logged once at INFO when the app starts, resolved to an absolute
    location (a relative default path depends on the working directory)."""
    caplog.set_level(logging.INFO, logger="agentfn_asgi")
    monkeypatch.chdir(tmp_path)
    webhooks = AgentWebhookApp(
        FunctionTools(), webhook_secret=SECRET, client=client, store="sqlite:///agentfn.db"
    )
    assert webhooks.store_location == f"sqlite:///{tmp_path}/agentfn.db"
    await webhooks.startup()
    await webhooks.startup()  # idempotent: no second line
    await webhooks.shutdown()
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "store" in r.getMessage()
    ]
    assert lines == [f"agentfn-asgi started: 0 tools, store sqlite:///{tmp_path}/agentfn.db"]


async def test_a_store_url_with_a_password_is_shown_redacted(client: AgentsClient) -> None:
    """The location the app logs and shows operators hides the password (the store is not
    opened here)."""
    webhooks = AgentWebhookApp(
        FunctionTools(),
        webhook_secret=SECRET,
        client=client,
        store="postgresql://app:hunter2@127.0.0.1:5432/test",
    )
    assert webhooks.store_location == "postgresql://app:***@127.0.0.1:5432/test (schema agentfn)"
    assert "hunter2" not in webhooks.store_location
