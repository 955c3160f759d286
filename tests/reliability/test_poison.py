"""Poison input never loops and never blocks a session (issue 14).

Each test names the behaviour of the code before the fix: a call that was re-run every
lease period and never answered, or a whole session left unanswered for one strange call.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import anyio
import pytest

from agentfn_asgi import FunctionTools, ToolContext
from agentfn_asgi.calls.records import CallState
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.messages import TOO_MANY_ATTEMPTS_MESSAGE
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import (
    FakeAgentsAPI,
    FakeCall,
    RawJSON,
    action_required_event,
    signed_delivery,
)

from ..support.stack import API_KEY, FAST, SECRET, running_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]


def _tools(runs: list[str]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def list_files(folder: str) -> str:
        """List a folder (returns an undecodable file name, as os.listdir can)."""
        runs.append("list_files")
        return "report-\udcff.txt"  # a lone surrogate: no JSON encoder or store can carry it

    @tools.function
    def echo(value: int | list[Any] | None = None) -> str:
        """Echo a value."""
        runs.append("echo")
        return "ok"

    return tools


async def test_a_result_with_a_lone_surrogate_is_answered_once() -> None:
    """Before: encoding the result raised UnicodeEncodeError past the dispatcher, the claim
    expired and the handler ran again every lease period, never answered. Now: one run, one
    model-facing failure."""
    runs: list[str] = []
    async with running_stack(_tools(runs)) as stack:
        sid = stack.fake.create_session([[FakeCall("list_files", {"folder": "/tmp"})]])
        await stack.fake.wait_idle(sid, timeout=10)
        await anyio.sleep(FAST.lease_seconds + 0.5)  # a lease period: nothing runs again
    [submission] = stack.fake.submissions
    assert submission.success is False
    assert "could not be sent" in (submission.error or "")
    assert runs == ["list_files"]


async def test_an_argument_string_with_a_huge_integer_fails_that_call() -> None:
    """Arguments sent as a JSON string holding a 5,000-digit integer: json.loads raised a
    plain ValueError (not a syntax error), which escaped validation and looped. Now: a
    validation failure the model can read."""
    runs: list[str] = []
    huge = json.dumps(json.dumps({"value": 1})).replace("1", "9" * 5000)
    async with running_stack(_tools(runs)) as stack:
        sid = stack.fake.create_session([[FakeCall("echo", RawJSON(huge))]])
        await stack.fake.wait_idle(sid, timeout=10)
    [submission] = stack.fake.submissions
    assert submission.success is False
    assert "number that is too large" in (submission.error or "")
    assert runs == []


@pytest.mark.parametrize(
    ("label", "raw"),
    [
        ("nested 400 levels", '{"value": ' + "[" * 400 + "]" * 400 + "}"),
        ("a 5,000-digit integer", '{"value": ' + "9" * 5000 + "}"),
        ("a lone surrogate escape", '{"value": "\\ud800"}'),
    ],
)
async def test_one_strange_call_does_not_stop_its_siblings(label: str, raw: str) -> None:
    """Before: pydantic refused the whole session body for one call's arguments, so no call
    of the session was ever answered. Now: that call fails with a message saying what could
    not be read; its sibling is answered normally."""
    runs: list[str] = []
    async with running_stack(_tools(runs)) as stack:
        calls = [
            FakeCall("echo", RawJSON(raw), call_id="strange"),
            FakeCall("echo", {"value": 1}, call_id="plain"),
        ]
        sid = stack.fake.create_session([calls])
        await stack.fake.wait_idle(sid, timeout=10)
    by_call = {s.call_id: s for s in stack.fake.submissions}
    assert set(by_call) == {"strange", "plain"}, label
    assert by_call["plain"].success is True and by_call["plain"].output == "ok"
    assert by_call["strange"].success is False
    assert "could not be read" in (by_call["strange"].error or "")
    assert runs == ["echo"]


async def test_a_call_that_keeps_dying_stops_after_max_attempts() -> None:
    """A call whose process dies every time it runs (here: an app stopped mid-handler, its
    claim left to expire) is started max_attempts times, then answered with a failure
    instead of being started again. Before: it was started again forever."""
    settings = replace(FAST, lease_seconds=0.6, max_attempts=3)
    store = open_store("memory://")
    # No webhooks: the first app gets one delivery by hand, later ones find the expired
    # claim with their recovery sweep, as a restarted replica does.
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    started: list[int] = []
    tools = FunctionTools()

    @tools.function
    async def hang(ctx: ToolContext) -> str:
        """Never returns (its process 'dies' while it runs)."""
        started.append(ctx.attempt)
        await anyio.sleep_forever()
        return "unreachable"

    async with fake:
        sid = ""
        for attempt in range(1, settings.max_attempts + 1):
            async with running_stack(tools, store=store, settings=settings, fake=fake) as stack:
                if attempt == 1:
                    sid = fake.create_session([[FakeCall("hang", {}, call_id="c1")]])
                    body, headers = signed_delivery(SECRET, action_required_event(sid))
                    assert (await stack.post_webhook(body, headers)).status_code == 200
                with anyio.fail_after(10):
                    while started[-1:] != [attempt]:
                        await anyio.sleep(0.02)
                # The "crash": stop without draining; the claim stays and expires.
                await stack.app.dispatcher.stop(drain_timeout=0)
            await anyio.sleep(settings.lease_seconds + settings.fence_margin + 0.1)
        async with running_stack(tools, store=store, settings=settings, fake=fake) as stack:
            await fake.wait_idle(sid, timeout=10)
            record = await stack.store.get_call(
                next(iter(await stack.store.calls_for_session(sid))).key
            )
    assert started == [1, 2, 3]
    [submission] = fake.submissions
    assert submission.success is False
    assert submission.error == TOO_MANY_ATTEMPTS_MESSAGE.format(attempts=3)
    assert record is not None and record.state is CallState.SUBMITTED


async def test_the_max_attempts_setting_is_read_from_the_environment() -> None:
    """AGENTFN_MAX_ATTEMPTS configures the bound (documented in docs/configuration.md)."""
    from agentfn_asgi import Config

    assert Config.from_env({"AGENTFN_MAX_ATTEMPTS": "7"}).dispatch.max_attempts == 7
    assert DispatchSettings().max_attempts == 5
