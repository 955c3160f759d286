"""Submitting a saved result to the Agents API, and settling a refusal.

The result's bytes and idempotency key were fixed when it was saved, so a submission from any
replica, at any time, is the same request. A call the API no longer waits for (400 "Unknown
pending tool call", 409, 404) is checked against a fresh read of the session and becomes
``stale``. Also here: when each delivery arrived, for the delivery-to-result latency metric.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from .._crash import crash_point
from ..client import AgentsClient
from ..errors import (
    APIError,
    APIStatusError,
    ConflictError,
    NotFoundError,
    UnknownPendingToolCallError,
)
from ..records import CallKey, CallRecord
from ..results import event_json, events_body, failure_event, submission_key
from ..store.base import Store
from ..tracing import Telemetry

__all__ = ["REFUSED_MESSAGE", "Submitter"]

#: Told to the model when the API refuses a saved result outright (a 400/413/422 other than
#: the registration race): resending the same bytes could never succeed. Built only from
#: the status and code, so every replica sends the identical fallback under the same key.
REFUSED_MESSAGE = (
    "The result of this call was refused by the Agents API (HTTP {status}, {code}), so it "
    "could not be delivered. Ask for less data or a simpler result and try again."
)
_REFUSING_STATUSES = frozenset({400, 413, 422})

logger = logging.getLogger("agentfn_asgi.dispatch.submission")


class Submitter:
    """Submits saved results for one dispatcher. Raises StoreError; API errors are settled
    here (logged, or the call marked stale) and left to the recovery sweep."""

    def __init__(self, client: AgentsClient, store: Store, telemetry: Telemetry) -> None:
        self._client = client
        self._store = store
        self._telemetry = telemetry
        # When each delivery arrived (bounded): the delivery-to-result latency metric.
        self._received: OrderedDict[str, float] = OrderedDict()

    def delivery_received(self, delivery_id: str) -> None:
        """Note that ``delivery_id`` arrived now."""
        self._received[delivery_id] = time.monotonic()
        if len(self._received) > 10_000:
            self._received.popitem(last=False)

    async def submit(self, record: CallRecord, delivery_id: str | None = None) -> None:
        """Submit the record's saved result, unless it has none or is already settled."""
        result = record.result
        if result is None or record.state.terminal:
            return
        key = record.key
        with self._telemetry.submission(
            session_id=key.session_id, turn_id=key.turn_id, call_id=key.call_id
        ) as span:
            try:
                await self._client.submit_raw_events(
                    key.session_id,
                    events_body(result.event_json),
                    idempotency_key=result.idempotency_key,
                )
            except (UnknownPendingToolCallError, ConflictError, NotFoundError) as exc:
                stale = await self._after_rejection(key, exc)
                span.set_outcome("stale" if stale else "failed")
                return
            except APIStatusError as exc:
                if exc.status not in _REFUSING_STATUSES:
                    span.set_outcome("failed")
                    logger.warning("submitting %s failed; the sweep retries it: %s", key, exc)
                    return
                span.set_outcome("failed")
                await self._submit_refusal(record, exc)
                return
            except APIError as exc:
                span.set_outcome("failed")
                logger.warning("submitting %s failed; the recovery sweep retries it: %s", key, exc)
                return
            span.set_outcome("submitted")
            crash_point("after_submit", record.tool_name)
            await self._store.mark_submitted(key)
        received = self._received.get(delivery_id) if delivery_id is not None else None
        self._telemetry.record_submission(
            attempts=span.attempts,
            delivery_to_submit_seconds=None if received is None else time.monotonic() - received,
        )

    async def _submit_refusal(self, record: CallRecord, refused: APIStatusError) -> None:
        """The API refused the saved result itself (e.g. too large after all): tell the model
        with a failure instead of resending bytes that can never be accepted."""
        key = record.key
        logger.error("the API refused the result of %s (%s); sending a failure", key, refused)
        message = REFUSED_MESSAGE.format(status=refused.status, code=refused.code or "no code")
        text = event_json(failure_event(key.turn_id, key.call_id, message))
        try:
            await self._client.submit_raw_events(
                key.session_id, events_body(text), idempotency_key=submission_key(key, text)
            )
        except (UnknownPendingToolCallError, ConflictError, NotFoundError) as exc:
            await self._after_rejection(key, exc)
            return
        except APIError as exc:
            logger.warning("submitting the refusal of %s failed; will retry: %s", key, exc)
            return
        await self._store.mark_submitted(key)

    async def _after_rejection(self, key: CallKey, exc: APIError) -> bool:
        """The API refused our result: only a fresh read of the session says what that means."""
        if not isinstance(exc, NotFoundError):
            try:
                session = await self._client.retrieve_session(key.session_id)
            except NotFoundError:
                pass
            else:
                still_pending = any(
                    a.turn_id == key.turn_id and a.call_id == key.call_id
                    for a in session.function_calls
                )
                if still_pending:
                    # The registration race outlived the client's short retries: keep the
                    # saved result; the sweep resubmits it (same bytes, same key).
                    logger.info("call %s still pending after %s; will resubmit", key, exc)
                    return False
        logger.info("call %s is no longer pending (%s); marking it stale", key, exc.message)
        await self._store.mark_stale(key)
        return True
