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

    claimed ──take_slot (admitted)──▶ claimed, holding a slot of its limiter
       └────wait (refused)──▶ waiting ──admit (admitted)──▶ claimed, holding a slot
                                 │  └─keep_waiting (refused: the waiter's lease renewed)
                                 └─adopt (the waiter's lease lapsed)──▶ claimed (next attempt)

Flow control (``concurrency=`` / ``rate=`` on a tool): a claimed call of a limited tool
takes a slot of its limiter (:attr:`~agentfn_asgi.records.CallRecord.limiter`) when the
limits admit it (:func:`admits`), or waits for one (``waiting``), holding no slot and no
thread; its holder polls (``admit_call``), which also renews the waiter's lease. A call
holds a slot while it is ``claimed`` with its ``limiter`` set and a lease that has not
lapsed by more than the fencing margin: leaving ``claimed`` frees the slot, and so does a
holder that died (its lease runs out). Rows that enter ``claimed`` any other way clear the
limiter, so a taken-over call holds nothing until it is admitted again.

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
    "FOR_A_PERSON",
    "HOLDS_SLOT",
    "PRUNABLE",
    "SAVED",
    "SETTLEABLE",
    "TRANSITIONS",
    "Guard",
    "Target",
    "Transition",
    "Way",
    "admits",
    "allows",
    "bucket_tokens",
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
    #: Flow control: the call's limiter has a slot (and a token) for it now, with every live
    #: waiter that arrived earlier served first (:func:`admits`). The store counts the
    #: limiter's holders, waiters and tokens in the same transaction as the change.
    ADMITTED = "admitted"
    #: Flow control: the limiter has no slot (or token) for it now.
    REFUSED = "refused"


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
    #: Flow control: True sets the call's ``limiter`` (it holds or waits for a slot), False
    #: clears it (a claim entered another way holds no slot), None leaves it.
    limiter: bool | None = None
    #: Whether the row sets ``updated_at`` (what ``unchanged_since`` compares). A waiter's
    #: poll (``keep_waiting``) does not: renewing its place in the line is no change a reader
    #: of the session could have missed, so a turn cancelled meanwhile still marks it stale.
    touches: bool = True

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
FOR_A_PERSON: Final = frozenset({CallState.AWAITING_APPROVAL, CallState.APPROVED})
#: A call in this state with its ``limiter`` set and a lease not lapsed by more than the
#: margin holds one slot of that limiter (flow control).
HOLDS_SLOT: Final = CallState.CLAIMED
_PENDING: Final = tuple(state for state in CallState if not state.terminal)
_HELD: Final = frozenset({Guard.HOLDER})
_OWN_LIVE: Final = frozenset({Guard.OWN_LIVE_LEASE})
#: What an operator may settle or re-run (:func:`settleable`): held for them, or in doubt.
SETTLEABLE: Final = (
    _from(CallState.QUARANTINED),
    _from(CallState.CLAIMED, guards=frozenset({Guard.LEASE_LAPSED})),
)

# -- flow control: retries and limits -----------------------------------------------
#: ``claimed`` ──schedule_retry──▶ ``retry_scheduled`` ──retry (due)──▶ ``claimed`` (next
#: attempt). Only the holder schedules (fencing); whoever claims the call once its time has
#: come runs the next attempt, exactly one claimant wins.
#:
#: Limits: the holder of a claim takes a slot (``take_slot``) or waits (``wait``); a waiting
#: call's holder polls (``admit`` / ``keep_waiting``); a waiter whose lease lapsed (its
#: replica died) is adopted by whoever claims it next (nothing ran: not in doubt).
_ADMITTED: Final = frozenset({Guard.HOLDER, Guard.ADMITTED})
_REFUSED: Final = frozenset({Guard.HOLDER, Guard.REFUSED})
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
        limiter=False,
    ),
    Transition(
        "take_slot",
        "admit_call",
        (_from(CallState.CLAIMED, guards=_ADMITTED),),
        Target.SAME,
        limiter=True,
    ),
    Transition(
        "wait",
        "admit_call",
        (_from(CallState.CLAIMED, guards=_REFUSED),),
        CallState.WAITING,
        event="waiting",
        limiter=True,
    ),
    Transition(
        "admit",
        "admit_call",
        (_from(CallState.WAITING, guards=_ADMITTED),),
        CallState.CLAIMED,
        event="admitted",
    ),
    Transition(
        "keep_waiting",
        "admit_call",
        (_from(CallState.WAITING, guards=_REFUSED),),
        Target.SAME,
        touches=False,
    ),
    Transition(
        "adopt",
        "claim_call",
        (_from(CallState.WAITING, guards=frozenset({Guard.LEASE_LAPSED})),),
        CallState.CLAIMED,
        event="adopted",
        new_attempt=True,
        limiter=False,
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
            (
                _from(
                    CallState.CLAIMED, CallState.WAITING, guards=frozenset({Guard.OWN_LIVE_LEASE})
                ),
            ),
            Target.SAME,
        ),
        Transition(
            "take_over",
            "claim_call",
            (_from(CallState.CLAIMED, guards=frozenset({Guard.LEASE_LAPSED})),),
            CallState.CLAIMED,
            event="taken_over",
            new_attempt=True,
            limiter=False,
        ),
        Transition("renew", "renew_lease", (_from(CallState.CLAIMED, guards=_HELD),), Target.SAME),
        Transition(
            "save",
            "save_result",
            # From ``waiting``: a wait that ran past the tool's ``max_wait`` saves a failure.
            (_from(CallState.CLAIMED, CallState.WAITING, guards=_HELD),),
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
            # It changes when the sweep looks again, not the record's age: what another
            # replica saved stays newer than it (mark_stale's unchanged_since).
            touches=False,
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
            limiter=False,
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
            limiter=False,
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
    admitted: bool | None,
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
    if guard is Guard.ADMITTED:
        return admitted is True
    if guard is Guard.REFUSED:
        return admitted is False
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
    admitted: bool | None = None,
) -> bool:
    """Does ``row`` apply to ``record`` (None: no record yet) with these arguments?
    ``admitted`` is the limiter's answer (:func:`admits`), for the flow-control rows."""
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
                admitted=admitted,
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


def admits(
    *,
    concurrency: int | None,
    rate: float | None,
    holders: int,
    ahead: int,
    tokens: float,
) -> bool:
    """The limiter's rule (``Guard.ADMITTED``), the same in every store.

    ``holders``: the other calls holding a slot of the limiter (``claimed`` with it, lease
    not lapsed by more than the margin); ``ahead``: the live waiters of the limiter that
    arrived earlier (``waiting`` with it, lease not lapsed by more than the margin, ordered
    by ``(created_at, session_id, turn_id, call_id)``); ``tokens``: the limiter's bucket now
    (:func:`bucket_tokens`). A call is admitted when a slot is free after everyone ahead of
    it took one, and a token is left after everyone ahead took theirs: calls start in the
    order they arrived, and a waiter that died stops holding up the line once its lease
    lapses. An admitted call of a rated limiter spends one token.
    """
    if concurrency is not None and holders + ahead >= concurrency:
        return False
    return rate is None or tokens >= ahead + 1


def bucket_tokens(
    tokens: float | None, updated_at: float, *, now: float, rate: float, burst: int
) -> float:
    """A token bucket's tokens at ``now``: ``tokens`` at ``updated_at`` (None: a new bucket,
    full) refilled at ``rate`` per second up to ``burst``. A clock that reads earlier than
    the last update (another replica's, skewed) refills nothing rather than draining."""
    if tokens is None:
        return float(burst)
    return min(float(burst), tokens + max(0.0, now - updated_at) * rate)
