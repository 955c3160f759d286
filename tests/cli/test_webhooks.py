"""``agentfn-asgi webhooks``: each subcommand against FakeAgentsAPI over loopback, configured
only through the environment as the app is (OPENAI_API_KEY, OPENAI_BASE_URL); the test
deliveries go to a real app under uvicorn. The full journey as subprocesses is in
``test_webhooks_journey.py``."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.cli import main
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.testing import FakeAgentsAPI, serve_app, serve_fake
from tests.support.stack import API_KEY, FAST
from tests.test_stream import counting_tools

pytestmark = pytest.mark.anyio


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_WEBHOOK_SECRET", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
async def fake(env: pytest.MonkeyPatch) -> AsyncIterator[FakeAgentsAPI]:
    """The fake on a loopback port, named by OPENAI_BASE_URL and OPENAI_API_KEY."""
    api = FakeAgentsAPI(api_key=API_KEY)
    async with api, serve_fake(api) as base_url:
        env.setenv("OPENAI_API_KEY", API_KEY)
        env.setenv("OPENAI_BASE_URL", base_url)
        yield api


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Run:
    """Run the command line in a worker thread (it calls ``asyncio.run``); its output."""
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(main, list(argv))
    out, err = capsys.readouterr()
    assert API_KEY not in out + err  # the API key is never printed
    return Run(code, out, err)


@contextlib.asynccontextmanager
async def app_with(secret: str, base_url: str) -> AsyncIterator[str]:
    """A real app (Starlette under uvicorn) verifying with ``secret``; its webhook URL."""
    tools, _ = counting_tools()
    async with AgentsClient(api_key=API_KEY, base_url=base_url) as client:
        app = AgentWebhookApp(
            tools, webhook_secret=secret, client=client, store="memory://", settings=FAST
        )
        host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
        async with serve_app(host, lifespan="on") as root:
            yield root + "/openai/webhooks"


async def test_create_prints_the_secret_once_as_the_line_to_set(
    fake: FakeAgentsAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    """``create`` prints exactly one stdout line, ``OPENAI_WEBHOOK_SECRET=whsec_...`` (the
    endpoint's secret), subscribes to action_required by default and names the endpoint
    after the URL's host; what it did goes to stderr. Nothing else ever shows the secret."""
    run = await cli(capsys, "webhooks", "create", "--url", "https://example.com/openai/webhooks")
    assert run.code == 0, run.err
    (endpoint,) = fake.endpoints.by_id.values()
    assert run.out == f"OPENAI_WEBHOOK_SECRET={endpoint.secret}\n"
    assert endpoint.event_types == [
        "agent.session.action_required",
        "agent.session.idle",
        "agent.session.failed",
    ]
    assert endpoint.name == "agentfn-asgi example.com"
    assert f"created {endpoint.id}" in run.err and "shown this once" in run.err

    for argv in (
        ["list"],
        ["list", "--json"],
        ["show", endpoint.id],
        ["show", endpoint.id, "--json"],
    ):
        shown = await cli(capsys, "webhooks", *argv)
        assert shown.code == 0 and endpoint.id in shown.out
        assert endpoint.secret not in shown.out + shown.err
    listed = json.loads((await cli(capsys, "webhooks", "list", "--json")).out)
    assert [e["id"] for e in listed] == [endpoint.id] and "signing_secret" not in listed[0]
    assert listed[0]["url"] == "https://example.com/openai/webhooks"


async def test_update_and_delete(fake: FakeAgentsAPI, capsys: pytest.CaptureFixture[str]) -> None:
    """``update`` changes what it is given (``--events`` replaces the set) and shows the
    result; ``delete`` removes it; then it is unknown (exit 1, one line)."""
    await cli(capsys, "webhooks", "create", "--url", "https://a.test/h", "--name", "first")
    (endpoint,) = fake.endpoints.by_id.values()
    run = await cli(
        capsys,
        "webhooks",
        "update",
        endpoint.id,
        "--name",
        "second",
        "--events",
        "agent.session.idle",
        "agent.session.action_required",
    )
    assert run.code == 0, run.err
    assert "name      second" in run.out
    # A name is anyone's text: shown with its control characters escaped.
    hostile = await cli(capsys, "webhooks", "update", endpoint.id, "--name", "x\x1b[2Jy")
    assert "name      x\\x1b[2Jy" in hostile.out and "\x1b" not in hostile.out
    assert "\x1b" not in (await cli(capsys, "webhooks", "list")).out
    await cli(capsys, "webhooks", "update", endpoint.id, "--name", "second")
    assert endpoint.event_types == ["agent.session.idle", "agent.session.action_required"]
    assert endpoint.url == "https://a.test/h"
    nothing = await cli(capsys, "webhooks", "update", endpoint.id)
    assert nothing.code == 2 and "nothing to change" in nothing.err

    deleted = await cli(capsys, "webhooks", "delete", endpoint.id)
    assert (deleted.code, deleted.out) == (0, f"deleted {endpoint.id}\n")
    assert fake.endpoints.by_id == {}
    gone = await cli(capsys, "webhooks", "show", endpoint.id)
    assert gone.code == 1
    assert gone.err.count("\n") == 1 and "No webhook endpoint found" in gone.err
    assert (await cli(capsys, "webhooks", "list")).out == "no webhook endpoints\n"


async def test_rotate_secret_prints_the_value_to_set(
    fake: FakeAgentsAPI, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--keep-old``: the new secret alone. With it: the new secret and the
    current ``OPENAI_WEBHOOK_SECRET`` (new first, comma-separated, as the app reads
    several); without a current one, a placeholder and a note saying what to add."""
    created = await cli(capsys, "webhooks", "create", "--url", "https://a.test/h")
    old = created.out.strip().split("=", 1)[1]
    (endpoint,) = fake.endpoints.by_id.values()

    env.setenv("OPENAI_WEBHOOK_SECRET", old)
    kept = await cli(capsys, "webhooks", "rotate-secret", endpoint.id, "--keep-old")
    assert kept.code == 0, kept.err
    assert endpoint.old_secret == old and endpoint.secret != old
    assert kept.out == f"OPENAI_WEBHOOK_SECRET={endpoint.secret},{old}\n"
    # The exact stdout above is the value lines alone; the 24-hour window goes to
    # stderr. (Not a substring test on stdout: a random secret may hold any digits.)
    assert "until about" in kept.err and "UTC" in kept.err

    env.delenv("OPENAI_WEBHOOK_SECRET")
    blind = await cli(capsys, "webhooks", "rotate-secret", endpoint.id, "--keep-old")
    assert blind.out == f"OPENAI_WEBHOOK_SECRET={endpoint.secret},<the old secret>\n"
    assert "is not set here" in blind.err

    plain = await cli(capsys, "webhooks", "rotate-secret", endpoint.id)
    assert plain.out == f"OPENAI_WEBHOOK_SECRET={endpoint.secret}\n"
    assert endpoint.old_secret is None and "no longer signs" in plain.err


async def test_test_prints_the_status_the_app_answered(
    fake: FakeAgentsAPI, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``test`` prints the status of the app's answer: 200 with the endpoint's secret
    (exit 0); 401 with another secret, with the hint about OPENAI_WEBHOOK_SECRET (exit 1).
    ``--event`` picks the sample's type."""
    base = os.environ["OPENAI_BASE_URL"]
    async with app_with("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", base) as url:
        created = await cli(capsys, "webhooks", "create", "--url", url)
        (endpoint,) = fake.endpoints.by_id.values()
        refused = await cli(capsys, "webhooks", "test", endpoint.id)
        assert (refused.code, refused.out) == (1, "401 Unauthorized\n")
        assert "OPENAI_WEBHOOK_SECRET" in refused.err
    secret = created.out.strip().split("=", 1)[1]
    async with app_with(secret, base) as url:
        await cli(capsys, "webhooks", "update", endpoint.id, "--url", url)
        for event in ("agent.session.action_required", "agent.session.idle"):
            run = await cli(capsys, "webhooks", "test", endpoint.id, "--event", event)
            assert (run.code, run.out) == (0, "200 OK\n"), run.err
            assert f"took the {event} sample" in run.err
    assert [d.event_type for d in fake.deliveries] == [
        "agent.session.action_required",
        "agent.session.action_required",
        "agent.session.idle",
    ]


async def test_test_at_a_wrong_path_names_the_mount_path(
    fake: FakeAgentsAPI, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An endpoint whose URL misses the mount path answers 404: the hint says so."""
    async with app_with(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", os.environ["OPENAI_BASE_URL"]
    ) as url:
        await cli(capsys, "webhooks", "create", "--url", url.replace("/openai/webhooks", "/hooks"))
        (endpoint,) = fake.endpoints.by_id.values()
        missed = await cli(capsys, "webhooks", "test", endpoint.id)
    assert (missed.code, missed.out) == (1, "404 Not Found\n")
    assert "nothing answers at that path: check the mount path" in missed.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["create", "--url", "https://a.test/h", "--events", "agent.sesion.idle"],
            "unknown event type 'agent.sesion.idle' (did you mean agent.session.idle?)",
        ),
        (["test", "we_x", "--event", "batch.complete"], "(did you mean batch.completed?)"),
        (["show", "../x"], "invalid webhook endpoint id"),
    ],
)
async def test_mistakes_are_one_line_exit_2(
    fake: FakeAgentsAPI, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """A mistyped event type or a malformed id: one line naming the fix, exit 2, nothing
    created."""
    run = await cli(capsys, "webhooks", *argv)
    assert run.code == 2
    assert message in run.err and run.err.count("\n") == 1
    assert fake.endpoints.by_id == {}


async def test_settings_mistakes(
    env: pytest.MonkeyPatch, fake: FakeAgentsAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    """No API key: exit 2 naming OPENAI_API_KEY. A refused key: exit 1, one line, with
    any key-like word in the API's message masked."""
    env.delenv("OPENAI_API_KEY")
    missing = await cli(capsys, "webhooks", "list")
    assert missing.code == 2 and "OPENAI_API_KEY" in missing.err
    env.setenv("OPENAI_API_KEY", API_KEY)
    fake.fail_next(
        "webhook_endpoints",
        status=401,
        body={"error": {"message": "Incorrect API key provided: sk-proj-abc123.", "type": "x"}},
    )
    refused = await cli(capsys, "webhooks", "list")
    assert refused.code == 1 and refused.err.count("\n") == 1
    assert "sk-proj-abc123" not in refused.err and "sk-***" in refused.err
