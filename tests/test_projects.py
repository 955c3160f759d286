"""Two OpenAI projects in one service (issue 17): two webhook sub-apps at two paths, each
with its own webhook secret, API key and ``OpenAI-Project``, sharing one store (SQLite,
Redis, PostgreSQL) in two namespaces without interference.

The set-up is the one docs/replicas.md's "Two projects in one service" section shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp, DispatchSettings
from agentfn_asgi.calls.records import CallState, Job
from agentfn_asgi.cli import main
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_app, serve_fake
from agentfn_asgi.testing.deliveries import action_required_event, signed_delivery
from agentfn_asgi.tools import FunctionTools

from .support.backends import DURABLE, store_url_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

PROJECTS = {
    "proj_a": ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "sk-proj-a"),
    "proj_b": ("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "sk-proj-b"),
}
SETTINGS = DispatchSettings(lease_seconds=5.0, recovery_interval=3600.0, recovery_grace=0.0)


def registry(ran: list[str]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def whoami(project: str) -> str:
        """Say which project asked."""
        ran.append(project)
        return project

    return tools


def project_app(tools: FunctionTools, url: str, project: str, base_url: str) -> AgentWebhookApp:
    """One project's sub-app: its own secret, key and project header, its own namespace."""
    secret, api_key = PROJECTS[project]
    return AgentWebhookApp(
        tools,
        webhook_secret=secret,
        client=AgentsClient(api_key=api_key, base_url=base_url, project=project),
        store=open_store(url, namespace=project),
        settings=SETTINGS,
    )


#: The registry the CLI's ``recover`` is pointed at (it must never run with B's settings).
CLI_TOOLS = "tests.test_projects:cli_registry"
cli_registry = registry([])


@contextlib.asynccontextmanager
async def both_lifespans(apps: list[AgentWebhookApp]) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for app in apps:
            await stack.enter_async_context(app.lifespan())
        yield


@pytest.mark.parametrize("backend", DURABLE)
async def test_two_projects_share_a_store_without_interference(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each project's fake sends signed webhooks to its own path: each session is answered
    by its own sub-app with its own key and project header; a delivery signed for one
    project is refused at the other's path; each namespace lists, counts and sweeps only
    its own records (the CLI too, given ``AGENTFN_STORE_NAMESPACE``)."""
    ran: list[str] = []
    tools = registry(ran)
    fakes = {
        p: FakeAgentsAPI(webhook_secret=secret, api_key=key)
        for p, (secret, key) in PROJECTS.items()
    }
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url_for(backend, tmp_path))
        bases = {p: await stack.enter_async_context(serve_fake(f)) for p, f in fakes.items()}
        for fake in fakes.values():
            await stack.enter_async_context(fake)
        apps = {p: project_app(tools, url, p, bases[p]) for p in PROJECTS}
        host = Starlette(
            routes=[
                *webhook_routes(apps["proj_a"], "/openai/a/webhooks"),
                *webhook_routes(apps["proj_b"], "/openai/b/webhooks"),
            ],
            lifespan=lambda _host: both_lifespans(list(apps.values())),
        )
        root = await stack.enter_async_context(serve_app(host))
        fakes["proj_a"].add_webhook_url(root + "/openai/a/webhooks")
        fakes["proj_b"].add_webhook_url(root + "/openai/b/webhooks")

        sessions = {
            p: fakes[p].create_session([[FakeCall("whoami", {"project": p}, call_id="call_1")]])
            for p in PROJECTS
        }
        for p, sid in sessions.items():
            await fakes[p].wait_idle(sid, timeout=20)
            (answer,) = fakes[p].submissions
            assert answer.session_id == sid and answer.output == p
            assert {r.headers.get("openai-project") for r in fakes[p].requests} == {p}
        assert sorted(ran) == ["proj_a", "proj_b"]

        # A delivery signed with project B's secret is not project A's.
        body, headers = signed_delivery(
            PROJECTS["proj_b"][0], action_required_event(sessions["proj_b"])
        )
        async with httpx.AsyncClient(base_url=root) as http:
            refused = await http.post("/openai/a/webhooks", content=body, headers=headers)
        assert refused.status_code == 401

        # Each namespace sees its own.
        for p, sid in sessions.items():
            store = apps[p].store
            assert [r.key.session_id for r in await store.find_calls("call_1")] == [sid]
            assert (await store.stats()).deliveries >= 1
        # B's stuck delivery is B's: A's sweep never reads it, B's does.
        await apps["proj_b"].store.record_delivery("wh_b_stuck", "sess_b_missing")
        await apps["proj_a"].dispatcher.sweep()
        assert not [r for r in fakes["proj_a"].requests if "sess_b_missing" in r.path]
        (stuck,) = await apps["proj_b"].store.list_deliveries(unresolved_only=True)
        assert stuck.attempts == 0
        await apps["proj_b"].dispatcher.sweep()
        assert [r for r in fakes["proj_b"].requests if "sess_b_missing" in r.path]

        # The CLI reads the namespace like the app does.
        monkeypatch.setenv("AGENTFN_STORE_NAMESPACE", "proj_a")
        assert await anyio.to_thread.run_sync(main, ["calls", "--json", "--store", url]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [c["session_id"] for c in listed] == [sessions["proj_a"]]


@pytest.mark.parametrize("backend", DURABLE)
async def test_recover_with_another_projects_settings_leaves_the_call_alone(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Project A's result is saved but not submitted (A's API refused it for a while).
    ``agentfn-asgi recover --session <A's>`` run with project B's settings (namespace, key,
    API) does not see A's call: it neither marks it stale nor submits it. A's own sweep
    then submits it to A's API."""
    ran: list[str] = []
    tools = registry(ran)
    fakes = {
        p: FakeAgentsAPI(webhook_secret=secret, api_key=key)
        for p, (secret, key) in PROJECTS.items()
    }
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url_for(backend, tmp_path))
        bases = {p: await stack.enter_async_context(serve_fake(f)) for p, f in fakes.items()}
        for fake in fakes.values():
            await stack.enter_async_context(fake)
        app_a = project_app(tools, url, "proj_a", bases["proj_a"])
        await stack.enter_async_context(app_a.lifespan())
        fake_a = fakes["proj_a"]
        fake_a.fail_next("submit", 20, status=500)
        session = fake_a.create_session([[FakeCall("whoami", {"project": "proj_a"})]])
        await app_a.recover(session)
        with anyio.fail_after(20):
            while not await app_a.store.unsubmitted_results(due_before=float("inf")):
                await anyio.sleep(0.05)
        [owed] = await app_a.store.calls_for_session(session)

        monkeypatch.setenv("AGENTFN_STORE_NAMESPACE", "proj_b")
        monkeypatch.setenv("OPENAI_PROJECT_ID", "proj_b")
        monkeypatch.setenv("OPENAI_API_KEY", PROJECTS["proj_b"][1])
        monkeypatch.setenv("OPENAI_BASE_URL", bases["proj_b"])
        code = await anyio.to_thread.run_sync(
            main, ["recover", "--session", session, "--tools", CLI_TOOLS, "--store", url]
        )
        capsys.readouterr()
        assert code in (0, 1)
        after = await app_a.store.get_call(owed.key)
        assert after is not None and after.state is owed.state
        assert not fakes["proj_b"].submissions

        fake_a.faults.failures["submit"].clear()
        await app_a.recover(session)
        await fake_a.wait_idle(session, timeout=20)
        [answer] = fake_a.submissions
        assert answer.output == "proj_a" and ran == ["proj_a"]


