"""Actions nobody here answers on the operator page (issue 34), over the real
:class:`~agentfn_asgi.operator.Operator` and the memory store: the overview counts them in a
card that opens their list, with their kinds, the oldest one's age and that someone else
must answer them; the list and the call's page show the outcome and why."""

from __future__ import annotations

import html

import pytest

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.operator import Operator
from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock
from .conftest import TOKEN, admin_url
from .test_app import BEARER, connect

pytestmark = pytest.mark.anyio


async def left(store: MemoryStore, key: CallKey, name: str, why: str) -> None:
    outcome = await store.claim_call(key, tool_name=name, owner="replica-a", lease_seconds=30)
    assert await store.leave(key, owner="replica-a", attempt=outcome.record.attempt, reason=why)


async def test_unanswered_actions_have_a_card_a_count_a_list_and_a_reason() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await left(store, CallKey("sess", "turn", "req_crm"), "mcp:crm/find", "no actions= policy")
    clock.advance(60)
    environment = CallKey("sess", "", "environment:env_1")
    await left(store, environment, "environment:env_1", "no connect_environment hook")
    clock.advance(240)
    view = Operator(store, location="memory://", clock=clock)
    async with connect(AdminApp(view, tokens=[TOKEN], clock=clock)) as http:
        overview = html.unescape((await http.get(admin_url("/"), headers=BEARER)).text)
        listing = (await http.get(admin_url("/calls?outcome=unanswered"), headers=BEARER)).text
        page = await http.get(admin_url("/call?id=environment:env_1&session=sess"), headers=BEARER)
    assert "<h2>Unanswered actions</h2>" in overview
    assert '<a href="/openai/admin/calls?outcome=unanswered">2</a>' in overview
    assert "environment_connection 1, mcp 1; the oldest waits for 5m 0s" in overview
    assert "Someone else must answer them" in overview
    assert "outcome-unanswered" in overview
    assert "req_crm" in listing and "environment:env_1" in listing
    assert page.status_code == 200
    assert "no connect_environment hook" in page.text and "outcome-unanswered" in page.text


async def test_without_unanswered_actions_the_card_says_so() -> None:
    view = Operator(MemoryStore(), location="memory://")
    async with connect(AdminApp(view, tokens=[TOKEN])) as http:
        overview = (await http.get(admin_url("/"), headers=BEARER)).text
    assert "Every pending action is answered here." in overview
