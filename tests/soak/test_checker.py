"""The soak's checker and schedule on made-up records: each violation is seen, each excuse
honoured, and a seed replays its schedule; the nemesis ends turns through the fake."""

from __future__ import annotations

from typing import Any

import pytest

from agentfn_asgi.testing import (
    DeliveryAttempt,
    FakeAgentsAPI,
    FakeCall,
    RecordedRequest,
    Submission,
)

from .approver import Decision, decision_for
from .checker import History, PlannedCall, check
from .cluster import StoreCutter
from .nemesis import FAULT_KINDS, Cancellation, Fault, Nemesis, Outage, schedule
from .workload import SIDE_EFFECT_TOOLS, plans

URL = "http://127.0.0.1:1/openai/webhooks"


def _submission(call_id: str, at: float) -> Submission:
    return Submission("sess_1", "turn_1", call_id, True, "ok", None, f"k-{call_id}", at)


def _delivery(at: float, status: int | None) -> DeliveryAttempt:
    return DeliveryAttempt(
        "wh_1", "evt_1", "agent.session.action_required", "sess_1", URL, 1, status, None, at
    )


def _history(**changes: Any) -> History:
    calls = [
        PlannedCall("c_lookup", "get_customer", 0, "sess_1", 100.0),
        PlannedCall("c_refund", "create_refund", 0, "sess_1", 100.0),
        PlannedCall("c_next", "slow_echo", 1, "sess_1", 100.0),
    ]
    fields: dict[str, Any] = {
        "calls": calls,
        "submissions": [
            _submission("c_lookup", 101.0),
            _submission("c_refund", 102.0),
            _submission("c_next", 105.0),
        ],
        "duplicate_submissions": [],
        "requests": [],
        "deliveries": [_delivery(100.5, 200)],
        "ledger": [{"call_id": "c_refund", "order_id": "o", "amount_cents": 1}],
        "store_states": {"c_lookup": "submitted", "c_refund": "submitted", "c_next": "submitted"},
        "logs": {"replica0-1.log": "could not renew the lease (will retry)\n"},
        "outages": [],
        "replica_urls": {URL: 0},
        "injected": {"kill": 1},
        "side_effect_tools": SIDE_EFFECT_TOOLS,
    }
    fields.update(changes)
    return History(**fields)


def test_a_clean_record_passes_with_its_figures() -> None:
    report = check(_history())
    assert report.ok, report.violations
    assert (report.calls, report.answered) == (3, 3)
    # c_next became pending at c_refund's result (102) and was answered at 105.
    assert report.p99 == 3.0
    line = report.final_line()
    assert "calls=3" in line and "lost=0" in line and "[kill=1]" in line and line.endswith("OK")


def test_a_call_without_a_result_is_lost() -> None:
    report = check(
        _history(submissions=[_submission("c_lookup", 101.0)], waiting_at_end=["c_refund"])
    )
    assert report.lost == ["c_refund", "c_next"]
    assert not report.ok and "lost: 2 calls" in report.violations[0]
    assert "FAILED" in report.final_line()


def test_two_accepted_results_or_a_conflicting_one_are_violations() -> None:
    twice = _history(submissions=[*_history().submissions, _submission("c_lookup", 110.0)])
    assert check(twice).duplicate_results == ["c_lookup"]
    conflict = RecordedRequest("POST", "/v1/agents/sessions/sess_1/events", "submit", 409, {}, 1.0)
    report = check(_history(requests=[conflict]))
    assert report.conflicts == 1 and not report.ok


def test_a_failed_result_is_listed_not_blamed() -> None:
    failed = Submission("sess_1", "turn_1", "c_lookup", False, None, "in doubt", "k", 101.0)
    submissions = [failed, *_history().submissions[1:]]
    report = check(_history(submissions=submissions))
    assert report.ok and report.failed_results == ["c_lookup: in doubt"]
    assert "failed_results=1" in report.final_line()


def test_identical_resubmissions_are_counted_not_blamed() -> None:
    report = check(_history(duplicate_submissions=[_submission("c_lookup", 103.0)]))
    assert report.ok and report.duplicate_submissions == 1


