"""Handlers that run in a worker: jobs, signed completion tokens and the worker's client.

A tool registered with ``enqueue=`` does not run in the web process. Once its arguments are
validated, the dispatcher builds a :class:`Job` and hands it to that callable (sync or async:
a Celery/RQ/arq task's ``delay``, a Redis ``LPUSH``, an HTTP POST to a worker), extends the
call's claim to the job's deadline and moves on. The worker runs the handler wherever it
likes (:func:`run_job` does it with the same registry) and completes the call::

    POST {mount}/calls/complete
    Authorization: Bearer <job.completion_token>
    Content-Type: application/json

    {"success": true, "output": <any JSON>}   or   {"success": false, "error": "<text>"}

or from Python with :func:`complete_call` / :func:`complete_call_sync` / :func:`complete_job`.
From there the result follows the in-process path: saved durably (the first result saved
wins), submitted with the stable idempotency key, stale handling, recovery.

The completion token (:class:`CompletionTokens`) is an itsdangerous signature over the ids of
exactly one call (session, turn, call), the tool name and the claim's owner, expiring at
the job's deadline. It carries no secret: anyone can read it, nobody can forge or alter it
without ``AGENTFN_COMPLETION_SECRET`` (a secret of its own, never the webhook secret).

Answers of the completion endpoint:

========================================================  ======  ==========================
situation                                                 status  body
========================================================  ======  ==========================
result saved now (submission under way)                   200     ``{"status":"accepted"}``
the same result was already saved (a retry)                200     ``{"status":"duplicate"}``
the API no longer waits for this call (don't retry)        200     ``{"status":"stale"}``
body not the JSON above                                    400     ``{"error":"invalid_body"}``
token missing, forged, altered or for another app          401     ``{"error":"invalid_token"}``
token authentic but past the job deadline                  401     ``{"error":"token_expired"}``
the tool is not registered in this app                     404     ``{"error":"unknown_tool"}``
another result was saved first (or the deadline failure)   409     ``{"error":"conflict"}``
store unavailable, shutting down                           503     (retry later)
========================================================  ======  ==========================

Job deadline policy: while a job is outstanding its claim's lease is the job deadline, so no
replica re-runs it. When the lease expires with no result, the call fails with
:data:`JOB_DEADLINE_MESSAGE` (the job is *not* queued again: it may still be running). Only
when the claim expired before the deadline could have passed (the web process crashed
between claiming the call and queueing its job) is the call treated like any in-doubt call:
queued again for a plain tool, reconciled for a side-effect tool.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx

# The app's side (tokens, jobs, completion bodies) lives in _completion.py; its names are
# re-exported so that everything stays importable from here.
from ._completion import CLOCK_SKEW as CLOCK_SKEW
from ._completion import (
    COMPLETE_PATH,
    COMPLETION_BODY_LIMIT,
    COMPLETION_SECRET_ENV,
    ENQUEUE_FAILED_MESSAGE,
    JOB_DEADLINE_MESSAGE,
    PUBLIC_URL_ENV,
    Completion,
    CompletionStatus,
    CompletionTokens,
    Job,
    TokenClaims,
    bearer_token,
    build_job,
    call_enqueue,
    completion_setup,
    parse_completion,
)
from ._completion import DEFAULT_TOKEN_MAX_AGE as DEFAULT_TOKEN_MAX_AGE
from ._completion import MAX_TOKEN_LENGTH as MAX_TOKEN_LENGTH
from ._completion import MIN_SECRET_LENGTH as MIN_SECRET_LENGTH
from ._completion import TOKEN_SALT as TOKEN_SALT
from .client import status_error
from .errors import (
    APIConnectionError,
    ArgumentValidationError,
    CompletionTokenError,
    CompletionTokenExpiredError,
    ConfigurationError,
    ResultEncodingError,
    ToolError,
)
from .results import encode_output, model_error_message, timeout_message
from .tools import FunctionTool, FunctionTools

__all__ = [
    "COMPLETE_PATH",
    "COMPLETION_BODY_LIMIT",
    "COMPLETION_SECRET_ENV",
    "ENQUEUE_FAILED_MESSAGE",
    "JOB_DEADLINE_MESSAGE",
    "PUBLIC_URL_ENV",
    "Completion",
    "CompletionResult",
    "CompletionStatus",
    "CompletionTokens",
    "Job",
    "TokenClaims",
    "bearer_token",
    "build_job",
    "call_enqueue",
    "complete_call",
    "complete_call_sync",
    "complete_job",
    "completion_setup",
    "parse_completion",
    "run_job",
]

logger = logging.getLogger("agentfn_asgi.worker")


# -- completions (worker side) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """What the app answered: ``accepted``, ``duplicate``, ``stale`` or ``conflict``.

    None of them is worth retrying: ``stale`` means the API no longer waits for the call,
    ``conflict`` that another result (or the deadline failure) was saved first.
    """

    status: Literal["accepted", "duplicate", "stale", "conflict"]


def _completion_request(token: str, completion: Completion) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        completion.to_dict(), separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    return body, headers


def _interpret(response: httpx.Response) -> CompletionResult:
    error: object = None
    status: object = None
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        error, status = data.get("error"), data.get("status")
    code = response.status_code
    if code == 200 and status in ("accepted", "duplicate", "stale"):
        return CompletionResult(status)
    if code == 409:
        return CompletionResult("conflict")
    if code == 401:
        if error == "token_expired":
            raise CompletionTokenExpiredError("the completion token has expired")
        raise CompletionTokenError("the app refused the completion token")
    raise status_error(code, response.content, response.headers)


def _retryable(response: httpx.Response) -> bool:
    return response.status_code in (408, 429) or response.status_code >= 500


def _backoff(attempt: int) -> float:
    return min(0.25 * 2.0 ** (attempt - 1), 4.0)


async def complete_call(
    url: str,
    token: str,
    *,
    success: bool,
    output: Any = None,
    error: str | None = None,
    http_client: httpx.AsyncClient | None = None,
    request_timeout: float = 30.0,
    attempts: int = 4,
) -> CompletionResult:
    """Complete one call from a Python worker (``url`` is ``{mount}/calls/complete``).

    Retries connection errors, 408, 429 and 5xx up to ``attempts`` times (a repeat of the
    same completion is harmless). Raises CompletionTokenExpiredError / CompletionTokenError
    on 401, APIConnectionError when the app cannot be reached, and APIStatusError for other
    refusals.
    """
    body, headers = _completion_request(token, Completion(success, output, error))
    client = http_client if http_client is not None else httpx.AsyncClient(timeout=request_timeout)
    try:
        for attempt in range(1, attempts + 1):
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                if attempt >= attempts:
                    raise APIConnectionError(f"cannot reach {url}: {exc}") from exc
            else:
                if attempt >= attempts or not _retryable(response):
                    return _interpret(response)
            await anyio.sleep(_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        if http_client is None:
            await client.aclose()


def complete_call_sync(
    url: str,
    token: str,
    *,
    success: bool,
    output: Any = None,
    error: str | None = None,
    http_client: httpx.Client | None = None,
    request_timeout: float = 30.0,
    attempts: int = 4,
) -> CompletionResult:
    """:func:`complete_call` for synchronous workers (Celery, RQ), over ``httpx.Client``."""
    body, headers = _completion_request(token, Completion(success, output, error))
    client = http_client if http_client is not None else httpx.Client(timeout=request_timeout)
    try:
        for attempt in range(1, attempts + 1):
            try:
                response = client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                if attempt >= attempts:
                    raise APIConnectionError(f"cannot reach {url}: {exc}") from exc
            else:
                if attempt >= attempts or not _retryable(response):
                    return _interpret(response)
            time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        if http_client is None:
            client.close()


async def complete_job(
    job: Job,
    completion: Completion,
    *,
    url: str | None = None,
    http_client: httpx.AsyncClient | None = None,
) -> CompletionResult:
    """Send ``completion`` for ``job`` to ``url`` (default ``job.complete_url``)."""
    target = url or job.complete_url
    if not target:
        raise ConfigurationError(
            "the job has no complete_url: pass url= or give the app public_url="
        )
    return await complete_call(
        target,
        job.completion_token,
        success=completion.success,
        output=completion.output,
        error=completion.error,
        http_client=http_client,
    )


async def run_job(
    tools: FunctionTools | FunctionTool,
    job: Job,
    *,
    resources: Any = None,
    limiter: anyio.CapacityLimiter | None = None,
) -> Completion:
    """Run the job's handler in the worker, as the dispatcher would in-process.

    Arguments are re-validated, the handler gets ``job.tool_context()`` and is abandoned at
    the job's deadline, and the outcome is encoded exactly as in-process (a ``ToolError``'s
    text as written, any other exception a fixed safe message), ready for
    :func:`complete_job`.
    """
    tool = tools if isinstance(tools, FunctionTool) else tools.get(job.tool_name)
    if tool is None or tool.name != job.tool_name:
        return Completion(False, error=f"No handler for '{job.tool_name}' in this worker.")
    try:
        arguments = tool.parse_arguments(job.arguments)
        with anyio.fail_after(job.remaining()):
            value = await tool.invoke(
                arguments, job.tool_context(resources=resources), limiter=limiter
            )
        return Completion(True, output=encode_output(value))
    except TimeoutError:
        return Completion(False, error=timeout_message(tool.name, None))
    except (ToolError, ArgumentValidationError, ResultEncodingError) as exc:
        return Completion(False, error=model_error_message(exc, tool_name=tool.name))
    except Exception as exc:
        logger.exception("job %s/%s of tool %s failed", job.session_id, job.call_id, tool.name)
        return Completion(False, error=model_error_message(exc, tool_name=tool.name))
