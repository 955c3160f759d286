"""The call state machine, declared once: states, operations, guards, and what each
transition changes.

Every store carries out the same machine. :func:`apply` carries one row out on a record: it
is the reference, and the memory store runs it. The SQL statements and the Redis scripts of
every transition are rendered from the rows (:mod:`agentfn_asgi.store.sql.compile`,
:mod:`agentfn_asgi.store.redis.compile`;
``docs/how-it-works/state-machine.md`` shows them), and the generated histories
(``tests/store/test_histories.py``) hold every backend's behaviour to the reference's. A new
state or transition is a row here.

The machine, one row per :class:`Transition` of :data:`TRANSITIONS`::

    (absent) ──claim──▶ claimed ──save──▶ succeeded | failed ──mark_submitted──▶ submitted
                          │  ▲                 │  └─submission_failed (stays, retried)
           take_over ◀────┘  │                 └──mark_stale──▶ stale
           (lease lapsed)    │ release
    claimed ──quarantine──▶ quarantined ──settle──▶ succeeded | failed
    claimed (lease lapsed) ──settle / release──▶ …     submitted | stale ──prune──▶ (gone)

    claimed ──request_approval──▶ awaiting_approval ──approve──▶ approved ──run_approved──▶ claimed
                                    │  └─deny (open) / expire_approval (lapsed)──▶ failed
                                    └─cancel──▶ cancelled     (the session stopped waiting)

    claimed | waiting | awaiting_approval | approved | retry_scheduled ──cancel──▶ cancelled

    claimed ──schedule_retry──▶ retry_scheduled ──retry (due)──▶ claimed (the next attempt)

    claimed ──count (within its session's budget)──▶ claimed, counted (once, ever)

    claimed ──leave──▶ unanswered ──take_up──▶ claimed (a fresh attempt)
                           └─mark_stale (a read no longer lists it, its turn goes on)──▶ stale
    claimed | retry_scheduled | succeeded | failed | unanswered | submitted | stale | cancelled
        ──retire (turn-less, no longer listed)──▶ retired
    retired ──take_up (its next occurrence)──▶ claimed

    claimed ──take_slot (admitted)──▶ claimed, holding a slot of its limiter
       └────wait (refused)──▶ waiting ──admit (admitted)──▶ claimed, holding a slot
                                 │  ├─keep_waiting (refused: the waiter's lease renewed)
                                 │  └─keep_place (not asked: the waiter's lease renewed)
                                 └─adopt (the waiter's lease lapsed)──▶ claimed (next attempt)

Flow control (``concurrency=`` / ``rate=`` on a tool): a claimed call of a limited tool
takes a slot of its limiter (:attr:`~agentfn_asgi.calls.records.CallRecord.limiter`) when the
limits admit it (:func:`admits`), or waits for one (``waiting``), holding no slot and no
thread; its holder polls (``admit_call``), which also renews the waiter's lease. Only the
head of a process's line for a limiter polls; the waiters behind it keep their place
(``keep_places``: their leases renewed, the limiter not asked). A store counts at most
:func:`admission_bounds` holders and waiters ahead of a call: an admission costs the same
at any length of line. A call
holds a slot while it is ``claimed`` with its ``limiter`` set and a lease that has not
lapsed by more than the fencing margin: leaving ``claimed`` frees the slot, and so does a
holder that died (its lease runs out). Rows that enter ``claimed`` any other way clear the
limiter, so a taken-over call holds nothing until it is admitted again.

Call budgets (``max_calls_per_session=`` on a tool): before a call of such a tool first
runs, its holder asks the store to count it (``count_call``). The store counts, in the same
transaction, the calls of the same session and tool already counted (in any state: a
budget is a limiter whose holders are every call ever admitted to run) and, while they are
fewer than the budget (:func:`within_budget`), makes the ``count`` row: the call's
``counted`` is its place. A counted call is never counted again (a retry, a takeover or an
operator's re-run finds it counted); a refused one changes nothing and its holder saves the
budget's failure instead of running it.

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

This module imports only :mod:`agentfn_asgi.calls.records`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentfn_asgi.calls.records import CallEvent, CallRecord, CallState, ClaimStatus

__all__ = [
    "CLAIM_ORDER",
    "FIELDS",
    "FOR_A_PERSON",
    "HISTORY_HEAD",
    "HISTORY_TAIL",
    "HOLDS_SLOT",
    "PRUNABLE",
    "SAVED",
    "SETTLEABLE",
    "SOURCES",
    "TRANSITIONS",
    "WORKLISTS",
    "Args",
    "Guard",
    "Target",
    "Transition",
    "Way",
    "Worklist",
    "admission_bounds",
    "admits",
    "allows",
    "appended",
    "apply",
    "bucket_tokens",
    "claim_nonces",
    "claimed_with",
    "holds",
    "in_doubt",
    "reclaimed",
    "refusal",
    "resulting_state",
    "settleable",
    "settled_with",
    "within_budget",
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
    #: waiter that arrived earlier served first (:func:`admits`); or, for the ``count`` row,
    #: its session's budget of its tool has room for it (:func:`within_budget`). The store
    #: counts the limiter's holders, waiters and tokens (or the budget's counted calls) in
    #: the same transaction as the change.
    ADMITTED = "admitted"
    #: Flow control: the limiter has no slot (or token) for it now.
    REFUSED = "refused"
    #: The decision names the request the call waits for (``approval_id``).
    SAME_REQUEST = "same_request"
    #: The call was first claimed no later than ``since`` (a session read that no longer
    #: lists it): it was owed before that read, so the read shows it is not any more. A call
    #: claimed after the read (the read may predate it) is left alone. Not ``updated_at``:
    #: a running call's lease renewals change that.
    KNOWN_BEFORE = "known_before"


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


#: Where a field's new value comes from, in :attr:`Transition.sets`: the step's time
#: (``now``), one of the step's arguments (``:name``), the field plus one (``+1``), nothing
#: (``null``), the field's own value if it has one and the argument otherwise (``?:name``),
#: or a whole number written out (``1``).
SOURCES: Final = ("now", ":name", "+1", "null", "?:name", "1")
#: Fields a row may set (:attr:`Transition.sets`): :class:`CallRecord`'s, by name.
FIELDS: Final = frozenset(
    {
        "attempt",
        "owner",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "next_attempt_at",
        "failures",
        "limiter",
        "reason",
        "delivery_id",
        "result",
        "approval",
        "nonce",
        "counted",
    }
)


def _valid_source(source: str) -> bool:
    return (
        source in ("now", "+1", "null")
        or source.isdigit()
        or (source.startswith((":", "?:")) and source.lstrip("?:").isidentifier())
    )


@dataclass(frozen=True, slots=True)
class Transition:
    """One row of the machine: when it may happen and what it changes.

    ``operation`` is the :class:`~agentfn_asgi.store.base.Store` method that makes it; any one
    of its ``ways`` lets it happen. ``target`` is the resulting state. ``sets`` says every
    other field it changes and from where (:data:`SOURCES`); ``event`` is the kind of the
    history event it appends (None: none), carrying the step's ``owner`` and ``detail``
    arguments when ``says`` names them. The event's attempt is the attempt after the change.

    This is all a store needs: :func:`apply` carries a row out on a record (the memory store
    runs it; it is the reference), and the SQL statements and Lua scripts of the other stores
    are rendered from the same fields (:mod:`agentfn_asgi.store.sql.compile`,
    :mod:`agentfn_asgi.store.redis.compile`).
    """

    name: str
    operation: str
    ways: tuple[Way, ...]
    target: CallState | Target
    event: str | None = None
    sets: tuple[tuple[str, str], ...] = ()
    says: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name, source in self.sets:
            if name not in FIELDS or not _valid_source(source):
                raise ValueError(f"row {self.name}: cannot set {name} from {source!r}")

    @property
    def sources(self) -> frozenset[CallState]:
        """Every state the transition may start from."""
        return frozenset().union(*(way.states for way in self.ways))

    @property
    def changes(self) -> Mapping[str, str]:
        """:attr:`sets` as a mapping."""
        return dict(self.sets)

    @property
    def new_attempt(self) -> bool:
        """Does the row start the claim's next attempt?"""
        return self.changes.get("attempt") == "+1"


