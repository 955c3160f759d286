"""The fake served for local development: the ``/_fake/`` control API (session scripts with
readable errors, redelivery) and ``serve_fake_api`` (retries with backoff, says when it
gives up)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from agentfn_asgi import AgentsClient, AgentWebhookApp, FunctionTools
from agentfn_asgi.integrations.starlette import webhook_routes
from agentfn_asgi.testing import FakeAgentsAPI, FakeControlApp, serve_app
from agentfn_asgi.testing.control import (
    ONE_STEP_SHAPE,
    SESSION_SCRIPT_SHAPE,
    parse_session_script,
    serve_fake_api,
)

from ..support.ports import free_port

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

#: A session script a newcomer gets wrong -> what the 400 says (also listed for the README's
#: common mistakes).
BAD_SCRIPTS: list[tuple[bytes | Any, str]] = [
    (b"calls: get_customer", "the body is not JSON"),
    ([{"name": "get_customer"}], "the body must be a JSON object, got an array"),
    ({}, 'the body needs "steps" (several steps) or "calls" (one step)'),
    ({"call": []}, 'the body has an unknown key "call" (did you mean "calls"?)'),
    ({"steps": [], "calls": []}, 'give either "steps" or "calls", not both'),
    ({"steps": [{"name": "get_customer"}]}, "steps[0] must be an array of calls, got an object"),
    ({"steps": {"name": "get_customer"}}, '"steps" must be an array of steps'),
    ({"steps": []}, '"steps" is empty: a session needs at least one step'),
    ({"calls": []}, "calls is empty: a step needs at least one call"),
    ({"calls": ["get_customer"]}, "calls[0] must be an object like"),
    ({"calls": [{"arguments": {}}]}, "calls[0].name must be the tool's name (a string)"),
    (
        {"calls": [{"name": "get_customer", "args": {}}]},
        'calls[0] has an unknown key "args" (did you mean "arguments"?)',
    ),
    (
        {"calls": [{"name": "get_customer", "arguments": '{"customer_id": "123"}'}]},
        "calls[0].arguments must be an object of the tool's arguments, got a string",
    ),
    (
        {"calls": [{"name": "a", "call_id": "c1"}, {"name": "b", "call_id": "c1"}]},
        "call id c1 is already used",
    ),
]


@pytest.fixture
async def control() -> AsyncIterator[tuple[FakeAgentsAPI, httpx.AsyncClient]]:
    async with FakeAgentsAPI(webhook_secret=SECRET) as fake:
        transport = httpx.ASGITransport(app=FakeControlApp(fake))
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http:
            yield fake, http


@pytest.mark.parametrize(("body", "message"), BAD_SCRIPTS)
async def test_a_bad_session_script_gets_a_readable_400(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient], body: bytes | Any, message: str
) -> None:
    """Each mistake answers 400 naming what is wrong and where, with the expected shape;
    no Python repr, and no session is created."""
    fake, http = control
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = await http.post("/_fake/sessions", content=content)
    assert answer.status_code == 400
    error = answer.json()
    assert message in error["error"], error
    assert error["error"].startswith("bad session script: ")
    assert SESSION_SCRIPT_SHAPE in error["expected"] and ONE_STEP_SHAPE in error["expected"]
    assert "Error(" not in error["error"] and "\\n" not in error["error"]
    assert fake.sessions == {}


def test_a_script_of_steps_becomes_the_calls_of_each_step() -> None:
    """``steps`` keeps the batches and their order; ``arguments`` defaults to {}."""
    steps = parse_session_script(
        {"steps": [[{"name": "a", "arguments": {"x": 1}}, {"name": "b"}], [{"name": "c"}]]}
    )
    assert [[(c.name, c.arguments) for c in step] for step in steps] == [
        [("a", {"x": 1}), ("b", {})],
        [("c", {})],
    ]


async def test_sessions_are_created_and_results_listed(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient],
) -> None:
    """A good script answers 201 with the session id, whose calls are pending."""
    fake, http = control
    answer = await http.post(
        "/_fake/sessions", json={"calls": [{"name": "get_customer", "call_id": "c1"}]}
    )
    assert answer.status_code == 201
    [action] = fake.required_actions(answer.json()["id"])
    assert action["call_id"] == "c1" and action["arguments"] == {}
    assert (await http.get("/_fake/submissions")).json() == []


async def test_control_paths_answer_405_and_404_with_directions(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient],
) -> None:
    """A wrong method names the right one; an unknown control path lists the endpoints."""
    _, http = control
    wrong = await http.get("/_fake/sessions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    unknown = await http.get("/_fake/nothing")
    assert unknown.status_code == 404
    assert "POST /_fake/sessions/{id}/redeliver" in unknown.json()["endpoints"]


async def test_redeliver_answers_for_each_state(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient],
) -> None:
    """404 for an unknown session, 409 without a webhook URL or with nothing pending, and
    202 with a fresh webhook-id when calls are pending."""
    fake, http = control
    assert (await http.post("/_fake/sessions/sess_nope/redeliver")).status_code == 404
    pending = (await http.post("/_fake/sessions", json={"calls": [{"name": "a"}]})).json()["id"]
    no_url = await http.post(f"/_fake/sessions/{pending}/redeliver")
    assert no_url.status_code == 409 and "--webhook-url" in no_url.json()["error"]
    fake.add_webhook_url("http://127.0.0.1:9/unreachable")
    answer = await http.post(f"/_fake/sessions/{pending}/redeliver")
    assert answer.status_code == 202
    assert answer.json()["webhook_id"].startswith("wh_")
    fake.cancel_turn(pending)
    idle = await http.post(f"/_fake/sessions/{pending}/redeliver")
    assert idle.status_code == 409 and "no pending calls" in idle.json()["error"]


async def test_a_turn_is_cancelled_or_failed_through_the_control_api(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient],
) -> None:
    """cancel and fail end the active turn (the turn then reads cancelled, or failed with
    the code given); 404 for an unknown session, 409 once no turn is active, 400 for a body
    that is not an object."""
    fake, http = control
    assert (await http.post("/_fake/sessions/sess_nope/cancel")).status_code == 404
    one = (await http.post("/_fake/sessions", json={"calls": [{"name": "a"}]})).json()["id"]
    two = (await http.post("/_fake/sessions", json={"calls": [{"name": "b"}]})).json()["id"]
    turn = fake.required_actions(two)[0]["turn_id"]
    cancelled = await http.post(f"/_fake/sessions/{one}/cancel")
    assert cancelled.status_code == 200 and cancelled.json() == {"status": "cancelled"}
    assert fake.required_actions(one) == [] and fake.session(one)["status"] == "idle"
    assert (await http.post(f"/_fake/sessions/{one}/cancel")).status_code == 409
    assert (await http.post(f"/_fake/sessions/{two}/fail", content=b"[1]")).status_code == 400
    failed = await http.post(
        f"/_fake/sessions/{two}/fail", json={"code": "session_budget_exceeded", "message": "m"}
    )
    assert failed.status_code == 200 and failed.json() == {"status": "failed"}
    assert fake.session(two)["status"] == "failed" and fake.session(two)["error"] == "m"
    auth = {"Authorization": "Bearer sk-test", "OpenAI-Beta": "agents=v1"}
    read = await http.get(f"/v1/agents/sessions/{two}/turns/{turn}", headers=auth)
    assert read.status_code == 200, read.text
    assert read.json()["status"] == "failed"
    assert read.json()["error"] == {"code": "session_budget_exceeded", "message": "m"}
    missing = await http.get(f"/v1/agents/sessions/{two}/turns/turn_nope", headers=auth)
    assert missing.status_code == 404


async def test_a_session_is_paused_on_its_budget_through_the_control_api(
    control: tuple[FakeAgentsAPI, httpx.AsyncClient],
) -> None:
    """budget pauses a session (status budget_reached, spend_control as given, the stream
    event); 404 for an unknown session, 400 for a body that is not whole numbers or spends
    less than the limit."""
    fake, http = control
    assert (await http.post("/_fake/sessions/sess_nope/budget")).status_code == 404
    sid = (await http.post("/_fake/sessions", json={"calls": [{"name": "a"}]})).json()["id"]
    for bad in (b"[1]", b'{"limit": "x"}', b'{"limit": 5, "consumed": 4}', b'{"limit": true}'):
        assert (await http.post(f"/_fake/sessions/{sid}/budget", content=bad)).status_code == 400
    paused = await http.post(f"/_fake/sessions/{sid}/budget", json={"limit": 5, "consumed": 7})
    assert paused.status_code == 200 and paused.json() == {"status": "budget_reached"}
    snapshot = fake.session(sid)
    assert snapshot["status"] == "budget_reached"
    assert snapshot["spend_control"] == {"limit": 5, "consumed": 7}
    assert fake.events(sid)[-1]["type"] == "agent.session.budget_reached"


# -- serve_fake_api --------------------------------------------------------------------------


def _echo_tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def echo(text: str) -> str:
        """Echo the text."""
        return text

    return tools


@contextlib.asynccontextmanager
async def _fake_api(
    app_port: int, **options: Any
) -> AsyncIterator[tuple[str, io.StringIO, Callable[[], Awaitable[list[Any]]]]]:
    """``serve_fake_api`` in a task, webhooks to ``app_port``; yields its root URL, its
    output and a reader of its submissions."""
    port = free_port()
    out = io.StringIO()
    ready = asyncio.Event()
    server = asyncio.create_task(
        serve_fake_api(
            port=port,
            webhook_urls=[f"http://127.0.0.1:{app_port}/openai/webhooks"],
            webhook_secret=SECRET,
            calls=[("echo", {"text": "hi"})],
            out=out,
            ready=ready,
            **options,
        )
    )
    root = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=root) as http:

        async def submissions() -> list[Any]:
            return list((await http.get("/_fake/submissions")).json())

        try:
            await asyncio.wait_for(ready.wait(), timeout=10)
            yield root, out, submissions
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server


@contextlib.asynccontextmanager
async def _app_on(port: int, root: str) -> AsyncIterator[None]:
    """The user's app, started late on ``port``, reading from the fake at ``root``."""
    client = AgentsClient(api_key="sk-test", base_url=root + "/v1")
    app = AgentWebhookApp(_echo_tools(), webhook_secret=SECRET, client=client, store="memory://")
    host = Starlette(routes=webhook_routes(app), lifespan=app.lifespan)
    async with serve_app(host, port=port, lifespan="on"):
        yield
    await client.aclose()


