"""dispatch.alarms: a wrong key or project is logged once per cause, with the fix, while the
recovery sweep keeps retrying the work it left recorded."""

from __future__ import annotations

import pytest

from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock
from .conftest import API, SETTINGS, dispatching, lookup_tools

pytestmark = pytest.mark.anyio


async def test_a_refused_key_is_logged_once_until_a_request_succeeds(
    api: API, store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = api.one_call(call_id="c1"), api.one_call(call_id="c2")
    api.fake.fail_next("retrieve", 2, 401)
    with caplog.at_level("ERROR", logger="agentfn_asgi.dispatch.alarms"):
        async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
            await store.record_delivery("d1", first.session_id, nonce="n")
            for _ in range(2):  # two sweeps meet the 401: one ERROR line
                clock.advance(SETTINGS.retry_cap)
                await dispatcher.sweep()
            assert len(caplog.records) == 1
            assert "OPENAI_API_KEY" in caplog.records[0].getMessage()
            clock.advance(SETTINGS.retry_cap)
            await dispatcher.sweep()  # the key works again: answered, the alarm re-armed
            await dispatcher.wait_for([first])
            api.fake.fail_next("retrieve", 1, 401)
            await store.record_delivery("d2", second.session_id, nonce="n")
            clock.advance(SETTINGS.retry_cap)
            await dispatcher.sweep()
    assert len(caplog.records) == 2
    assert [s.call_id for s in api.fake.submissions] == ["c1"]
