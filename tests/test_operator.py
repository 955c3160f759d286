"""The operator's view of a real store: what became of each call, in counts that agree."""

from __future__ import annotations

import pytest

from agentfn_asgi.operator import OUTCOMES, CallFilter, Operator, outcome_of
from agentfn_asgi.records import CallKey, SavedResult
from agentfn_asgi.store.memory import MemoryStore

from .store.conftest import FakeClock

LEASE = 30.0


def _result(success: bool) -> SavedResult:
    return SavedResult(
        success=success,
        event_json="{}",
        idempotency_key="k",
        error_type=None if success else "tool_error",
    )


async def _seed(store: MemoryStore, clock: FakeClock) -> dict[str, str]:
    """One call per outcome; returns call id -> the outcome it must show."""
    expected: dict[str, str] = {}

    async def claim(call_id: str, lease: float = LEASE) -> CallKey:
        key = CallKey("sess", "turn", call_id)
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=lease)
        return key

    await claim("c_in_doubt", lease=1.0)
    expected["c_in_doubt"] = "in_doubt"
    clock.advance(5)
    await claim("c_running")
    expected["c_running"] = "running"
    for call_id, success, submit, outcome in [
        ("c_ok", True, True, "succeeded"),
        ("c_err", False, True, "failed"),
        ("c_saved", True, False, "submitting"),
        ("c_saved_err", False, False, "submitting"),
    ]:
        key = await claim(call_id)
        await store.save_result(key, owner="o", attempt=1, result=_result(success))
        if submit:
            await store.mark_submitted(key)
        expected[call_id] = outcome
    key = await claim("c_stale")
    await store.mark_stale(key)
    expected["c_stale"] = "stale"
    key = await claim("c_held")
    await store.quarantine(key, owner="o", attempt=1, reason="unknown")
    expected["c_held"] = "held"
    return expected


@pytest.mark.anyio
async def test_each_call_has_one_outcome_and_the_counts_add_up() -> None:
    """A failed submitted call is 'failed', never a green 'submitted'; the overview counts
    every call once by outcome, and those counts match the successes and failures."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    expected = await _seed(store, clock)
    operator = Operator(store, location="memory://", clock=clock)

    page = await operator.calls(CallFilter(limit=50))
    assert {c.call_id: c.outcome for c in page.calls} == expected
    overview = await operator.overview()
    assert sum(overview.outcomes.values()) == len(expected)
    assert set(overview.outcomes) == set(OUTCOMES)
    for outcome in OUTCOMES:
        assert overview.outcomes[outcome] == list(expected.values()).count(outcome), outcome
    assert (overview.successes, overview.failures) == (
        overview.outcomes["succeeded"],
        overview.outcomes["failed"],
    )
    for call_id in expected:
        [record] = await store.find_calls(call_id)
        assert outcome_of(record, clock()) == expected[call_id]
