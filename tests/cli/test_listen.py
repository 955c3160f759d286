"""``agentfn-asgi listen`` over real loopback HTTP: FakeAgentsAPI (sending no webhooks)
under uvicorn, the user's app under uvicorn, and the listener forwarding signed deliveries
from the fake's event streams to the app (in process, and as a real subprocess)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.backoff import Backoff
from agentfn_asgi.cli import main
from agentfn_asgi.cli.listen import Forwarder, listen
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_app, serve_fake
from agentfn_asgi.wire import AgentSession
from tests.support.ports import free_port
from tests.support.stack import API_KEY, FAST, SECRET
from tests.test_stream import DEEP_SECOND_STEP, counting_tools

pytestmark = pytest.mark.anyio

FAST_BACKOFF = Backoff(base=0.01, cap=0.05)
TWO_STEPS = [
    [FakeCall("lookup", {"key": "a"}), FakeCall("lookup", {"key": "b"})],
    [FakeCall("lookup", {"key": "c"})],
]
OTHER_SECRET = "whsec_dGhlLW90aGVyLXNlY3JldC1rZXktMTIzNDU2Nzg="


@dataclass
class Stack:
    fake: FakeAgentsAPI
    base_url: str
    webhook_url: str
    runs: collections.Counter[str]


@contextlib.asynccontextmanager
async def local_stack() -> AsyncIterator[Stack]:
    """The fake (no webhook URL: nothing can reach the app but ``listen``) and the user's
    Starlette app with the webhook routes, each under uvicorn on a free loopback port."""
    tools, runs = counting_tools()
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake, serve_fake(fake) as base_url:
        client = AgentsClient(api_key=API_KEY, base_url=base_url)
        app = AgentWebhookApp(
            tools, webhook_secret=SECRET, client=client, store="memory://", settings=FAST
        )
        host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
        async with client, serve_app(host, lifespan="on") as root:
            yield Stack(fake, base_url, root + "/openai/webhooks", runs)


@contextlib.asynccontextmanager
async def listening(
    stack: Stack, *session_ids: str, poll_interval: float = 0.05
) -> AsyncIterator[io.StringIO]:
    """``listen`` in this process until the block ends; yields its stdout."""
    out, err = io.StringIO(), io.StringIO()
    stop = asyncio.Event()
    async with AgentsClient(api_key=API_KEY, base_url=stack.base_url) as client:
        task = asyncio.create_task(
            listen(
                stack.webhook_url,
                secrets=[SECRET],
                client=client,
                session_ids=session_ids,
                poll_interval=poll_interval,
                stop=stop,
                out=out,
                err=err,
                backoff=FAST_BACKOFF,
            )
        )
        try:
            yield out
        finally:
            stop.set()
            assert await task == 0
    assert "stopped" in err.getvalue()


def forwarded(out: io.StringIO) -> list[str]:
    return [line.split("  ", 1)[1] for line in out.getvalue().splitlines()]


async def test_listen_discovers_active_sessions_and_the_app_answers_them() -> None:
    """Without ``--session``, sessions that become active are found by polling the list
    (an idle one is not followed) and each delivery is forwarded once, answered 200."""
    async with local_stack() as stack, listening(stack) as out:
        idle = stack.fake.create_session([])
        first = stack.fake.create_session(TWO_STEPS)
        second = stack.fake.create_session([[FakeCall("lookup", {"key": "d"})]])
        await stack.fake.wait_idle(first, timeout=20)
        await stack.fake.wait_idle(second, timeout=20)
    assert stack.runs == {"a": 1, "b": 1, "c": 1, "d": 1}
    lines = forwarded(out)
    assert sorted(lines) == sorted(
        [
            f"{first} action_required (2 calls: lookup, lookup) -> 200 accepted",
            f"{first} action_required (1 call: lookup) -> 200 accepted",
            f"{second} action_required (1 call: lookup) -> 200 accepted",
        ]
    )
    assert idle not in out.getvalue()


async def test_a_dropped_stream_mid_turn_still_completes_the_turn_once() -> None:
    """The stream is cut instead of sending step 2's ``requires_action``: the listener
    reconnects, re-reads the session, forwards step 2; every call ran exactly once."""
    async with local_stack() as stack:
        session_id = stack.fake.create_session(TWO_STEPS)
        stack.fake.cut_streams(session_id, before="agent.session.requires_action")
        async with listening(stack, session_id) as out:
            await stack.fake.wait_idle(session_id, timeout=20)
    assert not stack.fake.faults.stream_cuts
    assert stack.runs == {"a": 1, "b": 1, "c": 1}
    assert len(stack.fake.submissions) == 3
    assert stack.fake.duplicate_submissions == []
    assert len(forwarded(out)) == 2


async def test_an_unreadable_event_of_one_session_stops_no_follower() -> None:
    """Issue 22: one session's streamed snapshot nests its arguments 100,000 levels deep.
    Before, the RecursionError ended ``listen`` for every session it followed. Now that
    event is skipped and the session read again; both sessions' turns complete."""
    async with local_stack() as stack:
        deep = stack.fake.create_session(DEEP_SECOND_STEP)
        plain = stack.fake.create_session(TWO_STEPS)
        async with listening(stack, deep, plain):
            await stack.fake.wait_idle(deep, timeout=20)
            await stack.fake.wait_idle(plain, timeout=20)
    assert stack.runs == {"a": 2, "b": 1, "c": 2}
    failed = [s for s in stack.fake.submissions if not s.success]
    assert [s.call_id for s in failed] == ["deep"]


