"""The values that the stores and the dispatcher share: calls, their states, saved results.

Calls are keyed by :class:`CallKey` ``(session_id, turn_id, call_id)``. Their states::

    claimed ──▶ succeeded ─┐
       │    └─▶ failed ────┴─▶ submitted
       │                   └─▶ stale        (the API no longer waits for it)
       └─ the turn ended before a result (cancelled, failed) ──▶ cancelled
       └─ lease expired, no saved result ──▶ in doubt (a re-claim returns IN_DOUBT)
    quarantined: an in-doubt side-effect call whose reconcile hook could not decide, held
                 for an operator (with ``hold``) instead of being answered.
    awaiting_approval: a call of a tool declared with ``approval=`` that waits for a person
                 (its :class:`ApprovalRequest` is on the record); nothing has run.
    approved:    a person approved it; any replica claims it and runs it as a fresh attempt.
    waiting:     a call of a tool with ``concurrency=`` or ``rate=`` that waits for a slot of
                 its limiter (:class:`Limit`); nothing has run.
    unanswered:  a pending action nobody here answers (no policy, a ``leave`` decision, an
                 ``environment_connection`` without a hook, an unknown action type): left to
                 whoever answers it, and shown with its age (``created_at``).
    retired:     a turn-less action (an ``environment_connection``, an unknown type) the
                 session no longer lists: its occurrence is over; the next one takes it up.

A call of a tool with ``max_calls_per_session=`` is counted against its session's budget
once, before it first runs (:attr:`CallRecord.counted`).

Also here: :class:`Job` (one call handed to a worker) and :class:`Completion` (a worker's
outcome for it), the two values the app's side (:mod:`agentfn_asgi.jobs`) and the worker's
side (:mod:`agentfn_asgi.worker`) exchange.

This module imports nothing of the package: every other module may depend on it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "LIMITER_KEY_SEPARATOR",
    "ApprovalRequest",
    "CallEvent",
    "CallKey",
    "CallQuery",
    "CallRecord",
    "CallState",
    "ClaimOutcome",
    "ClaimStatus",
    "Completion",
    "DeliveryRecord",
    "Job",
    "Limit",
    "SavedResult",
    "StoreStats",
    "arguments_digest",
    "parse_history",
]


class CallState(enum.StrEnum):
    """Where one call is in its life. Terminal: ``submitted``, ``stale``, ``quarantined``,
    ``cancelled``, ``retired``. ``awaiting_approval``, ``approved`` and ``unanswered`` are
    pending: the API still waits for the call."""

    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUBMITTED = "submitted"
    STALE = "stale"
    QUARANTINED = "quarantined"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    #: Flow control: a plain attempt failed transiently or its handler raised
    #: RetryLater; the next attempt may start at ``next_attempt_at`` (kept in
    #: ``lease_expires_at`` too, the time the guards compare), by whichever replica claims it.
    RETRY_SCHEDULED = "retry_scheduled"
    #: Flow control: waiting for a slot (or a token) of its tool's limiter
    #: (:attr:`CallRecord.limiter`); its holder polls, renewing its lease, and nothing ran.
    WAITING = "waiting"
    #: The API stopped waiting for the call before it had a result (its turn was cancelled
    #: or failed, its session deleted): whatever ran or waited for it was stopped, and
    #: nothing is submitted. :attr:`CallRecord.reason` says why.
    CANCELLED = "cancelled"
    #: A pending action nobody here answers (no ``actions=`` policy, a ``leave`` decision, an
    #: ``environment_connection`` without a hook, an action type this version does not
    #: know): recorded so that it is seen, with its age (``created_at``), and left to
    #: whoever answers it. A policy or hook that answers it later takes it up (``take_up``).
    UNANSWERED = "unanswered"
    #: A turn-less action (``environment_connection``, an unknown type: keyed with turn
    #: ``""``) that a read of its session no longer lists: that occurrence is over. The
    #: action's next occurrence takes the record up again (``take_up``).
    RETIRED = "retired"

    @property
    def terminal(self) -> bool:
        return self in (
            CallState.SUBMITTED,
            CallState.STALE,
            CallState.QUARANTINED,
            CallState.CANCELLED,
            CallState.RETIRED,
        )

    @property
    def has_result(self) -> bool:
        return self in (CallState.SUCCEEDED, CallState.FAILED, CallState.SUBMITTED)


@dataclass(frozen=True, slots=True)
class CallKey:
    """Identifies one pending function call: ``(session_id, turn_id, call_id)``."""

    session_id: str
    turn_id: str
    call_id: str

    def __str__(self) -> str:
        return f"{self.session_id}/{self.turn_id}/{self.call_id}"


@dataclass(frozen=True, slots=True)
class SavedResult:
    """A result saved durably before it is submitted.

    ``event_json`` is the exact ``agent.session.input.tool_result`` event (compact JSON) that
    is, and will on every resubmission be, sent; ``idempotency_key`` goes with it so that a
    retry from any replica is byte-for-byte the same request. ``full_output`` keeps a result
    that was too large to send (the event then carries a failure telling the model so).
    ``error_type`` is a low-cardinality reason for failures (``handler_error``, ``timeout``...).
    ``source`` says how the result was obtained: ``ran``, ``reconciled`` or ``worker``.
    """

    success: bool
    event_json: str
    idempotency_key: str
    error_type: str | None = None
    source: str = "ran"
    full_output: str | None = None


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One step of a call's history, as every store keeps it (never content).

    ``kind``: ``claimed`` (first seen, attempt 1), ``taken_over`` (claimed again after a lease ran
    out: in doubt), ``saved`` (a result; ``detail`` holds its source, error type and how long
    obtaining it took), ``submitted`` (``detail``: the API's answer and the number of requests it
    took), ``submit_failed`` (``detail``: the API's answer), ``stale``, ``cancelled`` (``detail``:
    why), ``quarantined`` (``detail``: the reason), ``settled`` (an operator saved a result),
    ``released`` (an operator asked for a re-run), ``retry_scheduled`` (an attempt asked for
    another; ``detail``: the error type or RetryLater reason), ``retried`` (the scheduled attempt
    claimed at its time). ``owner`` is the replica that did it, when one did.
    """

    at: float
    kind: str
    attempt: int
    owner: str | None = None
    detail: str = ""

    def to_json(self) -> str:
        """Compact JSON of the event (what the stores keep)."""
        data: dict[str, Any] = {"at": self.at, "kind": self.kind, "attempt": self.attempt}
        if self.owner is not None:
            data["owner"] = self.owner
        if self.detail:
            data["detail"] = self.detail
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CallEvent:
        """Rebuild an event from its JSON object (extra keys ignored)."""
        return cls(
            at=float(data.get("at") or 0.0),
            kind=str(data.get("kind") or ""),
            attempt=int(data.get("attempt") or 0),
            owner=None if data.get("owner") is None else str(data["owner"]),
            detail=str(data.get("detail") or ""),
        )