def test_a_side_effect_twice_is_a_violation_unless_quarantined() -> None:
    line = {"call_id": "c_refund", "order_id": "o", "amount_cents": 1}
    report = check(_history(ledger=[line, line]))
    assert report.duplicate_effects == ["c_refund (2 ledger lines)"] and not report.ok
    held = _history(ledger=[line, line], store_states={"c_refund": "quarantined"})
    report = check(held)
    assert report.ok and report.quarantined_with_effects == ["c_refund"]


def test_a_webhook_5xx_is_excused_only_around_its_replicas_outage() -> None:
    failed = [_delivery(200.0, 503)]
    assert not check(_history(deliveries=failed)).ok
    assert check(_history(deliveries=failed, outages=[Outage(0, 195.0, 198.0)])).ok
    assert not check(_history(deliveries=failed, outages=[Outage(1, 195.0, 198.0)])).ok
    assert not check(_history(deliveries=failed, outages=[Outage(0, 100.0, 110.0)])).ok
    # No answer at all (a killed or stopped replica) is not a 5xx.
    assert check(_history(deliveries=[_delivery(200.0, None)])).ok


def test_a_traceback_in_a_log_is_a_violation() -> None:
    logs = {"replica1-2.log": "Traceback (most recent call last):\n  boom\n"}
    report = check(_history(logs=logs))
    assert report.tracebacks == ["replica1-2.log: 1"] and not report.ok


def test_a_flaky_lookups_own_failure_is_no_traceback_to_blame() -> None:
    flaky = (
        "WARNING tool flaky_lookup failed transiently\n"
        "Traceback (most recent call last):\n"
        '  File "agentfn_asgi/demo/tools.py", line 207, in flaky_lookup\n'
        '    raise ConnectionError(f"upstream unavailable (attempt {k + 1})")\n'
        "ConnectionError: upstream unavailable (attempt 2)\n"
        "INFO next line\n"
    )
    assert check(_history(logs={"replica0-1.log": flaky})).ok
    # The same error from anywhere else, or another error in it, still counts.
    elsewhere = flaky.replace("in flaky_lookup", "in get_customer")
    assert not check(_history(logs={"replica0-1.log": elsewhere})).ok
    other = flaky.replace("ConnectionError: upstream", "KeyError: upstream")
    report = check(_history(logs={"replica0-1.log": flaky + other}))
    assert report.tracebacks == ["replica0-1.log: 1"]


def test_a_seed_replays_its_schedule_and_workload() -> None:
    def draw(seed: int, connections: bool = True) -> list[str]:
        faults = schedule(
            seed, 600, replicas=3, lease_seconds=3, mean_interval=4, connections=connections
        )
        return [fault.describe() for fault in faults]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert {line.split()[1] for line in draw(7)} == set(FAULT_KINDS)
    # SQLite has no store connections to cut.
    assert "store_cut" not in {line.split()[1] for line in draw(7, connections=False)}
    assert plans(7, 60, 1) == plans(7, 60, 1)
    assert len(plans(7, 60, 2)) == 120


def _failure(call_id: str, error: str, at: float = 103.0) -> Submission:
    return Submission("sess_1", "turn_1", call_id, False, None, error, f"k-{call_id}", at)


def _flaky(fail_times: int, attempts: list[int], success: bool = True) -> History:
    call = PlannedCall(
        "c_flaky", "flaky_lookup", 0, "sess_1", 100.0, {"key": "k", "fail_times": fail_times}
    )
    result = _submission("c_flaky", 103.0) if success else _failure("c_flaky", "unavailable")
    base = _history()
    return _history(
        calls=[*base.calls, call],
        submissions=[*base.submissions, result],
        ledger=[
            *base.ledger,
            *({"call_id": "c_flaky", "tool": "flaky_lookup", "attempt": n} for n in attempts),
        ],
    )


def test_a_flaky_lookup_answered_has_each_of_its_attempts_once() -> None:
    report = check(_flaky(2, [1, 2, 3]))
    assert report.ok, report.violations
    assert (report.flaky, report.flaky_retried) == (1, 1)
    assert "flaky=1/retried=1/bad=0" in report.final_line()
    assert check(_flaky(0, [1])).ok
    # Within its attempts but failed anyway (kills used them up): listed, not blamed.
    assert check(_flaky(1, [1], success=False)).ok


