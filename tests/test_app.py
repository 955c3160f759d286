"""``AgentWebhookApp`` itself: the answers of its small endpoints, what it says at start-up,
and when it checks its configuration (at start-up, never when it is built); deliveries and
calls are covered by the dispatch, reliability and integration tests."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentfn_asgi import AgentsClient, AgentWebhookApp, ConfigurationError, FunctionTools
from agentfn_asgi.testing import action_required_event, signed_delivery

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


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/", 405, "POST"),
        ("PUT", "", 405, "POST"),
        ("DELETE", "/healthz", 405, "GET, HEAD"),
        ("GET", "/calls/complete", 405, "POST"),
        ("GET", "/healthz/", 404, None),
        ("POST", "/calls/complete/", 404, None),
        ("POST", "//", 404, None),
        ("GET", "/nope", 404, None),
    ],
)
async def test_paths_are_exact_never_redirected_and_a_405_says_what_is_allowed(
    client: AgentsClient, method: str, path: str, status: int, allow: str | None
) -> None:
    """Below its mount point the app answers its own exact paths (the mount point itself
    with or without the slash); any other path is its JSON 404, never a redirect; a wrong
    method is its JSON 405 with ``Allow``, in a fixed order."""
    webhooks = AgentWebhookApp(
        FunctionTools(), webhook_secret=SECRET, client=client, store="memory://"
    )
    transport = httpx.ASGITransport(app=webhooks, root_path="/openai/webhooks")
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        answer = await http.request(method, "/openai/webhooks" + path)
    assert (answer.status_code, answer.headers.get("allow")) == (status, allow)
    assert answer.json() == {"error": "not found" if status == 404 else "method not allowed"}


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


def _bare_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OPENAI_* or AGENTFN_* variable: a fresh shell, or a test run without secrets."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENTFN_")):
            monkeypatch.delenv(name)


def _one_tool() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def get_customer(customer_id: str) -> dict[str, bool]:
        """Look up a customer by ID."""
        return {"found": customer_id == "123"}

    return tools


def test_building_the_app_checks_nothing_and_check_names_every_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (issue 26): building the app at module level failed without a secret, so
    the CLI's `tools` and pytest's collection could not import the module. Now building
    never fails for the environment; ``check()`` (and start-up) names every problem at
    once, each with its fix."""
    _bare_environment(monkeypatch)
    monkeypatch.setenv("AGENTFN_STORE_URL", "sqlite:/x")
    webhooks = AgentWebhookApp(_one_tool())
    assert len(webhooks.tools) == 1
    with pytest.raises(ConfigurationError) as info:
        webhooks.check()
    message = str(info.value)
    assert message.startswith("3 configuration problems: (1) no webhook secret: ")
    assert "(2) no API key: set the OPENAI_API_KEY environment variable" in message
    assert "(3) store URL 'sqlite:/x' is malformed" in message


def test_a_malformed_setting_is_also_reported_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value of the environment that cannot be used fails the check, not the import."""
    _bare_environment(monkeypatch)
    monkeypatch.setenv("AGENTFN_LEASE_SECONDS", "soon")
    webhooks = AgentWebhookApp(_one_tool(), webhook_secret=SECRET, store="memory://")
    with pytest.raises(ConfigurationError, match="AGENTFN_LEASE_SECONDS='soon'"):
        webhooks.check()


async def test_the_lifespan_fails_with_the_configuration_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ASGI lifespan's start-up reports the check's message, for the server to print."""
    _bare_environment(monkeypatch)
    webhooks = AgentWebhookApp(_one_tool(), store="memory://")
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}])

    async def receive() -> MutableMapping[str, Any]:
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await webhooks({"type": "lifespan"}, receive, send)
    [failed] = sent
    assert failed["type"] == "lifespan.startup.failed"
    assert failed["message"].startswith(
        "agentfn-asgi cannot start: 2 configuration problems: (1) no webhook secret"
    )
    await webhooks.shutdown()  # nothing was opened: nothing to close, no error


