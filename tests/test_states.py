"""The call state machine's table (agentfn_asgi.calls.states): consistent with itself and with the
states it names. The stores are held to it by the generated histories
(tests/store/test_histories.py); what they run is rendered from it (tests/store/test_compile.py)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from agentfn_asgi.calls.records import ApprovalRequest, CallKey, CallRecord, CallState
from agentfn_asgi.calls.states import (
    FOR_A_PERSON,
    PRUNABLE,
    SAVED,
    TRANSITIONS,
    WORKLISTS,
    Guard,
    Target,
    Transition,
    admits,
    allows,
    apply,
    bucket_tokens,
    resulting_state,
    settleable,
)

NOW = 1_000.0


def record(
    state: CallState, *, owner: str = "a", attempt: int = 1, lease: float = NOW + 30
) -> CallRecord:
    return CallRecord(
        key=CallKey("s", "t", "c"),
        tool_name="tool",
        state=state,
        attempt=attempt,
        owner=owner,
        lease_expires_at=lease,
        created_at=NOW - 60,
        updated_at=NOW - 10,
    )


def test_every_state_is_reached_and_every_non_terminal_state_can_be_left() -> None:
    """No state is unreachable and none but the terminal ones is a dead end."""
    reached = {t.target for t in TRANSITIONS.values() if isinstance(t.target, CallState)}
    reached |= SAVED  # by_result
    assert reached == set(CallState)
    for state in CallState:
        leaving = [
            t
            for t in TRANSITIONS.values()
            if state in t.sources and t.target not in (Target.SAME, state)
        ]
        assert leaving, state
    for state in (CallState.SUBMITTED, CallState.STALE):
        names = [t.name for t in TRANSITIONS.values() if state in t.sources]
        assert names == ["prune", "retire"]


def test_terminal_states_are_only_left_by_an_operator_the_pruner_or_a_new_occurrence() -> None:
    """Submitted, stale and cancelled are final for a call of a turn; quarantined waits for
    an operator's settle/release. A turn-less action (an environment connection) has
    occurrences: the end of one retires its record, and the next takes it up."""
    for state in (s for s in CallState if s.terminal):
        names = {t.name for t in TRANSITIONS.values() if state in t.sources}
        assert names <= {"settle", "release", "prune", "retire", "take_up"}, (state, names)
    assert {t.name for t in TRANSITIONS.values() if CallState.RETIRED in t.sources} == {
        "prune",
        "take_up",
    }
    assert {
        CallState.SUBMITTED,
        CallState.STALE,
        CallState.CANCELLED,
        CallState.RETIRED,
    } == PRUNABLE


@pytest.mark.parametrize("state", list(CallState))
def test_settleable_is_quarantined_or_a_lapsed_claim(state: CallState) -> None:
    """The one rule: held for an operator, or claimed with a lease lapsed past the margin."""
    live, lapsed = record(state), record(state, lease=NOW - 5)
    assert settleable(live, now=NOW) is (state is CallState.QUARANTINED)
    assert settleable(lapsed, now=NOW, margin=1.0) is (
        state in (CallState.QUARANTINED, CallState.CLAIMED)
    )
    # Within the margin, a lapsed claim is not settleable yet: its holder may still save.
    assert settleable(lapsed, now=NOW, margin=10.0) is (state is CallState.QUARANTINED)
    assert settleable(None, now=NOW) is False


def test_fenced_rows_need_the_holder_and_takeover_needs_a_lapsed_lease() -> None:
    """Save, renew and quarantine need (owner, attempt); take-over needs the lease to have
    run out past the margin; a retried claim needs the same owner and a live lease."""
    for name in ("save", "renew", "quarantine", "request_approval"):
        assert {g for w in TRANSITIONS[name].ways for g in w.guards} == {Guard.HOLDER}
        row = TRANSITIONS[name]
        assert allows(row, record(CallState.CLAIMED), now=NOW, owner="a", attempt=1)
        assert not allows(row, record(CallState.CLAIMED), now=NOW, owner="b", attempt=1)
        assert not allows(row, record(CallState.CLAIMED), now=NOW, owner="a", attempt=2)
        # A wait past its max_wait is saved as a failure by its holder.
        held = {CallState.CLAIMED, CallState.WAITING} if name == "save" else {CallState.CLAIMED}
        for state in set(CallState) - held:
            assert not allows(row, record(state), now=NOW, owner="a", attempt=1)
    take_over, reclaim = TRANSITIONS["take_over"], TRANSITIONS["reclaim"]
    assert allows(take_over, record(CallState.CLAIMED, lease=NOW - 5), now=NOW, margin=1)
    assert not allows(take_over, record(CallState.CLAIMED, lease=NOW - 5), now=NOW, margin=10)
    assert allows(reclaim, record(CallState.CLAIMED), now=NOW, owner="a")
    assert not allows(reclaim, record(CallState.CLAIMED, lease=NOW - 1), now=NOW, owner="a")
    assert allows(TRANSITIONS["claim"], None, now=NOW)
    assert not any(allows(t, None, now=NOW) for t in TRANSITIONS.values() if t.name != "claim")


def test_mark_stale_applies_to_saved_results_unchanged_since_the_read() -> None:
    """Stale: a saved result, unless (when asked) it changed after the caller's read; an
    unanswered action first claimed no later than the read (created at NOW - 60 here)."""
    row = TRANSITIONS["mark_stale"]
    for state, since in itertools.product(CallState, (None, NOW - 20, NOW)):
        expected = (state in SAVED and (since is None or since >= NOW - 10)) or (
            state is CallState.UNANSWERED and since is not None and since >= NOW - 60
        )
        assert allows(row, record(state), now=NOW, unchanged_since=since) is expected


def test_cancel_applies_to_unsaved_pending_calls_known_before_the_read() -> None:
    """Cancelled: a pending call without a result, first claimed no later than the read
    that no longer lists it (renewals, polls and decisions since do not matter); never
    without that time, never a saved result or a finished call."""
    row = TRANSITIONS["cancel"]
    for state, since in itertools.product(CallState, (None, NOW - 70, NOW - 60, NOW)):
        expected = (
            not state.terminal and state not in SAVED and since is not None and since >= NOW - 60
        )
        assert allows(row, record(state), now=NOW, unchanged_since=since) is expected
    assert row.target is CallState.CANCELLED and CallState.CANCELLED.terminal
    assert dict(row.sets)["reason"] == ":detail" and row.event == "cancelled"


def test_resulting_states() -> None:
    """by_result follows the saved result; same keeps the state."""
    claimed = record(CallState.CLAIMED)
    assert resulting_state(TRANSITIONS["save"], claimed, success=True) is CallState.SUCCEEDED
    assert resulting_state(TRANSITIONS["save"], claimed, success=False) is CallState.FAILED
    assert resulting_state(TRANSITIONS["renew"], claimed, success=None) is CallState.CLAIMED
    assert resulting_state(TRANSITIONS["release"], claimed, success=None) is CallState.CLAIMED
    with pytest.raises(ValueError, match="removed"):
        resulting_state(TRANSITIONS["prune"], record(CallState.STALE), success=None)


def test_a_call_waiting_for_approval_is_decided_once_by_its_expiry() -> None:
    """Approve and deny need the request open (before its expiry, which the waiting record
    keeps as its lease); expiry needs it lapsed; each applies only to a waiting call, so a
    second decision finds nothing to decide."""
    approve, deny, expire = (TRANSITIONS[n] for n in ("approve", "deny", "expire_approval"))
    request = ApprovalRequest(
        approval_id="ap", tool_name="tool", digest="d", requested_at=NOW, expires_at=NOW
    )

    def waiting(state: CallState, lease: float) -> CallRecord:
        return dataclasses.replace(record(state, lease=lease), approval=request)

    open_request = waiting(CallState.AWAITING_APPROVAL, NOW + 60)
    lapsed = waiting(CallState.AWAITING_APPROVAL, NOW)

    def on(row: Transition, call: CallRecord) -> bool:
        return allows(row, call, now=NOW, approval_id="ap")

    assert on(approve, open_request) and on(deny, open_request)
    assert not on(expire, open_request)
    assert not on(approve, lapsed) and not on(deny, lapsed)
    assert on(expire, lapsed)
    # A decision names the request it decides: another request's id decides nothing.
    assert not allows(approve, open_request, now=NOW, approval_id="another")
    assert not allows(expire, lapsed, now=NOW, approval_id="another")
    for state in set(CallState) - {CallState.AWAITING_APPROVAL}:
        for row in (approve, deny, expire):
            assert not on(row, waiting(state, NOW + 60)), (row.name, state)
            assert not on(row, waiting(state, NOW - 60)), (row.name, state)
    assert resulting_state(approve, open_request, success=None) is CallState.APPROVED
    assert resulting_state(deny, open_request, success=False) is CallState.FAILED
    assert resulting_state(expire, lapsed, success=False) is CallState.FAILED


def test_an_approved_call_is_claimed_as_a_fresh_attempt_by_anyone() -> None:
    """run_approved: only from approved, no holder needed (any replica), next attempt;
    nothing else leads out of approved but the session no longer waiting (cancel)."""
    row = TRANSITIONS["run_approved"]
    assert (
        row.new_attempt and row.target is CallState.CLAIMED and row.sources == {CallState.APPROVED}
    )
    assert allows(row, record(CallState.APPROVED, owner="someone else"), now=NOW)
    for state in set(CallState) - {CallState.APPROVED}:
        assert not allows(row, record(state), now=NOW)
    leaving = {t.name for t in TRANSITIONS.values() if CallState.APPROVED in t.sources}
    assert leaving == {"run_approved", "cancel"}
    waiting = {t.name for t in TRANSITIONS.values() if CallState.AWAITING_APPROVAL in t.sources}
    assert waiting == {"approve", "deny", "expire_approval", "cancel"}


def test_waiting_calls_are_pending_and_never_settleable_or_prunable() -> None:
    """A person decides a waiting call, not an operator's settle, a take-over or a pruner."""
    for state in FOR_A_PERSON:
        assert not state.terminal and not state.has_result
        for lease in (NOW + 60, NOW - 60):
            waiting = record(state, lease=lease)
            assert not settleable(waiting, now=NOW)
            for name in ("take_over", "reclaim", "prune", "save", "renew", "release"):
                assert not allows(TRANSITIONS[name], waiting, now=NOW, owner="a", attempt=1)