def test_a_flaky_attempt_twice_or_a_wrong_count_is_a_violation() -> None:
    twice = check(_flaky(2, [1, 2, 2, 3]))
    assert not twice.ok and "attempt [2] ran twice" in twice.retry_violations[0]
    # Even when the call failed in the end.
    assert not check(_flaky(9, [1, 1], success=False)).ok
    short = check(_flaky(2, [1, 2]))
    assert not short.ok and "not 1..3" in short.retry_violations[0]
    assert not check(_flaky(1, [1, 2, 3])).ok


def test_a_flaky_lookup_beyond_its_attempts_fails_after_at_most_four() -> None:
    assert check(_flaky(9, [1, 2, 3, 4], success=False)).ok
    too_many = check(_flaky(9, [1, 2, 3, 4, 5], success=False))
    assert not too_many.ok and "5 attempts ran" in too_many.retry_violations[0]
    assert not check(_flaky(9, [1, 2, 3, 4], success=True)).ok


def _approval(
    decision: Decision | None, lines: int, result: Submission | None, state: str = "submitted"
) -> History:
    call = PlannedCall("c_close", "close_account", 0, "sess_1", 100.0, {"account_id": "a"})
    base = _history()
    entry = {"call_id": "c_close", "account_id": "a", "tool": "close_account"}
    return _history(
        calls=[*base.calls, call],
        submissions=[*base.submissions, *([result] if result else [])],
        ledger=[*base.ledger, *([entry] * lines)],
        store_states={**base.store_states, "c_close": state},
        decisions={} if decision is None else {"c_close": decision},
        waiting_at_end=[] if result else ["c_close"],
    )


APPROVE = Decision(approve=True)
DENY = Decision(approve=False, reason="soak denies c_close")


def test_an_approved_call_runs_at_most_once_and_succeeds() -> None:
    report = check(_approval(APPROVE, 1, _submission("c_close", 103.0)))
    assert report.ok, report.violations
    assert (report.approved, report.denied) == (1, 0)
    assert "approvals=1+0denied/bad=0" in report.final_line()
    twice = check(_approval(APPROVE, 2, _submission("c_close", 103.0)))
    assert not twice.ok and "approved, ran 2 times" in twice.approval_violations[0]
    failed = check(_approval(APPROVE, 1, _failure("c_close", "in doubt")))
    assert not failed.ok and "answered with a failure" in failed.approval_violations[0]


def test_a_denied_call_never_runs_and_fails_with_the_reason() -> None:
    told = _failure("c_close", "denied by soak: soak denies c_close")
    report = check(_approval(DENY, 0, told))
    assert report.ok, report.violations
    assert (report.approved, report.denied) == (0, 1)
    ran = check(_approval(DENY, 1, told))
    assert not ran.ok and "denied, ran 1 times" in ran.approval_violations[0]
    assert not check(_approval(DENY, 0, _failure("c_close", "denied"))).ok
    assert not check(_approval(DENY, 0, _submission("c_close", 103.0))).ok


def test_an_approval_call_answered_without_a_decision_is_a_violation() -> None:
    report = check(_approval(None, 0, _submission("c_close", 103.0)))
    assert not report.ok and "nobody decided it" in report.approval_violations[0]
    # Never decided and never answered: lost, and nothing more.
    report = check(_approval(None, 0, None))
    assert report.lost == ["c_close"] and not report.approval_violations


def test_the_approver_decides_from_the_seed() -> None:
    decisions = [decision_for(27, f"s{n}_0_0_approval") for n in range(200)]
    assert decisions == [decision_for(27, f"s{n}_0_0_approval") for n in range(200)]
    denied = [d for d in decisions if not d.approve]
    assert 0 < len(denied) < 100
    assert all(d.reason and "soak denies" in d.reason for d in denied)
    kinds = {c.name for plan in plans(27, 600, 1) for step in plan.steps for c in step}
    assert {"flaky_lookup", "close_account"} <= kinds


def _idle(
    at: float, status: int | None = 200, event: str = "agent.session.idle"
) -> DeliveryAttempt:
    return DeliveryAttempt("wh_2", "evt_2", event, "sess_2", URL, 1, status, None, at)


