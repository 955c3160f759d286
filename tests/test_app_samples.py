"""The app answers the sample of every webhook event type on purpose (``webhooks test``):
2xx, nothing run, one log line each, and no warning.

The fake's endpoint points at the app in this process; each sample is signed with the
endpoint's secret, which the app is configured with.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from agentfn_asgi import FunctionTools
from agentfn_asgi.operator import CallFilter
from agentfn_asgi.testing import FakeAgentsAPI, connect
from agentfn_asgi.wire import WEBHOOK_EVENT_TYPES
from tests.support.stack import FAST

pytestmark = pytest.mark.anyio

APP_URL = "http://app.test/openai/webhooks"


def registry(ran: list[str]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        return key

    return tools


async def test_every_event_types_sample_is_answered_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each documented type's sample gets 200; the types the app does not act on are one
    INFO line each ("nothing to do"); the samples of the three it acts on
    (``action_required``, and ``idle``/``failed``, which settle a session whose turn ended)
    name a session that does not exist: one INFO line each saying so, no warning, no call
    run, nothing submitted."""
    ran: list[str] = []
    settings = replace(FAST, not_found_retries=())
    async with FakeAgentsAPI() as fake:
        status, created = fake.endpoints.create(
            {"url": APP_URL, "name": "app", "event_types": list(WEBHOOK_EVENT_TYPES)}
        )
        assert status == 200
        async with connect(
            registry(ran), fake, settings=settings, webhook_secret=created["signing_secret"]
        ) as (app, _):
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="agentfn_asgi"):
                answers = {
                    kind: await fake.test_webhook_endpoint(created["id"], kind)
                    for kind in WEBHOOK_EVENT_TYPES
                }
                async with asyncio.timeout(10):
                    while sum("not found" in r.getMessage() for r in caplog.records) < 3:
                        await asyncio.sleep(0.01)
            page = await app.operator().calls(CallFilter())
    assert answers == dict.fromkeys(WEBHOOK_EVENT_TYPES, 200)
    lines = [
        r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("agentfn")
    ]
    assert [r for r in lines if r.levelno >= logging.WARNING] == []
    ignored = [r.getMessage() for r in lines if "nothing to do" in r.getMessage()]
    acted = ("agent.session.action_required", "agent.session.idle", "agent.session.failed")
    others = [kind for kind in WEBHOOK_EVENT_TYPES if kind not in acted]
    assert len(ignored) == len(others)
    for kind, line in zip(others, ignored, strict=True):
        assert f"({kind}) answered 200, nothing to do" in line
    missing = [r.getMessage() for r in lines if "not found" in r.getMessage()]
    assert len(missing) == len(acted)
    assert all("agentfn-asgi webhooks test" in line for line in missing)
    assert len(lines) == len(WEBHOOK_EVENT_TYPES)
    assert ran == [] and fake.submissions == [] and list(page.calls) == []


async def test_ignored_lines_are_throttled_per_event_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flood of one ignored type is one line a minute (the next one counts the rest)."""
    async with FakeAgentsAPI() as fake:
        _, created = fake.endpoints.create(
            {"url": APP_URL, "name": "app", "event_types": ["agent.session.idle"]}
        )
        async with connect(
            registry([]), fake, settings=FAST, webhook_secret=created["signing_secret"]
        ):
            with caplog.at_level(logging.INFO, logger="agentfn_asgi.app"):
                for _ in range(5):
                    assert await fake.test_webhook_endpoint(created["id"], "batch.failed") == 200
    assert len([r for r in caplog.records if "nothing to do" in r.getMessage()]) == 1
