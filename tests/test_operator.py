"""The operator's view of a real store: what became of each call, in counts that agree."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import CallKey, Limit, SavedResult
from agentfn_asgi.errors import AgentFnError, CallNotFoundError, OperatorError, OperatorInputError
from agentfn_asgi.operator import OUTCOMES, CallFilter, Operator, outcome_of, parse_duration
from agentfn_asgi.store.memory import MemoryStore

from .support.clock import FakeClock

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
    await store.save_result(key, owner="o", attempt=1, result=_result(True))
    await store.mark_stale(key)
    expected["c_stale"] = "stale"
    key = await claim("c_cancelled")
    await store.cancel(key, owner="o", reason="the turn was cancelled", known_before=clock())
    expected["c_cancelled"] = "cancelled"
    key = await claim("c_held")
    await store.quarantine(key, owner="o", attempt=1, reason="unknown")
    expected["c_held"] = "held"
    key = await claim("c_retrying")
    await store.schedule_retry(key, owner="o", attempt=1, at=clock() + 5, reason="429")
    expected["c_retrying"] = "retrying"
    limit = Limit(name="t_limited", concurrency=1)
    for call_id, outcome in (("c_slot", "running"), ("c_waiting", "waiting")):
        key = CallKey("sess", "turn", call_id)
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=LEASE, limit=limit)
        expected[call_id] = outcome
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


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [1, 2, 50])
async def test_each_outcome_lists_exactly_the_calls_its_badge_counts(limit: int) -> None:
    """The overview's "succeeded 1" opened the submitted calls (the failed one too) and
    "running 2" the claimed ones (in doubt too): each outcome now lists exactly the calls
    it counts, page by page."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    expected = await _seed(store, clock)
    operator = Operator(store, location="memory://", clock=clock)
    counts = (await operator.overview()).outcomes
    for outcome in OUTCOMES:
        listed: list[str] = []
        cursor = None
        while True:
            page = await operator.calls(CallFilter(outcome=outcome, limit=limit, cursor=cursor))
            listed += [c.call_id for c in page.calls]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert sorted(listed) == sorted(c for c, o in expected.items() if o == outcome)
        assert len(listed) == counts[outcome], outcome


@pytest.mark.anyio
async def test_what_an_operator_asks_wrongly_raises_the_trees_errors() -> None:
    """An unknown call is a CallNotFoundError, an id naming calls of two sessions, a cursor
    not of the listing and a duration not understood are OperatorInputErrors: in the one
    tree, and still the LookupError and ValueError the CLI and the page catch."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    for session_id in ("sess_a", "sess_b"):
        key = CallKey(session_id, "turn", "c_twice")
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=LEASE)
    operator = Operator(store, location="memory://", clock=clock)
    with pytest.raises(CallNotFoundError, match="no call c_missing") as missing:
        await operator.call("c_missing")
    assert isinstance(missing.value, AgentFnError)
    assert isinstance(missing.value, LookupError) and isinstance(missing.value, OperatorError)
    with pytest.raises(OperatorInputError, match="several sessions") as ambiguous:
        await operator.call("c_twice")
    assert isinstance(ambiguous.value, ValueError) and isinstance(ambiguous.value, OperatorError)
    assert (await operator.call("c_twice", session_id="sess_b")).summary.session_id == "sess_b"
    with pytest.raises(OperatorInputError, match="not a cursor"):
        await operator.calls(CallFilter(cursor="not-ours"))
    with pytest.raises(OperatorInputError, match="like 15m"):
        parse_duration("fortnight")
