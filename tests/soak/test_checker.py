"""The soak's checker and schedule on made-up records: each violation is seen, each excuse
honoured, and a seed replays its schedule."""

from __future__ import annotations

from typing import Any

from agentfn_asgi.testing import DeliveryAttempt, RecordedRequest, Submission

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