def _sets(**sources: str) -> tuple[tuple[str, str], ...]:
    return tuple(sources.items())


def _says(*names: str) -> frozenset[str]:
    return frozenset(names)


def _from(*states: CallState, guards: frozenset[Guard] = frozenset()) -> Way:
    return Way(frozenset(states), guards)


#: ``succeeded`` and ``failed``: a result is saved and owed to the API.
SAVED: Final = frozenset({CallState.SUCCEEDED, CallState.FAILED})
#: Submitted, stale, cancelled or retired calls are finished: pruning may remove them. Quarantined
#: calls wait for an operator, never for a pruner.
PRUNABLE: Final = frozenset(
    {CallState.SUBMITTED, CallState.STALE, CallState.CANCELLED, CallState.RETIRED}
)
#: Not finished and answered here: where the oldest pending call is looked for
#: (``StoreStats.oldest_pending_at``). An ``unanswered`` action waits for someone else, and
#: its age is shown apart.
OWED_HERE: Final = frozenset(
    state for state in CallState if not state.terminal and state is not CallState.UNANSWERED
)
#: A person decides these: waiting for approval, or approved and not yet run.
FOR_A_PERSON: Final = frozenset({CallState.AWAITING_APPROVAL, CallState.APPROVED})


@dataclass(frozen=True, slots=True)
class Worklist:
    """The calls a step acts on next, read on every store from indexes of their own: those
    in one of ``states`` (each set from its own index) whose ``column`` is at or before a
    bound (before it, when ``strict``), in the order of ``column``, ties broken by the key
    when ``by_key`` (the order a cursor pages on). ``listing``: operators read it too."""

    states: tuple[frozenset[CallState], ...]
    column: str
    strict: bool = False
    by_key: bool = True
    listing: bool = False