async def _wait_for(check: Callable[[], Awaitable[bool]], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not await check():
            await asyncio.sleep(0.05)


async def test_giving_up_is_printed_and_redeliver_gets_the_call_answered() -> None:
    """With nothing listening, each failed attempt says when the next comes, the last says
    the fake gave up and how to redeliver; once the app runs, redeliver gets the call
    answered."""
    app_port = free_port()
    async with _fake_api(app_port, webhook_retry_delays=(0.05,)) as (root, out, submissions):
        await _wait_for(lambda: _contains(out, "/redeliver"), 10)
        log = out.getvalue()
        assert "(attempt 1, next in 0.05 s)" in log
        assert "gave up on webhook wh_" in log and "after 2 attempt(s)" in log
        session_id = "sess_" + log.split("\nsession sess_", 1)[1].split()[0]
        assert f"curl -X POST {root}/_fake/sessions/{session_id}/redeliver" in log
        async with _app_on(app_port, root), httpx.AsyncClient() as http:
            answer = await http.post(f"{root}/_fake/sessions/{session_id}/redeliver")
            assert answer.status_code == 202
            await _wait_for(lambda: _has_results(submissions, 1), 10)
        assert [s["output"] for s in await submissions()] == ["hi"]


async def test_a_webhook_url_nothing_answers_names_the_mount_path() -> None:
    """A 404 from the app's host (the receiver is mounted at another path) was logged as a
    bare 404; each webhook's first attempt now says to check the mount path."""
    app_port = free_port()
    async with (
        serve_app(Starlette(), port=app_port, lifespan="off"),
        _fake_api(app_port, webhook_retry_delays=(0.05,)) as (_, out, _),
    ):
        await _wait_for(lambda: _contains(out, "gave up"), 10)
    log = out.getvalue()
    assert "-> http://127.0.0.1:" in log and "/openai/webhooks: 404" in log
    assert "  nothing answers at /openai/webhooks: check the mount path" in log
    assert log.count("check the mount path") == log.count("(attempt 1, next in")


@pytest.mark.slow
async def test_the_default_retries_wait_for_an_app_started_seconds_later() -> None:
    """``fake-api``'s default schedule (minutes, not 1.5 s) delivers to an app that starts
    two seconds after the session was created: the first retry after 1 s fails, the
    next (3 s in) is answered."""
    app_port = free_port()
    async with _fake_api(app_port) as (root, out, submissions):
        await _wait_for(lambda: _contains(out, "next in 1 s"), 10)
        await asyncio.sleep(2.0)
        async with _app_on(app_port, root):
            await _wait_for(lambda: _has_results(submissions, 1), 15)
    assert "gave up" not in out.getvalue()
    assert "a failed webhook is retried 10 time(s) over 300 s" in out.getvalue()


async def _contains(out: io.StringIO, text: str) -> bool:
    return text in out.getvalue()


async def _has_results(submissions: Callable[[], Awaitable[list[Any]]], n: int) -> bool:
    return len(await submissions()) >= n


async def test_a_result_submitted_just_before_the_server_stops_is_printed() -> None:
    """The output is polled every 50 ms; a result that came in after the last look was
    never printed when the server stopped (the CLI's last lines went missing)."""
    async with _fake_api(free_port(), webhook_retry_delays=()) as (root, out, _):
        session_id = "sess_" + out.getvalue().split("\nsession sess_", 1)[1].split()[0]
        headers = {"Authorization": "Bearer sk-test", "OpenAI-Beta": "agents=v1"}
        async with httpx.AsyncClient(base_url=root + "/v1", headers=headers) as api:
            read = await api.get(f"/agents/sessions/{session_id}")
            assert read.status_code == 200, read.text
            (action,) = read.json()["required_actions"]
            event = {
                "type": "agent.session.input.tool_result",
                "turn_id": action["turn_id"],
                "call_id": action["call_id"],
                "success": True,
                "output": "late",
            }
            posted = await api.post(
                f"/agents/sessions/{session_id}/events", json={"events": [event]}
            )
            assert posted.status_code == 202, posted.text
    assert f"result  {session_id}/{action['call_id']}: late" in out.getvalue()