async def test_repeated_stream_events_are_forwarded_once() -> None:
    """Every streamed event arrives twice (same ``event_id``): one delivery per step."""
    async with local_stack() as stack:
        stack.fake.duplicate_stream_events()
        session_id = stack.fake.create_session(TWO_STEPS)
        async with listening(stack, session_id) as out:
            await stack.fake.wait_idle(session_id, timeout=20)
    assert stack.runs == {"a": 1, "b": 1, "c": 1}
    assert len(forwarded(out)) == 2


async def test_a_delivery_the_app_cannot_take_is_retried_then_reported() -> None:
    """No app on the port: each attempt is one line, the last says it gave up."""
    port = free_port()
    session = AgentSession.model_validate(
        {
            "id": "sess_1",
            "status": "requires_action",
            "required_actions": [
                {"type": "function_call", "turn_id": "t", "call_id": "c", "name": "f"}
            ],
        }
    )
    out = io.StringIO()
    async with httpx.AsyncClient(timeout=5.0) as http:
        forwarder = Forwarder(
            f"http://127.0.0.1:{port}/hooks",
            [SECRET],
            http,
            out=out,
            attempts=3,
            backoff=FAST_BACKOFF,
        )
        await forwarder(session)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert all("no answer (ConnectError: is the app running?)" in line for line in lines)
    assert [line.endswith("retrying)") for line in lines] == [True, True, False]


async def test_a_wrong_secret_is_reported_with_the_fix_and_not_retried() -> None:
    """The app refuses a delivery signed with another secret (401): one line naming the
    fix, no retry."""
    async with local_stack() as stack:
        session_id = stack.fake.create_session([[FakeCall("lookup", {"key": "a"})]])
        out = io.StringIO()
        async with (
            AgentsClient(api_key=API_KEY, base_url=stack.base_url) as client,
            httpx.AsyncClient(timeout=5.0) as http,
        ):
            forwarder = Forwarder(stack.webhook_url, [OTHER_SECRET], http, out=out)
            await forwarder(await client.retrieve_session(session_id))
    [line] = out.getvalue().splitlines()
    assert "-> 401" in line and "OPENAI_WEBHOOK_SECRET" in line
    assert not stack.runs


# -- the command itself ----------------------------------------------------------------------