#: The store's worklists by name: the sweep's (in doubt, due retries, results to submit) and
#: the approval flow's. The bounds are the table's guards: ``lease_lapsed`` (before
#: now - margin) for a takeover or an adoption, ``due`` (at or before now) for a retry.
WORKLISTS: Final = {
    "expired_claims": Worklist(
        (frozenset({CallState.CLAIMED}), frozenset({CallState.WAITING})),
        "lease_expires_at",
        strict=True,
        by_key=False,
    ),
    "due_retries": Worklist(
        (frozenset({CallState.RETRY_SCHEDULED}),), "lease_expires_at", by_key=False
    ),
    "unsubmitted_results": Worklist((SAVED,), "next_attempt_at"),
    "waiting_approvals": Worklist(
        (frozenset({CallState.AWAITING_APPROVAL}),), "lease_expires_at", listing=True
    ),
    "approved_calls": Worklist((frozenset({CallState.APPROVED}),), "updated_at"),
}
#: A call in this state with its ``limiter`` set and a lease not lapsed by more than the
#: margin holds one slot of that limiter (flow control).
HOLDS_SLOT: Final = CallState.CLAIMED
#: Owed to the API and without a result yet: what a turn's end cancels.
_UNSAVED: Final = tuple(state for state in CallState if not state.terminal and state not in SAVED)
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
_REQUEST: Final = frozenset({Guard.SAME_REQUEST})
#: A fresh attempt under the usual rules: the claimant owns it for a new lease, holding no
#: slot of any limiter until it is admitted again.
_NEXT_ATTEMPT: Final = {
    "attempt": "+1",
    "owner": ":owner",
    "lease_expires_at": ":lease_expires_at",
    "updated_at": "now",
    "limiter": "null",
    "nonce": "null",
}
#: A fresh attempt whose claimant passed a one-off ``nonce``: its own claim, retried after
#: the answer was lost, finds the call claimed with it (:func:`claimed_with`).
_NEXT_ATTEMPT_WITH_NONCE: Final = {**_NEXT_ATTEMPT, "nonce": ":nonce"}
#: A result saved: owed to the API from now (the sweep's ``next_attempt_at``).
_RESULT: Final = {"result": ":result", "updated_at": "now", "next_attempt_at": "now"}
_RENEWED: Final = {"lease_expires_at": ":lease_expires_at", "updated_at": "now"}
_TOUCHED: Final = {"updated_at": "now"}
_OWNER: Final = _says("owner")
_DETAIL: Final = _says("detail")
_BOTH: Final = _says("owner", "detail")
_FLOW_CONTROL: Final = (
    Transition(
        "schedule_retry",
        "schedule_retry",
        (_from(CallState.CLAIMED, guards=_HELD),),
        CallState.RETRY_SCHEDULED,
        event="retry_scheduled",
        sets=_sets(**_TOUCHED, lease_expires_at=":at", next_attempt_at=":at"),
        says=_BOTH,
    ),
    Transition(
        "retry",
        "claim_call",
        (_from(CallState.RETRY_SCHEDULED, guards=frozenset({Guard.DUE})),),
        CallState.CLAIMED,
        event="retried",
        # The claim's nonce for this row: its own claim, sent again after a lost answer,
        # answers RETRY as the first did (reclaimed), not "in doubt".
        sets=_sets(**{**_NEXT_ATTEMPT, "nonce": ":nonce_retry"}),
        says=_OWNER,
    ),
    Transition(
        "take_slot",
        "admit_call",
        (_from(CallState.CLAIMED, guards=_ADMITTED),),
        Target.SAME,
        sets=_sets(**_RENEWED, limiter=":limiter"),
    ),
    Transition(
        "wait",
        "admit_call",
        (_from(CallState.CLAIMED, guards=_REFUSED),),
        CallState.WAITING,
        event="waiting",
        # next_attempt_at: when it began to wait (a tool's max_wait counts from it).
        sets=_sets(**_RENEWED, limiter=":limiter", next_attempt_at="now"),
        says=_BOTH,
    ),
    Transition(
        "admit",
        "admit_call",
        (_from(CallState.WAITING, guards=_ADMITTED),),
        CallState.CLAIMED,
        event="admitted",
        sets=_sets(**_RENEWED),
        says=_OWNER,
    ),
    Transition(
        "keep_waiting",
        "admit_call",
        (_from(CallState.WAITING, guards=_REFUSED),),
        Target.SAME,
        # Not updated_at: renewing its place in the line is no change to the call (a saved
        # result's unchanged_since and the page's "last change" look past it).
        sets=_sets(lease_expires_at=":lease_expires_at"),
    ),
    Transition(
        "keep_place",
        "keep_places",
        (_from(CallState.WAITING, guards=_HELD),),
        Target.SAME,
        # A waiter behind the head of its process's line keeps its place without asking
        # the limiter (only the head asks): its lease renewed, as keep_waiting does.
        sets=_sets(lease_expires_at=":lease_expires_at"),
    ),
    Transition(
        "adopt",
        "claim_call",
        (_from(CallState.WAITING, guards=frozenset({Guard.LEASE_LAPSED})),),
        CallState.CLAIMED,
        event="adopted",
        sets=_sets(**{**_NEXT_ATTEMPT, "nonce": ":nonce_adopt"}),
        says=_OWNER,
    ),
    # Call budgets: before a call of a tool with ``max_calls_per_session`` first runs, its
    # holder has it counted against its session's budget of the tool. The budget is a
    # limiter of the session and tool whose holders are every call of it ever counted
    # (``counted`` set, in any state, never cleared by a row): counted once, a call stays
    # counted through retries, takeovers and re-runs. Refused, nothing changes: the holder
    # saves the budget's failure instead of running it. Not ``updated_at``: counting is no
    # change a reader of the session could have missed.
    Transition(
        "count",
        "count_call",
        (_from(CallState.CLAIMED, guards=_ADMITTED),),
        Target.SAME,
        event="counted",
        sets=_sets(counted=":counted"),
        says=_DETAIL,
    ),
)

