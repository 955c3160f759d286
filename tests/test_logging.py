"""What an operator reads in the app's log (issue 16, "Logs"): refused deliveries, finished
calls, a lazy start, configurations refused at start-up. Never a secret or a body."""

from __future__ import annotations

import logging

import pytest

from agentfn_asgi import AgentsClient, AgentWebhookApp, FunctionTools
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.testing import FakeCall, action_required_event, signed_delivery

from .support.stack import SECRET, running_stack

OTHER_SECRET = "whsec_b3RoZXItc2VjcmV0LW9mLXRoaXJ0eS10d28tYnl0ZXMh"


def _tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def ping() -> str:
        """Answers pong."""
        return "pong"

    return tools


def _lines(caplog: pytest.LogCaptureFixture, name: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


@pytest.mark.anyio
async def test_a_refused_delivery_is_a_warning_naming_the_reason_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A delivery signed with the wrong secret: one WARNING naming the reason and what to
    check; ten more within the minute add no line; no secret, signature or body is logged."""
    caplog.set_level(logging.INFO, logger="agentfn_asgi")
    async with running_stack(_tools(), webhooks=False) as stack:
        event = action_required_event("sess_1")
        for _ in range(11):
            body, headers = signed_delivery(OTHER_SECRET, event)
            assert (await stack.post_webhook(body, headers)).status_code == 401
    [line] = _lines(caplog, "agentfn_asgi.app", logging.WARNING)
    assert "bad_signature" in line and "OPENAI_WEBHOOK_SECRET" in line
    text = caplog.text
    assert SECRET not in text and OTHER_SECRET not in text
    assert headers["webhook-signature"] not in text and "sess_1" not in text


@pytest.mark.anyio
async def test_each_finished_call_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    """One INFO line per finished call: tool, session, call, outcome, source, duration."""
    caplog.set_level(logging.INFO, logger="agentfn_asgi")
    async with running_stack(_tools()) as stack:
        sid = stack.fake.create_session([[FakeCall("ping", {}, call_id="c1")]])
        await stack.fake.wait_idle(sid, timeout=10)
    [line] = [
        m
        for m in _lines(caplog, "agentfn_asgi.dispatch.execution", logging.INFO)
        if m.startswith("call finished")
    ]
    for part in ("tool=ping", f"session={sid}", "call=c1", "outcome=success", "source=ran"):
        assert part in line
    assert "submission=submitted" in line and "duration=" in line


@pytest.mark.anyio
async def test_a_lazy_start_warns_once_what_is_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Started by its first request instead of a lifespan: one WARNING saying the start-up
    recovery was late and shutdown will not drain, and how to fix it."""
    caplog.set_level(logging.INFO, logger="agentfn_asgi")
    async with running_stack(_tools(), start=False, webhooks=False) as stack:
        for n in range(2):
            body, headers = signed_delivery(SECRET, action_required_event(f"sess_{n}"))
            assert (await stack.post_webhook(body, headers)).status_code == 200
    [line] = _lines(caplog, "agentfn_asgi.app", logging.WARNING)
    assert "lazily" in line and "lifespan=webhooks.lifespan" in line and "drained" in line


def test_a_worker_tool_without_a_public_url_is_refused() -> None:
    """Jobs must say where to post their result: without a public URL the app refuses to
    start, naming AGENTFN_PUBLIC_URL."""
    tools = FunctionTools()

    @tools.function(enqueue=lambda job: None)
    def report() -> str:
        """Builds a report in a worker."""
        return ""

    webhooks = AgentWebhookApp(
        tools,
        webhook_secret=SECRET,
        completion_secret="c" * 32,
        store="memory://",
        client=_client(),
    )
    with pytest.raises(ConfigurationError, match="AGENTFN_PUBLIC_URL"):
        webhooks.check()


def test_a_completion_secret_equal_to_the_webhook_secret_is_refused() -> None:
    """Reusing the webhook secret to sign completion tokens is refused at start-up."""
    webhooks = AgentWebhookApp(
        _tools(),
        webhook_secret=SECRET,
        completion_secret=SECRET,
        store="memory://",
        client=_client(),
    )
    with pytest.raises(ConfigurationError, match="a secret of its own"):
        webhooks.check()


def _client() -> AgentsClient:
    return AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
