"""What must hold over everything a soak recorded, and the one final line.

The checker reads only the record (:class:`History`): the fake's accepted results, its
absorbed duplicates and its answers, the webhook deliveries, the example's ledger, the
store's call records, the replicas' logs and the nemesis' outages. It asserts:

- **nothing lost**: every planned call has an accepted result once the drain is over (a call
  of a later step only exists once the step before it is answered, so it counts as lost
  with it);
- **one result per call**: at most one accepted result, and no submission of a *different*
  result for an answered call (the fake answers it 409);
- **side effects at most once**: a side-effect tool's ledger has at most one line per call,
  unless the call was quarantined (then it is listed);
- **webhooks**: no validly signed webhook (the fake signs them all) got a 5xx from a replica
  that was up (killed or stopped, plus a grace around it, excuses it);
- **no traceback** in the replicas' logs;
- **retries**: a flaky lookup's ledger never holds the same attempt twice (not even across
  kills); one answered with success has exactly ``fail_times + 1`` lines, attempts 1..n
  once each; one that fails more times than its 4 attempts ends as a failure after at most
  4 lines;
- **approvals**: a call the approver approved has at most one ledger line and a success
  result; one it denied has no ledger line and a failure carrying the reason; none is
  answered without a decision;
- **cancelled turns** (the nemesis cancels turns, or fails them with an error code, through
  the fake):

  - the calls of such a turn without an accepted result when it ended are not owed any more:
    they are not *lost* (nor are its later steps' calls, which never came to exist);
  - no result is accepted for a call of the turn after it ended, and each call pending then
    ends ``cancelled`` in the store, or ``stale`` (its result was saved just before),
    ``quarantined`` (held for an operator before: only a person takes it out), or has no
    record at all (no replica had heard of it yet);
  - no handler is still running :data:`STOP_WITHIN` seconds after the cancellation was
    *heard*: the first 2xx ``agent.session.idle``/``agent.session.failed`` webhook delivery
    for the session to a replica that was up, or, without one, the cancellation time plus
    the replicas' re-read interval; then, since a webhook only says that the session
    changed, the first read of the session the fake answered 2xx from that moment on (when
    the nemesis slows or refuses reads, that is when a replica could know). Every
    ``long_task``/``long_task_sync`` run of the turn's calls (a ``start`` ledger line,
    stamped with when the run first saw it) has its ``end`` or ``cancelled`` line seen by
    then (a run started later counts as still running). A run may stay open if a replica
    was killed or stopped between its start and that deadline (its handler died or froze
    with it); the ledger does not say which replica ran it, so each such outage, of any
    replica, excuses one open run (listed, not blamed).
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfn_asgi.testing import DeliveryAttempt, RecordedRequest, Submission

from .approver import Decision
from .nemesis import Cancellation, Outage
from .workload import APPROVAL_TOOL, FLAKY_TOOL, LONG_TOOLS

__all__ = [
    "FLAKY_ATTEMPTS",
    "OUTAGE_GRACE",
    "STOP_WITHIN",
    "History",
    "PlannedCall",
    "Report",
    "check",
]

#: The attempts of flaky_lookup's retry policy (agentfn_asgi.demo.tools.FLAKY_RETRY).
FLAKY_ATTEMPTS = 4

#: Seconds around an outage in which a replica's 5xx is excused: a webhook sent just before
#: the kill is answered by nobody, one sent while it starts again may meet it half-ready,
#: and the fake stamps an attempt when its answer (or timeout, 5 s) comes.
OUTAGE_GRACE = 6.0

TRACEBACK = "Traceback (most recent call last)"

#: Seconds after a turn's cancellation was heard by which its handlers must have stopped.
STOP_WITHIN = 3.0

#: The webhooks that tell a replica a turn ended.
TURN_ENDED = frozenset({"agent.session.idle", "agent.session.failed"})

#: The last line of the traceback a flaky lookup's own transient failure logs (the soak
#: asks for those failures: they are not news).
FLAKY_FAILURE = re.compile(r"ConnectionError: upstream unavailable \(attempt \d+\)")


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """A call of the workload: its session, step, tool; ``session_id`` None if never
    created (the run ended first)."""

    call_id: str
    tool: str
    step: int
    session_id: str | None
    created_at: float | None
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class History:
    """Everything recorded during one run."""

    calls: list[PlannedCall]
    submissions: list[Submission]
    duplicate_submissions: list[Submission]
    requests: list[RecordedRequest]
    deliveries: list[DeliveryAttempt]
    ledger: list[dict[str, Any]]
    store_states: dict[str, str]
    """call id → state in the store (``quarantined`` matters)."""
    logs: dict[str, str]
    """log name → its text."""
    outages: list[Outage]
    replica_urls: dict[str, int]
    """webhook URL → replica index."""
    injected: dict[str, int]
    side_effect_tools: frozenset[str]
    waiting_at_end: list[str] = field(default_factory=list)
    """Call ids the fake still waited for when the drain ended."""
    drain_seconds: float = 0.0
    nemesis_errors: list[str] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    """call id → what the approver decided for it."""
    cancellations: list[Cancellation] = field(default_factory=list)
    """The turns the nemesis cancelled or failed."""
    ledger_seen: list[float] = field(default_factory=list)
    """When each line of :attr:`ledger` was first seen (wall clock; same order)."""
    reread_interval: float = 15.0
    """The replicas' ``reread_interval``: how late a cancellation is heard without webhook."""