COMPLETION_SECRET = "one-completion-secret-for-both-0123456789"


@pytest.mark.parametrize("backend", DURABLE)
async def test_a_completion_token_is_refused_by_the_other_project(
    backend: str, tmp_path: Path
) -> None:
    """Both projects hand their tool to workers and share one completion secret and one
    store: project A's token posted to B's ``/calls/complete`` is a 401 that changes nothing
    (A's call stays claimed, B submits nothing), and A's worker then completes A's call at
    A's path, submitted to A's session."""
    fakes = {
        p: FakeAgentsAPI(webhook_secret=secret, api_key=key)
        for p, (secret, key) in PROJECTS.items()
    }
    queues: dict[str, asyncio.Queue[Job]] = {p: asyncio.Queue() for p in PROJECTS}

    def queued_registry(project: str) -> FunctionTools:
        tools = FunctionTools()

        async def enqueue(job: Job) -> None:
            await queues[project].put(job)

        @tools.function(enqueue=enqueue)
        def whoami(project: str) -> str:
            """Say which project asked (in a worker)."""
            return project

        return tools

    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url_for(backend, tmp_path))
        bases = {p: await stack.enter_async_context(serve_fake(f)) for p, f in fakes.items()}
        for fake in fakes.values():
            await stack.enter_async_context(fake)
        paths = {"proj_a": "/openai/a/webhooks", "proj_b": "/openai/b/webhooks"}
        apps = {}
        for p, (secret, api_key) in PROJECTS.items():
            apps[p] = AgentWebhookApp(
                queued_registry(p),
                webhook_secret=secret,
                client=AgentsClient(api_key=api_key, base_url=bases[p], project=p),
                store=open_store(url, namespace=p),
                settings=SETTINGS,
                completion_secret=COMPLETION_SECRET,
                public_url="https://api.example.com" + paths[p],
            )
        host = Starlette(
            routes=[r for p in PROJECTS for r in webhook_routes(apps[p], paths[p])],
            lifespan=lambda _host: both_lifespans(list(apps.values())),
        )
        root = await stack.enter_async_context(serve_app(host))
        for p in PROJECTS:
            fakes[p].add_webhook_url(root + paths[p])
        session_a = fakes["proj_a"].create_session(
            [[FakeCall("whoami", {"project": "proj_a"}, call_id="call_1")]]
        )
        with anyio.fail_after(20):
            job = await queues["proj_a"].get()
        body = {"success": True, "output": "answered by a worker"}
        auth = {"authorization": f"Bearer {job.completion_token}"}
        async with httpx.AsyncClient(base_url=root) as http:
            refused = await http.post(paths["proj_b"] + "/calls/complete", json=body, headers=auth)
            assert refused.status_code == 401
            assert refused.json() == {"error": "invalid_token"}
            (record,) = await apps["proj_a"].store.find_calls("call_1")
            assert record.state is CallState.CLAIMED and record.result is None
            assert fakes["proj_b"].submissions == [] and fakes["proj_a"].submissions == []

            accepted = await http.post(paths["proj_a"] + "/calls/complete", json=body, headers=auth)
            assert accepted.json() == {"status": "accepted"}
        await fakes["proj_a"].wait_idle(session_a, timeout=20)
        (answer,) = fakes["proj_a"].submissions
        assert answer.session_id == session_a and answer.output == "answered by a worker"
        assert fakes["proj_b"].submissions == []