def _cancelled(
    phases: list[tuple[float, str]],
    *,
    state: str | None = "cancelled",
    deliveries: list[DeliveryAttempt] | None = None,
    **changes: Any,
) -> History:
    """The clean record plus a session whose turn the nemesis cancelled at 200 while its
    long task ran (ledger ``phases``: when each line was seen, and its phase); its next step
    never came to exist. Heard at 200.5 unless ``deliveries`` say otherwise."""
    base = _history()
    calls = [
        PlannedCall("c_long", "long_task", 0, "sess_2", 190.0, {"seconds": 8.0}),
        PlannedCall("c_after", "get_customer", 1, "sess_2", 190.0),
    ]
    lines = [{"call_id": "c_long", "tool": "long_task", "phase": phase} for _, phase in phases]
    fields: dict[str, Any] = {
        "calls": [*base.calls, *calls],
        "ledger": [*base.ledger, *lines],
        "ledger_seen": [101.5, *(seen for seen, _ in phases)],
        "store_states": {**base.store_states, **({} if state is None else {"c_long": state})},
        "deliveries": [*base.deliveries, *([_idle(200.5)] if deliveries is None else deliveries)],
        "cancellations": [Cancellation("sess_2", 200.0, ("c_long",))],
    }
    fields.update(changes)
    return _history(**fields)


STOPPED = [(195.0, "start"), (201.0, "cancelled")]


def _bad(history: History) -> list[str]:
    """The cancelled turns' violations of ``history`` (and nothing else is wrong)."""
    report = check(history)
    assert all(v.startswith("cancelled turns: ") for v in report.violations), report.violations
    return report.cancel_violations


def test_a_cancelled_turn_stopped_in_time_passes_and_is_not_lost() -> None:
    report = check(_cancelled(STOPPED))
    assert report.ok, report.violations
    assert report.lost == [] and (report.calls, report.answered) == (5, 3)
    assert (report.cancelled_turns, report.cancelled_calls) == (1, 1)
    assert "cancelled=1/1/bad=0" in report.final_line()
    # A result saved just before (stale), no record at all, a failed turn's webhook, a
    # handler that ended on its own just before the deadline: all fine.
    assert check(_cancelled([(195.0, "start"), (203.4, "end")], state="stale")).ok
    assert check(_cancelled(STOPPED, state=None)).ok
    failed = [_idle(200.5, event="agent.session.failed")]
    assert check(_cancelled([(195.0, "start"), (203.4, "end")], deliveries=failed)).ok
    # The rest of the record is checked as before: a call of another session is still lost.
    other = check(_cancelled(STOPPED, submissions=_history().submissions[:2]))
    assert other.lost == ["c_next"] and not other.ok


def test_a_result_accepted_after_the_turn_ended_is_a_violation() -> None:
    late = _submission("c_long", 201.0)
    report = check(_cancelled(STOPPED, submissions=[*_history().submissions, late]))
    assert not report.ok
    assert report.cancel_violations == ["c_long: result accepted after its turn ended"]
    assert "cancelled=1/1/bad=1" in report.final_line()
    # Accepted before the cancellation: an answered call like any other.
    early = _submission("c_long", 199.0)
    assert check(_cancelled(STOPPED, submissions=[*_history().submissions, early])).ok


def test_a_call_of_an_ended_turn_left_open_in_the_store_is_a_violation() -> None:
    for state in ("claimed", "succeeded", "submitted", "retry_scheduled", "awaiting_approval"):
        report = check(_cancelled(STOPPED, state=state))
        assert report.cancel_violations == [f"c_long: {state} in the store after its turn ended"]


def test_a_handler_still_running_3s_after_the_cancellation_was_heard_is_a_violation() -> None:
    report = check(_cancelled([(195.0, "start"), (203.6, "cancelled")]))
    assert not report.ok and "still running 3s after" in report.cancel_violations[0]
    # Never stopped at all; started again after the deadline.
    assert _bad(_cancelled([(195.0, "start")]))
    assert _bad(_cancelled([*STOPPED, (204.0, "start"), (204.2, "cancelled")]))
    # Stopped, then run again and stopped in time (a takeover): fine.
    assert check(_cancelled([*STOPPED, (201.5, "start"), (202.0, "cancelled")])).ok