@dataclass(slots=True)
class Report:
    """The verdict: figures and violations (empty: the run passed)."""

    calls: int = 0
    answered: int = 0
    lost: list[str] = field(default_factory=list)
    duplicate_results: list[str] = field(default_factory=list)
    conflicts: int = 0
    duplicate_effects: list[str] = field(default_factory=list)
    quarantined_with_effects: list[str] = field(default_factory=list)
    duplicate_submissions: int = 0
    failed_results: list[str] = field(default_factory=list)
    """Calls whose one result is a failure (the model was told it failed): not a violation
    (an in-doubt call without a reconcile answer fails by design), but worth a look."""
    webhook_5xx: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)
    flaky: int = 0
    flaky_retried: int = 0
    """Flaky lookups answered after at least one failed attempt."""
    retry_violations: list[str] = field(default_factory=list)
    approved: int = 0
    denied: int = 0
    approval_violations: list[str] = field(default_factory=list)
    cancelled_turns: int = 0
    cancelled_calls: int = 0
    """Calls pending when their turn was cancelled or failed."""
    cancel_violations: list[str] = field(default_factory=list)
    cancel_excused: list[str] = field(default_factory=list)
    """Handler runs left open at their deadline, excused by a replica's outage."""
    p99: float = 0.0
    drain_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing was violated."""
        return not self.violations

    def final_line(self) -> str:
        """The one line a run ends with."""
        faults = sum(self.injected.values())
        kinds = ",".join(f"{k}={n}" for k, n in sorted(self.injected.items())) or "-"
        verdict = "OK" if self.ok else f"FAILED ({len(self.violations)} violations)"
        return (
            f"calls={self.calls} answered={self.answered} faults={faults} [{kinds}] "
            f"lost={len(self.lost)} duplicate_effects={len(self.duplicate_effects)} "
            f"duplicate_submissions={self.duplicate_submissions} conflicts={self.conflicts} "
            f"failed_results={len(self.failed_results)} "
            f"webhook_5xx={len(self.webhook_5xx)} tracebacks={len(self.tracebacks)} "
            f"quarantined={len(self.quarantined_with_effects)} "
            f"flaky={self.flaky}/retried={self.flaky_retried}/bad={len(self.retry_violations)} "
            f"approvals={self.approved}+{self.denied}denied/bad={len(self.approval_violations)} "
            f"cancelled={self.cancelled_turns}/{self.cancelled_calls}"
            f"/bad={len(self.cancel_violations)} "
            f"p99_to_result={self.p99:.2f}s drain={self.drain_seconds:.1f}s {verdict}"
        )


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def _times_to_result(history: History) -> list[float]:
    """Per answered call, seconds from the moment it became pending to its result: a first
    step's calls at the session's creation, a later step's at the last result of the step
    before (the fake opens the next step at once)."""
    accepted = {s.call_id: s.received_at for s in history.submissions}
    by_step: dict[tuple[str, int], list[PlannedCall]] = collections.defaultdict(list)
    for call in history.calls:
        if call.session_id is not None:
            by_step[(call.session_id, call.step)].append(call)
    durations = []
    for (session_id, step), calls in by_step.items():
        if step == 0:
            since = calls[0].created_at
        else:
            before = [accepted.get(c.call_id) for c in by_step[(session_id, step - 1)]]
            since = None if None in before else max(b for b in before if b is not None)
        for call in calls:
            if since is not None and call.call_id in accepted:
                durations.append(max(accepted[call.call_id] - since, 0.0))
    return durations


def _excused(history: History, delivery: DeliveryAttempt) -> bool:
    replica = history.replica_urls.get(delivery.url)
    return any(
        outage.replica == replica
        and outage.start - OUTAGE_GRACE <= delivery.at <= outage.end + OUTAGE_GRACE
        for outage in history.outages
    )


def _tracebacks(text: str) -> int:
    """How many tracebacks ``text`` holds, a flaky lookup's own transient failures aside."""
    count = 0
    for block in text.split(TRACEBACK)[1:]:
        lines = block.splitlines()[1:]
        frames = [line for line in lines if line.startswith(" ")]
        last = next((line for line in lines if not line.startswith(" ")), "")
        excused = FLAKY_FAILURE.fullmatch(last) and any(
            "in flaky_lookup" in line for line in frames
        )
        count += not excused
    return count


