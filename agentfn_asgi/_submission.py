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

from ._crash import crash_point
from ._outcomes import events_body
from .client import AgentsClient
from .errors import APIError, ConflictError, NotFoundError, UnknownPendingToolCallError
from .store.base import CallKey, CallRecord, Store
from .tracing import Telemetry

__all__ = ["Submitter"]

# The dispatcher's logger: operators filter on it, and these messages were always logged there.
logger = logging.getLogger("agentfn_asgi.dispatch")


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
