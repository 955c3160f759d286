"""The worker's side of worker tools: run a job, complete its call.

A tool registered with ``enqueue=`` hands each call to your queue as a :class:`Job` (the
protocol is in :mod:`agentfn_asgi.jobs`). A worker rebuilds the job, runs it with the same
registry and posts the outcome back::

    from agentfn_asgi.worker import Job, complete_job, run_job

    job = Job.from_json(raw)
    completion = await run_job(tools, job)     # validates, runs, encodes like the app would
    await complete_job(job, completion)        # POST {mount}/calls/complete; retries 5xx/429

:func:`complete_call` / :func:`complete_call_sync` complete a call from its URL and token
(synchronous workers such as Celery or RQ use the latter). Every completion is retried on
connection errors, 408, 429 and 5xx; a repeat of the same completion is harmless.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx

from ._threads import ThreadPool
from .backoff import Backoff
from .calls.records import Completion, Job
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
from .messages import model_error_message, timeout_message
from .results import encode_output
from .running import invoke
from .tools import FunctionTool, FunctionTools, ToolContext

__all__ = [
    "Completion",
    "CompletionResult",
    "Job",
    "complete_call",
    "complete_call_sync",
    "complete_job",
    "job_context",
    "run_job",
]

logger = logging.getLogger("agentfn_asgi.worker")


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """What the app answered: ``accepted``, ``duplicate``, ``stale`` or ``conflict``.

    None of them is worth retrying: ``stale`` means the API no longer waits for the call,
    ``conflict`` that another result (or the deadline failure) was saved first.
    """

    status: Literal["accepted", "duplicate", "stale", "conflict"]


# -- completing a call: one retry policy, two drivers ----------------------------------------


_RETRY = Backoff(base=0.25, cap=4.0, jitter=0.25)  # between tries of one completion


def _request(token: str, completion: Completion) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a completion's POST (the same on every try)."""
    body = json.dumps(
        completion.to_dict(), separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
    return body, {"authorization": f"Bearer {token}", "content-type": "application/json"}


def _outcome(
    url: str, answer: httpx.Response | httpx.HTTPError, *, last: bool
) -> CompletionResult | None:
    """The retry policy, without I/O: the app's answer to one try (or raise), or None to
    try again after a pause. The drivers below only perform the tries and pauses."""
    if isinstance(answer, httpx.Response):
        if last or not _retryable(answer):
            return _interpret(answer)
    elif last:
        raise APIConnectionError(f"cannot reach {url}: {answer}") from answer
    return None


def _retryable(response: httpx.Response) -> bool:
    return response.status_code in (408, 429) or response.status_code >= 500


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
    body, headers = _request(token, Completion(success, output, error))
    client = http_client if http_client is not None else httpx.AsyncClient(timeout=request_timeout)
    try:
        for attempt in range(1, attempts + 1):
            answer: httpx.Response | httpx.HTTPError
            try:
                answer = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                answer = exc
            result = _outcome(url, answer, last=attempt >= attempts)
            if result is not None:
                return result
            await anyio.sleep(_RETRY.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover - the last try returns
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
    body, headers = _request(token, Completion(success, output, error))
    client = http_client if http_client is not None else httpx.Client(timeout=request_timeout)
    try:
        for attempt in range(1, attempts + 1):
            answer: httpx.Response | httpx.HTTPError
            try:
                answer = client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                answer = exc
            result = _outcome(url, answer, last=attempt >= attempts)
            if result is not None:
                return result
            time.sleep(_RETRY.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover - the last try returns
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


# -- running a job ---------------------------------------------------------------------------


def job_context(job: Job, *, resources: Any = None) -> ToolContext:
    """The :class:`~agentfn_asgi.tools.ToolContext` a handler gets when a worker runs ``job``."""
    return ToolContext(
        session_id=job.session_id,
        turn_id=job.turn_id,
        call_id=job.call_id,
        tool_name=job.tool_name,
        attempt=job.attempt,
        deadline=job.deadline,
        idempotency_key=job.idempotency_key,
        resources=resources,
    )


async def run_job(
    tools: FunctionTools | FunctionTool,
    job: Job,
    *,
    resources: Any = None,
    threads: ThreadPool | None = None,
) -> Completion:
    """Run the job's handler in the worker, as the dispatcher would in-process.

    Arguments are re-validated, the handler gets :func:`job_context` and is abandoned at
    the job's deadline (a sync handler runs in ``threads``, a shared default pool when None),
    and the outcome is encoded exactly as in-process (a ``ToolError``'s
    text as written, any other exception a fixed safe message), ready for
    :func:`complete_job`.
    """
    tool = tools if isinstance(tools, FunctionTool) else tools.get(job.tool_name)
    if tool is None or tool.name != job.tool_name:
        return Completion(False, error=f"No handler for '{job.tool_name}' in this worker.")
    try:
        arguments = tool.parse_arguments(job.arguments)
        value = await invoke(
            tool,
            arguments,
            job_context(job, resources=resources),
            threads=threads,
            time_limit=job.remaining(),
        )
        return Completion(True, output=encode_output(value))
    except TimeoutError:
        return Completion(False, error=timeout_message(tool.name, None))
    except (ToolError, ArgumentValidationError, ResultEncodingError) as exc:
        return Completion(False, error=model_error_message(exc, tool_name=tool.name))
    except Exception as exc:
        logger.exception("job %s/%s of tool %s failed", job.session_id, job.call_id, tool.name)
        return Completion(False, error=model_error_message(exc, tool_name=tool.name))