# -- actions nobody here answers ------------------------------------------------------------
#: A pending action nobody here answers is claimed like any call (the claim decides which
#: replica records it) and its holder leaves it (``leave``): ``unanswered`` from then on,
#: shown with its age, its lease no longer renewed. A claim of it answers ``DONE``; a
#: replica that can answer it now (a policy, a hook) takes it up (``take_up``): a fresh
#: attempt, first claimed now. A turn-less action (``environment_connection``, an unknown
#: type) has occurrences rather than a turn: a read that no longer lists it ends the
#: occurrence (``retire``) and its next occurrence takes the record up again.
_UNANSWERED_ROWS: Final = (
    Transition(
        "leave",
        "leave",
        (_from(CallState.CLAIMED, guards=_HELD),),
        CallState.UNANSWERED,
        event="unanswered",
        # reason: why nobody here answers it (what calls and the page show beside it).
        sets=_sets(**_TOUCHED, reason=":detail"),
        says=_BOTH,
    ),
    Transition(
        "take_up",
        "take_up",
        (_from(CallState.UNANSWERED, CallState.RETIRED),),
        CallState.CLAIMED,
        event="taken_up",
        # created_at: first claimed now (a read sent before it never settles it).
        sets=_sets(**_NEXT_ATTEMPT_WITH_NONCE, created_at="now", reason="null"),
        says=_OWNER,
    ),
    Transition(
        "retire",
        "retire",
        # Whatever the occurrence was doing: a hook still running (its holder stops, its
        # renewal refused), a lapsed claim (never in doubt: nothing is owed any more), a
        # retry waiting for its time, an answer saved or submitted, or nobody's.
        (
            _from(
                CallState.CLAIMED,
                CallState.RETRY_SCHEDULED,
                *SAVED,
                CallState.UNANSWERED,
                CallState.SUBMITTED,
                CallState.STALE,
                CallState.CANCELLED,
                guards=frozenset({Guard.KNOWN_BEFORE}),
            ),
        ),
        CallState.RETIRED,
        event="retired",
        sets=_sets(**_TOUCHED),
    ),
)