def parse_history(text: str | None) -> tuple[CallEvent, ...]:
    """Events stored as concatenated JSON objects (``{...}{...}``: SQL appends them without
    a separator) or one per line (Redis, memory); unreadable pieces are skipped."""
    if not text:
        return ()
    decoder = json.JSONDecoder()
    events: list[CallEvent] = []
    position, end = 0, len(text)
    while position < end:
        while position < end and text[position] in " \t\r\n":
            position += 1
        if position >= end:
            break
        try:
            data, position = decoder.raw_decode(text, position)
        except ValueError:
            break
        if isinstance(data, dict):
            events.append(CallEvent.from_mapping(data))
    return tuple(events)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """A call's request for a person's approval, kept on its record (and so durable).

    ``digest`` is the SHA-256 of the call's canonical arguments (:func:`arguments_digest`):
    an approval is bound to the exact arguments the person saw. ``expires_at`` is when the
    request lapses into a failure (also the waiting record's ``lease_expires_at``, which the
    state table's approval guards read). Once decided, ``decision`` is ``approved``,
    ``denied`` or ``expired``, with who (``decided_by``), how (``decided_via``: ``cli``,
    ``api``, ``page``, ``link``, ``sweep``), when and why (``reason``, what the model sees on
    a denial). ``asked_at`` is the attempt that asked (nothing ran in it): the runs of the
    call are its attempts after that one.
    """

    approval_id: str
    tool_name: str
    digest: str
    requested_at: float
    expires_at: float
    asked_at: int = 0
    decision: str | None = None
    decided_by: str | None = None
    decided_via: str | None = None
    decided_at: float | None = None
    reason: str | None = None

    @property
    def decided(self) -> bool:
        return self.decision is not None

    def to_json(self) -> str:
        """Compact JSON of every field (what the durable stores keep)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | None) -> ApprovalRequest | None:
        """Rebuild a request from :meth:`to_json` output (None for None or unreadable)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(
                approval_id=str(data["approval_id"]),
                tool_name=str(data["tool_name"]),
                digest=str(data["digest"]),
                requested_at=float(data["requested_at"]),
                expires_at=float(data["expires_at"]),
                asked_at=int(data.get("asked_at", 0)),
                decision=data.get("decision"),
                decided_by=data.get("decided_by"),
                decided_via=data.get("decided_via"),
                decided_at=None if data.get("decided_at") is None else float(data["decided_at"]),
                reason=data.get("reason"),
            )
        except (ValueError, KeyError, TypeError):
            return None


