"""What an operator sees and does: an overview, the calls, one call's history, settling one.

The CLI (``agentfn-asgi status``, ``calls``, ``deliveries``) and the operator page
(:mod:`agentfn_asgi.admin`) both read through :class:`OperatorView`, so a terminal and a
browser always show the same facts. Content (a call's arguments and output) is only read
when asked for (``content=True``): it may hold personal data.

Display states of a call (``CallSummary.state``) are the store's states plus ``in_doubt``
(claimed, but its lease expired with no saved result: the handler may or may not have run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "CallDetail",
    "CallEventView",
    "CallFilter",
    "CallPage",
    "CallSummary",
    "DeliveryView",
    "OperatorView",
    "Overview",
    "SettleOutcome",
]

#: Display states, in the order an operator reads them.
DisplayState = Literal[
    "claimed", "in_doubt", "succeeded", "failed", "submitted", "stale", "quarantined"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFilter:
    """Which calls to list, newest first. ``since`` is a Unix time (calls first seen at or
    after it); ``cursor`` is the ``next_cursor`` of the previous page (opaque)."""

    state: str | None = None
    session_id: str | None = None
    tool_name: str | None = None
    since: float | None = None
    limit: int = 50
    cursor: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSummary:
    """One line of a call list."""

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    state: str
    attempt: int
    created_at: float
    updated_at: float
    error_type: str | None = None
    reason: str | None = None  # why it is quarantined (held for an operator), if it is


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEventView:
    """One step of a call's history (never content): ``kind`` is a short word (``seen``,
    ``claimed``, ``outcome``, ``saved``, ``submit_failed``, ``submitted``, ``stale``,
    ``quarantined``, ``settled``...), ``detail`` a short non-content text (an error type,
    an API status, a reason)."""

    at: float
    kind: str
    attempt: int
    owner: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDetail:
    """One call with its history; ``arguments``/``output`` only when content was asked for."""

    summary: CallSummary
    history: tuple[CallEventView, ...] = ()
    arguments: str | None = None
    output: str | None = None
    settleable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CallPage:
    """A page of calls, newest first; ``next_cursor`` fetches the next one (None: last)."""

    calls: tuple[CallSummary, ...]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryView:
    """A recorded webhook delivery; ``attempts``/``last_error`` are the recovery sweep's."""

    delivery_id: str
    session_id: str
    received_at: float
    resolved: bool
    attempts: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Overview:
    """Health and counts: what ``status`` prints and the page's first screen shows."""

    store: str  # the resolved store location, password hidden
    healthy: bool
    deliveries: int
    unresolved_deliveries: int
    calls_by_state: Mapping[str, int] = field(default_factory=dict)
    successes: int = 0
    failures: int = 0
    needs_attention: tuple[CallSummary, ...] = ()  # in doubt and quarantined, by id
    failing_deliveries: tuple[DeliveryView, ...] = ()  # the sweep keeps failing on these
    oldest_pending_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleOutcome:
    """What settling did: ``submitted``/``saved`` (a result stands), ``running`` (re-run
    started), or ``refused`` (``message`` says why: running, submitted, stale...)."""

    status: Literal["submitted", "saved", "running", "refused"]
    message: str


class OperatorView(Protocol):
    """What the CLI and the operator page read and do. Raises ``LookupError`` for an unknown
    call, ``ValueError`` when ``call_id`` alone names calls of several sessions."""

    async def overview(self) -> Overview: ...

    async def calls(self, query: CallFilter) -> CallPage: ...

    async def call(
        self, call_id: str, *, session_id: str | None = None, content: bool = False
    ) -> CallDetail: ...

    async def deliveries(
        self, *, unresolved: bool = False, limit: int = 50
    ) -> list[DeliveryView]: ...

    async def settle(
        self,
        call_id: str,
        *,
        session_id: str | None = None,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> SettleOutcome: ...