def test_the_limiter_rows_split_on_its_answer_and_need_the_holder() -> None:
    """take_slot / wait from claimed, admit / keep_waiting from waiting: the holder's, one
    of each pair by the limiter's answer; adopt needs the waiter's lease lapsed past the
    margin; only take_slot and wait set the limiter, and every other way into claimed
    clears it (a taken-over call holds no slot until admitted)."""
    pairs = {CallState.CLAIMED: ("take_slot", "wait"), CallState.WAITING: ("admit", "keep_waiting")}
    for state, (yes, no) in pairs.items():
        held = record(state)
        for admitted, name in ((True, yes), (False, no)):
            row = TRANSITIONS[name]
            assert allows(row, held, now=NOW, owner="a", attempt=1, admitted=admitted)
            assert not allows(row, held, now=NOW, owner="a", attempt=1, admitted=not admitted)
            assert not allows(row, held, now=NOW, owner="b", attempt=1, admitted=admitted)
            assert not allows(row, held, now=NOW, owner="a", attempt=1)  # no answer asked
    assert resulting_state(TRANSITIONS["wait"], record(CallState.CLAIMED), success=None) is (
        CallState.WAITING
    )
    assert resulting_state(TRANSITIONS["admit"], record(CallState.WAITING), success=None) is (
        CallState.CLAIMED
    )
    adopt = TRANSITIONS["adopt"]
    assert adopt.new_attempt and adopt.target is CallState.CLAIMED
    assert allows(adopt, record(CallState.WAITING, lease=NOW - 5), now=NOW, margin=1)
    assert not allows(adopt, record(CallState.WAITING, lease=NOW - 5), now=NOW, margin=10)
    assert not allows(adopt, record(CallState.CLAIMED, lease=NOW - 60), now=NOW, margin=1)
    setting = {t.name for t in TRANSITIONS.values() if t.changes.get("limiter") == ":limiter"}
    assert setting == {"take_slot", "wait"}
    into_claimed = {
        t.name
        for t in TRANSITIONS.values()
        if t.target is CallState.CLAIMED and t.name not in ("claim", "admit")
    }
    assert into_claimed == {"take_over", "release", "run_approved", "retry", "adopt", "take_up"}
    assert all(TRANSITIONS[name].changes["limiter"] == "null" for name in into_claimed)