def _check_retries(history: History, report: Report) -> None:
    """The flaky lookups' ledger lines against their fail_times and their results."""
    results = {s.call_id: s for s in history.submissions}
    attempts: dict[str, list[int]] = collections.defaultdict(list)
    for entry in history.ledger:
        if entry.get("tool") == FLAKY_TOOL:
            attempts[str(entry.get("call_id"))].append(int(entry.get("attempt", 0)))
    bad = report.retry_violations
    for call in history.calls:
        if call.tool != FLAKY_TOOL:
            continue
        report.flaky += 1
        fail_times = int(call.arguments.get("fail_times", 0))
        seen = attempts.get(call.call_id, [])
        twice = sorted(n for n, times in collections.Counter(seen).items() if times > 1)
        if twice:
            bad.append(f"{call.call_id}: attempt {twice} ran twice (ledger {seen})")
        result = results.get(call.call_id)
        if result is None:
            continue  # lost: counted as such
        if fail_times >= FLAKY_ATTEMPTS:
            if result.success:
                bad.append(f"{call.call_id}: fails {fail_times} times, answered with success")
            if len(seen) > FLAKY_ATTEMPTS:
                bad.append(f"{call.call_id}: {len(seen)} attempts ran, the policy allows 4")
        elif result.success:
            if sorted(seen) != list(range(1, fail_times + 2)):
                bad.append(
                    f"{call.call_id}: success after fail_times={fail_times} with ledger "
                    f"attempts {seen}, not 1..{fail_times + 1}"
                )
            elif fail_times:
                report.flaky_retried += 1