def arguments_digest(arguments: Any) -> str:
    """SHA-256 (hex) of ``arguments`` as canonical JSON: keys sorted, no spaces, UTF-8."""
    canonical = json.dumps(
        arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A snapshot of one call as the store holds it.

    ``reason`` says why a ``quarantined`` call is held for an operator (what the
    reconcile hook answered), or why a ``cancelled`` one was stopped (the turn cancelled,
    failed with its error code, the session deleted; and "may have run" for a side-effect
    tool stopped while it ran); it is None in every other state. ``history`` is filled only
    where it was asked for (:meth:`Store.get_call` with ``history=True``, operator listings).
    ``next_attempt_at`` is when the recovery sweep may next retry a saved result that failed
    to submit (``failures`` times so far). ``history_dropped`` counts the events left out of
    a long history between its first and last events (the bound of
    :mod:`agentfn_asgi.calls.states`).
    ``approval`` is the call's approval request, once one was made (kept after the decision).
    ``nonce`` is the one-off token of the step that started the current attempt or settled
    it, when that step gave one (running an approved call, an operator's re-run or result): a
    step retried after its answer was lost recognises its own success by it.
    """

    key: CallKey
    tool_name: str
    state: CallState
    attempt: int
    owner: str | None
    lease_expires_at: float
    created_at: float
    updated_at: float
    delivery_id: str | None = None
    result: SavedResult | None = None
    reason: str | None = None
    history: tuple[CallEvent, ...] = ()
    next_attempt_at: float = 0.0
    failures: int = 0
    history_dropped: int = 0
    approval: ApprovalRequest | None = None
    #: Flow control: the limiter whose slot the call holds (``claimed``) or waits for
    #: (``waiting``; its ``next_attempt_at`` is then when it began to wait). None otherwise.
    limiter: str | None = None
    nonce: str | None = None
    #: Call budgets (a tool's ``max_calls_per_session``): the call's place among the calls
    #: of its tool and session counted against the budget (1 for the first), set once when
    #: it was counted and kept through retries, takeovers and re-runs. None: never counted.
    counted: int | None = None

    # The two time columns hold one thing per state (schema 1: every guard compares one
    # column); these read them by what they hold, None in a state where they hold another.
    @property
    def lease_until(self) -> float | None:
        """When the holder's lease ends (``claimed``, and ``waiting``, whose holder renews it)."""
        held = self.state in (CallState.CLAIMED, CallState.WAITING)
        return self.lease_expires_at if held else None

    @property
    def expires_at(self) -> float | None:
        """When the approval request lapses (``awaiting_approval``)."""
        waits = self.state is CallState.AWAITING_APPROVAL
        return self.lease_expires_at if waits else None

    @property
    def due_at(self) -> float | None:
        """When the next attempt may start (``retry_scheduled``), or when the recovery sweep
        may submit a saved result again (``succeeded``, ``failed``)."""
        if self.state is CallState.RETRY_SCHEDULED:
            return self.lease_expires_at
        return (
            self.next_attempt_at if self.state in (CallState.SUCCEEDED, CallState.FAILED) else None
        )

    @property
    def waiting_since(self) -> float | None:
        """When the call began to wait for its limiter (``waiting``; a ``max_wait`` counts
        from it)."""
        return self.next_attempt_at if self.state is CallState.WAITING else None


class ClaimStatus(enum.StrEnum):
    """What :meth:`Store.claim_call` decided."""

    CLAIMED = "claimed"  # new call, now ours (attempt 1): run it
    IN_DOUBT = "in_doubt"  # a previous claim expired with no saved result; now ours again
    SAVED = "saved"  # a result is saved but not submitted: (re)submit it, never re-run
    BUSY = "busy"  # another owner holds a live lease: leave it alone
    DONE = "done"  # submitted, stale, quarantined or cancelled: nothing to do
    RETRY = "retry"  # a scheduled retry came due; now ours with the next attempt: run it
    WAITING = "waiting"  # ours, but its limiter has no slot yet: poll Store.admit_call


#: Between a tool's name and a ``concurrency_key``'s value in a limiter's name.
LIMITER_KEY_SEPARATOR = "\x1f"


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """One call's flow-control limits, as the store applies them when it admits the call.

    ``name`` is the limiter (the tool's name, plus :data:`LIMITER_KEY_SEPARATOR` and the
    ``concurrency_key``'s value when the tool has one; a long or unprintable value is
    digested, so the name is small and storable whatever the model sent): calls sharing it
    share its slots and its bucket across every replica on the store. ``concurrency``:
    slots (None: no bound); ``rate``: tokens per second (None: no bound), ``burst``: the
    bucket's size. The margin and the waiter's lease come from the claim.
    """

    name: str
    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    status: ClaimStatus
    record: CallRecord


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """A verified webhook delivery recorded before it was acknowledged.

    ``attempts`` counts the recovery sweep's failed tries to resolve it, ``last_error`` says
    why the last one failed, ``next_attempt_at`` is when it may be tried again (backoff).
    """

    delivery_id: str
    session_id: str
    received_at: float
    resolved: bool = False
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What an operator wants to see (``agentfn-asgi status``).

    ``successes``/``failures``: submitted results by their outcome. ``failing_deliveries``:
    unresolved deliveries the sweep has failed on at least once.
    """

    deliveries: int
    unresolved_deliveries: int
    calls_by_state: dict[str, int] = field(default_factory=dict)
    in_doubt: int = 0
    oldest_pending_at: float | None = None
    successes: int = 0
    failures: int = 0
    failing_deliveries: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CallQuery:
    """Which calls :meth:`Store.list_calls` returns, newest first (by first seen).

    ``state`` is a :class:`CallState` value or ``in_doubt`` (claimed, its lease run out more
    than ``margin`` seconds ago: :func:`agentfn_asgi.calls.states.in_doubt`); ``since`` a Unix
    time (first seen at or after); ``before`` the position after which the page starts: the
    ``(created_at, session_id, turn_id, call_id)`` of the last call of the previous page.
    """

    state: str | None = None
    session_id: str | None = None
    tool_name: str | None = None
    since: float | None = None
    limit: int = 50
    before: tuple[float, str, str, str] | None = None
    margin: float = 0.0


# -- worker jobs ---------------------------------------------------------------------------

_W3C = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One call handed to a worker. JSON-safe: ``Job.from_dict(job.to_dict()) == job``.

    ``arguments`` is the validated argument object in the tool's schema shape (re-parse it
    with ``tool.parse_arguments`` for typed values; ``agentfn_asgi.worker.run_job`` does).
    ``deadline`` is the Unix time after which the call fails and completions are refused.
    ``complete_url`` is set when the app knows its public URL (``public_url=``).
    ``traceparent`` / ``tracestate`` (W3C) let the worker's span join the call's trace
    (:meth:`trace_context`). Pass ``idempotency_key`` to downstream APIs.
    """

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    idempotency_key: str
    completion_token: str
    deadline: float
    attempt: int = 1
    complete_url: str | None = None
    traceparent: str = ""
    tracestate: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of JSON values (give it to Celery, RQ, arq, json.dumps...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """Compact JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """Rebuild a job; ValueError naming the field when something is missing or wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("a job must be a JSON object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name in _OPTIONAL_FIELDS:
                    continue
                raise ValueError(f"job field {f.name!r} is missing")
            value = data[f.name]
            expected = _FIELD_TYPES[f.name]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ValueError(f"job field {f.name!r} has the wrong type")
            values[f.name] = value
        values["deadline"] = float(values["deadline"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str | bytes) -> Job:
        """Rebuild a job from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    def remaining(self, *, clock: Callable[[], float] = time.time) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - clock())

    def trace_context(self) -> otel_context.Context:
        """An OpenTelemetry context whose parent is the call's span, for the worker's span:
        ``tracer.start_as_current_span("work", context=job.trace_context())``."""
        carrier = {"traceparent": self.traceparent}
        if self.tracestate:
            carrier["tracestate"] = self.tracestate
        return _W3C.extract(carrier)


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "session_id": str,
    "turn_id": str,
    "call_id": str,
    "tool_name": str,
    "arguments": dict,
    "idempotency_key": str,
    "completion_token": str,
    "deadline": (int, float),
    "attempt": int,
    "complete_url": (str, type(None)),
    "traceparent": str,
    "tracestate": str,
}
_OPTIONAL_FIELDS = frozenset({"attempt", "complete_url", "traceparent", "tracestate"})


@dataclass(frozen=True, slots=True)
class Completion:
    """A worker's outcome for one job: ``output`` (any JSON value, encoded like a handler's
    return value) when ``success``, else ``error`` (shown to the model as written)."""

    success: bool
    output: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The endpoint's JSON body."""
        if self.success:
            return {"success": True, "output": self.output}
        return {"success": False, "error": self.error or ""}
