"""The dispatcher's worker-job lane: calls of ``enqueue=`` tools and their completions.

Handing a validated call to the tool's queue (worker.py documents the protocol), holding its
claim until the job deadline, and saving the result a worker sends back. The
:class:`~agentfn_asgi.dispatch.Dispatcher` owns one :class:`WorkerJobs` and submits what it
saves; everything this needs is given to it explicitly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from ._completion import (
    ENQUEUE_FAILED_MESSAGE,
    CompletionStatus,
    CompletionTokens,
    TokenClaims,
    build_job,
    call_enqueue,
)
from ._crash import crash_point
from ._lease import LeaseKeeper
from ._outcomes import encode_result, failure_result
from ._settings import DispatchSettings
from .errors import CompletionTokenError
from .records import CallKey, CallRecord, CallState, SavedResult
from .store.base import Store
from .tools import FunctionTool, FunctionTools, ToolContext

__all__ = ["WorkerJobs"]

# The dispatcher's logger: operators filter on it, and these messages were always logged there.
logger = logging.getLogger("agentfn_asgi.dispatch")


class WorkerJobs:
    """Queues calls for workers and saves their completions (one per dispatcher)."""

    def __init__(
        self,
        store: Store,
        *,
        tools: FunctionTools,
        settings: DispatchSettings,
        leases: LeaseKeeper,
        owner: str,
        clock: Callable[[], float],
        tokens: CompletionTokens | None,
        complete_url: str | None,
    ) -> None:
        self._store = store
        self._tools = tools
        self._settings = settings
        self._leases = leases
        self._owner = owner
        self._clock = clock
        # Tokens sign completions; the URL goes into each job.
        self._tokens = tokens
        self._complete_url = complete_url

    async def overdue(self, key: CallKey, tool: FunctionTool) -> bool:
        """An in-doubt queued call is past its job deadline (else its claim expired early:
        the process died between claiming it and handing over its job)."""
        record = await self._store.get_call(key)
        return record is None or self._clock() >= record.created_at + tool.job_deadline

    async def enqueue(
        self,
        key: CallKey,
        tool: FunctionTool,
        arguments: dict[str, Any],
        context: ToolContext,
        *,
        limiter: anyio.CapacityLimiter | None,
    ) -> SavedResult | None:
        """Hand the call to the tool's queue; its claim then lasts until the job deadline."""
        assert tool.enqueue is not None
        timeout = tool.timeout if tool.timeout is not None else self._settings.default_timeout
        try:
            async with self._leases.kept(key):
                with anyio.fail_after(timeout):
                    await self._hand_off(key, tool, arguments, context, limiter=limiter)
        except Exception:
            logger.exception("could not enqueue call %s of tool %s", key, tool.name)
            message = ENQUEUE_FAILED_MESSAGE.format(name=tool.name)
            return failure_result(key, message, "enqueue_error")
        # No heartbeat while the job is out: the lease itself is the deadline. (False when
        # a fast worker already completed it: nothing left to hold.)
        await self._store.renew_lease(key, owner=self._owner, lease_seconds=tool.job_deadline)
        return None

    async def _hand_off(
        self,
        key: CallKey,
        tool: FunctionTool,
        arguments: dict[str, Any],
        context: ToolContext,
        *,
        limiter: anyio.CapacityLimiter | None,
    ) -> None:
        assert tool.enqueue is not None
        if self._tokens is None:
            raise RuntimeError("no completion secret configured")  # the app checks first
        job = build_job(
            key,
            tool,
            arguments,
            tokens=self._tokens,
            owner=self._owner,
            attempt=context.attempt,
            idempotency_key=context.idempotency_key,
            now=self._clock(),
            complete_url=self._complete_url,
        )
        await call_enqueue(tool.enqueue, job, limiter=limiter)

    async def save_completion(
        self, claims: TokenClaims, *, success: bool, output: Any, error: str | None
    ) -> tuple[CompletionStatus, CallRecord | None]:
        """Save a worker's result for the call its verified token names.

        Returns the status (see :meth:`Dispatcher.complete`) and the record to submit now,
        if any. Raises StoreError, or CompletionTokenError when the token names another tool
        than its call.
        """
        key = claims.key
        record = await self._store.get_call(key)
        if record is None or record.state is CallState.STALE:
            return "stale", None
        if record.tool_name != claims.tool_name:
            raise CompletionTokenError("the token names another tool than its call")
        tool = self._tools.get(claims.tool_name)
        if tool is None:
            return "unknown_tool", None
        if success:
            result = encode_result(
                key,
                tool,
                output,
                source="worker",
                limit=self._settings.result_limit,
                margin=self._settings.result_margin,
            )
        else:
            result = failure_result(key, error or "", "worker_error", source="worker")
        fresh = record.state is CallState.CLAIMED
        if fresh:
            record = await self._store.save_result(key, owner=claims.owner, result=result)
            crash_point("after_save", claims.tool_name)
        if record.state is CallState.STALE:
            return "stale", None
        if record.result is None or record.result.event_json != result.event_json:
            return "conflict", None
        status: CompletionStatus = "accepted" if fresh else "duplicate"
        # Even if the call's own task is still finishing (a fast worker completes before
        # the enqueuing attempt returns): a second submission of these bytes is harmless.
        return status, None if record.state.terminal else record