def test_the_cancellation_is_heard_from_a_live_replicas_2xx_else_after_the_reread() -> None:
    stopped_at_210 = [(195.0, "start"), (210.0, "cancelled")]
    # No webhook at all: heard after the re-read interval (15 s by default).
    assert check(_cancelled(stopped_at_210, deliveries=[])).ok
    assert _bad(_cancelled(stopped_at_210, deliveries=[], reread_interval=5.0))
    assert _bad(_cancelled([(195.0, "start"), (219.0, "cancelled")], deliveries=[]))
    # A 5xx, no answer, or a 2xx from a replica that was down then, is not hearing it.
    # (The 503 is a violation of its own, of the webhooks property.)
    for unheard in ([_idle(200.5, 503)], [_idle(200.5, None)]):
        assert not check(_cancelled(stopped_at_210, deliveries=unheard)).cancel_violations
    assert _bad(_cancelled(stopped_at_210))  # heard at 200.5: stopped too late
    down = [Outage(0, 200.2, 200.8)]
    report = check(_cancelled(stopped_at_210, outages=down))
    assert report.ok and not report.cancel_excused
    # (Down, it may also have been the one running the handler: each outage excuses one.)
    report = check(_cancelled(stopped_at_210, outages=down, reread_interval=5.0))
    assert report.ok and report.cancel_excused
    # The idle webhook of an earlier turn (before the cancellation) is not it either.
    assert check(_cancelled(stopped_at_210, deliveries=[_idle(199.0)])).ok


def _read(at: float, status: int | None) -> RecordedRequest:
    return RecordedRequest("GET", "/v1/agents/sessions/sess_2", "retrieve", status, {}, at)


def test_a_slowed_or_refused_read_of_the_session_delays_hearing_it() -> None:
    # Heard at 200.5, but the session could be read only at 204 (refused, then slow).
    stopped_at_206 = [(195.0, "start"), (206.0, "cancelled")]
    reads = [_read(199.0, 200), _read(201.0, 503), _read(202.0, None), _read(204.0, 200)]
    assert check(_cancelled(stopped_at_206, requests=reads)).ok
    assert _bad(_cancelled(stopped_at_206))
    # Read at once (a read before the webhook, or of another session, is not it).
    other = RecordedRequest("GET", "/v1/agents/sessions/sess_22", "retrieve", 200, {}, 205.0)
    assert _bad(_cancelled(stopped_at_206, requests=[*reads[:1], _read(200.6, 200), other]))
    assert _bad(_cancelled(stopped_at_206, requests=[reads[0], other]))


def test_a_handler_a_replica_outage_took_down_is_excused_and_listed() -> None:
    killed = [(195.0, "start")]
    report = check(_cancelled(killed, outages=[Outage(1, 197.0, 199.0)]))
    assert report.ok, report.violations
    assert report.cancel_excused == [
        "c_long: 1 run(s) of long_task still running 3s after its turn's end was heard "
        "(1 outage(s))"
    ]
    # Taken over after the kill and stopped in time: the killed run is excused.
    taken_over = [*killed, (199.5, "start"), (201.0, "cancelled")]
    assert check(_cancelled(taken_over, outages=[Outage(1, 197.0, 199.0)])).ok
    # An outage before the run started, or after the deadline, excuses nothing; nor does one
    # outage excuse two open runs.
    assert _bad(_cancelled(killed, outages=[Outage(1, 190.0, 194.0)]))
    assert _bad(_cancelled(killed, outages=[Outage(1, 204.0, 206.0)]))
    two = [*killed, (199.5, "start")]
    assert _bad(_cancelled(two, outages=[Outage(1, 197.0, 199.0)]))


@pytest.mark.anyio
async def test_the_nemesis_ends_a_turn_with_a_pending_call_through_the_fake() -> None:
    fake = FakeAgentsAPI()
    nemesis = Nemesis(fake, [], StoreCutter("sqlite", "", "t"), 3.0, seed=1)
    cancel, fail = Fault(0, 1.0, "cancel_turn"), Fault(1, 2.0, "fail_turn", route="e_code")
    assert not await FAULT_KINDS["cancel_turn"].apply(nemesis, cancel)  # nothing pending
    session_id = fake.create_session([[FakeCall("long_task", {"seconds": 5}, call_id="c1")]])
    assert await FAULT_KINDS["cancel_turn"].apply(nemesis, cancel)
    assert fake.sessions[session_id].status == "idle" and not fake.required_actions(session_id)
    failed_id = fake.create_session([[FakeCall("get_customer", {}, call_id="c2")]])
    assert await FAULT_KINDS["fail_turn"].apply(nemesis, fail)
    assert fake.sessions[failed_id].status == "failed"
    assert [(c.session_id, c.calls, c.code) for c in nemesis.cancellations] == [
        (session_id, ("c1",), ""),
        (failed_id, ("c2",), "e_code"),
    ]