def _check_approvals(history: History, report: Report) -> None:
    """The approval calls' ledger lines and results against the approver's decisions."""
    results = {s.call_id: s for s in history.submissions}
    lines = collections.Counter(
        str(e.get("call_id")) for e in history.ledger if e.get("tool") == APPROVAL_TOOL
    )
    bad = report.approval_violations
    for call in history.calls:
        if call.tool != APPROVAL_TOOL:
            continue
        result = results.get(call.call_id)
        decision = history.decisions.get(call.call_id)
        if decision is None:
            if result is not None:
                bad.append(f"{call.call_id}: answered though nobody decided it")
            if lines[call.call_id]:
                bad.append(f"{call.call_id}: ran though nobody decided it")
            continue
        if decision.approve:
            report.approved += 1
            if lines[call.call_id] > 1 and history.store_states.get(call.call_id) != "quarantined":
                bad.append(f"{call.call_id}: approved, ran {lines[call.call_id]} times")
            if result is not None and not result.success:
                bad.append(f"{call.call_id}: approved, answered with a failure: {result.error}")
        else:
            report.denied += 1
            if lines[call.call_id]:
                bad.append(f"{call.call_id}: denied, ran {lines[call.call_id]} times")
            if result is not None and (
                result.success or (decision.reason or "") not in (result.error or "")
            ):
                bad.append(
                    f"{call.call_id}: denied ({decision.reason}), answered "
                    f"{'success' if result.success else repr(result.error)}"
                )


def _heard(history: History, cancellation: Cancellation) -> float:
    """When a replica that was up first heard that the turn ended, and could read which
    calls it ended (see the docstring)."""
    webhooks = [
        d.at
        for d in history.deliveries
        if d.session_id == cancellation.session_id
        and d.event_type in TURN_ENDED
        and d.ok
        and d.at >= cancellation.at
        and not _down(history, history.replica_urls.get(d.url), d.at)
    ]
    heard = min(webhooks, default=cancellation.at + history.reread_interval)
    reads = [
        r.at
        for r in history.requests
        if r.route == "retrieve"
        and r.status is not None
        and 200 <= r.status < 300
        and r.at >= heard
        and r.path.rstrip("/").endswith("/" + cancellation.session_id)
    ]
    return min(reads, default=heard)


def _down(history: History, replica: int | None, at: float) -> bool:
    return any(o.replica == replica and o.start <= at <= o.end for o in history.outages)


def _check_cancellations(history: History, report: Report) -> None:
    """The calls of the turns the nemesis ended: not lost, not answered after, settled in
    the store, their handlers stopped in time (see the module docstring)."""
    accepted = {s.call_id: s.received_at for s in history.submissions}
    by_session: dict[str | None, list[PlannedCall]] = collections.defaultdict(list)
    for call in history.calls:
        by_session[call.session_id].append(call)
    runs: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for n, entry in enumerate(history.ledger):
        if entry.get("tool") in LONG_TOOLS:
            seen = history.ledger_seen[n] if n < len(history.ledger_seen) else math.inf
            runs[str(entry.get("call_id"))].append((seen, str(entry.get("phase"))))
    bad = report.cancel_violations
    unowed: set[str] = set()
    for cancellation in history.cancellations:
        report.cancelled_turns += 1
        report.cancelled_calls += len(cancellation.calls)
        calls = by_session[cancellation.session_id]
        unowed.update(
            c.call_id
            for c in calls
            if c.call_id not in accepted or accepted[c.call_id] > cancellation.at
        )
        for call in calls:
            if accepted.get(call.call_id, -math.inf) > cancellation.at:
                bad.append(f"{call.call_id}: result accepted after its turn ended")
        for call_id in cancellation.calls:
            state = history.store_states.get(call_id)
            if state not in (None, "cancelled", "stale", "quarantined"):
                bad.append(f"{call_id}: {state} in the store after its turn ended")
        deadline = _heard(history, cancellation) + STOP_WITHIN
        for call in calls:
            lines = sorted(runs.get(call.call_id, []), key=lambda line: line[0])
            if call.tool not in LONG_TOOLS or not lines:
                continue
            # Runs started (even after the deadline) that had not ended by the deadline.
            started = [seen for seen, phase in lines if phase == "start"]
            ended = [seen for seen, phase in lines if phase != "start" and seen <= deadline]
            open_runs = len(started) - len(ended)
            if open_runs <= 0:
                continue
            outages = sum(1 for o in history.outages if o.end >= started[0] and o.start <= deadline)
            what = (
                f"{call.call_id}: {open_runs} run(s) of {call.tool} still running "
                f"{STOP_WITHIN:g}s after its turn's end was heard"
            )
            if open_runs <= outages:
                report.cancel_excused.append(f"{what} ({outages} outage(s))")
            else:
                bad.append(what)
    report.lost[:] = [call_id for call_id in report.lost if call_id not in unowed]