#: Every transition a store may make, by name.
TRANSITIONS: Final[Mapping[str, Transition]] = {
    t.name: t
    for t in (
        Transition(
            "claim",
            "claim_call",
            (_from(),),
            CallState.CLAIMED,
            event="claimed",
            sets=_sets(
                attempt="1",
                owner=":owner",
                lease_expires_at=":lease_expires_at",
                created_at="now",
                updated_at="now",
                next_attempt_at="now",
                delivery_id=":delivery_id",
            ),
            says=_OWNER,
        ),
        Transition(
            "reclaim",
            "claim_call",
            (_from(CallState.CLAIMED, CallState.WAITING, guards=_OWN_LIVE),),
            Target.SAME,
        ),
        Transition(
            "take_over",
            "claim_call",
            (_from(CallState.CLAIMED, guards=frozenset({Guard.LEASE_LAPSED})),),
            CallState.CLAIMED,
            event="taken_over",
            sets=_sets(**_NEXT_ATTEMPT, delivery_id="?:delivery_id"),
            says=_OWNER,
        ),
        Transition(
            "renew",
            "renew_lease",
            (_from(CallState.CLAIMED, guards=_HELD),),
            Target.SAME,
            sets=_sets(**_RENEWED),
        ),
        Transition(
            "save",
            "save_result",
            # From ``waiting``: a wait that ran past the tool's ``max_wait`` saves a failure.
            (_from(CallState.CLAIMED, CallState.WAITING, guards=_HELD),),
            Target.BY_RESULT,
            event="saved",
            sets=_sets(**_RESULT),
            says=_BOTH,
        ),
        Transition(
            "mark_submitted",
            "mark_submitted",
            (_from(*SAVED),),
            CallState.SUBMITTED,
            event="submitted",
            sets=_sets(**_TOUCHED),
            says=_DETAIL,
        ),
        Transition(
            "submission_failed",
            "submission_failed",
            (_from(*SAVED),),
            Target.SAME,
            event="submit_failed",
            # It changes when the sweep looks again, not the record's age: what another
            # replica saved stays newer than it (mark_stale's unchanged_since).
            sets=_sets(failures="+1", next_attempt_at=":retry_at"),
            says=_DETAIL,
        ),
        Transition(
            "mark_stale",
            "mark_stale",
            # A saved result the API no longer waits for (its submission refused, or the
            # session read since shows the call answered or gone); or an unanswered action
            # a read no longer lists while its turn goes on: answered elsewhere.
            (
                _from(*SAVED, guards=frozenset({Guard.UNCHANGED_SINCE})),
                _from(CallState.UNANSWERED, guards=frozenset({Guard.KNOWN_BEFORE})),
            ),
            CallState.STALE,
            event="stale",
            sets=_sets(**_TOUCHED),
        ),
        Transition(
            "cancel",
            "cancel",
            # Owed no longer before it had a result: whoever runs or waits for it stops (the
            # holder's next renewal or save is refused); a waiter leaves its line.
            (_from(*_UNSAVED, guards=frozenset({Guard.KNOWN_BEFORE})),),
            CallState.CANCELLED,
            event="cancelled",
            sets=_sets(**_TOUCHED, reason=":detail", limiter="null"),
            says=_BOTH,
        ),
        Transition(
            "quarantine",
            "quarantine",
            (_from(CallState.CLAIMED, guards=_HELD),),
            CallState.QUARANTINED,
            event="quarantined",
            sets=_sets(**_TOUCHED, reason=":detail"),
            says=_BOTH,
        ),
        Transition(
            "settle",
            "settle",
            SETTLEABLE,
            Target.BY_RESULT,
            event="settled",
            sets=_sets(**_RESULT, reason="null", nonce=":nonce"),
            says=_DETAIL,
        ),
        Transition(
            "release",
            "release",
            SETTLEABLE,
            CallState.CLAIMED,
            event="released",
            sets=_sets(**_NEXT_ATTEMPT_WITH_NONCE, reason="null"),
            says=_OWNER,
        ),
        Transition("prune", "prune", (_from(*PRUNABLE),), Target.REMOVED),
        Transition(
            "request_approval",
            "request_approval",
            (_from(CallState.CLAIMED, guards=_HELD),),
            CallState.AWAITING_APPROVAL,
            event="approval_requested",
            # While it waits, its lease is the request's expiry (the approval guards).
            sets=_sets(**_TOUCHED, lease_expires_at=":expires_at", approval=":approval"),
            says=_BOTH,
        ),
        Transition(
            "approve",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=_REQUEST | {Guard.APPROVAL_OPEN}),),
            CallState.APPROVED,
            event="approved",
            sets=_sets(**_TOUCHED, approval=":approval"),
            says=_DETAIL,
        ),
        Transition(
            "deny",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=_REQUEST | {Guard.APPROVAL_OPEN}),),
            Target.BY_RESULT,
            event="denied",
            sets=_sets(**_RESULT, approval=":approval"),
            says=_DETAIL,
        ),
        Transition(
            "expire_approval",
            "decide_approval",
            (_from(CallState.AWAITING_APPROVAL, guards=_REQUEST | {Guard.APPROVAL_LAPSED}),),
            Target.BY_RESULT,
            event="approval_expired",
            sets=_sets(**_RESULT, approval=":approval"),
            says=_DETAIL,
        ),
        Transition(
            "run_approved",
            "claim_approved",
            (_from(CallState.APPROVED),),
            CallState.CLAIMED,
            event="claimed_approved",
            sets=_sets(**_NEXT_ATTEMPT_WITH_NONCE),
            says=_OWNER,
        ),
        *_FLOW_CONTROL,
        *_UNANSWERED_ROWS,
    )
}


