"""Submitting a saved result to the Agents API, and settling a refusal.

The result's bytes and idempotency key were fixed when it was saved, so a submission from any
replica, at any time, is the same request. A refused submission (400 "Unknown pending tool
call", 409, 404) is checked against a fresh read of the session: the call becomes ``stale``
only when the session no longer waits for it, or is gone (404) ``not_found_grace`` after the
result was saved; otherwise the saved result stays and the recovery sweep resubmits it, with
backoff. A single 404 (the API not seeing a session for a moment) never discards a result.

Results of one turn that are ready together (saved in the same loop turn, while sibling
calls of the turn run here, or resubmitted together by the sweep) go in one POST: the first
waits one loop turn for the others, then sends them all, in a body under the size budget
(a large result goes alone) and under a key derived from the events' own keys, so the same
batch always travels under the same key. A batch the API refuses (a 4xx) falls back to one
POST per result, so one bad event never holds up the others and stale calls are found per
call; a failure worth another try is every member's, for the sweep.
Also here: when each delivery arrived, for the delivery-to-result latency metric.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, Literal

from .._crash import crash_point
from ..calls.records import CallKey, CallRecord
from ..client import AgentsClient
from ..errors import (
    APIError,
    APIStatusError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    UnknownPendingToolCallError,
)
from ..results import (
    BATCH_EVENT_MAX,
    DEFAULT_SAFETY_MARGIN,
    TOOL_RESULT_LIMIT,
    batch_body,
    batch_key,
    encoded_size,
    event_json,
    events_body,
    failure_event,
    submission_key,
)
from ..store.base import Store
from ..tracing import Telemetry
from ..wire import AgentSession
from .alarms import ConfigurationAlarm, is_configuration_error

__all__ = [
    "NOT_POSTED",
    "REFUSED_MESSAGE",
    "SUBMITTED_BEFORE_SAVED",
    "SubmitOutcome",
    "Submitter",
    "read_session",
]

#: The ``source`` of a saved result that was submitted before it was saved (a sign-in's
#: answer, whose values are never stored: what is saved is its redacted copy).
SUBMITTED_BEFORE_SAVED = "sign_in"
#: The source of an answer that is recorded and never POSTed (an environment connection:
#: the API learns of it from the environment itself).
NOT_POSTED = "environment"

#: What became of one submission (see :meth:`Submitter.submit`).
SubmitOutcome = Literal["submitted", "stale", "failed", "skipped"]

#: Told to the model when the API refuses a saved result outright (a 400/413/422 other than
#: the registration race): resending the same bytes could never succeed. Built only from
#: the status and code, so every replica sends the identical fallback under the same key.
REFUSED_MESSAGE = (
    "The result of this call was refused by the Agents API (HTTP {status}, {code}), so it "
    "could not be delivered. Ask for less data or a simpler result and try again."
)
_REFUSING_STATUSES = frozenset({400, 413, 422})
#: A batch's body stays under the limit one result's does (wire protocol §9.1).
_BATCH_BUDGET = TOOL_RESULT_LIMIT - DEFAULT_SAFETY_MARGIN
#: At most this many events a body: the API does not say how many it takes; one
#: re-implementation takes 1-64 (wire protocol §4.1).
_BATCH_EVENTS = 64
_ENVELOPE = encoded_size("")  # {"events":[]}: a body's bytes beside its events
#: What a batch's POST means for each member: accepted, a failure for the sweep to retry
#: (with the answer), or "send it on its own" (refused, or nothing to batch it with).
_Verdict = tuple[Literal["submitted", "failed", "alone"], str]


@dataclass(slots=True)
class _Batch:
    """Results of one turn gathering for one POST during one loop turn."""

    members: list[tuple[CallRecord, asyncio.Future[_Verdict]]] = field(default_factory=list)


logger = logging.getLogger("agentfn_asgi.dispatch.submission")


async def read_session(
    client: AgentsClient, session_id: str, *, pauses: Sequence[float]
) -> AgentSession:
    """``GET`` the session; a 404 is tried again after each of ``pauses`` (seconds) before
    it is raised: a session may be unreadable for a moment (``not_found_retries``)."""
    for delay in pauses:
        try:
            return await client.retrieve_session(session_id)
        except NotFoundError:
            await asyncio.sleep(delay)
    return await client.retrieve_session(session_id)


@dataclass(slots=True, eq=False)
class Submitter:
    """Submits saved results for one dispatcher. Raises StoreError; API errors are settled
    here (logged, or the call marked stale) and left to the recovery sweep.

    ``not_found_grace`` and ``not_found_pauses`` are the session read's
    (:class:`~agentfn_asgi.dispatch.DispatchSettings` ``not_found_grace`` and
    ``not_found_retries``): a session the API does not find is only treated as gone once it
    is still missing that long after the result was saved.
    """

    client: AgentsClient
    store: Store
    telemetry: Telemetry
    _: KW_ONLY
    alarm: ConfigurationAlarm = field(default_factory=ConfigurationAlarm)
    retry_delay: Callable[[int], float] = lambda failures: 5.0
    not_found_grace: float = 60.0
    not_found_pauses: Sequence[float] = ()
    clock: Callable[[], float] = time.time
    # When each delivery arrived (bounded): the delivery-to-result latency metric.
    _received: OrderedDict[str, float] = field(default_factory=OrderedDict, init=False)
    #: Per (session, turn): the batch gathering now (see the module docstring).
    _gathering: dict[tuple[str, str], _Batch] = field(default_factory=dict, init=False)

    def delivery_received(self, delivery_id: str) -> None:
        """Note that ``delivery_id`` arrived now."""
        self._received[delivery_id] = time.monotonic()
        if len(self._received) > 10_000:
            self._received.popitem(last=False)

    async def submit(
        self, record: CallRecord, delivery_id: str | None = None, *, together: bool = False
    ) -> SubmitOutcome:
        """Submit the record's saved result, unless it has none or is already settled.

        ``together``: other results of its turn may be ready in this loop turn; they go in
        one POST (see the module docstring). Returns ``submitted``, ``stale`` (the API no
        longer waits for it), ``failed`` (left for the recovery sweep) or ``skipped``
        (nothing to send). Raises StoreError.
        """
        result = record.result
        if result is None or record.state.terminal:
            return "skipped"
        key = record.key
        if result.source == SUBMITTED_BEFORE_SAVED:
            # A sign-in's answer went out (values in memory) before its redacted copy was
            # saved: there is nothing to send again, only the record to close.
            await self.store.mark_submitted(key, detail="submitted before it was saved")
            return "submitted"
        if result.source == NOT_POSTED:
            await self.store.mark_submitted(key, detail="not posted: an environment connection")
            return "submitted"
        with self.telemetry.submission(
            session_id=key.session_id, turn_id=key.turn_id, call_id=key.call_id
        ) as span:
            kind, answer = await self._gather(record) if together else ("alone", "")
            outcome: SubmitOutcome = "submitted" if kind == "submitted" else "failed"
            if kind == "alone":
                outcome, answer = await self._send(
                    record, result.event_json, result.idempotency_key
                )
            span.set_outcome(outcome)
            if outcome == "failed":
                # The sweep retries it later, with backoff, so it never crowds out the rest.
                retry_at = self.clock() + self.retry_delay(record.failures + 1)
                await self.store.submission_failed(key, detail=answer, retry_at=retry_at)
                self.telemetry.record_recovery_failure("submission")
            if outcome != "submitted":
                return outcome
            self.alarm.cleared()
            crash_point("after_submit", record.tool_name)
            requests = span.attempts
            await self.store.mark_submitted(
                key, detail=f"{answer}, {requests} request{'' if requests == 1 else 's'}"
            )
        received = self._received.get(delivery_id) if delivery_id is not None else None
        self.telemetry.record_submission(
            attempts=span.attempts,
            delivery_to_submit_seconds=None if received is None else time.monotonic() - received,
        )
        return outcome

    async def _gather(self, record: CallRecord) -> _Verdict:
        """Join the batch of the record's turn gathering in this loop turn, or start one and
        send it after a loop turn; what its POST means for this record."""
        key = record.key
        turn = (key.session_id, key.turn_id)
        answer: asyncio.Future[_Verdict] = asyncio.get_running_loop().create_future()
        batch = self._gathering.get(turn)
        if batch is not None:
            batch.members.append((record, answer))
            return await answer
        batch = self._gathering[turn] = _Batch([(record, answer)])
        try:
            try:
                await asyncio.sleep(0)  # the turn's other results saved with this one join now
            finally:
                if self._gathering.get(turn) is batch:
                    del self._gathering[turn]
            await self._send_batches(batch)
        finally:
            # Not told yet (we were cancelled, even while they joined): each goes alone.
            for _, told in batch.members:
                _tell(told, ("alone", ""))
        return await answer

    async def _send_batches(self, batch: _Batch) -> None:
        """Pack the members into bodies under the budget and POST each pack of two or more;
        a member that fits no pack (a large result) is told to go alone."""
        packs: list[list[tuple[CallRecord, asyncio.Future[_Verdict]]]] = []
        size = 0
        # In key order: the same results always make the same bodies.
        for member in sorted(batch.members, key=lambda m: _saved_key(m[0])):
            text = _saved_text(member[0])
            event_size = encoded_size(text) - _ENVELOPE
            if event_size > BATCH_EVENT_MAX:
                _tell(member[1], ("alone", ""))
                continue
            if (
                not packs
                or size + event_size + 1 > _BATCH_BUDGET
                or len(packs[-1]) == _BATCH_EVENTS
            ):
                packs.append([])
                size = _ENVELOPE
            packs[-1].append(member)
            size += event_size + 1
        for pack in packs:
            if len(pack) == 1:
                _tell(pack[0][1], ("alone", ""))
                continue
            verdict = await self._post_batch([record for record, _ in pack])
            for _, told in pack:
                _tell(told, verdict)

    async def _post_batch(self, records: list[CallRecord]) -> _Verdict:
        """One POST of several results: accepted (every member submitted), a failure worth
        another try (every member's), or refused (each member goes alone)."""
        session_id = records[0].key.session_id
        body = batch_body([_saved_text(r) for r in records])
        idempotency_key = batch_key([_saved_key(r) for r in records])
        try:
            await self.client.submit_raw_events(session_id, body, idempotency_key=idempotency_key)
        except APIError as exc:
            if exc.status is not None and exc.status < 500 and exc.status not in _TRY_LATER:
                # Refused (one bad event, a call no longer pending, a batch too large or not
                # accepted at all): one POST per result settles each on its own.
                logger.info(
                    "a batch of %d results of session %s was refused (%s); sending each alone",
                    len(records),
                    session_id,
                    _answer(exc),
                )
                return "alone", ""
            logger.warning(
                "submitting %d results failed; the sweep retries them: %s", len(records), exc
            )
            return "failed", _answer(exc)
        return "submitted", f"HTTP 202, one of {len(records)} in one request"

    async def submit_unsaved(
        self, key: CallKey, event_json_text: str, idempotency_key: str
    ) -> Literal["submitted", "stale", "refused"]:
        """Submit an answer that is never stored (a sign-in's values): ``submitted`` once the
        API accepted it, ``stale`` when the session no longer waits for it, ``refused`` when
        the API refused the answer itself (a 400). Raises APIError for a failure worth
        another try (the caller keeps nothing: whoever takes the call over asks for the
        values again)."""
        with self.telemetry.submission(
            session_id=key.session_id, turn_id=key.turn_id, call_id=key.call_id
        ) as span:
            outcome: Literal["submitted", "stale", "refused"] = "submitted"
            try:
                await self._post(key, event_json_text, idempotency_key)
            except (UnknownPendingToolCallError, ConflictError, NotFoundError):
                outcome = "stale"
            except BadRequestError:
                outcome = "refused"
            span.set_outcome(outcome)
        return outcome

    async def _post(self, key: CallKey, event_json_text: str, idempotency_key: str) -> None:
        """POST one event for the call ``key``."""
        await self.client.submit_raw_events(
            key.session_id, events_body(event_json_text), idempotency_key=idempotency_key
        )

    async def _send(
        self, record: CallRecord, event_json_text: str, idempotency_key: str
    ) -> tuple[SubmitOutcome, str]:
        """One submission: what its answer means for the call, and the answer in short."""
        key = record.key
        try:
            await self._post(key, event_json_text, idempotency_key)
        except (UnknownPendingToolCallError, ConflictError, NotFoundError) as exc:
            stale = await self._after_rejection(record, exc)
            return ("stale" if stale else "failed"), _answer(exc)
        except APIStatusError as exc:
            if is_configuration_error(exc):
                self.alarm.report(exc, doing=f"the result of call {key}")
            elif exc.status in _REFUSING_STATUSES:
                if await self._submit_refusal(record, exc):
                    return "submitted", _answer(exc)
            else:
                logger.warning("submitting %s failed; the sweep retries it: %s", key, exc)
            return "failed", _answer(exc)
        except APIError as exc:
            logger.warning("submitting %s failed; the recovery sweep retries it: %s", key, exc)
            return "failed", _answer(exc)
        return "submitted", "HTTP 202"

    async def _submit_refusal(self, record: CallRecord, refused: APIStatusError) -> bool:
        """The API refused the saved result itself (e.g. too large after all): tell the model
        with a failure instead of resending bytes that can never be accepted. True once the
        failure is accepted (the call is then submitted)."""
        key = record.key
        logger.error("the API refused the result of %s (%s); sending a failure", key, refused)
        message = REFUSED_MESSAGE.format(status=refused.status, code=refused.code or "no code")
        text = event_json(failure_event(key.turn_id, key.call_id, message))
        try:
            await self._post(key, text, submission_key(key, text))
        except (UnknownPendingToolCallError, ConflictError, NotFoundError) as exc:
            await self._after_rejection(record, exc)
            return False
        except APIError as exc:
            logger.warning("submitting the refusal of %s failed; will retry: %s", key, exc)
            return False
        return True

    async def _after_rejection(self, record: CallRecord, exc: APIError) -> bool:
        """The API refused our result: only a fresh read of the session says what that means.

        True (the call is now stale) when the session no longer waits for the call, or when
        it is gone (404) and the result was saved ``not_found_grace`` ago or more. Otherwise
        the saved result stays for the sweep to resubmit (same bytes, same key): the
        registration race outlived the client's short retries, or the API did not see the
        session for a moment (a 404 on the submission, or on the read, inside the grace).
        """
        key = record.key
        try:
            session = await read_session(self.client, key.session_id, pauses=self.not_found_pauses)
        except NotFoundError:
            missing_for = self.clock() - record.updated_at
            if missing_for < self.not_found_grace:
                logger.info(
                    "session of call %s not found (%s); keeping its result for %.0f s more",
                    key,
                    exc.message,
                    self.not_found_grace - missing_for,
                )
                return False
            logger.info("session of call %s no longer exists; marking the call stale", key)
        except APIError as failure:
            logger.warning("call %s: the session cannot be read (%s); will resubmit", key, failure)
            return False
        else:
            if session.pending_call(key.turn_id, key.call_id) is not None:
                logger.info("call %s still pending after %s; will resubmit", key, exc)
                return False
            logger.info("call %s is no longer pending (%s); marking it stale", key, exc.message)
        await self.store.mark_stale(key)
        return True


#: A batch answered with these (after the client's own retries) is tried again later, as a
#: batch: sending its results one by one would only multiply the requests that fail.
_TRY_LATER: Final = frozenset({408, 429})


def _tell(member: asyncio.Future[_Verdict], verdict: _Verdict) -> None:
    """Tell a member what became of it, unless it was told, or stopped waiting (cancelled)."""
    if not member.done():
        member.set_result(verdict)


def _saved_text(record: CallRecord) -> str:
    assert record.result is not None  # only saved results are submitted
    return record.result.event_json


def _saved_key(record: CallRecord) -> str:
    assert record.result is not None
    return record.result.idempotency_key


def _answer(exc: APIError) -> str:
    """The API's answer in short (status and code, never the message: it may quote us)."""
    if exc.status is None:
        return type(exc).__name__
    return f"HTTP {exc.status} {exc.code or ''}".strip()
