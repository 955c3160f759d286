"""Durable human approval: deciding a waiting call, and running it once approved.

A call of a tool declared with ``approval=`` is held in ``awaiting_approval`` by the replica
that claimed it (:meth:`Executor._request_approval`), with its request on the record. From
there (the rows of :mod:`agentfn_asgi.calls.states`):

- :meth:`Approvals.decide` takes a person's decision once, in the store, from any process
  (the app, the CLI, the operator page). Deny saves a failure carrying the reason and
  submits it at once (the sweep retries a failed submission, as for any saved result).
  Approve only marks the call ``approved``: it runs where the tools are.
- Every replica polls the store every ``approval_poll_interval`` (1 s) with two indexed
  queries (:meth:`Approvals.poll`): approved calls, which one replica claims (the store's
  ``run_approved`` row lets one claim win) and runs as a fresh attempt under the usual rules
  (fencing, lease, side effects, the stable idempotency key); and expired requests, which
  become a failure saying nobody approved in time. A decision taken in this process wakes
  the poll at once. So an approval starts its call within about a second wherever it was
  taken, and a replica dying while a call waits loses nothing: the call is in the store.
- A session that stops waiting cancels the call (the ``cancel`` row of :mod:`.cancelling`): its
  request leaves the list, an approval then finds nothing to decide, or the approved call is not
  run. So does a session deleted meanwhile (404 after the ``not_found_retries`` pauses). A session
  that cannot be read for another reason (an outage, a 403) is tried again after a pause that
  doubles up to a minute (:data:`REREAD`), per call and per replica, so a pile of such calls neither
  makes every poll read them all nor hides the calls approved after them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from ..actions import action_fields, action_kind
from ..backoff import Backoff
from ..calls.records import ApprovalRequest, CallKey, CallRecord, CallState, SavedResult
from ..calls.states import claimed_with
from ..client import AgentsClient
from ..errors import (
    APIError,
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ConfigurationError,
    NotFoundError,
    StoreError,
)
from ..messages import APPROVAL_DENIED_MESSAGE, APPROVAL_EXPIRED_MESSAGE
from ..results import failure_result
from ..tools import FunctionTools
from ..wire import FunctionCallAction
from .actions import saved_answer
from .alarms import call_fields
from .execution import Executor
from .submission import read_session

__all__ = ["ApprovalView", "Approvals", "approval_view"]

logger = logging.getLogger("agentfn_asgi.dispatch.approvals")

#: Tries of ``on_approval_request`` for one request, and the pauses between them: about
#: eight minutes in all.
NOTIFY_TRIES = 10
NOTIFY_BACKOFF = Backoff(base=1.0, cap=512.0)
#: Requests expired or approved calls claimed per poll.
POLL_BATCH = 100
#: An approved call whose session could not be read waits this long before the next read.
REREAD = Backoff(base=2.0, cap=60.0)
#: Why an approved call was cancelled instead of run.
_GONE: Final = "the session no longer waits for it; withdrawn after its approval, before it ran"
_GONE_DELETED: Final = "the session was deleted; withdrawn after its approval, before it ran"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalView:
    """One approval request as hosts, the CLI and the page see it (no arguments: those are
    read from the live session when a person is about to decide). ``links`` holds the
    signed links to decide it, when the app can make them."""

    approval_id: str
    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    digest: str
    #: ``function``, ``mcp`` or ``computer_use``: what the person approves (``call_id`` is
    #: then the request's ``request_id``).
    kind: str = "function"
    #: An MCP request's server label and tool name (None when it names none).
    server_label: str | None = None
    name: str | None = None
    #: A computer-use request's origin (or a sign-in's credential origin).
    origin: str | None = None
    requested_at: float
    expires_at: float
    state: str
    decision: str | None = None
    decided_by: str | None = None
    decided_via: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    links: dict[str, str] = field(default_factory=dict)


def approval_view(record: CallRecord, links: dict[str, str] | None = None) -> ApprovalView:
    """The :class:`ApprovalView` of a call that has an approval request."""
    request = record.approval
    assert request is not None, "the call has no approval request"
    described = action_fields(record.tool_name)
    return ApprovalView(
        approval_id=request.approval_id,
        session_id=record.key.session_id,
        turn_id=record.key.turn_id,
        call_id=record.key.call_id,
        tool_name=record.tool_name,
        digest=request.digest,
        kind=described["kind"] or "function",
        server_label=described.get("server_label"),
        name=described.get("name"),
        origin=described.get("origin"),
        requested_at=request.requested_at,
        expires_at=request.expires_at,
        state=record.state.value,
        decision=request.decision,
        decided_by=request.decided_by,
        decided_via=request.decided_via,
        decided_at=request.decided_at,
        reason=request.reason,
        links=dict(links or {}),
    )


@dataclass(slots=True, kw_only=True, eq=False)
class Approvals:
    """Decides approval requests and runs approved calls for one dispatcher (the store,
    settings, owner, clock and telemetry are its executor's)."""

    client: AgentsClient
    executor: Executor
    tools: FunctionTools
    track: Callable[[CallKey, Coroutine[Any, Any, None]], None]
    busy: Callable[[CallKey], bool]
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
    #: The host's ``on_approval_request``: told of each request made here, once.
    notify: Callable[[ApprovalView], Awaitable[Any]] | None = None
    #: Builds the links of a request (the operator page's signed link), when the page
    #: knows its public URL (``AdminApp(public_url=...)``).
    links: Callable[[ApprovalView], dict[str, str]] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _count_due: float = field(default=0.0, init=False)
    # Approved calls whose session could not be read: (next read due, last pause).
    _unreadable: dict[CallKey, tuple[float, int]] = field(default_factory=dict, init=False)
    # Requests made here whose write went unanswered: read again by the next poll.
    _unconfirmed: dict[CallKey, ApprovalRequest] = field(default_factory=dict, init=False)
    # Approved calls whose claim went unanswered: (its nonce, when sent, the action).
    _unanswered_claims: dict[CallKey, tuple[str, float, FunctionCallAction]] = field(
        default_factory=dict, init=False
    )

    def __post_init__(self) -> None:
        self.executor.on_approval_request = self._requested
        self.executor.on_approval_unconfirmed = self._unconfirmed.__setitem__

    # -- deciding ----------------------------------------------------------------------------
    async def decide(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str,
        via: str,
        reason: str | None = None,
        digest: str | None = None,
    ) -> ApprovalView:
        """Take a person's decision on ``approval_id``, once; returns the decided request.

        Raises :class:`~agentfn_asgi.errors.ApprovalNotFoundError` (no such request here),
        :class:`~agentfn_asgi.errors.ApprovalExpiredError` (it expired first: the call
        fails, saying so) or :class:`~agentfn_asgi.errors.ApprovalDecidedError` (decided
        already, or the session stopped waiting). ``digest``, when given (a signed link),
        must be the request's: the decision is bound to the arguments the person saw.
        """
        store = self.executor.store
        record, request = await self._waiting(approval_id, digest)
        if self.executor.clock() >= request.expires_at:
            await self._expire(record)
            raise ApprovalExpiredError(
                f"approval request {approval_id} expired before this decision; the call "
                "failed, saying nobody approved it in time",
                approval_id=approval_id,
                decision="expired",
            )
        decision = "approved" if approve else "denied"
        result = None
        if not approve:
            text = reason.strip() if reason and reason.strip() else "no reason was given."
            message = APPROVAL_DENIED_MESSAGE.format(name=record.tool_name, reason=text)
            result = _refusal(record, message, "approval_denied")
        decided = await store.decide_approval(
            record.key,
            approval_id=approval_id,
            decision=decision,
            by=by,
            via=via,
            reason=reason,
            result=result,
        )
        if decided is None:  # another decision, the expiry or the session got there first
            latest = await store.find_approval(approval_id)
            if latest is not None:
                self._refuse_if_decided(latest)
            raise ApprovalDecidedError(
                f"approval request {approval_id} changed meanwhile",
                approval_id=approval_id,
                decision=None,
            )
        self._decided(decided)
        if approve:
            self._wake.set()  # run it now if this process runs the dispatcher's poll
        else:  # a failed submission is the sweep's to retry
            await self.executor.resubmit(decided)
        return approval_view(decided)

    async def _waiting(
        self, approval_id: str, digest: str | None = None
    ) -> tuple[CallRecord, ApprovalRequest]:
        """The call waiting on ``approval_id``, and its request; raises as :meth:`decide`
        does when there is none, it is for other arguments than ``digest``, or it was
        decided."""
        record = await self.executor.store.find_approval(approval_id)
        if record is None or record.approval is None:
            raise ApprovalNotFoundError(
                f"no approval request {approval_id} in this store", approval_id=approval_id
            )
        if digest is not None and digest != record.approval.digest:
            raise ApprovalNotFoundError(
                f"approval request {approval_id} is for other arguments",
                approval_id=approval_id,
            )
        self._refuse_if_decided(record)
        return record, record.approval

    def _refuse_if_decided(self, record: CallRecord) -> None:
        request = record.approval
        assert request is not None
        if request.decision is not None:
            who = f" by {request.decided_by}" if request.decided_by else ""
            error = ApprovalExpiredError if request.decision == "expired" else ApprovalDecidedError
            raise error(
                f"approval request {request.approval_id} was already decided: "
                f"{request.decision}{who}",
                approval_id=request.approval_id,
                decision=request.decision,
            )
        if record.state is not CallState.AWAITING_APPROVAL:
            raise ApprovalDecidedError(
                f"approval request {request.approval_id} no longer waits: the call is "
                f"{record.state.value} (the session stopped waiting for it)",
                approval_id=request.approval_id,
                decision=None,
            )

    def _decided(self, record: CallRecord) -> None:
        """The log line and the histogram of one decision."""
        request = record.approval
        assert request is not None and request.decision is not None
        waited = (request.decided_at or self.executor.clock()) - request.requested_at
        self.executor.telemetry.record_approval_decision(request.decision, waited)
        fields = call_fields(
            record.key,
            record.tool_name,
            approval_id=request.approval_id,
            approval=request.decision,
            decided_by=request.decided_by,
            decided_via=request.decided_via,
            reason=request.reason,
            waited_s=round(waited, 3),
        )
        logger.info(
            "approval %s: tool=%s session=%s call=%s approval_id=%s by=%s via=%s waited=%.0fs%s",
            request.decision,
            record.tool_name,
            record.key.session_id,
            record.key.call_id,
            request.approval_id,
            request.decided_by or "-",
            request.decided_via or "-",
            waited,
            f" reason={request.reason!r}" if request.reason else "",
            extra={"agentfn": fields},
        )

    async def _expire(self, record: CallRecord) -> CallRecord | None:
        """The request lapsed: fail the call, saying nobody approved it in time."""
        request = record.approval
        assert request is not None
        message = APPROVAL_EXPIRED_MESSAGE.format(name=record.tool_name)
        result = _refusal(record, message, "approval_expired")
        decided = await self.executor.store.decide_approval(
            record.key,
            approval_id=request.approval_id,
            decision="expired",
            by="nobody",
            via="expiry",
            reason=None,
            result=result,
        )
        if decided is not None:
            self._decided(decided)
            await self.executor.resubmit(decided)
        return decided

    # -- the poll ----------------------------------------------------------------------------
    async def poll(self) -> None:
        """One pass: expire lapsed requests, claim and run approved calls, count waiting."""
        store = self.executor.store
        await self._confirm_requests()
        for record in await store.waiting_approvals(
            expired_by=self.executor.clock(), limit=POLL_BATCH
        ):
            if not self.busy(record.key):
                await self._expire(record)
        now = time.monotonic()
        resting = {key for key, (due, _) in self._unreadable.items() if due > now}
        # Those resting until their next read are skipped without using up the batch.
        limit = POLL_BATCH + len(resting)
        approved = await store.approved_calls(limit=limit)
        if len(approved) < limit:  # all of them: forget the calls no longer approved
            listed = {record.key for record in approved}
            self._unreadable = {k: v for k, v in self._unreadable.items() if k in listed}
        for record in approved:
            if not self.busy(record.key) and record.key not in resting:
                await self._run_approved(record)
        if time.monotonic() >= self._count_due:
            # The gauge needs no second's precision: count at the sweep's pace.
            self._count_due = time.monotonic() + self.executor.settings.recovery_interval
            self.executor.telemetry.set_approvals_waiting(await store.count_waiting_approvals())

    async def _confirm_requests(self) -> None:
        """Tell of the requests whose write went unanswered, now that the store shows
        they were made, and run the approved calls whose claim went unanswered, now that the
        store shows it is ours (a store still failing keeps them for the next poll)."""
        for key, (nonce, sent, action) in list(self._unanswered_claims.items()):
            record = await self.executor.store.get_call(key)
            del self._unanswered_claims[key]
            if claimed_with(record, owner=self.executor.owner, nonce=nonce):
                assert record is not None
                tool = self.tools.get(action.name)
                self.track(key, self.executor.rerun(record, action, tool, claimed_at=sent))
        for key, request in list(self._unconfirmed.items()):
            record = await self.executor.store.get_call(key)
            del self._unconfirmed[key]
            if (
                record is not None
                and record.state is CallState.AWAITING_APPROVAL
                and record.approval == request
            ):
                self._requested(record)

    async def _run_approved(self, record: CallRecord) -> None:
        """Read the live session for the call's arguments, claim it (one replica wins) and
        run it as a fresh attempt; a session that no longer waits makes it stale."""
        key = record.key
        # What another replica saved after this read (less the clock margin) stands.
        read_at = self.executor.clock() - self.executor.settings.fence_margin
        try:
            session = await read_session(
                self.client, key.session_id, pauses=self.executor.settings.not_found_retries
            )
        except NotFoundError:
            self._unreadable.pop(key, None)
            logger.info("approved call %s is not run: its session no longer exists", key)
            await self.executor.store.cancel(
                key, owner=self.executor.owner, reason=_GONE_DELETED, known_before=read_at
            )
            return
        except APIError as exc:
            failures = self._unreadable.get(key, (0.0, 0))[1] + 1
            pause = REREAD.delay(failures)
            self._unreadable[key] = (time.monotonic() + pause, failures)
            logger.warning(
                "approved call %s waits: its session could not be read (%s); next try in %.0f s",
                key,
                exc,
                pause,
            )
            return
        self._unreadable.pop(key, None)
        action = session.pending_call(key.turn_id, key.call_id)
        if action is None:
            await self.executor.store.cancel(
                key, owner=self.executor.owner, reason=_GONE, known_before=read_at
            )
            return
        sent, nonce = time.monotonic(), secrets.token_hex(8)
        try:
            claimed = await self.executor.store.claim_approved(
                key,
                owner=self.executor.owner,
                lease_seconds=self.executor.settings.lease_seconds,
                nonce=nonce,
            )
        except StoreError:
            # Its answer was lost and the store could not be read back: the claim may be
            # ours all the same. The next poll looks, and runs it if it is (its lease counts
            # from now: it is fenced as any run).
            self._unanswered_claims[key] = (nonce, sent, action)
            raise
        if claimed is None:
            return  # another replica claimed it first
        tool = self.tools.get(action.name)
        self.track(key, self.executor.rerun(claimed, action, tool, claimed_at=sent))

    async def loop(self) -> None:
        """Poll every ``approval_poll_interval``, or at once when woken by a decision."""
        while True:
            self._wake.clear()
            try:
                await self.poll()
            except (APIError, StoreError) as exc:
                logger.warning("approval poll failed, retrying: %s", exc)
            except Exception:
                logger.exception("unexpected error in the approval poll")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), timeout=self.executor.settings.approval_poll_interval
                )

    # -- telling someone -----------------------------------------------------------------------
    async def notify_again(self, approval_id: str) -> ApprovalView:
        """Tell ``on_approval_request`` of a waiting request again, with new links (a link
        expires sooner than its request, or got lost). Raises
        :class:`~agentfn_asgi.errors.ApprovalError` when it no longer waits, and
        :class:`~agentfn_asgi.errors.ConfigurationError` when nobody is told of requests."""
        if self.notify is None:
            raise ConfigurationError("nobody to tell: the app has no on_approval_request")
        record, _ = await self._waiting(approval_id)
        self._requested(record)
        return approval_view(record)

    def _requested(self, record: CallRecord) -> None:
        """A request was just made here: tell the host (in the background, with retries)."""
        if self.notify is None:
            return
        view = approval_view(record)
        if self.links is not None:
            view = dataclasses.replace(view, links=self.links(view))
        self.spawn(self._notify(view))

    async def _notify(self, view: ApprovalView) -> None:
        notify = self.notify
        assert notify is not None
        for attempt in range(1, NOTIFY_TRIES + 1):
            try:
                await notify(view)
                return
            except Exception:
                logger.warning(
                    "on_approval_request failed for %s (try %d of %d)",
                    view.approval_id,
                    attempt,
                    NOTIFY_TRIES,
                    exc_info=True,
                )
            await asyncio.sleep(NOTIFY_BACKOFF.delay(attempt))
        logger.error("on_approval_request gave up on %s", view.approval_id)


def _refusal(record: CallRecord, message: str, error_type: str) -> SavedResult:
    """What a call a person denied (or nobody approved in time) answers: a failure saying
    ``message``; an approval request is answered "deny" instead (its tool never runs, the
    turn goes on; the reason stays in the record)."""
    if action_kind(record.tool_name) != "function":
        return saved_answer(record.key, record.tool_name, "deny", source="approval")
    return failure_result(record.key, message, error_type, source="approval")