#: Every argument a guard or an effect may read, by name: ``now`` (the step's time),
#: ``owner``, ``attempt``, ``takeover_before`` (``now`` minus the fencing margin), ``since``
#: (``unchanged_since``, or None), ``admitted`` (the limiter's answer), ``approval_id``,
#: ``lease_expires_at``, ``result`` (a :class:`SavedResult`), ``approval`` (an
#: :class:`ApprovalRequest`), ``detail``, ``limiter``, ``delivery_id``, ``at``, ``retry_at``,
#: ``expires_at``, ``counted`` (a call's place in its budget); a claim adds the call's ``key``
#: and ``tool_name``.
Args = Mapping[str, Any]


#: How a claim decides (:meth:`~agentfn_asgi.store.base.Store.claim_call`): the first of
#: these rows whose guards hold happens, and the claim answers its status. The guards are
#: mutually exclusive, so the order is for the reader; every store follows it (the memory
#: store loops over it, the Lua claim is rendered from it, the SQL claim's upsert and the
#: statements after it carry the same rows). ``reclaim`` (our own claim, retried) changes
#: nothing and answers :func:`reclaimed`. No row: the claim answers by the record's state
#: (``BUSY``, ``SAVED`` or ``DONE``).
CLAIM_ORDER: Final = (
    ("claim", ClaimStatus.CLAIMED),
    ("reclaim", ClaimStatus.CLAIMED),
    ("retry", ClaimStatus.RETRY),
    ("adopt", ClaimStatus.CLAIMED),
    ("take_over", ClaimStatus.IN_DOUBT),
)


def claim_nonces(nonce: str) -> dict[str, str]:
    """The arguments a claim passes for the rows that record which of them it made
    (``retry``, ``adopt``), from its one-off ``nonce``."""
    return {"nonce_retry": f"{nonce}:retry", "nonce_adopt": f"{nonce}:adopt"}


def reclaimed(record: CallRecord, *, nonce: str | None = None) -> ClaimStatus:
    """What our own claim answers when it is sent again (its answer was lost, the store
    retried it): it waits still; or what the first answered, told by the row's ``nonce``
    (``retry``: a fresh attempt; ``adopt``: claimed); else claimed, in doubt when it is not
    the first attempt (a takeover)."""
    if record.state is CallState.WAITING:
        return ClaimStatus.WAITING
    if nonce is not None and record.nonce is not None:
        made = claim_nonces(nonce)
        if record.nonce == made["nonce_retry"]:
            return ClaimStatus.RETRY
        if record.nonce == made["nonce_adopt"]:
            return ClaimStatus.CLAIMED
    return ClaimStatus.CLAIMED if record.attempt == 1 else ClaimStatus.IN_DOUBT


