"""The soak's checker and schedule on made-up records: each violation is seen, each excuse
honoured, and a seed replays its schedule."""

from __future__ import annotations

from typing import Any

from agentfn_asgi.testing import DeliveryAttempt, RecordedRequest, Submission

from .approver import Decision, decision_for
from .checker import History, PlannedCall, check
from .nemesis import FAULT_KINDS, Outage, schedule
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
    kinds = {
        getattr(c, "name", "request")
        for plan in plans(27, 600, 1)
        for step in plan.steps
        for c in step
    }
    assert {"flaky_lookup", "close_account", "request"} <= kinds


def _request(
    call_id: str, request: dict[str, Any], answer: str | None, decision: Decision | None = None
) -> History:
    tool = (
        f"mcp:{request['server_label']}/run"
        if "server_label" in request
        else f"computer_use:{request['origin']}"
    )
    call = PlannedCall(call_id, tool, 0, "sess_1", 100.0, request)
    base = _history()
    answered = (
        []
        if answer is None
        else [
            Submission(
                "sess_1",
                "turn_1",
                call_id,
                answer == "approve",
                {"decision": answer},
                None,
                "k",
                103.0,
            )
        ]
    )
    return _history(
        calls=[*base.calls, call],
        submissions=[*base.submissions, *answered],
        decisions={} if decision is None else {call_id: decision},
        waiting_at_end=[] if answered else [call_id],
    )


def test_each_request_is_answered_as_the_policy_or_the_approver_said() -> None:
    """Issue 34: an MCP or origin request must be answered once, with the examples' policy's
    decision, or for those it asks, the approver's."""
    docs = {"type": "mcp_tool_call", "server_label": "docs"}
    shell = {"type": "mcp_tool_call", "server_label": "shell"}
    pay = {"type": "mcp_tool_call", "server_label": "payments"}
    sub = {"type": "browser_origin_access", "origin": "https://shop.example.com"}
    other = {"type": "browser_origin_access", "origin": "https://other.test"}
    assert check(_request("r1", docs, "approve")).ok
    assert check(_request("r2", shell, "deny")).ok
    assert check(_request("r3", sub, "approve")).ok
    assert check(_request("r4", pay, "approve", APPROVE)).ok
    assert check(_request("r5", other, "deny", DENY)).ok
    report = check(_request("r6", shell, "approve"))
    assert not report.ok and "answered approve, expected deny" in report.approval_violations[0]
    report = check(_request("r7", pay, "approve"))
    assert not report.ok and "nobody decided it" in report.approval_violations[0]
    assert "requests=1" in report.final_line()
