"""Flow control on the operator page, over the real :class:`~agentfn_asgi.operator.Operator`
and the memory store: a call waiting for its tool's limit has its own outcome (badge, count,
filter) and its page names the limit and since when it waits."""

from __future__ import annotations

import pytest

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.calls.records import CallKey, ClaimStatus, Limit
from agentfn_asgi.operator import Operator
from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock
from .conftest import TOKEN, admin_url
from .test_app import BEARER, connect

pytestmark = pytest.mark.anyio


async def test_a_waiting_call_has_its_badge_its_count_its_filter_and_its_limit() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limit = Limit(name="report", concurrency=1)
    for call_id, status in (("c_run", ClaimStatus.CLAIMED), ("c_wait", ClaimStatus.WAITING)):
        outcome = await store.claim_call(
            CallKey("sess", "turn", call_id),
            tool_name="report",
            owner="replica-a",
            lease_seconds=30,
            limit=limit,
        )
        assert outcome.status is status
    view = Operator(store, location="memory://", clock=clock)
    async with connect(AdminApp(view, tokens=[TOKEN], clock=clock)) as http:
        overview = (await http.get(admin_url("/"), headers=BEARER)).text
        assert '<span class="state outcome-waiting">waiting for a limit</span>' in overview
        assert 'href="/openai/admin/calls?outcome=waiting"' in overview
        listing = (await http.get(admin_url("/calls?outcome=waiting"), headers=BEARER)).text
        assert "c_wait" in listing and "c_run" not in listing
        page = await http.get(admin_url("/call?id=c_wait&session=sess"), headers=BEARER)
    assert page.status_code == 200
    assert "<dt>Limit</dt><dd><code>report</code></dd>" in page.text
    assert "<dt>Waiting since</dt>" in page.text
    assert "outcome-waiting" in page.text