def test_admission_serves_the_line_in_order() -> None:
    """A slot is free only after everyone ahead took one; a token only after everyone
    ahead took theirs; a bucket refills at its rate up to its burst and never drains on a
    clock that reads earlier."""
    assert admits(concurrency=2, rate=None, holders=1, ahead=0, tokens=0)
    assert not admits(concurrency=2, rate=None, holders=1, ahead=1, tokens=0)
    assert not admits(concurrency=2, rate=None, holders=2, ahead=0, tokens=0)
    assert admits(concurrency=None, rate=5.0, holders=99, ahead=1, tokens=2.0)
    assert not admits(concurrency=None, rate=5.0, holders=0, ahead=1, tokens=1.9)
    assert not admits(concurrency=3, rate=5.0, holders=0, ahead=0, tokens=0.5)
    assert bucket_tokens(None, 0, now=NOW, rate=5.0, burst=3) == 3
    assert bucket_tokens(0.0, NOW - 0.1, now=NOW, rate=5.0, burst=3) == pytest.approx(0.5)
    assert bucket_tokens(0.0, NOW - 60, now=NOW, rate=5.0, burst=3) == 3
    assert bucket_tokens(0.5, NOW + 10, now=NOW, rate=5.0, burst=3) == 0.5


def test_the_time_columns_are_read_by_what_they_hold() -> None:
    """``lease_expires_at`` is a lease, an approval's expiry or a retry's due time, and
    ``next_attempt_at`` a sweep's due time or the start of a wait: the record's named
    readings give each only in the state where the column holds it (after the rows that
    write it)."""
    args = {"now": NOW, "owner": "a", "attempt": 1, "detail": "", "approval": None}
    held = record(CallState.CLAIMED)
    assert (held.lease_until, held.expires_at, held.due_at) == (NOW + 30, None, None)
    retry = apply(TRANSITIONS["schedule_retry"], held, {**args, "at": NOW + 5})
    assert (retry.due_at, retry.lease_until, retry.expires_at) == (NOW + 5, None, None)
    asked = apply(TRANSITIONS["request_approval"], held, {**args, "expires_at": NOW + 900})
    assert (asked.expires_at, asked.lease_until, asked.due_at) == (NOW + 900, None, None)
    waits = apply(TRANSITIONS["wait"], held, {**args, "lease_expires_at": NOW + 20, "limiter": "t"})
    assert (waits.waiting_since, waits.lease_until, waits.due_at) == (NOW, NOW + 20, None)
    saved = dataclasses.replace(held, state=CallState.SUCCEEDED, next_attempt_at=NOW + 7)
    assert (saved.due_at, saved.lease_until, saved.waiting_since) == (NOW + 7, None, None)
    assert held.waiting_since is None


@pytest.mark.parametrize(
    ("name", "rows"),
    [("expired_claims", ("take_over", "adopt")), ("due_retries", ("retry",))],
)
def test_a_sweep_worklist_lists_exactly_the_calls_its_rows_may_take(
    name: str, rows: tuple[str, ...]
) -> None:
    """The sweep reads the calls its rows can then take: the worklist's states and bound
    (``upto`` is now - margin for a takeover, now for a retry) agree with the rows' guards
    at the bound and on both sides of it, in every state."""
    work = WORKLISTS[name]
    states = frozenset().union(*work.states)
    margin = 0.5 if name == "expired_claims" else 0.0
    upto = NOW - margin
    for state, lease in itertools.product(CallState, (upto - 1, upto, upto + 1)):
        call = record(state, lease=lease)
        listed = state in states and (lease < upto if work.strict else lease <= upto)
        taken = any(allows(TRANSITIONS[r], call, now=NOW, margin=margin) for r in rows)
        assert listed == taken, (state, lease - upto)