async def test_a_request_to_an_unconfigured_app_gets_503_and_the_reason_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a lifespan, the first request runs the check: the sender gets 503 (it retries
    once the setting is fixed) and the log says why, once, not once per retry."""
    _bare_environment(monkeypatch)
    client = AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    webhooks = AgentWebhookApp(_one_tool(), client=client, store="memory://")
    transport = httpx.ASGITransport(app=webhooks)
    async with client, httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        first = await http.post("/", content=b"{}")
        second = await http.get("/healthz")
    assert (first.status_code, second.status_code) == (503, 503)
    assert first.json() == {"error": "not configured"}
    errors = [r.getMessage() for r in caplog.records if r.name == "agentfn_asgi.app"]
    assert errors == [
        "agentfn-asgi cannot start, answering 503: no webhook secret: pass webhook_secret= or"
        " set OPENAI_WEBHOOK_SECRET (the whsec_... value shown when the webhook endpoint was"
        " created)"
    ]


async def test_a_store_that_cannot_open_without_a_lifespan_gets_503_not_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store URL names a folder that does not exist, and no lifespan ran the start-up
    checks: the health check and a verified delivery answer 503 with the reason logged as
    one line (not a 500, not a traceback per retry)."""
    client = AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    missing = tmp_path / "missing" / "store.sqlite3"
    webhooks = AgentWebhookApp(
        _one_tool(), client=client, store=f"sqlite:///{missing}", webhook_secret=SECRET
    )
    transport = httpx.ASGITransport(app=webhooks)
    body, headers = signed_delivery(SECRET, action_required_event("sess_1"))
    async with client, httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        health = await http.get("/healthz")
        head = await http.head("/healthz")
        deliveries = [await http.post("/", content=body, headers=headers) for _ in range(2)]
    assert [r.status_code for r in (health, head, *deliveries)] == [503] * 4
    assert [r.json() for r in (health, *deliveries)] == [{"error": "not configured"}] * 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "does not exist" in errors[0].getMessage()
    assert errors[0].exc_info is None
    assert not missing.parent.exists()


@pytest.mark.slow  # starts the CLI (and pytest) as processes
def test_the_cli_lists_the_tools_of_a_module_that_builds_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentfn-asgi tools myservice:tools` imports a module that builds the app at module
    level, with no secret, key or store set, as a fresh checkout has; so does pytest."""
    _bare_environment(monkeypatch)
    (tmp_path / "myservice.py").write_text(
        "from agentfn_asgi import AgentWebhookApp, FunctionTools\n"
        "tools = FunctionTools()\n"
        "@tools.function\n"
        "def ping() -> str:\n"
        '    """Answer pong."""\n'
        '    return "pong"\n'
        "webhooks = AgentWebhookApp(tools)\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for target in ("myservice:tools", "myservice:webhooks"):
        done = subprocess.run(
            [sys.executable, "-m", "agentfn_asgi", "tools", target, "--compact"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert [tool["name"] for tool in json.loads(done.stdout)] == ["ping"]
    # pytest collects a test module that imports it, as a service's own tests do.
    (tmp_path / "test_myservice.py").write_text(
        "from myservice import tools, webhooks\n\n"
        "def test_the_registry() -> None:\n"
        "    assert webhooks.tools is tools and len(tools) == 1\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_myservice.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_failure_after_the_answer_started_sends_no_second_answer() -> None:
    """The connection drops as the 200 goes out (sending it raises): the app sends nothing
    more (a second ``http.response.start`` would be a protocol error in the server) and
    raises nothing; the delivery stays recorded."""
    client = AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    webhooks = AgentWebhookApp(_one_tool(), webhook_secret=SECRET, client=client, store="memory://")
    body, headers = signed_delivery(SECRET, action_required_event("sess_1"))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))
        raise OSError("the client went away")

    async with client:
        await webhooks.startup()
        try:
            await webhooks(scope, receive, send)
            stats = await webhooks.store.stats()
        finally:
            await webhooks.shutdown()
    assert [(m["type"], m.get("status")) for m in sent] == [("http.response.start", 200)]
    assert stats.unresolved_deliveries == 1
