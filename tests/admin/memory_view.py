"""TEST DOUBLE: an in-memory :class:`~agentfn_asgi.operator.OperatorView` for the page's tests.

It is not the real view (store history + settling through the dispatcher lives in the
package); it keeps calls and deliveries in dicts and follows the protocol's documented
rules: newest first with an opaque cursor, content only when asked, ``LookupError`` for an
unknown call, ``ValueError`` for an id shared by several sessions, and settling only held
(quarantined) and in-doubt calls. :func:`seed` fills it with the situations the page shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.operator import (
    CallDetail,
    CallEventView,
    CallFilter,
    CallPage,
    CallSummary,
    DeliveryView,
    Overview,
    SettleOutcome,
)

SETTLEABLE = frozenset({"quarantined", "in_doubt"})
HOSTILE_TOOL = "<img src=x onerror=alert(1)>"


@dataclass
class _Entry:
    summary: CallSummary
    history: list[CallEventView] = field(default_factory=list)
    arguments: str = "{}"
    output: str | None = None


# A seeded state's outcome; ``submitted`` is succeeded or failed by its error type.
_OUTCOME_OF_STATE = {
    "claimed": "running",
    "in_doubt": "in_doubt",
    "succeeded": "submitting",
    "failed": "submitting",
    "stale": "stale",
    "quarantined": "held",
    "waiting": "waiting",
}


class MemoryOperatorView:
    """Calls and deliveries in memory; ``down = True`` makes every method raise
    :class:`StoreUnavailableError` (the store outage the page must show as a 503)."""

    def __init__(self, *, store: str = "memory://") -> None:
        self.store = store
        self.entries: dict[tuple[str, str], _Entry] = {}
        self.delivery_list: list[DeliveryView] = []
        self.down = False
        self.settle_calls: list[dict[str, Any]] = []
        self.revoked_logins: dict[str, float] = {}

    # -- filling it ------------------------------------------------------------------------

    def add_call(
        self,
        *,
        session_id: str,
        call_id: str,
        tool_name: str,
        state: str,
        created_at: float,
        turn_id: str = "turn_1",
        attempt: int = 1,
        error_type: str | None = None,
        reason: str | None = None,
        arguments: str = "{}",
        output: str | None = None,
        history: list[CallEventView] | None = None,
    ) -> CallSummary:
        """Record one call; its ``updated_at`` is its last history event (or creation)."""
        events = history or [CallEventView(at=created_at, kind="seen", attempt=0)]
        summary = CallSummary(
            session_id=session_id,
            turn_id=turn_id,
            call_id=call_id,
            tool_name=tool_name,
            state=state,
            attempt=attempt,
            created_at=created_at,
            updated_at=events[-1].at,
            error_type=error_type,
            reason=reason,
            outcome=_OUTCOME_OF_STATE.get(state, "")
            or ("failed" if error_type is not None else "succeeded"),
        )
        self.entries[(session_id, call_id)] = _Entry(summary, events, arguments, output)
        return summary

    def add_delivery(self, delivery: DeliveryView) -> None:
        """Record one delivery."""
        self.delivery_list.append(delivery)

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailableError("the test double is down")

    # -- OperatorView ----------------------------------------------------------------------

    async def overview(self) -> Overview:
        """Counts computed from the entries, like the real view's."""
        self._check()
        summaries = [e.summary for e in self.entries.values()]
        by_state: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        for s in summaries:
            by_state[s.state] = by_state.get(s.state, 0) + 1
            outcomes[s.outcome] = outcomes.get(s.outcome, 0) + 1
        pending = [s.created_at for s in summaries if s.state in {"claimed", "in_doubt"}]
        return Overview(
            store=self.store,
            healthy=True,
            deliveries=len(self.delivery_list),
            unresolved_deliveries=sum(not d.resolved for d in self.delivery_list),
            calls_by_state=by_state,
            successes=outcomes.get("succeeded", 0),
            failures=outcomes.get("failed", 0),
            outcomes=outcomes,
            needs_attention=tuple(
                sorted(
                    (s for s in summaries if s.state in SETTLEABLE),
                    key=lambda s: -s.created_at,
                )
            ),
            failing_deliveries=tuple(d for d in self.delivery_list if d.last_error),
            oldest_pending_at=min(pending, default=None),
        )

    async def calls(self, query: CallFilter) -> CallPage:
        """Filtered, newest first; the cursor is the offset (refused when not one)."""
        self._check()
        matching = sorted(
            (
                e.summary
                for e in self.entries.values()
                if (query.state is None or e.summary.state == query.state)
                and (query.outcome is None or e.summary.outcome == query.outcome)
                and (query.session_id is None or e.summary.session_id == query.session_id)
                and (query.tool_name is None or e.summary.tool_name == query.tool_name)
                and (query.since is None or e.summary.created_at >= query.since)
            ),
            key=lambda s: (-s.created_at, s.session_id, s.call_id),
        )
        start = 0
        if query.cursor is not None:
            if not query.cursor.isdigit():
                raise ValueError(f"invalid cursor {query.cursor!r}")
            start = int(query.cursor)
        end = start + query.limit
        return CallPage(
            calls=tuple(matching[start:end]),
            next_cursor=str(end) if end < len(matching) else None,
        )

    def _find(self, call_id: str, session_id: str | None) -> _Entry:
        found = [
            e
            for (session, call), e in self.entries.items()
            if call == call_id and (session_id is None or session == session_id)
        ]
        if not found:
            raise LookupError(f"no call {call_id!r}")
        if len(found) > 1:
            raise ValueError(f"call id {call_id!r} is used by several sessions; give the session")
        return found[0]

    async def call(
        self, call_id: str, *, session_id: str | None = None, content: bool = False
    ) -> CallDetail:
        """One call with its history; content only when ``content`` is true."""
        self._check()
        entry = self._find(call_id, session_id)
        return CallDetail(
            summary=entry.summary,
            history=tuple(entry.history),
            arguments=entry.arguments if content else None,
            output=entry.output if content else None,
            settleable=entry.summary.state in SETTLEABLE,
        )

    async def deliveries(self, *, unresolved: bool = False, limit: int = 50) -> list[DeliveryView]:
        """Deliveries newest first, optionally only the unresolved ones."""
        self._check()
        listed = [d for d in self.delivery_list if not (unresolved and d.resolved)]
        return sorted(listed, key=lambda d: -d.received_at)[:limit]

    async def settle(
        self,
        call_id: str,
        *,
        session_id: str | None = None,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> SettleOutcome:
        """Held and in-doubt calls only: a result is saved and submitted at once; a re-run
        claims the next attempt. Other states are refused with the reason."""
        self._check()
        entry = self._find(call_id, session_id)
        self.settle_calls.append(
            {
                "call_id": call_id,
                "session_id": session_id,
                "output": output,
                "error": error,
                "rerun": rerun,
            }
        )
        summary = entry.summary
        if summary.state not in SETTLEABLE:
            return SettleOutcome(
                status="refused", message=f"call {call_id} is {summary.state}; nothing to settle"
            )
        at = summary.updated_at + 1
        if rerun:
            entry.history += [
                CallEventView(at=at, kind="settled", attempt=summary.attempt, detail="rerun"),
                CallEventView(at=at, kind="claimed", attempt=summary.attempt + 1, owner="operator"),
            ]
            entry.summary = replace(
                summary,
                state="claimed",
                attempt=summary.attempt + 1,
                updated_at=at,
                reason=None,
                outcome="running",
            )
            return SettleOutcome(status="running", message="re-run started")
        how = "error" if error is not None else "output"
        entry.output = error if error is not None else _text(output)
        entry.history += [
            CallEventView(
                at=at, kind="settled", attempt=summary.attempt, detail=f"by operator: {how}"
            ),
            CallEventView(at=at, kind="saved", attempt=summary.attempt),
            CallEventView(at=at, kind="submitted", attempt=summary.attempt, detail="200"),
        ]
        entry.summary = replace(
            summary,
            state="submitted",
            updated_at=at,
            reason=None,
            error_type="OperatorError" if error is not None else None,
            outcome="failed" if error is not None else "succeeded",
        )
        return SettleOutcome(status="submitted", message="saved and submitted")

    async def revoke_login(self, login_id: str, *, expires_at: float) -> None:
        """Remember an ended login (the real view keeps it in the store)."""
        self._check()
        self.revoked_logins[login_id] = expires_at

    async def login_revoked(self, login_id: str) -> bool:
        """Whether the login was ended (expiry is the cookie's own business here)."""
        self._check()
        return login_id in self.revoked_logins


def _text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, separators=(",", ":"))