def settled_with(record: CallRecord | None, *, nonce: str) -> bool:
    """Is ``record`` settled with the one-off ``nonce`` of a ``settle`` step (a result saved
    by an operator)? Then that step happened (see :func:`claimed_with`)."""
    return record is not None and record.state in SAVED and record.nonce == nonce


def claimed_with(record: CallRecord | None, *, owner: str, nonce: str) -> bool:
    """Is ``record`` claimed by ``owner`` with the one-off ``nonce`` of a ``run_approved`` or
    ``release`` step? Then that step happened: a retry of it (its answer was lost, the store
    sent it again) is refused by the row's guard, and the caller recognises its own success
    by this instead. Another claim of the same owner (another poll of the same process)
    carries another nonce, so it is never taken for this one."""
    return (
        record is not None
        and record.state is CallState.CLAIMED
        and record.owner == owner
        and record.nonce == nonce
    )


def _guard_holds(guard: Guard, record: CallRecord, args: Args) -> bool:
    if guard is Guard.HOLDER:
        return bool(record.owner == args["owner"] and record.attempt == args["attempt"])
    if guard is Guard.OWN_LIVE_LEASE:
        return record.owner == args["owner"] and bool(record.lease_expires_at >= args["now"])
    if guard is Guard.LEASE_LAPSED:
        return bool(record.lease_expires_at < args["takeover_before"])
    if guard is Guard.APPROVAL_OPEN:
        return bool(args["now"] < record.lease_expires_at)
    if guard is Guard.APPROVAL_LAPSED:
        return bool(args["now"] >= record.lease_expires_at)
    if guard is Guard.DUE:
        return bool(record.lease_expires_at <= args["now"])
    if guard is Guard.ADMITTED:
        return args.get("admitted") is True
    if guard is Guard.REFUSED:
        return args.get("admitted") is False
    if guard is Guard.SAME_REQUEST:
        return record.approval is not None and record.approval.approval_id == args["approval_id"]
    if guard is Guard.KNOWN_BEFORE:
        since = args.get("since")
        return since is not None and bool(record.created_at <= since)
    # UNCHANGED_SINCE is asked for by the caller; without a time it does not apply.
    since = args.get("since")
    return since is None or record.updated_at <= since


def holds(row: Transition, record: CallRecord | None, args: Args) -> bool:
    """Does ``row`` apply to ``record`` (None: no record yet) with the step's ``args``?"""
    for way in row.ways:
        if record is None:
            if not way.states:
                return True
            continue
        if record.state in way.states and all(
            _guard_holds(guard, record, args) for guard in way.guards
        ):
            return True
    return False


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
    approval_id: str | None = None,
) -> bool:
    """:func:`holds` with the arguments spelled out (``margin``: the fencing margin)."""
    args = {
        "now": now,
        "owner": owner,
        "attempt": attempt,
        "takeover_before": now - margin,
        "since": unchanged_since,
        "admitted": admitted,
        "approval_id": approval_id,
    }
    return holds(row, record, args)


def settleable(record: CallRecord | None, *, now: float, margin: float = 0.0) -> bool:
    """May an operator settle or re-run this call? Held for them (``quarantined``), or in
    doubt (:func:`in_doubt`). The stores, the dispatcher's settling and the operator views
    all ask this one rule."""
    return allows(_SETTLE, record, now=now, margin=margin)


def in_doubt(record: CallRecord, *, now: float, margin: float = 0.0) -> bool:
    """Claimed, with a lease that ran out more than ``margin`` seconds before ``now`` and no
    saved result: the handler may have run. Exactly what :data:`SETTLEABLE` takes from
    ``claimed`` and what a claim takes over (``Guard.LEASE_LAPSED``)."""
    return record.state is CallState.CLAIMED and record.lease_expires_at < now - margin


_SETTLE: Final = TRANSITIONS["settle"]


def _value(source: str, current: Any, args: Args) -> Any:
    if source == "now":
        return args["now"]
    if source == "+1":
        return current + 1
    if source == "null":
        return None
    if source.isdigit():
        return int(source)
    if source.startswith("?"):
        return current if current is not None else args.get(source[2:])
    return args.get(source[1:])