def check(history: History) -> Report:
    """Every property of the module docstring over ``history``."""
    report = Report(injected=dict(history.injected), drain_seconds=history.drain_seconds)
    report.calls = len(history.calls)
    per_call = collections.Counter(s.call_id for s in history.submissions)
    report.answered = len(per_call)
    report.lost = [c.call_id for c in history.calls if c.call_id not in per_call]
    report.duplicate_results = sorted(c for c, n in per_call.items() if n > 1)
    report.conflicts = sum(1 for r in history.requests if r.route == "submit" and r.status == 409)
    report.duplicate_submissions = len(history.duplicate_submissions)
    report.failed_results = [
        f"{s.call_id}: {(s.error or '')[:100]}" for s in history.submissions if not s.success
    ]

    tools = {c.call_id: c.tool for c in history.calls}
    effects = collections.Counter(str(entry.get("call_id")) for entry in history.ledger)
    for call_id, lines in sorted(effects.items()):
        if lines > 1 and tools.get(call_id) in history.side_effect_tools:
            if history.store_states.get(call_id) == "quarantined":
                report.quarantined_with_effects.append(call_id)
            else:
                report.duplicate_effects.append(f"{call_id} ({lines} ledger lines)")
    unknown = sorted(set(effects) - set(tools))
    report.webhook_5xx = [
        f"{d.webhook_id} {d.event_type} -> replica {history.replica_urls.get(d.url)}: {d.status}"
        for d in history.deliveries
        if d.status is not None and d.status >= 500 and not _excused(history, d)
    ]
    for name, text in sorted(history.logs.items()):
        count = _tracebacks(text)
        if count:
            report.tracebacks.append(f"{name}: {count}")
    _check_retries(history, report)
    _check_approvals(history, report)
    _check_cancellations(history, report)
    report.p99 = _percentile(_times_to_result(history), 0.99)

    v = report.violations
    if report.lost:
        waiting = len(history.waiting_at_end)
        v.append(
            f"lost: {len(report.lost)} calls without a result ({waiting} still waited for "
            f"after the drain): {', '.join(report.lost[:10])}"
        )
    if report.duplicate_results:
        v.append(f"more than one accepted result: {', '.join(report.duplicate_results[:10])}")
    if report.conflicts:
        v.append(f"{report.conflicts} submissions of a different result for an answered call")
    if report.duplicate_effects:
        v.append(f"side effect more than once: {', '.join(report.duplicate_effects[:10])}")
    if unknown:
        v.append(f"ledger lines for calls nobody made: {', '.join(unknown[:10])}")
    if report.webhook_5xx:
        v.append(f"webhooks answered 5xx by a live replica: {'; '.join(report.webhook_5xx[:10])}")
    if report.tracebacks:
        v.append(f"tracebacks in the logs: {', '.join(report.tracebacks)}")
    if report.retry_violations:
        v.append(f"retries: {'; '.join(report.retry_violations[:10])}")
    if report.approval_violations:
        v.append(f"approvals: {'; '.join(report.approval_violations[:10])}")
    if report.cancel_violations:
        v.append(f"cancelled turns: {'; '.join(report.cancel_violations[:10])}")
    v.extend(f"nemesis: {error}" for error in history.nemesis_errors)
    return report