def _history(start: float, *steps: tuple[float, str, int, str | None, str]) -> list[CallEventView]:
    return [
        CallEventView(at=start + offset, kind=kind, attempt=attempt, owner=owner, detail=detail)
        for offset, kind, attempt, owner, detail in steps
    ]


@dataclass(frozen=True, slots=True)
class Seeded:
    """The calls :func:`seed` created that the tests reach for by name."""

    held: CallSummary
    in_doubt: CallSummary
    hostile: CallSummary
    running: CallSummary


def seed(view: MemoryOperatorView, now: float) -> Seeded:
    """Fill ``view`` with what an operator meets: a held refund, a call in doubt, a call
    whose tool name is markup, a running call, failures, and 64 older finished calls
    spread over four days (enough for two pages)."""
    owner = "replica-7f3a"
    held = view.add_call(
        session_id="sess_8d1f",
        turn_id="turn_2",
        call_id="call_refund_91",
        tool_name="create_refund",
        state="quarantined",
        created_at=now - 540,
        attempt=2,
        reason="reconcile could not tell whether the refund ran; held for an operator",
        arguments='{"order_id":"ord_1042","amount_cents":1500}',
        history=_history(
            now - 540,
            (0, "seen", 0, None, ""),
            (0.02, "claimed", 1, owner, ""),
            (31, "claim_expired", 1, owner, "no saved result"),
            (40, "claimed", 2, "replica-2c9e", ""),
            (40.1, "reconciled", 2, "replica-2c9e", "unknown"),
            (40.1, "quarantined", 2, "replica-2c9e", "in_doubt=hold"),
        ),
    )
    in_doubt = view.add_call(
        session_id="sess_3b77",
        call_id="call_refund_17",
        tool_name="create_refund",
        state="in_doubt",
        created_at=now - 95,
        reason="lease expired with no saved result",
        arguments='{"order_id":"ord_2210","amount_cents":990}',
        history=_history(now - 95, (0, "seen", 0, None, ""), (0.01, "claimed", 1, owner, "")),
    )
    hostile = view.add_call(
        session_id="sess_e0c4",
        call_id="call_x_1",
        tool_name=HOSTILE_TOOL,
        state="submitted",
        created_at=now - 300,
        error_type="UnknownTool",
        arguments='{"q":"<script>alert(2)</script>"}',
        output='No handler is registered for "<img src=x onerror=alert(1)>"',
        history=_history(
            now - 300,
            (0, "seen", 0, None, ""),
            (0.01, "claimed", 1, owner, ""),
            (0.02, "outcome", 1, owner, "UnknownTool"),
            (0.03, "saved", 1, owner, ""),
            (0.2, "submitted", 1, owner, "200"),
        ),
    )
    running = view.add_call(
        session_id="sess_8d1f",
        turn_id="turn_3",
        call_id="call_echo_4",
        tool_name="slow_echo",
        state="claimed",
        created_at=now - 4,
        arguments='{"text":"hello","delay_ms":9000}',
        history=_history(now - 4, (0, "seen", 0, None, ""), (0.01, "claimed", 1, owner, "")),
    )
    view.add_call(
        session_id="sess_3b77",
        call_id="call_cust_2",
        tool_name="get_customer",
        state="submitted",
        created_at=now - 100,
        error_type="ToolError",
        arguments='{"customer_id":"999"}',
        output="customer 999 does not exist",
        history=_history(
            now - 100,
            (0, "seen", 0, None, ""),
            (0.01, "claimed", 1, owner, ""),
            (0.05, "outcome", 1, owner, "ToolError"),
            (0.06, "saved", 1, owner, ""),
            (0.3, "submit_failed", 1, owner, "503 (retrying)"),
            (1.3, "submitted", 1, owner, "200"),
        ),
    )
    view.add_call(
        session_id="sess_51aa",
        call_id="call_old_stale",
        tool_name="slow_echo",
        state="stale",
        created_at=now - 7200,
        history=_history(
            now - 7200,
            (0, "seen", 0, None, ""),
            (0.01, "claimed", 1, owner, ""),
            (2, "saved", 1, owner, ""),
            (2.1, "stale", 1, owner, "Unknown pending tool call"),
        ),
    )
    tools = ("get_customer", "slow_echo", "create_refund")
    for i in range(64):
        created = now - 1800 - i * 5400  # every 90 minutes, back about four days
        view.add_call(
            session_id=f"sess_{1000 + i // 3}",
            call_id=f"call_{i:03d}",
            tool_name=tools[i % 3],
            state="submitted",
            created_at=created,
            arguments='{"customer_id":"123"}' if i % 3 == 0 else "{}",
            output='{"found":true}',
            history=_history(
                created,
                (0, "seen", 0, None, ""),
                (0.01, "claimed", 1, owner, ""),
                (0.04, "saved", 1, owner, ""),
                (0.1, "submitted", 1, owner, "200"),
            ),
        )
    view.add_delivery(
        DeliveryView(
            delivery_id="msg_2Yb0cQ",
            session_id="sess_3b77",
            received_at=now - 96,
            resolved=False,
            attempts=4,
            next_attempt_at=now + 20,
            last_error="APIConnectionError",
        )
    )
    view.add_delivery(
        DeliveryView(
            delivery_id="msg_7Kd1aZ", session_id="sess_8d1f", received_at=now - 5, resolved=False
        )
    )
    for i in range(6):
        view.add_delivery(
            DeliveryView(
                delivery_id=f"msg_{i:04d}",
                session_id=f"sess_{1000 + i}",
                received_at=now - 1800 - i * 5400,
                resolved=True,
                attempts=1,
            )
        )
    return Seeded(held=held, in_doubt=in_doubt, hostile=hostile, running=running)