def apply(row: Transition, record: CallRecord | None, args: Args) -> CallRecord:
    """``record`` after ``row`` (the caller checked :func:`holds`): the reference every store
    is held to. ``None`` is the call before its first claim (``args`` then carry its ``key``
    and ``tool_name``)."""
    if record is None:
        record = CallRecord(
            key=args["key"],
            tool_name=args["tool_name"],
            state=CallState.CLAIMED,
            attempt=0,
            owner=None,
            lease_expires_at=0.0,
            created_at=0.0,
            updated_at=0.0,
        )
    changes: dict[str, Any] = {
        name: _value(source, getattr(record, name), args) for name, source in row.sets
    }
    result = changes.get("result")
    changes["state"] = resulting_state(
        row, record, success=None if result is None else result.success
    )
    updated = dataclasses.replace(record, **changes)
    if row.event is None:
        return updated
    event = CallEvent(
        args["now"],
        row.event,
        updated.attempt,
        args.get("owner") if "owner" in row.says else None,
        str(args.get("detail") or "") if "detail" in row.says else "",
    )
    return appended(updated, event)


#: A call's history is bounded: every store keeps its first ``HISTORY_HEAD`` events and its
#: last ``HISTORY_TAIL`` ones, and counts those dropped between them
#: (:attr:`CallRecord.history_dropped`). A call refused a thousand times stays cheap to
#: append to and to read, and still shows how it began and how it is going.
HISTORY_HEAD: Final = 10
HISTORY_TAIL: Final = 40


def appended(record: CallRecord, event: CallEvent) -> CallRecord:
    """``record`` with ``event`` appended to its bounded history: past
    ``HISTORY_HEAD + HISTORY_TAIL`` events, the oldest after the head is dropped and counted."""
    history = (*record.history, event)
    if len(history) <= HISTORY_HEAD + HISTORY_TAIL:
        return dataclasses.replace(record, history=history)
    return dataclasses.replace(
        record,
        history=history[:HISTORY_HEAD] + history[HISTORY_HEAD + 1 :],
        history_dropped=record.history_dropped + 1,
    )


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


def admission_bounds(*, concurrency: int | None, rate: float | None, burst: int) -> tuple[int, int]:
    """How many of a limiter's holders and of the live waiters ahead of a call a store
    needs to count for :func:`admits` (and :func:`refusal`): ``(holders, ahead)``. Past
    these counts the answer (and its reason) does not change, so a store counts
    ``min(n, bound)``, reading at most that many entries of an index in the line's order,
    never the whole line: the concurrency for both with a ``concurrency``, else none of
    the holders (a rate does not count them) and ``burst`` waiters ahead (a bucket never
    holds more tokens)."""
    if concurrency is not None:
        return concurrency, concurrency
    return 0, burst if rate is not None else 0


def refusal(
    *,
    concurrency: int | None,
    rate: float | None,
    holders: int,
    ahead: int,
    tokens: float,
) -> str:
    """Why the limiter refuses (:func:`admits` with the same arguments): ``concurrency``
    when its slots are all taken with everyone ahead served, ``rate`` when its bucket is
    short, ``""`` when it admits. The refusal's reason is the ``waiting`` event's detail."""
    if admits(concurrency=concurrency, rate=rate, holders=holders, ahead=ahead, tokens=tokens):
        return ""
    full = concurrency is not None and holders + ahead >= concurrency
    return "concurrency" if full else "rate"


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


def within_budget(*, budget: int, counted: int) -> bool:
    """The rule of a call budget (``Guard.ADMITTED`` of the ``count`` row), the same in
    every store: a call not counted yet is counted while fewer than ``budget`` other calls
    of its session and tool are (``counted``: those, in any state, counted in the same
    transaction). Its place is then ``counted + 1``."""
    return counted < budget


def bucket_tokens(
    tokens: float | None, updated_at: float, *, now: float, rate: float, burst: int
) -> float:
    """A token bucket's tokens at ``now``: ``tokens`` at ``updated_at`` (None: a new bucket,
    full) refilled at ``rate`` per second up to ``burst``. A clock that reads earlier than
    the last update (another replica's, skewed) refills nothing rather than draining."""
    if tokens is None:
        return float(burst)
    return min(float(burst), tokens + max(0.0, now - updated_at) * rate)