def _env(base_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTFN_"))}
    return {**env, "OPENAI_API_KEY": API_KEY, "OPENAI_BASE_URL": base_url, **extra}


@pytest.mark.slow
async def test_the_listen_command_answers_a_session_and_stops_on_ctrl_c() -> None:
    """``agentfn-asgi listen`` as a real process (secret from OPENAI_WEBHOOK_SECRET): the
    session completes through the local app, one stdout line per delivery, and Ctrl-C
    (SIGINT) stops it with exit 0 and no traceback."""
    async with local_stack() as stack:
        session_id = stack.fake.create_session(TWO_STEPS)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentfn_asgi",
            "listen",
            "--forward-to",
            stack.webhook_url,
            "--session",
            session_id,
            env=_env(stack.base_url, OPENAI_WEBHOOK_SECRET=SECRET),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await stack.fake.wait_idle(session_id, timeout=30)
            process.send_signal(signal.SIGINT)
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, stderr.decode()
    assert stack.runs == {"a": 1, "b": 1, "c": 1}
    lines = [line.split("  ", 1)[1] for line in stdout.decode().splitlines()]
    assert lines == [
        f"{session_id} action_required (2 calls: lookup, lookup) -> 200 accepted",
        f"{session_id} action_required (1 call: lookup) -> 200 accepted",
    ]
    errors = stderr.decode()
    assert "stopped (2 deliveries forwarded)" in errors
    assert "Traceback" not in errors


@pytest.mark.slow
async def test_the_listen_command_stops_on_sigterm_while_waiting() -> None:
    """Discovering with nothing active, SIGTERM stops it cleanly (exit 0)."""
    async with local_stack() as stack:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentfn_asgi",
            "listen",
            "--forward-to",
            stack.webhook_url,
            "--secret",
            SECRET,
            env=_env(stack.base_url),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stderr is not None
        try:
            banner = await asyncio.wait_for(process.stderr.readline(), timeout=20)
            assert b"listening to the project's active sessions" in banner
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0
    assert b"stopped (0 deliveries forwarded)" in stderr


@pytest.mark.parametrize(
    ("argv", "env", "code", "message"),
    [
        (["listen"], {}, 2, "--forward-to"),
        (["listen", "--forward-to", "localhost:8000"], {}, 2, "expected the app's webhook URL"),
        (["listen", "--forward-to", "http://127.0.0.1:1/h"], {}, 2, "no webhook secret"),
        (
            ["listen", "--forward-to", "http://127.0.0.1:1/h", "--secret", "whsec_!"],
            {"OPENAI_API_KEY": "sk", "OPENAI_BASE_URL": "http://127.0.0.1:1/v1"},
            2,
            "webhook secret is not valid base64",
        ),
        (
            ["listen", "--forward-to", "http://127.0.0.1:1/h", "--secret", SECRET],
            {},
            2,
            "no API key",
        ),
        (["listen", "--forward-to", "http://x/h", "--poll-interval", "0"], {}, 2, "more than 0"),
    ],
)
def test_user_mistakes_are_one_line_not_a_traceback(
    argv: list[str],
    env: dict[str, str],
    code: int,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Missing or malformed options, secret or key: exit 2 (usage) or 1, a message."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENTFN_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        result = main(argv)
    except SystemExit as exit_info:
        result = exit_info.code  # type: ignore[assignment]
    assert result == code
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err


async def test_a_refused_api_key_ends_listen_with_a_message() -> None:
    """The API refuses the key (401): exit 1 naming the variables to check."""
    async with local_stack() as stack:
        stack.fake.create_session([[FakeCall("lookup", {"key": "a"})]])
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OPENAI_API_KEY", "sk-wrong")
            patch.setenv("OPENAI_BASE_URL", stack.base_url)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = await anyio.to_thread.run_sync(
                    main, ["listen", "--forward-to", stack.webhook_url, "--secret", SECRET]
                )
    assert code == 1
    assert "the Agents API refused the request" in err.getvalue()
    assert "check OPENAI_API_KEY" in err.getvalue()
