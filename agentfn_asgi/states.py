"""The call state machine, declared once: states, operations, guards and resulting states.

Every store carries out the same machine. The memory store executes this table (it is the
reference); the SQL statements (:mod:`agentfn_asgi.store._sql_statements`) and the Redis
scripts (:mod:`agentfn_asgi.store._redis_scripts`) spell each guard in their own language,
and ``tests/store/test_state_table.py`` holds every statement and script to the row of the
table it carries out, while the generated histories (``tests/store/test_histories.py``) hold
every backend's behaviour to the reference's. A new state or operation starts here.

The machine, one row per :class:`Transition` of :data:`TRANSITIONS`::

    (absent) ──claim──▶ claimed ──save──▶ succeeded | failed ──mark_submitted──▶ submitted
                          │  ▲                 │  └─submission_failed (stays, retried)
           take_over ◀────┘  │                 └──mark_stale──▶ stale
           (lease lapsed)    │ release
    claimed ──quarantine──▶ quarantined ──settle──▶ succeeded | failed
    claimed (lease lapsed) ──settle / release──▶ …     submitted | stale ──prune──▶ (gone)

    claimed ──request_approval──▶ awaiting_approval ──approve──▶ approved ──run_approved──▶ claimed
                                    │  └─deny (open) / expire_approval (lapsed)──▶ failed
                                    └─mark_stale──▶ stale     (the session stopped waiting)

    claimed ──schedule_retry──▶ retry_scheduled ──retry (due)──▶ claimed (the next attempt)

A call of a tool declared with ``approval=`` is held in ``awaiting_approval`` by the holder
of its claim, after its arguments were validated: nothing runs, and a redelivery, the sweep
or another replica leaves it alone (a claim of it is ``DONE``). While it waits, its
``lease_expires_at`` is the request's expiry, which the approval guards read. A decision is
taken once: ``approve`` makes it ``approved`` (the replicas poll for those and one of them
claims it with ``run_approved``: a fresh attempt under the usual rules, not in doubt);
``deny`` and ``expire_approval`` save a failure the model sees, submitted as any result.

Guards (:class:`Guard`) are the conditions beyond the source state: who holds the claim,
whether its lease lapsed, whether the record changed since it was read. The one rule of what
an operator may settle or re-run is :func:`settleable`.

This module imports only :mod:`agentfn_asgi.records`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from agentfn_asgi.records import CallRecord, CallState

__all__ = [
    "PRUNABLE",
    "SAVED",
    "SETTLEABLE",
    "TRANSITIONS",
    "WAITING",
    "Guard",
    "Target",
    "Transition",
    "Way",
    "allows",
    "resulting_state",
    "settleable",
]


class Guard(enum.StrEnum):
    """A condition a transition needs beyond its source state.

    - ``holder``: the claim is held by the caller's ``(owner, attempt)`` (fencing).
    - ``own_live_lease``: the caller's ``owner`` holds the claim and its lease has not run out
      (a claim retried after its answer was lost).
    - ``lease_lapsed``: the lease ran out more than the fencing margin ago (the claim is in
      doubt: taking it over, settling or re-running it is safe).
    - ``unchanged_since``: the record was not updated after the time the caller read the
      session (optional: only when the caller passes that time).
    - ``approval_open``: the approval request has not expired yet (``now`` is before the
      waiting record's ``lease_expires_at``, its request's ``expires_at``).
    - ``approval_lapsed``: the approval request expired (``now`` at or past it).
    """

    HOLDER = "holder"
    OWN_LIVE_LEASE = "own_live_lease"
    LEASE_LAPSED = "lease_lapsed"
    UNCHANGED_SINCE = "unchanged_since"
    APPROVAL_OPEN = "approval_open"
    APPROVAL_LAPSED = "approval_lapsed"
    #: Flow control: the scheduled time of a retry has come
    #: (``lease_expires_at <= now``: a ``retry_scheduled`` call keeps its next attempt's time
    #: there). Never sooner; a replica whose clock runs ahead starts it that much early.
    DUE = "due"


class Target(enum.StrEnum):
    """Resulting states that are not one fixed :class:`CallState`."""

    #: ``succeeded`` or ``failed``, by the saved result's ``success``.
    BY_RESULT = "by_result"
    #: The state does not change (a renewal, a failed submission, a retried claim).
    SAME = "same"
    #: The record is removed.
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class Way:
    """One way a transition may happen: from one of ``states`` (empty: the call has no
    record yet) when every one of ``guards`` holds."""

    states: frozenset[CallState]
    guards: frozenset[Guard] = frozenset()


@dataclass(frozen=True, slots=True)
class Transition:
    """One row of the machine.

    ``operation`` is the :class:`~agentfn_asgi.store.base.Store` method that makes it; any one
    of its ``ways`` lets it happen. ``event`` is the kind of the history event it appends
    (None: none), ``new_attempt`` whether it starts the claim's next attempt.
    """

    name: str
    operation: str
    ways: tuple[Way, ...]
    target: CallState | Target
    event: str | None = None
    new_attempt: bool = False

    @property
    def sources(self) -> frozenset[CallState]:
        """Every state the transition may start from."""
        return frozenset().union(*(way.states for way in self.ways))


def _from(*states: CallState, guards: frozenset[Guard] = frozenset()) -> Way:
    return Way(frozenset(states), guards)


#: ``succeeded`` and ``failed``: a result is saved and owed to the API.
SAVED: Final = frozenset({CallState.SUCCEEDED, CallState.FAILED})
#: Submitted or stale calls are finished: pruning may remove them. Quarantined calls wait for
#: an operator, never for a pruner.
PRUNABLE: Final = frozenset({CallState.SUBMITTED, CallState.STALE})
#: A person decides these: waiting for approval, or approved and not yet run.
WAITING: Final = frozenset({CallState.AWAITING_APPROVAL, CallState.APPROVED})
_PENDING: Final = tuple(state for state in CallState if not state.terminal)
_HELD: Final = frozenset({Guard.HOLDER})
#: What an operator may settle or re-run (:func:`settleable`): held for them, or in doubt.
SETTLEABLE: Final = (
    _from(CallState.QUARANTINED),
    _from(CallState.CLAIMED, guards=frozenset({Guard.LEASE_LAPSED})),
)

# -- flow control: retries ---------------------------------------------------------
#: ``claimed`` ──schedule_retry──▶ ``retry_scheduled`` ──retry (due)──▶ ``claimed`` (next
#: attempt). Only the holder schedules (fencing); whoever claims the call once its time has
#: come runs the next attempt, exactly one claimant wins.
_FLOW_CONTROL: Final = (
    Transition(
        "schedule_retry",
        "schedule_retry",
        (_from(CallState.CLAIMED, guards=_HELD),),
        CallState.RETRY_SCHEDULED,
        event="retry_scheduled",
    ),
    Transition(
        "retry",
        "claim_call",
        (_from(CallState.RETRY_SCHEDULED, guards=frozenset({Guard.DUE})),),
        CallState.CLAIMED,
        event="retried",
        new_attempt=True,
    ),
)

#: Every transition a store may make, by name.
TRANSITIONS: Final[Mapping[str, Transition]] = {
    t.name: t
    for t in (
        Transition("claim", "claim_call", (_from(),), CallState.CLAIMED, event="claimed"),
        Transition(
            "reclaim",
            "claim_call",
            (_from(CallState.CLAIMED, guards=frozenset({Guard.OWN_LIVE_LEASE})),),
            Target.SAME,
        ),
        Transition(
            "take_over",
            "claim_call",
            (_from(CallState.CLAIMED, guards=frozenset({Guard.LEASE_LAPSED})),),
            CallState.CLAIMED,
            event="taken_over",
            new_attempt=True,
        ),
        Transition("renew", "renew_lease", (_from(CallState.CLAIMED, guards=_HELD),), Target.SAME),
        Transition(
            "save",
            "save_result",
            (_from(CallState.CLAIMED, guards=_HELD),),
            Target.BY_RESULT,
            event="saved",
        ),
        Transition(
            "mark_submitted",
            "mark_submitted",
            (_from(*SAVED),),
            CallState.SUBMITTED,
            event="submitted",
        ),
        Transition(
            "submission_failed",
            "submission_failed",
            (_from(*SAVED),),
            Target.SAME,
            event="submit_failed",
        ),
        Transition(
            "mark_stale",
            "mark_stale",
            (_from(*_PENDING, guards=frozenset({Guard.UNCHANGED_SINCE})),),
            CallState.STALE,
            event="stale",
        ),
        Transition(
            "quarantine",
            "quarantine",
            (_from(CallState.CLAIMED, guards=_HELD),),
            CallState.QUARANTINED,
            event="quarantined",
        ),
        Transition("settle", "settle", SETTLEABLE, Target.BY_RESULT, event="settled"),
        Transition(
            "release",
            "release",
            SETTLEABLE,
            CallState.CLAIMED,
            event="released",
            new_attempt=True,
        ),
        Transition("prune", "prune", (_from(*PRUNABLE),), Target.REMOVED),
        Transition(
            "request_approval",
            "request_approval",
            (_from(CallState.CLAIMED, guards=_HELD),),
            CallState.AWAITING_APPROVAL,
            event="approval_requested",
        ),
        Transition(
            "approve",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=frozenset({Guard.APPROVAL_OPEN})),),
            CallState.APPROVED,
            event="approved",
        ),
        Transition(
            "deny",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=frozenset({Guard.APPROVAL_OPEN})),),
            Target.BY_RESULT,
            event="denied",
        ),
        Transition(
            "expire_approval",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=frozenset({Guard.APPROVAL_LAPSED})),),
            Target.BY_RESULT,
            event="approval_expired",
        ),
        Transition(
            "run_approved",
            "claim_approved",
            (_from(CallState.APPROVED),),
            CallState.CLAIMED,
            event="claimed_approved",
            new_attempt=True,
        ),
        *_FLOW_CONTROL,
    )
}


def _guard_holds(
    guard: Guard,
    record: CallRecord,
    *,
    now: float,
    owner: str | None,
    attempt: int | None,
    margin: float,
    unchanged_since: float | None,
) -> bool:
    if guard is Guard.HOLDER:
        return record.owner == owner and record.attempt == attempt
    if guard is Guard.OWN_LIVE_LEASE:
        return record.owner == owner and record.lease_expires_at >= now
    if guard is Guard.LEASE_LAPSED:
        return record.lease_expires_at < now - margin
    if guard is Guard.APPROVAL_OPEN:
        return now < record.lease_expires_at
    if guard is Guard.APPROVAL_LAPSED:
        return now >= record.lease_expires_at
    if guard is Guard.DUE:
        return record.lease_expires_at <= now
    # UNCHANGED_SINCE is asked for by the caller; without a time it does not apply.
    return unchanged_since is None or record.updated_at <= unchanged_since


def allows(
    row: Transition,
    record: CallRecord | None,
    *,
    now: float,
    owner: str | None = None,
    attempt: int | None = None,
    margin: float = 0.0,
    unchanged_since: float | None = None,
) -> bool:
    """Does ``row`` apply to ``record`` (None: no record yet) with these arguments?"""
    for way in row.ways:
        if record is None:
            if not way.states:
                return True
            continue
        if record.state in way.states and all(
            _guard_holds(
                guard,
                record,
                now=now,
                owner=owner,
                attempt=attempt,
                margin=margin,
                unchanged_since=unchanged_since,
            )
            for guard in way.guards
        ):
            return True
    return False


def settleable(record: CallRecord | None, *, now: float, margin: float = 0.0) -> bool:
    """May an operator settle or re-run this call? Held for them (``quarantined``), or in
    doubt: ``claimed`` with a lease that ran out more than ``margin`` seconds before ``now``.
    The stores, the dispatcher's settling and the operator views all ask this one rule."""
    return allows(_SETTLE, record, now=now, margin=margin)


_SETTLE: Final = TRANSITIONS["settle"]


def resulting_state(row: Transition, record: CallRecord, *, success: bool | None) -> CallState:
    """The state ``record`` is in after ``row`` (``success``: the saved result's, for rows
    that save one)."""
    if row.target is Target.BY_RESULT:
        return CallState.SUCCEEDED if success else CallState.FAILED
    if row.target is Target.SAME:
        return record.state
    if row.target is Target.REMOVED:
        raise ValueError("a removed record has no state")
    return row.target
