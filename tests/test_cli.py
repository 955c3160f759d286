"""``agentfn-asgi``: help, exit codes, and each subcommand against real parts (a loopback
webhook receiver, a SQLite store in a temp folder, FakeAgentsAPI over loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.cli import build_parser, main
from agentfn_asgi.cli.common import load_tools
from agentfn_asgi.cli.dev import parse_call_spec
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.demo.tools import tools as example_tools
from agentfn_asgi.errors import CLIError, CLIUsageError
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_app, serve_fake
from agentfn_asgi.testing.control import ONE_STEP_SHAPE, SESSION_SCRIPT_SHAPE, serve_fake_api
from agentfn_asgi.tools import FunctionTools

from .support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
COMMANDS = ["demo", "fake-api", "send", "listen", "tools", "status", "recover", "webhooks"]


async def run_cli(*argv: str) -> int:
    """Run ``main`` in a worker thread: it calls ``asyncio.run`` itself."""
    return await anyio.to_thread.run_sync(main, list(argv))


# -- help and usage --------------------------------------------------------------------------


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` exits 0 and names every subcommand and the exit codes."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out
    assert "Exit codes" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand documents itself (``COMMAND --help`` exits 0 with a description)."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert len(capsys.readouterr().out.splitlines()) > 3


def test_fake_api_help_documents_the_session_script_as_the_examples_readme_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fake-api --help`` shows the session script shape, unwrapped, with the control
    endpoints and the retry option; the examples README shows the same shape."""
    with pytest.raises(SystemExit):
        main(["fake-api", "--help"])
    out = capsys.readouterr().out
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for text in (SESSION_SCRIPT_SHAPE, ONE_STEP_SHAPE):
        assert text in out
        assert text in readme
    for endpoint in ("POST /_fake/sessions/ID/redeliver", "GET  /_fake/submissions"):
        assert endpoint in out
    assert "--webhook-retry-for" in out and "(default 300;" in " ".join(out.split())


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["tools"],
        ["tools", "no-colon"],
        ["recover"],
        ["send"],
        ["status", "--x"],
        ["fake-api", "--webhook-retry-for", "-1"],
        ["fake-api", "--webhook-retry-for", "soon"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Missing or malformed arguments are usage errors: exit code 2 with a message."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.slow  # starts a Python process
def test_python_dash_m_runs_the_same_cli() -> None:
    """``python -m agentfn_asgi`` is the same command line."""
    done = subprocess.run(
        [sys.executable, "-m", "agentfn_asgi", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("agentfn-asgi ")


def test_parser_is_buildable_for_docs() -> None:
    """The parser is exposed (README and docs render it)."""
    assert build_parser().prog == "agentfn-asgi"


# -- tools -----------------------------------------------------------------------------------


def test_tools_prints_the_definitions(capsys: pytest.CaptureFixture[str]) -> None:
    """``tools MODULE:ATTR`` prints exactly ``definitions()`` as JSON; ``--compact`` on one
    line; a factory function works too."""
    assert main(["tools", "agentfn_asgi.demo.tools:tools"]) == 0
    assert json.loads(capsys.readouterr().out) == example_tools.definitions()
    assert main(["tools", "--compact", "agentfn_asgi.demo.tools:build_tools"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == example_tools.definitions()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:tools", "cannot import"),
        ("agentfn_asgi.demo.tools:missing", "has no attribute"),
        ("agentfn_asgi.demo.tools:CUSTOMERS", "not a FunctionTools"),
    ],
)
def test_tools_failures_exit_2(spec: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A spec that does not lead to a registry is a usage mistake (exit 2) with a clear
    cause on one line, no traceback."""
    assert main(["tools", spec]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


class _Registry:
    """A class: never called to make a registry, even without arguments."""


def _targets_module(webhooks: AgentWebhookApp) -> types.ModuleType:
    module = types.ModuleType("cli_targets_for_test")
    calls: list[str] = []
    module.calls = calls  # type: ignore[attr-defined]
    module.tools = example_tools  # type: ignore[attr-defined]
    module.webhooks = webhooks  # type: ignore[attr-defined]
    module.host = Starlette()  # type: ignore[attr-defined]
    module.Registry = _Registry  # type: ignore[attr-defined]
    module.answer = 42  # type: ignore[attr-defined]
    module.nothing = None  # type: ignore[attr-defined]

    def build() -> FunctionTools:
        calls.append("build")
        return example_tools

    def build_app() -> AgentWebhookApp:
        return webhooks

    def build_nothing() -> int:
        calls.append("build_nothing")
        return 7

    def build_broken() -> FunctionTools:
        raise RuntimeError("no database configured")

    def lookup(city: str, country: str = "FR") -> str:
        calls.append("lookup")
        return city

    for function in (build, build_app, build_nothing, build_broken, lookup):
        setattr(module, function.__name__, function)
    return module


_NOT_A_REGISTRY = "not a FunctionTools registry: name the registry"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("attr", "found"),
    [
        ("tools", None),
        ("webhooks", None),  # an AgentWebhookApp stands for its registry
        ("build", None),  # a factory without arguments
        ("build_app", None),
        ("host", f"is a Starlette app, {_NOT_A_REGISTRY}"),
        ("Registry", f"is the class _Registry, {_NOT_A_REGISTRY}"),
        ("answer", f"is an int, {_NOT_A_REGISTRY}"),
        ("nothing", f"is None, {_NOT_A_REGISTRY}"),
        ("lookup", f"is a function taking arguments (city, country), {_NOT_A_REGISTRY}"),
        ("build_nothing", f"() returned an int, {_NOT_A_REGISTRY}"),
        ("build_broken", "() failed: RuntimeError: no database configured (…test_cli.py:…)"),
        ("missing", "has no attribute 'missing' (registries there: tools, webhooks)"),
    ],
)
async def test_load_tools_names_what_it_found(
    attr: str, found: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 18): a MODULE:ATTR that is not a registry is one line naming what
    it is and what was expected, with the right article; only a function that takes no
    arguments is called (never a class, an ASGI app or a function with parameters). The
    old code called any callable and raised its TypeError."""
    async with AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1") as client:
        webhooks = AgentWebhookApp(
            example_tools, webhook_secret=SECRET, client=client, store="memory://"
        )
        module = _targets_module(webhooks)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        spec = f"{module.__name__}:{attr}"
        if found is None:
            assert load_tools(spec) is example_tools
            return
        with pytest.raises(CLIUsageError) as info:
            load_tools(spec)
    pattern = ".*".join(re.escape(part) for part in found.split("…"))
    where = rf"(cli_targets_for_test:{attr} ?|'cli_targets_for_test' )"
    assert re.match(where + pattern, str(info.value)), str(info.value)
    assert module.calls in ([], ["build_nothing"])


def test_load_tools_and_call_specs() -> None:
    """Helpers: ``load_tools`` returns the registry; ``NAME:JSON`` call specs parse or fail
    with a message."""
    assert load_tools("agentfn_asgi.demo.tools:tools") is example_tools
    assert parse_call_spec('get_customer:{"customer_id": "123"}') == (
        "get_customer",
        {"customer_id": "123"},
    )
    assert parse_call_spec("ping") == ("ping", {})
    for bad in (":{}", "x:[1]", "x:{nope"):
        with pytest.raises(CLIError):
            parse_call_spec(bad)


# -- send ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[str, FakeAgentsAPI]]:
    """A real webhook app on loopback (its API calls go to an in-process fake)."""
    fake = FakeAgentsAPI(webhook_secret=SECRET)
    api_http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://fake")
    client = AgentsClient(api_key="sk-test", base_url="http://fake/v1", http_client=api_http)
    app = AgentWebhookApp(example_tools, webhook_secret=SECRET, client=client, store="memory://")
    host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
    try:
        async with fake, serve_app(host, lifespan="on") as root:
            yield root + "/openai/webhooks", fake
    finally:
        await client.aclose()
        await api_http.aclose()


@pytest.mark.anyio
async def test_send_delivers_a_signed_event(capsys: pytest.CaptureFixture[str]) -> None:
    """``send`` signs with the secret and prints the receiver's answer; exit 0 on 2xx."""
    async with receiver() as (url, _):
        code = await run_cli("send", url, "--secret", SECRET, "--type", "agent.session.in_progress")
        assert code == 0
        out = capsys.readouterr().out
        assert out.startswith("200 OK")
        assert '"status":"ignored"' in out
        code = await run_cli("send", url, "--secret", SECRET, "--session-id", "sess_x")
        assert code == 0
        assert '"status":"accepted"' in capsys.readouterr().out


@pytest.mark.anyio
async def test_send_reads_the_secret_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--secret`` the secret comes from ``OPENAI_WEBHOOK_SECRET``; without
    either, a clear configuration error and exit 2."""
    async with receiver() as (url, _):
        monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
        assert await run_cli("send", url, "--type", "agent.session.in_progress") == 0
        monkeypatch.delenv("OPENAI_WEBHOOK_SECRET")
        assert await run_cli("send", url) == 2
        assert "no webhook secret" in capsys.readouterr().err


@pytest.mark.anyio
async def test_send_failures_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """A refused signature (401), a wrong path (404, with a hint at the mount path) and an
    unreachable URL all exit 1 with the cause."""
    other = "whsec_" + "b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA=="
    async with receiver() as (url, _):
        assert await run_cli("send", url, "--secret", other, "--session", "sess_x") == 1
        assert capsys.readouterr().out.startswith("401")
        wrong = url.replace("/openai/webhooks", "/webhooks")
        assert await run_cli("send", wrong, "--secret", SECRET, "--session", "sess_x") == 1
        said = capsys.readouterr()
        assert said.out.startswith("404")
        assert "nothing answers at /webhooks: check the mount path" in said.err
    dead = f"http://127.0.0.1:{free_port()}/openai/webhooks"
    code = await run_cli("send", dead, "--secret", SECRET, "--session", "s", "--timeout", "2")
    assert code == 1
    assert "could not deliver" in capsys.readouterr().err


# -- status ----------------------------------------------------------------------------------


async def _populated_store(path: Path) -> str:
    url = f"sqlite:///{path}"
    store = open_store(url)
    await store.open()
    await store.record_delivery("wh_1", "sess_1")
    await store.record_delivery("wh_2", "sess_1")
    await store.mark_delivery_resolved("wh_1")
    done = CallKey("sess_1", "turn_1", "call_done")
    await store.claim_call(done, tool_name="get_customer", owner="me", lease_seconds=30)
    await store.save_result(
        done, owner="me", attempt=1, result=SavedResult(True, '{"type":"x"}', "key-1")
    )
    await store.mark_submitted(done)
    pending = CallKey("sess_1", "turn_1", "call_pending")
    await store.claim_call(pending, tool_name="slow_echo", owner="me", lease_seconds=30)
    await store.close()
    return url


@pytest.mark.anyio
async def test_status_reports_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``status`` shows deliveries (and unresolved ones), calls by state, in-doubt,
    quarantined and the oldest pending call; ``--json`` gives the same as JSON."""
    url = await _populated_store(tmp_path / "store.sqlite3")
    assert await run_cli("status", "--store", url) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"store           sqlite:///{tmp_path}/store.sqlite3"
    assert "deliveries" in out
    assert "2 (1 unresolved)" in out
    assert "claimed 1" in out
    assert "submitted 1" in out
    assert "in doubt" in out
    assert "quarantined" in out
    assert "UTC" in out  # the oldest pending call has a time
    assert await run_cli("status", "--store", url, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deliveries"] == 2
    assert report["calls_by_state"]["submitted"] == 1


@pytest.mark.anyio
async def test_status_of_a_missing_store_fails_without_creating_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped SQLite path is a configuration error (exit 2) naming the resolved file,
    not a fresh empty store; the default comes from ``AGENTFN_STORE_URL``, and a relative
    path is resolved from the working directory as the app resolves it."""
    missing = tmp_path / "nope.sqlite3"
    monkeypatch.setenv("AGENTFN_STORE_URL", f"sqlite:///{missing}")
    assert await run_cli("status") == 2
    assert f"no store at {missing} (nothing was created)" in capsys.readouterr().err
    assert not missing.exists()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTFN_STORE_URL", "sqlite:///nonexistent_dir/x.db")
    assert await run_cli("status") == 2
    assert f"no store at {tmp_path}/nonexistent_dir/x.db" in capsys.readouterr().err
    assert not (tmp_path / "nonexistent_dir").exists()


# -- recover ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_recover_answers_a_session_with_no_webhook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``recover --session`` reads the session from the API and answers its pending calls
    (no webhook ever arrived), then lists the calls' states."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url)
    await store.open()
    await store.close()
    fake = FakeAgentsAPI(webhook_secret=SECRET)
    async with fake, serve_fake(fake) as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
        session_id = fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "123"}, call_id="call_c")]]
        )
        code = await run_cli(
            "recover",
            "--session",
            session_id,
            "--tools",
            "agentfn_asgi.demo.tools:tools",
            "--store",
            url,
        )
        assert code == 0, capsys.readouterr().err
        assert [s.call_id for s in fake.submissions] == ["call_c"]
    captured = capsys.readouterr()
    assert "call_c  get_customer  submitted" in captured.out
    assert "recovery done" in captured.out
    assert f"store sqlite:///{tmp_path}/store.sqlite3\n" in captured.err


# -- fake-api --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_fake_api_serves_sessions_that_call_the_users_tools() -> None:
    """``fake-api`` serves the fake with a control endpoint: sessions created there (or
    from ``--call``) send signed webhooks to the user's app, whose results it lists."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    client = AgentsClient(api_key="sk-test", base_url=base_url)
    app = AgentWebhookApp(example_tools, webhook_secret=SECRET, client=client, store="memory://")
    host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
    out = io.StringIO()
    async with serve_app(host, lifespan="on") as app_root:
        ready = asyncio.Event()
        server = asyncio.create_task(
            serve_fake_api(
                port=port,
                webhook_urls=[app_root + "/openai/webhooks"],
                webhook_secret=SECRET,
                calls=[("get_customer", {"customer_id": "123"})],
                out=out,
                ready=ready,
            )
        )
        try:
            await asyncio.wait_for(ready.wait(), timeout=10)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                created = await http.post(
                    "/_fake/sessions",
                    json={
                        "calls": [{"name": "slow_echo", "arguments": {"text": "hi", "delay_ms": 1}}]
                    },
                )
                assert created.status_code == 201
                bad = await http.post("/_fake/sessions", json={"nope": 1})
                assert bad.status_code == 400
                results: list[dict[str, object]] = []
                for _ in range(200):
                    results = (await http.get("/_fake/submissions")).json()
                    if len(results) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert sorted(str(r["output"]) for r in results) == [
                    "hi",
                    '{"found":true,"customer":{"name":"Example Customer","plan":"pro"}}',
                ]
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
            await client.aclose()
    log = out.getvalue()
    assert f"OPENAI_BASE_URL={base_url}" in log
    assert f"OPENAI_WEBHOOK_SECRET={SECRET}" in log
    assert "session sess_" in log
    assert "result " in log


@pytest.mark.anyio
@pytest.mark.slow
async def test_fake_api_command_runs_until_sigterm() -> None:
    """``agentfn-asgi fake-api --call ...`` prints its settings and the session it created,
    serves that session over HTTP, and stops cleanly (exit 0) on SIGTERM."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentfn_asgi",
        "fake-api",
        "--port",
        str(port),
        "--secret",
        SECRET,
        "--call",
        'get_customer:{"customer_id":"123"}',
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        lines: list[str] = []
        async with asyncio.timeout(20):
            while not any(line.startswith("session sess_") for line in lines):
                lines.append((await process.stdout.readline()).decode())
        session_id = lines[-1].split()[1]
        assert f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1\n" in "".join(lines)
        async with httpx.AsyncClient() as http:
            response = await http.get(
                f"http://127.0.0.1:{port}/v1/agents/sessions/{session_id}",
                headers={"authorization": "Bearer sk-test", "openai-beta": "agents=v1"},
            )
        assert response.json()["required_actions"][0]["name"] == "get_customer"
        process.terminate()
        rest = await asyncio.wait_for(process.stdout.read(), timeout=10)
        assert await process.wait() == 0
        assert "stopped" in rest.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
